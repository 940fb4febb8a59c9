"""bench/bench_fp8_loss.py: the documents it takes from the shared data, its 1% check, and a CPU run end to end
(a store built through `cookmind tokenizer train` and `cookmind pack`, then the tiny shape twice, float8 emulated).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil

import pytest
import torch
from lm_fixtures import TINY

from bench import bench_fp8_loss as B
from cookmind.model import float8_blocks


def _torchao_or_skip():
    try:
        float8_blocks.import_torchao_float8()
    except ImportError as exc:
        pytest.skip(str(exc))  # the message says: pip install cookmind[fp8]


def test_documents_are_every_shared_record(shared_data):
    docs = B.shared_documents(shared_data)
    # GSM8K 7,473 + 1,319 problems (the data README); MMLU's published splits: 14,042 test, 1,531 val, 285 dev;
    # the five TinyStories stories; corpus.en whole.
    assert len(docs) == 7473 + 1319 + 14042 + 1531 + 285 + 5 + 1
    assert all(d and "<|endoftext|>" not in d for d in docs)
    assert docs[0].startswith("Once upon a time there was a little boy named Ben.")
    assert docs[5].startswith("iron cement is a ready for use paste")
    assert docs[6].startswith("Question: Natalia sold clips to 48 of her friends in April,")
    assert "\nAnswer: Natalia sold 48/2 = <<48/2=24>>24 clips in May." in docs[6]
    # the first row of mmlu/dev/abstract_algebra_dev.csv (dev sorts before test and val)
    assert "Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer: B" in docs


def test_the_check_against_hand_computed_values():
    assert B.compare(4.0, 4.03) == {"rel_diff": 0.0075, "tolerance": 0.01, "pass": True}
    assert B.compare(4.0, 3.95) == {"rel_diff": -0.0125, "tolerance": 0.01, "pass": False}
    assert B.compare(4.0, 4.0)["pass"]
    assert B.final_loss(list(range(30))) == sum(range(10, 30)) / 20  # the last 20 steps
    assert B.final_loss([3.0, 5.0]) == 4.0  # fewer steps than 20: all of them


def _small_shared(shared_data, dest):
    """The shared folder's layout with the heads of its real files, so a build takes seconds."""
    (dest / "text").mkdir(parents=True)
    (dest / "gsm8k").mkdir()
    (dest / "mmlu" / "dev").mkdir(parents=True)
    for name in ("tinystories_sample.txt", "corpus.en"):
        shutil.copy(shared_data / "text" / name, dest / "text" / name)
    for split, n in (("train", 300), ("test", 50)):
        lines = (shared_data / "gsm8k" / f"{split}.jsonl").read_text().splitlines(keepends=True)[:n]
        (dest / "gsm8k" / f"{split}.jsonl").write_text("".join(lines))
    for csv in sorted((shared_data / "mmlu" / "dev").glob("*.csv"))[:10]:
        shutil.copy(csv, dest / "mmlu" / "dev" / csv.name)
    return dest


def test_compare_pools_every_run_of_each_kind_and_gives_one_verdict_per_fp8_recipe(tmp_path):
    """Runs from several device calls: the baselines pooled (a --baseline-twice repeat too), the fp8 runs pooled per
    precision; means, spreads and differences against hand-computed values."""
    settings = dict.fromkeys(B.RUN_KEYS, 1)

    def line(run, precision, final, curve, speed):
        return json.dumps(
            {
                "figure": "fp8 loss run",
                "run": run,
                "precision": precision,
                **settings,
                "final_loss": final,
                "loss_curve": curve,
                "tokens_per_s": speed,
            }  # fmt: skip
        )

    fast = "bf16 + float8 blocks (tensorwise, fast accumulation: all)"
    one = tmp_path / "one.log"
    one.write_text(
        "\n".join(
            [
                line("bf16", "bf16", 4.0, [8.0, 4.0], 100),
                line("fp8-blocks", "bf16 + float8 blocks (tensorwise)", 4.12, [8.0, 4.12], 110),
                line("bf16 again", "bf16", 4.2, [8.2, 4.2], 100),
            ]
        )
    )
    two = tmp_path / "two.log"
    two.write_text(
        line("fp8-blocks", fast, 4.2, [8.4, 4.2], 120) + "\n" + line("fp8-blocks", fast, 4.3, [8.2, 4.3], 116)
    )
    default, fast_v = B.verdict_from_logs([one, two])
    assert (default["baseline_loss"], default["baseline_runs"], default["baseline_spread"]) == (4.1, 2, 0.04878)
    assert (default["fp8_loss"], default["fp8_runs"], default["fp8_spread"]) == (4.12, 1, 0.0)
    assert default["rel_diff"] == pytest.approx(0.02 / 4.1, abs=1e-5)
    assert default["pass"]
    assert (fast_v["fp8_loss"], fast_v["fp8_runs"], fast_v["fp8_precision"]) == (4.25, 2, fast)
    assert fast_v["rel_diff"] == pytest.approx(0.15 / 4.1, abs=1e-5)
    assert not fast_v["pass"]
    assert fast_v["fp8_spread"] == pytest.approx(0.1 / 4.25, abs=1e-5)
    assert fast_v["speedup"] == 1.18  # 118 / 100
    # the mean curves: bf16 (8.1, 4.1), fast (8.3, 4.25): the widest gap at the end, 0.15 / 4.1
    assert fast_v["curve_max_rel_diff"] == pytest.approx(0.15 / 4.1, abs=1e-5)
    # the standard error of the difference, by hand: sample stdevs 0.1 * sqrt(2) and 0.05 * sqrt(2), two runs each
    assert fast_v["rel_diff_stderr"] == pytest.approx(((0.02 / 2 + 0.005 / 2) ** 0.5) / 4.1, abs=1e-5)
    assert "rel_diff_stderr" not in default  # one fp8 run: no spread to take it from


def test_cpu_run_end_to_end(tmp_path, shared_data, capsys):
    _torchao_or_skip()
    shared = _small_shared(shared_data, tmp_path / "shared")
    data = tmp_path / "data"
    with pytest.raises(SystemExit, match="--build"):
        B.main(["--data", str(data), "--device", "cpu"])
    B.build(data, shared, overwrite=False)
    meta = json.loads((data / "store" / "meta.json").read_text())
    assert meta["num_records"] == 5 + 1 + 300 + 50 + 50  # each dev csv has 5 rows
    with pytest.raises(SystemExit, match="--overwrite"):
        B.build(data, shared, overwrite=False)  # what an earlier build made stays unless asked
    capsys.readouterr()

    argv = ["--data", str(data), "--shape", "tiny", "--device", "cpu", "--steps", "4", "--baseline-twice"]
    assert B.main(argv) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    base, fp8, again, verdict = lines
    assert (base["run"], base["precision"]) == ("fp32", "fp32")
    assert (fp8["run"], fp8["precision"]) == ("fp8-blocks", "fp32 + float8 blocks (tensorwise), emulated")
    assert (base["float8_linears"], fp8["float8_linears"]) == (0, 2 * 7)  # 2 blocks x q/k/v/o, gate/up/down
    assert (base["lm_head_fp8"], fp8["lm_head_fp8"]) == (False, False)  # the head only with --fp8-head
    # the trained weights scored on 64 windows the run never drew (4 steps x 2 of 106k), in fp32 on the CPU
    assert base["heldout_windows"] == fp8["heldout_windows"] == 64
    assert math.isfinite(base["heldout_loss"]) and "heldout_loss_as_trained" not in fp8  # as trained: CUDA only
    assert base["windows"] == meta["num_tokens"] // 32 and "windows_repeated" not in base
    # 4 steps: the curve is each step's loss. Untrained, the model spreads its probability evenly over the vocabulary.
    assert base["loss_curve"][0] == pytest.approx(math.log(meta["vocab_size"]), abs=0.05)
    assert fp8["loss_curve"][0] == pytest.approx(base["loss_curve"][0], rel=1e-3)
    assert fp8["loss_curve"] != base["loss_curve"]  # the float8 rounding is in the step: not the fp32 path again
    assert fp8["loss_curve"] == pytest.approx(base["loss_curve"], rel=0.01)
    assert base["final_loss"] == pytest.approx(sum(base["loss_curve"]) / 4, abs=1e-3)
    assert verdict["rel_diff"] == pytest.approx((fp8["final_loss"] - base["final_loss"]) / base["final_loss"], abs=2e-5)
    assert verdict["pass"] == (abs(verdict["rel_diff"]) <= 0.01)
    held = (fp8["heldout_loss"] - base["heldout_loss"]) / base["heldout_loss"]
    assert verdict["heldout_rel_diff"] == pytest.approx(held, abs=2e-5) and verdict["heldout_pass"] == (
        abs(held) <= 0.01
    )
    gaps = [abs(f / b - 1) for b, f in zip(base["loss_curve"], fp8["loss_curve"])]
    assert verdict["curve_max_rel_diff"] == pytest.approx(max(gaps), abs=2e-5) and max(gaps) > 0
    # the premise of the check: the same init, the same tokens in the same order (one CPU thread count: bit for bit)
    assert again["run"] == "fp32 again" and again["loss_curve"] == base["loss_curve"]
    assert verdict["baseline_repeat_rel_diff"] == 0.0

    # one run a call (a compiled pair can outlast a device call), then the verdict from the two logs
    logs = {}
    for run in ("baseline", "fp8"):
        assert B.main(argv[:-1] + ["--runs", run]) == 0
        logs[run] = tmp_path / f"{run}.log"
        logs[run].write_text(capsys.readouterr().out)
    only = [json.loads(x) for x in logs["fp8"].read_text().splitlines() if x.startswith("{")]
    assert [x["run"] for x in only] == ["fp8-blocks"]  # its line alone, no verdict
    assert B.main(["--compare", str(logs["baseline"]), str(logs["fp8"])]) == 0
    (joined,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (joined["baseline_loss"], joined["fp8_loss"]) == (base["final_loss"], fp8["final_loss"])
    assert joined["rel_diff"] == pytest.approx(verdict["rel_diff"], abs=2e-5) and joined["pass"] == verdict["pass"]
    assert joined["curve_max_rel_diff"] == pytest.approx(verdict["curve_max_rel_diff"], abs=2e-5)
    with pytest.raises(SystemExit, match="no fp8 run line"):
        B.verdict_from_logs([logs["baseline"]])
    other = tmp_path / "other.log"  # a run of other settings is not compared
    other.write_text(logs["fp8"].read_text().replace('"steps": 4', '"steps": 5'))
    with pytest.raises(SystemExit, match="differ in steps 4 vs 5"):
        B.verdict_from_logs([logs["baseline"], other])
    with pytest.raises(SystemExit):
        B.main(argv[:-1] + ["--runs", "fp16"])
    # the FP8 head is a CUDA kernel: asked for on a CPU, a one-line refusal, not a run labelled FP8 that is not
    with pytest.raises(SystemExit):
        B.main(argv[:-1] + ["--runs", "fp8", "--fp8-head"])
    assert "--fp8-head: the FP8 LM head runs only on a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("shape,batch,lr", [("qwen3-0.6b", 8, 3e-4), ("llama-1.3b", 4, 2e-4)])
def test_gpu_runs_take_the_preset_recipe_for_200_steps(shape, batch, lr, tmp_path):
    args = argparse.Namespace(
        data=tmp_path,
        seq=None,
        lr=None,
        precision=None,
        no_compile=False,
        fp8_scaling="tensorwise",
        fp8_fast_accum="all",
        compile_scope="blocks",
    )
    cfg, b, t = B.run_config(shape, 8192, 200, 20, torch.device("cuda"), args)
    assert (b, t, cfg.train.micro_batch_size, cfg.data.window_size) == (batch, 2048, batch, 2048)
    assert (cfg.train.max_steps, cfg.train.grad_accum_steps, cfg.optim.warmup_steps) == (200, 1, 20)
    assert (cfg.optim.lr, cfg.optim.schedule, cfg.train.precision, cfg.train.compile) == (lr, "cosine", "bf16", True)
    assert cfg.train.compile_scope == "blocks"
    assert cfg.train.fp8_fast_accum == "all"  # --fp8-fast-accum reaches the FP8 run's config
    assert cfg.model["vocab_size"] == {"qwen3-0.6b": 151936, "llama-1.3b": 32768}[shape]  # the preset's
    assert cfg.data.train_path == str(tmp_path / "store") and cfg.data.tokenizer == str(tmp_path / "tok")


def test_the_heldout_loss_is_the_mean_cross_entropy_of_windows_the_run_never_drew(tmp_path):
    """The FP8 head's training loss is its FP8 forward's: the check also scores the trained weights on windows the
    run never drew, with a plain model. Reference: torch's cross_entropy over the logits, window by window."""
    from cookmind.model import CookMindLM
    from cookmind.store import write_store
    from cookmind.train import TrainConfig, Trainer

    g = torch.Generator().manual_seed(0)
    docs = [{"sequence": torch.randint(1, 64, (40,), generator=g).numpy()} for _ in range(10)]
    write_store(tmp_path / "seq", "seq", docs, vocab_size=64)
    model = dict(TINY, max_position_embeddings=16)  # the tests' tiny shape, windows of 16
    cfg = TrainConfig.from_dict(
        {
            "model": model,
            "data": {"train_path": str(tmp_path / "seq"), "window_size": 16},
            "train": {"max_steps": 3, "micro_batch_size": 4, "seed": 1},
            "logging": {"run_dir": str(tmp_path / "run"), "progress": False, "report": False},
        }
    )
    trainer = Trainer(cfg)
    trainer.fit()
    dataset = trainer.train_loader.loader.dataset
    held = B.heldout_windows(trainer)
    # 400 tokens in windows of 16; 12 trained on (the Trainer fetches no batch past the last step): 13 never drawn
    assert len(dataset) == 25 and len(held) == 25 - 3 * 4
    trained = trainer.train_loader.sampler.permutation(0)[:12].tolist()
    assert not set(held) & set(trained) and len(set(held)) == len(held)
    assert B.heldout_windows(trainer, limit=5) == held[:5]

    plain = B.trained_weights_in(trainer)
    assert type(plain) is CookMindLM and plain is not trainer.bare_model and not plain.training
    for name, value in trainer.bare_model.state_dict().items():
        assert torch.equal(plain.state_dict()[name], value), name
    got = B.heldout_loss(plain, dataset, held, 4, torch.device("cpu"), "fp32")
    losses = []
    with torch.no_grad():
        for i in held:
            item = dataset[i]
            ids = item["input_ids"][None]
            logits = plain(ids, position_ids=item["position_ids"][None]).logits[0]
            losses.append(torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:]).item())
    assert got == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_the_fp8_heads_gradient_format_can_be_chosen_for_the_check(capsys):
    import cookmind.kernels.linear_ce_fp8 as F8

    shipped = (F8.GRAD_DTYPE, F8.GRAD_SCALE)
    assert shipped == (torch.float8_e4m3fn, 256.0)  # the table's e4m3 entry is the head's own format
    try:
        assert B.set_head_grad_format("e5m2") == shipped
        assert (F8.GRAD_DTYPE, F8.GRAD_SCALE) == (torch.float8_e5m2, 32768.0)
        assert B.set_head_grad_format("e4m3") == (torch.float8_e5m2, 32768.0)
        assert (F8.GRAD_DTYPE, F8.GRAD_SCALE) == shipped
    finally:
        F8.GRAD_DTYPE, F8.GRAD_SCALE = shipped
    with pytest.raises(SystemExit):
        B.main(["--device", "cpu", "--fp8-head-grad", "e5m2"])
    assert "--fp8-head-grad sets the FP8 head's gradient format: give --fp8-head too" in capsys.readouterr().err


def test_a_refused_call_leaves_the_fp8_heads_gradient_format_as_it_was(capsys):
    """--fp8-head-grad set the kernel module's format before the CPU refusal of --fp8-head: a caller in the same
    process (a test, a notebook) was left with e5m2 after a call that ran nothing."""
    import cookmind.kernels.linear_ce_fp8 as F8

    with pytest.raises(SystemExit):
        B.main(["--device", "cpu", "--fp8-head", "--fp8-head-grad", "e5m2"])
    assert "the FP8 LM head runs only on a CUDA GPU" in capsys.readouterr().err
    assert (F8.GRAD_DTYPE, F8.GRAD_SCALE) == (torch.float8_e4m3fn, 256.0)


@pytest.mark.gpu
def test_gpu_run_scores_held_out_windows_plain_and_as_trained_with_the_fp8_head(capsys):
    # the FP8 run's trained weights on unseen windows: by a plain model and as the run trained them (float8
    # blocks, FP8 head), the second with the rounding of the first's GEMMs: different, and both near the training loss
    _torchao_or_skip()
    if not (B.DEFAULT_DATA / "store").is_dir():
        pytest.skip(f"needs {B.DEFAULT_DATA}: python bench/bench_fp8_loss.py --build, then carry build/fp8-loss")
    argv = ["--shape", "tiny", "--device", "cuda", "--steps", "6", "--no-compile", "--fp8-head"]
    assert B.main(argv) == 0
    base, fp8, verdict = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert fp8["lm_head_fp8"] is True and fp8["float8_linears"] > 0 and "FP8 LM head" in fp8["precision"]
    assert base["heldout_windows"] == fp8["heldout_windows"] == 64 and "heldout_loss_as_trained" not in base
    assert fp8["heldout_loss_as_trained"] != fp8["heldout_loss"]
    assert fp8["heldout_loss_as_trained"] == pytest.approx(fp8["heldout_loss"], rel=0.05)
    assert verdict["heldout_fp8_loss_as_trained"] == fp8["heldout_loss_as_trained"]
