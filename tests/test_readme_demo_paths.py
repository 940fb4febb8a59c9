"""The README's and docs' commands that name a run of `cookmind demo` (runs/demo/runs/NAME) name one it writes: the
README's `generate ... --prompt-file -` line named runs/demo/runs/pre, which no demo writes ("no such directory")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_RUNS = {"pretrain", "sft", "dpo", "grpo"}  # a finished demo's runs/ (its report.md lists these stages)


def test_every_demo_run_the_docs_name_is_one_the_demo_writes():
    named = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for run in re.findall(r"runs/demo/runs/([A-Za-z0-9_.-]+)", line):
                named.setdefault(run, []).append(f"{doc.name}:{n}")
    assert named, "no demo run is named: the pattern no longer matches the docs"
    unknown = {run: where for run, where in named.items() if run not in DEMO_RUNS}
    assert unknown == {}, unknown
