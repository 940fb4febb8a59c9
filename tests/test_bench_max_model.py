"""bench/bench_max_model.py on the CPU under a simulated cap: the largest depth each method fits, against the model
state counted by hand (fp32 parameters, gradients and AdamW's two moments: 16 bytes a parameter, of which FSDP
keeps half on each of 2 ranks and ZeRO-1 shards only the moments)."""

import json
import os

import pytest
from gloo_fixtures import main_on_ranks

SHAPE = {"hidden_size": 32, "intermediate_size": 64, "vocab_size": 64, "num_attention_heads": 4}
SHAPE.update(num_key_value_heads=2, head_dim=8, tie_word_embeddings="true")
CAP_GIB = 0.00027  # 1 layer under DDP, 2 under ZeRO-1, 3 under FSDP on 2 ranks: short searches
ARGS = ["--device", "cpu", "--cap-gib", str(CAP_GIB), "--batch", "2", "--seq", "16", "--max-layers", "16"]
ARGS += ["--model", *(f"{k}={v}" for k, v in SHAPE.items())]


def params(layers: int) -> int:
    """CookMindLM's parameters at SHAPE, by hand: per block q and o 32x32, k and v 32x16, the SwiGLU's three 32x64,
    two norms of 32; the tied 64x32 embedding and the final norm once."""
    block = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32
    return layers * block + 64 * 32 + 32


def deepest(bytes_per_param: float) -> int:
    """The most layers whose model state per rank stays within the cap."""
    layers = 0
    while bytes_per_param * params(layers + 1) <= CAP_GIB * 2**30:
        layers += 1
    return layers


def _rows(stdout: str) -> dict[str, dict]:
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {r["method"]: r for r in rows}


def test_two_ranks_fsdp_fits_the_deepest_model_then_zero1_then_ddp(tmp_path):
    from bench.bench_max_model import main

    printed = main_on_ranks(main, [[*ARGS, "--methods", "ddp", "zero1", "fsdp"]], tmp_path, dict(os.environ))
    rows = _rows("".join(out[0] for out in printed))  # the script under torchrun: its ranks' output, merged
    assert set(rows) == {"ddp", "zero1", "fsdp"} and all(r["world_size"] == 2 for r in rows.values())
    ddp, zero1, fsdp = rows["ddp"], rows["zero1"], rows["fsdp"]
    assert (ddp["layers"], ddp["params"]) == (deepest(16), params(deepest(16)))
    assert (fsdp["layers"], fsdp["params"]) == (deepest(8), params(deepest(8)))  # every dim 0 halves evenly
    # ZeRO-1 gives each parameter whole to one rank: between half the moments and all of them, minus the greedy
    # split's slack; strictly between the other two at this cap
    assert deepest(16) < zero1["layers"] < deepest(8), zero1
    for r in rows.values():  # the search: the largest fits, one more layer does not
        assert r["first_too_large"] == r["layers"] + 1
        fits = {p["layers"]: p["fit"] for p in r["probes"]}
        assert fits[r["layers"]] and not fits[r["layers"] + 1]
        assert all(p["state_gib"] <= CAP_GIB for p in r["probes"] if p["fit"])
        assert r["limit_gib"] == CAP_GIB and r["peak_gib"] is None  # the CPU has no peak to measure


def test_one_process_every_method_holds_the_whole_state(capsys, keep_threads):
    from bench.bench_max_model import main

    assert main([*ARGS, "--methods", "ddp", "fsdp"]) == 0
    rows = _rows(capsys.readouterr().out)
    for method in ("ddp", "fsdp"):  # one rank shards nothing
        assert rows[method]["world_size"] == 1
        assert rows[method]["layers"] == deepest(16), rows[method]


def test_the_cpu_needs_a_cap():
    from bench.bench_max_model import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu"])


def test_a_first_guess_too_deep_halves_then_bisects_to_the_same_answer(capsys, keep_threads):
    start = 8  # 8, 4, 2 do not fit, 1 does
    from bench.bench_max_model import main

    assert main([*ARGS, "--methods", "ddp", "--start-layers", str(start)]) == 0
    row = _rows(capsys.readouterr().out)["ddp"]
    assert (row["layers"], row["first_too_large"]) == (deepest(16), deepest(16) + 1), row
    assert row["probes"][-1]["layers"] <= start and {p["layers"] for p in row["probes"]} >= {deepest(16), start}
