"""The guard in front of every route (pure ASGI, so client disconnects still reach the routes).

In order: the Host header must name this server (a web page that rebinds its own DNS name to
127.0.0.1 arrives with its own name: DNS rebinding); with an API key, every path but the web page
and /health needs ``Authorization: Bearer KEY``; a POST must say ``Content-Type: application/json``
(a cross-site form or ``text/plain`` POST needs no CORS preflight, a JSON one does and gets none);
a body over ``max_body_bytes`` is answered 413 without being read.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterable

from fastapi.responses import JSONResponse

from cookmind.infer.schemas import error_body

LOCAL_NAMES = ("localhost",)
OPEN_PATHS = ("/", "/health")  # the page asks for the key itself; load balancers probe /health
DEFAULT_MAX_BODY_BYTES = 4 * 2**20


def route_path(scope) -> str:
    """The path the app routes: the request's path less the scope's root_path (an ASGI path holds the root path:
    a Starlette Mount's, uvicorn's --root-path, the server's own)."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path


def host_name(host_header: str) -> str:
    """The name in a Host header without its port: 'a.b:80' -> 'a.b', '[::1]:80' -> '::1'."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    """Which Host headers are served: localhost, any IP literal (a page cannot rebind an address, only a name),
    and the names given (the bind address, --allowed-host). ``*`` allows every host."""

    def __init__(self, names: Iterable[str] = ()):
        self.names = {host_name(n) for n in names if n} | set(LOCAL_NAMES)
        self.any = "*" in self.names

    def allows(self, host_header: str | None) -> bool:
        if self.any:
            return True
        if not host_header:
            return False
        name = host_name(host_header)
        return name in self.names or _is_ip(name)


def _json_error(
    status: int,
    message: str,
    code: str | None = None,
    type_: str = "invalid_request_error",
    headers: dict | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, None, code), status_code=status, headers=headers)


class RequestGuard:
    """ASGI middleware enforcing the checks above before the app sees a request."""

    def __init__(
        self,
        app,
        api_key: str | None = None,
        hosts: HostPolicy | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.hosts = hosts or HostPolicy()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        rejection = self._reject(scope, headers)
        if rejection is not None:
            return await rejection(scope, receive, send)
        body, complete = await self._read_body(receive)
        if body is None:
            return await self._too_large()(scope, receive, send)
        if not complete:
            return  # the client left while sending
        return await self.app(scope, _replay(body, receive), send)

    def _reject(self, scope, headers: dict) -> JSONResponse | None:
        host = headers.get("host")
        if not self.hosts.allows(host):
            return _json_error(
                400,
                f"Host {host!r} is not served here (DNS-rebinding protection): open the server "
                f"by its address or localhost, or start it with --allowed-host NAME",
                code="host_not_allowed",
            )
        if self.api_key is not None and route_path(scope) not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            token = auth[7:].strip().encode() if auth[:7].lower() == "bearer " else b""
            if not secrets.compare_digest(token, self.api_key):
                return _json_error(
                    401,
                    "Incorrect or missing API key: send 'Authorization: Bearer KEY'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        if scope["method"] == "POST":
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                return _json_error(
                    415,
                    f"Content-Type must be application/json, got {media or 'none'!r}",
                    code="unsupported_media_type",
                )
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return self._too_large() if length.isdigit() else _json_error(400, f"bad Content-Length {length!r}")
        return None

    def _too_large(self) -> JSONResponse:
        return _json_error(
            413,
            f"the request body is over {self.max_body_bytes} bytes (the server's "
            f"--max-body-mb); send a smaller request",
            code="request_too_large",
        )

    async def _read_body(self, receive) -> tuple[bytes | None, bool]:
        """(body, complete); body None when it passed the limit (reading stops there)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks), False
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None, True
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), True


def _replay(body: bytes, receive):
    """A receive that hands the app the body already read, then the client's own messages (its disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
