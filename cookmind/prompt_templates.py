"""The prompt templates' texts and names (GRPO's grpo.template, eval gsm8k's --template, pack's --prompt-template)
and how a flag's template of one's own is read: text only, so that pack and the data stages read them without
torch (``cookmind.align.prompts`` formats and encodes prompts with them)."""

from __future__ import annotations

import re

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


def template_escapes(template: str) -> str:
    """A template of one's own as a flag gives it (eval's --template, pack's --prompt-template), its \\n, \\t and
    \\\\ read as a new line, a tab and a backslash: a shell's quotes hand them over as typed
    ('Question: {question}\\nAnswer:'), and a prompt with a backslash and an 'n' where a line break was meant is a
    prompt nobody wrote. A template's name is left as it is."""
    if template == "chat" or template in PROMPTS:
        return template
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), "\\"), template)
