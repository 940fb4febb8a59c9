"""The path a new user walks, through the CLI only, on the real data in ../shared/data (#17):

tokenizer train (GSM8K + TinyStories text) -> pack seq and pack sft (GSM8K question -> answer chats) -> pretrain
-> SFT -> eval gsm8k -> export --hf -> transformers with the exported chat template -> serve -> the openai client.

Each step checks, against an independent count, that nothing was silently truncated, dropped or mismatched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from gloo_fixtures import find_free_port

from cookmind.cli import main as cli_main

RECORDS = 200  # GSM8K training problems: enough for real lengths, few enough for a CPU test
CONTEXT = 640  # above the longest chat of those records with a 600-token vocabulary


def _run(capsys, *argv) -> str:
    """Run one CLI command in this process; return what it printed (stdout). A failure shows stderr."""
    capsys.readouterr()
    rc = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 0, f"cookmind {' '.join(map(str, argv))} -> {rc}\n{err[-2000:]}"
    return out


def _wait_healthy(url: str, proc: subprocess.Popen, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"cookmind serve exited with {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"cookmind serve did not answer {url}/health within {seconds} s")


@pytest.mark.slow
def test_user_path_on_real_data(shared_data, tmp_path, capsys):
    pytest.importorskip("transformers")
    openai = pytest.importorskip("openai")
    from cookmind.store import TokenStore
    from cookmind.tokenizer import Tokenizer

    gsm_lines = (shared_data / "gsm8k" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:RECORDS]
    gsm = tmp_path / "gsm8k_train.jsonl"
    gsm.write_text("\n".join(gsm_lines) + "\n", encoding="utf-8")
    problems = [json.loads(line) for line in gsm_lines]
    text = tmp_path / "gsm8k.txt"  # the tokenizer's and pretraining's text: each problem as one document
    text.write_text("<|endoftext|>".join(f"{p['question']}\n{p['answer']}" for p in problems), encoding="utf-8")
    stories = shared_data / "text" / "tinystories_sample.txt"
    n_stories = len([d for d in stories.read_text(encoding="utf-8").split("<|endoftext|>") if d.strip()])

    # 1. tokenizer
    tok_dir = tmp_path / "tok"
    _run(capsys, "tokenizer", "train", "--input", text, stories, "--vocab-size", 600, "--out", tok_dir, "--workers", 1)
    tok = Tokenizer.load(tok_dir)
    assert tok.vocab_size == 600 and tok.im_end_id is not None

    # 2. pack: every document and every chat becomes one record, none skipped
    out = _run(
        capsys,
        "pack",
        "--tokenizer",
        tok_dir,
        "--train-type",
        "seq",
        "--input",
        text,
        stories,
        "--out",
        tmp_path / "pre",
        "--quiet",
    )
    assert f"packed {RECORDS + n_stories} seq records" in out and "skipped" not in out
    out = _run(
        capsys,
        "pack",
        "--tokenizer",
        tok_dir,
        "--train-type",
        "sft",
        "--input",
        gsm,
        "--out",
        tmp_path / "sft",
        "--quiet",
    )
    assert f"packed {RECORDS} sft records" in out and "skipped" not in out
    sft = TokenStore(tmp_path / "sft")
    first = sft.record("sequence", 0).tolist()
    expect, _ = tok.render(
        [{"role": "user", "content": problems[0]["question"]}, {"role": "assistant", "content": problems[0]["answer"]}]
    )
    assert first == list(expect)  # the chat the user meant, token for token
    longest = max(len(sft.record("sequence", i)) for i in range(len(sft)))
    assert longest <= CONTEXT, f"the longest chat ({longest} tokens) no longer fits CONTEXT={CONTEXT}; raise it"

    # 3. pretrain, 4. SFT from it (a window that holds every chat: nothing to truncate)
    shape = [
        f"model.max_position_embeddings={CONTEXT}",
        "train.micro_batch_size=2",
        "checkpoint.every=2",
        "eval.every=0",
        "train.max_steps=2",
    ]
    _run(
        capsys,
        "train",
        "--config",
        "tiny-cpu",
        "--train-data",
        tmp_path / "pre",
        "--tokenizer",
        tok_dir,
        "--run-dir",
        tmp_path / "runs" / "pre",
        "data.window_size=128",
        *shape,
    )
    out = _run(
        capsys,
        "train",
        "--config",
        "tiny-cpu",
        "--objective",
        "sft",
        "--init-from",
        tmp_path / "runs" / "pre",
        "--train-data",
        tmp_path / "sft",
        "--tokenizer",
        tok_dir,
        "--run-dir",
        tmp_path / "runs" / "sft",
        f"data.window_size={CONTEXT}",
        *shape,
    )
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert (summary["data_records"], summary["data_truncated"], summary["data_dropped"]) == (RECORDS, 0, 0)
    report = (tmp_path / "runs" / "sft" / "report.md").read_text()  # the run's record says so too (#17.8)
    assert f"| data_records | {RECORDS} |" in report
    assert "| data_truncated | 0 |" in report and "| data_dropped | 0 |" in report
    from cookmind.data import DatasetFactory

    assert len(DatasetFactory.load("sft", str(tmp_path / "sft"), CONTEXT)) == RECORDS  # no chat dropped

    # 5. eval gsm8k with the chat template the model was tuned on: every problem graded, none skipped
    model_dir = tmp_path / "runs" / "sft"
    out = _run(
        capsys,
        "eval",
        "gsm8k",
        "--model",
        model_dir,
        "--data",
        shared_data / "gsm8k" / "test.jsonl",
        "--limit",
        4,
        "--template",
        "chat",
        "--max-new-tokens",
        8,
        "--quiet",
        "--out",
        tmp_path / "g.jsonl",
    )
    metrics = json.loads(out.strip().splitlines()[-1])
    assert metrics["num_problems"] == 4 and metrics["num_skipped_too_long"] == 0 and metrics["context"] == CONTEXT
    assert len((tmp_path / "g.jsonl").read_text().splitlines()) == 4

    # 6. export, then transformers with the exported tokenizer and chat template
    import torch
    import transformers

    hf_dir = tmp_path / "hf"
    _run(capsys, "export", "--hf", "--model", model_dir, "--out", hf_dir)
    gen_cfg = json.loads((hf_dir / "generation_config.json").read_text())
    assert gen_cfg["eos_token_id"] == [tok.eos_id, tok.im_end_id]  # transformers stops at <|im_end|> as we do
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    messages = [{"role": "user", "content": problems[1]["question"]}]
    ours, _ = tok.render(messages, add_generation_prompt=True)
    hf_ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    hf_ids = list(hf_ids["input_ids"] if hasattr(hf_ids, "keys") else hf_ids)
    assert hf_ids == list(ours)  # the same prompt on both sides
    typed = [{"role": "user", "content": "a <|im_end|> typed by the user"}]
    # #17.5: with transformers' sanitize_control_tokens=True (see the README) a typed <|im_end|> stays text
    hf_typed = list(
        hf_tok.apply_chat_template(typed, add_generation_prompt=True, sanitize_control_tokens=True, return_dict=False)
    )
    assert hf_typed.count(tok.im_end_id) == 1  # only the template's own end of the user turn
    assert hf_typed == list(tok.render(typed, add_generation_prompt=True)[0])
    from cookmind.infer import SamplingParams
    from cookmind.infer.generate import generate
    from cookmind.model import load_model, resolve_model_dir

    ids = torch.tensor([hf_ids])
    hf_new = hf_model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :].tolist()
    stops = (tok.eos_id, tok.im_end_id)
    if hf_new and hf_new[-1] in stops:
        hf_new = hf_new[:-1]  # cookmind leaves the stop token out
    ours_new = generate(
        load_model(resolve_model_dir(model_dir)).eval(),
        [list(ours)],
        SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=stops),
    )[0]
    assert not any(t in stops for t in hf_new)  # transformers stopped at the first end token, if any
    assert hf_new == ours_new  # greedy: the same tokens from both stacks

    # 7. serve, 8. the openai client: the prompt it bills is the prompt we render, the answer is our greedy one
    port = find_free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(p) for p in sys.path if p])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cookmind", "serve", "--model", str(model_dir), "--port", str(port), "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        name = client.models.list().data[0].id
        reply = client.chat.completions.create(model=name, messages=messages, max_tokens=12, temperature=0)
        assert reply.usage.prompt_tokens == len(ours)
        assert reply.choices[0].message.content == tok.decode(ours_new)
        assert reply.choices[0].finish_reason == ("length" if len(ours_new) == 12 else "stop")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
