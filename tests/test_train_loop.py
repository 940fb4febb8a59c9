"""The loop's mechanics: accumulation, non-finite skips, SIGTERM checkpoints, activation checkpointing, outputs."""

import json
import os
import shutil
import signal
import warnings

import numpy as np
import pytest
import torch
from lm_fixtures import TINY, tiny_lm

from cookmind.store import write_store
from cookmind.train import Callback, PretrainObjective, TrainConfig, Trainer, TrainingDiverged
from cookmind.train.checkpoint import find_latest_checkpoint, list_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread", "keep_threads")  # each test starts on one thread


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, size=80)} for _ in range(8)], vocab_size=64)
    return tmp_path / "seq"


def _cfg(tmp_path, store, name, **sections):
    d = {
        "model": dict(TINY),
        "data": {"train_path": str(store), "window_size": 16},
        "train": {"max_steps": 4, "micro_batch_size": 4, "seed": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 1},
        "logging": {"run_dir": str(tmp_path / name), "progress": False, "log_every": 1},
    }
    for k, v in sections.items():
        d.setdefault(k, {}).update(v)
    return TrainConfig.from_dict(d)


def _weights(trainer):
    return {k: v.clone() for k, v in trainer.bare_model.state_dict().items()}


def test_gradient_accumulation_equals_one_big_batch(tmp_path, store):
    a = Trainer(_cfg(tmp_path, store, "a", train={"micro_batch_size": 8, "grad_accum_steps": 1}))
    a.fit()
    b = Trainer(_cfg(tmp_path, store, "b", train={"micro_batch_size": 2, "grad_accum_steps": 4}))
    b.fit()
    wa, wb = _weights(a), _weights(b)
    # Equal up to summation order: the gradients differ by ~1e-9, which AdamW (lr 1e-2, dividing by sqrt(v))
    # can turn into ~2e-5 on near-zero components after 4 steps; a wrong micro-batch moves them by ~lr per step.
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-4), (k, (wa[k] - wb[k]).abs().max().item())


def test_activation_checkpointing_gives_the_same_training(tmp_path, store):
    a = Trainer(_cfg(tmp_path, store, "a"))
    a.fit()
    b = Trainer(_cfg(tmp_path, store, "b", train={"activation_checkpointing": True}))
    b.fit()
    wa, wb = _weights(a), _weights(b)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k


class NaNAt(PretrainObjective):
    """A loss that turns NaN on chosen (1-based) steps."""

    def __init__(self, bad_steps):
        self.bad_steps, self.calls = set(bad_steps), 0

    def __call__(self, model, batch):
        self.calls += 1
        loss, m = super().__call__(model, batch)
        return (loss * float("nan"), m) if self.calls in self.bad_steps else (loss, m)


@pytest.mark.parametrize("on_device", [False, True])
def test_non_finite_step_is_skipped_and_counted(tmp_path, store, on_device):
    t = Trainer(_cfg(tmp_path, store, "nan"), objective=NaNAt({2}))
    if on_device:  # the GPU path: fused AdamW reads the skip flag itself, no host decision (runs on CPU too)
        for g in t.optimizer.param_groups:
            g["fused"] = True
        t._skip_on_device = True
    before = {}

    class Snap(Callback):
        def on_step_end(self, trainer, step, metrics):
            before[step] = _weights(trainer)

    t.callbacks.append(Snap())
    summary = t.fit()
    assert summary["skipped_steps"] == 1 and summary["steps"] == 4
    for k in before[1]:  # step 2 changed nothing
        assert torch.equal(before[1][k], before[2][k])
    assert any(not torch.equal(before[2][k], before[3][k]) for k in before[2])
    assert all(torch.isfinite(v).all() for v in _weights(t).values())


def test_too_many_bad_steps_stop_with_a_checkpoint_marked_diverged(tmp_path, store):
    t = Trainer(
        _cfg(tmp_path, store, "div", train={"max_bad_steps": 2, "max_steps": 10}), objective=NaNAt(range(1, 100))
    )
    with pytest.raises(TrainingDiverged, match="consecutive steps had a non-finite or exploding loss"):
        t.fit()
    [saved] = list_checkpoints(tmp_path / "div" / "checkpoints")
    assert saved.name == "step_00000003" and json.loads((saved / "meta.json").read_text())["diverged"] is True
    with pytest.warns(UserWarning, match="diverged run"):
        assert find_latest_checkpoint(tmp_path / "div" / "checkpoints") is None


class ExplodeFrom(PretrainObjective):
    """A finite loss multiplied by 100 from step ``start`` (1-based) on: an exploding run."""

    def __init__(self, start):
        self.start, self.calls = start, 0

    def __call__(self, model, batch):
        self.calls += 1
        loss, m = super().__call__(model, batch)
        return (loss * 100.0 if self.calls >= self.start else loss), m


def test_an_exploding_loss_stops_the_run_and_keeps_the_good_checkpoints(tmp_path, store):
    cfg = _cfg(
        tmp_path, store, "boom", train={"max_steps": 40, "max_bad_steps": 3}, checkpoint={"every": 5, "keep_last": 1}
    )
    t = Trainer(cfg, objective=ExplodeFrom(21))
    with pytest.raises(TrainingDiverged, match="exploding"):
        t.fit()
    assert t.step == 24  # steps 21..24 exploded: the 4th bad step is past max_bad_steps=3
    names = [p.name for p in list_checkpoints(tmp_path / "boom" / "checkpoints")]
    assert names == ["step_00000020", "step_00000024"]  # step 20 (good) was not pruned for the bad one
    assert find_latest_checkpoint(tmp_path / "boom" / "checkpoints").name == "step_00000020"


def test_a_fresh_run_refuses_a_used_run_dir_and_never_prunes_another_runs_checkpoints(tmp_path, store):
    first = Trainer(_cfg(tmp_path, store, "run", train={"max_steps": 6}, checkpoint={"every": 2, "keep_last": 2}))
    first.fit()
    ckpts = tmp_path / "run" / "checkpoints"
    assert [p.name for p in list_checkpoints(ckpts)] == ["step_00000004", "step_00000006"]
    with pytest.raises(FileExistsError, match="already holds another run.*--resume auto"):
        Trainer(_cfg(tmp_path, store, "run", train={"max_steps": 2}, checkpoint={"every": 1, "keep_last": 1}))
    assert [p.name for p in list_checkpoints(ckpts)] == ["step_00000004", "step_00000006"]
    # resuming continues the same run and prunes its own
    resumed = Trainer(
        _cfg(tmp_path, store, "run", train={"max_steps": 8}, checkpoint={"every": 2, "keep_last": 2, "resume": "auto"})
    )
    resumed.fit()
    assert [p.name for p in list_checkpoints(ckpts)] == ["step_00000006", "step_00000008"]
    # a checkpoint of another run in the directory (copied in by hand) is never pruned
    other = ckpts / "step_00000001"
    shutil.copytree(ckpts / "step_00000006", other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "run_id": "someone-else", "step": 1}))
    Trainer(
        _cfg(tmp_path, store, "run", train={"max_steps": 12}, checkpoint={"every": 2, "keep_last": 1, "resume": "auto"})
    ).fit()
    assert [p.name for p in list_checkpoints(ckpts)] == ["step_00000001", "step_00000012"]
    # an explicit overwrite deletes the old run and starts afresh
    Trainer(_cfg(tmp_path, store, "run", train={"max_steps": 2}, checkpoint={"overwrite": True})).fit()
    assert [p.name for p in list_checkpoints(ckpts)] == ["step_00000002"]


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, store):
    Trainer(_cfg(tmp_path, store, "c", train={"max_steps": 4}, checkpoint={"every": 2, "keep_last": 0})).fit()
    ckpts = tmp_path / "c" / "checkpoints"
    opt = ckpts / "step_00000004" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[: opt.stat().st_size // 2])  # a kill mid-write of an older version
    with pytest.warns(UserWarning, match="step_00000004.*optimizer.pt is missing or truncated"):
        t = Trainer(_cfg(tmp_path, store, "c", train={"max_steps": 6}, checkpoint={"resume": "auto"}))
    assert t.step == 2
    from cookmind.model import resolve_model_dir

    assert resolve_model_dir(tmp_path / "c").name == "step_00000004"  # loading weights needs no optimizer
    w = ckpts / "step_00000004" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-10])
    with pytest.warns(UserWarning, match="step_00000004.*model.safetensors is truncated"):
        assert resolve_model_dir(tmp_path / "c").name == "step_00000002"


def test_stale_temporary_checkpoints_of_a_dead_run_are_removed(tmp_path, store):
    import subprocess
    import sys

    from cookmind.atomic import temp_name

    dead = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        ).stdout
    )
    ckpts = tmp_path / "s" / "checkpoints"
    ckpts.mkdir(parents=True)
    host = temp_name(ckpts / "x").name.split("@", 1)[1]
    stale = ckpts / f".step_00000002.tmp-{dead}@{host}"
    stale.mkdir()
    (stale / "optimizer.pt").write_bytes(b"0" * 1000)
    Trainer(_cfg(tmp_path, store, "s", train={"max_steps": 1}, checkpoint={"resume": "auto"})).fit()
    assert not stale.exists() and [p.name for p in ckpts.iterdir()] == ["step_00000001"]


def test_a_full_disk_while_saving_is_one_line_and_leaves_no_temporary(tmp_path, store, monkeypatch):
    import errno

    t = Trainer(_cfg(tmp_path, store, "full", train={"max_steps": 1}))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="no space left on device while writing .*step_00000001"):
        t.fit()
    assert list((tmp_path / "full" / "checkpoints").iterdir()) == []


def test_config_numbers_are_validated_at_load():
    for override, field in (
        ("optim.lr=nan", "optim.lr"),
        ("optim.lr=inf", "optim.lr"),
        ("optim.lr=-1", "optim.lr"),
        ("train.max_steps=-5", "train.max_steps"),
        ("optim.warmup_steps=-1", "optim.warmup_steps"),
        ("optim.grad_clip=.nan", "optim.grad_clip"),
        ("optim.beta2=1.5", "optim.beta2"),
        ("checkpoint.keep_last=-1", "checkpoint.keep_last"),
        ("data.window_size=512", "data.window_size"),
    ):  # tiny-cpu's context is 256
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            TrainConfig.load("tiny-cpu", [override])


def test_sigterm_saves_a_checkpoint_of_the_step_it_names(tmp_path, store):
    class Kill(Callback):
        def on_step_end(self, trainer, step, metrics):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    t = Trainer(_cfg(tmp_path, store, "sig", train={"max_steps": 10}), callbacks=[Kill()])
    summary = t.fit()
    assert summary["status"] == "stopped" and summary["steps"] == 2
    ckpt = find_latest_checkpoint(tmp_path / "sig" / "checkpoints")
    meta = json.loads((ckpt / "meta.json").read_text())
    assert ckpt.name == "step_00000002" and meta["step"] == 2 and meta["sampler"]["consumed"] == 2 * 4
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_val_loss_is_the_mean_over_the_sets_tokens_not_over_batches(tmp_path, store):
    """Five validation windows in batches of 2, 2 and 1: the loss was the mean of the three batch means, so the last
    window weighed twice the others. Reference: each window's summed token NLL by torch's cross_entropy, over the
    set's target tokens."""
    import torch.nn.functional as F

    rng = np.random.default_rng(1)
    val = write_store(tmp_path / "valstore", "seq", [{"sequence": rng.integers(1, 64, size=81)}], vocab_size=64)
    cfg = _cfg(tmp_path, store, "val", data={"val_path": str(val)}, train={"micro_batch_size": 2})
    t = Trainer(cfg)
    batches = list(t.val_loader.loader)
    sizes = [len(b["input_ids"]) for b in batches]
    assert sizes == [2, 2, 1]
    got = t.evaluate(0)["val_loss"]
    model = t.bare_model.eval()
    nll, targets = 0.0, 0
    with torch.no_grad():
        for b in batches:
            logits = model(b["input_ids"]).logits[:, :-1].float()
            labels = b["labels"][:, 1:]
            nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum").item()
            targets += int((labels != -100).sum())
    assert got == pytest.approx(nll / targets, rel=1e-5)
    per_batch = [
        F.cross_entropy(model(b["input_ids"]).logits[:, :-1].float().flatten(0, 1), b["labels"][:, 1:].flatten())
        for b in batches
    ]
    # the old figure, the mean of the batch means, is another number here
    assert got != pytest.approx(sum(x.item() for x in per_batch) / len(per_batch), rel=1e-6)


def test_run_outputs_metrics_eval_report_and_config(tmp_path, store):
    t = Trainer(
        _cfg(tmp_path, store, "out", data={"val_path": str(store)}, eval={"every": 2}, optim={"grad_clip": 0.5})
    )
    summary = t.fit()
    run = tmp_path / "out"
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["split"] == "train"]
    val = [r for r in recs if r["split"] == "val"]
    assert [r["step"] for r in train] == [1, 2, 3, 4] and [r["step"] for r in val] == [2, 4]
    assert all(r["grad_norm"] > 0 for r in train)
    assert val[-1]["val_ppl"] == pytest.approx(np.exp(val[-1]["val_loss"]), rel=1e-4)
    assert summary["val_loss"] == pytest.approx(val[-1]["val_loss"], rel=1e-4)
    # lr follows warmup + cosine: step 0 -> lr (1 warmup step), last -> towards min_lr
    assert train[0]["lr"] == pytest.approx(1e-2) and train[-1]["lr"] < train[1]["lr"]
    for f in ("report.md", "loss.png", "lr.png", "config.yaml"):
        assert (run / f).is_file(), f
    assert TrainConfig.load(str(run / "config.yaml")).to_dict() == t.cfg.to_dict()


def test_bf16_autocast_on_cpu_trains(tmp_path, store):
    t = Trainer(_cfg(tmp_path, store, "bf16", train={"precision": "bf16", "max_steps": 3}))
    summary = t.fit()
    assert summary["skipped_steps"] == 0
    assert all(v.dtype == torch.float32 for v in t.bare_model.state_dict().values())  # fp32 master weights


def test_cli_print_config_and_errors(capsys):
    from cookmind.cli import main

    assert main(["train", "--config", "tiny-cpu", "--print-config", "optim.lr=0.5", "--objective", "sft"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.5" in out and "objective: sft" in out
    assert main(["train", "--config", "tiny-cpu", "optim.learning_rate=1"]) == 2
    assert "unknown key" in capsys.readouterr().err


def test_tensorboard_option_is_clear_when_the_package_is_missing(tmp_path, store):
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install tensorboard"):
            Trainer(_cfg(tmp_path, store, "tb", logging={"tensorboard": True}))
        return
    Trainer(_cfg(tmp_path, store, "tb", logging={"tensorboard": True}, train={"max_steps": 2})).fit()
    assert any((tmp_path / "tb" / "tensorboard").iterdir())


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_cuda_learns_with_fp32_master_weights(tmp_path, store, precision):
    t = Trainer(
        _cfg(
            tmp_path,
            store,
            precision,
            train={"precision": precision, "device": "cuda", "max_steps": 30},
            optim={"lr": 3e-3, "warmup_steps": 2},
            data={"val_path": str(store)},
        )
    )
    first = None

    class First(Callback):
        def on_step_end(self, trainer, step, metrics):
            nonlocal first
            first = metrics["loss"] if first is None else first

    t.callbacks.append(First())
    summary = t.fit()
    assert summary["val_loss"] < first - 0.1
    assert all(p.dtype == torch.float32 for p in t.bare_model.parameters())
    meta = json.loads((find_latest_checkpoint(tmp_path / precision / "checkpoints") / "meta.json").read_text())
    assert "cuda" in meta["rng"]


def test_fp16_uses_a_loss_scaler_whose_state_is_checkpointed(tmp_path, store):
    t = Trainer(_cfg(tmp_path, store, "fp16", train={"precision": "fp16", "max_steps": 3}))
    t.fit()
    assert t.scaler is not None and t.scaler.get_scale() > 1
    state = torch.load(find_latest_checkpoint(tmp_path / "fp16" / "checkpoints") / "optimizer.pt", weights_only=True)
    assert state["scaler"]["scale"] == t.scaler.get_scale()
    assert all(p.dtype == torch.float32 for p in t.bare_model.parameters())


def test_torch_adamw_fast_path_trains_the_same_as_ours(tmp_path, store):
    a = Trainer(_cfg(tmp_path, store, "ours", optim={"weight_decay": 0.1}))
    a.fit()
    b = Trainer(_cfg(tmp_path, store, "lib", optim={"weight_decay": 0.1, "impl": "torch"}))
    assert isinstance(b.optimizer, torch.optim.AdamW)
    b.fit()
    wa, wb = _weights(a), _weights(b)
    assert any(not torch.equal(wa[k], Trainer(_cfg(tmp_path, store, "x")).bare_model.state_dict()[k]) for k in wa)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k


def test_device_side_clipping_trains_like_the_host_side_clipping(tmp_path, store):
    """On the fused path the clip factor is divided out inside AdamW's kernel (grad_divisor); the weights must
    match the plain path, which clips the gradients in place first, with clipping active at every step."""
    runs = {}
    for on_device in (False, True):
        t = Trainer(_cfg(tmp_path, store, f"clip{on_device}", optim={"grad_clip": 0.05}))
        if on_device:
            for g in t.optimizer.param_groups:
                g["fused"] = True
            t._skip_on_device = True
        t.fit()
        runs[on_device] = t
    rows = [json.loads(x) for x in (tmp_path / "clipFalse" / "metrics.jsonl").read_text().splitlines()]
    norms = [r["grad_norm"] for r in rows if r.get("split") == "train"]
    assert len(norms) == 4 and min(norms) > 0.05  # the clip acted at every step
    wh, wd = _weights(runs[False]), _weights(runs[True])
    for k in wh:
        torch.testing.assert_close(wd[k], wh[k], rtol=1e-5, atol=1e-6, msg=k)


def test_init_from_a_bf16_model_trains_fp32_parameters(tmp_path, store, capsys):
    """A model stored in bf16 (Hugging Face folders usually are) loads bf16; without train.master_weights the
    Trainer trained those bf16 weights directly, where an update below 1/256 of a weight is lost. Its trained
    parameters are fp32 now, with a line saying so, and it trains as the same model stored in fp32 does."""
    from cookmind.model import save_model

    torch.manual_seed(0)
    model = tiny_lm().to(torch.bfloat16)
    save_model(tmp_path / "bf16", model)
    save_model(tmp_path / "fp32", model.float())  # the same (bf16-representable) values, stored in fp32
    runs = {}
    for name in ("bf16", "fp32"):
        cfg = _cfg(tmp_path, store, f"run-{name}", train={"init_from": str(tmp_path / name)})
        cfg.model = {}
        capsys.readouterr()
        runs[name] = Trainer(cfg)
        said = capsys.readouterr().err
        assert ("arrived as bfloat16 and train as float32" in said) == (name == "bf16"), said
        runs[name].fit()
    wa, wb = _weights(runs["bf16"]), _weights(runs["fp32"])
    for k in wa:
        assert wa[k].dtype == torch.float32 and torch.equal(wa[k], wb[k]), k


def test_init_from_takes_runtime_options_and_refuses_shape_changes(tmp_path, store):
    """A loaded model's weights fix its shape, but how it runs (attention kernel, FP8 head) may change."""
    from cookmind.model import save_model
    from cookmind.train.build import build_model

    save_model(tmp_path / "init", tiny_lm())
    cfg = _cfg(tmp_path, store, "r", train={"init_from": str(tmp_path / "init")})
    cfg.model = {"attn_backend": "naive", "lm_head_fp8": True, "hidden_size": TINY["hidden_size"]}
    model = build_model(cfg)
    assert model.config.attn_backend == "naive" and model.config.lm_head_fp8 is True
    assert all(layer.self_attn.backend == "naive" for layer in model.model.layers)
    cfg.model = {}
    cfg.update({"model": {"hidden_size": 64}})  # set by the user (their YAML or an override)
    named = r"differ from the model at --init-from \S+ \(train.init_from\).*only attn_backend, lm_head_fp8"
    with pytest.raises(ValueError, match=named):
        build_model(cfg)
    # a built-in preset's shape is not the user's: the CLI user cannot drop it, and the loaded model's stands
    preset = TrainConfig.load("tiny-cpu", [f"train.init_from={tmp_path / 'init'}", f"data.train_path={store}"])
    assert preset.model["hidden_size"] != TINY["hidden_size"]  # 64 against the loaded model's 32
    assert build_model(preset).config.hidden_size == TINY["hidden_size"]
    preset.set_dotted("model.hidden_size=64")  # the same value given by the user is refused
    with pytest.raises(ValueError, match=r"model settings \{'hidden_size': 64\} differ"):
        build_model(preset)
    cfg.model = {"attn_backend": "fastest"}
    with pytest.raises(ValueError, match="attn_backend='fastest': choose one of"):
        build_model(cfg)
    with pytest.raises(ValueError, match="not runtime options"):
        model.set_runtime_options(num_hidden_layers=3)


class FailAt(PretrainObjective):
    """Raises in its ``call``-th call (a user's bug, an OOM)."""

    def __init__(self, call):
        super().__init__()
        self.call, self.calls = call, 0

    def __call__(self, model, batch):
        self.calls += 1
        if self.calls == self.call:
            raise RuntimeError("the objective failed")
        return super().__call__(model, batch)


def test_a_failing_run_ends_its_progress_bar_before_the_error(tmp_path, store, capsys):
    """The error raised out of fit starts on a line of its own: the bar is closed first (it printed on the bar's
    line before), and callbacks hear of the error through on_train_error (no on_train_end)."""
    heard = []

    class Listener(Callback):
        def on_train_error(self, trainer, exc):
            heard.append(str(exc))

        def on_train_end(self, trainer, status):
            heard.append(status)

    cfg = _cfg(tmp_path, store, "fail", logging={"progress": True})
    t = Trainer(cfg, objective=FailAt(3), callbacks=[Listener()])
    with pytest.raises(RuntimeError, match="the objective failed"):
        t.fit()
    err = capsys.readouterr().err
    assert "2/4" in err and err.endswith("\n")  # the bar got to step 2 and ended its line
    assert heard == ["the objective failed"]


def test_a_model_built_for_a_llama_style_tokenizer_exports_its_bos_and_eos(tmp_path):
    """A model trained with a Llama-style tokenizer got no bos_token_id, so its export's config.json named none,
    though every packed document opens with <s>. The model takes its BOS and EOS from the tokenizer, as transformers
    reads them."""
    transformers = pytest.importorskip("transformers")
    from tokenizer_fixtures import llama_style_tokenizer

    from cookmind.model import save_model
    from cookmind.model.hf import export_hf
    from cookmind.tokenizer import Tokenizer
    from cookmind.train.build import build_model

    folder = llama_style_tokenizer(tmp_path / "llama")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    cfg = TrainConfig.load("tiny-cpu", [])
    save_model(tmp_path / "m", build_model(cfg, Tokenizer.load(folder)))
    export_hf(tmp_path / "m", tmp_path / "hf")
    config = transformers.AutoConfig.from_pretrained(str(tmp_path / "hf"))
    assert (config.bos_token_id, config.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)


def test_the_summary_gives_the_mean_training_loss_of_the_last_20_steps(tmp_path, store):
    # the summary line held the eval's figures only: a run without validation data ended saying nothing of its loss
    cfg = _cfg(tmp_path, store, "r", train={"max_steps": 25}, logging={"report": True})
    summary = Trainer(cfg).fit()
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r.get("split") == "train"]
    assert len(losses) == 25 and summary["train_means_over_steps"] == 20
    assert summary["train_loss"] == pytest.approx(sum(losses[-20:]) / 20, rel=1e-6)  # the log rounds
    assert summary["train_loss"] != pytest.approx(sum(losses) / 25, rel=1e-6)  # the last 20, not all
    assert [k for k in summary if k.startswith("train_")] == ["train_loss", "train_means_over_steps"]
    report = (tmp_path / "r" / "report.md").read_text()
    assert "| train_loss |" in report and "objective.png" not in report  # pretraining logs no metrics of its own


@pytest.mark.parametrize("accum", [1, 3])
def test_the_last_step_loads_no_batches_of_a_step_that_never_comes(tmp_path, store, accum):
    """The loop loads each step's micro-batches ahead while the step before computes; after the last step there is
    no next one, so exactly max_steps x grad_accum_steps micro-batches are drawn (a resume of a finished run: none)."""
    t = Trainer(_cfg(tmp_path, store, "a", train={"max_steps": 3, "grad_accum_steps": accum}))
    drawn = []
    next_batch = t._next_batch
    t._next_batch = lambda: drawn.append(1) or next_batch()
    t.fit()
    assert t.step == 3 and len(drawn) == 3 * accum
    t2 = Trainer(
        _cfg(tmp_path, store, "a", train={"max_steps": 3, "grad_accum_steps": accum}, checkpoint={"resume": "auto"})
    )
    drawn.clear()
    next_batch2 = t2._next_batch
    t2._next_batch = lambda: drawn.append(1) or next_batch2()
    t2.fit()
    assert t2.step == 3 and drawn == []


def test_the_report_shows_the_objectives_own_validation_metrics(tmp_path, monkeypatch):
    """A DPO run's report showed its validation as loss and a perplexity of None: the held-out reward accuracy and
    margin (GRPO's held-out accuracy) were in metrics.jsonl's val rows but nowhere in the report. The validation table
    has a column for each of them now, and objective.png plots each beside the training curve of its name."""
    from cookmind.train import report

    run = tmp_path / "dpo"
    run.mkdir()
    rows = [
        {"step": s, "split": "train", "loss": 0.7 - s / 100, "lr": 1e-3, "reward_accuracy": 0.5 + s / 100}
        for s in (1, 2, 3, 4)
    ]
    rows += [
        {"step": s, "split": "val", "val_loss": loss, "val_reward_accuracy": acc, "val_reward_margin": margin}
        for s, loss, acc, margin in ((2, 0.67, 0.64, 0.2), (4, 0.65, 0.68, 0.4))
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    panels = {}
    real = report.plot_panels
    monkeypatch.setattr(report, "plot_panels", lambda path, p, **kw: (panels.update(p), real(path, p, **kw))[1])
    report.write_report(run, "cookmind dpo run", {"status": "completed"})
    text = (run / "report.md").read_text()
    val = text.split("## Validation")[1].split("##")[0]
    assert "| step | loss | reward_accuracy | reward_margin |" in val and "None" not in val and "perplexity" not in val
    assert "| 2 | 0.67 | 0.64 | 0.2 |" in val and "| 4 | 0.65 | 0.68 | 0.4 |" in val
    assert panels["reward_accuracy"] == {
        "train": ([1, 2, 3, 4], [0.51, 0.52, 0.53, 0.54]),
        "val": ([2, 4], [0.64, 0.68]),
    }
    assert panels["reward_margin"] == {"val": ([2, 4], [0.2, 0.4])}
    assert (run / "objective.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_progress_bar_in_a_pipe_or_a_log_is_plain_lines(tmp_path, store, capsys, monkeypatch):
    """Into a pipe (capsys's stderr is not a terminal) the bar wrote as on a terminal: a carriage return and the whole
    bar again at every step, so a run's log was one line, thousands of screens long, that tail -f showed nothing of.
    Now each update is a line of its own (at most one every LINE_SECONDS), the last one the run's end."""
    from cookmind import progress

    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)
    Trainer(_cfg(tmp_path, store, "pipe", logging={"progress": True})).fit()
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = [line for line in err.splitlines() if line.startswith("pretrain:")]
    assert lines[0].startswith("pretrain:   0% 0/4") and lines[-1].startswith("pretrain: 100% 4/4")
    assert "step/s" in lines[-1] and "loss=" in lines[-1]


def test_the_progress_bar_on_a_terminal_is_drawn_in_place_and_quiet_when_disabled():
    import io

    from cookmind.progress import progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty, pipe = Terminal(), io.StringIO()
    for file in (tty, pipe):
        with progress_bar(total=3, desc="train", unit="step", file=file) as bar:
            bar.update(3)
    assert tty.getvalue().startswith("\rtrain:") and "3/3" in tty.getvalue()  # tqdm's own bar
    assert "\r" not in pipe.getvalue() and pipe.getvalue().splitlines()[-1].startswith("train: 100% 3/3")
    quiet = Terminal()
    with progress_bar(total=3, file=quiet, enabled=False) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_the_progress_bar_shows_on_a_terminal_that_tells_no_size(monkeypatch):
    """A terminal that says it is 0 columns by 0 rows (a pseudo-terminal nobody sized: `script`, `docker exec -t`,
    some CI runners) got no bar at all on stderr: tqdm fitted it to 0 rows. It is drawn 80 columns wide there now."""
    import pty
    import select
    import sys

    from cookmind.progress import progress_bar

    master, slave = pty.openpty()  # a new pseudo-terminal is 0 x 0
    assert os.get_terminal_size(slave) == (0, 0)
    shown = b""
    with os.fdopen(slave, "w") as tty:
        monkeypatch.setattr(sys, "stderr", tty)  # where the bar goes, as in `cookmind train`
        with progress_bar(total=3, desc="train", unit="step") as bar:
            bar.update(3)
        tty.flush()
        while select.select([master], [], [], 0.2)[0]:
            shown += os.read(master, 4096)
    os.close(master)
    assert "train: 100%" in shown.decode() and "3/3" in shown.decode()


def test_a_grpo_reports_held_out_accuracy_though_its_evaluations_log_no_loss(tmp_path, monkeypatch):
    """A GRPO run evaluates its held-out problems (val_accuracy, val_format_rate) and, with no validation store,
    logs no val_loss: the report took only val rows with a loss, so it had no validation section and its accuracy
    panel showed the training curve alone."""
    from cookmind.train import report

    run = tmp_path / "grpo"
    run.mkdir()
    rows = [{"step": s, "split": "train", "loss": 0.1, "lr": 3e-5, "reward": r} for s, r in ((1, 0.25), (2, 0.5))]
    rows += [{"step": s, "split": "val", "val_accuracy": a, "val_format_rate": 1.0} for s, a in ((0, 0.5), (2, 0.75))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    panels, plotted = {}, {}
    real_panels, real_series = report.plot_panels, report.plot_series
    monkeypatch.setattr(report, "plot_panels", lambda path, p, **kw: (panels.update(p), real_panels(path, p, **kw))[1])
    monkeypatch.setattr(
        report,
        "plot_series",
        lambda path, s, *a, **kw: (plotted.update({path.name: s}), real_series(path, s, *a, **kw))[1],
    )
    report.write_report(run, "cookmind grpo run", {"status": "completed"})
    val = (run / "report.md").read_text().split("## Validation")[1].split("##")[0]
    assert "| step | accuracy | format_rate |" in val and "| 0 | 0.5 | 1 |" in val and "| 2 | 0.75 | 1 |" in val
    assert panels["accuracy"] == {"val": ([0, 2], [0.5, 0.75])} and panels["reward"]["train"] == ([1, 2], [0.25, 0.5])
    assert list(plotted["loss.png"]) == ["train"]  # no validation loss to plot beside it


@pytest.mark.parametrize("how", ["diverged", "stopped"])
def test_the_step_a_run_stops_at_is_in_its_metrics_and_report(tmp_path, store, how):
    """metrics.jsonl took a row every logging.log_every steps and at train.max_steps: a run that diverged at step 7
    (or was stopped there) with log_every 5 ended its curves at step 5, and the report showed a healthy loss beside
    status 'diverged'. The step it stops at is logged too."""
    from cookmind.train.metrics import read_metrics

    class Kill(Callback):
        def on_step_end(self, trainer, step, metrics):
            if step == 7:
                os.kill(os.getpid(), signal.SIGTERM)

    cfg = _cfg(tmp_path, store, how, train={"max_steps": 20, "max_bad_steps": 1}, logging={"log_every": 5})
    if how == "diverged":
        with pytest.raises(TrainingDiverged):
            Trainer(cfg, objective=NaNAt({6, 7})).fit()
    else:
        assert Trainer(cfg, callbacks=[Kill()]).fit()["status"] == "stopped"
    rows = [json.loads(x) for x in (tmp_path / how / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("split") == "train"] == [5, 7]
    assert f"| status | {how} |" in (tmp_path / how / "report.md").read_text()
    assert read_metrics(tmp_path / how / "metrics.jsonl")[-1]["step"] == 7


def test_a_long_run_brings_its_report_up_to_date_at_each_checkpoint(tmp_path, store):
    """report.md was written once, when fit returned: a run of days showed no curves until its end, and one killed
    outright (SIGKILL, a lost node) had none at all, though its checkpoints and metrics.jsonl were there. The report
    is brought up to date at each checkpoint now (status 'running'); the end's report replaces it."""
    seen = {}

    class Look(Callback):
        def on_step_end(self, trainer, step, metrics):
            if step == 3:
                seen["report"] = (tmp_path / "live" / "report.md").read_text()
                seen["plot"] = (tmp_path / "live" / "loss.png").read_bytes()[:8]

    cfg = _cfg(tmp_path, store, "live", train={"max_steps": 4}, checkpoint={"every": 2})
    Trainer(cfg, callbacks=[Look()]).fit()
    assert "| status | running |" in seen["report"] and "| steps | 2 |" in seen["report"]
    assert "| of_steps | 4 |" in seen["report"] and seen["plot"] == b"\x89PNG\r\n\x1a\n"
    final = (tmp_path / "live" / "report.md").read_text()
    assert "| status | completed |" in final and "| steps | 4 |" in final and "running" not in final


def test_a_run_that_fails_after_a_checkpoint_does_not_leave_its_report_saying_running(tmp_path, store):
    """The report brought up to date at a checkpoint said 'running'; a run that then died of an error (not a signal,
    which ends with its own report) left it so, a run that looked alive. The error's report says 'failed', the step
    it failed at and why."""
    import pytest

    class Fail(Callback):
        def on_step_end(self, trainer, step, metrics):
            if step == 3:
                raise RuntimeError("the disk went away in the test")

    cfg = _cfg(tmp_path, store, "dies", train={"max_steps": 6}, checkpoint={"every": 2})
    with pytest.raises(RuntimeError, match="disk went away"):
        Trainer(cfg, callbacks=[Fail()]).fit()
    text = (tmp_path / "dies" / "report.md").read_text()
    assert "| status | failed |" in text and "running" not in text, text
    assert "RuntimeError: the disk went away in the test" in text


@pytest.mark.parametrize("shuffle", [True, False])
def test_the_windows_an_epoch_leaves_out_are_counted(tmp_path, store, capsys, shuffle):
    """An epoch ends where fewer items than a global batch are left, and those are dropped: nothing said so, and with
    data.shuffle=false the same last items were never trained, however long the run. 640 tokens in windows of 16
    make 40 windows; a global batch of 3 takes 39 of them an epoch (13 steps), 1 left out."""
    train = {"max_steps": 14, "micro_batch_size": 3}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(_cfg(tmp_path, store, f"s{shuffle}", train=train, data={"shuffle": shuffle}))
    err = capsys.readouterr().err
    assert "seq data: 640 tokens in 40 windows of data.window_size=16" in err, err
    said = [str(w.message) for w in caught if "epoch" in str(w.message)]
    if shuffle:
        assert "an epoch is 13 steps of 3 windows: 1 of the 40 is left out of each (others each epoch)" in err, err
        assert not said
    else:
        assert said == [
            "data.shuffle=false: the last 1 of the 40 training windows is never trained: an epoch is 13 steps of 3 "
            "(train.micro_batch_size x train.grad_accum_steps x processes) and ends where fewer are left; set "
            "data.shuffle=true, or a global batch that divides 40"
        ], said
    capsys.readouterr()
    Trainer(_cfg(tmp_path, store, f"short{shuffle}", train={**train, "max_steps": 13}, data={"shuffle": shuffle}))
    assert "left out" not in capsys.readouterr().err  # a run of one epoch or less leaves nothing out at an epoch's end
