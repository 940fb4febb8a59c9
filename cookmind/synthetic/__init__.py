"""The embedded default data: seeded generators, so a fresh install trains with nothing downloaded.

- ``stories(n, seed)``: short simple stories (pretraining text)
- ``arithmetic_problems(n, seed, level, max_number)``: word problems, answers in GSM8K's ``#### N``
- ``chats(n, seed)``: SFT conversations (message lists)
- ``preference_pairs(n, seed)``: DPO records, a correct answer chosen over a wrong one
- ``crawl``: a small synthetic web crawl (see cookmind/synthetic/crawl.py)
"""

from cookmind.synthetic.arithmetic import Problem, arithmetic_problems, direct_answer, make_problem
from cookmind.synthetic.chats import chats, problem_chat
from cookmind.synthetic.preferences import preference_pairs, wrong_answer
from cookmind.synthetic.stories import make_story, stories

__all__ = [
    "Problem",
    "arithmetic_problems",
    "direct_answer",
    "make_problem",
    "chats",
    "problem_chat",
    "preference_pairs",
    "wrong_answer",
    "make_story",
    "stories",
]
