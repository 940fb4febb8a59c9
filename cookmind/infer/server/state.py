"""What every route reads: the engine, the tokenizer, the served model's name and the HTTP counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated

from fastapi import Depends, Request

from cookmind.infer.engine import Engine
from cookmind.infer.server.errors import APIError
from cookmind.infer.stop import chat_stop_ids, control_token_ids, text_stop_ids


@dataclass
class ServerState:
    engine: Engine
    tokenizer: object
    model_name: str
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.time)
    stats: dict = field(default_factory=lambda: {"requests": 0, "errors": 0, "rejected_429": 0})

    @property
    def stop_ids(self) -> list[int]:
        """End-of-text, end-of-turn and the model's own eos: a completion stops at each (``text_stop_ids``)."""
        return list(text_stop_ids(self.tokenizer, getattr(self.engine, "model_config", None)))

    @cached_property
    def chat_stop_ids(self) -> list[int]:
        """Every control token: a chat reply ends at the first one (``cookmind.infer.stop.chat_stop_ids``)."""
        return list(chat_stop_ids(self.tokenizer))

    @cached_property
    def control_ids(self) -> frozenset[int]:
        """The tokens left out of the text users see (``cookmind.infer.stop.control_token_ids``)."""
        return control_token_ids(self.tokenizer)

    @property
    def vocab_size(self) -> int:
        """Token ids a prompt may hold: known to both the model and the tokenizer."""
        tok_size = getattr(self.tokenizer, "vocab_size", None)
        return self.engine.vocab_size if tok_size is None else min(self.engine.vocab_size, tok_size)

    def check_model(self, name: str) -> str | None:
        """The LoRA adapter a request's ``model`` picks: None for the base model's own name, the adapter's name for
        one the engine serves; 404 ``model_not_found`` (OpenAI's shape) for anything else."""
        if name == self.model_name:
            return None
        if name in self.engine.adapter_names:
            return name
        served = ", ".join(repr(n) for n in [self.model_name, *self.engine.adapter_names])
        raise APIError(
            404,
            f"The model '{name}' does not exist; this server serves {served}",
            param="model",
            code="model_not_found",
        )


def get_state(request: Request) -> ServerState:
    """FastAPI dependency: the app's ServerState."""
    return request.app.state.server


State = Annotated[ServerState, Depends(get_state)]  # a route's parameter type for the app's ServerState
