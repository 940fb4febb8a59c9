"""Verifiable rewards and grading: final-answer extraction and comparison, response parsers (GSM8K, MMLU),
the format and answer rewards.
"""

from __future__ import annotations

import re
from fractions import Fraction

from cookmind.align.prompts import uses_think_tags
from cookmind.answer_numbers import NUMBER_RE, clean_number_text, numbers_in  # noqa: F401 - torch-free, for pack

# -- Reading a final answer out of free text and deciding whether it equals the reference ---------------------------
# how numbers are read out of text (torch-free: pack checks reference answers with it)
from cookmind.store.records import reference_text  # noqa: F401 - graders and problem files read answers alike

_HASHES_RE = re.compile(r"####\s*(.+)")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


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
    match = NUMBER_RE.search(clean_number_text(text))
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
    found = NUMBER_RE.findall(clean_number_text(text))
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
    return re.sub(r"\s+", " ", clean_number_text(text)).strip().rstrip(".").lower()


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


# -- Turn a model's free text into the answer a benchmark grades ----------------------------------------------------


LETTERS = "ABCD"


def parse_gsm8k_response(text: str) -> str | None:
    r"""The numeric answer in ``text`` as a plain string ("1,234" -> "1234", "\frac{1}{2}" -> "1/2"), or None.

    Looks in <answer> tags, then ``#### N``, then \boxed{}, then takes the last number.
    """
    raw = extract_answer(text)
    if raw is None:
        return None
    value = to_number(raw)
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _options(example) -> list[str]:
    if isinstance(example, dict):
        if "options" in example:
            return list(example["options"])
        return [str(example.get(letter, "")) for letter in LETTERS]
    return []


def parse_mmlu_response(example, text: str) -> str | None:
    """The option letter ("A".."D") a response chose, or None when it names none.

    Tries, in order: "answer is (X)" / "Answer: X", an <answer> tag, a lone letter, and an
    exact copy of one option's text. ``example`` is {"question", "options": [4 strings], ...}
    or a row with keys A/B/C/D.
    """
    body = text.strip()
    patterns = (
        r"(?i:answer)\s*(?:(?i:is)|:)?\s*[:\-]?\s*\(?\s*([ABCD])\b",
        r"<answer>\s*\(?([ABCD])\)?\s*</answer>",
        r"^\(?([ABCD])\)?(?:[.):\s]|$)",
    )
    for pattern in patterns:
        found = re.findall(pattern, body, flags=re.MULTILINE)
        if found:
            return found[-1].upper() if pattern != patterns[2] else found[0].upper()
    options = _options(example)
    lowered = body.lower()
    hits = [LETTERS[i] for i, opt in enumerate(options) if opt and opt.strip().lower() in lowered]
    return hits[0] if len(hits) == 1 else None


# -- Verifiable rewards: a format reward for <think>…</think> <answer>…</answer>, an answer reward, and both --------


# the prompt ends with "<think>", so a well-formed response is: reasoning </think> <answer> … </answer>
_FORMAT_RE = re.compile(r"^(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL)
_TRAILING_SPECIALS = re.compile(r"(?:\s*<\|(?:endoftext|im_end)\|>)+\s*$")


def format_reward(response: str) -> float:
    """1.0 when ``response`` is ``… </think> <answer> … </answer>`` (only end tokens after), else 0.0."""
    body = _TRAILING_SPECIALS.sub("", response)
    match = _FORMAT_RE.match(body)
    if not match or "<answer>" in match.group("think") or "</think>" in match.group("answer"):
        return 0.0
    return 1.0 if match.group("answer").strip() else 0.0


def answer_reward(response: str, ground_truth: str) -> float:
    """1.0 when the response's final answer equals the reference, else 0.0."""
    return 1.0 if answers_match(extract_answer(response), extract_gold(ground_truth)) else 0.0


def r1_zero_reward_fn(response: str, ground_truth: str, format_weight: float = 0.0) -> dict[str, float]:
    """R1-Zero reward: the answer counts only inside the format.

    reward = answer_reward * format_reward + format_weight * format_reward
    (format_weight 0 is the paper's; a small positive weight helps a tiny model learn the tags).
    """
    fmt = format_reward(response)
    ans = answer_reward(response, ground_truth) if fmt else 0.0
    return {"format_reward": fmt, "answer_reward": ans, "reward": ans * fmt + format_weight * fmt}


_HASH_RE = re.compile(r"####\s*[-+$]?\s*\d")


def hash_reward_fn(response: str, ground_truth: str, format_weight: float = 0.0) -> dict[str, float]:
    """GSM8K's own format: the answer follows ``#### ``; format reward 1 when that line is present.

    reward = answer_reward * format_reward + format_weight * format_reward.
    """
    fmt = 1.0 if _HASH_RE.search(response) else 0.0
    ans = answer_reward(response, ground_truth) if fmt else 0.0
    return {"format_reward": fmt, "answer_reward": ans, "reward": ans * fmt + format_weight * fmt}


def reward_fn_for_template(template: str, format_weight: float = 0.0):
    """r1-zero tags for prompts that open <think>; ``#### N`` for chat; the last number otherwise."""
    if uses_think_tags(template):
        return lambda r, g: r1_zero_reward_fn(r, g, format_weight)
    if template == "chat":
        return lambda r, g: hash_reward_fn(r, g, format_weight)
    return plain_reward_fn


def plain_reward_fn(response: str, ground_truth: str) -> dict[str, float]:
    """For models not taught the tags: the final answer (####, \\boxed, last number) against the reference."""
    ans = answer_reward(response, ground_truth)
    return {"format_reward": 1.0 if extract_answer(response) is not None else 0.0, "answer_reward": ans, "reward": ans}
