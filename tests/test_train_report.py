"""report.md brought up to date at every checkpoint reads only what metrics.jsonl gained since the last report: a run of
a million logged steps re-read and re-parsed the whole file, and redrew every point, on rank 0 at each checkpoint."""

from __future__ import annotations

import json
import math

import pytest

from cookmind.train import report
from cookmind.train.metrics import MetricsWriter


def _row(step: int, shift: float = 0.0) -> dict:
    return {"step": step, "split": "train", "loss": 3.0 - step / 100 + shift, "lr": 1e-3, "reward": step / 50}


def _val(step: int) -> dict:
    return {"step": step, "split": "val", "val_loss": 2.5 - step / 200, "val_accuracy": step / 40, "val_problems": 8}


def _append(path, rows) -> None:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def _plotted(monkeypatch) -> dict:
    """What each plot of the next report draws, by file name (plot_series' and plot_panels' arguments)."""
    seen = {}
    real_series, real_panels = report.plot_series, report.plot_panels

    def series(path, s, *a, **kw):
        seen[path.name] = {k: (list(xs), list(ys)) for k, (xs, ys) in s.items()}
        return real_series(path, s, *a, **kw)

    def panels(path, p, **kw):
        seen[path.name] = {n: {k: (list(xs), list(ys)) for k, (xs, ys) in lines.items()} for n, lines in p.items()}
        return real_panels(path, p, **kw)

    monkeypatch.setattr(report, "plot_series", series)
    monkeypatch.setattr(report, "plot_panels", panels)
    return seen


def _both(run, monkeypatch, kept: report.MetricsSeries) -> tuple:
    """The report written with ``kept`` (brought up to date) and one written from scratch: (text, plots) each."""
    seen = _plotted(monkeypatch)
    report.write_report(run, "run", {"status": "running"}, counts=("problems",), series=kept)
    incremental = ((run / "report.md").read_text(), dict(seen))
    seen.clear()
    report.write_report(run, "run", {"status": "running"}, counts=("problems",))
    return incremental, ((run / "report.md").read_text(), dict(seen))


def _naive_losses(path) -> tuple[list, list]:
    """The train rows' (steps, losses) of every whole line: an independent full read."""
    rows = [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1] if line.strip()]
    train = [r for r in rows if r.get("split") == "train"]
    return [r["step"] for r in train], [r["loss"] for r in train]


def test_an_incremental_report_equals_one_from_scratch_after_appends_a_cut_line_and_a_resume(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.jsonl"
    kept = report.MetricsSeries(path)
    _append(path, [*map(_row, range(1, 6)), _val(5)])
    first, scratch = _both(run, monkeypatch, kept)
    assert first == scratch
    _append(path, [*map(_row, range(6, 11)), _val(10)])
    with open(path, "a") as f:
        f.write('{"step": 11, "split": "train", "lo')  # a kill in the middle of a write
    grown, scratch = _both(run, monkeypatch, kept)
    assert grown == scratch
    assert grown[1]["loss.png"]["train"] == _naive_losses(path) and grown[1]["loss.png"]["train"][0][-1] == 10
    assert "cut short" in grown[0]  # the cut row is said, not dropped silently
    assert "problems" not in grown[1]["objective.png"] and grown[1]["objective.png"]["accuracy"]["val"][0] == [5, 10]
    # the resume from the checkpoint at step 7 rewinds the file (its rows after step 7 and the cut line go) and logs
    # steps 8.. again, with other values
    assert MetricsWriter(path).rewind(7)
    _append(path, [_row(s, shift=0.5) for s in range(8, 13)])
    resumed, scratch = _both(run, monkeypatch, kept)
    assert resumed == scratch
    assert resumed[1]["loss.png"]["train"] == _naive_losses(path)
    assert resumed[1]["loss.png"]["train"][1][-1] == pytest.approx(3.0 - 12 / 100 + 0.5)
    assert "cut short" not in resumed[0] and resumed[1]["objective.png"]["accuracy"]["val"][0] == [5]


def test_each_report_of_a_run_parses_only_the_rows_logged_since_the_last(tmp_path, monkeypatch):
    """Counted by the lines json.loads reads while the reports are written (not timed): each row of metrics.jsonl is
    parsed once over the run, the checkpoints' reports and the end's together."""
    import numpy as np
    from lm_fixtures import TINY

    from cookmind.store import write_store
    from cookmind.train import TrainConfig, Trainer

    rng = np.random.default_rng(0)
    store = tmp_path / "seq"
    write_store(store, "seq", [{"sequence": rng.integers(1, 64, size=80)} for _ in range(8)], vocab_size=64)
    parsed, writing = [], []
    real_loads, real_write = json.loads, report.write_report

    def loads(text, *a, **kw):
        if writing and '"step"' in str(text):  # a row (matplotlib reads its font cache as JSON once)
            parsed[-1] += 1
        return real_loads(text, *a, **kw)

    def write(*a, **kw):
        writing.append(1)
        parsed.append(0)
        try:
            return real_write(*a, **kw)
        finally:
            writing.pop()

    monkeypatch.setattr(json, "loads", loads)
    monkeypatch.setattr(report, "write_report", write)
    cfg = TrainConfig.from_dict(
        {
            "model": dict(TINY),
            "data": {"train_path": str(store), "window_size": 16},
            "train": {"max_steps": 6, "micro_batch_size": 2, "seed": 1},
            "optim": {"lr": 1e-2, "warmup_steps": 1},
            "checkpoint": {"every": 2},
            "logging": {"run_dir": str(tmp_path / "run"), "progress": False, "log_every": 1, "report": True},
        }
    )
    Trainer(cfg).fit()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(parsed) == 3, parsed  # at the checkpoints of steps 2 and 4, and as the run ends
    assert sum(parsed) == len(lines), (parsed, len(lines))  # a full re-read each time parsed 2 + 4 + 6 train rows
    assert max(parsed) <= 3, parsed  # two steps' rows (and the end's evaluation) a report


def test_a_long_series_is_drawn_thinned_and_the_report_says_so(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    _append(run / "metrics.jsonl", map(_row, range(1, 11)))
    monkeypatch.setattr(report, "PLOT_POINTS", 4)
    seen = _plotted(monkeypatch)
    report.write_report(run, "run", {})
    # every 3rd row of 10 (ceil(10 / 4)): rows 1, 4, 7, 10; the last is drawn always
    assert seen["loss.png"]["train"][0] == [1, 4, 7, 10]
    assert seen["objective.png"]["reward"]["train"] == ([1, 4, 7, 10], [0.02, 0.08, 0.14, 0.2])
    assert "every 3rd of the 10 logged" in (run / "report.md").read_text()
    assert math.isclose(seen["loss.png"]["train"][1][-1], 2.9)


def test_a_panel_of_held_out_figures_alone_says_they_are_held_out(tmp_path, monkeypatch):
    """objective.png drew a metric only the evaluation logs (GRPO's held-out format_rate) as one line in the first
    colour, with no legend, as a training curve looks: a reader took the held-out figure for the training one. A
    panel says which its lines are wherever it is not the training curve alone, and draws each in its own colour."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    legends = {}
    real_legend = Axes.legend

    def legend(self, *a, **kw):
        legends[self.get_title()] = [(line.get_label(), line.get_color()) for line in self.get_lines()]
        return real_legend(self, *a, **kw)

    monkeypatch.setattr(Axes, "legend", legend)
    panels = {"reward": {"train": ([1, 2], [0.1, 0.2])}, "format_rate": {"val": ([1, 2], [0.5, 0.6])}}
    panels["accuracy"] = {"train": ([1, 2], [0.0, 0.5]), "val": ([2], [0.25])}
    report.plot_panels(tmp_path / "objective.png", panels)
    # and a held-out line has the one colour in every panel: the second (C1), as beside a training curve
    assert legends == {"format_rate": [("val", "C1")], "accuracy": [("train", "C0"), ("val", "C1")]}, legends


def test_a_bad_row_keeps_what_was_read_before_it_and_is_read_again_from_its_own_line(tmp_path):
    # update() added the rows before a bad line, then raised without moving past them: the next update read them
    # again (each step twice in every curve) and counted their lines again (the error named line 6, not 3)
    path = tmp_path / "metrics.jsonl"
    good = [json.dumps(_row(s)) + "\n" for s in (1, 2)]
    bad = '{"step": 3, "split": "train", "loss": 2.97, "lr": 0.001, "reward": 0.06 oops\n'
    path.write_text("".join(good) + bad)
    kept = report.MetricsSeries(path)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"metrics\.jsonl:3: not a JSON row"):
            kept.update()
    assert list(kept.steps) == [1, 2]
    fixed = json.dumps(_row(3)).ljust(len(bad) - 1) + "\n"  # the same file, the line mended in place
    with open(path, "r+") as f:
        f.seek(len("".join(good)))
        f.write(fixed)
    kept.update()
    assert list(kept.steps) == [1, 2, 3] and list(kept.loss) == [_row(s)["loss"] for s in (1, 2, 3)]


def test_a_line_still_being_written_is_read_once_it_ends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    line = json.dumps(_row(2)) + "\n"
    path.write_text(json.dumps(_row(1)) + "\n" + line[:20])
    kept = report.MetricsSeries(path).update()
    assert list(kept.steps) == [1] and kept.cut_short == 20
    with open(path, "a") as f:
        f.write(line[20:])
    kept.update()
    assert list(kept.steps) == [1, 2] and kept.cut_short == 0


def test_read_metrics_skips_a_cut_last_line_saying_so_and_names_a_bad_line_before_it(tmp_path):
    from cookmind.train.metrics import read_metrics

    path = tmp_path / "metrics.jsonl"
    whole = json.dumps(_row(1)) + "\n" + json.dumps(_row(2)) + "\n"
    path.write_text(whole + '{"step": 3, "split": "tr')  # the trainer is writing its third row
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:3: .*cut short.*\(24 bytes"):
        rows = read_metrics(path)
    assert rows == [_row(1), _row(2)]
    path.write_text(json.dumps(_row(1)) + "\n" + '{"step": 2, "spl\n' + json.dumps(_row(3)) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON row"):
        read_metrics(path)


def test_a_plot_the_new_report_does_not_draw_is_removed_only_where_our_report_had_drawn_it(tmp_path):
    # a report without the objective's metrics (its rows rewound by a resume, or a run of another objective) left
    # the earlier report's objective.png beside it, a figure of rows metrics.jsonl no longer holds
    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics.jsonl"
    _append(path, map(_row, range(1, 4)))
    report.write_report(run, "run", {})
    assert "(objective.png)" in (run / "report.md").read_text() and (run / "objective.png").is_file()
    path.write_text("".join(json.dumps({k: v for k, v in _row(s).items() if k != "reward"}) + "\n" for s in (1, 2)))
    report.write_report(run, "run", {})
    assert sorted(p.name for p in run.iterdir()) == ["loss.png", "lr.png", "metrics.jsonl", "report.md"]
    assert "objective.png" not in (run / "report.md").read_text()
    # a figure of the user's own under that name, which no report of ours drew, stays
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "objective.png").write_bytes(b"the user's")
    (mine / "metrics.jsonl").write_text(path.read_text())
    report.write_report(mine, "run", {})
    assert (mine / "objective.png").read_bytes() == b"the user's"


def test_a_resume_refuses_a_malformed_middle_line_of_metrics_jsonl_naming_it(tmp_path):
    # rewind took any line json could not read for the cut last line of a killed write and dropped it: a damaged row
    # in the middle went silently (its step unknown, it may be one the resume keeps). Only the part after the last
    # end of line is a cut write; a bad line before the rows dropped is refused by file:line, the file as it was
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "split": "train", "loss": 1.0}) for s in (1, 2, 3, 4)]
    text = "\n".join([rows[0], "{not json", *rows[1:]]) + "\n"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{path}:2: not a JSON row .*a resume from step 2 keeps; fix or remove"):
        MetricsWriter(path).rewind(2)
    assert path.read_text() == text
    # one among the rows the resume drops (after a row past the step: rows are logged in step order) goes with them,
    # named; so does one where the resume keeps no step (an attempt that saved no checkpoint)
    for step, want in ((2, [3, -1, 4]), (-1, [1, 2, 3, -1, 4])):
        bad = "\n".join([*rows[:3], "{not json", rows[3]]) + "\n"
        path.write_text(bad)
        with pytest.warns(UserWarning, match=rf"^{path}:4: not a JSON row .*dropped with the rows logged after step "):
            assert MetricsWriter(path).rewind(step) == want
        assert path.read_text() == "".join(r + "\n" for r in rows[: max(step, 0)])
    # a cut last line (no end of line) still goes, with the rows after the step
    path.write_text("\n".join(rows) + '\n{"step": 5, "spl')
    assert MetricsWriter(path).rewind(2) == [3, 4, -1]
    assert path.read_text() == "\n".join(rows[:2]) + "\n"
