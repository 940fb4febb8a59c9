import argparse
import gzip
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lm_fixtures import CORPUS, tiny_lm

from cookmind.cli import COMMANDS
from cookmind.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_stage():
    out = subprocess.run(
        [sys.executable, "-m", "cookmind", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in COMMANDS:
        assert name in out, f"`cookmind --help` does not list {name}"


def test_unknown_stage_is_an_error():
    proc = subprocess.run([sys.executable, "-m", "cookmind", "no-such-stage"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "invalid choice" in proc.stderr


def test_resolve_model_dir_picks_the_newest_checkpoint_of_a_run(tmp_path):
    import torch
    from safetensors.torch import save_file

    from cookmind.model import resolve_model_dir

    run = tmp_path / "run"
    for step in (9, 10, 2):  # numeric order, not string order: step_10 is newest
        d = run / "checkpoints" / f"step_{step}"
        d.mkdir(parents=True)
        save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
        (d / "config.json").write_text("{}")
    (run / "checkpoints" / "step_11").mkdir()  # no weights: not a model
    assert resolve_model_dir(run) == run / "checkpoints" / "step_10"
    assert resolve_model_dir(run / "checkpoints" / "step_2") == run / "checkpoints" / "step_2"
    assert resolve_model_dir(tmp_path / "absent") == tmp_path / "absent"


def test_bad_input_is_one_clear_line_not_a_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cookmind", "generate", "--checkpoint", str(tmp_path / "nope"), "--prompt", "hi"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert str(tmp_path / "nope") in proc.stderr


# --- the seams between stages (#17.12, #17.16) ---


def _store_texts(store_dir, tok_dir):
    """The documents of a seq store, decoded (each record ends with the end-of-text id)."""
    from cookmind.store import TokenStore
    from cookmind.tokenizer import Tokenizer

    tok, store = Tokenizer.load(tok_dir), TokenStore(store_dir)
    return [tok.decode(store.record("sequence", i).tolist()[:-1]) for i in range(len(store))]


@pytest.mark.parametrize("fmt", ["jsonl.gz", "parquet"])
def test_pack_reads_curate_output(tmp_path, tok_dir, fmt, capsys):
    """`curate run` (default jsonl.gz, or parquet) -> `pack` of its folder and of its files: every document packed."""
    assert cli_main(["curate", "crawl", "--output", str(tmp_path / "crawl"), "--num-pages", "40", "--shards", "2"]) == 0
    assert (
        cli_main(
            [
                "curate",
                "run",
                "--input",
                str(tmp_path / "crawl"),
                "--output",
                str(tmp_path / "cur"),
                "--format",
                fmt,
                "--workers",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    shards = sorted((tmp_path / "cur").glob("shard-*"))
    assert shards and all(s.name.endswith(fmt) for s in shards)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        expect = [t for s in shards for t in pq.read_table(s).column("text").to_pylist()]
    else:
        lines = [line for s in shards for line in gzip.decompress(s.read_bytes()).decode().splitlines()]
        expect = [json.loads(line)["text"] for line in lines]
    assert len(expect) > 3
    for inputs in ([str(tmp_path / "cur")], [str(s) for s in shards]):
        out = tmp_path / f"store{len(inputs)}"
        capsys.readouterr()
        assert (
            cli_main(
                [
                    "pack",
                    "--tokenizer",
                    str(tok_dir),
                    "--train-type",
                    "seq",
                    "--input",
                    *inputs,
                    "--out",
                    str(out),
                    "--quiet",
                ]
            )
            == 0
        )
        assert f"packed {len(expect)} seq records" in capsys.readouterr().out
        assert _store_texts(out, tok_dir) == [t.strip() for t in expect]


def test_pack_reads_gzip_text_and_jsonl_even_without_the_suffix(tmp_path, tok_dir):
    docs = ["The cook stirs the soup.", "Tom has 3 apples."]
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress("<|endoftext|>".join(docs).encode()))
    (tmp_path / "b.jsonl").write_bytes(gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode()))
    assert (
        cli_main(
            [
                "pack",
                "--tokenizer",
                str(tok_dir),
                "--train-type",
                "seq",
                "--input",
                str(tmp_path / "a.txt.gz"),
                str(tmp_path / "b.jsonl"),
                "--out",
                str(tmp_path / "s"),
                "--quiet",
            ]
        )
        == 0
    )
    assert _store_texts(tmp_path / "s", tok_dir) == docs * 2


def test_pack_a_folder_without_shards_is_a_clear_error(tmp_path, tok_dir, capsys):
    (tmp_path / "d").mkdir()
    rc = cli_main(
        [
            "pack",
            "--tokenizer",
            str(tok_dir),
            "--train-type",
            "seq",
            "--input",
            str(tmp_path / "d"),
            "--out",
            str(tmp_path / "s"),
            "--quiet",
        ]
    )
    assert rc != 0 and "holds no shard-* files" in capsys.readouterr().err


def test_ctrl_c_while_the_stage_imports_is_one_line(monkeypatch, capsys):
    # a Ctrl-C during the first seconds of `cookmind train` (its module importing torch) printed a KeyboardInterrupt
    # traceback, where one a moment later printed one line
    import importlib

    real = importlib.import_module

    def import_module(name, *a, **kw):
        if name.startswith("cookmind.train"):
            raise KeyboardInterrupt  # as Ctrl-C arrives while the stage's module imports
        return real(name, *a, **kw)

    monkeypatch.setattr(importlib, "import_module", import_module)
    assert cli_main(["train", "--config", "tiny-cpu"]) == 130
    assert capsys.readouterr().err == "cookmind train: interrupted\n"


# The command as `python -m cookmind` runs it (cookmind.cli.run), its work done (main printed its summary and returned
# 0), then one Ctrl-C as the interpreter shuts down: in an atexit callback, while it joins a thread still running, or
# while it tears the modules down (after Python has put SIGINT's default handler back).
_CTRL_C_AT_EXIT = """
import atexit, os, signal, sys, threading, time
import cookmind.cli as cli

def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100_000):  # Python code to run on: where a Python handler would take the signal
        pass

cli.main = lambda argv=None: print('{"status": "completed"}') or 0
when = sys.argv[1]
if when == "atexit":
    atexit.register(ctrl_c)
elif when == "thread join":
    def worker():
        while threading.main_thread().is_alive():  # until the main thread has ended and the exit joins this one
            time.sleep(0.01)
        ctrl_c()
        time.sleep(0.5)
    threading.Thread(target=worker).start()
else:
    class AtTeardown:
        def __del__(self):
            ctrl_c()
    sys.modules["at_teardown"] = AtTeardown()
cli.run()
"""


@pytest.mark.parametrize("when", ["atexit", "thread join", "module teardown"])
def test_a_ctrl_c_as_the_interpreter_exits_keeps_the_commands_exit_status(tmp_path, when):
    """A Ctrl-C after the command's output was complete printed a KeyboardInterrupt traceback (an atexit callback, a
    thread join) or ended the process by the signal (-2 to a caller, 130 to a shell: the modules' teardown, after
    Python restores SIGINT's default): a completed run read as interrupted. It now exits with the command's status."""
    script = tmp_path / "exit.py"
    script.write_text(_CTRL_C_AT_EXIT)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(script), when], capture_output=True, text=True, env=env, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, '{"status": "completed"}\n', "")


def test_a_ctrl_c_to_an_exit_callback_that_hangs_still_ends_the_process(tmp_path):
    """A callback registered while the command ran (as torch.distributed's or a data loader's are) that hangs at exit:
    Ctrl-C must still end the process, with the command's status, not be ignored until the callback returns."""
    script = tmp_path / "hang.py"
    script.write_text(
        _CTRL_C_AT_EXIT.split("cli.main = ")[0]
        + """
def hang():
    ctrl_c()
    time.sleep(30)
    print("the hung callback ran to its end")

def main(argv=None):
    atexit.register(hang)
    print('{"status": "completed"}')
    return 0

cli.main = main
cli.run()
"""
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, '{"status": "completed"}\n', "")
    assert time.monotonic() - start < 20


# A torchrun worker's command that left its process group standing (a run that failed as it started, a Ctrl-C in the
# train CLI's own teardown), then a Ctrl-C as the process ends: while the group is left, or in an exit callback.
_CTRL_C_AS_THE_GROUP_IS_LEFT = """
import atexit, os, signal, sys
import torch.distributed as dist
import cookmind.cli as cli
from cookmind.parallel import init_distributed

def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100_000):  # Python code to run on: where a Python handler would take the signal
        pass

destroy = dist.destroy_process_group

def destroy_with_a_ctrl_c(*args, **kwargs):
    if sys.argv[1] == "while the group is left":
        ctrl_c()
    destroy(*args, **kwargs)
    print("group left", dist.is_initialized(), flush=True)

dist.destroy_process_group = destroy_with_a_ctrl_c

def main(argv=None):
    init_distributed("cpu", "gloo", group_of_one=True)
    if sys.argv[1] == "in an exit callback":
        atexit.register(ctrl_c)
    print('{"status": "failed"}', flush=True)
    return 2

cli.main = main
cli.run()
"""


@pytest.mark.parametrize("when", ["while the group is left", "in an exit callback"])
def test_a_ctrl_c_as_a_torchrun_worker_ends_still_leaves_its_process_group(tmp_path, when):
    """end_process ends a worker that was in a process group without Python's finalization: a group the command
    left standing was never destroyed, and a Ctrl-C in that teardown ended the process at once (with the status)
    past any destroy_process_group. The group is now left before the exit callbacks, a Ctrl-C meanwhile waits for
    it, and the command's status is kept."""
    script = tmp_path / "group.py"
    script.write_text(_CTRL_C_AS_THE_GROUP_IS_LEFT)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(script), when], capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (2, '{"status": "failed"}\ngroup left False\n', "")


def test_ctrl_c_is_one_line_and_leaves_no_half_written_output(tmp_path, tok_dir, monkeypatch, capsys):
    from cookmind.store.writer import StoreWriter

    def interrupted(self, record):
        raise KeyboardInterrupt  # as Ctrl-C arrives in the middle of packing

    monkeypatch.setattr(StoreWriter, "add", interrupted)
    (tmp_path / "in.txt").write_text("one story<|endoftext|>another story")
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(tmp_path / "in.txt")]
    assert cli_main([*argv, "--out", str(tmp_path / "s"), "--quiet"]) == 130
    assert capsys.readouterr().err == "cookmind pack: interrupted\n"  # was a KeyboardInterrupt traceback
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no store, no temporary directory


def _help(stage, *sub):
    """What `cookmind STAGE [SUB] --help` prints (built in this process: no interpreter start per call)."""
    import argparse

    from cookmind.cli import _stage_parser

    parser, _ = _stage_parser(stage)
    for name in sub:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser.format_help()


def test_pack_help_examples_pack(tmp_path, tok_dir):
    """Every example line `pack --help` shows is accepted by its train type (one record each)."""
    from cookmind.store import TokenStore

    text = _help("pack")
    section, examples = None, {}
    for line in text.split("what each --train-type reads")[1].splitlines():
        head = line[2:8].strip()
        if head in ("seq", "sft", "dpo", "grpo"):
            section = head
        elif line.startswith(" " * 11) and line.strip().startswith('"') and examples.get(section):
            examples[section][-1] += " " + line.strip()  # a long example's next line (TRL's DPO rows)
        elif line.startswith(" " * 10) and section:
            examples.setdefault(section, []).append(line.strip())
    assert set(examples) == {"seq", "sft", "dpo", "grpo"}
    for train_type, lines in examples.items():
        for k, line in enumerate(lines):
            src = tmp_path / (f"{train_type}{k}.jsonl" if line.startswith("{") else f"{train_type}{k}.txt")
            src.write_text(line + "\n")
            out = tmp_path / f"{train_type}{k}-store"
            assert (
                cli_main(
                    [
                        "pack",
                        "--tokenizer",
                        str(tok_dir),
                        "--train-type",
                        train_type,
                        "--input",
                        str(src),
                        "--out",
                        str(out),
                        "--quiet",
                    ]
                )
                == 0
            ), line
            expect = 2 if "<|endoftext|>" in line else 1
            assert len(TokenStore(out)) == expect, line


def _parse(stage, *argv):
    from cookmind.cli import _stage_parser, parse_stage_args

    parser, _ = _stage_parser(stage)
    return parse_stage_args(parser, list(argv))


@pytest.mark.parametrize(
    "stage, extra", [("generate", ["--prompt", "hi"]), ("chat", []), ("serve", ["--port", "1"]), ("eval", None)]
)
def test_the_model_is_named_one_way_everywhere(stage, extra):
    """--model DIR, its old spelling --checkpoint, and a positional MODEL all name the model (#17.16)."""
    head = ["eval", "gsm8k"] if extra is None else [stage]
    extra = ["--limit", "1", "--data", "d.jsonl"] if extra is None else extra
    for spelling in (["--model", "m/dir"], ["--checkpoint", "m/dir"], ["m/dir"]):
        assert _parse(*head, *spelling, *extra).model == "m/dir", spelling
        assert _parse(*head, *extra, *spelling).model == "m/dir", spelling
    assert "--model" in _help(*head)
    with pytest.raises(SystemExit):  # none given
        _parse(*head, *extra)
    with pytest.raises(SystemExit):  # two different ones
        _parse(*head, "--model", "a", "b", *extra)


@pytest.mark.parametrize("stage", ["export", "import"])
def test_export_and_import_take_model_and_out_as_flags_or_arguments(stage):
    from cookmind.model.cli_export import model_and_out

    for argv in (["--model", "a", "--out", "b"], ["a", "b"], ["--model", "a", "b"], ["--out", "b", "a"]):
        assert model_and_out(_parse(stage, "--hf", *argv)) == ("a", "b"), argv
    with pytest.raises(ValueError, match="give the model and the output directory"):
        model_and_out(_parse(stage, "--hf", "a"))
    assert "--model" in _help(stage) and "--out" in _help(stage)


def test_train_overrides_work_wherever_they_stand(tmp_path):
    from cookmind.train.cli import resolve_config

    for argv in (
        ["optim.lr=0.00123", "--run-dir", str(tmp_path), "train.max_steps=7"],
        ["--run-dir", str(tmp_path), "optim.lr=0.00123", "train.max_steps=7"],
        ["optim.lr=0.00123", "train.max_steps=7", "--run-dir", str(tmp_path)],
    ):
        cfg = resolve_config(_parse("train", *argv))
        assert (cfg.optim.lr, cfg.train.max_steps, cfg.logging.run_dir) == (0.00123, 7, str(tmp_path)), argv


def test_readme_shows_the_same_input_formats_as_pack_help():
    from cookmind.store.cli import INPUT_FORMATS

    readme = (ROOT / "README.md").read_text()
    lines = [line.strip() for line in INPUT_FORMATS.splitlines() if line.strip().startswith("{")]
    assert len(lines) >= 7
    for line in lines:
        assert line.replace("\\\\", "\\") in readme, line


def test_readme_eval_examples_run(tmp_path, tok_dir, shared_data, capsys):
    """Every `cookmind eval` line of the README runs as written on a tiny model (the data cut short) (#17.13)."""
    import shlex

    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    save_model(
        tmp_path / "ckpt", tiny_lm(vocab_size=tok.vocab_size, eos_token_id=tok.eos_id, max_position_embeddings=512)
    )  # room for the README's eval prompts
    tok.save(tmp_path / "ckpt")
    (tmp_path / "text.txt").write_text(CORPUS)
    (tmp_path / "clean").mkdir()  # a curate output folder
    (tmp_path / "clean" / "shard-00000.jsonl.gz").write_bytes(gzip.compress(json.dumps({"text": CORPUS}).encode()))
    section = (ROOT / "README.md").read_text().split("## Alignment and evaluation", 1)[1].split("\n## ", 1)[0]
    lines = [line.split("#")[0] for line in section.splitlines() if line.startswith("cookmind eval ")]
    assert {shlex.split(line)[2] for line in lines} == {"gsm8k", "mmlu", "ppl"}
    shorten = {
        "gsm8k": ["--limit", "2", "--max-new-tokens", "3"],
        "mmlu": ["--subjects", "virology", "--limit-per-subject", "2"],
        "ppl": [],
    }
    for line in lines:
        argv = [
            str(tmp_path / "ckpt")
            if a in ("CKPT", "HF_OR_CKPT")
            else str(tmp_path / a)
            if a in ("text.txt", "gsm8k.jsonl", "clean/")
            else a.replace("../shared/data", str(shared_data))
            for a in shlex.split(line)[1:]
        ]
        assert cli_main(argv + shorten[argv[1]] + ["--quiet"]) == 0, line
        metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert metrics.get("num_problems", metrics.get("num_questions", metrics.get("tokens"))), line


def test_eval_gsm8k_cli_reports_skipped_over_long_questions(tmp_path, tok_dir, capsys):
    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    save_model(
        tmp_path / "m", tiny_lm(vocab_size=tok.vocab_size, eos_token_id=tok.eos_id, max_position_embeddings=64)
    )  # the context the message below names
    tok.save(tmp_path / "m")
    rows = [{"question": "Tom has 3 apples.", "answer": "#### 3"}, {"question": CORPUS[:2000], "answer": "#### 7"}]
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (
        cli_main(
            [
                "eval",
                "gsm8k",
                str(tmp_path / "m"),
                "--data",
                str(tmp_path / "g.jsonl"),
                "--template",
                "chat",
                "--max-new-tokens",
                "2",
                "--quiet",
                "--out",
                str(tmp_path / "out.jsonl"),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert "skipped 1 of 2 items" in err[-2] and "context of 64 tokens" in err[-2]
    assert "1 answer(s) ran into --max-new-tokens" in err[-1]  # 2 new tokens cut the one graded answer
    metrics = json.loads(captured.out)  # stdout holds the JSON alone
    assert metrics["num_problems"] == 1 and metrics["num_skipped_too_long"] == 1 and metrics["num_cut_short"] == 1
    saved = json.loads((tmp_path / "out.metrics.json").read_text())
    assert saved["num_skipped_too_long"] == 1


def test_pack_reads_a_json_array_file_like_json_lines(tmp_path, tok_dir):
    from cookmind.store import TokenStore

    rows = [{"question": "Tom has 3 apples. How many?", "answer": "#### 3"}, {"prompt": "Say hi", "response": "Hi!"}]
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=2))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("a.json", "b.jsonl"):
        assert (
            cli_main(
                [
                    "pack",
                    "--tokenizer",
                    str(tok_dir),
                    "--train-type",
                    "sft",
                    "--input",
                    str(tmp_path / name),
                    "--out",
                    str(tmp_path / f"{name}.store"),
                    "--quiet",
                ]
            )
            == 0
        )
    a, b = TokenStore(tmp_path / "a.json.store"), TokenStore(tmp_path / "b.jsonl.store")
    assert len(a) == len(b) == 2
    assert all(a.record("sequence", i).tolist() == b.record("sequence", i).tolist() for i in range(2))
    (tmp_path / "bad.json").write_text('[{"prompt": "x", "response": "y"},\n oops]')
    with pytest.raises(ValueError, match=r"bad.json:2: the file opens a JSON array but is not valid JSON"):
        from cookmind.store.sources import iter_items

        list(iter_items(tmp_path / "bad.json"))


def test_inference_needs_neither_the_compiler_nor_the_distributed_stack_at_start(tmp_path):
    """Loading a saved model and generating through the engine (generate, chat, serve) imports no torch._dynamo /
    inductor and no torch.distributed checkpoint / FSDP / DTensor (about 2 s of every inference command's start):
    they come in only where used (compiling, a sharded checkpoint, training). The loaded model equals the saved one."""
    from cookmind.model.model_io import save_model

    model = tiny_lm()
    save_model(tmp_path / "m", model)
    want = model(torch.tensor([[5, 9, 14]])).logits
    heavy = ["torch._dynamo", "torch._inductor", "torch.distributed.checkpoint", "torch.distributed.fsdp",
             "torch.distributed.tensor", "cookmind.parallel", "cookmind.train"]  # fmt: skip
    code = f"""
import sys, torch
import cookmind.infer.cli_generate, cookmind.infer.cli_chat
from cookmind.infer.engine import Engine
from cookmind.infer.sampling import SamplingParams
from cookmind.model.model_io import load_model
model = load_model({str(tmp_path / "m")!r})
torch.save(model(torch.tensor([[5, 9, 14]])).logits, {str(tmp_path / "logits.pt")!r})
engine = Engine(model, num_slots=1, max_seq_len=16)
req = engine.submit([5, 9, 14], SamplingParams(temperature=0.0, max_new_tokens=3))
engine.run_until_idle()
print([m for m in {heavy!r} if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), want, rtol=0, atol=0)


def test_generate_warns_when_the_context_cuts_max_new_tokens(tmp_path, tok_dir, capsys):
    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    ckpt = save_model(tmp_path / "m", tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=24))
    tok.save(ckpt)
    room = 24 - len(tok.encode("the cook"))
    argv = ["generate", "--model", str(ckpt), "--prompt", "the cook", "--max-new-tokens"]
    assert cli_main([*argv, "100"]) == 0  # it stopped at the context's end without a word
    err = capsys.readouterr().err
    assert f"leaves room for {room} new tokens after the prompt, fewer than --max-new-tokens 100" in err
    assert cli_main([*argv, str(room)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_generate_warns_of_the_prompts_the_context_cuts_in_a_batch_naming_them(tmp_path, tok_dir, capsys):
    # each prompt of a batch has its own room: a long one no longer cuts the others' answers, so the warning names
    # the prompts it cuts, and only them
    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    ckpt = save_model(tmp_path / "m", tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=24))
    tok.save(ckpt)
    short, long = "the cook", "the cook " * 3
    room_short, room_long = 24 - len(tok.encode(short)), 24 - len(tok.encode(long))
    assert 0 < room_long < room_short
    argv = ["generate", "--model", str(ckpt), "--prompt", short, "--prompt", long, "--max-new-tokens", str(room_short)]
    assert cli_main(argv) == 0
    err = capsys.readouterr().err
    assert f"leaves room for {room_long} new tokens after --prompt 2 of 2" in err
    assert "--prompt 1 of 2" not in err and err.count("warning") == 1


def test_generate_names_the_prompt_that_fills_the_context_once(tmp_path, tok_dir, capsys):
    # "cookmind generate: error: generate: a prompt of 402 tokens fills ...": the prefix twice, and of several
    # --prompt none was named
    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    ckpt = save_model(tmp_path / "m", tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=24))
    tok.save(ckpt)
    long = "the cook stirs the soup " * 10
    argv = ["generate", "--model", str(ckpt), "--max-new-tokens", "4"]
    n = len(tok.encode(long))
    assert n >= 24
    assert cli_main([*argv, "--prompt", long]) == 2
    err = capsys.readouterr().err
    assert err.count("generate") == 1 and err.count("error") == 1, err  # the prefix once
    assert f"the prompt ({n} tokens) fills the model's context of 24 tokens" in err, err
    assert cli_main([*argv, "--prompt", "the cook", "--prompt", long]) == 2
    err = capsys.readouterr().err
    want = f"--prompt 2 of 2 ('the cook stirs the soup the…', {n} tokens) fills the model's context of 24 tokens"
    assert err.count("generate") == 1 and want in err, err
    n_chat = len(tok.render([{"role": "user", "content": long}], add_generation_prompt=True)[0])
    assert cli_main([*argv, "--chat", "--prompt", long, "--prompt", "the cook"]) == 2
    err = capsys.readouterr().err
    assert f"--prompt 1 of 2 ('the cook stirs the soup the…', {n_chat} tokens with the chat template)" in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "ppl", "--model", "m", "--data", "t.txt", "--window", "0"],  # 0 silently meant the model's context
        ["eval", "gsm8k", "--model", "m", "--data", "d", "--limit", "0"],  # it evaluated one problem
        ["pack", "--tokenizer", "t", "--train-type", "seq", "--input", "i", "--out", "o", "--shard-tokens", "0"],
    ],
)
def test_counts_below_their_range_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(argv)
    assert e.value.code == 2 and "must be 1 or more, got 0" in capsys.readouterr().err


def test_read_jsonl_limit_zero_reads_nothing(tmp_path):
    from cookmind.evals.atomic_io import read_jsonl

    (tmp_path / "a.jsonl").write_text('{"q": 1}\n{"q": 2}\n')
    assert read_jsonl(tmp_path / "a.jsonl", limit=0) == [] and len(read_jsonl(tmp_path / "a.jsonl", limit=1)) == 1


def test_ctrl_c_names_the_subcommand_as_an_error_does(monkeypatch, capsys):
    """An error in `cookmind eval ppl` said 'cookmind eval ppl: error: ...' but Ctrl-C said 'cookmind eval:
    interrupted' (the stage alone), and so for every command with subcommands (tokenizer, curate, eval, ...). The
    interrupt line now names the subcommand too, checked over every command's subcommands: each stage's main
    raises KeyboardInterrupt, then a ValueError, and the two lines name the same command."""
    import argparse as ap

    import cookmind.cli as cli

    seen = 0
    for name in COMMANDS:
        parser, module = cli._stage_parser(name)
        subs = [a for a in parser._actions if isinstance(a, ap._SubParsersAction)]
        for sub in subs[0].choices if subs else ():
            args = ap.Namespace(**{subs[0].dest: sub})
            monkeypatch.setattr(cli, "parse_stage_args", lambda parser, argv, args=args: args)
            for exc, line in ((KeyboardInterrupt(), "interrupted"), (ValueError("bad"), "error: bad")):

                def raising(args, exc=exc):
                    raise exc

                monkeypatch.setattr(module, "main", raising)
                cli.main([name, sub])
                assert capsys.readouterr().err == f"cookmind {name} {sub}: {line}\n", (name, sub)
            seen += 1
    assert seen >= 6  # tokenizer, curate and eval have several each


def _ctrl_c_as_a_terminal_gives_it():
    """A child's SIGINT at its default: a test run started in the background of a non-interactive shell ignores
    SIGINT, its children inherit that, and Python then installs no KeyboardInterrupt handler to test."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


_WORKER_MASK = """
import signal, sys
from cookmind.pools import pool_context

def sigint_held(_):
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return blocked or signal.getsignal(signal.SIGINT) is signal.SIG_IGN

if __name__ == "__main__":
    with pool_context().Pool(2) as pool:  # no initializer: what a worker is before ignore_ctrl_c runs
        held = pool.map(sigint_held, range(4))
    print(held, sigint_held(0))
"""


def test_pool_workers_hold_ctrl_c_back_from_their_first_instruction(tmp_path):
    """A Ctrl-C while a worker (or the forkserver) is still starting, before ignore_ctrl_c runs, killed it with an
    import traceback (and once hung a pack: CI, session 22): the forkserver starts with SIGINT blocked, and its
    workers inherit that. The parent's own handler is as it was. In a fresh interpreter: a forkserver this test
    process started earlier would be reused as it is."""
    if "forkserver" not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip("no forkserver on this platform: workers are spawned")
    script = tmp_path / "mask.py"
    script.write_text(_WORKER_MASK)
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_ctrl_c_as_a_terminal_gives_it,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[True,", "True,", "True,", "True]", "False"]


def test_ctrl_c_to_a_pack_with_worker_processes_is_one_line(tmp_path, tok_dir):
    # Ctrl-C reaches the whole process group: each worker printed a KeyboardInterrupt traceback of its own
    import os
    import signal
    import time

    line = "the cook stirs the soup and tastes it, then adds a pinch of salt and some pepper.\n"
    (tmp_path / "in.txt").write_text(line * 60_000)  # 5 MB: seconds of work for two workers
    argv = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(tmp_path / "in.txt")]
    argv += ["--out", str(tmp_path / "s"), "--one-per-line", "--workers", "2", "--shard-tokens", "20000", "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cookmind", "pack", *argv],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_a_terminal_gives_it,
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".s.tmp-*/shard_0001*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # the workers are encoding once a second shard is written
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    assert err == "cookmind pack: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_ctrl_c_to_a_tokenizer_train_with_worker_processes_is_one_line(tmp_path):
    # as for pack: the pre-tokenizing workers printed a KeyboardInterrupt traceback each (cookmind.pools)
    import os
    import random
    import signal
    import time

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    lines = (" ".join(rng.choice(words) for _ in range(12)) + ".\n" for _ in range(150_000))
    # ~12 MB of distinct lines, four times: seconds of pre-tokenizing. Once (1 s in all on a quiet machine), a
    # loaded machine's main process counted every chunk itself before its pool's first worker had started
    (tmp_path / "in.txt").write_text("".join(lines) * 4)
    argv = ["tokenizer", "train", "--input", str(tmp_path / "in.txt"), "--vocab-size", "2000"]
    argv += ["--out", str(tmp_path / "tok"), "--workers", "2", "--quiet"]  # its bars go into the pipe too
    proc = subprocess.Popen(
        [sys.executable, "-m", "cookmind", *argv],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ctrl_c_as_a_terminal_gives_it,
    )
    deadline = time.monotonic() + 60
    # the resource tracker, the forkserver and the pool's one worker are up (the main process counts beside it)
    while len(_children(proc.pid)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    assert proc.poll() is None, "finished before the interrupt: give it more text"
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, err
    assert err == "cookmind tokenizer train: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def _children(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        todo += kids
    return found


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tokenizer", "train", "--input", "c.txt", "--vocab-size", "300", "--out", "t", "--chunk-mb", "0"], "above 0"),
        (
            ["tokenizer", "train", "--input", "c.txt", "--vocab-size", "300", "--out", "t", "--workers", "0"],
            "1 or more",
        ),
        (
            [
                "pack",
                "--tokenizer",
                "t",
                "--train-type",
                "sft",
                "--input",
                "i",
                "--out",
                "o",
                "--add-system-ratio",
                "2",
            ],
            "0 or more and at most 1",
        ),
        (["curate", "run", "--input", "i", "--output", "o", "--workers", "-2"], "1 or more"),
        (
            ["curate", "dedup", "--method", "minhash", "--input", "i", "--output", "o", "--jaccard-threshold", "0"],
            "above 0 and at most 1",
        ),
        (["generate", "--model", "m", "--prompt", "p", "--temperature", "-1"], "0 or more"),
        (["generate", "--model", "m", "--prompt", "p", "--top-p", "0"], "above 0 and at most 1"),
        (["generate", "--model", "m", "--prompt", "p", "--top-p", "nan"], "above 0 and at most 1"),
        # the sampler's own range: 0.001 and a seed past 64 bits passed, then read "sampling parameter ... out of range"
        (["chat", "--model", "m", "--repetition-penalty", "0.001"], "must be 0.01 or more and at most 100"),
        (["generate", "--model", "m", "--prompt", "p", "--seed", str(2**63)], "must be from -9223372036854775808"),
        (["eval", "gsm8k", "--model", "m", "--data", "d", "--seed", str(2**63)], "must be from -9223372036854775808"),
        (["chat", "--model", "m", "--max-new-tokens", "0"], "1 or more"),
        (["chat", "--model", "m", "--min-p", "1.5"], "0 or more and at most 1"),
        (["serve", "--model", "m", "--max-body-mb", "0"], "above 0"),
        (["eval", "gsm8k", "--model", "m", "--data", "d", "--temperature", "x"], "expected a number"),
        (["demo", "--workdir", "w", "--sft-steps", "0"], "1 or more"),
    ],
)
def test_numbers_outside_their_range_are_usage_errors(argv, message, capsys, tmp_path, monkeypatch):
    """--chunk-mb 0 divided by zero, a probability of 2 or a top-p of 0 ran, negative workers were taken."""
    monkeypatch.chdir(tmp_path)  # were a check lost, the command runs: its relative paths land here
    with pytest.raises(SystemExit) as e:
        cli_main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err


def test_generate_system_without_chat_is_refused_not_dropped(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["generate", "--model", "m", "--prompt", "p", "--system", "Be brief."]) == 2
    assert "--system needs --chat" in capsys.readouterr().err


def test_generate_chat_with_keep_special_tokens_is_refused_not_ignored(capsys, tmp_path, monkeypatch):
    """A chat reply ends at its first control token and holds none: the flag could show nothing (it was accepted
    and did nothing), as the server's chat completions refuse skip_special_tokens=false."""
    monkeypatch.chdir(tmp_path)
    assert cli_main(["generate", "--model", "m", "--prompt", "p", "--chat", "--keep-special-tokens"]) == 2
    err = capsys.readouterr().err
    assert "cookmind generate: error: --keep-special-tokens has nothing to show with --chat" in err
    assert len(err.strip().splitlines()) == 1


def test_an_os_error_is_one_sentence_naming_the_path_not_an_errno(tmp_path):
    """The top-level handler printed str(exc): "[Errno 17] File exists: 'afile'", with nothing to do about it."""
    from cookmind.cli import os_error_line

    afile = tmp_path / "afile"
    afile.write_text("mine")
    lines = {}
    for name, fail in {
        "exists": lambda: afile.mkdir(),
        "mkdir-over-file": lambda: (afile / "sub").mkdir(parents=True, exist_ok=True),
        "under-a-file": lambda: open(afile / "x.txt", "w"),
        "a-folder": lambda: open(tmp_path, "rb"),
        "missing": lambda: open(tmp_path / "none.txt"),
    }.items():
        with pytest.raises(OSError) as info:
            fail()
        lines[name] = os_error_line(info.value)
    assert lines["exists"] == f"{afile}: is a file, not a folder; choose another path or move it away"
    assert lines["mkdir-over-file"].startswith(f"{afile}")
    assert lines["under-a-file"] == (
        f"{afile / 'x.txt'}: {afile} is a file, not a folder; choose another path or move {afile} away"
    )
    assert lines["a-folder"] == f"{tmp_path}: is a folder, not a file; name a file"
    assert lines["missing"] == f"{tmp_path / 'none.txt'}: no such file or folder; check the path"
    denied = PermissionError(13, "Permission denied", "/root/x")
    assert os_error_line(denied) == "/root/x: permission denied; choose a path you may use, or change its permissions"
    assert all("Errno" not in line and "\n" not in line for line in lines.values())
    kept = FileNotFoundError(2, "no tokenizer here; train one", "tok")  # not the system's words: kept
    assert os_error_line(kept) == "tok: no tokenizer here; train one"
    ours = "out already exists; pass --overwrite"
    assert os_error_line(FileExistsError(ours)) == ours  # our own sentences are kept


def test_every_error_line_names_the_stage_and_its_sub_command(tmp_path, capsys):
    """An OSError the top level caught read `cookmind curate: error: [Errno 17] ...` where the stage's own said
    `cookmind curate crawl: error:`; `tokenizer export --out afile` was a raw errno too."""
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert cli_main(["curate", "crawl", "--output", str(afile), "--num-pages", "3"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"cookmind curate crawl: error: {afile} is not a crawl folder (a file);") and "Errno" not in err
    )
    assert len(err.strip().splitlines()) == 1
    assert cli_main(["tokenizer", "export", "--tokenizer", str(tmp_path / "tok"), "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind tokenizer export: error: --out {afile} is a file;") and "Errno" not in err
    assert cli_main(["eval", "ppl", "--model", str(tmp_path / "none"), "--data", str(afile), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("cookmind eval ppl: error: ")
    assert afile.read_text() == "mine"


def test_curate_sub_commands_say_a_missing_input_in_a_sentence(tmp_path, capsys):
    """curate's own error handler printed str(exc): "[Errno 2] No such file or directory: '...'"."""
    missing = tmp_path / "nope.jsonl"
    for argv in (
        ["curate", "train-classifier", "--input", str(missing), "--output", str(tmp_path / "m.npz")],
        ["curate", "dedup", "--method", "lines", "--input", str(missing), "--output", str(tmp_path / "d")],
    ):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert err == f"cookmind curate {argv[1]}: error: {missing}: no such file or folder; check the path\n", err


def test_output_piped_into_a_reader_that_stops_early_ends_quietly():
    """`cookmind train --config tiny-cpu --print-config | head` printed "cookmind train: error: Broken pipe" and
    exited 2, as if the command had failed: a reader that stops early is no error (silence, exit 128 + SIGPIPE)."""
    import signal

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cookmind", "train", "--config", "tiny-cpu", "--print-config"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=root,
    )
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE and err == "", err


def _all_parsers(parser, path=()):
    """(command path, parser) for ``parser`` and every subcommand parser below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_parsers(sub, (*path, name))


def test_every_command_that_writes_a_named_output_takes_out():
    """`pack`, `train`'s exports, `eval` and `tokenizer train` take --out, but `curate run` and `tokenizer encode`
    only --output: a user who had just typed `pack --out` got 'unrecognized arguments: --out' from the next stage.
    Every command's output option answers to --out now (--output stays where it was)."""
    import importlib

    from cookmind.cli import COMMANDS

    missing, outs = [], 0
    for name, (module, _help) in COMMANDS.items():
        top = argparse.ArgumentParser(prog=f"cookmind {name}")
        importlib.import_module(module).add_arguments(top)
        for path, parser in _all_parsers(top, (name,)):
            for action in parser._actions:
                if "--output" in action.option_strings and "--out" not in action.option_strings:
                    missing.append(" ".join(path))
                outs += "--out" in action.option_strings
    assert missing == []
    assert outs >= 10  # the walk reached the subcommands (curate's four, tokenizer's, pack, eval, export...)


def test_ctrl_c_to_serve_is_one_line_and_exit_130(tmp_path, tok_dir):
    # README: Ctrl-C prints 'cookmind STAGE: interrupted' (exit 130). serve printed nothing and exited 0: uvicorn
    # re-raises the SIGINT it shut down on, and asyncio.run's own SIGINT handler swallowed it
    import signal
    import socket
    import time

    from cookmind.model import save_model
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    ckpt = save_model(tmp_path / "m", tiny_lm(vocab_size=tok.vocab_size, max_position_embeddings=24))
    tok.save(ckpt)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cookmind", "serve", str(ckpt), "--port", str(port), "--max-batch", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_as_a_terminal_gives_it,
    )
    try:
        assert "web chat at /" in proc.stdout.readline()  # up: the line is printed just before uvicorn starts
        for _ in range(300):  # and listening
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:  # a failed test leaves no server behind
        proc.kill()
    assert (proc.returncode, err) == (130, "cookmind serve: interrupted\n")


@pytest.mark.parametrize("quiet", [False, True])
def test_tokenizer_train_shows_its_bars_into_a_pipe_as_pack_does_unless_quiet(tmp_path, capsys, quiet):
    # `cookmind tokenizer train ... 2> log` (or under CI) showed no progress at all, where pack and curate show
    # theirs; its bars were tqdm's terminal-only default. --quiet now turns them off, as pack's does
    (tmp_path / "c.txt").write_text("the cook stirs the soup and tastes it. " * 200)
    argv = ["tokenizer", "train", "--input", str(tmp_path / "c.txt"), "--vocab-size", "300", "--workers", "1"]
    assert cli_main([*argv, "--out", str(tmp_path / "t"), *(["--quiet"] if quiet else [])]) == 0
    err = capsys.readouterr().err  # captured: not a terminal
    assert ("pre-tokenize:" in err) != quiet and ("merges:" in err) != quiet
    assert "\r" not in err and "\x1b" not in err  # plain lines in a log, as pack's (cookmind.progress)


@pytest.mark.parametrize(
    "argv, dest, value",
    [
        (
            ["pack", "--separator", "---", "--tokenizer", "t", "--train-type", "seq", "--input", "a", "--out", "o"],
            "separator",
            "---",
        ),
        (
            ["generate", "--model", "m", "--prompt", "-3 degrees is", "--stop", "-END-", "--max-new-tokens", "4"],
            "prompt",
            ["-3 degrees is"],
        ),
        (["generate", "--model", "m", "--prompt", "x", "--stop", "-END-", "--max-new-tokens", "4"], "stop", ["-END-"]),
        (["tokenizer", "encode", "--tokenizer", "t", "--text", "-x-", "--output", "o"], "text", "-x-"),
    ],
)
def test_free_text_that_begins_with_a_dash_is_the_options_value(argv, dest, value):
    # argparse read "---" as an option: "argument --separator: expected one argument"
    assert getattr(_parse(*argv), dest) == value


def test_an_option_after_a_free_text_option_stays_an_option(capsys):
    with pytest.raises(SystemExit):  # the forgotten value is still argparse's usage error, not the text "--out"
        _parse("pack", "--tokenizer", "t", "--train-type", "seq", "--input", "a", "--separator", "--out", "o")
    assert "argument --separator: expected one argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    "names, globs",
    [(["a.txt", "b.txt"], ["*.txt"]), (["a.jsonl.gz"], ["*.jsonl.gz"]), (["a.txt", "b.jsonl"], ["*.txt", "*.jsonl"])],
)
def test_a_folder_without_shards_suggests_its_own_files(tmp_path, tok_dir, capsys, names, globs):
    # a folder of .txt files was told "name the input files instead, e.g. txtdir/*.jsonl"; one of several suffixes
    # is told a glob for each (`d/*` took in a subfolder, and a crawl's manifest.json)
    (tmp_path / "d").mkdir()
    for name in names:
        (tmp_path / "d" / name).write_text("text\n")
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(tmp_path / "d")]
    assert cli_main([*argv, "--out", str(tmp_path / "s"), "--quiet"]) == 2
    example = " ".join(f"{tmp_path / 'd'}/{g}" for g in globs)
    assert capsys.readouterr().err.strip().endswith(f"name the input files instead, e.g. {example}")


def test_a_share_left_out_reads_100_percent_only_when_it_is_all():
    from cookmind.evals.cli import _share

    got = [_share(132_527, 133_027), _share(210, 310), _share(5, 5), _share(0, 5), _share(1, 4000), _share(3999, 4000)]
    assert got == ["99.6%", "68%", "100%", "0%", "<0.1%", ">99.9%"]


UNTRUSTED_NAME = "soup\x1b]0;owned\x07\x1b[2J\u202etxt.gpj.txt"  # an OSC title, a screen clear, a bidi override
SHOWN_NAME = "soup\\x1b]0;owned\\x07\\x1b[2J\\u202etxt.gpj.txt"  # as escape_controls writes it, by hand


def _shows_the_name_escaped(err: str, name: str = SHOWN_NAME) -> bool:
    """The output names the file (``name``: as escape_controls writes it, by hand) with its ESC, BEL and bidi override
    escaped, and holds none of them raw."""
    return name in err and not any(c in err for c in "\x1b\x07\u202e")


def test_error_and_warning_lines_show_a_file_name_s_control_characters_escaped(tmp_path, tok_dir, capsys):
    """A one-line error or warning quotes the user's file names (and lines of their files): a name holding an ESC
    drove the terminal (set its title, cleared the screen) and a bidi override showed the name reversed. Every line
    the CLI prints as `cookmind STAGE: error:` / `warning:` shows them escaped, whichever stage prints it."""
    missing = str(tmp_path / UNTRUSTED_NAME)
    commands = [
        ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", missing, "--out", str(tmp_path / "s")],
        ["tokenizer", "train", "--input", missing, "--vocab-size", "300", "--out", str(tmp_path / "t")],
        ["curate", "run", "--input", missing, "--output", str(tmp_path / "o")],
        ["eval", "ppl", str(tok_dir), "--data", missing],
    ]
    for argv in commands:
        assert cli_main([*argv, "--quiet"] if argv[0] != "eval" else argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind {' '.join(argv[:2]) if argv[0] != 'pack' else 'pack'}: error:"), err
        assert _shows_the_name_escaped(err), (argv, err)
    # a note: tokenizer train --skip-bad says how many records it left out, and where the first was
    bad = tmp_path / (UNTRUSTED_NAME + ".jsonl")
    bad.write_text('{"text": "the soup is good"}\n{"text": 5}\n')
    assert (
        cli_main(
            ["tokenizer", "train", "--input", str(bad), "--vocab-size", "280", "--out", str(tmp_path / "t2")]
            + ["--skip-bad", "--quiet"]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "cookmind tokenizer train: skipped 1 bad record(s)" in err and _shows_the_name_escaped(err), err
    # a warning: curate reads a text file's bytes that are not UTF-8 as U+FFFD and says where the first is
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / UNTRUSTED_NAME).write_bytes(b"Un caf\xe9 tr\xe8s bon.\n")
    (tmp_path / "c.yaml").write_text("stages:\n  - extract: {}\n")
    argv = ["curate", "run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o2")]
    proc = subprocess.run(
        [sys.executable, "-m", "cookmind", *argv, "--config", str(tmp_path / "c.yaml"), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    warning = next(line for line in proc.stderr.splitlines() if "warning:" in line)
    assert warning.startswith("cookmind curate: warning: ") and _shows_the_name_escaped(warning), proc.stderr


def test_pack_and_curate_summaries_show_a_file_name_s_control_characters_escaped(tmp_path, tok_dir, capsys):
    """pack's summary line (stdout: a note for a person, not JSON) names the store and the first skipped line's file,
    and curate's `decontaminate: SET (PATH)` line (stderr) and its closing summary (stdout) name the paths the user
    gave: a name holding an ESC set the terminal's title and cleared the screen, a U+202E showed it reversed."""
    import yaml

    bad = tmp_path / (UNTRUSTED_NAME + ".jsonl")
    bad.write_text('{"text": "the soup is good"}\n{"text": 5}\n')
    out = tmp_path / UNTRUSTED_NAME
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(bad), "--out", str(out)]
    assert cli_main([*argv, "--skip-bad", "--quiet"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("packed 1 seq records") and "skipped 1" in said, said
    assert _shows_the_name_escaped(said, f"{SHOWN_NAME}.jsonl:2"), said  # the first skipped line
    assert _shows_the_name_escaped(said, f"-> {tmp_path}/{SHOWN_NAME} ("), said  # the store
    assert (out / "meta.json").exists()  # the store is written where the name says, the name as given

    eval_set = tmp_path / (UNTRUSTED_NAME + ".eval.jsonl")
    eval_set.write_text('{"question": "how many apples does the farmer sell at the market on sunday"}\n')
    (tmp_path / "docs.txt").write_text("The farmer sells apples at the market on sunday morning.\nA quiet day.\n")
    stages = [{"extract": {}}, {"decontaminate": {"eval_sets": {"gsm8k": str(eval_set)}, "ngram": 5}}]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"stages": stages}))  # the name's controls as YAML escapes
    output = tmp_path / ("o" + UNTRUSTED_NAME)
    proc = subprocess.run(
        [sys.executable, "-m", "cookmind", "curate", "run", "--input", str(tmp_path / "docs.txt")]
        + ["--output", str(output), "--config", str(tmp_path / "c.yaml"), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stderr.splitlines() if line.startswith("decontaminate: "))
    assert line.startswith(f"decontaminate: gsm8k ({tmp_path}/{SHOWN_NAME}.eval.jsonl): 1 items"), line
    assert _shows_the_name_escaped(proc.stderr, f"{SHOWN_NAME}.eval.jsonl"), proc.stderr
    assert _shows_the_name_escaped(proc.stdout, f"in {tmp_path}/o{SHOWN_NAME} ("), proc.stdout


def test_usage_errors_show_the_argument_s_control_characters_escaped(capsys):
    """argparse's usage errors quote what the user typed: a bad choice (argparse writes it as Python's repr) and an
    argument it does not know (written raw: its ESC drove the terminal). Both show it escaped, in the usual
    `cookmind STAGE: error:` line after the usage."""
    bad = "seq\x1b]0;owned\x07\x1b[2J\u202e"
    shown = "seq\\x1b]0;owned\\x07\\x1b[2J\\u202e"
    pack = ["pack", "--tokenizer", "t", "--input", "i", "--out", "o"]
    for argv, said in [
        ([*pack, "--train-type", bad], f"cookmind pack: error: argument --train-type: invalid choice: '{shown}'"),
        ([*pack, "--train-type", "seq", f"--{bad}"], f"cookmind pack: error: unrecognized arguments: --{shown}"),
        (
            ["curate", "run", "--input", "i", "--output", "o", bad],
            f"cookmind curate run: error: unrecognized arguments: {shown}",
        ),
        ([bad], f"cookmind: error: argument <stage>: invalid choice: '{shown}'"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            cli_main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith("usage: cookmind"), err
        assert said in err and shown in err and not any(c in err for c in "\x1b\x07\u202e"), (argv, err)


def test_an_unknown_option_of_a_sub_command_is_named_by_the_sub_command_with_its_usage(capsys):
    """`cookmind eval gsm8k --data d --dtype=bf16` said `cookmind eval: error: unrecognized arguments: --dtype=bf16`
    under eval's usage (`{gsm8k,mmlu,ppl} ...`), which shows none of gsm8k's options; every other usage error of a
    sub-command names it (`cookmind STAGE SUB-COMMAND: error:`) under its own usage."""
    for argv, usage, said in [
        (
            ["eval", "gsm8k", "--data", "d", "--dtype=bf16"],
            "usage: cookmind eval gsm8k [-h]",
            "cookmind eval gsm8k: error: unrecognized arguments: --dtype=bf16\n",
        ),
        (
            ["tokenizer", "info", "--tokenizer", "t", "--bogus"],
            "usage: cookmind tokenizer info [-h]",
            "cookmind tokenizer info: error: unrecognized arguments: --bogus\n",
        ),
    ]:
        with pytest.raises(SystemExit) as exit_:
            cli_main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(usage) and err.endswith(said), err


def test_a_newline_in_a_file_name_does_not_split_a_one_line_error_or_summary(tmp_path, tok_dir, capsys):
    """An error, a warning, a note and a summary line are one line each: a file name holding a newline showed the rest
    of its name as a line of its own, which may read as another (here a forged `packed` line). The newline is shown
    as `\\n` in them; a report printed whole (curate run's) keeps its lines."""
    forged = "x\ncookmind pack: packed 9 seq records"
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--out", str(tmp_path / "s"), "--quiet"]
    assert cli_main([*argv, "--input", str(tmp_path / forged)]) == 2
    err = capsys.readouterr().err
    assert err == f"cookmind pack: error: input {tmp_path}/x\\ncookmind pack: packed 9 seq records does not exist\n"
    (tmp_path / "in.txt").write_text("the soup is good\n")
    argv = [*argv[:5], "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / forged), "--quiet"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("packed 1 seq records") and out.count("\n") == 1, out
    assert f"-> {tmp_path}/x\\ncookmind pack: packed 9 seq records (bin)\n" in out, out
    (tmp_path / "c.yaml").write_text("stages:\n  - extract: {}\n")
    argv = ["curate", "run", "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "c" / forged)]
    assert cli_main([*argv, "--config", str(tmp_path / "c.yaml"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Curation report\n\n| stage | in | kept | removed |"), out  # the report keeps its lines
    assert f"\n1 shards in {tmp_path}/c/x\\ncookmind pack: packed 9 seq records (1 tasks run" in out, out


def test_a_line_goes_out_in_one_write_so_ranks_sharing_a_stderr_do_not_merge_lines(monkeypatch):
    # under torchrun every rank says its error on one shared stderr: print's two writes (the text, then "\n") let
    # two ranks' lines run together, "... that run's checkpointscookmind train: error: ..." and an empty line
    import sys

    from cookmind.cli import say
    from cookmind.terminal import show

    class Recorder:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)
            return len(text)

        def flush(self):
            pass

    err, out = Recorder(), Recorder()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    say("cookmind train", "error", "runs/x already holds another run")
    show("two\nlines", one_line=False)
    assert err.writes == ["cookmind train: error: runs/x already holds another run\n"], err.writes
    assert out.writes == ["two\nlines\n"], out.writes


def test_readme_own_data_walkthrough_runs(tmp_path, shared_data, monkeypatch, capsys):
    """The README's "Your own data, end to end" block runs as written, in a fresh folder, each command exiting 0 and
    handing the next what it reads (training steps cut to 3; the chat reads one line and then the end of input)."""
    import io
    import shlex

    text = (ROOT / "README.md").read_text()
    section = text.split("## Your own data, end to end", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[0].startswith("cookmind curate crawl") and lines[-1].startswith("cookmind chat"), lines
    monkeypatch.chdir(tmp_path)
    for line in lines:
        argv = shlex.split(line.replace("../shared/data", str(shared_data)))
        assert argv[0] == "cookmind", line
        redirect = None
        if ">" in argv:
            argv, redirect = argv[: argv.index(">")], argv[argv.index(">") + 1]
        argv = argv[1:]
        if argv[0] == "train":
            argv += ["train.max_steps=3"]
        if argv[0] == "chat":
            monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n"))
        assert cli_main(argv) == 0, line
        out = capsys.readouterr().out
        if redirect:
            Path(redirect).write_text(out)
    assert "you> bot> " in out, out  # the chat answered the one line
    assert (tmp_path / "data" / "clean" / "report.md").is_file()
    assert (tmp_path / "runs" / "pre" / "report.md").is_file() and (tmp_path / "runs" / "sft" / "checkpoints").is_dir()


# The group's teardown stuck in C++ (a peer gone: here a TCPStore wait), or failing: a second Ctrl-C must end it, and
# a failure must keep the command's status.
_TEARDOWN_HANGS_OR_FAILS = """
import datetime, os, signal, sys, threading, time
import torch.distributed as dist
import cookmind.cli as cli
from cookmind.parallel import init_distributed, process_group

def stuck_destroy():
    if sys.argv[1] == "fails":
        raise RuntimeError("the peer is gone")
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60))

    def two_ctrl_c():
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=two_ctrl_c, daemon=True).start()
    store.wait(["never"])  # in C++: no Python handler runs in this thread until it returns

process_group.destroy_distributed = stuck_destroy

def main(argv=None):
    init_distributed("cpu", "gloo", group_of_one=True)
    print('{"status": "failed"}', flush=True)
    return 2

cli.main = main
cli.run()
"""


@pytest.mark.parametrize("how", ["hangs", "fails"])
def test_a_process_group_teardown_that_hangs_or_fails_keeps_the_exit_status(tmp_path, how):
    """Leaving a group can hang in C++ where a rank has gone: a second Ctrl-C was meant to end it at once, but a
    Python handler runs only when the main thread is back in Python, so it waited out the C++ call (60 s here).
    A teardown that raised escaped as a traceback with exit status 1. Now the teardown runs beside a main thread
    that takes the signals: the second Ctrl-C ends the process with the command's status within seconds, and a
    failed teardown is one line, the status kept."""
    script = tmp_path / "teardown.py"
    script.write_text(_TEARDOWN_HANGS_OR_FAILS)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stdout == '{"status": "failed"}\n', (done.returncode, done.stdout)
    assert "Traceback" not in done.stderr, done.stderr
    if how == "hangs":
        assert time.monotonic() - start < 30, time.monotonic() - start
    else:
        assert done.stderr == "cookmind: warning: leaving the process group failed (RuntimeError: the peer is gone)\n"


@pytest.mark.parametrize("flag", ["--node-rank 0", "--nnodes=2", "--nproc_per_node 2", "--rdzv-endpoint h:29500"])
def test_a_torchrun_flag_after_the_module_says_that_torchrun_s_flags_go_first(flag, capsys):
    """`torchrun -m cookmind train --node-rank 0 ...` (torchrun's flag after the module, so handed to cookmind) said
    only `unrecognized arguments: --node-rank 0`."""
    with pytest.raises(SystemExit) as exit_:
        cli_main(["train", "--print-config", *flag.split()])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"unrecognized arguments: {flag.split()[0]}" in err, err
    assert "torchrun's own options go before -m cookmind" in err and err.count("error:") == 1, err
    # an unknown option of no launcher keeps the plain message
    with pytest.raises(SystemExit):
        cli_main(["train", "--print-config", "--bogus"])
    assert "torchrun" not in capsys.readouterr().err


def test_the_ctrl_c_exit_ends_the_process_when_the_signal_lands_inside_a_write(monkeypatch):
    """keep_exit_status's Ctrl-C handler flushed stdout and stderr before os._exit; a Ctrl-C landing while the main
    thread was inside a write to one of them made that flush raise `RuntimeError: reentrant call inside
    <_io.BufferedWriter>`, and os._exit never ran (the process went on, the exit status lost)."""
    import cookmind.cli as cli

    ended = []

    class Writing:  # a buffered stream the signal interrupted mid-write, as Python's BufferedWriter says it
        def flush(self):
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stdout>'>")

    monkeypatch.setattr(sys, "stdout", Writing())
    monkeypatch.setattr(cli.os, "_exit", ended.append)
    before = signal.getsignal(signal.SIGINT)
    try:
        cli.keep_exit_status(3)
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGINT, before)
    assert ended == [3]


def test_a_missing_or_doubled_model_is_an_error_naming_the_subcommand(tmp_path, capsys):
    """`cookmind eval ppl --data t.txt` said 'cookmind eval: error: the model is missing', under `cookmind eval`'s
    usage, where every other error of that command says 'cookmind eval ppl: error: ...' (as the README promises:
    `cookmind STAGE [SUB-COMMAND]: error: ...'). The model's errors now name the subcommand, as argparse's own do."""
    (tmp_path / "t.txt").write_text("hello")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for task in ("ppl", "gsm8k", "mmlu"):
        for argv, says in (
            (["--data", str(tmp_path / "t.txt")], "the model is missing"),
            ([str(tmp_path / "a"), "--model", str(tmp_path / "b"), "--data", str(tmp_path / "t.txt")], "two models"),
        ):
            with pytest.raises(SystemExit) as exit_:
                cli_main(["eval", task, *argv])
            err = capsys.readouterr().err
            assert exit_.value.code == 2
            assert err.strip().splitlines()[-1].startswith(f"cookmind eval {task}: error: {says}"), err
            assert f"usage: cookmind eval {task} " in err, err
