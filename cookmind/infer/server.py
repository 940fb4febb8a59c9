"""The OpenAI-compatible HTTP server: FastAPI in front of the continuous-batching engine.

Routes: POST /v1/chat/completions, POST /v1/completions (both streaming as SSE in OpenAI's
chunk format, or not), GET /v1/models, GET /health, GET /metrics (Prometheus text), and the
web chat page at /. Errors use OpenAI's error JSON. The engine runs in its own thread; each
request's events cross into the event loop through an asyncio queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from cookmind.infer.engine import Engine, QueueFullError
from cookmind.infer.output import OutputProcessor, extract_tool_calls
from cookmind.infer.sampling import SamplingParams
from cookmind.infer.schemas import ChatCompletionRequest, CompletionRequest, error_body


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)


def _error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body, status_code=exc.status)


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


def create_app(engine: Engine, tokenizer, model_name: str, api_key: str | None = None,
               manage_engine: bool = True) -> FastAPI:
    """Build the FastAPI app. With manage_engine the engine thread starts and stops with the app."""
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if manage_engine:
            engine.start()
        try:
            yield
        finally:
            if manage_engine:
                engine.stop()

    app = FastAPI(title="cookmind", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.model_name, app.state.engine = model_name, engine
    stop_ids = sorted({t for t in (getattr(tokenizer, "eos_id", None), getattr(tokenizer, "im_end_id", None))
                       if t is not None})
    created = int(time.time())
    stats = {"requests": 0, "errors": 0, "rejected_429": 0, "started": time.time()}

    @app.middleware("http")
    async def _auth_and_count(request: Request, call_next):
        stats["requests"] += 1
        if api_key and request.url.path.startswith("/v1/"):
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(token.encode(), api_key.encode()):
                stats["errors"] += 1
                return _error_response(APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'",
                                                "invalid_request_error", code="invalid_api_key"))
        response = await call_next(request)
        if response.status_code >= 400:
            stats["errors"] += 1
        return response

    @app.exception_handler(APIError)
    async def _api_error(_request, exc: APIError):
        if exc.status == 429:
            stats["rejected_429"] += 1
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request, exc: StarletteHTTPException):
        return _error_response(APIError(exc.status_code, str(exc.detail), code=None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request, exc: RequestValidationError):
        return _error_response(APIError(400, str(exc)))

    async def _parse(request: Request, schema):
        raw = await request.body()
        try:
            json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON: {exc}") from exc
        try:
            return schema.model_validate_json(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise APIError(400, f"{loc}: {err['msg']} (got {err.get('input')!r:.100})", param=loc or None) from exc

    def _check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"The model '{name}' does not exist; this server serves '{model_name}'",
                           param="model", code="model_not_found")

    def _max_new(req, prompt_len: int) -> int:
        room = engine.max_seq_len - prompt_len
        wanted = req.max_new_tokens()
        if room < 1 or (wanted is not None and wanted > room):
            raise APIError(400, f"This model's maximum context length is {engine.max_seq_len} tokens. However, you "
                                f"requested {prompt_len + (wanted or 0)} tokens ({prompt_len} in the prompt, "
                                f"{wanted or 0} for the completion). Reduce the prompt or max_tokens.",
                           param="max_tokens" if wanted else "messages", code="context_length_exceeded")
        return wanted if wanted is not None else room

    def _params(req, i: int, logprobs: bool, top: int) -> SamplingParams:
        return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                              repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
                              frequency_penalty=req.frequency_penalty,
                              seed=None if req.seed is None else req.seed + i, logprobs=logprobs, top_logprobs=top)

    def _submit(prompt_ids, req, n, logprobs, top, queue_, loop, first: int = 0, prompt_logprobs=None, handles=None):
        """Submit n engine requests (choices first..first+n-1); all or none (a full queue cancels the
        ones already in, including those in ``handles`` from earlier prompts of the same call)."""
        max_new = _max_new(req, len(prompt_ids))
        handles = [] if handles is None else handles
        try:
            for j in range(n):
                i = first + j
                sink = (lambda ev, i=i: loop.call_soon_threadsafe(queue_.put_nowait, (i, ev)))
                handles.append(engine.submit(prompt_ids, _params(req, j, logprobs, top), max_new, stop_ids, sink,
                                             prompt_logprobs=prompt_logprobs))
        except QueueFullError as exc:
            for h in handles:
                engine.cancel(h)
            raise APIError(429, str(exc), "rate_limit_error", code="rate_limit_exceeded") from exc
        except ValueError as exc:
            for h in handles:
                engine.cancel(h)
            raise APIError(400, str(exc)) from exc
        return handles

    async def _events(queue_, procs, handles, request: Request | None):
        """Yield (choice index, Delta) until every choice has finished; cancel on stop strings."""
        remaining = len(procs)
        last_check = time.monotonic()
        while remaining:
            if request is not None and time.monotonic() - last_check > 0.5:
                last_check = time.monotonic()  # a non-streaming client may leave while tokens still flow
                if await request.is_disconnected():
                    raise asyncio.CancelledError("client disconnected")
            try:
                i, ev = await asyncio.wait_for(queue_.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            if procs[i].finish_reason is not None:
                continue  # events after a stop string, or the engine's own finish of a cancelled request
            delta = procs[i].feed(ev)
            if procs[i].stopped_by_string:
                engine.cancel(handles[i])
            if delta.finish_reason is not None:
                remaining -= 1
            yield i, delta

    async def _drain(queue_, procs, handles, request: Request) -> None:
        """Feed every event of a non-streamed request to its processors; however that ends (done, a client
        that left, an error), none of its generations runs on."""
        try:
            async for _ in _events(queue_, procs, handles, request):
                pass
        finally:
            for h in handles:
                engine.cancel(h)

    def _usage(prompt_len: int, procs, handles, n: int) -> dict:
        completion = sum(p.completion_tokens for p in procs)
        usage = {"prompt_tokens": prompt_len, "completion_tokens": completion, "total_tokens": prompt_len + completion}
        if getattr(engine, "prefix", None) is not None:  # prompt tokens read from the prefix cache, as OpenAI
            # reports them; a prompt is counted once, like prompt_tokens (the first of its n choices)
            usage["prompt_tokens_details"] = {"cached_tokens": sum(h.cached_tokens for h in handles[::n])}
        return usage

    def _chat_logprobs(entries):
        return {"content": [{"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode()),
                             "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(s.encode())}
                                              for _, s, lp in e["top"]]} for e in entries]}

    def _completion_logprobs(entries, offset0: int):
        offsets, pos = [], offset0
        for e in entries:
            offsets.append(pos)
            pos += len(e["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [None if e["top"] is None else {s: lp for _, s, lp in e["top"]} for e in entries],
                "text_offset": offsets}

    def _finish_reason(proc, tool_calls) -> str:
        if proc.finish_reason == "error":
            raise APIError(500, "generation failed", "server_error")
        if tool_calls:
            return "tool_calls"
        return "length" if proc.finish_reason == "length" else "stop"

    # ---- routes -----------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(resources.files("cookmind.infer").joinpath("static/index.html").read_text())

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        m = engine.metrics()
        lines = [f"cookmind_{k} {v}" for k, v in m.items()]
        lines += [f"cookmind_http_{k} {v}" for k, v in stats.items() if k != "started"]
        lines.append(f"cookmind_uptime_seconds {time.time() - stats['started']:.1f}")
        return "\n".join(lines) + "\n"

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "cookmind"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await _parse(request, ChatCompletionRequest)
        _check_model(req.model)
        try:
            messages = []
            for m in req.messages:
                d = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                if m.reasoning_content is not None:
                    d["reasoning_content"] = m.reasoning_content
                if m.tool_calls:
                    d["tool_calls"] = m.tool_calls
                messages.append(d)
            prompt_ids = tokenizer.render(messages, add_generation_prompt=True, tools=req.tools)[0]
        except (ValueError, TypeError, KeyError) as exc:
            raise APIError(400, f"messages cannot be rendered with the chat template: {exc}", param="messages") from exc
        top = req.top_logprobs or 0
        if top and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        loop = asyncio.get_running_loop()
        queue_: asyncio.Queue = asyncio.Queue()
        handles = _submit(prompt_ids, req, req.n, req.logprobs, top, queue_, loop)
        procs = [OutputProcessor(tokenizer, req.stop_list()) for _ in range(req.n)]
        rid, now = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
        if req.stream:
            return StreamingResponse(_chat_stream(req, rid, now, queue_, procs, handles, len(prompt_ids), request),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        await _drain(queue_, procs, handles, request)
        choices = []
        for i, p in enumerate(procs):
            content, calls = extract_tool_calls(p.content) if req.tools else (p.content, [])
            msg = {"role": "assistant", "content": content if content or not calls else None}
            if p.reasoning_content:
                msg["reasoning_content"] = p.reasoning_content
            if calls:
                msg["tool_calls"] = calls
            choices.append({"index": i, "message": msg, "logprobs": _chat_logprobs(p.logprob_entries) if req.logprobs
                            else None, "finish_reason": _finish_reason(p, calls)})
        return {"id": rid, "object": "chat.completion", "created": now, "model": model_name, "choices": choices,
                "usage": _usage(len(prompt_ids), procs, handles, req.n)}

    async def _chat_stream(req, rid, now, queue_, procs, handles, prompt_len, request):
        def chunk(choices, usage=None):
            body = {"id": rid, "object": "chat.completion.chunk", "created": now, "model": model_name,
                    "choices": choices}
            if usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n"

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        try:
            for i in range(len(procs)):
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
            held = ["" for _ in procs]  # with tools, content from <tool_call> on waits for the end
            async for i, d in _events(queue_, procs, handles, None):
                content = d.content
                if req.tools:
                    content, held[i] = _hold_tool_calls(held[i] + content)
                delta = {}
                if d.reasoning:
                    delta["reasoning_content"] = d.reasoning
                if content:
                    delta["content"] = content
                lp = _chat_logprobs(d.logprobs) if (req.logprobs and d.logprobs) else None
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
                    reason = "error" if procs[i].finish_reason == "error" else _finish_reason(procs[i], calls)
                    yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}])
            if include_usage:
                yield chunk([], _usage(prompt_len, procs, handles, req.n))
            yield "data: [DONE]\n\n"
        finally:  # also runs when the client disconnects and the response is cancelled
            for h in handles:
                engine.cancel(h)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest)
        _check_model(req.model)
        prompt = req.prompt  # one string / token list, or a list of them: one group of n choices each
        batch = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)) else [prompt]
        prompts = []
        for k, p in enumerate(batch):
            ids = list(p) if isinstance(p, list) else tokenizer.encode(p)
            if not ids:
                raise APIError(400, f"prompt {k} is empty", param="prompt")
            _max_new(req, len(ids))  # every prompt fits before any is submitted
            prompts.append((ids, p if isinstance(p, str) else tokenizer.decode(ids)))
        top = req.logprobs or 0
        # echo with logprobs scores the prompt too (first token None), as OpenAI does
        prompt_lp = top if (req.echo and req.logprobs is not None) else None
        loop = asyncio.get_running_loop()
        queue_: asyncio.Queue = asyncio.Queue()
        handles, procs, echoes = [], [], []
        for k, (ids, text) in enumerate(prompts):  # choice index = prompt index * n + j, OpenAI's order
            _submit(ids, req, req.n, req.logprobs is not None, top, queue_, loop, first=k * req.n,
                    prompt_logprobs=prompt_lp, handles=handles)
            procs += [OutputProcessor(tokenizer, req.stop_list(), split_reasoning=False, prompt_ids=ids)
                      for _ in range(req.n)]
            echoes += [text if req.echo else ""] * req.n
        prompt_tokens = sum(len(ids) for ids, _ in prompts)
        rid, now = "cmpl-" + uuid.uuid4().hex, int(time.time())
        if req.stream:
            return StreamingResponse(_completion_stream(req, rid, now, queue_, procs, handles, prompt_tokens, echoes),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        await _drain(queue_, procs, handles, request)
        choices = []
        for i, p in enumerate(procs):
            lp = None
            if req.logprobs is not None:
                entries = (p.prompt_logprob_entries or []) + p.logprob_entries if req.echo else p.logprob_entries
                lp = _completion_logprobs(entries, 0 if req.echo else len(echoes[i]))
            choices.append({"index": i, "text": echoes[i] + p.content, "logprobs": lp,
                            "finish_reason": _finish_reason(p, [])})
        return {"id": rid, "object": "text_completion", "created": now, "model": model_name, "choices": choices,
                "usage": _usage(prompt_tokens, procs, handles, req.n)}

    async def _completion_stream(req, rid, now, queue_, procs, handles, prompt_len, echoes):
        def chunk(choices, usage=None):
            body = {"id": rid, "object": "text_completion", "created": now, "model": model_name, "choices": choices}
            if usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n"

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        offsets = [len(e) for e in echoes]
        scored = req.echo and req.logprobs is not None  # the echo goes out with its logprobs, after prefill
        try:
            if req.echo and not scored:
                for i, echo in enumerate(echoes):
                    yield chunk([{"index": i, "text": echo, "logprobs": None, "finish_reason": None}])
            async for i, d in _events(queue_, procs, handles, None):
                if d.prompt_logprobs is not None:
                    yield chunk([{"index": i, "text": echoes[i], "finish_reason": None,
                                  "logprobs": _completion_logprobs(d.prompt_logprobs, 0)}])
                    continue
                lp = None
                if req.logprobs is not None and d.logprobs:
                    lp = _completion_logprobs(d.logprobs, offsets[i])
                    offsets[i] += sum(len(e["token"]) for e in d.logprobs)
                if d.content or lp:
                    yield chunk([{"index": i, "text": d.content, "logprobs": lp, "finish_reason": None}])
                if d.finish_reason is not None:
                    reason = "error" if procs[i].finish_reason == "error" else _finish_reason(procs[i], [])
                    yield chunk([{"index": i, "text": "", "logprobs": None, "finish_reason": reason}])
            if include_usage:
                yield chunk([], _usage(prompt_len, procs, handles, req.n))
            yield "data: [DONE]\n\n"
        finally:
            for h in handles:
                engine.cancel(h)

    return app
