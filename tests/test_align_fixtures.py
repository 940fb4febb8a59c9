"""Tiny models and tokenizers shared by the alignment and evaluation tests (no tests here)."""

from __future__ import annotations

import re

import torch


class CharTok:
    """Byte-per-character tokenizer: id = code point (< 256); 3 is EOS and pad."""

    eos_id = 3
    pad_id = 3
    vocab_size = 256

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class OracleLM(torch.nn.Module):
    """Writes a canned response after its prompt, one character per step (logits are one-hot).

    ``respond(prompt) -> response``; the model reads the prompt back from the ids, so it is a
    deterministic policy that needs no training, for checking graders and drivers end to end.
    """

    def __init__(self, respond, marker="<think>"):
        super().__init__()
        self.respond, self.marker = respond, marker
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids):
        b, t = ids.shape
        logits = torch.full((b, t, 256), -30.0)
        for r in range(b):
            text = "".join(chr(i) for i in ids[r].tolist())
            cut = text.rfind(self.marker) + len(self.marker)
            target = self.respond(text[:cut]) + chr(CharTok.eos_id)
            done = len(text) - cut
            logits[r, -1, ord(target[min(done, len(target) - 1)])] = 30.0
        return logits


def tiny_hf_tokenizer(folder):
    """A byte-level Hugging Face fast tokenizer (256 byte tokens + <eos>), saved to ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    fast.save_pretrained(folder)
    return fast


def tiny_hf_model(folder=None, vocab_size=257, seed=0):
    """A 2-layer Llama-shaped random model (transformers), saved to ``folder`` when given."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=vocab_size - 1,
        pad_token_id=None,
        bos_token_id=None,
    )  # no padding_idx: every token trains
    model = LlamaForCausalLM(cfg).eval()
    if folder is not None:
        model.save_pretrained(folder)
    return model


def gsm8k_gold(text):
    return re.search(r"####\s*(\S+)", text).group(1).replace(",", "")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread; on a shared 2-core machine more threads only spin."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class XYZ:
    """A 5-token language: 0 'x', 1 'y', 2 'z', 3 end, 4 '?'."""

    eos_id = 3
    pad_id = 3

    def encode(self, text):
        return ["xyz\x03?".index(c) for c in text]

    def decode(self, ids):
        return "".join("xyz\x03?"[i] for i in ids)


def x_fraction(response, _truth):
    """Reward: the share of 'x' in the response; 'correct' when it is all x."""
    r = response.count("x") / max(1, len(response))
    return {"reward": r, "format_reward": 1.0, "answer_reward": float(r == 1.0)}
