"""BPE training speed and memory: cookmind's trainer vs Hugging Face `tokenizers` BpeTrainer, same run.

    .venv/bin/python bench/bench_bpe_train.py --mb 50 --vocab 10000 32000 --threads 2

Corpora: ../shared/data/text/corpus.en repeated to --mb; a seeded synthetic multilingual
corpus (Zipf-distributed invented words in eight scripts, every line different) of --mb; and
"real": GSM8K + MMLU from ../shared/data concatenated (about 12 MB, nothing repeated).
The repeated corpus favours our trainer, which pre-tokenizes identical lines once.
Each trainer runs in its own subprocess (so peak RSS is its own); one JSON line per figure:
{"bench": "bpe_train", "corpus", "mb", "vocab_size", "impl", "seconds", "peak_rss_mb", "tokens"}
then one line with the ratio ours/peer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("COOKMIND_SHARED_DATA", ROOT.parent / "shared" / "data"))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

SCRIPTS = {
    "latin": "abcdefghijklmnopqrstuvwxyz",
    "accented": "aeiouéèàùçñöüäßøå",
    "cyrillic": "абвгдежзийклмнопрстуфхцчшщыэюя",
    "greek": "αβγδεζηθικλμνξοπρστυφχψω",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "cjk": "".join(chr(c) for c in range(0x4E00, 0x4E00 + 800)),
    "kana": "".join(chr(c) for c in range(0x3041, 0x3097)),
    "hangul": "".join(chr(c) for c in range(0xAC00, 0xAC00 + 400)),
}


def make_repeated(path: Path, mb: float) -> None:
    base = (SHARED / "text/corpus.en").read_bytes()
    reps = max(1, int(mb * 1e6 // len(base)))
    with open(path, "wb") as f:
        for _ in range(reps):
            f.write(base)


def make_real(path: Path, mb: float) -> None:
    """Real, unrepeated text: GSM8K and MMLU as they lie on disk (about 12 MB, whatever --mb says)."""
    with open(path, "wb") as f:
        for p in sorted((SHARED / "gsm8k").glob("*.jsonl")) + sorted((SHARED / "mmlu").glob("*/*.csv")):
            f.write(p.read_bytes())


def make_multilingual(path: Path, mb: float, seed: int = 0) -> None:
    rng = random.Random(seed)
    lexicon = []
    for alphabet in SCRIPTS.values():
        for _ in range(6000):
            lexicon.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))))
    lexicon += [str(n) for n in range(1000)] + [",", ".", "!", "?", "(", ")", "-", "'s", "«", "»", "—", "…"]
    weights = [1.0 / (r + 1) ** 1.05 for r in range(len(lexicon))]  # Zipf: frequency ~ 1 / rank
    rng.shuffle(lexicon)
    cum, acc = [], 0.0
    for w in weights:
        acc += w
        cum.append(acc)
    target = int(mb * 1e6)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            words = rng.choices(lexicon, cum_weights=cum, k=20_000)
            lines, i = [], 0
            while i < len(words):
                n = rng.randint(3, 25)
                lines.append(" ".join(words[i : i + n]))
                i += n
            block = "\n".join(lines) + "\n"
            if rng.random() < 0.5:
                block += "<|endoftext|>"
            f.write(block)
            written += len(block.encode("utf-8"))


def run_ours(path: str, vocab: int, threads: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from cookmind.tokenizer import train_bpe

    t0 = time.perf_counter()
    v, m = train_bpe(path, vocab, SPECIALS, workers=threads, progress=False)
    return {"seconds": time.perf_counter() - t0, "tokens": len(v)}


def run_hf(path: str, vocab: int, threads: int) -> dict:
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tr = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    t0 = time.perf_counter()
    tk.train([path], tr)
    return {"seconds": time.perf_counter() - t0, "tokens": tk.get_vocab_size()}


def child(args) -> None:
    fn = run_ours if args.child == "cookmind" else run_hf
    out = fn(args.path, args.vocab_size, args.threads)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the process, its threads and its worker processes: robust to a contended machine
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    out.update(
        peak_rss_mb=round(me.ru_maxrss / 1024, 1),
        worker_peak_rss_mb=round(kids.ru_maxrss / 1024, 1),
        cpu_seconds=round(cpu, 3),
    )
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--vocab", type=int, nargs="+", default=[10000, 32000])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--corpora",
        nargs="+",
        default=["corpus.en", "multilingual", "real"],
        choices=["corpus.en", "multilingual", "real"],
    )
    ap.add_argument("--cache-dir", default="/tmp/cookmind_bench")
    ap.add_argument("--child", choices=["cookmind", "hf-tokenizers"])
    ap.add_argument("--path")
    ap.add_argument("--vocab-size", type=int)
    args = ap.parse_args()
    if args.child:
        return child(args)
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    for corpus in args.corpora:
        path = cache / (f"{corpus}-{args.mb:g}mb.txt" if corpus != "real" else "real-gsm8k-mmlu.txt")
        if not path.exists():
            {"corpus.en": make_repeated, "multilingual": make_multilingual, "real": make_real}[corpus](path, args.mb)
        mb = path.stat().st_size / 1e6
        for vocab in args.vocab:
            res = {}
            for impl in ("cookmind", "hf-tokenizers"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    impl,
                    "--path",
                    str(path),
                    "--vocab-size",
                    str(vocab),
                    "--threads",
                    str(args.threads),
                ]
                out = json.loads(
                    subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
                )
                res[impl] = out
                print(
                    json.dumps(
                        {
                            "bench": "bpe_train",
                            "corpus": corpus,
                            "mb": round(mb, 1),
                            "vocab_size": vocab,
                            "impl": impl,
                            "threads": args.threads,
                            "seconds": round(out["seconds"], 3),
                            "cpu_seconds": out["cpu_seconds"],
                            "peak_rss_mb": out["peak_rss_mb"],
                            "worker_peak_rss_mb": out["worker_peak_rss_mb"],
                            "tokens": out["tokens"],
                        }
                    ),
                    flush=True,
                )
            print(
                json.dumps(
                    {
                        "bench": "bpe_train",
                        "corpus": corpus,
                        "mb": round(mb, 1),
                        "vocab_size": vocab,
                        "ratio_seconds_ours_over_peer": round(
                            res["cookmind"]["seconds"] / res["hf-tokenizers"]["seconds"], 3
                        ),
                        "ratio_cpu_ours_over_peer": round(
                            res["cookmind"]["cpu_seconds"] / res["hf-tokenizers"]["cpu_seconds"], 3
                        ),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
