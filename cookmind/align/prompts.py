"""Prompt templates for reasoning with verifiable answers."""

from __future__ import annotations

# The R1-Zero template (DeepSeek-R1 paper): the model writes its reasoning, closes </think>,
# then puts the answer in <answer> tags; the prompt ends inside <think> so generation starts there.
R1_ZERO_PROMPT = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
    "The reasoning process is enclosed within <think> </think> and answer is enclosed within <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\n"
    "User: {question}\n"
    "Assistant: <think>"
)

# A compact variant for tiny models with short context windows: same tags, same grading.
COMPACT_PROMPT = "Q: {question}\nA: <think>"

# Plain question answering for models never taught the tags (graded by the last number).
PLAIN_PROMPT = "Question: {question}\nAnswer:"

PROMPTS = {"r1_zero": R1_ZERO_PROMPT, "compact": COMPACT_PROMPT, "plain": PLAIN_PROMPT}

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
        return tokenizer.apply_chat_template([{"role": "user", "content": question.strip()}], add_generation_prompt=True)
    text = PROMPTS.get(template, template)
    if "{question}" not in text:
        raise ValueError(f"prompt template {template!r} is neither one of {sorted(PROMPTS)} nor a string with {{question}}")
    return text.replace("{question}", question.strip())


def uses_think_tags(template: str) -> bool:
    """True when the prompt opens a <think> block (graded by <answer> tags), else graded by ``#### N``/last number."""
    return template != "chat" and PROMPTS.get(template, template).rstrip().endswith("<think>")


def r1_zero_target(reasoning: str, answer: str) -> str:
    """The response an r1-zero prompt expects: reasoning, </think>, then the answer in tags."""
    return f" {reasoning.strip()} </think> <answer> {answer.strip()} </answer>"
