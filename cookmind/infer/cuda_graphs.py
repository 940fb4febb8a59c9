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

Speculative decoding's forwards (speculative.py) replay graphs the same way: ``CudaGraphVerifier`` (the target
over k + 1 tokens per row) and ``CudaGraphDrafter`` (a draft model's feed and k - 1 one-token steps in one graph),
with their inputs loaded from the host each step. With the paged decode kernel they attend through it too, one
query per token (``ModelRunner.kernel_reads``: one graph per batch bucket); otherwise through the gather path (one
graph per batch and length bucket).
"""

from __future__ import annotations

import torch

from cookmind.device import collector_paused


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


def capture_and_buckets(runner, capture: bool | None, buckets) -> tuple[bool, list[int]]:
    """Whether to capture (default: on CUDA; refused elsewhere) and the batch buckets (default_buckets, checked
    against the runner's slots), as every graph holder here takes them."""
    capture = runner.device.type == "cuda" if capture is None else capture
    if capture and runner.device.type != "cuda":
        raise ValueError("CUDA graphs need a CUDA model; pass capture=False to run the same steps eagerly")
    buckets = sorted(buckets or default_buckets(runner.num_slots))
    if buckets[-1] > runner.num_slots:
        raise ValueError(f"graph bucket {buckets[-1]} exceeds the cache's {runner.num_slots} slots")
    return capture, buckets


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
        self.capture, self.buckets = capture_and_buckets(runner, capture, buckets)
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
        with torch.inference_mode(), collector_paused():
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


class _StaticSteps:
    """What the speculative graphs share: one (rows, columns) long tensor of inputs on the device, loaded from a
    pinned stage in one copy, and one graph per (batch, length) bucket whose outputs are fixed buffers (so the
    graphs of every bucket share one output and one memory pool). Subclasses define ``_run(b, length)``; their
    forwards take up to ``tokens`` tokens per row."""

    def __init__(self, runner, columns: int, tokens: int, buckets, capture, length_buckets):
        self.runner = runner
        self.capture, self.buckets = capture_and_buckets(runner, capture, buckets)
        if length_buckets is None:  # the decode kernel reads each row's own length: one bucket serves all; the
            # gather path reads the first L columns of every row
            length_buckets = (
                [runner.max_seq_len] if runner.kernel_reads(tokens) else default_length_buckets(runner.max_seq_len)
            )
        self.length_buckets = sorted(length_buckets)
        if self.length_buckets[-1] != runner.max_seq_len:
            raise ValueError(
                f"the largest length bucket must be max_seq_len={runner.max_seq_len}, got {self.length_buckets[-1]}"
            )
        n, dev = self.buckets[-1], runner.device
        with torch.inference_mode():  # like every other input of a compiled layer: one compilation serves all
            self.inputs = torch.zeros((n, columns), dtype=torch.long, device=dev)
        self._stage = torch.zeros((n, columns), dtype=torch.long, pin_memory=dev.type == "cuda")
        self._stage_np = self._stage.numpy()  # the same memory: the host lays rows out in place
        self._loaded = torch.cuda.Event() if dev.type == "cuda" else None  # the stage may be refilled after it
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def bucket_for(self, b: int) -> int | None:
        """The smallest captured batch size that holds b rows (None: too many)."""
        return next((x for x in self.buckets if x >= b), None)

    def length_for(self, n: int) -> int:
        """The smallest length bucket that holds n columns."""
        return next(x for x in self.length_buckets if x >= n)

    def _capture_all(self) -> None:
        if hasattr(self.runner.cache, "sync_tables"):
            self.runner.cache.sync_tables()
        keys = [(b, n) for b in self.buckets for n in self.length_buckets]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # the idle inputs (token 0 at positions 0.., writing the scratch column) change no state: lazy init,
        # compilation and autotuning happen here, outside the graphs
        with torch.cuda.stream(side), torch.inference_mode():
            for key in keys:
                self._run(*key)
        torch.cuda.current_stream().wait_stream(side)
        pool = None
        with torch.inference_mode(), collector_paused():
            for key in sorted(keys, reverse=True):  # largest first: smaller graphs reuse its pool
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._run(*key)
                pool = graph.pool()
                self.graphs[key] = graph
        torch.cuda.synchronize()

    def stage_rows(self, b: int):
        """The pinned input rows of the bucket that holds slots 0..b-1, as a numpy array to fill in place, every row
        idle (``_idle``) until the caller lays its own out; then ``_launch(b, length)``."""
        bucket = self.bucket_for(b)
        if bucket is None:
            raise ValueError(f"batch {b} exceeds the largest captured bucket {self.buckets[-1]}")
        if self._loaded is not None:
            self._loaded.synchronize()  # the previous load has left the stage
        rows = self._stage_np[:bucket]
        rows[:] = self._idle_np
        return rows

    def _launch(self, b: int, length: int) -> None:
        """Copy the staged rows of b's bucket up and run the step of the smallest buckets that hold them."""
        bucket, n = self.bucket_for(b), self.length_for(length)
        with torch.inference_mode():
            self.inputs[:bucket].copy_(self._stage[:bucket], non_blocking=self._loaded is not None)
            if self._loaded is not None:
                self._loaded.record()
            if self.capture:
                self.graphs[(bucket, n)].replay()
            else:
                self._run(bucket, n)


class CudaGraphVerifier(_StaticSteps):
    """The target's verify forwards for speculative decoding: ``width`` tokens per row (the newest token and up to
    width - 1 drafts, padded) over slots 0..B-1, replayed from graphs (or run eagerly: capture=False).

    Inputs per row: tokens, positions, write columns (each ``width`` long), then how many of the row's drafts to
    judge greedily (0: none, for idle and sampled rows); padding writes the scratch column and is never judged.
    The step accepts on the device: a judged row keeps its drafts up to the first that differs from the target's
    argmax at the place before, and its newest token becomes the argmax after them (the bonus), written into
    ``last_tok`` (the engine's, which the plain decode graph reads) so nothing goes back up after the step; with
    ``decode_state`` (``CudaGraphDecoder.state``) its position moves past the accepted tokens there too (and its
    write column, where the decoder has the row active), so the decoder's next step needs no reload.
    Outputs, fixed buffers overwritten by every run: ``result`` (rows, width + 1), the argmax at each place then the
    accepted count, read back in one copy; ``logits`` (rows, width, V) float32 only with keep_logits (speculative
    sampling needs the distributions; greedy rows need only the argmax, and the buffer is slots x width x V: 780 MB
    at 256 slots, width 5 and a 152k vocabulary). A row's LoRA adapter is read on the device
    (``adapters.select``), so one graph serves any mix of adapters."""

    def __init__(
        self,
        runner,
        width: int,
        buckets=None,
        capture=None,
        length_buckets=None,
        last_tok=None,
        keep_logits=True,
        decode_state=None,
    ):
        super().__init__(runner, 3 * width + 1, width, buckets, capture, length_buckets)
        self.width = width
        self.last_tok = last_tok
        self.decode_state = decode_state
        n, dev = self.buckets[-1], runner.device
        self._idle = torch.cat(
            [torch.zeros(width), torch.arange(width), torch.full((width,), runner.scratch_col), torch.zeros(1)]
        ).long()
        self._idle_np = self._idle.numpy()
        with torch.inference_mode():
            self.inputs.copy_(self._idle.expand(n, -1))
            self.logits = None
            if keep_logits:
                self.logits = torch.zeros((n, width, runner.config.vocab_size), dtype=torch.float32, device=dev)
            self.result = torch.zeros((n, width + 1), dtype=torch.long, device=dev)
            self._places = torch.arange(width - 1, device=dev)
        # a compiled runner's layers are fused kernels; so is the acceptance after them (else ~20 launches)
        self._accept_fn = torch.compile(accept_drafts, dynamic=True) if runner.compiled else accept_drafts
        if self.capture:
            self._capture_all()

    def _run(self, b: int, length: int) -> None:
        w = self.width
        x = self.inputs[:b]
        cols = x[:, 2 * w : 3 * w]
        logits = self.runner.compute(x[:, :w], x[:, w : 2 * w], 0, length, last_only=False, write_cols=cols)
        if self.logits is not None:
            self.logits[:b].copy_(logits)
        last_tok = None if self.last_tok is None else self.last_tok[:b]
        state = None if self.decode_state is None else self.decode_state[:, :b]
        # compiled with the runner's layers, under its fallback (a compile failure runs everything eagerly)
        self.runner._compiled(self._accept_fn, accept_drafts, logits, x, self._places, self.result[:b], last_tok, state)

    def verify(self, b: int, length: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Run the rows laid out in ``stage_rows(b)`` (tokens, positions, write columns, drafts judged) for slots
        0..b-1, attending to at least ``length`` columns; returns views of the logits (b, width, V) (None without
        keep_logits) and the result (b, width + 1)."""
        self._launch(b, length)
        return (None if self.logits is None else self.logits[:b]), self.result[:b]


def accept_drafts(logits, x, places, result, last_tok=None, decode_state=None) -> None:
    """The verify step's greedy acceptance on the device (``CudaGraphVerifier``): x holds each row's inputs (tokens,
    positions, write columns, drafts judged; ``width`` each but the last), logits (rows, width, V) the target's.
    Writes result (the argmax at each place, then the accepted count), the judged rows' bonus into last_tok and
    their place past the accepted tokens into decode_state (rows: position, write column, active). Eager it is
    about 20 small kernels in the verify graph; the verifier of a compiled runner compiles it into a few."""
    w = logits.shape[1]
    best = logits.argmax(-1)
    judged = x[:, 3 * w]
    kept = (x[:, 1:w] == best[:, :-1]) & (places < judged[:, None])
    accepted = kept.long().cumprod(1).sum(1)  # drafts up to the first the target would not have chosen
    result.copy_(torch.cat([best, accepted[:, None]], 1))
    on = judged > 0
    if last_tok is not None:
        bonus = best.gather(1, accepted[:, None])[:, 0]
        last_tok.copy_(torch.where(on, bonus, last_tok))
    if decode_state is not None:  # the newest token now sits after the accepted drafts
        pos, cols, active = decode_state
        moved = torch.where(on, x[:, w] + accepted + 1, pos)
        pos.copy_(moved)
        cols.copy_(torch.where(on & (active > 0), moved, cols))


class CudaGraphDrafter(_StaticSteps):
    """A draft model's proposals for speculative decoding in one replay over slots 0..B-1: a feed of up to 2
    tokens per row (the bonus token, after a fully accepted step also the last draft), whose last logits give d1,
    then ``k - 1`` one-token steps, each fed the argmax of the one before (d2..dk).

    Inputs per row: feed tokens, positions, write columns (2 each), the feed's last index, then the later steps'
    positions and write columns (k - 1 each; scratch where a row wants fewer drafts). Output: ``drafts`` (rows, k)."""

    FEED = 2

    def __init__(self, runner, k: int, buckets=None, capture=None, length_buckets=None):
        f = self.FEED
        super().__init__(runner, 3 * f + 1 + 2 * (k - 1), f, buckets, capture, length_buckets)
        self.k = k
        n, dev = self.buckets[-1], runner.device
        scratch = runner.scratch_col
        self._idle = torch.cat(
            [
                torch.zeros(f),
                torch.arange(f),
                torch.full((f,), scratch),
                torch.zeros(1),
                torch.zeros(k - 1),
                torch.full((k - 1,), scratch),
            ]
        ).long()
        self._idle_np = self._idle.numpy()
        with torch.inference_mode():
            self.inputs.copy_(self._idle.expand(n, -1))
            self.drafts = torch.zeros((n, k), dtype=torch.long, device=dev)
        if self.capture:
            self._capture_all()

    def _run(self, b: int, length: int) -> None:
        f, m = self.FEED, self.k - 1
        x = self.inputs[:b]
        tokens, positions, cols, last = x[:, :f], x[:, f : 2 * f], x[:, 2 * f : 3 * f], x[:, 3 * f]
        later_pos, later_cols = x[:, 3 * f + 1 : 3 * f + 1 + m], x[:, 3 * f + 1 + m :]
        tok = self.runner.compute(tokens, positions, 0, length, write_cols=cols, last_index=last).argmax(-1)
        self.drafts[:b, 0].copy_(tok)
        for j in range(m):  # stays on the device: each step's argmax is the next step's input
            col = later_cols[:, j, None]
            tok = self.runner.compute(tok[:, None], later_pos[:, j, None], 0, length, write_cols=col).argmax(-1)
            self.drafts[:b, j + 1].copy_(tok)

    def propose(self, b: int, length: int) -> torch.Tensor:
        """Run the rows laid out in ``stage_rows(b)`` (as above) for slots 0..b-1, attending to at least ``length``
        columns; returns a view of the drafts (b, k)."""
        self._launch(b, length)
        return self.drafts[:b]
