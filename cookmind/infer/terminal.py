"""Model text on a terminal: its control characters are shown escaped, never written as they are.

A model can sample any character, and a prompt can ask it for any text: an ESC written raw lets the output drive the
terminal with escape sequences (clear the screen, set the window title, write the clipboard with OSC 52), and a
``\\r`` lets text overwrite the line it is on. ``escape_controls`` shows each C0 control but the newline and the tab,
DEL, and the C1 controls (U+0080-U+009F: U+009B is a one-character CSI to some terminals) as Python writes them in a
string literal: ``\\r``, ``\\x1b``, ``\\x7f``, ``\\x9b``. The rest of the text, backslashes included, is left as it is,
so model text that spells ``\\x1b`` reads the same (``generate --raw`` prints the text as generated). Only what a
terminal shows is escaped: the server's replies, a chat's history and the files written keep the text as generated.
"""

from __future__ import annotations

_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\n\t"}
_ESCAPES[ord("\r")] = "\\r"


def escape_controls(text: str) -> str:
    """``text`` with its control characters but ``\\n`` and ``\\t`` escaped, for a terminal. One character at a time,
    so the pieces of a stream escape to the pieces of the whole text's escape."""
    return text.translate(_ESCAPES)
