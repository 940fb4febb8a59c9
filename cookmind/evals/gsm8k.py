"""GSM8K accuracy: greedy or sampled decoding, pass@k, and a JSONL of every problem, prompt, output and grade."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cookmind import text_input
from cookmind.align.prompts import (
    PROMPTS,
    R1_ZERO_STOP,
    decode_response,
    encode_prompt,
    format_prompt,
    next_question_stops,
    stop_ids_of,
    uses_think_tags,
)
from cookmind.align.rewards import extract_answer, extract_gold, reference_text
from cookmind.atomic import write_jsonl
from cookmind.evals.atomic_io import read_jsonl_lines
from cookmind.evals.passk import pass_at_k
from cookmind.infer import SamplingParams, generate
from cookmind.progress import progress_bar
from cookmind.store.records import check_gradable
from cookmind.tokenizer import Tokenizer
from cookmind.tokenizer.bytes_unicode import without_lone_surrogates


def load_gsm8k(path, limit: int | None = None) -> list[dict]:
    """Problems from a GSM8K-shaped JSONL ({"question", "answer" ending in ``#### N``})."""
    if Path(path).is_dir():  # e.g. GSM8K's folder, or MMLU's root given to the wrong task
        jsonl = sorted(Path(path).glob("*.jsonl"))
        example = Path(path) / "test.jsonl" if (Path(path) / "test.jsonl").is_file() else (jsonl or [None])[0]
        mmlu = any((Path(path) / split).is_dir() for split in ("dev", "val", "test"))
        raise FileNotFoundError(
            f"GSM8K --data {path} is a folder, not a file; pass --data PATH to a JSONL file of "
            '{"question": ..., "answer": "... #### N"} records'
            + (f", e.g. {example}" if example else " (e.g. GSM8K's test.jsonl)")
            + (f"; the folder looks like an MMLU root: `cookmind eval mmlu --data {path}`" if mmlu else "")
        )
    if not text_input.readable_as_file(path):  # a pipe is read too (`--data <(zcat test.jsonl.gz)`)
        raise FileNotFoundError(
            f"GSM8K file {path} not found; pass --data PATH to a JSONL of "
            '{"question": ..., "answer": "... #### N"} records (e.g. GSM8K\'s test.jsonl)'
        )
    rows = read_jsonl_lines(path, limit)
    if not rows:  # a score over no problem would read as a model that got every one wrong
        raise ValueError(
            f"{path}: no GSM8K problems in the file (it is empty or holds only blank lines); pass --data PATH to a "
            'JSONL of {"question": ..., "answer": "... #### N"} records'
        )
    for lineno, row in rows:
        # the field names `pack --train-type grpo` and grpo.eval_problems read, so one problem file serves all three
        question = next((f for f in ("question", "prompt") if isinstance(row, dict) and f in row), None)
        answer = next(
            (f for f in ("answer", "reference_answer", "ground_truth") if isinstance(row, dict) and f in row), None
        )
        if question is None or answer is None:
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(
                f"{path}:{lineno}: a GSM8K record needs a question ('question' or 'prompt') and its answer ('answer', "
                f"'reference_answer' or 'ground_truth'), got {got}; fix the record or pass another --data"
            )
        row["question"], row["answer"] = row.pop(question), row.pop(answer)
        try:  # a number answer is graded as its text; another type would stop the run after the generation
            # errors name the fields as the record spells them ('prompt', 'reference_answer'), not as read here
            if not isinstance(row["question"], str):
                raise ValueError(f"{question!r} must be text, got {type(row['question']).__name__}")
            row["answer"] = reference_text(row["answer"], answer)
            for field, named in (("question", question), ("answer", answer)):  # as pack reads it: a bad record
                if not row[field].strip():
                    raise ValueError(f"empty text in {named!r}; fix or remove the record")
            check_gradable(row["answer"], answer)
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: {exc}") from None
        for field in ("question", "answer"):  # JSON's "\\ud800", no character: as the encoder reads it, and --out
            row[field] = without_lone_surrogates(row[field])  # can write it (UTF-8 cannot hold a lone surrogate)
    return [row for _, row in rows]


def chunk_seed(seed: int, start: int) -> int:
    """The first row's seed of the chunk of problems from ``start`` (its rows take the next ones): a hash of the run's
    seed and ``start``, 62 bits, so that no two chunks or seeds share their streams."""
    digest = hashlib.blake2b(f"gsm8k:{seed}:{start}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


def count_records(path) -> int | None:
    """The records of a JSONL file (its lines that are not blank), read again to say how many --limit left out;
    None for a pipe, which has been read once."""
    if not Path(path).is_file():
        return None
    # as load_gsm8k reads it: a .gz decompressed (its compressed bytes' newlines are no records), a BOM no text
    return sum(1 for _, line in text_input.utf8_lines(path) if line.strip())


def as_problem(p) -> dict:
    """A problem as {"question", "answer"}, from a dict or an object with those attributes."""
    if isinstance(p, dict):
        return {"question": p["question"], "answer": p["answer"]}
    return {"question": p.question, "answer": p.answer}


def context_length(model) -> int | None:
    """The model's context in tokens (``config.max_position_embeddings``), or None when it does not say."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def too_long(prompt_len: int, context: int | None) -> str | None:
    """Why a prompt cannot be answered (it leaves no room for one new token), or None when it fits."""
    if context is not None and prompt_len >= context:
        return f"prompt of {prompt_len} tokens fills the model's context of {context} tokens"
    return None


def reward_fn_for(template: str):
    """Tag-based grading when the prompt opens a <think> block, ``#### N`` for chat, else the last number."""
    from cookmind.align.rewards import reward_fn_for_template

    return reward_fn_for_template(template)


def check_options(template: str, num_samples: int, ks, temperature: float) -> None:
    """ValueError naming the flag when --template, --num-samples, --k and --temperature cannot work together: what
    `cookmind eval gsm8k` checks before it loads the model."""
    if temperature <= 0 and num_samples > 1:
        raise ValueError(
            f"--num-samples {num_samples} with greedy decoding (--temperature 0) gives the same answer every time; "
            "set --temperature > 0 (e.g. 0.7)"
        )
    too_many = [k for k in ks if not 1 <= k <= num_samples]
    if too_many:
        raise ValueError(
            f"--k {too_many[0]}: pass@{too_many[0]} needs 1..{num_samples} samples a problem (--num-samples); raise "
            f"--num-samples (with --temperature > 0) or drop {', '.join(map(str, too_many))} from --k"
        )
    if template != "chat" and template not in PROMPTS and "{question}" not in template:
        names = ["chat", *sorted(PROMPTS)]
        raise ValueError(
            f"--template {template!r} is neither one of {names} nor a string with {{question}}; name one, or put "
            "{question} where the question goes"
        )


def evaluate_gsm8k(
    model,
    tokenizer,
    problems,
    out_path=None,
    template: str = "r1_zero",
    num_samples: int = 1,
    ks: tuple[int, ...] = (1,),
    temperature: float = 0.0,
    max_new_tokens: int = 256,
    seed: int = 0,
    batch_size: int = 64,
    stop_strings: tuple[str, ...] | None = None,
    progress: bool = True,
) -> dict:
    """Generate ``num_samples`` answers per problem and grade them.

    Returns {"accuracy" (mean over all samples), "pass@k" for each k (each must be <= num_samples),
    "format_rate", "num_problems" (graded), "num_skipped_too_long", and the generation settings: "template",
    "temperature", "max_new_tokens", "seed", "batch_size"}; with ``out_path`` writes one
    JSONL record per problem. A problem whose prompt fills the model's context is not generated:
    it is counted in ``num_skipped_too_long``, left out of the scores, and its record says why.
    Greedy decoding (temperature 0) with num_samples > 1 would repeat itself, so it is refused.
    """
    check_options(template, num_samples, ks, temperature)
    if template == "chat" and isinstance(tokenizer, Tokenizer) and None in (tokenizer.im_start_id, tokenizer.im_end_id):
        # ours without ChatML's tokens (GPT-2's imported; a Hugging Face one renders its own template): its own
        # refusal's hint is for generate and pack
        raise ValueError(
            "--template chat renders chats in ChatML, and this tokenizer has no <|im_start|>/<|im_end|> special "
            "tokens (a base model's): use --template r1_zero, compact or plain"
        )
    problems = [as_problem(p) for p in problems]
    reward_fn = reward_fn_for(template)
    if stop_strings is None:
        # plain: a base model goes on to a question of its own, whose last number was graded
        stop_strings = R1_ZERO_STOP if uses_think_tags(template) else next_question_stops(template)
    stops = tuple(stop_strings)
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        stop_token_ids=stop_ids_of(tokenizer),
        stop_strings=stops,
        seed=seed,
    )
    prompts = [format_prompt(p["question"], template, tokenizer) for p in problems]
    prompt_ids = [encode_prompt(tokenizer, p["question"], template) for p in problems]
    context = context_length(model)
    skipped = {i: why for i, ids in enumerate(prompt_ids) if (why := too_long(len(ids), context))}
    if len(skipped) == len(problems):  # an accuracy over no graded problem would read as 0 right
        raise ValueError(
            f"every one of the {len(problems)} GSM8K prompts fills the model's context of {context} tokens; nothing "
            "to grade: use a model with a longer context, or a shorter --template (compact, plain)"
            if problems
            else "no GSM8K problems to grade"
        )
    records = []
    cut_by_context = 0
    chunk = max(1, batch_size // num_samples)
    bar = progress_bar(total=len(problems), desc="gsm8k", unit="problem", enabled=progress)
    for start in range(0, len(problems), chunk):
        span = range(start, min(start + chunk, len(problems)))
        for i in span:
            if i in skipped:
                records.append(
                    {
                        "index": i,
                        "question": problems[i]["question"],
                        "reference": extract_gold(problems[i]["answer"]),
                        "prompt": prompts[i],
                        "skipped": skipped[i],
                    }
                )
        part = [i for i in span if i not in skipped]
        ids = [prompt_ids[i] for i in part for _ in range(num_samples)]
        # row r of the chunk draws from chunk_seed + r: each (seed, chunk) its own block of streams (seed + start
        # shifted the next chunk's rows, and the next seed's, onto this one's)
        outs = (
            generate(model, ids, params.replace(seed=chunk_seed(seed, start)), tokenizer, batch_size=batch_size)
            if ids
            else []
        )
        for j, i in enumerate(part):
            mine = outs[j * num_samples : (j + 1) * num_samples]
            texts = [decode_response(tokenizer, o) for o in mine]
            scores = [reward_fn(t, problems[i]["answer"]) for t in texts]
            # an answer that reached --max-new-tokens or the context's end was graded as it stood (one that stopped
            # on its very last allowed token counts too: the ids do not say which)
            room = max_new_tokens if context is None else min(max_new_tokens, context - len(prompt_ids[i]))
            cut = [len(o) >= room for o in mine]
            # the context set the room (alone, or with --max-new-tokens ending at the same token): raising
            # --max-new-tokens would not let these end
            if context is not None and context - len(prompt_ids[i]) <= max_new_tokens:
                cut_by_context += sum(cut)
            records.append(
                {
                    "index": i,
                    "question": problems[i]["question"],
                    "reference": extract_gold(problems[i]["answer"]),
                    "prompt": prompts[i],
                    "outputs": texts,
                    "extracted": [extract_answer(t) for t in texts],
                    "format_rewards": [s["format_reward"] for s in scores],
                    "grades": [s["answer_reward"] for s in scores],
                    "cut_short": cut,
                }
            )
        bar.update(len(span))
    bar.close()
    graded = [r for r in records if "skipped" not in r]
    n = max(1, len(graded))
    metrics = {
        "num_problems": len(graded),
        "num_skipped_too_long": len(skipped),
        "context": context,
        "num_samples": num_samples,
        "accuracy": sum(sum(r["grades"]) / num_samples for r in graded) / n,
        "format_rate": sum(sum(r["format_rewards"]) / num_samples for r in graded) / n,
        # answers graded as they were when --max-new-tokens or the context ran out: raise it, or expect misses
        "num_cut_short": sum(sum(r["cut_short"]) for r in graded),
        "num_cut_by_context": cut_by_context,  # of num_cut_short: those the model's context ended
        # what the answers were generated under (with the seed, batch_size decides sampled ones)
        "template": template,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "batch_size": batch_size,
    }
    for k in ks:
        metrics[f"pass@{k}"] = sum(pass_at_k(num_samples, int(sum(r["grades"])), k) for r in graded) / n
    if out_path is not None:
        write_jsonl(Path(out_path), sorted(records, key=lambda r: r["index"]))
    return metrics
