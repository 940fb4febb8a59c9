"""OpenAI's error JSON: the exception routes raise, and request bodies parsed into 400s naming the field."""

from __future__ import annotations

import asyncio
import difflib
import re

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from cookmind import json_input
from cookmind.infer.schemas import FieldError, error_body, field_types, object_types


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
        json_input.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from exc
    try:
        return schema.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors()
        if errors[0]["type"] == "json_invalid":  # JSON to Python's parser, not to pydantic's: a lone surrogate escape
            why = errors[0]["msg"].removeprefix("Invalid JSON: ")
            if "escape" in why:  # pydantic's "unexpected end of hex escape" of a lone \ud800
                why += (
                    " (a \\uD800-\\uDFFF escape is half of a UTF-16 surrogate pair and needs its other half: a lone "
                    "one is no character; send whole characters)"
                )
            raise APIError(400, f"the request body is not valid JSON: {why}") from exc
        unknown = next((e["loc"] for e in errors if e["type"] == "extra_forbidden"), None)
        if unknown:  # its last part is the client's key, whatever it looks like ("Content" is no union's tag)
            field = (*_untagged(unknown[:-1]), unknown[-1])
            raise APIError(400, _unknown_field(field, schema), param=_path(field)) from exc
        # a check of ours (a validator of schemas.py), or an error inside a union's member, says the most
        err = min(errors, key=lambda e: (e["type"] != "value_error", not _inside(e["loc"])))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):  # a check across fields: its message names the field (the body's is noise)
            raise APIError(400, str(cause), param=cause.param) from exc
        told_where = err["type"] == "value_error" or _inside(err["loc"])
        field, tag = (_untagged(err["loc"]), None) if told_where else _field_of(err["loc"])
        loc = _path(field)
        where = loc or "the request body"  # an empty location is the body itself (a list, say, not an object)
        if tag is None:
            msg = err["ctx"]["error"] if err["type"] == "value_error" else err["msg"]
            raise APIError(400, f"{where}: {msg} (got {err.get('input')!r:.100})", param=loc or None) from exc
        # a field of several types (str | list[str]): pydantic names each type it tried as if it were a field
        # ("stop.str"); the client sent "stop", and needs the types it takes
        tried = [_field_of(e["loc"]) for e in errors]
        tags = dict.fromkeys(_VALIDATED.sub(r"\1", t) for f, t in tried if f == field and t is not None)
        types = [_TYPE_WORDS.get(t, "an object" if t[:1].isupper() else t) for t in tags]
        takes = types[0] if len(types) == 1 else f"{', '.join(types[:-1])} or {types[-1]}"
        value = next((e["input"] for f, e in zip(tried, errors) if f == (field, e["loc"][-1])), err.get("input"))
        raise APIError(400, f"{where}: takes {takes} (got {value!r:.100})", param=loc) from exc


def _inside(loc: tuple) -> bool:
    """Is this an error inside an object the client sent as a union's member (messages[0].content[1].type)? It
    says more than the types the union takes, and is told where it is."""
    field, tag = _field_of(loc)
    return tag is not None and any(isinstance(p, str) and not _is_tag(p) for p in loc[len(field) + 1 :])


_VALIDATED = re.compile(r"function-\w+\[\w+\(\), (\w+)\]")  # a model with a validator of its own, as tagged


def _unknown_field(loc: tuple, schema: type[BaseModel]) -> str:
    """A request field the schema does not declare: refused, never ignored, with the closest known name there."""
    *at, name = loc
    fields = field_types(schema)
    for part in at:
        if isinstance(part, str):  # a field (an index is an item of the list the field before it holds)
            fields = field_types(object_types(fields[part])[0])
    close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]!r}?" if close else "leave it out"
    return f"{_path(loc)}: not known to this server, which refuses a field rather than ignore it; {hint}"


def _path(loc: tuple) -> str:
    """A field's location as OpenAI writes it: messages[2].content."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).removeprefix(".")


# the types of a union as pydantic tags them, in a client's (JSON's) words
_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "list[str]": "an array of strings",
    "list[int]": "an array of token ids",
    "list[list[int]]": "an array of arrays of token ids",
    "list[ContentPart]": "an array of content parts",
    "dict[str,any]": "an object",
}


def _is_tag(part) -> bool:
    """Our fields are snake_case names and list indices; a tag is a type's name: "str", "list[int]", a class name."""
    return isinstance(part, str) and (part in _TYPE_WORDS or "[" in part or part[:1].isupper())


def _untagged(loc: tuple) -> tuple:
    return tuple(p for p in loc if not _is_tag(p))


def _field_of(loc: tuple) -> tuple[tuple, str | None]:
    """(the location up to the first union member pydantic tags in it, that tag or None)."""
    for i, part in enumerate(loc):
        if _is_tag(part):
            return tuple(loc[:i]), part
    return tuple(loc), None


async def parse_request(request: Request, schema: type[BaseModel]) -> BaseModel:
    """The body validated against ``schema``, in a worker thread (a large body must not stall other requests)."""
    return await asyncio.to_thread(_validate, await request.body(), schema)
