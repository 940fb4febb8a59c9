"""Numbers read out of free text as the graders read them (``cookmind.align.rewards``): text only, so that pack
checks a reference answer (``store.records.check_gradable``) without importing torch."""

from __future__ import annotations

import re

# a number: optional sign, digits with optional thousands groups, optional decimals, optional /denominator
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|[-+]?\.\d+"
NUMBER_RE = re.compile(NUMBER)
FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")


def clean_number_text(text: str) -> str:
    """Unify signs, drop LaTeX/currency decoration that never changes a number's value."""
    text = text.replace("\u2212", "-").replace("\u2013", "-")  # unicode minus / en dash
    text = FRAC_RE.sub(r"\1/\2", text)
    for junk in ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\left", "\\right", "\\text", "\\mathrm"):
        text = text.replace(junk, "")
    # a sign separated from its digits ("- 5") and a leading "$" after the sign ("-$5") both happen
    text = re.sub(r"(?<![\w)])-\s+(?=\d)", "-", text)
    return text


def numbers_in(text: str) -> list[str]:
    """Every number-looking token in ``text`` (a LaTeX fraction is one), as the graders read them."""
    return NUMBER_RE.findall(clean_number_text(text))
