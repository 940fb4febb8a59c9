"""Per-stage statistics (documents kept/removed, reasons, bytes, CPU seconds) and the report."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from pathlib import Path

from cookmind.atomic import write_text


@dataclasses.dataclass
class StageStats:
    """What one stage did to the documents that reached it."""

    name: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    reasons: Counter = dataclasses.field(default_factory=Counter)  # removal reason -> documents
    counters: Counter = dataclasses.field(default_factory=Counter)  # e.g. emails masked, lines removed
    seconds: float = 0.0
    dropped: list | None = None  # (reason, document) of each removal, when the run lists them (--removed)
    first_at: dict = dataclasses.field(default_factory=dict)  # counter -> where its first instance is (file:line)

    def drop(self, reason: str, doc: dict) -> bool:
        """Count ``doc``'s removal under ``reason`` (noting the document when removals are listed); returns False."""
        self.reasons[reason] += 1
        if self.dropped is not None:
            self.dropped.append((reason, doc))
        return False

    @property
    def removed(self) -> int:
        return self.docs_in - self.docs_out

    def merge(self, other: StageStats) -> StageStats:
        """Add another shard's numbers into this one."""
        self.docs_in += other.docs_in
        self.docs_out += other.docs_out
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.reasons.update(other.reasons)
        self.counters.update(other.counters)
        self.seconds += other.seconds
        for key, where in other.first_at.items():
            self.first_at.setdefault(key, where)
        return self

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "docs_in": self.docs_in,
            "kept": self.docs_out,
            "removed": self.removed,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "reasons": dict(sorted(self.reasons.items())),
            "counters": dict(sorted(self.counters.items())),
            "seconds": round(self.seconds, 4),
            **({"first_at": dict(self.first_at)} if self.first_at else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> StageStats:
        return cls(
            name=d["name"],
            docs_in=d["docs_in"],
            docs_out=d["kept"],
            bytes_in=d["bytes_in"],
            bytes_out=d["bytes_out"],
            reasons=Counter(d["reasons"]),
            counters=Counter(d["counters"]),
            seconds=d["seconds"],
            first_at=dict(d.get("first_at", {})),
        )


def text_bytes(doc: dict) -> int:
    """UTF-8 size of a document's text (its HTML before extraction)."""
    body = doc.get("text")
    if body is None:
        body = doc.get("html") or ""
    return len(body.encode("utf-8", errors="replace"))


def render_markdown(
    stages: list[StageStats], title: str = "Curation report", removed: str | None = None, notes: list[str] = ()
) -> str:
    """A Markdown table, one row per stage in pipeline order, then the removal reasons (and where they are listed),
    then the stages' notes (what a user may want to change)."""
    lines = [
        f"# {title}",
        "",
        "| stage | in | kept | removed | removed % | MB in | MB out | CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stages:
        pct = 100.0 * s.removed / s.docs_in if s.docs_in else 0.0
        lines.append(
            f"| {s.name} | {s.docs_in} | {s.docs_out} | {s.removed} | {pct:.1f} | "
            f"{s.bytes_in / 1e6:.3f} | {s.bytes_out / 1e6:.3f} | {s.seconds:.2f} |"
        )
    lines += ["", "## Reasons and counters", ""]
    for s in stages:
        parts = [f"{k}: {v}" for k, v in sorted(s.reasons.items())] + [
            f"{k}: {v}" for k, v in sorted(s.counters.items())
        ]
        if parts:
            lines.append(f"- **{s.name}**: " + ", ".join(parts))
    if removed:
        lines += ["", f"Removed documents, each with its stage and reason: `{removed}/shard-*.jsonl.gz`"]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def write_report(
    stages: list[StageStats],
    out_dir: str | os.PathLike,
    removed: str | os.PathLike | None = None,
    notes: list[str] = (),
    files_left_out: dict[str, int] | None = None,
) -> tuple[Path, Path]:
    """``report.json`` and ``report.md`` in ``out_dir``, each written atomically; ``removed``: the folder listing
    the removed documents, if the run wrote one; ``notes``: the stages' notes on what they did; ``files_left_out``:
    the input folders' files that are not documents, by suffix (report.json's ``input_files_left_out``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    left = dict(sorted((files_left_out or {}).items(), key=lambda kv: (-kv[1], kv[0])))  # most first, as the note
    payload = {
        "stages": [s.to_dict() for s in stages],
        "input_docs": stages[0].docs_in if stages else 0,
        "output_docs": stages[-1].docs_out if stages else 0,
        **({"removed": str(removed)} if removed else {}),
        **({"notes": list(notes)} if notes else {}),
        **({"input_files_left_out": left} if left else {}),
    }
    paths = []
    for name, body in (
        ("report.json", json.dumps(payload, indent=2) + "\n"),
        ("report.md", render_markdown(stages, removed=removed and str(removed), notes=notes)),
    ):
        write_text(out_dir / name, body)
        paths.append(out_dir / name)
    return paths[0], paths[1]
