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
        # one static buffer for the three inputs, so a step needs a single host-to-device copy
        self.inputs = torch.zeros((3, n, 1), dtype=torch.long, device=dev)
        self.inputs[2].fill_(runner.scratch_col)
        self.tokens, self.positions, self.write_cols = self.inputs[0], self.inputs[1], self.inputs[2]
        # pinned staging buffers, so the copy is asynchronous and the host never waits for the device here;
        # two alternate: a buffer is refilled only after the engine has read back the step that used it
        self._staging = [torch.zeros((2, n), dtype=torch.long, pin_memory=True) for _ in range(2)]
        self._turn = 0
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

    def bucket_for(self, b: int) -> int | None:
        """The smallest captured batch size that holds b rows (None: too many)."""
        return next((x for x in self.buckets if x >= b), None)

    def decode(self, tokens: torch.Tensor, positions: list[int], write_cols: list[int]) -> torch.Tensor:
        """tokens: device tensor (B,) for slots 0..B-1 (it never visits the host); positions and write
        columns: host lists. Returns logits (B, V), a view into the graph's output: use it before the
        next replay. Rows between B and the bucket size are idle: they write the scratch column."""
        b = len(positions)
        bucket = self.bucket_for(b)
        if bucket is None:
            raise ValueError(f"decode batch {b} exceeds the largest captured bucket {self.buckets[-1]}")
        pad = bucket - b
        stage = self._staging[self._turn][:, :bucket]
        self._turn ^= 1
        stage.copy_(torch.tensor([positions + [0] * pad, write_cols + [self.runner.scratch_col] * pad]))
        self.inputs[1:, :bucket, 0].copy_(stage, non_blocking=True)
        self.inputs[0, :b, 0].copy_(tokens)
        self.graphs[bucket].replay()
        return self.outputs[bucket][:b]
