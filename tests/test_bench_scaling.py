"""bench/bench_scaling.py on the CPU: a one-process baseline and FSDP on two gloo ranks, each a torchrun job of
its own, and the scaling line computed from their figures."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_scaling.py"


def test_baseline_then_fsdp_on_two_ranks_and_their_ratio(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--shape", "llama-1.3b", "--gpus", "2"]
    cmd += ["--methods", "fsdp", "--steps", "2", "--warmup", "1", "--no-compile"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    base, fsdp, scaling = (json.loads(line) for line in proc.stdout.splitlines())
    assert (base["method"], base["gpus"], fsdp["method"], fsdp["gpus"]) == ("plain", 1, "fsdp", 2)
    assert base["params"] == fsdp["params"] and (fsdp["micro_batch"], fsdp["seq"]) == (2, 32)  # the tiny shape
    assert abs(fsdp["tokens_per_s"] - 2 * fsdp["tokens_per_s_per_gpu"]) <= 0.2 and fsdp["tokens_per_s"] > 0
    expected = round(fsdp["tokens_per_s"] / (2 * base["tokens_per_s"]), 3)
    want = {"figure": "scaling", "method": "fsdp", "variant": "", "gpus": 2}
    want.update(scaling_efficiency=expected, memory_ratio=None)
    assert scaling == want  # the CPU has no peak memory


def test_variant_settings_take_the_types_the_config_wants():
    from bench.bench_scaling import parse_variant

    got = parse_variant("fsdp_unit_blocks=4,fsdp_prefetch=true,reduce_dtype=bf16,bucket_mb=12.5")
    assert got == {"fsdp_unit_blocks": 4, "fsdp_prefetch": True, "reduce_dtype": "bf16", "bucket_mb": 12.5}
    assert type(got["fsdp_unit_blocks"]) is int and parse_variant("") == {}
