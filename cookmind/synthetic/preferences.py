"""Preference pairs for DPO: the correct worked answer chosen over a plausible wrong one."""

from __future__ import annotations

import random

from cookmind.synthetic.arithmetic import Problem, arithmetic_problems, direct_answer
from cookmind.synthetic.rng import make_rng


def wrong_answer(p: Problem, rng: random.Random) -> str:
    """A wrong solution of the same shape: an off-by-a-little result, the other operation, or no ``####``."""
    lines = p.answer.split("\n")
    kind = rng.random()
    delta = rng.choice([-2, -1, 1, 2])
    wrong = max(0, p.value + delta)
    if wrong == p.value:
        wrong = p.value + 1
    if kind < 0.7:
        # Same working, wrong arithmetic in the last step.
        last = lines[-2]
        lhs = last.rsplit("=", 1)[0]
        return "\n".join(lines[:-2] + [f"{lhs}= {wrong}", f"#### {wrong}"])
    if kind < 0.85:
        return f"The answer is {wrong}.\n#### {wrong}"
    return lines[0]  # working without the final answer line


def preference_pairs(
    n: int,
    seed: int = 0,
    level: int = 1,
    max_number: int = 20,
    exclude: set[str] | None = None,
    worked_fraction: float = 1.0,
) -> list[dict]:
    """``n`` records ``{"chosen", "rejected"}`` (message lists, as the dpo packer takes).

    ``worked_fraction`` of the chosen answers show the working, the rest give only the answer.
    """
    rng = make_rng(seed, "preferences")
    style = make_rng(seed, "preferences-style")  # own stream: the default leaves the pairs as before
    problems = arithmetic_problems(n, seed=seed + 104729, level=level, max_number=max_number, exclude=exclude)
    out = []
    for p in problems:
        user = [{"role": "user", "content": p.question}]
        out.append(
            {
                "chosen": user
                + [
                    {"role": "assistant", "content": p.answer if style.random() < worked_fraction else direct_answer(p)}
                ],
                "rejected": user + [{"role": "assistant", "content": wrong_answer(p, rng)}],
            }
        )
    return out
