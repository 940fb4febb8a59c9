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


def plot_panels(path: Path, panels: dict[str, tuple[list[float], list[float]]], columns: int = 3) -> Path:
    """One PNG with a small plot per named (step, value) series, each on its own scale, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = -(-len(panels) // columns)
    cols = min(columns, len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), dpi=100, squeeze=False)
    for ax, (name, (xs, ys)) in zip(axes.flat, panels.items()):
        ax.plot(xs, ys, marker="o" if len(xs) < 20 else None, markersize=3)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
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


def write_report(
    run_dir: str | Path,
    title: str,
    summary: dict[str, Any],
    samples: list[dict[str, str]] | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    """Write ``<run_dir>/report.md`` (+ ``loss.png``, ``lr.png``, and ``objective.png`` when the objective logs
    metrics of its own) from ``metrics.jsonl``."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("split", "train") == "train" and "loss" in r]
    val = [r for r in records if r.get("split") == "val" and "val_loss" in r]
    lines = [f"# {title}", ""]
    if summary:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in summary.items()]
        lines.append("")
    if train:
        series = {"train": ([r["step"] for r in train], [r["loss"] for r in train])}
        if val:
            series["val"] = ([r["step"] for r in val], [r["val_loss"] for r in val])
        plot_series(run_dir / LOSS_PLOT, series, "loss")
        plot_series(run_dir / LR_PLOT, {"lr": ([r["step"] for r in train], [r["lr"] for r in train])}, "learning rate")
        lines += ["## Curves", "", f"![loss]({LOSS_PLOT})", "", f"![learning rate]({LR_PLOT})", ""]
        own = objective_series(train)
        if own:
            plot_panels(run_dir / OBJECTIVE_PLOT, own)
            lines += ["## The objective's metrics", "", f"![objective metrics]({OBJECTIVE_PLOT})", ""]
    if val:
        lines += ["## Validation", "", "| step | loss | perplexity |", "|---|---|---|"]
        lines += [f"| {r['step']} | {_fmt(r['val_loss'])} | {_fmt(r.get('val_ppl'))} |" for r in val]
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


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
