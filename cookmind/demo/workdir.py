"""A demo's work directory: the demo writes only into a folder that is new, empty, or its own.

``.cookmind-demo.json`` in the folder names the command that made it and every file it wrote there (taken before
and after each stage), so a rerun replaces the demo's own output and nothing else: a folder holding a file the
record does not name is refused before any work, in one line naming that file. A run cut short during a stage
leaves that stage recorded as running; what appeared in the folder while it ran is taken as the demo's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cookmind.atomic import is_temp_name, write_json

RECORD = ".cookmind-demo.json"


class DemoWorkdir:
    """``claim()`` before any work, ``record(running=stage)`` before each stage, ``record()`` at the end."""

    def __init__(self, path: str | os.PathLike, command: str):
        self.path, self.command = Path(path), command

    def claim(self) -> None:
        """Refuse a workdir holding anything this command did not write there; create or take it."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise FileExistsError(f"--workdir {p} is a file; give a folder (new, empty, or an earlier demo's)")
        record = self._read()
        if record and record.get("command") != self.command:
            raise FileExistsError(
                f"--workdir {p} is the work folder of `cookmind {record.get('command')}`, not of "
                f"`cookmind {self.command}`; choose another --workdir"
            )
        ours = set(record.get("files", [])) if record else set()
        if not (record and record.get("running")):  # after an interrupted stage, what appeared is the demo's
            foreign = [f for f in self.files() if f not in ours]
            if foreign:
                raise FileExistsError(
                    f"--workdir {p} holds {foreign[0]}, which `cookmind {self.command}` did not write there "
                    f"({len(foreign)} such files); it replaces only its own output: choose a new or empty "
                    "--workdir, or move them away"
                )
        p.mkdir(parents=True, exist_ok=True)
        self.record(running=record.get("running") if record else None)

    def record(self, running: str | None = None) -> None:
        """Write the record: every file now in the workdir, and the stage running (None: none)."""
        write_json(self.path / RECORD, {"command": self.command, "running": running, "files": self.files()})

    def files(self) -> list[str]:
        """Every file (and link) under the workdir, relative, but the record and temporary names."""
        out = []
        for root, dirs, names in os.walk(self.path):
            rel = Path(root).relative_to(self.path)
            links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
            dirs[:] = [d for d in dirs if d not in links and not is_temp_name(d)]
            out += [(rel / n).as_posix() for n in names + links if not is_temp_name(n)]
        return sorted(f for f in out if f != RECORD)

    def _read(self) -> dict | None:
        try:
            record = json.loads((self.path / RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None
