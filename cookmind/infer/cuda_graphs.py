"""CUDA graphs for decode steps: record one step per batch-size bucket, then replay it.

A decode step of a small model is hundreds of tiny kernels; launching them one by one from
Python costs more than running them. The slot cache keeps every shape and address fixed,
so each bucket's whole step is captured once and replayed with a single launch.
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
    """Replays a captured ``runner.forward`` for decode (T = 1) over slots 0..B-1."""

    def __init__(self, runner, buckets: list[int] | None = None):
        if runner.device.type != "cuda":
            raise ValueError("CudaGraphDecoder needs a CUDA model; on CPU decode runs eagerly")
        self.runner = runner
        self.buckets = sorted(buckets or default_buckets(runner.num_slots))
        if self.buckets[-1] > runner.num_slots:
            raise ValueError(f"graph bucket {self.buckets[-1]} exceeds the cache's {runner.num_slots} slots")
        n, dev = self.buckets[-1], runner.device
        self.tokens = torch.zeros((n, 1), dtype=torch.long, device=dev)
        self.positions = torch.zeros((n, 1), dtype=torch.long, device=dev)
        self.write_cols = torch.full((n, 1), runner.scratch_col, dtype=torch.long, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._capture()

    def _step(self, b: int) -> torch.Tensor:
        return self.runner.forward(self.tokens[:b], self.positions[:b], 0, self.runner.max_seq_len,
                                   write_cols=self.write_cols[:b])

    def _capture(self) -> None:
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

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, write_cols: torch.Tensor) -> torch.Tensor:
        """tokens/positions/write_cols (B, 1) for slots 0..B-1 -> logits (B, V) (a view: copy to keep)."""
        b = tokens.shape[0]
        bucket = next((x for x in self.buckets if x >= b), None)
        if bucket is None:
            raise ValueError(f"decode batch {b} exceeds the largest captured bucket {self.buckets[-1]}")
        self.tokens[:b].copy_(tokens)
        self.positions[:b].copy_(positions)
        self.write_cols[:b].copy_(write_cols)
        if bucket > b:  # rows past the batch are idle: write to the scratch column only
            self.positions[b:bucket].zero_()
            self.write_cols[b:bucket].fill_(self.runner.scratch_col)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:b]
