"""#17.6: a checkpoint folder is untrusted input; a pickle in it that would run code is refused, not run."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import torch
from lm_fixtures import tiny_lm

from cookmind.optim import AdamW
from cookmind.train.checkpoint import load_checkpoint, save_checkpoint


class _Payload:
    """Unpickling this calls os.mkdir(marker): code execution, if the loader allows arbitrary objects."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_crafted_optimizer_pickle_is_refused_without_running(tmp_path):
    model = tiny_lm()
    opt = AdamW(model.parameters(), lr=1e-2)
    path = save_checkpoint(tmp_path / "run", 1, model, opt, {})
    marker = tmp_path / "pwned"
    torch.save({"optimizer": _Payload(marker)}, path / "optimizer.pt")
    # a checksum is no signature: whoever can plant the file can record its SHA-256 in meta.json too
    meta = json.loads((path / "meta.json").read_text())
    meta["sha256"]["optimizer.pt"] = hashlib.sha256((path / "optimizer.pt").read_bytes()).hexdigest()
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=re.escape(str(path / "optimizer.pt")) + r": refused to load"):
        load_checkpoint(path, model, opt)
    assert not marker.exists()


def test_no_unsafe_unpickling_in_the_package():
    root = Path(__file__).resolve().parents[1] / "cookmind"
    unsafe = re.compile(r"weights_only\s*=\s*False|pickle\.loads?\(|allow_pickle\s*=\s*True")
    found = [
        f"{p.relative_to(root.parent)}:{n}"
        for p in sorted(root.rglob("*.py"))
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if unsafe.search(line)
    ]
    assert found == []
