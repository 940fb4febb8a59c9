"""GET routes: the web chat page, /health, /metrics (Prometheus text) and /v1/models."""

from __future__ import annotations

import time
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, PlainTextResponse

from cookmind.infer.server.state import State

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
async def index():
    return HTMLResponse(resources.files("cookmind.infer").joinpath("static/index.html").read_text())


@router.get("/health")
async def health(state: State):
    return {"status": "ok", "model": state.model_name}


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(state: State):
    lines = [f"cookmind_{k} {v}" for k, v in state.engine.metrics().items()]
    lines += [f"cookmind_http_{k} {v}" for k, v in state.stats.items()]
    lines.append(f"cookmind_uptime_seconds {time.time() - state.started:.1f}")
    return "\n".join(lines) + "\n"


def _model_card(state, name: str, parent: str | None) -> dict:
    # max_model_len as vLLM reports it: the web page sizes its max-tokens default from it. LoRA adapters are
    # models of their own, with the base as their parent (as vLLM lists them).
    out = {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "cookmind",
        "max_model_len": state.engine.max_seq_len,
    }
    return out if parent is None else {**out, "parent": parent}


@router.get("/v1/models")
async def models(state: State):
    base = state.model_name
    cards = [_model_card(state, base, None)] + [_model_card(state, a, base) for a in state.engine.adapter_names]
    return {"object": "list", "data": cards}


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, state: State):
    """One model's card (the openai client's ``models.retrieve``); 404 ``model_not_found`` naming those served."""
    adapter = state.check_model(model_id)
    return _model_card(state, model_id, None if adapter is None else state.model_name)
