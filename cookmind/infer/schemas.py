"""Request schemas of the OpenAI-compatible API, validated strictly (a string is not a number).

Responses are plain dicts built in ``server.py`` in OpenAI's exact shapes; requests go through
these models so a wrong type or range becomes a 400 naming the field. A request field the server does not know is
a 400 naming it too, as OpenAI answers an unrecognized argument: a typo (``max_token``, a message's ``contnet``) or
another server's parameter (``guided_json``, sent through the openai package's ``extra_body``) would otherwise change
nothing and say nothing. Every field OpenAI defines is declared, in the objects inside a request too, and so are the
reply fields a client sends back in its history. The vendor fields implemented here (vLLM's ``top_k``, ``min_p``, ...)
are declared below.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, WrapValidator, field_validator, model_validator, with_config
from typing_extensions import TypedDict, is_typeddict  # pydantic reads typing's TypedDict from 3.12 only

# strict: "0.7" is not a float; extra="forbid": a field the server does not know is a 400 naming its path (errors.py),
# at any depth (a message's "contnet" would leave the message empty, stream_options' "include_usgae" send no usage)
_CHECKED = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)  # Python's JSON reads NaN, Infinity


class FieldError(ValueError):
    """A check across a request's fields that names the field at fault (``param``) in its message: answered as a 400
    of that message and param alone (``server.errors``), not as "the request body: ... (got {its first 100
    characters})"."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class _Strict(BaseModel):
    model_config = _CHECKED


def _as_sent(value, check):
    check(value)  # its fields are checked, and the object is kept as sent: a tool's JSON is rendered into the prompt
    return value


# Objects handed on as dicts (to the chat template, tool_calls.py, constraints.py), which check their values; the
# keys are OpenAI's (tests/test_server.py walks the openai package's types against them)
@with_config(_CHECKED)
class FunctionDefinition(TypedDict, total=False):
    name: Any
    description: Any
    parameters: Any
    strict: Any


@with_config(_CHECKED)
class Tool(TypedDict, total=False):
    type: Any
    function: FunctionDefinition
    custom: Any  # a custom tool, which check_tools refuses (its type is not "function")


@with_config(_CHECKED)
class FunctionName(TypedDict, total=False):
    name: Any


@with_config(_CHECKED)
class ToolChoiceObject(TypedDict, total=False):
    type: Any
    function: FunctionName
    custom: Any
    allowed_tools: Any


@with_config(_CHECKED)
class JSONSchemaFormat(TypedDict, total=False):
    name: Any
    description: Any
    schema: Any
    strict: Any


@with_config(_CHECKED)
class ResponseFormat(TypedDict, total=False):
    type: Any
    json_schema: JSONSchemaFormat


@with_config(_CHECKED)
class FunctionCall(TypedDict, total=False):
    name: Any
    arguments: Any
    parsed_arguments: Any  # a reply field: the openai package's parse() adds it


@with_config(_CHECKED)
class ToolCall(TypedDict, total=False):
    id: Any
    type: Any
    function: FunctionCall
    custom: Any
    index: Any  # a stream delta's field: a client that rebuilds the turn from the stream sends it back


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool = True  # OpenAI pads its stream events against side channels; this server does not


class ContentPart(_Strict):
    type: Literal["text", "refusal", "image_url", "input_audio", "file"]
    text: str | None = None
    refusal: str | None = None  # an assistant's refusal, sent back in its turn: what it said
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    prompt_cache_breakpoint: Any = None  # a caching hint: changes no output

    @model_validator(mode="after")
    def _text_only(self):
        if self.type not in ("text", "refusal"):
            raise ValueError(f"{self.type} content is not supported by this server, which reads text only; send text")
        if getattr(self, self.type) is None:
            raise ValueError(f"a {self.type!r} part needs its {self.type!r} string")
        return self


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    # reply fields: a client keeps the history by sending the reply's message back, with all of them
    refusal: str | None = None
    annotations: list[Any] | None = None
    parsed: Any = None  # the openai package's parse() adds it
    audio: dict[str, Any] | None = None  # a reply in audio, which this server never gives
    function_call: dict[str, Any] | None = None  # the call of the deprecated functions, which this server refuses

    @model_validator(mode="after")
    def _tool_result_names_its_call(self):
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id: the id of the assistant's tool call it answers")
        # the chat template shows these on their own role's turn only: elsewhere they were dropped without a word
        if self.role != "assistant":
            for field, what in (
                ("reasoning_content", "reasoning_content belongs"),
                ("tool_calls", "tool_calls belong"),
                ("refusal", "refusal belongs"),
            ):
                if getattr(self, field):
                    raise ValueError(
                        f"{what} to an assistant turn, and this is a {self.role} message, whose template shows no "
                        f"{field}: leave it out, or put it in the content"
                    )
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError(f"tool_call_id belongs to a tool result, and this is a {self.role} message: leave it out")
        if self.content is None and self.role != "assistant":  # an assistant turn may be tool calls or a refusal
            raise ValueError(f"a {self.role} message needs content (null would be an empty turn)")
        return self

    @field_validator("name")
    @classmethod
    def _no_participant_names(cls, v, info):
        # OpenAI shows a participant's name to the model; the chat template has no place for one, so it would be
        # dropped. A tool result's name is its function's, which tool_call_id already identifies.
        if v is not None and info.data.get("role") != "tool":
            raise ValueError(
                "participant names are not shown to the model by this server's chat template; leave name out, "
                "or put the name in the content"
            )
        return v

    @field_validator("audio", "function_call")
    @classmethod
    def _not_ours(cls, v, info):
        if v:
            use = "send tool_calls instead" if info.field_name == "function_call" else "leave it out"
            raise ValueError(f"{info.field_name} is not supported by this server; {use}")
        return v

    def text(self) -> str:
        """Content as text: its text parts (and refusals) joined; a refusal alone when there is no content."""
        if self.content is None:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "".join(getattr(part, part.type) for part in self.content)


class _SamplingFields(_Strict):
    model: str
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # 64-bit signed, as OpenAI's: none folded
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    user: str | None = None
    # extensions (vLLM names)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0, le=1)
    # a seen token's logit is divided (or multiplied) by it: outside [0.01, 100] the logits overflow or vanish
    repetition_penalty: float = Field(1.0, ge=0.01, le=100)
    # {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}: checked by constraints.py
    response_format: ResponseFormat | None = None
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

    @model_validator(mode="after")
    def _usage_in_a_stream(self):
        if self.stream_options is not None and not self.stream:
            raise FieldError(
                "stream_options", "stream_options needs stream=true; leave it out of a reply that is not streamed"
            )
        return self

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
    tools: list[Annotated[Tool, WrapValidator(_as_sent)]] | None = None  # checked by tool_calls.check_tools
    tool_choice: str | ToolChoiceObject | None = None
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

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, v, info):
        other = info.data.get("max_tokens")  # OpenAI: max_tokens is deprecated in favour of max_completion_tokens
        if v is not None and other is not None and other != v:
            raise ValueError(
                f"differs from max_tokens ({other}), its deprecated name: which limit was meant is unclear; send "
                "max_completion_tokens alone"
            )
        return v

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
        # an empty object turns a feature on with its defaults (OpenAI's web_search_options={}); null leaves it off
        if v or isinstance(v, dict):
            raise ValueError(f"{info.field_name} is not supported by this server; leave it out")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, v):
        if v and set(v) != {"text"}:
            raise ValueError('modalities other than "text" are not supported by this server; leave it out')
        return v

    @model_validator(mode="after")
    def _tool_results_answer_calls(self):
        # a tool result answers a call of the assistant turn it follows (other results between them): rendered
        # elsewhere, the model would read a result of a call it never made
        calls: set | None = None  # ids of the calls the results since the last assistant turn may answer
        for i, m in enumerate(self.messages):
            if m.role == "assistant":
                calls = {c.get("id") for c in m.tool_calls or []}
            elif m.role == "tool":
                if not calls or m.tool_call_id not in calls:
                    raise FieldError(
                        f"messages[{i}]",
                        f"messages[{i}] (a tool result for {m.tool_call_id!r}) answers no tool call of the assistant "
                        "turn right before it; put it after the assistant message whose tool_calls hold that id",
                    )
            else:
                calls = None
        return self

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


def object_types(annotation) -> list[type]:
    """The models and TypedDicts a field's annotation takes, through unions, lists and Annotated."""
    if is_typeddict(annotation) or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return [annotation]
    return [t for arg in get_args(annotation) for t in object_types(arg)]


def field_types(cls: type) -> dict[str, Any]:
    """A model's or TypedDict's fields: name -> annotation."""
    if is_typeddict(cls):
        return get_type_hints(cls)
    return {name: f.annotation for name, f in cls.model_fields.items()}
