"""Token store benchmarks: packing throughput and random-window reads, one JSON line per figure.

    .venv/bin/python bench/bench_store.py [--docs 4000] [--window 512] [--reads 3000]

Packing: ``cookmind.store.packer.pack`` (seq, .bin) with 1 and 2 workers, against the peer
``Tokenizer.encode_batch`` on the same texts (pure tokenization, no store) in the same run.
Reads: random windows through ``build_dataloader`` with 0 and 2 workers from the memory-mapped
``.bin`` store and the ``.h5`` store, against the peer: the same windows sliced from one
in-memory torch tensor with the same DataLoader settings.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset


class InMemoryWindows(Dataset):
    """The peer: windows sliced from a token tensor already in RAM (no store at all)."""

    def __init__(self, tokens: torch.Tensor, window: int):
        self.tokens, self.window = tokens, window

    def __len__(self):
        return (len(self.tokens) - self.window) // self.window + 1

    def __getitem__(self, i):
        x = self.tokens[i * self.window : (i + 1) * self.window].long()
        return {"input_ids": x, "labels": x.clone(), "position_ids": torch.arange(self.window)}


def _tokenizer(work: Path, texts: list[str], vocab_size: int):
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(texts[:2000]))
    vocab, merges = train_bpe(corpus, vocab_size, DEFAULT_SPECIAL_TOKENS, progress=False)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    tok.save(work / "tok")
    return tok


def _emit(**kw):
    print(json.dumps(kw), flush=True)


def bench_pack(work: Path, tok, texts: list[str]) -> Path:
    from cookmind.store.packer import pack

    src = work / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok.encode_batch(texts[:8])  # build the fast path first: its one-time set-up is not throughput
    t0 = time.perf_counter()
    n_tokens = sum(len(ids) + 1 for ids in tok.encode_batch(texts))
    peer = n_tokens / (time.perf_counter() - t0)
    out = None
    for workers in (1, 2):
        out = work / f"store_w{workers}"
        t0 = time.perf_counter()
        meta = pack([src], out, work / "tok", "seq", workers=workers, progress=False, overwrite=True)
        tps = meta["num_tokens"] / (time.perf_counter() - t0)
        _emit(
            bench="pack_seq_bin",
            workers=workers,
            docs=len(texts),
            tokens=meta["num_tokens"],
            tokens_per_s=round(tps),
            peer="Tokenizer.encode_batch (no store)",
            peer_tokens_per_s=round(peer),
            ratio=round(tps / peer, 3),
        )
    return out


def bench_reads(work: Path, store_dir: Path, window: int, reads: int, batch: int) -> None:
    from cookmind.data import DatasetFactory, build_dataloader
    from cookmind.store.packer import pack

    h5_dir = work / "store_h5"
    pack([work / "docs.jsonl"], h5_dir, work / "tok", "seq", storage_type="h5", progress=False, overwrite=True)
    bin_ds = DatasetFactory.load("seq", store_dir, window)
    peer_ds = InMemoryWindows(
        torch.from_numpy(bin_ds.store.stream("sequence", 0, bin_ds.store.stream_length("sequence")).astype("int64")),
        window,
    )
    for workers in (0, 2):
        rates = {}
        for name, ds in (("peer", peer_ds), ("bin", bin_ds), ("h5", DatasetFactory.load("seq", h5_dir, window))):
            loader = build_dataloader(ds, "seq", batch, pad_id=0, seed=0, num_workers=workers)
            it, n, t0 = iter(loader), 0, None
            while n < reads:
                try:
                    b = next(it)
                except StopIteration:
                    loader.sampler.set_epoch(loader.sampler.epoch + 1)
                    it = iter(loader)
                    continue
                if t0 is None:  # start timing after the first batch: worker start-up is not read speed
                    t0 = time.perf_counter()
                    continue
                n += len(b["input_ids"])
            rates[name] = n / (time.perf_counter() - t0)
            del it
        for name in ("bin", "h5"):
            _emit(
                bench=f"random_window_read_{name}",
                workers=workers,
                window=window,
                batch=batch,
                windows_per_s=round(rates[name]),
                tokens_per_s=round(rates[name] * window),
                peer="in-memory torch tensor, same DataLoader",
                peer_windows_per_s=round(rates["peer"]),
                ratio=round(rates[name] / rates["peer"], 3),
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=4000, help="synthetic stories to pack")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--reads", type=int, default=3000, help="windows read per configuration")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    from cookmind.synthetic.stories import stories

    texts = stories(args.docs, seed=0)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        tok = _tokenizer(work, texts, args.vocab)
        store = bench_pack(work, tok, texts)
        bench_reads(work, store, args.window, args.reads, args.batch)


if __name__ == "__main__":
    main()
