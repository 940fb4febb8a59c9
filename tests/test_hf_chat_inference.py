"""Chat and serve with a Hugging Face chat template: the prompt is one render with the generation prompt, equal to
transformers' ``apply_chat_template(add_generation_prompt=True)``, also for a template that rewrites earlier turns
(Qwen3's drops past reasoning); a system message the template leaves out is refused, not answered as if read."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from lm_fixtures import sharp_tiny_lm  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from test_hf_chat_mask import CHATML, LLAMA2, sp_folder  # noqa: E402

from cookmind.infer import SamplingParams  # noqa: E402
from cookmind.infer import chat_session as chat_session_module  # noqa: E402
from cookmind.infer.chat_session import ChatSession  # noqa: E402
from cookmind.infer.engine import Engine  # noqa: E402
from cookmind.infer.server import create_app  # noqa: E402
from cookmind.tokenizer.errors import TokenizerError  # noqa: E402
from cookmind.tokenizer.hf_adapter import load_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# Qwen3's way: an assistant turn's reasoning is rendered only after the last user message, so a conversation's first
# turns render otherwise alone than inside a longer one
QWEN3_STYLE = (
    "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}"
    "{% endif %}{% endfor %}{% for m in messages %}"
    "{% if m.role == 'assistant' and loop.index0 > ns.last and m.reasoning_content %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}"
    "{{ m.content + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is two and two?"},
    {"role": "assistant", "content": "Four.", "reasoning_content": "two and two make four"},
]


def transformers_prompt(folder, messages) -> list[int]:
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    return list(hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


def test_a_qwen3_style_template_renders_past_turns_otherwise_than_alone():
    """The premise: the template is not prefix-stable (the whole render does not start with the first turns')."""
    env = transformers.utils.chat_template_utils._compile_jinja_template(QWEN3_STYLE)
    alone = env.render(messages=HISTORY, add_generation_prompt=False)
    whole = env.render(messages=[*HISTORY, {"role": "user", "content": "And?"}], add_generation_prompt=False)
    assert "two and two make four" in alone and not whole.startswith(alone)


def test_chat_with_a_qwen3_style_template_answers_a_multi_turn_history_with_transformers_prompt(tmp_path, monkeypatch):
    folder = sp_folder(tmp_path / "t", QWEN3_STYLE)
    tok = load_tokenizer(folder)
    model = sharp_tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=512)
    real, seen = chat_session_module.stream, []

    def spy(model, prompt, cfg):
        seen.append(list(prompt))
        yield from real(model, prompt, cfg)

    monkeypatch.setattr(chat_session_module, "stream", spy)
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=3), system="Be brief.")
    s.history = [dict(m) for m in HISTORY[1:]]
    list(s.send("And three and three?"))  # was refused: "not the start of its render of the whole"
    assert seen == [transformers_prompt(folder, [*HISTORY, {"role": "user", "content": "And three and three?"}])]
    assert s.history[-1]["role"] == "assistant"


def test_serve_with_a_qwen3_style_template_answers_a_multi_turn_history_with_transformers_prompt(tmp_path):
    folder = sp_folder(tmp_path / "t", QWEN3_STYLE)
    tok = load_tokenizer(folder)
    messages = [*HISTORY, {"role": "user", "content": "And three and three?"}]
    want = transformers_prompt(folder, messages)
    assert tok.render_prompt(messages) == want
    model = sharp_tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=512)
    app = create_app(Engine(model, num_slots=2, max_seq_len=512, max_waiting=4), tok, "m")
    with TestClient(app, base_url="http://localhost") as client:
        r = client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(want)


def test_the_prompt_is_one_render_however_long_the_conversation(tmp_path):
    """A prompt needs no training mask: the mask's prefix renders (four per assistant turn) made each reply's prompt
    quadratic in the conversation."""
    tok = load_tokenizer(sp_folder(tmp_path / "t", CHATML))
    real, seen = tok.hf.apply_chat_template, []

    def counting(messages, *a, **kw):
        seen.append(len(messages))
        return real(messages, *a, **kw)

    tok.hf.apply_chat_template = counting
    turns = [{"role": r, "content": f"turn {k}"} for k in range(5) for r in ("user", "assistant")]
    tok.render_prompt([*turns, {"role": "user", "content": "last"}])
    assert all(n == len(turns) + 1 for n in seen) and len(seen) <= 2, seen


def test_a_system_message_the_template_leaves_out_is_refused_by_chat_in_one_line(tmp_path):
    tok = load_tokenizer(sp_folder(tmp_path / "t", LLAMA2, chatml=False))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "t"))
    assert "Be brief." not in hf.apply_chat_template(HISTORY[:2], tokenize=False)  # the premise
    model = sharp_tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=512)
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=2), system="Be brief.")
    with pytest.raises(TokenizerError, match=r"message 1 \(system\).*not in the chat template's render") as e:
        list(s.send("What is two and two?"))
    assert "\n" not in str(e.value)
    assert s.history == []  # nothing was answered
    s.system = ""
    list(s.send("What is two and two?"))  # without it the same template answers
    assert s.history[-1]["role"] == "assistant"


def test_a_system_message_the_template_leaves_out_is_a_400_naming_it_from_serve(tmp_path):
    tok = load_tokenizer(sp_folder(tmp_path / "t", LLAMA2, chatml=False))
    model = sharp_tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=512)
    app = create_app(Engine(model, num_slots=2, max_seq_len=512, max_waiting=4), tok, "m")
    with TestClient(app, base_url="http://localhost") as client:
        r = client.post("/v1/chat/completions", json={"model": "m", "messages": HISTORY[:2], "max_tokens": 2})
        ok = client.post("/v1/chat/completions", json={"model": "m", "messages": HISTORY[1:2], "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert "message 1 (system)" in r.json()["error"]["message"]
    assert ok.status_code == 200, ok.text


def test_cookmind_chat_refuses_a_system_prompt_the_template_leaves_out_before_the_chat_starts(
    tmp_path, monkeypatch, capsys
):
    """Each message was answered "(error: ...)" after the chat opened: the --system prompt was the problem."""
    import io
    import sys

    from cookmind.cli import main as cli_main
    from cookmind.model import save_model

    folder = sp_folder(tmp_path / "t", LLAMA2, chatml=False)
    save_model(tmp_path / "m", sharp_tiny_lm(vocab_size=load_tokenizer(folder).vocab_size))
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    argv = ["chat", str(tmp_path / "m"), "--tokenizer", str(folder), "--system", "Be brief.", "--max-new-tokens", "2"]
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("cookmind chat: error: --system: message 1 (system)"), captured.err
    assert captured.err.count("\n") == 1 and "bot>" not in captured.out
