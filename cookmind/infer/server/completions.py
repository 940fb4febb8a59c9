"""POST /v1/completions: a text or token-id prompt (or a list of them, n choices each) continued as plain
text, answered whole or streamed as text_completion events; echo and prompt logprobs as OpenAI does them.

Control tokens (``cookmind.infer.stop.control_token_ids``) are left out of the text unless the request says
``skip_special_tokens: false`` (vLLM's field); they still count in usage and have their logprobs entries."""

from __future__ import annotations

import asyncio
import codecs
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from cookmind.infer.detokenize import decode_text
from cookmind.infer.schemas import CompletionRequest
from cookmind.infer.server.errors import APIError, parse_request
from cookmind.infer.server.generation import (
    Generation,
    compile_off_loop,
    finish_reason,
    max_new_tokens,
    response_grammar,
    sse,
    stream_error,
    stream_finish_reason,
)
from cookmind.infer.server.state import ServerState, State
from cookmind.infer.stop import spelled_stop_ids
from cookmind.tokenizer.documents import prompt_ids

router = APIRouter()


def _prompts(state: ServerState, req: CompletionRequest, skip_ids) -> list[tuple[list[int], str]]:
    """(ids, text) of every prompt, each checked to fit before any is submitted. Text is encoded as plain
    text (no special tokens from it) opening a document (``prompt_ids``: Llama's <s> first); token ids are taken
    as given and must lie in the vocabulary, their text leaves out ``skip_ids``."""
    prompt = req.prompt
    batch = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)) else [prompt]
    tok, vocab = state.tokenizer, state.vocab_size
    prompts = []
    for k, p in enumerate(batch):
        where = "prompt" if len(batch) == 1 else f"prompt[{k}]"
        if isinstance(p, str):
            ids = prompt_ids(tok, p)  # a document's start first (Llama's <s>), as transformers and vLLM encode it
        else:
            ids = list(p)
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise APIError(
                    400, f"{where}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="prompt"
                )
        if not ids:
            raise APIError(400, f"{where} is empty", param="prompt")
        max_new_tokens(state, req, len(ids))
        prompts.append((ids, p if isinstance(p, str) else decode_text(tok, ids, skip_ids)))
    return prompts


class _TextOffsets:
    """OpenAI's ``text_offset``: where in a choice's text each token's text begins, in characters. Counted on the
    tokens' bytes as the text is decoded, an unfinished character held until its last byte comes: a token's offset
    is where the text it brings begins (the characters of the tokens before it that are whole). Each token's own
    decoded text counted a character split over byte tokens once per token ("é" as 2, an emoji as 4), and every
    later offset pointed past its token. A left-out control token brings no text."""

    def __init__(self, tokenizer, start: int = 0):
        self.tokenizer, self.chars = tokenizer, start
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # bad bytes as U+FFFD, as the text has them

    def take(self, entries) -> list[int]:
        offsets = []
        for e in entries:
            offsets.append(self.chars)
            if e["in_text"]:
                self.chars += len(self._utf8.decode(self.tokenizer.decode_bytes([e["id"]])))
        return offsets


def _top_by_text(top, token: str, logprob: float) -> dict[str, float]:
    """OpenAI's top_logprobs dict, keyed by a token's text: where tokens share a text (byte tokens that hold part of
    a character all read U+FFFD) the likeliest one's logprob, the first (``top`` is likeliest first). The last one
    overwrote it, so the chosen token's own text could show less than it was chosen with. The chosen token (text
    ``token``) is always there, as OpenAI's "up to logprobs+1 elements": one sampled outside the top was missing."""
    out: dict[str, float] = {}
    for _, text, lp in top:
        out.setdefault(text, lp)
    out.setdefault(token, logprob)
    return out


def _logprobs(entries, offsets: _TextOffsets) -> dict:
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [
            None if e["top"] is None else _top_by_text(e["top"], e["token"], e["logprob"]) for e in entries
        ],
        "text_offset": offsets.take(entries),
    }


@router.post("/v1/completions")
async def completions(request: Request, state: State):
    req = await parse_request(request, CompletionRequest)
    state.check_model(req.model)
    skip = state.control_ids if req.skip_special_tokens else frozenset()
    prompts = await asyncio.to_thread(_prompts, state, req, skip)  # tokenizing off the event loop
    top = req.logprobs or 0
    prompt_lp = top if (req.echo and req.logprobs is not None) else None  # echo + logprobs scores the prompt
    grammar = await asyncio.to_thread(response_grammar, req)  # building a schema's grammar can take a while
    # a stop string that spells a control token stops at that token (its text is not shown to be matched)
    stops = sorted({*state.stop_ids, *spelled_stop_ids(state.tokenizer, req.stop_list())})
    await compile_off_loop(state, grammar, "response_format", stops)  # and so can compiling it
    gen, echoes = Generation(state), []
    for ids, text in prompts:
        gen.submit(
            ids,
            req,
            req.logprobs is not None,
            top,
            prompt_logprobs=prompt_lp,
            grammar=grammar,
            stop_ids=stops,
            split_reasoning=False,
            prompt_ids=ids,
            skip_ids=skip,
        )
        echoes += [text if req.echo else ""] * req.n
    prompt_tokens = sum(len(ids) for ids, _ in prompts)
    rid, now = "cmpl-" + uuid.uuid4().hex, int(time.time())
    if req.stream:
        return StreamingResponse(
            _stream(state, req, gen, rid, now, prompt_tokens, echoes),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            # cancels what is left once the response is over, also where the client left before it began (the
            # stream's own clean-up then never ran); the stream's finally covers its errors
            background=BackgroundTask(gen.aclose),
        )
    await gen.run_to_end(request)
    choices = []
    for i, p in enumerate(gen.procs):
        lp = None
        if req.logprobs is not None:
            entries = (p.prompt_logprob_entries or []) + p.logprob_entries if req.echo else p.logprob_entries
            lp = _logprobs(entries, _TextOffsets(state.tokenizer, 0 if req.echo else len(echoes[i])))
        choices.append({"index": i, "text": echoes[i] + p.content, "logprobs": lp, "finish_reason": finish_reason(p)})
    return {
        "id": rid,
        "object": "text_completion",
        "created": now,
        "model": req.model,
        "choices": choices,
        "usage": gen.usage(prompt_tokens, req.n),
    }


async def _stream(
    state: ServerState, req: CompletionRequest, gen: Generation, rid: str, now: int, prompt_len: int, echoes: list[str]
):
    def chunk(choices, usage=None):
        body = {"id": rid, "object": "text_completion", "created": now, "model": req.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return sse(body)

    scored = req.echo and req.logprobs is not None  # the echo goes out with its logprobs, after prefill
    # each choice's, across its chunks: a scored echo's tokens count from 0 into the completion's
    offsets = [_TextOffsets(state.tokenizer, 0 if scored else len(e)) for e in echoes]
    try:
        if req.echo and not scored:
            for i, echo in enumerate(echoes):
                yield chunk([{"index": i, "text": echo, "logprobs": None, "finish_reason": None}])
        async for i, d in gen.events():
            if d.prompt_logprobs is not None:
                yield chunk(
                    [
                        {
                            "index": i,
                            "text": echoes[i],
                            "finish_reason": None,
                            "logprobs": _logprobs(d.prompt_logprobs, offsets[i]),
                        }
                    ]
                )
                continue
            lp = None
            if req.logprobs is not None and d.logprobs:
                lp = _logprobs(d.logprobs, offsets[i])
            if d.content or lp:
                yield chunk([{"index": i, "text": d.content, "logprobs": lp, "finish_reason": None}])
            if d.finish_reason is not None:
                yield chunk(
                    [{"index": i, "text": "", "logprobs": None, "finish_reason": stream_finish_reason(gen.procs[i])}]
                )
                if error := stream_error(gen.procs[i]):  # why it failed: the client raises it
                    yield error
        if req.stream_options and req.stream_options.include_usage:
            yield chunk([], gen.usage(prompt_len, req.n))
        yield "data: [DONE]\n\n"
    finally:  # also runs when the client disconnects and the response is cancelled
        gen.cancel()
