"""CookMindLM: the decoder-only language model (Llama/Qwen3 layout)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from cookmind.kernels.linear_ce import kernel_available, linear_cross_entropy
from cookmind.model.block import Block
from cookmind.model.config import CookMindConfig
from cookmind.model.cross_entropy import cross_entropy
from cookmind.model.embedding import Embedding
from cookmind.model.linear import Linear
from cookmind.model.rmsnorm import RMSNorm
from cookmind.model.rope import RotaryEmbedding

RUNTIME_OPTIONS = ("attn_backend", "lm_head_fp8")  # config fields that choose kernels, not weights


def fused_loss_applies(lm_head: nn.Module, device: torch.device) -> bool:
    """Whether the training loss may skip the logits: the LM head + cross-entropy as one fused op.

    Only for a plain cookmind Linear head without bias (a LoRA-wrapped head adds its update in its own
    forward) and where the Triton kernel runs on CUDA; the CPU path stays the unfused one, bit for bit.
    """
    return device.type == "cuda" and type(lm_head) is Linear and lm_head.bias is None and kernel_available(device)


@dataclasses.dataclass
class LMOutput:
    """logits (B, T, V) fp32 or None (``return_logits=False``); loss: mean next-token CE (+ MoE aux) or None;
    aux_loss: MoE balance loss or None."""

    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


class CookMindBackbone(nn.Module):
    """Embeddings, blocks and final norm; lives at ``model.`` so weight names match HF."""

    def __init__(self, cfg: CookMindConfig):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, std=cfg.initializer_range)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(
            cfg.resolved_head_dim, cfg.rope_theta, cfg.rope_scaling, max_positions=cfg.max_position_embeddings
        )


class CookMindLM(nn.Module):
    """Token ids -> next-token logits. See docs/INTERFACES.md for the forward contract."""

    def __init__(self, cfg: CookMindConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.model = CookMindBackbone(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, std=cfg.initializer_range)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight  # one matrix reads and writes tokens
        # with lm_head_fp8: which of the head's FP8 GEMMs accumulate fast (train.fp8_fast_accum, set by parallelize)
        self.lm_head_fast_accum: tuple[str, ...] = ()

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache=None,
        return_logits: bool = True,
    ) -> LMOutput:
        """input_ids (B, T) -> LMOutput. labels are shifted inside (logit t predicts labels t+1).

        return_logits=False (with labels) skips materialising the fp32 (B, T, V) logits: the loss upcasts
        inside its own reduction, which torch.compile fuses; out.logits is then None. For pretraining speed.
        On CUDA it goes further where ``fused_loss_applies``: the LM head and the loss run as one
        ``linear_cross_entropy`` that never hands out the logits (cookmind/kernels/linear_ce.py).
        """
        b, t = input_ids.shape
        h = self.model.embed_tokens(input_ids)
        if position_ids is None:  # consecutive positions from the cache's length: a slice of the RoPE tables
            start = kv_cache.seq_len if kv_cache is not None else 0
            cos, sin = self.model.rotary_emb.prefix(start, t, h.dtype, input_ids.device)  # (1, T, D)
        else:
            cos, sin = self.model.rotary_emb(position_ids, h.dtype)
        aux_total = None
        for layer in self.model.layers:
            h, aux = layer(h, cos, sin, attention_mask, kv_cache)
            if aux is not None:
                aux_total = aux if aux_total is None else aux_total + aux
        if kv_cache is not None:
            kv_cache.advance(t)
        h = self.model.norm(h)
        fused = labels is not None and not return_logits and fused_loss_applies(self.lm_head, h.device)
        logits = None if fused else self.lm_head(h)  # matmul dtype (bf16 under autocast)

        aux_loss = None if aux_total is None else self.config.moe_aux_loss_coef * aux_total
        loss = None
        if labels is not None:
            # shift the targets, not the logits: no copy of the (B, T, V) tensor
            targets = torch.cat([labels[:, 1:], labels.new_full((b, 1), -100)], dim=1)
            if fused:
                loss = linear_cross_entropy(
                    h,
                    self.lm_head.weight,
                    targets,
                    ignore_index=-100,
                    fp8=self.config.lm_head_fp8,
                    fp8_fast_accum=self.lm_head_fast_accum,
                )
            else:
                loss = cross_entropy(logits, targets, ignore_index=-100)
            if aux_loss is not None:
                loss = loss + aux_loss
        if not return_logits and labels is None:
            raise ValueError("CookMindLM.forward: return_logits=False needs labels (there would be no output)")
        if return_logits:
            logits = logits.float()  # fp32 logits, whatever the matmul's dtype under autocast
        return LMOutput(logits=logits if return_logits else None, loss=loss, aux_loss=aux_loss)

    def set_runtime_options(self, **options) -> None:
        """Change how the model runs, not what it is: ``attn_backend``, ``lm_head_fp8`` (RUNTIME_OPTIONS).

        For a model loaded from disk (``train.init_from``), whose shape its weights fix: the options are
        validated as a CookMindConfig and take effect from the next forward.
        """
        unknown = sorted(set(options) - set(RUNTIME_OPTIONS))
        if unknown:
            raise ValueError(f"set_runtime_options: {unknown} are not runtime options; those are {RUNTIME_OPTIONS}")
        self.config = dataclasses.replace(self.config, **options)  # validates
        for layer in self.model.layers:
            layer.self_attn.backend = self.config.attn_backend

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Distinct parameters (a tied embedding counts once); optionally without the token embedding."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.model.embed_tokens.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward) for MFU: 6 N_active + 12 L H D T.

        N_active counts weights used in matmuls (the LM head even when tied; only the top-k routed experts
        of an MoE layer), as in the PaLM appendix and nanoGPT; attention scores are counted non-causally.
        """
        cfg = self.config

        def matmul_weights(module: nn.Module) -> int:
            # every projection, not one class: torchao's float8 linears (train.fp8_blocks), LoRA's wrapped base
            # and its A and B all multiply by their weight
            return sum(m.weight.numel() for m in module.modules() if hasattr(m, "in_features") and hasattr(m, "weight"))

        n = 0
        for block in self.model.layers:
            n += matmul_weights(block.self_attn)
            if block.is_moe:
                moe = block.mlp
                n += matmul_weights(moe.gate) + moe.top_k * matmul_weights(moe.experts[0])
                if moe.shared_expert is not None:
                    n += matmul_weights(moe.shared_expert)
            else:
                n += matmul_weights(block.mlp)
        n += self.lm_head.weight.numel()
        attn = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.resolved_head_dim * seq_len
        return float(6 * n + attn)
