"""The whole training step as one CUDA graph (``train.cuda_graph``).

Why: for a small model or a short sequence the GPU finishes a step's kernels faster than Python can launch
them. On the H200, the MiniMind-3 shape at T=340 keeps the GPU busy 11.8 ms per step while the host needs
~19 ms to queue the step's ~570 launches (forward and backward through torch.compile's kernels, autograd,
clipping, AdamW). ``compile_mode=reduce-overhead`` graphs the forward and the backward separately and leaves
the rest to the host. Here everything from the first micro-batch's forward to the optimizer's update is one
graph, so a step costs the host one replay plus a few copies.

How:
1. The first ``WARMUP`` steps of a fit run eagerly: torch.compile compiles, cuBLAS and cuDNN set up their
   workspaces and the optimizer creates its state. Nothing that a capture records may be created later.
2. The next step is captured once (``torch.cuda.graph``): the same ``Trainer._step_body`` the eager path runs,
   reading its micro-batches from static buffers. Gradients are left in the graph's memory: each replay
   rewrites them, so they need no zeroing.
3. Every later step copies its micro-batches into the static buffers, refills the optimizer's lr tensors from
   the schedule (the fused AdamW reads lr from device memory) and replays. The skip-on-non-finite flag was
   already decided on the device, so nothing changes there.

The replayed kernels are the ones the eager step launches, on the same data, so the results are the same
(tests/test_train_cuda_graph.py compares weights after N steps). With dropout the random numbers differ
from an eager run's: the graph draws them from its own offsets of the CUDA generator.

Limits (``graph_problems``: refused with a message at start-up under ``true``, silently off under ``auto``;
what shows only at capture runs eagerly after a warning): CUDA, one process, our fused AdamW (precision bf16 or fp32:
fp16's grad scaler decides on the host),
objectives that read batches from the data loader (GRPO makes its own), no host synchronisation inside the
step (an ``.item()`` in an objective cannot be captured), and tensor-valued metrics (a Python number would be
the captured step's forever). A batch whose shapes differ from the captured one (a shorter last batch, SFT
without padding to the window) runs eagerly.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from cookmind.device import collector_paused


def graph_problems(trainer) -> list[str]:
    """Why the trainer's step cannot be captured (empty when it can): what ``train.cuda_graph`` checks first."""
    cfg = trainer.cfg
    problems = []
    if trainer.device.type != "cuda":
        problems.append(f"it needs a CUDA device (train.device is {trainer.device})")
    if trainer.dist.world_size > 1:
        problems.append(
            f"it runs one process (this is a torchrun job of {trainer.dist.world_size}); the "
            "data-parallel reduction is not captured"
        )
    if not trainer._skip_on_device:
        problems.append(
            "it needs the optimizer to decide the non-finite skip on the device: optim.impl=cookmind "
            "(fused AdamW) with precision bf16 or fp32, not fp16"
        )
    if hasattr(trainer.objective, "next_batch"):
        problems.append(f"the {cfg.train.objective} objective makes its own batches (rollouts) each step")
    if cfg.train.compile and cfg.train.compile_mode == "reduce-overhead":
        problems.append("train.compile_mode=reduce-overhead already uses CUDA graphs of its own")
    return problems


class GraphedStep:
    """Captures ``trainer._step_body`` once and replays it; see the module docstring."""

    WARMUP = 3  # eager steps before the capture

    def __init__(self, trainer):
        self.trainer = trainer
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: list[dict[str, Any]] | None = None
        self.out = None
        self.eager_steps = 0
        self.disabled = False
        self.replays = 0

    def wants_step(self) -> bool:
        """Whether the next step should go through the graph (counts the warm-up steps)."""
        if self.disabled:
            return False
        if self.graph is None and self.eager_steps < self.WARMUP:
            self.eager_steps += 1
            return False
        return True

    def run(self, batches: list[dict[str, Any]]):
        """Replay the step on ``batches`` (capturing it first if needed); None if it must run eagerly."""
        if self.graph is None:
            try:
                self._capture(batches)
            except Exception as exc:  # the step does something a graph cannot hold: stay eager, but say so
                self.graph, self.static, self.out, self.disabled = None, None, None, True
                warnings.warn(
                    f"train.cuda_graph: could not capture the training step ({type(exc).__name__}: "
                    f"{exc}); running it eagerly",
                    stacklevel=2,
                )
                return None
        if not self._fits(batches):
            return None
        for static, batch in zip(self.static, batches):
            for k, v in batch.items():
                if torch.is_tensor(v):
                    static[k].copy_(v, non_blocking=True)
        self.trainer.optimizer.refill_device_lr()
        self.graph.replay()
        self.replays += 1
        return self.out

    def _fits(self, batches: list[dict[str, Any]]) -> bool:
        if len(batches) != len(self.static):
            return False
        for static, batch in zip(self.static, batches):
            if static.keys() != batch.keys():
                return False
            for k, v in batch.items():
                s = static[k]
                if torch.is_tensor(v) != torch.is_tensor(s):
                    return False
                if torch.is_tensor(v) and (v.shape != s.shape or v.dtype != s.dtype):
                    return False
                if not torch.is_tensor(v) and v != s:
                    return False
        return True

    def _capture(self, batches: list[dict[str, Any]]) -> None:
        trainer = self.trainer
        self.static = [{k: v.clone() if torch.is_tensor(v) else v for k, v in b.items()} for b in batches]
        trainer.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates them in the graph's pool
        torch.cuda.synchronize(trainer.device)
        graph = torch.cuda.CUDAGraph()
        with collector_paused(), torch.cuda.graph(graph):
            out = trainer._step_body(self.static.__getitem__, in_graph=True)
        constant = [k for k, v in out.sums.items() if not torch.is_tensor(v)]
        if constant:
            raise RuntimeError(
                f"the objective's metrics {constant} are Python numbers, which a replay would "
                "repeat from the captured step"
            )
        self.graph, self.out = graph, out
