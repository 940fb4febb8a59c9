"""Answer extraction, grading, format reward and response parsers on hand-written cases."""

import pytest

from cookmind.align import (
    R1_ZERO_PROMPT,
    extract_answer,
    format_prompt,
    format_reward,
    grade_gsm8k,
    parse_gsm8k_response,
    parse_mmlu_response,
    r1_zero_reward_fn,
)


@pytest.mark.parametrize(
    "response, gold, correct",
    [
        ("She pays 3*4 = 12 dollars.\n#### 12", "#### 12", True),
        ("The answer is \\boxed{1,234}.", "1234", True),
        ("so 10 + 5 = 15 apples", "x #### 15", True),  # the last number
        ("so 10 + 5 = 15 apples", "#### 10", False),  # not an earlier one
        ("It costs $1,200.00 in total", "1200", True),  # currency, separators, trailing zeros
        ("It is 1,200 dollars", "1200", True),
        ("The temperature is -5 degrees", "#### -5", True),  # negative
        ("The temperature is -5 degrees", "#### 5", False),
        ("\\boxed{\\frac{3}{4}}", "0.75", True),  # fraction == decimal
        ("<answer> 3/4 </answer>", "#### 0.75", True),
        ("He ran 12 km", "#### 12", True),  # units
        ("50%", "50", True),
        ("no number here", "#### 3", False),
        ("#### 7\nthen 8", "#### 7", True),  # #### wins over the last number
    ],
)
def test_grade_gsm8k(response, gold, correct):
    assert grade_gsm8k(response, gold) is correct


def test_extract_answer_priority():
    assert extract_answer("1 then <answer> 2 </answer> 3") == "2"
    assert extract_answer("4 #### 5") == "5"
    assert extract_answer("\\boxed{6} and 7") == "6"
    assert extract_answer("nothing") is None


@pytest.mark.parametrize(
    "response, fmt",
    [
        (" 2 + 2 = 4 </think> <answer> 4 </answer>", 1.0),
        (" think </think>\n<answer>4</answer><|endoftext|>", 1.0),
        (" think </think> <answer> 4 </answer> extra words", 0.0),  # text after the answer
        (" think <answer> 4 </answer>", 0.0),  # no </think>
        (" think </think> 4", 0.0),  # no tags
        (" think </think> <answer> </answer>", 0.0),  # empty answer
    ],
)
def test_format_reward(response, fmt):
    assert format_reward(response) == fmt


def test_r1_zero_reward_requires_format_for_answer():
    good = r1_zero_reward_fn(" 3+4=7 </think> <answer> 7 </answer>", "#### 7")
    assert good == {"format_reward": 1.0, "answer_reward": 1.0, "reward": 1.0}
    wrong = r1_zero_reward_fn(" 3+4=8 </think> <answer> 8 </answer>", "#### 7")
    assert wrong == {"format_reward": 1.0, "answer_reward": 0.0, "reward": 0.0}
    unformatted = r1_zero_reward_fn(" the answer is 7", "#### 7")
    assert unformatted["reward"] == 0.0 and unformatted["format_reward"] == 0.0
    shaped = r1_zero_reward_fn(" 3+4=8 </think> <answer> 8 </answer>", "#### 7", format_weight=0.1)
    assert shaped["reward"] == pytest.approx(0.1)


def test_r1_zero_prompt_ends_inside_think():
    text = format_prompt("What is 2+3?")
    assert text.endswith("Assistant: <think>") and "User: What is 2+3?" in text
    assert R1_ZERO_PROMPT.count("{question}") == 1
    with pytest.raises(ValueError, match="question"):
        format_prompt("x", template="no placeholder")


def test_parse_gsm8k_response():
    assert parse_gsm8k_response("so it is 1,234 apples") == "1234"
    assert parse_gsm8k_response("#### -3") == "-3"
    assert parse_gsm8k_response("\\boxed{\\frac{6}{8}}") == "3/4"
    assert parse_gsm8k_response("2.50 dollars") == "5/2"
    assert parse_gsm8k_response("none") is None


def test_parse_mmlu_response():
    ex = {"question": "Which is a mammal?", "options": ["shark", "whale", "trout", "eel"]}
    assert parse_mmlu_response(ex, "The correct answer is B.") == "B"
    assert parse_mmlu_response(ex, "Answer: (C)") == "C"
    assert parse_mmlu_response(ex, "D") == "D"
    assert parse_mmlu_response(ex, "<answer>A</answer>") == "A"
    assert parse_mmlu_response(ex, "I think it is the whale") == "B"  # the option's text
    assert parse_mmlu_response(ex, "The answer is a fish") is None  # lowercase 'a' is a word, not a letter
    assert parse_mmlu_response(ex, "no idea") is None
