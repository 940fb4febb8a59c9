"""`cookmind pack --train-type sft --split-turns`: each assistant turn of a chat its own record, the chat up to it
rendered as the model sees it at inference (the messages before it with the generation prompt, then the turn), so
a template that is not prefix-stable (Qwen3's drops earlier turns' reasoning once a later user turn follows) packs.
The references are transformers' apply_chat_template of each prefix, the mask found by hand in its text."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from test_hf_chat_inference import QWEN3_STYLE  # noqa: E402
from test_hf_chat_mask import CHATML, sp_folder  # noqa: E402

from cookmind.cli import main as cookmind_main  # noqa: E402
from cookmind.store import TokenStore  # noqa: E402
from cookmind.store.records import RecordOptions, make_dpo  # noqa: E402
from cookmind.tokenizer.hf_adapter import load_tokenizer  # noqa: E402

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is two and two?"},
    {"role": "assistant", "content": "Four.", "reasoning_content": "two and two make four"},
    {"role": "user", "content": "And three and three?"},
    {"role": "assistant", "content": "Six.", "reasoning_content": "three and three make six"},
]
ONE_TURN = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}]


def turn_reference(folder, messages, i):
    """(ids, mask) of assistant turn ``i`` in its inference context, by transformers: the ids of messages[:i+1],
    which start with the text of messages[:i] with the generation prompt; the mask on the tokens from there through
    the turn's <|im_end|>, mapped by the tokenizer's offsets."""
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = hf.apply_chat_template(messages[: i + 1], tokenize=False)
    prompt = hf.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False)
    assert text.startswith(prompt)
    start = len(prompt)
    end = text.index("<|im_end|>", start) + len("<|im_end|>")
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(hf.apply_chat_template(messages[: i + 1], return_dict=False))
    assert enc["input_ids"] == ids
    return ids, [int(a < end and b > start) for a, b in enc["offset_mapping"]]


def pack_argv(folder, src, out, *extra):
    return [
        "pack",
        "--tokenizer",
        str(folder),
        "--quiet",
        "--train-type",
        "sft",
        "--input",
        str(src),
        "--out",
        str(out),
        *extra,
    ]


def test_split_turns_packs_each_assistant_turn_as_transformers_renders_it_at_inference(tmp_path, capsys):
    folder = sp_folder(tmp_path / "t", QWEN3_STYLE)
    src = tmp_path / "chats.jsonl"
    src.write_text(json.dumps({"messages": CHAT}) + "\n" + json.dumps({"messages": ONE_TURN}) + "\n")
    assert cookmind_main(pack_argv(folder, src, tmp_path / "s", "--split-turns")) == 0
    assert "2 chats became 3 records" in capsys.readouterr().out
    store = TokenStore(tmp_path / "s")
    want = [turn_reference(folder, CHAT, 2), turn_reference(folder, CHAT, 4), turn_reference(folder, ONE_TURN, 1)]
    assert len(store) == 3
    for k, (ids, mask) in enumerate(want):
        assert store.record("sequence", k).tolist() == ids
        assert store.record("loss_mask", k).tolist() == mask
        assert sum(mask) > 0
    assert "two and two make four" in load_tokenizer(folder).decode(want[0][0])  # the turn's own reasoning trains
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["pack"]["split_turns"] == {"chats": 2, "records": 3}


def test_without_split_turns_a_non_prefix_stable_template_is_refused_naming_the_flag(tmp_path, capsys):
    folder = sp_folder(tmp_path / "t", QWEN3_STYLE)
    src = tmp_path / "chats.jsonl"
    src.write_text(json.dumps({"messages": CHAT}) + "\n")
    assert cookmind_main(pack_argv(folder, src, tmp_path / "s")) == 2
    err = capsys.readouterr().err
    assert "not the start of" in err and "--split-turns" in err, err


def test_split_turns_with_a_prefix_stable_template_gives_each_turn_its_own_record(tmp_path):
    folder = sp_folder(tmp_path / "t", CHATML)
    chat = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in CHAT]
    src = tmp_path / "chats.jsonl"
    src.write_text(json.dumps({"messages": chat}) + "\n")
    assert cookmind_main(pack_argv(folder, src, tmp_path / "s", "--split-turns")) == 0
    store = TokenStore(tmp_path / "s")
    for k, i in enumerate((2, 4)):
        ids, mask = turn_reference(folder, chat, i)
        assert store.record("sequence", k).tolist() == ids
        assert store.record("loss_mask", k).tolist() == mask


def test_split_turns_is_for_sft_only(tmp_path, capsys):
    folder = sp_folder(tmp_path / "t", CHATML)
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"prompt": "Say hi", "chosen": "Hi!", "rejected": "Go away."}) + "\n")
    argv = pack_argv(folder, src, tmp_path / "d", "--split-turns")
    argv[argv.index("sft")] = "dpo"
    assert cookmind_main(argv) == 2
    assert "--split-turns applies to --train-type sft only" in capsys.readouterr().err


def test_a_preference_pairs_mask_is_its_last_turn_exactly_with_a_non_prefix_stable_template(tmp_path):
    """The mask of a pair's answer was the last run of ones when the template was not prefix-stable (a guess, said
    nowhere); it is the answer's tokens past its prompt with the generation prompt, as transformers renders them."""
    folder = sp_folder(tmp_path / "t", QWEN3_STYLE)
    tok = load_tokenizer(folder)
    prompt = CHAT[:4]
    pair = {"prompt": prompt, "chosen": [CHAT[4]], "rejected": [{"role": "assistant", "content": "Seven."}]}
    record = make_dpo(pair, tok, RecordOptions("dpo"))
    for side, answer in (("chosen", CHAT[4]), ("rejected", pair["rejected"][0])):
        ids, mask = turn_reference(folder, [*prompt, answer], 4)
        assert record[side].tolist() == ids
        assert record[f"{side}_mask"].tolist() == mask


def test_split_turns_with_val_fraction_holds_out_whole_chats_and_says_the_share_of_chats(tmp_path, capsys):
    """A chat is one place in the split (its turns never straddle the two stores); the share asked is of chats: it
    was counted of records, so a split of chats of unequal turns was said to miss what was asked, "bad or empty lines
    drew places", when none did."""
    folder = sp_folder(tmp_path / "t", CHATML)
    one = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    three = one + [{"role": "user", "content": "Again?"}, {"role": "assistant", "content": "Hello again."}] * 2
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": m}) + "\n" for m in (one, three, one, three, one, three)))
    for seed in range(4):
        out, val = tmp_path / f"s{seed}", tmp_path / f"v{seed}"
        argv = pack_argv(folder, src, out, "--split-turns", "--val-fraction", "0.5", "--val-out", str(val))
        assert cookmind_main([*argv, "--seed", str(seed)]) == 0
        said = capsys.readouterr().out
        assert "asked" not in said, said
        split = json.loads((out / "meta.json").read_text())["split"]
        assert split["val_chats"] == split["train_chats"] == 3
        assert split["val_records"] + split["train_records"] == 12
        assert len(TokenStore(val)) == split["val_records"]
