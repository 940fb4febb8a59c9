"""create_app: the FastAPI app, its guard, error handlers and routers around one engine."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from urllib.parse import quote

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import RedirectResponse
from starlette.routing import Match

from cookmind.infer.engine import Engine
from cookmind.infer.server import chat, completions, info
from cookmind.infer.server.errors import APIError
from cookmind.infer.server.security import DEFAULT_MAX_BODY_BYTES, HostPolicy, RequestGuard, route_path
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


class _RootPath:
    """ASGI middleware serving the app under a root path (/llm) for a proxy that passes /llm/... as it came and for one
    that strips /llm: a path gets the prefix where it lacks it and the scope's root_path names it, so Starlette routes
    the rest. uvicorn's own root_path prepends it to every path, which only a stripping proxy survives (/llm/v1/models
    became /llm/llm/v1/models: 404). The bare /llm is the page itself: a redirect to /llm/ would name the Host the
    proxy sent upstream, not the one the browser asked."""

    def __init__(self, app, root_path: str):
        self.app, self.root, self.raw_root = app, root_path, root_path.encode("ascii")

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "root_path": self.root, "path": _under(self.root, scope["path"], "/")}
            if scope.get("raw_path") is not None:
                scope["raw_path"] = _under(self.raw_root, scope["raw_path"], b"/")
        await self.app(scope, receive, send)


def _under(root, path, slash):
    """``path`` under ``root``: as it is when it already is (the proxy kept the prefix), the prefix added when not
    (the proxy stripped it, or a client on this machine), the bare root as its page."""
    if path == root:
        return root + slash
    return path if path.startswith(root + slash) else root + path


def _relative_slash_redirect(router):
    """The router's answer to a path no route takes: where that path less its one trailing slash (or with one) is a
    route, a redirect there by a relative Location (/llm/metrics/ -> ../metrics), which the client resolves against
    the address it asked, so it stays under a proxy's prefix (Starlette's own redirect named the absolute URL that
    reached the server: the upstream's Host, without a stripping proxy's prefix); else the router's 404. Not for
    several trailing slashes: clients resolve ../ after an empty segment differently (browsers climb it, Python's
    urljoin and httpx drop it)."""

    async def default(scope, receive, send):
        path = scope["path"]
        if scope["type"] == "http" and route_path(scope) != "/" and not path.endswith("//"):
            other = path[:-1] if path.endswith("/") else path + "/"
            segment = quote(other.rstrip("/").rsplit("/", 1)[-1], safe="!$&'()*+,;=:@-._~")
            if segment and any(r.matches({**scope, "path": other})[0] is not Match.NONE for r in router.routes):
                where = f"../{segment}" if path.endswith("/") else f"./{segment}/"
                query = scope.get("query_string", b"").decode("latin-1")
                response = RedirectResponse(where + (f"?{query}" if query else ""))
                return await response(scope, receive, send)
        await router.not_found(scope, receive, send)

    return default


_SEGMENT = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@-]+")  # a URL path segment that needs no %-escape
ROUTE_ROOTS = ("v1", "health", "metrics", "openapi.json")  # the first segments of the app's own paths


def check_root_path(value: str) -> str:
    """A root path as the app keeps it ('/llm/' -> '/llm', '/' -> '': none); ValueError saying why for one that
    cannot work: not absolute, characters a URL sends %-escaped, or one starting like the app's own paths (/v1/models
    could then not be told from /v1 + /models)."""
    if not value.startswith("/"):
        raise ValueError(f"root path {value!r} must start with / (the prefix the proxy serves under, e.g. /llm)")
    root = value.rstrip("/")
    segments = root.split("/")[1:]
    if "" in segments:
        raise ValueError(f"root path {value!r} has an empty segment (//); give it as /a/b")
    if odd := next((s for s in segments if not _SEGMENT.fullmatch(s)), None):
        raise ValueError(
            f"root path {value!r}: {odd!r} may hold only letters, digits and -._~!$&'()*+,;=:@ (no %, ?, # or "
            "spaces: the path as a URL sends it)"
        )
    if segments and segments[0] in ROUTE_ROOTS:
        raise ValueError(
            f"root path {value!r} starts like the server's own /{segments[0]} paths, which it would hide; "
            "choose another prefix (e.g. /llm)"
        )
    return root


async def _api_error(_request, exc: APIError):
    return exc.response()


API_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")


async def _http_error(request, exc: StarletteHTTPException):
    """Starlette's own errors, saying what was asked and what is served: a bare "Not Found" left a client whose
    base_url lacks /v1 guessing, and "Method Not Allowed" named no method."""
    message, asked = str(exc.detail), f"{request.method} {request.url.path}"
    root, path = request.scope.get("root_path", ""), route_path(request.scope)  # the paths as the client names them
    if exc.status_code == 404 and message == "Not Found":
        served = ", ".join(root + p for p in API_PATHS)
        others = f"the web page at {root}/, {root}/health, {root}/metrics"
        message = f"{asked}: no such path; the API is at {served} ({others})"
        if "/v1" + path in API_PATHS:
            message += f": did you mean {root}/v1{path}? An OpenAI client's base_url ends in /v1"
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
    root_path: str = "",
) -> FastAPI:
    """Build the FastAPI app. With manage_engine the engine thread starts and stops with the app.

    api_key: required as ``Authorization: Bearer KEY`` everywhere but the web page and /health.
    allowed_hosts: Host names served besides localhost and IP addresses (give the bind name; "*": any).
    max_body_bytes: larger request bodies are answered 413 unread.
    root_path: the prefix a reverse proxy serves the app under (/llm), whether it passes it on or strips it.
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
    app.router.redirect_slashes, app.router.default = False, _relative_slash_redirect(app.router)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    # added last = outermost: refused requests are counted too
    app.add_middleware(RequestGuard, api_key=api_key, hosts=HostPolicy(allowed_hosts), max_body_bytes=max_body_bytes)
    app.add_middleware(_CountResponses, stats=state.stats)
    root_path = check_root_path(root_path) if root_path else ""
    if root_path:
        app.add_middleware(_RootPath, root_path=root_path)
    return app
