"""Chat and serve with a Hugging Face chat template: the prompt is one render with the generation prompt, equal to
transformers' ``apply_chat_template(add_generation_prompt=True)``, also for a template that rewrites earlier turns
(Qwen3's drops past reasoning)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from lm_fixtures import sharp_tiny_lm  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from test_hf_chat_mask import CHATML, sp_folder  # noqa: E402

from cookmind.infer import SamplingParams  # noqa: E402
from cookmind.infer import chat_session as chat_session_module  # noqa: E402
from cookmind.infer.chat_session import ChatSession  # noqa: E402
from cookmind.infer.engine import Engine  # noqa: E402
from cookmind.infer.server import create_app  # noqa: E402
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
