"""create_app: the FastAPI app, its guard, error handlers and routers around one engine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from cookmind.infer.engine import Engine
from cookmind.infer.server import chat, completions, info
from cookmind.infer.server.errors import APIError
from cookmind.infer.server.security import DEFAULT_MAX_BODY_BYTES, HostPolicy, RequestGuard
from cookmind.infer.server.state import ServerState


class _CountResponses:
    """ASGI middleware counting requests, error answers and 429s for /metrics."""

    def __init__(self, app, stats: dict):
        self.app, self.stats = app, stats

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.stats["requests"] += 1

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status = message["status"]
                self.stats["errors"] += status >= 400
                self.stats["rejected_429"] += status == 429
            await send(message)

        await self.app(scope, receive, counting_send)


async def _api_error(_request, exc: APIError):
    return exc.response()


API_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")


async def _http_error(request, exc: StarletteHTTPException):
    """Starlette's own errors, saying what was asked and what is served: a bare "Not Found" left a client whose
    base_url lacks /v1 guessing, and "Method Not Allowed" named no method."""
    message, asked = str(exc.detail), f"{request.method} {request.url.path}"
    if exc.status_code == 404 and message == "Not Found":
        message = f"{asked}: no such path; the API is at {', '.join(API_PATHS)} (the web page at /, /health, /metrics)"
        if "/v1" + request.url.path in API_PATHS:
            message += f": did you mean /v1{request.url.path}? An OpenAI client's base_url ends in /v1"
    elif exc.status_code == 405 and message == "Method Not Allowed":
        allowed = (exc.headers or {}).get("Allow")
        message = f"{asked}: method not allowed" + (f"; this path takes {allowed}" if allowed else "")
    return APIError(exc.status_code, message, headers=exc.headers).response()


async def _validation_error(_request, exc: RequestValidationError):
    return APIError(400, str(exc)).response()


def create_app(
    engine: Engine,
    tokenizer,
    model_name: str,
    api_key: str | None = None,
    manage_engine: bool = True,
    *,
    allowed_hosts: Iterable[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """Build the FastAPI app. With manage_engine the engine thread starts and stops with the app.

    api_key: required as ``Authorization: Bearer KEY`` everywhere but the web page and /health.
    allowed_hosts: Host names served besides localhost and IP addresses (give the bind name; "*": any).
    max_body_bytes: larger request bodies are answered 413 unread.
    An engine built without a tokenizer gets this one (response_format grammars are matched against it).
    """

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if manage_engine:
            engine.start()
        try:
            yield
        finally:
            if manage_engine:
                engine.stop()

    if getattr(engine, "tokenizer", None) is None:
        engine.tokenizer = tokenizer
    app = FastAPI(title="cookmind", docs_url=None, redoc_url=None, lifespan=lifespan)
    state = ServerState(engine, tokenizer, model_name)
    app.state.server, app.state.model_name, app.state.engine = state, model_name, engine
    for router in (info.router, chat.router, completions.router):
        app.include_router(router)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    # added last = outermost: refused requests are counted too
    app.add_middleware(RequestGuard, api_key=api_key, hosts=HostPolicy(allowed_hosts), max_body_bytes=max_body_bytes)
    app.add_middleware(_CountResponses, stats=state.stats)
    return app
