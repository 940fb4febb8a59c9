"""LoRA: starts equal to the base, merge/unmerge equal, only adapters train, PEFT loads our adapter."""

import os

import pytest
import torch
from lm_fixtures import tiny_config as _cfg

from cookmind.model import CookMindLM, save_model
from cookmind.model.lora import (
    adapters_disabled,
    apply_lora,
    lora_modules,
    merge_lora,
    merged_copy,
    save_adapter,
    unmerge_lora,
)


def _randomize_b(model):
    for _, m in lora_modules(model):
        torch.nn.init.normal_(m.lora_B.weight, std=0.05)


def test_b_zero_init_keeps_the_model_unchanged_and_only_adapters_train():
    model = CookMindLM(_cfg())
    ids = torch.randint(0, 64, (2, 12))
    before = model(ids).logits
    names = apply_lora(model, r=4, alpha=8)
    assert len(names) == 2 * 7  # q k v o gate up down in 2 layers
    assert torch.equal(model(ids).logits, before)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # the update is (alpha / r) * B A, applied beside the frozen W
    _, m = next(lora_modules(model))
    assert m.scaling == pytest.approx(8 / 4)
    x = torch.randn(3, m.in_features)
    torch.nn.init.normal_(m.lora_B.weight)
    want = x @ m.weight.t() + 2.0 * (x @ m.lora_A.weight.t() @ m.lora_B.weight.t())
    assert torch.allclose(m(x), want, atol=1e-5)


def test_merge_unmerge_and_disable():
    model = CookMindLM(_cfg())
    ids = torch.randint(0, 64, (2, 12))
    base = model(ids).logits
    w0 = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    apply_lora(model, r=4, alpha=16, targets=["q_proj", "v_proj", "down_proj"])
    _randomize_b(model)
    adapted = model(ids).logits
    assert not torch.allclose(adapted, base, atol=1e-4)
    with adapters_disabled(model):
        assert torch.allclose(model(ids).logits, base, atol=1e-6)
    merge_lora(model)
    assert torch.allclose(model(ids).logits, adapted, atol=1e-5)
    assert torch.allclose(merged_copy(model)(ids).logits, adapted, atol=1e-5)
    unmerge_lora(model)
    assert torch.allclose(model.model.layers[0].self_attn.q_proj.weight, w0, atol=1e-6)
    assert torch.allclose(model(ids).logits, adapted, atol=1e-5)


def test_unknown_target_is_a_clear_error():
    with pytest.raises(ValueError, match="match no linear layer.*q_proj"):
        apply_lora(CookMindLM(_cfg()), targets=["query"])


def test_a_target_that_matches_nothing_is_refused_beside_ones_that_match():
    # a typo among the targets (lora.targets=[q_proj,v_prj]) adapted only q_proj, saying nothing
    model = CookMindLM(_cfg())
    with pytest.raises(ValueError, match=r"\['v_prj'\] match no linear layer.*v_proj"):
        apply_lora(model, targets=["q_proj", "v_prj"])
    assert not any(True for _ in lora_modules(model))  # refused before anything was wrapped


@pytest.mark.parametrize("gqa_tied", [(2, True), (4, False)])
def test_peft_loads_our_adapter_onto_the_exported_hf_model(tmp_path, gqa_tied):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from cookmind.model.hf import export_hf

    kv, tied = gqa_tied
    model = CookMindLM(_cfg(num_key_value_heads=kv, tie_word_embeddings=tied)).eval()
    save_model(tmp_path / "base", model)
    export_hf(tmp_path / "base", tmp_path / "hf")
    apply_lora(model, r=4, alpha=8)
    _randomize_b(model)
    save_adapter(tmp_path / "adapter", model)
    ids = torch.randint(0, 64, (2, 12))
    ours = model(ids).logits

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32)
    peft_model = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs = peft_model(input_ids=ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    # and the adapter really changes the output (not a vacuous equality)
    with torch.no_grad(), peft_model.disable_adapter():
        assert (peft_model(input_ids=ids).logits - theirs).abs().max().item() > 1e-3


def test_a_lora_runs_adapter_names_its_base_and_peft_loads_it_there(tmp_path, keep_threads):
    """Every LoRA checkpoint's adapter_config.json said base_model_name_or_path: null, so nothing in the adapter named
    the model it adapts (AutoPeftModel has nothing to load). It names the checkpoint train.init_from loaded (a run's
    newest), as an absolute path; PEFT loads the adapter onto that base's Hugging Face export with the run's merged
    model's logits."""
    import json

    import numpy as np

    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from cookmind.model import load_model
    from cookmind.model.hf import export_hf
    from cookmind.store import write_store
    from cookmind.train import TrainConfig, Trainer
    from cookmind.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    save_checkpoint(tmp_path / "base" / "checkpoints", 1, CookMindLM(_cfg()), None, {"run_id": "base"})
    mask = np.array([0, 0, 0, 1, 1, 1], np.uint8)
    rows = [{"sequence": np.arange(1 + i, 7 + i), "loss_mask": mask} for i in range(4)]
    write_store(tmp_path / "sft", "sft", rows, vocab_size=64)
    cfg = {
        "train": {"objective": "sft", "init_from": "base", "max_steps": 2, "micro_batch_size": 2, "seed": 0},
        "data": {"train_path": str(tmp_path / "sft"), "window_size": 8},
        "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0},
        "optim": {"lr": 0.05, "warmup_steps": 0},
        "logging": {"run_dir": str(tmp_path / "run"), "progress": False, "report": False},
    }
    cwd = os.getcwd()
    os.chdir(tmp_path)  # --init-from base, relative as a user types it
    try:
        assert Trainer(TrainConfig.from_dict(cfg)).fit()["status"] == "completed"
    finally:
        os.chdir(cwd)
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002"
    said = json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert said == str(tmp_path / "base" / "checkpoints" / "step_00000001")
    export_hf(said, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32)
    peft_model = peft.PeftModel.from_pretrained(hf, ckpt).eval()
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        theirs = peft_model(input_ids=ids).logits
        merged = load_model(ckpt).eval()(ids).logits
        assert (merged - theirs).abs().max().item() < 1e-4
        with peft_model.disable_adapter():  # the run trained the adapter: not a vacuous equality
            assert (peft_model(input_ids=ids).logits - theirs).abs().max().item() > 1e-4


def test_the_base_fingerprint_of_a_matrix_over_2_24_values_samples_inside_it():
    """`save_adapter` (every LoRA checkpoint) of a model with a matrix of more than 2**24 values (gpt2-small's
    50304 x 768 embedding; `python3 bench/bench_multi_lora.py` on a CPU) died with "IndexError: index 38633472 is
    out of bounds": float32 places rounded the last one past the end. Reference: the matrix's own first and last
    values, and every sampled value is one of its values."""
    from cookmind.model.fingerprint import VALUES, fingerprint_mismatch, weights_fingerprint

    torch.manual_seed(0)
    model = torch.nn.Linear(4098, 4098, bias=False)  # 16,793,604 values > 2**24
    flat = model.weight.detach().reshape(-1)
    (rec,) = weights_fingerprint(model).values()
    assert len(rec["values"]) == VALUES and rec["shape"] == [4098, 4098]
    assert rec["values"][0] == float(f"{flat[0].item():.6g}") and rec["values"][-1] == float(f"{flat[-1].item():.6g}")
    assert fingerprint_mismatch({"weight": rec}, model) is None
    with torch.no_grad():
        model.weight.mul_(2)
    assert fingerprint_mismatch({"weight": rec}, model) == "weight"


def test_a_folder_holding_only_an_adapter_given_as_a_model_says_it_is_an_adapter(tmp_path, capsys):
    """`cookmind generate ADAPTER_DIR` (save_adapter's output, or a PEFT adapter) said 'ADAPTER_DIR/config.json:
    missing; a CookMind model directory needs config.json and model.safetensors', not that it is an adapter and how
    to use one."""
    from cookmind.cli import main

    model = CookMindLM(_cfg())
    apply_lora(model, r=2, alpha=4.0, targets=["q_proj"])
    save_adapter(tmp_path / "chef", model, base_model_path="runs/sft")
    assert main(["generate", str(tmp_path / "chef"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind generate: error: {tmp_path / 'chef'} holds a LoRA adapter (adapter_config.json;")
    assert "trained on runs/sft" in err and "--lora NAME=" in err and err.count("\n") == 1, err


def test_a_token_store_or_a_tokenizer_given_as_a_model_says_what_it_is(tmp_path, tok_dir, capsys):
    """`cookmind export --hf data/sft OUT` and `generate tok/` said 'config.json: missing; a CookMind model directory
    needs config.json and model.safetensors' of a token store and of a tokenizer folder."""
    from cookmind.cli import main
    from cookmind.store import write_store

    store = write_store(tmp_path / "sft", "seq", [{"sequence": [1, 2, 3]}], vocab_size=64)
    for folder, said in ((store, "a token store (`cookmind pack`'s output), not a model"), (tok_dir, "a tokenizer")):
        assert main(["generate", str(folder), "--prompt", "hi"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind generate: error: {folder} holds {said}") and err.count("\n") == 1, err


@pytest.mark.parametrize("what", ["adapter", "model"])
def test_a_save_killed_before_its_last_file_leaves_no_folder_under_the_final_name(tmp_path, monkeypatch, what):
    """save_adapter made its folder, then wrote adapter_model.safetensors, then adapter_config.json: killed between
    the two, a folder with weights and no config stood under the final name (serve --lora read it as no adapter).
    A new folder is now built under a temporary name and renamed whole, as save_model's is."""
    import cookmind.model.lora
    import cookmind.model.model_io

    model = CookMindLM(_cfg())
    if what == "adapter":
        apply_lora(model, r=2, alpha=4)

    def killed(path, *args, **kwargs):  # the process dies before the config file is written
        raise KeyboardInterrupt

    monkeypatch.setattr(cookmind.model.lora, "write_json", killed)
    monkeypatch.setattr(cookmind.model.model_io, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        (save_adapter if what == "adapter" else save_model)(tmp_path / "out", model)
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    (save_adapter if what == "adapter" else save_model)(tmp_path / "out", model)
    written = {"adapter": ["adapter_config.json", "adapter_model.safetensors"]}
    assert sorted(os.listdir(tmp_path / "out")) == written.get(what, ["config.json", "model.safetensors"])


def test_save_adapter_into_a_folder_holding_an_adapter_refuses_unless_overwrite(tmp_path):
    """save_adapter into an existing folder replaced the adapter files there without a word, whoever wrote them (a
    PEFT adapter, another run's). It refuses in one line naming the folder, and replaces them with overwrite=True;
    a folder without an adapter's files (one being assembled, an empty one) is written into as before."""
    from safetensors import safe_open

    from cookmind.model.lora import lora_state_dict

    model = CookMindLM(_cfg())
    apply_lora(model, r=4, alpha=8)
    _randomize_b(model)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 16}')
    (theirs / "adapter_model.safetensors").write_bytes(b"someone else's")
    with pytest.raises(FileExistsError, match=r"theirs.*adapter.*overwrite=True"):
        save_adapter(theirs, model)
    assert (theirs / "adapter_model.safetensors").read_bytes() == b"someone else's"
    assert (theirs / "adapter_config.json").read_text() == '{"peft_type": "LORA", "r": 16}'
    save_adapter(theirs, model, overwrite=True)
    with safe_open(theirs / "adapter_model.safetensors", "pt") as f:
        assert len(list(f.keys())) == len(lora_state_dict(model))
    empty = tmp_path / "empty"
    empty.mkdir()
    save_adapter(empty, model)
    assert (empty / "adapter_config.json").is_file()
