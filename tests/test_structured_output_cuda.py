"""Structured outputs on CUDA: graphs, compiled layers and pinned masks, with constrained and free rows in one batch.

Its own file: the GPU machines lack the server packages (openai, uvicorn, jsonschema) test_structured_output.py
imports. The JSON answers are checked against SCHEMA by hand.
"""

from __future__ import annotations

import json

import pytest
from lm_fixtures import sharp_tiny_lm
from structured_fixtures import RESPONSE_FORMAT, VOCAB, YES_NO

from cookmind.infer import SamplingParams, generate
from cookmind.infer.constraints import grammar_for_response_format
from cookmind.infer.engine import Engine
from cookmind.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tok_dir) -> Tokenizer:
    return Tokenizer.load(tok_dir)


def check_schema(answer: dict) -> None:
    """SCHEMA by hand: exactly these keys, a bool, an int 0..9, one of three colours, a string of at most 6."""
    assert set(answer) == {"ok", "n", "colour", "note"}, answer
    assert isinstance(answer["ok"], bool)
    assert isinstance(answer["n"], int) and not isinstance(answer["n"], bool) and 0 <= answer["n"] <= 9
    assert answer["colour"] in ("red", "green", "blue")
    assert isinstance(answer["note"], str) and len(answer["note"]) <= 6


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [True, False])
def test_cuda_engine_mixes_constrained_and_free_rows(tok, overlap):
    """On CUDA (graphs, compiled layers, pinned masks): free rows decode as the plain loop does, grammar rows obey."""
    model = sharp_tiny_lm(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, max_position_embeddings=256).cuda()
    prompts = [tok.encode("The cook stirs the soup."), tok.encode("Tom has 3 apples")]
    free = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=(tok.eos_id,))
    reference = [generate(model, [p], free, tok, engine="builtin", keep_stop_token=True)[0] for p in prompts]
    engine = Engine(model, num_slots=8, max_seq_len=256, tokenizer=tok, cuda_graphs=True, overlap=overlap)
    schema = free.replace(max_new_tokens=120, grammar=grammar_for_response_format(RESPONSE_FORMAT))
    reqs = [engine.submit(p, free) for p in prompts]
    reqs += [engine.submit(p, schema) for p in prompts]
    reqs += [engine.submit(prompts[0], free.replace(temperature=1.0, seed=s, grammar=YES_NO)) for s in range(3)]
    engine.run_until_idle()
    for req, ref in zip(reqs[:2], reference):
        assert req.output_ids + ([req.stop_token] if req.stop_token is not None else []) == ref
    for req in reqs[2:4]:
        assert req.finish_reason == "stop"
        check_schema(json.loads(tok.decode(req.output_ids)))
    assert all(r.finish_reason == "stop" and tok.decode(r.output_ids) in ("yes", "no") for r in reqs[4:])
