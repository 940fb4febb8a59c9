"""`--help` says what a user would otherwise guess: every shipped preset, and the sampling defaults, which differ
between `generate` (greedy) and `chat` (sampled)."""

from __future__ import annotations

from cookmind.cli import _stage_parser


def _help(stage: str) -> str:
    return " ".join(_stage_parser(stage)[0].format_help().split())


def test_train_help_names_every_shipped_preset_and_the_default():
    from pathlib import Path

    import cookmind

    shipped = sorted(p.stem for p in (Path(cookmind.__file__).parent / "configs").glob("*.yaml"))
    assert {"qwen3-0.6b", "llama-1.3b", "tiny-cpu"} <= set(shipped)
    text = _help("train")
    assert all(name in text for name in shipped), shipped
    assert "(default tiny-cpu). A resume takes the run's own config.yaml instead" in text


def test_train_help_says_how_to_run_many_processes_and_nodes():
    # `cookmind train --help` said nothing of torchrun, parallel.ddp / zero1 / fsdp or the multi-node launch: a user
    # of the help alone could not find that one loop runs on 1..N processes
    text = _help("train")
    assert "torchrun --standalone --nproc-per-node 2 -m cookmind train" in text, text
    for key in ("parallel.ddp=torch", "parallel.ddp=ours parallel.zero1=true", "parallel.fsdp=true"):
        assert key in text, key
    assert "--rdzv-backend c10d --rdzv-endpoint HOST:29500" in text and "--run-dir" in text
    assert "train.grad_accum_steps" in text  # how a resume at another world size keeps the global batch
    # the one example paired ZeRO-1 with our DDP: nothing said it goes with PyTorch's too (tests/test_train_ddp.py)
    assert "parallel.zero1=true (ZeRO-1: AdamW's state split over the processes) goes with either parallel.ddp" in text


def test_generate_and_chat_help_show_their_sampling_defaults():
    parsers = {stage: _stage_parser(stage)[0] for stage in ("generate", "chat")}
    for stage, parser in parsers.items():
        text = _help(stage)
        for action in parser._actions:
            if action.dest in ("max_new_tokens", "temperature", "top_p", "top_k", "device"):
                assert action.help and "default" in action.help, (stage, action.dest)
        assert f"default {parser.get_default('max_new_tokens')}" in text
    assert "0 = greedy (default)" in _help("generate") and "default 0.7" in _help("chat")


def test_our_warnings_print_as_one_line_and_others_keep_pythons_format(monkeypatch):
    import warnings

    import cookmind
    from cookmind.cli import warnings_as_lines

    # Python's own format, behind a fresh function (an earlier test's CLI call may have installed ours already)
    stdlib_format = getattr(warnings.formatwarning, "replaced", warnings.formatwarning)

    def python_format(*args, **kwargs):
        return stdlib_format(*args, **kwargs)

    monkeypatch.setattr(warnings, "formatwarning", python_format)  # restored after the test
    warnings_as_lines("eval")
    warnings_as_lines("train")  # a second stage in one process (tests run main() often): replaces, never nests
    assert warnings.formatwarning.replaced is python_format
    ours = warnings.formatwarning("43% of the sft records are cut short", UserWarning, cookmind.__file__, 214)
    assert ours == "cookmind train: warning: 43% of the sft records are cut short\n"
    theirs = warnings.formatwarning("deprecated", FutureWarning, "/usr/lib/python3/x.py", 3, line="x = 1")
    assert theirs == "/usr/lib/python3/x.py:3: FutureWarning: deprecated\n  x = 1\n"


def test_eval_names_its_data_and_points_at_no_developer_folder(capsys):
    """`eval gsm8k` and `eval mmlu` defaulted --data to ../shared/data/..., a folder of this repository's developer
    layout that a user's clone has not got: --data is now required, and the help says what it holds."""
    import pytest

    texts = {}
    for task in ("gsm8k", "mmlu"):
        with pytest.raises(SystemExit):
            _stage_parser("eval")[0].parse_args([task, "--help"])
        texts[task] = " ".join(capsys.readouterr().out.split())
        assert "shared/data" not in texts[task] and "--data DATA" in texts[task]
        with pytest.raises(SystemExit):  # without it: a usage error naming it
            _stage_parser("eval")[0].parse_args([task, "--model", "m"])
        assert "the following arguments are required: --data" in capsys.readouterr().err
    assert "answer ending in '#### N'" in texts["gsm8k"]
    assert "dev/, val/ and test/ folders" in texts["mmlu"]


def test_chat_has_generates_sampling_options_with_the_same_help():
    # chat lacked --stop and --min-p; the options both have are one definition, so they cannot drift apart (--seed
    # too, but its help: chat's seeds a session, reply k at SEED + k)
    generate, chat = (_stage_parser(stage)[0] for stage in ("generate", "chat"))
    shared = ("top_k", "min_p", "repetition_penalty", "stop")
    helps = [{a.dest: a.help for a in p._actions if a.dest in shared} for p in (generate, chat)]
    assert helps[0] == helps[1] and set(helps[0]) == set(shared)
    args = chat.parse_args(["--model", "m", "--stop", "###", "--stop", "END", "--min-p", "0.1"])
    assert args.stop == ["###", "END"] and args.min_p == 0.1


def test_every_option_of_every_stage_says_what_it_does():
    """`cookmind serve --help` listed `--port PORT` with no word (the README's `--port 8000`: what is the default?),
    as `curate run` did `--executor`/`--format` and `tokenizer export` its `--tokenizer`/`--out`."""
    import argparse

    def options(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from options(sub, f"{path} {name}")
            elif action.option_strings and action.dest != "help":
                yield path, action

    stages = ["curate", "tokenizer", "pack", "train", "export", "import", "generate", "chat", "serve", "eval", "demo"]
    silent = [
        f"{path} {a.option_strings[0]}" for s in stages for path, a in options(_stage_parser(s)[0], s) if not a.help
    ]
    assert silent == []
    assert "default 8000" in _help("serve")


def test_curate_run_workers_help_says_what_a_shard_is_and_the_default(tmp_path, capsys):
    # "--workers: local processes" left a user with 200 HTML pages to guess why --workers 8 ran one process: a
    # process works on one shard at a time, and 256 HTML files make one shard
    import pytest

    from cookmind.cli import main as cli_main
    from cookmind.curate.shards import plan_input_shards

    with pytest.raises(SystemExit):
        cli_main(["curate", "run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = "a shard is one WARC, JSONL or Parquet file, or up to 256 HTML/text files (default: the config's workers, 1)"
    assert said in text, text
    for i in range(257):
        (tmp_path / f"p{i:03d}.html").write_text("<p>soup</p>")
    assert [len(s) for s in plan_input_shards([tmp_path])] == [256, 1]
    (tmp_path / "a.jsonl").write_text('{"text": "soup"}\n')
    assert len(plan_input_shards([tmp_path / "a.jsonl", tmp_path / "p000.html"])) == 2


def test_import_and_export_dtype_help_names_every_value_they_accept():
    """`--dtype` said "fp32, bf16 or fp16" but took float32, bfloat16 and float16 as well: the help names all six."""
    import torch

    from cookmind.model.cli_dtype import parse_dtype

    accepted = {
        "fp32": torch.float32,
        "float32": torch.float32,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    assert {name: parse_dtype(name) for name in accepted} == accepted
    for stage in ("import", "export"):
        action = next(a for a in _stage_parser(stage)[0]._actions if "--dtype" in a.option_strings)
        assert action.help == (
            "cast weights: fp32, bf16 or fp16 (also spelled float32, bfloat16, float16; default: keep)"
        ), (stage, action.help)


def test_every_device_flag_names_every_value_the_device_check_takes():
    """`--device` help in generate, chat, serve and eval said "cpu, cuda or cuda:N" while each took `auto` (and the
    error for a bad one said "pass auto, cpu, cuda or cuda:N"): the help names every value resolve_device accepts."""
    import argparse

    import pytest

    from cookmind.device import resolve_device

    for value in ("auto", "cpu"):
        resolve_device(value)  # accepted
    with pytest.raises(ValueError, match="pass auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
    found = 0
    for stage in ("generate", "chat", "serve", "eval"):
        parser = _stage_parser(stage)[0]
        parsers = [parser] + [
            sub
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values()
        ]
        for p in parsers:
            for action in p._actions:
                if "--device" in action.option_strings:
                    found += 1
                    words = " ".join(action.help.split())
                    assert "auto, cpu, cuda or cuda:N" in words, (stage, p.prog, words)
    assert found >= 6, found  # generate, chat, serve, eval gsm8k / mmlu / ppl


def test_chat_help_lists_the_chats_commands_and_keys():
    # `cookmind chat --help` named none of /reset, /system, /history, /quit nor what Ctrl-C and Ctrl-D do: they were
    # in the README only, and in the chat once it had loaded the model
    from cookmind.infer.cli_chat import HELP

    parser = _stage_parser("chat")[0]
    assert HELP in parser.format_help()  # as the chat's /help prints them, line by line
    text = _help("chat")
    assert "Ctrl-C while a reply streams stops it" in text and "Ctrl-D" in text and "piped" in text


def test_serve_help_says_where_the_api_is_and_how_a_client_reaches_it():
    # `cookmind serve --help` named no endpoint: nothing said the API is under /v1 (a client's base_url without it
    # gets 404 for every call), nor which paths it serves, nor that the key goes in as an OpenAI client's api_key
    text = _help("serve")
    assert 'OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=KEY)' in text
    for path in ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models", "/health", "/metrics"):
        assert path in text, path
    assert "web chat page: http://127.0.0.1:8000/" in text


def test_generate_chat_and_serve_say_the_same_of_tokenizer_the_checkpoints_own():
    # serve said "default: the model directory" (a run directory holds none: its newest checkpoint does) where generate
    # and chat said "the model's", and none said that another tokenizer than the model's is refused
    helps = {}
    for stage in ("generate", "chat", "serve"):
        parser = _stage_parser(stage)[0]
        helps[stage] = next(a.help for a in parser._actions if a.dest == "tokenizer")
    assert len(set(helps.values())) == 1, helps
    assert "the checkpoint's own" in helps["serve"] and "is refused" in helps["serve"], helps


def test_generate_help_says_how_to_give_a_prompt_from_a_file_or_stdin():
    # `cookmind generate runs/x < prompt.txt` answered only "the following arguments are required: --prompt", and the
    # help said "prompt text": nothing said how to give a file's text or a pipe's
    text = _help("generate")
    assert "--prompt-file FILE" in text and "--prompt-file -" in text


def test_mmlu_help_says_its_questions_are_asked_zero_shot(capsys):
    """Nothing said that `eval mmlu` asks each question with no worked examples before it (zero-shot), where
    published MMLU figures are mostly 5-shot from the dev split: a user compared the two as one measure."""
    import pytest

    with pytest.raises(SystemExit):
        _stage_parser("eval")[0].parse_args(["mmlu", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "zero-shot" in text and "5-shot" in text, text


def test_gsm8k_seed_help_says_the_samples_follow_the_batch_size_too(capsys):
    """`--seed` read "sampling seed (default 0)", and the same seed gave other samples (and another accuracy) at
    another --batch-size: each batch of problems draws from its own generator. The help now says both fix them."""
    import pytest

    with pytest.raises(SystemExit):
        _stage_parser("eval")[0].parse_args(["gsm8k", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the same --seed and --batch-size give the same samples" in text, text


def test_help_under_torchrun_prints_once_a_node_and_the_other_ranks_exit_quietly(tmp_path):
    """`torchrun --nproc-per-node 4 -m cookmind train --help` printed the whole help four times, one per rank, as
    session 33 found the start-up errors did. Each node's LOCAL_RANK 0 prints it now (a node's log is all its user may
    read); the node's other ranks print nothing and exit 0, as they do for --version, each stage's --help and
    `train --print-config`."""
    import os
    import subprocess
    import sys

    import cookmind

    root = os.path.dirname(os.path.dirname(cookmind.__file__))
    asks = (["train", "--help"], ["--help"], [], ["eval", "gsm8k", "--help"], ["--version"])
    asks += (["train", "--print-config"],)
    started = []
    for argv in asks:
        for rank, local in ((0, 0), (1, 1), (2, 0)):  # two nodes of two ranks each (rank 3 would be as rank 1)
            env = dict(os.environ, PYTHONPATH=root, WORLD_SIZE="4", RANK=str(rank), LOCAL_RANK=str(local))
            env.update(GROUP_RANK=str(rank // 2), TORCHELASTIC_USE_AGENT_STORE="True")
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="9")  # no launcher's store: help needs none
            cmd = [sys.executable, "-m", "cookmind", *argv]
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            started.append((argv, local, proc))
    for argv, local, proc in started:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (argv, local, err.decode())
        if local == 0:
            assert out.decode().startswith(("usage: cookmind", "cookmind ", "model:")), (argv, out)
        else:
            assert out == b"" and err == b"", (argv, local, out, err)


def test_encode_says_a_transformers_tokenizer_reads_its_input_whole():
    """The README and `tokenizer encode --help` called encode streamed, but a tokenizer read through transformers
    (Llama 2's SentencePiece kind) encodes the file as one text in memory: its ids depend on the whole text (no
    pre-tokenizer, a "▁" put before the text's start), so blocks would give other ids. Both say so."""
    import argparse
    from pathlib import Path

    import cookmind
    from cookmind.tokenizer.cli import add_arguments

    readme = (Path(cookmind.__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    line = next(ln for ln in readme.splitlines() if ln.startswith("cookmind tokenizer encode"))
    assert "transformers" in line and "whole" in line, line
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["encode"].format_help().split())
    assert "a tokenizer read through transformers encodes it whole, in memory" in text, text
