"""Arithmetic word problems in GSM8K's answer format: a short worked solution, then ``#### N``.

Level 1 is one addition or subtraction with small numbers (a tiny model can learn it in
minutes); level 2 adds multiplication of small factors; level 3 chains two operations;
level 4 is only two-step problems (add then take away, or take away then add), the demo's
RL task: the worked solution computes the intermediate result on its own line.
Answers are never negative (graded as every GSM8K answer is: ``cookmind.align.rewards``);
``direct_answer`` is the same problem answered without the working.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from cookmind.synthetic.rng import make_rng
from cookmind.synthetic.vocabulary import ITEMS, NAMES


@dataclass(frozen=True)
class Problem:
    """One word problem: ``answer`` text ends in ``#### <value>``, GSM8K style."""

    question: str
    answer: str
    value: int

    def to_dict(self) -> dict:
        """GSM8K's JSONL record: {"question", "answer"}."""
        return {"question": self.question, "answer": self.answer}


def _add(rng: random.Random, hi: int) -> Problem:
    (name, he), item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(1, hi), rng.randint(1, hi)
    verb = rng.choice(["gets", "finds", "buys", "is given"])
    q = f"{name} has {a} {item}. {he.capitalize()} {verb} {b} more. How many {item} does {name} have now?"
    return Problem(q, f"{a} + {b} = {a + b}\n#### {a + b}", a + b)


def _sub(rng: random.Random, hi: int) -> Problem:
    (name, he), (friend, _) = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    a = rng.randint(2, hi)
    b = rng.randint(1, a)
    verb = rng.choice(
        [
            f"gives {b} to {friend}",
            f"loses {b}",
            f"eats {b}" if item in ("apples", "cookies", "oranges", "candies", "eggs") else f"sells {b}",
        ]
    )
    q = f"{name} has {a} {item}. {he.capitalize()} {verb}. How many {item} does {name} have left?"
    return Problem(q, f"{a} - {b} = {a - b}\n#### {a - b}", a - b)


def _mul(rng: random.Random, hi: int) -> Problem:
    (name, _), item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, max(2, min(hi, 9))), rng.randint(2, max(2, min(hi, 9)))
    q = f"{name} has {a} bags. Each bag has {b} {item}. How many {item} does {name} have in total?"
    return Problem(q, f"{a} * {b} = {a * b}\n#### {a * b}", a * b)


def _two_step(rng: random.Random, hi: int) -> Problem:
    (name, he), item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(1, hi), rng.randint(1, hi)
    c = rng.randint(1, a + b)
    q = (
        f"{name} has {a} {item}. {he.capitalize()} gets {b} more and then gives away {c}. "
        f"How many {item} does {name} have left?"
    )
    return Problem(q, f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}\n#### {a + b - c}", a + b - c)


def _take_then_add(rng: random.Random, hi: int) -> Problem:
    (name, he), item = rng.choice(NAMES), rng.choice(ITEMS)
    a = rng.randint(2, hi)
    b, c = rng.randint(1, a), rng.randint(1, hi)
    q = (
        f"{name} has {a} {item}. {he.capitalize()} gives away {b} and then gets {c} more. "
        f"How many {item} does {name} have now?"
    )
    return Problem(q, f"{a} - {b} = {a - b}\n{a - b} + {c} = {a - b + c}\n#### {a - b + c}", a - b + c)


def _three_step(rng: random.Random, hi: int) -> Problem:
    (name, he), item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(1, hi), rng.randint(1, hi)
    c, d = rng.randint(1, a + b), rng.randint(1, hi)
    s, t = a + b, a + b - c
    q = (
        f"{name} has {a} {item}. {he.capitalize()} gets {b} more, gives away {c}, and then finds {d} more. "
        f"How many {item} does {name} have now?"
    )
    return Problem(q, f"{a} + {b} = {s}\n{s} - {c} = {t}\n{t} + {d} = {t + d}\n#### {t + d}", t + d)


def _three_step_take(rng: random.Random, hi: int) -> Problem:
    (name, he), item = rng.choice(NAMES), rng.choice(ITEMS)
    a = rng.randint(2, hi)
    b, c = rng.randint(1, a), rng.randint(1, hi)
    d = rng.randint(1, a - b + c)
    s, t = a - b, a - b + c
    q = (
        f"{name} has {a} {item}. {he.capitalize()} gives away {b}, gets {c} more, and then loses {d}. "
        f"How many {item} does {name} have left?"
    )
    return Problem(q, f"{a} - {b} = {s}\n{s} + {c} = {t}\n{t} - {d} = {t - d}\n#### {t - d}", t - d)


_LEVELS = {
    1: (_add, _sub),
    2: (_add, _sub, _mul),
    3: (_add, _sub, _mul, _two_step),
    4: (_two_step, _take_then_add),
    5: (_three_step, _three_step_take),
}


def direct_answer(p: Problem) -> str:
    """The answer without the working: what a demonstrator who skips the steps writes."""
    return f"The answer is {p.value}.\n#### {p.value}"


def make_problem(rng: random.Random, level: int = 1, max_number: int = 20) -> Problem:
    """One problem drawn from ``rng``: operations up to ``level``, operands in 1..``max_number``."""
    if level not in _LEVELS:
        raise ValueError(f"arithmetic level must be one of {sorted(_LEVELS)}, got {level}")
    return rng.choice(_LEVELS[level])(rng, max_number)


def arithmetic_problems(
    n: int, seed: int = 0, level: int = 1, max_number: int = 20, exclude: set[str] | None = None
) -> list[Problem]:
    """``n`` distinct problems from ``seed``; questions in ``exclude`` are skipped (held-out sets)."""
    rng = make_rng(seed, f"arithmetic-{level}-{max_number}")
    seen: set[str] = set(exclude or ())
    out: list[Problem] = []
    tries = 0
    while len(out) < n:
        p = make_problem(rng, level, max_number)
        tries += 1
        if p.question in seen:
            if tries > 50 * n + 1000:
                raise ValueError(f"cannot draw {n} distinct problems at level {level}, max_number {max_number}")
            continue
        seen.add(p.question)
        out.append(p)
    return out
