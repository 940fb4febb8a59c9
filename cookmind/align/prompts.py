"""Prompt templates for reasoning with verifiable answers, and one way to turn text into ids for any tokenizer
we meet (ours or a Hugging Face one: it adds BOS/EOS from ``encode`` unless told not to, which would put special
tokens in the middle of a prompt+response join, so we ask it not to).
"""

from __future__ import annotations

from cookmind.infer.stop import chat_stop_ids, control_token_ids

# the templates' texts and names (and a flag's escapes) live in cookmind.prompt_templates, which the data stages
# read without torch; they are this module's too
from cookmind.prompt_templates import (  # noqa: F401
    COMPACT_PROMPT,
    PLAIN_PROMPT,
    PROMPTS,
    R1_ZERO_PROMPT,
    template_escapes,
)

# encode_text is this module's too (evals and losses import it from here): one definition, in tokenizer/documents.py
from cookmind.tokenizer.documents import encode_text, is_hf_tokenizer, prompt_ids  # noqa: F401

# -- Prompt templates for reasoning with verifiable answers ---------------------------------------------------------

# stop generating once the answer is closed
R1_ZERO_STOP = ("</answer>",)


def format_prompt(question: str, template: str = "r1_zero", tokenizer=None) -> str:
    """``template`` (a name in PROMPTS or a string with ``{question}``) filled with the question.

    ``"chat"`` renders the question as a user turn with the tokenizer's chat template and opens
    the assistant turn (for models SFT'd on chats, graded by ``#### N``).
    """
    if template == "chat":
        if tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
            raise ValueError("the 'chat' template needs a tokenizer with apply_chat_template")
        require_chat_template(tokenizer)
        # transformers' own returns ids unless told otherwise (ours and its adapter return the text)
        text_only = {"tokenize": False} if is_hf_tokenizer(tokenizer) else {}
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": question.strip()}], add_generation_prompt=True, **text_only
        )
    text = PROMPTS.get(template, template)
    if "{question}" not in text:
        names = ["chat", *sorted(PROMPTS)]
        raise ValueError(f"prompt template {template!r} is neither one of {names} nor a string with {{question}}")
    return text.replace("{question}", question.strip())


def require_chat_template(tokenizer) -> None:
    """The 'chat' prompt template renders with the tokenizer's own chat template: a Hugging Face tokenizer without
    one (a base model's) is refused here, naming the templates that work (transformers' error pointed at its docs)."""
    hf = tokenizer if is_hf_tokenizer(tokenizer) else getattr(tokenizer, "hf", None)
    if hf is not None and not getattr(hf, "chat_template", None):
        names = ", ".join(sorted(PROMPTS))
        raise ValueError(
            f"the 'chat' prompt template renders with the tokenizer's chat template, and this tokenizer has no chat "
            f"template (a base model's): use one of {names}, or a tokenizer that has one"
        )


def next_question_stops(template: str) -> tuple[str, ...]:
    """Where a base model's answer to a question-and-answer template ends: at the next question it makes up (the
    template's text before ``{question}``, on a new line: ``"\nQuestion:"`` for plain), as lm-eval-harness stops
    GSM8K. The chat template ends at the end of the turn, and a think template at ``</answer>``: none there."""
    if template == "chat" or uses_think_tags(template):
        return ()
    head = PROMPTS.get(template, template).split("{question}")[0].strip()
    return ("\n" + head,) if head else ()


def uses_think_tags(template: str) -> bool:
    """True when the prompt opens a <think> block (graded by <answer> tags), else graded by ``#### N``/last number."""
    return template != "chat" and PROMPTS.get(template, template).rstrip().endswith("<think>")


# -- One way to turn text into ids for any tokenizer we meet: ours or a Hugging Face one ----------------------------


def encode_prompt(tokenizer, question: str, template: str) -> list[int]:
    """Ids of ``format_prompt(question, template)``: a plain template's text opens as a document does
    (``prompt_ids``: Llama's <s> first); the chat template's own special tokens as tokens, the question always as
    text (a typed ``<|im_end|>`` never closes the turn)."""
    if template != "chat":
        return prompt_ids(tokenizer, format_prompt(question, template, tokenizer))
    require_chat_template(tokenizer)
    messages = [{"role": "user", "content": question.strip()}]
    if is_hf_tokenizer(tokenizer):
        return list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, sanitize_control_tokens=True, return_dict=False
            )
        )
    return list(tokenizer.render_prompt(messages))


def decode_ids(tokenizer, ids) -> str:
    """Text for ``ids``; special tokens kept so tags such as ``</answer>`` survive."""
    ids = [int(i) for i in ids]
    if is_hf_tokenizer(tokenizer):
        return tokenizer.decode(ids, skip_special_tokens=False)
    return tokenizer.decode(ids)


def pad_id_of(tokenizer) -> int:
    """The padding id: ours ``pad_id``, else Hugging Face's pad, else EOS, else 0."""
    for name in ("pad_id", "pad_token_id", "eos_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def stop_ids_of(tokenizer) -> tuple[int, ...]:
    """Ids that end a generated answer (evals, GRPO rollouts): every control token (``chat_stop_ids``), since what
    follows the first is not graded (``decode_response``) and an <|im_start|> opens a turn the model made up."""
    return chat_stop_ids(tokenizer)


def decode_response(tokenizer, ids) -> str:
    """A generated response as text to grade: what comes before its first control token (the end-of-text or
    end-of-turn it stops on, an <|im_start|> opening a turn the model made up: what follows is not its answer, and
    a control token is never text). Reasoning markers (<think>, </think>) stay: graders read them."""
    ids = [int(i) for i in ids]
    control = control_token_ids(tokenizer)
    end = next((k for k, t in enumerate(ids) if t in control), len(ids))
    return decode_ids(tokenizer, ids[:end])
