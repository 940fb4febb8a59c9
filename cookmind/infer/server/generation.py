"""One HTTP call's generations: its engine requests (n choices per prompt), their output processors, and the
asyncio queue the engine thread feeds. However the call ends (done, a stop string, a client that left, an
error), ``cancel()`` leaves none of its generations running."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from fastapi import Request

from cookmind.infer.constraints import compile_grammar, grammar_for_response_format
from cookmind.infer.engine import EngineClosedError, QueueFullError
from cookmind.infer.output import Delta, OutputProcessor
from cookmind.infer.sampling import SamplingParams
from cookmind.infer.server.errors import APIError
from cookmind.infer.server.state import ServerState

DISCONNECT_POLL_S = 0.5


def max_new_tokens(state: ServerState, req, prompt_len: int) -> int:
    """The request's max_tokens, or the rest of the context; 400 when the prompt plus it do not fit."""
    limit = state.engine.max_seq_len
    room = limit - prompt_len
    wanted = req.max_new_tokens()
    if wanted is not None and not ({"max_tokens", "max_completion_tokens"} & req.model_fields_set):
        wanted = min(wanted, max(room, 1))  # a default (a completion's 16) the client did not ask for: what fits
    what = "messages" if hasattr(req, "messages") else "prompt"  # the prompt's field: a chat's or a completion's
    if room < 1:  # the prompt alone: it was "you requested N + 1 tokens (N in the prompt, 1 for the completion)",
        # a completion's default max_tokens cut to the 1 that fitted, or 0 for a chat that asked for none
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your {what} resulted in {prompt_len} "
            f"tokens{' with the chat template' if what == 'messages' else ''}, which leaves no room for the "
            f"completion. Reduce the {what} to fewer than {limit} tokens.",
            param=what,
            code="context_length_exceeded",
        )
    if wanted is not None and wanted > room:
        field = "max_tokens" if getattr(req, "max_completion_tokens", None) is None else "max_completion_tokens"
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + wanted} tokens ({prompt_len} in the prompt, {wanted} for the "
            f"completion). Reduce the prompt or {field}.",
            param=field,
            code="context_length_exceeded",
        )
    return wanted if wanted is not None else room


def response_grammar(req) -> str | None:
    """The grammar of the request's response_format (None for text); 400 naming the problem when it is invalid."""
    try:
        return grammar_for_response_format(req.response_format)
    except ValueError as exc:
        raise APIError(400, str(exc), param=getattr(exc, "param", "response_format")) from exc


async def compile_off_loop(state: ServerState, grammar: str | None, param: str, stop_ids) -> None:
    """Compile a request's grammar in a worker thread before its submit, which then copies the compiled matcher:
    compiling on the event loop would hold every other request (a plain one's tokens too) for as long as it takes.
    ``stop_ids``: the tokens that end the request (as its submit gets them). 400 naming ``param`` when the grammar
    does not compile."""
    if grammar is None:
        return
    try:
        engine = state.engine  # the tokenizer its matchers use: the compiled grammar is kept per tokenizer
        await asyncio.to_thread(compile_grammar, engine.tokenizer, engine.vocab_size, grammar, stop_ids)
    except ValueError as exc:
        raise APIError(400, str(exc), param=param) from exc


def sampling_params(req, choice: int, logprobs: bool, top: int, grammar: str | None = None) -> SamplingParams:
    """The request's sampling fields; choice i of n samples with seed + i; grammar constrains the output."""
    return SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        seed=None if req.seed is None else req.seed + choice,
        logprobs=logprobs,
        top_logprobs=top,
        grammar=grammar,
    )


class Generation:
    """Choices submitted to the engine for one HTTP call; choice index = prompt index * n + j, OpenAI's order."""

    def __init__(self, state: ServerState):
        self.state = state
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.handles: list = []
        self.procs: list[OutputProcessor] = []

    def submit(
        self,
        ids: list[int],
        req,
        logprobs: bool,
        top: int,
        prompt_logprobs: int | None = None,
        grammar: str | None = None,
        stop_ids=None,
        **processor_kw,
    ) -> None:
        """Submit req.n choices for one prompt; all or none: a refusal cancels every choice of this call.
        stop_ids: the tokens that end each choice (default: end-of-text and end-of-turn)."""
        engine = self.state.engine
        if req.n > engine.max_waiting:  # a 429 would send the client to retry what can never fit
            raise APIError(
                400,
                f"n={req.n} choices are {req.n} requests, and this server queues at most {engine.max_waiting} "
                f"(--max-queue): ask for at most {engine.max_waiting}",
                param="n",
            )
        max_new = max_new_tokens(self.state, req, len(ids))
        adapter = self.state.check_model(req.model)  # the LoRA adapter the model name picks (None: the base)
        try:
            for j in range(req.n):
                sink = self._sink(len(self.handles))
                self.handles.append(
                    engine.submit(
                        ids,
                        sampling_params(req, j, logprobs, top, grammar),
                        max_new,
                        self.state.stop_ids if stop_ids is None else stop_ids,
                        sink,
                        prompt_logprobs=prompt_logprobs,
                        adapter=adapter,
                        text_stops=bool(req.stop_list()),  # its OutputProcessor may make a length finish a stop
                    )
                )
                self.procs.append(OutputProcessor(self.state.tokenizer, req.stop_list(), **processor_kw))
        except EngineClosedError as exc:  # the server is stopping at once (a second Ctrl-C): it starts nothing new
            self.cancel()
            raise APIError(
                503,
                f"the server is stopping ({exc}) and did not start this request; send it again once it is back",
                "server_error",
                code="server_shutting_down",
            ) from exc
        except QueueFullError as exc:
            self.cancel()
            raise APIError(
                429,
                str(exc),
                "rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(engine.retry_after())},
            ) from exc
        except ValueError as exc:
            self.cancel()
            raise APIError(400, str(exc)) from exc

    def _sink(self, choice: int):
        """The engine thread's callback for one choice: hand its events to the event loop's queue."""

        def sink(ev):
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (choice, ev))
            except RuntimeError:
                if not self.loop.is_closed():
                    raise
                # the call's loop has closed (the server is shutting down): no one is left to read the event, and
                # raising here would fail the engine's step, every request beside this one

        return sink

    def cancel(self) -> None:
        for h in self.handles:
            self.state.engine.cancel(h)

    async def aclose(self) -> None:
        """``cancel`` for a response's background task (a coroutine runs on the loop, not in a worker thread)."""
        self.cancel()

    async def events(self, request: Request | None = None) -> AsyncIterator[tuple[int, Delta]]:
        """Yield (choice index, Delta) until every choice has finished; a stop string cancels its choice.
        With ``request`` (non-streamed calls) a client that disconnects raises CancelledError."""
        remaining = len(self.procs)
        last_check = time.monotonic()
        while remaining:
            if request is not None and time.monotonic() - last_check > DISCONNECT_POLL_S:
                last_check = time.monotonic()
                if await request.is_disconnected():
                    raise asyncio.CancelledError("client disconnected")
            try:
                i, ev = await asyncio.wait_for(self.queue.get(), timeout=DISCONNECT_POLL_S)
            except TimeoutError:
                continue
            proc = self.procs[i]
            if proc.finish_reason is not None:
                continue  # events after a stop string, or the engine's own finish of a cancelled request
            delta = proc.feed(ev)
            if proc.stopped_by_string:
                self.state.engine.cancel(self.handles[i], "stop")
            elif delta.finish_reason is not None:
                # the engine's own finish, and no stop string in the text it left: a length finish, whose count the
                # engine holds for this word (text_stops), is counted now as "length" (other finishes: a no-op)
                self.state.engine.cancel(self.handles[i])
            if delta.finish_reason is not None:
                remaining -= 1
            yield i, delta

    async def run_to_end(self, request: Request) -> None:
        """Feed every event to the processors (a non-streamed answer); cancel whatever is left however it ends."""
        try:
            async for _ in self.events(request):
                pass
        finally:
            self.cancel()

    def usage(self, prompt_tokens: int, n: int) -> dict:
        """OpenAI's usage; with the prefix cache, the prompt tokens read from it (once per prompt, like
        prompt_tokens: the first of its n choices)."""
        completion = sum(p.completion_tokens for p in self.procs)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
        if getattr(self.state.engine, "prefix", None) is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": sum(h.cached_tokens for h in self.handles[::n])}
        return usage


def finish_reason(proc: OutputProcessor, tool_calls=()) -> str:
    """OpenAI's finish_reason for a finished choice; a failed generation is a 500 for non-streamed calls, one the
    server cut (``CUT``: stopping, or its engine's cancel) a 503. A reply cut by max_tokens is "length" even after
    whole tool calls: the turn is unfinished (a later call may be cut off)."""
    if proc.finish_reason == "error":  # the reason, as the server's console has it (Engine._loop)
        raise APIError(500, "generation failed" + (f": {proc.error}" if proc.error else ""), "server_error")
    if proc.finish_reason == "shutdown":  # a second Ctrl-C or SIGTERM to the server (cli_serve.make_server)
        raise APIError(
            503,
            f"the server is stopping and cut this generation after {proc.completion_tokens} token(s); send the request "
            "again once it is back",
            "server_error",
            code="server_shutting_down",
        )
    if proc.finish_reason == "cancelled":  # not by this call (its own cancels come after its last read): the app
        # embedding the server stopped its engine, or cancelled the request. A "stop" would pass the cut text off as
        # the model's whole answer; a 5xx tells the client it may send it again
        raise APIError(
            503,
            f"the server's engine cancelled this generation after {proc.completion_tokens} token(s), before it "
            "finished (the engine was stopped, or the request cancelled by the application serving it); send the "
            "request again",
            "server_error",
            code="generation_cancelled",
        )
    if proc.finish_reason == "length":
        return "length"
    return "tool_calls" if tool_calls else "stop"


CUT = ("error", "shutdown", "cancelled")  # the engine's finishes of a generation that did not end: an error for it


def stream_finish_reason(proc: OutputProcessor, tool_calls=()) -> str:
    """As finish_reason, but a failed or cut generation says "error" in its last chunk (the status is already sent)."""
    return "error" if proc.finish_reason in CUT else finish_reason(proc, tool_calls)


def stream_error(proc: OutputProcessor) -> str | None:
    """The error event a stream carries after a failed or cut choice's last chunk (``{"error": {...}}``, as OpenAI's
    streams do: the openai client raises APIError with its message), or None for one that finished. The status was
    sent with the first chunk; without it a client read a failed generation as a finished, shorter answer."""
    if proc.finish_reason not in CUT:
        return None
    try:
        finish_reason(proc)
    except APIError as exc:
        return sse(exc.body)
    return None


def sse(body: dict) -> str:
    """One server-sent event carrying a JSON chunk."""
    return f"data: {json.dumps(body)}\n\n"
