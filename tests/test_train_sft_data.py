"""SFT records and GRPO prompts are never truncated or dropped silently; an unset SFT window is sized from the store
(issue #17.8). Pretraining tokens that no window covers are counted too."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from lm_fixtures import tiny_cli_overrides, tiny_lm

from cookmind.model import save_model
from cookmind.store import write_store
from cookmind.train import TrainConfig, Trainer

MODEL = tiny_cli_overrides(num_hidden_layers=1, max_position_embeddings=64)  # the context caps an unset window


@pytest.fixture
def sft_store(tmp_path):
    """Chats of 10..90 tokens; the assistant part is the second half of each."""
    rng = np.random.default_rng(0)
    records = []
    for n in (10, 20, 30, 40, 50, 60, 70, 80, 90, 12):
        mask = np.zeros(n, np.uint8)
        mask[n // 2 :] = 1
        records.append({"sequence": rng.integers(1, 64, size=n), "loss_mask": mask})
    return write_store(tmp_path / "sft", "sft", records, vocab_size=64), records


def _cfg(tmp_path, store, *overrides):
    return TrainConfig.load(
        "tiny-cpu",
        [
            f"data.train_path={store}",
            f"logging.run_dir={tmp_path / 'run'}",
            "train.objective=sft",
            "train.max_steps=1",
            "train.micro_batch_size=2",
            "logging.progress=false",
            "eval.every=0",
            *MODEL,
            *overrides,
        ],
    )


def test_truncated_and_dropped_records_are_counted_printed_and_reported(tmp_path, sft_store, capsys, keep_threads):
    store, records = sft_store
    window = 24
    # naive reference: a record is dropped when no supervised token lies in its first `window` tokens
    dropped = sum(1 for r in records if r["loss_mask"][:window].sum() == 0)
    truncated = sum(1 for r in records if len(r["sequence"]) > window and r["loss_mask"][:window].sum() > 0)
    assert dropped > 0 and truncated > 0
    with pytest.warns(UserWarning, match="cut short or dropped"):
        t = Trainer(_cfg(tmp_path, store, f"data.window_size={window}"))
    summary = t.fit()
    err = capsys.readouterr().err
    assert f"{len(records)} records; {truncated} truncated to data.window_size={window} and {dropped} dropped" in err
    assert summary["data_truncated"] == truncated and summary["data_dropped"] == dropped
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"| data_truncated | {truncated} |" in report and f"| data_dropped | {dropped} |" in report
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {
        "split": "data",
        "step": 0,
        "data_records": len(records),
        "data_truncated": truncated,
        "data_dropped": dropped,
    }.items() <= rows[0].items()


def test_the_validation_stores_truncated_and_dropped_records_are_counted_too(tmp_path, sft_store, capsys, keep_threads):
    """data.val_path's records go through the same window: its loss would be taken over other text than the user
    gave, so its counts are printed, warned about and kept under val_ keys beside the training store's."""
    store, records = sft_store
    window = 24
    dropped = sum(1 for r in records if r["loss_mask"][:window].sum() == 0)
    truncated = sum(1 for r in records if len(r["sequence"]) > window and r["loss_mask"][:window].sum() > 0)
    with pytest.warns(UserWarning) as caught:  # the training store's warning, then the validation store's
        t = Trainer(_cfg(tmp_path, store, f"data.window_size={window}", f"data.val_path={store}"))
    cut = [str(w.message) for w in caught if "holds the training data" not in str(w.message)]  # val is train here
    assert [" validation " in m for m in cut] == [False, True]
    summary = t.fit()
    err = capsys.readouterr().err
    assert f"sft validation data: {len(records)} records; {truncated} truncated to data.window_size={window}" in err
    want = {"records": len(records), "truncated": truncated, "dropped": dropped}
    assert {f"val_data_{k}": v for k, v in want.items()}.items() <= summary.items()
    assert {f"data_{k}": v for k, v in want.items()}.items() <= summary.items()  # the training store's, as before


def test_the_validation_truncation_warning_speaks_of_evaluation_not_training(tmp_path, sft_store, keep_threads):
    """The validation store's warning said 'a cut one loses the end of its answer and its end of turn, a dropped one
    never trains' (and, for most records cut, 'the model will rarely see a whole answer'): validation records never
    train. It now says what they lose for the validation loss; the training store's warning is as it was."""
    store, _ = sft_store
    for window, most in ((60, False), (24, True)):
        run = [f"logging.run_dir={tmp_path / f'run{window}'}", f"data.window_size={window}", f"data.val_path={store}"]
        with pytest.warns(UserWarning) as caught:
            Trainer(_cfg(tmp_path, store, *run)).close()
        cut = [str(w.message) for w in caught if "cut short or dropped" in str(w.message)]
        train, val = cut
        assert " validation " not in train and "a dropped one never trains" in train
        assert " validation " in val and "train" not in val.split(". ")[0]
        assert "a cut one is scored without the end of its answer and its end of turn" in val
        assert "a dropped one is never evaluated" in val
        assert ("the validation loss will rarely cover a whole answer or its end of turn" in val) == most


def test_an_unset_sft_window_is_sized_from_the_store_capped_by_the_context(tmp_path, sft_store, capsys, keep_threads):
    store, records = sft_store
    t = Trainer(_cfg(tmp_path, store))  # tiny-cpu's preset window (128) is not the user's choice
    assert t.cfg.data.window_size == 64  # the longest record (90) capped by max_position_embeddings=64
    assert "window_size: 64" in (tmp_path / "run" / "config.yaml").read_text()  # the run's own record says so
    t2 = Trainer(_cfg(tmp_path, store, "model.max_position_embeddings=128", f"logging.run_dir={tmp_path / 'b'}"))
    assert t2.cfg.data.window_size == max(len(r["sequence"]) for r in records) == 90
    assert t2.data_stats["data_truncated"] == t2.data_stats["data_dropped"] == 0
    assert "sized from the sft store to 90 (its longest record, at most the model's max_position_embeddings=128)" in (
        capsys.readouterr().err
    )


def test_grpo_prompts_longer_than_the_window_are_counted_not_dropped_silently(tmp_path, tok_dir, capsys, keep_threads):
    lengths = [4, 10, 30, 50, 8, 40]
    window = 24
    records = [{"prompts": np.arange(1, n + 1) % 300 + 1, "answers": np.frombuffer(b"7", np.uint8)} for n in lengths]
    store = write_store(tmp_path / "rl", "grpo", records, vocab_size=320)
    dropped = sum(n >= window for n in lengths)  # a prompt is never cut: one with no room for an answer is dropped
    grpo = ["train.objective=grpo", f"data.tokenizer={tok_dir}", "model.vocab_size=320"]
    cfg = _cfg(tmp_path, store, *grpo, f"data.window_size={window}")
    with pytest.warns(UserWarning, match="of the grpo prompts are dropped"):
        t = Trainer(cfg)
    err = capsys.readouterr().err
    assert (
        f"grpo data: {len(lengths)} prompts; {dropped} leave no room for an answer in data.window_size={window}" in err
    )
    assert t.data_stats == {"data_records": len(lengths), "data_dropped": dropped}


def test_the_truncation_warning_of_an_init_from_run_does_not_advise_a_longer_context(tmp_path, sft_store, keep_threads):
    store, _ = sft_store
    # pack keeps records whole: the advice says what a user can do with it (it said "pack shorter records")
    with pytest.warns(
        UserWarning, match=r"Raise data.window_size .* leave the longest records out of the data you pack"
    ):
        Trainer(_cfg(tmp_path, store)).fit()  # a fresh model: its context may be raised
    # a loaded model's max_position_embeddings cannot change (the config refuses it): say what can
    cfg = _cfg(tmp_path, store, f"train.init_from={tmp_path / 'run'}", f"logging.run_dir={tmp_path / 'sft-run'}")
    cfg.model = {}  # the shape comes from the checkpoint (the MODEL overrides would be refused as a change)
    whole = r"whole context, max_position_embeddings=64, of the model at --init-from \(train.init_from\)"
    with pytest.warns(UserWarning, match=whole):
        Trainer(cfg)
    # a window below the loaded model's context said "Raise data.window_size (and the model's max_position_embeddings)",
    # the one setting an init_from run cannot change: it names how far the window can go and why no further
    init = [f"train.init_from={tmp_path / 'run'}", f"logging.run_dir={tmp_path / 'short'}", "data.window_size=24"]
    cfg = _cfg(tmp_path, store, *init)
    cfg.model = {}
    with pytest.warns(UserWarning) as caught:
        Trainer(cfg)
    (msg,) = [str(w.message) for w in caught]
    assert msg.endswith(
        "Raise data.window_size=24 up to 64 (the longest record holds 90 tokens): the model at --init-from "
        "(train.init_from) fixes its context, max_position_embeddings=64, so the window can grow to it and no further; "
        "or leave the longest records out of the data you pack (pack keeps each record whole)."
    ), msg
    assert "max_position_embeddings)" not in msg


def test_an_init_from_run_whose_window_drops_every_record_does_not_advise_a_larger_window(tmp_path, sft_store):
    """Every record dropped at the window (their answers start past it) said 'raise data.window_size', which an
    --init-from run whose window is already the loaded model's whole context cannot do: it says so, and what can."""
    store, _ = sft_store
    Trainer(_cfg(tmp_path, store)).fit()  # the model to start from: max_position_embeddings=64
    late = []
    for n in (100, 120, 140):
        mask = np.zeros(n, np.uint8)
        mask[80:] = 1  # every answer starts past the 64-token context
        late.append({"sequence": np.arange(n) % 60 + 1, "loss_mask": mask})
    late_store = write_store(tmp_path / "late", "sft", late, vocab_size=64)
    init = [f"train.init_from={tmp_path / 'run'}", f"logging.run_dir={tmp_path / 'late-run'}", "data.window_size=64"]
    cfg = _cfg(tmp_path, late_store, *init)
    cfg.model = {}
    with pytest.raises(ValueError, match="holds nothing to train on") as caught:
        Trainer(cfg)
    said = str(caught.value)
    assert said.endswith(
        "data.window_size=64 is already the whole context, max_position_embeddings=64, of the model at --init-from "
        "(train.init_from): pack records whose answers start within it, or start from a model with a longer context"
    ), said


def test_an_unset_grpo_window_is_the_models_context_not_the_presets(tmp_path, tok_dir, capsys, keep_threads):
    """tiny-cpu's window (128) dropped the prompts of 150 and 200 tokens a 256-token model could take; the advice
    was to raise the model's context, which was already 256."""
    lengths = [30, 150, 200, 300]
    records = [{"prompts": np.arange(1, n + 1) % 300 + 1, "answers": np.frombuffer(b"7", np.uint8)} for n in lengths]
    store = write_store(tmp_path / "rl", "grpo", records, vocab_size=320)
    grpo = ["train.objective=grpo", f"data.tokenizer={tok_dir}", "model.vocab_size=320"]
    with pytest.warns(UserWarning, match="of the grpo prompts are dropped"):
        t = Trainer(_cfg(tmp_path, store, *grpo, "model.max_position_embeddings=256"))
    assert t.cfg.data.window_size == 256
    assert t.data_stats == {"data_records": 4, "data_dropped": 1}  # only the prompt longer than the context
    assert "grpo data: 4 prompts; 1 leave no room for an answer in data.window_size=256" in capsys.readouterr().err


def test_the_truncation_warning_names_the_share_cut_and_claims_rarely_only_when_most_are(tmp_path, keep_threads):
    """6% of records cut was warned as 'the model will rarely see a whole answer or its end of turn'. The warning
    names the share and what those records lose; 'rarely' is kept for a store most of whose records are cut.
    Reference: the lengths of the records written, against the window."""
    rng = np.random.default_rng(0)
    window = 24
    records = []
    for n in [12] * 18 + [40] * 2:  # 2 of 20 longer than the window
        mask = np.zeros(n, np.uint8)
        mask[n // 2 :] = 1
        records.append({"sequence": rng.integers(1, 64, size=n), "loss_mask": mask})
    cut = sum(len(r["sequence"]) > window for r in records)
    store = write_store(tmp_path / "few", "sft", records, vocab_size=64)
    with pytest.warns(UserWarning) as caught:
        Trainer(_cfg(tmp_path, store, f"data.window_size={window}"))
    (msg,) = [str(w.message) for w in caught]
    assert f"{cut / len(records):.1%} of the sft records ({cut} of {len(records)}) are cut short or dropped" in msg
    assert "rarely" not in msg and "a cut one loses the end of its answer and its end of turn" in msg
    with pytest.warns(UserWarning, match=r"100.0% of the sft records \(20 of 20\) .* will rarely see a whole answer"):
        Trainer(_cfg(tmp_path, store, "data.window_size=8", f"logging.run_dir={tmp_path / 'most'}"))


def test_a_grpo_prompt_that_fills_the_context_is_dropped_and_counted_not_a_crash_mid_run(
    tmp_path, tok_dir, capsys, keep_threads
):
    """An unset grpo window is the model's context, and a prompt exactly that long was kept ('0 longer than
    data.window_size=64 dropped'): the run stopped at the step that drew it, 'generate: prompts[1] has 64 tokens and
    fills the model's context'. A prompt needs room for one answer token, as an offline one does; one without is
    dropped and counted. Reference: the lengths written against the context (64)."""
    lengths = [64, 10, 20, 63]
    records = [{"prompts": np.arange(1, n + 1) % 300 + 1, "answers": np.frombuffer(b"7", np.uint8)} for n in lengths]
    store = write_store(tmp_path / "rl", "grpo", records, vocab_size=320)
    grpo = ["train.objective=grpo", f"data.tokenizer={tok_dir}", "model.vocab_size=320"]
    quick = ["grpo.group_size=2", "grpo.max_new_tokens=1", "train.micro_batch_size=3"]
    with pytest.warns(UserWarning, match="of the grpo prompts are dropped"):
        t = Trainer(_cfg(tmp_path, store, *grpo, *quick))
    assert t.cfg.data.window_size == 64
    dropped = sum(n >= 64 for n in lengths)  # no room left for an answer token in the context
    assert t.data_stats == {"data_records": len(lengths), "data_dropped": dropped}
    assert f"grpo data: 4 prompts; {dropped} leave no room for an answer in data.window_size=64 and are dropped" in (
        capsys.readouterr().err
    )
    assert t.fit()["status"] == "completed"  # every kept prompt is drawn in the one step: none stops the run


def test_a_grpo_store_packed_with_another_prompt_template_than_grpo_template_is_refused(
    tmp_path, tok_dir, keep_threads
):
    """pack's default grpo prompts are the chat template; a run with grpo.template=r1_zero trained on them graded
    each rollout for <answer> tags and stopped at </answer>, prompts that asked for neither, and said nothing
    (every reward 0). The store records its --prompt-template; a run whose grpo.template is another is refused,
    naming both. The same template, by name or as its text, trains."""
    from cookmind.align.prompts import COMPACT_PROMPT
    from cookmind.store.packer import pack

    src = tmp_path / "g.jsonl"
    src.write_text(json.dumps({"question": "Tom has 3 apples and buys 4. How many?", "answer": "#### 7"}) + "\n")
    pack([src], tmp_path / "chat", tok_dir, "grpo", progress=False)
    pack([src], tmp_path / "compact", tok_dir, "grpo", prompt_template=COMPACT_PROMPT, progress=False)
    grpo = ["train.objective=grpo", f"data.tokenizer={tok_dir}", "model.vocab_size=320", "train.micro_batch_size=1"]
    with pytest.raises(ValueError, match=r"packed with --prompt-template 'chat', but grpo.template='r1_zero'"):
        Trainer(_cfg(tmp_path, tmp_path / "chat", *grpo, "grpo.template=r1_zero"))
    with pytest.raises(
        ValueError, match=r"packed with --prompt-template 'Q: \{question\}\\nA: <think>', but grpo.template='chat'"
    ):
        Trainer(_cfg(tmp_path, tmp_path / "compact", *grpo, f"logging.run_dir={tmp_path / 'b'}"))
    quoted = json.dumps(COMPACT_PROMPT)  # an override is YAML: the text as a quoted scalar
    for n, (store, template) in enumerate((("chat", "chat"), ("compact", "compact"), ("compact", quoted))):
        run = f"logging.run_dir={tmp_path / f'ok{n}'}"
        Trainer(_cfg(tmp_path, tmp_path / store, *grpo, f"grpo.template={template}", run))


@pytest.mark.parametrize("stride", [None, 40])
def test_pretraining_tokens_in_no_window_are_counted_printed_and_warned_of(tmp_path, capsys, keep_threads, stride):
    """data.stride > data.window_size trained on a sliver of the store without a word (here 60% of its tokens lie
    between windows), and the tail after the last window never trained either; now the run prints, keeps and (past
    5%) warns how many tokens lie in no window, for the validation store too."""
    rng = np.random.default_rng(0)
    lengths = [50, 33, 70, 6, 41]
    store = write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, n)} for n in lengths], 64)
    window, total = 16, sum(lengths)
    covered = np.zeros(total, bool)  # naive reference: mark every token of every full window
    for start in range(0, total - window + 1, stride or window):
        covered[start : start + window] = True
    windows = len(range(0, total - window + 1, stride or window))
    unused = int((~covered).sum())
    overrides = ["train.objective=pretrain", f"data.val_path={store}", f"data.window_size={window}"]
    overrides += [] if stride is None else [f"data.stride={stride}"]
    if stride is None:
        t = Trainer(_cfg(tmp_path, store, *overrides))
    else:
        with pytest.warns(UserWarning, match="Lower data.stride to at most data.window_size=16") as caught:
            t = Trainer(_cfg(tmp_path, store, *overrides))
        cut = [str(w.message) for w in caught if "holds the training data" not in str(w.message)]  # val is train
        assert [" validation " in m for m in cut] == [False, True]
    err = capsys.readouterr().err
    every = "" if stride is None else f" every data.stride={stride}"
    line = f"{total} tokens in {windows} windows of data.window_size={window}{every}; {unused} ({unused / total:.1%})"
    assert f"seq data: {line} in no window, never trained on" in err
    assert f"seq validation data: {line} in no window, never evaluated" in err
    want = {"tokens": total, "windows": windows, "tokens_unused": unused}
    assert {f"data_{k}": v for k, v in want.items()}.items() <= t.summary_stats.items()
    assert {f"val_data_{k}": v for k, v in want.items()}.items() <= t.summary_stats.items()


def test_a_pretraining_store_shorter_than_one_window_says_how_many_tokens_it_holds(tmp_path, keep_threads):
    store = write_store(tmp_path / "seq", "seq", [{"sequence": np.arange(1, 12)}], 64)
    with pytest.raises(ValueError, match=r"store at .*seq holds 11 tokens, fewer than one window of "):
        Trainer(_cfg(tmp_path, store, "train.objective=pretrain", "data.window_size=16"))


def test_a_validation_set_larger_than_eval_max_batches_says_how_much_of_it_each_evaluation_scores(
    tmp_path, capsys, keep_threads
):
    """The validation loss is taken over the first eval.max_batches batches only (20 in every preset): a split of
    thousands of windows was scored on a few hundred, and nothing said so. Now the run prints how many of the
    validation batches each evaluation scores, and keeps both counts."""
    rng = np.random.default_rng(0)
    store = write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, 16 * 11)}], 64)
    batches = -(-11 // 2)  # 11 windows of 16 tokens in micro-batches of 2, the last one short
    t = Trainer(_cfg(tmp_path, store, "train.objective=pretrain", f"data.val_path={store}", "data.window_size=16",
                     "eval.max_batches=4"))  # fmt: skip
    assert "each evaluation scores the first 4 of the 6 validation batches (eval.max_batches=4)" in (
        capsys.readouterr().err
    )
    assert (t.summary_stats["val_data_batches"], t.summary_stats["val_data_batches_scored"]) == (batches, 4)
    t2 = Trainer(_cfg(tmp_path, store, "train.objective=pretrain", f"data.val_path={store}", "data.window_size=16",
                      f"logging.run_dir={tmp_path / 'all'}", "eval.max_batches=6"))  # fmt: skip
    assert "each evaluation scores" not in capsys.readouterr().err
    assert (t2.summary_stats["val_data_batches"], t2.summary_stats["val_data_batches_scored"]) == (batches, batches)


def test_a_validation_store_holding_the_training_data_is_warned_of(tmp_path, keep_threads):
    """--val-data naming the training store (or a copy of it) was taken without a word, and its val_loss reported
    as if held out: it measures the fit to the training data. Now the run warns, naming both stores."""
    import shutil
    import warnings

    rng = np.random.default_rng(0)
    store = write_store(tmp_path / "seq", "seq", [{"sequence": rng.integers(1, 64, 160)}], 64)
    shutil.copytree(store, tmp_path / "copy")
    other = write_store(tmp_path / "other", "seq", [{"sequence": rng.integers(1, 64, 160)}], 64)
    base = ["train.objective=pretrain", "data.window_size=16"]
    for k, val in enumerate((store, tmp_path / "copy")):
        with pytest.warns(UserWarning, match=rf"validation store {re.escape(str(val))} holds the training data"):
            Trainer(_cfg(tmp_path, store, *base, f"data.val_path={val}", f"logging.run_dir={tmp_path / str(k)}"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer(_cfg(tmp_path, store, *base, f"data.val_path={other}", f"logging.run_dir={tmp_path / 'ok'}"))


def test_the_window_sized_from_the_store_says_it_replaces_the_presets(tmp_path, sft_store, capsys, keep_threads):
    # it said "data.window_size not set" where tiny-cpu sets 128 (and --print-config showed 128)
    store, _ = sft_store
    t = Trainer(_cfg(tmp_path, store, "train.grad_accum_steps=1"))
    assert t.cfg.data.window_size == 64  # the longest record is 90 tokens: the model's context
    assert (
        "cookmind train: data.window_size sized from the sft store to 64 (its longest record, at most the model's "
        "max_position_embeddings=64), in place of the preset's 128; set data.window_size to choose it"
    ) in capsys.readouterr().err


def _dpo_pair(chosen, rejected, prompt=(1, 2)):
    side = lambda answer: (np.array([*prompt, *answer]), np.array([0] * len(prompt) + [1] * len(answer)))  # noqa: E731
    (c, cm), (r, rm) = side(chosen), side(rejected)
    return {"chosen": c, "chosen_mask": cm, "rejected": r, "rejected_mask": rm}


def test_dpo_pairs_dropped_as_the_same_in_the_window_are_said_as_such_and_an_emptied_store_says_raise_the_window(
    tmp_path, capsys, keep_threads
):
    """The start line put pairs dropped as the same in the window under "no supervised token left in the window",
    and a store the window emptied was 'empty (window_size W longer than the data?)', where the window was too
    short. Reference: the pairs below, by hand, against a window of 5 (prompt 2 tokens + answer)."""
    pairs = [
        _dpo_pair([3, 4, 5], [6, 4, 5]),  # differs within 5 tokens: kept
        _dpo_pair([3, 4, 5, 7], [3, 4, 5, 8]),  # the same first 5 tokens: dropped, the same in the window
        _dpo_pair([3, 4, 5, 9, 9, 9], [3, 4, 5, 8]),  # the same first 5 tokens: dropped, the same in the window
    ]
    store = write_store(tmp_path / "dpo", "dpo", pairs, vocab_size=64)
    save_model(tmp_path / "init", tiny_lm(num_hidden_layers=1, max_position_embeddings=64))
    dpo = ["train.objective=dpo", f"train.init_from={tmp_path / 'init'}", "data.window_size=5"]
    with pytest.warns(UserWarning):
        Trainer(_cfg(tmp_path, store, *dpo, "train.micro_batch_size=1"))
    err = capsys.readouterr().err
    assert "dpo data: 3 records; 0 truncated to data.window_size=5 and 2 dropped (chosen and rejected the same" in err
    assert "no supervised token" not in err
    prompt_only = [_dpo_pair([3], [4], prompt=(1, 2, 1, 2, 1, 2)) for _ in range(2)]  # answers past a window of 5
    store = write_store(tmp_path / "long", "dpo", prompt_only, vocab_size=64)
    with pytest.warns(UserWarning), pytest.raises(ValueError) as caught:
        Trainer(_cfg(tmp_path, store, *dpo, f"logging.run_dir={tmp_path}/b"))
    msg = str(caught.value)
    assert "every one of its 2 records was dropped at data.window_size=5" in msg, msg
    assert "no supervised token left in the window" in msg and "raise data.window_size" in msg, msg
    assert "longer than the data" not in msg


def test_an_eval_prompt_that_fills_the_context_is_refused_before_training(tmp_path, tok_dir, keep_threads):
    """`eval.prompts=[LONG]` trained the whole run and then stopped at its final evaluation with exit status 2,
    'generate: the prompt has 813 tokens and fills the model's context' (naming no setting), its report unwritten;
    with eval.every it stopped at the first evaluation. Refused at the start, naming the prompt and its setting."""
    records = [{"sequence": np.arange(1, 21), "loss_mask": np.r_[np.zeros(10), np.ones(10)].astype(np.uint8)}] * 2
    store = write_store(tmp_path / "sft", "sft", records, vocab_size=320)
    setup = [f"data.tokenizer={tok_dir}", "model.vocab_size=320", "logging.run_dir=" + str(tmp_path / "run2")]
    long = "the soup " * 60  # well past the 64-token context, in the chat template too
    cfg = _cfg(tmp_path, store, *setup, f"eval.prompts=['hello', '{long}']")
    with pytest.raises(ValueError, match=r"eval.prompts\[1\] \('the soup the soup .*', \d+ tokens with the chat "):
        Trainer(cfg)
    assert not (tmp_path / "run2").exists()
    Trainer(_cfg(tmp_path, store, *setup, "eval.prompts=['hello']"))  # one that fits starts
