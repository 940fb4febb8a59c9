"""Perplexity and bits per byte of a model on a text file or a token store.

    ppl = exp( sum NLL / tokens )        bpb = sum NLL / (ln 2 * UTF-8 bytes)
Bits per byte compares models with different tokenizers: it counts the text, not the tokens.
Windows of ``window`` tokens slide by ``stride``; each token is scored once, with as much
left context as the window allows (the first window scores all of its predictions).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tqdm import tqdm

from cookmind.align.losses import gather_log_probs, logits_of
from cookmind.align.prompts import decode_ids, encode_text


@torch.no_grad()
def sequence_nll(
    model, ids: list[int], window: int, stride: int | None = None, progress: bool = False
) -> tuple[float, int]:
    """(sum of -log p(token | previous tokens) in nats, number of scored tokens) over ``ids``.

    The first token has no context and is not scored.
    """
    stride = stride or window
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and window > context:
        raise ValueError(
            f"perplexity: a window of {window} tokens exceeds the model's context of {context} tokens "
            f"(positions past it are meaningless); use --window {context} or less"
        )
    if not 0 < stride <= window:
        raise ValueError(f"perplexity: stride {stride} must be in 1..window ({window})")
    device = next(model.parameters()).device if hasattr(model, "parameters") else torch.device("cpu")
    ids_t = torch.tensor(ids, dtype=torch.long, device=device)
    total, count, scored_upto = 0.0, 0, 1  # position of the next target not yet scored
    starts = range(0, max(1, len(ids) - 1), stride)
    for start in tqdm(starts, desc="perplexity", unit="window", disable=not progress):
        chunk = ids_t[start : start + window + 1]
        if len(chunk) < 2:
            break
        logits = logits_of(model(chunk[None, :-1]))[0]
        lp = gather_log_probs(logits, chunk[1:])
        first_new = max(0, scored_upto - (start + 1))  # skip targets an earlier window scored
        total -= lp[first_new:].sum().item()
        count += len(lp) - first_new
        scored_upto = start + len(chunk)
        if scored_upto >= len(ids):
            break
    return total, count


def _report(nll: float, tokens: int, n_bytes: int) -> dict:
    return {
        "tokens": tokens,
        "bytes": n_bytes,
        "nll_per_token": nll / max(1, tokens),
        "perplexity": math.exp(nll / max(1, tokens)),
        "bits_per_byte": nll / math.log(2) / max(1, n_bytes),
    }


def evaluate_text(
    model, tokenizer, text: str, window: int = 256, stride: int | None = None, progress: bool = False
) -> dict:
    """Perplexity and bits per byte on ``text``. Bytes exclude the first token's (it is never predicted)."""
    ids = encode_text(tokenizer, text)
    if len(ids) < 2:
        raise ValueError("perplexity: the text has fewer than 2 tokens; nothing to predict")
    nll, n = sequence_nll(model, ids, window, stride, progress)
    n_bytes = len(text.encode("utf-8")) - len(decode_ids(tokenizer, ids[:1]).encode("utf-8"))
    return _report(nll, n, n_bytes)


def evaluate_text_file(
    model,
    tokenizer,
    path,
    window: int = 256,
    stride: int | None = None,
    max_bytes: int | None = None,
    progress: bool = True,
) -> dict:
    """``evaluate_text`` on a UTF-8 file (its first ``max_bytes`` bytes when given)."""
    data = Path(path).read_bytes()
    if max_bytes is not None:
        data = data[:max_bytes]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if max_bytes is None or exc.reason != "unexpected end of data":  # only the cut may split a character
            raise ValueError(
                f"{path}: invalid UTF-8 at byte {exc.start}; convert the file to UTF-8 (e.g. `iconv -f latin1 -t"
                " utf-8`): bad bytes dropped or replaced would change the perplexity"
            ) from None
        text = data[: exc.start].decode("utf-8")
    return {"path": str(path), **evaluate_text(model, tokenizer, text, window, stride, progress)}


def evaluate_store(
    model, tokenizer, path, window: int = 256, max_windows: int | None = None, progress: bool = True
) -> dict:
    """Perplexity and bits per byte over a packed token store's windows (read as a ``seq`` dataset).

    Each window predicts its own tokens 2..T from their prefixes; the tokens after the last full window form one
    shorter window, so every token but each window's first is scored. Bytes are those of the decoded predicted
    tokens, so bits per byte stays comparable with ``evaluate_text``.
    """
    from cookmind.data import DatasetFactory

    # a store packed with another tokenizer than the model's is refused: its ids would be scored as other text
    fingerprint = tokenizer.fingerprint() if hasattr(tokenizer, "fingerprint") else None
    ds = DatasetFactory.load("seq", str(path), window, tokenizer_fingerprint=fingerprint, tokenizer_path="the model's")
    spans = [ds.window_bounds(i) for i in range(len(ds))]
    stream_length = ds.store.stream_length("sequence")
    end = spans[-1][1] if spans else 0
    if stream_length - end >= 2:  # the tail (or a whole store shorter than one window)
        spans.append((end, stream_length))
    if not spans:
        raise ValueError(f"perplexity: the store at {path} has {stream_length} token(s); nothing to predict")
    total, count, n_bytes = 0.0, 0, 0
    for start, stop in tqdm(spans[:max_windows], desc="perplexity", unit="window", disable=not progress):
        ids = ds.store.stream("sequence", start, stop).tolist()
        nll, k = sequence_nll(model, ids, window)
        total += nll
        count += k
        n_bytes += len(decode_ids(tokenizer, ids[1:]).encode("utf-8"))
    return {"path": str(path), **_report(total, count, n_bytes)}
