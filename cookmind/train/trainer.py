"""The one training loop: pretrain, SFT, DPO (and GRPO) differ only in their objective and data.

One optimizer step:

    for each of grad_accum_steps micro-batches:
        batch = objective.prepare(model, next(data))        # e.g. GRPO rollouts; no grad
        with autocast: loss, metrics = objective(model, batch)
        backward(loss / grad_accum_steps)                   # DDP syncs on the last micro-step only
    unscale (fp16) -> clip global norm -> skip if loss/grad non-finite -> lr from cosine -> optimizer.step
    prefetch the next step's micro-batches, then read loss and norm (the step's one host sync)

On CUDA the skip decision stays on the device (fused AdamW takes a found_inf flag), so the host queues the
update and loads the next batch while the GPU still runs the step; elsewhere the host decides after the sync.
On that device-side path the read itself is deferred too (``train.defer_metrics``): the host queues step k+1
first, then reads step k's loss and norm (copied to pinned memory behind step k) and runs its callbacks, so
the GPU never idles waiting for the host. A step is read before the next one is queued when a callback needs
the state at that step (``Callback.needs_state_at``: checkpoints, evaluation, any callback that does not say
otherwise), at the last step, and when it could be the step that ends a diverging run, so the results are the
same bit for bit with and without deferral.

Checkpoints are saved after the optimizer step they name (every N steps, at the end, and when a
SIGTERM/SIGINT or ``request_stop`` arrives), and resuming one continues exactly: the model,
optimizer, sampler position and every RNG come back, so on CPU (with the same ``train.threads``; the
default 1 is bit-reproducible) an interrupted-and-resumed run ends with the same weights bit for bit as
an uninterrupted one.

A fresh run refuses a run directory that holds another run (``checkpoint.resume`` continues it,
``checkpoint.overwrite`` deletes it). A run whose loss stays non-finite or exploding (above
``train.diverge_loss_ratio`` times its best) for more than ``train.max_bad_steps`` steps stops: its state
is saved marked ``diverged`` (never chosen as "the newest checkpoint", never a reason to prune a good one)
and ``fit`` raises TrainingDiverged.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import signal
import time
import uuid
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cookmind.atomic import clean_stale_temps
from cookmind.model.model_io import CheckpointWarning
from cookmind.parallel import (
    finish_gradient_sync,
    gathered_weights,
    init_distributed,
    is_sharded,
    no_sync,
    parallelize,
    reshard_all,
    unwrap,
)
from cookmind.parallel.process_group import (
    differences_from_rank0,
    min_max_over_ranks,
    raise_together,
    rank0_value,
    stop_together,
    sum_over_ranks,
)
from cookmind.terminal import say_from_handler
from cookmind.train import build as B
from cookmind.train.callbacks import (
    Callback,
    CheckpointCallback,
    EvalCallback,
    MetricsCallback,
    ProgressCallback,
    ReportCallback,
)
from cookmind.train.checkpoint import (
    check_run_dir,
    checkpoint_name,
    find_latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    read_meta,
    refuse_foreign_files,
    refuse_overwriting_inputs,
    save_checkpoint,
    update_meta,
)
from cookmind.train.config import TrainConfig, setting, uses_master_weights, yaml_word
from cookmind.train.metrics import MetricsWriter, is_number, peak_flops, to_float, training_metric_names
from cookmind.train.objectives.base import Objective
from cookmind.train.precision import autocast_context, make_grad_scaler
from cookmind.train.rng_state import capture_rng, restore_rng, seed_everything
from cookmind.train.run_lock import lock_run_dir, release_run_dir
from cookmind.train.sharded_checkpoint import check_shared, saves_sharded, sharded_checkpointer

# the settings the learning rate of a step is computed from (Trainer.lr_at): a resume that changes one warns
SCHEDULE_KEYS = ("train.max_steps", "optim.lr", "optim.min_lr_ratio", "optim.warmup_steps", "optim.schedule")


class TrainingDiverged(RuntimeError):
    """Too many consecutive non-finite or exploding losses (or non-finite gradients)."""


_FAILED = 1 << 20  # _stop_on_any_rank's code of a rank that failed (above any signal's number)
LOSS_WINDOW = 10  # steps averaged for the best-loss reference of the divergence check
TRUNCATION_WARN = 0.05  # warn when more than this share of sft/dpo records is truncated or dropped


@dataclass
class _QueuedStep:
    """One optimizer step as the host queued it; its loss, norm and tensor metrics may still be on the device.

    ``readout`` is ``[loss, grad_norm, *tensor metrics]``, and with several ranks the step's tokens over them last:
    on the host already, or a pinned buffer that an async copy fills once the GPU reaches the end of the step
    (``ready`` is recorded right after that copy).
    """

    step: int  # 1-based: the optimizer step this is
    t_launch: float  # perf_counter when the host began to queue it
    lr: float
    step_tokens: int  # tokens of this step on this rank: the step's for one process
    readout: torch.Tensor
    slots: dict[str, int]  # tensor metric name -> its index in readout
    sums: dict[str, Any]  # the objective's metrics summed over micro-batches (tensors read through readout)
    token_slot: int | None = None  # several ranks: where readout holds the step's tokens over them
    ready: Any = None  # a torch.cuda.Event when readout is filled asynchronously
    values: list[float] | None = field(default=None)  # readout on the host, once read
    t_queued: float = 0.0  # perf_counter when the host had queued it all
    t_read: float = 0.0  # perf_counter when values reached the host


@dataclass
class StepOutputs:
    """What one step's GPU work hands back: ``readout`` = [loss, grad norm, *tensor metrics] on the device."""

    readout: torch.Tensor
    slots: dict[str, int]  # tensor metric name -> its index in readout
    sums: dict[str, Any]  # the objective's metrics summed over micro-batches
    tokens: int  # tokens of this step on this rank
    micro_outputs: list = field(default_factory=list)  # (loss, metrics) per micro-batch, when captured
    token_slot: int | None = None  # several ranks: where readout holds the step's tokens over them


def _note(text: str) -> None:
    """``cookmind train: TEXT`` on stderr, its control and bidi characters escaped (``cookmind.cli.say``): the notes
    quote paths, store names and config values the user gave, and an ESC in one would drive the terminal."""
    from cookmind.cli import say

    say("cookmind train", None, text)


def _longest_record(dataset) -> int | None:
    """The tokens of the longest record of an sft or dpo dataset's store (a window that long cuts none); None for
    another dataset."""
    store = getattr(dataset, "store", None)
    keys = [k for k in ("sequence", "chosen", "rejected") if k in getattr(store, "keys", ())]
    if not keys or not len(store) or getattr(dataset, "num_truncated", None) is None:
        return None
    return max(int(store.lengths(k).max()) for k in keys)


def _drop_reasons(dataset) -> str:
    """Why an sft/dpo/grpo dataset dropped the records it did at its window, by count where there are two reasons."""
    if getattr(dataset, "num_truncated", None) is None:  # grpo: a prompt is never cut, only dropped
        return "no room left for an answer in the window"
    same = getattr(dataset, "num_same_in_window", 0)  # dpo: chosen and rejected the same in the window
    reasons = [
        (dataset.num_dropped - same, "no supervised token left in the window"),
        (same, "chosen and rejected the same in the window"),
    ]
    said = [(n, why) for n, why in reasons if n]
    if len(said) == 1:
        return said[0][1]
    return ", ".join(f"{n} with {why}" for n, why in said) or reasons[0][1]


def _check_same_config(cfg: TrainConfig, info, own_run_dir: str | None = None) -> None:
    """Every rank must run the same config: nodes launched with different overrides trained apart (another learning
    rate), hung at the end (other max_steps) or failed in DDP's own traceback (another width). ``own_run_dir``: this
    rank's run directory before rank 0's was taken; the clock's part of a default one may differ between ranks."""
    import re

    from cookmind.train.cli import STAMP

    values = cfg.flat()
    values.pop("checkpoint.dir")  # may name each node's own disk; that the ranks resume alike is checked on resume
    if own_run_dir is not None:  # a node with --run-dir and one without: both trained in rank 0's, unsaid
        values["logging.run_dir"] = re.sub(STAMP + "$", "-<UTC time>", str(own_run_dir))
    values = {setting(key): value for key, value in values.items()}  # "--resume (checkpoint.resume)": as typed
    diff = differences_from_rank0(values, info)
    if diff:
        more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
        raise ValueError(
            f"the ranks were started with different configs: {'; '.join(diff[:3])}{more}. Start every node and "
            "process with the same --config and overrides"
        )


_VAL_UNITS = " units"  # validation's running total of loss units (a key no metric has)


def sample_prompt_ids(cfg, tok) -> tuple[bool, list[list[int]]]:
    """(chat, ids): each of ``cfg.eval.prompts`` as its sample prompts the model, a user turn in the chat template
    (chat: sft/dpo/grpo with a chat tokenizer) or the start of a document (Llama's <s> first)."""
    from cookmind.tokenizer.documents import prompt_ids

    chat = cfg.train.objective != "pretrain" and hasattr(tok, "render")
    if chat:
        render = [tok.render([{"role": "user", "content": p}], add_generation_prompt=True)[0] for p in cfg.eval.prompts]
        return chat, [list(ids) for ids in render]
    return chat, [prompt_ids(tok, p) for p in cfg.eval.prompts]


class Trainer:
    """Owns the loop; everything else (model, objective, data) is built from ``cfg`` or passed in."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: torch.nn.Module | None = None,
        objective: Objective | None = None,
        train_dataset=None,
        val_dataset=None,
        tokenizer=None,
        callbacks: list[Callback] | None = None,
    ):
        cfg.validate()
        self.cfg = cfg
        self.dist = init_distributed(cfg.train.device, cfg.parallel.backend, group_of_one=cfg.parallel.fsdp)
        self.device = self.dist.device
        if self.device.type == "cpu" and cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)  # bit-reproducible CPU runs need the same count each time
        seed_everything(cfg.train.seed)
        # rank 0's run directory on every rank: a default one is named by each rank's clock (`cookmind train`
        # without --run-dir), and ranks a second apart would write and resume in different directories
        own_run_dir = cfg.logging.run_dir
        cfg.logging.run_dir = rank0_value(cfg.logging.run_dir, self.dist)
        _check_same_config(cfg, self.dist, own_run_dir)
        self.run_dir = Path(cfg.logging.run_dir)
        self.ckpt_dir = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else self.run_dir / "checkpoints"
        reads = {
            "train.init_from": cfg.train.init_from,
            "dpo.reference": cfg.dpo.reference,
            "data.train_path": cfg.data.train_path,
            "data.val_path": cfg.data.val_path,
            "data.tokenizer": cfg.data.tokenizer,
        }
        # A rank that cannot start stops every rank with its reason (stop_together): each block below holds what
        # may fail on one node (its files) and no collective; the collectives come between them.
        with stop_together(self.dist, "start"):
            refuse_overwriting_inputs(
                self.ckpt_dir, self.run_dir, cfg.checkpoint.resume, cfg.checkpoint.overwrite, reads
            )
            if self.dist.is_main:  # before anything is read or deleted there: one run per directory at a time
                if not cfg.checkpoint.resume:  # and not a folder of other files (the lock would be the first we add)
                    refuse_foreign_files(self.run_dir, self.ckpt_dir)
                lock_run_dir(self.run_dir)  # an existing one (a new one is locked once it is made, below)
        with stop_together(self.dist, "start"):  # its all-gather is the barrier: rank 0 has deleted before any reads
            if self.dist.is_main or not cfg.checkpoint.overwrite:  # every rank refuses alike; rank 0 deletes
                check_run_dir(
                    self.ckpt_dir,
                    self.run_dir,
                    cfg.checkpoint.resume,
                    cfg.checkpoint.overwrite,
                    cfg,
                    progress=cfg.logging.progress and self.dist.is_main,  # --resume PATH's weights, read whole
                )
                clean_stale_temps(self.ckpt_dir)  # what a killed save left behind
        if saves_sharded(cfg):  # every rank writes its shards there: a node that does not see it stops here
            check_shared(self.ckpt_dir, self.dist)
        self.run_id = uuid.uuid4().hex  # marks this run's checkpoints: only those are ever pruned
        self.lora_base: str | None = None  # the model a LoRA run adapts (adapter_config.json), when built from a path
        # finding a run's newest checkpoint (train.init_from, dpo.reference) hashes its weights: rank 0 shows a bar
        progress = cfg.logging.progress and self.dist.is_main
        with stop_together(self.dist, "start"):  # this node's tokenizer, stores and weights; no collective
            if train_dataset is None:
                B.check_train_store(cfg, objective)
            if tokenizer is None and not cfg.data.tokenizer:
                # the checkpoint's or the store's: copied into checkpoints
                cfg.data.tokenizer = B.find_tokenizer(cfg, progress)
                if cfg.data.tokenizer and self.dist.is_main:
                    _note(f"{setting('data.tokenizer')} not set; using {cfg.data.tokenizer}")
            self.metrics_writer = MetricsWriter(self.run_dir / "metrics.jsonl", enabled=self.dist.is_main)
            self.tokenizer = tokenizer if tokenizer is not None else B.load_tokenizer(cfg.data.tokenizer)
            B.check_init_tokenizer(cfg, self.tokenizer, progress)

            # Model: fp32 master weights on this rank's device; checkpointing, compile and DDP (or FSDP, which shards
            # bare_model in place: the optimizer below is built over its sharded parameters) applied from outside.
            if model is None:
                model = B.build_model(cfg, self.tokenizer, progress)
                if cfg.lora.enabled:  # the base the adapters train on, as loaded: adapter_config.json names it
                    self.lora_base = B.lora_base(cfg, progress)
            elif cfg.lora.enabled:
                from cookmind.model.lora import apply_lora, has_lora

                if not has_lora(model):
                    apply_lora(model, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.targets)
            # under FSDP, fully_shard moves each block's weights to this rank's device as it shards them: the whole
            # model never sits on one GPU, so weights that outgrow a GPU still train when their shards fit
            self.bare_model = model if cfg.parallel.fsdp else model.to(self.device)
            vocab_note = B.check_vocab(cfg, self.bare_model, self.tokenizer) if train_dataset is None else None
            if vocab_note and self.dist.is_main:
                _note(vocab_note)
            max_pos = getattr(getattr(self.bare_model, "config", None), "max_position_embeddings", None)
            self._check_sample_prompts(max_pos)
            kind = cfg.data.train_type or {"sft": "sft", "dpo": "dpo"}.get(cfg.train.objective)
            if (
                train_dataset is None
                and kind in ("sft", "dpo")
                and cfg.data.train_path
                and max_pos is not None
                and not cfg.is_user_set("data.window_size")
            ):
                preset = cfg.data.window_size
                cfg.data.window_size = B.window_for_store(cfg.data.train_path, kind, max_pos)
                if self.dist.is_main:  # it said "not set" where the preset set one
                    instead = f", in place of the preset's {preset}" if preset != cfg.data.window_size else ""
                    _note(
                        f"data.window_size sized from the {kind} store to {cfg.data.window_size} (its "
                        f"longest record, at most the model's max_position_embeddings={max_pos}){instead}; set "
                        "data.window_size to choose it"
                    )
            elif (
                max_pos is not None
                and not cfg.is_user_set("data.window_size")
                and (cfg.data.window_size > max_pos or "grpo" in (kind, cfg.train.objective))
            ):
                # a preset's window is not the user's: past this model's context it is capped; for grpo it is the
                # context (a prompt may take what the model can; longer ones drop, counted, as grpo.problems')
                cfg.data.window_size = max_pos
            elif max_pos is not None and cfg.data.window_size > max_pos:
                raise ValueError(
                    f"data.window_size={cfg.data.window_size} is longer than the model's context "
                    f"(max_position_embeddings={max_pos}); lower data.window_size"
                )
            _check_fp8_head(self.bare_model, self.device)
            # train.master_weights: the parameters become bf16 before any wrapper sees them; their fp32 masters go to
            # the optimizer (cookmind.optim.master_weights)
            self._reduce_fp32_grads = False  # train.master_weights with accumulation under data parallelism
            self.master_weights = uses_master_weights(cfg, self.device)  # train.master_weights, "auto" decided
            masters = self._master_weights() if self.master_weights else self._plain_weights()
        self.model = parallelize(self.bare_model, cfg, self.device)
        self.optimizer = B.build_optimizer(cfg, self.bare_model, self.device, masters=masters)
        self._sharded = sharded_checkpointer(cfg.checkpoint, self.model, self.dist.rank, self.dist.world_size)
        self.scaler = make_grad_scaler(cfg.train.precision, self.device)
        self._skip_on_device = _skips_on_device(self.optimizer) and self.scaler is None

        with stop_together(self.dist, "start"):  # this node's stores
            self.objective = objective if objective is not None else B.build_objective(cfg, self)
            self.train_type = cfg.data.train_type or self.objective.train_type
            self.data_stats: dict[str, int] = {}  # sft/dpo/grpo records cut or dropped: metrics.jsonl, summary, report
            # seq tokens in no window, validation batches scored: summary, report
            self.summary_stats: dict[str, int] = {}
            self.data_stores: dict[str, dict[str, str]] = {}  # "train"/"val" -> the store's path and fingerprint
            self.train_loader = self._loader(train_dataset, cfg.data.train_path, shuffle=cfg.data.shuffle, train=True)
            self.val_loader = self._loader(val_dataset, cfg.data.val_path, shuffle=False, train=False)
        self._check_ranks_read_the_same_data()
        self._warn_if_validating_on_training_data()

        self.step = 0
        self.tokens_seen = 0
        self.skipped_steps = 0
        self.consecutive_bad = 0
        self.recent_losses: list[float] = []  # the last LOSS_WINDOW finite losses
        self.best_loss: float | None = None  # the lowest mean of LOSS_WINDOW consecutive finite losses
        self.deferred_steps = 0  # steps read after the next step was queued (this process, this fit)
        self.last_saved_step = -1
        self.last_eval: dict[str, float] = {}
        self.last_eval_step = -1  # the step of the last evaluation (every rank), and of the one the last save holds
        self._saved_eval_step = -1
        self._recent_metrics: deque[dict[str, Any]] = deque(maxlen=RECENT_STEPS)  # the summary's train_* means
        self.samples: list[dict[str, str]] = []
        self._stop_reason: str | None = None
        self._failed: tuple[str, Exception] | None = None  # what this rank could not do, held (_on_this_rank)
        self._iter = None
        self._micros_taken = 0  # micro-batches drawn from the train loader: a step begins at each accum-th
        self._prefetched: list[dict[str, Any]] = []  # the next step's micro-batches, already on the device
        self._sampler_before_prefetch: dict | None = None
        self._rng_to_restore = None
        self._trainable: list[torch.nn.Parameter] | None = None  # cached by the first step of a fit
        self._last_step_end: float | None = None  # when the last step read had been queued and read (step_time_s)
        self.peak = peak_flops(self.device)
        self.flops_per_token = self._flops_per_token()
        self.callbacks: list[Callback] = [
            MetricsCallback(cfg.logging.log_every),
            EvalCallback(cfg.eval.every),
            CheckpointCallback(cfg.checkpoint.every),
            ReportCallback(cfg.checkpoint.every, cfg.logging.report and self.dist.is_main),  # the report meanwhile
            ProgressCallback(cfg.logging.progress and self.dist.is_main, desc=cfg.train.objective),
            *(callbacks or []),
        ]
        with stop_together(self.dist, "start"):  # e.g. a DPO reference model read from this node's disk
            self.objective.setup(self)
        self._maybe_resume()
        with stop_together(self.dist, "start"):  # rank 0 makes the directory: a refusal there stops all
            self._graph = None  # train.cuda_graph: the step captured once and replayed (cookmind.train.cuda_graph)
            if cfg.train.cuda_graph != "false":
                from cookmind.train.cuda_graph import GraphedStep, graph_problems

                problems = graph_problems(self)
                if cfg.parallel.fsdp:
                    problems.append("FSDP's collectives (parallel.fsdp) cannot be captured")
                if problems and cfg.train.cuda_graph == "true":
                    raise ValueError(
                        "train.cuda_graph=true cannot be used here: "
                        + "; ".join(problems)
                        + ". Set train.cuda_graph=false (or auto: on only where it can be)."
                    )
                self._graph = None if problems else GraphedStep(self)
            # Last, once the run can start: a run that cannot (a missing tokenizer, a refused resume) leaves no run
            # directory behind, and an existing run's config.yaml alone. The config holds the values this run resolved
            # (a window sized from the store).
            if self.dist.is_main:
                if cfg.checkpoint.dir:  # one that cannot be made (under a file) stopped the run at its first save
                    self.ckpt_dir.mkdir(parents=True, exist_ok=True)
                self.run_dir.mkdir(parents=True, exist_ok=True)
                lock_run_dir(self.run_dir)  # a new directory: another run that made it meanwhile holds it
                if cfg.logging.tensorboard:
                    from cookmind.train.callbacks import TensorBoardCallback

                    self.callbacks.append(  # a resumed run hides the interrupted run's events after its step
                        TensorBoardCallback(
                            self.run_dir / "tensorboard", cfg.logging.log_every, purge_step=self.step + 1
                        )
                    )
                cfg.save(self.run_dir / "config.yaml")
                self._say_if_warmup_outlasts_the_run()

    def _say_if_warmup_outlasts_the_run(self) -> None:
        """A line where ``optim.warmup_steps`` is not below ``train.max_steps``: the learning rate rises through the
        whole run and never decays (nor, past max_steps, reaches optim.lr)."""
        o, steps = self.cfg.optim, self.cfg.train.max_steps
        if not o.warmup_steps or o.warmup_steps < steps:
            return
        decays = " and never decays" if o.schedule != "constant" else ""
        _note(
            f"optim.warmup_steps={o.warmup_steps} is not below train.max_steps={steps}: the learning rate rises "
            f"through the whole run (to {self.lr_at(steps - 1):.3g} at its last step, of optim.lr={o.lr:g}){decays}; "
            "lower optim.warmup_steps (a few percent of the steps is usual) or raise train.max_steps"
        )

    def _check_ranks_read_the_same_data(self) -> None:
        """Every rank must read the same stores: nodes whose store at the configured path held other data trained
        apart without a word (only rank 0's was recorded in the checkpoints). Every rank raises alike."""
        prints = {f"the {role} store at {s['path']}": s["fingerprint"] for role, s in self.data_stores.items()}
        if diff := differences_from_rank0(prints, self.dist):
            raise ValueError(
                f"the ranks read different data: {'; '.join(diff[:2])} (its fingerprint). Give every node the same "
                "store: copy it to the same path on each node, or keep it on a filesystem they share"
            )

    def _master_weights(self) -> dict:
        """Make the model's parameters bf16 with fp32 masters (``train.master_weights``); with gradient accumulation
        their gradients add up in fp32 buffers. Returns {parameter: master} for the optimizer."""
        from cookmind.optim.master_weights import accumulate_grads_in_fp32, to_bf16_with_masters

        accum = self.cfg.train.grad_accum_steps
        masters = to_bf16_with_masters(self.bare_model)
        if accum > 1:
            accumulate_grads_in_fp32(list(masters))
            # data-parallel: the fp32 buffers hold the step's gradients and .grad is emptied after each
            # micro-batch, so DDP skips every micro-batch's all-reduce and the buffers are averaged after the last
            self._reduce_fp32_grads = self.dist.world_size > 1
        return masters

    def _plain_weights(self) -> None:
        """Without ``train.master_weights`` the trained parameters are fp32 (autocast casts them for each step). A
        model that arrives in bf16 or fp16 (a Hugging Face folder stored so, or a model an earlier master-weights
        Trainer made bf16) has its trained parameters made fp32, with a line saying so: in bf16 an update below
        1/256 of a weight is lost. Frozen ones (a LoRA base) keep their dtype. An earlier Trainer's
        fp32-accumulation hooks, which would take each gradient away from this optimizer, come off."""
        from cookmind.optim.master_weights import release_fp32_accumulation

        params = [p for p in dict.fromkeys(self.bare_model.parameters()) if p.requires_grad]
        release_fp32_accumulation(params)
        low = [p for p in params if p.is_floating_point() and p.dtype != torch.float32]
        if low:
            dtypes = ", ".join(sorted({str(p.dtype).removeprefix("torch.") for p in low}))
            n = sum(p.numel() for p in low)
            for p in low:
                p.data = p.data.float()
            if self.dist.is_main:
                _note(
                    f"{len(low)} trained parameters ({n / 1e6:.1f}M) arrived as {dtypes} and train "
                    "as float32 under autocast (train.master_weights=true keeps them bf16 with fp32 masters)"
                )

    def _fp32_weights_in_place(self) -> contextlib.AbstractContextManager:
        """Around a save or a load: the model's parameters hold their fp32 masters (``train.master_weights``), so
        the checkpoint's model.safetensors has fp32 weights; a no-op otherwise."""
        model_params = getattr(self.optimizer, "model_params", None)
        if not model_params:
            return contextlib.nullcontext()
        from cookmind.optim.master_weights import masters_in_place

        return masters_in_place(self.bare_model, model_params)

    # -- data -------------------------------------------------------------------------------

    def _loaded_context(self) -> int | None:
        """The context (max_position_embeddings) of the model an --init-from run loaded, which it cannot change;
        None for a fresh model, whose context a window's advice may raise."""
        if not self.cfg.train.init_from:
            return None
        return getattr(getattr(self.bare_model, "config", None), "max_position_embeddings", None)

    def _loader(self, dataset, path: str | None, shuffle: bool, train: bool):
        from cookmind.data import build_dataloader

        if dataset is None:
            if path is None:
                if train and not hasattr(self.objective, "next_batch"):
                    raise ValueError(
                        f"no training data: pass {setting('data.train_path')} (a token store; for grpo also "
                        "grpo.problems) or give the Trainer a train_dataset"
                    )
                return None
            dataset = B.build_dataset(
                self.cfg, path, self.train_type, self.tokenizer, "data.train_path" if train else "data.val_path"
            )
        store = getattr(dataset, "store", None)
        if hasattr(store, "fingerprint"):  # recorded in each checkpoint: a resume continues on the same data
            where = str(path) if path is not None else str(store.path)
            self.data_stores["train" if train else "val"] = {"path": where, "fingerprint": store.fingerprint()}
        self._report_truncation(dataset, train)
        if train and len(dataset) < self.cfg.train.micro_batch_size * self.dist.world_size:
            self._check_resume_store()  # another store than the resume's: say that, not what would not fit
        if len(dataset) == 0:
            what = "training" if train else "validation"
            if getattr(dataset, "num_tokens", None) is not None:  # seq
                raise ValueError(
                    f"the {what} store at {path} holds {dataset.num_tokens:,} tokens, fewer than one window of "
                    f"data.window_size={self.cfg.data.window_size}: lower data.window_size, or pack more text"
                )
            if dropped := getattr(dataset, "num_dropped", 0):  # the window dropped them all: it is too short
                window, max_pos = self.cfg.data.window_size, self._loaded_context()
                advice = (  # a loaded model fixes its context: a window of all of it can grow no further
                    f"data.window_size={window} is already the whole context, max_position_embeddings={max_pos}, of "
                    f"the model at {setting('train.init_from')}: pack records whose answers start within it, or "
                    "start from a model with a longer context"
                    if max_pos is not None and window >= max_pos
                    else "raise data.window_size"
                )
                raise ValueError(
                    f"the {what} dataset at {path} holds nothing to train on: every one of its {dropped} records was "
                    f"dropped at data.window_size={window} ({_drop_reasons(dataset)}): {advice}"
                )
            raise ValueError(f"the {what} dataset at {path} holds no records: pack some into it")
        world = self.dist.world_size if train else 1
        rank = self.dist.rank if train else 0
        pad = self.tokenizer.pad_id if self.tokenizer is not None else 0
        loader = build_dataloader(
            dataset,
            self.train_type,
            self.cfg.train.micro_batch_size,
            pad,
            num_replicas=world,
            rank=rank,
            shuffle=shuffle,
            seed=self.cfg.train.seed,
            drop_last=train,
            num_workers=self.cfg.data.num_workers if train else 0,
            pin_memory=self.device.type == "cuda",
        )
        if train and len(dataset) < self._global_batch():
            micro, accum = self.cfg.train.micro_batch_size, self.cfg.train.grad_accum_steps
            raise ValueError(
                f"the training set ({len(dataset)} items) is smaller than one global batch ({self._global_batch()}: "
                f"train.micro_batch_size={micro} x train.grad_accum_steps={accum} x {world} processes); lower "
                "train.micro_batch_size or train.grad_accum_steps, or pack more data"
            )
        if train:
            self._say_what_an_epoch_leaves_out(len(dataset), shuffle)
        if not train:  # each evaluation scores the first eval.max_batches batches: say so when that is not all
            scored, limit = min(len(loader), self.cfg.eval.max_batches), self.cfg.eval.max_batches
            self.summary_stats.update(val_data_batches=len(loader), val_data_batches_scored=scored)
            if scored < len(loader) and self.dist.is_main:
                _note(
                    f"each evaluation scores the first {scored} of the {len(loader)} validation "
                    f"batches (eval.max_batches={limit}); raise it to score them all"
                )
        # A private generator: creating a loader iterator must not draw from the global RNG (exact resume).
        loader.loader.generator = torch.Generator()
        return loader

    def _say_what_an_epoch_leaves_out(self, items: int, shuffle: bool) -> None:
        """An epoch ends where fewer than a global batch of items are left (``_next_batch``): where the run goes past
        one, say how many each leaves out; with data.shuffle=false the same last ones, never trained (a warning)."""
        batch = self._global_batch()
        steps, left = divmod(items, batch)
        if not left or self.cfg.train.max_steps <= steps or not self.dist.is_main:
            return
        what = {"seq": "windows", "grpo": "prompts"}.get(self.train_type, "records")
        verb = "is" if left == 1 else "are"
        if shuffle:
            _note(f"an epoch is {steps} steps of {batch} {what}: {left} of the {items} {verb} left out of each (others "
                  "each epoch)")  # fmt: skip
            return
        import warnings

        warnings.warn(
            f"data.shuffle=false: the last {left} of the {items} training {what} {verb} never trained: an epoch is "
            f"{steps} steps of {batch} (train.micro_batch_size x train.grad_accum_steps x processes) and ends where "
            f"fewer are left; set data.shuffle=true, or a global batch that divides {items}",
            stacklevel=4,
        )

    def _warn_if_validating_on_training_data(self) -> None:
        """A validation store with the training store's fingerprint (the same store, or a copy) measures the fit to
        the training data, not to held-out text: say so, naming both."""
        train, val = self.data_stores.get("train"), self.data_stores.get("val")
        if train and val and train["fingerprint"] == val["fingerprint"] and self.dist.is_main:
            import warnings

            warnings.warn(
                f"the validation store {val['path']} holds the training data ({train['path']}, the same fingerprint): "
                "its loss measures the fit to what the model trains on, not to held-out text; pack a split with "
                "`cookmind pack --val-fraction F --val-out DIR` and pass DIR as --val-data",
                stacklevel=3,
            )

    def _report_truncation(self, dataset, train: bool = True) -> None:
        """Count, print and keep (for metrics and report.md) the records the window cut short or dropped; those of
        the validation store under ``val_`` keys (its loss is then taken over other text than the user gave)."""
        if getattr(dataset, "num_unused", None) is not None:
            self._report_unused(dataset, train)
            return
        truncated, dropped = getattr(dataset, "num_truncated", None), getattr(dataset, "num_dropped", None)
        if dropped is None:
            return
        total = len(dataset.store) if hasattr(dataset, "store") else len(dataset) + dropped
        data, key = ("data", "data_") if train else ("validation data", "val_data_")
        if truncated is None:  # grpo: a prompt is never cut, only dropped
            stats = {"records": total, "dropped": dropped}
            line = (
                f"{self.train_type} {data}: {total} prompts; {dropped} leave no room for an answer in "
                f"data.window_size={self.cfg.data.window_size} and are dropped (a cut prompt would ask another "
                "question)"
            )
        else:
            stats = {"records": total, "truncated": truncated, "dropped": dropped}
            line = (
                f"{self.train_type} {data}: {total} records; {truncated} truncated to data.window_size="
                f"{self.cfg.data.window_size} and {dropped} dropped ({_drop_reasons(dataset)})"
            )
        self.data_stats.update({key + k: v for k, v in stats.items()})
        if not self.dist.is_main:
            return
        share = ((truncated or 0) + dropped) / max(total, 1)
        _note(line)
        if share > TRUNCATION_WARN:
            import warnings

            if train:
                lose, never, rarely = "loses", "never trains", "the model will rarely see"
            else:  # validation records never train: they are scored cut, or not at all
                lose, never, rarely = "is scored without", "is never evaluated", "the validation loss will rarely cover"
            what = (
                f"prompts are dropped: they {'never train' if train else 'are never evaluated'}"
                if truncated is None
                else f"records ({truncated + dropped} of {total}) are cut short or dropped: a cut one {lose} the end "
                f"of its answer and its end of turn, a dropped one {never}"
                + (f"; {rarely} a whole answer or its end of turn" if share > 0.5 else "")
            )
            max_pos = self._loaded_context()
            window = self.cfg.data.window_size
            if max_pos is not None and window >= max_pos:
                advice = (  # the loaded model fixes its context: raising it is refused
                    f"The window is already the whole context, max_position_embeddings={max_pos}, of the model at "
                    f"{setting('train.init_from')}: leave the longest records out of the data you pack (pack "
                    f"keeps each record whole), or start from a model with a longer context."
                )
            elif max_pos is not None:  # room below the context the loaded model fixes
                longest = _longest_record(dataset)
                fits = f" (the longest record holds {longest} tokens)" if longest is not None else ""
                advice = (
                    f"Raise data.window_size={window} up to {min(longest or max_pos, max_pos)}{fits}: the model at "
                    f"{setting('train.init_from')} fixes its context, max_position_embeddings={max_pos}, so the "
                    "window can grow to it and no further; or leave the longest records out of the data you pack "
                    "(pack keeps each record whole)."
                )
            else:
                advice = (
                    "Raise data.window_size (and the model's max_position_embeddings), or leave the longest records "
                    "out of the data you pack (pack keeps each record whole)."
                )
            split = "" if train else "validation "
            warnings.warn(f"{share:.1%} of the {self.train_type} {split}{what}. {advice}", stacklevel=3)

    def _report_unused(self, dataset, train: bool = True) -> None:
        """seq: count, print and keep the store's tokens that lie in no window (the tail after the last one, and the
        gaps between windows when data.stride > data.window_size): they never train, or never count in the
        validation loss."""
        if len(dataset) == 0:  # _loader's error says the store is shorter than one window
            return
        total, unused, windows = dataset.num_tokens, dataset.num_unused, len(dataset)
        data, key = ("data", "data_") if train else ("validation data", "val_data_")
        self.summary_stats.update({key + "tokens": total, key + "windows": windows, key + "tokens_unused": unused})
        if not self.dist.is_main:
            return
        window, stride = self.cfg.data.window_size, self.cfg.data.stride
        share = unused / max(total, 1)
        _note(
            f"{self.train_type} {data}: {total:,} tokens in {windows:,} windows of "
            f"data.window_size={window}"
            + (f" every data.stride={stride}" if stride is not None else "")
            + f"; {unused:,} ({share:.1%}) in no window, never {'trained on' if train else 'evaluated'}"
        )
        if share > TRUNCATION_WARN:
            import warnings

            advice = (
                f"Lower data.stride to at most data.window_size={window}"
                if stride is not None and stride > window
                else "Lower data.window_size, or pack more text"
            )
            split = "" if train else "validation "
            warnings.warn(
                f"{share:.1%} of the {self.train_type} {split}data's tokens lie in no window. {advice}.", stacklevel=3
            )

    def _next_batch(self) -> dict[str, Any]:
        if hasattr(self.objective, "next_batch"):
            return self.objective.next_batch(self)
        s, accum = self.train_loader.sampler, self.cfg.train.grad_accum_steps
        if self._micros_taken % accum == 0 and s.num_samples_total - s.consumed < self._global_batch():
            # An epoch ends where fewer items than a global batch are left (they are dropped), at a step's first
            # micro-batch: every split of the global batch (micro-batches x accumulation x processes) reads the
            # same items in the same steps, so a run resumed at another world size goes on as it would have. Ended
            # per micro-batch per rank, one process accumulating two micro-batches began the next epoch a
            # micro-batch sooner than two processes did.
            s.set_epoch(s.epoch + 1)
            self._iter = None
        self._micros_taken += 1
        if self._iter is None:
            self._iter = iter(self.train_loader)
        return next(self._iter)

    def _global_batch(self) -> int:
        return self.cfg.train.micro_batch_size * self.cfg.train.grad_accum_steps * self.dist.world_size

    def _take_batch(self) -> dict[str, Any]:
        """The next micro-batch on the device: one prefetched at the end of the last step, if any."""
        if self._prefetched:
            batch = self._prefetched.pop(0)
            if not self._prefetched:
                self._sampler_before_prefetch = None
            return batch
        return self._to_device(self._next_batch())

    def _prefetch_batch(self, step: int) -> None:
        """Load step ``step``'s micro-batches (all ``train.grad_accum_steps`` of them) while the GPU still computes
        the step before; none past ``train.max_steps`` (no step would train them).

        All of them before the step's first forward: with several ranks, one that cannot load one (an I/O error on
        its node) holds its error (``_on_this_rank``) until the stop signal that follows the step, and goes through
        the step's collectives with the others. Loaded between the micro-batches, it raised between their
        collectives (DDP's gradient all-reduce, FSDP's gathers), and the others died there in gloo's "Connection
        closed by peer" traceback or waited until NCCL's timeout. No collective is added to the step.

        The sampler moves on by a step's batches; checkpoints save its position from before (the prefetched
        batches are not trained yet), so a resumed run draws exactly those batches next. Objectives that make
        their own batches (GRPO's rollouts need the updated policy) are not prefetched.
        """
        if (
            step > self.cfg.train.max_steps
            or self._prefetched
            or self.train_loader is None
            or hasattr(self.objective, "next_batch")
        ):
            return
        self._sampler_before_prefetch = self.train_loader.state_dict()
        for _ in range(self.cfg.train.grad_accum_steps):
            self._prefetched.append(self._to_device(self._next_batch()))

    def _sampler_state(self) -> dict | None:
        if self.train_loader is None:
            return None
        if self._prefetched:
            return self._sampler_before_prefetch
        return self.train_loader.state_dict()

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        nb = self.device.type == "cuda"
        return {k: v.to(self.device, non_blocking=nb) if torch.is_tensor(v) else v for k, v in batch.items()}

    # -- the loop ---------------------------------------------------------------------------

    def lr_at(self, step: int, cfg: TrainConfig | None = None) -> float:
        """Learning rate for 0-based optimizer step ``step``: linear warmup then cosine to min_lr_ratio * lr (under
        ``cfg``'s schedule settings, this run's by default)."""
        from cookmind.optim import cosine_with_warmup

        cfg = cfg or self.cfg
        o = cfg.optim
        if o.schedule == "constant":
            return o.lr * min(1.0, (step + 1) / o.warmup_steps) if o.warmup_steps else o.lr
        return cosine_with_warmup(step, o.lr, o.warmup_steps, cfg.train.max_steps, o.lr * o.min_lr_ratio)

    def request_stop(self, reason: str = "requested") -> None:
        """Stop after the current step, saving a checkpoint first."""
        self._stop_reason = reason

    def _stop_on_any_rank(self) -> bool:
        """Whether any rank was asked to stop (one small all-reduce a step). A rank that was not takes the reason
        of one that was: a SIGTERM that reached one node stops every rank by that signal (each exits 128 + N, rank
        0 says so), where rank 0 said "stopped by a stop request" and exited 3. A rank that failed at its own work
        of the step (``_on_this_rank``) says so in the same all-reduce, and every rank raises with its reason."""
        reason = self._stop_reason
        if not self.dist.enabled:
            return reason is not None
        mine = 0 if reason is None else 1  # 1: request_stop's own words, which stay on their rank
        if reason is not None and reason.startswith("signal "):
            mine = int(getattr(signal, reason.removeprefix("signal "), 1))
        if self._failed is not None:
            mine = _FAILED
        _, code = self._max_over_ranks(mine)
        if code == _FAILED:
            self._raise_held()
        if code and reason is None:
            self._stop_reason = f"signal {signal.Signals(code).name}" if code > 1 else "a stop request on another rank"
        return code > 0

    @contextlib.contextmanager
    def _on_this_rank(self, what: str, cb: Callback | None = None, hook: str = ""):
        """Host work of the loop that runs no collective and that one rank may fail at while the others go on (rank
        0's row of metrics.jsonl, loading the next batch, a hook of a callback that ``runs_no_collective``). With
        several ranks its error is held: the rank goes on through the step's collectives, and the next stop signal
        (``_stop_on_any_rank``; at the end ``_stop_if_any_rank_failed``) stops every rank, this one with its own
        error, the others with "rank R (on HOST) could not WHAT (CALLBACK.HOOK): reason". The rank that raised alone
        left the others to die in their next collective with gloo's "Connection closed by peer" traceback, or to
        wait in it until NCCL's timeout. Work that holds a collective must not be held: the rank would go on to the
        stop signal while the others wait in that collective, and the two would pair. One process: raised at once,
        as ever."""
        if not self.dist.enabled:
            yield
            return
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - held, and raised on every rank at the next stop signal
            if self._failed is None:  # the first is the one said
                self._failed = (what if cb is None else f"{what} ({type(cb).__name__}.{hook})", exc)

    def _hooks(self, hook: str, what: str, *args) -> None:
        """Every callback's ``hook(self, *args)``. With several ranks, a callback that ``runs_no_collective`` through
        ``_on_this_rank``: where it fails on one rank, the others still run the step's hooks and collectives, and
        every rank stops with its reason at the step's end. Any other callback's error is raised at once, as from
        any code: its hook may take part in collectives (an evaluation, a save, a user's all-reduce) that a held
        rank would leave the others waiting in."""
        for cb in self.callbacks:
            if self.dist.enabled and getattr(cb, "runs_no_collective", False):
                with self._on_this_rank(what, cb, hook):
                    getattr(cb, hook)(self, *args)
            else:
                getattr(cb, hook)(self, *args)

    def _raise_held(self) -> None:
        """Every rank: raise the failure any rank holds (``raise_together``; a no-op where none does)."""
        failure, self._failed = self._failed, None
        raise_together(self.dist, failure)

    def _stop_if_any_rank_failed(self) -> None:
        """Where no step's stop signal follows (the start, the last step, the end): one small all-reduce, and every
        rank raises if any rank holds a failure."""
        if self.dist.enabled:
            _, failed = self._max_over_ranks(int(self._failed is not None))
            if failed:
                self._raise_held()

    def _max_over_ranks(self, mine: int) -> tuple[int, int]:
        """``min_max_over_ranks`` for the stop signals. Where it fails (another rank is gone: killed, out of memory)
        while this rank holds a failure of its own, that failure is the error this rank says."""
        try:
            return min_max_over_ranks(mine, self.dist)
        except Exception:
            if self._failed is not None:
                raise self._failed[1]  # noqa: B904 - the collective's error stays its context
            raise

    @property
    def stop_reason(self) -> str | None:
        """Why the run was asked to stop (``"signal SIGTERM"``, ...), or None."""
        return self._stop_reason

    def close(self) -> None:
        """Drop the parallel wrappers around the model before the process group is left. DDP's reducer holds the
        group: freed after it, the reducer would free the group in its own destructor, which joins gloo's worker
        threads while holding the GIL, and a worker still freeing its last collective's tensors waits for the GIL:
        a hang at exit. Freed here, the group's last reference is its registry's, and leaving the group releases
        the GIL while it waits. The model itself (``bare_model``) stays."""
        import gc

        self.model, self._sharded = self.bare_model, None
        gc.collect()
        release_run_dir(self.run_dir)

    def fit(self) -> dict[str, Any]:
        """Train to ``train.max_steps`` (or a stop); returns a summary dict."""
        cfg = self.cfg
        old_handlers = self._install_signal_handlers()
        t_start = time.perf_counter()
        start_step = self.step  # a resumed run's: its summary's seconds are this attempt's, from this step on
        status = "completed"
        if self._rng_to_restore is not None:
            restore_rng(self._rng_to_restore)  # last, after everything that draws at start-up
            self._rng_to_restore = None
        self._failed = None
        self._fit_raised = False
        self.deferred_steps, self._last_step_end = 0, None
        self._trainable = None  # the parameters that train, listed again at each fit (once per run)
        behind: _QueuedStep | None = None  # a step queued but not read yet: read once the next one is queued
        # The handlers stay until fit returns: a second SIGTERM waits for the stop's checkpoint, a second Ctrl-C
        # stops at once (the checkpoint's temporary directory is removed, never left under its name), and a signal
        # after the last step leaves the run to complete (its checkpoint, final evaluation and report).
        try:
            try:
                if self.data_stats and self.step == 0:  # a resume trains on the same stores: their row is logged once
                    with self._on_this_rank("begin training (metrics.jsonl)"):
                        self.metrics_writer.write({"step": self.step, "split": "data", **self.data_stats})
                self._hooks("on_train_begin", "begin training")
                with self._on_this_rank(f"load a batch of step {self.step + 1}"):  # before the step's collectives
                    self._prefetch_batch(self.step + 1)
                self._stop_if_any_rank_failed()
                while self.step < cfg.train.max_steps:
                    queued = self._launch_step()
                    if behind is not None:
                        done, behind = behind, None
                        self._end_step(done)
                    if self._may_defer(queued.step):
                        behind = queued
                        self.deferred_steps += 1
                    else:
                        self._end_step(queued)
                    # A deferred step never ends a run (see _may_defer), so these see the same counts as without one.
                    if self.consecutive_bad > cfg.train.max_bad_steps:
                        status = "diverged"
                        break
                    # No step is queued after a stop (a signal, request_stop, another rank's) is seen here; after
                    # the last step there is none to stop: the run completes (every rank sees the same step).
                    if self.step < cfg.train.max_steps and self._stop_on_any_rank():
                        status = "stopped"
                        break
                if behind is not None:  # stopped with the last queued step unread
                    done, behind = behind, None
                    self._end_step(done)
                self._stop_if_any_rank_failed()  # at the last step (or the stop) no step's stop signal followed
            except BaseException as exc:
                if behind is not None:  # keep that step's metrics row if its stats can still be read
                    with contextlib.suppress(Exception):  # the error being raised is the one to report
                        self._end_step(behind)
                for cb in self.callbacks:
                    with contextlib.suppress(Exception):
                        cb.on_train_error(self, exc)
                raise
            if status == "diverged":
                self.save_checkpoint(diverged=True)
            elif self.last_saved_step != self.step:
                self.save_checkpoint()
            if self._sharded is not None:
                self._sharded.wait()  # an async save completes before the run ends
            self._hooks("on_train_end", "end training", status)
            self._stop_if_any_rank_failed()
            if self.last_eval_step == self.step == self.last_saved_step and self._saved_eval_step != self.step:
                with stop_together(self.dist, f"record the final evaluation in {checkpoint_name(self.step)}"):
                    self._record_final_eval()
            summary = {
                "status": status,
                "steps": self.step,
                "tokens": self.tokens_seen,
                "skipped_steps": self.skipped_steps,
                "seconds": round(time.perf_counter() - t_start, 2),
                # the steps before it trained in an earlier attempt: their time is not in "seconds"
                **({"resumed_from_step": start_step} if start_step else {}),
                # what the "auto" settings decided for this run (train.master_weights, train.cuda_graph)
                "master_weights": self.master_weights,
                "cuda_graph": self._graph is not None and self._graph.replays > 0,
                **self.data_stats,
                **self.summary_stats,
                **recent_means(self._recent_metrics),
                **self.last_eval,
            }
            # rank 0 writes the report; one it cannot write stops every rank with its reason (the all-gather is the
            # barrier that kept the others from leaving the group while rank 0 still wrote)
            with stop_together(self.dist, "write the report"):
                if self.dist.is_main and cfg.logging.report:
                    from cookmind.train.report import write_report

                    # the checkpoints' reports read metrics.jsonl up to their step: this one reads what came since
                    kept = next((cb.series for cb in self.callbacks if isinstance(cb, ReportCallback)), None)
                    write_report(
                        self.run_dir, f"cookmind {cfg.train.objective} run", summary, self.samples, cfg.to_dict(),
                        getattr(self.objective, "count_metrics", ()), kept,
                    )  # fmt: skip
                release_run_dir(self.run_dir)  # its last write is done: the run directory is free for the next run
        except BaseException:
            self._fit_raised = True  # a signal from here on finds the run ending on its error (the handler)
            raise
        finally:
            self._restore_signal_handlers(old_handlers)
        if status == "diverged":
            good = find_latest_checkpoint(self.ckpt_dir) if self.dist.is_main else None
            raise TrainingDiverged(
                f"{self.consecutive_bad} consecutive steps had a non-finite or exploding loss (limit "
                f"train.max_bad_steps={cfg.train.max_bad_steps}); stopped at step {self.step} (saved, marked "
                f"diverged); last good checkpoint: {good or 'none'}. Lower optim.lr, use precision=bf16/fp32, "
                f"or check the data."
            )
        return summary

    def _may_defer(self, step: int) -> bool:
        """Whether step ``step`` (just queued) may be read after step ``step + 1`` is queued.

        Only where the device decides the skip (nothing about step ``step + 1`` depends on step ``step``'s
        numbers on the host), never at the last step, never where a callback must see the state at this step
        (a checkpoint, an evaluation, a callback that does not say otherwise), and never when this step could
        be the one that ends a diverging run: ``consecutive_bad`` counts up to step ``step - 1`` here, and only
        past ``max_bad_steps`` does the run stop, so the stop comes at the same step as without deferral.
        The answer depends on the step number, the config, the callbacks and ``consecutive_bad``, which every
        rank shares (the norm is of the all-reduced gradients; the divergence stop relies on that already), so
        all ranks queue their collectives in the same order.

        A ``needs_state_at`` that raises on one rank of several counts as True there (as a callback that does not
        say otherwise), and its error is held (``_on_this_rank``): the step's stop signal stops every rank with it.
        Raised at once, it left the others in the next step's collectives.
        """
        if not (self.cfg.train.defer_metrics and self._skip_on_device) or step >= self.cfg.train.max_steps:
            return False
        if self.consecutive_bad >= self.cfg.train.max_bad_steps:
            return False
        if not self.dist.enabled:
            return not any(cb.needs_state_at(self, step) for cb in self.callbacks)
        for cb in self.callbacks:
            needs = True
            with self._on_this_rank(f"end step {step}", cb, "needs_state_at"):
                needs = cb.needs_state_at(self, step)
            if needs:
                return False
        return True

    def _end_step(self, queued: _QueuedStep) -> None:
        """Read a queued step's stats, count it and run the callbacks' ``on_step_end`` for it."""
        metrics = self._read_step(queued)
        self._recent_metrics.append(metrics)
        self._hooks("on_step_end", f"end step {queued.step}", queued.step, metrics)

    def _launch_step(self) -> _QueuedStep:
        """Queue optimizer step ``self.step + 1`` (micro-batches, clip, update, next batch's prefetch).

        With the device-side skip nothing here waits for the GPU: the stats are copied to pinned memory behind
        the step and read later (``_read_step``). Otherwise the host reads them here to decide the update.
        With ``train.cuda_graph`` the step after the warm-up ones is captured once and then replayed.
        """
        cfg = self.cfg
        accum = cfg.train.grad_accum_steps
        t0 = time.perf_counter()
        self._hooks("on_step_begin", f"begin step {self.step + 1}", self.step + 1)
        if not (self.model.training and self.bare_model.training):  # .train() walks every module: only if needed
            self.model.train()
        if self._trainable is None:  # walking the module tree each step costs the host ~0.5 ms on 8 layers
            self._trainable = [p for p in self.bare_model.parameters() if p.requires_grad]
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        out = None
        if self._graph is not None and self._graph.wants_step():
            batches = [self._take_batch() for _ in range(accum)]
            out = self._graph.run(batches)  # None: this batch does not fit the captured shapes; run it eagerly
            if out is None:
                self.optimizer.zero_grad(set_to_none=True)  # the graph's gradients must not accumulate into it
                out = self._step_body(batches.__getitem__)
            else:
                for micro, (loss, m) in enumerate(out.micro_outputs):
                    self._hooks(
                        "on_micro_batch_end", f"end micro-batch {micro} of step {self.step + 1}", micro, loss, m
                    )
        else:
            out = self._step_body(lambda micro: self._take_batch())
        with self._on_this_rank(f"load a batch of step {self.step + 2}"):  # the stop signal below says it
            self._prefetch_batch(self.step + 2)
        readout = out.readout
        ready = None
        if self._skip_on_device and readout.device.type == "cuda":
            host = torch.empty(readout.shape, dtype=readout.dtype, pin_memory=True)
            host.copy_(readout, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            readout = host
        queued = _QueuedStep(
            step=self.step + 1,
            t_launch=t0,
            lr=lr,
            step_tokens=out.tokens,
            readout=readout,
            slots=out.slots,
            sums=out.sums,
            token_slot=out.token_slot,
            ready=ready,
        )
        if not self._skip_on_device:
            loss_val, norm_val = self._stats(queued)[:2]  # the one host sync of the step
            if self.scaler is not None:
                # fp16: the scaler skips steps with inf/nan gradients itself (and lowers its scale).
                self.scaler.step(self.optimizer)
                self.scaler.update()
            elif math.isfinite(loss_val) and math.isfinite(norm_val):
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step = queued.step
        queued.t_queued = time.perf_counter()
        return queued

    def _step_body(self, take_batch, in_graph: bool = False) -> StepOutputs:
        """The GPU work of one optimizer step: micro-batches' forward and backward, clip, and (where the device
        decides the skip) the update. ``take_batch(micro)`` gives micro-batch ``micro``.

        Shared by the eager path and the CUDA-graph capture (``in_graph``), where the host-side parts behave
        differently: callbacks see each micro-batch after a replay instead, and the gradients are not set to
        None (the graph rewrites the same memory each replay).
        """
        cfg = self.cfg
        accum = cfg.train.grad_accum_steps
        loss_sum = torch.zeros((), device=self.device)
        sums: dict[str, Any] = {}
        tokens = 0
        micro_outputs = []
        weights = self._micro_weights(take_batch) if self.objective.token_mean_loss else None
        for micro in range(accum):
            if weights is None:
                with torch.no_grad():
                    batch = self.objective.prepare(self.model, take_batch(micro))
            else:
                batch = weights[micro][0]  # prepared already
            tokens += self.objective.num_tokens(batch)
            with no_sync(self.model, sync=micro == accum - 1 and not self._reduce_fp32_grads):
                with autocast_context(cfg.train.precision, self.device):
                    loss, m = self.objective(self.model, batch)
                # the mean over micro-batches, each contributing 1/accum, or its share of the global batch's tokens
                scaled = loss / accum if weights is None else loss * weights[micro][1]
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            # summed so that the mean over ranks, over accum, is the step's loss
            loss_sum = loss_sum + (loss.detach().float() if weights is None else scaled.detach().float() * accum)
            for k, v in m.items():
                if k != "loss":
                    sums[k] = sums.get(k, 0.0) + (v.detach().float() if torch.is_tensor(v) else v)
            if in_graph:
                micro_outputs.append((loss.detach(), m))
            else:
                self._hooks("on_micro_batch_end", f"end micro-batch {micro} of step {self.step + 1}", micro, loss, m)
        finish_gradient_sync(self.model)
        # the step's loss and the objective's metrics over every rank's rows, as the gradients are: rank 0 logged its
        # own rows' (a DPO reward accuracy of its half of the batch, SFT's supervised tokens halved), and a rank whose
        # loss alone was not finite would skip a step the others took. One collective for them all, which also sums
        # the ranks' token counts: each rank pads its own batches (SFT, DPO) or rolls out its own lengths (GRPO), and
        # the step's tokens were rank 0's count times the ranks. In float64, where the sum of the counts is exact (any
        # integer below 2**53; float32's stop at 2**24), read with the loss: no wait for the device here.
        names = [k for k, v in sums.items() if torch.is_tensor(v)] if self.dist.enabled else []
        together = torch.stack(
            [loss_sum, *((sums[k] if sums[k].numel() == 1 else sums[k].mean()).reshape(()).float() for k in names)]
        )
        step_tokens = None
        if self.dist.enabled:
            mine = torch.tensor([tokens], dtype=torch.float64).to(self.device, non_blocking=True)
            together = sum_over_ranks(torch.cat([together.double(), mine]), self.dist)
            step_tokens, together = together[-1:], together[:-1].float()
        world = self.dist.world_size
        loss_sum = together[0] / world if self.dist.enabled else together[0]
        counts = set(getattr(self.objective, "count_metrics", ()))  # sums over the rows, not means
        for i, k in enumerate(names, 1):
            sums[k] = together[i] if k in counts else together[i] / world
        if self._reduce_fp32_grads:
            from cookmind.optim.master_weights import all_reduce_fp32_grads

            all_reduce_fp32_grads(self._trainable, getattr(self.model, "process_group", None))
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        from cookmind.optim import clip_divisor, clip_grad_norm, global_grad_norm
        from cookmind.parallel.fsdp import plain

        max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
        divisor = None
        if self._skip_on_device:  # fused AdamW clips as it reads the gradients: no separate pass over them
            grad_norm = plain(global_grad_norm(self._trainable)).to(self.device)  # FSDP: the norm over all shards
            divisor = clip_divisor(grad_norm, max_norm)
        else:
            grad_norm = plain(clip_grad_norm(self._trainable, max_norm))
        stats = torch.stack([loss_sum / accum, grad_norm.float().to(self.device)])
        if self._skip_on_device:
            # The optimizer reads "skip" from the device: nothing here waits for the GPU, so the host can
            # queue the update and fetch the next batch while this step still runs (a GPU win of several %).
            self.optimizer.step(found_inf=(~torch.isfinite(stats).all()).float(), grad_divisor=divisor)
            if not in_graph:
                self.optimizer.zero_grad(set_to_none=True)
        # Tensor metrics ride along with loss and norm: one copy to the host per step, and no .item() that
        # would wait for whatever the host queued after this step. (A mean, as to_float takes of a vector.)
        slots = {k: 2 + i for i, k in enumerate(k for k, v in sums.items() if torch.is_tensor(v))}
        readout = torch.cat(
            [
                stats,
                *(
                    (v if v.numel() == 1 else v.mean()).reshape(1).to(stats.device)
                    for v in sums.values()
                    if torch.is_tensor(v)
                ),
            ]
        )
        token_slot = None
        if step_tokens is not None:
            token_slot, readout = len(readout), torch.cat([readout.double(), step_tokens.to(stats.device)])
        return StepOutputs(readout, slots, sums, tokens, micro_outputs, token_slot)

    def _micro_weights(self, take_batch) -> list[tuple[dict[str, Any], torch.Tensor]]:
        """Each micro-batch of the step, prepared, with the weight of its loss: its target tokens x world / the global
        batch's (every micro-batch of every rank; one small all-reduce). The ranks' gradients are averaged, so the
        step's gradient is that of the mean over the global batch's tokens, as one process with the whole batch
        computes it. On the device: nothing waits for it (and a CUDA graph replays it with the step)."""
        accum = self.cfg.train.grad_accum_steps
        with torch.no_grad():  # every micro-batch prepared first (GRPO's rollouts): its token count follows
            batches = [self.objective.prepare(self.model, take_batch(m)) for m in range(accum)]
        counts = torch.stack([self.objective.target_tokens(b) for b in batches]).float()
        total = counts.sum()
        if self.dist.enabled:
            total = total.clone()
            torch.distributed.all_reduce(total)
        return [(b, c * self.dist.world_size / total) for b, c in zip(batches, counts)]

    def _stats(self, queued: _QueuedStep) -> list[float]:
        """A queued step's readout as floats, waiting for the GPU to get there if it has not yet."""
        if queued.values is None:
            if queued.ready is not None:
                queued.ready.synchronize()
            queued.values = queued.readout.tolist()
            queued.t_read = time.perf_counter()
        return queued.values

    def _read_step(self, queued: _QueuedStep) -> dict[str, Any]:
        """Count a queued step as skipped or not and build its metrics row.

        A step ends when the host has both queued it and read its stats. ``step_time_s`` runs from when the host
        began to queue the step, or from the previous step's end if that was later, to this step's end: without
        deferral as before (queue, wait, update), with it the time between consecutive reads, which in steady
        state is the GPU's time per step. ``tokens_per_s`` and ``mfu`` follow from it.
        """
        values = self._stats(queued)
        loss_val, norm_val = values[0], values[1]
        # fp16: the scaler skips on inf/nan gradients; a step counts as bad on a non-finite loss.
        finite = math.isfinite(loss_val) and (self.scaler is not None or math.isfinite(norm_val))
        if not finite:  # skipped: by the device-side flag, the scaler, or not stepped in _launch_step
            self.skipped_steps += 1
            self.consecutive_bad += 1
        elif self._exploding(loss_val):  # stepped, but counts toward the divergence stop
            self.consecutive_bad += 1
        else:
            self.consecutive_bad = 0
        prev, end = self._last_step_end, max(queued.t_queued, queued.t_read)
        dt = max(end - (queued.t_launch if prev is None else max(queued.t_launch, prev)), 1e-9)
        self._last_step_end = end
        # several ranks: the sum of every rank's own count, read with the loss (one process: its own)
        tokens = queued.step_tokens if queued.token_slot is None else int(values[queued.token_slot])
        self.tokens_seen += tokens  # counted as the step is read: its checkpoint, and the summary, follow
        tps = tokens / dt
        metrics = {
            "split": "train",
            "loss": loss_val,
            "lr": queued.lr,
            "grad_norm": norm_val,
            "tokens": self.tokens_seen,
            "tokens_per_s": tps,
            "step_time_s": dt,
            "skipped_steps": self.skipped_steps,
        }
        if self.peak is not None and self.flops_per_token:
            metrics["mfu"] = tps * self.flops_per_token / (self.peak * self.dist.world_size)
        accum = self.cfg.train.grad_accum_steps
        for k, v in queued.sums.items():
            metrics[k] = (values[queued.slots[k]] if k in queued.slots else to_float(v)) / accum
        return metrics

    def _exploding(self, loss: float) -> bool:
        """Whether a finite ``loss`` exceeds ``train.diverge_loss_ratio`` x the run's best windowed mean loss
        (and that best by at least 1). Only for non-negative losses (not GRPO's); 0 turns it off."""
        ratio = self.cfg.train.diverge_loss_ratio
        if ratio <= 0 or loss < 0 or self.cfg.train.objective == "grpo":
            return False
        if self.best_loss is not None and loss > max(ratio * self.best_loss, self.best_loss + 1.0):
            return True
        self.recent_losses = (self.recent_losses + [loss])[-LOSS_WINDOW:]
        if len(self.recent_losses) == LOSS_WINDOW:
            mean = sum(self.recent_losses) / LOSS_WINDOW
            self.best_loss = mean if self.best_loss is None else min(self.best_loss, mean)
        return False

    def _flops_per_token(self) -> float | None:
        fn = getattr(self.bare_model, "flops_per_token", None)
        return float(fn(self.cfg.data.window_size)) if fn is not None else None

    # -- evaluation -------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """Validation loss (and perplexity for seq/sft) on up to ``eval.max_batches`` batches; samples.

        Without FSDP rank 0 alone evaluates. A sharded model (FSDP) computes the validation loss on every rank
        through its sharded forward (one block gathered at a time, so peak memory stays sharded), each rank
        taking every world-th batch, the sums all-reduced: every rank must call this. What needs the whole model
        on one rank (greedy samples of ``eval.prompts`` through the KV-cache engine, an objective's held-out
        generation such as GRPO's accuracy) runs on rank 0 inside ``gathered_weights`` (every rank gathers).
        The results are rank 0's ({} elsewhere).
        """
        self.last_eval_step = step
        sharded = is_sharded(self.model)
        if sharded:
            return self._evaluate(step, sharded)
        # rank 0 alone evaluates: an evaluation it cannot finish stops every rank with its reason (the others went
        # on to the next step's all-reduce and died in gloo's traceback)
        out = {}
        with stop_together(self.dist, f"evaluate at step {step}"):
            if self.dist.is_main:
                out = self._evaluate(step, sharded)
        return out

    def _evaluate(self, step: int, sharded: bool) -> dict[str, float]:
        model = self.model if sharded else unwrap(self.model, data_parallel_only=True)  # DDP's forward talks
        was_training = model.training
        model.eval()
        out = self._val_loss(model, sharded, step)
        if sharded:
            reshard_all(self.model)  # the root (and blocks without reshard_after_forward) kept theirs gathered
        if self._evaluates_whole_model():
            with gathered_weights(self.model) if sharded else contextlib.nullcontext():
                # sharded: every rank waits here while rank 0 generates, and stops with it if it fails
                with stop_together(self.dist, f"evaluate at step {step}") if sharded else contextlib.nullcontext():
                    if self.dist.is_main:
                        held_out = getattr(self.objective, "evaluate", None)
                        if held_out is not None:  # e.g. GRPO's greedy accuracy on held-out problems
                            out.update({f"val_{k}": v for k, v in held_out(self.bare_model).items()})
                        self.samples = self.generate_samples()
        if was_training:
            model.train()
        if not self.dist.is_main:
            return {}
        if out:
            self.metrics_writer.write({"step": step, "split": "val", **out})
            self.last_eval = out
        return out

    def _evaluates_whole_model(self) -> bool:
        """Whether evaluation samples text or runs an objective's own evaluation (both need the whole model)."""
        prompts = bool(self.cfg.eval.prompts) and self.tokenizer is not None
        return prompts or callable(getattr(self.objective, "evaluate", None))

    def _val_loss(self, model: torch.nn.Module, sharded: bool, step: int) -> dict[str, float]:
        """Mean loss and metrics over the first ``eval.max_batches`` validation batches: each of a sharded model's
        ranks runs every world-th batch, and a rank left without one in the last round runs the first batch again
        and drops it (its forwards are collectives: every rank runs as many).

        A sharded model's ranks read their batches (on the host) before the first forward, and agree that every
        rank could (one small all-gather per evaluation, none per batch): a rank that cannot read one (an I/O error
        on its node) stops every rank with "rank R (on HOST) could not load a validation batch at step N: reason".
        Read between the forwards, it raised alone and left the others in the next forward's gather."""
        if self.val_loader is None:
            return {}
        rank, world = (self.dist.rank, self.dist.world_size) if sharded else (0, 1)
        total = min(self.cfg.eval.max_batches, len(self.val_loader.loader))
        rounds = -(-total // world)
        sums: dict[str, float] = {}
        batches = enumerate(itertools.islice(self.val_loader.loader, total))  # read as they are run
        if world > 1:  # this rank's share (and the first batch) read before the first forward
            with stop_together(self.dist, f"load a validation batch at step {step}"):
                batches = [(i, batch) for i, batch in batches if i == 0 or i % world == rank]
        first = None
        for i, batch in batches:
            first = batch if first is None else first
            if i % world == rank:
                self._add_val_batch(model, batch, sums, 1.0)
        for _ in range(rounds - (total - rank + world - 1) // world):  # the rounds this rank had no batch in
            self._add_val_batch(model, first, sums, 0.0)
        keys = sorted(sums)
        if sharded and world > 1:
            t = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(t)
            sums = dict(zip(keys, t.tolist()))
        units = sums.pop(_VAL_UNITS, 0.0)
        if not total or not units:
            return {}
        # the mean over the set's tokens (rows for DPO), not over batches: a short last batch, or SFT batches with
        # fewer supervised tokens, weigh what they hold; counts (supervised tokens) are totals
        counts = set(getattr(self.objective, "count_metrics", ()))
        out = {"val_loss": sums.pop("loss") / units}
        if self.train_type in ("seq", "sft"):
            out["val_ppl"] = math.exp(min(out["val_loss"], 50.0))
        out.update({f"val_{k}": v if k in counts else v / units for k, v in sums.items()})
        return out

    def _add_val_batch(self, model: torch.nn.Module, batch: dict[str, Any], sums: dict[str, float], weight: float):
        """Add the batch's loss and mean metrics, times its loss units (``Objective.loss_units``), and its counts to
        ``sums``, all times ``weight`` (0 for a sharded rank's filler batch)."""
        batch = self._to_device(batch)
        with autocast_context(self.cfg.train.precision, self.device):
            loss, m = self.objective(model, batch)
        counts = set(getattr(self.objective, "count_metrics", ()))
        units = self.objective.loss_units(batch) if hasattr(self.objective, "loss_units") else 1.0
        sums[_VAL_UNITS] = sums.get(_VAL_UNITS, 0.0) + weight * units
        for k, v in {**m, "loss": loss}.items():
            scale = weight * (1.0 if k in counts else units)  # 0: a filler batch, or one with no target (its loss NaN)
            sums[k] = sums.get(k, 0.0) + (scale * float(to_float(v)) if scale else 0.0)

    def _check_sample_prompts(self, context: int | None) -> None:
        """Refuse an ``eval.prompts`` entry that fills the model's context before the run starts: its sample stopped
        the run at its first evaluation (the final one, after all the training), in generate's words."""
        if not self.cfg.eval.prompts or self.tokenizer is None or not isinstance(context, int):
            return
        chat, prompts = sample_prompt_ids(self.cfg, self.tokenizer)
        for i, (text, ids) in enumerate(zip(self.cfg.eval.prompts, prompts)):
            if len(ids) >= context:
                shown = text if len(text) <= 20 else text[:20] + "…"
                raise ValueError(
                    f"eval.prompts[{i}] ({shown!r}, {len(ids)} tokens{' with the chat template' if chat else ''}) "
                    f"fills the model's context of {context} tokens, leaving no room for its sample; shorten it or "
                    "leave it out"
                )

    def generate_samples(self) -> list[dict[str, str]]:
        """Greedy continuations of ``eval.prompts`` (chat-formatted for sft/dpo) via cookmind.infer."""
        if not self.cfg.eval.prompts or self.tokenizer is None:
            return []
        from cookmind.infer import SamplingParams, generate
        from cookmind.infer.detokenize import decode_text
        from cookmind.infer.stop import chat_stop_ids, control_token_ids, text_stop_ids

        tok = self.tokenizer
        chat, prompts = sample_prompt_ids(self.cfg, tok)
        # a chat reply ends at the first control token; a completion leaves them out of its text
        stops = chat_stop_ids(tok) if chat else text_stop_ids(tok, getattr(self.bare_model, "config", None))
        gcfg = SamplingParams(max_new_tokens=self.cfg.eval.max_new_tokens, temperature=0.0, stop_token_ids=stops)
        # the plain loop: a serving engine kept during training would hold its KV pool and graphs
        outs = generate(self.bare_model, prompts, gcfg, tokenizer=tok, engine="builtin")
        control = control_token_ids(tok)
        return [{"prompt": p, "completion": decode_text(tok, o, control)} for p, o in zip(self.cfg.eval.prompts, outs)]

    # -- checkpoints ------------------------------------------------------------------------

    def _record_final_eval(self) -> None:
        """Write the end-of-run evaluation, which runs after the final save, into that checkpoint's meta.json: a
        resume of the finished run reports it and does not evaluate (and log its row) again."""
        if self.dist.is_main:
            update_meta(self.ckpt_dir / checkpoint_name(self.step), last_eval=self.last_eval, last_eval_step=self.step)
        self._saved_eval_step = self.step

    def save_checkpoint(self, diverged: bool = False) -> Path | None:
        """Save ``<ckpt_dir>/step_<step>`` (the state after optimizer step ``step``) on rank 0, or from every rank
        in the sharded format (with ``checkpoint.async_save`` it is complete once the next save or the end of
        ``fit`` waits for it); ``diverged`` marks it so that no rule picks it as the newest checkpoint. A failure a
        rank holds (``_on_this_rank``: rank 0's metrics row of this step unwritten) stops every rank before it: a
        resume would go on from a checkpoint whose step the run's records lack."""
        self._stop_if_any_rank_failed()
        self.last_saved_step, self._saved_eval_step = self.step, self.last_eval_step
        meta = {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "sampler": self._sampler_state(),
            "rng": capture_rng(),
            "world_size": self.dist.world_size,
            "skipped_steps": self.skipped_steps,
            "consecutive_bad": self.consecutive_bad,
            "recent_losses": self.recent_losses,
            # the summary's train_* means are over the run's last steps, those before a resume included
            "recent_metrics": _recent_for_meta(self._recent_metrics),
            "best_loss": self.best_loss,
            "run_id": self.run_id,
            "diverged": diverged,
            "objective": self.objective.state_dict(),
            "last_eval": self.last_eval,
            "last_eval_step": self.last_eval_step,
            "data": self.data_stores,
            "config": self.cfg.to_dict(),
        }
        keep_last = self.cfg.checkpoint.keep_last
        if self._sharded is not None:  # every rank writes its shard; rank 0 completes the directory
            return self._sharded.save(
                self.ckpt_dir / checkpoint_name(self.step),
                self.model,
                self.optimizer,
                meta,
                tokenizer_dir=self.cfg.data.tokenizer,
                scaler=self.scaler,
                on_complete=lambda final: prune_checkpoints(self.ckpt_dir, final, meta, keep_last),
            )
        # A sharded optimizer gathers its full state collectively: every rank takes part.
        gathered = self.optimizer.state_dict() if self.dist.enabled and self.cfg.parallel.zero1 else None
        saved = None
        # rank 0 writes; a save it cannot make (a full disk) stops every rank, not rank 0 alone
        with stop_together(self.dist, f"save {checkpoint_name(self.step)}"):
            if self.dist.is_main:
                with self._fp32_weights_in_place():
                    saved = save_checkpoint(
                        self.ckpt_dir,
                        self.step,
                        self.model,
                        self.optimizer,
                        meta,
                        tokenizer_dir=self.cfg.data.tokenizer,
                        keep_last=keep_last,
                        scaler=self.scaler,
                        optimizer_state=gathered,
                        lora_base=self.lora_base,
                    )
        return saved

    def _checkpoint_to_resume(self, spec: str) -> Path | None:
        """The newest complete checkpoint ``checkpoint.resume`` names. Every rank looks; rank 0 alone names each
        newer one it passes over (every rank printed the same warning), and the ranks must then find the same step
        (``_check_ranks_resume_alike``)."""
        with warnings.catch_warnings():
            if not self.dist.is_main:
                warnings.simplefilter("ignore", CheckpointWarning)
            return find_latest_checkpoint(
                self.ckpt_dir if spec == "auto" else spec,
                need_optimizer=True,
                progress=self.cfg.logging.progress and self.dist.is_main,  # the weights and optimizer, read whole
            )

    def _check_lora_base(self, path: Path, meta: dict) -> None:
        """A sharded LoRA checkpoint holds the adapter alone, and the resume rebuilt the frozen base from
        train.init_from, which names a run's newest checkpoint: once that run had saved on, the adapter went on over
        weights it never trained with, without a word. Refused before anything loads, naming the base checkpoint
        beside it that holds the weights the run trained on. Every rank: under FSDP the base's sampled matrices
        are gathered (a collective), and every rank then decides alike."""
        from cookmind.model.fingerprint import fingerprints_differ, weights_fingerprint
        from cookmind.model.lora import has_lora
        from cookmind.model.model_io import BASE_FINGERPRINT_KEY, base_checkpoint_trained_on, resolve_model_dir
        from cookmind.parallel.fsdp import plain_name

        recorded = meta.get(BASE_FINGERPRINT_KEY)
        if not recorded or not has_lora(self.bare_model):
            return
        now = weights_fingerprint(self.bare_model, gather=True) or {}
        where = fingerprints_differ(recorded, {plain_name(k): v for k, v in now.items()})
        if where is None:
            return
        with stop_together(self.dist, "start"):
            base = self.cfg.train.init_from
            if not base:  # a model the caller built
                raise ValueError(
                    f"{setting('checkpoint.resume')}: {path}'s LoRA adapter was trained on other base weights than "
                    "the model "
                    f"given holds (they differ at {where}): give the base it trained on"
                )
            base_dir = resolve_model_dir(base)
            found = base_checkpoint_trained_on(Path(base_dir), recorded)
            fix = (
                f"resume with {setting('train.init_from', found[0])}, the base checkpoint it trained on"
                if found is not None
                else f"restore the base checkpoint the run started from and name it in {setting('train.init_from')}"
            )
            raise ValueError(
                f"{setting('checkpoint.resume')}: {path}'s LoRA adapter was trained on other base weights than "
                f"{setting('train.init_from', base)} gives now ({base_dir}; they differ at {where}): {fix}"
            )

    def _check_ranks_resume_alike(self, spec: str, path: Path | None) -> None:
        """Every rank must resume from the same step: nodes that do not share the checkpoint directory would
        otherwise start from different weights (rank 0 writes checkpoints; the others only read them)."""
        step = int(read_meta(path)["step"]) if path is not None else -1
        low, high = min_max_over_ranks(step, self.dist)
        if low != high:
            found = ", ".join(f"step {s}" if s >= 0 else "no checkpoint" for s in sorted({low, high}))
            mine = f"step {step}" if step >= 0 else "none"
            where = self.ckpt_dir if spec == "auto" else spec
            raise ValueError(
                f"{setting('checkpoint.resume', spec)}: the ranks found different checkpoints ({found}; rank "
                f"{self.dist.rank} found {mine} in {where}). A multi-node run needs its checkpoint directory on a "
                "filesystem every node shares (or the same checkpoint copied to the same path on each node)"
            )

    def _maybe_resume(self) -> None:
        spec = self.cfg.checkpoint.resume
        if not spec:
            return
        path = self._checkpoint_to_resume(spec)
        self._check_ranks_resume_alike(spec, path)
        if path is None:
            if spec == "auto":  # nothing saved yet: a fresh start (the first run of a job that always resumes)
                with stop_together(self.dist, "start"):  # rank 0's rewrite of metrics.jsonl (a full disk) stops all
                    if self.dist.is_main:
                        _note(f"no checkpoint in {self.ckpt_dir} yet; starting at step 0")
                        # an attempt killed before its first save logged rows this run logs again: the plots read both
                        if dropped := self.metrics_writer.rewind(-1):
                            _note(
                                f"{len(dropped)} rows of metrics.jsonl were logged by an attempt that "
                                "saved no checkpoint; dropped: this run logs those steps again"
                            )
                return
            what = "no complete checkpoint there" if Path(spec).exists() else "does not exist"
            if kept := ", ".join(d.name for d in list_checkpoints(self.ckpt_dir)):  # keep_last pruned the one named?
                what += (
                    f"; {self.ckpt_dir} holds {kept} (checkpoint.keep_last deletes older ones as a run saves): "
                    "resume one of them, or --resume auto"
                )
            raise FileNotFoundError(f"{setting('checkpoint.resume', spec)}: {what}")
        with stop_together(self.dist, "start"):  # this node's copy of the checkpoint
            meta = read_meta(path)
            self._check_resume_data(path, meta)  # before any weights load
            ours = Path(path).resolve().parent == self.ckpt_dir.resolve()
            if not ours and int(meta.get("step", 0)) >= self.cfg.train.max_steps:  # before the run directory is made
                raise ValueError(
                    f"{setting('checkpoint.resume', spec)}: {path} is at step {meta.get('step')}, already at or past "
                    f"train.max_steps={self.cfg.train.max_steps}: nothing to train in {self.run_dir}; raise "
                    f"train.max_steps to continue that run here, or start a new run from its weights with "
                    f"--init-from {path}"
                )
        self._check_lora_base(path, meta)
        if self.dist.is_main:  # whether it resumed, and from where, was not said
            _note(f"resuming from {path}")
        # a sharded load is a collective whose errors reach every rank (torch.distributed.checkpoint's own)
        with stop_together(self.dist, f"resume from {path}"), self._fp32_weights_in_place():
            meta = load_checkpoint(path, self.bare_model, self.optimizer, self.scaler)
        self.run_id = meta.get("run_id") or self.run_id
        self.recent_losses = list(meta.get("recent_losses") or [])
        self._recent_metrics.extend(meta.get("recent_metrics") or [])
        self.best_loss = meta.get("best_loss")
        self.step = int(meta["step"])
        self.tokens_seen = int(meta.get("tokens_seen", 0))
        self.skipped_steps = int(meta.get("skipped_steps", 0))
        self.consecutive_bad = int(meta.get("consecutive_bad", 0))
        self.last_eval = meta.get("last_eval") or {}
        self.last_eval_step = self._saved_eval_step = int(meta.get("last_eval_step", -1))
        self.last_saved_step = self.step
        # rank 0 rewrites metrics.jsonl without the rows logged after the checkpoint: one it cannot write (a full
        # disk, its permissions) stops every rank with its reason (the others died in start-up's next collective)
        with stop_together(self.dist, f"resume from {path}"):
            if self.dist.is_main and (dropped := self.metrics_writer.rewind(self.step)):
                steps = [s for s in dropped if s >= 0]
                _note(
                    f"{len(dropped)} rows of metrics.jsonl were logged after step {self.step} by the "
                    f"interrupted run{f' (steps {min(steps)}-{max(steps)})' if steps else ''}; dropped: this run logs "
                    "those steps again"
                )
            if meta.get("sampler") is not None and self.train_loader is not None:
                self.train_loader.load_state_dict(meta["sampler"])
            self.objective.load_state_dict(meta.get("objective") or {})
        self._rng_to_restore = meta.get("rng")
        self._warn_of_a_new_schedule(meta.get("config") or {})
        self._warn_of_another_global_batch(meta)
        if self.step >= self.cfg.train.max_steps and self.dist.is_main:  # it "completed" without training a step
            _note(
                f"the checkpoint is at step {self.step}, already at or past train.max_steps="
                f"{self.cfg.train.max_steps}: nothing to train; raise train.max_steps to continue"
            )

    def _warn_of_a_new_schedule(self, saved: dict) -> None:
        """A resume whose schedule settings (``SCHEDULE_KEYS``) differ from the checkpoint's run's recomputes the
        learning rate over them: raising train.max_steps after a finished cosine takes it from its floor back up.
        That is the schedule's math and stays; one warning line (rank 0) says the jump at the next step and how to
        go on at the old rate instead. Nothing when the next step's rate is the same."""
        import copy
        import warnings

        changed = []
        old_cfg = copy.deepcopy(self.cfg)
        for key in SCHEDULE_KEYS:
            section, name = key.split(".")
            then = (saved.get(section) or {}).get(name, getattr(getattr(self.cfg, section), name))
            if then != getattr(getattr(self.cfg, section), name):
                changed.append((key, then))
                setattr(getattr(old_cfg, section), name, then)
        if not changed or self.step >= self.cfg.train.max_steps or not self.dist.is_main:
            return
        before, after = self.lr_at(self.step, old_cfg), self.lr_at(self.step)
        if math.isclose(before, after, rel_tol=1e-9, abs_tol=0.0):
            return
        now = ", ".join(f"{k}={getattr(getattr(self.cfg, k.split('.')[0]), k.split('.')[1])}" for k, _ in changed)
        then = ", ".join(str(v) for _, v in changed)
        warnings.warn(
            f"{now} (the checkpoint's run had {then}): the learning rate at step {self.step + 1} jumps from "
            f"{before:.4g} to {after:.4g}, because the {self.cfg.optim.schedule} schedule is recomputed over "
            f"{self.cfg.train.max_steps} steps; to go on at {before:.4g} instead, set optim.schedule=constant "
            f"optim.lr={before:.4g}",
            stacklevel=3,
        )

    def _warn_of_another_global_batch(self, meta: dict) -> None:
        """A resume at another world size (or micro-batch, or accumulation) that changes the global batch goes on
        with other steps than the run it continues: resuming a two-rank run in one process with the same command
        halved it silently. One warning line (rank 0) gives both and the setting that keeps the checkpoint's."""
        import warnings

        saved = (meta.get("config") or {}).get("train") or {}
        then_world = int(meta.get("world_size") or 1)
        then_micro = int(saved.get("micro_batch_size", self.cfg.train.micro_batch_size))
        then_accum = int(saved.get("grad_accum_steps", self.cfg.train.grad_accum_steps))
        micro, accum, world = self.cfg.train.micro_batch_size, self.cfg.train.grad_accum_steps, self.dist.world_size
        then, now = then_micro * then_accum * then_world, micro * accum * world
        if then == now or self.step >= self.cfg.train.max_steps or not self.dist.is_main:
            return

        def processes(n: int) -> str:
            return f"{n} process" + ("es" if n != 1 else "")

        keep = []
        if then % (micro * world) == 0:
            keep.append(f"train.grad_accum_steps={then // (micro * world)}")
        if then % (accum * world) == 0:
            keep.append(f"train.micro_batch_size={then // (accum * world)}")
        advice = (
            f"set {keep[0]}" + (f" (or {keep[1]})" if len(keep) > 1 else "")
            if keep
            else f"make train.micro_batch_size x train.grad_accum_steps x processes {then}"
        )
        warnings.warn(
            f"the global batch is {now} (train.micro_batch_size={micro} x train.grad_accum_steps={accum} "
            f"x {processes(world)}), the checkpoint's run had {then} ({then_micro} x {then_accum} x "
            f"{processes(then_world)}): this run takes other steps than the run it continues; to keep {then}, "
            f"{advice}",
            stacklevel=3,
        )

    def _check_resume_store(self) -> None:
        """Before the training store is refused as too small for a batch: a resume on another store than its
        checkpoint's is refused as that (lowering train.micro_batch_size would only lead to this refusal)."""
        spec = self.cfg.checkpoint.resume
        path = spec and self._checkpoint_to_resume(spec)
        if path:
            self._check_resume_data(path, read_meta(path))

    def _check_resume_data(self, path: Path, meta: dict) -> None:
        """Refuse to resume ``path`` on other data than it trained on: another training or validation store than
        the one its meta records (by fingerprint: the same store moved elsewhere is the same; a repack in another
        order or split is not, and its validation split could hold trained records), or, by the sampler's sample
        count, other data settings. Each is one line naming both and what to do. A checkpoint saved before stores
        were recorded is checked by the count alone."""
        advice = f"start a new run on this data from its weights with --init-from {path} and another --run-dir"
        for role, what, used in (("train", "training", "trained on"), ("val", "validation", "evaluated on")):
            then, now = (meta.get("data") or {}).get(role), self.data_stores.get(role)
            if then and now and then.get("fingerprint") != now["fingerprint"]:
                raise ValueError(
                    f"{path} {used} the {what} store {then.get('path')} (fingerprint {then.get('fingerprint')}), "
                    f"not on {now['path']} (fingerprint {now['fingerprint']}), which holds other data or another "
                    f"order or split: resume with the store it {used}, or {advice}"
                )
        sampler = meta.get("sampler")
        if sampler is None or getattr(self, "train_loader", None) is None:  # (not built yet: _check_resume_store)
            return
        saved, made = sampler.get("num_samples"), self.train_loader.sampler.num_samples_total
        if saved != made:
            store = self.data_stores.get("train", {})
            store = f"{store['path']} (fingerprint {store['fingerprint']})" if store else "given"
            settings = f"data.window_size={self.cfg.data.window_size}"
            if self.train_type == "seq":
                settings += f", data.stride={self.cfg.data.stride or self.cfg.data.window_size}"
            raise ValueError(
                f"{path}: its sampler state is for {saved} training samples, the training store {store} makes "
                f"{made} with these data settings ({settings}): resume with the data and data settings it trained "
                f"with, or {advice}"
            )
        then = {"train.seed": sampler.get("seed"), "data.shuffle": sampler.get("shuffle")}
        now = {"train.seed": self.train_loader.sampler.seed, "data.shuffle": self.train_loader.sampler.shuffle}
        if changed := [k for k in then if then[k] is not None and then[k] != now[k]]:
            was = " and ".join(f"{k}={yaml_word(then[k])}" for k in changed)
            raise ValueError(
                f"{path} was saved by a run with {was} (this run: "
                f"{', '.join(f'{k}={yaml_word(now[k])}' for k in changed)}), which fix the order it reads the data "
                f"in: resume with {was}, or {advice}"
            )

    # -- signals ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def handling_signals(self):
        """SIGTERM/SIGINT are fit's stop requests (a second Ctrl-C raises KeyboardInterrupt) for the whole block, the
        previous handlers back after it: a caller that holds them from before ``fit`` until it has reported the run
        leaves a signal that comes as fit returns to the completed run (fit's own handlers end with it)."""
        old = self._install_signal_handlers()
        try:
            yield
        finally:
            self._restore_signal_handlers(old)

    def _install_signal_handlers(self) -> dict:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return {}
        old = {}

        def handler(signum, frame):
            if self._stop_reason is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C stops at once
            first = self._stop_reason is None
            self.request_stop(f"signal {signal.Signals(signum).name}")
            if first and getattr(self, "_fit_raised", False):  # fit raised: no step to end, no checkpoint to save
                # (torchrun's SIGTERM to the workers as one of them fails reaches ranks ending on their own error)
                name = signal.Signals(signum).name
                again = "; Ctrl-C again ends it at once" if signum == signal.SIGINT else ""
                note = f"{name} came as the run was ending on its error; nothing is saved{again}"
                say_from_handler(f"cookmind train: {note}")  # its error prints after clean-up
            elif first and self.dist.is_main:  # said at once: a long step (accumulation, a CPU) can take minutes
                name = signal.Signals(signum).name
                again = "; Ctrl-C again stops without it" if signum == signal.SIGINT else ""
                said = f"cookmind train: {name}: stopping when the step under way ends, then saving{again}"
                if self.step >= self.cfg.train.max_steps:  # nothing left to stop: fit completes the run
                    again = "; Ctrl-C again stops without them" if signum == signal.SIGINT else ""
                    said = (
                        f"cookmind train: {name}: the last step has run; the run ends once its checkpoint and report "
                        f"are written{again}"
                    )
                say_from_handler(said)

        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, handler)
        return old

    @staticmethod
    def _restore_signal_handlers(old: dict) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)


RECENT_STEPS = 20  # the run summary's train_* figures: means over this many last steps


def recent_means(steps) -> dict[str, Any]:
    """The run summary's training figures: the mean of the loss and of each of the objective's own metrics (GRPO's
    reward and accuracy, DPO's reward margin, ...) over ``steps`` (the run's last RECENT_STEPS steps, those before
    a resume included: a checkpoint carries them),
    as ``train_<name>``, and how many steps they average (``train_means_over_steps``); non-finite values (a skipped
    step's) left out. A GRPO run without eval problems had no reward in its summary at all."""
    steps = list(steps)
    if not steps:
        return {}
    out: dict[str, Any] = {}
    for name in training_metric_names(steps):
        values = [m[name] for m in steps if is_number(m.get(name)) and math.isfinite(m[name])]
        if values:
            out[f"train_{name}"] = sum(values) / len(values)
    return {**out, "train_means_over_steps": len(steps)} if out else {}


def _recent_for_meta(steps) -> list[dict[str, Any]]:
    """What ``recent_means`` reads of the last steps, for a checkpoint: the loss and the objective's metrics (not the
    timings, which differ from run to run), a non-finite value (a skipped step's) as None, which it leaves out."""
    names = training_metric_names(steps)
    return [{k: (m[k] if math.isfinite(m[k]) else None) for k in names if is_number(m.get(k))} for m in steps]


def _skips_on_device(optimizer) -> bool:
    """Whether ``optimizer.step(found_inf=...)`` decides on the GPU (our AdamW's fused path) without a sync."""
    from cookmind.optim import AdamW

    return isinstance(optimizer, AdamW) and all(g.get("fused") for g in optimizer.param_groups)


def _check_fp8_head(model: torch.nn.Module, device: torch.device) -> None:
    """model.lm_head_fp8: warn where it cannot apply (CPU), refuse on a CUDA GPU without FP8 tensor cores."""
    config = getattr(model, "config", None)
    if not getattr(config, "lm_head_fp8", False):
        return
    from cookmind.kernels.linear_ce_fp8 import fp8_head_problem

    problem = fp8_head_problem(device)
    if problem is None:
        return
    if device.type == "cuda":
        raise ValueError(problem + "; set model.lm_head_fp8=false")
    import warnings

    warnings.warn(problem, stacklevel=3)
