"""generate / stream: prefill then decode with the model's preallocated KVCache.

Prompts of different lengths are left-padded into one batch; an attention mask hides the
padding and explicit position ids start every row at 0, so each row's tokens equal what the
row would get alone (a test checks this under greedy decoding).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from cookmind.infer.generation_config import GenerationConfig
from cookmind.infer.sampling import SamplingBatch, make_generator, process_logits, sample_from_logits
from cookmind.model import KVCache


def _model_device_dtype(model) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


@torch.inference_mode()
def generate_steps(model, prompts: list[list[int]], cfg: GenerationConfig
                   ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (next tokens (B,), the logits they were drawn from (B, V)) once per decode step.

    Runs until every row has hit a stop token or max_new_tokens; finished rows keep being fed
    (their tokens are ignored) so the batch keeps one shape. Callers stop consuming early to
    end generation (e.g. on a stop string).
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate: every prompt needs at least one token (got an empty prompt or no prompts)")
    device, dtype = _model_device_dtype(model)
    mcfg = model.config
    b, p_len = len(prompts), max(len(p) for p in prompts)
    max_new = min(cfg.max_new_tokens, mcfg.max_position_embeddings - p_len)
    if max_new < 1:
        raise ValueError(f"generate: a prompt of {p_len} tokens fills the model's context of "
                         f"{mcfg.max_position_embeddings} tokens; shorten the prompt")
    total = p_len + max_new
    pad = mcfg.pad_token_id if mcfg.pad_token_id is not None else 0
    ids = torch.full((b, p_len), pad, dtype=torch.long, device=device)
    valid = torch.zeros((b, total), dtype=torch.bool, device=device)  # which cache columns hold real tokens
    for i, prompt in enumerate(prompts):
        ids[i, p_len - len(prompt):] = torch.tensor(prompt, dtype=torch.long, device=device)
        valid[i, p_len - len(prompt):] = True
    positions = (valid[:, :p_len].long().cumsum(-1) - 1).clamp(min=0)  # each row counts from 0

    causal = torch.ones(p_len, p_len, dtype=torch.bool, device=device).tril()
    eye = torch.eye(p_len, dtype=torch.bool, device=device)
    # padding queries see only themselves: a row with nothing to attend to would give NaN
    mask = ((causal & valid[:, None, :p_len]) | eye)[:, None]  # (B, 1, T, S)

    cache = KVCache(mcfg, b, total, device=device, dtype=dtype)
    logits = model(ids, position_ids=positions, attention_mask=mask, kv_cache=cache).logits[:, -1]

    params = [cfg.sampling_params()] * b
    # row i draws from seed + i: repeated prompts (a GRPO group) get distinct, reproducible samples
    seeds = [None if cfg.seed is None else cfg.seed + i for i in range(b)]
    batch = SamplingBatch.from_params(params, device, [make_generator(s, device) for s in seeds])
    vocab = logits.shape[-1]
    seen = torch.zeros((b, vocab), dtype=torch.bool, device=device)
    for i, prompt in enumerate(prompts):
        seen[i, torch.tensor(prompt, device=device).clamp(max=vocab - 1)] = True
    counts = torch.zeros((b, vocab), dtype=torch.long, device=device)
    last_pos = positions[:, -1]
    for step in range(max_new):
        tokens = sample_from_logits(process_logits(logits, batch, seen, counts), batch)
        yield tokens, logits
        if step == max_new - 1:
            return
        seen[torch.arange(b), tokens] = True
        counts[torch.arange(b), tokens] += 1
        col = p_len + step
        valid[:, col] = True
        last_pos = last_pos + 1
        logits = model(tokens[:, None], position_ids=last_pos[:, None],
                       attention_mask=valid[:, None, None, : col + 1], kv_cache=cache).logits[:, -1]


def _stop_string_hit(tokenizer, out_ids: list[int], stop_strings: tuple[str, ...], checked_chars: list[int]) -> bool:
    """Did the newest token complete a stop string? Only the text's tail can hold a new match."""
    text = tokenizer.decode(out_ids)
    longest = max(len(s) for s in stop_strings)
    start = max(0, checked_chars[0] - longest)
    checked_chars[0] = len(text)
    return any(s in text[start:] for s in stop_strings)


def generate(model, prompts: list[list[int]], cfg: GenerationConfig, tokenizer=None) -> list[list[int]]:
    """New tokens for each prompt. A stop token ends a row and is not included; a stop string
    (needs `tokenizer`) ends a row after the token that completes it."""
    if cfg.stop_strings and tokenizer is None:
        raise ValueError("generate: stop_strings need a tokenizer to decode the output; pass tokenizer=")
    stop_ids = set(cfg.stop_token_ids)
    outs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    checked = [[0] for _ in prompts]
    for tokens, _ in generate_steps(model, prompts, cfg):
        for i, t in enumerate(tokens.tolist()):
            if done[i]:
                continue
            if t in stop_ids:
                done[i] = True
                continue
            outs[i].append(t)
            if cfg.stop_strings and _stop_string_hit(tokenizer, outs[i], cfg.stop_strings, checked[i]):
                done[i] = True
        if all(done):
            break
    return outs


def stream(model, prompt: list[int], cfg: GenerationConfig, tokenizer=None) -> Iterator[int]:
    """Yield new token ids one at a time (same stopping rules as `generate`)."""
    if cfg.stop_strings and tokenizer is None:
        raise ValueError("stream: stop_strings need a tokenizer to decode the output; pass tokenizer=")
    stop_ids = set(cfg.stop_token_ids)
    out: list[int] = []
    checked = [0]
    for tokens, _ in generate_steps(model, [prompt], cfg):
        t = int(tokens[0])
        if t in stop_ids:
            return
        out.append(t)
        yield t
        if cfg.stop_strings and _stop_string_hit(tokenizer, out, cfg.stop_strings, checked):
            return
