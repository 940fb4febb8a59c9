"""Token stores: round trips through both backends, meta.json contract, atomic writes, errors."""

from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest
import torch

from cookmind.store import StoreError, StoreFactory, StoreWriter, TokenStore, detect_format, write_store


def _docs(n=9, seed=0, vocab=500):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(rng.integers(1, 12))) for _ in range(n)]


@pytest.mark.parametrize("fmt", ["bin", "h5"])
def test_round_trip_records_and_stream_across_shards(tmp_path, fmt):
    docs = _docs()
    out = write_store(
        tmp_path / "s", "seq", [{"sequence": d} for d in docs], vocab_size=500, storage_type=fmt, shard_tokens=15
    )
    store = TokenStore(out)
    assert len(store.shards) > 2, "shard_tokens=15 should cut several shards"
    assert len(store) == len(docs)
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(store.record("sequence", i), d)
    flat = np.concatenate(docs)  # naive reference: the documents back to back
    for start, stop in [(0, len(flat)), (3, 29), (14, 16), (len(flat) - 1, len(flat))]:
        np.testing.assert_array_equal(store.stream("sequence", start, stop), flat[start:stop])
    np.testing.assert_array_equal(store.document_starts("sequence"), np.cumsum([0] + [len(d) for d in docs[:-1]]))
    np.testing.assert_array_equal(store.lengths("sequence"), [len(d) for d in docs])
    assert detect_format(out) == fmt


def test_bin_meta_json_contract_and_raw_little_endian_arrays(tmp_path):
    recs = [
        {"sequence": np.array([1, 2, 3]), "loss_mask": np.array([0, 1, 1])},
        {"sequence": np.array([70000 - 1, 5]), "loss_mask": np.array([1, 1])},
    ]
    out = write_store(
        tmp_path / "sft", "sft", recs, vocab_size=70000, storage_type="bin", meta={"tokenizer": {"fingerprint": "abc"}}
    )
    top = json.loads((out / "meta.json").read_text())
    assert top["format_version"] == 1 and top["format"] == "bin" and top["train_type"] == "sft"
    assert top["keys"]["sequence"]["dtype"] == "<u4", "vocab 70000 does not fit uint16"
    assert top["keys"]["loss_mask"]["dtype"] == "|u1"
    assert top["num_documents"] == 2 and top["num_tokens"] == 5 and top["tokenizer"]["fingerprint"] == "abc"
    shard = out / top["shards"][0]["name"]
    meta = json.loads((shard / "meta.json").read_text())
    assert meta["keys"]["sequence"]["offsets"] == [0, 3, 5]
    assert meta["keys"]["sequence"]["shape"] == [5]
    raw = (shard / "sequence.bin").read_bytes()
    assert raw == np.array([1, 2, 3, 69999, 5], dtype="<u4").tobytes()  # independent little-endian encoding


def test_uint16_chosen_when_vocab_fits(tmp_path):
    out = write_store(tmp_path / "s", "seq", [{"sequence": np.array([65535, 0])}], vocab_size=65536)
    assert json.loads((out / "meta.json").read_text())["keys"]["sequence"]["dtype"] == "<u2"
    assert TokenStore(out).record("sequence", 0).tolist() == [65535, 0]


def test_h5_has_one_dataset_per_key_and_shares_memory(tmp_path):
    recs = [
        {
            "chosen": np.array([1, 2]),
            "rejected": np.array([3]),
            "chosen_mask": np.array([0, 1]),
            "rejected_mask": np.array([1]),
        }
    ] * 3
    out = write_store(tmp_path / "d", "dpo", recs, vocab_size=10, storage_type="h5")
    shard_file = out / json.loads((out / "meta.json").read_text())["shards"][0]["name"]
    with h5py.File(shard_file, "r") as f:
        assert {"chosen", "rejected", "chosen_mask", "rejected_mask"} <= set(f.keys())
        assert f["chosen"][...].tolist() == [1, 2, 1, 2, 1, 2]
        assert f["offsets/rejected"][...].tolist() == [0, 1, 2, 3]
    store = TokenStore(out)
    store.share_memory()
    assert all(t.is_shared() for t in store.shards[0]._tensors.values())
    assert isinstance(store.shards[0].tensor("chosen"), torch.Tensor)
    assert TokenStore(shard_file).record("chosen_mask", 2).tolist() == [0, 1]  # a lone shard opens too


def test_grpo_stores_answers_and_rewards(tmp_path):
    online = [{"prompts": np.array([4, 5]), "answers": np.frombuffer(b"72", np.uint8)}]
    store = TokenStore(write_store(tmp_path / "on", "grpo", online, vocab_size=10))
    assert bytes(store.record("answers", 0)).decode() == "72"
    offline = [
        {"prompts": np.array([1]), "responses": np.array([2, 3]), "masks": np.array([1, 1]), "rewards": np.array([0.5])}
    ]
    store = TokenStore(write_store(tmp_path / "off", "grpo", offline, vocab_size=10, storage_type="h5"))
    assert store.record("rewards", 0).dtype == np.float32 and store.record("rewards", 0)[0] == 0.5


def test_failed_write_leaves_nothing_that_loads(tmp_path):
    out = tmp_path / "s"
    with pytest.raises(RuntimeError):
        with StoreWriter(out, "seq", vocab_size=10, shard_tokens=2) as w:
            w.add({"sequence": np.array([1, 2, 3])})  # one shard already on disk in the temp dir
            raise RuntimeError("crash mid-pack")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [], "the temporary directory must be removed"
    # a directory whose top-level meta.json never got written is refused with a clear message
    (tmp_path / "half").mkdir()
    with pytest.raises(StoreError, match="incomplete"):
        TokenStore(tmp_path / "half")


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(StoreError, match="unknown store format 'zip'"):
        StoreFactory.create("zip")
    with pytest.raises(StoreError, match="no such store"):
        detect_format(tmp_path / "nope")
    with pytest.raises(StoreError, match="do not form a sft store"):
        write_store(tmp_path / "x", "sft", [{"sequence": np.array([1])}], vocab_size=10)
    with pytest.raises(ValueError, match="out of range"):
        write_store(tmp_path / "y", "seq", [{"sequence": np.array([10])}], vocab_size=10)
    out = write_store(tmp_path / "z", "seq", [{"sequence": np.array([1])}], vocab_size=10)
    with pytest.raises(StoreError, match="asked for a 'h5' store but it is 'bin'"):
        TokenStore(out, storage_type="h5")
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_store(out, "seq", [{"sequence": np.array([2])}], vocab_size=10)
    write_store(out, "seq", [{"sequence": np.array([2])}], vocab_size=10, overwrite=True)
    assert TokenStore(out).record("sequence", 0).tolist() == [2]
    (out / "shard_0000" / "sequence.bin").write_bytes(b"\x00")  # truncated array
    with pytest.raises(StoreError, match="expected 2 bytes"):
        TokenStore(out)
    store_fp = write_store(
        tmp_path / "fp",
        "seq",
        [{"sequence": np.array([1])}],
        vocab_size=10,
        meta={"tokenizer": {"fingerprint": "aaaa"}},
    )
    with pytest.raises(StoreError, match="re-pack"):
        TokenStore(store_fp).check_tokenizer("bbbb")


def test_a_killed_packs_temporary_store_is_removed_by_the_next_write(tmp_path):
    import subprocess
    import sys

    from cookmind.atomic import temp_name

    dead = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        ).stdout
    )
    host = temp_name(tmp_path / "x").name.split("@", 1)[1]
    stale = tmp_path / f".store.tmp-{dead}@{host}"
    (stale / "shard_0000").mkdir(parents=True)
    (stale / "shard_0000" / "sequence.bin").write_bytes(b"\0" * 4096)
    write_store(tmp_path / "other", "seq", [{"sequence": np.array([1, 2])}], vocab_size=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_a_damaged_store_names_the_file_and_says_to_re_pack(tmp_path):
    """A store meta.json that is not JSON was 'error: Expecting value: line 2 column 1 (char 34)', naming no file;
    an array file removed from a shard was 'expected 92584 bytes ..., found missing', with nothing to do."""
    out = write_store(tmp_path / "s", "seq", [{"sequence": np.arange(1, 9)}], vocab_size=10)
    meta = out / "meta.json"
    text = meta.read_text()
    meta.write_text(text[:30])  # cut short, as a full disk or a copy cut off leaves it
    for open_it in (TokenStore, detect_format):
        with pytest.raises(
            StoreError, match=rf"^{re.escape(str(meta))}: not valid JSON \(.*line \d+.*re-run `cookmind pack`"
        ):
            open_it(out)
    meta.write_text(text)
    shard_meta = out / "shard_0000" / "meta.json"
    shard_meta.write_text("{")
    with pytest.raises(StoreError, match=rf"^{re.escape(str(shard_meta))}: not valid JSON .*re-run `cookmind pack`"):
        TokenStore(out)
    write_store(out, "seq", [{"sequence": np.arange(1, 9)}], vocab_size=10, overwrite=True)
    array = out / "shard_0000" / "sequence.bin"
    array.unlink()
    with pytest.raises(
        StoreError, match=rf"^{re.escape(str(array))}: missing; the store is incomplete .*re-run `cookmind pack`"
    ):
        TokenStore(out)
    array.write_bytes(b"\x00")
    with pytest.raises(StoreError, match=r"expected 16 bytes for shape \[8\] <u2, found 1; .*re-run `cookmind pack`"):
        TokenStore(out)


@pytest.mark.parametrize("fmt", ["bin", "h5"])
def test_a_shard_opened_on_its_own_is_refused_for_another_tokenizer_as_its_store_is(tmp_path, fmt):
    """A store's shard (``shard_0000`` or ``shard_0000.h5``) opens as a store of its own, but its tokenizer went
    unchecked: its meta says ``tokenizer_fingerprint``, which TokenStore never read, so `cookmind train --train-data
    STORE/shard_0000 --tokenizer OTHER` trained on ids of another vocabulary without a word."""
    from cookmind.data import DatasetFactory

    out = write_store(
        tmp_path / "s", "seq", [{"sequence": np.arange(1, 9)}], 10, fmt, meta={"tokenizer": {"fingerprint": "aaaa"}}
    )
    shard = out / ("shard_0000" + (".h5" if fmt == "h5" else ""))
    assert TokenStore(shard).tokenizer_fingerprint == TokenStore(out).tokenizer_fingerprint == "aaaa"
    for path in (out, shard):
        with pytest.raises(StoreError, match=rf"{re.escape(str(path))} was packed with .*fingerprint aaaa.*re-pack"):
            DatasetFactory.load("seq", path, 4, tokenizer_fingerprint="bbbb")
    DatasetFactory.load("seq", shard, 4, tokenizer_fingerprint="aaaa")  # its own tokenizer: fine


def test_a_tokenizer_retrained_at_the_path_the_store_records_is_told_as_changed_not_as_another(tmp_path, tok_dir):
    """Retraining a tokenizer in place (`tokenizer train --out tok --overwrite`, another --vocab-size) and training
    on a store packed before: "st was packed with tokenizer /abs/tok (fingerprint a), not tok (fingerprint b);
    train with the store's tokenizer or ..." named the same folder twice, as if two tokenizers, and told to use the
    store's, which was gone (eval ppl was told to "train" too). It now says the tokenizer at that path changed since
    the pack, and how to go on."""
    import shutil

    from lm_fixtures import CORPUS

    from cookmind.store.packer import pack
    from cookmind.store.token_store import StoreError
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    tok = tmp_path / "tok"
    shutil.copytree(tok_dir, tok)
    (tmp_path / "in.txt").write_text(CORPUS)
    pack([str(tmp_path / "in.txt")], tmp_path / "st", tok, "seq", progress=False)
    vocab, merges = train_bpe(tmp_path / "in.txt", 300, DEFAULT_SPECIAL_TOKENS, progress=False)
    retrained = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    retrained.save(tok)
    with pytest.raises(StoreError) as exc:
        TokenStore(tmp_path / "st").check_tokenizer(retrained.fingerprint(), str(tok))
    msg = str(exc.value)
    assert "changed since" in msg and "re-pack" in msg and "train with" not in msg
    other = tmp_path / "other"  # a tokenizer at another path is still told as another one
    retrained.save(other)
    with pytest.raises(StoreError, match=r"was packed with tokenizer .*, not .*other"):
        TokenStore(tmp_path / "st").check_tokenizer(retrained.fingerprint(), str(other))


def test_text_or_a_curate_output_given_as_a_store_is_told_to_be_packed_first(tmp_path):
    """`train --train-data curated/` (a curate run's output) said "no meta.json; the store is incomplete or not a
    cookmind store — re-run `cookmind pack`", though nothing had been packed, and `--val-data held.txt` "a file that
    is not HDF5". Text given where a token store goes is now told as text, with the pack command that makes one."""
    (tmp_path / "held.txt").write_text("Some held-out text.\n")
    (tmp_path / "curated").mkdir()
    (tmp_path / "curated" / "shard-00000.jsonl.gz").write_bytes(b"")
    for given in (tmp_path / "held.txt", tmp_path / "curated"):
        with pytest.raises(StoreError) as exc:
            detect_format(given)
        msg = str(exc.value)
        assert "not a token store" in msg and f"cookmind pack --tokenizer TOK --train-type seq --input {given}" in msg
        assert "re-run" not in msg and "incomplete" not in msg
    (tmp_path / "half").mkdir()  # a folder that is neither: a store whose pack died before meta.json, say
    with pytest.raises(StoreError, match="no meta.json"):
        detect_format(tmp_path / "half")
