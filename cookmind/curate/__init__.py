"""Web-text curation: HTML -> text, language id, Gopher rules, PII masking, harmful-content and
quality classifiers, exact-line and MinHash dedup, decontamination against eval sets, and a shard
runner (local processes or Ray).

Heavy dependencies (fastText, scikit-learn, Ray) load only when the function that needs them runs.
"""

from __future__ import annotations

from cookmind.curate.classifier import FastTextClassifier, load_classifier, train_classifier
from cookmind.curate.config import CurateConfig
from cookmind.curate.exact_lines import exact_line_dedup
from cookmind.curate.extract import extract_text
from cookmind.curate.gopher import GopherConfig, gopher_quality_filter, gopher_reasons
from cookmind.curate.harmful import classify_nsfw, classify_quality, classify_toxic_speech
from cookmind.curate.langid import identify_language
from cookmind.curate.minhash import minhash_dedup
from cookmind.curate.pii import mask_emails, mask_ips, mask_phone_numbers, mask_pii
from cookmind.curate.runner import run_pipeline

__all__ = [
    "CurateConfig",
    "FastTextClassifier",
    "GopherConfig",
    "classify_nsfw",
    "classify_quality",
    "classify_toxic_speech",
    "exact_line_dedup",
    "extract_text",
    "gopher_quality_filter",
    "gopher_reasons",
    "identify_language",
    "load_classifier",
    "mask_emails",
    "mask_ips",
    "mask_phone_numbers",
    "mask_pii",
    "minhash_dedup",
    "run_pipeline",
    "train_classifier",
]
