"""A Hugging Face chat template's assistant mask: what cookmind's own template marks (the assistant's content and its
end-of-turn token, not the role header nor the newline after), for a template with no ``{% generation %}`` block.
The references are independent: the assistant spans found by hand in transformers' rendered text, mapped to tokens by
the tokenizer's ``offset_mapping``; for a ``{% generation %}`` template, transformers' own assistant mask."""

from __future__ import annotations

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from tokenizer_fixtures import sentencepiece_style_tokenizer  # noqa: E402

from cookmind.store import TokenStore  # noqa: E402
from cookmind.store.packer import pack  # noqa: E402
from cookmind.tokenizer.errors import TokenizerError  # noqa: E402
from cookmind.tokenizer.hf_adapter import HFTokenizerAdapter, load_tokenizer  # noqa: E402

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_GENERATION = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA2 = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}{{ '[INST] ' + m.content + ' [/INST]' }}"
    "{% elif m.role == 'assistant' %}{{ ' ' + m.content + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# renders only the last assistant answer: a conversation's render is not the start of a longer one's
LAST_ONLY = (
    "{% for m in messages %}{% if m.role == 'user' or loop.last %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# no {% if add_generation_prompt %}: the assistant's header comes only with its answer
CHATML_NO_PROMPT = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
)
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is two and two?"},
    {"role": "assistant", "content": "Four, Tom."},
    {"role": "user", "content": "And three and three?"},
    {"role": "assistant", "content": " six, said the man."},
]


def sp_folder(path, template, chatml: bool = True):
    """A SentencePiece-style tokenizer (Llama 2's kind: transformers reads it, cookmind's codec cannot) with the chat
    ``template``; ``chatml``: with <|im_start|> and <|im_end|> as special tokens."""
    folder = sentencepiece_style_tokenizer(path)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    if chatml:
        hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    hf.chat_template = template
    hf.save_pretrained(folder)
    assert isinstance(load_tokenizer(folder), HFTokenizerAdapter)  # the adapter's render, not cookmind's ChatML
    return folder


def hand_mask(folder, messages, turn_end: str, lead: str = "") -> list[int]:
    """Tokens overlapping each assistant message's content through its end-of-turn text ``turn_end``, found by hand
    in transformers' rendered text, mapped by the tokenizer's offsets; ``lead``: the template's text before the
    content that its generation prompt does not hold (Llama 2's " " after [/INST]), which the model writes."""
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = hf.apply_chat_template(messages, tokenize=False)
    spans, pos = [], 0
    for m in messages:
        if m["role"] == "assistant":
            start = text.index(lead + m["content"], pos)
            end = text.index(turn_end, start + len(lead + m["content"])) + len(turn_end)
            spans.append((start, end))
            pos = end
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == hf.apply_chat_template(messages, return_dict=False)
    return [int(any(a < e and b > s for s, e in spans)) for a, b in enc["offset_mapping"]]


@pytest.mark.parametrize("messages", [CHAT, CHAT[1:3], CHAT[:3]])
def test_chatml_template_marks_assistant_content_and_im_end_as_found_by_hand(tmp_path, messages):
    folder = sp_folder(tmp_path / "t", CHATML)
    ids, mask = load_tokenizer(folder).render(messages)
    assert mask == hand_mask(folder, messages, "<|im_end|>")
    assert sum(mask) > 0


@pytest.mark.parametrize("messages", [CHAT[1:], CHAT[1:3]])
def test_llama2_sentencepiece_template_marks_answer_and_eos_as_found_by_hand(tmp_path, messages):
    folder = sp_folder(tmp_path / "t", LLAMA2)
    ids, mask = load_tokenizer(folder).render(messages)
    assert mask == hand_mask(folder, messages, "</s>", " ")
    assert sum(mask) > 0


def test_generation_template_mask_is_transformers_own(tmp_path):
    folder = sp_folder(tmp_path / "t", CHATML_GENERATION)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    want = hf.apply_chat_template(CHAT, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = load_tokenizer(folder).render(CHAT)
    assert ids == want["input_ids"]
    assert mask == want["assistant_masks"]
    assert sum(mask) > 0


def test_a_template_whose_renders_are_not_prefix_stable_is_refused_naming_it(tmp_path):
    tok = load_tokenizer(sp_folder(tmp_path / "t", LAST_ONLY))
    with pytest.raises(TokenizerError, match="chat template.*not the start of"):
        tok.render(CHAT)


def test_a_template_without_a_generation_prompt_is_refused_not_trained_on_its_header(tmp_path):
    """A template that ignores add_generation_prompt renders the assistant's header (<|im_start|>assistant) only
    with the answer, so the prefix diff put the header inside the trained mask without a word. Such a template is
    refused saying what to add; one whose answer follows the prompt with no header (Llama 2's) is not, nor a prompt
    for a reply (its mask is not trained on)."""
    folder = sp_folder(tmp_path / "t", CHATML_NO_PROMPT)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert hf.apply_chat_template(CHAT[:2], tokenize=False) == hf.apply_chat_template(
        CHAT[:2], add_generation_prompt=True, tokenize=False
    )
    tok = load_tokenizer(folder)
    with pytest.raises(TokenizerError, match="ignores add_generation_prompt") as e:
        tok.render(CHAT[1:3])
    assert "\n" not in str(e.value) and "{% if add_generation_prompt %}" in str(e.value)
    ids, _ = tok.render(CHAT, add_generation_prompt=True)
    assert ids == hf.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    _, mask = load_tokenizer(sp_folder(tmp_path / "l", LLAMA2)).render(CHAT[1:3])  # no header to keep out
    assert mask == hand_mask(tmp_path / "l", CHAT[1:3], "</s>", " ")


def test_the_mask_renders_each_prefix_once_and_only_those_ending_at_an_assistant_turn(tmp_path):
    """Each assistant turn's mask comes from renders of the conversation up to it; the last turn's render (the whole
    conversation) was made twice more, as text and as ids, beside the render of the whole: a one-turn SFT record
    took six renders where four tell the same. The mask is as found by hand, with no render repeated."""
    folder = sp_folder(tmp_path / "t", CHATML)
    tok = load_tokenizer(folder)
    tok.render(CHAT)  # a template's first render may probe it
    real, seen = tok.hf.apply_chat_template, []

    def counting(messages, *a, **kw):
        seen.append((len(messages), bool(kw.get("add_generation_prompt")), kw.get("tokenize", True)))
        return real(messages, *a, **kw)

    tok.hf.apply_chat_template = counting
    for messages in (CHAT, CHAT[1:3], CHAT[:4]):
        seen.clear()
        _, mask = tok.render(messages)
        assert mask == hand_mask(folder, messages, "<|im_end|>")
        assert len(seen) == len(set(seen)), seen
        ends = {i for i, m in enumerate(messages) if m["role"] == "assistant"}
        assert {n for n, _, _ in seen} <= {len(messages)} | ends | {i + 1 for i in ends}, seen


def gsm8k_rows(shared_data, n=4):
    return [json.loads(line) for line in (shared_data / "gsm8k" / "test.jsonl").read_text().splitlines()[:n]]


@pytest.mark.parametrize("make_folder", ["chatml", "llama2"])
def test_sft_and_dpo_pack_gsm8k_with_a_hugging_face_template_and_its_masks(tmp_path, shared_data, make_folder):
    from cookmind.cli import main as cookmind_main

    folder = sp_folder(tmp_path / "t", CHATML if make_folder == "chatml" else LLAMA2)
    turn_end, lead = ("<|im_end|>", "") if make_folder == "chatml" else ("</s>", " ")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    rows = gsm8k_rows(shared_data)
    (tmp_path / "dpo.jsonl").write_text(
        "".join(
            json.dumps({"prompt": r["question"], "chosen": r["answer"], "rejected": "No idea. #### 0"}) + "\n"
            for r in rows
        )
    )
    base = ["pack", "--tokenizer", str(folder), "--quiet"]
    sft_in = shared_data / "gsm8k" / "test.jsonl"
    assert cookmind_main([*base, "--train-type", "sft", "--input", str(sft_in), "--out", str(tmp_path / "s")]) == 0
    assert (
        cookmind_main(
            [*base, "--train-type", "dpo", "--input", str(tmp_path / "dpo.jsonl"), "--out", str(tmp_path / "d")]
        )
        == 0
    )
    sft, dpo = TokenStore(tmp_path / "s"), TokenStore(tmp_path / "d")
    for k, r in enumerate(rows):
        chat = [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]
        assert sft.record("sequence", k).tolist() == hf.apply_chat_template(chat, return_dict=False)
        assert sft.record("loss_mask", k).tolist() == hand_mask(folder, chat, turn_end, lead)
        for side, answer in (("chosen", r["answer"]), ("rejected", "No idea. #### 0")):
            chat[1]["content"] = answer
            assert dpo.record(side, k).tolist() == hf.apply_chat_template(chat, return_dict=False)
            assert dpo.record(f"{side}_mask", k).tolist() == hand_mask(folder, chat, turn_end, lead)


def test_offline_grpo_chat_question_packs_its_response_as_the_templates_assistant_turn(tmp_path):
    folder = sp_folder(tmp_path / "t", LLAMA2)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    question = [{"role": "user", "content": "What is four and four"}]
    rows = [
        {"question": question, "response": "eight, Tom.", "reward": 1.0},
        {"question": "What is four and four", "response": "eight, Tom.", "reward": 1.0},
    ]
    (tmp_path / "o.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack([tmp_path / "o.jsonl"], tmp_path / "o", folder, "grpo", prompt_template="chat", progress=False)
    store = TokenStore(tmp_path / "o")
    chat = [*question, {"role": "assistant", "content": "eight, Tom."}]
    want = hf.apply_chat_template(chat, return_dict=False)
    mask = hand_mask(folder, chat, "</s>", " ")
    for k in range(2):
        prompt = store.record("prompts", k).tolist()
        assert prompt == hf.apply_chat_template(question, add_generation_prompt=True, return_dict=False)
        assert prompt + store.record("responses", k).tolist() == want
        assert store.record("masks", k).tolist() == mask[len(prompt) :]
        assert np.any(store.record("masks", k))


def test_cookminds_tokenizer_packs_an_offline_grpo_chat_questions_response_as_its_assistant_turn(tmp_path, tok_dir):
    """The response of a question given as messages was encoded apart and ended with EOS, not as the template's turn;
    the reference is transformers rendering the same chat with the Jinja template our tokenizer saves."""
    hf = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is four and four"}]
    (tmp_path / "o.jsonl").write_text(json.dumps({"question": question, "response": " eight.", "reward": 1.0}) + "\n")
    pack([tmp_path / "o.jsonl"], tmp_path / "o", tok_dir, "grpo", progress=False)
    store = TokenStore(tmp_path / "o")
    chat = [*question, {"role": "assistant", "content": " eight."}]
    prompt = store.record("prompts", 0).tolist()
    assert prompt + store.record("responses", 0).tolist() == hf.apply_chat_template(chat, return_dict=False)
    assert hf.decode(store.record("responses", 0)[store.record("masks", 0) == 1]) == " eight.<|im_end|>"


def test_a_llama2_tokenizer_without_chatml_tokens_packs_sft_through_its_own_template(tmp_path, shared_data):
    """pack refused sft/dpo for any tokenizer without <|im_start|>/<|im_end|> ("cookmind renders chats in ChatML
    only"), though a Hugging Face tokenizer's chats are rendered by its own template: a real Llama 2 tokenizer could
    not be packed for SFT. Without a template of its own the refusal stands."""
    from cookmind.cli import main as cookmind_main

    folder = sp_folder(tmp_path / "t", LLAMA2, chatml=False)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    sft_in = shared_data / "gsm8k" / "test.jsonl"
    argv = ["pack", "--tokenizer", str(folder), "--quiet", "--train-type", "sft", "--input", str(sft_in)]
    assert cookmind_main([*argv, "--out", str(tmp_path / "s")]) == 0
    store = TokenStore(tmp_path / "s")
    (r,) = gsm8k_rows(shared_data, 1)
    chat = [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]
    assert store.record("sequence", 0).tolist() == hf.apply_chat_template(chat, return_dict=False)
    assert store.record("loss_mask", 0).tolist() == hand_mask(folder, chat, "</s>", " ")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    assert cookmind_main([*argv, "--out", str(tmp_path / "n")]) == 2


CHATML_REASONING = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{% if m.reasoning_content %}{{ '<think>' + m.reasoning_content + '</think>' }}{% endif %}"
    "{{ m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_think_block_in_a_reply_stays_in_the_text_of_a_template_that_does_not_read_reasoning(tmp_path, capsys):
    """An assistant reply "<think>...</think>answer" was split into reasoning_content and content, and Llama 2's
    template, which reads no reasoning_content, rendered the answer alone: the reasoning left the training text
    without a word. Such a template gets the reply whole; one that reads reasoning_content gets it apart; and a
    record's own reasoning_content that the template would drop is a bad record saying what to do."""
    from cookmind.cli import main as cookmind_main

    chat = [
        {"role": "user", "content": "What is two and two?"},
        {"role": "assistant", "content": "<think>two and two make four</think>Four."},
    ]
    apart = [chat[0], {"role": "assistant", "content": "Four.", "reasoning_content": "two and two make four"}]
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"messages": chat}) + "\n")
    for name, template, want_chat in [("llama2", LLAMA2, chat), ("reads", CHATML_REASONING, apart)]:
        folder = sp_folder(tmp_path / name, template, chatml=name != "llama2")
        hf = transformers.AutoTokenizer.from_pretrained(str(folder))
        argv = ["pack", "--tokenizer", str(folder), "--quiet", "--train-type", "sft", "--input", str(src)]
        assert cookmind_main([*argv, "--out", str(tmp_path / f"s-{name}")]) == 0
        want = hf.apply_chat_template(want_chat, return_dict=False)
        assert TokenStore(tmp_path / f"s-{name}").record("sequence", 0).tolist() == want, name
        assert "two and two make four" in hf.decode(want), name
    src.write_text(json.dumps({"messages": apart}) + "\n")
    argv = ["pack", "--tokenizer", str(tmp_path / "llama2"), "--quiet", "--train-type", "sft", "--input", str(src)]
    capsys.readouterr()
    assert cookmind_main([*argv, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "reasoning_content" in err and "does not render" in err and err.count("\n") == 1, err


def test_a_part_of_a_chat_the_template_leaves_out_is_a_bad_record_not_dropped(tmp_path, capsys):
    """A Hugging Face template that renders only user and assistant turns (the test's Llama 2 one) packed a chat's
    system message, a tool's reply and the tool schemas as nothing: the training text lacked them without a word.
    Each is a bad record naming the message (or the tools) and what to do; a chat it renders whole packs."""
    from cookmind.cli import main as cookmind_main

    folder = sp_folder(tmp_path / "t", LLAMA2, chatml=False)
    src = tmp_path / "in.jsonl"
    tools = [{"type": "function", "function": {"name": "add_numbers", "parameters": {"type": "object"}}}]
    for record, said in [
        ({"messages": CHAT}, "message 1 (system): its content"),
        ({"messages": CHAT[1:3], "tools": tools}, "the tool schema 'add_numbers'"),
    ]:
        src.write_text(json.dumps(record) + "\n")
        argv = ["pack", "--tokenizer", str(folder), "--quiet", "--train-type", "sft", "--input", str(src)]
        capsys.readouterr()
        assert cookmind_main([*argv, "--out", str(tmp_path / "bad")]) == 2, said
        err = capsys.readouterr().err
        assert f"{src}:1: " in err and said in err and "not in the chat template's render" in err, err
    src.write_text(json.dumps({"messages": CHAT[1:]}) + "\n")
    assert cookmind_main([*argv, "--out", str(tmp_path / "ok")]) == 0
