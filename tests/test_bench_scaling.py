"""bench/bench_scaling.py on the CPU: one real torchrun job (FSDP on two gloo ranks) and the driver's arithmetic
over the jobs' figures."""

import json

import pytest


def test_an_fsdp_job_on_two_gloo_ranks_reports_the_whole_jobs_throughput():
    from bench.bench_scaling import launch, parse_args
    from bench.bench_train import TINY
    from cookmind.model import CookMindConfig, CookMindLM
    from cookmind.train.config import TrainConfig

    args = parse_args(["--device", "cpu", "--tiny", "--steps", "2", "--warmup", "1", "--no-compile"])
    row = launch(args, "fsdp", 2, "fsdp_unit_blocks=2")
    assert "error" not in row, row
    assert (row["method"], row["variant"], row["gpus"], row["micro_batch"], row["seq"]) == (
        "fsdp",
        "fsdp_unit_blocks=2",
        2,
        2,
        32,
    )
    shape = {**TrainConfig.load("llama-1.3b").model, **TINY}  # the preset's architecture, shrunk
    assert row["params"] == CookMindLM(CookMindConfig.from_dict(shape)).num_parameters()
    assert abs(row["tokens_per_s"] - 2 * row["tokens_per_s_per_gpu"]) <= 0.2 and row["tokens_per_s"] > 0
    assert row["peak_gib"] is None  # the CPU has no peak memory to read


def test_the_driver_divides_each_run_by_n_times_the_one_gpu_baseline(monkeypatch, capsys):
    import bench.bench_scaling as bench

    figures = {("plain", 1): (100.0, 30.0), ("fsdp", 1): (90.0, 26.0), ("fsdp", 2): (170.0, 19.5)}

    def fake_launch(args, method, gpus, variant=""):
        tps, peak = figures[(method, gpus)]
        return {"method": method, "variant": variant, "gpus": gpus, "tokens_per_s": tps, "peak_gib": peak}

    monkeypatch.setattr(bench, "launch", fake_launch)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)  # a machine of two GPUs
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert bench.main(["--device", "cuda", "--gpus", "1", "2", "--methods", "fsdp"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    scaling = {r["gpus"]: r for r in rows if r.get("figure") == "scaling"}
    assert scaling[1]["scaling_efficiency"] == 0.9 and scaling[1]["memory_ratio"] == round(26 / 30, 3)
    assert scaling[2]["scaling_efficiency"] == 0.85 and scaling[2]["memory_ratio"] == 0.65


def test_variant_settings_take_the_types_the_config_wants():
    from bench.bench_scaling import parse_variant

    got = parse_variant("fsdp_unit_blocks=4,fsdp_prefetch=true,reduce_dtype=bf16,bucket_mb=12.5")
    assert got == {"fsdp_unit_blocks": 4, "fsdp_prefetch": True, "reduce_dtype": "bf16", "bucket_mb": 12.5}
    assert type(got["fsdp_unit_blocks"]) is int and parse_variant("") == {}
    with pytest.raises(SystemExit):
        parse_variant("fsdp_unit_blocks")


def test_a_failed_jobs_error_names_the_ranks_reason_not_torchruns_wrapper():
    """job_error on torchrun's stderr (shapes copied from torch 2.13's output): a rank's exception line when there is
    one; for a rank killed by a signal, the root cause torchrun reports (rank, exit code, signal); never the
    ChildFailedError line torchrun ends with."""
    from bench.bench_scaling import job_error

    tail = (
        "E1201 14:45:54.995000 14765 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)\n"
        "Traceback (most recent call last):\n"
        '  File "torch/distributed/run.py", line 936, in main\n'
        "    raise ChildFailedError(\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "=======================================================\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  rank      : 1 (local_rank: 1)\n"
    )
    raised = (
        "Traceback (most recent call last):\n"
        '  File "/tmp/failrank.py", line 3, in <module>\n'
        '    raise ValueError("rank one broke: the reason")\n'
        "ValueError: rank one broke: the reason\n"
        + tail
        + "  exitcode  : 1 (pid: 14773)\n  error_file: <N/A>\n  traceback : To enable traceback see: ...\n"
    )
    assert job_error(raised) == "ValueError: rank one broke: the reason"
    killed = tail + "  exitcode  : -11 (pid: 14796)  (SIGSEGV)\n  error_file: <N/A>\n"
    killed += "  traceback : Signal 11 (SIGSEGV) received by PID 14796\n"
    assert job_error(killed) == (
        "rank : 1 (local_rank: 1) | exitcode : -11 (pid: 14796) (SIGSEGV) | traceback : Signal 11 (SIGSEGV) received "
        "by PID 14796"
    )
    assert job_error("") == "no output"
    # A rank that aborts says why first (libstdc++'s std::terminate wording); that leads the reason
    aborted = "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
    aborted += "  what():  [enforce fail at pair.cc:446] ex_ == nullptr. \n" + tail
    aborted += "  exitcode  : -6 (pid: 8650)  (SIGABRT)\n  error_file: <N/A>\n"
    aborted += "  traceback : Signal 6 (SIGABRT) received by PID 8650\n"
    assert job_error(aborted) == (
        "terminate called after throwing an instance of 'gloo::EnforceNotMet' | what(): [enforce fail at "
        "pair.cc:446] ex_ == nullptr. | rank : 1 (local_rank: 1) | exitcode : -6 (pid: 8650) (SIGABRT) | "
        "traceback : Signal 6 (SIGABRT) received by PID 8650"
    )
