"""OpenAI's error JSON: the exception routes raise, and request bodies parsed into 400s naming the field."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from cookmind.infer.schemas import error_body


class APIError(Exception):
    """An error answered as ``{"error": {...}}`` with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)
        self.headers = headers  # e.g. a 429's Retry-After

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status, headers=self.headers)


def _validate(raw: bytes, schema: type[BaseModel]) -> BaseModel:
    try:
        json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from exc
    try:
        return schema.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        where = loc or "the request body"  # an empty location is the body itself (a list, say, not an object)
        raise APIError(400, f"{where}: {err['msg']} (got {err.get('input')!r:.100})", param=loc or None) from exc


async def parse_request(request: Request, schema: type[BaseModel]) -> BaseModel:
    """The body validated against ``schema``, in a worker thread (a large body must not stall other requests)."""
    return await asyncio.to_thread(_validate, await request.body(), schema)
