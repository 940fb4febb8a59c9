"""`cookmind curate --restart` deletes only a curate run's own work folder (issue #17.1, same rule as --overwrite)."""

from __future__ import annotations

import pytest

from cookmind.curate.config import CurateConfig
from cookmind.curate.runner import WORK, run_pipeline


def test_restart_refuses_a_work_folder_curate_did_not_make(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "docs.jsonl").write_text('{"id": "a", "text": "hello world"}\n')
    mine = tmp_path / "out" / WORK
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("precious")
    cfg = CurateConfig(stages=[{"pii": {}}])
    with pytest.raises(ValueError, match="not made by cookmind curate"):
        run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "out", restart=True, progress=False)
    assert (mine / "notes.txt").read_text() == "precious"
