"""Request schemas of the OpenAI-compatible API, validated strictly (a string is not a number).

Responses are plain dicts built in ``server.py`` in OpenAI's exact shapes; requests go through
these models so a wrong type or range becomes a 400 naming the field. A request field the server does not know is
a 400 naming it too, as OpenAI answers an unrecognized argument: a typo (``max_token``) or another server's
parameter (``guided_json``, sent through the openai package's ``extra_body``) would otherwise change nothing and
say nothing. The vendor fields implemented here (vLLM's ``top_k``, ``min_p``, ...) are declared below.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    # strict: "0.7" is not a float; extra="ignore" inside a request: a message dumped by a client carries OpenAI's
    # reply fields (refusal, annotations, audio: null) back, and the request's own fields are checked (extra="forbid")
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _tool_result_names_its_call(self):
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id: the id of the assistant's tool call it answers")
        return self

    def text(self) -> str:
        """Content as text; list content keeps its text parts (images are not supported)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"only text content parts are supported, got type {part.get('type')!r}")
            parts.append(part["text"])
        return "".join(parts)


class _SamplingFields(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid")  # an unknown field is a 400 naming it (errors.py)

    model: str
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    user: str | None = None
    # extensions (vLLM names)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    # {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}: checked by constraints.py
    response_format: dict[str, Any] | None = None
    # OpenAI fields that would change the answer and that we do not implement: refused when set, not ignored
    logit_bias: dict[str, Any] | None = None
    best_of: int | None = None
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None

    @field_validator("logit_bias", "functions", "function_call")
    @classmethod
    def _unsupported(cls, v, info):
        if v:
            use = "; send tools and tool_choice instead" if "function" in info.field_name else "; leave it out"
            raise ValueError(f"{info.field_name} is not supported by this server{use}")
        return v

    @field_validator("best_of")
    @classmethod
    def _one_candidate(cls, v):
        if v not in (None, 1):
            raise ValueError("best_of is not supported by this server; leave it out, or ask for n choices")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        if isinstance(v, list):
            if len(v) > 4:
                raise ValueError("at most 4 stop sequences are allowed")
            if any(s == "" for s in v):
                raise ValueError("stop sequences must be non-empty")
        if v == "":
            raise ValueError("stop sequences must be non-empty")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None  # checked by cookmind.infer.tool_calls.check_tools
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    # OpenAI's bookkeeping and speed hints: they change no output, so they are accepted and not used
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None  # our prefix cache keeps what memory allows, whatever is asked
    prompt_cache_options: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    # OpenAI fields that would change the answer and that we do not implement: refused when set, not ignored
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    # vLLM's name, which its clients send on chat requests too. A chat reply ends at its first control token and
    # holds none (cookmind.infer.stop.chat_stop_ids): true is what it does; false would show nothing, so it is refused
    skip_special_tokens: bool = True

    @field_validator("skip_special_tokens")
    @classmethod
    def _nothing_to_show(cls, v):
        if not v:
            raise ValueError(
                "false has nothing to show in a chat reply: it ends at the first control token and holds none; "
                "leave the field out, or use /v1/completions to see control tokens in the text"
            )
        return v

    @field_validator("audio", "reasoning_effort", "verbosity", "web_search_options", "moderation")
    @classmethod
    def _not_here(cls, v, info):
        if v:
            raise ValueError(f"{info.field_name} is not supported by this server; leave it out")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, v):
        if v and set(v) != {"text"}:
            raise ValueError('modalities other than "text" are not supported by this server; leave it out')
        return v

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # 0 with echo + logprobs scores the prompt alone
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    # vLLM's name: leave control tokens (<|im_start|>, <|endoftext|>, ...) out of the text; false shows them
    skip_special_tokens: bool = True

    @field_validator("suffix")
    @classmethod
    def _no_insertion(cls, v):
        if v:
            raise ValueError("suffix (text to insert before) is not supported by this server; leave it out")
        return v

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, list) and len(v) == 0:
            raise ValueError("prompt must not be empty")
        return v

    def max_new_tokens(self) -> int | None:
        return self.max_tokens


def error_body(
    message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    """OpenAI's error JSON."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
