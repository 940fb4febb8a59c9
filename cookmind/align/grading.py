"""Reading a final answer out of free text and deciding whether it equals the reference.

Numbers are compared exactly as fractions, so "1,200", "$1200.00", "1200 dollars" and
"\\boxed{1200}" all equal 1200, "3/4" equals "0.75" and "\\frac{3}{4}", and "-5" differs from "5".
"""

from __future__ import annotations

import re
from fractions import Fraction

# a number: optional sign, digits with optional thousands groups, optional decimals, optional /denominator
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|[-+]?\.\d+"
_NUM_RE = re.compile(_NUM)
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_HASHES_RE = re.compile(r"####\s*(.+)")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _clean(text: str) -> str:
    """Unify signs, drop LaTeX/currency decoration that never changes a number's value."""
    text = text.replace("\u2212", "-").replace("\u2013", "-")  # unicode minus / en dash
    text = _FRAC_RE.sub(r"\1/\2", text)
    for junk in ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\left", "\\right", "\\text", "\\mathrm"):
        text = text.replace(junk, "")
    # a sign separated from its digits ("- 5") and a leading "$" after the sign ("-$5") both happen
    text = re.sub(r"(?<![\w)])-\s+(?=\d)", "-", text)
    return text


def boxed_content(text: str) -> str | None:
    r"""The content of the last \boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def to_number(text: str) -> Fraction | None:
    """The value of the first number in ``text`` ("1,234.5 dollars" -> 2469/2), or None."""
    match = _NUM_RE.search(_clean(text))
    if not match:
        return None
    token = match.group(0).replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            if float(den) == 0:
                return None
            return Fraction(num) / Fraction(den)
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def last_number(text: str) -> str | None:
    """The last number-looking token in ``text`` (commas kept), or None."""
    found = _NUM_RE.findall(_clean(text))
    return found[-1] if found else None


def extract_gold(ground_truth: str) -> str:
    """The reference answer: text after GSM8K's ``####`` when present, else the whole string."""
    match = _HASHES_RE.search(ground_truth)
    return (match.group(1) if match else ground_truth).strip()


def extract_answer(text: str) -> str | None:
    r"""The model's final answer: <answer>…</answer>, else ``#### N``, else \boxed{}, else the last number."""
    tags = _ANSWER_TAG_RE.findall(text)
    if tags:
        inner = tags[-1]
        return boxed_content(inner) or last_number(inner) or inner.strip() or None
    match = _HASHES_RE.search(text)
    if match:
        return last_number(match.group(1).split("\n")[0]) or match.group(1).strip()
    boxed = boxed_content(text)
    if boxed is not None:
        return boxed.strip()
    return last_number(text)


def _normal_text(text: str) -> str:
    return re.sub(r"\s+", " ", _clean(text)).strip().rstrip(".").lower()


def answers_match(predicted: str | None, reference: str) -> bool:
    """True when the two answers name the same number (exactly), or the same words when neither is a number."""
    if predicted is None:
        return False
    p, r = to_number(predicted), to_number(reference)
    if p is not None and r is not None:
        return p == r
    if p is None and r is None:
        return _normal_text(predicted) == _normal_text(reference)
    return False


def grade_gsm8k(response: str, ground_truth: str) -> bool:
    """Is the final answer in ``response`` equal to the reference (a GSM8K answer or a bare value)?"""
    return answers_match(extract_answer(response), extract_gold(ground_truth))
