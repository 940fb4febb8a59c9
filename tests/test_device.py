"""One device rule for train.device and every inference command's --device (cookmind.device): auto is the GPU
when CUDA is present; a bad name, or CUDA where there is none, is one line naming the key or flag, not a torch
traceback. generate, chat and eval used to run on the CPU unless told, unlike serve and train."""

from __future__ import annotations

import pytest
import torch

from cookmind.cli import main as cli_main
from cookmind.device import inference_dtype, resolve_device


def _cuda_present(monkeypatch, count=1):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_auto_is_the_cpu_without_cuda_and_bad_names_are_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^--device cuda but CUDA is not available here; pass cpu or auto$"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match=r"^train.device=gpu is not a device; pass auto, cpu, cuda or cuda:N$"):
        resolve_device("gpu", what="train.device")
    assert inference_dtype(None, torch.device("cpu")) is None  # the checkpoint's own
    assert inference_dtype("float32", torch.device("cuda", 0)) == "float32"  # what the user asked for


def test_auto_is_this_ranks_gpu_with_cuda(monkeypatch):
    _cuda_present(monkeypatch, count=2)
    assert resolve_device(None) == torch.device("cuda", 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="only 2 CUDA devices are visible"):
        resolve_device("cuda:2")
    assert inference_dtype(None, torch.device("cuda", 0)) == "bfloat16"


class Loaded(Exception):
    """Raised by the stand-in loader: the command got as far as loading, with these arguments."""


@pytest.mark.parametrize(
    "argv,dtype",
    [
        (["generate", "--prompt", "hi"], "bfloat16"),
        (["chat"], "bfloat16"),
        (["serve"], "bfloat16"),
        (["eval", "ppl", "--data", "store"], None),  # eval keeps the checkpoint's dtype: scores as trained
    ],
)
def test_every_inference_command_takes_the_gpu_when_there_is_one(monkeypatch, tmp_path, argv, dtype):
    import cookmind.infer.loading as loading

    _cuda_present(monkeypatch)
    got = {}

    def load(path, device="cpu", dtype=None, tokenizer_path=None, **kw):
        got.update(device=device, dtype=dtype)
        raise Loaded

    monkeypatch.setattr(loading, "load_for_inference", load)
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "store").mkdir()  # eval checks its --data (a store: a folder with meta.json) before the model
    (tmp_path / "store" / "meta.json").write_text("{}")
    if argv[0] == "serve":
        monkeypatch.setattr("cookmind.infer.cli_serve.check_port_free", lambda host, port: None)
    with pytest.raises(Loaded):
        cli_main([*argv, "--model", str(model)])
    assert got == {"device": "cuda:0", "dtype": dtype}


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["chat"], ["eval", "ppl", "--data", "store"]])
def test_a_bad_device_is_one_line_before_anything_loads(monkeypatch, tmp_path, capsys, command):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = tmp_path / "model"
    model.mkdir()
    assert cli_main([*command, "--model", str(model), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    stage = " ".join(command[:2] if command[0] == "eval" else command[:1])  # eval names its sub-command
    assert err == [f"cookmind {stage}: error: --device cuda but CUDA is not available here; pass cpu or auto"]


def test_captures_run_after_one_collection_with_the_collector_paused():
    """An object kept alive by a reference cycle must be freed before CUDA-graph captures begin, never inside
    them: its CUDA frees would spoil a capture (the GPU test-order failure of speculative decoding after the
    structured-output tests). One collection first, the collector off until the block ends, then as it was."""
    import gc

    from cookmind.device import collector_paused

    freed = []

    class Cyclic:
        def __init__(self):
            self.me = self

        def __del__(self):
            freed.append(True)

    assert gc.isenabled()
    Cyclic()  # garbage only a collection pass frees
    with collector_paused():
        assert freed == [True] and not gc.isenabled()
        Cyclic()  # made inside: it waits for a pass after the block
        assert freed == [True]
    assert gc.isenabled()  # restored after
    gc.collect()
    assert freed == [True, True]
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_overlapping_pauses_in_two_threads_keep_the_collector_off_until_the_last_ends():
    """The server's engine thread and a training step may capture at once: the first block to end turned the
    collector back on while the other was still capturing."""
    import gc
    import threading

    from cookmind.device import collector_paused

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with collector_paused():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with collector_paused():
            second_in.set()
            first_out.wait(10)
            seen["inside after the first ended"] = gc.isenabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    assert gc.isenabled()
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"inside after the first ended": False}
    assert gc.isenabled()  # on again once both ended


@pytest.mark.parametrize(
    "script, argv",
    [
        ("bench_train", ["--device", "cuda", "--variants", "cuda-graph"]),
        ("bench_decode", ["--device", "cuda"]),
        ("bench_speculative", ["--device", "cuda", "--k", "6"]),
        ("bench_multi_lora", ["--device", "cuda"]),
        ("profile_speculative", ["--device", "cuda"]),
        ("bench_max_model", ["--device", "cuda"]),
        ("bench_fp8_loss", ["--device", "cuda", "--shape", "tiny"]),
        ("bench_scaling", ["--device", "cuda"]),
        ("bench_scaling", ["--shape", "llama-1.3b", "--gpus", "2", "--job-timeout-s", "5"]),
        ("bench_attention", ["--rep", "30"]),
        ("bench_linear_ce", []),
    ],
)
def test_a_gpu_benchmark_on_a_machine_without_cuda_says_so_in_one_line(script, argv, monkeypatch, capsys):
    """The README's GPU figures' commands on a CPU machine: `python3 bench/bench_train.py --device cuda` ended in
    torch's "AssertionError: Torch not compiled with CUDA enabled", `bench/bench_attention.py` in
    "ModuleNotFoundError: No module named 'triton'" (and the decode/speculative/LoRA benches ran or failed deep
    inside). Each stops at once with exit status 2 and one line saying CUDA is missing."""
    import importlib
    import sys

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "triton", None)  # as on a CPU machine without it: importing it fails
    monkeypatch.setattr(sys, "argv", [f"bench/{script}.py", *argv])
    module = importlib.import_module(f"bench.{script}")
    try:
        status = module.main()
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and "CUDA" in err[-1], err[-3:]


@pytest.mark.parametrize("name", ["mps", "xpu", "meta"])
def test_a_device_torch_knows_but_cookmind_does_not_run_on_is_one_line(name, capsys):
    # `generate --device mps` was a traceback ending "PyTorch is not linked with support for mps devices"
    with pytest.raises(ValueError, match=rf"^--device {name}: cookmind runs on the CPU or CUDA GPUs; pass auto, cpu"):
        resolve_device(name)
    from cookmind.cli import main

    assert main(["generate", "no-model", "--prompt", "hi", "--device", name]) == 2
    assert f"--device {name}: cookmind runs on the CPU or CUDA GPUs" in capsys.readouterr().err
