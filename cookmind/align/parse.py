"""Turn a model's free text into the answer a benchmark grades."""

from __future__ import annotations

import re

from cookmind.align.grading import extract_answer, to_number

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
