"""Encoding speed: cookmind's reference encoder and tiktoken fast path vs tiktoken's own gpt2, one thread.

    .venv/bin/python bench/bench_encode.py --mb 10 --ref-mb 1

Text: ../shared/data/text/corpus.en repeated to --mb. Tokenizers: GPT-2 imported from
../shared/data/gpt2 (peer: tiktoken's `gpt2` encoding built offline from the same files), and a
tokenizer we train on corpus.en. Best of --repeat runs; one JSON line per figure:
{"bench": "encode", "tokenizer", "impl", "mb", "seconds", "mb_per_s", "ids_equal_peer"}, then ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("COOKMIND_SHARED_DATA", ROOT.parent / "shared" / "data"))
sys.path.insert(0, str(ROOT))


def tiktoken_gpt2():
    """tiktoken's gpt2 encoding from the shared files, through tiktoken's own cache (no download)."""
    import tiktoken

    cache = Path(tempfile.mkdtemp(prefix="tiktoken-cache-"))
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    (cache / hashlib.sha1((base + "vocab.bpe").encode()).hexdigest()).write_bytes(
        b"#version: 0.2\n" + (SHARED / "gpt2/merges.txt").read_bytes()
    )
    (cache / hashlib.sha1((base + "encoder.json").encode()).hexdigest()).write_bytes(
        (SHARED / "gpt2/vocab.json").read_bytes()
    )
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    return tiktoken.get_encoding("gpt2")


def best_time(fn, text, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(text)
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=10.0, help="text size for the fast paths")
    ap.add_argument("--ref-mb", type=float, default=1.0, help="text size for the (slow) reference encoder")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads for the encode_batch figures")
    ap.add_argument("--train-vocab", type=int, default=8000)
    args = ap.parse_args()

    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, load_gpt2_files, train_bpe

    base = (SHARED / "text/corpus.en").read_text(encoding="utf-8")
    text = base * max(1, int(args.mb * 1e6 // len(base)))
    ref_text = text[: int(args.ref_mb * 1e6)]
    mb, ref_mb = len(text.encode()) / 1e6, len(ref_text.encode()) / 1e6

    peer = tiktoken_gpt2()
    gpt2 = load_gpt2_files(SHARED / "gpt2/vocab.json", SHARED / "gpt2/merges.txt")
    vocab, merges = train_bpe(SHARED / "text/corpus.en", args.train_vocab, DEFAULT_SPECIAL_TOKENS, progress=False)
    trained = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)

    def emit(name, impl, size, seconds, equal):
        print(
            json.dumps(
                {
                    "bench": "encode",
                    "tokenizer": name,
                    "impl": impl,
                    "mb": round(size, 2),
                    "seconds": round(seconds, 4),
                    "mb_per_s": round(size / seconds, 2),
                    "ids_equal_peer": equal,
                }
            ),
            flush=True,
        )
        return size / seconds

    # alternate the two runs so machine load drifts hit both alike
    t_peer = t_fast = float("inf")
    for _ in range(args.repeat):
        tp, ids_peer = best_time(lambda t: peer.encode(t, allowed_special="all"), text, 1)
        tf, ids_fast = best_time(gpt2.encode, text, 1)
        t_peer, t_fast = min(t_peer, tp), min(t_fast, tf)
    r_peer = emit("gpt2", "tiktoken", mb, t_peer, True)
    r_fast = emit("gpt2", "cookmind-fast", mb, t_fast, ids_fast == ids_peer)
    t_ref, ids_ref = best_time(gpt2.encode_reference, ref_text, 1)
    r_ref = emit("gpt2", "cookmind-reference", ref_mb, t_ref, ids_ref == peer.encode(ref_text, allowed_special="all"))
    print(
        json.dumps(
            {
                "bench": "encode",
                "tokenizer": "gpt2",
                "fast_over_tiktoken": round(r_fast / r_peer, 3),
                "reference_over_tiktoken": round(r_ref / r_peer, 3),
            }
        ),
        flush=True,
    )

    lines = text.splitlines(keepends=True)
    tb_peer, out_peer = best_time(
        lambda ls: peer.encode_batch(ls, num_threads=args.threads, allowed_special="all"), lines, args.repeat
    )
    tb_fast, out_fast = best_time(lambda ls: gpt2.encode_batch(ls, num_threads=args.threads), lines, args.repeat)
    rb_peer = emit("gpt2", f"tiktoken-batch-{args.threads}threads", mb, tb_peer, True)
    rb_fast = emit("gpt2", f"cookmind-batch-{args.threads}threads", mb, tb_fast, out_fast == out_peer)
    print(
        json.dumps({"bench": "encode", "tokenizer": "gpt2", "batch_over_tiktoken_batch": round(rb_fast / rb_peer, 3)}),
        flush=True,
    )

    t_tfast, ids_tfast = best_time(trained.encode, text, args.repeat)
    r_tfast = emit(f"trained-{trained.vocab_size}", "cookmind-fast", mb, t_tfast, None)
    t_tref, ids_tref = best_time(trained.encode_reference, ref_text, 1)
    r_tref = emit(
        f"trained-{trained.vocab_size}", "cookmind-reference", ref_mb, t_tref, ids_tref == trained.encode(ref_text)
    )
    print(
        json.dumps(
            {
                "bench": "encode",
                "tokenizer": f"trained-{trained.vocab_size}",
                "fast_over_reference": round(r_tfast / r_tref, 3),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
