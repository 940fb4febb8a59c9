"""Sharded checkpoints (torch.distributed.checkpoint): save/resume, resume at another world size (2 -> 1, 1 -> 2),
FSDP2-sharded models, async saves, export and loading from one process, SIGTERM and crashes mid-save."""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from gloo_fixtures import main_on_ranks, run_on_gloo_ranks
from lm_fixtures import tiny_cli_overrides, tiny_lm

from cookmind.cli import main as cookmind_main
from cookmind.model import load_model
from cookmind.model.model_io import latest_checkpoint, read_weights
from cookmind.model.sharded_io import read_metadata, read_sharded_weights
from cookmind.model.sharded_layout import ShardedCheckpointError, is_sharded_checkpoint
from cookmind.train import TrainConfig, Trainer
from cookmind.train import cli as train_cli
from cookmind.train.checkpoint import find_latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.usefixtures("keep_threads")

COMMON = [
    "data.window_size=16",
    "train.seed=3",
    "train.device=cpu",
    "train.threads=1",
    "optim.lr=1e-2",
    "optim.warmup_steps=1",
    "optim.schedule=constant",  # a run cut at step 2 (max_steps=2) then resumed sees the same learning rates
    "train.grad_accum_steps=2",
    "logging.progress=false",
    "logging.report=false",
    "eval.every=0",
    "checkpoint.keep_last=0",
    *tiny_cli_overrides(),
]


@pytest.fixture
def store(tmp_path):
    from cookmind.store import write_store

    rng = np.random.default_rng(0)
    rows = [{"sequence": rng.integers(1, 64, size=60)} for _ in range(12)]
    return write_store(tmp_path / "seq", "seq", rows, vocab_size=64)


def _overrides(store, run_dir, *extra):
    return [f"data.train_path={store}", f"logging.run_dir={run_dir}", *COMMON, *extra]


def _train(store, run_dir, *extra):
    """One in-process run (micro-batch 4: the global batch of two ranks at micro-batch 2)."""
    cfg = TrainConfig.load("tiny-cpu", _overrides(store, run_dir, "train.micro_batch_size=4", *extra))
    return Trainer(cfg).fit()


def _torchrun(tmp_path, store, run_dir, *extra):
    """The same run as ``_train`` on two gloo ranks at micro-batch 2 (`cookmind train` as torchrun starts it)."""
    argv = ["train", *_overrides(store, run_dir, "train.micro_batch_size=2", *extra)]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    main_on_ranks(cookmind_main, [argv], tmp_path, env, cwd=tmp_path)


def _weights(run_dir, step):
    return load_model(Path(run_dir) / "checkpoints" / f"step_{step:08d}").state_dict()


def _assert_same(a, b, exact=True):
    assert set(a) == set(b)
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), f"{k}: max diff {(a[k] - b[k]).abs().max()}"
        else:  # another world size sums the gradients in another order: float rounding only
            torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)


def test_sharded_save_resume_equals_an_uninterrupted_run_bit_for_bit(tmp_path, store):
    _train(store, tmp_path / "full", "train.max_steps=4", "checkpoint.format=full")
    _train(store, tmp_path / "cut", "train.max_steps=2", "checkpoint.format=sharded")
    step2 = tmp_path / "cut" / "checkpoints" / "step_00000002"
    assert is_sharded_checkpoint(step2) and not (step2 / "model.safetensors").exists()
    assert {"config.json", "meta.json", "dcp"} <= {p.name for p in step2.iterdir()}
    _train(store, tmp_path / "cut", "train.max_steps=4", "checkpoint.format=sharded", "checkpoint.resume=auto")
    assert find_latest_checkpoint(tmp_path / "cut", need_optimizer=True).name == "step_00000004"
    _assert_same(_weights(tmp_path / "full", 4), _weights(tmp_path / "cut", 4))
    # the optimizer state came back too: both runs' AdamW moments at step 4 are the same
    opts = []
    for run in ("full", "cut"):
        resume = f"checkpoint.resume={tmp_path / run / 'checkpoints' / 'step_00000004'}"
        cfg = TrainConfig.load("tiny-cpu", _overrides(store, tmp_path / f"x-{run}", "train.micro_batch_size=4", resume))
        opts.append(Trainer(cfg).optimizer.state_dict()["state"])
    assert opts[0].keys() == opts[1].keys() and opts[0]
    for i in opts[0]:
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opts[0][i][name], opts[1][i][name]), (i, name)


def test_export_and_load_of_a_sharded_checkpoint_equal_the_full_format(tmp_path, store):
    from cookmind.infer.loading import load_model_dir
    from cookmind.model import cli_export

    _train(store, tmp_path / "full", "train.max_steps=2", "checkpoint.format=full")
    _train(store, tmp_path / "sharded", "train.max_steps=2", "checkpoint.format=sharded")
    for run in ("full", "sharded"):
        args = argparse_export(str(tmp_path / run), str(tmp_path / f"hf-{run}"))
        assert cli_export.main(args) == 0
    a = read_weights(tmp_path / "hf-full" / "model.safetensors")
    b = read_weights(tmp_path / "hf-sharded" / "model.safetensors")
    _assert_same(a, b)
    assert sorted(os.listdir(tmp_path / "hf-full")) == sorted(os.listdir(tmp_path / "hf-sharded"))
    _assert_same(load_model_dir(tmp_path / "full").state_dict(), load_model_dir(tmp_path / "sharded").state_dict())


def argparse_export(model, out):
    import argparse

    from cookmind.model import cli_export

    parser = argparse.ArgumentParser()
    cli_export.add_arguments(parser)
    return parser.parse_args(["--hf", model, out])


def _assert_shards_hashed(step_dir: Path) -> None:
    """meta.json's sha256 holds every file of dcp/ (each rank's shard and DCP's .metadata), as hashlib reads it."""
    import hashlib

    recorded = json.loads((step_dir / "meta.json").read_text())["sha256"]
    files = sorted((step_dir / "dcp").iterdir())
    assert len(files) >= 2
    for f in files:
        assert recorded.get(f"dcp/{f.name}") == hashlib.sha256(f.read_bytes()).hexdigest(), f.name


def test_a_bit_flipped_in_a_shard_is_refused_by_every_loader_and_passed_over_by_resume_auto(tmp_path, store):
    """A bit flipped in a shard's tensor data (its size kept: DCP's own reads cannot see it) loaded other weights
    without a word: only the full format's files were hashed. Each rank now records its shard's SHA-256, and resume,
    load, export and --resume auto check them and name the shard."""
    from cookmind.model.hf import export_hf
    from cookmind.model.model_io import CheckpointWarning, ModelLoadError

    _train(store, tmp_path / "r", "train.max_steps=2", "checkpoint.format=sharded", "checkpoint.every=1")
    step1, step2 = (tmp_path / "r" / "checkpoints" / f"step_0000000{i}" for i in (1, 2))
    _assert_shards_hashed(step2)
    shard = step2 / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    damaged = r"step_00000002/dcp/__0_0\.distcp: does not match the SHA-256 .*; use an earlier checkpoint"
    for load in (
        lambda: load_checkpoint(step2, tiny_lm()),
        lambda: load_model(step2),
        lambda: export_hf(step2, tmp_path / "hf"),
    ):
        with pytest.raises(ModelLoadError, match=damaged):
            load()
    with pytest.warns(CheckpointWarning, match=r"skipping checkpoint .*step_00000002: .*__0_0\.distcp"):
        assert find_latest_checkpoint(tmp_path / "r" / "checkpoints") == step1


def test_two_ranks_to_one_and_one_to_two(tmp_path, store):
    # 2 -> 1: two DDP ranks save a sharded checkpoint at step 2, one process resumes it to step 4.
    _train(store, tmp_path / "ref", "train.max_steps=4", "checkpoint.format=full")
    _torchrun(tmp_path, store, tmp_path / "two", "train.max_steps=2", "checkpoint.format=sharded")
    meta = json.loads((tmp_path / "two/checkpoints/step_00000002/meta.json").read_text())
    assert meta["world_size"] == 2
    shards = os.listdir(tmp_path / "two/checkpoints/step_00000002/dcp")
    assert sorted(s for s in shards if s.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    _assert_shards_hashed(tmp_path / "two/checkpoints/step_00000002")
    _train(store, tmp_path / "two", "train.max_steps=4", "checkpoint.format=sharded", "checkpoint.resume=auto")
    _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / "two", 4), exact=False)
    # 1 -> 2: one process saves at step 2, two ranks resume it to step 4 (and save in the background)
    _train(store, tmp_path / "one", "train.max_steps=2", "checkpoint.format=sharded")
    _torchrun(
        tmp_path,
        store,
        tmp_path / "one",
        "train.max_steps=4",
        "checkpoint.format=sharded",
        "checkpoint.async_save=true",
        "checkpoint.resume=auto",
    )
    assert json.loads((tmp_path / "one/checkpoints/step_00000004/meta.json").read_text())["world_size"] == 2
    _assert_shards_hashed(tmp_path / "one/checkpoints/step_00000004")  # saved in the background by two ranks
    _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / "one", 4), exact=False)


def test_a_resume_at_another_world_size_warns_when_the_global_batch_changes(tmp_path, store):
    """The README's 2 -> 1 resume (the same command without torchrun) kept each rank's micro-batch, so one process
    went on at half the global batch with no word, and ended far from the uninterrupted run. The resume says so in
    one line naming the setting that keeps the global batch; a resume that keeps it says nothing."""
    import shutil
    import warnings

    _torchrun(tmp_path, store, tmp_path / "two", "train.max_steps=2", "checkpoint.format=sharded")
    shutil.copytree(tmp_path / "two", tmp_path / "kept")
    resume = ["train.max_steps=4", "checkpoint.format=sharded", "checkpoint.resume=auto"]
    with pytest.warns(UserWarning) as caught:  # micro-batch 2 x accumulation 2 x 1 process: 4, where it was 8
        cfg = TrainConfig.load("tiny-cpu", _overrides(store, tmp_path / "two", "train.micro_batch_size=2", *resume))
        Trainer(cfg).fit()
    said = [str(w.message) for w in caught if "global batch" in str(w.message)]
    assert said == [
        "the global batch is 4 (train.micro_batch_size=2 x train.grad_accum_steps=2 x 1 process), the "
        "checkpoint's run had 8 (2 x 2 x 2 processes): this run takes other steps than the run it continues; to "
        "keep 8, set train.grad_accum_steps=4 (or train.micro_batch_size=4)"
    ]
    with warnings.catch_warnings(record=True) as quiet:  # the advice: no warning
        warnings.simplefilter("always")
        _train(store, tmp_path / "kept", *resume)
    assert not [w for w in quiet if "global batch" in str(w.message)]


def test_async_save_completes_every_checkpoint_and_resumes(tmp_path, store):
    _train(store, tmp_path / "ref", "train.max_steps=4", "checkpoint.format=full")
    extra = ["checkpoint.format=sharded", "checkpoint.async_save=true", "checkpoint.every=1"]
    _train(store, tmp_path / "a", "train.max_steps=3", *extra)
    ckpts = tmp_path / "a" / "checkpoints"
    assert sorted(os.listdir(ckpts)) == [f"step_0000000{i}" for i in (1, 2, 3)]  # no temporary left behind
    assert all((ckpts / d / "meta.json").is_file() for d in os.listdir(ckpts))
    _train(store, tmp_path / "a", "train.max_steps=4", *extra, "checkpoint.resume=auto")
    _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / "a", 4))


def test_sigterm_saves_a_sharded_checkpoint_and_exits_128_plus_n(tmp_path, store, sigterm_at_step):
    sigterm_at_step(1)
    run = tmp_path / "run"
    argv = _overrides(store, run, "train.micro_batch_size=4", "train.max_steps=50")
    parser = __import__("argparse").ArgumentParser()
    train_cli.add_arguments(parser)
    code = train_cli.main(parser.parse_args([*argv, "checkpoint.format=sharded", "checkpoint.async_save=true"]))
    assert code == 128 + signal.SIGTERM
    assert os.listdir(run / "checkpoints") == ["step_00000002"]
    assert latest_checkpoint(run, need_optimizer=True).name == "step_00000002"


@pytest.mark.parametrize("background", [False, True])
def test_a_crash_mid_save_leaves_no_complete_looking_directory(tmp_path, store, monkeypatch, background):
    from concurrent.futures import Future

    import torch.distributed.checkpoint as dcp

    _train(store, tmp_path / "r", "train.max_steps=1", "checkpoint.format=sharded")
    save = dcp.save

    def save_then_crash(state, checkpoint_id, **kwargs):
        save(state, checkpoint_id=checkpoint_id, no_dist=True)  # the shards and .metadata are written ...
        raise OSError("simulated crash")  # ... but the save never completes

    def async_save_then_crash(state, checkpoint_id, **kwargs):
        future = Future()
        try:
            save_then_crash(state, checkpoint_id)
        except OSError as exc:
            future.set_exception(exc)  # the background writer fails: seen when the save is waited for
        return future

    monkeypatch.setattr(dcp, "save", save_then_crash)
    monkeypatch.setattr(dcp, "async_save", async_save_then_crash)
    bg = ["checkpoint.async_save=true"] if background else []
    with pytest.raises(OSError, match="simulated crash"):
        _train(store, tmp_path / "r", "train.max_steps=2", "checkpoint.format=sharded", "checkpoint.resume=auto", *bg)
    assert os.listdir(tmp_path / "r" / "checkpoints") == ["step_00000001"]
    assert latest_checkpoint(tmp_path / "r").name == "step_00000001"


def test_damaged_and_hostile_shards_are_refused(tmp_path, store):
    _train(store, tmp_path / "r", "train.max_steps=2", "checkpoint.format=sharded", "checkpoint.every=1")
    step1, step2 = (tmp_path / "r" / "checkpoints" / f"step_0000000{i}" for i in (1, 2))
    shard = step2 / "dcp" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated: passed over for the older checkpoint
    with pytest.warns(UserWarning, match="is truncated"):
        assert latest_checkpoint(tmp_path / "r") == step1

    class Boom:  # a pickle that would run os.system if unpickled freely
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    (step1 / "dcp" / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(ShardedCheckpointError, match="refused to load: posix.system is not allowed"):
        read_sharded_weights(step1)
    assert not (tmp_path / "pwned").exists()


def test_a_lora_run_saves_the_adapter_only_and_resumes(tmp_path, store):
    from cookmind.model import save_model

    torch.manual_seed(5)
    save_model(tmp_path / "init", tiny_lm())
    lora = [f"train.init_from={tmp_path / 'init'}", "lora.enabled=true", "lora.r=4", "lora.alpha=8"]
    _train(store, tmp_path / "ref", "train.max_steps=4", "checkpoint.format=full", *lora)
    _train(store, tmp_path / "cut", "train.max_steps=2", "checkpoint.format=sharded", *lora)

    keys = read_metadata(tmp_path / "cut/checkpoints/step_00000002").state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys), model_keys[:5]
    _train(store, tmp_path / "cut", "train.max_steps=4", "checkpoint.format=sharded", "checkpoint.resume=auto", *lora)
    # the full format holds the merged model; the sharded one is merged onto train.init_from when read
    _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / "cut", 4))
    base = load_model(tmp_path / "init").state_dict()
    assert any(not torch.equal(base[k], v) for k, v in _weights(tmp_path / "cut", 4).items()), "the adapter trained"


def test_a_sharded_lora_runs_adapter_serves_as_the_full_formats_does(tmp_path, store):
    """`cookmind serve --lora NAME=RUN` takes a LoRA training run (README), but a run under FSDP saves sharded by
    default, its adapter in dcp/ with no adapter_config.json: serve stopped with "adapter_config.json: missing;
    ... holds no LoRA adapter". The sharded checkpoint's adapter reads as the full format's PEFT files."""
    from cookmind.infer.loading import load_adapters
    from cookmind.model import save_model

    torch.manual_seed(5)
    save_model(tmp_path / "init", tiny_lm())
    lora = [f"train.init_from={tmp_path / 'init'}", "lora.enabled=true", "lora.r=4", "lora.alpha=8"]
    _train(store, tmp_path / "full", "train.max_steps=2", "checkpoint.format=full", *lora)
    _train(store, tmp_path / "sharded", "train.max_steps=2", "checkpoint.format=sharded", *lora)
    base = load_model(tmp_path / "init")
    (full,) = load_adapters(base, {"full": tmp_path / "full"})
    (sharded,) = load_adapters(base, {"sharded": tmp_path / "sharded"})
    assert sharded.path == tmp_path / "sharded" / "checkpoints" / "step_00000002"
    assert sharded.scaling == full.scaling == 2.0 and set(sharded.weights) == set(full.weights)
    for module, (a, b) in full.weights.items():
        assert torch.equal(a, sharded.weights[module][0]) and torch.equal(b, sharded.weights[module][1]), module


def test_a_sharded_lora_run_whose_base_is_gone_says_what_would_read_it(tmp_path, store):
    """Its export said "resume the run and save with checkpoint.format=full": a resume needs the same base, and an
    FSDP run refuses that format. The error says what does work: the base back at its path, or the directory a
    relative train.init_from is read from."""
    from cookmind.model import save_model
    from cookmind.model.model_io import ModelLoadError, read_model_weights

    torch.manual_seed(5)
    save_model(tmp_path / "init", tiny_lm())
    lora = [f"train.init_from={tmp_path / 'init'}", "lora.enabled=true", "lora.r=4", "lora.alpha=8"]
    _train(store, tmp_path / "sharded", "train.max_steps=2", "checkpoint.format=sharded", *lora)
    (tmp_path / "init").rename(tmp_path / "moved")
    step = tmp_path / "sharded" / "checkpoints" / "step_00000002"
    with pytest.raises(ModelLoadError) as e:
        read_model_weights(step, load_model(tmp_path / "moved").config)
    said = str(e.value)
    assert f"train.init_from={str(tmp_path / 'init')!r}" in said and "format=full" not in said, said
    assert "put the base model back at that path" in said and "\n" not in said, said


# -- FSDP2-sharded models (two gloo ranks, fully_shard applied here until parallel.fsdp lands) -------------------


def _fsdp_lm(seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = tiny_lm()
    for block in model.model.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def _fsdp_save_and_resume(rank):
    """On each of two ranks: shard a tiny model, take one AdamW step with known gradients, save it sharded (in the
    background); then load it into a differently initialised FSDP model. Returns both full weights and the
    resumed optimizer's step counts."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from cookmind.train.sharded_checkpoint import ShardedCheckpointer, resolve_format

    root = Path(os.environ["COOKMIND_TEST_ROOT"])
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model = _fsdp_lm(0)
    assert resolve_format("auto", model) == "sharded"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for i, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, 0.01 * (i + 1))
    opt.step()
    saver = ShardedCheckpointer(rank, 2, async_save=True)
    saver.save(root / "step_00000001", model, opt, {"step": 1, "run_id": "r"})
    saver.wait()
    saved = {k: v.clone() for k, v in get_model_state_dict(model, options=full).items()}

    other = _fsdp_lm(1)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    assert load_checkpoint(root / "step_00000001", other, other_opt)["step"] == 1
    steps = {float(s["step"]) for s in other_opt.state_dict()["state"].values()}
    resumed = {k: v.clone() for k, v in get_model_state_dict(other, options=full).items()}
    return saved, resumed, steps


def test_fsdp_sharded_model_saves_and_resumes_on_two_ranks_and_loads_in_one_process(tmp_path, monkeypatch):
    root = tmp_path / "ckpts"
    monkeypatch.setenv("COOKMIND_TEST_ROOT", str(root))  # the spawned ranks read it
    saved, resumed, steps = run_on_gloo_ranks(_fsdp_save_and_resume, 2, tmp_path)[0]
    step = root / "step_00000001"
    assert sorted(f for f in os.listdir(step / "dcp") if f.endswith(".distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    # two ranks, into a model initialised differently: the saved weights and optimizer steps come back
    _assert_same(resumed, saved)
    assert steps == {1.0}
    # one process, no group: the consolidated weights are the FSDP model's full weights, optimizer included
    _assert_same(load_model(step).state_dict(), saved)
    plain = tiny_lm()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    load_checkpoint(step, plain, opt)
    _assert_same(plain.state_dict(), saved)
    assert all(float(s["step"]) == 1.0 for s in opt.state_dict()["state"].values())


def _save_where_each_rank_sees_its_own_directory(rank):
    """Two nodes whose checkpoint directory is not shared: the same relative path names another folder on each
    rank (each runs in a folder of its own). Returns the error the save raised, or None."""
    from cookmind.parallel.process_group import DistInfo
    from cookmind.train.sharded_checkpoint import ShardedCheckpointer, check_shared

    node = Path(os.environ["COOKMIND_TEST_ROOT"]) / f"node{rank}"
    (node / "ckpt").mkdir(parents=True)
    os.chdir(node)
    torch.manual_seed(0)
    said = []
    for start in (True, False):  # the Trainer's check as a run starts, then a save
        try:
            if start:
                check_shared("ckpt/not_made_yet", DistInfo(rank, 2))  # rank 0 tries the nearest folder it has
            else:
                ShardedCheckpointer(rank, 2).save(Path("ckpt/step_00000001"), tiny_lm(), None, {"step": 1})
            said.append(None)
        except Exception as exc:  # noqa: BLE001 - the test reads its message
            said.append(str(exc))
    return said


def test_a_checkpoint_directory_the_nodes_do_not_share_stops_the_save_with_one_line(tmp_path, monkeypatch):
    # each rank wrote its shard into its own node's folder and rank 0 named the step complete, its meta.json
    # hashing a shard its folder lacks: the run ended "completed" with every checkpoint unreadable
    root = tmp_path / "nodes"
    monkeypatch.setenv("COOKMIND_TEST_ROOT", str(root))
    ranks = run_on_gloo_ranks(_save_where_each_rank_sees_its_own_directory, 2, tmp_path)
    errors = [e for said in ranks for e in said]
    assert all(e is not None and "a filesystem every node shares" in e for e in errors), errors
    assert all("rank 1" in e for e in ranks[0]), ranks[0]  # rank 0 names the rank that could not see its folder
    assert "could not start" in ranks[0][0] and "could not save step_00000001" in ranks[0][1], ranks[0]
    # the start's check made its folder in the run's own checkpoint directory, not in the nearest folder above it
    assert all("ckpt/not_made_yet: this rank does not see" in e for e in (ranks[0][0], ranks[1][0])), ranks
    for r in (0, 1):  # nothing that looks like a checkpoint, no shard left behind on either node
        assert sorted(p.name for p in (root / f"node{r}" / "ckpt").iterdir()) == []


def _check_shared_under_a_file(rank):
    """The start's check where the checkpoint directory cannot be made (a file stands where a folder of its path
    goes), on a filesystem both ranks share. Returns the error it raised, or None."""
    from cookmind.parallel.process_group import DistInfo
    from cookmind.train.sharded_checkpoint import check_shared

    root = Path(os.environ["COOKMIND_TEST_ROOT"])
    try:
        check_shared(root / "a_file" / "ckpt", DistInfo(rank, 2))
    except Exception as exc:  # noqa: BLE001 - the test reads its message
        return f"{type(exc).__name__}: {exc}"
    return None


def test_a_checkpoint_directory_that_cannot_be_made_stops_the_start_with_one_line(tmp_path, monkeypatch):
    # the check walked up to the nearest folder that exists (root here, or /) and probed there: it passed, and the
    # run failed at its first save; where that folder was not writable it raised a bare PermissionError
    root = tmp_path / "shared"
    root.mkdir()
    (root / "a_file").write_text("not a folder")
    monkeypatch.setenv("COOKMIND_TEST_ROOT", str(root))
    said = run_on_gloo_ranks(_check_shared_under_a_file, 2, tmp_path)
    assert said[0] is not None and said[0].startswith(f"OSError: {root / 'a_file' / 'ckpt'}: cannot make "), said
    assert f"({root / 'a_file'} is not a folder)" in said[0] and "checkpoint.dir" in said[0], said[0]
    assert said[1] == said[0]  # rank 1 stops with rank 0's error
    assert sorted(p.name for p in root.iterdir()) == ["a_file"]  # no probe left beside it


def test_format_settings_that_cannot_work_are_one_line_errors(tmp_path):
    from cookmind.train.config import CheckpointConfig
    from cookmind.train.sharded_checkpoint import sharded_checkpointer

    base = [f"logging.run_dir={tmp_path}", *COMMON]
    with pytest.raises(ValueError, match=r"checkpoint.format must be one of \['auto', 'full', 'sharded'\]"):
        TrainConfig.load("tiny-cpu", [*base, "checkpoint.format=dcp"])
    with pytest.raises(ValueError, match="checkpoint.async_save needs checkpoint.format=sharded"):
        TrainConfig.load("tiny-cpu", [*base, "checkpoint.format=full", "checkpoint.async_save=true"])
    with pytest.raises(ValueError, match="does not support parallel.zero1"):
        TrainConfig.load("tiny-cpu", [*base, "checkpoint.format=sharded", "parallel.zero1=true"])
    # auto on a model FSDP did not shard is the full format, which cannot save in the background
    assert sharded_checkpointer(CheckpointConfig(), tiny_lm(), 0, 1) is None
    with pytest.raises(ValueError, match="async_save needs the sharded format"):
        sharded_checkpointer(CheckpointConfig(async_save=True), tiny_lm(), 0, 1)


def test_format_settings_the_config_decides_are_refused_at_load_before_the_model_is_built(tmp_path):
    # parallel.fsdp=true always shards the model (one process is a one-rank group), so these two cannot work
    # whatever the model: they were found only once the model was built and sharded (10 s at gpt2-small on a CPU)
    base = [f"logging.run_dir={tmp_path}", *COMMON]
    with pytest.raises(ValueError, match="checkpoint.format=full cannot save an FSDP-sharded model"):
        TrainConfig.load("tiny-cpu", [*base, "parallel.fsdp=true", "checkpoint.format=full"])
    with pytest.raises(ValueError, match=r"checkpoint.async_save needs checkpoint.format=sharded"):
        TrainConfig.load("tiny-cpu", [*base, "checkpoint.async_save=true"])  # auto without FSDP is full
    TrainConfig.load("tiny-cpu", [*base, "checkpoint.async_save=true", "parallel.fsdp=true"])
    TrainConfig.load("tiny-cpu", [*base, "checkpoint.async_save=true", "checkpoint.format=sharded"])


def test_a_background_save_holds_the_weights_of_when_it_was_called(tmp_path):
    from cookmind.train.sharded_checkpoint import ShardedCheckpointer

    torch.manual_seed(0)
    model = tiny_lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saver = ShardedCheckpointer(async_save=True)
    saver.save(tmp_path / "step_00000001", model, None, {"step": 1})
    assert not (tmp_path / "step_00000001").exists()  # appears only once complete
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # training goes on while the save runs
    assert saver.wait() == tmp_path / "step_00000001"
    saved = load_model(tmp_path / "step_00000001").state_dict()
    _assert_same(saved, {k: v for k, v in before.items() if k in saved})


class _Payload:
    """Unpickling this calls os.mkdir(marker): code execution, if the loader allowed arbitrary objects."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _record_hashes(step_dir: Path) -> None:
    """meta.json's sha256 rewritten for the dcp/ files as they are now."""
    import hashlib

    meta = json.loads((step_dir / "meta.json").read_text())
    for f in (step_dir / "dcp").iterdir():
        meta["sha256"][f"dcp/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    (step_dir / "meta.json").write_text(json.dumps(meta))


def test_a_hostile_non_tensor_entry_is_refused_without_running(tmp_path):
    import torch.distributed.checkpoint as dcp

    from cookmind.optim import AdamW
    from cookmind.train.sharded_checkpoint import ShardedCheckpointer, _state

    model = tiny_lm()
    opt = AdamW(model.parameters(), lr=1e-2)
    step = ShardedCheckpointer().save(tmp_path / "step_00000001", model, opt, {"step": 1})
    state = _state(model, opt)
    marker = tmp_path / "pwned"
    state["optim"]["param_groups"][0]["lr"] = _Payload(marker)  # DCP stores non-tensor entries as pickled bytes
    dcp.save(state, checkpoint_id=str(step / "dcp"), no_dist=True)
    _record_hashes(step)  # as an attacker who can plant a shard can: the checksum is no signature
    with pytest.raises(ShardedCheckpointError, match="refused to load"):
        load_checkpoint(step, model, opt)
    assert not marker.exists()


def test_another_optimizer_gets_one_line_naming_the_missing_state(tmp_path):
    from cookmind.optim import AdamW
    from cookmind.train.sharded_checkpoint import ShardedCheckpointer

    model = tiny_lm()
    step = ShardedCheckpointer().save(tmp_path / "step_00000001", model, AdamW(model.parameters()), {"step": 1})
    with pytest.raises(ShardedCheckpointError) as info:  # torch's AdamW has settings ours does not (amsgrad, ...)
        load_checkpoint(step, model, torch.optim.AdamW(model.parameters()))
    message = str(info.value)
    assert "\n" not in message and str(step / "dcp") in message and "Missing key in checkpoint state_dict" in message
    assert message.endswith("resume with the same model, optimizer and LoRA settings")


def test_a_full_disk_during_a_sharded_save_is_one_line(tmp_path, store, monkeypatch):
    import errno

    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    from cookmind.atomic import DiskFullError

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(FileSystemWriter, "write_data", full)
    with pytest.raises(DiskFullError, match="no space left on device while writing .*step_00000001; free some"):
        _train(store, tmp_path / "r", "train.max_steps=1", "checkpoint.format=sharded")
    assert os.listdir(tmp_path / "r" / "checkpoints") == []


# -- through the Trainer with parallel.fsdp=true (FSDP2 on two gloo ranks) ---------------------------------------


def test_fsdp_run_saves_sharded_resumes_exactly_and_reshards_to_one_process(tmp_path, store):
    """checkpoint.format=auto is sharded under FSDP; a resumed FSDP run ends with the uninterrupted FSDP run's
    weights bit for bit (same world size, same reduction order); one process resumes the two ranks' checkpoint and
    ends where one process would (float rounding only: another world size sums gradients in another order)."""
    import shutil

    fsdp = ["parallel.fsdp=true", "checkpoint.every=2"]
    _torchrun(tmp_path, store, tmp_path / "ref2", "train.max_steps=4", *fsdp)
    _torchrun(tmp_path, store, tmp_path / "cut2", "train.max_steps=2", *fsdp)
    step2 = tmp_path / "cut2" / "checkpoints" / "step_00000002"
    assert is_sharded_checkpoint(step2) and json.loads((step2 / "meta.json").read_text())["world_size"] == 2
    shutil.copytree(tmp_path / "cut2", tmp_path / "cut1")  # the same checkpoint, resumed by one plain process
    _torchrun(tmp_path, store, tmp_path / "cut2", "train.max_steps=4", *fsdp, "checkpoint.resume=auto")
    _assert_same(_weights(tmp_path / "ref2", 4), _weights(tmp_path / "cut2", 4))
    _train(store, tmp_path / "ref1", "train.max_steps=4", "checkpoint.format=full")
    _train(store, tmp_path / "cut1", "train.max_steps=4", "checkpoint.resume=auto", "checkpoint.format=sharded")
    _assert_same(_weights(tmp_path / "ref1", 4), _weights(tmp_path / "cut1", 4), exact=False)
    # it did resume the two ranks' run (a fresh start would also land near ref1): the run id carried over
    meta = {
        s: json.loads((tmp_path / "cut1/checkpoints" / f"step_0000000{s}" / "meta.json").read_text()) for s in (2, 4)
    }
    assert meta[4]["run_id"] == meta[2]["run_id"] and (meta[2]["world_size"], meta[4]["world_size"]) == (2, 1)


def test_a_full_format_checkpoint_resumes_under_fsdp_on_two_ranks_and_in_one_process(tmp_path, store):
    """A run that outgrows one process: its full-format checkpoint (safetensors + optimizer.pt) resumes with
    parallel.fsdp=true, weights and AdamW moments sharded from the whole tensors every rank reads, and ends where
    the uninterrupted run ends (float rounding only: FSDP sums gradients in another order). It was refused."""
    import shutil

    _train(store, tmp_path / "ref", "train.max_steps=4", "checkpoint.format=full")
    _train(store, tmp_path / "cut", "train.max_steps=2", "checkpoint.format=full", "checkpoint.every=2")
    step2 = tmp_path / "cut" / "checkpoints" / "step_00000002"
    assert (step2 / "model.safetensors").is_file() and (step2 / "optimizer.pt").is_file()
    shutil.copytree(tmp_path / "cut", tmp_path / "cut1")
    fsdp = ["parallel.fsdp=true", "checkpoint.format=auto", "checkpoint.resume=auto"]
    _torchrun(tmp_path, store, tmp_path / "cut", "train.max_steps=4", *fsdp)
    step4 = tmp_path / "cut" / "checkpoints" / "step_00000004"
    assert is_sharded_checkpoint(step4) and json.loads((step4 / "meta.json").read_text())["world_size"] == 2
    _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / "cut", 4), exact=False)
    _train(store, tmp_path / "cut1", "train.max_steps=4", *fsdp)  # FSDP2 in one process: a one-rank group
    _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / "cut1", 4), exact=False)
    # the moments came back too: a fresh optimizer (the state ignored) ends elsewhere after two Adam steps
    _train(store, tmp_path / "fresh", "train.max_steps=2", "checkpoint.format=full", "checkpoint.every=2")
    init = f"train.init_from={tmp_path / 'fresh' / 'checkpoints' / 'step_00000002'}"
    _train(store, tmp_path / "restart", "train.max_steps=2", init, "parallel.fsdp=true")
    with pytest.raises(AssertionError):
        _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / "restart", 2), exact=False)


def test_a_full_format_lora_checkpoint_resumes_under_fsdp_on_two_ranks_and_in_one_process(tmp_path, store):
    """A LoRA run's full-format checkpoint (adapter_model.safetensors, PEFT-named, + optimizer.pt, whose AdamW holds
    the adapter only, numbered) resumes with parallel.fsdp=true: every rank reads the whole adapter and moments and
    keeps its shard, the frozen base rebuilt from train.init_from. The adapter then ends where the uninterrupted
    run's does (within atol 1e-5, rtol 1e-4: FSDP sums gradients in another order). It was refused."""
    import shutil

    from cookmind.model import save_model
    from cookmind.model.lora import read_adapter_tensors
    from cookmind.model.sharded_io import read_sharded_weights

    torch.manual_seed(5)
    save_model(tmp_path / "init", tiny_lm())
    lora = [f"train.init_from={tmp_path / 'init'}", "lora.enabled=true", "lora.r=4", "lora.alpha=8"]
    _train(store, tmp_path / "ref", "train.max_steps=4", "checkpoint.format=full", *lora)
    _train(store, tmp_path / "cut", "train.max_steps=2", "checkpoint.format=full", "checkpoint.every=2", *lora)
    step2 = tmp_path / "cut" / "checkpoints" / "step_00000002"
    assert (step2 / "adapter_model.safetensors").is_file() and (step2 / "optimizer.pt").is_file()
    shutil.copytree(tmp_path / "cut", tmp_path / "cut1")
    fsdp = ["parallel.fsdp=true", "checkpoint.format=auto", "checkpoint.resume=auto"]
    _torchrun(tmp_path, store, tmp_path / "cut", "train.max_steps=4", *fsdp, *lora)
    _train(store, tmp_path / "cut1", "train.max_steps=4", *fsdp, *lora)  # FSDP2 in one process: a one-rank group
    want = read_adapter_tensors(tmp_path / "ref" / "checkpoints" / "step_00000004")
    assert want and all(".lora_" in k for k in want)
    for run in ("cut", "cut1"):
        step4 = tmp_path / run / "checkpoints" / "step_00000004"
        assert is_sharded_checkpoint(step4)  # the sharded adapter, named as in the model
        _assert_same(want, read_sharded_weights(step4), exact=False)
        _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / run, 4), exact=False)
    # the adapter moved from step 2 to 4 by more than the tolerance: the comparison above sees a lost step or moment
    before = read_adapter_tensors(step2)
    assert any((before[k] - v).abs().max() > 1e-3 for k, v in want.items())


def test_a_full_format_checkpoint_resumes_under_fsdp_with_activation_checkpointing(tmp_path, store):
    """The optimizer's numbered parameters were named through named_parameters(), whose names carry the checkpoint
    wrapper's ``_checkpoint_wrapped_module.``; DCP names them without it, so a run with
    train.activation_checkpointing=true found no AdamW state for any block parameter and the resume failed."""
    ac = "train.activation_checkpointing=true"
    _train(store, tmp_path / "ref", "train.max_steps=4", "checkpoint.format=full", ac)
    _train(store, tmp_path / "cut", "train.max_steps=2", "checkpoint.format=full", "checkpoint.every=2", ac)
    fsdp = ["parallel.fsdp=true", "checkpoint.format=auto", "checkpoint.resume=auto"]
    _train(store, tmp_path / "cut", "train.max_steps=4", *fsdp, ac)  # FSDP2 in one process: a one-rank group
    _assert_same(_weights(tmp_path / "ref", 4), _weights(tmp_path / "cut", 4), exact=False)


def test_a_file_the_user_put_in_dcp_stops_overwrite_from_deleting_the_checkpoint(tmp_path, store):
    """written_files/foreign_files looked only at a checkpoint's top level, so a file the user put in a sharded
    checkpoint's dcp/ went with it on --overwrite (and pruning). Now the save records the files inside dcp/ too,
    and anything else in there refuses the deletion in the usual one line."""
    from cookmind.train.checkpoint import check_run_dir

    run = tmp_path / "run"
    _train(store, run, "train.max_steps=1", "checkpoint.format=sharded")
    step = run / "checkpoints" / "step_00000001"
    listing = sorted(  # the record against an independent walk of the folder as written
        str(Path(root, f).relative_to(step)) for root, dirs, files in os.walk(step) for f in [*dirs, *files]
    )
    assert any(p.startswith("dcp/") for p in listing)
    assert json.loads((step / "meta.json").read_text())["files"] == listing
    (step / "dcp" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError) as exc:
        check_run_dir(run / "checkpoints", run, None, overwrite=True)
    assert str(exc.value) == (
        f"{step} holds dcp/notes.txt, which no checkpoint save wrote: --overwrite deletes a run's checkpoints, never "
        "other files; move them out, then run again"
    )
    assert (step / "dcp" / "notes.txt").read_text() == "mine"
    # a checkpoint saved before meta.json recorded dcp/'s files: DCP's own files there are still the save's
    meta = json.loads((step / "meta.json").read_text())
    (step / "meta.json").write_text(json.dumps({**meta, "files": sorted(os.listdir(step))}))
    with pytest.raises(FileExistsError, match="holds dcp/notes.txt, which no checkpoint save wrote"):
        check_run_dir(run / "checkpoints", run, None, overwrite=True)
    (step / "dcp" / "notes.txt").unlink()
    check_run_dir(run / "checkpoints", run, None, overwrite=True)  # only the save's files: deleted
    assert not step.exists()


def test_a_tokenizer_folder_that_is_a_model_lends_only_its_tokenizer_files(tmp_path):
    # `--tokenizer` often names the model the run starts from (an imported Hugging Face folder holds its tokenizer):
    # its model.safetensors beside a sharded checkpoint's dcp/ was read by export/generate instead of the trained dcp/
    from cookmind.model import save_model
    from cookmind.model.model_io import read_model_weights
    from cookmind.train.sharded_checkpoint import ShardedCheckpointer

    torch.manual_seed(0)
    base, trained = tiny_lm(), tiny_lm()
    save_model(tmp_path / "imported", base)
    for name in ("tokenizer.json", "tokenizer_config.json", "optimizer.pt", "adapter_config.json"):
        (tmp_path / "imported" / name).write_text("{}")
    step = ShardedCheckpointer().save(
        tmp_path / "step_00000001", trained, None, {"step": 1, "run_id": "r"}, tokenizer_dir=tmp_path / "imported"
    )
    assert sorted(p.name for p in step.iterdir()) == [
        "config.json",
        "dcp",
        "meta.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    _, weights = read_model_weights(step, trained.config)
    _assert_same(weights, {k: v for k, v in trained.state_dict().items() if k != "lm_head.weight"})


def test_a_sharded_lora_run_on_a_hugging_face_model_reads_as_the_full_formats_does(tmp_path, store):
    # --init-from takes a Hugging Face folder, but a sharded LoRA checkpoint's adapter was merged onto its base by
    # load_model, which read the folder's config.json as ours: "CookMindConfig: unknown keys ['architectures', ...]"
    from cookmind.model import save_model
    from cookmind.model.hf import export_hf

    torch.manual_seed(5)
    save_model(tmp_path / "init", tiny_lm())
    export_hf(tmp_path / "init", tmp_path / "init_hf")
    lora = [f"train.init_from={tmp_path / 'init_hf'}", "lora.enabled=true", "lora.r=4", "lora.alpha=8"]
    _train(store, tmp_path / "full", "train.max_steps=2", "checkpoint.format=full", *lora)
    _train(store, tmp_path / "sharded", "train.max_steps=2", "checkpoint.format=sharded", *lora)
    _assert_same(_weights(tmp_path / "full", 2), _weights(tmp_path / "sharded", 2))


def test_a_sharded_checkpoint_reads_its_dcp_weights_as_resume_does_whatever_lies_beside(tmp_path):
    # a checkpoint saved before 7438e49 with a model folder as --tokenizer holds that model's model.safetensors beside
    # dcp/: resume read dcp/, export --hf / generate / eval read the stray file (the run's starting weights)
    import shutil

    from cookmind.model import save_model
    from cookmind.model.model_io import read_model_weights
    from cookmind.train.sharded_checkpoint import ShardedCheckpointer

    torch.manual_seed(0)
    base, trained = tiny_lm(), tiny_lm()
    step = ShardedCheckpointer().save(tmp_path / "step_00000001", trained, None, {"step": 1, "run_id": "r"})
    save_model(tmp_path / "base", base)
    shutil.copy2(tmp_path / "base" / "model.safetensors", step / "model.safetensors")
    _, weights = read_model_weights(step, trained.config)
    _assert_same(weights, {k: v for k, v in trained.state_dict().items() if k != "lm_head.weight"})


def test_a_sharded_lora_run_is_merged_onto_the_base_checkpoint_it_trained_on_not_a_newer_one(tmp_path, store):
    """A sharded LoRA checkpoint holds the adapter only; export/eval merged it onto train.init_from's newest
    checkpoint as it is now: after the base run trained on, onto weights the adapter never saw, without a word."""
    from cookmind.model import save_model

    torch.manual_seed(5)
    old, new = tiny_lm(), tiny_lm()  # the base run's checkpoint the adapter trained on, and a later one
    save_model(tmp_path / "base" / "checkpoints" / "step_00000010", old)
    lora = [f"train.init_from={tmp_path / 'base'}", "lora.enabled=true", "lora.r=4", "lora.alpha=8"]
    _train(store, tmp_path / "full", "train.max_steps=2", "checkpoint.format=full", *lora)  # the merged reference
    _train(store, tmp_path / "cut", "train.max_steps=2", "checkpoint.format=sharded", *lora)
    save_model(tmp_path / "base" / "checkpoints" / "step_00000020", new)  # the base run went on
    with pytest.warns(UserWarning, match="step_00000010"):  # it says which base it merged onto
        _assert_same(_weights(tmp_path / "full", 2), _weights(tmp_path / "cut", 2), exact=False)
    import shutil

    shutil.rmtree(tmp_path / "base" / "checkpoints" / "step_00000010")  # pruned: no base it trained on is left
    with pytest.raises(ValueError, match="trained on other base weights"):
        _weights(tmp_path / "cut", 2)


def test_resuming_a_sharded_lora_run_whose_base_run_trained_on_refuses_naming_the_base_it_trained_on(tmp_path, store):
    """The resume rebuilt the frozen base from train.init_from's newest checkpoint: once the base run had saved
    on, the adapter went on training over other weights than it started on, without a word. It is refused now,
    naming the base checkpoint that holds the weights the run trained on; with that as train.init_from it resumes."""
    from cookmind.model import save_model

    torch.manual_seed(5)
    save_model(tmp_path / "base" / "checkpoints" / "step_00000010", tiny_lm())
    lora = [f"train.init_from={tmp_path / 'base'}", "lora.enabled=true", "lora.r=4", "lora.alpha=8"]
    _train(store, tmp_path / "run", "train.max_steps=2", "checkpoint.format=sharded", *lora)
    save_model(tmp_path / "base" / "checkpoints" / "step_00000020", tiny_lm())  # the base run went on
    more = ["train.max_steps=3", "checkpoint.format=sharded", "checkpoint.resume=auto"]
    with pytest.raises(ValueError, match="trained on other base weights") as refused:
        _train(store, tmp_path / "run", *more, *lora)
    said = str(refused.value)
    base = tmp_path / "base" / "checkpoints" / "step_00000010"
    assert "\n" not in said and f"resume with --init-from {base} (train.init_from), the base" in said
    assert not (tmp_path / "run" / "checkpoints" / "step_00000003").exists()
    lora[0] = f"train.init_from={tmp_path / 'base' / 'checkpoints' / 'step_00000010'}"  # what the error says
    assert _train(store, tmp_path / "run", *more, *lora)["steps"] == 3


def test_resuming_a_sharded_lora_run_over_a_model_the_caller_built_from_other_weights_is_refused(tmp_path, store):
    from cookmind.model import save_model

    torch.manual_seed(5)
    save_model(tmp_path / "base", tiny_lm())
    lora = ["lora.enabled=true", "lora.r=4", "lora.alpha=8", "checkpoint.format=sharded"]
    _train(store, tmp_path / "run", "train.max_steps=2", f"train.init_from={tmp_path / 'base'}", *lora)
    more = _overrides(store, tmp_path / "run", "train.micro_batch_size=4", "train.max_steps=3", *lora)
    cfg = TrainConfig.load("tiny-cpu", [*more, "checkpoint.resume=auto"])
    with pytest.raises(ValueError, match="trained on other base weights than the model given holds"):
        Trainer(cfg, model=tiny_lm())  # the same shapes, other weights


def test_serving_a_sharded_lora_run_on_another_base_warns_as_the_full_formats_does(tmp_path, store):
    from cookmind.infer.loading import load_adapters
    from cookmind.model import save_model

    torch.manual_seed(5)
    save_model(tmp_path / "init", tiny_lm())
    lora = [f"train.init_from={tmp_path / 'init'}", "lora.enabled=true", "lora.r=4", "lora.alpha=8"]
    _train(store, tmp_path / "sharded", "train.max_steps=2", "checkpoint.format=sharded", *lora)
    other = tiny_lm()  # the same shapes, other weights
    with pytest.warns(UserWarning, match="was trained on"):  # a full-format adapter warned; the sharded one did not
        load_adapters(other, {"sharded": tmp_path / "sharded"}, base_name="other")


def test_reading_a_sharded_checkpoint_prints_no_torch_single_process_warning(tmp_path, store):
    # `cookmind eval ppl --model RUN` first imported the sharded reader inside a catch_warnings block (its LoRA-base
    # look-up), which dropped the reader's filter on the way out: torch's "torch.distributed is disabled, ...,
    # assuming the intent is to load in a single process" UserWarning was printed above the perplexity
    import subprocess
    import sys

    _train(store, tmp_path / "sharded", "train.max_steps=1", "checkpoint.format=sharded")
    step = tmp_path / "sharded" / "checkpoints" / "step_00000001"
    code = (
        "import sys, warnings\n"
        "with warnings.catch_warnings():\n"
        "    import cookmind.model.sharded_io as io\n"
        "print(len(io.read_sharded_weights(sys.argv[1])))\n"
    )
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code, str(step)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(_weights(tmp_path / "sharded", 1))
    assert "Warning" not in done.stderr, done.stderr
