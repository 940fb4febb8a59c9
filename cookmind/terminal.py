"""Untrusted text on a terminal (model text, and the file names and file lines an error or warning quotes): its control
characters are shown escaped, never written as they are. Nothing here imports other cookmind packages: the CLI's
error and warning lines use it without loading a stage.

A model can sample any character, and a prompt can ask it for any text: an ESC written raw lets the output drive the
terminal with escape sequences (clear the screen, set the window title, write the clipboard with OSC 52), and a
``\\r`` lets text overwrite the line it is on. ``escape_controls`` shows each C0 control but the newline and the tab,
DEL, and the C1 controls (U+0080-U+009F: U+009B is a one-character CSI to some terminals) as Python writes them in a
string literal: ``\\r``, ``\\x1b``, ``\\x7f``, ``\\x9b``.

And the characters that make a terminal show text otherwise than it is: the Unicode bidirectional controls (the
embeddings, overrides and isolates U+202A-U+202E and U+2066-U+2069, the marks U+200E, U+200F and U+061C) reorder what
follows them on the line ("Trojan Source": a reply that reads "rm -rf ~ # safe" may hold other text in another order),
and the line and paragraph separators U+2028 and U+2029 are blank on one terminal and a line break on another (or in
a pager), so a reply could show a line it does not hold. They are written as Python writes them too (``\\u202e``).
Other invisible characters are left as they are: the zero-width joiner and non-joiner (U+200C, U+200D) are part of
emoji sequences and of Indic and Persian words, the tag characters (U+E0020-U+E007F) of flag emoji, and none of them
moves or hides the text around it.

The rest of the text, backslashes included, is left as it is, so model text that spells ``\\x1b`` reads the same
(``generate --raw`` prints the text as generated). Only what a terminal shows is escaped: the server's replies, a
chat's history and the files written keep the text as generated. A file name in an error line is escaped the same
way: a file named with an ESC set the terminal's title, and one with U+202E showed its name reversed; and so is every
note and summary a stage prints for a person (``show``), which quotes paths, file lines and config values. Machine
output (JSON lines, the files and reports written) keeps the text: JSON writes the C0 controls as ``\\u001b`` itself,
and the JSON lines printed keep json's default ``ensure_ascii``, which writes every other non-ASCII character, the bidi
controls too, as ``\\u202e``: still the same strings to a program that parses them.
"""

from __future__ import annotations

import os
import sys

_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\n\t"}
_ESCAPES[ord("\r")] = "\\r"
# bidirectional controls and the line/paragraph separators: they change what a terminal shows, not what it does
SPOOFING = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
_ESCAPES.update({c: f"\\u{c:04x}" for c in SPOOFING})
# a line that must stay one (an error, a note, a summary): a newline in a file name it quotes is shown as \n
_ONE_LINE = {**_ESCAPES, ord("\n"): "\\n"}


def escape_controls(text: str, one_line: bool = False) -> str:
    """``text`` with its control characters but ``\\n`` and ``\\t``, and the characters that reorder or break what a
    terminal shows (``SPOOFING``), escaped, for a terminal. One character at a time, so the pieces of a stream escape
    to the pieces of the whole text's escape. ``one_line``: the newline too (``\\n``), for a line that quotes a file
    name (which may hold one) and must not break in two, where the second part would read as a line of its own."""
    return text.translate(_ONE_LINE if one_line else _ESCAPES)


def show(text: object, file=None, one_line: bool = True) -> None:
    """Print ``text``, a line for a person to read (``one_line`` False: lines, a report), on ``file`` (stdout by
    default) with its control and bidi characters escaped (``escape_controls``; a line's newline too): the one printer
    of the notes and summaries that quote a path, a file line or a config value the user gave. JSON and the files
    written are printed as they are, not through here. The text and its newline go out in one write: ranks under
    torchrun share one stderr, and print's two writes (the text, then the newline) let their lines run together."""
    (sys.stdout if file is None else file).write(escape_controls(str(text), one_line) + "\n")


def say_from_handler(line: str) -> None:
    """Write ``line`` from a signal handler: it and its newline in one ``os.write`` to fd 2, not print. The handler
    runs inside whatever the main thread was doing, a write to sys.stderr too (a progress bar's), and a print into the
    buffer it interrupted raises "reentrant call". On a terminal a newline goes first, ending the line a progress bar
    (or the echoed ^C) left open; in a pipe or a log every line ends in its own. With no stderr left to tell (closed,
    its reader gone) nothing is said: the stop goes on."""
    try:
        start = "\n" if os.isatty(2) else ""
        os.write(2, f"{start}{line}\n".encode())
    except OSError:
        pass
