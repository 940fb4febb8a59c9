"""Chat conversations for SFT: greetings, simple facts, story requests and arithmetic problems.

Each chat is a list of ``{"role", "content"}`` messages, the shape ``Tokenizer.render`` takes.
"""

from __future__ import annotations

import random

from cookmind.synthetic.arithmetic import Problem, arithmetic_problems, direct_answer
from cookmind.synthetic.rng import make_rng
from cookmind.synthetic.stories import make_story
from cookmind.synthetic.vocabulary import ANIMALS, FACTS, GREETINGS, SYSTEM_PROMPTS

Message = dict[str, str]


def problem_chat(p: Problem, worked: bool = True) -> list[Message]:
    """A user asks the word problem; the assistant answers with the worked solution (or only the answer)
    and ``#### N``."""
    return [
        {"role": "user", "content": p.question},
        {"role": "assistant", "content": p.answer if worked else direct_answer(p)},
    ]


def _small_talk(rng: random.Random) -> list[Message]:
    kind = rng.random()
    if kind < 0.3:
        q, a = rng.choice(GREETINGS)
    elif kind < 0.8:
        q, a = rng.choice(FACTS)
    else:
        animal = rng.choice(ANIMALS)
        q = f"Tell me a short story about a {animal}."
        story = make_story(rng)
        a = story if animal in story else f"Once there was a {animal}. " + story
    chat = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if rng.random() < 0.2:
        chat.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    return chat


def chats(
    n: int,
    seed: int = 0,
    math_fraction: float = 0.7,
    level: int = 1,
    max_number: int = 20,
    exclude: set[str] | None = None,
    worked_fraction: float = 1.0,
) -> list[list[Message]]:
    """``n`` chats: ``math_fraction`` of them arithmetic problems (questions in ``exclude`` skipped).

    ``worked_fraction`` of the arithmetic answers show the working; the rest give only the answer,
    as a demonstrator in a hurry would (the demo's RL stage is about that difference).
    """
    rng = make_rng(seed, "chats")
    style = make_rng(seed, "chats-style")  # its own stream: worked_fraction 1.0 leaves the chats as before
    n_math = int(round(n * math_fraction))
    problems = arithmetic_problems(n_math, seed=seed + 7919, level=level, max_number=max_number, exclude=exclude)
    out = [problem_chat(p, style.random() < worked_fraction) for p in problems] + [
        _small_talk(rng) for _ in range(n - n_math)
    ]
    rng.shuffle(out)
    return out
