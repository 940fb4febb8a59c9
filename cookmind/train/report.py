"""The run report: ``report.md`` with loss and learning-rate curves (PNG), the objective's own metrics (GRPO's reward
and accuracy, DPO's reward margin, ...) as curves, and sample generations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cookmind.atomic import write_text, writing
from cookmind.run_layout import LOSS_PLOT, LR_PLOT, OBJECTIVE_PLOT, REPORT_NAME
from cookmind.train.metrics import is_number, read_metrics, training_metric_names


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


def plot_panels(path: Path, panels: dict[str, dict[str, tuple[list[float], list[float]]]], columns: int = 3) -> Path:
    """One PNG with a small plot per named panel, each on its own scale, written atomically; a panel holds a line per
    named (step, value) series (``train``, ``val``), with a legend where it holds more than one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = -(-len(panels) // columns)
    cols = min(columns, len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), dpi=100, squeeze=False)
    for ax, (name, lines) in zip(axes.flat, panels.items()):
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, label=label, marker="o" if len(xs) < 20 else None, markersize=3)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    with writing(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return path


def objective_series(train: list[dict[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """The objective's own metrics in metrics.jsonl's train rows (all but the loss and the Trainer's bookkeeping),
    each as (steps, values) over the rows that logged a number for it."""
    series = {}
    for name in training_metric_names(train):
        rows = [r for r in train if name != "loss" and is_number(r.get(name))]
        if rows:
            series[name] = ([r["step"] for r in rows], [r[name] for r in rows])
    return series


# what every evaluation logs besides the objective's own metrics (the loss is plotted with the training loss)
_VAL_GENERIC = ("val_loss", "val_ppl")


def validation_names(val: list[dict[str, Any]]) -> list[str]:
    """The objective's own metrics in metrics.jsonl's val rows (DPO's reward accuracy and margin, GRPO's held-out
    accuracy, ...), without their ``val_`` prefix, in the order first logged."""
    keys = dict.fromkeys(k for r in val for k in r if k.startswith("val_") and k not in _VAL_GENERIC)
    return [k.removeprefix("val_") for k in keys if any(is_number(r.get(k)) for r in val)]


def objective_panels(
    train: list[dict[str, Any]], val: list[dict[str, Any]], counts: tuple[str, ...] = ()
) -> dict[str, dict[str, tuple]]:
    """A panel per objective metric: its training curve, and beside it the validation curve of the same name (a
    metric only the evaluation logs gets a panel of its own). The objective's ``counts`` (GRPO's held-out problems
    graded, SFT's supervised tokens) say how big a batch or an evaluation was, no curve to read the objective by:
    they get no panel (the validation table has them)."""
    panels: dict[str, dict[str, tuple]] = {
        name: {"train": xy} for name, xy in objective_series(train).items() if name not in counts
    }
    for name in (n for n in validation_names(val) if n not in counts):
        rows = [r for r in val if is_number(r.get(f"val_{name}"))]
        panels.setdefault(name, {})["val"] = ([r["step"] for r in rows], [r[f"val_{name}"] for r in rows])
    return panels


def write_report(
    run_dir: str | Path,
    title: str,
    summary: dict[str, Any],
    samples: list[dict[str, str]] | None = None,
    config: dict[str, Any] | None = None,
    counts: tuple[str, ...] = (),
) -> Path:
    """Write ``<run_dir>/report.md`` (+ ``loss.png``, ``lr.png``, and ``objective.png`` when the objective logs
    metrics of its own) from ``metrics.jsonl``; ``counts``: the objective's ``count_metrics``, in the text only."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("split", "train") == "train" and "loss" in r]
    # every evaluation's row: a GRPO run's held-out accuracy comes without a loss where it has no validation store
    val = [r for r in records if r.get("split") == "val" and any(_is_val_number(k, v) for k, v in r.items())]
    val_loss = [r for r in val if is_number(r.get("val_loss"))]
    lines = [f"# {title}", ""]
    if summary:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in summary.items()]
        lines.append("")
    if train:
        series = {"train": ([r["step"] for r in train], [r["loss"] for r in train])}
        if val_loss:
            series["val"] = ([r["step"] for r in val_loss], [r["val_loss"] for r in val_loss])
        plot_series(run_dir / LOSS_PLOT, series, "loss")
        plot_series(run_dir / LR_PLOT, {"lr": ([r["step"] for r in train], [r["lr"] for r in train])}, "learning rate")
        lines += ["## Curves", "", f"![loss]({LOSS_PLOT})", "", f"![learning rate]({LR_PLOT})", ""]
        own = objective_panels(train, val, counts)
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
    write_text(out, "\n".join(lines))
    return out


def _is_val_number(key: str, value: Any) -> bool:
    return key.startswith("val_") and is_number(value)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
