"""GRPO as an objective of the one training loop (``cookmind train`` with ``train.objective: grpo``).

    for each optimizer step (the Trainer's loop):
        prompts  <- the next micro-batch: from a grpo token store, or the next fresh problems of a stream
        rollouts <- group_size samples per prompt from the current policy (prepare, no grad)
        A        <- (r - mean_group r) / (std_group r + eps)
        loss     <- PG loss (no_baseline | reinforce_with_baseline | grpo_clip) [+ kl_coef * k3 KL to the reference],
                    reduced per ``length_normalization`` (constant = Dr. GRPO)

The Trainer does backward, accumulation, clipping, DDP sync, the optimizer step, checkpoints and exact resume as
for every objective. Each rollout batch gets one optimizer step (on-policy: the ratio is 1 and grpo_clip equals
REINFORCE with a baseline). Sampling seeds come from ``train.seed`` and a rollout counter kept in ``state_dict``;
the stream position is kept there too, so a resumed run replays the same prompts and rollouts. With held-out
problems (``eval_problems``) every Trainer evaluation (``eval.every`` and the end) adds greedy exact accuracy,
format rate and answer length as ``val_accuracy``, ``val_format_rate``, ``val_response_length``, over
``val_problems`` problems (the first ``eval_size``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import shlex
import typing
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cookmind import json_input
from cookmind.align.losses import (
    LENGTH_NORMALIZATIONS,
    aggregate_token_loss,
    compute_policy_gradient_loss,
    get_response_log_probs,
    masked_mean,
    pack_prompt_and_output,
)
from cookmind.align.prompts import (
    PROMPTS,
    R1_ZERO_STOP,
    decode_response,
    encode_prompt,
    next_question_stops,
    pad_id_of,
    stop_ids_of,
    uses_think_tags,
)
from cookmind.align.reference import Reference
from cookmind.align.rewards import reference_text, reward_fn_for_template
from cookmind.align.rollout import SamplingParams, collect_rollouts, cut_short, generate_ids
from cookmind.parallel.fsdp import gathered_weights, is_sharded
from cookmind.parallel.parallelize import shard_frozen
from cookmind.store.records import check_gradable
from cookmind.train.config import coerce_value
from cookmind.train.objectives.base import Objective, unwrap

LOSS_TYPES = ("no_baseline", "reinforce_with_baseline", "grpo_clip")
# settings that shape how online rollouts are sampled, grouped and scored: a store of scored responses reads none
ONLINE_ONLY = (
    "group_size",
    "temperature",
    "top_p",
    "min_new_tokens",
    "normalize_by_std",
    "advantage_eps",
    "format_weight",
)


@dataclass
class GRPOConfig:
    """The objective's knobs; the loop's (lr, steps, batch, clipping, seed, cadence) are ``TrainConfig``'s."""

    group_size: int = 8  # samples per prompt; a micro-batch of P prompts rolls out P * group_size responses
    loss_type: str = "grpo_clip"
    cliprange: float = 0.2
    advantage_eps: float = 1e-6
    normalize_by_std: bool = True
    length_normalization: str = "sequence"  # sequence | token | constant (Dr. GRPO: divide by max_new_tokens)
    kl_coef: float = 0.0
    reference: str = "none"  # none | copy | base (LoRA base with adapters off)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    min_new_tokens: int = 0
    # None: "</answer>" for <think> templates; for plain and one's own, the next question a model makes up
    # ("\nQuestion:", as `eval gsm8k` stops); none for chat (its turn ends with a stop token)
    stop_strings: tuple[str, ...] | None = None
    template: str = "r1_zero"  # r1_zero | compact | chat | plain | a string with {question}
    format_weight: float = 0.0
    engine: str = "auto"
    rollout_chunk: int = 64  # generation batch size
    # A JSONL of {"question", "answer"} taken in order, each once (e.g. fresh problems from a seeded generator),
    # instead of data.train_path: step k trains on problems [k * P * world, (k + 1) * P * world).
    problems: str | None = None
    eval_problems: str | None = None  # a held-out JSONL graded greedily at every evaluation
    eval_size: int = 0  # 0: all of eval_problems
    eval_max_new_tokens: int | None = None  # None: max_new_tokens

    @classmethod
    def from_dict(cls, d: dict) -> GRPOConfig:
        """Build from a dict, refusing unknown keys (typos must not pass silently)."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"grpo: unknown keys {unknown}; known: {sorted(cls.__dataclass_fields__)}. Loop settings "
                "(lr, steps, batch size, warmup, clipping, seed, eval/save cadence) belong to "
                "optim.* / train.* / eval.* / checkpoint.*"
            )
        values = dict(d)
        if isinstance(values.get("stop_strings"), list):
            values["stop_strings"] = tuple(values["stop_strings"])
        hints = typing.get_type_hints(cls)
        for key, value in values.items():  # the types the run's other sections are held to, named as grpo.KEY
            try:
                values[key] = coerce_value(value, hints[key], f"grpo.{key}")
            except ValueError as exc:
                if key == "template" and isinstance(value, dict):  # `grpo.template=Q: {question}` is a YAML mapping
                    raise ValueError(f"{exc}; quote it, e.g. grpo.template='\"Q: {{question}}\\nA:\"'") from None
                raise
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Settings that cannot work are refused with the fix in the message."""
        if self.group_size < 1:
            raise ValueError(f"grpo.group_size={self.group_size}: need at least 1 sample per prompt")
        if self.group_size == 1 and self.loss_type != "no_baseline":
            raise ValueError(
                f"grpo.group_size=1: the group baseline of grpo.loss_type={self.loss_type} is the one rollout's own "
                "reward, so every advantage is 0 and nothing trains; use at least 2 samples per prompt (or "
                "grpo.loss_type=no_baseline, which trains on the raw rewards)"
            )
        if self.temperature == 0 and self.group_size > 1 and self.loss_type != "no_baseline":
            raise ValueError(
                f"grpo.temperature={self.temperature}: a problem's {self.group_size} rollouts are all the same greedy "
                "answer, so every advantage is 0 and nothing trains; sample them (grpo.temperature above 0)"
            )
        for key, low, note in (
            ("max_new_tokens", 1, ""),
            ("min_new_tokens", 0, ""),
            ("eval_size", 0, " (0: all of grpo.eval_problems)"),
            ("eval_max_new_tokens", 1, ""),
            ("rollout_chunk", 1, ""),
            ("temperature", 0, ""),
            ("advantage_eps", 0, " (added to each group's reward std before dividing by it)"),
            ("format_weight", 0, " (the reward a well-formatted answer earns beside a right one)"),
            ("kl_coef", 0, " (0: no KL term)"),
        ):
            value = getattr(self, key)
            if value is not None and value < low:
                raise ValueError(f"grpo.{key}={value}: must be at least {low}{note}")
        if not self.cliprange > 0:  # the ratio is clipped to [1 - cliprange, 1 + cliprange]
            raise ValueError(f"grpo.cliprange={self.cliprange}: must be above 0 (the ratio is clipped to 1 +- it)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"grpo.top_p={self.top_p}: must be in (0, 1]")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"grpo.loss_type={self.loss_type!r}; choose one of {', '.join(LOSS_TYPES)}")
        if self.length_normalization not in LENGTH_NORMALIZATIONS:
            raise ValueError(
                f"grpo.length_normalization={self.length_normalization!r}; "
                f"choose one of {', '.join(LENGTH_NORMALIZATIONS)}"
            )
        if self.reference not in ("none", "copy", "base"):
            raise ValueError(f"grpo.reference={self.reference!r}; choose none, copy or base")
        if self.kl_coef and self.reference == "none":
            raise ValueError("grpo.kl_coef > 0 needs a reference: set grpo.reference=copy (or base under LoRA)")
        if not self.kl_coef and self.reference != "none":  # it would be neither built nor read
            raise ValueError(
                f"grpo.reference={self.reference} is the reference of the KL penalty, and grpo.kl_coef=0 turns that "
                "off: set grpo.kl_coef above 0 (e.g. 0.04) to use it, or leave grpo.reference out"
            )


def sampling_params(cfg: GRPOConfig, tokenizer, seed: int | None, greedy: bool = False) -> SamplingParams:
    """How rollouts (or, with ``greedy``, held-out answers) are decoded: the one place these are built."""
    stops = cfg.stop_strings
    if stops is None:  # where `eval gsm8k` stops: an answer graded past them graded a question the model made up
        stops = R1_ZERO_STOP if uses_think_tags(cfg.template) else next_question_stops(cfg.template)
    return SamplingParams(
        max_new_tokens=(cfg.eval_max_new_tokens or cfg.max_new_tokens) if greedy else cfg.max_new_tokens,
        min_new_tokens=0 if greedy else cfg.min_new_tokens,
        temperature=0.0 if greedy else cfg.temperature,
        top_p=cfg.top_p,
        stop_token_ids=stop_ids_of(tokenizer),
        stop_strings=tuple(stops),
        seed=seed,
    )


def rollout_options(cfg: GRPOConfig, model: torch.nn.Module | None = None) -> dict:
    """generate_ids / collect_rollouts keyword arguments: rows per forward and the generation back end.

    A model sharded by FSDP decodes in the plain loop ("auto" picks "builtin"): its gathered weights are
    allocated afresh at each gather, and the serving engine keeps itself (and its CUDA graphs) across calls.
    """
    engine = "builtin" if cfg.engine == "auto" and model is not None and is_sharded(model) else cfg.engine
    return {"batch_size": cfg.rollout_chunk, "engine": engine}


def as_problem(p) -> dict[str, str]:
    """A ``{"question", "answer"}`` dict from a dict or an object with those attributes."""
    if isinstance(p, dict):
        return {"question": p["question"], "answer": p["answer"]}
    return {"question": p.question, "answer": p.answer}


# the field names `cookmind pack --train-type grpo` reads, so one problem file serves both ways of feeding GRPO
QUESTION_FIELDS, ANSWER_FIELDS = ("question", "prompt"), ("answer", "reference_answer", "ground_truth")


def problem_of(obj) -> dict[str, str]:
    """``{"question", "answer"}`` of one JSON record (pack's field names; a number answer as its text); a record
    that is none is a ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    problem = {}
    for name, fields in (("question", QUESTION_FIELDS), ("answer", ANSWER_FIELDS)):
        field = next((f for f in fields if f in obj), None)
        if field is None:
            raise ValueError(f"missing field: expected one of {list(fields)}, found {sorted(obj)}")
        value = obj[field]
        if name == "question" and not isinstance(value, str):
            raise ValueError(f"{field!r} must be text, got {type(value).__name__}")
        problem[name] = reference_text(value, field)
        if not problem[name].strip():  # as pack reads a GRPO record: an empty required field makes a bad record
            raise ValueError(f"empty text in {field!r}: a problem needs a question and an answer; fix or drop it")
        if name == "answer":
            check_gradable(problem[name], field)
    return problem


def load_problems(path: str | Path, key: str = "grpo.problems") -> list[dict[str, str]]:
    """``{"question", "answer"}`` rows of a JSONL file (``problem_of``); every error names the config ``key`` that
    gave the file, and a bad line its file:line."""
    rows = []
    try:
        for n, obj in json_input.jsonl_lines(path):
            try:
                rows.append(problem_of(obj))
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
    except OSError as exc:  # missing, a directory, unreadable: say which setting named it
        why = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc)).lower()
        raise ValueError(
            f'{key}={path}: {why}; give a JSONL file with one {{"question": ..., "answer": ...}} object a line'
        ) from None
    except ValueError as exc:  # bad UTF-8 or JSON, named by file:line
        raise ValueError(f"{key}={exc}") from None
    if not rows:
        raise ValueError(f"{key}={path}: no problems in the file")
    return rows


EVAL_CHUNKS_A_CALL = 8  # grpo.rollout_chunk's a generation call of the held-out evaluation (its bar moves per call)


def evaluate_accuracy(
    model, tokenizer, problems, cfg: GRPOConfig, reward_fn=None, progress: bool = False
) -> dict[str, Any]:
    """Greedy exact accuracy, format rate and mean response length (tokens) on ``problems``, with the responses.
    ``progress``: a bar of the problems answered (``cookmind.progress``; a held-out set of thousands takes minutes)."""
    from cookmind.progress import progress_bar

    reward_fn = reward_fn or reward_fn_for_template(cfg.template, cfg.format_weight)
    problems = [as_problem(p) for p in problems]
    ids = [encode_prompt(tokenizer, p["question"], cfg.template) for p in problems]
    was_training = model.training
    model.eval()
    params = sampling_params(cfg, tokenizer, seed=0, greedy=True)
    options = rollout_options(cfg, model)
    outs: list[list[int]] = []
    # EVAL_CHUNKS_A_CALL chunks of rows a call, for the bar: the engine refills the slots short answers free with the
    # next chunk's problems (a chunk a call left them idle until its longest answer ended); row i keeps seed i (0 + i,
    # as in one call)
    rows = options["batch_size"] * EVAL_CHUNKS_A_CALL
    with progress_bar(total=len(ids), desc="held-out accuracy", unit="problem", leave=False, enabled=progress) as bar:
        for start in range(0, len(ids), rows):
            chunk = ids[start : start + rows]
            outs += generate_ids(model, chunk, params.replace(seed=start), tokenizer, **options)
            bar.update(len(chunk))
    model.train(was_training)
    texts = [decode_response(tokenizer, o) for o in outs]
    scores = [reward_fn(t, p["answer"]) for t, p in zip(texts, problems)]
    n = max(1, len(scores))
    return {
        "accuracy": sum(s["answer_reward"] for s in scores) / n,
        "format_rate": sum(s["format_reward"] for s in scores) / n,
        "response_length": sum(len(o) for o in outs) / n,
        "cut_short": sum(cut_short(model, ids, outs, params)) / n,  # graded unfinished: raise the token budget
        "responses": texts,
    }


# After this many rollout batches in a row where every group's rollouts all scored the same (every advantage 0),
# the run says so once: a reward the responses can never earn (or always earn) trains nothing, silently.
NO_SIGNAL_BATCHES = 10


def no_signal_message(cfg: GRPOConfig, meta: dict[str, float], batches: int, custom_reward: bool) -> str:
    """What to tell the user when ``batches`` rollout batches in a row carried no reward signal, and what to check."""
    low, high = meta.get("reward_min", 0.0), meta.get("reward_max", 0.0)
    head = (
        f"grpo: no learning signal in the last {batches} rollout batches: within every group the "
        f"{cfg.group_size} rollouts of a problem scored the same (rewards {low:g} to {high:g}), so every advantage "
        "is 0 and the policy-gradient loss trains nothing"
    )
    if high > 0:  # something is earned, but never by some of a problem's rollouts and not others
        return head + (
            "; each problem's rollouts all earn the same: the problems may be too easy or too hard for the model, "
            f"or grpo.temperature={cfg.temperature:g} and grpo.group_size={cfg.group_size} too low to vary them"
        )
    if custom_reward:
        graded = "the reward function's format"
    elif uses_think_tags(cfg.template):
        graded = "<answer>...</answer> after </think>"
    elif cfg.template == "chat":
        graded = "'#### N' at the end"
    else:
        graded = "a final number"
    cut = meta.get("cut_short", 0.0)
    cut_note = f" ({cut:.0%} of the last batch's rollouts ran into it unfinished)" if cut > 0 else ""
    return (
        head + f"; no rollout earned any reward: check that the answers can take the format the reward grades "
        f"({graded}; grpo.template={cfg.template!r}), that grpo.max_new_tokens={cfg.max_new_tokens} leaves room "
        f"for one{cut_note}, and that the model answers in that format at all (fine-tune it on worked answers first)"
    )


def offline_no_signal_message(meta: dict[str, float], batches: int) -> str:
    """What to tell the user when ``batches`` micro-batches of stored rollouts in a row each held one reward."""
    return (
        f"grpo: no learning signal in the last {batches} micro-batches of offline rollouts: within each, every "
        f"stored reward was the same (rewards {meta.get('reward_min', 0.0):g} to {meta.get('reward_max', 0.0):g}), "
        "so every advantage (a reward minus its micro-batch's mean) is 0 and nothing trains; raise "
        "train.micro_batch_size, keep data.shuffle=true so rollouts of different rewards meet, or set "
        "grpo.loss_type=no_baseline to train on the raw rewards"
    )


# the most prompts of a grpo store the held-out check reads: it read every one, a full pass at start-up
HELD_OUT_CHECK_ROWS = 100_000


def _prompts_in_store(store: Any, wanted: dict[bytes, int], source: str) -> set[bytes]:
    """The ``wanted`` prompts (int64 token bytes -> their length) that are prompts of the grpo ``store``. Only a prompt
    of a wanted one's length can be one (the store's offsets say each length, no row read), at most
    ``HELD_OUT_CHECK_ROWS`` of those are read, in the store's order, and the reading stops once all are found; a
    bound that leaves some unread is said."""
    lengths = store.lengths("prompts")
    could = np.flatnonzero(np.isin(lengths, list(set(wanted.values()))))
    found: set[bytes] = set()
    for i in could[:HELD_OUT_CHECK_ROWS]:
        row = store.record("prompts", int(i)).astype("int64").tobytes()
        if row in wanted:
            found.add(row)
            if len(found) == len(wanted):
                return found
    if len(could) > HELD_OUT_CHECK_ROWS:
        warnings.warn(
            f"grpo: the check that held-out problems (grpo.eval_problems) are not training prompts read the first "
            f"{HELD_OUT_CHECK_ROWS} of the {len(could)} training prompts of their lengths in {source}; the others "
            "went unchecked",
            stacklevel=3,
        )
    return found


class GRPOObjective(Objective):
    """Online GRPO on {"prompt_ids", "prompt_lengths", "answer"} batches (or offline scored responses).

    ``problems`` (a list of {"question", "answer"}) makes the objective its own data source: the Trainer then
    draws each micro-batch from it in order (``next_batch``) instead of from ``data.train_path``.
    ``eval_problems`` adds held-out accuracy to the Trainer's evaluations.
    """

    train_type = "grpo"
    count_metrics = ("problems",)  # an evaluation's held-out problems graded: its size (report.md: a column)

    def __init__(
        self,
        cfg: GRPOConfig | None = None,
        tokenizer=None,
        reward_fn: Callable | None = None,
        reference: Reference | None = None,
        problems=None,
        eval_problems=None,
        seed: int = 0,
    ):
        self.cfg = cfg or GRPOConfig()
        self.cfg.validate()
        self.tokenizer = tokenizer
        self.custom_reward = reward_fn is not None
        self.reward_fn = reward_fn or reward_fn_for_template(self.cfg.template, self.cfg.format_weight)
        self.reference = reference
        self.rank, self.world = 0, 1
        self._dist = None  # the trainer's DistInfo (setup): rollouts one rank cannot make stop every rank
        self._trainer = None  # a weak reference to the trainer (setup): its step names the rollouts that failed
        self.seed = seed
        self.calls = 0  # rollout batches drawn so far: seeds the sampling
        self.position = 0  # problems of the stream used so far, over all ranks
        self.problems = [as_problem(p) for p in problems] if problems is not None else None
        # the stream as given (before setup drops the prompts that fill the context): what a resume must find again
        self._problems_fingerprint = (
            hashlib.sha256(json.dumps(self.problems, sort_keys=True).encode()).hexdigest()[:16]
            if self.problems is not None
            else None
        )
        self.eval_problems = [as_problem(p) for p in eval_problems] if eval_problems is not None else None
        if self.problems is not None:
            if not self.problems:
                raise ValueError("GRPOObjective: the problem stream is empty")
            self.next_batch = self._next_problems  # the Trainer draws batches from the stream instead of a store
        self._wrapped = False
        self._progress = False  # the held-out evaluation's bar (setup: the run's logging.progress, on rank 0)
        self._no_signal = 0  # rollout batches in a row whose groups all scored flat
        self._rows = 0  # the most rollout rows of a batch (setup: micro_batch_size x group_size): the seed block
        self.given: frozenset[str] = frozenset()  # the grpo.* keys the run set (build_objective): checked in setup

    def setup(self, trainer: Any) -> None:
        """Take the run's tokenizer, rank and seed; build the frozen reference (the start) when the KL is on."""
        if self.tokenizer is None:
            self.tokenizer = getattr(trainer, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError(
                "the grpo objective needs a tokenizer to decode rollouts: pass --tokenizer (data.tokenizer)"
            )
        dist = getattr(trainer, "dist", None)
        if dist is not None:
            self.rank, self.world = dist.rank, dist.world_size
            self._dist, self._trainer = dist, weakref.ref(trainer)
        self.seed = trainer.cfg.train.seed
        # the held-out evaluation's bar: where the run draws its own (rank 0 evaluates)
        self._progress = bool(trainer.cfg.logging.progress) and (dist is None or dist.is_main)
        self._rows = trainer.cfg.train.micro_batch_size * self.cfg.group_size
        self._check_store_template(trainer)
        self._check_offline_batch(trainer)
        context = getattr(getattr(trainer.bare_model, "config", None), "max_position_embeddings", None)
        if isinstance(context, int):  # a prompt that fills the context stopped the run at its step (or evaluation)
            lengths: dict[str, int] = {}  # question -> its prompt's tokens, encoded once for both checks

            def length(problem: dict) -> int:
                question = problem["question"]
                if question not in lengths:
                    lengths[question] = len(encode_prompt(self.tokenizer, question, self.cfg.template))
                return lengths[question]

            self.problems = self._fitting(self.problems, context, "grpo.problems", length, trainer)
            self.eval_problems = self._fitting(self.eval_problems, context, "grpo.eval_problems", length, trainer)
            self._say_short_of_room(trainer, context, length)
        self._say_if_held_out_problems_train(trainer)
        if self.cfg.engine == "serving" and is_sharded(trainer.bare_model):
            raise ValueError(
                "grpo.engine=serving keeps an engine over weights that parallel.fsdp gathers afresh for each "
                "rollout; use grpo.engine=builtin (or auto)"
            )
        lora = getattr(getattr(trainer.cfg, "lora", None), "enabled", False)
        if self.cfg.kl_coef and self.reference is None and self.cfg.reference == "base" and not lora:
            raise ValueError(
                "grpo.reference=base is the LoRA base model (the policy with its adapters off), and this run trains "
                "no adapters (lora.enabled=false): set lora.enabled=true, or grpo.reference=copy for a frozen copy "
                "of the starting model"
            )
        if self.cfg.kl_coef and self.reference is None:  # under FSDP a copy is sharded like the policy
            shard = functools.partial(shard_frozen, cfg=trainer.cfg) if is_sharded(trainer.bare_model) else None
            self.reference = Reference(trainer.bare_model, self.cfg.reference, shard=shard)

    def _fitting(
        self, problems: list[dict] | None, context: int, name: str, length: Callable[[dict], int], trainer: Any = None
    ) -> list[dict] | None:
        """The problems whose prompt leaves room for an answer in the model's ``context``; the others are dropped
        and counted, as a grpo store's long prompts are (a cut prompt would ask another question): warned, and kept
        beside the store's counts in the trainer's ``data_stats`` (metrics.jsonl, the summary, report.md) as
        ``grpo_problems_records``/``grpo_problems_dropped`` (``grpo_eval_problems_*`` for grpo.eval_problems)."""
        if problems is None:
            return None
        keep = [p for p in problems if length(p) < context]
        stats = getattr(trainer, "data_stats", None)
        if isinstance(stats, dict):
            key = name.replace(".", "_")
            stats.update({f"{key}_records": len(problems), f"{key}_dropped": len(problems) - len(keep)})
        if not keep:
            raise ValueError(f"{name}: every prompt fills the model's context of {context} tokens; shorten them")
        if len(keep) < len(problems):
            warnings.warn(
                f"{name}: {len(problems) - len(keep)} of {len(problems)} problems are dropped: their prompts fill the "
                f"model's context of {context} tokens",
                stacklevel=2,
            )
        return keep

    def _say_if_held_out_problems_train(self, trainer: Any) -> None:
        """Warn (rank 0) when held-out problems graded are training problems too: grpo.problems with the same
        question, or an online grpo store holding the same prompt (``_prompts_in_store``: its prompts of a held-out
        one's length, a bounded share). val_accuracy then measures what the run trains on, as a validation store with
        the training data's fingerprint would."""
        graded = self._graded()
        if self.rank != 0 or not graded:
            return
        dataset = getattr(getattr(getattr(trainer, "train_loader", None), "loader", None), "dataset", None)
        if self.problems is not None:
            source = "grpo.problems"
            seen = {p["question"].strip() for p in self.problems}
            shared = sum(p["question"].strip() in seen for p in graded)
        elif getattr(dataset, "offline", True) is False:  # an online grpo store: its prompts as packed
            source = f"--train-data {trainer.cfg.data.train_path}"
            ids = [np.asarray(encode_prompt(self.tokenizer, p["question"], self.cfg.template), "int64") for p in graded]
            found = _prompts_in_store(dataset.store, {i.tobytes(): len(i) for i in ids}, source)
            shared = sum(i.tobytes() in found for i in ids)
        else:
            return
        if shared:
            warnings.warn(
                f"grpo: {shared} of the {len(graded)} held-out problems graded (grpo.eval_problems) are training "
                f"problems too (their questions are in {source}): val_accuracy measures them after training on "
                "them, not held-out ones; hold them out of the training problems (GSM8K: train.jsonl to train, "
                "test.jsonl to evaluate)",
                stacklevel=2,
            )

    def _check_store_template(self, trainer: Any) -> None:
        """Refuse an online grpo store whose prompts were packed with another template than ``grpo.template``: the
        rewards and stop strings follow grpo.template, so every rollout would be graded for a format its prompt
        never asked for."""
        dataset = getattr(getattr(getattr(trainer, "train_loader", None), "loader", None), "dataset", None)
        if getattr(dataset, "offline", True) is not False or self.problems is not None:
            return
        packed = dataset.store.meta.get("pack", {}).get("prompt_template")
        if packed is None:  # a store from before pack recorded it, or not made by pack
            return
        if PROMPTS.get(packed, packed) != PROMPTS.get(self.cfg.template, self.cfg.template):
            named = next((name for name, text in PROMPTS.items() if text == packed), None)
            # a text of one's own as the shell and YAML take it (JSON is YAML's double-quoted string): typed bare,
            # "grpo.template=Q: {question}\nA:" is a YAML mapping and refused
            override = f"grpo.template={named}" if named else shlex.quote("grpo.template=" + json.dumps(packed))
            raise ValueError(
                f"{trainer.cfg.data.train_path} was packed with --prompt-template {packed!r}, but grpo.template="
                f"{self.cfg.template!r} grades the answers (their format, where they stop) of another prompt; set "
                f"{override}, or repack the store with that template's text as --prompt-template"
            )

    def _check_offline_batch(self, trainer: Any) -> None:
        """Refuse offline rollouts that train nothing (weight decay alone would move the weights): one a micro-batch
        under a baseline (a stored response's advantage is its reward minus the micro-batch's mean, so alone it is
        0), or a store whose rewards are all the same (every advantage 0; without a baseline, all 0 rewards)."""
        dataset = getattr(getattr(getattr(trainer, "train_loader", None), "loader", None), "dataset", None)
        if getattr(dataset, "offline", False) is not True:
            return
        unread = sorted(self.given & set(ONLINE_ONLY))
        if unread:
            shape = "shapes" if len(unread) == 1 else "shape"
            raise ValueError(
                f"{trainer.cfg.data.train_path} holds offline rollouts (responses stored with their rewards): "
                f"{', '.join('grpo.' + k for k in unread)} {shape} how online rollouts are sampled, grouped or scored, "
                "and would be ignored; leave them out (each stored response's advantage is its reward minus its "
                "micro-batch's mean)"
            )
        baseline = self.cfg.loss_type != "no_baseline"
        if baseline and trainer.cfg.train.micro_batch_size < 2:
            raise ValueError(
                f"{trainer.cfg.data.train_path} holds offline rollouts, whose advantage is the reward minus the "
                f"micro-batch's mean: with train.micro_batch_size={trainer.cfg.train.micro_batch_size} every "
                f"advantage is 0 and nothing trains; set train.micro_batch_size to 2 or more, or "
                "grpo.loss_type=no_baseline to train on the raw rewards"
            )
        store = dataset.store
        rewards = store.stream("rewards", 0, store.stream_length("rewards"))
        if len(rewards) != len(store) or not len(dataset.indices):  # not one reward a record: not pack's layout
            return
        values = np.unique(rewards[dataset.indices])
        if len(values) == 1 and (baseline or values[0] == 0):
            why = (
                "each response's advantage is its reward minus its micro-batch's mean, 0 for every one"
                if baseline
                else f"with grpo.loss_type={self.cfg.loss_type} each response is weighted by its reward, 0"
            )
            fix = (
                "add rollouts that scored otherwise (wrong answers beside the right ones), or set "
                "grpo.loss_type=no_baseline to train on the raw rewards"
                if baseline and values[0] != 0
                else "add rollouts that scored otherwise (right answers beside the wrong ones)"
            )
            raise ValueError(
                f"{trainer.cfg.data.train_path} holds offline rollouts and every stored reward is {float(values[0]):g}"
                f" ({len(dataset.indices)} responses): {why}, so nothing trains; {fix}"
            )

    def _say_short_of_room(self, trainer: Any, context: int, length: Callable[[dict], int]) -> None:
        """Warn, per source, how many prompts leave less than ``max_new_tokens`` of the ``context`` for the answer:
        their answers stop at the context's end and are graded as they stand, which nothing else would say."""
        if self.rank != 0:
            return

        def lengths_of(problems):
            return None if problems is None else [length(p) for p in problems]

        dataset = getattr(getattr(getattr(trainer, "train_loader", None), "loader", None), "dataset", None)
        stored = None
        if getattr(dataset, "offline", True) is False:  # an online grpo store: its prompts the window kept
            stored = dataset.store.lengths("prompts")[dataset.indices].tolist()
        rollout = ("grpo.max_new_tokens", self.cfg.max_new_tokens)
        held_out = (
            ("grpo.eval_max_new_tokens", self.cfg.eval_max_new_tokens) if self.cfg.eval_max_new_tokens else rollout
        )
        graded = self._graded()  # grpo.eval_size grades only the first ones: the others are never answered
        for name, lengths, (key, room) in (
            ("grpo.problems", lengths_of(self.problems), rollout),
            ("--train-data (data.train_path)", stored, rollout),
            ("grpo.eval_problems", lengths_of(graded), held_out),
        ):
            short = sum(n + room > context for n in lengths or ())
            if short:
                warnings.warn(
                    f"{name}: {short} of {len(lengths)} prompts leave less than {key}={room} tokens of the model's "
                    f"context ({context}) for the answer: those answers stop at the context's end and are graded as "
                    f"they stand; lower {key} or leave the longest problems out",
                    stacklevel=2,
                )

    def _next_problems(self, trainer: Any) -> dict[str, Any]:
        """This rank's share of the next ``micro_batch_size * world`` problems of the stream, as prompt ids."""
        per_rank = trainer.cfg.train.micro_batch_size
        n = len(self.problems)
        start = self.position + self.rank * per_rank
        if self.position + per_rank * self.world > n and not self._wrapped:
            self._wrapped = True  # once a process: a resume past the first pass is in a later one already
            said = (
                "; it starts again from the first (problems now repeat)"
                if self.position <= n
                else f": it is in its pass {self.position // n + 1} over them (problems repeat)"
            )
            warnings.warn(
                f"grpo: the problem stream has {n} problems and the run has used {self.position}{said}", stacklevel=2
            )
        chosen = [self.problems[(start + i) % n] for i in range(per_rank)]
        self.position += per_rank * self.world
        prompts = [encode_prompt(self.tokenizer, p["question"], self.cfg.template) for p in chosen]
        width = max(map(len, prompts))
        pad = pad_id_of(self.tokenizer)
        ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts], dtype=torch.long)
        return {
            "prompt_ids": ids,
            "prompt_lengths": torch.tensor([len(p) for p in prompts]),
            "answer": [p["answer"] for p in chosen],
        }

    def _prompts(self, batch: dict[str, Any]) -> list[list[int]]:
        rows = batch["prompt_ids"].tolist()
        lengths = batch.get("prompt_lengths")
        if lengths is None:
            return rows
        return [row[: int(n)] for row, n in zip(rows, lengths.tolist())]

    @torch.no_grad()
    def prepare(self, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, Any]:
        """Roll out, score and lay out the loss batch (online); or pack stored responses (offline)."""
        device = batch["prompt_ids"].device
        prompts = self._prompts(batch)
        pad = pad_id_of(self.tokenizer)
        if "response_ids" in batch:  # offline: responses and rewards were stored; REINFORCE on the reward
            resp, masks = batch["response_ids"].tolist(), batch["response_mask"].tolist()
            responses = [[t for t, m in zip(r, mk) if m] or [pad] for r, mk in zip(resp, masks)]
            out = pack_prompt_and_output(prompts, responses, pad)
            reward = batch["reward"].float()
            out.update(
                advantages=reward - reward.mean(),
                raw_rewards=reward,
                metadata={
                    "reward_mean": reward.mean().item(),
                    "response_length": sum(map(len, responses)) / len(responses),
                },
            )
            if self.cfg.loss_type != "no_baseline":  # a micro-batch of one reward: every advantage is 0
                low, high = reward.min().item(), reward.max().item()
                flat = {"frac_zero_std_groups": float(low == high), "reward_min": low, "reward_max": high}
                self._note_signal(flat, offline=True)
        else:
            params = sampling_params(self.cfg, self.tokenizer, seed=self._rollout_seed(len(prompts)))
            # FSDP: rollouts stop at different lengths on each rank. Each rank rolls out and scores its own problems
            # (the reward function is the user's code): one that fails stops every rank with its reason, where it
            # left the others in the step's next collective (gloo's "Connection closed by peer", NCCL's timeout).
            # The block holds no collective (generation runs on the gathered weights); one all-gather on leaving it.
            with gathered_weights(model), self._stop_together_if_one_fails():
                out = collect_rollouts(
                    unwrap(model),
                    self.tokenizer,
                    prompts,
                    list(batch["answer"]),
                    self.cfg.group_size,
                    params,
                    self.reward_fn,
                    self.cfg.advantage_eps,
                    self.cfg.normalize_by_std,
                    **rollout_options(self.cfg, model),
                )
            self._note_signal(out["metadata"])
        self.calls += 1
        loss_batch = {
            k: out[k].to(device) for k in ("input_ids", "labels", "response_mask", "advantages", "raw_rewards")
        }
        if self.reference is not None:
            loss_batch["ref_log_probs"] = self.reference.log_probs(loss_batch["input_ids"], loss_batch["labels"]).to(
                device
            )
        loss_batch["rollout_metrics"] = out["metadata"]
        return loss_batch

    def _rollout_seed(self, prompts: int) -> int:
        """The seed of this rank's next rollout batch, whose row i samples from ``seed + i``: each (call, rank) gets
        a block of ``max(101, rows)`` seeds of its own, so no two rows of a run share a random stream (rank r once
        drew rank 0's shifted by r rows, and a batch of over 101 rows the next batch's). One process with up to 101
        rows a batch keeps the seeds it always had, ``(train.seed * 1_000_003 + calls) * 101``."""
        self._rows = max(self._rows, prompts * self.cfg.group_size)
        return ((self.seed * 1_000_003 + self.calls) * self.world + self.rank) * max(101, self._rows)

    def _stop_together_if_one_fails(self):
        """``stop_together`` over the trainer's ranks, "roll out step N" (a no-op in one process)."""
        if self._dist is None or not self._dist.enabled:
            return contextlib.nullcontext()
        from cookmind.parallel.process_group import stop_together

        trainer = self._trainer() if self._trainer is not None else None
        return stop_together(self._dist, "roll out" + (f" step {trainer.step + 1}" if trainer is not None else ""))

    def _note_signal(self, meta: dict[str, float], offline: bool = False) -> None:
        """Count rollout batches (offline: micro-batches of stored rollouts) in a row with no reward signal; at
        ``NO_SIGNAL_BATCHES`` say so (rank 0, once a run of them)."""
        flat = meta.get("frac_zero_std_groups", 0.0) >= 1.0
        if self.cfg.loss_type == "no_baseline":  # raw rewards weight the rollouts: only all-0 ones train nothing
            flat = meta.get("reward_min", 0.0) == meta.get("reward_max", 0.0) == 0.0
        if not flat:
            self._no_signal = 0
            return
        self._no_signal += 1
        if self._no_signal == NO_SIGNAL_BATCHES and self.rank == 0:
            if offline:
                message = offline_no_signal_message(meta, NO_SIGNAL_BATCHES)
            else:
                message = no_signal_message(self.cfg, meta, NO_SIGNAL_BATCHES, self.custom_reward)
            warnings.warn(message, stacklevel=2)

    @property
    def token_mean_loss(self) -> bool:
        """length_normalization=token (DAPO) is a mean over the global batch's response tokens (the Trainer weights
        each micro-batch by its share of them); the others are means over sequences."""
        return self.cfg.length_normalization == "token"

    def target_tokens(self, batch: dict[str, Any]) -> torch.Tensor:
        return batch["response_mask"].sum()

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        """The aggregated policy-gradient loss and the run's RL metrics."""
        out = get_response_log_probs(model, batch["input_ids"], batch["labels"], return_token_entropy=True)
        lp, mask = out["log_probs"], batch["response_mask"]
        per_token, meta = compute_policy_gradient_loss(
            lp,
            self.cfg.loss_type,
            raw_rewards=batch["raw_rewards"].unsqueeze(-1),
            advantages=batch["advantages"].unsqueeze(-1),
            old_log_probs=lp.detach(),
            cliprange=self.cfg.cliprange,
            ref_log_probs=batch.get("ref_log_probs"),
            kl_coef=self.cfg.kl_coef,
        )
        loss = aggregate_token_loss(per_token, mask, self.cfg.length_normalization, float(self.cfg.max_new_tokens))
        rm = batch.get("rollout_metrics", {})
        metrics = {"loss": loss.detach()}
        # offline responses were never graded, grouped or sampled: a metric they lack is left out, not reported as 0
        for name, key in (
            ("reward", "reward_mean"),
            ("format_reward", "format_reward_mean"),
            ("accuracy", "answer_reward_mean"),
            ("response_length", "response_length"),
            ("cut_short", "cut_short"),
            ("frac_zero_std_groups", "frac_zero_std_groups"),
        ):
            if key in rm:
                metrics[name] = rm[key]
        metrics["entropy"] = masked_mean(out["token_entropy"].detach(), mask).item()
        if "clipped" in meta:
            metrics["clip_fraction"] = masked_mean(meta["clipped"].float(), mask).item()
        if "kl" in meta:
            metrics["kl"] = masked_mean(meta["kl"], mask).item()
        return loss, metrics

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Greedy held-out accuracy, format rate, answer length and the share of answers cut short, over
        ``problems`` graded (grpo.eval_size's first ones; the Trainer prefixes them with ``val_``)."""
        if not self.eval_problems:
            return {}
        graded = self._graded()
        res = evaluate_accuracy(unwrap(model), self.tokenizer, graded, self.cfg, self.reward_fn, self._progress)
        return {
            "problems": len(graded),
            **{k: res[k] for k in ("accuracy", "format_rate", "response_length", "cut_short")},
        }

    def _graded(self) -> list[dict] | None:
        """The held-out problems each evaluation grades: the first ``grpo.eval_size`` of them (0: all)."""
        if self.eval_problems is None or not self.cfg.eval_size:
            return self.eval_problems
        return self.eval_problems[: self.cfg.eval_size]

    def num_tokens(self, batch: dict[str, Any]) -> int:
        """Prompt + response tokens of the rollouts."""
        return int(batch["input_ids"].numel())

    def state_dict(self) -> dict[str, Any]:
        """The rollout counter and stream position (they fix the next prompts and sampling seeds on resume), and
        a fingerprint of the stream's problems (the position counts in them)."""
        state: dict[str, Any] = {"calls": self.calls, "position": self.position}
        if self._problems_fingerprint is not None:
            state["problems"] = self._problems_fingerprint
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rollout counter and stream position; a stream of other problems than the checkpoint's (its
        file edited, or another named) is refused: the position would count in them."""
        saved = state.get("problems")
        if saved is not None and self._problems_fingerprint is not None and saved != self._problems_fingerprint:
            raise ValueError(
                f"grpo.problems{'=' + self.cfg.problems if self.cfg.problems else ''}: not the problems the "
                "checkpoint's run trained on (the file's problems have changed, or another file is named): a resume "
                "takes the next problems of the same stream; give it back, or train the checkpoint's weights on these "
                "with a new run (--init-from CHECKPOINT and another --run-dir)"
            )
        self.calls = int(state.get("calls", 0))
        self.position = int(state.get("position", 0))


def grpo_settings(section: dict | None) -> GRPOConfig:
    """The run's ``grpo`` section over the defaults (the prompt template "chat" unless set), validated."""
    values = dict(section or {})
    values.setdefault("template", "chat")
    return GRPOConfig.from_dict(values)


def build_objective(cfg, trainer) -> GRPOObjective:
    """The Trainer's plugin hook: GRPO settings from ``cfg.grpo``; ``grpo.problems`` / ``grpo.eval_problems`` are read.

    Without a template the prompt is "chat" (grading ``#### N``), matching ``cookmind pack``'s default
    grpo prompt template.
    """
    gcfg = grpo_settings(getattr(cfg, "grpo", None))
    if gcfg.problems and cfg.data.train_path:  # the stream replaces the store, which was read and never drawn from
        raise ValueError(
            f"grpo.problems={gcfg.problems} and data.train_path={cfg.data.train_path} (--train-data) both name the "
            "training prompts, and the run takes grpo.problems only: give one of them"
        )
    problems = load_problems(gcfg.problems, "grpo.problems") if gcfg.problems else None
    held_out = load_problems(gcfg.eval_problems, "grpo.eval_problems") if gcfg.eval_problems else None
    objective = GRPOObjective(gcfg, problems=problems, eval_problems=held_out, seed=cfg.train.seed)
    objective.given = frozenset(getattr(cfg, "grpo", None) or {})
    return objective
