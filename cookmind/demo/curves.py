"""Reward and accuracy curves of a GRPO run as one PNG."""

from __future__ import annotations

from pathlib import Path

from cookmind.atomic import writing


def plot_grpo_curves(
    history: list[dict], path, before: float | None = None, title: str = "GRPO", before_length: float | None = None
) -> Path:
    """Left: mean reward and rollout accuracy per step. Middle: held-out accuracy at eval steps.
    Right: response length in tokens (rollouts per step; held-out greedy answers at eval steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    steps = [h["step"] for h in history]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 3.6))
    a.plot(steps, [h["reward"] for h in history], label="reward", lw=1)
    a.plot(steps, [h["accuracy"] for h in history], label="rollout accuracy", lw=1)
    rewards = [h["reward"] for h in history]
    w = 10  # a 10-step moving average: one step's 8 problems are a noisy sample
    if len(rewards) >= w:
        avg = [sum(rewards[i - w + 1 : i + 1]) / w for i in range(w - 1, len(rewards))]
        a.plot(steps[w - 1 :], avg, label=f"reward, {w}-step mean", lw=2, color="black")
    if any("format_reward" in h for h in history):
        a.plot(steps, [h.get("format_reward", float("nan")) for h in history], label="format reward", lw=1, alpha=0.6)
    a.set_xlabel("step")
    a.set_ylim(-0.02, 1.02)
    a.set_title("training rollouts")
    a.legend(loc="lower right", fontsize=8)
    ev = [(h["step"], h["eval_accuracy"]) for h in history if "eval_accuracy" in h]
    xs, ys = (
        ([0] if before is not None else []) + [s for s, _ in ev],
        ([before] if before is not None else []) + [v for _, v in ev],
    )
    b.plot(xs, ys, marker="o")
    b.set_xlabel("step")
    b.set_ylim(-0.02, 1.02)
    b.set_title("held-out exact accuracy (greedy)")
    c.plot(steps, [h["response_length"] for h in history], label="rollouts", lw=1)
    ev_len = [(h["step"], h["eval_response_length"]) for h in history if "eval_response_length" in h]
    if ev_len:
        xs = ([0] if before_length is not None else []) + [s for s, _ in ev_len]
        ys = ([before_length] if before_length is not None else []) + [v for _, v in ev_len]
        c.plot(xs, ys, marker="o", label="held-out (greedy)")
    c.set_xlabel("step")
    c.set_ylim(bottom=0)
    c.set_title("response length (tokens)")
    c.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with writing(path, "wb") as f:
        fig.savefig(f, dpi=100, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
