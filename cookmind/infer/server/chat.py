"""POST /v1/chat/completions: messages rendered through the tokenizer's chat template, answered whole or
streamed as chat.completion.chunk events; reasoning and tool calls split out of the text."""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from cookmind.infer.output import extract_tool_calls
from cookmind.infer.schemas import ChatCompletionRequest
from cookmind.infer.server.errors import APIError, parse_request
from cookmind.infer.server.generation import Generation, finish_reason, sse, stream_finish_reason
from cookmind.infer.server.state import ServerState, State

router = APIRouter()
TOOL_OPEN = "<tool_call>"


def _hold_tool_calls(text: str) -> tuple[str, str]:
    """Streaming with tools: (text to send now, text held until the end), holding everything from
    a <tool_call> tag (or a partial one at the end) so calls arrive whole in the final chunk."""
    cut = text.find(TOOL_OPEN)
    if cut >= 0:
        return text[:cut], text[cut:]
    for n in range(min(len(TOOL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_OPEN[:n]):
            return text[:-n], text[-n:]
    return text, ""


def _render(tokenizer, req: ChatCompletionRequest) -> list[int]:
    """Prompt ids through the chat template (content is data: the tokenizer never reads specials in it)."""
    messages = []
    for m in req.messages:
        d = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.reasoning_content is not None:
            d["reasoning_content"] = m.reasoning_content
        if m.tool_calls:
            d["tool_calls"] = m.tool_calls
        messages.append(d)
    return tokenizer.render(messages, add_generation_prompt=True, tools=req.tools)[0]


def _logprobs(entries) -> dict:
    return {
        "content": [
            {
                "token": e["token"],
                "logprob": e["logprob"],
                "bytes": list(e["token"].encode()),
                "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(s.encode())} for _, s, lp in e["top"]],
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
    try:  # off the event loop: a long conversation must not stall other requests
        prompt_ids = await asyncio.to_thread(_render, state.tokenizer, req)
    except (ValueError, TypeError, KeyError) as exc:
        raise APIError(400, f"messages cannot be rendered with the chat template: {exc}", param="messages") from exc
    gen = Generation(state)
    gen.submit(prompt_ids, req, req.logprobs, top)
    rid, now = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
    if req.stream:
        return StreamingResponse(
            _stream(state, req, gen, rid, now, len(prompt_ids)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    await gen.run_to_end(request)
    choices = []
    for i, p in enumerate(gen.procs):
        content, calls = extract_tool_calls(p.content) if req.tools else (p.content, [])
        msg = {"role": "assistant", "content": content if content or not calls else None}
        if p.reasoning_content:
            msg["reasoning_content"] = p.reasoning_content
        if calls:
            msg["tool_calls"] = calls
        choices.append(
            {
                "index": i,
                "message": msg,
                "logprobs": _logprobs(p.logprob_entries) if req.logprobs else None,
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


async def _stream(state: ServerState, req: ChatCompletionRequest, gen: Generation, rid: str, now: int, prompt_len: int):
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
            yield chunk(
                [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
            )
        held = ["" for _ in gen.procs]  # with tools, content from <tool_call> on waits for the end
        async for i, d in gen.events():
            content = d.content
            if req.tools:
                content, held[i] = _hold_tool_calls(held[i] + content)
            delta = {}
            if d.reasoning:
                delta["reasoning_content"] = d.reasoning
            if content:
                delta["content"] = content
            lp = _logprobs(d.logprobs) if (req.logprobs and d.logprobs) else None
            if delta or lp:
                yield chunk([{"index": i, "delta": delta, "logprobs": lp, "finish_reason": None}])
            if d.finish_reason is not None:
                calls = []
                if req.tools:
                    rest, calls = extract_tool_calls(held[i])
                    final_delta = {"content": rest} if rest else {}
                    if calls:
                        final_delta["tool_calls"] = [dict(c, index=k) for k, c in enumerate(calls)]
                    if final_delta:
                        yield chunk([{"index": i, "delta": final_delta, "logprobs": None, "finish_reason": None}])
                yield chunk(
                    [
                        {
                            "index": i,
                            "delta": {},
                            "logprobs": None,
                            "finish_reason": stream_finish_reason(gen.procs[i], calls),
                        }
                    ]
                )
        if req.stream_options and req.stream_options.include_usage:
            yield chunk([], gen.usage(prompt_len, req.n))
        yield "data: [DONE]\n\n"
    finally:  # also runs when the client disconnects and the response is cancelled
        gen.cancel()
