"""bench/bench_train.py's timing window and its float8 peer, on the CPU."""

import pytest


def _capture_step() -> int:
    """The step (1-based) at which the Trainer's CUDA graph is captured: the first that GraphedStep.wants_step()
    sends to the graph (it counts its eager warm-up steps itself; no GPU is needed to ask it)."""
    from cookmind.train.cuda_graph import GraphedStep

    graphed = GraphedStep(trainer=None)
    step = 1
    while not graphed.wants_step():
        step += 1
    return step


@pytest.mark.parametrize("warmup", [0, 1, 3, 4, 10])
def test_with_the_cuda_graph_the_timed_steps_start_after_the_capture(warmup):
    from bench.bench_train import timed_warmup

    # the timed window runs from the end of step timed_warmup(...) on: the capture's step must lie before it
    assert timed_warmup(warmup, cuda_graph=True) >= _capture_step()
    assert timed_warmup(warmup, cuda_graph=True) >= warmup


@pytest.mark.parametrize("warmup", [0, 1, 3, 10])
def test_without_the_graph_the_warmup_asked_for_is_the_warmup_run(warmup):
    from bench.bench_train import timed_warmup

    assert timed_warmup(warmup, cuda_graph=False) == warmup


def test_the_profiles_idle_gaps_add_up_by_size_with_overlaps_counted_once():
    from bench.profile_train import idle_gaps

    # kernels (start, end) in µs: b overlaps a (no gap), then gaps of 1, 50 and 2000 µs
    kernels = [(0.0, 10.0, "a"), (5.0, 12.0, "b"), (13.0, 20.0, "c"), (70.0, 80.0, "d"), (2080.0, 2090.0, "e")]
    g = idle_gaps(kernels, top=2)
    assert g["idle_us"] == {"<= 2 us": 1.0, "<= 10 us": 0.0, "<= 100 us": 50.0, "<= 1000 us": 0.0, "> 1000 us": 2000.0}
    assert g["gaps"] == {"<= 2 us": 1, "<= 10 us": 0, "<= 100 us": 1, "<= 1000 us": 0, "> 1000 us": 1}
    assert g["longest"] == [{"us": 2000.0, "after": "d", "before": "e"}, {"us": 50.0, "after": "c", "before": "d"}]


def test_the_float8_peer_converts_the_decoder_layers_linears_and_not_the_head():
    """--peer-fp8: transformers' model with each decoder layer's q/k/v/o and gate/up/down as torchao float8 linears
    (7 a layer, counted by hand), the LM head a plain nn.Linear, the logits close to the bf16 peer's."""
    pytest.importorskip("transformers")
    import torch

    from bench.bench_train import convert_hf_peer_to_float8, hf_peer, preset_run
    from cookmind.model.float8_blocks import import_torchao_float8

    try:
        import_torchao_float8()
    except ImportError as exc:
        pytest.skip(str(exc))
    shape, _, _ = preset_run("qwen3-0.6b", tiny=True, seq=None)
    torch.manual_seed(0)
    ref = hf_peer(shape)
    model = hf_peer(shape)
    model.load_state_dict(ref.state_dict())
    assert convert_hf_peer_to_float8(model, emulate=True) == 7 * shape["num_hidden_layers"]
    assert type(model.lm_head) is torch.nn.Linear
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    ids = torch.randint(0, shape["vocab_size"], (2, 32))
    with torch.no_grad():
        got, want = model(input_ids=ids).logits, ref(input_ids=ids).logits
    err = ((got - want).norm() / want.norm()).item()
    assert 1e-5 < err < 0.1, err  # rounded to float8 (not the bf16 path), within e4m3's 3 mantissa bits


@pytest.mark.parametrize("fast_accum, want", [("output", (True, False, False)), ("all", (True, True, True))])
def test_the_float8_peer_accumulates_fast_in_the_gemms_asked(fast_accum, want):
    """--peer-fp8-fast-accum: ``output`` is torchao's tensorwise recipe as published (only the forward GEMM fast:
    read from torchao's own recipe, not ours); ``all`` every GEMM, the like-for-like peer of
    train.fp8_fast_accum=all."""
    pytest.importorskip("transformers")
    from bench.bench_train import convert_hf_peer_to_float8, hf_peer, preset_run
    from cookmind.model.float8_blocks import import_torchao_float8

    try:
        float8 = import_torchao_float8()
    except ImportError as exc:
        pytest.skip(str(exc))
    published = float8.Float8LinearConfig.from_recipe_name("tensorwise")
    assert (published.gemm_config_output.use_fast_accum, published.gemm_config_grad_input.use_fast_accum) == (
        True,
        False,
    )
    shape, _, _ = preset_run("llama-1.3b", tiny=True, seq=None)
    model = hf_peer(shape)
    assert convert_hf_peer_to_float8(model, emulate=True, fast_accum=fast_accum) == 7 * shape["num_hidden_layers"]
    got = {
        (
            c.gemm_config_output.use_fast_accum,
            c.gemm_config_grad_input.use_fast_accum,
            c.gemm_config_grad_weight.use_fast_accum,
        )
        for c in (m.config for m in model.modules() if type(m).__name__ == "Float8Linear")
    }
    assert got == {want}
    with pytest.raises(ValueError, match="fast_accum must be one of output, all"):
        convert_hf_peer_to_float8(hf_peer(shape), emulate=True, fast_accum="grad_input")
