"""Tool calls as OpenAI's API has them, in the chat template's format.

The model calls a function by writing, exactly as the chat template renders an assistant's tool call,

    <tool_call>\\n{"name": "<function>", "arguments": <JSON object>}\\n</tool_call>

(several calls are separated by a newline). This module checks a request's ``tools`` / ``tool_choice``,
parses calls out of generated text (whole, or incrementally while streaming: a call is sent as soon as its
closing tag arrives, the text before it streams as it comes), and builds the llguidance Lark grammar that
``tool_choice="required"`` or a named function sets as ``SamplingParams.grammar``.

A block that does not parse (not JSON, no string ``name``) stays in the content as text, as does a block cut
off by max_tokens; the whitespace the template puts around calls is not content.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from dataclasses import dataclass

from cookmind import json_input

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
CALL_PREFIX = '<tool_call>\n{"name": "'  # then the name, CALL_MIDDLE, the arguments, CALL_SUFFIX
CALL_MIDDLE = '", "arguments": '
CALL_SUFFIX = "}\n</tool_call>"
CALL_SEPARATOR = "\n"
FUNCTION_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names
# JSON written the way json.dumps writes it (the template's arguments): no free whitespace to wander in
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MODES = ("none", "auto", "required")
GRAMMAR_LISTING = re.compile(r"\s+\d+ \|")  # where llguidance's error starts quoting the grammar


class ToolSpecError(ValueError):
    """A request's tools or tool_choice is malformed; ``param`` names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolChoice:
    """A checked tool_choice: mode "none", "auto", "required" or "function" (then ``name`` is the function);
    ``parallel`` False (OpenAI's parallel_tool_calls) allows at most one call."""

    mode: str
    name: str | None = None
    parallel: bool = True

    @property
    def max_calls(self) -> int | None:
        """How many calls are parsed out of the output (None: any number)."""
        return None if self.parallel and self.mode != "function" else 1

    @property
    def parses(self) -> bool:
        """Are calls parsed out of the output (and the tools shown to the model)?"""
        return self.mode != "none"

    @property
    def enforced(self) -> bool:
        """Is the output constrained to tool calls by a grammar?"""
        return self.mode in ("required", "function")


def _check_tool(i: int, tool) -> str:
    where = f"tools[{i}]"
    if isinstance(tool, dict) and tool.get("type") == "custom":  # OpenAI's free-form-text tools: named, not generic
        raise ToolSpecError(
            f'{where}.type "custom" (a tool called with free-form text) is not served: this server calls "function" '
            f"tools, whose arguments are JSON for a schema in function.parameters; describe it as a function",
            f"{where}.type",
        )
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ToolSpecError(f'{where}.type must be "function", got {tool!r:.100}', f"{where}.type")
    f = tool.get("function")
    if not isinstance(f, dict):
        raise ToolSpecError(f"{where}.function must be an object with a name, got {f!r:.100}", f"{where}.function")
    name = f.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME_RE.fullmatch(name):
        raise ToolSpecError(
            f"{where}.function.name must be 1-64 letters, digits, _ or -, got {name!r:.100}", f"{where}.function.name"
        )
    if "description" in f and not isinstance(f["description"], str):
        raise ToolSpecError(f"{where}.function.description must be a string", f"{where}.function.description")
    if "parameters" in f:
        params = f["parameters"]
        if not isinstance(params, dict) or params.get("type") != "object":
            raise ToolSpecError(
                f'{where}.function.parameters must be a JSON Schema with "type": "object" (leave it out for no '
                f"arguments), got {params!r:.100}",
                f"{where}.function.parameters.type",
            )
        import jsonschema  # here, not at the top: the engine imports this module's markers, and needs no schemas

        try:
            jsonschema.validators.validator_for(params).check_schema(params)
        except jsonschema.SchemaError as exc:
            raise ToolSpecError(
                f"{where}.function.parameters is not a valid JSON Schema: {exc.message}", f"{where}.function.parameters"
            ) from exc
    return name


def check_tools(tools: list | None, tool_choice: str | dict | None, parallel: bool = True) -> ToolChoice:
    """Validate a request's tools and tool_choice (raising ToolSpecError naming the field); the checked choice.

    tool_choice defaults to "auto" with tools and "none" without; "none" is also accepted without tools.
    ``parallel`` is the request's parallel_tool_calls.
    """
    if tools is not None:
        if not tools:
            raise ToolSpecError("tools must not be empty (leave it out for no tools)", "tools")
        names = [_check_tool(i, t) for i, t in enumerate(tools)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ToolSpecError(f"tools name the function {dupes[0]!r} more than once", "tools")
    if tool_choice is None:
        return ToolChoice("auto" if tools else "none", parallel=parallel)
    if isinstance(tool_choice, str):
        if tool_choice not in MODES:
            raise ToolSpecError(
                f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": {{"name": ...}}}}'
                f", got {tool_choice!r:.100}",
                "tool_choice",
            )
        choice = ToolChoice(tool_choice, parallel=parallel)
    else:
        f = tool_choice.get("function") if tool_choice.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ToolSpecError(
                f'tool_choice must be {{"type": "function", "function": {{"name": ...}}}}, got {tool_choice!r:.100}',
                "tool_choice",
            )
        choice = ToolChoice("function", f["name"], parallel)
    if choice.mode != "none" and not tools:
        raise ToolSpecError(f"tool_choice {tool_choice!r:.100} needs tools; give tools or leave it out", "tool_choice")
    if choice.mode == "function" and choice.name not in names:
        raise ToolSpecError(
            f"tool_choice names the function {choice.name!r:.100}, which is not in tools ({', '.join(names)})",
            "tool_choice.function.name",
        )
    return choice


def _arguments_schema(function: dict) -> dict:
    """The JSON Schema a call's arguments are held to (no parameters: an object without any), in json.dumps style."""
    schema = dict(function.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False})
    schema["x-guidance"] = JSON_STYLE
    return schema


def _lark_string(s: str) -> str:
    return json.dumps(s)  # a JSON string literal is a Lark string literal with the same escapes


def tool_call_grammar(tools: list[dict], choice: ToolChoice) -> str:
    """Lark (llguidance) text whose language is the tool calls ``choice`` allows, byte for byte as the chat template
    writes them: one call of the named function, or for "required" one or more calls (newline-separated; one
    without ``parallel``) of any tool. Arguments follow each function's parameters schema (``%json``), written like
    json.dumps."""
    if not choice.enforced:
        raise ValueError(f"tool_choice {choice.mode!r} is not enforced by a grammar")
    lines = ["start: call" if choice.max_calls == 1 else f"start: call ({_lark_string(CALL_SEPARATOR)} call)*"]
    alternatives = []
    for i, tool in enumerate(tools):
        f = tool["function"]
        if choice.mode == "function" and f["name"] != choice.name:
            continue
        alternatives.append(f"call_{i}")
        lines.append(
            f"call_{i}: {_lark_string(CALL_PREFIX + f['name'] + CALL_MIDDLE)} args_{i} {_lark_string(CALL_SUFFIX)}"
        )
        lines.append(f"args_{i}: %json {json.dumps(_arguments_schema(f), ensure_ascii=False)}")
    lines.insert(1, "call: " + " | ".join(alternatives))
    return "\n".join(lines) + "\n"


def check_enforceable(tools: list[dict], choice: ToolChoice) -> None:
    """Raise ToolSpecError naming the tool whose parameters llguidance cannot enforce (e.g. an unknown "format" or
    a look-ahead "pattern"); call before using tool_call_grammar for ``choice``."""
    import llguidance  # the grammar engine; only needed when a request enforces tool calls

    for i, tool in enumerate(tools):
        f = tool["function"]
        if choice.mode == "function" and f["name"] != choice.name:
            continue
        grammar = "start: args\nargs: %json " + json.dumps(_arguments_schema(f), ensure_ascii=False)
        error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar))
        if error:
            lines = error.split("failed to compile JSON schema: ")[-1].splitlines()
            reason = " ".join(x.strip() for x in itertools.takewhile(lambda x: not GRAMMAR_LISTING.match(x), lines))
            raise ToolSpecError(
                f"tools[{i}].function.parameters cannot be enforced for tool_choice {choice.mode!r}: {reason}",
                f"tools[{i}].function.parameters",
            )


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_call(block: str) -> dict | None:
    """An OpenAI tool call from one ``<tool_call>...</tool_call>`` block, or None when it does not parse."""
    body = block[len(TOOL_OPEN) : -len(TOOL_CLOSE)]
    try:
        obj = json_input.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": new_call_id(), "type": "function", "function": {"name": obj["name"], "arguments": args}}


class ToolCallParser:
    """Incremental: ``feed(text)`` returns (content to send now, calls completed by this text); ``flush()`` at the
    end returns what was held. Content is held only from a (possible) ``<tool_call>`` tag on and for trailing
    whitespace (which is dropped if a call follows). After ``max_calls`` calls, the rest is text."""

    def __init__(self, max_calls: int | None = None):
        self.max_calls = max_calls
        self.held = ""  # text not yet sent: a partial or open call, or trailing whitespace
        self.in_call = False
        self.space_before_call = ""  # whitespace right before the open call: text again if the call fails
        self.after_call = False  # drop whitespace right after a call
        self.calls: list[dict] = []

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self.held += text
        out, new = [], []
        while self.held:
            if self.after_call:
                self.held = self.held.lstrip()
                if not self.held:
                    break
                self.after_call = False
            if self.max_calls is not None and len(self.calls) >= self.max_calls:
                out.append(self.held)
                self.held = ""
                break
            if self.in_call:
                end = self.held.find(TOOL_CLOSE)
                if end < 0:
                    break
                end += len(TOOL_CLOSE)
                block, self.held, self.in_call = self.held[:end], self.held[end:], False
                call = parse_call(block)
                if call is None:
                    out.append(self.space_before_call + block)
                else:
                    self.calls.append(call)
                    new.append(call)
                    self.after_call = True
                continue
            cut = self.held.find(TOOL_OPEN)
            if cut >= 0:
                before = self.held[:cut]
                keep = len(before.rstrip())
                out.append(before[:keep])
                self.space_before_call, self.held, self.in_call = before[keep:], self.held[cut:], True
                continue
            hold_from = len(self.held)  # a tag may be starting at the end
            for n in range(min(len(TOOL_OPEN) - 1, len(self.held)), 0, -1):
                if self.held.endswith(TOOL_OPEN[:n]):
                    hold_from -= n
                    break
            keep = len(self.held[:hold_from].rstrip())
            out.append(self.held[:keep])
            self.held = self.held[keep:]
            break
        return "".join(out), new

    def flush(self) -> str:
        """The held text at the end (an unfinished call stays text)."""
        rest = (self.space_before_call if self.in_call else "") + self.held
        self.held, self.in_call, self.space_before_call = "", False, ""
        return rest


def extract_tool_calls(content: str, max_calls: int | None = None) -> tuple[str, list[dict]]:
    """(content without its tool calls, the OpenAI tool calls) of a whole text; as streaming would split it."""
    parser = ToolCallParser(max_calls)
    text, calls = parser.feed(content)
    return text + parser.flush(), calls
