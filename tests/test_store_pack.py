"""`cookmind pack`: every input kind and train type, checked against the tokenizer's own encode/render;
bad lines reported as file:line and never leaving a half store; real GSM8K through the CLI."""

from __future__ import annotations

import argparse
import json
import re
import shutil

import numpy as np
import pytest
from lm_fixtures import CORPUS

from cookmind.data import DatasetFactory
from cookmind.store import TokenStore
from cookmind.store import cli as pack_cli
from cookmind.store.packer import PackError, pack
from cookmind.store.records import SYSTEM_PROMPTS
from cookmind.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tok_dir):
    return Tokenizer.load(tok_dir)


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _records(path, key):
    store = TokenStore(path)
    return [store.record(key, i).tolist() for i in range(len(store))]


DOCS = ["The cook stirs the soup.", "Tom has 3 apples.\nHe buys 4 more.", "Numbers and recipes!"]


def test_seq_from_text_jsonl_and_parquet_give_the_same_documents(tmp_path, tok, tok_dir):
    want = [tok.encode(d) + [tok.eos_id] for d in DOCS]
    txt = tmp_path / "a.txt"
    txt.write_text("<|endoftext|>".join(DOCS) + "<|endoftext|>\n")
    pack([txt], tmp_path / "t", tok_dir, "seq", progress=False)
    assert _records(tmp_path / "t", "sequence") == want
    lines = tmp_path / "l.txt"
    lines.write_text("\n\n".join(d.replace("\n", " ") for d in DOCS))
    meta = pack([lines], tmp_path / "l", tok_dir, "seq", one_per_line=True, progress=False)
    assert _records(tmp_path / "l", "sequence") == [tok.encode(d.replace("\n", " ")) + [tok.eos_id] for d in DOCS]
    jl = _jsonl(tmp_path / "a.jsonl", [{"body": d} for d in DOCS])
    meta = pack([jl], tmp_path / "j", tok_dir, "seq", text_field="body", storage_type="h5", workers=2, progress=False)
    assert _records(tmp_path / "j", "sequence") == want
    assert meta["num_tokens"] == sum(map(len, want)) and meta["tokenizer"]["fingerprint"] == tok.fingerprint()
    assert meta["sources"] == [{"path": str(jl), "records": 3}]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": DOCS}), tmp_path / "a.parquet")
    pack([tmp_path / "a.parquet"], tmp_path / "p", tok_dir, "seq", shard_tokens=5, progress=False)
    assert _records(tmp_path / "p", "sequence") == want
    assert len(TokenStore(tmp_path / "p").shards) == 3


CHAT = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tom has 3 apples?"},
        {"role": "assistant", "content": "He has 7 apples.", "reasoning_content": "3 + 4 = 7"},
        {"role": "user", "content": "And the cook?"},
        {"role": "assistant", "content": "The soup."},
    ]
}


def test_sft_chats_render_with_assistant_only_labels(tmp_path, tok, tok_dir):
    conv = {"conversations": CHAT["messages"][1:3]}
    src = _jsonl(tmp_path / "chat.jsonl", [CHAT, conv])
    pack([src], tmp_path / "s", tok_dir, "sft", progress=False)
    for i, row in enumerate([CHAT, conv]):
        messages = row.get("messages") or row["conversations"]
        ids, mask = tok.render(messages)
        assert _records(tmp_path / "s", "sequence")[i] == ids
        assert _records(tmp_path / "s", "loss_mask")[i] == mask
    item = DatasetFactory.load("sft", tmp_path / "s", 512)[0]
    learned = tok.decode(item["input_ids"][item["labels"] != -100].tolist())
    assert learned == "<think>\n3 + 4 = 7\n</think>\n\nHe has 7 apples.<|im_end|>The soup.<|im_end|>"


def test_sft_augmentation_is_seeded_and_optional(tmp_path, tok, tok_dir):
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"q{k}"},
                {
                    "role": "assistant",
                    "content": "<think>\n</think>\nok",
                },
            ]
        }
        for k in range(6)
    ]
    src = _jsonl(tmp_path / "c.jsonl", rows)
    pack([src], tmp_path / "plain", tok_dir, "sft", progress=False)
    pack([src], tmp_path / "aug", tok_dir, "sft", add_system_ratio=1.0, drop_empty_think_ratio=1.0, progress=False)
    for plain, aug in zip(_records(tmp_path / "plain", "sequence"), _records(tmp_path / "aug", "sequence")):
        assert "<think>" in tok.decode(plain) and "system" not in tok.decode(plain)
        text = tok.decode(aug)
        assert "<think>" not in text
        head = text.split("<|im_end|>")[0]
        assert head.startswith("<|im_start|>system\n") and head.split("\n", 1)[1] in SYSTEM_PROMPTS
    pack([src], tmp_path / "aug2", tok_dir, "sft", add_system_ratio=0.5, workers=2, progress=False)
    pack([src], tmp_path / "aug3", tok_dir, "sft", add_system_ratio=0.5, progress=False)
    assert _records(tmp_path / "aug2", "sequence") == _records(tmp_path / "aug3", "sequence")


def test_a_reply_opening_with_a_think_block_becomes_reasoning(tmp_path, tok, tok_dir):
    """`<think>..</think>answer` in a reply is the dataset's reasoning: the template writes the think tokens; a
    `<think>` typed by the user or in the middle of a reply stays text (#17)."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Why <think>?"},
                {"role": "assistant", "content": "<think>\n3 + 4 = 7\n</think>\n\n7 <think> x"},
            ]
        }
    ]
    pack([_jsonl(tmp_path / "c.jsonl", rows)], tmp_path / "s", tok_dir, "sft", progress=False)
    want = tok.render(
        [
            {"role": "user", "content": "Why <think>?"},
            {"role": "assistant", "content": "7 <think> x", "reasoning_content": "3 + 4 = 7"},
        ]
    )
    (ids,) = _records(tmp_path / "s", "sequence")
    assert ids == want[0] and ids.count(tok.special_tokens["<think>"]) == 1
    assert tok.decode(ids) == (
        "<|im_start|>user\nWhy <think>?<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n3 + 4 = 7\n</think>\n\n7 <think> x<|im_end|>\n"
    )


def test_dpo_masks_cover_only_the_final_response(tmp_path, tok, tok_dir):
    prompt = [
        {"role": "user", "content": "Tom has 3 apples?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "How many now?"},
    ]
    rows = [
        {
            "chosen": prompt + [{"role": "assistant", "content": "7 apples."}],
            "rejected": prompt + [{"role": "assistant", "content": "3 soup."}],
        },
        {"prompt": "The cook?", "chosen": "Stirs the soup.", "rejected": "No."},
    ]
    pack([_jsonl(tmp_path / "p.jsonl", rows)], tmp_path / "d", tok_dir, "dpo", progress=False)
    ds = DatasetFactory.load("dpo", tmp_path / "d", 512)
    picked = [
        tok.decode(ds[i][f"{s}_input_ids"][ds[i][f"{s}_labels"] != -100].tolist())
        for i in range(2)
        for s in ("chosen", "rejected")
    ]
    assert picked == ["7 apples.<|im_end|>", "3 soup.<|im_end|>", "Stirs the soup.<|im_end|>", "No.<|im_end|>"]
    full, _ = tok.render(rows[0]["chosen"])
    assert ds[0]["chosen_input_ids"].tolist() == full


def test_grpo_online_prompt_template_and_offline(tmp_path, tok, tok_dir):
    src = _jsonl(
        tmp_path / "g.jsonl",
        [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}],
    )
    pack([src], tmp_path / "g", tok_dir, "grpo", prompt_template="Q: {question}\nA:", progress=False)
    item = DatasetFactory.load("grpo", tmp_path / "g", 256)[0]
    assert item["answer"] == "7"
    assert item["prompt_ids"].tolist() == tok.encode("Q: Tom has 3 apples and buys 4. How many?\nA:")
    off = _jsonl(
        tmp_path / "o.jsonl",
        [{"prompt": "3 + 4?", "response": "7", "reward": 1.0}, {"prompt": "3 + 4?", "response": "8", "reward": 0}],
    )
    pack([off], tmp_path / "o", tok_dir, "grpo", progress=False)
    ds = DatasetFactory.load("grpo", tmp_path / "o", 256)
    prompt_ids = tok.render([{"role": "user", "content": "3 + 4?"}], add_generation_prompt=True)[0]
    assert ds[0]["prompt_ids"].tolist() == prompt_ids
    resp = ds[1]["response_ids"][ds[1]["response_mask"] == 1].tolist()
    assert tok.decode(resp) == "8<|im_end|>" and ds[1]["reward"].item() == 0.0


BAD = [
    ('{"text": "fine"}', None),
    ('{"text": "broken', "invalid JSON"),
    ('{"body": "x"}', "missing field 'text'"),
    ('{"text": 7}', "field 'text' must be a string, got int"),
    # deeper than Python's recursion limit: json.loads raised RecursionError, a traceback instead of this line
    ('{"text": "x", "m": ' + "[" * 100_000 + "]" * 100_000 + "}", "invalid JSON (nested too deeply"),
]


@pytest.mark.parametrize("line,reason", [b for b in BAD if b[1]])
def test_bad_line_stops_with_file_line_and_reason_and_leaves_no_store(tmp_path, tok_dir, line, reason):
    src = _jsonl(tmp_path / "in.jsonl", ['{"text": "ok"}', line])
    with pytest.raises(PackError) as exc:
        pack([src], tmp_path / "out", tok_dir, "seq", progress=False)
    assert f"{src}:2: {reason}" in str(exc.value) and "--skip-bad" in str(exc.value)
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_chat_roles_out_of_order_and_skip_bad_counts(tmp_path, tok_dir, capsys):
    rows = [
        CHAT,
        {"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "q"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]},
        "not json",
        {"messages": [{"role": "user", "content": "q"}]},
    ]
    src = _jsonl(tmp_path / "c.jsonl", rows)
    args = [
        "--tokenizer",
        str(tok_dir),
        "--train-type",
        "sft",
        "--input",
        str(src),
        "--out",
        str(tmp_path / "s"),
        "--quiet",
    ]
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    assert pack_cli.main(parser.parse_args(args)) == 2  # bad input, as every stage answers it (it was 1)
    err = capsys.readouterr().err
    assert f"{src}:2: roles out of order: message 1 is assistant at the start" in err
    assert pack_cli.main(parser.parse_args(args + ["--skip-bad"])) == 0
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["num_records"] == 1
    assert meta["skipped"]["count"] == 4
    assert meta["skipped"]["by_reason"] == {
        "roles out of order": 1,
        "empty text": 1,
        "invalid JSON": 1,
        "invalid record": 1,
    }
    assert meta["skipped"]["examples"][3] == f"{src}:5: no assistant message to learn from"


def test_gsm8k_packs_as_grpo_and_sft_through_the_cli(tmp_path, tok, tok_dir, shared_data):
    gsm = shared_data / "gsm8k" / "test.jsonl"
    rows = [json.loads(line) for line in gsm.read_text().splitlines()]
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    base = ["--tokenizer", str(tok_dir), "--input", str(gsm), "--quiet"]
    assert pack_cli.main(parser.parse_args(base + ["--train-type", "grpo", "--out", str(tmp_path / "g")])) == 0
    ds = DatasetFactory.load("grpo", tmp_path / "g", 4096, tokenizer_fingerprint=tok.fingerprint())
    assert len(ds) == len(rows) == 1319
    for k in (0, 700, 1318):
        assert ds[k]["answer"] == rows[k]["answer"].split("####")[1].strip()
        assert tok.decode(ds[k]["prompt_ids"].tolist()) == (
            f"<|im_start|>user\n{rows[k]['question']}<|im_end|>\n<|im_start|>assistant\n"
        )
    assert (
        pack_cli.main(
            parser.parse_args(
                base + ["--train-type", "sft", "--out", str(tmp_path / "s"), "--format", "h5", "--workers", "2"]
            )
        )
        == 0
    )
    sft = DatasetFactory.load("sft", tmp_path / "s", 4096)
    item = sft[5]
    assert tok.decode(item["input_ids"][item["labels"] != -100].tolist()) == rows[5]["answer"] + "<|im_end|>"
    assert np.array_equal(
        TokenStore(tmp_path / "s").record("sequence", 5),
        tok.render(
            [{"role": "user", "content": rows[5]["question"]}, {"role": "assistant", "content": rows[5]["answer"]}]
        )[0],
    )


def test_synthetic_chats_and_preferences_pack_through_the_command_line(tmp_path, tok, tok_dir):
    import subprocess
    import sys

    from cookmind.synthetic.chats import chats
    from cookmind.synthetic.preferences import preference_pairs

    convs = chats(40, seed=3)
    src = _jsonl(tmp_path / "chats.jsonl", [{"messages": m} for m in convs])
    prefs = _jsonl(tmp_path / "prefs.jsonl", preference_pairs(10, seed=3))
    cmd = [
        sys.executable,
        "-m",
        "cookmind",
        "pack",
        "--tokenizer",
        str(tok_dir),
        "--train-type",
        "sft",
        "--input",
        str(src),
        "--out",
        str(tmp_path / "s"),
        "--quiet",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "packed 40 sft records" in proc.stdout
    ds = DatasetFactory.load("sft", tmp_path / "s", 1024)
    assert len(ds) == 40 and ds.num_dropped == 0
    for k in (0, 39):
        item = ds[k]
        want = "".join(m["content"] + "<|im_end|>" for m in convs[k] if m["role"] == "assistant")
        assert tok.decode(item["input_ids"][item["labels"] != -100].tolist()) == want
    meta = pack([prefs], tmp_path / "d", tok_dir, "dpo", storage_type="h5", progress=False)
    assert meta["num_records"] == 10 and meta["format"] == "h5"


def test_invalid_utf8_is_a_bad_line_in_jsonl_and_an_error_in_text(tmp_path, tok_dir):
    src = tmp_path / "u.jsonl"
    src.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n{"text": "fine"}\n')
    with pytest.raises(PackError, match=f"{src}:2: invalid UTF-8"):
        pack([src], tmp_path / "a", tok_dir, "seq", progress=False)
    meta = pack([src], tmp_path / "b", tok_dir, "seq", skip_bad=True, progress=False)
    assert meta["num_records"] == 2 and meta["skipped"]["by_reason"] == {"invalid UTF-8": 1}
    txt = tmp_path / "u.txt"
    txt.write_bytes(b"line one\nline two \xff\n")
    with pytest.raises(ValueError, match=f"{txt}:2: invalid UTF-8"):
        pack([txt], tmp_path / "c", tok_dir, "seq", workers=2, progress=False)
    assert not (tmp_path / "c").exists()


def test_sft_from_parquet_with_tools_and_tool_calls(tmp_path, tok, tok_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tools = [{"name": "add", "parameters": {"type": "object"}}]
    call = [{"name": "add", "arguments": '{"a": 3, "b": 4}'}]
    messages = [
        {"role": "user", "content": "3 + 4?"},
        {"role": "assistant", "content": "", "tool_calls": call},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "It is 7."},
    ]
    pq.write_table(pa.table({"conversations": [messages]}), tmp_path / "c.parquet")  # nested structs
    pack([tmp_path / "c.parquet"], tmp_path / "s", tok_dir, "sft", progress=False)
    got = TokenStore(tmp_path / "s").record("sequence", 0).tolist()
    assert got == tok.render(messages)[0]
    # tools as a JSON line field
    src = _jsonl(tmp_path / "t.jsonl", [{"conversations": messages, "tools": tools}])
    pack([src], tmp_path / "t", tok_dir, "sft", progress=False)
    ids, mask = tok.render(messages, tools=tools)
    assert TokenStore(tmp_path / "t").record("sequence", 0).tolist() == ids
    assert "add" in tok.decode(ids) and sum(mask) > 0


def test_overwrite_replaces_only_a_token_store(tmp_path, tok_dir):
    folder = tmp_path / "d"
    folder.mkdir()
    corpus = folder / "corpus.txt"
    corpus.write_text(CORPUS)
    (folder / "notes.md").write_text("mine")
    for out in (folder, corpus):  # a user's folder (the input's own) and a file: never replaced
        with pytest.raises((FileExistsError, PackError), match="--out|not a token store"):
            pack([corpus], out, tok_dir, "seq", overwrite=True, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["corpus.txt", "notes.md"]
    assert corpus.read_text() == CORPUS
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (elsewhere / "data.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a token store"):
        pack([corpus], elsewhere, tok_dir, "seq", overwrite=True, progress=False)
    assert (elsewhere / "data.txt").read_text() == "keep"
    store = tmp_path / "s"
    pack([corpus], store, tok_dir, "seq", progress=False)
    meta = pack([corpus], store, tok_dir, "seq", overwrite=True, separator="\n", progress=False)
    assert TokenStore(store).meta["num_records"] == meta["num_records"] > 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "other", "s"]


def test_a_bad_json_line_names_its_column_in_one_sentence():
    from cookmind.store.records import BadRecord, parse
    from cookmind.store.sources import Item

    # json's message "Invalid control character at" expects a position: it read "... at at column 10"
    with pytest.raises(BadRecord) as e:
        parse(Item("in.jsonl", 6, "json", '{"text": "a\tb"}'))
    assert str(e.value) == "invalid JSON (Invalid control character at column 12)"
    with pytest.raises(BadRecord) as e:
        parse(Item("in.jsonl", 7, "json", '{"text": "open'))
    assert str(e.value) == "invalid JSON (Unterminated string starting at column 10)"
    with pytest.raises(BadRecord) as e:  # a line cut off mid-object, read with its newline: it said "column 1"
        parse(Item("in.jsonl", 8, "json", '{"question": "What is 2+3?", "a\n'))
    assert str(e.value) == "invalid JSON (Unterminated string starting at column 30)"
    with pytest.raises(BadRecord) as e:
        parse(Item("in.jsonl", 9, "json", '{"question": "What is 2+3?"\n'))
    assert str(e.value) == "invalid JSON (Expecting ',' delimiter at column 28)"  # as json reads the line alone


def test_skip_bad_with_every_line_bad_says_how_many_and_why(tmp_path, tok_dir):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"body": f"doc {i}"}) + "\n" for i in range(3)))  # --text-field is wrong
    with pytest.raises(PackError) as e:  # was "every input was empty or skipped", no count, no reason
        pack([src], tmp_path / "s", tok_dir, "seq", skip_bad=True, progress=False)
    assert "every one was bad; skipped 3 bad record(s) (missing field 3)" in str(e.value)
    assert "the first: " in str(e.value) and "in.jsonl:1: missing field 'text'" in str(e.value)
    assert not (tmp_path / "s").exists()


def test_a_message_whose_content_is_not_a_string_says_so():
    from cookmind.store.records import BadRecord, check_messages

    chat = [{"role": "user", "content": 5}, {"role": "assistant", "content": "five"}]
    with pytest.raises(BadRecord, match=r"message 1 \(user\): content must be a string, got int"):  # "empty text"
        check_messages(chat)


def _tokenizer_with(tmp_path, specials):
    from lm_fixtures import CORPUS

    from cookmind.tokenizer import train_bpe

    d = tmp_path / ("tok-" + "-".join(s.strip("<|>") for s in specials))
    d.mkdir()
    (d / "corpus.txt").write_text(CORPUS)
    vocab, merges = train_bpe(d / "corpus.txt", 300, specials, progress=False)
    Tokenizer(vocab, merges, specials).save(d)
    return d


def test_pack_options_that_cannot_work_are_one_error_before_any_line(tmp_path, tok_dir):
    """A grpo template without {question} packed every prompt as the template's literal text; a tokenizer without
    <|endoftext|> was a TypeError; one without chat tokens failed at line 1 as a bad line ('fix the line')."""
    gsm = _jsonl(tmp_path / "gsm.jsonl", [{"question": "What is 2+3?", "answer": "#### 5"}])
    chats = _jsonl(
        tmp_path / "c.jsonl",
        [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}],
    )
    with pytest.raises(PackError, match=r"--prompt-template 'Q: \{q\}' has no \{question\}"):
        pack([gsm], tmp_path / "s1", tok_dir, "grpo", prompt_template="Q: {q}", progress=False)
    for ratio in ("add_system_ratio", "drop_empty_think_ratio"):
        with pytest.raises(PackError, match="a probability between 0 and 1"):
            pack([chats], tmp_path / "s2", tok_dir, "sft", progress=False, **{ratio: 2.0})
    no_eos = _tokenizer_with(tmp_path, ["<|im_start|>", "<|im_end|>"])
    with pytest.raises(PackError, match=r"has neither <\|endoftext\|> nor an EOS token"):
        pack([gsm], tmp_path / "s3", no_eos, "seq", text_field="question", progress=False)
    no_chat = _tokenizer_with(tmp_path, ["<|endoftext|>"])
    for kind, src in (("sft", chats), ("dpo", chats), ("grpo", gsm)):
        with pytest.raises(PackError, match=r"has no <\|im_start\|>/<\|im_end\|> tokens"):
            pack([src], tmp_path / "s4", no_chat, kind, skip_bad=True, progress=False)
    # a grpo template of its own needs no chat tokens, and the question goes where {question} is
    pack([gsm], tmp_path / "s5", no_chat, "grpo", prompt_template="Q: {question}\nA:", progress=False)
    prompt = TokenStore(tmp_path / "s5").record("prompts", 0).tolist()
    assert Tokenizer.load(no_chat).decode(prompt) == "Q: What is 2+3?\nA:"
    assert not any((tmp_path / f"s{i}").exists() for i in range(1, 5))


def test_curate_and_eval_readers_name_the_column_of_a_cut_off_line(tmp_path):
    from cookmind.curate.shards import read_jsonl
    from cookmind.evals.atomic_io import read_jsonl_lines

    src = tmp_path / "cut.jsonl"
    src.write_text('{"text": "fine"}\n{"question": "What is 2+3?"\n')
    with pytest.raises(ValueError, match=r"cut.jsonl:2: not valid JSON \(Expecting ',' delimiter at column 28\)"):
        list(read_jsonl(src))
    with pytest.raises(ValueError, match=r"cut.jsonl:2: not valid JSON \(Expecting ',' delimiter at column 28\)"):
        read_jsonl_lines(src)


@pytest.mark.parametrize("fmt", ["bin", "h5"])
def test_overwrite_refuses_a_store_the_user_added_files_to_and_names_the_first(tmp_path, tok_dir, capsys, fmt):
    """--overwrite deleted the old store whole, with the NOTES.md and mydata/ a user had put in it; now it replaces
    only a folder holding nothing but a store's own files, and the refusal names the first other one."""
    from cookmind.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    store = tmp_path / "s1"
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(corpus), "--out", str(store)]
    argv += ["--format", fmt, "--quiet"]
    assert main(argv) == 0
    (store / "NOTES.md").write_text("my notes")
    (store / "mydata").mkdir()
    (store / "mydata" / "important.txt").write_text("important")
    assert main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind pack: error: {store} holds NOTES.md, which a token store never has;")
    assert err.count("\n") == 1 and f"move {store / 'NOTES.md'} away" in err
    (store / "NOTES.md").unlink()
    assert main([*argv, "--overwrite"]) == 2
    assert "holds mydata/important.txt" in capsys.readouterr().err
    assert (store / "mydata" / "important.txt").read_text() == "important"
    if fmt == "bin":  # a file put inside a shard folder is found too
        (store / "mydata" / "important.txt").rename(store / "shard_0000" / "important.txt")
        (store / "mydata").rmdir()
        assert main([*argv, "--overwrite"]) == 2
        assert "holds shard_0000/important.txt" in capsys.readouterr().err
        (store / "shard_0000" / "important.txt").unlink()
    else:
        shutil.rmtree(store / "mydata")
    assert main([*argv, "--overwrite"]) == 0  # a store of its own files only: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "s1"]


def test_overwrite_is_offered_only_where_it_would_work(tmp_path, tok_dir, capsys):
    """`pack --out afile` said "pass --overwrite", which then refused: the advice led nowhere."""
    from cookmind.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(corpus), "--quiet", "--out"]
    assert main([*argv, str(afile)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a token store" in err and "pass --overwrite" not in err
    assert main([*argv, str(tmp_path / "s")]) == 0
    assert main([*argv, str(tmp_path / "s")]) == 2
    assert "already exists; choose another output path or pass --overwrite" in capsys.readouterr().err
    assert afile.read_text() == "mine"


def test_val_fraction_holds_a_seeded_share_out_into_its_own_store(tmp_path, tok_dir, capsys):
    """The README's --val-data needs a store the user had no way to make from one corpus (pack had no split): now
    --val-fraction F --val-out DIR sends round(F x records) there, chosen with --seed by their places in the input.
    Reference: the records of one unsplit pack, which the two stores partition."""
    docs = [f"Document {i} about soup number {i * 7}." for i in range(200)]
    src = _jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs])
    pack([src], tmp_path / "whole", tok_dir, "seq", progress=False)
    whole = _records(tmp_path / "whole", "sequence")
    argv = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(src), "--quiet"]
    split = [*argv, "--out", str(tmp_path / "tr"), "--val-fraction", "0.1", "--val-out", str(tmp_path / "va")]
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    assert pack_cli.main(parser.parse_args(split)) == 0
    train, val = _records(tmp_path / "tr", "sequence"), _records(tmp_path / "va", "sequence")
    assert sorted(train + val) == sorted(whole) and not {tuple(r) for r in train} & {tuple(r) for r in val}
    assert len(val) == 20  # 10% of 200
    meta = json.loads((tmp_path / "va" / "meta.json").read_text())
    assert meta["role"] == "validation" and meta["split"]["val_records"] == len(val)
    assert json.loads((tmp_path / "tr" / "meta.json").read_text())["split"]["train_records"] == len(train)
    tokens = sum(len(r) for r in val)  # the summary gives the held-out share in tokens too: a record can be a book
    assert f"; {len(val)} held out ({tokens:,} tokens) -> {tmp_path / 'va'}" in capsys.readouterr().out
    # the same split with two tokenizer processes, and another with another seed
    two = [*argv, "--workers", "2", "--out", str(tmp_path / "tr2"), "--val-fraction", "0.1"]
    assert pack_cli.main(parser.parse_args([*two, "--val-out", str(tmp_path / "va2")])) == 0
    assert _records(tmp_path / "va2", "sequence") == val
    other = [*argv, "--seed", "1", "--out", str(tmp_path / "tr3"), "--val-fraction", "0.1"]
    assert pack_cli.main(parser.parse_args([*other, "--val-out", str(tmp_path / "va3")])) == 0
    assert _records(tmp_path / "va3", "sequence") != val
    # refused in one line: a share without its store, the store as --out
    with pytest.raises(PackError, match="--val-fraction and --val-out go together"):
        pack([src], tmp_path / "x", tok_dir, "seq", progress=False, val_fraction=0.1)
    with pytest.raises(PackError, match=r"--val-fraction 0 holds nothing out for --val-out .*va4: give a share"):
        pack([src], tmp_path / "x", tok_dir, "seq", progress=False, val_fraction=0.0, val_out=tmp_path / "va4")
    with pytest.raises(PackError, match="is --out; give the validation store its own folder"):
        pack([src], tmp_path / "y", tok_dir, "seq", progress=False, val_fraction=0.1, val_out=tmp_path / "y")


def test_a_split_into_an_existing_store_is_refused_before_the_inputs_are_read(tmp_path, tok_dir):
    """The README's second pack line (`--out data/pre --val-fraction 0.01 --val-out data/val` after the first made
    data/pre) read every input through to count its records, then said "data/pre already exists" (or, for a text
    file of one document, complained of its record count instead). The output check comes first, as without a split."""
    one = tmp_path / "corpus.txt"
    one.write_text("One document, no separator.\nIts second line.\n", encoding="utf-8")
    pack([one], tmp_path / "pre", tok_dir, "seq", progress=False)
    for out, val in ((tmp_path / "pre", tmp_path / "val"), (tmp_path / "train", tmp_path / "pre")):
        with pytest.raises(FileExistsError, match=f"{re.escape(str(tmp_path / 'pre'))} already exists"):
            pack([one], out, tok_dir, "seq", progress=False, val_fraction=0.5, val_out=val)
    assert not (tmp_path / "train").exists() and not (tmp_path / "val").exists()


def test_a_split_of_one_plain_text_document_says_how_to_make_each_line_a_record(tmp_path, tok_dir):
    """corpus.txt (one sentence a line, no <|endoftext|>) is one record; the refusal said "pack more records" and a
    user had to find --one-per-line in the README. It names the flag; with it the split works."""
    src = tmp_path / "corpus.txt"
    src.write_text("".join(f"Sentence {i} about soup.\n" for i in range(20)), encoding="utf-8")
    with pytest.raises(PackError, match="holds 1 record.*--one-per-line"):
        pack([src], tmp_path / "tr", tok_dir, "seq", progress=False, val_fraction=0.1, val_out=tmp_path / "va")
    pack(
        [src],
        tmp_path / "tr",
        tok_dir,
        "seq",
        progress=False,
        val_fraction=0.1,
        val_out=tmp_path / "va",
        one_per_line=True,
    )
    assert len(_records(tmp_path / "va", "sequence")) == 2 and len(_records(tmp_path / "tr", "sequence")) == 18


def test_val_fraction_for_grpo_is_refused_at_pack_time_naming_grpo_eval_problems(tmp_path, tok_dir, capsys):
    """`pack --train-type grpo --val-fraction F` wrote a validation store that `train` then refused as --val-data
    (GRPO has no validation loss): the pack refuses it in one line, before anything is written, naming what a GRPO
    run validates on instead; `pack --help` says --val-fraction is not for grpo."""
    rows = [{"question": f"What is {i}+1?", "answer": f"#### {i + 1}"} for i in range(10)]
    src = _jsonl(tmp_path / "problems.jsonl", rows)
    argv = ["--tokenizer", str(tok_dir), "--train-type", "grpo", "--input", str(src), "--quiet"]
    argv += ["--out", str(tmp_path / "tr"), "--val-fraction", "0.2", "--val-out", str(tmp_path / "va")]
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    assert pack_cli.main(parser.parse_args(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "cookmind pack: error: --val-fraction 0.2: a grpo run takes no validation store (`cookmind train` refuses "
        "--val-data for grpo); its held-out check is grpo.eval_problems=FILE, a JSON lines file of problems: split "
        "the held-out problems off into a file of their own, pack the rest without --val-fraction, and pass that "
        "file to train as grpo.eval_problems=FILE"
    )
    assert not (tmp_path / "tr").exists() and not (tmp_path / "va").exists()
    help_text = " ".join(parser.format_help().split())
    assert "(seq, sft, dpo; refused for grpo, which validates on held-out problems instead" in help_text


def test_val_fraction_holds_out_round_share_times_records_chosen_by_seed(tmp_path, tok_dir):
    """--val-fraction 0.2 on 5 records held out none for most seeds (each record was drawn on its own) and then
    refused with 'raise it'. It holds out round(F x N) records, at least one and never all, the same ones for the
    same --seed and others for another. Reference: an unsplit pack's records, which the two stores partition."""
    docs = [f"Document {i} about soup number {i * 7}." for i in range(5)]
    src = _jsonl(tmp_path / "five.jsonl", [{"text": d} for d in docs])
    pack([src], tmp_path / "whole", tok_dir, "seq", progress=False)
    whole = sorted(_records(tmp_path / "whole", "sequence"))

    def split(fraction, seed, name=""):
        out, val = tmp_path / f"tr-{fraction}-{seed}{name}", tmp_path / f"va-{fraction}-{seed}{name}"
        pack([src], out, tok_dir, "seq", seed=seed, progress=False, val_fraction=fraction, val_out=val)
        return _records(out, "sequence"), _records(val, "sequence")

    held = set()
    for fraction in (0.001, 0.2, 0.6, 0.999):
        for seed in range(6):
            train, val = split(fraction, seed)
            assert len(val) == min(max(round(fraction * len(docs)), 1), len(docs) - 1), (fraction, seed)
            assert sorted(train + val) == whole
            held |= {tuple(r) for r in val}
    assert split(0.2, 3, name="-again") == split(0.2, 3, name="-once-more")
    assert len(held) == len(docs)  # the seed chooses which records, not only how many
    tiny = _jsonl(tmp_path / "one.jsonl", [{"text": "one"}])
    with pytest.raises(
        PackError, match=r"0.5: the input holds 1 record, and a split needs at least 2 \(one for each store\)"
    ):
        pack([tiny], tmp_path / "z", tok_dir, "seq", progress=False, val_fraction=0.5, val_out=tmp_path / "zv")
    assert not (tmp_path / "z").exists() and not (tmp_path / "zv").exists()


def test_a_stores_fingerprint_tells_what_it_holds_not_how_or_where_it_was_packed(tmp_path, tok_dir):
    """A resume checks that it continues on the store it trained on by this fingerprint (pack wrote none). A repack
    of the same text with another --seed (another split: other records in each store) differs; the same pack again,
    another time, with two workers, into another folder or moved, is the same; so is each of its two stores."""
    docs = [f"Document {i} about soup number {i * 7}." for i in range(60)]
    src = _jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in docs])

    def packed(out, seed=0, workers=0, storage_type="bin"):
        pack(
            [src],
            tmp_path / out,
            tok_dir,
            "seq",
            storage_type=storage_type,
            seed=seed,
            workers=workers,
            progress=False,
            val_fraction=0.2,
            val_out=tmp_path / f"{out}-val",
        )
        return TokenStore(tmp_path / out).fingerprint(), TokenStore(tmp_path / f"{out}-val").fingerprint()

    a, a_val = packed("a")
    assert a != a_val and len(a) == 16 and all(c in "0123456789abcdef" for c in a)
    assert packed("b", workers=2) == (a, a_val)
    shutil.move(tmp_path / "a", tmp_path / "moved")
    assert TokenStore(tmp_path / "moved").fingerprint() == a
    other, other_val = packed("c", seed=1)
    assert other != a and other_val != a_val
    h5 = packed("h", storage_type="h5")
    assert packed("h2", storage_type="h5") == h5 and h5[0] != a  # another format: other bytes on disk


def test_a_stores_fingerprint_sees_other_tokens_in_records_of_the_same_sizes(tmp_path):
    """Stores whose meta.json and sizes are equal (write_store records no pack settings) differ by their tokens."""
    from cookmind.store import write_store

    def store(name, seed):
        rng = np.random.default_rng(seed)
        records = [{"sequence": rng.integers(1, 64, size=40)} for _ in range(4)]
        return TokenStore(write_store(tmp_path / name, "seq", records, vocab_size=64)).fingerprint()

    assert store("a", 0) == store("b", 0) != store("c", 1)


def test_a_stores_fingerprint_is_the_same_when_its_input_was_packed_from_another_folder(tmp_path, tok_dir):
    """The fingerprint leaves out where a store was packed from, input paths included; but meta.json's skipped
    examples ('PATH:LINE: reason', --skip-bad) still carried the input's path, so the same file packed again from
    another folder made another fingerprint, and a resume on that identical store was refused."""
    rows = [{"text": f"Document {i} about soup."} for i in range(8)] + [{"title": "no text here"}]
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        _jsonl(tmp_path / where / "docs.jsonl", rows)
        pack([tmp_path / where / "docs.jsonl"], tmp_path / f"s{where}", tok_dir, "seq", skip_bad=True, progress=False)
    assert TokenStore(tmp_path / "sa").meta["skipped"]["count"] == 1
    assert TokenStore(tmp_path / "sa").fingerprint() == TokenStore(tmp_path / "sb").fingerprint()


SEP = "<|endoftext|>"
BLOCK = 1 << 22  # estimate_items reads this many bytes at a time


ITEM_COUNTS = {  # file name: (content, one_per_line)
    "ends-with-newline.jsonl": ("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)), False),
    "no-final-newline.jsonl": ("\n".join(json.dumps({"text": f"doc {i}"}) for i in range(5)), False),
    "lines.txt": ("one\ntwo\nthree\n", True),
    "ends-with-separator.txt": (f"one{SEP}two{SEP}three{SEP}\n", False),
    "no-final-separator.txt": (f"one{SEP}two{SEP}three\n", False),
    "one-document.txt": ("just one document\n", False),
    "separator-ends-a-block.txt": ("x" * (BLOCK - len(SEP)) + SEP + "\n", False),
}


@pytest.mark.parametrize("name", ITEM_COUNTS)
def test_the_progress_bars_document_count_is_the_inputs_item_count(tmp_path, name):
    """The bar said 0/6 for a 5-record JSONL file: the estimate counted newlines plus one, so a file that ends with
    its last line's newline (or a text file with a closing separator) counted an empty item after it.
    Reference: the items the packer reads."""
    from cookmind.store.sources import estimate_items, iter_items

    content, one_per_line = ITEM_COUNTS[name]
    path = tmp_path / name
    path.write_text(content)
    assert estimate_items(path, SEP, one_per_line) == len(list(iter_items(path, SEP, one_per_line)))


def test_a_bad_preference_pair_names_the_side_and_is_counted_under_its_reason(tmp_path, tok_dir):
    """A pair whose rejected chat had no assistant turn said only 'no assistant message to learn from', an empty
    chosen answer 'empty text in message 2 (assistant)': a pair holds two chats, and neither said which. The
    reason now names the side; --skip-bad still counts it under its kind."""
    user = {"role": "user", "content": "Say hi"}
    rows = [
        {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away."},
        {"chosen": [user, {"role": "assistant", "content": "Hi"}], "rejected": [user]},
        {"prompt": "Say hi", "chosen": " ", "rejected": "No."},
    ]
    for line, reason in ((2, "no assistant message to learn from (in 'rejected')"), (3, "empty text in chosen")):
        src = _jsonl(tmp_path / f"p{line}.jsonl", [rows[0], rows[line - 1]])
        with pytest.raises(PackError, match=re.escape(f"{src}:2: {reason}")):
            pack([src], tmp_path / f"d{line}", tok_dir, "dpo", progress=False)
    with pytest.raises(PackError, match=r"p3\.jsonl:2: empty text in chosen;"):
        pack([tmp_path / "p3.jsonl"], tmp_path / "d", tok_dir, "dpo", progress=False)
    meta = pack([_jsonl(tmp_path / "all.jsonl", rows)], tmp_path / "s", tok_dir, "dpo", skip_bad=True, progress=False)
    assert meta["skipped"]["by_reason"] == {"invalid record": 1, "empty text": 1}


def test_a_preference_pair_whose_two_answers_are_the_same_is_a_bad_record(tmp_path, tok_dir):
    """{"chosen": "Hi!", "rejected": "Hi!"} was packed as a pair: its DPO loss is log 2 with no gradient whatever the
    model, and validation counted it as a pair the model ranks wrong (reward_accuracy takes chosen > rejected), so
    the figure fell with every tie in the data. It is now refused by line, and --skip-bad counts it."""
    rows = [
        {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away."},
        {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Hi!"},
    ]
    src = _jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(PackError, match=r"p\.jsonl:2: chosen and rejected are the same chat: the pair teaches nothing"):
        pack([src], tmp_path / "d", tok_dir, "dpo", progress=False)
    meta = pack([src], tmp_path / "s", tok_dir, "dpo", skip_bad=True, progress=False)
    assert meta["num_records"] == 1 and meta["skipped"]["by_reason"] == {"invalid record": 1}


def test_utf8_errors_replace_packs_what_tokenizer_train_learned_from(tmp_path, tok, tok_dir, capsys):
    """`tokenizer train --utf8-errors replace` learned from a file with bad bytes, but pack had no such option: the
    same file stopped it with 'invalid UTF-8 at byte 9; fix or re-encode the file as UTF-8'. pack now takes
    --utf8-errors too (bad bytes read as U+FFFD, as Python's decoder reads them), and its strict error names it."""
    raw = b"caf\xe9 au lait<|endoftext|>second \xff\xfe doc<|endoftext|>third doc<|endoftext|>fourth"
    src = tmp_path / "latin.txt"
    src.write_bytes(raw)
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    base = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(src), "--quiet"]
    assert pack_cli.main(parser.parse_args([*base, "--out", str(tmp_path / "strict")])) == 2
    err = capsys.readouterr().err
    assert f"{src}:1: invalid UTF-8 at byte 3" in err and "--utf8-errors replace" in err
    args = [*base, "--out", str(tmp_path / "s"), "--utf8-errors", "replace", "--val-fraction", "0.25"]
    assert pack_cli.main(parser.parse_args([*args, "--val-out", str(tmp_path / "v")])) == 0
    docs = [d.strip() for d in raw.decode("utf-8", "replace").split("<|endoftext|>")]  # the reference decoder
    got = [
        TokenStore(tmp_path / d).record("sequence", i).tolist() for d in ("s", "v") for i in range(3 if d == "s" else 1)
    ]
    assert sorted(got) == sorted(tok.encode(d) + [tok.eos_id] for d in docs)
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["pack"]["utf8_errors"] == "replace"
    # a line's bad bytes (one document a line, or a JSON line) name the option too, beside --skip-bad
    lines = tmp_path / "lines.jsonl"
    lines.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    argv = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(lines), "--quiet", "--out"]
    assert pack_cli.main(parser.parse_args([*argv, str(tmp_path / "l")])) == 2
    err = capsys.readouterr().err
    assert f"{lines}:2: invalid UTF-8" in err and "--skip-bad" in err and "--utf8-errors replace" in err
    assert pack_cli.main(parser.parse_args([*argv, str(tmp_path / "l"), "--utf8-errors", "replace"])) == 0
    assert TokenStore(tmp_path / "l").record("sequence", 1).tolist() == tok.encode("caf\ufffd") + [tok.eos_id]


def test_an_input_named_twice_is_refused_not_packed_twice(tmp_path, tok_dir, capsys):
    """`--input cur cur/shard-00000.jsonl.gz` (a folder and one of its shards, or a file twice through a glob) packed
    every record of that shard twice without a word, and meta.json's sources gave each entry the two entries' sum;
    tokenizer train learned it twice. Both now refuse the input in one line naming the file and how it came twice."""
    import gzip

    from cookmind.cli import main

    cur = tmp_path / "cur"
    cur.mkdir()
    shard = cur / "shard-00000.jsonl.gz"
    shard.write_bytes(gzip.compress(b'{"text": "doc one"}\n{"text": "doc two"}\n'))
    pack_argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--quiet", "--out", str(tmp_path / "s")]
    train_argv = ["tokenizer", "train", "--vocab-size", "270", "--workers", "1", "--out", str(tmp_path / "t")]
    for argv in (pack_argv, train_argv):
        again = tmp_path / "." / "cur" / shard.name
        for inputs, first in (([cur, shard], f"{shard} (in the folder {cur})"), ([shard, again], shard)):
            assert main([*argv, "--input", *map(str, inputs)]) == 2
            err = capsys.readouterr().err.strip()
            assert f"input {inputs[1]} is the same file as {first}: its records would be read twice" in err, err
            assert len(err.splitlines()) == 1 and "name each file once" in err, err
    assert not (tmp_path / "s").exists() and not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("train_type", "flag", "only"),
    [
        ("sft", ["--text-field", "body"], "seq"),
        ("grpo", ["--separator", "\n\n"], "seq"),
        ("dpo", ["--one-per-line"], "seq"),
        ("seq", ["--add-system-ratio", "0.5"], "sft"),
        ("grpo", ["--drop-empty-think-ratio", "1"], "sft"),
        ("sft", ["--prompt-template", "Q: {question}\nA:"], "grpo"),
        # a flag given with its default value is given all the same: it was ignored without a word
        ("seq", ["--prompt-template", "chat"], "grpo"),
        ("sft", ["--text-field", "text"], "seq"),
        ("grpo", ["--separator", "<|endoftext|>"], "seq"),
    ],
)
def test_an_option_that_does_not_apply_to_the_train_type_is_refused(tmp_path, tok_dir, capsys, train_type, flag, only):
    """`pack --train-type sft --text-field body` packed the chats as if the flag were not there (sft reads messages,
    question/answer or prompt/response), as did --add-system-ratio on seq text or --one-per-line on JSON chats: a
    user who believed the flag took effect was not told. Now it is one line naming the flag and the type it is for."""
    from cookmind.cli import main

    src = _jsonl(tmp_path / "qa.jsonl", [{"question": "What is 2+3?", "answer": "2+3=5\n#### 5", "text": "x"}] * 2)
    argv = ["pack", "--tokenizer", str(tok_dir), "--input", str(src), "--quiet", "--out", str(tmp_path / "s")]
    assert main([*argv, "--train-type", train_type, *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{flag[0]} applies to --train-type {only} only, and this pack is {train_type}: drop it" in err, err
    assert not (tmp_path / "s").exists()
    if train_type != "dpo":  # the same records pack without the flag
        assert main([*argv, "--train-type", train_type]) == 0


@pytest.mark.parametrize("train_type", ["sft", "dpo", "grpo"])
def test_a_plain_text_input_to_a_records_pack_names_the_suffix_it_was_read_by(tmp_path, tok_dir, capsys, train_type):
    """GSM8K's JSON lines saved as train.txt (or MMLU's .csv) packed as sft stopped with "train.txt:1: expected a JSON
    object, got str", though line 1 is one: the suffix made it plain text, which only seq reads, and nothing said so.
    Now the file is refused before any line is read, naming the suffixes that are read as records."""
    from cookmind.cli import main

    row = {"question": "What is 2+3?", "answer": "2+3=5\n#### 5", "prompt": "Say hi", "chosen": "Hi!", "rejected": "No"}
    good = _jsonl(tmp_path / "qa.jsonl", [row] * 2)
    txt = tmp_path / "qa.txt"
    shutil.copy(good, txt)
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", train_type, "--quiet", "--out", str(tmp_path / "s")]
    for extra in ([], ["--skip-bad"]):  # --skip-bad skipped every record of it, one by one, as not JSON
        assert main([*argv, "--input", str(good), str(txt), *extra]) == 2
        assert capsys.readouterr().err == (
            f"cookmind pack: error: {txt}: --train-type {train_type} reads records, from JSON lines (.jsonl, .json, "
            ".ndjson) or Parquet (.parquet, .pq) files, optionally .gz, and this file's suffix makes it plain text, "
            "which only --train-type seq reads; rename it (e.g. qa.jsonl if it holds JSON lines)\n"
        )
        assert not (tmp_path / "s").exists()
    assert main([*argv, "--input", str(good)]) == 0  # the same lines under a .jsonl name pack


def test_one_per_line_and_a_separator_together_are_refused(tmp_path, tok_dir, capsys):
    from cookmind.cli import main

    src = tmp_path / "t.txt"
    src.write_text("one\ntwo\n")
    argv = [
        "pack",
        "--tokenizer",
        str(tok_dir),
        "--train-type",
        "seq",
        "--input",
        str(src),
        "--out",
        str(tmp_path / "s"),
    ]
    assert main([*argv, "--one-per-line", "--separator", "\n\n"]) == 2
    assert "--one-per-line and --separator both say where documents end: give one" in capsys.readouterr().err


def test_a_split_pack_stopped_while_writing_the_training_stores_last_shard_leaves_neither_store(
    tmp_path, tok_dir, monkeypatch
):
    """The validation store was renamed into place before the training store's last shard (up to --shard-tokens of
    buffered tokens) was written: Ctrl-C or a full disk there left --val-out alone under its final name (a rerun was
    then refused: it 'already exists'), or with --overwrite a new validation split beside the old training store.
    Now both stores are whole on disk before either is renamed."""
    from cookmind.store.writer import StoreWriter

    src = _jsonl(tmp_path / "docs.jsonl", [{"text": f"Document {i} about soup."} for i in range(20)])
    flush = StoreWriter._flush

    def interrupted_at_the_last_flush(self):  # one shard each (--shard-tokens 1e8): its flush is the store's last
        if self.out == tmp_path / "tr":
            raise KeyboardInterrupt
        flush(self)

    monkeypatch.setattr(StoreWriter, "_flush", interrupted_at_the_last_flush)
    with pytest.raises(KeyboardInterrupt):
        pack([src], tmp_path / "tr", tok_dir, "seq", progress=False, val_fraction=0.2, val_out=tmp_path / "va")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


def test_a_bad_record_of_a_json_array_or_parquet_file_is_named_by_its_number_not_a_line(tmp_path, tok_dir, capsys):
    """A .json file holding one JSON array numbers its records from 1 in place of lines, and so does Parquet by row,
    but the errors wrote them as lines: 'arr.json:3: missing field' sent the user to line 3, which holds another
    record (the bad one is on line 4; in a one-line array every record is on line 1). pack, tokenizer train and
    eval ppl now say 'arr.json: record 3:' and 'rows.parquet: row 2:'."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cookmind.cli import main

    arr = tmp_path / "arr.json"
    arr.write_text('[\n  {"text": "a"},\n  {"text": "b"},\n  {"body": "c"}\n]\n')
    rows = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["a", None, "c"]}), rows)
    for src, where in ((arr, f"{arr}: record 3: missing field 'text'"), (rows, f"{rows}: row 2: field 'text'")):
        pack_argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--out", str(tmp_path / "s")]
        train_argv = ["tokenizer", "train", "--vocab-size", "270", "--workers", "1", "--out", str(tmp_path / "t")]
        for argv in (pack_argv, train_argv):
            assert main([*argv, "--input", str(src)]) == 2
            err = capsys.readouterr().err
            assert where in err, err
        from cookmind.evals.perplexity import read_documents  # eval ppl's reader

        with pytest.raises(ValueError, match=re.escape(where)):
            list(read_documents([src]))
        assert main([*pack_argv, "--input", str(src), "--skip-bad", "--quiet"]) == 0
        skipped = json.loads((tmp_path / "s" / "meta.json").read_text())["skipped"]
        assert skipped["examples"][0].startswith(where), skipped
        shutil.rmtree(tmp_path / "s")


@pytest.mark.parametrize(("out", "val_out"), [("pre", "pre/val"), ("both/pre", "both")])
def test_a_validation_store_inside_the_training_store_or_around_it_is_refused_before_anything_is_written(
    tmp_path, tok_dir, out, val_out
):
    """--out data --val-out data/val packed both, renamed the validation store into data/val (making data for it),
    then refused its own training store: 'data exists and is a folder, not a token store', leaving data/val under
    its final name; the other way round it left an empty folder. A store holds only its own files, so the pair is
    now refused at once, naming both, and nothing is written."""
    src = _jsonl(tmp_path / "docs.jsonl", [{"text": f"Document {i} about soup."} for i in range(20)])
    with pytest.raises(PackError, match=r"--val-out .* and --out .*: one store inside the other; give them sibling"):
        pack([src], tmp_path / out, tok_dir, "seq", progress=False, val_fraction=0.2, val_out=tmp_path / val_out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


def test_skip_bad_says_what_it_skipped_and_where_as_tokenizer_train_does(tmp_path, tok_dir, capsys):
    """pack --skip-bad printed "skipped 2 bad line(s): {'invalid JSON': 1, 'missing field': 1}" (a Python dict, and
    no record to look at) where tokenizer train, on the same file, names the reasons and the first bad record; pack
    now prints the same words."""
    from cookmind.cli import main

    src = _jsonl(tmp_path / "bad.jsonl", ['{"text": "hello world"}', '{"text": "cut', '{"body": "x"}'])
    train = ["tokenizer", "train", "--input", str(src), "--vocab-size", "270", "--workers", "1", "--skip-bad"]
    assert main([*train, "--out", str(tmp_path / "t")]) == 0
    said = capsys.readouterr().err
    line = next(x for x in said.splitlines() if "skipped" in x).split("skipped", 1)[1]
    assert f"the first: {src}:2: invalid JSON" in line
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(src), "--quiet", "--skip-bad"]
    assert main([*argv, "--out", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out.strip().endswith("skipped" + line), line


def test_val_fraction_with_skip_bad_states_the_held_out_count_against_the_asked_one(tmp_path, tok_dir, capsys):
    """--skip-bad --val-fraction F: bad lines drew places in the split (which lines are bad is known only once the
    workers have parsed and tokenized them, so an exact count over the good records would cost a second full
    parse), and the summary said '3 held out' where round(F x good records) were asked, without a word. meta.json's
    split and the summary now give the count held out beside the count asked."""
    rows = [{"text": f"Document {i} about soup number {i * 7}."} if i % 2 else "{bad json" for i in range(20)]
    src = _jsonl(tmp_path / "half_bad.jsonl", rows)
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    argv = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(src), "--quiet", "--skip-bad"]
    seen = set()
    for seed in range(4):
        out, val = tmp_path / f"tr{seed}", tmp_path / f"va{seed}"
        split = [*argv, "--seed", str(seed), "--out", str(out), "--val-fraction", "0.3", "--val-out", str(val)]
        assert pack_cli.main(parser.parse_args(split)) == 0
        held = len(TokenStore(val))
        meta = json.loads((val / "meta.json").read_text())["split"]
        assert meta["val_records"] == held and meta["val_records_asked"] == 3  # round(0.3 x 10 good records)
        printed = capsys.readouterr().out
        if held == 3:
            assert "; 3 held out (" in printed and "asked" not in printed
        else:
            why = "bad or empty lines drew places"
            assert f"; {held} held out, not the 3 asked (round(0.3 x 10 records); {why})" in printed
        seen.add(held)
    assert seen != {3}  # the seeds chosen show the shortfall (or excess) the summary now states


def test_utf8_errors_replace_reads_a_json_array_file_too(tmp_path, tok, tok_dir):
    """`--utf8-errors replace` read bad bytes of JSON lines as U+FFFD, but a .json file holding one JSON array (read
    whole by sources._json_array_items) was still refused as 'not valid JSON' by pack and tokenizer train. It now
    reads the array's bad bytes as U+FFFD too; strict still refuses it naming the line."""
    from cookmind.tokenizer.pretokenize import document_texts

    src = tmp_path / "arr.json"
    src.write_bytes(b'[\n{"text": "ok"},\n{"text": "caf\xe9 au lait"}\n]\n')
    with pytest.raises(PackError, match=r"arr\.json:3: .*--utf8-errors replace"):
        pack([src], tmp_path / "strict", tok_dir, "seq", progress=False)
    pack([src], tmp_path / "s", tok_dir, "seq", progress=False, utf8_errors="replace")
    assert _records(tmp_path / "s", "sequence") == [tok.encode(t) + [tok.eos_id] for t in ("ok", "caf\ufffd au lait")]
    assert list(document_texts(src, utf8_errors="replace")) == ["ok", "caf\ufffd au lait"]
    bom = tmp_path / "bom.json"  # a leading byte-order mark is still dropped
    bom.write_bytes(b'\xef\xbb\xbf[{"text": "caf\xe9"}]')
    assert list(document_texts(bom, utf8_errors="replace")) == ["caf\ufffd"]


def test_a_blank_document_between_separators_is_counted_as_empty_by_every_reader(tmp_path, tok, tok_dir):
    """In a plain text file a blank document between two separators was dropped without a count, where a JSON
    record with blank text counted in empty_records. Blank text before the first separator or after the last (a
    file that ends with one) is no document."""
    from cookmind.evals.perplexity import read_documents
    from cookmind.tokenizer.pretokenize import ReadCounts, document_texts

    src = tmp_path / "s.txt"
    src.write_text(
        f"\n{DOCS[0]}<|endoftext|>\n<|endoftext|>{DOCS[1]}<|endoftext|>  <|endoftext|>{DOCS[0]}<|endoftext|>\n"
    )
    pack([src], tmp_path / "s", tok_dir, "seq", progress=False)
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert (meta["num_records"], meta["empty_records"]) == (3, 2)
    assert _records(tmp_path / "s", "sequence") == [tok.encode(d) + [tok.eos_id] for d in (DOCS[0], DOCS[1], DOCS[0])]
    read, empty = ReadCounts(), []
    assert (
        list(document_texts(src, read=read)) == list(read_documents([src], empty=empty)) == [DOCS[0], DOCS[1], DOCS[0]]
    )
    assert read.empty_records == len(empty) == 2


def test_an_empty_document_is_left_out_and_counted_as_tokenizer_train_and_eval_ppl_do(tmp_path, tok, tok_dir, capsys):
    """pack stopped at a record with empty text unless --skip-bad (which counted it as bad), while tokenizer train
    and eval ppl left it out and counted it. One rule now: an empty pretraining document carries nothing, so every
    reader leaves it out and says how many; an SFT/DPO record whose required text is empty stays a bad record."""
    from cookmind.evals.perplexity import read_documents
    from cookmind.tokenizer.pretokenize import ReadCounts, document_texts

    rows = [{"text": DOCS[0]}, {"text": ""}, {"text": " \n\t"}, {"text": DOCS[1]}]
    src = _jsonl(tmp_path / "d.jsonl", rows)
    args = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(src), "--out", str(tmp_path / "s")]
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    assert pack_cli.main(parser.parse_args([*args, "--quiet"])) == 0, capsys.readouterr().err
    assert "left out 2 record(s) with empty text" in capsys.readouterr().out
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert (meta["num_records"], meta["empty_records"], meta["skipped"]["count"]) == (2, 2, 0)
    assert _records(tmp_path / "s", "sequence") == [tok.encode(d) + [tok.eos_id] for d in DOCS[:2]]
    read, empty = ReadCounts(), []
    assert list(document_texts(src, read=read)) == list(read_documents([src], empty=empty)) == DOCS[:2]
    assert read.empty_records == len(empty) == 2
    # every record empty: nothing to pack, and the error says why
    only_empty = _jsonl(tmp_path / "e.jsonl", [{"text": ""}, {"text": " "}])
    with pytest.raises(PackError, match=r"no records to write to .*: every one had empty text \(2\)"):
        pack([only_empty], tmp_path / "e", tok_dir, "seq", progress=False)
    # an SFT record with an empty required field is bad: it stops the pack, naming file:line
    chat = _jsonl(tmp_path / "c.jsonl", [{"prompt": "3 + 4?", "response": "7"}, {"prompt": "2 + 2?", "response": ""}])
    with pytest.raises(PackError, match=r"c\.jsonl:2: empty text in response;"):
        pack([chat], tmp_path / "c", tok_dir, "sft", progress=False)


def test_a_llama_style_tokenizer_ends_each_document_with_its_eos(tmp_path):
    """pack refused a tokenizer without <|endoftext|> ("has no <|endoftext|> token ... train the tokenizer with
    --special-token"), though a Llama/Mistral-style one names its end of text in tokenizer_config.json: </s>. The end of
    a document is now <|endoftext|> when the tokenizer has it, else its EOS, as transformers reads it."""
    transformers = pytest.importorskip("transformers")
    from tokenizer_fixtures import llama_style_tokenizer

    from cookmind.evals.perplexity import document_end_id

    folder = llama_style_tokenizer(tmp_path / "llama", bos=False)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert hf.eos_token == "</s>" and "<|endoftext|>" not in hf.get_vocab()
    (tmp_path / "d.txt").write_text("<|endoftext|>".join(DOCS))
    meta = pack([tmp_path / "d.txt"], tmp_path / "s", folder, "seq", progress=False)
    assert _records(tmp_path / "s", "sequence") == [hf.encode(d) + [hf.eos_token_id] for d in DOCS]
    assert meta["tokenizer"]["eos_id"] == hf.eos_token_id
    assert document_end_id(Tokenizer.load(folder)) == document_end_id(hf) == hf.eos_token_id  # eval ppl's end


def test_a_tokenizer_that_opens_every_text_with_bos_opens_each_document_with_it_in_pack_and_eval_ppl(tmp_path):
    """A Llama-style tokenizer's post_processor puts <s> before every text in transformers; pack only warned
    ("cookmind's encode does not") and packed each document without it, so a model learned from the store what
    transformers never feeds it. Each document now opens with <s> as transformers encodes it, and eval ppl scores the
    same ids from the text, the documents and the store, with our tokenizer or transformers' own."""
    import warnings

    import torch
    import transformers
    from tokenizer_fixtures import llama_style_tokenizer

    from cookmind.evals import evaluate_data

    folder = llama_style_tokenizer(tmp_path / "llama")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    want = [hf(d)["input_ids"] + [hf.eos_token_id] for d in DOCS]
    assert all(ids[0] == hf.bos_token_id for ids in want)
    (tmp_path / "d.txt").write_text("<|endoftext|>".join(DOCS) + "<|endoftext|>")
    _jsonl(tmp_path / "d.jsonl", [{"text": d} for d in DOCS])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left to warn about: pack does what transformers does
        pack([tmp_path / "d.txt"], tmp_path / "s", folder, "seq", progress=False)
    assert _records(tmp_path / "s", "sequence") == want
    torch.manual_seed(0)
    model = torch.nn.Embedding(len(hf), len(hf))  # a bigram table
    stream = sum(want, [])
    by_hand = -sum(torch.log_softmax(model.weight[a], -1)[b].item() for a, b in zip(stream[:-1], stream[1:]))
    for tok in (Tokenizer.load(folder), hf):
        for data in ("d.txt", "d.jsonl", "s"):
            r = evaluate_data(model, tok, tmp_path / data, window=128, progress=False)
            case = (type(tok).__name__, data)
            assert (r["tokens"], r["bytes"]) == (len(stream) - 1, sum(len(d.encode()) for d in DOCS)), case
            assert r["nll_per_token"] == pytest.approx(by_hand / (len(stream) - 1), rel=1e-6), case


def test_a_sentencepiece_style_tokenizer_packs_as_transformers_encodes(tmp_path):
    """A Llama 2 / Mistral tokenizer.json (SentencePiece's BPE with byte fallback, not byte-level) stopped pack at
    once: "model.byte_fallback=True is not supported by cookmind's byte-level BPE", though generate, chat and eval
    read it through transformers. pack now reads it the same way: each document as transformers encodes it, then
    </s>, and eval ppl scores the text as it scores the store."""
    import torch
    import transformers
    from tokenizer_fixtures import sentencepiece_style_tokenizer

    from cookmind.evals import evaluate_data
    from cookmind.tokenizer.hf_adapter import load_tokenizer

    folder = sentencepiece_style_tokenizer(tmp_path / "sp")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    docs = [*DOCS, "Crème brûlée 😀"]  # bytes the vocabulary lacks: byte fallback
    (tmp_path / "d.txt").write_text("<|endoftext|>".join(docs) + "<|endoftext|>")
    pack([tmp_path / "d.txt"], tmp_path / "s", folder, "seq", progress=False, workers=2)
    want = [hf(d)["input_ids"] + [hf.eos_token_id] for d in docs]
    assert _records(tmp_path / "s", "sequence") == want
    torch.manual_seed(0)
    model = torch.nn.Embedding(len(hf), len(hf))  # a bigram table
    tok = load_tokenizer(folder)
    text, packed = (evaluate_data(model, tok, tmp_path / d, window=256, progress=False) for d in ("d.txt", "s"))
    assert text["tokens"] == packed["tokens"] == sum(map(len, want)) - 1
    assert text["nll_per_token"] == pytest.approx(packed["nll_per_token"], rel=1e-6)
    # train reads it too: the tokenizer the store was packed with
    from cookmind.train.build import load_tokenizer as run_tokenizer

    assert run_tokenizer(str(folder)).fingerprint() == TokenStore(tmp_path / "s").tokenizer_fingerprint


def test_a_tokenizer_json_neither_reader_can_read_is_refused_with_cookminds_reason(tmp_path, capsys):
    # with transformers as the second reader, a cut-off tokenizer.json said only transformers' "Expecting property
    # name enclosed in double quotes: line 2 column 1 (char 37)", naming no file
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {\n')
    (tmp_path / "d.txt").write_text("The cook stirs the soup.")
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    args = ["--tokenizer", str(tmp_path / "tok"), "--train-type", "seq", "--input", str(tmp_path / "d.txt")]
    assert pack_cli.main(parser.parse_args([*args, "--out", str(tmp_path / "s"), "--quiet"])) == 2
    err = capsys.readouterr().err.strip()
    assert f"{tmp_path / 'tok' / 'tokenizer.json'}:2: not valid JSON" in err and "\n" not in err, err


@pytest.mark.parametrize("flag", [["--one-per-line"], ["--separator", "==="]])
def test_a_plain_text_flag_without_a_plain_text_input_is_refused(tmp_path, tok_dir, flag, capsys):
    # it packed normally, the flag without effect: the user believed the documents were cut there
    src = _jsonl(tmp_path / "d.jsonl", [{"text": "The cook stirs."}, {"text": "Tom has 3 apples."}])
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    argv = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(src), "--out", str(tmp_path / "s")]
    assert pack_cli.main(parser.parse_args([*argv, *flag, "--quiet"])) == 2
    assert (
        f"{flag[0]} says where a plain text file's documents end, and no input is plain text (JSON lines, JSON and "
        "Parquet hold one document a record): drop it"
    ) in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    text = tmp_path / "d.txt"
    text.write_text("The cook stirs.\nTom has 3 apples.\n")
    assert pack_cli.main(parser.parse_args([*argv, "--input", str(src), str(text), *flag, "--quiet"])) == 0


@pytest.mark.parametrize(
    "record, reason",
    [
        ('{"prompt": "3 + 4?", "response": "7", "reward": NaN}', "reward must be a finite number, got nan"),
        ('{"prompt": "3 + 4?", "response": "7", "reward": -Infinity}', "reward must be a finite number, got -inf"),
        ('{"question": "3 + 4?", "answer": NaN}', "'answer' must be text ('... #### N') or a finite number, got nan"),
        ('{"question": "3 + 4?", "answer": true}', "'answer' must be text ('... #### N') or a finite number, got bool"),
    ],
)
def test_grpo_numbers_that_are_not_finite_numbers_are_bad_records(tmp_path, tok_dir, record, reason):
    """Python's json reads NaN and Infinity: a record's "reward": NaN was packed, and the training step that drew it
    was skipped with nothing said; "answer": NaN became the reference answer "nan", "answer": true "True"."""
    src = _jsonl(tmp_path / "g.jsonl", ['{"question": "1 + 1?", "answer": "2"}', record])
    with pytest.raises(PackError) as exc:
        pack([src], tmp_path / "g", tok_dir, "grpo", progress=False)
    assert f"{src}:2: {reason}" in str(exc.value), str(exc.value)


@pytest.mark.parametrize(
    "record, reason",
    [
        ('{"question": 5, "answer": "7"}', "question must be a string, got int"),
        ('{"prompt": "3 + 4?", "ground_truth": [7]}', "'ground_truth' must be text ('... #### N') or a finite number"),
        ('{"prompt": "3 + 4?", "reference_answer": " "}', "empty text in reference_answer"),
        ('{"question": " ", "answer": "7"}', "empty text in question"),
    ],
)
def test_a_bad_grpo_field_is_named_as_the_record_spells_it(tmp_path, tok_dir, record, reason):
    """A grpo record's question that was not text was "prompt must be a string", its ground_truth "'answer' must be
    text": fields the record did not have. The reason names the field the record holds."""
    src = _jsonl(tmp_path / "g.jsonl", ['{"question": "1 + 1?", "answer": "2"}', record])
    with pytest.raises(PackError) as exc:
        pack([src], tmp_path / "g", tok_dir, "grpo", progress=False)
    assert f"{src}:2: {reason}" in str(exc.value), str(exc.value)


@pytest.mark.parametrize(
    "train_type, record, reason",
    [
        ("sft", '{"question": 5, "answer": "7"}', "question must be a string, got int"),
        ("sft", '{"question": "3 + 4?", "answer": " "}', "empty text in answer"),
        ("sft", '{"prompt": "3 + 4?", "completion": ["7"]}', "completion must be a string, got list"),
        ("sft", '{"prompt": "", "response": "7"}', "empty text in prompt"),
        ("dpo", '{"prompt": 5, "chosen": "7", "rejected": "8"}', "prompt must be a string, got int"),
        ("dpo", '{"prompt": "3 + 4?", "chosen": "7", "rejected": 8}', "rejected must be a string, got int"),
    ],
)
def test_a_bad_sft_or_dpo_text_field_is_named_as_the_record_spells_it(tmp_path, tok_dir, train_type, record, reason):
    """An exchange's fields (question/answer, prompt/response) become a chat, and a bad one was named as the message
    it became: "message 1 (user): content must be a string" of a question, "empty text in message 2 (assistant)" of
    a response, fields the record does not have. The reason names the field."""
    good = {"sft": '{"question": "1 + 1?", "answer": "2"}'}
    good["dpo"] = '{"prompt": "1 + 1?", "chosen": "2", "rejected": "3"}'
    src = _jsonl(tmp_path / "r.jsonl", [good[train_type], record])
    with pytest.raises(PackError) as exc:
        pack([src], tmp_path / "r", tok_dir, train_type, progress=False)
    assert f"{src}:2: {reason}; fix the line" in str(exc.value), str(exc.value)


def test_blank_lines_under_one_per_line_are_empty_documents_counted(tmp_path, tok, tok_dir, capsys):
    """With --one-per-line each line is a document, and a blank one was dropped quietly ("packed 3 seq records",
    empty_records 0) where a blank document between separators is counted. A whitespace-only last line without a
    newline is no line, as text after the last separator is no document; JSON lines still skip blank lines."""
    src = tmp_path / "lines.txt"
    src.write_text("one\n\n\ntwo\n  \nthree\n \t")
    args = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(src), "--out", str(tmp_path / "s")]
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    assert pack_cli.main(parser.parse_args([*args, "--one-per-line", "--quiet"])) == 0, capsys.readouterr().err
    assert "left out 3 record(s) with empty text" in capsys.readouterr().out
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert (meta["num_records"], meta["empty_records"]) == (3, 3)
    assert _records(tmp_path / "s", "sequence") == [tok.encode(w) + [tok.eos_id] for w in ("one", "two", "three")]


def test_a_preference_pair_whose_chats_ask_different_things_is_a_bad_record(tmp_path, tok_dir):
    """DPO compares two answers to one prompt; a pair whose chosen and rejected chats differed before their last
    answer ("q" against "q2") was packed without a word, and trained the margin between two unrelated texts."""
    user, other = {"role": "user", "content": "Say hi"}, {"role": "user", "content": "Say bye"}
    system = {"role": "system", "content": "Be brief."}
    rows = [
        {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away."},
        {
            "chosen": [user, {"role": "assistant", "content": "Hi"}],
            "rejected": [other, {"role": "assistant", "content": "Bye"}],
        },
        {
            "chosen": [system, user, {"role": "assistant", "content": "Hi"}],
            "rejected": [user, {"role": "assistant", "content": "Yo"}],
        },
    ]
    for line, k in ((2, 1), (3, 1)):
        src = _jsonl(tmp_path / f"p{line}.jsonl", [rows[0], rows[line - 1]])
        said = f"{src}:2: chosen and rejected differ before their last answer (message {k} of each)"
        with pytest.raises(PackError, match=re.escape(said)):
            pack([src], tmp_path / f"d{line}", tok_dir, "dpo", progress=False)
    meta = pack([_jsonl(tmp_path / "all.jsonl", rows)], tmp_path / "s", tok_dir, "dpo", skip_bad=True, progress=False)
    assert meta["num_records"] == 1 and meta["skipped"]["count"] == 2


def test_a_prompt_beside_whole_chats_must_be_theirs_or_the_pair_is_a_bad_record(tmp_path, tok_dir):
    """A pair given as whole chats with a `prompt` too had its prompt ignored without a word, whatever it said: a
    prompt that restates the chats' (UltraFeedback's rows: the user's text, then each side as the chat; or the
    messages before the last answer) packs as the chats alone; another is a bad record naming the side, counted
    under --skip-bad."""
    user = {"role": "user", "content": "Say hi"}
    system = {"role": "system", "content": "Be brief."}

    def pair(prompt, head):
        row = {"chosen": [*head, {"role": "assistant", "content": "Hi"}]}
        row["rejected"] = [*head, {"role": "assistant", "content": "Go away."}]
        return row if prompt is None else {"prompt": prompt, **row}

    plain = [pair(None, [system, user])]
    restated = [pair("Say hi", [system, user]), pair([system, user], [system, user])]
    pack([_jsonl(tmp_path / "plain.jsonl", plain * 2)], tmp_path / "p", tok_dir, "dpo", progress=False)
    pack([_jsonl(tmp_path / "restated.jsonl", restated)], tmp_path / "r", tok_dir, "dpo", progress=False)
    for key in ("chosen", "rejected", "chosen_mask", "rejected_mask"):
        assert _records(tmp_path / "r", key) == _records(tmp_path / "p", key), key
    # a multi-turn pair whose prompt is its first user message (UltraChat's convention), and a null prompt, pack too
    turns = [user, {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Again"}]
    pack(
        [_jsonl(tmp_path / "turns.jsonl", [pair("Say hi", turns), pair(None, turns)])],
        tmp_path / "t",
        tok_dir,
        "dpo",
        progress=False,
    )
    assert len(_records(tmp_path / "t", "chosen")) == 2
    src = _jsonl(tmp_path / "other.jsonl", [*restated, pair("Say bye", [user]), pair([user], [system, user])])
    said = (
        f"{src}:3: prompt 'Say bye' is not the prompt of the whole chat in 'chosen' (one of its user messages, or "
        "its first messages): give chosen/rejected as answers to the prompt, or leave prompt out"
    )
    with pytest.raises(PackError, match=re.escape(said)):
        pack([src], tmp_path / "o", tok_dir, "dpo", progress=False)
    meta = pack([src], tmp_path / "s", tok_dir, "dpo", skip_bad=True, progress=False)
    assert meta["num_records"] == 2 and meta["skipped"]["count"] == 2
    assert [e.split(": ", 1)[0] for e in meta["skipped"]["examples"]] == [f"{src}:3", f"{src}:4"]


def test_a_prompt_or_question_beside_an_sft_chat_must_be_one_of_its_user_messages(tmp_path, tok_dir):
    """An sft record holding a chat (`messages` / `conversations`) and a `prompt` or `question` too had that field
    ignored without a word, whatever it said. One that restates a user message of the chat (UltraChat's rows: the
    first user message as `prompt`) packs as the chat alone; another is a bad record naming the field (file:line,
    counted under --skip-bad); and a record with both `messages` and `conversations` that differ is refused too."""
    chat = [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "Hi again"},
    ]
    pack([_jsonl(tmp_path / "plain.jsonl", [{"messages": chat}] * 3)], tmp_path / "p", tok_dir, "sft", progress=False)
    restated = [{"prompt": "Say hi", "messages": chat}, {"question": "Again", "messages": chat}]
    restated.append({"messages": chat, "conversations": chat})
    # null (a column missing from some rows, as pandas writes it) is no prompt; a question a template wraps is one
    templated = [{"role": "user", "content": "Solve this: Say hi\nShow your work."}, *chat[1:]]
    more = [{"prompt": None, "question": None, "messages": chat}, {"question": "Say hi", "messages": templated}]
    pack([_jsonl(tmp_path / "more.jsonl", more)], tmp_path / "m", tok_dir, "sft", progress=False)
    assert _records(tmp_path / "m", "sequence")[0] == _records(tmp_path / "p", "sequence")[0]
    # a chat that is no chat is said as such, not blamed on the prompt beside it (ShareGPT's from/value keys)
    sharegpt = {"prompt": "Hi", "messages": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
    with pytest.raises(PackError, match="role") as bad:
        pack([_jsonl(tmp_path / "sharegpt.jsonl", [sharegpt])], tmp_path / "g", tok_dir, "sft", progress=False)
    assert "prompt" not in str(bad.value).split("sharegpt.jsonl:1:")[1]
    pack([_jsonl(tmp_path / "restated.jsonl", restated)], tmp_path / "r", tok_dir, "sft", progress=False)
    for key in ("sequence", "loss_mask"):
        assert _records(tmp_path / "r", key) == _records(tmp_path / "p", key), key
    other = [{"prompt": "Say bye", "messages": chat}, {"messages": chat, "conversations": chat[:2]}]
    src = _jsonl(tmp_path / "other.jsonl", [*restated, *other])
    said = f"{src}:4: prompt 'Say bye' is not a user message of the chat in 'messages'"
    with pytest.raises(PackError, match=re.escape(said)):
        pack([src], tmp_path / "o", tok_dir, "sft", progress=False)
    meta = pack([src], tmp_path / "s", tok_dir, "sft", skip_bad=True, progress=False)
    assert meta["num_records"] == 3 and meta["skipped"]["count"] == 2
    assert [e.split(": ", 1)[0] for e in meta["skipped"]["examples"]] == [f"{src}:4", f"{src}:5"]
    assert "'messages' and 'conversations' hold different chats" in meta["skipped"]["examples"][1]


def test_a_text_field_for_plain_text_inputs_is_refused_and_a_bad_line_is_one_line(tmp_path, tok_dir, capsys):
    """--text-field names a JSON/Parquet field: on plain text inputs it was ignored without a word. And a bad line's
    error printed its advice on a second line, where every other error is one."""
    from cookmind.cli import main

    txt = tmp_path / "t.txt"
    txt.write_text("one document<|endoftext|>another\n")
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--quiet", "--out", str(tmp_path / "s")]
    assert main([*argv, "--input", str(txt), "--text-field", "body"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--text-field names a field of JSON or Parquet records, and no input is JSON or Parquet" in err, err
    bad = _jsonl(tmp_path / "b.jsonl", ['{"body": 5}'])
    assert main([*argv, "--input", str(bad), "--text-field", "body"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}:1: field 'body' must be a string, got int; fix the line" in err, err
    assert "or pass --skip-bad to skip and count bad lines" in err


def test_tokenizer_train_and_eval_ppl_refuse_a_text_field_their_inputs_do_not_have(tmp_path, capsys):
    """The same flag on the other readers of pack's inputs: `tokenizer train --text-field body` on a text file and
    `eval ppl --text-field body` on a text file or a token store read as if it were not there."""
    from cookmind.cli import main

    txt = tmp_path / "t.txt"
    txt.write_text("one document<|endoftext|>another\n")
    argv = ["tokenizer", "train", "--input", str(txt), "--vocab-size", "300", "--out", str(tmp_path / "tok")]
    assert main([*argv, "--text-field", "body"]) == 2
    assert "--text-field names a field of JSON or Parquet records" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()
    argv = ["eval", "ppl", "--model", str(tmp_path / "no-model"), "--data", str(txt), "--text-field", "body"]
    assert main(argv) == 2  # refused before the model is looked for
    err = capsys.readouterr().err
    assert "--text-field names a field of JSON or Parquet records, and --data" in err and "no-model" not in err, err


def test_utf8_errors_replace_counts_and_warns_of_what_it_replaced(tmp_path, tok_dir):
    """`pack --utf8-errors replace` read bad bytes as U+FFFD as asked, but never said how many: meta.json recorded
    the mode alone. It now counts the files, lines and bytes replaced, warns with the first file:line, and records
    the counts in meta.json (the pass that counts the records for --val-fraction counts nothing twice)."""
    clean = tmp_path / "c.txt"
    clean.write_bytes(b"nothing bad here<|endoftext|>nor here")
    lines = tmp_path / "b.jsonl"  # line 3: 0xef before "v" (no character) and 0xe9 before '"': 2 bytes
    lines.write_bytes(b'{"text": "ok"}\n{"text": "ok too"}\n{"text": "na\xefve \xe9"}\n')
    text = tmp_path / "a.txt"  # line 2: 0xe9 (1 byte); line 3: 0xff 0xfe and 0x80 (3 bytes)
    text.write_bytes(b"first doc\nclean line<|endoftext|>caf\xe9 au lait\n\xff\xfe x \x80<|endoftext|>end")
    want = {"files": 2, "lines": 3, "bytes": 6, "first": f"{lines}:3"}  # counted by hand
    says = re.escape(f"{lines}:3: invalid UTF-8, read as U+FFFD (2 input file(s) held such bytes: 6 bytes on 3 lines)")
    for split in ({}, {"val_fraction": 0.25, "val_out": tmp_path / "v"}):
        out = tmp_path / f"s{len(split)}"
        with pytest.warns(UserWarning, match=says):
            meta = pack([clean, lines, text], out, tok_dir, "seq", progress=False, utf8_errors="replace", **split)
        assert meta["pack"]["invalid_utf8"] == want
    with pytest.warns(UserWarning, match=re.escape(f"{text}:2: invalid UTF-8, read as U+FFFD (1 input file(s)")):
        meta = pack([clean, text], tmp_path / "t", tok_dir, "seq", progress=False, utf8_errors="replace")
    assert meta["pack"]["invalid_utf8"] == {"files": 1, "lines": 2, "bytes": 4, "first": f"{text}:2"}
    meta = pack([clean], tmp_path / "n", tok_dir, "seq", progress=False, utf8_errors="replace")  # no warning
    assert meta["pack"]["invalid_utf8"] == {"files": 0, "lines": 0, "bytes": 0}


def _suggested(err: str) -> list[str]:
    """The globs pack's 'name the input files instead, e.g. ...' line suggests."""
    return err.split("e.g. ", 1)[1].strip().split(" ")


def test_a_folder_without_shards_suggests_inputs_that_pack_reads(tmp_path, tok_dir, capsys):
    """`pack --input crawl2` (a synthetic crawl, not a curate output) suggested `crawl2/*`, which takes in the crawl's
    manifest.json, and its pages are HTML, which pack does not read as documents: it now says to curate them first.
    A folder of documents gets one glob a suffix, which pack reads as given."""
    import glob

    from cookmind.cli import main
    from cookmind.synthetic.crawl import write_crawl

    write_crawl(tmp_path / "crawl2", num_pages=6, seed=0, num_shards=2)
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--quiet", "--out"]
    assert main([*argv, str(tmp_path / "s"), "--input", str(tmp_path / "crawl2")]) == 2
    err = capsys.readouterr().err
    assert "`cookmind curate crawl`" in err and f"cookmind curate run --input {tmp_path / 'crawl2'} --output" in err
    assert "/*" not in err and err.endswith("\n") and err.count("\n") == 1  # one line

    folder = tmp_path / "docs"
    folder.mkdir()
    _jsonl(folder / "a.jsonl", [{"text": d} for d in DOCS])
    (folder / "b.txt").write_text("A plain text document about soup.")
    (folder / ".notes.swp").write_text("an editor's file")  # hidden: no glob takes it
    assert main([*argv, str(tmp_path / "s"), "--input", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "holds no shard-* files" in err
    globs = _suggested(err)
    assert globs == [f"{folder}/*.jsonl", f"{folder}/*.txt"]
    files = [p for g in globs for p in glob.glob(g)]  # as a shell expands them
    assert main([*argv, str(tmp_path / "s"), "--input", *files]) == 0, capsys.readouterr().err
    assert len(TokenStore(tmp_path / "s")) == len(DOCS) + 1


def test_a_token_store_given_as_input_is_told_as_one_not_read_through_its_meta_json(tmp_path, tok_dir, capsys):
    """`pack --input STORE` (or tokenizer train's) suggested "name the input files instead, e.g. STORE/*.json": its
    meta.json, which pack then read as JSON records. A token store holds ids, not text: the error now says so, and
    where its text came from."""
    from cookmind.cli import main

    src = _jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in DOCS])
    pack([src], tmp_path / "st", tok_dir, "seq", progress=False)
    for argv in (
        ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--out", str(tmp_path / "s2")],
        ["tokenizer", "train", "--vocab-size", "300", "--out", str(tmp_path / "t2")],
        ["curate", "run", "--output", str(tmp_path / "c2")],
    ):
        assert main([*argv, "--input", str(tmp_path / "st"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "is a token store" in err and "*.json" not in err and "docs.jsonl" in err, err
        assert f"--train-data {tmp_path / 'st'}" in err


@pytest.mark.parametrize(
    "train_type,record,hint",
    [
        ("seq", {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}]}, "sft"),
        ("seq", {"question": "What is 2+3?", "answer": "#### 5"}, "sft"),
        ("seq", {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away."}, "dpo"),
        ("sft", {"text": "Once upon a time there was a cat."}, "seq"),
        ("dpo", {"text": "Once upon a time there was a cat."}, "seq"),
        ("dpo", {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}]}, "sft"),
    ],
)
def test_records_of_another_train_type_are_named_with_the_train_type_that_reads_them(
    tmp_path, tok_dir, train_type, record, hint
):
    """Chat records given to a seq pack were told "missing field 'text' (found ['messages']); choose it with
    --text-field" (no field holds a chat's text), and text records given to an sft pack "expected 'conversations',
    'messages', ..."; neither said that the file is another --train-type's data. The error names it now."""
    src = _jsonl(tmp_path / "in.jsonl", [json.dumps(record)])
    with pytest.raises(PackError) as exc:
        pack([src], tmp_path / "out", tok_dir, train_type, progress=False)
    assert f"{src}:1: missing field" in str(exc.value)
    assert f"--train-type {hint}" in str(exc.value)
    assert "choose it with --text-field" not in str(exc.value)  # no field of these holds the document's text


def test_a_text_record_under_another_text_field_is_told_to_choose_the_field_not_to_pack_seq():
    """With --text-field body a record holding only 'text' was told it "looks like seq data, which cookmind pack
    --train-type seq reads": the very command that refused it. It is told to choose its field."""
    from cookmind.store.records import BadRecord, RecordOptions, make_seq

    with pytest.raises(BadRecord) as info:
        make_seq({"text": "a story", "title": "x"}, None, RecordOptions(train_type="seq", text_field="body"))
    assert str(info.value) == "missing field 'body' (found ['text', 'title']); choose it with --text-field"


def test_a_split_counts_each_skipped_and_empty_record_in_the_one_store_whose_place_it_drew(
    tmp_path, tok, tok_dir, capsys
):
    """pack --val-fraction wrote the same "skipped", "empty_records" and sources' record counts into both stores'
    meta.json: summing the two stores double counted every bad line. A bad line or an empty document draws a place
    in the split as a record does, so each store now counts those in its own places, and the command's report
    states the totals once."""
    import random

    bad, empty = {3, 12, 15}, {7, 11}  # places (0-based lines) of invalid JSON lines and of empty documents
    docs = [f"Document {i} about soup number {i * 7}." for i in range(20)]
    lines = ['{"text": "cut' if i in bad else {"text": "" if i in empty else d} for i, d in enumerate(docs)]
    src = _jsonl(tmp_path / "d.jsonl", lines)
    # the split by hand, as pack's docstring gives it: selection sampling over the 20 places, round(0.25 x 20) = 5
    # held out, seeded by --seed; a bad or empty line draws its place too
    draw, left, hold, val_places = random.Random("0:val"), 20, 5, set()
    for k in range(20):
        if draw.random() * left < hold:
            val_places.add(k)
            hold -= 1
        left -= 1
    assert val_places == {7, 12, 15, 18, 19}  # bad and empty lines in both stores
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    argv = ["--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(src), "--quiet", "--skip-bad"]
    argv += ["--out", str(tmp_path / "tr"), "--val-fraction", "0.25", "--val-out", str(tmp_path / "va")]
    assert pack_cli.main(parser.parse_args(argv)) == 0
    for store, places in (("tr", set(range(20)) - val_places), ("va", val_places)):
        meta = json.loads((tmp_path / store / "meta.json").read_text())
        good = sorted(places - bad - empty)
        assert _records(tmp_path / store, "sequence") == [tok.encode(docs[i]) + [tok.eos_id] for i in good], store
        assert meta["sources"] == [{"path": str(src), "records": len(good)}], store
        assert meta["skipped"]["count"] == len(places & bad), store
        assert [e.split(": ")[0] for e in meta["skipped"]["examples"]] == [
            f"{src}:{i + 1}" for i in sorted(places & bad)
        ]
        assert meta["empty_records"] == len(places & empty), store
    out = capsys.readouterr().out
    assert "; skipped 3 bad record(s) (invalid JSON 3); the first: " + f"{src}:4: invalid JSON" in out
    assert "; left out 2 record(s) with empty text (nothing to learn)" in out


def test_a_pair_with_its_prompt_apart_and_answers_as_assistant_messages_packs_as_the_whole_chats(tmp_path, tok_dir):
    # TRL's conversational preference rows keep the prompt apart: {"prompt": [user], "chosen": [assistant], ...};
    # pack read the chosen list alone and refused each as "roles out of order: message 1 is assistant at the start"
    user = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The cook?"}]

    def answer(text):
        return [{"role": "assistant", "content": text}]

    rows = [
        {"prompt": user, "chosen": answer("Stirs the soup."), "rejected": answer("No.")},
        {"prompt": "The cook?", "chosen": answer("Stirs."), "rejected": answer("No.")},
    ]
    whole = [
        {"chosen": user + answer("Stirs the soup."), "rejected": user + answer("No.")},
        {"prompt": "The cook?", "chosen": "Stirs.", "rejected": "No."},
    ]
    pack([_jsonl(tmp_path / "apart.jsonl", rows)], tmp_path / "a", tok_dir, "dpo", progress=False)
    pack([_jsonl(tmp_path / "whole.jsonl", whole)], tmp_path / "w", tok_dir, "dpo", progress=False)
    for key in ("chosen", "rejected", "chosen_mask", "rejected_mask"):
        assert _records(tmp_path / "a", key) == _records(tmp_path / "w", key), key


def test_online_and_offline_grpo_records_in_one_pack_are_refused_naming_both_kinds(tmp_path, tok_dir):
    # the error said "record keys ['answers', 'prompts'] differ from the store's keys ['masks', 'prompts', ...]"
    rows = [{"prompt": "1 + 1?", "response": "2", "reward": 1.0}, {"question": "2 + 1?", "answer": "#### 3"}]
    src = _jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(PackError) as err:
        pack([src], tmp_path / "g", tok_dir, "grpo", progress=False)
    assert str(err.value) == (
        f"{src}:2: this record is a problem with its reference answer (online), the ones before it scored responses "
        "(offline, prompt/response/reward): a grpo store holds one kind; pack each kind into its own store, or pass "
        "--skip-bad to keep the input's more common kind and skip and count the other"
    )
    flipped = r"other\.jsonl:2: this record is scored responses \(offline, prompt/response/reward\), the ones before"
    with pytest.raises(PackError, match=flipped):
        pack([_jsonl(tmp_path / "other.jsonl", rows[::-1])], tmp_path / "h", tok_dir, "grpo", progress=False)


def test_skip_bad_keeps_the_more_common_grpo_kind_and_skips_and_counts_the_other(tmp_path, tok_dir, capsys):
    # --skip-bad stopped at the first record of the other kind as without it: the minority kind is now skipped and
    # counted as bad lines are (meta.json, the summary line), wherever in the input it comes; the store is the one
    # the majority's records alone make
    online = [{"question": f"{i} + 1?", "answer": f"#### {i + 1}"} for i in range(6)]
    offline = [{"prompt": f"{i} + 2?", "response": str(i + 2), "reward": 1.0} for i in range(2)]
    rows = [online[0], offline[0], *online[1:4], offline[1], *online[4:]]
    src = _jsonl(tmp_path / "mixed.jsonl", rows)
    argv = ["--tokenizer", str(tok_dir), "--train-type", "grpo", "--input", str(src), "--quiet", "--skip-bad"]
    argv += ["--out", str(tmp_path / "g")]
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    assert pack_cli.main(parser.parse_args(argv)) == 0
    out = capsys.readouterr().out
    reason = (
        "minority grpo kind: this record is a scored response (offline), and 6 of the input's 8 good records are "
        "problems with reference answers (online): a grpo store holds one kind, the input's more common one; pack "
        "this kind into its own store"
    )
    assert out.startswith("packed 6 grpo records, ")
    assert f"; skipped 2 bad record(s) (minority grpo kind 2); the first: {src}:2: {reason}" in out
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    assert meta["skipped"] == {
        "count": 2,
        "by_reason": {"minority grpo kind": 2},
        "examples": [f"{src}:2: {reason}", f"{src}:6: {reason}"],
    }
    pack([_jsonl(tmp_path / "online.jsonl", online)], tmp_path / "only", tok_dir, "grpo", progress=False)
    for key in ("prompts", "answers"):
        assert _records(tmp_path / "g", key) == _records(tmp_path / "only", key), key
    # the other way round: the offline records are the more common kind
    flipped = _jsonl(tmp_path / "flipped.jsonl", [offline[0], online[0], offline[1], offline[0]])
    meta = pack([flipped], tmp_path / "f", tok_dir, "grpo", skip_bad=True, progress=False)
    assert meta["num_records"] == 3 and meta["skipped"]["by_reason"] == {"minority grpo kind": 1}
    assert (
        "this record is a problem with its reference answer (online), and 3 of the input's 4 good records are scored"
        in (meta["skipped"]["examples"][0])
    )
    # records bad anyway (an empty answer) count for neither kind: 3 good offline and 5 bad online keep the offline
    bad_online = [{"question": f"{i} + 3?", "answer": ""} for i in range(5)]
    spoilt = _jsonl(tmp_path / "spoilt.jsonl", [*bad_online, offline[0], offline[1], offline[0]])
    meta = pack([spoilt], tmp_path / "b", tok_dir, "grpo", skip_bad=True, progress=False)
    assert meta["num_records"] == 3 and meta["skipped"]["count"] == 5
    assert "minority grpo kind" not in meta["skipped"]["by_reason"]
    # as many of each: no kind to keep, said in one line
    even = _jsonl(tmp_path / "even.jsonl", [online[0], offline[0]])
    with pytest.raises(PackError, match=r"as many scored responses \(offline\) as problems \(online\), 1 of each"):
        pack([even], tmp_path / "e", tok_dir, "grpo", skip_bad=True, progress=False)


def test_skip_bad_grpo_tokenizes_each_record_once(tmp_path, tok, tok_dir, monkeypatch):
    # --skip-bad read and tokenized a grpo input twice: once to count its good records of each kind, once to pack
    # them. Now once; the store is the one the majority's records alone make, the skipped counted in input order.
    from collections import Counter

    online = [{"question": f"{i} + 1?", "answer": f"#### {i + 1}"} for i in range(30)]
    offline = [{"prompt": f"{i} + 2?", "response": f"{i + 2} apples", "reward": 1.0} for i in range(25)]
    rows, expected_skips = [], []  # by hand: (line, reason) of each record skipped
    for i in range(30):
        rows.append(online[i])
        if i < 25:
            rows.append(offline[i])
            expected_skips.append((len(rows), "minority grpo kind"))
        if i in (2, 20):
            rows.append({"question": "3 + 3?", "answer": ""})
            expected_skips.append((len(rows), "empty text in answer"))
        if i == 4:
            rows.append({"question": 5, "answer": "#### 1"})
            expected_skips.append((len(rows), "question must be a string, got int"))
    src = _jsonl(tmp_path / "mixed.jsonl", rows)
    calls: Counter = Counter()
    encode = tok.encode

    def counting(text, *args, **kwargs):
        calls[text] += 1
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tok, "encode", counting)
    template = "Q: {question}\nA:"
    kw = dict(prompt_template=template, shard_tokens=60, progress=False)
    pack([src], tmp_path / "g", tok, "grpo", skip_bad=True, **kw)
    # by hand: each record's prompt text once (a good record's, and an empty answer's, read before its answer; the
    # two empty answers ask the same), each offline response once; an online answer is stored as bytes, not tokens
    prompts = [template.replace("{question}", r["question"]) for r in online] + ["Q: 3 + 3?\nA:"] * 2
    prompts += [template.replace("{question}", r["prompt"]) for r in offline]
    assert calls == Counter(prompts + [r["response"] for r in offline])
    pack([_jsonl(tmp_path / "online.jsonl", online)], tmp_path / "only", tok, "grpo", **kw)
    only = sorted(p.relative_to(tmp_path / "only") for p in (tmp_path / "only").rglob("shard_*/*"))
    assert len(only) > 4
    # the same from 2 worker processes (each loads the tokenizer from its folder)
    pack([src], tmp_path / "w", tok_dir, "grpo", skip_bad=True, workers=2, **kw)
    for store in (tmp_path / "g", tmp_path / "w"):
        # the shards are byte for byte those of the online records packed alone
        assert sorted(p.relative_to(store) for p in store.rglob("shard_*/*")) == only
        for name in only:
            assert (store / name).read_bytes() == (tmp_path / "only" / name).read_bytes(), name
        meta = json.loads((store / "meta.json").read_text())
        assert meta["num_records"] == 30 and meta["sources"] == [{"path": str(src), "records": 30}]
        skipped = meta["skipped"]
        assert skipped["count"] == len(expected_skips) == 28
        assert list(skipped["by_reason"].items()) == [
            ("minority grpo kind", 25),
            ("empty text", 2),
            ("invalid record", 1),
        ]
        assert [e.split(": ")[:2] for e in skipped["examples"]] == [[f"{src}:{n}", r] for n, r in expected_skips[:20]]
        assert "and 30 of the input's 55 good records are problems" in skipped["examples"][0]
    assert not list(tmp_path.glob(".*"))  # no temporary folder left, the offline kind's neither


def test_the_bar_in_a_pipe_or_a_log_is_plain_lines_ending_at_the_true_count(tmp_path, tok_dir, capsys):
    """Into a pipe (capsys's stderr is not a terminal) pack drew its bar as on a terminal: carriage returns and the
    bar redrawn, three times at its end. It writes plain lines now, the last one the count packed, with its
    tokens/s."""
    txt = tmp_path / "a.txt"
    txt.write_text("<|endoftext|>\n".join(DOCS) + "<|endoftext|>\n")
    pack([txt], tmp_path / "t", tok_dir, "seq")
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    assert err.splitlines()[-1].startswith("pack seq: 100% 3/3 [") and err.splitlines()[-1].endswith(" tok/s]")


def test_pack_takes_the_named_grpo_templates_and_reads_a_typed_newline(tmp_path, tok_dir):
    """train and eval take grpo.template / --template plain, r1_zero or compact, but pack refused them ('has no
    {question}'), while the guide says to pack a store with the template grpo.template names; and a template of one's
    own typed in a shell ('Q: {question}\\nA:') stored a backslash and an n. Both now pack as train and eval prompt
    (align.prompts.encode_prompt is the reference)."""
    from cookmind.align.prompts import encode_prompt
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    src = _jsonl(tmp_path / "p.jsonl", [{"question": "What is 2+3?", "answer": "#### 5"}])
    for name in ("plain", "r1_zero", "compact"):
        pack([src], tmp_path / name, tok_dir, "grpo", prompt_template=name, progress=False)
        assert _records(tmp_path / name, "prompts") == [encode_prompt(tok, "What is 2+3?", name)], name
    argv = ["--tokenizer", str(tok_dir), "--train-type", "grpo", "--input", str(src), "--quiet"]
    argv += ["--prompt-template", "Q: {question}\\nA:", "--out", str(tmp_path / "typed")]
    parser = argparse.ArgumentParser()
    pack_cli.add_arguments(parser)
    assert pack_cli.main(parser.parse_args(argv)) == 0
    assert _records(tmp_path / "typed", "prompts") == [encode_prompt(tok, "What is 2+3?", "Q: {question}\nA:")]


def test_a_gpt2_user_without_chat_tokens_is_told_the_import_that_adds_them_and_it_works(shared_data, tmp_path):
    """The SFT "no <|im_start|>" error said only "train a tokenizer": a GPT-2 user needs GPT-2's own files imported
    with the chat tokens added. The error names that import, and the import it names packs the same chats."""
    from tokenizer_fixtures import run_cli

    g2 = shared_data / "gpt2"
    files = ["--vocab", str(g2 / "vocab.json"), "--merges", str(g2 / "merges.txt")]
    assert run_cli(["import", *files, "--out", str(tmp_path / "plain")]) == 0
    chats = _jsonl(
        tmp_path / "c.jsonl",
        [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}],
    )
    with pytest.raises(PackError) as e:
        pack([chats], tmp_path / "s", tmp_path / "plain", "sft", progress=False)
    flags = "--special-token '<|endoftext|>' '<|im_start|>' '<|im_end|>'"
    assert "cookmind tokenizer import" in str(e.value) and flags in str(e.value) and "tokenizer train" in str(e.value)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert run_cli(["import", *files, "--special-token", *specials, "--out", str(tmp_path / "chat")]) == 0
    pack([chats], tmp_path / "s", tmp_path / "chat", "sft", progress=False)
    chat = Tokenizer.load(tmp_path / "chat")
    assert chat.decode(TokenStore(tmp_path / "s").record("sequence", 0).tolist()).startswith("<|im_start|>user\nHi")


def test_val_fraction_counting_pass_shows_progress_before_the_pack(tmp_path, tok_dir, capsys):
    """`pack --val-fraction` read every input once to count its records with nothing on screen: on a big corpus,
    minutes of silence before the pack's own bar. That pass has a bar of its own now, counting the 7 documents."""
    src = tmp_path / "c.txt"
    src.write_text("<|endoftext|>".join(f"story {i}" for i in range(7)), encoding="utf-8")
    pack([src], tmp_path / "tr", tok_dir, "seq", progress=True, val_fraction=0.3, val_out=tmp_path / "va")
    err = capsys.readouterr().err
    counting = [line for line in err.splitlines() if "counting" in line]
    assert counting and "7" in counting[-1], err
    assert err.index(counting[-1]) < err.index("pack seq"), err
