"""MMLU: option log-likelihood or generation scoring, accuracy per subject and macro-averaged.

Scoring modes:
  letter     argmax_X log p(" X" | prompt)          for X in A..D (the prompt lists the options)
  option     argmax_i log p(" option_i" | prompt) / len  (length-normalised continuation)
  generate   decode greedily and read the letter with ``parse_mmlu_response``
"""

from __future__ import annotations

import csv
from collections import Counter, defaultdict
from pathlib import Path

import torch

from cookmind import text_input
from cookmind.align.losses import get_response_log_probs, pack_prompt_and_output
from cookmind.align.prompts import decode_response, pad_id_of, prompt_ids, stop_ids_of
from cookmind.align.rewards import LETTERS, parse_mmlu_response
from cookmind.atomic import write_jsonl
from cookmind.evals.gsm8k import context_length, too_long
from cookmind.infer import SamplingParams, generate
from cookmind.progress import progress_bar
from cookmind.tokenizer.documents import continuation_ids

SCORINGS = ("letter", "option", "generate")


def load_mmlu(
    root, split: str = "test", subjects: list[str] | None = None, limit_per_subject: int | None = None
) -> list[dict]:
    """Rows {"subject", "question", "options": [4], "answer": "A".."D"} from ``root/split/<subject>_<split>.csv``."""
    if Path(root).is_file():  # e.g. a GSM8K JSONL given to the wrong task
        raise NotADirectoryError(
            f"MMLU --data {root} is a file, not a folder; pass --data ROOT, the folder holding "
            "{dev,val,test}/<subject>_<split>.csv (question,A,B,C,D,answer rows, no header)"
            + ("; a GSM8K JSONL is `cookmind eval gsm8k --data`" if Path(root).suffix == ".jsonl" else "")
        )
    folder = Path(root) / split
    if not folder.is_dir():
        # the split folder itself given (its CSVs inside): the root is its parent
        inside = Path(root).is_dir() and any(Path(root).glob("*_*.csv"))
        raise FileNotFoundError(
            f"MMLU split folder {folder} not found; "
            + (
                f"{root} holds the split's CSV files itself: pass its parent, --data {Path(root).parent}"
                + (f" (with --split {Path(root).name})" if Path(root).name in {"dev", "val", "test"} - {split} else "")
                if inside
                else "pass --data ROOT, a folder holding {dev,val,test}/<subject>_<split>.csv (question,A,B,C,D,"
                "answer rows, no header)"
            )
        )
    rows = []
    suffix = f"_{split}.csv"
    files = sorted(folder.glob(f"*{suffix}"))
    found = {f.name[: -len(suffix)] for f in files}
    if subjects:
        missing = sorted(set(subjects) - found)
        if missing:
            raise ValueError(f"MMLU subjects {missing} not in {folder}; known: {', '.join(sorted(found)[:8])}, ...")
    for f in files:
        subject = f.name[: -len(suffix)]
        if subjects and subject not in subjects:
            continue
        rows += _subject_rows(f, subject, limit_per_subject)
    if not rows:  # a score over no question would read as a model that got every one wrong
        read = [f for f in files if not subjects or f.name[: -len(suffix)] in subjects]
        what = (
            f"{len(read)} CSV file{'s' if len(read) != 1 else ''}, every one empty"
            if read
            else f"no <subject>{suffix} files"
        )
        raise ValueError(
            f"no MMLU questions in {folder} ({what}); pass --data ROOT, a folder holding "
            f"{{dev,val,test}}/<subject>_<split>.csv (question,A,B,C,D,answer rows, no header)"
        )
    return rows


def subjects_in(root, split: str = "test", subjects: list[str] | None = None) -> list[str]:
    """The subjects ``load_mmlu`` reads: ``subjects`` of those with a CSV of ``split`` under ``root``, else all."""
    suffix = f"_{split}.csv"
    found = sorted(f.name[: -len(suffix)] for f in (Path(root) / split).glob(f"*{suffix}"))
    return [s for s in found if not subjects or s in subjects]


def count_questions(root, split: str, subjects: list[str]) -> int | None:
    """The CSV records of these subjects' files: how many questions the data holds where --limit-per-subject read
    fewer; None when a file past the rows read does not parse (nothing was read from there)."""
    total = 0
    try:
        for subject in subjects:
            with open(Path(root) / split / f"{subject}_{split}.csv", newline="", encoding="utf-8-sig") as fh:
                total += sum(1 for _ in csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return total


def _subject_rows(f: Path, subject: str, limit: int | None) -> list[dict]:
    """One subject's CSV; an error names the file line a record starts on (a quoted field may span lines)."""
    rows = []
    with open(f, newline="", encoding="utf-8-sig") as fh:  # -sig: Excel's "CSV UTF-8" opens with a BOM
        reader = csv.reader(fh)
        start = 1  # the file line the next record starts on
        try:
            for n, rec in enumerate(reader, 1):
                if limit is not None and n > limit:
                    break
                # one letter: LETTERS is a string, and "", "AB" and "ABCD" are substrings of it
                if len(rec) != 6 or rec[5].strip() not in tuple(LETTERS):
                    if len(rec) != 6:
                        found = f"got {len(rec)} fields"
                    elif n == 1 and rec[5].strip().lower() == "answer":
                        found = "this looks like a header row; MMLU's CSVs have none: remove it"
                    else:
                        found = f"got answer {rec[5].strip()!r}" + (" (none)" if not rec[5].strip() else "")
                    raise ValueError(f"{f}:{start}: expected question,A,B,C,D,answer with answer in A-D; {found}")
                rows.append({"subject": subject, "question": rec[0], "options": rec[1:5], "answer": rec[5].strip()})
                start = reader.line_num + 1
        except UnicodeDecodeError:
            raise ValueError(text_input.first_bad_utf8(f)) from None
        except csv.Error as exc:  # a field past csv's size limit (a quote left open over the rest of the file)
            raise ValueError(f"{f}:{start}: not a CSV record ({exc}); MMLU rows are question,A,B,C,D,answer") from None
    return rows


def mmlu_prompt(row: dict) -> str:
    """The zero-shot prompt: subject line, question, lettered options, then "Answer:"."""
    subject = row["subject"].replace("_", " ")
    lines = [f"The following is a multiple choice question about {subject}.", "", row["question"].strip()]
    lines += [f"{letter}. {opt}" for letter, opt in zip(LETTERS, row["options"])]
    return "\n".join(lines) + "\nAnswer:"


def _policy(model):
    """A logits callable over (B, T) ids for either our model or a Hugging Face one."""
    return lambda ids: model(ids)


def answer_ids(tokenizer, prompt: str, answers: list[str]) -> tuple[list[int], list[list[int]]]:
    """(the prompt's ids, each answer's ids after them). An answer's are what the tokenizer gives prompt and answer
    written together, past the prompt's own (lm-evaluation-harness's rule): a SentencePiece-style tokenizer (Llama
    2's, Mistral's) encodes " A" alone as "▁▁A", but "Answer: A" as "Answer:" then "▁A". Where the two encodings
    part before the prompt's end (a token across the seam), the answer is encoded alone."""
    context = prompt_ids(tokenizer, prompt)
    return context, [continuation_ids(tokenizer, prompt, answer)[1] for answer in answers]


def _answers(row: dict, scoring: str) -> list[str]:
    """The continuations scored after the prompt: " A".." D", or " " and each option's text."""
    return [f" {x}" for x in (LETTERS if scoring == "letter" else row["options"])]


@torch.no_grad()
def _answer_log_probs(model, tokenizer, part: list[dict], scoring: str) -> torch.Tensor:
    """(questions, 4): log p(answer | prompt) of each question's four answers, per token with ``option``."""
    prompts, answers = [], []
    for row in part:
        context, ids = answer_ids(tokenizer, mmlu_prompt(row), _answers(row, scoring))
        prompts += [context] * len(ids)
        answers += ids
    batch = pack_prompt_and_output(prompts, answers, pad_id_of(tokenizer))
    lp = get_response_log_probs(_policy(model), batch["input_ids"], batch["labels"])["log_probs"]
    mask = batch["response_mask"].float()
    total = (lp * mask).sum(-1)
    total = total / mask.sum(-1).clamp(min=1) if scoring == "option" else total
    return total.view(len(part), len(LETTERS))


def _why_too_long(row: dict, scoring: str, tokenizer, context: int | None) -> str | None:
    """Why ``row`` cannot be scored within the model's context, or None when it fits."""
    if context is None:
        return None
    text = mmlu_prompt(row)
    if scoring == "generate":
        return too_long(len(prompt_ids(tokenizer, text)), context)
    context_ids, ids = answer_ids(tokenizer, text, _answers(row, scoring))
    longest = len(context_ids) + max(map(len, ids)) - 1  # the last token is only a target
    if longest > context:
        return f"prompt and option of {longest} tokens exceed the model's context of {context} tokens"
    return None


def evaluate_mmlu(
    model,
    tokenizer,
    rows: list[dict],
    scoring: str = "letter",
    out_path=None,
    batch_size: int = 8,
    max_new_tokens: int = 16,
    progress: bool = True,
) -> dict:
    """Accuracy per subject, macro average (mean of subjects) and micro average (mean of questions).

    A question whose prompt (with its longest option) does not fit the model's context is not
    scored: it is counted in ``num_skipped_too_long`` and left out of the accuracies. ``generate`` also counts the
    answers that name no letter (``num_no_letter``, each record's ``no_letter``; graded wrong) and the share that
    name one (``format_rate``).
    """
    if scoring not in SCORINGS:
        raise ValueError(f"unknown MMLU scoring {scoring!r}; choose one of {SCORINGS}")
    device = next(model.parameters()).device
    context = context_length(model)
    why = [_why_too_long(r, scoring, tokenizer, context) for r in rows]
    skipped_records = [
        {"subject": r["subject"], "question": r["question"], "answer": r["answer"], "skipped": w}
        for r, w in zip(rows, why)
        if w is not None
    ]
    skipped = len(skipped_records)
    if skipped == len(rows):  # an accuracy over no scored question would read as 0 right
        raise ValueError(
            f"every one of the {len(rows)} MMLU questions is too long for the model's context of {context} tokens; "
            "nothing to score: use a model with a longer context"
            if rows
            else "no MMLU questions to score"
        )
    subjects = sorted({r["subject"] for r in rows})
    rows = [r for r, w in zip(rows, why) if w is None]
    records = []
    bar = progress_bar(total=len(rows), desc=f"mmlu/{scoring}", unit="q", enabled=progress)
    for start in range(0, len(rows), batch_size):
        part = rows[start : start + batch_size]
        prompts = [mmlu_prompt(r) for r in part]
        if scoring == "generate":
            params = SamplingParams(
                max_new_tokens=max_new_tokens,
                temperature=0.0,
                stop_token_ids=stop_ids_of(tokenizer),
                stop_strings=("\n",),
            )
            ids = [prompt_ids(tokenizer, p) for p in prompts]
            outs = generate(model, ids, params, tokenizer, batch_size=batch_size)
            texts = [decode_response(tokenizer, o) for o in outs]
            preds = [parse_mmlu_response(r, t) for r, t in zip(part, texts)]
            scores = [None] * len(part)
        else:
            s = _answer_log_probs(model, tokenizer, part, scoring).to(device)
            preds = [LETTERS[int(i)] for i in s.argmax(-1)]
            scores = s.tolist()
            texts = [None] * len(part)
        for r, p, t, sc in zip(part, preds, texts, scores):
            records.append(
                {
                    "subject": r["subject"],
                    "question": r["question"],
                    "answer": r["answer"],
                    "predicted": p,
                    "correct": p == r["answer"],
                    "output": t,
                    "scores": sc,
                    **({"no_letter": p is None} if scoring == "generate" else {}),  # graded wrong, as GSM8K's format
                }
            )
        bar.update(len(part))
    bar.close()
    per_subject: dict[str, list[bool]] = defaultdict(list)
    for rec in records:
        per_subject[rec["subject"]].append(rec["correct"])
    subject_acc = {s: sum(v) / len(v) for s, v in sorted(per_subject.items())}
    metrics = {
        "scoring": scoring,
        "num_questions": len(records),
        "num_skipped_too_long": skipped,
        "context": context,
        # over the subjects with a scored question: one whose every question was too long is not in it
        "macro_accuracy": sum(subject_acc.values()) / max(1, len(subject_acc)),
        "micro_accuracy": sum(r["correct"] for r in records) / max(1, len(records)),
        "per_subject": subject_acc,
        "num_subjects": len(subject_acc),
    }
    if scoring == "generate":  # an answer naming no letter is graded wrong: say how many, as GSM8K's format_rate
        metrics.update(max_new_tokens=max_new_tokens, temperature=0.0)  # what the answers were generated under
        no_letter = sum(r["no_letter"] for r in records)
        metrics["num_no_letter"] = no_letter
        metrics["format_rate"] = 1 - no_letter / max(1, len(records))
    if skipped:
        metrics["skipped_per_subject"] = dict(sorted(Counter(r["subject"] for r in skipped_records).items()))
        metrics["subjects_not_scored"] = [s for s in subjects if s not in subject_acc]
    if out_path is not None:
        write_jsonl(out_path, records + skipped_records)  # a skipped question's record says why, as GSM8K's
    return metrics
