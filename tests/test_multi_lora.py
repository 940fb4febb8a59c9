"""LoRA adapters per request (#19 item 4): one engine batch serves several adapters and the base at once.

The reference for every adapter is the model with that adapter merged into its weights (``merged_copy``, or PEFT's
``merge_and_unload`` on the Hugging Face export) run alone through its plain forward, a naive full-recompute greedy
loop: the engine's greedy tokens must equal it, and its log-probabilities (prompt places: prefill; generated tokens:
decode) must match within 1e-4 (float32; the merged weight W + s B A and the unmerged x W^T + s (x A^T) B^T differ
only by rounding).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from lm_fixtures import sharp_tiny_lm
from torch.utils._python_dispatch import TorchDispatchMode

from cookmind.infer.engine import Engine, PromptLogprobsEvent, TokenEvent
from cookmind.infer.loading import load_adapters
from cookmind.infer.sampling import SamplingParams
from cookmind.model.lora import apply_lora, lora_modules, merged_copy, save_adapter

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread

TOL = 1e-4
NEW = 6


def _adapter(base, directory, seed, r, alpha, targets, rslora=False):
    """Train-free adapter: random A and B on a copy of base, saved in cookmind's format; returns its merged model."""
    model = copy.deepcopy(base)
    apply_lora(model, r=r, alpha=alpha, targets=targets)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in lora_modules(model):
            m.lora_A.weight.copy_(torch.randn(m.lora_A.weight.shape, generator=gen) * 0.5)
            m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=gen) * 0.5)
    save_adapter(directory, model)
    if rslora:  # the file says alpha / sqrt(r); the reference merges with that scaling
        cfg = json.loads((directory / "adapter_config.json").read_text())
        (directory / "adapter_config.json").write_text(json.dumps({**cfg, "use_rslora": True}))
        for _, m in lora_modules(model):
            m.scaling = alpha / r**0.5
    return merged_copy(model).eval()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multilora")
    base = sharp_tiny_lm()
    refs = {
        None: copy.deepcopy(base),
        "chef": _adapter(base, tmp / "chef", 1, r=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"]),
        "baker": _adapter(
            base, tmp / "baker", 2, r=2, alpha=4.0, targets=["k_proj", "o_proj", "gate_proj", "up_proj"], rslora=True
        ),
    }
    return base, tmp, refs


def _reference(model, prompt, n):
    """Greedy tokens and their log-probabilities, and the prompt's log-probabilities, by full recompute."""
    ids = list(prompt)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        prompt_lp = [logp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
        out, lps = [], []
        for _ in range(n):
            last = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            tok = int(last.argmax())
            out.append(tok)
            lps.append(last[tok].item())
            ids.append(tok)
    return out, lps, prompt_lp


def _run(engine, jobs):
    """Submit every (prompt, adapter) before stepping (so they share batches); tokens, logprobs, prompt logprobs."""
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW, logprobs=True)
    reqs = [engine.submit(p, params, prompt_logprobs=0, adapter=a) for p, a in jobs]
    engine.run_until_idle()
    results = []
    for req in reqs:
        events = list(req.events(timeout=5))
        toks = [e for e in events if isinstance(e, TokenEvent)]
        prompt = next(e for e in events if isinstance(e, PromptLogprobsEvent))
        results.append(([e.token_id for e in toks], [e.logprob for e in toks], prompt.logprobs[1:]))
    return results


@pytest.mark.parametrize(
    "kw",
    [
        {"kv_cache": "paged", "decode_attention": "gather"},
        {"kv_cache": "paged", "decode_attention": "kernel", "cuda_graphs": True},  # fused decode, graph step
        {"kv_cache": "slots"},
    ],
    ids=["paged-gather", "paged-kernel-graphstep", "slots"],
)
@pytest.mark.parametrize("path", ["masked", "gathered"])  # gathered: what "auto" takes past MASKED_MAX_STACK adapters
def test_one_batch_of_two_adapters_and_the_base_equals_each_merged_model(setup, kw, path):
    from cookmind.infer import multi_lora

    base, tmp, refs = setup
    adapters = load_adapters(base, {"chef": tmp / "chef", "baker": tmp / "baker"})
    engine = Engine(copy.deepcopy(base), num_slots=4, adapters=adapters, lora_update=path, **kw)
    deltas = [m for m in engine.runner.model.modules() if isinstance(m, multi_lora.LowRankDelta)]
    assert deltas and all(d.masked == (path == "masked") for d in deltas)
    prompts = [[5, 9, 14, 3, 22, 7], [5, 9, 14, 3, 40], [11, 2, 30, 8, 8, 19, 4], [5, 9, 14, 3, 22, 7]]
    jobs = list(zip(prompts, ["chef", None, "baker", "baker"]))
    got = _run(engine, jobs)
    differs = False
    for (prompt, name), (toks, lps, prompt_lp) in zip(jobs, got):
        ref_toks, ref_lps, ref_prompt_lp = _reference(refs[name], prompt, NEW)
        assert toks == ref_toks, (name, prompt)
        assert max(abs(a - b) for a, b in zip(lps, ref_lps)) < TOL
        assert max(abs(a - b) for a, b in zip(prompt_lp, ref_prompt_lp)) < TOL
        base_toks = _reference(refs[None], prompt, NEW)[0]
        differs |= name is not None and toks != base_toks
    assert differs, "the adapters did not change any output: the comparison would prove nothing"


@pytest.mark.parametrize("stack_max, masked", [(3, True), (2, False)])
def test_auto_masks_up_to_masked_max_stack_adapters_and_a_bad_update_is_refused(setup, stack_max, masked, monkeypatch):
    """update="auto": two adapters and the base (3 stacked) are masked while MASKED_MAX_STACK >= 3, else gathered;
    an unknown update is a ValueError naming the choices."""
    from cookmind.infer import multi_lora

    base, tmp, _ = setup
    adapters = load_adapters(base, {"chef": tmp / "chef", "baker": tmp / "baker"})
    monkeypatch.setattr(multi_lora, "MASKED_MAX_STACK", stack_max)
    model = copy.deepcopy(base)
    multi_lora.attach_adapters(model, adapters, num_slots=2)
    deltas = [m for m in model.modules() if isinstance(m, multi_lora.LowRankDelta)]
    assert deltas and all(d.masked == masked for d in deltas)
    with pytest.raises(ValueError, match="update must be one of auto, masked, gathered"):
        multi_lora.attach_adapters(copy.deepcopy(base), adapters, num_slots=2, update="fast")


@pytest.mark.parametrize("share", [0.25, 1.0], ids=["gate-up-folds", "both-fold"])
def test_served_layers_stay_fused_with_adapters_on_some_of_the_parts(setup, share, monkeypatch):
    """Adapters on q and v (chef), on k (baker), on gate and up (baker only): every layer still runs one QKV and one
    gate/up GEMM, each part's update in its slice (zeros where the row's adapter does not target it), and the mixed
    batch equals each merged model through the fused prefill (a short one, every adapter masked, and a long one,
    each row's pair gathered) and the fused decode kernel. Where every adapter's A adds at most FOLD_MAX_SHARE of
    the fused weight's rows it joins that GEMM (gate/up here: 12 rows on 128; q/k/v too at share 1: 30 on 64)."""
    from cookmind.infer import multi_lora

    monkeypatch.setattr(multi_lora, "FOLD_MAX_SHARE", share)
    base, tmp, refs = setup
    adapters = load_adapters(base, {"chef": tmp / "chef", "baker": tmp / "baker"})
    engine = Engine(copy.deepcopy(base), num_slots=4, decode_attention="kernel", adapters=adapters)
    fused = engine.runner.fused
    assert fused is not None and len(fused) == len(base.model.layers)
    for f, layer in zip(fused, engine.runner.model.model.layers):
        assert f.qkv is not None and f.gate_up is not None  # one GEMM each, adapters or not
        assert f.qkv_delta is not None and f.gate_up_delta is not None
        assert f.gate_up.shape[0] == 128 + 3 * 4  # [W_gate; W_up; A_all], W_gate a view of its rows
        assert f.qkv.shape[0] == (64 + 3 * 10 if share == 1.0 else 64)
        gate = layer.mlp.gate_proj.weight
        assert gate.untyped_storage().data_ptr() == f.gate_up.untyped_storage().data_ptr()
    long_prompt = [(7 * i + 3) % 97 for i in range(20)]  # past MASKED_MAX_TOKENS: its prefill gathers
    jobs = [([5, 9, 14, 3, 22, 7], "chef"), ([11, 2, 30, 8], None), ([5, 9, 14, 3, 22, 7], "baker")]
    jobs.append((long_prompt, "chef"))
    for (prompt, name), (toks, lps, prompt_lp) in zip(jobs, _run(engine, jobs)):
        ref_toks, ref_lps, ref_prompt_lp = _reference(refs[name], prompt, NEW)
        assert toks == ref_toks, name
        assert max(abs(a - b) for a, b in zip(lps + prompt_lp, ref_lps + ref_prompt_lp)) < TOL, name


@pytest.mark.gpu
@pytest.mark.parametrize("update", ["own", "select"])  # multi_lora.COMPILED_UPDATE
@pytest.mark.parametrize("hidden", [32, 64], ids=["head-dim-8-gather", "head-dim-16-kernel-fused"])
def test_cuda_graphs_and_compile_serve_each_rows_adapter(tmp_path, hidden, update, monkeypatch):
    """On CUDA (graphs captured once, layers compiled): the batch of the CPU test equals each merged model (float32;
    1e-3 for the GPU's reduction order), and every decode step of the mixed batch replays a captured graph (the
    runner's forward runs only for prefills). Head dim 8 decodes by "gather" with the projections unfused; head dim
    16 takes the Triton decode kernel with fused QKV / gate-up GEMMs carrying the adapters."""
    from cookmind.infer import multi_lora

    monkeypatch.setattr(multi_lora, "COMPILED_UPDATE", update)
    base = sharp_tiny_lm(hidden_size=hidden)
    refs = {
        None: base,
        "chef": _adapter(base, tmp_path / "chef", 1, r=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"]),
        "baker": _adapter(
            base, tmp_path / "baker", 2, r=2, alpha=4.0, targets=["k_proj", "o_proj", "gate_proj", "up_proj"]
        ),
    }
    adapters = load_adapters(base, {"chef": tmp_path / "chef", "baker": tmp_path / "baker"})
    # "masked" by name: on CUDA "auto" would take the Triton kernels (tests/test_lora_bgmv.py), not COMPILED_UPDATE
    engine = Engine(copy.deepcopy(base).cuda(), num_slots=4, adapters=adapters, lora_update="masked")
    assert engine.graphs is not None and engine.graphs.capture and engine.runner.compiled
    if hidden == 64:
        assert engine.runner.decode_attention == "kernel"
        assert all(f.qkv_delta is not None and f.gate_up_delta is not None for f in engine.runner.fused)
    serves_a_mixed_batch_from_graphs_like_the_merged_models(engine, refs)


def serves_a_mixed_batch_from_graphs_like_the_merged_models(engine, refs):
    """A batch of chef, the base and baker on a CUDA engine equals each merged model (greedy tokens; log
    probabilities within 1e-3, the GPU's reduction order), no decode step runs eagerly (a captured step replays
    without calling the runner's forward), and the compiler took every layer."""
    prompts = [[5, 9, 14, 3, 22, 7], [5, 9, 14, 3, 40], [11, 2, 30, 8, 8, 19, 4]]
    jobs = list(zip(prompts, ["chef", None, "baker"]))
    tokens_per_row, compute = [], engine.runner.compute

    def counted(tokens, *args, **kwargs):
        tokens_per_row.append(tokens.shape[1])
        return compute(tokens, *args, **kwargs)

    engine.runner.compute = counted
    for (prompt, name), (toks, lps, _) in zip(jobs, _run(engine, jobs)):
        ref_toks, ref_lps, _ = _reference(refs[name], prompt, NEW)
        assert toks == ref_toks, name
        assert max(abs(a - b) for a, b in zip(lps, ref_lps)) < 1e-3
    assert tokens_per_row and 1 not in tokens_per_row, f"decode steps ran eagerly: {tokens_per_row}"
    assert engine.runner.compile_error is None


def test_prefix_cache_does_not_share_blocks_across_adapters(setup):
    base, tmp, refs = setup
    adapters = load_adapters(base, {"chef": tmp / "chef", "baker": tmp / "baker"})
    engine = Engine(copy.deepcopy(base), num_slots=2, block_size=4, prefix_cache=True, adapters=adapters)
    prompt = [5, 9, 14, 3, 22, 7, 1, 2, 40, 41]  # two full blocks of 4 before the last token
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW)

    def run(adapter):
        req = engine.submit(prompt, greedy, adapter=adapter)
        engine.run_until_idle()
        return req

    first = run("chef")
    assert first.cached_tokens == 0
    other = run("baker")  # the same prefix under another adapter: its KV differs, nothing may be reused
    assert other.cached_tokens == 0
    assert run(None).cached_tokens == 0
    again = run("baker")
    assert again.cached_tokens == 8  # within one adapter the blocks are shared
    for req, name in [(first, "chef"), (other, "baker"), (again, "baker")]:
        assert req.output_ids == _reference(refs[name], prompt, NEW)[0]


def _peft_adapter(base, tmp):
    """A LoRA adapter made by the `peft` library on the Hugging Face export of base (use_rslora, dropout, a rank
    of its own); returns its directory and peft's merge_and_unload model."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from cookmind.model import save_model
    from cookmind.model.hf import export_hf

    save_model(tmp / "base", base)
    export_hf(tmp / "base", tmp / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32)
    cfg = peft.LoraConfig(
        r=3, lora_alpha=5, lora_dropout=0.1, use_rslora=True, target_modules=["q_proj", "up_proj", "o_proj"]
    )
    model = peft.get_peft_model(hf, cfg)
    torch.manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.5)
    model.save_pretrained(tmp / "peft")
    return tmp / "peft", model.merge_and_unload().eval()


def test_peft_saved_adapter_equals_peft_merged_model(setup, tmp_path):
    base, tmp, _ = setup
    directory, merged = _peft_adapter(base, tmp_path)
    adapters = load_adapters(base, {"hf-lora": directory, "chef": tmp / "chef"})
    # the fused path: peft's q_proj and up_proj updates land in their slices of the QKV and gate/up GEMMs
    engine = Engine(copy.deepcopy(base), num_slots=2, decode_attention="kernel", adapters=adapters)
    assert engine.runner.fused[0].qkv_delta is not None and engine.runner.fused[0].gate_up_delta is not None
    prompt = [5, 9, 14, 3, 22, 7]
    ((toks, lps, prompt_lp),) = _run(engine, [(prompt, "hf-lora")])
    ref_toks, ref_lps, ref_prompt_lp = _reference(lambda ids: merged(input_ids=ids), prompt, NEW)
    assert toks == ref_toks
    assert max(abs(a - b) for a, b in zip(lps + prompt_lp, ref_lps + ref_prompt_lp)) < TOL
    assert toks != _reference(base, prompt, NEW)[0]


def _greedy_until_stop(model, prompt, n, stops):
    """Naive greedy continuation (full recompute each token) that ends at a stop token, which is not kept."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            if tok in stops:
                break
            out.append(tok)
            ids.append(tok)
    return out


def test_openai_client_picks_the_adapter_by_model(tmp_path_factory, tok_dir):
    import concurrent.futures
    import os

    import openai
    from test_server import LiveServer, make_model
    from test_server_cli import parse

    from cookmind.infer import cli_serve
    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    tmp = tmp_path_factory.mktemp("serve-lora")
    base = make_model(tok.vocab_size, max_pos=256)
    save_model(tmp / "cook", base)
    tok.save(tmp / "cook")
    refs = {
        "cook": base,
        "chef": _adapter(base, tmp / "chef", 1, r=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"]),
        "baker": _adapter(base, tmp / "baker", 2, r=2, alpha=4.0, targets=["o_proj", "up_proj"]),
    }
    args = parse(
        tmp / "cook",
        "--device",
        "cpu",
        "--max-batch",
        "4",
        "--lora",
        f"chef={tmp / 'chef'}",
        "--lora",
        f"baker={tmp / 'baker'}",
    )
    app, engine = cli_serve.build_app(args)
    server = LiveServer(app)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        listed = {m.id: (m.model_extra or {}).get("parent") for m in client.models.list().data}
        assert listed == {"cook": None, "chef": "cook", "baker": "cook"}
        prompt = tok.encode("The cook stirs the soup")
        stops = {tok.eos_id, tok.im_end_id}

        def ask(name):
            return client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0)

        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # in flight together: they may share batches
            answers = dict(zip(refs, pool.map(ask, refs)))
        texts = set()
        for name, r in answers.items():
            assert r.model == name
            assert r.choices[0].text == tok.decode(_greedy_until_stop(refs[name], prompt, 8, stops)), name
            texts.add(r.choices[0].text)
        assert len(texts) == 3, "the adapters did not change the answer: the test would prove nothing"
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model="sous-chef", messages=[{"role": "user", "content": "hi"}])
        assert e.value.code == "model_not_found" and "'chef'" in str(e.value)
    finally:
        server.close()
    assert os.path.isdir(tmp / "chef")  # serving reads adapters, never moves them


def _edit_config(directory, **fields):
    f = directory / "adapter_config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **fields}))


@pytest.mark.parametrize(
    "edit, match",
    [
        ({"bias": "lora_only"}, "bias is 'lora_only'"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"use_dora": True}, "use_dora"),
        ({"target_modules": ["q_proj", "v_proj", "k_proj"]}, r"module model\.layers\.0\.self_attn\.k_proj is a target"),
        ({"r": 8}, r"adapter 'bad'.*layers\.0\.mlp\.down_proj\.lora_A\.weight has shape \(4, 64\).*expects \(8, 64\)"),
    ],
    ids=["bias", "modules_to_save", "dora", "missing-module", "rank"],
)
def test_adapter_config_mismatches_are_refused_naming_adapter_and_module(setup, tmp_path, edit, match):
    import shutil

    base, tmp, _ = setup
    shutil.copytree(tmp / "chef", tmp_path / "bad")
    _edit_config(tmp_path / "bad", **edit)
    with pytest.raises(ValueError, match=match):
        load_adapters(base, {"bad": tmp_path / "bad"})


def test_a_lora_training_run_serves_its_newest_checkpoints_adapter(setup, tmp_path):
    import shutil

    from cookmind.model import save_model

    base, tmp, _ = setup
    for step, source in [(1, "baker"), (2, "chef")]:  # as the Trainer saves a LoRA run: merged model + adapter
        d = tmp_path / "run" / "checkpoints" / f"step_{step}"
        save_model(d, base)
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            shutil.copy(tmp / source / f, d / f)
    (adapter,) = load_adapters(base, {"run": tmp_path / "run"})
    assert adapter.path == tmp_path / "run" / "checkpoints" / "step_2"
    assert set(adapter.weights) == set(load_adapters(base, {"chef": tmp / "chef"})[0].weights)


def test_adapter_for_another_base_is_refused(setup, tmp_path):
    base, _, _ = setup
    _adapter(sharp_tiny_lm(hidden_size=48), tmp_path / "wide", 1, r=4, alpha=8.0, targets=["q_proj"])
    with pytest.raises(ValueError, match=r"adapter 'wide'.*model\.layers\.0\.self_attn\.q_proj\.lora_A.*\(4, 48\)"):
        load_adapters(base, {"wide": tmp_path / "wide"})
    _adapter(sharp_tiny_lm(num_hidden_layers=3), tmp_path / "deep", 1, r=4, alpha=8.0, targets=["q_proj"])
    with pytest.raises(ValueError, match=r"adapter 'deep'.*module model\.layers\.2\.self_attn\.q_proj is not a linear"):
        load_adapters(base, {"deep": tmp_path / "deep"})


def test_an_adapter_path_that_is_not_there_says_so(setup, tmp_path):
    # "nope/adapter_config.json: missing; nope holds no LoRA adapter" read as if the folder were there
    base, _, _ = setup
    with pytest.raises(FileNotFoundError, match=r"nope: no such directory; name a LoRA adapter folder or a LoRA"):
        load_adapters(base, {"x": tmp_path / "nope"})


def test_an_adapter_path_that_is_a_file_says_so_and_names_its_folder(setup, tmp_path):
    # --lora chef=run/checkpoints/step_N/adapter_model.safetensors said "...: no such directory", though it is there
    base, _, _ = setup
    _adapter(base, tmp_path / "chef", 1, r=4, alpha=8.0, targets=["q_proj"])
    weights = tmp_path / "chef" / "adapter_model.safetensors"
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(f"{weights}: is a file, not a folder; name the folder that holds it, {weights.parent} ")
        + re.escape("(adapter 'x')"),
    ):
        load_adapters(base, {"x": weights})


def test_a_model_that_is_no_adapter_is_refused_naming_the_adapter_and_what_to_give(setup, tmp_path):
    # --lora chef=runs/pre (a pretraining run) said ".../adapter_config.json: missing; ... holds no LoRA adapter":
    # neither which --lora it was nor what an adapter is
    from cookmind.model import save_model

    base, _, _ = setup
    save_model(tmp_path / "full", base)
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(f"adapter 'chef' ({tmp_path / 'full'}) holds no LoRA adapter (no adapter_config.json): ")
        + r".*lora\.enabled=true.*save_adapter.*PEFT",
    ):
        load_adapters(base, {"chef": tmp_path / "full"})


def test_bad_lora_arguments():
    from cookmind.infer.loading import parse_lora_specs

    assert parse_lora_specs(["a=x/y", "b=z"], "base") == {"a": Path("x/y"), "b": Path("z")}
    cases = [(["noequals"], "expected NAME=PATH"), (["a=x", "a=y"], "another --lora"), (["base=x"], "the base model")]
    for specs, match in cases:
        with pytest.raises(ValueError, match=match):
            parse_lora_specs(specs, "base")


def test_submit_with_an_unknown_adapter_is_refused(setup):
    base, tmp, _ = setup
    engine = Engine(copy.deepcopy(base), num_slots=1, adapters=load_adapters(base, {"chef": tmp / "chef"}))
    with pytest.raises(ValueError, match=r"unknown adapter 'baker'; this engine serves \['chef'\]"):
        engine.submit([1, 2, 3], adapter="baker")
    with pytest.raises(ValueError, match="serves no LoRA adapters"):
        Engine(copy.deepcopy(base), num_slots=1).submit([1, 2, 3], adapter="chef")


def _delta_case(n, seed=0):
    """A fused projection of four parts (widths 8, 4, 4, 6; the third targeted by no adapter) whose parts carry
    n adapters of ranks up to 3 (a part's smaller-rank adapters zero-padded, as attach_adapters stacks them)."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for spec in [(8, 3), (4, 2), 4, (6, 3)]:
        if isinstance(spec, int):
            parts.append(spec)
            continue
        out, r = spec
        a = torch.randn(n + 1, r, 5, generator=gen)
        b = torch.randn(n + 1, out, r, generator=gen)
        a[0], b[0], b[1:, :, r - 1 :] = 0, 0, 0  # index 0 is the base; adapters of rank r - 1 in an r-wide stack
        parts.append((a, b, torch.rand(n + 1, generator=gen) + 0.5))
    rows = torch.tensor([(3 * i + 1) % (n + 1) for i in range(7)])  # the base and every adapter, in no order
    return parts, rows, gen


def _delta_reference(parts, rows, x, y):
    """Row by row, part by part: y + scale[i] * (x A[i]^T) B[i]^T in each targeted part's slice."""
    out = y.clone()
    for row, i in enumerate(rows.tolist()):
        start = 0
        for p in parts:
            width = p if isinstance(p, int) else p[1].shape[1]
            if not isinstance(p, int):
                a, b, s = p
                out[row, ..., start : start + width] += s[i] * (x[row] @ a[i].T) @ b[i].T
            start += width
    return out


@pytest.mark.parametrize("path", ["masked", "gathered"])
def test_low_rank_delta_adds_each_rows_adapter_update(path):
    """Against a row-by-row loop, for a decode step (B, 1, in), a verify step (B, 4, in), a prefill (B, 20, in)
    and a head's (B, in); both ways of computing it (every adapter masked, used up to MASKED_MAX_STACK adapters and
    MASKED_MAX_TOKENS tokens a row; or each row's pair gathered)."""
    from cookmind.infer.multi_lora import LowRankDelta

    parts, rows, gen = _delta_case(n=3)
    delta = LowRankDelta(parts, rows, masked=path == "masked")
    for shape in [(7, 1, 5), (7, 4, 5), (7, 20, 5), (7, 5)]:
        x = torch.randn(shape, generator=gen)
        y = torch.randn(*shape[:-1], 22, generator=gen)
        torch.testing.assert_close(delta(x, y), _delta_reference(parts, rows, x, y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("update", ["own", "select"])
def test_compiled_low_rank_delta_adds_each_rows_adapter_update(update, monkeypatch):
    """Compiled as the runner compiles (dynamic shapes), the decode step's fused reduction (each row's own columns
    and B, or every adapter's with the others' zeroed: COMPILED_UPDATE), a larger verify step's select and GEMM
    (past COMPILED_EXPAND_MAX_ELEMENTS, lowered here to reach it at these sizes), and the prefill's gathered pairs
    all equal the row-by-row loop."""
    from cookmind.infer import multi_lora
    from cookmind.infer.multi_lora import LowRankDelta

    monkeypatch.setattr(multi_lora, "COMPILED_UPDATE", update)
    monkeypatch.setattr(multi_lora, "COMPILED_EXPAND_MAX_ELEMENTS", 1000)  # (7, 1) rows x 32 below, (7, 12) above
    parts, rows, gen = _delta_case(n=3, seed=1)
    delta = LowRankDelta(parts, rows, masked=True)
    compiled = torch.compile(lambda x, y: delta(x, y), dynamic=True)
    for shape in [(7, 1, 5), (7, 12, 5), (7, 20, 5), (7, 5)]:
        x = torch.randn(shape, generator=gen)
        y = torch.randn(*shape[:-1], 22, generator=gen)
        torch.testing.assert_close(compiled(x, y), _delta_reference(parts, rows, x, y), rtol=1e-5, atol=1e-5)


class Ops(TorchDispatchMode):
    """The aten ops that run inside it, by name: views launch nothing, nor does _unsafe_view (a view by another
    name) or a Python number's tensor."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.__name__ not in ("_unsafe_view.default", "scalar_tensor.default"):
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("n", [2, 15])
def test_a_projections_adapter_update_is_four_ops_whatever_the_adapters(n):
    """A decode step is launch-bound: a fused projection's update (four parts, three targeted, rows on every
    adapter) runs four ops uncompiled (down-projection GEMM, mask, select, up-projection GEMM with the add), not
    a gather and a matmul per part, and the count does not grow with the number of adapters."""
    from cookmind.infer.multi_lora import LowRankDelta

    parts, rows, gen = _delta_case(n)
    delta = LowRankDelta(parts, rows, masked=True)
    x, y = torch.randn(7, 1, 5, generator=gen), torch.randn(7, 1, 22, generator=gen)
    with Ops() as ops:
        delta(x, y)
    assert len(ops.names) <= 4, ops.names


def test_an_unfused_projection_computes_its_output_and_every_adapters_down_projection_in_one_gemm(monkeypatch):
    """o/down (never fused) with few adapters: the weight becomes the first rows of one tensor with the stacked A
    (no memory added, values kept); a decode step is that GEMM, the mask, the select and the up-projection (four
    ops with the projection itself), and decode and prefill both equal the row-by-row loop. Where A would add more
    than FOLD_MAX_SHARE of the weight's rows (12 on 8 here), the weight stays as it was."""
    from torch import nn

    from cookmind.infer import multi_lora
    from cookmind.infer.multi_lora import MultiLoRALinear

    gen = torch.Generator().manual_seed(3)
    parts, rows, _ = _delta_case(n=3)
    a, b, scale = parts[0]  # out 8, rank 3, in 5
    base = nn.Linear(5, 8, bias=False)
    weight = base.weight.detach().clone()
    assert MultiLoRALinear(nn.Linear(5, 8, bias=False), a, b, scale, rows, masked=True, fold=True).weight_and_A is None
    monkeypatch.setattr(multi_lora, "FOLD_MAX_SHARE", 1.5)
    layer = MultiLoRALinear(base, a, b, scale, rows, masked=True, fold=True)
    assert layer.weight is base.weight and torch.equal(layer.weight, weight)
    assert layer.weight.untyped_storage().data_ptr() == layer.weight_and_A.untyped_storage().data_ptr()
    for shape in [(7, 1, 5), (7, 20, 5)]:
        x = torch.randn(shape, generator=gen)
        ref = _delta_reference([(a, b, scale)], rows, x, x @ weight.T)
        with torch.no_grad(), Ops() as ops:
            got = layer(x)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        if shape[1] == 1:
            assert len(ops.names) <= 4, ops.names


def test_auto_update_takes_the_kernels_on_cuda_up_to_their_rank_else_masks_then_gathers(monkeypatch):
    """multi_lora.resolve_update: "auto" is "kernel" on CUDA with triton for ranks up to lora_bgmv.MAX_RANK;
    otherwise "masked" up to MASKED_MAX_STACK adapters plus the base, then "gathered"; a named choice stays."""
    from cookmind.infer import multi_lora
    from cookmind.infer.multi_lora import LoRAAdapter, resolve_update
    from cookmind.kernels import lora_bgmv

    def adapters(n, rank):
        pair = (torch.zeros(rank, 8), torch.zeros(8, rank))
        return [LoRAAdapter(f"a{i}", None, 1.0, {"q": pair}) for i in range(n)]

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(lora_bgmv, "kernel_available", lambda device: True)
    assert resolve_update("auto", cuda, adapters(4, 16)) == "kernel"
    assert resolve_update("auto", cuda, adapters(40, lora_bgmv.MAX_RANK)) == "kernel"
    assert resolve_update("auto", cuda, adapters(4, lora_bgmv.MAX_RANK + 1)) == "masked"
    assert resolve_update("auto", cpu, adapters(4, 16)) == "masked"  # the interpreter only when asked for by name
    assert resolve_update("auto", cpu, adapters(multi_lora.MASKED_MAX_STACK, 16)) == "gathered"
    assert resolve_update("masked", cuda, adapters(4, 16)) == "masked"
    monkeypatch.setattr(lora_bgmv, "kernel_available", lambda device: False)  # CUDA without triton
    assert resolve_update("auto", cuda, adapters(4, 16)) == "masked"


def _fine_tuned(base, relative):
    """A copy of ``base`` with every weight moved by ``relative`` of its spread: another model of the same shape, as a
    fine-tune of base would be."""
    other = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * relative)
    return other


def test_an_adapter_served_on_another_base_of_the_same_shape_warns_naming_both(setup, tmp_path):
    # a LoRA run trained with train.init_from=runs/sft, served on runs/sft1k: right shapes, wrong outputs, no word
    from cookmind.train.checkpoint import save_checkpoint

    base, _, _ = setup
    trained = copy.deepcopy(base)
    apply_lora(trained, r=4, alpha=8.0, targets=["q_proj", "v_proj"])
    meta = {"run_id": "lora", "config": {"train": {"init_from": "runs/sft"}}}
    save_checkpoint(tmp_path / "lora" / "checkpoints", 3, trained, None, meta)
    with pytest.warns(UserWarning) as caught:
        (adapter,) = load_adapters(_fine_tuned(base, 0.05), {"chef": tmp_path / "lora"}, base_name="runs/sft1k")
    (msg,) = [str(w.message) for w in caught]
    assert msg.startswith("adapter 'chef' (") and "step_00000003) was trained on runs/sft, not on runs/sft1k" in msg
    assert "serve it on runs/sft (or a copy of it)" in msg and "\n" not in msg
    assert set(adapter.weights) == {f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")}


def test_an_adapter_served_on_a_copy_of_its_base_in_another_dtype_loads_without_a_word(setup, tmp_path):
    # the same weights after export --hf --dtype bf16 and import --hf, served in float16: not another base
    import warnings

    from cookmind.infer.loading import load_model_dir
    from cookmind.model import save_model
    from cookmind.model.hf import export_hf, import_hf

    base, tmp, _ = setup
    save_model(tmp_path / "sft", base)
    export_hf(tmp_path / "sft", tmp_path / "hf", dtype=torch.bfloat16)
    import_hf(tmp_path / "hf", tmp_path / "again")
    copies = {"hf": (tmp_path / "hf", None), "again": (tmp_path / "again", "float16"), "sft": (tmp_path / "sft", None)}
    for what, (path, dtype) in copies.items():
        model = load_model_dir(path, dtype=dtype).eval()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_adapters(model, {"chef": tmp / "chef"}, base_name=what)


def test_an_adapter_that_records_no_base_loads_on_any_base_as_before(setup, tmp_path):
    # PEFT's adapters and cookmind's older ones say nothing of their base's weights: nothing to compare
    import shutil
    import warnings

    from safetensors.torch import load_file, save_file

    base, tmp, _ = setup
    shutil.copytree(tmp / "chef", tmp_path / "old")
    f = tmp_path / "old" / "adapter_model.safetensors"
    save_file(load_file(f), f, metadata={"format": "pt"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_adapters(_fine_tuned(base, 0.05), {"old": tmp_path / "old"})


def test_an_adapter_for_another_base_says_so_not_only_which_module_is_missing(setup):
    """An adapter trained on a 2-layer base, served on a 1-layer model, said only "module model.layers.1.mlp.down_proj
    is not a linear layer of the base model": it now says the adapter was trained on another model."""
    _, tmp, _ = setup
    other = sharp_tiny_lm(num_hidden_layers=1)
    with pytest.raises(ValueError) as caught:
        load_adapters(other, {"chef": tmp / "chef"}, base_name="small-base")
    said = str(caught.value)
    assert "module model.layers.1." in said and "trained on another model, not on small-base" in said, said
