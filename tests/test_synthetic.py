"""Synthetic generators: seeded, arithmetic answers correct in GSM8K's format, held-out sets disjoint."""

import re

from cookmind.synthetic import arithmetic_problems, chats, direct_answer, preference_pairs, stories


def _gsm8k_answer(text):
    """GSM8K's own convention: the number after '####', commas removed."""
    return int(text.split("####")[-1].strip().replace(",", ""))


def test_seeded_and_reproducible():
    assert stories(5, seed=1) == stories(5, seed=1)
    assert stories(5, seed=1) != stories(5, seed=2)
    assert arithmetic_problems(20, seed=3, level=3) == arithmetic_problems(20, seed=3, level=3)
    assert chats(10, seed=4) == chats(10, seed=4)


def test_worked_solutions_are_arithmetically_right_and_in_gsm8k_format():
    for level in (1, 2, 3, 4, 5):
        for p in arithmetic_problems(300, seed=level, level=level, max_number=20):
            assert p.answer.splitlines()[-1] == f"#### {p.value}"
            assert _gsm8k_answer(p.answer) == p.value
            assert p.value >= 0
            for line in p.answer.splitlines()[:-1]:  # every "a op b = c" step checks out
                lhs, rhs = line.split("=")
                a, op, b = lhs.split()
                want = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
                assert want == int(rhs)
            if level >= 4:  # multi-step: each step starts from the result of the one before
                steps = p.answer.splitlines()[:-1]
                assert len(steps) == level - 2
                for prev, line in zip(steps, steps[1:]):
                    assert line.split()[0] == prev.split("=")[1].strip()
            numbers = [int(n) for n in re.findall(r"\d+", p.question)]
            assert numbers and max(numbers) <= (20 if level < 3 else 40)  # level 3 gives away up to a + b


def test_held_out_questions_never_appear_in_training_sets():
    held = arithmetic_problems(200, seed=1)
    exclude = {p.question for p in held}
    assert len(exclude) == 200
    train = arithmetic_problems(2000, seed=2, exclude=exclude)
    assert not exclude & {p.question for p in train}
    sft_questions = {c[-2]["content"] for c in chats(500, seed=3, exclude=exclude)}
    assert not exclude & sft_questions
    dpo_questions = {r["chosen"][0]["content"] for r in preference_pairs(300, seed=4, exclude=exclude)}
    assert not exclude & dpo_questions


def test_preference_pairs_prefer_the_correct_answer():
    for r in preference_pairs(200, seed=0):
        assert r["chosen"][:-1] == r["rejected"][:-1]
        rejected = r["rejected"][-1]["content"]  # a wrong number, or the working with no `#### N` line
        assert "####" not in rejected or _gsm8k_answer(rejected) != _gsm8k_answer(r["chosen"][-1]["content"])


def test_chats_are_well_formed():
    for c in chats(200, seed=0):
        assert c[-1]["role"] == "assistant" and c[-2]["role"] == "user"
        assert all(m["content"].strip() for m in c)
        assert {m["role"] for m in c} <= {"system", "user", "assistant"}


def test_direct_answers_and_the_worked_share():
    """A terse demonstration has the same ``#### N`` but no working; worked_fraction sets how many show it."""
    for p in arithmetic_problems(100, seed=5, level=5, max_number=10):
        d = direct_answer(p)
        assert _gsm8k_answer(d) == p.value and "=" not in d
    assert chats(300, seed=4) == chats(300, seed=4, worked_fraction=1.0)  # the default is the old data
    math = [c for c in chats(1000, seed=4, level=5, max_number=10, worked_fraction=0.3) if "####" in c[-1]["content"]]
    worked = sum("=" in c[-1]["content"] for c in math) / len(math)
    assert 0.25 < worked < 0.35, worked
    pairs = preference_pairs(400, seed=4, level=5, max_number=10, worked_fraction=0.3)
    chosen_worked = sum("=" in r["chosen"][-1]["content"] for r in pairs) / len(pairs)
    assert 0.22 < chosen_worked < 0.38, chosen_worked
    for r in pairs:  # terse or not, the chosen answer is the right one and the rejected one is not
        rejected = r["rejected"][-1]["content"]
        assert "####" not in rejected or _gsm8k_answer(rejected) != _gsm8k_answer(r["chosen"][-1]["content"])
