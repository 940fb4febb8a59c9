"""`demo_stage`: the first step of `cookmind demo` — make the synthetic crawl, curate it, return clean text."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cookmind.atomic import writing
from cookmind.curate.classifier import ClassifierConfig, train_classifier
from cookmind.curate.config import DEFAULT_STAGES, CurateConfig
from cookmind.curate.extract import extract_text
from cookmind.curate.runner import read_outputs, run_pipeline


def train_quality_model(path: Path, seed: int = 0, num_pages: int = 300, progress: bool = False) -> Path:
    """Train the demo's quality classifier on a separate synthetic crawl (good pages vs spam)."""
    from cookmind.synthetic.crawl import labelled_pages

    records = [
        {"text": extract_text(r["html"]) or "", "label": r["label"]}
        for r in labelled_pages(num_pages, seed=seed + 1000)
    ]
    model = train_classifier(
        records, cfg=ClassifierConfig(dim=16, bucket=1 << 15, epoch=10, lr=1.0, seed=seed), progress=progress
    )
    return model.save(path)


def demo_config(quality_model: Path) -> CurateConfig:
    """The default stages plus the quality classifier, last because it is the most specific judgement."""
    stages = [dict(s) for s in DEFAULT_STAGES] + [{"quality": {"model": str(quality_model), "threshold": 0.5}}]
    return CurateConfig(stages=stages, output_format="jsonl.gz", workers=1)


def demo_stage(workdir: Path, seed: int = 0, num_pages: int = 600, workers: int = 1, progress: bool = True) -> dict:
    """Make the seeded crawl in ``workdir/crawl``, curate it into ``workdir/curated``, and return

    {"text_path": JSONL with one {"text"} per kept page, "report_md", "report_json", "stages": [...],
     "manifest": what the crawl contains, "docs_in", "docs_out", "bytes_out", "seconds"}.
    """
    from cookmind.synthetic.crawl import write_crawl

    t0 = time.time()
    workdir = Path(workdir)
    crawl_dir, out_dir = workdir / "crawl", workdir / "curated"
    manifest = write_crawl(crawl_dir, num_pages=num_pages, seed=seed, num_shards=max(2, workers), replace=True)
    model = train_quality_model(workdir / "quality.npz", seed=seed)
    result = run_pipeline(
        demo_config(model),
        [str(crawl_dir)],
        out_dir,
        executor="local",
        workers=workers,
        restart=True,
        progress=progress,
    )
    text_path = workdir / "curated.jsonl"
    n = nbytes = 0
    with writing(text_path) as f:
        for doc in read_outputs(result.outputs):
            f.write(json.dumps({"text": doc["text"]}, ensure_ascii=False) + "\n")
            n += 1
            nbytes += len(doc["text"].encode("utf-8"))
    return {
        "text_path": text_path,
        "report_md": result.report_md,
        "report_json": result.report_json,
        "stages": [s.to_dict() for s in result.stages],
        "manifest": manifest,
        "docs_in": result.stages[0].docs_in,
        "docs_out": n,
        "bytes_out": nbytes,
        "seconds": round(time.time() - t0, 2),
    }
