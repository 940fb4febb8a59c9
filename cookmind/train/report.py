"""The run report: ``report.md`` with loss and learning-rate curves (PNG), the objective's own metrics (GRPO's reward
and accuracy, DPO's reward margin, ...) as curves, and sample generations."""

from __future__ import annotations

import json
import math
import os
from array import array
from pathlib import Path
from typing import Any

from cookmind.atomic import write_text, writing
from cookmind.run_layout import LOSS_PLOT, LR_PLOT, OBJECTIVE_PLOT, REPORT_NAME, RUN_METRICS
from cookmind.train.metrics import STEP_BOOKKEEPING, is_number

# the most rows a curve draws: a figure 600 pixels wide shows no more, and a million rows took seconds to draw at every
# checkpoint. A longer series is drawn at every stride-th row (and its last), as log_every samples the steps; the
# report says so
PLOT_POINTS = 2000
# a train row's keys that are not the objective's own metrics
_NOT_OWN = frozenset(("step", "split", "loss", *STEP_BOOKKEEPING))


class MetricsSeries:
    """metrics.jsonl as the report reads it, kept from one report to the next: ``update`` parses only the lines
    appended since it last read, so a report at each checkpoint of a long run costs what the run logged since the
    last. A file replaced or cut (a resume's rewind rewrites it) is read again from its start. A last line without
    its newline (a write under way, or one a kill cut) is left for later, its bytes counted in ``cut_short``; a line
    that does not parse is a ValueError naming its file:line, the rows before it kept (the next call starts at it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._clear()

    def _clear(self) -> None:
        self._file: tuple[int, int] | None = None  # (device, inode) of the file read
        self._offset = 0  # bytes of whole lines read
        self._tail = b""  # the last of them: a file rewritten under the same name differs there
        self._lines = 0
        self.steps, self.loss, self.lr = array("d"), array("d"), array("d")  # the train rows'
        self.own: dict[str, tuple[array, array]] = {}  # the train rows' own metrics as (steps, values), first logged
        self.val: list[dict[str, Any]] = []  # every evaluation's row
        self.cut_short = 0

    def update(self) -> MetricsSeries:
        """Read what the file gained since the last call (all of it the first time, or when it was rewritten)."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            self._clear()
            return self
        with f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != self._file or st.st_size < self._offset or not self._same_tail(f):
                self._clear()
                self._file = (st.st_dev, st.st_ino)
            f.seek(self._offset)
            data = f.read(st.st_size - self._offset)
        whole = data.rfind(b"\n") + 1
        self.cut_short = len(data) - whole
        start = 0
        while start < whole:  # a line at a time: one that does not parse raises with what came before it kept
            end = data.index(b"\n", start) + 1
            line = data[start:end]
            if line.strip():
                self._add(self._parse(line, self._lines + 1))
            self._lines += 1
            self._offset += len(line)
            self._tail = (self._tail + line)[-64:]
            start = end
        return self

    def _same_tail(self, f) -> bool:
        f.seek(self._offset - len(self._tail))
        return f.read(len(self._tail)) == self._tail

    def _parse(self, line: bytes, n: int) -> dict[str, Any]:
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ValueError(
                f"{self.path}:{n}: not a JSON row ({exc}); the report cannot read it: fix or remove the line"
            ) from None
        if not isinstance(record, dict) or not is_number(record.get("step")):
            raise ValueError(
                f"{self.path}:{n}: a row without a step ({line[:80]!r}); the report cannot read it: fix or "
                "remove the line"
            )
        return record

    def _add(self, r: dict[str, Any]) -> None:
        split, step = r.get("split", "train"), r["step"]
        if split == "train" and "loss" in r:
            self.steps.append(step)
            self.loss.append(_number(r["loss"]))
            self.lr.append(_number(r.get("lr")))
            for name, value in r.items():
                if name not in _NOT_OWN:
                    xs, ys = self.own.setdefault(name, (array("d"), array("d")))
                    if is_number(value):
                        xs.append(step)
                        ys.append(value)
        # every evaluation's row: a GRPO run's held-out accuracy comes without a loss where it has no validation store
        elif split == "val" and any(_is_val_number(k, v) for k, v in r.items()):
            self.val.append(r)


def _number(value: Any) -> float:
    return float(value) if is_number(value) else math.nan


def _stride(n: int) -> int:
    return max(1, -(-n // PLOT_POINTS))


def thinned(xs, ys) -> tuple[list[float], list[float]]:
    """At most ``PLOT_POINTS`` (+1) of the (xs, ys) series: every stride-th point, and the last."""
    stride = _stride(len(xs))
    px, py = list(xs[::stride]), list(ys[::stride])
    if len(xs) and (len(xs) - 1) % stride:
        px.append(xs[-1])
        py.append(ys[-1])
    return px, py


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plot_series(
    path: Path, series: dict[str, tuple[list[float], list[float]]], ylabel: str, logy: bool = False
) -> Path:
    """One PNG with a line per named (x, y) series, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for name, (xs, ys) in series.items():
        if xs:
            ax.plot(xs, ys, label=name, marker="o" if len(xs) < 20 else None, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    with writing(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return path


_COLORS = {"train": "C0", "val": "C1"}  # each line's colour, the same in every panel


def plot_panels(path: Path, panels: dict[str, dict[str, tuple[list[float], list[float]]]], columns: int = 3) -> Path:
    """One PNG with a small plot per named panel, each on its own scale, written atomically; a panel holds a line per
    named (step, value) series (``train``, ``val``), each in its colour, with a legend but for a training curve
    alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = -(-len(panels) // columns)
    cols = min(columns, len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), dpi=100, squeeze=False)
    for ax, (name, lines) in zip(axes.flat, panels.items()):
        for label, (xs, ys) in lines.items():
            color = _COLORS.get(label)  # a held-out line alone is not drawn in the training curve's colour
            ax.plot(xs, ys, label=label, color=color, marker="o" if len(xs) < 20 else None, markersize=3)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if list(lines) != ["train"]:  # a held-out figure alone says so
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    with writing(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return path


# what every evaluation logs besides the objective's own metrics (the loss is plotted with the training loss)
_VAL_GENERIC = ("val_loss", "val_ppl")


def validation_names(val: list[dict[str, Any]]) -> list[str]:
    """The objective's own metrics in metrics.jsonl's val rows (DPO's reward accuracy and margin, GRPO's held-out
    accuracy, ...), without their ``val_`` prefix, in the order first logged."""
    keys = dict.fromkeys(k for r in val for k in r if k.startswith("val_") and k not in _VAL_GENERIC)
    return [k.removeprefix("val_") for k in keys if any(is_number(r.get(k)) for r in val)]


def objective_panels(series: MetricsSeries, counts: tuple[str, ...] = ()) -> dict[str, dict[str, tuple]]:
    """A panel per objective metric: its training curve, and beside it the validation curve of the same name (a
    metric only the evaluation logs gets a panel of its own). The objective's ``counts`` (GRPO's held-out problems
    graded, SFT's supervised tokens) say how big a batch or an evaluation was, no curve to read the objective by:
    they get no panel (the validation table has them)."""
    panels: dict[str, dict[str, tuple]] = {
        name: {"train": thinned(*xy)} for name, xy in series.own.items() if len(xy[0]) and name not in counts
    }
    for name in (n for n in validation_names(series.val) if n not in counts):
        rows = [r for r in series.val if is_number(r.get(f"val_{name}"))]
        panels.setdefault(name, {})["val"] = thinned([r["step"] for r in rows], [r[f"val_{name}"] for r in rows])
    return panels


def write_report(
    run_dir: str | Path,
    title: str,
    summary: dict[str, Any],
    samples: list[dict[str, str]] | None = None,
    config: dict[str, Any] | None = None,
    counts: tuple[str, ...] = (),
    series: MetricsSeries | None = None,
) -> Path:
    """Write ``<run_dir>/report.md`` (+ ``loss.png``, ``lr.png``, and ``objective.png`` when the objective logs
    metrics of its own) from ``metrics.jsonl``; ``counts``: the objective's ``count_metrics``, in the text only;
    ``series``: the run's ``MetricsSeries`` kept from its last report (it reads only what is new), else one of its
    own."""
    run_dir = Path(run_dir)
    series = (series or MetricsSeries(run_dir / RUN_METRICS)).update()
    val = series.val
    val_loss = [r for r in val if is_number(r.get("val_loss"))]
    lines = [f"# {title}", ""]
    if summary:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in summary.items()]
        lines.append("")
    if series.cut_short:
        lines += [
            f"{RUN_METRICS} ends in a row cut short ({series.cut_short} bytes with no end of line: a write the run "
            "was killed in); it is in no curve or table.",
            "",
        ]
    if series.steps:
        loss = {"train": thinned(series.steps, series.loss)}
        if val_loss:
            loss["val"] = thinned([r["step"] for r in val_loss], [r["val_loss"] for r in val_loss])
        plot_series(run_dir / LOSS_PLOT, loss, "loss")
        plot_series(run_dir / LR_PLOT, {"lr": thinned(series.steps, series.lr)}, "learning rate")
        lines += ["## Curves", ""]
        stride = _stride(len(series.steps))
        if stride > 1:
            lines += [
                f"The curves draw every {_ordinal(stride)} of the {len(series.steps)} logged steps (and the last): "
                f"{PLOT_POINTS} points a curve at most; metrics.jsonl has them all.",
                "",
            ]
        lines += [f"![loss]({LOSS_PLOT})", "", f"![learning rate]({LR_PLOT})", ""]
        own = objective_panels(series, counts)
        if own:
            plot_panels(run_dir / OBJECTIVE_PLOT, own)
            lines += ["## The objective's metrics", "", f"![objective metrics]({OBJECTIVE_PLOT})", ""]
    if val:
        # a column per figure the evaluations logged: perplexity where the loss is a token NLL (pretrain, SFT), and
        # the objective's own (DPO's held-out reward accuracy, GRPO's held-out accuracy, ...)
        columns = [("loss", "val_loss")] if val_loss else []
        if any(is_number(r.get("val_ppl")) for r in val):
            columns.append(("perplexity", "val_ppl"))
        columns += [(name, f"val_{name}") for name in validation_names(val)]
        lines += ["## Validation", "", "| step | " + " | ".join(c for c, _ in columns) + " |"]
        lines.append("|---|" + "---|" * len(columns))
        for r in val:
            cells = [_fmt(r[key]) if is_number(r.get(key)) else "" for _, key in columns]
            lines.append(f"| {r['step']} | " + " | ".join(cells) + " |")
        lines.append("")
    if samples:
        lines += ["## Samples", ""]
        for s in samples:
            lines += [f"**Prompt:** `{s['prompt']}`", "", "```", s["completion"], "```", ""]
    if config:
        import yaml

        lines += ["## Config", "", "```yaml", yaml.safe_dump(config, sort_keys=False).rstrip(), "```", ""]
    out = run_dir / REPORT_NAME
    _remove_plots_not_drawn(out, "\n".join(lines))  # before the new report: the old one is the record of them
    write_text(out, "\n".join(lines))
    return out


def _remove_plots_not_drawn(report: Path, text: str) -> None:
    """Remove the plots the report at ``report`` shows that ``text`` (the report replacing it) does not: an earlier
    report's objective.png beside one without the objective's metrics showed rows metrics.jsonl no longer holds. Only
    our plot names, and only those the old report links (which our report drew): a user's file of that name stays."""
    try:
        old = report.read_text()
    except (OSError, UnicodeDecodeError):  # none yet
        return
    for name in (LOSS_PLOT, LR_PLOT, OBJECTIVE_PLOT):
        if f"]({name})" in old and f"]({name})" not in text:
            (report.parent / name).unlink(missing_ok=True)


def _is_val_number(key: str, value: Any) -> bool:
    return key.startswith("val_") and is_number(value)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
