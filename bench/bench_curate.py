"""Curation throughput: documents per second per core, for each stage and for the whole chain.

Input: the seeded synthetic crawl (``--pages`` pages, default 10,000). Each figure is one JSON line.
Per stage, the documents timed are those that reach the stage in pipeline order; CPU time is
``time.process_time`` in this one process, so docs/s per core = documents / CPU seconds.
The peer, measured in the same run on the same texts, is datatrove's equivalent stage where it
runs offline here (its Gopher filters, PII formatter and MinHash signatures, given a whitespace
word tokenizer since spaCy is not installed); its HTML extractor (trafilatura) and language
filter (downloads its model) do not run offline, and the line says so.

    .venv/bin/python bench/bench_curate.py --pages 10000
    PYTHONPATH=/path/to/datatrove .venv/bin/python bench/bench_curate.py   # with the peer
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cookmind.curate import exact_lines, minhash  # noqa: E402
from cookmind.curate.extract import extract_text  # noqa: E402
from cookmind.curate.gopher import gopher_reasons  # noqa: E402
from cookmind.curate.harmful import classify_nsfw, classify_quality, classify_toxic_speech, toxic_line_share  # noqa: E402
from cookmind.curate.langid import identify_language  # noqa: E402
from cookmind.curate.pii import mask_pii  # noqa: E402
from cookmind.curate.runner import BATCH, run_pipeline  # noqa: E402
from cookmind.curate.stages import ToxicStage  # noqa: E402
from cookmind.curate.stats import StageStats  # noqa: E402
from cookmind.demo import curate as curate_demo  # noqa: E402
from cookmind.synthetic.crawl import make_crawl, write_crawl  # noqa: E402


def _cpu(fn, items):
    t0 = time.process_time()
    out = [fn(x) for x in items]
    return time.process_time() - t0, out


def _line(stage, n, cpu_s, peer=None, peer_cpu_s=None, note=None, **extra):
    rec = {
        "bench": "curate",
        "stage": stage,
        "docs": n,
        "cpu_s": round(cpu_s, 3),
        "docs_per_s_per_core": round(n / cpu_s, 1) if cpu_s > 0 else None,
        "peer": peer,
        "peer_docs_per_s_per_core": round(n / peer_cpu_s, 1) if peer_cpu_s else None,
    }
    if peer_cpu_s:
        rec["speedup_vs_peer"] = round(peer_cpu_s / cpu_s, 2)
    if note:
        rec["note"] = note
    rec.update(extra)
    print(json.dumps(rec), flush=True)


def _datatrove():
    """datatrove's offline stages, or None when it is not importable."""
    try:
        from datatrove.data import Document
        from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
        from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
        from datatrove.pipeline.formatters import PIIFormatter
        from datatrove.utils.word_tokenizers import WordTokenizer
    except ImportError:
        return None

    class Whitespace(WordTokenizer):
        def word_tokenize(self, text):
            return text.split()

        def sent_tokenize(self, text):
            return [s for s in text.replace("\n", ". ").split(". ") if s]

        def span_tokenize(self, text):
            spans, start = [], 0
            for s in self.sent_tokenize(text):
                i = text.find(s, start)
                spans.append((i, i + len(s)))
                start = i + len(s)
            return spans

    import datatrove.utils.hashes.xxhash as dt_xxhash
    import xxhash

    # xxhash 4 hashes bytes only; datatrove 0.10 passes str: encode it, the same work our side does
    dt_xxhash.xxhash64 = lambda data: xxhash.xxh64_intdigest(data.encode() if isinstance(data, str) else data)
    dt_xxhash.xxhash32 = lambda data: xxhash.xxh32_intdigest(data.encode() if isinstance(data, str) else data)
    tok = Whitespace()
    return {
        "Document": Document,
        "quality": GopherQualityFilter(language=tok),
        "repetition": GopherRepetitionFilter(language=tok),
        "pii": PIIFormatter(),
        "minhash": MinhashDedupSignature(output_folder=tempfile.mkdtemp(), config=MinhashConfig(), language=tok),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="processes for the parallel whole-chain run")
    args = ap.parse_args()
    dt = _datatrove()
    if dt is None:  # every stage's peer reads null: say why once, before the figures
        print(
            'bench_curate: datatrove is not importable, so no stage has its peer ("peer": null); install it or '
            "run with PYTHONPATH=/path/to/datatrove for the ratios the README gives",
            file=sys.stderr,
            flush=True,
        )
    pages, manifest = make_crawl(args.pages, args.seed)
    htmls = [p.html for p in pages]
    work = Path(tempfile.mkdtemp(prefix="bench-curate-"))
    model = curate_demo.train_quality_model(work / "quality.npz", seed=args.seed)

    cpu, texts = _cpu(extract_text, htmls)
    _line("extract", len(htmls), cpu, note="peer: datatrove's extractor is trafilatura, which fails to import here")
    texts = [t for t in texts if t]
    cpu, langs = _cpu(identify_language, texts)
    _line("langid", len(texts), cpu, note="peer: datatrove's LanguageFilter downloads its model, not offline")
    texts = [t for t, (lang, s) in zip(texts, langs) if lang == "en" and s >= 0.65]
    cpu, reasons = _cpu(gopher_reasons, texts)
    peer_cpu = None
    if dt:
        docs = [dt["Document"](text=t, id=str(i)) for i, t in enumerate(texts)]
        t0 = time.process_time()
        for d in docs:
            dt["quality"].filter(d)
            dt["repetition"].filter(d)
        peer_cpu = time.process_time() - t0
    _line("gopher", len(texts), cpu, "datatrove GopherQualityFilter+GopherRepetitionFilter" if dt else None, peer_cpu)
    texts = [t for t, r in zip(texts, reasons) if not r]

    t0 = time.process_time()
    a, b = minhash.permutations(112, 0)  # datatrove's default: 14 buckets x 8 hashes, 5-grams
    sets = [minhash.shingles(t, 5) for t in texts]
    sigs = [minhash.signature(s, a, b) for s in sets]
    sig_cpu = time.process_time() - t0
    import numpy as np

    keep = minhash.duplicate_clusters(sets, np.stack(sigs), 14, 0.8)
    cpu = time.process_time() - t0
    peer_cpu = None
    if dt:
        t0 = time.process_time()
        for t in texts:
            dt["minhash"].get_signature(dt["minhash"].get_shingles(t))
        peer_cpu = time.process_time() - t0
    _line(
        "minhash_signatures",
        len(texts),
        sig_cpu,
        "datatrove MinhashDedupSignature (shingles+signature)" if dt else None,
        peer_cpu,
    )
    _line("minhash_total", len(texts), cpu, note="signatures + LSH + true-Jaccard check + union-find")
    texts = [t for i, t in enumerate(texts) if keep[i] == i]

    t0 = time.process_time()
    hashes = np.concatenate([exact_lines.line_hashes(t) for t in texts])
    uniq, counts = np.unique(hashes, return_counts=True)
    dup = uniq[counts > 1]
    texts = [exact_lines.remove_lines(t, dup)[0] for t in texts]
    _line("exact_lines", len(texts), time.process_time() - t0)

    cpu, _ = _cpu(mask_pii, texts)
    peer_cpu = None
    if dt:
        docs = [dt["Document"](text=t, id=str(i)) for i, t in enumerate(texts)]
        t0 = time.process_time()
        for d in docs:
            dt["pii"].format(d.text)
        peer_cpu = time.process_time() - t0
    _line("pii", len(texts), cpu, "datatrove PIIFormatter (emails+IPs only)" if dt else None, peer_cpu)
    cpu, nsfw = _cpu(classify_nsfw, texts)
    _line("nsfw", len(texts), cpu)
    texts = [t for t, (lab, _) in zip(texts, nsfw) if lab != "nsfw"]
    classify_toxic_speech("warm-up")  # the import of scikit-learn and the model is not per document
    sample = texts[:1000]
    cpu, _ = _cpu(lambda t: (classify_toxic_speech(t), toxic_line_share(t, 0.9)), sample)
    _line("toxic_per_doc", len(sample), cpu, note="two model calls per document (the unbatched path)")
    stage, st = ToxicStage(), StageStats("toxic")
    t0 = time.process_time()
    for k in range(0, len(texts), BATCH):
        stage.process_batch([{"text": t} for t in texts[k : k + BATCH]], st)
    _line("toxic", len(texts), time.process_time() - t0, note=f"batched as in the runner ({BATCH} docs per call)")
    classify_quality(texts[0], str(model))
    cpu, _ = _cpu(lambda t: classify_quality(t, str(model)), texts)
    _line("quality", len(texts), cpu)

    # the whole chain through the runner, from HTML shards to curated shards
    crawl_dir = work / "crawl"
    write_crawl(crawl_dir, args.pages, args.seed, num_shards=max(4, args.workers * 2))
    cfg = curate_demo.demo_config(model)
    t0, w0 = time.process_time(), time.time()
    res = run_pipeline(cfg, [str(crawl_dir)], work / "out1", workers=1, progress=False)
    cpu, wall = time.process_time() - t0, time.time() - w0
    _line("whole_chain", args.pages, cpu, wall_s=round(wall, 2), workers=1, docs_out=res.stages[-1].docs_out)
    w0 = time.time()
    c0 = os.times()
    res = run_pipeline(cfg, [str(crawl_dir)], work / "out2", workers=args.workers, progress=False)
    c1 = os.times()
    wall = time.time() - w0
    cpu = (
        (c1.user - c0.user)
        + (c1.system - c0.system)
        + (c1.children_user - c0.children_user)
        + (c1.children_system - c0.children_system)
    )
    _line(
        "whole_chain_parallel",
        args.pages,
        cpu,
        wall_s=round(wall, 2),
        workers=args.workers,
        docs_per_s_wall=round(args.pages / wall, 1),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
