"""Bounded load test on loopback: 64 concurrent streaming clients x 4 requests each.

No 5xx, no lost or interleaved tokens: under greedy decoding every stream must equal the same
request run alone (generate() through the model's own KV cache). Latency percentiles and
throughput are printed and saved to test-artifacts/ (reported, not asserted).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import openai
import pytest
from test_server import LiveServer, make_model, make_tokenizer

from cookmind.infer import SamplingParams, generate
from cookmind.infer.engine import Engine
from cookmind.infer.reasoning import split_reasoning
from cookmind.infer.server import create_app

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


CLIENTS, PER_CLIENT, MAX_TOKENS = 64, 4, 6
QUESTIONS = [
    "soup?",
    "What is hot?",
    "Who bakes the bread every morning?",
    "kitchen",
    "The cook stirs",
    "Is the bread fresh or is the soup hot?",
    "A",
    "morning smells",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory)


def test_64_concurrent_streaming_clients(tok):
    model = make_model(tok.vocab_size, max_pos=128)
    engine = Engine(model, num_slots=32, max_seq_len=128, max_waiting=256)
    server = LiveServer(create_app(engine, tok, "tiny", api_key=None))
    stops = (tok.eos_id, tok.im_end_id)
    expected = {}
    for q in QUESTIONS:
        ids = tok.render([{"role": "user", "content": q}], add_generation_prompt=True)[0]
        out = generate(model, [ids], SamplingParams(temperature=0, max_new_tokens=MAX_TOKENS, stop_token_ids=stops))[0]
        expected[q] = split_reasoning(tok.decode(out))[1]

    latencies, mismatches, errors = [], [], []

    async def client_task(c: int, client: openai.AsyncOpenAI):
        for k in range(PER_CLIENT):
            q = QUESTIONS[(c + k) % len(QUESTIONS)]
            t0 = time.perf_counter()
            try:
                stream = await client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": q}],
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                    stream=True,
                )
                text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
            except openai.APIError as exc:
                errors.append(repr(exc))
                continue
            latencies.append(time.perf_counter() - t0)
            if text != expected[q]:
                mismatches.append((q, text, expected[q]))

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120) as cl:
            t0 = time.perf_counter()
            await asyncio.gather(*(client_task(c, cl) for c in range(CLIENTS)))
            return time.perf_counter() - t0

    try:
        wall = asyncio.run(main())
    finally:
        server.close()
    assert errors == []
    assert mismatches == []
    assert len(latencies) == CLIENTS * PER_CLIENT
    lat = sorted(latencies)
    report = {
        "clients": CLIENTS,
        "requests": len(lat),
        "p50_s": round(statistics.median(lat), 4),
        "p99_s": round(lat[int(0.99 * (len(lat) - 1))], 4),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(lat) / wall, 2),
        "tokens_per_s": round(engine.tokens_generated / wall, 1),
    }
    print(json.dumps(report))
    out = Path("test-artifacts")
    out.mkdir(exist_ok=True)
    (out / "server_load.json").write_text(json.dumps(report) + "\n")
