"""GRPO inside the one training loop: `train.objective: grpo` on a packed grpo store, and exact resume."""

import json

import pytest
import torch
from test_align_fixtures import one_torch_thread  # noqa: F401


@pytest.fixture(scope="module")
def grpo_run_inputs(tmp_path_factory):
    pytest.importorskip("cookmind.train")
    from cookmind.store.packer import pack
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    root = tmp_path_factory.mktemp("grpo_train")
    problems = [
        {"question": f"Tom has {a} apples. He gets {b} more. How many?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
        for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (6, 3), (4, 4), (7, 1), (3, 3)]
    ]
    (root / "corpus.txt").write_text("\n".join(p["question"] + "\n" + p["answer"] for p in problems) * 4)
    vocab, merges = train_bpe(root / "corpus.txt", 300, DEFAULT_SPECIAL_TOKENS)
    Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).save(root / "tok")
    (root / "problems.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    pack([root / "problems.jsonl"], root / "grpo.bin", str(root / "tok"), "grpo", overwrite=True, progress=False)
    return root


def _trainer(root, run_dir, max_steps, resume=None):
    from cookmind.align.objective import GRPOConfig, GRPOObjective
    from cookmind.train import TrainConfig, Trainer

    cfg = TrainConfig.from_dict(
        {
            "model": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "max_position_embeddings": 128,
            },
            "data": {"train_path": str(root / "grpo.bin"), "tokenizer": str(root / "tok"), "window_size": 64},
            "train": {"objective": "grpo", "max_steps": max_steps, "micro_batch_size": 2, "device": "cpu", "seed": 0},
            "optim": {"lr": 3e-3, "warmup_steps": 0},
            "checkpoint": {"every": 1, "keep_last": 2, "resume": resume},
            "logging": {"run_dir": str(run_dir), "progress": False, "report": False, "log_every": 1},
        }
    )
    objective = GRPOObjective(GRPOConfig(template="chat", group_size=4, max_new_tokens=6))
    return Trainer(cfg, objective=objective)


def test_grpo_objective_trains_in_trainer_and_resumes_exactly(grpo_run_inputs, tmp_path):
    root = grpo_run_inputs
    straight = _trainer(root, tmp_path / "a", 2)
    start = {k: v.clone() for k, v in straight.bare_model.state_dict().items()}
    straight.fit()
    assert straight.objective.calls == 2
    assert any(not torch.equal(v, start[k]) for k, v in straight.bare_model.state_dict().items())
    _trainer(root, tmp_path / "b", 1).fit()
    resumed = _trainer(root, tmp_path / "b", 2, resume="auto")
    assert resumed.objective.calls == 1  # the rollout counter came back with the checkpoint
    resumed.fit()
    for (k, a), b in zip(straight.bare_model.state_dict().items(), resumed.bare_model.state_dict().values()):
        assert torch.equal(a, b), k
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r.get("split") == "train"]
    assert train_rows and all(k in train_rows[-1] for k in ("reward", "accuracy", "response_length", "entropy"))


def test_a_grpo_run_with_a_validation_store_is_refused_naming_eval_problems(grpo_run_inputs, tmp_path, capsys):
    # `--val-data` with a grpo store trained, then crashed at the last evaluation (KeyError: 'input_ids'), leaving a
    # metrics.jsonl that made the rerun "another run"
    from cookmind.cli import main

    root = grpo_run_inputs
    argv = ["train", "--config", "tiny-cpu", "--objective", "grpo", "--train-data", str(root / "grpo.bin")]
    argv += ["--val-data", str(root / "grpo.bin"), "--tokenizer", str(root / "tok"), "--run-dir", str(tmp_path / "g")]
    assert main([*argv, "train.max_steps=1", "train.micro_batch_size=2", "train.grad_accum_steps=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"cookmind train: error: --val-data {root / 'grpo.bin'}: GRPO has no validation loss to take on a store of "
        "prompts; its held-out check is grpo.eval_problems=FILE (JSON lines of question and answer, as `pack "
        "--train-type grpo` reads), graded greedily at every evaluation: pass that instead"
    )
    assert not (tmp_path / "g" / "metrics.jsonl").exists()


def _offline_store(out, tok):
    """A store of four scored responses (offline GRPO), rewards 0, 1, 0, 1."""
    from cookmind.store.packer import pack

    rows = [{"prompt": f"{a} + 1?", "response": str(a + 1), "reward": float(a % 2)} for a in range(4)]
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack([out.with_suffix(".jsonl")], out, str(tok), "grpo", progress=False)


def test_offline_rollouts_one_a_micro_batch_are_refused_naming_the_fix(grpo_run_inputs, tmp_path, capsys):
    # a stored response's advantage is its reward minus the micro-batch's mean: alone in it, that is its own reward,
    # every advantage was 0 and 12 steps moved the weights by weight decay alone, the run saying nothing
    from cookmind.cli import main

    root = grpo_run_inputs
    _offline_store(tmp_path / "off", root / "tok")
    argv = ["train", "--config", "tiny-cpu", "--objective", "grpo", "--train-data", str(tmp_path / "off")]
    argv += ["--tokenizer", str(root / "tok"), "train.max_steps=1", "train.micro_batch_size=1"]
    assert main([*argv, "--run-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"cookmind train: error: {tmp_path / 'off'} holds offline rollouts") and all(
        s in err for s in ("train.micro_batch_size=1", "grpo.loss_type=no_baseline")
    ), err
    assert main([*argv, "--run-dir", str(tmp_path / "b"), "grpo.loss_type=no_baseline"]) == 0  # raw rewards train


def test_offline_rollouts_of_one_reward_are_refused_as_training_nothing(grpo_run_inputs, tmp_path, capsys):
    # a store of scored responses that all earned the same reward (every answer right, as a filtered set of good
    # samples is): each advantage, a reward minus its micro-batch's mean, was 0, and the run trained 12 steps of
    # nothing, its summary reading train_loss 0 and train_reward 1 without a word
    from cookmind.cli import main
    from cookmind.store.packer import pack

    root = grpo_run_inputs
    for name, reward in (("ones", 1.0), ("zeros", 0.0)):
        rows = [{"prompt": f"{a} + 1?", "response": str(a + 1), "reward": reward} for a in range(4)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        pack([tmp_path / f"{name}.jsonl"], tmp_path / name, str(root / "tok"), "grpo", progress=False)
    argv = ["train", "--config", "tiny-cpu", "--objective", "grpo", "--tokenizer", str(root / "tok")]
    argv += ["train.max_steps=1", "train.micro_batch_size=2"]
    for name, extra, said in (
        ("ones", [], "every stored reward is 1"),
        ("zeros", [], "every stored reward is 0"),
        ("zeros", ["grpo.loss_type=no_baseline"], "every stored reward is 0"),
    ):
        run = tmp_path / f"run-{name}-{len(extra)}"
        assert main([*argv, "--train-data", str(tmp_path / name), "--run-dir", str(run), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"cookmind train: error: {tmp_path / name} holds offline rollouts") and said in err, err
        assert "nothing trains" in err, err
    # the raw rewards of right answers do train (REINFORCE without a baseline: the likelihood of each one rises)
    run = tmp_path / "run-ones-raw"
    argv += ["--train-data", str(tmp_path / "ones"), "--run-dir", str(run), "grpo.loss_type=no_baseline"]
    assert main(argv) == 0


def test_rollout_settings_on_offline_rollouts_are_refused_not_ignored(grpo_run_inputs, tmp_path, capsys):
    # grpo.group_size, grpo.temperature, grpo.normalize_by_std, ... shape how online rollouts are sampled, grouped and
    # scored; on a store of scored responses they were accepted and never read (the advantage is the reward minus
    # the micro-batch's mean, not divided by any std, whatever grpo.normalize_by_std said)
    from cookmind.cli import main

    root = grpo_run_inputs
    _offline_store(tmp_path / "off", root / "tok")
    argv = ["train", "--config", "tiny-cpu", "--objective", "grpo", "--train-data", str(tmp_path / "off")]
    argv += ["--tokenizer", str(root / "tok"), "train.max_steps=1", "train.micro_batch_size=2"]
    bad = ["grpo.group_size=4", "grpo.temperature=0.7", "grpo.normalize_by_std=true"]
    assert main([*argv, "--run-dir", str(tmp_path / "a"), *bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"cookmind train: error: {tmp_path / 'off'} holds offline rollouts (responses stored with their rewards): "
        "grpo.group_size, grpo.normalize_by_std, grpo.temperature shape how online rollouts are sampled, grouped or "
        "scored, and would be ignored; leave them out (each stored response's advantage is its reward minus its "
        "micro-batch's mean)"
    ), err
    assert not (tmp_path / "a" / "metrics.jsonl").exists()
    # what offline rollouts do read (the loss, its normalisation, the held-out check's decoding) is taken
    ok = ["grpo.loss_type=reinforce_with_baseline", "grpo.length_normalization=token", "grpo.max_new_tokens=8"]
    assert main([*argv, "--run-dir", str(tmp_path / "b"), *ok]) == 0


def test_offline_responses_cut_to_the_window_are_counted(grpo_run_inputs, tmp_path, capsys):
    # a stored response longer than the window's room after its prompt was cut to fit and trained cut, and the run
    # said "grpo data: 4 prompts; 0 leave no room for an answer": the cut responses went uncounted
    from cookmind.cli import main
    from cookmind.store.packer import pack
    from cookmind.store.token_store import TokenStore

    root = grpo_run_inputs
    rows = [{"prompt": f"{a} + 1?", "response": "one more " * (1 + 6 * (a % 2)), "reward": a % 2} for a in range(4)]
    (tmp_path / "off.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack([tmp_path / "off.jsonl"], tmp_path / "off", str(root / "tok"), "grpo", progress=False)
    store = TokenStore(tmp_path / "off")
    window = 40
    whole = store.lengths("prompts") + store.lengths("responses")
    want = int((whole > window).sum())  # independent: the records whose prompt and response overflow the window
    assert 0 < want < 4 and (store.lengths("prompts") < window).all(), (store.lengths("prompts"), whole)
    argv = ["train", "--config", "tiny-cpu", "--objective", "grpo", "--train-data", str(tmp_path / "off")]
    argv += ["--tokenizer", str(root / "tok"), "--run-dir", str(tmp_path / "a"), "train.max_steps=1"]
    assert main([*argv, "train.micro_batch_size=2", f"data.window_size={window}"]) == 0
    err = capsys.readouterr().err
    assert f"grpo data: 4 records; {want} truncated to data.window_size={window} and 0 dropped" in err, err
    data = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[0])
    assert data["data_truncated"] == want and data["data_records"] == 4


def test_held_out_problems_packed_into_the_training_store_are_warned_of(grpo_run_inputs, tmp_path):
    # the store's prompts as packed (chat template) against the held-out questions encoded the same way
    from cookmind.cli import main

    root = grpo_run_inputs
    held = [json.loads(line) for line in (root / "problems.jsonl").read_text().splitlines()][:3]
    held.append({"question": "Ann has 9 pens. She loses 2. How many?", "answer": "#### 7"})
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(p) + "\n" for p in held))
    argv = ["train", "--config", "tiny-cpu", "--objective", "grpo", "--train-data", str(root / "grpo.bin")]
    argv += ["--tokenizer", str(root / "tok"), "--run-dir", str(tmp_path / "a"), "train.max_steps=1"]
    argv += ["train.micro_batch_size=1", "grpo.group_size=2", "grpo.max_new_tokens=2"]
    said = r"grpo: 3 of the 4 held-out problems graded \(grpo.eval_problems\) are training "
    with pytest.warns(UserWarning, match=said):
        assert main([*argv, f"grpo.eval_problems={tmp_path / 'held.jsonl'}"]) == 0


@pytest.mark.parametrize("template", ["Q: {question}\\nA:", "Q: {question}\nA:"])
def test_the_template_a_store_was_packed_with_is_offered_as_an_override_that_parses(
    grpo_run_inputs, tmp_path, capsys, template
):
    # a store packed with a template of one's own, trained with the default grpo.template, was told "set
    # grpo.template=Q: {question}\nA:": typed so, YAML reads a mapping and the override is refused ("not valid YAML").
    # The suggestion is now quoted for the shell and YAML; run as given, it trains (a literal backslash-n, as bash's
    # 'Q: {question}\nA:' gives, and a real newline alike)
    import shlex

    from cookmind.cli import main
    from cookmind.store.packer import pack

    root = grpo_run_inputs
    source = root / "problems.jsonl"
    pack([source], tmp_path / "rl", str(root / "tok"), "grpo", prompt_template=template, progress=False)
    argv = ["train", "--config", "tiny-cpu", "--objective", "grpo", "--train-data", str(tmp_path / "rl")]
    argv += ["--tokenizer", str(root / "tok"), "train.max_steps=1", "train.micro_batch_size=1", "grpo.group_size=2"]
    assert main([*argv, "--run-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "; set " in err and ", or repack" in err, err
    typed = err.split("; set ", 1)[1].split(", or repack", 1)[0]
    override = shlex.split(typed)  # as the shell hands it to cookmind
    assert len(override) == 1 and override[0].startswith("grpo.template="), typed
    assert main([*argv, "--run-dir", str(tmp_path / "b"), *override, "grpo.max_new_tokens=2"]) == 0


def test_the_held_out_check_reads_a_bounded_share_of_a_big_store(grpo_run_inputs, tmp_path, monkeypatch):
    """The check that held-out problems are not training prompts read every prompt of the grpo store at start-up (a
    full pass over a store of millions). It reads only the prompts as long as a held-out one (no other can be one),
    at most HELD_OUT_CHECK_ROWS of them, and stops once every held-out prompt is found; it still warns of an overlap,
    and says when the bound left prompts unread. Counted in store rows read, not timed."""
    from types import SimpleNamespace

    from cookmind.align import objective as objective_module
    from cookmind.align.objective import GRPOConfig, GRPOObjective
    from cookmind.store.packer import pack
    from cookmind.store.token_store import TokenStore
    from cookmind.tokenizer import Tokenizer

    root = grpo_run_inputs
    # 40 prompts of several lengths (1- to 3-digit counts); the held-out set: two of them and one of its own
    problems = [{"question": f"Tom has {7**k % 997} apples. How many?", "answer": "#### 1"} for k in range(40)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    pack([tmp_path / "train.jsonl"], tmp_path / "rl", str(root / "tok"), "grpo", progress=False)
    held = [problems[3], problems[30], {"question": "Ann has 9 pens. How many?", "answer": "#### 9"}]
    store = TokenStore(tmp_path / "rl")
    reads = []
    real = TokenStore.record
    monkeypatch.setattr(TokenStore, "record", lambda self, key, i: (reads.append(i), real(self, key, i))[1])
    trainer = SimpleNamespace(
        cfg=SimpleNamespace(data=SimpleNamespace(train_path=str(tmp_path / "rl"))),
        train_loader=SimpleNamespace(loader=SimpleNamespace(dataset=SimpleNamespace(offline=False, store=store))),
    )
    objective = GRPOObjective(GRPOConfig(template="chat"), tokenizer=Tokenizer.load(root / "tok"), eval_problems=held)
    said = r"grpo: 2 of the 3 held-out problems graded \(grpo.eval_problems\) are training problems too"
    with pytest.warns(UserWarning, match=said):
        objective._say_if_held_out_problems_train(trainer)
    first = list(reads)
    # the prompts that could be a held-out one: those of the same length as one (the third's as the chat template
    # packs it: the store's prompts of a question of the same length)
    monkeypatch.setattr(TokenStore, "record", real)
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps(held[2]) + "\n")
    pack([own], tmp_path / "own", str(root / "tok"), "grpo", progress=False)
    lengths = {len(store.record("prompts", i)) for i in (3, 30)} | {
        len(TokenStore(tmp_path / "own").record("prompts", 0))
    }
    could = [i for i in range(len(store)) if len(store.record("prompts", i)) in lengths]
    assert 2 <= len(could) < 40
    assert sorted(set(first)) == first and set(first) <= set(could), (first, could)
    monkeypatch.setattr(TokenStore, "record", lambda self, key, i: (reads.append(i), real(self, key, i))[1])
    reads.clear()
    monkeypatch.setattr(objective_module, "HELD_OUT_CHECK_ROWS", 2)
    with pytest.warns(UserWarning) as caught:
        objective._say_if_held_out_problems_train(trainer)
    assert len(reads) == 2, reads
    text = " ".join(str(w.message) for w in caught)
    assert f"the first 2 of the {len(could)} training prompts" in text, text
