"""Training callbacks: hooks at step begin, after each micro-batch and after the optimizer step.

Metrics, evaluation and checkpoints hang on ``on_step_end``, which runs after the optimizer step
it names, so what they record is the state after that step. A callback may call
``trainer.request_stop(reason)``; the Trainer then saves a checkpoint and returns.

On CUDA the Trainer may call ``on_step_end(step)`` only after it has queued step ``step + 1`` (so
the GPU never waits for the host between steps), unless a callback's ``needs_state_at(step)`` says
it must see the model and optimizer as they are right after ``step``. The default says so at every
step; callbacks that only log the metrics they are given say they need nothing.

With several processes a hook of a callback that says it ``runs_no_collective`` (metrics, the progress bar,
TensorBoard; yours where true) and raises on one rank only (rank 0's metrics row on a full disk) does not leave the
others waiting in the next collective: the other callbacks still run, and as the step ends every rank stops, that
rank with its error, the others with "rank R (on HOST) could not end step N (ITS_CLASS.on_step_end): its reason"
(``Trainer._on_this_rank``). So does a ``needs_state_at`` that raises on one rank ("... could not end step N
(ITS_CLASS.needs_state_at): its reason"). Any other callback's error is raised at once: its hooks may take part in
collectives (an evaluation, a save, an all-reduce of yours) that a held rank would skip while the others wait.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cookmind.train.trainer import Trainer


class Callback:
    """Override the hooks you need; all are no-ops by default."""

    # True where no hook of the callback takes part in a collective (logging, a bar): with several processes, an
    # error one of its hooks raises on one rank is held to the step's end, and every rank stops with its reason
    runs_no_collective: bool = False

    def on_train_begin(self, trainer: Trainer) -> None:
        """Before the first step (after resume)."""

    def on_step_begin(self, trainer: Trainer, step: int) -> None:
        """Before the micro-batches of optimizer step ``step`` (1-based: the step about to run)."""

    def on_micro_batch_end(self, trainer: Trainer, micro_step: int, loss: Any, metrics: dict[str, Any]) -> None:
        """After one micro-batch's backward, inside the accumulation block."""

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        """After optimizer step ``step``; ``metrics`` holds loss, lr, grad_norm, tokens, ..."""

    def needs_state_at(self, trainer: Trainer, step: int) -> bool:
        """Whether ``on_step_end(step)`` must see the trainer exactly as it is right after step ``step``.

        True (the default, safe for any callback) makes the Trainer read step ``step`` before it queues the next
        one. False lets it queue step ``step + 1`` first: ``on_step_end(step)`` then runs after
        ``on_step_begin(step + 1)``, with ``trainer.step == step + 1`` and that step's update possibly applied
        to the weights, and a ``request_stop`` from it takes effect after step ``step + 1``. Say False only
        where the hook uses nothing but ``step`` and ``metrics`` (logging).
        """
        return True

    def on_train_end(self, trainer: Trainer, status: str) -> None:
        """After the last step (status: completed, stopped or diverged)."""

    def on_train_error(self, trainer: Trainer, exc: BaseException) -> None:
        """When ``fit`` is about to raise ``exc`` (no ``on_train_end`` then): release what the callback holds."""


class MetricsCallback(Callback):
    """Writes a metrics.jsonl line every ``log_every`` steps, at the last step, and at the step a run stops at
    (a stop or a divergence between two logged steps: the curves and the report end where the run did)."""

    runs_no_collective = True

    def __init__(self, log_every: int):
        self.log_every = max(1, log_every)
        self._unlogged: tuple[int, dict[str, Any]] | None = None  # the last step ended, where it was not logged

    def needs_state_at(self, trainer: Trainer, step: int) -> bool:
        return False

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if step % self.log_every and step != trainer.cfg.train.max_steps:
            self._unlogged = (step, dict(metrics))
            return
        self._unlogged = None
        trainer.metrics_writer.write({"step": step, **metrics})

    def on_train_end(self, trainer: Trainer, status: str) -> None:
        if self._unlogged is not None and status != "completed":
            step, metrics = self._unlogged
            trainer.metrics_writer.write({"step": step, **metrics})
        self._unlogged = None


class EvalCallback(Callback):
    """Validation loss/perplexity (and samples) every ``every`` steps and at the end."""

    def __init__(self, every: int):
        self.every = every

    def needs_state_at(self, trainer: Trainer, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if self.every > 0 and step % self.every == 0:
            trainer.evaluate(step)

    def on_train_end(self, trainer: Trainer, status: str) -> None:
        # trainer.last_eval_step comes from the checkpoint on resume: a finished run resumed is not evaluated again
        if status == "completed" and trainer.last_eval_step != trainer.step:
            trainer.evaluate(trainer.step)


class CheckpointCallback(Callback):
    """A checkpoint every ``every`` steps (0 = only at the end / on stop)."""

    def __init__(self, every: int):
        self.every = every

    def needs_state_at(self, trainer: Trainer, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if self.every > 0 and step % self.every == 0:
            trainer.save_checkpoint()


class ReportCallback(Callback):
    """``report.md`` and its plots brought up to date at every checkpoint step but the last (rank 0; status
    ``running``): a long run shows its curves while it trains, and one killed outright (SIGKILL, a lost node) keeps
    the report of its last checkpoint. The report ``fit`` writes as the run ends replaces it. A report that cannot
    be written is said once, in a warning, and the run goes on: it is no reason to stop training."""

    runs_no_collective = True

    def __init__(self, every: int, enabled: bool = True):
        self.every, self.enabled = every, enabled
        self._failed = False
        self._running = False  # a 'running' report was written: an error then rewrites it
        self.series = None  # metrics.jsonl as the last report read it (a MetricsSeries): the next reads what is new

    def needs_state_at(self, trainer: Trainer, step: int) -> bool:
        return False  # it reads metrics.jsonl and the step's own metrics

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled or self._failed or self.every <= 0 or step % self.every:
            return
        max_steps = trainer.cfg.train.max_steps
        if step >= max_steps:
            return  # fit writes the run's report
        summary = {"status": "running", "steps": step, "of_steps": max_steps, "tokens": metrics.get("tokens")}
        try:
            self._write(trainer, summary)
            self._running = True
        except Exception as exc:  # noqa: BLE001 - the run goes on; its last report is written (or fails) at the end
            import warnings

            self._failed = True
            warnings.warn(
                f"could not bring {trainer.run_dir}/report.md up to date at step {step} ({type(exc).__name__}: "
                f"{exc}); training goes on, and the report is written again when the run ends",
                stacklevel=2,
            )

    def on_train_error(self, trainer: Trainer, exc: BaseException) -> None:
        """A run that dies of an error after a 'running' report (a signal's stop ends with its own report) leaves one
        that says so: 'failed' (or 'interrupted'), the step and why, not a run that looks alive."""
        if not self._running:
            return
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        summary = {"status": status, "steps": trainer.step, "of_steps": trainer.cfg.train.max_steps}
        summary["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        with contextlib.suppress(Exception):  # the error being raised is the one to report
            self._write(trainer, summary)

    def _write(self, trainer: Trainer, summary: dict) -> None:
        from cookmind.run_layout import RUN_METRICS
        from cookmind.train.report import MetricsSeries, write_report

        if self.series is None:
            self.series = MetricsSeries(trainer.run_dir / RUN_METRICS)
        write_report(
            trainer.run_dir, f"cookmind {trainer.cfg.train.objective} run", summary, trainer.samples,
            trainer.cfg.to_dict(), getattr(trainer.objective, "count_metrics", ()), self.series,
        )  # fmt: skip


class ProgressCallback(Callback):
    """A tqdm bar: loss, lr, tokens/s, MFU (on GPU) and ETA; in a pipe or a log, a plain line now and then."""

    runs_no_collective = True

    def __init__(self, enabled: bool = True, desc: str = "train"):
        self.enabled, self.desc = enabled, desc
        self.bar = None
        self._last = None

    def needs_state_at(self, trainer: Trainer, step: int) -> bool:
        return False

    def on_train_begin(self, trainer: Trainer) -> None:
        if not self.enabled:
            return
        from cookmind.progress import progress_bar

        self.bar = progress_bar(  # a bar on a terminal, plain lines in a pipe or a log
            total=trainer.cfg.train.max_steps,
            initial=trainer.step,
            desc=self.desc,
            unit="step",
            dynamic_ncols=True,
            leave=True,
        )

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if self.bar is None:
            return
        post = {
            "loss": f"{metrics['loss']:.4f}",
            "lr": f"{metrics['lr']:.2e}",
            "tok/s": f"{metrics['tokens_per_s']:.0f}",
        }
        if metrics.get("mfu") is not None and math.isfinite(metrics["mfu"]):
            post["mfu"] = f"{100 * metrics['mfu']:.1f}%"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def on_train_end(self, trainer: Trainer, status: str) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_train_error(self, trainer: Trainer, exc: BaseException) -> None:
        self.on_train_end(trainer, "failed")  # the bar ends its line: the error prints on its own


class TensorBoardCallback(Callback):
    """Scalars to ``<run_dir>/tensorboard`` (rank 0); needs the optional ``tensorboard`` package."""

    runs_no_collective = True

    def __init__(self, log_dir, log_every: int, purge_step: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ValueError(
                "logging.tensorboard=true needs the tensorboard package: pip install tensorboard "
                "(or set logging.tensorboard=false; metrics.jsonl has the same numbers)"
            ) from exc
        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)  # events at or past it are hidden
        self.log_every = max(1, log_every)

    def needs_state_at(self, trainer: Trainer, step: int) -> bool:
        return False  # trainer.last_eval changes only at evaluation steps, which are never deferred

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any]) -> None:
        if step % self.log_every == 0:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(f"train/{k}", v, step)
            for k, v in trainer.last_eval.items():
                self.writer.add_scalar(f"val/{k.removeprefix('val_')}", v, step)

    def on_train_end(self, trainer: Trainer, status: str) -> None:
        self.writer.close()

    def on_train_error(self, trainer: Trainer, exc: BaseException) -> None:
        self.writer.close()  # what was logged up to the error reaches the event file
