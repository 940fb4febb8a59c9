"""`cookmind demo`: every stage end to end on the embedded synthetic data, on a laptop CPU.

    [curate] -> data -> tokenizer -> pack -> pretrain -> eval -> SFT -> eval -> DPO (LoRA) -> eval
             -> [GRPO] -> sample chats -> report

The demo is a list of stage functions ``stage(ctx) -> dict`` run in order over one
``DemoContext``; a later issue appends a stage (``STAGES.insert``, or a plugin module that
exposes ``demo_stage``). Each stage records what it did in ``ctx.results[name]`` and the
final report (``<workdir>/report.md``) shows whether each stage did its job: loss fell,
SFT taught the answer format, accuracy on 200 held-out arithmetic problems moved.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cookmind.atomic import building_dir, write_text
from cookmind.terminal import show

DEMO_PROMPTS = [
    "Tom has 5 apples. He gets 3 more, gives away 2, and then finds 4 more. How many apples does Tom have now?",
    "Lily has 12 stickers. She gives 4 to Sam. How many stickers does Lily have left?",
    "What color is the sky?",
    "Tell me a short story about a cat.",
]


@dataclass
class DemoSizes:
    """How much data and how many steps each stage gets (``quick`` shrinks all of it for tests)."""

    stories: int = 5000
    pretrain_problems: int = 3000
    sft_chats: int = 1400
    dpo_pairs: int = 800
    val_items: int = 200
    eval_problems: int = 200
    vocab_size: int = 1024
    level: int = 5  # three-step word problems (cookmind.synthetic.arithmetic)
    max_number: int = 10
    # Pretraining text shows its working (as worked solutions on the web do); the chat demonstrations
    # are few (~1000) and mostly terse: only this share of them writes the steps out. GRPO then
    # finds out, from the verifier alone, that writing the steps pays (cookmind/demo/rl.py).
    worked_fraction: float = 0.3
    # The preference pairs prefer a correct worked answer (this share shows the steps) over a wrong one, which
    # mining replaces by the SFT model's own wrong answer where it has one (stage_mine_pairs).
    dpo_worked_fraction: float = 1.0
    pretrain_steps: int = 400
    sft_steps: int = 500
    dpo_steps: int = 100
    crawl_pages: int = 300
    model: dict[str, Any] = field(
        default_factory=lambda: dict(
            hidden_size=128,
            intermediate_size=352,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
        )
    )

    @classmethod
    def quick(cls) -> DemoSizes:
        """A smoke-test size: every stage runs, in well under a minute."""
        return cls(
            stories=150,
            pretrain_problems=100,
            sft_chats=120,
            dpo_pairs=40,
            val_items=20,
            eval_problems=20,
            vocab_size=300,
            pretrain_steps=6,
            sft_steps=4,
            dpo_steps=3,
            crawl_pages=40,
            model=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=1,
                max_position_embeddings=128,
                tie_word_embeddings=True,
            ),
        )


@dataclass
class DemoContext:
    """Everything the stages share: where files go, what each stage produced."""

    workdir: Path
    seed: int = 0
    sizes: DemoSizes = field(default_factory=DemoSizes)
    progress: bool = True
    skip_curate: bool = False
    paths: dict[str, Path] = field(default_factory=dict)  # corpus, tokenizer, stores, eval set
    checkpoints: dict[str, Path] = field(default_factory=dict)  # stage -> its final checkpoint
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def policy(self) -> Path | None:
        """The newest trained model (the last stage's checkpoint)."""
        return list(self.checkpoints.values())[-1] if self.checkpoints else None

    def say(self, msg: str) -> None:
        """A progress line."""
        if self.progress:
            show(f"[demo] {msg}")  # it names the user's --workdir


Stage = tuple[str, Callable[[DemoContext], dict[str, Any]]]


# -- stages ----------------------------------------------------------------------------------


def stage_curate(ctx: DemoContext) -> dict[str, Any]:
    """Curate a synthetic web crawl (cookmind.curate) into clean text for pretraining."""
    if ctx.skip_curate:
        return {"skipped": "--skip-curate"}
    from cookmind.demo.curate import demo_stage

    out = demo_stage(ctx.workdir / "curate", seed=ctx.seed, num_pages=ctx.sizes.crawl_pages, progress=ctx.progress)
    ctx.paths["curated"] = Path(out["text_path"])
    res = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in out.items()
        if k in ("text_path", "docs_in", "docs_out", "bytes_out", "seconds", "report_md")
    }
    res["planted"] = out["manifest"]["kinds"]  # what the crawl contains, to read the removals against
    return res


def stage_data(ctx: DemoContext) -> dict[str, Any]:
    """Write the synthetic corpora: stories + worked problems (pretrain), chats (SFT), pairs (DPO), eval set."""
    from cookmind.synthetic import arithmetic_problems, chats, preference_pairs, problem_chat, stories

    s, d = ctx.sizes, ctx.workdir / "data"
    d.mkdir(parents=True, exist_ok=True)
    # The held-out problems come first; every training set excludes their questions.
    held_out = arithmetic_problems(s.eval_problems, seed=ctx.seed + 1, level=s.level, max_number=s.max_number)
    exclude = {p.question for p in held_out}
    _write_jsonl(d / "eval_problems.jsonl", [p.to_dict() | {"value": p.value} for p in held_out])

    texts = stories(s.stories + s.val_items, seed=ctx.seed)
    problems = arithmetic_problems(
        s.pretrain_problems, seed=ctx.seed + 2, level=s.level, max_number=s.max_number, exclude=exclude
    )
    docs = texts[: s.stories] + [f"Question: {p.question}\nAnswer: {p.answer}" for p in problems]
    _shuffle(docs, ctx.seed)
    _write_jsonl(d / "pretrain.jsonl", [{"text": t} for t in docs])
    _write_jsonl(d / "pretrain_val.jsonl", [{"text": t} for t in texts[s.stories :]])

    sft = chats(
        s.sft_chats + s.val_items,
        seed=ctx.seed + 3,
        level=s.level,
        max_number=s.max_number,
        exclude=exclude,
        worked_fraction=s.worked_fraction,
    )
    _write_jsonl(d / "sft.jsonl", [{"messages": m} for m in sft[: s.sft_chats]])
    _write_jsonl(d / "sft_val.jsonl", [{"messages": m} for m in sft[s.sft_chats :]])

    pairs = preference_pairs(
        s.dpo_pairs + s.val_items // 2,
        seed=ctx.seed + 4,
        level=s.level,
        max_number=s.max_number,
        exclude=exclude,
        worked_fraction=s.dpo_worked_fraction,
    )
    _write_jsonl(d / "dpo.jsonl", pairs[: s.dpo_pairs])
    _write_jsonl(d / "dpo_val.jsonl", pairs[s.dpo_pairs :])

    # Tokenizer corpus: everything the model will read, in plain text.
    corpus = d / "corpus.txt"
    parts = docs + [m["content"] for c in sft for m in c] + _curated_texts(ctx)
    _atomic_text(corpus, "\n".join(parts))
    ctx.paths.update(data=d, corpus=corpus, eval_problems=d / "eval_problems.jsonl")
    example = problem_chat(held_out[0])
    return {
        "stories": s.stories,
        "pretrain_problems": len(problems),
        "sft_chats": s.sft_chats,
        "dpo_pairs": s.dpo_pairs,
        "held_out_problems": len(held_out),
        "corpus_bytes": corpus.stat().st_size,
        "example_problem": example[0]["content"],
        "example_answer": example[1]["content"],
    }


def stage_tokenizer(ctx: DemoContext) -> dict[str, Any]:
    """Train a byte-level BPE on the corpus (cookmind.tokenizer)."""
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe
    from cookmind.tokenizer.cli import is_saved_tokenizer

    # its bars on a terminal only (None): into a pipe or a log tqdm writes carriage returns and redraws
    progress = None if ctx.progress else False
    vocab, merges = train_bpe(ctx.paths["corpus"], ctx.sizes.vocab_size, DEFAULT_SPECIAL_TOKENS, progress=progress)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    out = ctx.workdir / "tokenizer"
    # built whole and renamed: an earlier tokenizer's files never stay mixed into this one
    with building_dir(out, replace=True, is_ours=is_saved_tokenizer, what="tokenizer folder") as tmp:
        tok.save(tmp)
    ctx.paths["tokenizer"] = out
    sample = "Tom has 12 apples. 12 + 7 = 19"
    return {
        "vocab_size": tok.vocab_size,
        "merges": len(merges),
        "example": sample,
        "example_tokens": [tok.decode([i]) for i in tok.encode(sample)],
    }


def stage_pack(ctx: DemoContext) -> dict[str, Any]:
    """Tokenize the corpora into token stores (cookmind.store.packer)."""
    from cookmind.store.packer import pack

    d, stores = ctx.paths["data"], ctx.workdir / "stores"
    plan = {
        "pretrain": ("seq", ["pretrain.jsonl"]),
        "pretrain_val": ("seq", ["pretrain_val.jsonl"]),
        "sft": ("sft", ["sft.jsonl"]),
        "sft_val": ("sft", ["sft_val.jsonl"]),
        "dpo": ("dpo", ["dpo.jsonl"]),
        "dpo_val": ("dpo", ["dpo_val.jsonl"]),
    }
    out = {}
    for name, (train_type, files) in plan.items():
        inputs = [d / f for f in files]
        if name == "pretrain" and "curated" in ctx.paths:
            inputs.append(ctx.paths["curated"])
        meta = pack(
            inputs, stores / f"{name}.bin", str(ctx.paths["tokenizer"]), train_type, overwrite=True, progress=False
        )
        ctx.paths[f"store_{name}"] = stores / f"{name}.bin"
        out[name] = {"records": meta["num_records"], "tokens": meta["num_tokens"]}
    return out


def _train(
    ctx: DemoContext,
    name: str,
    overrides: dict[str, dict[str, Any]],
    callbacks: list | None = None,
    stop_ok: bool = False,
) -> dict[str, Any]:
    """Run one Trainer stage from the demo preset plus ``overrides``; record its checkpoint.

    ``stop_ok``: a run stopped by one of ``callbacks`` (a safety guard) is a result, not an interruption.
    """
    from cookmind.train import TrainConfig, Trainer

    cfg = TrainConfig.load("demo")
    cfg.model = dict(ctx.sizes.model)
    run_dir = ctx.workdir / "runs" / name
    base = {
        "data": {"tokenizer": str(ctx.paths["tokenizer"])},
        "train": {"seed": ctx.seed, "threads": 0},  # the demo's own --threads decides
        "logging": {"run_dir": str(run_dir), "progress": ctx.progress, "log_every": 10},
        "checkpoint": {"keep_last": 1, "overwrite": True},  # the demo owns its work directory
    }
    for section, values in overrides.items():
        base.setdefault(section, {}).update(values)
    if "init_from" in base["train"]:
        cfg.model = {}
    cfg.update(base, source=f"demo stage {name}")
    # at least five logged steps, so the report's loss arrow and plot span the run (--quick runs 4-6 steps)
    cfg.logging.log_every = max(1, min(cfg.logging.log_every, cfg.train.max_steps // 5))
    if cfg.optim.warmup_steps >= cfg.train.max_steps:  # --quick: the full demo's warm-up would be the whole run
        cfg.optim.warmup_steps = cfg.train.max_steps // 5
    cfg.validate()
    ctx.say(
        f"{name}: {cfg.train.max_steps} steps, objective {cfg.train.objective}"
        + (" with LoRA" if cfg.lora.enabled else "")
    )
    trainer = Trainer(cfg, callbacks=callbacks)
    params = sum(p.numel() for p in trainer.bare_model.parameters() if p.requires_grad)
    summary = trainer.fit()
    if summary["status"] != "completed" and not (stop_ok and summary["status"] == "stopped"):
        raise SystemExit(
            f"cookmind demo: the {name} stage was interrupted ({summary['status']} at step "
            f"{summary['steps']}); its checkpoint is in {trainer.ckpt_dir}"
        )
    from cookmind.train.checkpoint import find_latest_checkpoint
    from cookmind.train.metrics import read_metrics

    ctx.checkpoints[name] = find_latest_checkpoint(trainer.ckpt_dir)
    train_losses = [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("split") == "train"]
    return {
        "trainable_params": params,
        "first_loss": train_losses[0] if train_losses else None,
        "last_loss": train_losses[-1] if train_losses else None,
        "report": str(run_dir / "report.md"),
        "train_seconds": summary["seconds"],
        "status": summary["status"],
        "run_dir": str(run_dir),
        **{
            k: v
            for k, v in summary.items()
            if k in ("steps", "tokens", "val_loss", "val_ppl", "val_reward_accuracy", "val_reward_margin")
        },
    }


def stage_pretrain(ctx: DemoContext) -> dict[str, Any]:
    """Pretrain a small CookMind on stories, worked problems (and curated web text)."""
    return _train(
        ctx,
        "pretrain",
        {
            "train": {"objective": "pretrain", "max_steps": ctx.sizes.pretrain_steps},
            "data": {"train_path": str(ctx.paths["store_pretrain"]), "val_path": str(ctx.paths["store_pretrain_val"])},
            "eval": {"every": 0, "prompts": ["Once upon a time", "Question: Tom has 3 apples."]},
        },
    )


def stage_sft(ctx: DemoContext) -> dict[str, Any]:
    """Supervised fine-tuning on chats: only the assistant's tokens are trained."""
    return _train(
        ctx,
        "sft",
        {
            "train": {
                "objective": "sft",
                "max_steps": ctx.sizes.sft_steps,
                "init_from": str(ctx.checkpoints["pretrain"]),
            },
            "data": {"train_path": str(ctx.paths["store_sft"]), "val_path": str(ctx.paths["store_sft_val"])},
            "optim": {"lr": 1e-3, "warmup_steps": 10},
            "eval": {"every": 0, "prompts": DEMO_PROMPTS[:2]},
        },
    )


# The length cap of the SFT model's answers mined and of the held-out answers: a three-step worked answer is ~25 tokens.
HELDOUT_MAX_NEW_TOKENS = 40


def stage_mine_pairs(ctx: DemoContext) -> dict[str, Any]:
    """Preference pairs from the SFT model's own mistakes: the correct answer over the model's wrong one.

    The validation pairs are mined the same way, so DPO's held-out reward accuracy measures what it was trained
    for: preferring the right answer over what this model says when it is wrong, on questions it never trained on.
    """
    from cookmind.evals import gsm8k as gsm8k_eval
    from cookmind.model import load_model
    from cookmind.store.packer import pack
    from cookmind.tokenizer import Tokenizer

    model = load_model(ctx.checkpoints["sft"]).eval()
    tokenizer = Tokenizer.load(ctx.paths["tokenizer"])
    out: dict[str, Any] = {}
    for name in ("dpo", "dpo_val"):
        rows = [json.loads(line) for line in (ctx.paths["data"] / f"{name}.jsonl").read_text().splitlines()]
        # graded as `cookmind eval gsm8k --template chat` grades the held-out problems (and GRPO its rollouts)
        problems = [{"question": r["chosen"][0]["content"], "answer": r["chosen"][-1]["content"]} for r in rows]
        answers = ctx.workdir / "eval" / f"sft_on_{name}.jsonl"
        with torch.no_grad():
            gsm8k_eval.evaluate_gsm8k(
                model,
                tokenizer,
                problems,
                answers,
                template="chat",
                temperature=0.0,
                max_new_tokens=HELDOUT_MAX_NEW_TOKENS,
                batch_size=100,
                progress=False,
            )
        records = [json.loads(line) for line in answers.read_text().splitlines()]
        pairs, mined, empty = [], 0, 0
        for row, record in zip(rows, records):
            answer = record["outputs"][0]
            empty += not answer.strip()
            if not record["grades"][0] and answer.strip():
                # on-policy: push down exactly what the model says when it is wrong
                wrong = row["chosen"][:-1] + [{"role": "assistant", "content": answer}]
                row = {"chosen": row["chosen"], "rejected": wrong}
                mined += 1
            pairs.append(row)
        path = ctx.paths["data"] / f"{name}_mined.jsonl"
        _write_jsonl(path, pairs)
        store = ctx.workdir / "stores" / f"{name}_mined.bin"
        meta = pack([path], store, str(ctx.paths["tokenizer"]), "dpo", overwrite=True, progress=False)
        ctx.paths[f"store_{name}"] = store
        out[name] = {"pairs": len(pairs), "from_model_mistakes": mined, "empty": empty, "tokens": meta["num_tokens"]}
    ctx.say(
        f"{out['dpo']['from_model_mistakes']} of {out['dpo']['pairs']} DPO prompts answered wrongly by the SFT "
        "model: those answers become the rejected side"
        + (
            f"; {out['dpo']['empty']} empty answers keep a synthetic wrong answer instead"
            if out["dpo"]["empty"]
            else ""
        )
    )
    return {
        "pairs": out["dpo"]["pairs"],
        "from_model_mistakes": out["dpo"]["from_model_mistakes"],
        "synthetic_wrong": out["dpo"]["pairs"] - out["dpo"]["from_model_mistakes"],
        "empty_answers": out["dpo"]["empty"],
        "tokens": out["dpo"]["tokens"],
        "val_pairs": out["dpo_val"]["pairs"],
        "val_from_model_mistakes": out["dpo_val"]["from_model_mistakes"],
    }


# DPO's loop and loss settings (LoRA on the SFT model; the base with adapters off is the reference).
DPO_SETTINGS: dict[str, dict[str, Any]] = {
    "train": {"micro_batch_size": 8},
    "optim": {"lr": 1e-3, "warmup_steps": 5, "weight_decay": 0.0},
    "lora": {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.0},
    # the chosen-answer NLL term keeps DPO from lowering the likelihood of right answers (RPO)
    "dpo": {"beta": 0.1, "reduction": "sum", "nll_weight": 1.0},
}


def stage_dpo(ctx: DemoContext) -> dict[str, Any]:
    """DPO with LoRA adapters: correct answers preferred over wrong ones; the base is the reference."""
    overrides = {k: dict(v) for k, v in DPO_SETTINGS.items()}
    overrides["train"].update(objective="dpo", max_steps=ctx.sizes.dpo_steps, init_from=str(ctx.checkpoints["sft"]))
    overrides["data"] = {"train_path": str(ctx.paths["store_dpo"]), "val_path": str(ctx.paths["store_dpo_val"])}
    overrides["eval"] = {"every": 0, "prompts": DEMO_PROMPTS[:2]}
    return _train(ctx, "dpo", overrides)


def arithmetic_accuracy(ctx: DemoContext, checkpoint: Path, name: str, batch_size: int = 100) -> dict[str, Any]:
    """Exact-answer accuracy on the held-out problems as `cookmind eval gsm8k --template chat` scores it (greedy chat
    answer, ``#### N`` must equal the truth); its per-problem JSONL in ``eval/NAME.jsonl``, the command in the
    result."""
    from cookmind.demo.rl import shows_working
    from cookmind.evals import gsm8k as gsm8k_eval
    from cookmind.model import load_model
    from cookmind.tokenizer import Tokenizer

    problems = gsm8k_eval.load_gsm8k(ctx.paths["eval_problems"])
    answers = Path("eval") / f"{name}.jsonl"
    with torch.no_grad():
        metrics = gsm8k_eval.evaluate_gsm8k(
            load_model(checkpoint).eval(),
            Tokenizer.load(ctx.paths["tokenizer"]),
            problems,
            ctx.workdir / answers,
            template="chat",
            temperature=0.0,
            max_new_tokens=HELDOUT_MAX_NEW_TOKENS,
            batch_size=batch_size,
            progress=False,
        )
    records = [json.loads(line) for line in (ctx.workdir / answers).read_text().splitlines()]
    texts = [r["outputs"][0] for r in records]
    data = Path(os.path.relpath(ctx.paths["eval_problems"], ctx.workdir)).as_posix()
    # the checkpoint scored: the run's name would mean its newest one, another once the run trains on
    scored = Path(os.path.relpath(checkpoint, ctx.workdir)).as_posix()
    return {
        "accuracy": metrics["accuracy"],
        "answered_in_format": metrics["format_rate"],
        "shows_working": sum(map(shows_working, texts)) / len(texts),
        "n": metrics["num_problems"],
        "examples": [{"question": r["question"], "answer": t, "truth": r["reference"]} for r, t in zip(records, texts)][
            :3
        ],
        "answers": answers.as_posix(),
        # what reproduces the figure, run in the work directory
        "command": f"cookmind eval gsm8k {scored} --data {data} --template chat "
        f"--max-new-tokens {HELDOUT_MAX_NEW_TOKENS}",
    }


def _eval_stage(name: str, source: str) -> Stage:
    def stage(ctx: DemoContext) -> dict[str, Any]:
        res = arithmetic_accuracy(ctx, ctx.checkpoints[source], source)
        ctx.say(
            f"accuracy after {source}: {100 * res['accuracy']:.1f}% "
            f"({100 * res['answered_in_format']:.0f}% answered in the '#### N' format)"
        )
        return res

    stage.__doc__ = f"Exact-answer accuracy on the held-out arithmetic problems after {source}."
    return name, stage


def stage_chat(ctx: DemoContext) -> dict[str, Any]:
    """A few sample chats with the final model."""
    from cookmind.infer import SamplingParams, generate
    from cookmind.infer.stop import chat_stop_ids
    from cookmind.model import load_model
    from cookmind.terminal import escape_controls
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(ctx.paths["tokenizer"])
    model = load_model(ctx.policy).eval()
    stops = chat_stop_ids(tok)  # a reply ends at the first control token
    prompts = [list(tok.render([{"role": "user", "content": p}], add_generation_prompt=True)[0]) for p in DEMO_PROMPTS]
    outs = generate(model, prompts, SamplingParams(max_new_tokens=80, temperature=0.0, stop_token_ids=stops))
    # a small model's reply can run on in blank lines to the token limit: they are left out of what is shown
    chats = [{"user": p, "assistant": tok.decode(o).strip()} for p, o in zip(DEMO_PROMPTS, outs)]
    if ctx.progress:  # the terminal gets a reply's control characters escaped; the report, the text as said
        for c in chats:
            print(f"\n  user:      {c['user']}\n  assistant: {escape_controls(c['assistant'])}")
        print()
    return {"chats": chats}


def stage_report(ctx: DemoContext) -> dict[str, Any]:
    """Write ``<workdir>/report.md`` (and ``results.json``)."""
    path = write_demo_report(ctx)
    return {"report": str(path)}


def stage_grpo(ctx: DemoContext) -> dict[str, Any]:
    """GRPO on fresh problems through the Trainer (cookmind train's grpo objective); held-out accuracy moves."""
    from cookmind.demo.rl import demo_stage

    return demo_stage(ctx)


STAGES: list[Stage] = [
    ("curate", stage_curate),
    ("data", stage_data),
    ("tokenizer", stage_tokenizer),
    ("pack", stage_pack),
    ("pretrain", stage_pretrain),
    _eval_stage("eval_pretrain", "pretrain"),
    ("sft", stage_sft),
    _eval_stage("eval_sft", "sft"),
    ("mine_pairs", stage_mine_pairs),
    ("dpo", stage_dpo),
    _eval_stage("eval_dpo", "dpo"),
    ("grpo", stage_grpo),
    ("chat", stage_chat),
    ("report", stage_report),
]


def run_demo(ctx: DemoContext, stages: list[Stage] | None = None) -> DemoContext:
    """Run ``stages`` (default ``STAGES``) in order; each result lands in ``ctx.results[name]``."""
    from cookmind.demo.workdir import DemoWorkdir

    stages = STAGES if stages is None else stages
    workdir = DemoWorkdir(ctx.workdir, "demo")
    workdir.claim()  # a folder holding anything the demo did not write is refused before any work
    t_all = time.perf_counter()
    for i, (name, fn) in enumerate(stages, 1):
        ctx.say(f"stage {i}/{len(stages)}: {name} — {(fn.__doc__ or '').strip().splitlines()[0]}")
        t0 = time.perf_counter()
        workdir.record(running=name)
        result = fn(ctx) or {}
        result.setdefault("seconds", round(time.perf_counter() - t0, 2))
        ctx.results[name] = result
        ctx.say(f"{name} done in {result['seconds']:.1f}s (total {time.perf_counter() - t_all:.0f}s)")
    ctx.results["total_seconds"] = {"seconds": round(time.perf_counter() - t_all, 1)}
    if any(name == "report" for name, _ in stages):
        write_demo_report(ctx)  # again, now with the total time
    workdir.record()
    return ctx


def write_demo_report(ctx: DemoContext) -> Path:
    """Markdown report: per-stage table, accuracy before/after, sample chats, notes; plus results.json."""
    r = ctx.results
    lines = ["# cookmind demo", "", f"Work directory: `{ctx.workdir}` · seed {ctx.seed}", ""]
    lines += ["## Stages", "", "| stage | seconds | what happened |", "|---|---|---|"]
    for name, res in r.items():
        if name == "total_seconds":
            continue
        lines.append(f"| {name} | {res.get('seconds', '')} | {_describe(name, res)} |")
    if "total_seconds" in r:
        lines.append(f"| **total** | {r['total_seconds']['seconds']} | |")
    acc = [(n, r[n]) for n in ("eval_pretrain", "eval_sft", "eval_dpo", "grpo") if n in r and "accuracy" in r[n]]
    if acc:
        lines += [
            "",
            f"## Held-out arithmetic ({acc[0][1].get('n', r.get('grpo', {}).get('heldout_problems', ''))} "
            "problems, exact answer, greedy)",
            "",
            "| after | accuracy | in `#### N` format | shows its working |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {n.replace('eval_', '')} | {100 * a['accuracy']:.1f}% | "
            f"{100 * a.get('answered_in_format', 0):.0f}% | {_pct(a.get('shows_working'))} |"
            for n, a in acc
        ]
        cmd = next((a["command"] for n, a in acc if "command" in a), None)
        if cmd is not None:  # the GRPO row is graded the same way (template chat, greedy, the same cap)
            generic = " ".join("runs/STAGE" if w.startswith("runs/") else w for w in cmd.split())
            lines += [
                "",
                f"Each row is `{generic}` run in this folder; the pretrain, SFT and DPO rows keep their answers "
                "in `eval/STAGE.jsonl`.",
            ]
    if "accuracy_before" in r.get("grpo", {}):
        lines += _grpo_section(r["grpo"], r.get("eval_sft", {}).get("accuracy"), ctx.workdir)
    curate_md = Path(r.get("curate", {}).get("report_md", "")) if "report_md" in r.get("curate", {}) else None
    if curate_md is not None and curate_md.is_file():
        # the curation stage's own table: what each filter removed, and why
        body = curate_md.read_text().replace("# Curation report", "").replace("## ", "### ").strip()
        lines += ["", "## Curation: what each stage removed", "", body]
    if "chat" in r:
        lines += ["", "## Sample chats", ""]
        for c in r["chat"].get("chats", []):
            lines += [f"**user:** {c['user']}", "", "```", c["assistant"], "```", ""]
    stage_reports = [
        (n, res["report"]) for n, res in r.items() if isinstance(res, dict) and "report" in res and n != "report"
    ]
    if stage_reports:
        lines += ["", "## Training reports (loss and lr curves)", ""]
        # links relative to this report, as its GRPO curves image (an absolute path opened nothing in a viewer)
        links = [(n, Path(os.path.relpath(p, ctx.workdir)).as_posix()) for n, p in stage_reports]
        lines += [f"- {n}: [{rel}]({rel})" for n, rel in links]
    if ctx.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in ctx.notes]
    out = ctx.workdir / "report.md"
    _atomic_text(out, "\n".join(lines) + "\n")
    _atomic_text(ctx.workdir / "results.json", json.dumps(r, indent=1, default=str))
    return out


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def _grpo_section(g: dict[str, Any], sft_accuracy: float | None, workdir: Path) -> list[str]:
    """The RL stage: what it trained on, the curves, before/after, and whether the safety guard fired."""
    cfg = g.get("config", {})
    lines = [
        "",
        "## RL stage: GRPO on fresh problems",
        "",
        f"{g['steps']} steps of {cfg.get('prompts_per_step')} fresh "
        f"problems x {cfg.get('group_size')} samples ({g['rollouts']} rollouts; "
        f"{g.get('train_problems_seen')} problems, none held out, none seen by an earlier stage, none repeated). "
        "The reward is the verifier only: 1 when `#### N` equals the truth. The stage is `cookmind train` with "
        "`train.objective: grpo` (the Trainer and its GRPO objective; run report: "
        f"`{os.path.relpath(g['report'], workdir) if g.get('report') else ''}`).",
        "",
        f"- held-out accuracy: {100 * g['accuracy_before']:.1f}% before → **{100 * g['accuracy']:.1f}%** after "
        f"({g['gain_points']:+.1f} points)"
        + (f"; {100 * (g['accuracy'] - sft_accuracy):+.1f} points over SFT" if sft_accuracy is not None else ""),
        f"- sampled at temperature {cfg.get('temperature')}, {cfg.get('group_size')} answers per held-out problem: "
        f"pass@{cfg.get('group_size')} {_pct(g.get('pass_at_k_before'))} → {_pct(g.get('pass_at_k'))}, "
        f"one sample right {_pct(g.get('sampled_accuracy_before'))} → {_pct(g.get('sampled_accuracy'))} "
        "(pass@k far above greedy accuracy is the room RL has)"
        + (
            f"; `{g['sampled_command']}` in this folder gives the after figures (answers: `grpo/sampled_after.jsonl`)"
            if g.get("sampled_command")
            else ""
        ),
        f"- answers that show their working: {_pct(g.get('shows_working_before'))} → {_pct(g.get('shows_working'))}; "
        f"mean answer length {g.get('response_length_before', 0):.1f} → {g.get('response_length', 0):.1f} tokens",
        f"- held-out answers wrong before and right after: {g.get('heldout_fixed')}; right before and wrong after: "
        f"{g.get('heldout_broken')}",
        f"- mean rollout reward, first 20 steps → last 20: {g.get('reward_first') or 0:.3f} → "
        f"{g.get('reward_last') or 0:.3f}",
        "- held-out accuracy by step: "
        + ", ".join(f"{c['step']}: {100 * c['eval_accuracy']:.1f}%" for c in g.get("curve", [])),
        (
            "- **stopped early**: the safety guard fired"
            if g.get("stopped_early")
            else f"- fixed {g['steps']} steps (deterministic under the seed); the wall-clock guard did not fire"
        ),
        "",
        f"![GRPO curves]({os.path.relpath(g['curves_png'], workdir)})",
        "",
    ]
    for ex in g.get("examples", [])[:2]:
        what = {"fixed": "wrong before, right after", "broken": "right before, wrong after"}.get(ex.get("kind"), "")
        lines += [
            f"**{ex['question']}** ({what})",
            "",
            "before:",
            "```",
            ex["before"],
            "```",
            "after:",
            "```",
            ex["after"],
            "```",
            "",
        ]
    return lines


def _describe(name: str, res: dict[str, Any]) -> str:
    if "skipped" in res:
        return f"skipped ({res['skipped']})"[:120]
    if "accuracy_before" in res:
        return (
            f"held-out accuracy {100 * res['accuracy_before']:.1f}% → {100 * res['accuracy']:.1f}%, "
            f"{res['steps']} steps, {res['rollouts']} rollouts on fresh problems"
        )
    if "accuracy" in res:
        return f"accuracy {100 * res['accuracy']:.1f}%, in format {100 * res.get('answered_in_format', 0):.0f}%"
    if "last_loss" in res:
        v = f", val loss {res['val_loss']:.3f}" if res.get("val_loss") is not None else ""
        if res.get("val_reward_accuracy") is not None:  # DPO: chosen over rejected on held-out pairs
            v += f", held-out reward accuracy {res['val_reward_accuracy']:.2f}"
        return (
            f"loss {res['first_loss']:.3f} → {res['last_loss']:.3f}{v}, {res.get('steps')} steps, "
            f"{res.get('trainable_params')} trainable params"
        )
    if name == "curate" and "docs_in" in res:
        return f"{res['docs_in']} pages in → {res['docs_out']} clean documents"
    if name == "tokenizer":
        return f"vocab {res['vocab_size']}: `{'|'.join(res['example_tokens'])}`"
    if name == "pack":
        return ", ".join(f"{k}: {v['tokens']} tokens" for k, v in res.items() if isinstance(v, dict))
    if name == "mine_pairs":
        return f"{res['from_model_mistakes']} of {res['pairs']} pairs reject the SFT model's own wrong answer"
    if name == "data":
        return (
            f"{res['stories']} stories, {res['sft_chats']} chats, {res['dpo_pairs']} pairs, "
            f"{res['held_out_problems']} held out"
        )
    return ""


# -- helpers ---------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    _atomic_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def _atomic_text(path: Path, text: str) -> None:
    write_text(path, text)


def _shuffle(items: list, seed: int) -> None:
    import random

    random.Random(seed).shuffle(items)


def _curated_texts(ctx: DemoContext) -> list[str]:
    p = ctx.paths.get("curated")
    if not p:
        return []
    return [json.loads(line)["text"] for line in Path(p).read_text(encoding="utf-8").splitlines() if line.strip()]


# -- CLI -------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`cookmind demo` options."""
    from cookmind.cli import int_in

    parser.add_argument(
        "--workdir",
        default="runs/demo",
        help="where data, models and report.md go (default runs/demo): a new or empty folder, or an earlier demo's, "
        "whose own output a rerun replaces (a folder holding anything else is refused)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data and every stage (default 0)")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: a smoke test of every stage (about a minute on 2 cores)"
    )
    parser.add_argument("--skip-curate", action="store_true", help="skip the web-curation stage")
    parser.add_argument("--pretrain-steps", type=int_in(1), help="override the pretraining steps")
    parser.add_argument("--sft-steps", type=int_in(1), help="override the SFT steps")
    parser.add_argument("--dpo-steps", type=int_in(1), help="override the DPO steps")
    # One thread by default: this model's small matmuls gain little from a second thread, and a
    # thread pool that spins while other processes share the cores can run several times slower.
    parser.add_argument("--threads", type=int_in(0), default=1, help="torch CPU threads (0 = torch's default)")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars or stage lines; what the stages say about the data (records truncated or dropped) and "
        "warnings still print on stderr",
    )


def main(args: argparse.Namespace) -> int:
    """Run the demo and print where the report is."""
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = DemoSizes.quick() if args.quick else DemoSizes()
    for name in ("pretrain_steps", "sft_steps", "dpo_steps"):
        if getattr(args, name) is not None:
            setattr(sizes, name, getattr(args, name))
    workdir = Path(args.workdir)
    ctx = DemoContext(
        workdir=workdir, seed=args.seed, sizes=sizes, progress=not args.quiet, skip_curate=args.skip_curate
    )
    run_demo(ctx)
    acc = {
        n: ctx.results[n]["accuracy"]
        for n in ("eval_pretrain", "eval_sft", "eval_dpo", "grpo")
        if "accuracy" in ctx.results.get(n, {})
    }
    print(
        json.dumps(
            {
                "report": str(workdir / "report.md"),
                "seconds": ctx.results["total_seconds"]["seconds"],
                "accuracy": acc,
                "dpo_reward_accuracy": ctx.results.get("dpo", {}).get("val_reward_accuracy"),
            }
        )
    )
    return 0
