"""Sharded training checkpoints through ``torch.distributed.checkpoint`` (DCP): every rank writes its own shard.

    <root>/step_00000120/
        dcp/.metadata, dcp/__R_0.distcp   {"model": ..., "optim": ...} as DCP writes them (LoRA runs: the adapter)
        config.json                       the model config (load_model / export read the weights from dcp/)
        cookmind_tokenizer.json, ...      the run's tokenizer files
        meta.json                         as in the full format (+ the grad scaler's state); written last. Its
                                          sha256 holds dcp/'s files too: each rank hashes the shards it wrote

The state comes from ``get_state_dict(model, optimizer)``, which names everything by parameter (FQN) for plain,
DDP and FSDP2 modules alike, so a checkpoint resumes at another world size or without a process group (DCP
reshards on load). Rank 0 picks the temporary directory name (its PID, ``cookmind.atomic``) and tells the
others; every rank writes into it; after all have finished rank 0 writes meta.json and renames it into place.
With ``async_save`` DCP writes in the background and the next save (or the end of training) completes it.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from cookmind.atomic import (
    check_replaceable,
    clean_stale_temps,
    disk_full_error,
    is_disk_full,
    replace_dir,
    temp_name,
    write_json,
)
from cookmind.model.fingerprint import weights_fingerprint
from cookmind.model.lora import has_lora
from cookmind.model.model_io import (
    BASE_FINGERPRINT_KEY,
    CONFIG_NAME,
    META_NAME,
    SHA256_KEY,
    content_hashes,
    file_hashes,
    is_own_checkpoint,
    written_files,
)
from cookmind.model.sharded_io import (
    SafeLoadPlanner,
    SafeReader,
    error_reason,
    load_error,
    quiet_single_process,
    read_metadata,
)
from cookmind.model.sharded_layout import MODEL_KEY, OPTIM_KEY, dcp_dir
from cookmind.parallel import unwrap
from cookmind.parallel.fsdp import plain_name
from cookmind.parallel.process_group import DistInfo, stop_together
from cookmind.tokenizer.files import copy_tokenizer_files


def is_fsdp_sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP2 (``fully_shard``) sharded any part of ``model``."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in unwrap(model).modules())


def resolve_format(fmt: str, model: torch.nn.Module) -> str:
    """``checkpoint.format``: ``auto`` is ``sharded`` for an FSDP-sharded model, ``full`` otherwise."""
    if fmt == "auto":
        return "sharded" if is_fsdp_sharded(model) else "full"
    if fmt == "full" and is_fsdp_sharded(model):
        raise ValueError(
            "checkpoint.format=full cannot save an FSDP-sharded model (every rank holds a part of it); "
            "use checkpoint.format=sharded or auto"
        )
    return fmt


def sharded_checkpointer(cfg: Any, model: torch.nn.Module, rank: int, world_size: int) -> ShardedCheckpointer | None:
    """The trainer's saver for ``checkpoint.format`` (a CheckpointConfig) and this model, or None for the full
    format (rank 0 writes safetensors)."""
    fmt = resolve_format(cfg.format, model)
    if cfg.async_save and fmt != "sharded":
        raise ValueError(
            "checkpoint.async_save needs the sharded format: set checkpoint.format=sharded "
            "(auto picks it only for an FSDP-sharded model)"
        )
    return ShardedCheckpointer(rank, world_size, cfg.async_save) if fmt == "sharded" else None


def _state(model: torch.nn.Module, optimizer: Any | None) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` keyed by parameter names; a LoRA model gives its trainable adapter only."""
    bare = unwrap(model)
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(bare, optimizer)
    else:
        model_sd, optim_sd = get_model_state_dict(bare), None
    if has_lora(bare):  # the frozen base is rebuilt from train.init_from on resume
        trainable = {n for n, p in bare.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trainable}
    return {MODEL_KEY: model_sd} if optim_sd is None else {MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}


class ShardedCheckpointer:
    """Saves sharded checkpoints from every rank; holds at most one save in flight (``async_save``)."""

    def __init__(self, rank: int = 0, world_size: int = 1, async_save: bool = False):
        self.rank, self.world_size, self.async_save = rank, world_size, async_save
        self._pending: dict[str, Any] | None = None
        self._group = None  # async saves talk over their own gloo group, beside training's collectives
        self._info = DistInfo(rank, world_size)  # for stop_together: what one rank cannot write stops every rank

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_initialized()

    def save(
        self,
        final: str | Path,
        model: torch.nn.Module,
        optimizer: Any | None,
        meta: dict[str, Any],
        tokenizer_dir: str | Path | None = None,
        scaler: Any | None = None,
        on_complete=None,
    ) -> Path:
        """Write ``final`` from every rank (call it on all of them); ``on_complete(final)`` runs on rank 0 once
        the directory is in place (pruning). Returns ``final``, which exists once ``wait`` has returned."""
        self.wait()
        final = Path(final)
        tmp = self._agree_on_temp_dir(final)
        try:
            state = _state(model, optimizer)
            if has_lora(unwrap(model)):  # the adapter alone is saved: record the base it trains on (every rank)
                from cookmind.parallel.fsdp import plain_name

                fingerprint = weights_fingerprint(unwrap(model), gather=True)
                if fingerprint is not None:
                    meta = {**meta, BASE_FINGERPRINT_KEY: {plain_name(k): v for k, v in fingerprint.items()}}
            # rank 0's files, before the shards' collectives: one it cannot write (a full disk) stops every rank
            with stop_together(self._info, f"save {final.name}"):
                if self.rank == 0:
                    config = getattr(unwrap(model), "config", None)
                    if config is not None:
                        write_json(tmp / CONFIG_NAME, config.to_dict(), indent=2)
                    if tokenizer_dir is not None:
                        # its tokenizer files only: --tokenizer may name a model folder, whose weights are not these
                        copy_tokenizer_files(tokenizer_dir, tmp, replace=False)
            if scaler is not None:
                meta = {**meta, "scaler": scaler.state_dict()}
            try:
                future = self._write(state, tmp)
            except dcp.CheckpointException as exc:
                raise _save_error(exc, final) from None
        except BaseException:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._pending = {"future": future, "tmp": tmp, "final": final, "meta": meta, "on_complete": on_complete}
        if future is None:
            self.wait()
        return final

    def _write(self, state: dict[str, Any], tmp: Path) -> Future | None:
        """DCP writes this rank's shard under ``tmp/dcp``; a Future when it runs in the background."""
        if self.async_save:
            if self.distributed and self._group is None:
                self._group = dist.new_group(backend="gloo")
            # DCP copies the state to CPU memory before returning; without a group it writes as one process
            return dcp.async_save(state, checkpoint_id=str(dcp_dir(tmp)), process_group=self._group)
        with quiet_single_process():
            dcp.save(state, checkpoint_id=str(dcp_dir(tmp)), no_dist=not self.distributed)
        return None

    def wait(self) -> Path | None:
        """Finish the save in flight (if any): wait for every rank's shard, then rank 0 writes meta.json and renames
        the directory into place. Call it on every rank."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        tmp, final = pending["tmp"], pending["final"]
        try:
            # what one rank cannot do here (read back its shard; rank 0: complete the directory) stops every rank
            with stop_together(self._info, f"save {final.name}"):
                if pending["future"] is not None:
                    try:
                        pending["future"].result()
                    except dcp.CheckpointException as exc:
                        raise _save_error(exc, final) from None
                mine = _shard_hashes(tmp, self.rank)  # each rank reads back what it wrote, all at once
            hashes = [mine]
            if self.distributed:  # and every rank's shard is on disk before the directory looks complete
                hashes = [None] * self.world_size
                dist.all_gather_object(hashes, mine, group=self._group)
            with stop_together(self._info, f"save {final.name}"):
                if self.rank == 0:
                    meta = {**pending["meta"], "saved_at": time.time(), "complete": True, "files": written_files(tmp)}
                    meta[SHA256_KEY] = _all_hashes(tmp, hashes)
                    write_json(tmp / META_NAME, meta)
                    replace_dir(tmp, final, replace=True, is_ours=is_own_checkpoint, what="cookmind checkpoint")
                    if pending["on_complete"] is not None:
                        pending["on_complete"](final)
        finally:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _agree_on_temp_dir(self, final: Path) -> Path:
        """Rank 0 checks ``final`` may be replaced, names and creates the temporary directory; all ranks get it
        and must see it."""
        answer: list[Any] = [None]
        if self.rank == 0:
            try:
                check_replaceable(final, True, is_own_checkpoint, "cookmind checkpoint")
                final.parent.mkdir(parents=True, exist_ok=True)
                clean_stale_temps(final.parent)
                tmp = temp_name(final)
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                answer = [str(tmp)]
            except Exception as exc:  # the other ranks raise it too instead of waiting for a name
                answer = [exc]
        if self.distributed:
            dist.broadcast_object_list(answer, src=0)
        if isinstance(answer[0], BaseException):
            raise answer[0]
        tmp = Path(answer[0])
        try:
            # every rank writes its shard into rank 0's folder: a node that does not see it would write into its own
            # disk, and rank 0 would name the step complete without that shard (every checkpoint unreadable)
            _every_rank_sees(tmp, self._info, f"save {final.name}")
        except BaseException:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return tmp


def saves_sharded(cfg: Any) -> bool:
    """Whether a run of ``cfg`` (a TrainConfig) saves sharded checkpoints: ``auto`` does exactly under FSDP."""
    fmt = cfg.checkpoint.format
    return fmt == "sharded" or (fmt == "auto" and bool(cfg.parallel.fsdp))


def check_shared(directory: str | Path, info: DistInfo) -> None:
    """As a run of several ranks that saves sharded checkpoints starts: every rank must see a folder rank 0 makes
    in ``directory`` (the run's checkpoint directory, made here where there is none yet, and removed again with the
    folders above it that it made: a run that cannot start leaves none), or every rank stops now, naming the one that
    does not, instead of at the first save hours in. A directory that cannot be made or written is a one-line
    OSError. Call it on every rank; in one process there is nothing to check."""
    if not (info.enabled and dist.is_initialized()):
        return
    answer: list[Any] = [None]
    made: list[Path] = []  # the folders rank 0 made, deepest first
    if info.rank == 0:
        try:
            answer = [str(_make_probe(Path(directory), made))]
        except Exception as exc:  # the other ranks raise it too instead of waiting for a name
            answer = [exc]
    try:
        dist.broadcast_object_list(answer, src=0)
        if isinstance(answer[0], BaseException):
            raise answer[0]
        _every_rank_sees(Path(answer[0]), info, "start")
    finally:
        if info.rank == 0:
            if isinstance(answer[0], str):
                shutil.rmtree(answer[0], ignore_errors=True)
            for folder in made:  # only while empty: a save of another process may have begun there
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _make_probe(directory: Path, made: list[Path]) -> Path:
    """Make ``directory`` (each folder made is added to ``made``, deepest first) and a temporary folder in it."""
    try:
        missing = [p for p in (directory, *directory.parents) if not p.is_dir()]
        for folder in reversed(missing):
            folder.mkdir()
            made.insert(0, folder)
        probe = temp_name(directory / "shared_check")
        probe.mkdir()
    except OSError as exc:
        why = f"{exc.filename} is not a folder" if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
        raise OSError(
            f"{directory}: cannot make the checkpoint directory or write in it ({why}): set "
            "checkpoint.dir (or --run-dir) to a folder this user can write, on a filesystem every node shares"
        ) from None
    return probe


def _every_rank_sees(folder: Path, info: DistInfo, what: str) -> None:
    """Every rank raises, naming the first that does not see ``folder`` (which rank 0 made), if one does not."""
    with stop_together(info, what):
        for _ in range(10):  # a network filesystem may show another node's new folder a moment late
            if folder.is_dir():
                break
            time.sleep(0.5)
        else:
            raise FileNotFoundError(
                f"{folder.parent}: this rank does not see the folder {folder.name} that rank 0 made there: the "
                "checkpoint directory (checkpoint.dir, or the run directory's checkpoints/) must be on a filesystem "
                "every node shares (NFS, Lustre, ...), at the same path"
            )


def _shard_hashes(tmp: Path, rank: int) -> dict[str, str]:
    """SHA-256 of the shard files ``rank`` wrote (DCP's file system writer names them ``__RANK_N.distcp``)."""
    return file_hashes(tmp, sorted(dcp_dir(tmp).glob(f"__{rank}_*.distcp")))


def _all_hashes(tmp: Path, per_rank: list[dict[str, str]]) -> dict[str, str]:
    """meta.json's ``SHA256_KEY``: the files beside dcp/ (config.json, the tokenizer's), each rank's shards, and
    the rest of dcp/ (DCP's .metadata; any file named otherwise), hashed here."""
    hashes = content_hashes(tmp)
    for part in per_rank:
        hashes.update(part)
    rest = sorted(p for p in dcp_dir(tmp).iterdir() if p.is_file() and p.relative_to(tmp).as_posix() not in hashes)
    return {**hashes, **file_hashes(tmp, rest)}


def _save_error(exc: dcp.CheckpointException, final: Path) -> OSError:
    """One line for a failed DCP save (its exception carries every rank's traceback): a full disk says so."""
    if any(is_disk_full(cause, final) for cause, _ in exc.failures.values()):
        return disk_full_error(final)
    return OSError(f"saving {final} failed: {error_reason(exc)}")


def load_sharded(
    path: str | Path, model: torch.nn.Module, optimizer: Any | None = None, scaler: Any | None = None, meta=None
) -> None:
    """Load a sharded checkpoint into live objects (call on every rank of the job, or in one process without a
    group): DCP reads each rank's part, whatever world size and sharding wrote it."""
    path = Path(path)
    bare = unwrap(model)
    lora = has_lora(bare)
    saved = read_metadata(path).state_dict_metadata
    if optimizer is not None and not any(k.startswith(OPTIM_KEY + ".") for k in saved):
        raise FileNotFoundError(
            f"{dcp_dir(path)}: holds no optimizer state; cannot resume the optimizer (start fresh with --init-from "
            "(train.init_from))"
        )
    state = _state(bare, optimizer)
    want = {f"{MODEL_KEY}.{k}" for k in state[MODEL_KEY]}
    have = {k for k in saved if k.startswith(MODEL_KEY + ".")}
    if want != have:
        raise ValueError(
            f"{dcp_dir(path)}: parameter names differ from the model being trained (missing "
            f"{sorted(k[6:] for k in want - have)[:5]}, unexpected {sorted(k[6:] for k in have - want)[:5]}); "
            "resume with the same model config" + (" and LoRA settings" if lora else "")
        )
    for k, v in state[MODEL_KEY].items():
        size = tuple(saved[f"{MODEL_KEY}.{k}"].size)
        if tuple(v.shape) != size:
            raise ValueError(
                f"{dcp_dir(path)}: {k} has shape {size}, the model has {tuple(v.shape)}; "
                "resume with the same model config"
            )
    try:
        with quiet_single_process():
            dcp.load(
                state,
                storage_reader=SafeReader(dcp_dir(path)),
                planner=SafeLoadPlanner(),
                no_dist=not dist.is_initialized(),
            )
    except (Exception, dcp.CheckpointException) as exc:
        hint = "resume with the same model, optimizer and LoRA settings"
        raise load_error(exc, f"{dcp_dir(path)}: cannot load", hint) from None
    options = StateDictOptions(strict=not lora)
    if optimizer is None:
        set_model_state_dict(bare, state[MODEL_KEY], options=options)
    else:
        set_state_dict(
            bare, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIM_KEY], options=options
        )
    if scaler is not None and meta is not None and meta.get("scaler"):
        scaler.load_state_dict(meta["scaler"])


# -- A full-format checkpoint (one process's safetensors + optimizer.pt) into an FSDP2-sharded model ----------------
# A run that outgrows one GPU resumes its full checkpoints under parallel.fsdp: every rank reads the whole tensors
# and DCP's state-dict API keeps each rank's shard (``full_state_dict=True``), as for a sharded checkpoint. A LoRA
# run's: the adapter (adapter_model.safetensors) and its optimizer state, the frozen base rebuilt from init_from.


def load_full_model_into_sharded(model: torch.nn.Module, weights: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Whole tensors by parameter name (checked against the model by the caller) into FSDP2's shards; a LoRA
    adapter's with ``strict=False`` (the frozen base, rebuilt from train.init_from, is left as it is)."""
    set_model_state_dict(unwrap(model), weights, options=StateDictOptions(full_state_dict=True, strict=strict))


def load_full_optimizer_into_sharded(model: torch.nn.Module, optimizer: Any, saved: dict[str, Any], where) -> None:
    """A full-format optimizer state (``optimizer.state_dict()`` of an unsharded run: parameters numbered in the
    order of its groups) into the optimizer of the FSDP2-sharded ``model``. The numbers become parameter names
    through this optimizer's groups, which the Trainer builds the same way for both (same names, same order)."""
    bare = unwrap(model)
    name_of = {id(p): plain_name(n) for n, p in bare.named_parameters()}  # DCP's names: no checkpoint wrapper
    ours = [[name_of[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    theirs = [list(g["params"]) for g in saved["param_groups"]]
    if [len(g) for g in ours] != [len(g) for g in theirs]:
        raise ValueError(
            f"{where}: its parameter groups hold {[len(g) for g in theirs]} parameters, this run's optimizer "
            f"{[len(g) for g in ours]}; resume with the same model and optimizer settings"
        )
    name = {i: n for g_ours, g_theirs in zip(ours, theirs) for i, n in zip(g_theirs, g_ours)}
    by_name = {
        "state": {name[i]: s for i, s in saved["state"].items()},
        "param_groups": [{**g, "params": names} for g, names in zip(saved["param_groups"], ours)],
    }
    set_optimizer_state_dict(bare, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
