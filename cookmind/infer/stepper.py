"""One forward step with a KV cache for the plain generation loop: our CookMindLM, a Hugging Face causal LM
(transformers or peft, LoRA included) or any callable returning logits (no cache: the whole sequence each step).

CookMindLM rows may have different prompt lengths: they are left-padded into one batch, an attention mask
hides the padding and explicit position ids start every row at 0, so each row's tokens equal what the row
would get alone (tests/test_generate.py checks this). The other kinds take rows of one prompt length
(``generate`` groups them so), which needs no mask and matches their own ``generate`` exactly.
"""

from __future__ import annotations

import inspect

import torch


def model_kind(model) -> str:
    """ "cookmind" (a CookMindLM, LoRA-wrapped or not), "hf" (transformers / peft) or "callable"."""
    module = type(model).__module__
    if module.startswith("transformers") or module.startswith("peft"):
        return "hf"
    if hasattr(model, "config") and type(model).__name__ == "CookMindLM":
        return "cookmind"
    return "callable"


def model_device(model) -> torch.device:
    """Where the model's parameters live (CPU for a callable without parameters)."""
    if hasattr(model, "parameters"):
        for p in model.parameters():
            return p.device
    return torch.device("cpu")


class Stepper:
    """``prefill()`` -> next-token logits (B, V) of the prompts; ``step(tokens (B,))`` -> logits after them."""

    def __init__(self, model, prompts: list[list[int]], max_new_tokens: int):
        self.model, self.kind = model, model_kind(model)
        self.device = model_device(model)
        self.b, self.p_len = len(prompts), max(len(p) for p in prompts)
        if self.kind != "cookmind" and any(len(p) != self.p_len for p in prompts):
            raise ValueError(
                "Stepper: rows of a Hugging Face model or callable need one prompt length (generate groups them so)"
            )
        self.ids = torch.zeros((self.b, self.p_len), dtype=torch.long, device=self.device)
        for i, prompt in enumerate(prompts):
            self.ids[i, self.p_len - len(prompt) :] = torch.tensor(prompt, dtype=torch.long, device=self.device)
        self.col = self.p_len  # the cache column the next token goes to
        if self.kind == "cookmind":
            self._init_cookmind(prompts, max_new_tokens)
        self.past = None  # Hugging Face: its cache object
        self.seq = None  # callable: the sequence so far

    def _init_cookmind(self, prompts, max_new_tokens: int) -> None:
        from cookmind.model import KVCache

        cfg = self.model.config
        total = self.p_len + max_new_tokens
        self.valid = torch.zeros((self.b, total), dtype=torch.bool, device=self.device)  # real-token columns
        for i, prompt in enumerate(prompts):
            self.valid[i, self.p_len - len(prompt) : self.p_len] = True
        self.positions = (self.valid[:, : self.p_len].long().cumsum(-1) - 1).clamp(min=0)  # each row counts from 0
        dtype = next(self.model.parameters()).dtype
        self.cache = KVCache(cfg, self.b, total, device=self.device, dtype=dtype)

    def prefill(self) -> torch.Tensor:
        if self.kind == "cookmind":
            t = self.p_len
            causal = torch.ones(t, t, dtype=torch.bool, device=self.device).tril()
            eye = torch.eye(t, dtype=torch.bool, device=self.device)
            # padding queries see only themselves: a row with nothing to attend to would give NaN
            mask = ((causal & self.valid[:, None, :t]) | eye)[:, None]  # (B, 1, T, S)
            out = self.model(self.ids, position_ids=self.positions, attention_mask=mask, kv_cache=self.cache)
            self.last_pos = self.positions[:, -1]
            return out.logits[:, -1]
        return self._forward(self.ids)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        new = tokens[:, None]
        if self.kind == "cookmind":
            self.valid[:, self.col] = True
            self.col += 1
            self.last_pos = self.last_pos + 1
            mask = self.valid[:, None, None, : self.col]
            return self.model(
                new, position_ids=self.last_pos[:, None], attention_mask=mask, kv_cache=self.cache
            ).logits[:, -1]
        return self._forward(new)

    def _forward(self, new_ids: torch.Tensor) -> torch.Tensor:
        if self.kind == "hf":
            kwargs = {}
            if self.past is not None:  # transformers >= 5.2x names the cache argument `cache`; older `past_key_values`
                kwargs[_hf_cache_kwarg(self.model)] = self.past
            out = self.model(input_ids=new_ids, use_cache=True, **kwargs)
            self.past = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
            return out.logits[:, -1]
        # a callable has no cache: it sees the whole sequence every step
        self.seq = new_ids if self.seq is None else torch.cat([self.seq, new_ids], dim=1)
        out = self.model(self.seq)
        return (out["logits"] if isinstance(out, dict) else getattr(out, "logits", out))[:, -1]


def _hf_cache_kwarg(model) -> str:
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"
