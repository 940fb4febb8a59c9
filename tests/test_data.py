"""Datasets for seq / sft / dpo / grpo on stores built from arrays, checked against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cookmind.data import DatasetFactory, collate_for, doc_attention_mask
from cookmind.store import StoreError, write_store

FORMATS = ["bin", "h5"]
EOS = 0


@pytest.fixture(params=FORMATS)
def fmt(request):
    return request.param


def _seq_store(tmp_path, fmt, docs, shard_tokens=10**9):
    return write_store(
        tmp_path / "seq",
        "seq",
        [{"sequence": np.array(d)} for d in docs],
        vocab_size=100,
        storage_type=fmt,
        shard_tokens=shard_tokens,
    )


def test_seq_windows_with_stride_match_hand_computed(tmp_path, fmt):
    # stream: 1 2 3 0 | 4 5 0 | 6 7 8 9 0   (12 tokens, 3 documents ending in EOS=0), 2 shards
    path = _seq_store(tmp_path, fmt, [[1, 2, 3, EOS], [4, 5, EOS], [6, 7, 8, 9, EOS]], shard_tokens=4)
    ds = DatasetFactory.load("seq", path, window_size=5, stride=3)
    assert len(ds) == 3  # starts 0, 3, 6; start 9 would need tokens up to 14 > 12
    assert ds[0]["input_ids"].tolist() == [1, 2, 3, 0, 4]
    assert ds[1]["input_ids"].tolist() == [0, 4, 5, 0, 6]
    assert ds[2]["input_ids"].tolist() == [0, 6, 7, 8, 9]
    assert ds[1]["labels"].tolist() == [0, 4, 5, 0, 6]  # the model shifts: target of t is input t+1
    assert ds[1]["position_ids"].tolist() == [0, 1, 2, 3, 4]
    assert ds[0]["input_ids"].dtype == torch.long
    assert len(DatasetFactory.load("seq", path, window_size=4)) == 3  # stride defaults to window: 0, 4, 8


def test_seq_doc_mask_restarts_positions_and_builds_block_diagonal_mask(tmp_path, fmt):
    path = _seq_store(tmp_path, fmt, [[1, 2, 3, EOS], [4, 5, EOS], [6, 7, 8, 9, EOS]])
    ds = DatasetFactory.load("seq", path, window_size=6, stride=2, doc_mask=True)
    # window 1 = stream[2:8] = 3 0 | 4 5 0 | 6 ; documents start at stream positions 4 and 7
    assert ds[1]["input_ids"].tolist() == [3, 0, 4, 5, 0, 6]
    assert ds[1]["position_ids"].tolist() == [0, 1, 0, 1, 2, 0]
    assert ds[2]["position_ids"].tolist() == [0, 1, 2, 0, 1, 2]  # stream[4:10], docs at 4 and 7
    batch = collate_for("seq", pad_id=0, doc_mask=True)([ds[1], ds[2]])
    mask = batch["attention_mask"]
    assert mask.shape == (2, 1, 6, 6)
    docs = [[0, 0, 1, 1, 1, 2], [0, 0, 0, 1, 1, 1]]
    for b in range(2):  # naive reference: j <= i and the same document
        want = [[j <= i and docs[b][i] == docs[b][j] for j in range(6)] for i in range(6)]
        assert mask[b, 0].tolist() == want


def test_doc_attention_mask_without_restarts_is_causal():
    pos = torch.arange(5).unsqueeze(0)
    assert torch.equal(doc_attention_mask(pos)[0, 0], torch.ones(5, 5, dtype=torch.bool).tril())


def _sft_store(tmp_path, fmt, convs):
    recs = [{"sequence": np.array(ids), "loss_mask": np.array(m)} for ids, m in convs]
    return write_store(tmp_path / "sft", "sft", recs, vocab_size=100, storage_type=fmt)


def test_sft_worked_example_from_the_seed(tmp_path, fmt):
    path = _sft_store(tmp_path, fmt, [([1, 11, 25, 78, 2], [1, 1, 1, 1, 1])])
    ds = DatasetFactory.load("sft", path, window_size=8, pad_to_window=True, pad_id=0)
    assert ds[0]["input_ids"].tolist() == [1, 11, 25, 78, 2, 0, 0, 0]
    assert ds[0]["labels"].tolist() == [1, 11, 25, 78, 2, -100, -100, -100]


def test_sft_labels_only_on_assistant_and_truncated_records_dropped(tmp_path, fmt):
    # ids: <s> user u1 <e> <s> asst a1 a2 <e>; mask marks a1 a2 <e> (assistant content + end of turn)
    conv = ([5, 6, 7, 8, 5, 9, 30, 31, 8], [0, 0, 0, 0, 0, 0, 1, 1, 1])
    long_prompt = ([5, 6] + [7] * 10 + [8, 5, 9, 40, 8], [0] * 15 + [1, 1])  # supervised only past 12
    path = _sft_store(tmp_path, fmt, [conv, long_prompt, conv])
    ds = DatasetFactory.load("sft", path, window_size=12)
    assert ds.num_dropped == 1 and len(ds) == 2
    assert ds[0]["labels"].tolist() == [-100] * 6 + [30, 31, 8]
    assert ds[1]["input_ids"].tolist() == conv[0]
    short = DatasetFactory.load("sft", path, window_size=7)  # cut inside the answer: keeps a1 only
    assert short[0]["labels"].tolist() == [-100] * 6 + [30]
    batch = collate_for("sft", pad_id=99)([short[0], ds[0]])
    assert batch["input_ids"][0].tolist() == conv[0][:7] + [99, 99]
    assert batch["labels"][0].tolist() == [-100] * 6 + [30, -100, -100]


def test_sft_packing_fills_windows_in_order_with_restarting_positions(tmp_path, fmt):
    a = ([1, 2, 3], [0, 1, 1])
    b = ([4, 5], [0, 1])
    c = ([6, 7, 8, 9], [0, 0, 1, 1])
    path = _sft_store(tmp_path, fmt, [a, b, c])
    ds = DatasetFactory.load("sft", path, window_size=6, packing=True)
    assert len(ds) == 2  # [a b] (5 tokens) then [c]: c does not fit after a+b
    assert ds[0]["input_ids"].tolist() == [1, 2, 3, 4, 5]
    assert ds[0]["labels"].tolist() == [-100, 2, 3, -100, 5]
    assert ds[0]["position_ids"].tolist() == [0, 1, 2, 0, 1]
    assert ds[1]["labels"].tolist() == [-100, -100, 8, 9]


def test_dpo_masks_responses_only_and_collate_pads_both_sides_together(tmp_path, fmt):
    recs = [
        {
            "chosen": np.array([1, 2, 3, 4]),
            "chosen_mask": np.array([0, 0, 1, 1]),
            "rejected": np.array([1, 2, 5]),
            "rejected_mask": np.array([0, 0, 1]),
        },
        {
            "chosen": np.array([1, 2, 3, 4, 4, 4]),
            "chosen_mask": np.array([0, 0, 0, 0, 0, 1]),
            "rejected": np.array([1, 6]),
            "rejected_mask": np.array([0, 1]),
        },
    ]
    path = write_store(tmp_path / "dpo", "dpo", recs, vocab_size=10, storage_type=fmt)
    ds = DatasetFactory.load("dpo", path, window_size=5)
    assert ds.num_dropped == 1 and len(ds) == 1  # pair 2's chosen response lies past token 5
    item = ds[0]
    assert item["chosen_labels"].tolist() == [-100, -100, 3, 4]
    assert item["rejected_labels"].tolist() == [-100, -100, 5]
    batch = collate_for("dpo", pad_id=0)([item, item])
    assert batch["rejected_input_ids"].shape == batch["chosen_input_ids"].shape == (2, 4)
    assert batch["rejected_labels"][0].tolist() == [-100, -100, 5, -100]


def test_dpo_drops_a_pair_whose_sides_are_the_same_in_the_window_and_says_so(tmp_path, fmt):
    # GSM8K pairs that differ in their final "#### N" only: cut to the window, chosen == rejected, a pair that
    # teaches nothing (zero gradient) and counts as wrong in reward_accuracy; half of a real pack trained so silently
    prompt, mask = [1, 2], [0, 0]
    recs = [
        {  # differs at token 3: kept
            "chosen": np.array(prompt + [3, 4, 5]),
            "chosen_mask": np.array(mask + [1, 1, 1]),
            "rejected": np.array(prompt + [6, 4, 5]),
            "rejected_mask": np.array(mask + [1, 1, 1]),
        },
        {  # the same first 5 tokens, differs at token 6: past a window of 5
            "chosen": np.array(prompt + [3, 4, 5, 7]),
            "chosen_mask": np.array(mask + [1, 1, 1, 1]),
            "rejected": np.array(prompt + [3, 4, 5, 8]),
            "rejected_mask": np.array(mask + [1, 1, 1, 1]),
        },
        {  # rejected longer: the same first 5, rejected goes on
            "chosen": np.array(prompt + [3, 4, 5]),
            "chosen_mask": np.array(mask + [1, 1, 1]),
            "rejected": np.array(prompt + [3, 4, 5, 9, 9]),
            "rejected_mask": np.array(mask + [1, 1, 1, 1, 1]),
        },
    ]
    path = write_store(tmp_path / "dpo", "dpo", recs, vocab_size=10, storage_type=fmt)
    with pytest.warns(UserWarning, match=r"2 of the 3 dpo pairs .* the same in their first 5 tokens"):
        ds = DatasetFactory.load("dpo", path, window_size=5)
    assert len(ds) == 1 and ds.num_dropped == 2 and ds.num_same_in_window == 2
    assert ds[0]["rejected_input_ids"].tolist() == [1, 2, 6, 4, 5]
    wide = DatasetFactory.load("dpo", path, window_size=6)  # every pair differs within 6 tokens
    assert len(wide) == 3 and wide.num_dropped == 0 and wide.num_same_in_window == 0


def test_grpo_online_and_offline(tmp_path, fmt):
    online = [
        {"prompts": np.array(p), "answers": np.frombuffer(a.encode(), np.uint8)}
        for p, a in [([1, 2, 3], "18"), ([4] * 9, "x"), ([5], "3.5")]
    ]
    ds = DatasetFactory.load("grpo", write_store(tmp_path / "on", "grpo", online, 10, fmt), window_size=4)
    assert ds.num_dropped == 1 and len(ds) == 2
    assert ds[0]["prompt_ids"].tolist() == [1, 2, 3] and ds[0]["answer"] == "18"
    batch = collate_for("grpo", pad_id=9)([ds[0], ds[1]])
    assert batch["prompt_ids"].tolist() == [[1, 2, 3], [5, 9, 9]]
    assert batch["prompt_lengths"].tolist() == [3, 1] and batch["answer"] == ["18", "3.5"]
    offline = [
        {
            "prompts": np.array([1, 2]),
            "responses": np.array([3, 4, 5]),
            "masks": np.array([1, 1, 0]),
            "rewards": np.array([1.5]),
        }
    ]
    ds = DatasetFactory.load("grpo", write_store(tmp_path / "off", "grpo", offline, 10, fmt), window_size=4)
    item = ds[0]
    assert item["response_ids"].tolist() == [3, 4] and item["response_mask"].tolist() == [1, 1]
    assert item["reward"].item() == 1.5
    assert collate_for("grpo", 0)([item, item])["reward"].tolist() == [1.5, 1.5]


def test_factory_rejects_mismatches_with_clear_messages(tmp_path):
    path = _seq_store(tmp_path, "bin", [[1, 2, 3]])
    with pytest.raises(StoreError, match="is a 'seq' store, not 'sft'"):
        DatasetFactory.load("sft", path, 4)
    with pytest.raises(ValueError, match=r"unknown seq dataset option\(s\) \['packing'\]"):
        DatasetFactory.load("seq", path, 2, packing=True)
    with pytest.raises(ValueError, match="unknown train type"):
        DatasetFactory.load("rlhf", path, 2)


def test_factory_refusals_open_with_the_flag_the_store_came_from(tmp_path):
    # a grpo store given as --val-data to a dpo run was "X is a 'grpo' store, not 'dpo'": nothing said it was the
    # validation store, not the training one
    path = _seq_store(tmp_path, "bin", [[1, 2, 3]])
    source = "--val-data (data.val_path)"
    with pytest.raises(StoreError) as err:
        DatasetFactory.load("sft", path, 4, source=source)
    assert str(err.value).startswith(f"--val-data (data.val_path): {path} is a 'seq' store, not 'sft'")
    with pytest.raises(StoreError) as err:
        DatasetFactory.load("seq", tmp_path / "nowhere", 4, source=source)
    assert str(err.value).startswith(f"--val-data (data.val_path): {tmp_path / 'nowhere'}: no such store")
    sft = _sft_store(tmp_path, "bin", [([1, 2], [0, 1])])
    with pytest.raises(ValueError, match="stride applies to seq windows only"):
        DatasetFactory.load("sft", sft, 4, stride=2)
    with pytest.raises(ValueError, match="doc_mask needs position_ids"):
        collate_for("sft", 0, doc_mask=True)([DatasetFactory.load("sft", sft, 4)[0]])


def test_supervised_record_filter_matches_naive_scan_across_shards_and_blocks(tmp_path):
    from cookmind.data.sft_dataset import supervised_records
    from cookmind.store import TokenStore

    rng = np.random.default_rng(0)
    recs = []
    for _ in range(200):
        n = int(rng.integers(1, 30))
        recs.append({"sequence": rng.integers(0, 50, n), "loss_mask": (rng.random(n) < 0.1).astype(np.uint8)})
    store = TokenStore(write_store(tmp_path / "s", "sft", recs, 50, shard_tokens=400))
    assert len(store.shards) > 3
    for window in (1, 5, 17):
        naive = [i for i, r in enumerate(recs) if r["loss_mask"][:window].any()]
        for block in (1, 7, 1 << 16):
            assert supervised_records(store, "loss_mask", window, block).tolist() == naive
