"""generate/stream with the KV cache against full recomputation, batching, stops; the slot runner."""

from __future__ import annotations

import pytest
import torch
from lm_fixtures import sharp_tiny_lm, tiny_lm

from cookmind.infer import SamplingParams, generate, generate_steps, stream
from cookmind.infer.runner import ModelRunner

pytestmark = pytest.mark.usefixtures("one_thread")


tiny_model = sharp_tiny_lm


PROMPTS = [[5, 9, 11], [3, 1, 4, 1, 5, 9, 2, 6], [42]]


@pytest.mark.parametrize("overrides", [{}, {"qk_norm": True, "num_key_value_heads": 4, "tie_word_embeddings": False}])
def test_cached_logits_equal_full_recompute(overrides):
    model = tiny_model(**overrides)
    cfg = SamplingParams(temperature=0, max_new_tokens=6)
    steps = list(generate_steps(model, PROMPTS, cfg))
    for row, prompt in enumerate(PROMPTS):
        seq = list(prompt)
        for tokens, logits in steps:
            with torch.no_grad():
                full = model(torch.tensor([seq])).logits[0, -1]
            torch.testing.assert_close(logits[row], full, atol=1e-4, rtol=1e-4)
            seq.append(int(tokens[row]))


def test_batched_equals_one_at_a_time_greedy():
    model = tiny_model()
    cfg = SamplingParams(temperature=0, max_new_tokens=8)
    batched = generate(model, PROMPTS, cfg)
    alone = [generate(model, [p], cfg)[0] for p in PROMPTS]
    assert batched == alone
    assert all(len(o) == 8 for o in batched)
    assert list(stream(model, PROMPTS[1], cfg)) == alone[1]


def test_greedy_matches_naive_argmax_loop():
    model = tiny_model()
    seq = list(PROMPTS[0])
    for _ in range(5):
        with torch.no_grad():
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    assert generate(model, [PROMPTS[0]], SamplingParams(temperature=0, max_new_tokens=5))[0] == seq[len(PROMPTS[0]) :]


def test_stop_token_ends_row_and_is_not_returned():
    model = tiny_model()
    free = generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    stop = free[3]
    out = generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=(stop,)))[0]
    assert out == free[: free.index(stop)]


class CharTok:
    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


def test_stop_string_ends_after_completing_token():
    model = tiny_model()
    free = generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    text = CharTok().decode(free)
    stop = text[4:6]
    params = SamplingParams(temperature=0, max_new_tokens=8, stop_strings=(stop,))
    out = generate(model, [PROMPTS[1]], params, CharTok())[0]
    assert out == free[: text.index(stop) + 2]


def test_serving_counts_a_stop_string_its_last_token_completes_as_stop():
    """The serving engine ended a row whose stop string the max_new_tokens-th token completed at its length: the
    row's sink cancelled it ("stop") while the engine was emitting that token, and the engine then finished it
    "length", and counted it there. A stop string ends the row, whatever token it comes on: it counts as "stop"."""
    from cookmind.infer.engine_generate import held_engine

    model = tiny_model()
    free = generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8))[0]
    text = CharTok().decode(free)
    # the shortest tail of the text not found earlier in it: the 8th token completes it
    stop = next(text[k:] for k in range(len(text) - 1, -1, -1) if text.find(text[k:]) == k)
    params = SamplingParams(temperature=0, max_new_tokens=8, stop_strings=(stop,))
    assert generate(model, [PROMPTS[1]], params, CharTok(), engine="serving")[0] == free
    counts = {k: v for k, v in held_engine().metrics().items() if k.startswith("requests_finished_")}
    assert counts == {"requests_finished_stop": 1}


def test_seeded_sampling_reproducible():
    model = tiny_model()
    cfg = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=123)
    assert generate(model, PROMPTS, cfg) == generate(model, PROMPTS, cfg)


def test_seeded_repeated_prompts_sample_differently():
    """A group of identical prompts (as GRPO sends) must not share one sample stream."""
    model = tiny_model()
    cfg = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    rows = generate(model, [PROMPTS[0]] * 4, cfg)
    assert len({tuple(r) for r in rows}) > 1
    assert rows == generate(model, [PROMPTS[0]] * 4, cfg)


def test_prompt_filling_context_is_an_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="context"):
        generate(model, [[1] * 64], SamplingParams(temperature=0, max_new_tokens=4))
    for engine in ("builtin", "serving"):  # of several, the one too long is named
        with pytest.raises(ValueError, match=r"prompts\[1\] has 64 tokens and fills the model's context of 64"):
            generate(model, [[1], [1] * 64], SamplingParams(temperature=0, max_new_tokens=4), engine=engine)


@pytest.mark.parametrize("overrides", [{}, {"qk_norm": True, "num_key_value_heads": 1}])
def test_slot_runner_matches_model_forward(overrides):
    """Two requests in slots 2 and 0 of different lengths, prefilled then decoded together."""
    model = tiny_model(**overrides)
    runner = ModelRunner(model, num_slots=3, max_seq_len=32)
    seqs = {0: [7, 8, 9, 10, 11], 2: [1, 2]}
    for slot, seq in seqs.items():
        pos = torch.arange(len(seq))[None]
        logits = runner.forward(torch.tensor([seq]), pos, slot, attn_len=len(seq))
        with torch.no_grad():
            ref = model(torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(logits[0], ref, atol=1e-4, rtol=1e-4)
    for step in range(3):
        # decode slots 0..2 together; slot 1 is empty (a dummy row at position 0)
        toks = torch.tensor([[3 + step], [0], [20 + step]])
        pos = torch.tensor([[len(seqs[0])], [0], [len(seqs[2])]])
        logits = runner.forward(toks, pos, 0, attn_len=32)
        seqs[0].append(3 + step)
        seqs[2].append(20 + step)
        for slot in (0, 2):
            with torch.no_grad():
                ref = model(torch.tensor([seqs[slot]])).logits[0, -1]
            torch.testing.assert_close(logits[slot], ref, atol=1e-4, rtol=1e-4)


def test_tiny_model_trained_on_repeated_text_reproduces_it_through_generate():
    text = "the cook stirs the soup and bakes the bread. "
    data = torch.tensor(list((text * 6).encode()))
    torch.manual_seed(0)
    # byte tokens, a wider model and a 64-token window: it learns the sentence in 250 steps
    model = tiny_lm(vocab_size=256, hidden_size=48, intermediate_size=96, max_position_embeddings=128)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    window = 64
    for _ in range(250):
        starts = torch.randint(0, len(data) - window, (8,))
        batch = torch.stack([data[s : s + window] for s in starts])
        loss = model(batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    prompt = list(text[:8].encode())
    # stay inside the trained window: positions past it were never seen
    out = generate(model, [prompt], SamplingParams(temperature=0, max_new_tokens=window - len(prompt)))[0]
    assert len(out) > len(text)
    assert bytes(prompt + out).decode() == (text * 3)[: len(prompt) + len(out)]


def _naive_greedy(model, prompt, n, banned_first=(), min_new=0):
    """Argmax over full recomputation; tokens in banned_first are excluded for the first min_new steps."""
    seq = list(prompt)
    for step in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0, -1].clone()
        if step < min_new:
            logits[list(banned_first)] = float("-inf")
        seq.append(int(logits.argmax()))
    return seq[len(prompt) :]


@pytest.mark.parametrize("engine", ["builtin", "serving"])
def test_min_new_tokens_bans_stop_tokens_until_then(engine):
    model = tiny_model()
    free = generate(model, [PROMPTS[1]], SamplingParams(temperature=0, max_new_tokens=8), engine=engine)[0]
    stop = free[0]  # the greedy first token: without the ban the response ends at once
    params = SamplingParams(temperature=0, max_new_tokens=8, min_new_tokens=3, stop_token_ids=(stop,))
    out = generate(model, [PROMPTS[1]], params, keep_stop_token=True, engine=engine)[0]
    want = _naive_greedy(model, PROMPTS[1], 8, (stop,), 3)
    if stop in want[3:]:
        want = want[: want.index(stop, 3) + 1]
    assert out == want
    assert stop not in out[:3]


def test_row_i_is_seeded_seed_plus_i_in_both_engines():
    """Row i of a call draws what the same prompt alone draws with seed + i (GRPO's reproducible groups)."""
    model = tiny_model()
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=40)
    rows = generate(model, PROMPTS, params, engine="builtin")
    alone = [generate(model, [p], params.replace(seed=40 + i), engine="builtin")[0] for i, p in enumerate(PROMPTS)]
    assert rows == alone
    assert generate(model, PROMPTS, params, engine="serving") == rows  # same sampler, same per-row generators


@pytest.mark.parametrize("path", ["builtin", "serving", "kernel"])
def test_lora_model_generates_like_naive_loop(path):
    """LoRA-wrapped projections (every target, the LM head included) run through the plain loop and through the
    engine's runner (gather and paged-kernel decode), which calls the model's own modules."""
    from cookmind.infer.engine import Engine
    from cookmind.model.lora import apply_lora

    model = tiny_model(tie_word_embeddings=False)
    apply_lora(
        model,
        r=4,
        alpha=8.0,
        targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"),
    )
    with torch.no_grad():  # nonzero adapters, so the LoRA path changes the outputs
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    want = _naive_greedy(model, PROMPTS[0], 6)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    if path == "kernel":
        engine = Engine(model, num_slots=2, max_seq_len=32, block_size=4, decode_attention="kernel")
        req = engine.submit(PROMPTS[0], params)
        engine.run_until_idle()
        assert req.output_ids == want
    else:
        assert generate(model, [PROMPTS[0]], params, engine=path)[0] == want


def test_token_stops_end_on_stop_token_or_completing_token():
    from cookmind.infer.stop import TokenStops

    stops = TokenStops((7,), ("CD",), CharTok())  # CharTok: id i -> chr(65 + i % 26)
    assert [stops.feed(t) for t in (0, 1, 2)] == [False, False, False]  # "ABC"
    assert stops.feed(3) is True and stops.ids == [0, 1, 2, 3]  # "ABCD" completes "CD" with its last token
    other = TokenStops((7,), (), None)
    assert [other.feed(t) for t in (1, 7)] == [False, True]
    with pytest.raises(ValueError, match="tokenizer"):
        TokenStops((), ("x",), None)


@pytest.mark.parametrize(
    "bad",
    [
        {"stop_strings": "abc"},
        {"stop_strings": ("",)},
        {"min_new_tokens": 9, "max_new_tokens": 8},
        {"stop_token_ids": ("a",)},
        {"max_new_tokens": 1.5},
        # a seen token's logit divided by 1e-300 overflowed, and every sample was token 0 (the server refused it
        # already; `generate --repetition-penalty` and the Python API did not)
        {"repetition_penalty": 1e-300},
        {"repetition_penalty": 1e300},
        # a seed was folded modulo 2**64: 5 and 5 + 2**64 drew the same sample
        {"seed": 2**64 + 5},
        {"seed": -(2**63) - 1},
    ],
)
def test_sampling_params_refuse_bad_fields_naming_them(bad):
    with pytest.raises(ValueError, match=next(iter(bad)) if "stop_strings" not in bad else "stop strings"):
        SamplingParams(**bad)


@pytest.mark.parametrize("engine", ["builtin", "serving"])
def test_a_long_prompt_in_the_batch_does_not_shorten_the_other_rows(engine):
    """Each row gets its own room in the context (64): a 60-token prompt leaves 4 new tokens for itself, not 4 for
    every row of its batch; eval gsm8k's answers and GRPO's rollouts were cut short, and not counted as cut."""
    model = tiny_model()
    prompts = [PROMPTS[0], [7] * 60, PROMPTS[1]]
    out = generate(model, prompts, SamplingParams(temperature=0, max_new_tokens=8), engine=engine)
    assert [len(o) for o in out] == [8, 4, 8]
    assert out == [_naive_greedy(model, p, n) for p, n in zip(prompts, (8, 4, 8))]


def test_generate_steps_ends_every_row_where_the_longest_prompts_context_ends_unless_asked_per_row():
    """generate_steps is public: its callers read every row of every step. A batch with a long prompt ran on to the
    shortest prompt's room, so the long row's tokens past its own room lay beyond the model's context. By default
    every row ends at the longest prompt's room (64 - 60 = 4 steps); per_row=True runs to the most room (8)."""
    model = tiny_model()
    prompts = [PROMPTS[0], [7] * 60]
    params = SamplingParams(temperature=0, max_new_tokens=8)
    assert len(list(generate_steps(model, prompts, params))) == 4
    assert len(list(generate_steps(model, prompts, params, per_row=True))) == 8
