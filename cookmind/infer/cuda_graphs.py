"""CUDA graphs for decode steps: record one step per (batch, attention length) bucket, then replay it.

A decode step of a small model is hundreds of tiny kernels, and every call into the driver
costs time (more so in a sandboxed VM). The KV cache keeps shapes and addresses fixed, so
each bucket's whole step is captured once and replayed with one launch. The graph also keeps
its own inputs moving: it writes each active row's argmax into ``last_tok`` and advances the
row's position, so consecutive greedy steps of an unchanged batch need nothing from the host;
the engine re-uploads positions only when requests join or leave (``load``), and overrides
``last_tok`` itself when it samples.

Two things make the captured step itself short:
- A runner with ``set_compiled(True)`` (the engine's default on CUDA) runs each layer through
  ``torch.compile`` (inductor); warm-up compiles before capture, so the graphs hold fused
  kernels (RMSNorm, RoPE, cache writes, SwiGLU's gate, residual adds) instead of ~40 small ones
  per layer. The eager step is the same code, unfused, and is what CPU tests run.
- With the paged decode kernel (the default on CUDA) each row's attention reads only that row's
  positions, so one graph per batch size serves every length. Otherwise (gather + SDPA)
  attention reads the first L columns of the cache, where L is the smallest length bucket
  (64, 128, 256, ... up to max_seq_len) that holds the longest running request, and each
  (batch, length) pair gets its own graph.
"""

from __future__ import annotations

import torch


def default_buckets(num_slots: int) -> list[int]:
    """Batch sizes 1, 2, 4, ... and num_slots."""
    sizes, b = [], 1
    while b < num_slots:
        sizes.append(b)
        b *= 2
    return sizes + [num_slots]


def default_length_buckets(max_seq_len: int, smallest: int = 64) -> list[int]:
    """Attention lengths smallest, 2*smallest, ... and max_seq_len (cost of a step grows with L, so
    a bucket at most twice the real length wastes at most half the attention reads)."""
    sizes, n = [], smallest
    while n < max_seq_len:
        sizes.append(n)
        n *= 2
    return sizes + [max_seq_len]


class CudaGraphDecoder:
    """Decode steps (T = 1) over slots 0..B-1, replayed from graphs (or run eagerly: capture=False)."""

    def __init__(
        self,
        runner,
        last_tok: torch.Tensor,
        buckets: list[int] | None = None,
        capture: bool | None = None,
        length_buckets: list[int] | None = None,
    ):
        self.runner = runner
        self.capture = runner.device.type == "cuda" if capture is None else capture
        if self.capture and runner.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA model; pass capture=False to run the same steps eagerly")
        self.buckets = sorted(buckets or default_buckets(runner.num_slots))
        if self.buckets[-1] > runner.num_slots:
            raise ValueError(f"graph bucket {self.buckets[-1]} exceeds the cache's {runner.num_slots} slots")
        if length_buckets is None:  # the paged decode kernel reads each row's own length: one bucket serves all
            length_buckets = (
                [runner.max_seq_len]
                if runner.decode_attention == "kernel"
                else default_length_buckets(runner.max_seq_len)
            )
        self.length_buckets = sorted(length_buckets)
        if self.length_buckets[-1] != runner.max_seq_len:
            raise ValueError(
                f"the largest length bucket must be max_seq_len={runner.max_seq_len}, got {self.length_buckets[-1]}"
            )
        n, dev = self.buckets[-1], runner.device
        self.last_tok = last_tok  # (slots,) newest token per slot: read and advanced by the step
        # rows: position of the newest token, the column it is written to, 1 if the row is active.
        # Made in inference mode like every other input of a compiled layer, so they share one compilation.
        with torch.inference_mode():
            self.state = torch.zeros((3, n), dtype=torch.long, device=dev)
            self.state[1].fill_(runner.scratch_col)
        pin = dev.type == "cuda"
        # two pinned staging buffers: a load never waits for the device, and a buffer is refilled
        # only after the engine has read back the step that used it
        self._staging = [torch.zeros((3, n), dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._turn = 0
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        if self.capture:
            self._capture()

    def _step(self, b: int, length: int) -> torch.Tensor:
        pos, cols, active = self.state[0, :b], self.state[1, :b], self.state[2, :b]
        toks = self.last_tok[:b]
        logits = self.runner.compute(toks[:, None], pos[:, None], 0, length, write_cols=cols[:, None])
        on = active.bool()
        self.last_tok[:b].copy_(torch.where(on, logits.argmax(dim=-1), toks))  # greedy guess; sampling overrides
        pos.add_(active)  # the token just fed now sits in the cache: the next one goes one further
        cols.copy_(torch.where(on, pos, torch.full_like(pos, self.runner.scratch_col)))
        return logits

    def _keys(self):
        return [(b, n) for b in self.buckets for n in self.length_buckets]

    def _warm_up(self) -> None:
        # every row is inactive here, so warm-up runs change no state (idle rows write the scratch column)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with (
            torch.cuda.stream(side),
            torch.inference_mode(),
        ):  # lazy init, compilation, autotuning stay out of the graphs
            for b, n in self._keys():
                self._step(b, n)
        torch.cuda.current_stream().wait_stream(side)

    def _capture(self) -> None:
        if hasattr(self.runner.cache, "sync_tables"):
            self.runner.cache.sync_tables()
        self._warm_up()  # a runner whose compile fails falls back to eager layers here, before capture
        pool = None
        with torch.inference_mode():
            for key in sorted(self._keys(), reverse=True):  # largest first: smaller graphs reuse its pool
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[key] = self._step(*key)
                pool = graph.pool()
                self.graphs[key] = graph
        torch.cuda.synchronize()

    def bucket_for(self, b: int) -> int | None:
        """The smallest captured batch size that holds b rows (None: too many)."""
        return next((x for x in self.buckets if x >= b), None)

    def length_for(self, n: int) -> int:
        """The smallest length bucket that holds n columns."""
        return next(x for x in self.length_buckets if x >= n)

    @torch.inference_mode()
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
    def decode(self, b: int, length: int | None = None) -> torch.Tensor:
        """One step for rows 0..b-1 as loaded/advanced, attending to at least `length` columns (default:
        all); logits (b, V), a view valid until the next step."""
        bucket = self.bucket_for(b)
        if bucket is None:
            raise ValueError(f"decode batch {b} exceeds the largest captured bucket {self.buckets[-1]}")
        n = self.length_for(self.runner.max_seq_len if length is None else length)
        if not self.capture:
            return self._step(bucket, n)[:b]
        self.graphs[(bucket, n)].replay()
        return self.outputs[(bucket, n)][:b]
