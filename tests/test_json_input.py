"""cookmind.json_input.loads: json.loads for what users and clients give, too-deep nesting a JSONDecodeError."""

from __future__ import annotations

import json

import pytest

from cookmind import json_input


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, null, "x"]}', "[[[[]]]]", '"\\u00e9"', b'{"b": true}'])
def test_it_reads_what_json_reads(text):
    assert json_input.loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["{not json", "[1,", ""])
def test_bad_json_is_the_same_error(text):
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as ours:
        json_input.loads(text)
    assert (ours.value.msg, ours.value.pos) == (theirs.value.msg, theirs.value.pos)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, b'{"a": ' * 5000 + b"1" + b"}" * 5000])
def test_too_deep_nesting_is_bad_json_not_a_recursion_error(text):
    with pytest.raises(RecursionError):
        json.loads(text)  # the reference: what every reader caught with `except ValueError` missed
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        json_input.loads(text)
