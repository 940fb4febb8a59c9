"""Progress bars of the long commands (``curate``, ``pack``, ``train``), one way for all: a tqdm bar on a terminal
(rate, and ETA where the total is known); in a pipe or a log, plain lines, one every ``LINE_SECONDS`` and one at
the end, each ending in a newline, with no carriage returns and no cursor moves; nothing with ``enabled=False``
(``--quiet``, ``logging.progress=false``).

tqdm writes its updates into a pipe as it draws them on a terminal: ``\\r`` and the whole bar again, a few times a
second, and a second bar under the first (curate's documents under its shards) moved to with ``ESC[A``. A log of a
long run was one line, thousands of screens long, that ``tail -f`` showed nothing of until the run ended, with
escape codes in it.
"""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

# seconds between two progress lines in a pipe or a log (on a terminal tqdm redraws as it does)
LINE_SECONDS = 30.0


def is_terminal(file) -> bool:
    """Whether ``file`` is a terminal (one that is closed or has no ``isatty``: no)."""
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _has_size(file) -> bool:
    """Whether the terminal ``file`` says how many columns and rows it has (one that cannot be asked: yes, tqdm
    then takes its defaults)."""
    try:
        size = os.get_terminal_size(file.fileno())
    except (AttributeError, ValueError, OSError):
        return True
    return bool(size.columns and size.lines)


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel, where tqdm.auto draws a widget (a bar suits a notebook, not lines);
    tqdm.autonotebook's test."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        return shell is not None and "IPKernelApp" in shell.config
    except Exception:  # noqa: BLE001 - an IPython without a kernel, or one that answers otherwise: a console
        return False


def progress_bar(iterable=None, *, enabled: bool = True, file=None, **kwargs) -> tqdm:
    """A tqdm bar (``kwargs`` as tqdm takes them) over ``iterable`` or updated by hand: drawn on a terminal, plain
    lines in a pipe or a log (a bar under another one, ``position`` > 0, or one that goes when done, ``leave=False``,
    writes its lines there only once it has lasted ``LINE_SECONDS``, and then its last one too), disabled where not
    ``enabled``. ``file``: stderr by default."""
    file = sys.stderr if file is None else file
    if not enabled:
        return tqdm(iterable, disable=True, **kwargs)
    if is_terminal(file):
        if not _has_size(file):
            # a terminal that says it is 0 x 0 (a pseudo-terminal nobody sized: `script`, `docker exec -t`, some CI
            # runners): tqdm fitted its bar on stderr to 0 rows and drew nothing at all
            kwargs.update(dynamic_ncols=False, ncols=kwargs.get("ncols") or 80, nrows=kwargs.get("nrows") or 24)
        return tqdm(iterable, file=file, **kwargs)
    if _in_notebook():
        from tqdm.auto import tqdm as auto

        return auto(iterable, file=file, **kwargs)
    if kwargs.get("position") or kwargs.get("leave") is False:
        # a bar under another or one that goes when done (curate's documents under its shards, one per shard): its
        # lines only where it lasts LINE_SECONDS, not two for every short one
        kwargs["delay"] = max(LINE_SECONDS, kwargs.get("delay") or 0)
    return LineBar(iterable, file=file, **kwargs)


class _DropControl:
    """The file a ``LineBar`` hands tqdm: tqdm's own lone writes (``\\r`` to clear its line, ``\\n`` after a bar that
    stays) are dropped; the bar's lines go to the file itself."""

    def __init__(self, file):
        self.file = file

    def write(self, text: str) -> None:
        if text.strip("\r\n"):
            self.file.write(text)

    def flush(self) -> None:
        self.file.flush()


class LineBar(tqdm):
    """tqdm for a pipe or a log: each update it shows is a line of its own (the stats: count, total, elapsed, ETA,
    rate and the postfix; no bar drawn), at most one every ``LINE_SECONDS``, and the last count when it closes."""

    def __init__(self, iterable=None, file=None, **kwargs):
        self._out = sys.stderr if file is None else file
        self._shown = None  # the count and total the last line showed: closing after it adds no second line of it
        self._last = None  # when the last line was written (time.monotonic)
        kwargs.update(
            mininterval=max(LINE_SECONDS, kwargs.get("mininterval") or 0),
            maxinterval=max(LINE_SECONDS, kwargs.get("maxinterval") or 0),
            dynamic_ncols=False,
            ncols=0,  # no bar: the numbers only
            ascii=True,
            leave=True,  # the last state is the line a log keeps
            position=None,
        )
        super().__init__(iterable, file=_DropControl(self._out), **kwargs)

    def display(self, msg=None, pos=None):
        if msg == "" or (msg is None and (self.n, self.total) == self._shown):  # tqdm clears its line: it stays
            return True
        now = time.monotonic()
        # a refresh (pos None: update, set_postfix...) within LINE_SECONDS of the last line writes none: pack's
        # postfix after every chunk made a line of each; the first line, and the last count at close (pos 0), are
        if msg is None and pos is None and self._last is not None and now - self._last < LINE_SECONDS:
            return True
        self._last = now
        self._shown = (self.n, self.total) if msg is None else self._shown
        self._out.write((self.__str__() if msg is None else msg).rstrip() + "\n")
        self._out.flush()
        return True
