"""HTML -> main-content plain text with resiliparse (boilerplate such as menus and footers dropped)."""

from __future__ import annotations

import codecs
import re

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.encoding import bytes_to_str, detect_encoding, map_encoding_to_html5

from cookmind import text_input


def charset_of(content_type: str | None) -> str | None:
    """The ``charset`` parameter of a Content-Type header (``text/html; charset="cp1251"`` -> ``cp1251``), or None."""
    m = re.search(r"""charset\s*=\s*["']?([^"';\s]+)""", content_type or "", re.IGNORECASE)
    return m.group(1) if m else None


def decode_html(html: bytes | str, http_charset: str | None = None) -> str:
    """Bytes -> str by the first that holds: a UTF-8 BOM; the HTTP header's charset (``http_charset``, a crawled
    page's authoritative one), if Python knows it and the bytes decode in it; valid UTF-8; the page's meta charset,
    else resiliparse's byte statistics. Labels are read as browsers read them (iso-8859-1 as windows-1252)."""
    return decode_html_noting(html, http_charset)[0]


def decode_html_noting(html: bytes | str, http_charset: str | None = None) -> tuple[str, dict | None]:
    """``decode_html``'s text, and what of a page that a UTF-8 BOM marks as UTF-8 was not (read as U+FFFD, as a
    browser reads it): ``text_input.decode_replacing``'s count, None for any other page (the other ways decode every
    byte in some encoding)."""
    if isinstance(html, str):
        return html, None
    if html.startswith(codecs.BOM_UTF8):
        return text_input.decode_replacing(html)
    if http_charset:
        try:
            codecs.lookup(http_charset)  # resiliparse maps an unknown label to UTF-8: ask Python first
            return html.decode(map_encoding_to_html5(http_charset)).removeprefix("\ufeff"), None
        except (LookupError, UnicodeDecodeError):
            pass  # an unknown label, or bytes that are not in it: the page's own bytes decide
    try:  # uchardet alone calls a UTF-8 page with a few accents cp1252 (mojibake), even under <meta charset=utf-8>
        return html.decode("utf-8"), None
    except UnicodeDecodeError:
        return bytes_to_str(html, detect_encoding(html, from_html_meta=True)), None


def extract_text(html_bytes: bytes | str, main_content: bool = True) -> str | None:
    """The readable text of an HTML page, or None when nothing readable is left.

    ``main_content=True`` asks resiliparse to drop navigation, headers and footers
    (its boilerplate heuristics); lists, alt texts and forms are dropped too.
    """
    html = decode_html(html_bytes)
    text = extract_plain_text(
        html,
        main_content=main_content,
        alt_texts=False,
        links=False,
        list_bullets=False,
        noscript=False,
        form_fields=False,
    )
    text = text.strip()
    return text or None
