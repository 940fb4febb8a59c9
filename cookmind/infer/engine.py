"""The generation engine: continuous batching over a paged (or slot) KV cache.

Each iteration of ``step()``:
  1. drops cancelled requests (their rows and KV blocks free at once) and admits waiting ones into
     free rows, while the block pool can still hold them (else they wait in the queue);
  2. prefills new requests, a bounded number of prompt tokens per iteration (long prompts are
     chunked), batching requests that sit in neighbouring slots;
  3. runs one decode step for every request that is generating, each with its own sampling
     parameters and seed, and emits one token event per request.
Requests therefore join and leave the running batch between decode steps. The engine works
on token ids only; text (detokenizing, stop strings, reasoning) is the caller's business, and
a caller that sees a stop string simply cancels the request.
"""

from __future__ import annotations

import itertools
import math
import queue
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from cookmind.infer.block_manager import BlockManager
from cookmind.infer.constraints import GrammarMatcher, constrain_logits
from cookmind.infer.cuda_graphs import CudaGraphDecoder
from cookmind.infer.multi_lora import LoRAAdapter, attach_adapters
from cookmind.infer.paged_cache import blocks_for_budget
from cookmind.infer.runner import ModelRunner
from cookmind.infer.sampling import (
    SamplingBatch,
    SamplingParams,
    ban_tokens,
    make_generator,
    process_logits,
    sample_from_logits,
)
from cookmind.infer.slot_cache import SlotKVCache
from cookmind.infer.speculative import SpeculativeConfig, Speculator


@dataclass
class TokenEvent:
    """One generated token; logprob fields are filled when the request asked for logprobs."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class PromptLogprobsEvent:
    """Log-probabilities of the prompt's own tokens, sent once after prefill when asked for:
    logprobs[i] = log p(prompt[i] | prompt[:i]) under the raw model (None for i = 0, which has no
    context), and top[i] the top-k (token, logprob) pairs at that place (None for i = 0)."""

    logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None]


@dataclass
class FinishEvent:
    """The last event of a request: reason is "stop", "length", "cancelled" or "error"."""

    reason: str
    error: str | None = None


@dataclass
class StepRecord:
    """One sampled step whose tokens may still be on their way to the host (``Engine._emit_record`` reads it)."""

    reqs: list[EngineRequest]
    tokens: torch.Tensor  # on the host once ``ready`` has fired: one per request, or one per slot (by_slot)
    ready: torch.cuda.Event | None  # the copy's event (None: the tokens are readable now)
    by_slot: bool = False  # tokens are indexed by slot (the graph's argmax buffer), not by request
    chosen_logprobs: list[float] | None = None  # log p of each request's token, when any asked for logprobs
    top_logprobs: tuple[list[list[float]], list[list[int]]] | None = None  # (values, token ids) of the top k
    constrained: bool = False  # a request has a grammar: its next mask needs these tokens on the host at once


class QueueFullError(RuntimeError):
    """The engine's waiting queue is full; the server answers 429."""


class EngineClosedError(RuntimeError):
    """The engine takes no new request (``close_to_new``: a server stopping at once); the server answers 503."""


_ids = itertools.count()


class EngineRequest:
    """A request inside the engine; consumers read its events (``events()`` or their own sink)."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        stop_token_ids=(),
        sink: Callable[[object], None] | None = None,
        device="cpu",
        prompt_logprobs: int | None = None,
    ):
        self.id = next(_ids)
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.params = params
        self.max_new_tokens = int(max_new_tokens)
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids)
        self.prompt_logprobs = prompt_logprobs  # None: not asked; k: chosen token's and the top k's
        self._prompt_lp: list[float | None] = [None]
        self._prompt_top: list[list[tuple[int, float]] | None] = [None]
        self._queue: queue.Queue | None = None
        if sink is None:
            self._queue = queue.Queue()
            sink = self._queue.put
        self.sink = sink
        self.generator = make_generator(params.seed, device)
        self.output_ids: list[int] = []
        self.n_sampled = 0  # tokens drawn so far (ahead of output_ids while a step is in flight)
        self.state = "waiting"  # waiting -> prefill -> decode -> done
        self.slot: int | None = None
        self.blocks: list[int] = []  # paged cache: KV blocks held, in position order
        self.reserved_blocks = 0  # paged cache: blocks set aside at admission for the whole request
        self.prefilled = 0
        self.cached_tokens = 0  # prefix cache: prompt tokens found cached at admission (not computed)
        self.adapter: str | None = None  # the LoRA adapter serving it (None: the base model)
        self.adapter_index = 0  # its index in the engine's adapter stacks (0: none)
        self.block_keys: list[tuple] = []  # prefix cache: (key, parent key, tokens) of each full prompt block
        self.matcher: GrammarMatcher | None = None  # params.grammar's state (structured outputs)
        self.cancelled = False
        self.cancel_reason = "cancelled"  # the finish reason a cancel gives ("stop" for a stop string)
        self.finish_reason: str | None = None
        self.text_stops = False  # the caller matches stop strings on the text (Engine.submit)
        self.count_held = False  # a "length" finish not counted yet: the caller's next cancel() settles it
        self.stop_token: int | None = None  # the stop token that ended it (finish reason "stop")
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None

    def events(self, timeout: float | None = None) -> Iterator[TokenEvent | FinishEvent]:
        """Blocking iterator over this request's events (only without a custom sink)."""
        if self._queue is None:
            raise RuntimeError("this request was submitted with its own sink; read events there")
        while True:
            ev = self._queue.get(timeout=timeout)
            yield ev
            if isinstance(ev, FinishEvent):
                return


class Engine:
    """Continuous-batching generation over ``num_slots`` concurrent requests.

    kv_cache="paged" (default): keys/values live in blocks of ``block_size`` positions from one pool
    sized by ``kv_budget_bytes`` (default 256 MiB). A request is admitted when the pool can set aside
    the blocks its prompt plus max_new_tokens can fill (so it never runs out mid-way and nobody is
    preempted); it takes them one at a time as it grows and returns them all when it ends.
    kv_cache="slots": every row owns the whole context (``num_slots`` from the budget when not given).
    prefix_cache=True (paged only, off by default): full prompt blocks are kept after their request ends
    and shared by later requests that start with the same tokens, whose prefill then starts after them
    (see prefix_cache.py); cached blocks nobody holds count as free and are evicted LRU when needed.
    On CUDA, decode steps replay CUDA graphs (``cuda_graphs``) of a forward whose layers run through
    torch.compile (``compile``) around the paged decode-attention kernel (``decode_attention``, see
    runner.py; "gather" keeps the gather + SDPA path, where ``compile_attention`` compiles attention too).
    tokenizer: needed by requests with a ``SamplingParams.grammar`` (structured outputs, constraints.py); their
    rows are masked to the grammar before sampling, and a step holding one reads its tokens back at once.
    adapters (``multi_lora.LoRAAdapter``s, from ``loading.load_adapters``): LoRA adapters a request picks by name
    (``submit(adapter=...)``); requests for different adapters and the base share every batch (the model's targeted
    projections become ``MultiLoRALinear``s), and the prefix cache shares blocks only within one adapter.
    lora_update: how a decode step computes each row's adapter update (``multi_lora.attach_adapters``: "auto",
    "masked", "gathered" or "kernel", the Triton kernels of ``kernels.lora_bgmv``: CUDA; "auto" takes them where
    they run, ``multi_lora.resolve_update``).
    speculative (a SpeculativeConfig): greedy requests draft k tokens (n-gram lookup or a draft model) and verify
    them in one forward, emitting up to k + 1 tokens per step (see speculative.py); the others decode as before.

    Use ``start()`` for a background thread (the server), or call ``step()`` / ``run_until_idle()``
    yourself (benchmarks, tests). ``submit`` and ``cancel`` are thread-safe.
    """

    def __init__(
        self,
        model,
        num_slots: int | None = None,
        max_seq_len: int | None = None,
        kv_budget_bytes: int | None = None,
        max_waiting: int = 256,
        prefill_chunk: int = 512,
        cuda_graphs: bool | None = None,
        overlap: bool | None = None,
        kv_cache: str = "paged",
        block_size: int = 16,
        compile: bool | None = None,
        compile_attention: bool = False,
        prefix_cache: bool = False,
        decode_attention: str = "auto",
        fuse_projections: bool = True,
        tokenizer=None,
        adapters: list[LoRAAdapter] | None = None,
        lora_update: str = "auto",
        speculative: SpeculativeConfig | None = None,
    ):
        cfg = model.config
        self.tokenizer = tokenizer
        self.model_config = cfg  # the server reads its eos_token_id (text_stop_ids)
        param = next(model.parameters())
        self.device = param.device
        self.max_seq_len = int(max_seq_len or cfg.max_position_embeddings)
        budget = kv_budget_bytes if kv_budget_bytes is not None else 256 * 2**20
        num_blocks = None
        if kv_cache == "paged":
            if kv_budget_bytes is None and num_slots is not None:  # as much as num_slots full contexts
                num_blocks = num_slots * -(-self.max_seq_len // block_size) + 1
            else:
                num_blocks = blocks_for_budget(
                    budget,
                    cfg.num_hidden_layers,
                    cfg.num_key_value_heads,
                    block_size,
                    cfg.resolved_head_dim,
                    param.dtype,
                )
            num_slots = num_slots or min(256, num_blocks - 1)
        elif num_slots is None:
            num_slots = min(
                256,
                SlotKVCache.slots_for_budget(
                    budget,
                    cfg.num_hidden_layers,
                    cfg.num_key_value_heads,
                    self.max_seq_len + 1,
                    cfg.resolved_head_dim,
                    param.dtype,
                ),
            )
        # before the runner: it fuses q/k/v and gate/up, each fused projection taking its parts' adapters along
        self.lora = attach_adapters(model, adapters, num_slots, lora_update) if adapters else None
        self.runner = ModelRunner(
            model,
            num_slots,
            self.max_seq_len,
            kv_cache=kv_cache,
            num_blocks=num_blocks,
            block_size=block_size,
            decode_attention=decode_attention,
            fuse_projections=fuse_projections,
            adapters=self.lora,
        )
        self.paged = self.runner.paged
        self.block_size = block_size
        if prefix_cache and not self.paged:
            raise ValueError("prefix_cache=True needs kv_cache='paged' (blocks are what requests share)")
        self.blocks = BlockManager(self.runner.cache, self.max_seq_len, prefix_cache) if self.paged else None
        self.prefix = self.blocks.prefix if self.paged else None
        self.vocab_size = cfg.vocab_size
        self.max_waiting = max_waiting
        self.closed_reason: str | None = None  # close_to_new's: a submit after it is refused with it
        self.prefill_chunk = prefill_chunk
        self._last_tok = torch.zeros(num_slots, dtype=torch.long, device=self.device)  # newest sampled token
        use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        # on CPU the graph decoder runs the same steps eagerly (tests use it there)
        if self.device.type == "cuda" if compile is None else compile:
            self.runner.set_compiled(True, attention=compile_attention)
        self.graphs = CudaGraphDecoder(self.runner, self._last_tok) if use_graphs else None
        if self.runner.compiled:
            self._warm_prefill()
        self._graph_key: tuple | None = None  # the batch the graph state was loaded for
        # overlap: launch decode step k+1 before reading step k's tokens back, so the host's
        # bookkeeping runs while the device computes (a request that stopped at step k wastes one row)
        self.overlap = (self.device.type == "cuda") if overlap is None else overlap
        cuda = self.device.type == "cuda"
        self._host_bufs = [torch.zeros(num_slots, dtype=torch.long, pin_memory=cuda) for _ in range(2)]
        self._events = [torch.cuda.Event() for _ in range(2)] if cuda else [None, None]
        self._buf_turn = 0
        self._pending: StepRecord | None = None  # a launched decode step whose tokens are not yet emitted
        self.slots: list[EngineRequest | None] = [None] * num_slots
        self.waiting: deque[EngineRequest] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        self._seen: torch.Tensor | None = None  # (slots, V) bool, for the repetition penalty
        self._counts: torch.Tensor | None = None  # (slots, V) long, for presence/frequency
        self._batch_key: tuple | None = None
        self._batch: SamplingBatch | None = None
        self._batch_constrained = self._batch_min_new = self._batch_logprobs = False  # of its rows (_sampling_batch)
        self._grammar_bitmask: torch.Tensor | None = None  # host rows of the grammar masks (constraints.py)
        # metrics
        self.requests_total = 0
        self.requests_finished = 0
        self.finished_by_reason: dict[str, int] = {}
        self.tokens_generated = 0
        self.prompt_tokens = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._finished_at: deque[float] = deque(maxlen=1024)  # when the latest requests finished (retry_after)
        self.spec = Speculator(speculative, self) if speculative is not None else None

    @torch.inference_mode()
    def _warm_prefill(self) -> None:
        """Compile the prefill shapes (one row, several rows) now rather than inside the first request.
        Every write goes to the scratch column (slots) or the scratch block (paged): no state changes."""
        t = min(8, self.max_seq_len)
        for b in sorted({1, min(2, self.runner.num_slots)}):
            dev = self.device
            positions = torch.arange(t, device=dev).expand(b, t)
            cols = torch.full((b, t), self.runner.scratch_col, dtype=torch.long, device=dev)
            self.runner.forward(
                torch.zeros((b, t), dtype=torch.long, device=dev),
                positions,
                0,
                t,
                write_cols=cols,
                last_index=torch.full((b,), t - 1, dtype=torch.long, device=dev),
            )

    @property
    def num_slots(self) -> int:
        return len(self.slots)

    @property
    def adapter_names(self) -> list[str]:
        """The LoRA adapters a request may name (``submit(adapter=...)``)."""
        return [] if self.lora is None else list(self.lora.names)

    # ---- public API -------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        max_new_tokens: int | None = None,
        stop_token_ids=None,
        sink: Callable[[object], None] | None = None,
        prompt_logprobs: int | None = None,
        adapter: str | None = None,
        text_stops: bool = False,
    ) -> EngineRequest:
        """Queue a request; raises QueueFullError when the waiting queue is full and ValueError
        when the prompt leaves no room in the context. prompt_logprobs=k: send a PromptLogprobsEvent
        (the prompt's tokens scored, with the top k at each place) before the first token.
        max_new_tokens / stop_token_ids: default to the params' own. max_new_tokens=0 only prefills (with
        prompt_logprobs: scoring a text) and finishes "length". Stop strings are the caller's (it cancels).
        adapter: the name of a LoRA adapter the engine serves (None: the base model).
        text_stops: the caller matches stop strings on the request's text (the server), so it may find one only after
        the engine finished the request at its length: in its last token, or in the text its detokenizer held back
        until the end (an unfinished character). Such a finish is counted when the caller's next ``cancel`` settles
        it, "stop" or the engine's "length": /metrics' counters only go up, so a finish is counted once, and only
        with the reason the client is told."""
        params = params or SamplingParams()
        max_new_tokens = params.max_new_tokens if max_new_tokens is None else max_new_tokens
        stop_token_ids = params.stop_token_ids if stop_token_ids is None else stop_token_ids
        if len(prompt_ids) == 0:
            raise ValueError("the prompt is empty: it needs at least one token")
        if len(prompt_ids) >= self.max_seq_len:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {self.max_seq_len}; shorten the prompt"
            )
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if prompt_logprobs is not None and prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0 (top-k per prompt token), got {prompt_logprobs}")
        bad = [t for t in prompt_ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if adapter is not None and self.lora is None:
            raise ValueError(f"unknown adapter {adapter!r}: this engine serves no LoRA adapters")
        index = 0 if self.lora is None else self.lora.index(adapter)
        req = EngineRequest(prompt_ids, params, max_new_tokens, stop_token_ids, sink, self.device, prompt_logprobs)
        if params.grammar is not None:
            req.matcher = self._grammar_matcher(req)
        req.adapter, req.adapter_index, req.text_stops = adapter, index, text_stops
        if self.blocks is not None:
            self.blocks.check_fits(req)
        with self._cond:
            if self.closed_reason is not None:  # checked with the queue: none slips in after close_to_new
                raise EngineClosedError(self.closed_reason)
            if len(self.waiting) >= self.max_waiting:
                raise QueueFullError(f"the request queue is full ({self.max_waiting} waiting); retry later")
            self.waiting.append(req)
            self.requests_total += 1
            self._cond.notify()
        return req

    def _grammar_matcher(self, req: EngineRequest) -> GrammarMatcher:
        """The request's grammar compiled now, so a bad grammar fails its submit rather than a step. The response
        ends with the request's stop tokens (the tokenizer's end-of-text when it has none)."""
        if self.tokenizer is None:
            raise ValueError("a request with a grammar needs the engine's tokenizer: build Engine(..., tokenizer=tok)")
        if not req.stop_token_ids:
            eos = getattr(self.tokenizer, "eos_id", None)
            if eos is None:
                raise ValueError("a request with a grammar needs stop_token_ids (the tokenizer has no end-of-text)")
            req.stop_token_ids = frozenset({eos})
        return GrammarMatcher(self.tokenizer, self.vocab_size, req.params.grammar, req.stop_token_ids)

    def cancel(self, req: EngineRequest, reason: str = "cancelled") -> None:
        """Stop a request; its slot is freed at the start of the next step. ``reason``: its finish reason,
        "cancelled" (the client left) or "stop" (a stop string the caller found); the first cancel's counts. On a
        request the engine already finished at its length whose count waits for the caller (``text_stops``), the
        cancel settles it: "stop" makes it a stop (a stop string in its last token, or completed by the text flushed
        at its end, as the client was told), any other reason leaves it "length"; it is counted then."""
        with self._cond:
            if req.state == "done":
                if req.count_held:
                    req.count_held = False
                    if reason == "stop":
                        req.finish_reason = "stop"
                    self._count_finish(req.finish_reason)
                return
            if not req.cancelled:
                req.cancel_reason = reason
            req.cancelled = True
            self._cond.notify()

    def close_to_new(self, reason: str) -> None:
        """Refuse every later ``submit`` (EngineClosedError with ``reason``): a server stopping at once cuts what runs
        (``cancel_all``), and a request its handler hands over afterwards must not start."""
        with self._cond:
            self.closed_reason = reason

    def cancel_all(self, reason: str) -> int:
        """``cancel`` every request running or waiting (a server stopping: ``reason`` "shutdown"); how many."""
        with self._cond:
            reqs = [r for r in self.slots if r is not None and r.state != "done"] + list(self.waiting)
        for req in reqs:
            self.cancel(req, reason)
        return len(reqs)

    def has_work(self) -> bool:
        return bool(self.waiting) or self._pending is not None or any(r is not None for r in self.slots)

    def run_until_idle(self) -> None:
        while self.has_work():
            self.step()

    def start(self) -> None:
        """Run steps in a background thread until ``stop()``."""
        if self._thread is not None:
            return
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="cookmind-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def retry_after(self, window: float = 10.0) -> int:
        """Seconds a client refused for a full queue should wait (a 429's Retry-After): a place in the queue frees
        each time a request finishes, so the mean time between the finishes of the last ``window`` seconds, rounded
        up and kept within 1..60; ``window`` when none finished in that time."""
        now = time.perf_counter()
        finished = sum(now - t <= window for t in list(self._finished_at))
        if finished == 0:
            return math.ceil(window)
        return max(1, min(60, math.ceil(window / finished)))

    def metrics(self) -> dict:
        now = time.perf_counter()
        while self._recent and now - self._recent[0][0] > 10.0:
            self._recent.popleft()
        recent = sum(n for _, n in self._recent)
        return {
            "requests_total": self.requests_total,
            "requests_finished": self.requests_finished,
            "requests_running": sum(r is not None for r in self.slots),
            "queue_depth": len(self.waiting),
            "prompt_tokens_total": self.prompt_tokens,
            "generated_tokens_total": self.tokens_generated,
            "tokens_per_second": recent / 10.0,  # over the last 10 s
            "slots": self.num_slots,
            **self.kv_blocks(),
            **(self.prefix.metrics() if self.prefix is not None else {}),
            **(self.spec.metrics() if self.spec is not None else {}),
            **{f"requests_finished_{k}": v for k, v in sorted(self.finished_by_reason.items())},
        }

    # ---- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._running and not self.has_work():
                    self._cond.wait()
                if not self._running:
                    break
            try:
                self.step()
            except Exception as exc:  # a failing step must not hang every client
                self._pending = None
                if self.blocks is not None:  # what a failed step wrote is not trusted
                    self.blocks.forget_cached()
                failed = [r for r in self.slots if r is not None]
                why = f"{type(exc).__name__}: {exc}"
                # said on the console too: the clients' 500s (or "error" finishes) were all anyone learnt
                where = traceback.extract_tb(exc.__traceback__)[-1]
                print(
                    f"cookmind engine: error: a generation step failed ({why}, at {where.filename}:{where.lineno}); "
                    f"its {len(failed)} request(s) end with an error, the server goes on",
                    file=sys.stderr,
                    flush=True,
                )
                for req in failed:
                    self._finish(req, "error", why)
        for req in [r for r in self.slots if r is not None] + list(self.waiting):
            self._finish(req, "cancelled")
        self.waiting.clear()
        self._pending = None

    @torch.inference_mode()
    def step(self) -> None:
        """One iteration: cancel, admit, prefill a chunk, decode one token for every generating request (with
        speculation: several for those whose drafts the model verifies, one for the rest)."""
        self._admit()
        self._prefill()
        if self.spec is not None:  # a proposal needs the request's newest token on the host: read the step in flight
            if self._pending is not None and self.spec.needs_tokens(self._pending.reqs):
                self._emit_record(self._pending)
                self._pending = None
            self.spec.step()  # requests with drafts: verified and emitted now, up to k + 1 tokens each
        launched = self._decode()
        if self._pending is not None:
            self._emit_record(self._pending)
        self._pending = None
        if launched is not None:
            # a grammar's next mask needs this step's tokens on the host: no overlap for a step holding one
            if self.overlap and not launched.constrained:
                self._pending = launched  # emitted after the next step is launched
            else:
                self._emit_record(launched)

    def _admit(self) -> None:
        with self._cond:
            for req in [r for r in self.slots if r is not None and r.cancelled]:
                self._finish(req, req.cancel_reason)
            for req in [r for r in self.waiting if r.cancelled]:
                self.waiting.remove(req)
                self._finish(req, req.cancel_reason)
            free = [i for i, r in enumerate(self.slots) if r is None]
            while self.waiting and free:
                # first come, first served: the head waits until the pool can hold it
                if self.blocks is not None and not self.blocks.try_reserve(self.waiting[0]):
                    break
                req = self.waiting.popleft()
                req.slot, req.state = free.pop(0), "prefill"
                self.slots[req.slot] = req
                if self.lora is not None:
                    self.lora.set_slot(req.slot, req.adapter_index)
                self.prompt_tokens += len(req.prompt_ids)
                self._init_penalty_rows(req)

    def kv_blocks(self) -> dict:
        """Paged cache accounting: pool size, blocks free, blocks promised to running requests."""
        return {} if self.blocks is None else self.blocks.accounting()

    def _init_penalty_rows(self, req: EngineRequest) -> None:
        p = req.params
        if p.repetition_penalty != 1 or p.presence_penalty != 0 or p.frequency_penalty != 0:
            if self._seen is None:
                self._seen = torch.zeros((self.num_slots, self.vocab_size), dtype=torch.bool, device=self.device)
                self._counts = torch.zeros((self.num_slots, self.vocab_size), dtype=torch.long, device=self.device)
        if self._seen is not None:
            self._seen[req.slot] = False
            self._seen[req.slot, torch.tensor(req.prompt_ids, device=self.device)] = True
            self._counts[req.slot] = 0

    def _prefill(self) -> None:
        pending = sorted((r for r in self.slots if r is not None and r.state == "prefill"), key=lambda r: r.slot)
        chosen, budget = [], self.prefill_chunk
        for req in pending:
            n = min(len(req.prompt_ids) - req.prefilled, self.prefill_chunk)
            if chosen and n > budget:
                break
            chosen.append((req, n))
            budget -= n
        # neighbouring slots share one forward; a gap starts a new run
        runs: list[list[tuple[EngineRequest, int]]] = []
        for item in chosen:
            if runs and runs[-1][-1][0].slot + 1 == item[0].slot:
                runs[-1].append(item)
            else:
                runs.append([item])
        for run in runs:
            self._prefill_run(run)

    def _prefill_run(self, run: list[tuple[EngineRequest, int]]) -> None:
        b, t = len(run), max(n for _, n in run)
        scratch = self.runner.scratch_col
        tokens = torch.zeros((b, t), dtype=torch.long)
        positions = torch.zeros((b, t), dtype=torch.long)
        write_cols = torch.full((b, t), scratch, dtype=torch.long)
        last = torch.zeros(b, dtype=torch.long)
        for i, (req, n) in enumerate(run):
            chunk = req.prompt_ids[req.prefilled : req.prefilled + n]
            tokens[i, :n] = torch.tensor(chunk)
            positions[i] = torch.arange(req.prefilled, req.prefilled + t)
            write_cols[i, :n] = positions[i, :n]
            last[i] = n - 1
        attn_len = min(int(positions.max()) + 1, self.max_seq_len)
        dev = self.device
        if self.paged:
            for req, n in run:
                self.blocks.grow(req, req.prefilled + n - 1)
            self.runner.cache.sync_tables()
        scored = any(req.prompt_logprobs is not None for req, _ in run)
        last = last.to(dev)
        logits = self.runner.forward(
            tokens.to(dev),
            positions.clamp(max=self.max_seq_len - 1).to(dev),
            run[0][0].slot,
            attn_len,
            write_cols=write_cols.to(dev),
            last_index=last,
            last_only=not scored,
        )
        if scored:  # (B, T, V): every place's prediction; the last real one of each row samples
            for i, (req, n) in enumerate(run):
                if req.prompt_logprobs is not None:
                    self._score_prompt(req, logits[i, :n])
            logits = logits[torch.arange(b, device=dev), last]
        done_rows = []
        for i, (req, n) in enumerate(run):
            req.prefilled += n
            if self.blocks is not None:
                self.blocks.register_prompt_blocks(req, req.prefilled - n)
            if req.prefilled == len(req.prompt_ids):
                if req.prompt_logprobs is not None:
                    req.sink(PromptLogprobsEvent(req._prompt_lp, req._prompt_top))
                if req.max_new_tokens == 0:  # prefill only
                    self._finish(req, "length")
                else:
                    done_rows.append(i)
        if done_rows:
            reqs = [run[i][0] for i in done_rows]
            for req in reqs:
                req.state = "decode"
            self._emit_record(self._sample(reqs, logits[done_rows]))

    def _score_prompt(self, req: EngineRequest, logits: torch.Tensor) -> None:
        """Prompt logprobs from one prefill chunk: logits (n, V) at places s..s+n-1 predict tokens s+1..s+n."""
        start = req.prefilled
        m = min(logits.shape[0], len(req.prompt_ids) - 1 - start)  # the last prompt token predicts no prompt token
        if m <= 0:
            return
        logp = torch.log_softmax(logits[:m].float(), dim=-1)  # log p(x_{j+1} | x_{<=j})
        targets = torch.tensor(req.prompt_ids[start + 1 : start + 1 + m], device=logp.device)
        req._prompt_lp.extend(logp.gather(-1, targets[:, None])[:, 0].tolist())
        k = req.prompt_logprobs
        if k:
            vals, idx = logp.topk(k, dim=-1)
            req._prompt_top.extend([list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())])
        else:
            req._prompt_top.extend([[] for _ in range(m)])

    def _decode(self) -> StepRecord | None:
        """Launch one decode step for every generating request; return its (unread) record."""
        active = [
            r
            for r in self.slots
            if r is not None
            and r.state == "decode"
            and 0 < r.n_sampled < r.max_new_tokens
            and len(r.prompt_ids) + r.n_sampled < self.max_seq_len
            and (self.spec is None or r.id not in self.spec.claimed)  # those advanced by speculation this step
        ]
        if not active:
            return None
        b = max(r.slot for r in active) + 1
        # rows of idle slots sit at position 0 and write only to the scratch column
        positions, write_cols = [0] * b, [self.runner.scratch_col] * b
        for r in active:
            positions[r.slot] = write_cols[r.slot] = len(r.prompt_ids) + r.n_sampled - 1  # the newest token's place
        rows = [r.slot for r in active]
        if self.paged:
            for r in active:
                self.blocks.grow(r, positions[r.slot])
            self.runner.cache.sync_tables()
        length = max(positions) + 1  # columns the longest row attends to
        batch = self._sampling_batch(active)
        constrained = self._batch_constrained  # grammar rows: masked logits, tokens read now
        if self.graphs is not None and self.graphs.bucket_for(b) is not None:
            key = (b, tuple((r.slot, r.id) for r in active))
            if key != self._graph_key:  # requests joined or left: tell the graph state; else it advanced itself
                flags = [0] * b
                for r in active:
                    flags[r.slot] = 1
                self.graphs.load(positions, flags)
                self._graph_key = key
            logits = self.graphs.decode(b, length)
            if (
                batch.uses("all_greedy")
                and not batch.uses("repetition")
                and not batch.uses("presence_frequency")
                and not any(r.params.logprobs or r.n_sampled < r.params.min_new_tokens for r in active)
                and not constrained
            ):
                return self._greedy_record(active, b)  # the graph already took the argmax into _last_tok
        else:
            self._graph_key = None  # the graph state is stale after an eager step
            tokens = self._last_tok[:b]  # sampled on the device last step; never visits the host
            pw = torch.tensor([positions, write_cols], dtype=torch.long).to(self.device)
            logits = self.runner.forward(tokens[:, None], pw[0, :, None], 0, length, write_cols=pw[1, :, None])
        logits = logits if rows == list(range(b)) else logits[rows]
        return self._sample(active, logits, deferred=self.overlap and not constrained, batch=batch)

    def _copy_to_host(self, values: torch.Tensor, deferred: bool):
        """Start copying values into a pinned buffer (two alternate); returns (host tensor, event)."""
        if not deferred:
            return values, None
        turn = self._buf_turn
        self._buf_turn ^= 1
        host = self._host_bufs[turn][: values.shape[0]]
        host.copy_(values, non_blocking=self.device.type == "cuda")
        event = self._events[turn]
        if event is not None:
            event.record()
        return host, event

    def _greedy_record(self, reqs: list[EngineRequest], b: int) -> StepRecord:
        for r in reqs:
            r.n_sampled += 1
        host, event = self._copy_to_host(self._last_tok[:b], self.overlap)
        return StepRecord(reqs, host, event, by_slot=True)  # not constrained: a grammar's rows go through _sample

    def _sampling_batch(self, reqs: list[EngineRequest]) -> SamplingBatch:
        """The batch's sampling tensors, and what the engine needs to know of its rows (``_batch_constrained``: a
        row has a grammar; ``_batch_min_new``: one has min_new_tokens; ``_batch_logprobs``: one asks for logprobs),
        kept until the batch changes rather than found again every step (host time per step, #18)."""
        key = tuple(r.id for r in reqs)
        if key != self._batch_key:  # rebuilt only when the batch changes (a request's matcher is set at submit)
            self._batch = SamplingBatch.from_params([r.params for r in reqs], self.device, [r.generator for r in reqs])
            self._batch_key = key
            self._batch_constrained = any(r.matcher is not None for r in reqs)
            self._batch_min_new = any(r.params.min_new_tokens > 0 for r in reqs)
            self._batch_logprobs = any(r.params.logprobs for r in reqs)
        return self._batch

    def _sample(
        self,
        reqs: list[EngineRequest],
        logits: torch.Tensor,
        deferred: bool = False,
        batch: SamplingBatch | None = None,
    ) -> StepRecord:
        """Draw each request's next token on the device. deferred: start an asynchronous copy of the
        tokens into a pinned host buffer (two alternate: one pending step is read while the next fills).
        batch: ``_sampling_batch(reqs)``, when the caller has it."""
        batch = self._sampling_batch(reqs) if batch is None else batch
        if self._batch_min_new:
            bans = {i: tuple(r.stop_token_ids) for i, r in enumerate(reqs) if r.n_sampled < r.params.min_new_tokens}
            logits = ban_tokens(logits, {i: ids for i, ids in bans.items() if ids})
        if self._batch_constrained:
            matchers = [r.matcher for r in reqs]
            if self._grammar_bitmask is None:  # pinned on CUDA; refilled only after the step's tokens are read
                words = (self.vocab_size + 31) // 32
                cuda = self.device.type == "cuda"
                self._grammar_bitmask = torch.empty((self.num_slots, words), dtype=torch.int32, pin_memory=cuda)
            logits = constrain_logits(logits, matchers, self._grammar_bitmask)
        slot_list = [r.slot for r in reqs]
        contiguous = slot_list == list(range(slot_list[0], slot_list[0] + len(slot_list)))
        slots = None if contiguous and self._seen is None else torch.tensor(slot_list, device=self.device)
        seen = counts = None
        if self._seen is not None:
            seen, counts = self._seen[slots], self._counts[slots]
        next_tokens = sample_from_logits(process_logits(logits, batch, seen, counts), batch)
        if self._seen is not None:
            self._seen[slots, next_tokens] = True
            self._counts[slots, next_tokens] += 1
        if contiguous:
            self._last_tok[slot_list[0] : slot_list[0] + len(slot_list)].copy_(next_tokens)
        else:
            self._last_tok[slots] = next_tokens
        for r in reqs:
            r.n_sampled += 1
        host, event = self._copy_to_host(next_tokens, deferred)
        record = StepRecord(reqs, host, event, constrained=self._batch_constrained)
        if self._batch_logprobs:
            logp = torch.log_softmax(logits.float(), dim=-1)
            record.chosen_logprobs = logp.gather(-1, next_tokens[:, None])[:, 0].tolist()
            k = max(r.params.top_logprobs for r in reqs)
            if k:
                vals, idx = logp.topk(k, dim=-1)
                record.top_logprobs = (vals.tolist(), idx.tolist())
        return record

    def _emit_record(self, record: StepRecord) -> None:
        """Wait for a step's tokens to reach the host; emit events and finish requests."""
        reqs = record.reqs
        if record.ready is not None:
            record.ready.synchronize()
        now = time.perf_counter()
        values = record.tokens.tolist()
        tokens = [values[r.slot] for r in reqs] if record.by_slot else values
        events = [TokenEvent(tok) for tok in tokens]
        if record.chosen_logprobs is not None:
            for i, (req, ev) in enumerate(zip(reqs, events)):
                if req.params.logprobs:
                    ev.logprob = record.chosen_logprobs[i]
                    if record.top_logprobs is not None and req.params.top_logprobs:
                        n = req.params.top_logprobs
                        vals, ids = record.top_logprobs
                        ev.top_logprobs = list(zip(ids[i][:n], vals[i][:n]))
        self._emit(zip(reqs, events), now)

    def _emit_tokens(self, reqs: list[EngineRequest], tokens: list[list[int]]) -> None:
        """Emit each request's tokens in order (a speculative step's, already on the host) in one pass: a stop
        token, max_new_tokens or the context ends a request exactly where plain decoding would, and the tokens
        after it are dropped."""
        self._emit(((req, TokenEvent(tok)) for req, toks in zip(reqs, tokens) for tok in toks), time.perf_counter())

    def _emit(self, events, now: float) -> None:
        """Send each (request, token event) in order to its request, or finish the request instead (done,
        cancelled, a stop token); finish it after the token when that reached max_new_tokens, the context or the
        grammar's end. One loop for every step's tokens and no call per token but the request's sink: this loop is
        the engine's host time per token (#18)."""
        emitted = 0
        max_seq_len = self.max_seq_len
        for req, ev in events:
            if req.state == "done":
                continue  # it stopped at the step before: this row was computed in flight, not used
            if req.first_token_at is None:
                req.first_token_at = now
            if req.cancelled:
                self._finish(req, req.cancel_reason)
                continue
            tok = ev.token_id
            if tok in req.stop_token_ids:
                req.stop_token = tok  # not emitted as text; callers that train on it (GRPO) read it here
                self._finish(req, "stop")
                continue
            req.output_ids.append(tok)
            emitted += 1
            req.sink(ev)
            if req.matcher is not None and not self._advance_grammar(req, tok):
                continue
            if len(req.output_ids) >= req.max_new_tokens or len(req.prompt_ids) + len(req.output_ids) >= max_seq_len:
                self._finish(req, "length")
        self.tokens_generated += emitted
        self._recent.append((now, emitted))

    def _advance_grammar(self, req: EngineRequest, tok: int) -> bool:
        """Feed an emitted token to the request's grammar; False when that finished the request: "stop" once the
        grammar can take no more, "error" when it refused the token (min_new_tokens banned all it allowed)."""
        if not req.matcher.consume(tok):
            self._finish(req, "error", f"the grammar refused token {tok}: {req.matcher.error}")
            return False
        if req.matcher.is_stopped():
            self._finish(req, "stop")
            return False
        return True

    def _finish(self, req: EngineRequest, reason: str, error: str | None = None) -> None:
        if req.state == "done":
            return
        if req.slot is not None and self.slots[req.slot] is req:
            self.slots[req.slot] = None
            if self.blocks is not None:
                self.blocks.release(req)
            if self.spec is not None:
                self.spec.release(req)
        with self._cond:  # against cancel() (the server's thread), which may settle a held count
            if reason == "length" and req.cancelled and req.cancel_reason == "stop":
                # the caller found a stop string in the request's last token before this finish: in that token's
                # sink call (engine_generate), or in a cancel from its thread that came first
                reason = "stop"
            req.state, req.finish_reason = "done", reason
            self._finished_at.append(time.perf_counter())
            # a length finish whose caller may still find a stop string in its text waits for the caller's word
            # (``text_stops``); one it has cancelled already gets no other
            req.count_held = reason == "length" and req.text_stops and not req.cancelled
            if not req.count_held:
                self._count_finish(reason)
        req.sink(FinishEvent(reason, error))

    def _count_finish(self, reason: str) -> None:
        """Count a finished request under its final reason (under ``_cond``): once, since counters never go down."""
        self.requests_finished += 1
        self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1
