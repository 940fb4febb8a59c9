"""Evaluations: perplexity and bits per byte, GSM8K (accuracy, pass@k), MMLU (per subject, macro)."""

from cookmind.evals.gsm8k import evaluate_gsm8k, load_gsm8k
from cookmind.evals.mmlu import evaluate_mmlu, load_mmlu, mmlu_prompt
from cookmind.evals.passk import pass_at_k
from cookmind.evals.perplexity import (
    evaluate_data,
    evaluate_documents,
    evaluate_store,
    evaluate_text,
    evaluate_text_file,
    sequence_nll,
)

__all__ = [
    "evaluate_data",
    "evaluate_documents",
    "evaluate_gsm8k",
    "evaluate_mmlu",
    "evaluate_store",
    "evaluate_text",
    "evaluate_text_file",
    "load_gsm8k",
    "load_mmlu",
    "mmlu_prompt",
    "pass_at_k",
    "sequence_nll",
]
