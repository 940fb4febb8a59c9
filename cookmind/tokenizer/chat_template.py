"""The ChatML chat template: our renderer and the same template in Jinja for Hugging Face.

    <|im_start|>system\n{system}{tools}<|im_end|>\n
    <|im_start|>user\n{content}<|im_end|>\n
    <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}\n<tool_call>\n{json}\n</tool_call><|im_end|>\n
    <|im_start|>tool\n{content}<|im_end|>\n
    <|im_start|>assistant\n                      (the generation prompt)

The system turn appears when the first message is a system message or tools are given; tools
are listed one JSON object per line. The think block appears when an assistant message has
`reasoning_content` (not None). Tool calls accept OpenAI's {"function": {"name", "arguments"}}
or a bare {"name", "arguments"}; string arguments are written verbatim, others as JSON.
`chat_segments` marks the assistant spans (content through <|im_end|>) that SFT/DPO train on, and
which pieces are data (message content, reasoning, tool names, arguments and schemas) rather than
template: special tokens come only from the template; one typed into data is encoded as text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from cookmind.tokenizer.errors import TokenizerError

IM_START, IM_END, THINK, END_THINK, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"
DEFAULT_SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, THINK, END_THINK]
ROLES = ("system", "user", "assistant", "tool")

TOOLS_INTRO = "# Tools\n\nYou may call the functions below. Their signatures are inside <tools></tools>:\n<tools>"
TOOLS_OUTRO = (
    "\n</tools>\n\nTo call a function, reply with a JSON object inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call>'
)


def _tojson(x) -> str:
    # The same call transformers' `tojson` filter makes, so both renderers agree byte for byte.
    return json.dumps(x, ensure_ascii=False)


def _check(messages: Sequence[dict]) -> None:
    if not isinstance(messages, (list, tuple)):
        raise TokenizerError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise TokenizerError(f"messages[{i}] must be a dict with role in {ROLES}, got {m!r:.200}")
        if not isinstance(m.get("content") or "", str):
            raise TokenizerError(f"messages[{i}].content must be a string (or None), got {type(m['content']).__name__}")


def _tool_call(tc: dict, first: bool) -> list[tuple[str, bool]]:
    """(text, is_data) pieces of one tool call; `first` with no content before it means no leading newline."""
    f = tc.get("function", tc) if isinstance(tc, dict) else None
    if not isinstance(f, dict) or "name" not in f or "arguments" not in f:
        raise TokenizerError(f"tool call {tc!r:.200} needs a name and arguments (OpenAI form: {{'function': {{...}}}})")
    args = f["arguments"]
    args = args if isinstance(args, str) else _tojson(args)
    return [
        ("" if first else "\n", False),
        ('<tool_call>\n{"name": "', False),
        (str(f["name"]), True),
        ('", "arguments": ', False),
        (args, True),
        ("}\n</tool_call>", False),
    ]


def chat_segments(
    messages: Sequence[dict], add_generation_prompt: bool = False, tools: Sequence[dict] | None = None
) -> list[tuple[str, bool, bool]]:
    """The rendered conversation as (text, is_assistant_target, is_data) pieces; they concatenate to the prompt.

    is_data marks text that came from the caller (content, reasoning, tool names, arguments, tool schemas):
    the template's own special tokens are in pieces with is_data False.
    """
    _check(messages)
    segs: list[tuple[str, bool, bool]] = []

    def add(target: bool, *pieces: tuple[str, bool]) -> None:
        segs.extend((t, target, data) for t, data in pieces if t)

    start = 0
    has_system = bool(messages) and messages[0]["role"] == "system"
    if tools or has_system:
        body = (messages[0].get("content") or "") if has_system else ""
        start = 1 if has_system else 0
        add(False, (f"{IM_START}system\n", False), (body, True))
        if tools:
            add(False, ("\n\n" if body else "", False), (TOOLS_INTRO, False))
            for t in tools:
                add(False, ("\n", False), (_tojson(t), True))
            add(False, (TOOLS_OUTRO, False))
        add(False, (f"{IM_END}\n", False))
    for m in messages[start:]:
        role, content = m["role"], m.get("content") or ""
        if role != "assistant":
            add(False, (f"{IM_START}{role}\n", False), (content, True), (f"{IM_END}\n", False))
            continue
        add(False, (f"{IM_START}assistant\n", False))
        if m.get("reasoning_content") is not None:
            add(True, (f"{THINK}\n", False), (str(m["reasoning_content"]), True), (f"\n{END_THINK}\n\n", False))
        add(True, (content, True))
        for k, tc in enumerate(m.get("tool_calls") or []):
            add(True, *_tool_call(tc, first=not (content or k)))
        add(True, (IM_END, False))
        add(False, ("\n", False))
    if add_generation_prompt:
        add(False, (f"{IM_START}assistant\n", False))
    return segs


def render_text(
    messages: Sequence[dict], add_generation_prompt: bool = False, tools: Sequence[dict] | None = None
) -> str:
    """The prompt string for a conversation."""
    return "".join(t for t, _, _ in chat_segments(messages, add_generation_prompt, tools))


def jinja_template() -> str:
    """The Jinja chat_template for tokenizer_config.json; renders exactly what render_text renders."""
    q = json.dumps  # a JSON string literal is also a valid Jinja string literal
    return (
        "{%- set ns = namespace(start=0) -%}"
        "{%- set has_system = messages and messages[0].role == 'system' -%}"
        "{%- if tools or has_system -%}"
        "{{- " + q(IM_START + "system\n") + " -}}"
        "{%- if has_system -%}{%- set ns.start = 1 -%}{{- messages[0].content or '' -}}{%- endif -%}"
        "{%- if tools -%}"
        "{%- if has_system and messages[0].content -%}{{- '\\n\\n' -}}{%- endif -%}"
        "{{- " + q(TOOLS_INTRO) + " -}}"
        "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
        "{{- " + q(TOOLS_OUTRO) + " -}}"
        "{%- endif -%}"
        "{{- " + q(IM_END + "\n") + " -}}"
        "{%- endif -%}"
        "{%- for message in messages[ns.start:] -%}"
        "{{- " + q(IM_START) + " + message.role + '\\n' -}}"
        "{%- if message.role == 'assistant' -%}"
        "{%- if message.reasoning_content is defined and message.reasoning_content is not none -%}"
        "{{- " + q(THINK + "\n") + " + message.reasoning_content + " + q("\n" + END_THINK + "\n\n") + " -}}"
        "{%- endif -%}"
        "{{- message.content or '' -}}"
        "{%- for tc in message.tool_calls or [] -%}"
        "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
        "{%- set f = tc.function if tc.function is defined else tc -%}"
        '{{- \'<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' -}}'
        "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
        "{{- '}\\n</tool_call>' -}}"
        "{%- endfor -%}"
        "{%- else -%}"
        "{{- message.content or '' -}}"
        "{%- endif -%}"
        "{{- " + q(IM_END + "\n") + " -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- " + q(IM_START + "assistant\n") + " -}}{%- endif -%}"
    )
