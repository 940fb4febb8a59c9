"""CookMindConfig: the one typed, validated schema of a CookMind model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ATTN_BACKENDS = ("naive", "sdpa", "cudnn", "flash-triton")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass
class CookMindConfig:
    """Shape and options of a CookMind decoder-only language model.

    Field names follow Hugging Face Llama/Qwen3 configs so export is a rename-free copy.
    ``head_dim=None`` means ``hidden_size // num_attention_heads``.
    ``rope_scaling`` is None or ``{"rope_type": "yarn", "factor": s, "original_max_position_embeddings": n,
    "beta_fast": 32, "beta_slow": 1, "attention_factor": None, "truncate": True}``; "linear" ({"factor"}) and
    "llama3" ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) are
    accepted too, so Llama-3 checkpoints import.
    ``attention_bias`` adds biases to the q/k/v projections (Qwen2 style; needed to import Qwen2).
    ``lm_head_fp8`` runs the LM head's GEMMs in FP8 in the fused training loss (cookmind/kernels/
    linear_ce_fp8.py): CUDA with compute capability >= 8.9 only; elsewhere, and for logits, the head is unchanged.
    Faster, at a cost in loss: at Qwen3-0.6B 2.3-2.9% above bf16 after 200 steps in four runs (docs/BENCHMARKS.md).
    Like ``attn_backend`` it is how the model runs, not what it is: the Hugging Face export leaves it out.
    """

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    max_position_embeddings: int = 256
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    qk_norm: bool = False
    attention_bias: bool = False
    attn_backend: str = "sdpa"
    lm_head_fp8: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_shared_expert: bool = False
    moe_aux_loss_coef: float = 0.01
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def resolved_head_dim(self) -> int:
        """Per-head width: ``head_dim`` when set, else hidden_size / num_attention_heads."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field and what to do about it."""
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"CookMindConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"CookMindConfig: num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads} (grouped-query attention)"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"CookMindConfig: hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; set head_dim explicitly"
            )
        if self.resolved_head_dim % 2 != 0:
            raise ValueError(f"CookMindConfig: head_dim={self.resolved_head_dim} must be even for RoPE")
        if self.attn_backend not in ATTN_BACKENDS:
            raise ValueError(f"CookMindConfig.attn_backend={self.attn_backend!r}: choose one of {ATTN_BACKENDS}")
        if not isinstance(self.lm_head_fp8, bool):
            raise ValueError(f"CookMindConfig.lm_head_fp8 must be true or false, got {self.lm_head_fp8!r}")
        if self.num_experts < 0 or self.num_experts_per_tok <= 0:
            raise ValueError(
                f"CookMindConfig: num_experts={self.num_experts} must be >= 0 (0 = dense) and "
                f"num_experts_per_tok={self.num_experts_per_tok} > 0"
            )
        if self.rope_scaling is not None:
            self._validate_rope_scaling(self.rope_scaling)

    @staticmethod
    def _validate_rope_scaling(rs: dict[str, Any]) -> None:
        if not isinstance(rs, dict):
            raise ValueError(f"CookMindConfig.rope_scaling must be None or a dict, got {type(rs).__name__}")
        rope_type = rs.get("rope_type", rs.get("type"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"CookMindConfig.rope_scaling: rope_type {rope_type!r} is not supported; "
                f"supported: {ROPE_TYPES} (yarn needs factor and original_max_position_embeddings)"
            )
        if rope_type == "yarn":
            allowed = {
                "rope_type",
                "type",
                "factor",
                "original_max_position_embeddings",
                "beta_fast",
                "beta_slow",
                "attention_factor",
                "truncate",
                "mscale",
                "mscale_all_dim",
            }
            unknown = sorted(set(rs) - allowed)
            if unknown:
                raise ValueError(f"CookMindConfig.rope_scaling: unknown yarn keys {unknown}; allowed {sorted(allowed)}")
            for key in ("factor", "original_max_position_embeddings"):
                if rs.get(key) is None:
                    raise ValueError(f"CookMindConfig.rope_scaling: yarn needs {key!r}")
        if rope_type == "linear":
            unknown = sorted(set(rs) - {"rope_type", "type", "factor"})
            if unknown or rs.get("factor") is None:
                raise ValueError(f"CookMindConfig.rope_scaling: linear takes exactly 'factor' (unknown: {unknown})")
        if rope_type == "llama3":
            needed = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
            unknown = sorted(set(rs) - needed - {"rope_type", "type"})
            missing = sorted(k for k in needed if rs.get(k) is None)
            if unknown or missing:
                raise ValueError(
                    f"CookMindConfig.rope_scaling: llama3 needs {sorted(needed)}; missing {missing}, unknown {unknown}"
                )
        if rope_type != "default" and float(rs["factor"]) < 1.0:
            raise ValueError(f"CookMindConfig.rope_scaling: {rope_type} factor must be >= 1, got {rs['factor']}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CookMindConfig:
        """Build from a dict; unknown keys raise ValueError naming them (no silent drops)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"CookMindConfig: unknown keys {unknown}; known keys are {sorted(names)}")
        return cls(**d)
