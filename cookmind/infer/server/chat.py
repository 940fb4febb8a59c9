"""POST /v1/chat/completions: messages rendered through the tokenizer's chat template, answered whole or
streamed as chat.completion.chunk events; reasoning and tool calls split out of the text.

Tools: tool_choice "auto" (the default with tools) shows the tools to the model and parses its calls; "none"
neither shows them nor parses (the model cannot call what it was not shown); "required" and a named function
also constrain decoding with a grammar of the template's tool-call blocks, so the reply is calls only: its content is
null, and a call cut by max_tokens (finish_reason "length") is left out, never sent as text or as a call.
parallel_tool_calls=false (and a named function) allows one call: a later block stays text. Streamed, each call is
sent whole as one tool_calls delta as soon as its closing tag is generated.

A reply ends at the first control token the model emits (``cookmind.infer.stop.chat_stop_ids``: <|im_start|> opening
a turn it made up, <|endoftext|>, ...), finish_reason "stop"; the reasoning and tool-call markers are the reply's
own syntax, not control tokens. So ``skip_special_tokens`` (vLLM's field) may be true, what a reply does anyway;
false, which could show nothing, is a 400 naming the field."""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from cookmind.infer.schemas import ChatCompletionRequest
from cookmind.infer.server.errors import APIError, parse_request
from cookmind.infer.server.generation import (
    Generation,
    compile_off_loop,
    finish_reason,
    response_grammar,
    sse,
    stream_error,
    stream_finish_reason,
)
from cookmind.infer.server.state import ServerState, State
from cookmind.infer.tool_calls import ToolChoice, ToolSpecError, check_enforceable, check_tools, tool_call_grammar

router = APIRouter()


def _render(tokenizer, req: ChatCompletionRequest, choice: ToolChoice) -> list[int]:
    """Prompt ids through the chat template (content is data: the tokenizer never reads specials in it)."""
    messages = []
    for m in req.messages:
        d = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.reasoning_content is not None:
            d["reasoning_content"] = m.reasoning_content
        if m.tool_calls:
            d["tool_calls"] = m.tool_calls
        messages.append(d)
    return tokenizer.render_prompt(messages, tools=req.tools if choice.parses else None)


def _tool_grammar(req: ChatCompletionRequest, choice: ToolChoice) -> str | None:
    """The grammar that enforces tool_choice "required" or a named function; None otherwise."""
    if not choice.enforced:
        return None
    try:
        check_enforceable(req.tools, choice)
    except ToolSpecError as exc:
        raise APIError(400, str(exc), param=exc.param) from exc
    return tool_call_grammar(req.tools, choice)


def _logprobs(entries, tokenizer) -> dict:
    """OpenAI's logprobs.content; "bytes" are each token's own bytes, so a client can join the pieces of a character
    split over tokens (the decoded text of such a piece is U+FFFD, whose bytes would be wrong)."""

    def raw(token_id: int) -> list[int]:
        return list(tokenizer.decode_bytes([token_id]))

    return {
        "content": [
            {
                "token": e["token"],
                "logprob": e["logprob"],
                "bytes": raw(e["id"]),
                "top_logprobs": [{"token": s, "logprob": lp, "bytes": raw(t)} for t, s, lp in e["top"]],
            }
            for e in entries
        ]
    }


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, state: State):
    req = await parse_request(request, ChatCompletionRequest)
    state.check_model(req.model)
    top = req.top_logprobs or 0
    if top and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    try:
        choice = check_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
    except ToolSpecError as exc:
        raise APIError(400, str(exc), param=exc.param) from exc
    tool_grammar = await asyncio.to_thread(_tool_grammar, req, choice)
    try:  # off the event loop: a long conversation must not stall other requests
        prompt_ids = await asyncio.to_thread(_render, state.tokenizer, req, choice)
    except (ValueError, TypeError, KeyError) as exc:
        raise APIError(400, f"messages cannot be rendered with the chat template: {exc}", param="messages") from exc
    grammar = await asyncio.to_thread(response_grammar, req)  # building a schema's grammar can take a while
    if grammar is not None and tool_grammar is not None:
        raise APIError(
            400,
            f"response_format {req.response_format.get('type')!r} cannot be combined with tool_choice "
            f"{req.tool_choice!r}: both constrain the whole reply; drop one",
            param="response_format",
        )
    grammar = grammar if tool_grammar is None else tool_grammar
    stops = state.chat_stop_ids
    await compile_off_loop(state, grammar, "response_format" if tool_grammar is None else "tool_choice", stops)
    gen = Generation(state)
    gen.submit(
        prompt_ids,
        req,
        req.logprobs,
        top,
        grammar=grammar,
        stop_ids=stops,
        parse_tool_calls=choice.parses,
        max_tool_calls=choice.max_calls,
        skip_ids=state.control_ids,
    )
    rid, now = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
    forced_call = choice.mode in ("required", "function")  # the grammar allows calls only: any text is a cut call
    if req.stream:
        return StreamingResponse(
            _stream(state, req, gen, rid, now, len(prompt_ids), forced_call=forced_call),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            # cancels what is left once the response is over, also where the client left before it began (the
            # stream's own clean-up then never ran); the stream's finally covers its errors
            background=BackgroundTask(gen.aclose),
        )
    await gen.run_to_end(request)
    choices = []
    for i, p in enumerate(gen.procs):
        content, calls = p.content, p.tool_calls
        msg = {"role": "assistant", "content": content if (content or not calls) and not forced_call else None}
        if p.reasoning_content:
            msg["reasoning_content"] = p.reasoning_content
        if calls:
            msg["tool_calls"] = calls
        choices.append(
            {
                "index": i,
                "message": msg,
                "logprobs": _logprobs(p.logprob_entries, state.tokenizer) if req.logprobs else None,
                "finish_reason": finish_reason(p, calls),
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": now,
        "model": req.model,
        "choices": choices,
        "usage": gen.usage(len(prompt_ids), req.n),
    }


async def _stream(
    state: ServerState,
    req: ChatCompletionRequest,
    gen: Generation,
    rid: str,
    now: int,
    prompt_len: int,
    forced_call: bool = False,
):
    # the first delta opens the message; a reply forced to be tool calls has no content at all (null, as OpenAI)
    opening = {"role": "assistant", "content": None if forced_call else ""}

    def chunk(choices, usage=None):
        body = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": now,
            "model": req.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return sse(body)

    try:
        for i in range(len(gen.procs)):
            yield chunk([{"index": i, "delta": dict(opening), "logprobs": None, "finish_reason": None}])
        sent_calls = [0 for _ in gen.procs]  # tool calls sent per choice: the next call's index
        async for i, d in gen.events():
            delta = {}
            if d.reasoning:
                delta["reasoning_content"] = d.reasoning
            if d.content and not forced_call:
                delta["content"] = d.content
            if d.tool_calls:
                delta["tool_calls"] = [dict(c, index=sent_calls[i] + k) for k, c in enumerate(d.tool_calls)]
                sent_calls[i] += len(d.tool_calls)
            lp = _logprobs(d.logprobs, state.tokenizer) if (req.logprobs and d.logprobs) else None
            if delta or lp:
                yield chunk([{"index": i, "delta": delta, "logprobs": lp, "finish_reason": None}])
            if d.finish_reason is not None:
                reason = stream_finish_reason(gen.procs[i], gen.procs[i].tool_calls)
                yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}])
                if error := stream_error(gen.procs[i]):  # why it failed: the client raises it
                    yield error
        if req.stream_options and req.stream_options.include_usage:
            yield chunk([], gen.usage(prompt_len, req.n))
        yield "data: [DONE]\n\n"
    finally:  # also runs when the client disconnects and the response is cancelled
        gen.cancel()
