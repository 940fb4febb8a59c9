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
    model,
    ids: list[int],
    window: int,
    stride: int | None = None,
    progress: bool = False,
    windows: list[dict] | None = None,
) -> tuple[float, int]:
    """(sum of -log p(token | previous tokens) in nats, number of scored tokens) over ``ids``.

    The first token has no context and is not scored. ``windows``, when given, gets one row per window: its first
    token's position, the tokens it scored and their summed NLL (what ``eval ppl --out`` writes).
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
    starts = []  # up to the first window that reaches the end: the bar's total is the windows run (it ended at 5/6)
    for start in range(0, max(1, len(ids) - 1), stride):
        starts.append(start)
        if start + window + 1 >= len(ids):
            break
    for start in tqdm(starts, desc="perplexity", unit="window", disable=not progress):
        chunk = ids_t[start : start + window + 1]
        if len(chunk) < 2:
            break
        logits = logits_of(model(chunk[None, :-1]))[0]
        lp = gather_log_probs(logits, chunk[1:])
        first_new = max(0, scored_upto - (start + 1))  # skip targets an earlier window scored
        nll = -lp[first_new:].sum().item()
        total += nll
        count += len(lp) - first_new
        if windows is not None:
            windows.append({"start": start, "tokens": len(lp) - first_new, "nll": nll})
        scored_upto = start + len(chunk)
    return total, count


def _report(nll: float, tokens: int, n_bytes: int) -> dict:
    return {
        "tokens": tokens,
        "bytes": n_bytes,
        "nll_per_token": nll / max(1, tokens),
        "perplexity": math.exp(nll / max(1, tokens)),
        "bits_per_byte": nll / math.log(2) / max(1, n_bytes),
    }


def _window_row(i: int, row: dict) -> dict:
    return {"window": i, **row, "nll_per_token": row["nll"] / max(1, row["tokens"])}


def evaluate_text(
    model,
    tokenizer,
    text: str,
    window: int = 256,
    stride: int | None = None,
    progress: bool = False,
    rows: list[dict] | None = None,
) -> dict:
    """Perplexity and bits per byte on ``text``. Bytes exclude the first token's (it is never predicted).

    ``rows``, when given, gets one row per window: window, start (token), tokens scored, nll, nll_per_token."""
    ids = encode_text(tokenizer, text)
    if len(ids) < 2:
        raise ValueError("perplexity: the text has fewer than 2 tokens; nothing to predict")
    windows: list[dict] = []
    nll, n = sequence_nll(model, ids, window, stride, progress, windows)
    if rows is not None:
        rows.extend(_window_row(i, w) for i, w in enumerate(windows))
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
    rows: list[dict] | None = None,
) -> dict:
    """``evaluate_text`` on a UTF-8 file (its first ``max_bytes`` bytes when given: ``file_bytes`` and
    ``bytes_not_evaluated`` say how much that left out)."""
    data = Path(path).read_bytes()
    file_bytes = len(data)
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
    report = evaluate_text(model, tokenizer, text, window, stride, progress, rows)
    left_out = file_bytes - len(text.encode("utf-8"))
    return {"path": str(path), **report, "file_bytes": file_bytes, "bytes_not_evaluated": left_out}


def evaluate_store(
    model,
    tokenizer,
    path,
    window: int = 256,
    max_windows: int | None = None,
    progress: bool = True,
    rows: list[dict] | None = None,
) -> dict:
    """Perplexity and bits per byte over a packed token store's windows (read as a ``seq`` dataset).

    Each window predicts its own tokens 2..T from their prefixes; the tokens after the last full window form one
    shorter window, so every token but each window's first is scored. Bytes are those of the decoded predicted
    tokens, so bits per byte stays comparable with ``evaluate_text``. ``windows``/``windows_total`` and
    ``store_tokens``/``tokens_not_evaluated`` say how much ``max_windows`` left out; ``rows``, when given, gets one
    row per window: window, start, stop, tokens scored, bytes, nll, nll_per_token, bits_per_byte.
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
    evaluated = spans[:max_windows]
    for i, (start, stop) in enumerate(tqdm(evaluated, desc="perplexity", unit="window", disable=not progress)):
        ids = ds.store.stream("sequence", start, stop).tolist()
        nll, k = sequence_nll(model, ids, window)
        b = len(decode_ids(tokenizer, ids[1:]).encode("utf-8"))
        total += nll
        count += k
        n_bytes += b
        if rows is not None:
            row = _window_row(i, {"start": start, "stop": stop, "tokens": k, "bytes": b, "nll": nll})
            rows.append({**row, "bits_per_byte": nll / math.log(2) / max(1, b)})
    return {
        "path": str(path),
        **_report(total, count, n_bytes),
        "windows": len(evaluated),
        "windows_total": len(spans),
        "store_tokens": stream_length,
        "tokens_not_evaluated": stream_length - evaluated[-1][1],
    }
