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

import pytest
import torch
from lm_fixtures import sharp_tiny_lm

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
def test_one_batch_of_two_adapters_and_the_base_equals_each_merged_model(setup, kw):
    base, tmp, refs = setup
    adapters = load_adapters(base, {"chef": tmp / "chef", "baker": tmp / "baker"})
    engine = Engine(copy.deepcopy(base), num_slots=4, adapters=adapters, **kw)
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
    engine = Engine(copy.deepcopy(base), num_slots=2, adapters=adapters)
    prompt = [5, 9, 14, 3, 22, 7]
    ((toks, lps, prompt_lp),) = _run(engine, [(prompt, "hf-lora")])
    ref_toks, ref_lps, ref_prompt_lp = _reference(lambda ids: merged(input_ids=ids), prompt, NEW)
    assert toks == ref_toks
    assert max(abs(a - b) for a, b in zip(lps + prompt_lp, ref_lps + ref_prompt_lp)) < TOL
    assert toks != _reference(base, prompt, NEW)[0]
