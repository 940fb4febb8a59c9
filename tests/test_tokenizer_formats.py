"""Persistence and ecosystem formats: our JSON, Hugging Face (AutoTokenizer + chat template), tiktoken, GPT-2."""

from __future__ import annotations

import json
import random
import re

import pytest
from tokenizer_fixtures import run_cli, save_tokenizer

from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, TokenizerError, load_gpt2_files, train_bpe

TEXT_WORDS = [
    "the",
    "cat",
    "naïve",
    "日本語",
    "русский",
    "مرحبا",
    "123",
    "it's",
    "😀",
    "ok!",
    "  ",
    "\n",
    "\t",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<|im_end|>",
    "<|",
    "\r\n",
    "x=1;",
]


def random_text(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(TEXT_WORDS) + rng.choice([" ", "", "\n", ". "]) for _ in range(n))


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def tok(request, tmp_path_factory) -> Tokenizer:
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text(random_text(0, 3000), encoding="utf-8")
    vocab, merges = train_bpe(path, 700, DEFAULT_SPECIAL_TOKENS, pattern=request.param, workers=1, progress=False)
    return Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS, pattern=request.param)


CHATS = [
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two plus two is four"},
        {"role": "user", "content": " and 3+3 ?\n\n"},
        {"role": "assistant", "content": "\n\n6 <|endoftext|>"},
    ],
    [
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Zürich"}}},
                {"type": "function", "function": {"name": "time", "arguments": '{"tz": "CET"}'}},
            ],
        },
        {"role": "tool", "content": '{"temp": 3}'},
        {"role": "assistant", "content": "3 °C.", "reasoning_content": ""},
    ],
    [{"role": "system", "content": ""}, {"role": "user", "content": "x"}],
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_save_load_roundtrip_and_fingerprint(tok, tmp_path):
    tok.save(tmp_path)
    back = Tokenizer.load(tmp_path)
    text = random_text(1, 500)
    assert back.encode(text) == tok.encode(text)
    assert back.special_tokens == tok.special_tokens and back.pattern == tok.pattern
    assert back.fingerprint() == tok.fingerprint()
    fewer = Tokenizer(tok.vocab, tok.merges[:-1], tok.special_tokens, tok.pattern)
    assert fewer.fingerprint() != tok.fingerprint()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer in"):
        Tokenizer.load(tmp_path)
    (tmp_path / "cookmind_tokenizer.json").write_text("{\n  oops")
    with pytest.raises(TokenizerError, match=r"cookmind_tokenizer.json:2: not valid JSON"):
        Tokenizer.load(tmp_path)


def test_a_cookmind_tokenizer_file_of_another_shape_is_one_line_naming_it(tok, tmp_path, capsys):
    """A cookmind_tokenizer.json that parses but is not the format's object (a JSON list or number, a file without
    its special_tokens or pattern, specials that are no token -> id object) ended `tokenizer info` (and every command
    that loads it) in an AttributeError or KeyError traceback. Each is now one line naming the file."""
    good = tok.to_dict()
    cases = {
        "list": [],
        "number": 3,
        "no_specials": {k: v for k, v in good.items() if k != "special_tokens"},
        "no_pattern": {k: v for k, v in good.items() if k != "pattern"},
        "specials_list": {**good, "special_tokens": ["<|endoftext|>"]},
        "special_id_text": {**good, "special_tokens": {"<|endoftext|>": "x"}},
    }
    for name, doc in cases.items():
        (tmp_path / name).mkdir()
        path = tmp_path / name / "cookmind_tokenizer.json"
        path.write_text(json.dumps(doc))
        assert run_cli(["info", "--tokenizer", str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind tokenizer info: error: {path}: "), (name, err)
        assert len(err.strip().splitlines()) == 1 and "re-save the tokenizer" in err, (name, err)


def test_a_tokenizer_file_given_for_its_folder_is_told_to_name_the_folder(tok, tmp_path, capsys):
    """`--tokenizer tok/tokenizer.json` (a file where the folder belongs) read "no tokenizer in tok/tokenizer.json:
    expected cookmind_tokenizer.json (or tokenizer.json, ...); train one", as if the file were missing. It now says
    the path is a file and names the folder to pass; another file is told a tokenizer is a folder."""
    tok.save(tmp_path / "tok")
    for name in ("tokenizer.json", "cookmind_tokenizer.json"):
        assert run_cli(["info", "--tokenizer", str(tmp_path / "tok" / name)]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"cookmind tokenizer info: error: {tmp_path / 'tok' / name} is a file; a tokenizer is named "
            f"by its folder: pass {tmp_path / 'tok'}\n"
        ), err
    (tmp_path / "notes.txt").write_text("x")
    assert run_cli(["info", "--tokenizer", str(tmp_path / "notes.txt")]) == 2
    err = capsys.readouterr().err
    assert "notes.txt is a file; a tokenizer is named by its folder" in err and "pass " not in err, err


def test_a_damaged_tokenizer_file_is_named_not_replaced_by_its_tokenizer_json(tok, tmp_path, capsys):
    """A cookmind folder whose cookmind_tokenizer.json is damaged (cut short, edited) was read through transformers
    from the tokenizer.json beside it, without a word: pack wrote a store under another fingerprint (train then
    said the store was packed with 'another' tokenizer at the same path) and every sft line was 'the chat template
    marked no assistant token'. The commands now name the damaged file."""
    from cookmind.cli import main
    from cookmind.tokenizer.hf_adapter import load_tokenizer

    tok.save(tmp_path / "tok")
    (tmp_path / "tok" / "cookmind_tokenizer.json").write_text('{"vocab": ')  # cut short
    with pytest.raises(TokenizerError, match=r"cookmind_tokenizer.json:1: not valid JSON"):
        load_tokenizer(tmp_path / "tok")
    (tmp_path / "c.txt").write_text("the cat sat on the mat")
    argv = ["pack", "--tokenizer", str(tmp_path / "tok"), "--train-type", "seq", "--input", str(tmp_path / "c.txt")]
    assert main([*argv, "--out", str(tmp_path / "s"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cookmind pack: error: ") and "cookmind_tokenizer.json:1: not valid JSON" in err, err
    assert not (tmp_path / "s").exists()


def test_transformers_autotokenizer_encodes_identically(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save(tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    for seed in range(4):
        text = random_text(seed + 10, 300)
        ids = tok.encode(text, allowed_special="all")
        assert hf.encode(text, add_special_tokens=False) == ids
        assert hf.decode(ids) == text
        # our default reads every special token's spelling as text, as transformers does when told to
        assert hf.encode(text, add_special_tokens=False, split_special_tokens=True) == tok.encode(text)
    assert hf.eos_token_id == tok.eos_id and hf.pad_token_id == tok.pad_id


def test_chat_template_matches_transformers(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save(tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    for msgs in CHATS:
        for gen in (False, True):
            for tools in (None, TOOLS):
                ours = tok.apply_chat_template(msgs, add_generation_prompt=gen, tools=tools)
                theirs = hf.apply_chat_template(msgs, add_generation_prompt=gen, tools=tools, tokenize=False)
                assert ours == theirs
                assert tok.render(msgs, add_generation_prompt=gen, tools=tools)[0] == hf.apply_chat_template(
                    msgs, add_generation_prompt=gen, tools=tools, sanitize_control_tokens=True, return_dict=False
                )
                assert tok.render(msgs, add_generation_prompt=gen, tools=tools, allow_special_in_content=True)[
                    0
                ] == hf.encode(theirs, add_special_tokens=False)


def test_chat_template_string_by_hand(tok):
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A", "reasoning_content": "R"},
    ]
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n"
    )
    assert tok.apply_chat_template(msgs[:2]).endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_render_mask_covers_assistant_content_and_im_end(tok):
    msgs = CHATS[1]
    ids, mask = tok.render(msgs)
    assert len(ids) == len(mask) and tok.decode(ids) == tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert tok.eos_id not in ids  # the <|endoftext|> typed in the last reply is text
    target = tok.decode([i for i, m in zip(ids, mask) if m])
    # the two assistant turns: think block + content + <|im_end|>; content starting with "\n\n" pulls in the
    # header's newline because they form one pre-token
    assert target == ("<think>\ntwo plus two is four\n</think>\n\n4<|im_end|>\n\n\n6 <|endoftext|><|im_end|>")
    im_end_masked = [m for i, m in zip(ids, mask) if i == tok.im_end_id]
    assert im_end_masked == [0, 0, 1, 0, 1]  # system, user, assistant, user, assistant
    prompt_ids, prompt_mask = tok.render(msgs[:1], add_generation_prompt=True)
    assert not any(prompt_mask) and tok.decode(prompt_ids).endswith("<|im_start|>assistant\n")


def test_render_ids_equal_encode_on_random_chats(tok):
    rng = random.Random(4)
    for k in range(30):
        msgs = [{"role": "system", "content": random_text(k, 5)}] if k % 2 else []
        for turn in range(3):
            msgs.append({"role": "user", "content": random_text(100 * k + turn, rng.randint(0, 8))})
            reply = {"role": "assistant", "content": random_text(200 * k + turn, rng.randint(0, 8))}
            if rng.random() < 0.5:
                reply["reasoning_content"] = random_text(300 * k + turn, rng.randint(0, 4))
            msgs.append(reply)
        ids, mask = tok.render(msgs, tools=TOOLS if k % 3 == 0 else None, allow_special_in_content=True)
        text = tok.apply_chat_template(msgs, False, TOOLS if k % 3 == 0 else None)
        assert ids == tok.encode_reference(text, allowed_special="all")
        assert mask.count(1) > 0 and len(mask) == len(ids)


def test_render_rejects_bad_messages(tok):
    with pytest.raises(TokenizerError, match=r"messages\[1\]"):
        tok.render([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(TokenizerError, match="name and arguments"):
        tok.render([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}])


def test_tiktoken_rank_file_loads_in_tiktoken(tok, tmp_path):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    assert (
        run_cli(
            [
                "export",
                "--tokenizer",
                str(save_tokenizer(tok, tmp_path / "tok")),
                "--out",
                str(tmp_path / "tt"),
                "--format",
                "tiktoken",
            ]
        )
        == 0
    )
    ranks = load_tiktoken_bpe(str(tmp_path / "tt/tokenizer.tiktoken"))
    cfg = json.loads((tmp_path / "tt/tiktoken_config.json").read_text())
    enc = tiktoken.Encoding("x", pat_str=cfg["pat_str"], mergeable_ranks=ranks, special_tokens=cfg["special_tokens"])
    text = random_text(5, 400)
    assert enc.encode(text, allowed_special="all") == tok.encode_reference(text, allowed_special="all")
    assert enc.encode_ordinary(text) == tok.encode(text)


def test_gpt2_export_import_roundtrip(tok, tmp_path):
    assert (
        run_cli(
            [
                "export",
                "--tokenizer",
                str(save_tokenizer(tok, tmp_path / "tok")),
                "--out",
                str(tmp_path / "g"),
                "--format",
                "gpt2",
            ]
        )
        == 0
    )
    back = load_gpt2_files(tmp_path / "g/vocab.json", tmp_path / "g/merges.txt", DEFAULT_SPECIAL_TOKENS, tok.pattern)
    text = random_text(6, 400)
    assert back.encode_reference(text) == tok.encode_reference(text)


def test_hf_tokenizer_json_import(tok, tmp_path, shared_data):
    from cookmind.tokenizer import load_hf_tokenizer_json

    tok.save(tmp_path)
    back = load_hf_tokenizer_json(tmp_path / "tokenizer.json")
    text = random_text(8, 400)
    assert back.encode_reference(text) == tok.encode(text) and back.special_tokens == tok.special_tokens
    # a tokenizer.json written by `tokenizers` itself (GPT-2: ByteLevel with its built-in regex)
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer(models.BPE.from_file(str(shared_data / "gpt2/vocab.json"), str(shared_data / "gpt2/merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    hf.save(str(tmp_path / "gpt2.json"))
    gpt2 = load_hf_tokenizer_json(tmp_path / "gpt2.json")
    text = (shared_data / "text/tinystories_sample.txt").read_text()
    assert gpt2.eos_id == 50256 and gpt2.encode(text, allowed_special="all") == hf.encode(text).ids
    doc = json.loads((tmp_path / "tokenizer.json").read_text())
    doc["model"]["ignore_merges"] = True
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TokenizerError, match="ignore_merges"):
        load_hf_tokenizer_json(tmp_path / "bad.json")


def test_gpt2_files_load_from_directory(shared_data):
    tok = Tokenizer.load(shared_data / "gpt2")
    assert tok.encode("Hello world") == [15496, 995] and tok.eos_id == 50256


def test_gpt2_import_errors(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(TokenizerError, match=r"merges.txt:2: expected two tokens"):
        load_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(TokenizerError, match="does not exist"):
        load_gpt2_files(tmp_path / "nope.json", tmp_path / "merges.txt")
    (tmp_path / "merges.txt").write_bytes(b"#version: 0.2\na \xffb\n")  # was a bare 'utf-8' codec error
    with pytest.raises(TokenizerError, match=r"merges.txt:2: invalid UTF-8 at byte 2 of the line"):
        load_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    (tmp_path / "vocab.json").write_text('["a", "b"]')  # was an AttributeError traceback
    with pytest.raises(TokenizerError, match=r"vocab.json: not a JSON object of token -> id \(got a list\)"):
        load_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")


def test_import_of_a_json_file_that_is_no_tokenizer_json_says_so_in_one_line(tok, tmp_path, capsys):
    """`tokenizer import --tokenizer-json vocab.json` (GPT-2's vocab, whose token "model" has an id) ended in an
    AttributeError traceback; a JSON list, a BPE model without its vocab, a merge of three parts or one not in
    GPT-2's byte-to-unicode form did too (TypeError, KeyError, ValueError). Each is now one line naming the file."""
    from cookmind.tokenizer.hf_format import hf_tokenizer_json

    good = hf_tokenizer_json(tok)

    def with_model(**changes):
        return {**good, "model": {**good["model"], **changes}}

    first_merge = good["model"]["merges"][0]
    first_merge = first_merge if isinstance(first_merge, str) else " ".join(first_merge)
    cases = {
        "vocab_like": ({"model": 3, "the": 1}, r"no \"model\" object"),
        "list": ([1, 2], r"no \"model\" object"),
        "no_vocab": ({**good, "model": {"type": "BPE", "merges": []}}, r"model\.vocab"),
        "vocab_list": (with_model(vocab=[["a", 0.0]]), r"model\.vocab"),
        "no_merges": ({**good, "model": {k: v for k, v in good["model"].items() if k != "merges"}}, r"model\.merges"),
        "three_part_merge": (with_model(merges=[first_merge + " x"]), r"merge #0"),
        "not_byte_form": (with_model(merges=["\u0000 a"]), r"merge #0"),
        "added_no_content": ({**good, "added_tokens": [{"id": 256}]}, r"added_tokens"),
    }
    for name, (doc, why) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        assert run_cli(["import", "--tokenizer-json", str(path), "--out", str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind tokenizer import: error: {path}: "), (name, err)
        assert len(err.strip().splitlines()) == 1 and re.search(why, err), (name, err)
        assert not (tmp_path / name).exists()


def test_import_refuses_flags_a_tokenizer_json_does_not_read(tok, tmp_path, capsys):
    """`tokenizer import --tokenizer-json T --pattern gpt4` saved T's own pattern without a word, and --vocab/--merges
    beside --tokenizer-json were passed over the same way: the user got another tokenizer than the one asked for.
    Each is now refused naming the flag; and --vocab without --merges names the one missing."""
    tok.save(tmp_path / "src")
    tj = str(tmp_path / "src" / "tokenizer.json")
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("")
    for extra, flag in (
        (["--pattern", "gpt4"], "--pattern"),
        (["--special-token", "<|x|>"], "--special-token"),
        (["--vocab", str(tmp_path / "vocab.json"), "--merges", str(tmp_path / "merges.txt")], "--vocab"),
    ):
        assert run_cli(["import", "--tokenizer-json", tj, *extra, "--out", str(tmp_path / "out")]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind tokenizer import: error: {flag} ") and "--tokenizer-json" in err, err
        assert not (tmp_path / "out").exists()
    assert run_cli(["import", "--vocab", str(tmp_path / "vocab.json"), "--out", str(tmp_path / "out")]) == 2
    assert "--vocab needs --merges" in capsys.readouterr().err
    assert run_cli(["import", "--tokenizer-json", tj, "--out", str(tmp_path / "out")]) == 0  # alone: as before
    assert Tokenizer.load(tmp_path / "out").fingerprint() == tok.fingerprint()


def test_import_refuses_a_vocab_whose_ids_are_not_distinct_whole_numbers(tok, tmp_path, capsys):
    """vocab.json ids were read with int(): a null ended in a TypeError traceback, "x" in a bare "invalid literal for
    int()" naming no file, 1.5 was read as 1, a negative id was kept (a store's unsigned ids wrap it), and two
    tokens given one id kept the second, so the first's byte went missing: "the vocabulary lacks single-byte tokens
    [34]". Each is now refused naming the file and the token (tokenizer.json's model.vocab too)."""
    from cookmind.tokenizer.hf_format import hf_tokenizer_json

    tok.save(tmp_path / "src")
    assert (
        run_cli(["export", "--tokenizer", str(tmp_path / "src"), "--out", str(tmp_path / "g"), "--format", "gpt2"]) == 0
    )
    capsys.readouterr()
    good = json.loads((tmp_path / "g" / "vocab.json").read_text())
    first, second = list(good)[:2]
    hf = hf_tokenizer_json(tok)
    for name, value, why in (
        ("null", None, "is not a whole number"),
        ("text", "x", "is not a whole number"),
        ("half", 1.5, "is not a whole number"),
        ("negative", -5, "is not a whole number"),
        ("twice", good[first], f"also the id of {first!r}"),
    ):
        (tmp_path / f"{name}.json").write_text(json.dumps({**good, second: value}))
        argv = ["import", "--vocab", str(tmp_path / f"{name}.json"), "--merges", str(tmp_path / "g" / "merges.txt")]
        assert run_cli([*argv, "--out", str(tmp_path / "o")]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind tokenizer import: error: {tmp_path / f'{name}.json'}: "), (name, err)
        assert why in err and repr(second) in err, (name, err)
        bad_hf = {**hf, "model": {**hf["model"], "vocab": {**hf["model"]["vocab"], second: value}}}
        (tmp_path / f"{name}.tokenizer.json").write_text(json.dumps(bad_hf))
        assert (
            run_cli(
                ["import", "--tokenizer-json", str(tmp_path / f"{name}.tokenizer.json"), "--out", str(tmp_path / "o")]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind tokenizer import: error: {tmp_path / f'{name}.tokenizer.json'}: "), (name, err)
        assert not (tmp_path / "o").exists()


def test_encode_names_a_folder_given_as_its_input(tmp_path, tok, capsys):
    folder = save_tokenizer(tok, tmp_path / "tok")
    (tmp_path / "texts").mkdir()
    argv = ["encode", "--tokenizer", str(folder), "--input", str(tmp_path / "texts"), "--output", str(tmp_path / "o")]
    assert run_cli(argv) == 2
    assert "texts is a directory; name the text file to encode" in capsys.readouterr().err  # "does not exist"


def test_decode_shows_control_and_bidi_characters_escaped_and_raw_prints_them(tmp_path, tok, capsys):
    """`tokenizer decode` wrote the decoded text as it was: ids a model generated can spell an ESC sequence (clear the
    screen, set the title) or a right-to-left override that reorders the line. Shown escaped as generate shows a
    model's text; --raw prints it as decoded."""
    folder = save_tokenizer(tok, tmp_path / "tok")
    text = "a\x1b[2Jb\rc\u202ed\u2066e\n\tf"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert run_cli(["decode", "--tokenizer", str(folder), *map(str, ids)]) == 0
    assert capsys.readouterr().out == "a\\x1b[2Jb\\rc\\u202ed\\u2066e\n\tf\n"  # by hand
    assert run_cli(["decode", "--tokenizer", str(folder), "--raw", *map(str, ids)]) == 0
    assert capsys.readouterr().out == text + "\n"


def test_info_prints_control_and_bidi_characters_of_its_strings_escaped_as_json_does(tmp_path, capsys):
    """`tokenizer info` printed its JSON with ensure_ascii=False: JSON escapes the C0 controls itself, but a special
    token holding a right-to-left override (U+202E), a bidi isolate, a line separator or a C1 CSI (U+009B) reached the
    terminal raw and reordered or drove what it shows. Its line is machine output, as train's, import's and export's
    lines are: like them it escapes every non-ASCII character (\\u202e), and parses back to the same strings."""
    specials = ["<|endoftext|>", "<|\u202eevil|>", "<|\u2066a\u2069\u2028|>", "<|\x9b2J\x1b]0;t\x07|>", "<|日本|>"]
    vocab = {i: bytes([i]) for i in range(256)}
    folder = save_tokenizer(Tokenizer(vocab, [], specials), tmp_path / "tok")
    assert run_cli(["info", "--tokenizer", str(folder)]) == 0
    out = capsys.readouterr().out
    assert [c for c in out if not c.isascii()] == []  # not one raw control, override, isolate or separator
    assert "<|\\u202eevil|>" in out  # shown as JSON escapes it
    assert list(json.loads(out)["special_tokens"]) == specials


def test_cli_train_encode_decode(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(random_text(7, 2000), encoding="utf-8")
    out = tmp_path / "tok"
    assert run_cli(["train", "--input", str(corpus), "--vocab-size", "400", "--out", str(out), "--workers", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["vocab_size"] == 400 and report["specials"]["<|im_start|>"] == 257
    vocab, merges = train_bpe(corpus, 400, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    assert Tokenizer.load(out).merges == merges
    text = "the cat <|endoftext|> 日本語"
    assert run_cli(["encode", "--tokenizer", str(out), "--text", text]) == 0
    ids = [int(x) for x in capsys.readouterr().out.split()]
    assert ids == Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).encode_reference(text)
    assert run_cli(["decode", "--tokenizer", str(out), *map(str, ids)]) == 0
    assert capsys.readouterr().out == text + "\n"
    (tmp_path / "in.txt").write_text(text * 50, encoding="utf-8")
    assert (
        run_cli(
            [
                "encode",
                "--tokenizer",
                str(out),
                "--input",
                str(tmp_path / "in.txt"),
                "--output",
                str(tmp_path / "ids.bin"),
            ]
        )
        == 0
    )
    import numpy as np

    assert np.fromfile(tmp_path / "ids.bin", dtype="<u4").tolist() == Tokenizer.load(out).encode(text * 50)


def test_decode_reads_the_ids_encode_wrote_and_writes_the_file_back_byte_for_byte(tok, tmp_path, capsys):
    """`tokenizer encode --input F --output ids.bin` had no way back: decode took ids only as arguments (a .bin of
    a book's ids could not be given; a text of them only through the shell) and printed with a newline added and
    control characters escaped. decode --input reads what encode wrote (.bin or the text of ids) and --output
    writes the bytes the ids stand for, so encode then decode gives back the file (CRLF, NUL, emoji, CJK)."""
    folder = save_tokenizer(tok, tmp_path / "tok")
    original = "a\r\nb\x00c \U0001f600 \u5bb6 <|endoftext|>\n\tend".encode() * 40
    (tmp_path / "in.txt").write_bytes(original)
    for name in ("ids.bin", "ids.txt"):
        assert (
            run_cli(
                [
                    "encode",
                    "--tokenizer",
                    str(folder),
                    "--input",
                    str(tmp_path / "in.txt"),
                    "--output",
                    str(tmp_path / name),
                ]
            )
            == 0
        )
        back = tmp_path / f"back-{name}.txt"
        assert (
            run_cli(["decode", "--tokenizer", str(folder), "--input", str(tmp_path / name), "--output", str(back)]) == 0
        )
        assert back.read_bytes() == original, name
        assert (
            run_cli(["decode", "--tokenizer", str(folder), "--input", str(tmp_path / name), "--output", str(back)]) == 2
        )
        assert "already exists" in capsys.readouterr().err
    ids = tok.encode("hi there")
    (tmp_path / "few.txt").write_text(" ".join(map(str, ids)) + "\n")
    assert run_cli(["decode", "--tokenizer", str(folder), "--input", str(tmp_path / "few.txt")]) == 0
    assert capsys.readouterr().out == "hi there\n"  # to the terminal as before: escaped controls, a newline
    (tmp_path / "bad.txt").write_text("12 x 4\n")
    assert run_cli(["decode", "--tokenizer", str(folder), "--input", str(tmp_path / "bad.txt")]) == 2
    assert "bad.txt: 'x' is not a token id" in capsys.readouterr().err


def test_cli_bad_input_leaves_no_output(tmp_path, capsys):
    out = tmp_path / "tok"
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xc3\x28 latin\n")
    assert run_cli(["train", "--input", str(bad), "--vocab-size", "300", "--out", str(out)]) == 2
    assert "bad.txt:2" in capsys.readouterr().err and not out.exists()
    (tmp_path / "empty.txt").write_text("")
    assert run_cli(["train", "--input", str(tmp_path / "empty.txt"), "--vocab-size", "300", "--out", str(out)]) == 2
    assert run_cli(["train", "--input", str(bad), "--vocab-size", "100", "--out", str(out)]) == 2
    assert "too small" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "empty.txt"]


def test_cli_a_vocab_size_below_the_bytes_and_specials_names_the_flag(tmp_path, capsys):
    """`tokenizer train --vocab-size 200` said "pass vocab_size >= 261", a name the command line does not have."""
    text = tmp_path / "t.txt"
    text.write_text("some text to learn from\n")
    argv = ["train", "--input", str(text), "--vocab-size", "200", "--out", str(tmp_path / "tok")]
    assert run_cli(argv) == 2  # 256 byte tokens + the 5 default specials = 261 ids
    assert capsys.readouterr().err == (
        "cookmind tokenizer train: error: --vocab-size 200 is too small: the 256 byte tokens and 5 special tokens "
        "already take 261 ids; pass --vocab-size 261 or more\n"
    )
    assert run_cli([*argv, "--special-token", "<|endoftext|>"]) == 2  # 257 ids
    assert "take 257 ids; pass --vocab-size 257 or more\n" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()


def test_cli_encode_names_the_bad_line(tmp_path, capsys, shared_data):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n" * 3000 + "é".encode() * 3 + b" \xe9t\xe9\n")
    argv = [
        "encode",
        "--tokenizer",
        str(shared_data / "gpt2"),
        "--input",
        str(bad),
        "--output",
        str(tmp_path / "o.bin"),
    ]
    assert run_cli(argv) == 2
    assert "bad.txt:3001: byte offset 15007 is not valid UTF-8" in capsys.readouterr().err
    assert not (tmp_path / "o.bin").exists()


def test_import_of_an_exported_gpt2_pair_keeps_every_special_token_by_default(tok_dir, tmp_path, shared_data, capsys):
    """`tokenizer export --format gpt2` then `tokenizer import` gave another tokenizer unless the user listed all
    five special tokens: only <|endoftext|> stayed special, <|im_start|> and the rest became plain vocabulary that
    no merge makes (another fingerprint, so every store packed with the original was refused, and `pack --train-type
    sft` said the tokenizer has no <|im_start|>). Import now takes as special every vocab.json entry that is neither
    a byte nor made by a merge (in GPT-2's files that is <|endoftext|> alone, as before)."""
    tok = Tokenizer.load(tok_dir)
    assert run_cli(["export", "--tokenizer", str(tok_dir), "--out", str(tmp_path / "g"), "--format", "gpt2"]) == 0
    assert run_cli(["import", "--vocab", str(tmp_path / "g/vocab.json"), "--merges", str(tmp_path / "g/merges.txt"),
                    "--out", str(tmp_path / "back")]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    back = Tokenizer.load(tmp_path / "back")
    assert back.special_tokens == tok.special_tokens and summary["special_tokens"] == tok.special_tokens
    assert back.fingerprint() == tok.fingerprint() == summary["fingerprint"]
    gpt2 = load_gpt2_files(shared_data / "gpt2/vocab.json", shared_data / "gpt2/merges.txt")
    assert gpt2.special_tokens == {"<|endoftext|>": 50256}


def test_a_folder_with_tokenizer_json_and_gpt2_files_loads_what_transformers_loads(tmp_path, shared_data):
    # Qwen's folders ship vocab.json + merges.txt beside tokenizer.json: we read the pair (GPT-2's pattern, no added
    # tokens) where transformers reads tokenizer.json (its own pattern, <|im_start|>...): 48,967 tokens for its 47,897
    from transformers import AutoTokenizer

    path = tmp_path / "c.txt"
    path.write_text(random_text(0, 3000), encoding="utf-8")
    gpt4 = Tokenizer(
        *train_bpe(path, 700, DEFAULT_SPECIAL_TOKENS, pattern="gpt4", progress=False),
        DEFAULT_SPECIAL_TOKENS,
        pattern="gpt4",
    )
    gpt4.save(tmp_path / "folder")
    (tmp_path / "folder" / "cookmind_tokenizer.json").unlink()
    run_cli(
        [
            "export",
            "--tokenizer",
            str(tmp_path / "folder"),
            "--out",
            str(tmp_path / "pair"),
            "--format",
            "gpt2",
        ]
    )
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / "pair" / name).rename(tmp_path / "folder" / name)
    hf = AutoTokenizer.from_pretrained(tmp_path / "folder")
    ours = Tokenizer.load(tmp_path / "folder")
    text = (shared_data / "text" / "corpus.en").read_text(encoding="utf-8")[:20000]
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False, split_special_tokens=True)


def test_an_imported_llama_style_tokenizer_keeps_its_eos_and_bos(tmp_path):
    # `tokenizer import --tokenizer-json llama/tokenizer.json` saved a tokenizer that forgot its EOS </s> (pack then
    # refused it: "neither <|endoftext|> nor an EOS token") and the <s> its post_processor puts before every text
    import transformers
    from tokenizer_fixtures import llama_style_tokenizer

    from cookmind.tokenizer.documents import document_end_id, document_start_ids

    llama = transformers.AutoTokenizer.from_pretrained(str(llama_style_tokenizer(tmp_path / "llama")))
    assert (
        run_cli(["import", "--tokenizer-json", str(tmp_path / "llama/tokenizer.json"), "--out", str(tmp_path / "t")])
        == 0
    )
    back = Tokenizer.load(tmp_path / "t")
    assert (document_start_ids(back), document_end_id(back)) == ([llama.bos_token_id], llama.eos_token_id)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "t"))  # what the import saved for transformers
    assert (theirs.encode("the soup"), theirs.eos_token) == (llama.encode("the soup"), "</s>")


def test_a_post_processor_that_puts_a_plain_token_before_every_text_is_refused_by_name(tmp_path):
    # the ids before every text are what pack opens each document with: they must be special tokens of the tokenizer
    from tokenizer_fixtures import llama_style_tokenizer

    path = llama_style_tokenizer(tmp_path / "llama") / "tokenizer.json"
    doc = json.loads(path.read_text())
    doc["post_processor"]["special_tokens"]["<s>"]["ids"] = [65]  # "b", a byte token
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: its post_processor puts ids \[65\] before every text"):
        Tokenizer.load(tmp_path / "llama")


def test_a_training_run_given_as_the_tokenizer_names_its_newest_checkpoints_tokenizer(tok, tmp_path):
    """`pack --tokenizer runs/pre` (to pack more data for a run, where --model takes a run directory) said "no
    tokenizer in runs/pre ...; train one with `cookmind tokenizer train`", though the run's checkpoints each hold
    its tokenizer. The error now names the newest checkpoint's."""
    run = tmp_path / "runs" / "pre"
    for step in ("step_00000002", "step_00000010"):
        tok.save(run / "checkpoints" / step)
    (run / "checkpoints" / "step_00000012").mkdir()  # a step being written, no tokenizer yet
    with pytest.raises(TokenizerError) as exc:
        Tokenizer.load(run)
    msg = str(exc.value)
    assert "training run" in msg and str(run / "checkpoints" / "step_00000010") in msg and "tokenizer train" not in msg
    with pytest.raises(TokenizerError, match="train one with `cookmind tokenizer train`"):  # an empty folder
        Tokenizer.load(tmp_path)


def test_a_tiktoken_export_given_as_a_tokenizer_says_what_it_is(tok_dir, tmp_path, capsys):
    """`tokenizer export --format tiktoken` writes a ranks file cookmind does not read back, and `--tokenizer` of that
    folder said only 'no tokenizer in exp: expected cookmind_tokenizer.json (or ...)': nothing said the folder held
    an export for tiktoken, nor what to pass instead."""
    assert run_cli(["export", "--tokenizer", str(tok_dir), "--out", str(tmp_path / "tt"), "--format", "tiktoken"]) == 0
    with pytest.raises(TokenizerError) as e:
        Tokenizer.load(tmp_path / "tt")
    said = str(e.value)
    assert "tokenizer.tiktoken" in said and "tiktoken" in said and "--format hf" in said, said


def test_info_and_encode_accept_a_sentencepiece_tokenizer_as_pack_does(shared_data, tmp_path, capsys):
    """`tokenizer info` and `tokenizer encode` said "byte_fallback=True is not supported" of a Llama-style
    SentencePiece tokenizer that pack, generate and eval read through transformers. Both read it now, encode giving
    transformers' own ids for real text."""
    import transformers
    from tokenizer_fixtures import run_cli, sentencepiece_style_tokenizer

    path = sentencepiece_style_tokenizer(tmp_path / "sp")
    hf = transformers.AutoTokenizer.from_pretrained(path)
    capsys.readouterr()
    assert run_cli(["info", "--tokenizer", str(path)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["vocab_size"] == len(hf) and info["eos_id"] == hf.eos_token_id
    text = (shared_data / "text" / "tinystories_sample.txt").read_text(encoding="utf-8")[:3000]
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    assert run_cli(["encode", "--tokenizer", str(path), "--input", str(tmp_path / "in.txt")]) == 0
    ids = [int(w) for w in capsys.readouterr().out.split()]
    assert ids == hf.encode(text, add_special_tokens=False)


def test_decode_accepts_a_sentencepiece_tokenizer_as_encode_does(shared_data, tmp_path, capsys):
    """`tokenizer decode` said "byte_fallback=True is not supported" of the SentencePiece tokenizer that info and
    encode read through transformers. It decodes as transformers' own decode does, --output writes that text's
    bytes (encode then decode gives a file back), and an id past the vocabulary is refused, not dropped without a
    word as transformers' decode drops it."""
    import transformers
    from tokenizer_fixtures import run_cli, sentencepiece_style_tokenizer

    path = sentencepiece_style_tokenizer(tmp_path / "sp")
    hf = transformers.AutoTokenizer.from_pretrained(path)
    text = (shared_data / "text" / "tinystories_sample.txt").read_text(encoding="utf-8")[:2000] + " Z\u00e9 \U0001f600"
    ids = hf.encode(text, add_special_tokens=False)
    capsys.readouterr()
    assert run_cli(["decode", "--tokenizer", str(path), "--raw", *map(str, ids)]) == 0
    assert capsys.readouterr().out == hf.decode(ids) + "\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    encode = ["encode", "--tokenizer", str(path), "--input", str(tmp_path / "in.txt")]
    assert run_cli([*encode, "--output", str(tmp_path / "ids.bin")]) == 0
    back = tmp_path / "back.txt"
    decode = ["decode", "--tokenizer", str(path), "--input", str(tmp_path / "ids.bin")]
    assert run_cli([*decode, "--output", str(back)]) == 0
    assert back.read_bytes() == text.encode("utf-8")
    capsys.readouterr()
    assert run_cli(["decode", "--tokenizer", str(path), "5", str(len(hf))]) == 2
    assert f"id {len(hf)} is not in the vocabulary (ids run 0..{len(hf) - 1})" in capsys.readouterr().err


def test_export_of_a_sentencepiece_tokenizer_says_its_files_are_already_the_hugging_face_format(tmp_path, capsys):
    """`tokenizer export` of the SentencePiece tokenizer that info, encode and decode read through transformers
    said only "model.byte_fallback=True is not supported by cookmind's byte-level BPE", not what to do instead."""
    from tokenizer_fixtures import run_cli, sentencepiece_style_tokenizer

    path = sentencepiece_style_tokenizer(tmp_path / "sp")
    capsys.readouterr()
    assert run_cli(["export", "--tokenizer", str(path), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reads through transformers" in err and "copy its files" in err, err
    assert not (tmp_path / "x").exists()
