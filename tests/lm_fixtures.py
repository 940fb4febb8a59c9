"""Shared pieces of the generation/serving tests: a tiny model with sharp distributions, one CPU thread."""

import torch

from cookmind.model import CookMindConfig, CookMindLM


def sharp_tiny_lm(**overrides) -> CookMindLM:
    """A seeded 2-layer CookMindLM in eval mode whose matrices are scaled by 8.

    Larger weights give sharper, more varied next-token distributions, so greedy and sampled outputs
    differ between prompts and positions (a random small model would repeat one token).
    """
    torch.manual_seed(0)
    kw = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)
    kw.update(overrides)
    model = CookMindLM(CookMindConfig(**kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return model


def one_cpu_thread():
    """Tiny models run fastest on one thread; two OpenMP threads on a busy 2-core machine thrash.

    Use as ``one_cpu_thread = pytest.fixture(autouse=True, scope="module")(one_cpu_thread)``.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
