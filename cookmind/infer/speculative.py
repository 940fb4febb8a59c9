"""Speculative decoding for the engine: propose k tokens cheaply, verify them in one forward of the target.

For a greedy request whose newest token sits at position p, a proposer guesses the next k tokens d1..dk. The
target runs once over [newest, d1..dk] at positions p..p+k through the paged cache (as prefill does) and takes
the argmax g0..gk at each place. The request keeps the drafts up to the first one that differs from the target's
own choice (d_i == g_{i-1}), then the target's token after them (the bonus): 1 to k+1 tokens per forward, the
very tokens plain greedy decoding would have chosen one forward at a time. Keys and values of rejected drafts
stay in the cache past the request's length; the next forward writes over them before anything reads them (the
attention mask stops at each query's position), and they never enter the prefix cache (it only takes full prompt
blocks, and verification writes after the prompt).

Two proposers:
  - "ngram" (prompt lookup): the longest suffix of prompt+output (ngram_max down to ngram_min tokens) that occurred
    earlier; propose the tokens that followed its latest earlier occurrence (with k tokens after it). Free, and it
    pays when the output
    copies its input (summaries, edits, code, extraction);
  - "draft": a small model with the same tokenizer, with its own runner and paged cache over the same slots. Each
    step it first feeds what it has not seen (the prompt at first, then accepted tokens it did not propose and the
    bonus token) and then decodes k - 1 more tokens: k cheap forwards per engine step.

Greedy requests without logprobs, penalties, min_new_tokens or a grammar speculate (sampled ones too with
SpeculativeConfig.sampled: speculative sampling keeps a draft with the probability the request's own distribution
gives it, so the output is distributed as plain sampling's, though a seed draws other tokens); the rest decode as
before in
the same engine step (a second forward: the plain decode step keeps its CUDA graph and one-token kernel instead of
padding every row to k + 1 tokens), and so do speculating requests in a step where they got no drafts (no n-gram
match, or too close to their end). A proposer needs each request's newest token on the host, so the engine reads a
plain step in flight before proposing, unless no request in it can get a draft (``may_propose``: for the n-gram
proposer, the ngram_min - 1 known tokens before the one in flight occurred earlier) or every one that could is
backing off (its last proposal found no draft or kept none: it waits 1, 2, 4, ... up to backoff_max tokens); those
keep decoding with overlapped steps, which is why ngram_min defaults to 3 rather than 1 or 2 (almost every token
occurred before).

When the engine replays CUDA graphs for its plain steps, the verify forward and the draft model's k forwards
replay graphs too (``cuda_graphs.CudaGraphVerifier`` / ``CudaGraphDrafter``): eager they are host-bound, a
compiled call and several launches per layer each time. Their shapes are made static: slots 0..B-1 in batch
buckets, every row k + 1 tokens wide (drafts padded; padding writes the scratch column and is never accepted),
attention over a length bucket (none with the paged decode kernel). Without graphs (CPU) the eager forwards below
run over exactly the rows needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from cookmind.infer.cuda_graphs import CudaGraphDrafter, CudaGraphVerifier
from cookmind.infer.paged_cache import BlockAllocator

METHODS = ("ngram", "draft")


@dataclass
class SpeculativeConfig:
    """How to speculate: method "ngram" (prompt lookup) or "draft" (``draft_model``: a loaded CookMindLM with the
    target's tokenizer, see ``load_draft_model``); num_tokens: drafts per step (k); ngram_max / ngram_min: the
    longest and shortest suffix the n-gram proposer looks up. sampled: requests with temperature > 0 speculate too
    (speculative sampling: the same distribution, but a seed then draws other tokens than without speculation).
    backoff_max: after a proposal that finds no draft or has every draft rejected, a request decodes plainly (with
    overlapped steps) for its next 1, 2, 4, ... up to backoff_max tokens, until a draft is kept (0: never backs
    off)."""

    method: str = "ngram"
    num_tokens: int = 4
    ngram_max: int = 5
    ngram_min: int = 3
    draft_model: object = None
    sampled: bool = False
    backoff_max: int = 32

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or self.num_tokens < 1:
            raise ValueError(f"speculative num_tokens must be an int >= 1, got {self.num_tokens!r}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"speculative ngram sizes must satisfy 1 <= ngram_min <= ngram_max, got {self.ngram_min}, "
                f"{self.ngram_max}"
            )
        if isinstance(self.backoff_max, bool) or not isinstance(self.backoff_max, int) or self.backoff_max < 0:
            raise ValueError(f"speculative backoff_max must be an int >= 0, got {self.backoff_max!r}")
        if (self.method == "draft") != (self.draft_model is not None):
            raise ValueError(
                "speculative method 'draft' needs draft_model (a loaded model) and 'ngram' takes none; "
                f"got method={self.method!r} with draft_model={'set' if self.draft_model is not None else 'None'}"
            )


class NgramIndex:
    """One request's tokens and, for each n-gram size it is asked about, where every n-gram of that size ends.

    A lookup is a dict probe and a few comparisons per earlier occurrence, and a new token adds one entry per
    size, so the host's work per decode step does not grow with the sequence. (A vectorised numpy search over the
    whole sequence, the first version, cost about 38 µs per call on this project's CPU, twice a step, against a
    0.34 ms decode step on the H200: prompts with nothing to copy ran at 0.88x.)"""

    def __init__(self, sizes: tuple[int, ...]):
        self.seq: list[int] = []
        self.ends: dict[int, dict[tuple[int, ...], list[int]]] = {m: {} for m in sorted(set(sizes)) if m >= 1}

    def extend(self, tokens) -> None:
        seq = self.seq
        for tok in tokens:
            seq.append(int(tok))
            p = len(seq) - 1
            for m, table in self.ends.items():
                if p >= m - 1:
                    table.setdefault(tuple(seq[p - m + 1 : p + 1]), []).append(p)

    def earlier_ends(self, m: int) -> list[int]:
        """Where earlier occurrences of the last m tokens end, ascending (the suffix itself left out)."""
        n = len(self.seq)
        if n < m + 1:
            return []
        return self.ends[m].get(tuple(self.seq[n - m :]), [])[:-1]  # the last entry is the suffix itself

    def lookup(self, k: int, ngram_min: int, ngram_max: int) -> list[int]:
        """Up to k tokens that followed an earlier occurrence of the longest suffix of the sequence (ngram_max down to
        ngram_min tokens long, ngram_min one of the index's sizes): after the latest occurrence with k tokens after
        it, else after the earliest (in a loop the latest sits one period back and runs into the end); [] when no
        such suffix occurred before."""
        seq, n = self.seq, len(self.seq)
        if k < 1 or n < ngram_min + 1:
            return []
        cap = min(ngram_max, n - 1)
        best, matches = 0, []  # the longest match's ends, latest first
        for e in reversed(self.earlier_ends(ngram_min)):  # each matches at least ngram_min tokens back
            length = ngram_min
            while length < cap and e - length >= 0 and seq[e - length] == seq[n - 1 - length]:
                length += 1
            if length == cap and e + k <= n - 1:  # the longest possible, and the latest with k tokens after it
                return seq[e + 1 : e + 1 + k]
            if length > best:
                best, matches = length, [e]
            elif length == best:
                matches.append(e)
        if not matches:
            return []
        full = [e for e in matches if e + k <= n - 1]
        end = full[0] if full else matches[-1]
        return seq[end + 1 : end + 1 + k]


class NgramProposer:
    """Prompt-lookup drafts from each slot's ``NgramIndex``, extended by the request's new outputs each step."""

    def __init__(self, config: SpeculativeConfig, num_slots: int, max_seq_len: int):
        self.config = config
        self.indexes: list[NgramIndex | None] = [None] * num_slots
        self.owner: list[int | None] = [None] * num_slots

    def _index(self, req) -> NgramIndex:
        """The request's index, extended by the outputs it has not seen (a new request starts from its prompt)."""
        s = req.slot
        if self.owner[s] != req.id:
            self.owner[s] = req.id
            self.indexes[s] = NgramIndex((self.config.ngram_min, self.config.ngram_min - 1))
            self.indexes[s].extend(req.prompt_ids)
        index = self.indexes[s]
        known = len(index.seq) - len(req.prompt_ids)
        if known < len(req.output_ids):
            index.extend(req.output_ids[known:])
        return index

    def propose(self, reqs: list, ks: list[int]) -> list[list[int]]:
        cfg = self.config
        return [self._index(r).lookup(k, cfg.ngram_min, cfg.ngram_max) for r, k in zip(reqs, ks)]

    def may_propose(self, req) -> bool:
        """Whether a draft can exist once the token in flight lands: its suffix of ngram_min tokens can only have
        occurred before if the ngram_min - 1 known tokens before it did (with a token after them)."""
        m = self.config.ngram_min - 1
        return m == 0 or bool(self._index(req).earlier_ends(m))

    def verified(self, req, accepted: int) -> None:
        """Nothing to keep in step: the buffer follows the request's output."""

    def release(self, slot: int) -> None:
        self.owner[slot] = self.indexes[slot] = None


class DraftProposer:
    """Drafts from a small model with its own runner and paged cache over the engine's slots.

    Each slot remembers how many of its request's tokens the draft cache holds (``fed``); a step feeds the rest
    (the prompt the first time; later the accepted drafts it did not feed and the bonus token) in one forward,
    whose last logits give d1, then decodes d2..dk one forward each, all on the device. Its block pool has as many
    blocks as the target's; a row it cannot hold proposes nothing that step."""

    def __init__(self, config: SpeculativeConfig, engine):
        from cookmind.infer.runner import ModelRunner

        model = config.draft_model
        cfg = model.config
        if cfg.vocab_size > engine.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({cfg.vocab_size}) is larger than the target's ({engine.vocab_size}): "
                "a draft model must use the target's tokenizer"
            )
        if cfg.max_position_embeddings < engine.max_seq_len:
            raise ValueError(
                f"the draft model's context ({cfg.max_position_embeddings}) is shorter than the engine's "
                f"max_seq_len ({engine.max_seq_len}); lower --max-seq-len or pick a draft model with a longer context"
            )
        self.k = config.num_tokens
        self.block_size = engine.block_size
        self.max_seq_len = engine.max_seq_len
        num_slots = engine.num_slots
        if engine.paged:
            num_blocks = engine.runner.cache.num_blocks
        else:  # the target gives every slot a whole context: so does the draft
            num_blocks = num_slots * math.ceil(self.max_seq_len / self.block_size) + 1
        param = next(model.parameters())
        if param.device != engine.device:
            raise ValueError(f"the draft model is on {param.device} but the engine runs on {engine.device}")
        self.runner = ModelRunner(
            model,
            num_slots,
            self.max_seq_len,
            kv_cache="paged",
            num_blocks=num_blocks,
            block_size=self.block_size,
            fuse_projections=False,  # the draft may be the target itself, whose runner owns the fused weights
        )
        if engine.runner.compiled:  # its k forwards a step are launch-bound as well: fuse them like the target's
            self.runner.set_compiled(True)
        self.cache = self.runner.cache
        # the plain steps replay CUDA graphs (eagerly on CPU): so do the draft's k forwards a step
        eg = engine.graphs
        self.graphs = CudaGraphDrafter(self.runner, self.k, eg.buckets, eg.capture) if eg is not None else None
        self.allocator: BlockAllocator = self.cache.allocator
        self.device = engine.device
        self.owner: list[int | None] = [None] * num_slots
        self.blocks: list[list[int]] = [[] for _ in range(num_slots)]
        self.fed = [0] * num_slots  # positions of the slot's request whose keys the draft cache holds
        self.proposed: dict[int, tuple[int, int]] = {}  # slot -> (tokens the request had, drafts proposed)

    def release(self, slot: int) -> None:
        """Forget the slot's request; its blocks go back to the pool."""
        if self.blocks[slot]:
            self.allocator.free(self.blocks[slot])
        self.blocks[slot], self.owner[slot], self.fed[slot] = [], None, 0
        self.cache.set_row(slot, [])

    def _hold(self, slot: int, positions: int) -> bool:
        """Give the slot blocks for positions 0..positions-1; False (and nothing taken) if the pool is short."""
        need = -(-positions // self.block_size) - len(self.blocks[slot])
        if need <= 0:
            return True
        if need > self.allocator.num_free:
            return False
        self.blocks[slot] += [self.allocator.allocate() for _ in range(need)]
        self.cache.set_row(slot, self.blocks[slot])
        return True

    def propose(self, reqs: list, ks: list[int]) -> list[list[int]]:
        for req in reqs:  # a slot that changed hands (ending requests release theirs; one backing off keeps its)
            if self.owner[req.slot] not in (None, req.id):
                self.release(req.slot)
        self.proposed = {}
        rows = []  # (req, k, sequence, n)
        for req, k in zip(reqs, ks):
            s = req.slot
            self.owner[s] = req.id
            n = len(req.prompt_ids) + len(req.output_ids)
            if k > 0 and self._hold(s, n + k - 1):
                rows.append((req, k, req.prompt_ids + req.output_ids, n))
        drafts = {}
        if rows:
            drafts = self._decode(rows)
        return [drafts.get(r.slot, []) for r in reqs]

    @torch.inference_mode()
    def _decode(self, rows) -> dict[int, list[int]]:
        """Drafts for rows (req, k, sequence, n): the slot's unfed tokens in one forward, then k - 1 one-token steps."""
        self.cache.sync_tables()
        if self.graphs is not None:
            return self._decode_graphed(rows)
        lo = min(r.slot for r, *_ in rows)
        kmax = max(k for _, k, _, _ in rows)
        feeds = {r.slot: (self.fed[r.slot], seq[self.fed[r.slot] : n]) for r, _, seq, n in rows}
        dev = self.device
        b = max(r.slot for r, *_ in rows) - lo + 1
        scratch = self.runner.scratch_col
        # the k - 1 one-token steps after the feed: positions n .. n+k-2 (scratch where a row has fewer drafts)
        later_pos = torch.zeros((max(kmax - 1, 0), b), dtype=torch.long)
        later_cols = torch.full((max(kmax - 1, 0), b), scratch, dtype=torch.long)
        for req, k, _, n in rows:
            for j in range(k - 1):
                later_pos[j, req.slot - lo] = later_cols[j, req.slot - lo] = n + j
            self.proposed[req.slot] = (n, k)
        out = [self._feed(feeds).argmax(-1)]
        later_pos, later_cols = later_pos.to(dev), later_cols.to(dev)
        for j in range(kmax - 1):  # stays on the device: each step's argmax is the next step's input
            length = int(max(n + j for _, k, _, n in rows if k > j + 1) + 1) if kmax > j + 1 else 1
            logits = self.runner.forward(
                out[-1][:, None], later_pos[j, :, None], lo, length, write_cols=later_cols[j, :, None]
            )
            out.append(logits.argmax(-1))
        drafts = torch.stack(out, dim=1).tolist()  # (B, kmax): the one copy to the host
        for req, k, _, n in rows:
            self.fed[req.slot] = n - 1 + k  # positions 0..n+k-2 written (valid as far as the drafts are accepted)
        return {req.slot: drafts[req.slot - lo][:k] for req, k, _, _ in rows}

    def _feed(self, feeds: dict[int, tuple[int, list[int]]]) -> torch.Tensor:
        """One forward over each slot's tokens (slot -> (position of the first, tokens)); the logits (B, V) of each
        row's last token, for the run of slots from the lowest given."""
        lo, hi = min(feeds), max(feeds)
        b, t, scratch = hi - lo + 1, max(len(f) for _, f in feeds.values()), self.runner.scratch_col
        tokens = torch.zeros((b, t), dtype=torch.long)
        positions = torch.arange(t).repeat(b, 1)
        write_cols = torch.full((b, t), scratch, dtype=torch.long)
        last = torch.zeros(b, dtype=torch.long)
        for slot, (start, f) in feeds.items():
            i = slot - lo
            tokens[i, : len(f)] = torch.tensor(f)
            positions[i] = torch.arange(start, start + t).clamp(max=self.max_seq_len - 1)
            write_cols[i, : len(f)] = positions[i, : len(f)]
            last[i] = len(f) - 1
        dev = self.device
        return self.runner.forward(
            tokens.to(dev),
            positions.to(dev),
            lo,
            int(positions.max()) + 1,
            write_cols=write_cols.to(dev),
            last_index=last.to(dev),
        )

    def _decode_graphed(self, rows) -> dict[int, list[int]]:
        """As ``_decode``, in one replay of the drafter's graph for slots 0..B-1 (a feed longer than the graph's, the
        prompt at first, goes in one eager forward before it, all but its last token)."""
        g = self.graphs
        f, m = g.FEED, g.k - 1
        catch_up = {r.slot: (self.fed[r.slot], seq[self.fed[r.slot] : n - 1]) for r, _, seq, n in rows}
        catch_up = {s: x for s, x in catch_up.items() if len(x[1]) >= f}
        if catch_up:
            self._feed(catch_up)
            for s, (start, tokens) in catch_up.items():
                self.fed[s] = start + len(tokens)
        b = max(r.slot for r, *_ in rows) + 1
        layout = g.stage_rows(b)  # idle rows, in the pinned stage: filled in place
        length = 1
        for req, k, seq, n in rows:
            s = req.slot
            start, row = self.fed[s], layout[s]
            feed = seq[start:n]  # 1 token (the bonus), or 2 (the last draft too, when all were accepted)
            row[: len(feed)] = feed
            row[f : 2 * f] = np.minimum(np.arange(start, start + f), self.max_seq_len - 1)
            row[2 * f : 2 * f + len(feed)] = row[f : f + len(feed)]
            row[3 * f] = len(feed) - 1
            row[3 * f + 1 : 3 * f + k] = row[3 * f + 1 + m : 3 * f + k + m] = np.arange(n, n + k - 1)
            length = max(length, n + k - 1)
            self.proposed[s] = (n, k)
        drafts = g.propose(b, length).tolist()  # the one copy to the host
        for req, k, _, n in rows:
            self.fed[req.slot] = n - 1 + k
        return {req.slot: drafts[req.slot][:k] for req, k, _, _ in rows}

    def may_propose(self, req) -> bool:
        """A draft model always proposes."""
        return True

    def verified(self, req, accepted: int) -> None:
        """The target kept ``accepted`` drafts: the draft cache is valid through the last accepted one it fed."""
        if req.slot not in self.proposed:
            return
        n, k = self.proposed[req.slot]
        self.fed[req.slot] = n + min(accepted, k - 1)


class Speculator:
    """The engine's speculative step: picks the requests that speculate, asks the proposer for drafts, verifies them
    in one target forward and emits the accepted tokens through the engine (``Engine.step`` calls ``step``)."""

    def __init__(self, config: SpeculativeConfig, engine):
        self.config = config
        self.engine = engine
        if config.method == "ngram":
            self.proposer = NgramProposer(config, engine.num_slots, engine.max_seq_len)
        else:
            self.proposer = DraftProposer(config, engine)
        # the plain steps replay CUDA graphs (eagerly on CPU): so do the verify forwards, padded to k + 1 tokens
        eg = engine.graphs
        width = config.num_tokens + 1
        self.verifier = None
        if eg is not None:  # greedy rows: accepted on the device, their newest token and place set there for _decode
            self.verifier = CudaGraphVerifier(
                engine.runner,
                width,
                eg.buckets,
                eg.capture,
                last_tok=engine._last_tok,
                keep_logits=config.sampled,
                decode_state=eg.state,
            )
        self.steps = 0  # request-steps verified with at least one draft
        self.drafted = 0
        self.accepted = 0
        self.emitted = 0  # tokens those request-steps produced (accepted + bonus)
        self.forced_reads = 0  # plain steps read before the next was launched, for a proposal (overlap given up)
        # per slot: (request id, the request decodes plainly while n_sampled <= this, the back-off it waits)
        self.resting: list[tuple[int, int, int] | None] = [None] * engine.num_slots
        self.claimed: set[int] = set()  # ids of the requests this step advanced (the plain decode skips them)

    def takes(self, req) -> bool:
        """Whether this request speculates: greedy (or sampled, with ``sampled``), and nothing that needs each
        step's logits or changes them with the tokens before."""
        p = req.params
        return (
            (p.temperature == 0 or self.config.sampled)
            and not p.logprobs
            and p.min_new_tokens == 0
            and p.repetition_penalty == 1
            and p.presence_penalty == 0
            and p.frequency_penalty == 0
            and getattr(p, "grammar", None) is None
        )

    def needs_tokens(self, reqs: list) -> bool:
        """Whether the engine must read a plain step in flight before proposing: some of its requests speculate, are
        not backing off and may get drafts. Otherwise they decode plainly again and the engine keeps overlapping
        steps."""
        needed = any(
            r.state == "decode" and self.takes(r) and not self._rests(r) and self.proposer.may_propose(r) for r in reqs
        )
        self.forced_reads += needed
        return needed

    def _rests(self, req) -> bool:
        """Whether the request is backing off (a recent proposal found no draft or had every draft rejected)."""
        rest = self.resting[req.slot]
        return rest is not None and rest[0] == req.id and req.n_sampled <= rest[1]

    def _judge(self, req, kept: bool) -> None:
        """After a proposal: a kept draft ends the request's back-off; none (no draft, or all rejected) starts or
        doubles it, up to backoff_max tokens. Without it a request whose text has nothing to copy (though its last
        tokens occurred before) would give up the overlap of every step for proposals that find nothing."""
        cap, rest = self.config.backoff_max, self.resting[req.slot]
        if kept or cap == 0:
            self.resting[req.slot] = None
            return
        wait = min(2 * rest[2], cap) if rest is not None and rest[0] == req.id else 1
        self.resting[req.slot] = (req.id, req.n_sampled + wait, wait)

    def release(self, req) -> None:
        """The request ended: the proposer forgets its slot (a draft model's blocks go back)."""
        self.proposer.release(req.slot)
        self.resting[req.slot] = None

    def metrics(self) -> dict:
        """Totals since start, the acceptance rate and tokens per speculative step (accepted drafts + the bonus)."""
        return {
            "spec_num_tokens": self.config.num_tokens,
            "spec_draft_tokens_total": self.drafted,
            "spec_accepted_tokens_total": self.accepted,
            "spec_acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "spec_mean_accepted_per_step": self.accepted / self.steps if self.steps else 0.0,
            "spec_tokens_per_step": self.emitted / self.steps if self.steps else 0.0,
            "spec_forced_reads_total": self.forced_reads,
        }

    def step(self) -> None:
        """Propose for every generating request that ``takes``; verify those with drafts in one forward and emit
        their 1..k+1 tokens (``claimed``); the rest decode one token in the engine's plain step."""
        eng = self.engine
        self.claimed = set()
        # a request whose newest token is still on its way (a plain step in flight) decodes plainly again
        reqs = [
            r
            for r in eng.slots
            if r is not None
            and r.state == "decode"
            and r.n_sampled == len(r.output_ids)
            and self.takes(r)
            and not self._rests(r)
        ]
        if not reqs:
            return
        ks = []
        for r in reqs:  # never past max_new_tokens or the context: the step emits up to k + 1 tokens
            room = min(r.max_new_tokens - len(r.output_ids), eng.max_seq_len - len(r.prompt_ids) - len(r.output_ids))
            ks.append(max(0, min(self.config.num_tokens, room - 1)))
        proposals = self.proposer.propose(reqs, ks)
        for r, k, d in zip(reqs, ks, proposals):
            if k > 0 and not d:
                self._judge(r, False)
        chosen = [(r, d) for r, d in zip(reqs, proposals) if d]
        if not chosen:
            return
        reqs, drafts = [r for r, _ in chosen], [d for _, d in chosen]
        logits, rows, best, accepted = (self._verify_graphed if self.verifier is not None else self._verify)(
            reqs, drafts
        )
        emitted = [best[i][: a + 1] for i, a in enumerate(accepted)]  # a greedy row's drafts equal its argmax
        sampled = [i for i, r in enumerate(reqs) if r.params.temperature != 0]
        if sampled:
            picked = logits[torch.tensor([rows[i] for i in sampled], device=logits.device)]
            chosen_drafts = [drafts[i] for i in sampled]
            for i, tokens in zip(sampled, self._accept_sampled([reqs[i] for i in sampled], picked, chosen_drafts)):
                emitted[i] = tokens
        for r, d, e in zip(reqs, drafts, emitted):
            a = len(e) - 1
            self.proposer.verified(r, a)
            r.n_sampled += a + 1
            self._judge(r, a > 0)
            self.steps += 1
            self.drafted += len(d)
            self.accepted += a
            self.emitted += a + 1
        self.claimed = {r.id for r in reqs}
        # the plain step reads each row's newest token from _last_tok, and its CUDA graph their positions from its
        # state: the verify graph set both for greedy rows; the others are set here (the graph state by a reload)
        written = sampled if self.verifier is not None else range(len(reqs))
        if written:
            slots = torch.tensor([reqs[i].slot for i in written], device=eng.device)
            eng._last_tok[slots] = torch.tensor([emitted[i][-1] for i in written], device=eng.device)
            eng._graph_key = None
        eng._emit_tokens(reqs, emitted)

    def _verify(self, reqs: list, drafts: list[list[int]]) -> tuple:
        """One target forward over [newest token, drafts] per request (at least 2 tokens: through the paged decode
        kernel one query per token, or the gather path as prefill), for the run of slots from the first request's;
        returns the logits (rows, 1 + most drafts, V), each request's row in them, its argmax at each place (on the
        host) and how many of its drafts a greedy request keeps."""
        eng = self.engine
        runner = eng.runner
        lo, hi = reqs[0].slot, reqs[-1].slot
        b, t = hi - lo + 1, 1 + max(len(d) for d in drafts)
        tokens = torch.zeros((b, t), dtype=torch.long)
        positions = torch.arange(t).repeat(b, 1)
        write_cols = torch.full((b, t), runner.scratch_col, dtype=torch.long)
        for r, d in zip(reqs, drafts):
            i, p = r.slot - lo, len(r.prompt_ids) + len(r.output_ids) - 1  # the newest token's place
            tokens[i, 0] = r.output_ids[-1]
            tokens[i, 1 : 1 + len(d)] = torch.tensor(d, dtype=torch.long)
            positions[i] = torch.arange(p, p + t).clamp(max=eng.max_seq_len - 1)
            write_cols[i, : 1 + len(d)] = positions[i, : 1 + len(d)]
            if eng.blocks is not None:
                eng.blocks.grow(r, p + len(d))  # within the reservation: k was clamped to what the request may emit
        if eng.blocks is not None:
            runner.cache.sync_tables()
        dev = eng.device
        logits = runner.forward(
            tokens.to(dev),
            positions.to(dev),
            lo,
            int(positions.max()) + 1,
            write_cols=write_cols.to(dev),
            last_only=False,
        )
        rows = [r.slot - lo for r in reqs]
        argmax = logits.argmax(-1).tolist()
        best = [argmax[i] for i in rows]
        accepted = []
        for d, g in zip(drafts, best):
            a = 0
            while a < len(d) and d[a] == g[a]:  # drafts equal to the target's own choice
                a += 1
            accepted.append(a)
        return logits, rows, best, accepted

    def _verify_graphed(self, reqs: list, drafts: list[list[int]]) -> tuple:
        """As ``_verify``, replayed from the verifier's graph for slots 0..B-1, every row k + 1 tokens wide (padding
        writes the scratch column), laid out in place in its pinned stage; greedy rows are accepted on the device
        and everything comes back in one copy. The rows are the slots; logits are None unless sampled."""
        eng, v = self.engine, self.verifier
        w, cap = v.width, eng.max_seq_len - 1
        b = max(r.slot for r in reqs) + 1
        layout = v.stage_rows(b)
        length = 1
        for r, d in zip(reqs, drafts):
            p, row, n = len(r.prompt_ids) + len(r.output_ids) - 1, layout[r.slot], 1 + len(d)  # the newest's place
            row[0] = r.output_ids[-1]
            row[1:n] = d
            row[w : 2 * w] = range(p, p + w) if p + w <= cap else [min(q, cap) for q in range(p, p + w)]
            row[2 * w : 2 * w + n] = row[w : w + n]
            row[3 * w] = len(d) if r.params.temperature == 0 else 0  # sampled rows are judged on the host
            length = max(length, p + n)
            if eng.blocks is not None:
                eng.blocks.grow(r, p + len(d))  # within the reservation: k was clamped to what the request may emit
        if eng.blocks is not None:
            eng.runner.cache.sync_tables()
        logits, result = v.verify(b, length)
        out = result.tolist()  # the one copy to the host
        best = [out[r.slot][:w] for r in reqs]
        return logits, [r.slot for r in reqs], best, [out[r.slot][w] for r in reqs]

    def _accept_sampled(self, reqs: list, logits: torch.Tensor, drafts: list[list[int]]) -> list[list[int]]:
        """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for drafts proposed deterministically
        (q puts all its mass on the draft): keep draft d_i with probability p_i(d_i) under the request's own
        sampling distribution p_i (temperature, top-k/p, min-p); at the first rejection draw from p_i without
        d_i, renormalised (max(p - q, 0)); when all are kept, draw the bonus from p after the last. Each emitted
        token is then distributed exactly as plain sampling would draw it. Two host syncs for all the rows."""
        from cookmind.infer.sampling import SamplingBatch, process_logits

        dev = logits.device
        sizes = [len(d) + 1 for d in drafts]
        flat = torch.cat([logits[i, :n] for i, n in enumerate(sizes)])  # (sum of sizes, V)
        params = [r.params for r, n in zip(reqs, sizes) for _ in range(n)]
        probs = process_logits(flat, SamplingBatch.from_params(params, dev)).softmax(-1)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        uniforms = torch.cat([torch.rand(n - 1, generator=r.generator, device=dev) for r, n in zip(reqs, sizes)])
        places = torch.tensor([s + j for s, n in zip(starts, sizes) for j in range(n - 1)], dtype=torch.long)
        draft_ids = torch.tensor([t for d in drafts for t in d], dtype=torch.long)
        kept = (uniforms < probs[places.to(dev), draft_ids.to(dev)]).tolist() if len(places) else []
        accepted, at = [], 0
        for d in drafts:
            row = kept[at : at + len(d)]
            accepted.append(row.index(False) if False in row else len(d))
            at += len(d)
        last = probs[torch.tensor([s + a for s, a in zip(starts, accepted)], device=dev)].clone()
        for i, (d, a) in enumerate(zip(drafts, accepted)):
            if a < len(d):  # the rejected draft is taken out of the distribution
                last[i, d[a]] = 0
        last = last / last.sum(-1, keepdim=True)
        noise = torch.empty_like(last)
        for i, r in enumerate(reqs):  # the exponential race, each row from its own generator (as sampling.py)
            noise[i].exponential_(generator=r.generator)
        bonus = (last / noise).argmax(-1).tolist()
        return [d[:a] + [b] for d, a, b in zip(drafts, accepted, bonus)]


def load_draft_model(path, tokenizer, device="cpu", dtype=None, progress=False):
    """A draft model from a checkpoint directory (or a run: its newest checkpoint), refused when it carries another
    tokenizer than ``tokenizer`` (the served model's): its token ids would mean other text. ``progress``: bars of
    the checks of its weights' SHA-256s."""
    from cookmind.infer.loading import load_model_dir
    from cookmind.model import resolve_model_dir
    from cookmind.tokenizer.tokenizer import check_carried_tokenizer

    found = resolve_model_dir(path, progress=progress)  # once: finding a run's newest checkpoint hashes its weights
    check_carried_tokenizer(
        found,
        tokenizer,
        model=f"the draft model {path}",
        given="the served model's tokenizer",
        hint="give a --draft-model trained with the same tokenizer as the model",
    )
    draft = load_model_dir(found, device, dtype, progress).eval()
    # a draft that carries no tokenizer was compared with nothing: one that cannot read every id of the model's
    # tokenizer would fail each greedy request mid-way (an index out of its embedding)
    words = getattr(tokenizer, "vocab_size", None)
    if words is not None and draft.config.vocab_size < words:
        raise ValueError(
            f"the draft model {path} has a vocabulary of {draft.config.vocab_size} tokens, fewer than the {words} of "
            "the model's tokenizer: it was trained with another tokenizer; give a --draft-model trained with the same "
            "tokenizer as the model"
        )
    return draft
