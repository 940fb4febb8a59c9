"""save_model / load_model: config.json + model.safetensors, written atomically, loaded with clear errors."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from cookmind.atomic import building_dir, is_temp_name, save_safetensors, temp_path, write_json
from cookmind.model.config import CookMindConfig
from cookmind.model.lm import CookMindLM
from cookmind.model.sharded_layout import DCP_DIR, ShardedCheckpointError, dcp_dir, is_sharded_checkpoint
from cookmind.model.wrappers import unwrap
from cookmind.run_layout import CONFIG_NAME, META_NAME, STEP_DIR, WEIGHTS_NAME, is_checkpoint_dir


def model_state_dict(model: CookMindLM) -> dict[str, torch.Tensor]:
    """Weights to save, HF-named; a tied lm_head is left out (HF ties it back from embed_tokens)."""
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    storages: set[int] = set()
    for k, v in sd.items():  # weights that are views into one fused tensor (the serving runner makes
        # them) share a storage, which safetensors refuses: each gets its own copy
        ptr = v.untyped_storage().data_ptr()
        if ptr in storages:
            sd[k] = v.clone()
        storages.add(ptr)
    return sd


# bytes written between two progress updates: a 1B model's embedding is one tensor of 500 MB
_WRITE_CHUNK = 64 << 20
# a smaller file is written in well under a second: no bar (a tiny model's export printed two lines of it)
PROGRESS_BYTES = 64 << 20


def write_safetensors(
    tensors: dict[str, torch.Tensor],
    path: str | os.PathLike,
    metadata: dict[str, str] | None = None,
    progress: bool = False,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``tensors`` to ``path`` as safetensors' ``save_file`` does, byte for byte, a tensor at a time under a
    progress bar of the bytes written with ``progress`` (``cookmind.progress``; none for a file under
    ``PROGRESS_BYTES``). One save_file call was minutes of silence for a 1B model. The file is written where
    ``path`` says: an atomic caller gives a temporary name. ``dtype``: each tensor cast to it as it is written.
    Tensors ``read_weights`` mapped are read from the disk here, under the bar. One difference: tensors that share
    memory (tied weights), which save_file refuses, are each written in full (save_file's bytes for copies of them).

    The layout is the library's: an 8-byte little-endian header length, a JSON header padded with spaces to 8
    bytes, then the tensors' bytes in the header's order; that order (by dtype, then name) is safetensors' own,
    read from a file it writes of the same names and dtypes with no elements."""
    from safetensors.torch import save as safetensors_bytes

    from cookmind.progress import progress_bar

    path = Path(path)
    probe = safetensors_bytes({k: torch.empty(0, dtype=dtype or v.dtype) for k, v in tensors.items()})
    order = json.loads(probe[8 : 8 + int.from_bytes(probe[:8], "little")])  # {name: {"dtype": "BF16", ...}}
    names = [k for k in order if k != "__metadata__"]
    header: dict = {"__metadata__": metadata} if metadata is not None else {}  # save_file writes {} too
    offset = 0
    for name in names:
        t = tensors[name]
        end = offset + t.numel() * (dtype or t.dtype).itemsize
        header[name] = {"dtype": order[name]["dtype"], "shape": list(t.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with (
        open(path, "wb") as f,
        progress_bar(
            total=offset,
            desc=f"writing {path.name}",
            unit="B",
            unit_scale=True,
            enabled=progress and offset >= PROGRESS_BYTES,
        ) as bar,
    ):
        f.write(len(text).to_bytes(8, "little") + text)
        for name in names:
            t = tensors[name].detach().cpu()
            data = (t if dtype is None else t.to(dtype)).contiguous().reshape(-1).view(torch.uint8).numpy()
            for start in range(0, len(data), _WRITE_CHUNK):
                f.write(data[start : start + _WRITE_CHUNK])
                bar.update(min(_WRITE_CHUNK, len(data) - start))
    return path


def _write_files(directory: Path, model: CookMindLM) -> None:
    """Write each file under a temporary name inside `directory`, then rename it into place."""
    tensors = {k: v.cpu() for k, v in model_state_dict(model).items()}
    with temp_path(directory / WEIGHTS_NAME) as tmp:
        save_safetensors(tensors, tmp, metadata={"format": "pt"})
    write_json(directory / CONFIG_NAME, model.config.to_dict(), indent=2)


def save_model(directory: str | os.PathLike, model: CookMindLM) -> Path:
    """Save config.json and model.safetensors to `directory`.

    A new directory is built under a temporary sibling name and renamed, so a crash never leaves a half
    model. When `directory` already exists (e.g. a checkpoint the trainer is assembling), each file is
    written to a temporary name inside it and renamed, leaving the other files alone.
    """
    directory = Path(directory)
    model = unwrap(model)
    if not isinstance(model, CookMindLM):
        raise TypeError(
            f"save_model: expected a CookMindLM (optionally compiled or wrapped), got {type(model).__name__}"
        )
    if directory.is_dir():
        _write_files(directory, model)
        return directory
    with building_dir(directory) as tmp:
        _write_files(tmp, model)
    return directory


# meta.json of a sharded LoRA checkpoint: the base's weights_fingerprint, to merge its adapter onto that base
BASE_FINGERPRINT_KEY = "lora_base_fingerprint"


class ModelLoadError(ValueError):
    """A saved model cannot be loaded: names the file and what does not match."""


class CheckpointWarning(UserWarning):
    """A checkpoint was passed over (damaged, or saved by a diverged run) for an older one."""


_STEP_DIR = STEP_DIR  # one spelling of step_N for every command
OPTIMIZER_NAME = "optimizer.pt"
SHA256_KEY = "sha256"  # meta.json: {file name: SHA-256 hex} of the files a save wrote beside it ("dcp/NAME": a shard)
_verified: dict[tuple[str, int, int], str] = {}  # (file, size, mtime): the digest it matched in this process


def file_sha256(path: Path, read: Callable[[int], object] | None = None) -> str:
    """The SHA-256 of a file's bytes (what ``sha256sum`` prints); ``read(n)`` is told of each ``n`` bytes read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_WRITE_CHUNK):
            h.update(chunk)  # lets go of the GIL: the other files hash meanwhile
            if read is not None:
                read(len(chunk))
    return h.hexdigest()


def _sha256_all(files: list[Path], progress: bool = False) -> list[str]:
    """``file_sha256`` of each file, a thread a file (hashlib lets go of the GIL): the largest file sets the time.
    ``progress``: a bar of the bytes read (``cookmind.progress``; none under ``PROGRESS_BYTES`` in all)."""
    from concurrent.futures import ThreadPoolExecutor

    from cookmind.progress import progress_bar

    total = sum(f.stat().st_size for f in files if f.is_file())
    lock = threading.Lock()
    with progress_bar(
        total=total,
        desc="checking SHA-256",
        unit="B",
        unit_scale=True,
        enabled=progress and total > 0 and total >= PROGRESS_BYTES,
    ) as bar:

        def read(n: int) -> None:
            with lock:  # the threads update one bar
                bar.update(n)

        if len(files) < 2:
            return [file_sha256(f, read) for f in files]
        with ThreadPoolExecutor(max_workers=min(4, len(files))) as pool:
            return list(pool.map(lambda f: file_sha256(f, read), files))


def content_hashes(directory: Path) -> dict[str, str]:
    """``SHA256_KEY`` for a checkpoint being saved: each file at the top of ``directory`` but meta.json (which holds
    them) and our temporary files; read back right after the save wrote them, so from the page cache."""
    files = sorted(p for p in Path(directory).iterdir() if p.is_file() and p.name != META_NAME)
    return file_hashes(directory, [p for p in files if not is_temp_name(p.name)])


def file_hashes(directory: Path, files: list[Path]) -> dict[str, str]:
    """{path relative to ``directory`` (posix): SHA-256} of ``files``, as ``SHA256_KEY`` records them."""
    return dict(zip((p.relative_to(directory).as_posix() for p in files), _sha256_all(files)))


def checksum_problem(directory: Path, skip: tuple[str, ...] = (), progress: bool = False) -> str | None:
    """The first file (but ``skip``) whose bytes differ from the SHA-256 its checkpoint's meta.json recorded at save,
    said as "FILE: ..."; None when all match, and for a checkpoint saved before hashes were recorded. A file checked
    once in this process is not read again while its size and mtime stay (finding a checkpoint, then loading it).
    ``progress``: a bar of the bytes read."""
    meta = Path(directory) / META_NAME
    try:
        recorded = json.loads(meta.read_text()).get(SHA256_KEY) if meta.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None  # a damaged meta.json is reported by whoever reads it
    to_check = []  # (file, its cache key, the digest recorded)
    for name, digest in (recorded or {}).items() if isinstance(recorded, dict) else ():
        if name in skip:
            continue
        f = Path(directory) / name
        try:
            st = f.stat()
        except OSError:
            return f"{f}: missing, though {META_NAME} lists it"
        key = (str(f.resolve()), st.st_size, st.st_mtime_ns)
        if _verified.get(key) != digest:
            to_check.append((f, key, digest))
    for (f, key, digest), found in zip(to_check, _sha256_all([f for f, _, _ in to_check], progress)):
        if found != digest:
            return f"{f}: does not match the SHA-256 {META_NAME} recorded at save: it is truncated, corrupt or changed"
        _verified[key] = digest
    return None


def verify_checksums(directory: str | os.PathLike, skip: tuple[str, ...] = (), progress: bool = False) -> None:
    """ModelLoadError (one line: the file, what to do) when a file of the checkpoint fails ``checksum_problem``;
    ``progress``: a bar of the bytes read (a large model's weights are minutes of reading)."""
    problem = checksum_problem(Path(directory), skip, progress)
    if problem is not None:
        raise ModelLoadError(f"{problem}; use an earlier checkpoint")


def step_dirs(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, dir)`` of every ``step_N`` directory directly under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), d) for d in root.iterdir() if (m := _STEP_DIR.match(d.name)) and d.is_dir()]
    return sorted(found)


def written_files(directory: Path) -> list[str]:
    """What a save leaves in the checkpoint folder it builds (meta.json included), ``/``-separated paths inside it
    (a sharded checkpoint's ``dcp/`` and the files in it): recorded in its meta.json as ``files``, so that pruning,
    --overwrite and a re-save later remove only those."""
    return sorted(set(_paths(Path(directory))) | {META_NAME})


def foreign_files(directory: str | os.PathLike) -> list[str]:
    """Paths in a ``step_N`` folder (subfolders included, ``dcp/notes.txt``) that no checkpoint save wrote: every
    path when it has no readable meta.json (it is not a checkpoint), the paths beyond its meta.json's ``files``
    otherwise (a checkpoint saved before meta.json recorded them: none; one saved before it recorded dcp/'s files:
    those beyond DCP's own there). What --overwrite, pruning and a re-save may delete is a checkpoint with none."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    paths = _paths(directory)
    try:
        files = json.loads((directory / META_NAME).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return paths
    if not isinstance(files, list):
        return []
    ours = set(files)
    if DCP_DIR in ours and not any(f.startswith(DCP_DIR + "/") for f in ours):  # recorded before dcp/'s files were
        ours |= {p for p in paths if _DCP_FILE.match(p)}
    return [p for p in paths if p not in ours]


_DCP_FILE = re.compile(rf"^{DCP_DIR}/(\.metadata|__\d+_\d+\.distcp)$")  # what DCP writes: metadata, a file per rank


def _paths(directory: Path) -> list[str]:
    """Every file and folder under ``directory`` but our temporary ones, as sorted ``/``-separated relative paths."""
    found = []
    for p in directory.iterdir():
        if is_temp_name(p.name):
            continue
        found.append(p.name)
        if p.is_dir() and not p.is_symlink():
            found += [f"{p.name}/{q}" for q in _paths(p)]
    return sorted(found)


def is_own_checkpoint(path: Path) -> bool:
    """A checkpoint folder a save may replace: one holding only what a save wrote (or nothing)."""
    return not foreign_files(path)


def checkpoint_problem(directory: Path, need_optimizer: bool = False, progress: bool = False) -> str | None:
    """Why ``directory`` cannot be used as a checkpoint (missing or truncated files), or None. ``progress``: a bar of
    the check of its files' SHA-256s (``checksum_problem``).

    Cheap: reads the safetensors header and checks the file holds every byte it promises, and opens the
    optimizer's zip directory (at the file's end, so a truncated file fails), without loading tensors. A sharded
    checkpoint: DCP's metadata, and every shard file as long as the metadata says.
    """
    meta = directory / META_NAME
    try:
        info = json.loads(meta.read_text()) if meta.is_file() else {}
    except (OSError, ValueError):
        return f"{meta} is damaged"
    if info.get("diverged"):
        return "it was saved by a diverged run"
    problem = _file_problem(directory, need_optimizer)
    if problem is None:  # every file whole: its bytes as saved (a checkpoint with hashes in meta.json)
        problem = checksum_problem(directory, skip=() if need_optimizer else (OPTIMIZER_NAME,), progress=progress)
    return problem


def _file_problem(directory: Path, need_optimizer: bool) -> str | None:
    """``checkpoint_problem``'s look at the files themselves: missing, truncated, unreadable headers."""
    if is_sharded_checkpoint(directory):
        if not (directory / CONFIG_NAME).is_file():
            return f"{directory / CONFIG_NAME} is missing"
        from cookmind.model.sharded_io import sharded_problem  # DCP, imported only for a sharded checkpoint

        return sharded_problem(directory, need_optimizer)
    weights = directory / WEIGHTS_NAME
    if not weights.is_file() or not (directory / CONFIG_NAME).is_file():
        return f"{weights} or {CONFIG_NAME} is missing"
    try:
        with open(weights, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > weights.stat().st_size - 8:  # read as asked, a text file's 8 bytes were a MemoryError
                return f"{weights} is truncated or not a safetensors file (a Git LFS pointer?)"
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if weights.stat().st_size < 8 + n + end:
            return f"{weights} is truncated"
    except (OSError, ValueError, KeyError, TypeError):
        return f"{weights} is damaged"
    if need_optimizer:
        opt = directory / OPTIMIZER_NAME
        try:
            zipfile.ZipFile(opt).close()
        except (OSError, zipfile.BadZipFile):
            return f"{opt} is missing or truncated"
    return None


def latest_checkpoint(path: str | os.PathLike, need_optimizer: bool = False, progress: bool = False) -> Path | None:
    """THE rule for "the newest complete checkpoint", used by resume, load, export, eval and generate.

    ``path`` is a checkpoint itself (returned as is), a checkpoint root with ``step_N`` directories, or a run
    directory with ``checkpoints/``. The newest ``step_N`` holding ``meta.json`` (a training checkpoint's
    last file) or a saved model (config.json + weights: model.safetensors or a sharded ``dcp/``), whose files are
    whole (and match the SHA-256s its meta.json recorded) and which was not saved by a diverged run, wins; each
    newer one passed over is named in a CheckpointWarning. ``need_optimizer`` (resume) also requires the optimizer
    state (``optimizer.pt`` readable, or listed in the sharded checkpoint). ``progress``: a bar of the check of the
    SHA-256s (a checkpoint's weights are read whole: minutes for a large model).
    """
    path = Path(path)
    if (path / META_NAME).is_file() or (path / CONFIG_NAME).is_file():
        return path
    for root in (path, path / "checkpoints"):
        complete = [d for _, d in step_dirs(root) if is_checkpoint_dir(d)]
        for k, d in reversed(list(enumerate(complete))):
            problem = checkpoint_problem(d, need_optimizer, progress)
            if problem is None:
                return d
            then = "trying an older one" if k else "and there is no older one"
            warnings.warn(f"skipping checkpoint {d}: {problem}; {then}", CheckpointWarning, stacklevel=2)
        if complete:
            return None
    return None


def resolve_model_dir(path: str | os.PathLike, progress: bool = False) -> Path:
    """A model directory as given; a training run (or its ``checkpoints/``) -> its newest complete checkpoint
    (``latest_checkpoint``, ``progress`` its bar). Anything else is returned unchanged, for the loader to report."""
    found = latest_checkpoint(path, progress=progress)
    return found if found is not None else Path(path)


def load_config(directory: str | os.PathLike) -> CookMindConfig:
    """Read `directory`/config.json into a CookMindConfig, with errors naming the file."""
    path = Path(directory) / CONFIG_NAME
    if not Path(directory).is_dir():
        what = "a file, not a model folder" if Path(directory).exists() else "no such directory"
        raise ModelLoadError(
            f"{directory}: {what}; name a checkpoint, a training run (its newest complete checkpoint) "
            "or a Hugging Face folder"
        )
    run_files = ("checkpoints", "config.yaml")  # a run before its first save holds its config.yaml alone
    if not path.is_file() and any((Path(directory) / name).exists() for name in run_files):
        saved = [d.name for root in (Path(directory), Path(directory) / "checkpoints") for _, d in step_dirs(root)]
        if saved:  # each was passed over with a warning saying why: "yet" and "an older one" misled
            raise ModelLoadError(
                f"{directory}: none of its checkpoints ({', '.join(saved[-3:])}) is complete and whole (the warnings "
                "above say why); restore one from a copy, or train again"
            )
        raise ModelLoadError(f"{directory}: a training run without a complete checkpoint in its checkpoints/ yet")
    if not path.is_file() and (Path(directory) / "adapter_config.json").is_file():
        raise ModelLoadError(_adapter_not_model(Path(directory)))
    if not path.is_file() and (Path(directory) / "meta.json").is_file() and any(Path(directory).glob("shard_*")):
        raise ModelLoadError(
            f"{directory} holds a token store (`cookmind pack`'s output), not a model; name a checkpoint, a training "
            "run or a Hugging Face folder"
        )
    if not path.is_file() and (Path(directory) / "cookmind_tokenizer.json").is_file():
        raise ModelLoadError(
            f"{directory} holds a tokenizer (cookmind_tokenizer.json), not a model; name a checkpoint, a training "
            "run or a Hugging Face folder (the tokenizer goes to --tokenizer)"
        )
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing; a CookMind model directory needs {CONFIG_NAME} and {WEIGHTS_NAME}")
    verify_checksums(directory, skip=(WEIGHTS_NAME, OPTIMIZER_NAME))  # config.json (and the tokenizer's files)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc}); the file is truncated or corrupt") from exc
    try:
        return CookMindConfig.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def read_weights(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file; a missing or truncated file raises ModelLoadError naming it. On the CPU they
    are mapped, not read: their bytes come from the disk where they are first used (``write_safetensors`` shows it)."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing weights file")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: cannot read safetensors ({exc}); the file is truncated or corrupt") from exc


def read_model_weights(
    directory: str | os.PathLike, config: CookMindConfig, progress: bool = False
) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the file named in errors, the weights) of a model directory: ``model.safetensors``, or a sharded
    checkpoint's ``dcp/`` consolidated in this process (a tied ``lm_head.weight`` dropped, as save_model does);
    ``progress``: a bar of the shards' reading (a model.safetensors is mapped, not read here) and of the check of the
    SHA-256s its meta.json recorded."""
    directory = Path(directory)
    if not is_sharded_checkpoint(directory):  # a sharded one is its dcp/, as resume reads it, whatever lies beside
        if (directory / WEIGHTS_NAME).is_file():
            verify_checksums(directory, skip=(OPTIMIZER_NAME,), progress=progress)
        return directory / WEIGHTS_NAME, read_weights(directory / WEIGHTS_NAME)
    from cookmind.model.sharded_io import read_sharded_weights  # DCP, imported only for a sharded checkpoint

    verify_checksums(directory, progress=progress)  # the shards (model and optimizer share them), as saved
    try:
        found = read_sharded_weights(directory, progress=progress)
    except ShardedCheckpointError as exc:
        raise ModelLoadError(str(exc)) from None
    if found and all(".lora_A." in k or ".lora_B." in k for k in found):
        found = _merged_onto_base(directory, found, progress)
    if config.tie_word_embeddings:
        found.pop("lm_head.weight", None)
    return dcp_dir(directory), found


def _adapter_not_model(directory: Path) -> str:
    """What to say of a folder holding a LoRA adapter alone (save_adapter's output, a PEFT adapter) given as a
    model: it was "config.json: missing; a CookMind model directory needs config.json and model.safetensors"."""
    try:
        base = json.loads((directory / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    on = f"trained on {base}" if base else "its base is not recorded"
    return (
        f"{directory} holds a LoRA adapter (adapter_config.json; {on}), not a model: serve it on its base with "
        f"`cookmind serve BASE --lora NAME={directory}`, or give the LoRA training run, whose checkpoints hold the "
        "merged model"
    )


def recorded_lora_base(directory: str | os.PathLike) -> tuple[dict, dict, str | None]:
    """(meta.json, its run's ``lora`` settings, its ``train.init_from``) of the training checkpoint ``directory``:
    the base model a LoRA run's sharded checkpoint (its dcp/ holds the adapter only) is merged onto when it loads
    (``resolve_model_dir`` of it). A ModelLoadError when meta.json cannot tell (missing, damaged, not a run's)."""
    path = Path(directory) / META_NAME
    try:
        meta = json.loads(path.read_text())
        run = meta["config"]
        base, lora = run["train"]["init_from"], dict(run["lora"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(
            f"{path}: cannot tell this LoRA checkpoint's base model ({exc}); its dcp/ holds the adapter only"
        ) from None
    return meta, lora, base


def _merged_onto_base(
    directory: Path, adapter: dict[str, torch.Tensor], progress: bool = False
) -> dict[str, torch.Tensor]:
    """A LoRA run's sharded checkpoint holds its adapter only: fold it into the run's base (``train.init_from``
    in meta.json) to get the weights a full-format checkpoint would hold. Where the base is a run that saved on
    since, the checkpoint whose weights the adapter recorded (``BASE_FINGERPRINT_KEY``) is taken, not the newest."""
    from cookmind.model.lora import apply_lora, merged_copy

    meta, lora, base = recorded_lora_base(directory)
    base_dir = resolve_model_dir(base, progress=progress) if base else None
    if base_dir is None or not (base_dir / CONFIG_NAME).is_file():
        raise ModelLoadError(
            f"{dcp_dir(directory)}: holds a LoRA adapter only, and its base model train.init_from={base!r} (from "
            f"{directory / META_NAME}) is not a model directory here; put the base model back at that path (a "
            "relative one is read from the directory this command runs in: run it where the training ran)"
        )
    from cookmind.model.hf import load_model_or_hf  # hf reads through this module: imported here

    model = load_model_or_hf(base_dir, dtype=next(iter(adapter.values())).dtype)  # --init-from takes either
    recorded = meta.get(BASE_FINGERPRINT_KEY) if isinstance(meta, dict) else None
    if recorded and _differs(recorded, model):
        model = _base_trained_on(directory, base, base_dir, recorded, model)
    apply_lora(model, lora["r"], lora["alpha"], 0.0, lora["targets"])
    missing = set(adapter) - set(model.state_dict())
    if missing:
        raise ModelLoadError(f"{dcp_dir(directory)}: adapter tensors {sorted(missing)[:5]} do not fit {base_dir}")
    model.load_state_dict(adapter, strict=False)
    return dict(merged_copy(model).state_dict())


def _differs(recorded: dict, model) -> str | None:
    from cookmind.model.fingerprint import fingerprint_mismatch

    return fingerprint_mismatch(recorded, model)


def base_checkpoint_trained_on(base_dir: Path, recorded: dict, dtype: torch.dtype | None = None):
    """(the checkpoint, its model) beside ``base_dir`` (the base run's other checkpoints, newest first) whose
    weights match the fingerprint a LoRA run recorded of its base, or None when none is left."""
    from cookmind.model.hf import load_model_or_hf

    for _, older in reversed(step_dirs(base_dir.parent)):
        if older == base_dir or checkpoint_problem(older) is not None:
            continue
        candidate = load_model_or_hf(older, dtype=dtype)
        if _differs(recorded, candidate) is None:
            return older, candidate
    return None


def _base_trained_on(directory: Path, base: str, base_dir: Path, recorded: dict, model):
    """The checkpoint beside ``base_dir`` (newest first) whose weights are those the LoRA run trained on, loaded,
    with a warning naming it; a ModelLoadError when none is left (its run trained on and pruned it)."""
    where = _differs(recorded, model)
    found = base_checkpoint_trained_on(base_dir, recorded, dtype=next(iter(model.parameters())).dtype)
    if found is not None:
        older, candidate = found
        warnings.warn(
            f"{directory}: its LoRA adapter is merged onto {older}, the base checkpoint it trained on; "
            f"train.init_from={base} now gives {base_dir}, whose weights differ (at {where})",
            CheckpointWarning,
            stacklevel=3,
        )
        return candidate
    raise ModelLoadError(
        f"{dcp_dir(directory)}: its LoRA adapter was trained on other base weights than {base_dir} (train.init_from="
        f"{base} now; they differ at {where}), and no checkpoint beside it holds those: restore the base checkpoint "
        "the run started from beside it (a resume refuses too)"
    )


def check_state_dict(path: Path, expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor]) -> None:
    """Raise one ModelLoadError listing missing, unexpected and wrongly-shaped tensors of `path`."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = [
        f"{k}: file {tuple(found[k].shape)} vs config {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(found))
        if found[k].shape != expected[k].shape
    ]
    if missing or unexpected or wrong:
        parts = []
        if wrong:
            parts.append(f"shape mismatch in {len(wrong)} tensors: " + "; ".join(wrong[:5]))
        if missing:
            parts.append(f"missing {len(missing)} tensors: {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} tensors: {unexpected[:5]}")
        raise ModelLoadError(f"{path}: does not match {path.parent / CONFIG_NAME}: " + " | ".join(parts))


def load_model(
    directory: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    progress: bool = False,
) -> CookMindLM:
    """Load a model saved by save_model (or the model part of a training checkpoint, full or sharded).

    A training run (or its ``checkpoints/``) means its newest complete checkpoint, as for every command.
    dtype=None keeps the dtype stored in the file. Errors name the file and the mismatch. ``progress``: bars of
    the checks of the weights' SHA-256s (finding a run's newest checkpoint, then reading it) and of a sharded read.
    """
    directory = resolve_model_dir(directory, progress=progress)
    cfg = load_config(directory)
    weights_path, found = read_model_weights(directory, cfg, progress)
    with torch.device("meta"):  # shapes only: no random init of weights about to be overwritten
        model = CookMindLM(cfg)
    check_state_dict(weights_path, model_state_dict(model), found)
    if dtype is None:
        dtype = next(iter(found.values())).dtype if found else torch.float32
    model.load_state_dict(found, strict=not cfg.tie_word_embeddings, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # assign=True replaced the shared tensor
    # derived, unsaved buffers (RoPE frequencies) were computed for real even on the meta device (rope.py)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise ModelLoadError(f"{weights_path}: internal error: {left[:5]} were not loaded")
    return model.to(device=device, dtype=dtype)
