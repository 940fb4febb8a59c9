"""Control tokens (<|im_start|>, <|endoftext|>, ...) a model generates are never shown as text: a chat reply ends at
the first one (the chat CLI, the server's chat completions, the web page's stream), plain completions leave them out
unless the request says skip_special_tokens: false (a chat request refuses false: its reply holds none), a streamed
answer joins into the whole one byte for byte, and eval answers and GRPO rollouts stop at the first one.

A scripted tiny model makes the model emit them: its greedy next token depends on the current token alone, along
chains written here. Expected texts are written by hand.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from lm_fixtures import tiny_lm
from test_server import API_KEY, MODEL, LiveServer, make_tokenizer

from cookmind.align.prompts import decode_response
from cookmind.cli import main as cli_main
from cookmind.infer import SamplingParams, generate
from cookmind.infer.chat_session import ChatSession
from cookmind.infer.detokenize import IncrementalDetokenizer
from cookmind.infer.engine import Engine, FinishEvent, TokenEvent
from cookmind.infer.output import OutputProcessor
from cookmind.infer.server import create_app
from cookmind.infer.stop import chat_stop_ids, control_token_ids
from cookmind.model import save_model

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread

E_ACUTE = "é".encode()  # two bytes: C3 A9, byte tokens of their own (ids 0..255 are the bytes)
MESSAGES = [{"role": "user", "content": "Is the soup hot?"}]


def scripted_lm(vocab_size: int, chains: list[list[int]]):
    """A tiny CookMindLM whose greedy next token after chain[k] is chain[k + 1]. Attention and MLP add nothing (their
    output projections are zero), so the last hidden state is the current token's normed embedding; the head's row
    for the next token adds that embedding, scaled. A token is the current one of at most one step."""
    torch.manual_seed(0)
    model = tiny_lm(vocab_size=vocab_size, max_position_embeddings=256, tie_word_embeddings=False).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        emb = model.model.embed_tokens.weight
        model.lm_head.weight.zero_()
        steps = [(cur, nxt) for chain in chains for cur, nxt in zip(chain, chain[1:])]
        assert len({cur for cur, _ in steps}) == len(steps), "a token may lead to one next token only"
        for cur, nxt in steps:
            model.lm_head.weight[nxt] += emb[cur] / emb[cur].norm() * 20
    return model


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """The tokenizer, the model and its chains: a chat reply "Yes." then <|im_start|> (a turn the model makes up);
    a completion of "#": "Na", half of "é", <|im_start|>, the other half, "!", end of text."""
    tok = make_tokenizer(tmp_path_factory)
    last = tok.render(MESSAGES, add_generation_prompt=True)[0][-1]  # the chat prompt's last token ("\n")
    chat = [last, *b"Yes.", tok.im_start_id, E_ACUTE[1], ord("!"), tok.eos_id]
    plain = [ord("#"), *b"Na", E_ACUTE[0], tok.im_start_id]  # then chat's tail: the other byte of "é", "!", eos
    model = scripted_lm(tok.vocab_size, [chat, plain])
    # the script holds: greedy decoding follows it
    greedy = SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=[tok.eos_id])
    out = generate(model, [[ord("#")], [last]], greedy)
    assert out == [[*b"Na", E_ACUTE[0], tok.im_start_id, E_ACUTE[1], ord("!")], chat[1:-1]]
    return tok, model


@pytest.fixture(scope="module")
def server(scripted):
    tok, model = scripted
    engine = Engine(model, num_slots=4, max_seq_len=256, max_waiting=16)
    live = LiveServer(create_app(engine, tok, MODEL, api_key=API_KEY))
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    yield live, client
    live.close()


# --- the one rule: which tokens are control tokens ------------------------------------------------------------------


def test_control_tokens_are_the_specials_but_the_reply_syntax(scripted):
    tok, _ = scripted
    by_hand = {tok.special_tokens[s] for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert control_token_ids(tok) == by_hand  # <think> and </think> are the reply's own syntax
    assert set(chat_stop_ids(tok)) == by_hand


def test_reasoning_markers_still_split_a_chat_reply(scripted):
    """<think>/</think> are special tokens of this tokenizer, and the reasoning splitter reads them as text."""
    tok, _ = scripted
    ids = [tok.special_tokens["<think>"], *tok.encode("hm"), tok.special_tokens["</think>"], *tok.encode("Yes")]
    proc = OutputProcessor(tok, skip_ids=control_token_ids(tok))
    for t in ids:
        proc.feed(TokenEvent(t))
    proc.feed(FinishEvent("stop"))
    assert (proc.reasoning_content, proc.content) == ("hm", "Yes")


def test_incremental_detokenizer_leaves_control_tokens_out_even_inside_a_character(scripted):
    tok, _ = scripted
    ids = [*b"Na", E_ACUTE[0], tok.im_start_id, E_ACUTE[1], tok.eos_id, ord("!")]
    for skip, want in ((control_token_ids(tok), "Naé!"), ((), "Na\ufffd<|im_start|>\ufffd<|endoftext|>!")):
        detok = IncrementalDetokenizer(tok, skip_ids=skip)
        assert "".join(detok.add(t) for t in ids) + detok.flush() == want


# --- chat: the reply ends at the first control token ----------------------------------------------------------------


def test_server_chat_reply_ends_at_a_control_token(server):
    _, client = server
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == "Yes." and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 4  # the control token that ended the reply is not part of it
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Yes."
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]


def test_chat_session_reply_ends_at_a_control_token(scripted):
    tok, model = scripted
    session = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=20))
    assert "".join(piece for _, piece in session.send(MESSAGES[0]["content"])) == "Yes."
    assert session.history[-1] == {"role": "assistant", "content": "Yes."}


def test_cookmind_generate_chat_reply_ends_at_a_control_token(scripted, tmp_path, capsys):
    tok, model = scripted
    save_model(tmp_path / "m", model)
    tok.save(tmp_path / "m")
    args = ["generate", "--checkpoint", str(tmp_path / "m"), "--max-new-tokens", "20", "--chat"]
    assert cli_main(args + ["--prompt", MESSAGES[0]["content"]]) == 0
    assert capsys.readouterr().out == "Yes.\n"


# --- plain completion: control tokens left out of the text, unless asked for ----------------------------------------


def test_cookmind_generate_leaves_control_tokens_out_unless_kept(scripted, tmp_path, capsys):
    tok, model = scripted
    save_model(tmp_path / "m", model)
    tok.save(tmp_path / "m")
    args = ["generate", "--checkpoint", str(tmp_path / "m"), "--max-new-tokens", "8", "--prompt", "#"]
    assert cli_main(args) == 0
    assert capsys.readouterr().out == "Naé!\n"
    assert cli_main(args + ["--keep-special-tokens"]) == 0
    assert capsys.readouterr().out == "Na\ufffd<|im_start|>\ufffd!\n"
    assert cli_main(args + ["--prompt", "#"]) == 0  # a batch of two: generated together, printed whole
    assert capsys.readouterr().out == "=== #\nNaé!\n=== #\nNaé!\n"


@pytest.mark.parametrize(
    ("skip", "want"), [(None, "Naé!"), (True, "Naé!"), (False, "Na\ufffd<|im_start|>\ufffd!")], ids=str
)
def test_server_completion_text_streamed_and_whole(scripted, server, skip, want):
    tok, _ = scripted
    _, client = server
    extra = {} if skip is None else {"skip_special_tokens": skip}
    kw = dict(model=MODEL, prompt=[ord("#")], max_tokens=10, temperature=0, logprobs=0, extra_body=extra)
    r = client.completions.create(**kw)
    choice = r.choices[0]
    assert choice.text == want and choice.finish_reason == "stop"
    # the control token still counts, and has its logprobs entry; its text takes no room when left out
    assert r.usage.completion_tokens == 6
    assert choice.logprobs.tokens[3] == "<|im_start|>"
    # an offset is where the text a token brings begins: é's first byte brings none (the character is unfinished),
    # and "!" stands at 3 of "Naé!" (each token's own decoded text put it at 4); kept, the control token brings the
    # first byte's U+FFFD with its own text, and "!" stands at 16 of "Na\ufffd<|im_start|>\ufffd!"
    assert choice.logprobs.text_offset == ([0, 1, 2, 2, 2, 3] if skip is not False else [0, 1, 2, 2, 15, 16])
    assert choice.text[choice.logprobs.text_offset[-1]] == "!"
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert [t for c in chunks for t in (c.choices[0].logprobs.tokens if c.choices[0].logprobs else [])] == (
        choice.logprobs.tokens
    )
    # the echo of a token-id prompt follows the same rule
    kw.update(prompt=[tok.im_start_id, ord("#")], max_tokens=2, echo=True, logprobs=None)
    echo = client.completions.create(**kw)
    assert echo.choices[0].text == ("#Na" if skip is not False else "<|im_start|>#Na")


def test_stop_string_spelling_a_control_token_stops_there(server):
    _, client = server
    r = client.completions.create(model=MODEL, prompt=[ord("#")], max_tokens=10, temperature=0, stop="<|im_start|>")
    assert r.choices[0].text == "Na\ufffd" and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("bad", ["false", 0, None])
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_skip_special_tokens_must_be_a_boolean(server, endpoint, bad):
    live, _ = server
    body = {"model": MODEL, "max_tokens": 2, "skip_special_tokens": bad}
    body.update({"prompt": "#"} if endpoint == "completions" else {"messages": MESSAGES})
    r = httpx.post(f"{live.url}/v1/{endpoint}", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "skip_special_tokens" and error["type"] == "invalid_request_error"


def test_chat_takes_skip_special_tokens_true_and_refuses_false(server):
    """A chat reply ends at its first control token and holds none, so false has nothing to show: refused with a 400
    saying so (vLLM clients send the field on chat requests too), never accepted and ignored. True is what it does."""
    _, client = server
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0)
    r = client.chat.completions.create(**kw, extra_body={"skip_special_tokens": True})
    assert r.choices[0].message.content == "Yes." and r.choices[0].finish_reason == "stop"
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**kw, stream=stream, extra_body={"skip_special_tokens": False})
        error = e.value.body
        assert error["param"] == "skip_special_tokens" and error["type"] == "invalid_request_error"
        assert "ends at the first control token" in error["message"] and "/v1/completions" in error["message"]


# --- evals and GRPO grade the answer before any control token -------------------------------------------------------


def test_graded_response_text_ends_before_a_control_token(scripted):
    tok, _ = scripted
    think, end_think = tok.special_tokens["<think>"], tok.special_tokens["</think>"]
    ids = [think, *tok.encode("add"), end_think, *tok.encode(" 7"), tok.im_start_id, *tok.encode("user 9")]
    assert decode_response(tok, ids) == "<think>add</think> 7"
    assert decode_response(tok, [*tok.encode("#### 7"), tok.eos_id]) == "#### 7"


def test_trainer_samples_follow_the_same_rule(scripted):
    """The Trainer's eval samples: a chat (sft) reply ends at the control token, a pretraining completion leaves it
    out. Called on a stand-in holding what the method reads, not a whole Trainer."""
    from types import SimpleNamespace

    from cookmind.train.trainer import Trainer

    tok, model = scripted
    for objective, prompt, want in (("sft", MESSAGES[0]["content"], "Yes."), ("pretrain", "#", "Naé!")):
        cfg = SimpleNamespace(
            eval=SimpleNamespace(prompts=[prompt], max_new_tokens=10), train=SimpleNamespace(objective=objective)
        )
        trainer = SimpleNamespace(cfg=cfg, tokenizer=tok, bare_model=model)
        assert Trainer.generate_samples(trainer) == [{"prompt": prompt, "completion": want}]


# --- evals and GRPO stop generating at the first control token ------------------------------------------------------

SUM = {"question": "2+5", "answer": "#### 7"}
SUM_TEMPLATE = "{question}="  # a plain template: graded by the last number


@pytest.fixture(scope="module")
def rambler(scripted):
    """A model answering SUM's prompt "7", then <|im_start|> (a control token that is not end-of-text), then "xy"
    over and over: an answer that goes on after the control token until the token budget runs out."""
    from cookmind.align.prompts import encode_prompt

    tok, _ = scripted
    prompt = encode_prompt(tok, SUM["question"], SUM_TEMPLATE)
    chain = [prompt[-1], ord("7"), tok.im_start_id, *b"xyx"]
    model = scripted_lm(tok.vocab_size, [chain])
    greedy = SamplingParams(temperature=0, max_new_tokens=6, stop_token_ids=[tok.eos_id])
    assert generate(model, [prompt], greedy) == [[ord("7"), tok.im_start_id, *b"xyxy"]]  # the script holds
    return tok, model, prompt


def test_gsm8k_answer_ends_at_a_control_token(rambler, tmp_path):
    """The answer stops at <|im_start|>: it is not cut short by --max-new-tokens (it went on to the budget)."""
    from cookmind.evals import evaluate_gsm8k

    tok, model, _ = rambler
    out = tmp_path / "gsm8k.jsonl"
    metrics = evaluate_gsm8k(model, tok, [SUM], out, template=SUM_TEMPLATE, max_new_tokens=8, progress=False)
    assert (metrics["accuracy"], metrics["num_cut_short"]) == (1.0, 0)
    record = json.loads(out.read_text())
    assert (record["outputs"], record["cut_short"]) == (["7"], [False])


def test_grpo_rollout_ends_at_a_control_token(rambler):
    """A rollout ends at <|im_start|>, kept as its last token (the policy gradient trains on the stop token); what
    the model would write after it is not sampled, scored nor trained on."""
    from cookmind.align.objective import GRPOConfig, sampling_params
    from cookmind.align.rewards import reward_fn_for_template
    from cookmind.align.rollout import collect_rollouts

    tok, model, prompt = rambler
    cfg = GRPOConfig(template=SUM_TEMPLATE, max_new_tokens=8)
    params, reward_fn = sampling_params(cfg, tok, seed=0), reward_fn_for_template(cfg.template)
    batch = collect_rollouts(model, tok, [prompt], [SUM["answer"]], 2, params, reward_fn)
    assert batch["response_ids"] == [[ord("7"), tok.im_start_id]] * 2
    assert batch["responses"] == ["7", "7"] and batch["metadata"]["response_length"] == 2


def test_grpo_rollouts_and_held_out_answers_cut_by_max_new_tokens_are_counted(rambler):
    """A GRPO rollout that ran into grpo.max_new_tokens before it ended (GSM8K's worked answers past the default 64)
    was graded as it stood and trained on, and nothing said how many: the run's reward read as a model that answers
    wrong. Rollouts and held-out answers now report the share cut short (``cut_short``), as eval gsm8k counts them."""
    from cookmind.align.objective import (
        GRPOConfig,
        GRPOObjective,
        evaluate_accuracy,
        no_signal_message,
        sampling_params,
    )
    from cookmind.align.rewards import reward_fn_for_template
    from cookmind.align.rollout import collect_rollouts

    tok, model, prompt = rambler
    for budget, cut in ((8, 0.0), (1, 1.0)):  # "7" then <|im_start|> ends it; 1 token leaves only "7"
        cfg = GRPOConfig(template=SUM_TEMPLATE, max_new_tokens=budget)
        params, reward_fn = sampling_params(cfg, tok, seed=0), reward_fn_for_template(cfg.template)
        batch = collect_rollouts(model, tok, [prompt], [SUM["answer"]], 2, params, reward_fn)
        assert batch["metadata"]["cut_short"] == cut, budget
        assert evaluate_accuracy(model, tok, [SUM], cfg)["cut_short"] == cut, budget
        # the objective's metrics (the run's train_cut_short) carry the rollouts' share
        obj = GRPOObjective(cfg, tokenizer=tok)
        _, metrics = obj(model, {**batch, "rollout_metrics": batch["metadata"]})
        assert metrics["cut_short"] == cut
    # and the warning of a run whose rollouts earn nothing says how many ran out of room
    said = no_signal_message(cfg, {"reward_max": 0.0, "cut_short": 1.0}, 10, custom_reward=False)
    assert (
        "grpo.max_new_tokens=1 leaves room for one (100% of the last batch's rollouts ran into it unfinished)" in said
    )


def test_transformers_tokenizer_chat_markers_are_control_tokens_even_when_not_marked_special(tmp_path):
    """A transformers tokenizer whose ChatML markers were added as plain tokens: they still end a response and are
    left out of its text, as ``HFTokenizerAdapter`` has them (evals and GRPO use such a tokenizer as it is)."""
    from test_align_fixtures import tiny_hf_tokenizer

    hf = tiny_hf_tokenizer(tmp_path)  # 256 byte tokens, then <eos> (256)
    hf.add_tokens(["<|im_start|>", "<|im_end|>"])  # 257, 258: not special
    assert (hf.eos_token_id, hf.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])) == (256, [257, 258])
    assert chat_stop_ids(hf) == (256, 257, 258)
    assert decode_response(hf, [*hf.encode("7"), 257, *hf.encode("user")]) == "7"


def test_a_stray_closing_think_tag_is_not_text_anywhere(tmp_path_factory, tmp_path, capsys):
    # a reply "</think>ide" (no <think> opened) showed "</think>" as text. Before any answer text it closes a think
    # block the model never opened: the server (whole and streamed), `cookmind chat` and `generate --chat` all show
    # "ide", by one rule (cookmind.infer.reasoning)
    tok = make_tokenizer(tmp_path_factory)
    last = tok.render(MESSAGES, add_generation_prompt=True)[0][-1]
    model = scripted_lm(tok.vocab_size, [[last, tok.special_tokens["</think>"], *b"ide", tok.im_end_id]])
    live = LiveServer(create_app(Engine(model, num_slots=2, max_seq_len=256), tok, MODEL, api_key=API_KEY))
    try:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
        kw = dict(model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0)
        r = client.chat.completions.create(**kw).choices[0]
        chunks = list(client.chat.completions.create(**kw, stream=True))
    finally:
        live.close()
    assert (r.message.content, r.finish_reason) == ("ide", "stop")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ide"
    session = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=20))
    pieces = list(session.send(MESSAGES[0]["content"]))
    assert "".join(p for _, p in pieces) == "ide" and {k for k, _ in pieces} == {"content"}
    save_model(tmp_path / "m", model)
    tok.save(tmp_path / "m")
    args = ["generate", "--checkpoint", str(tmp_path / "m"), "--max-new-tokens", "20", "--chat"]
    assert cli_main(args + ["--prompt", MESSAGES[0]["content"]]) == 0
    assert capsys.readouterr().out == "ide\n"
    assert cli_main(args + ["--prompt", MESSAGES[0]["content"]] * 2) == 0  # a batch
    assert capsys.readouterr().out == f"=== {MESSAGES[0]['content']}\nide\n" * 2
