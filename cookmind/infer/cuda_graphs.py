"""CUDA graphs for decode steps: record one step per batch-size bucket, then replay it.

A decode step of a small model is hundreds of tiny kernels, and every call into the driver
costs time (more so in a sandboxed VM). The slot cache keeps shapes and addresses fixed, so
each bucket's whole step is captured once and replayed with one launch. The graph also keeps
its own inputs moving: it writes each active row's argmax into ``last_tok`` and advances the
row's position, so consecutive greedy steps of an unchanged batch need nothing from the host;
the engine re-uploads positions only when requests join or leave (``load``), and overrides
``last_tok`` itself when it samples.
"""

from __future__ import annotations

import torch


def default_buckets(num_slots: int) -> list[int]:
    sizes, b = [], 1
    while b < num_slots:
        sizes.append(b)
        b *= 2
    return sizes + [num_slots]


class CudaGraphDecoder:
    """Decode steps (T = 1) over slots 0..B-1, replayed from graphs (or run eagerly: capture=False)."""

    def __init__(self, runner, last_tok: torch.Tensor, buckets: list[int] | None = None,
                 capture: bool | None = None):
        self.runner = runner
        self.capture = runner.device.type == "cuda" if capture is None else capture
        if self.capture and runner.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA model; pass capture=False to run the same steps eagerly")
        self.buckets = sorted(buckets or default_buckets(runner.num_slots))
        if self.buckets[-1] > runner.num_slots:
            raise ValueError(f"graph bucket {self.buckets[-1]} exceeds the cache's {runner.num_slots} slots")
        n, dev = self.buckets[-1], runner.device
        self.last_tok = last_tok  # (slots,) newest token per slot: read and advanced by the step
        # rows: position of the newest token, the column it is written to, 1 if the row is active
        self.state = torch.zeros((3, n), dtype=torch.long, device=dev)
        self.state[1].fill_(runner.scratch_col)
        pin = dev.type == "cuda"
        # two pinned staging buffers: a load never waits for the device, and a buffer is refilled
        # only after the engine has read back the step that used it
        self._staging = [torch.zeros((3, n), dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._turn = 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if self.capture:
            self._capture()

    @torch.inference_mode()
    def _step(self, b: int) -> torch.Tensor:
        pos, cols, active = self.state[0, :b], self.state[1, :b], self.state[2, :b]
        toks = self.last_tok[:b]
        logits = self.runner.forward(toks[:, None], pos[:, None], 0, self.runner.max_seq_len,
                                     write_cols=cols[:, None])
        on = active.bool()
        self.last_tok[:b].copy_(torch.where(on, logits.argmax(dim=-1), toks))  # greedy guess; sampling overrides
        pos.add_(active)  # the token just fed now sits in the cache: the next one goes one further
        cols.copy_(torch.where(on, pos, torch.full_like(pos, self.runner.scratch_col)))
        return logits

    def _capture(self) -> None:
        # every row is inactive here, so warm-up runs change no state (idle rows write the scratch column)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up runs (lazy init, autotuning) stay out of the graphs
            for b in self.buckets:
                self._step(b)
        torch.cuda.current_stream().wait_stream(side)
        pool = None
        for b in reversed(self.buckets):  # largest first, so smaller graphs reuse its memory pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self._step(b)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()

    def bucket_for(self, b: int) -> int | None:
        """The smallest captured batch size that holds b rows (None: too many)."""
        return next((x for x in self.buckets if x >= b), None)

    def load(self, positions: list[int], active: list[int]) -> None:
        """Set rows 0..B-1 (position of each row's newest token; 1 = active) and idle the rest."""
        b = len(positions)
        bucket = self.bucket_for(b)
        pad = bucket - b
        scratch = self.runner.scratch_col
        cols = [p if a else scratch for p, a in zip(positions, active)]
        stage = self._staging[self._turn][:, :bucket]
        self._turn ^= 1
        stage.copy_(torch.tensor([positions + [0] * pad, cols + [scratch] * pad, active + [0] * pad]))
        self.state[:, :bucket].copy_(stage, non_blocking=stage.is_pinned())

    @torch.inference_mode()
    def decode(self, b: int) -> torch.Tensor:
        """One step for rows 0..b-1 as loaded/advanced; logits (b, V), a view valid until the next step."""
        bucket = self.bucket_for(b)
        if bucket is None:
            raise ValueError(f"decode batch {b} exceeds the largest captured bucket {self.buckets[-1]}")
        if not self.capture:
            return self._step(bucket)[:b]
        self.graphs[bucket].replay()
        return self.outputs[bucket][:b]
