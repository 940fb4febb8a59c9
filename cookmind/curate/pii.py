"""PII masking: e-mail addresses, phone numbers and IP addresses, each ``(text) -> (text, count)``.

The patterns prefer precision on the forms web pages actually use; the negatives they must leave
alone (dates, versions, prices, times, long ids) are in tests/test_curate_pii.py.
"""

from __future__ import annotations

import ipaddress
import re

EMAIL_TOKEN = "|||EMAIL_ADDRESS|||"
PHONE_TOKEN = "|||PHONE_NUMBER|||"
IP_TOKEN = "|||IP_ADDRESS|||"

_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}\b"
)

# North American: optional +1 / 1-, area code (bare or in parentheses), 3 digits, 4 digits.
_US_PHONE = r"(?:\+?1[\s.-]?)?(?:\(\d{3}\)|\d{3})[\s.-]?\d{3}[\s.-]?\d{4}"
# International: +country code then 2..6 groups of digits; the digit count is checked below.
_INTL_PHONE = r"\+\d{1,3}(?:[\s.-]?\(?\d{1,5}\)?){2,6}"
_PHONE = re.compile(rf"(?<![\w+$€£.,/-])(?:{_INTL_PHONE}|{_US_PHONE})(?![\w%]|[.,/-]\d)")

_IPV4_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.])(?:{_IPV4_OCTET}\.){{3}}{_IPV4_OCTET}(?!\w|\.\d)")
_IPV6_CANDIDATE = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")


def mask_emails(text: str) -> tuple[str, int]:
    """Replace e-mail addresses with |||EMAIL_ADDRESS|||; return (text, how many)."""
    if "@" not in text:  # most documents: skip the regex scan
        return text, 0
    return _EMAIL.subn(EMAIL_TOKEN, text)


def _phone_or_same(m: re.Match) -> str:
    digits = sum(c.isdigit() for c in m.group(0))
    return PHONE_TOKEN if 10 <= digits <= 15 else m.group(0)


def mask_phone_numbers(text: str) -> tuple[str, int]:
    """Replace phone numbers (US forms and +country forms, 10..15 digits) with |||PHONE_NUMBER|||."""
    count = 0

    def sub(m: re.Match) -> str:
        nonlocal count
        out = _phone_or_same(m)
        count += out is PHONE_TOKEN
        return out

    return _PHONE.sub(sub, text), count


def mask_ips(text: str) -> tuple[str, int]:
    """Replace IPv4 and IPv6 addresses with |||IP_ADDRESS|||; return (text, how many)."""
    text, n4 = _IPV4.subn(IP_TOKEN, text)
    n6 = 0
    if "::" not in text and text.count(":") < 7:  # no IPv6 form is possible: skip that scan
        return text, n4

    def sub6(m: re.Match) -> str:
        nonlocal n6
        candidate = m.group(0)
        # a digit is required: "a::b" (C++ scopes, ratios) parses as IPv6 but never is one on the web
        if candidate.count(":") < 2 or not any(c.isdigit() for c in candidate):
            return candidate
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            return candidate  # times like 12:30:45 and other colon runs
        n6 += 1
        return IP_TOKEN

    text = _IPV6_CANDIDATE.sub(sub6, text)
    return text, n4 + n6


def mask_pii(text: str) -> tuple[str, dict[str, int]]:
    """All three maskers; e-mails and IPs first so their digits are never read as phones."""
    text, emails = mask_emails(text)
    text, ips = mask_ips(text)
    text, phones = mask_phone_numbers(text)
    return text, {"emails": emails, "ips": ips, "phones": phones}
