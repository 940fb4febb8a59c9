"""HTML -> main-content plain text with resiliparse (boilerplate such as menus and footers dropped)."""

from __future__ import annotations

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.encoding import bytes_to_str, detect_encoding


def decode_html(html: bytes | str) -> str:
    """Bytes -> str: valid UTF-8 as UTF-8, else the page's meta charset, else resiliparse's byte statistics."""
    if isinstance(html, str):
        return html
    try:  # uchardet alone calls a UTF-8 page with a few accents cp1252 (mojibake), even under <meta charset=utf-8>
        return html.decode("utf-8-sig")
    except UnicodeDecodeError:
        return bytes_to_str(html, detect_encoding(html, from_html_meta=True))


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
