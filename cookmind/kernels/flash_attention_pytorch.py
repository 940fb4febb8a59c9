"""FlashAttention-2 written in plain PyTorch: the readable reference for the Triton kernel.

Never builds the full (T x T) score matrix. The forward pass walks key tiles with an online
softmax and keeps only the output O and the per-row logsumexp L; the backward pass recomputes
each probability tile from Q, K and L (Dao, "FlashAttention-2", 2023, Algorithms 1 and 2).

Shapes: q (..., H, Tq, D); k, v (..., Hkv, Tk, D) with H a multiple of Hkv (grouped-query
attention), any leading dims as in F.scaled_dot_product_attention: (B, T, D) and (T, D) too.
The G = H / Hkv query heads that share one K/V head are viewed as an extra axis, so K and V are
broadcast, never repeated in memory. The saved logsumexp L (natural log) has q's leading shape,
q.shape[:-1]: (B, Tq) for 3-D input.
"""

from __future__ import annotations

import math

import torch

from .shapes import as_heads, autocast_inputs, check_attention_inputs

BLOCK_M = 64  # query rows per tile
BLOCK_N = 64  # key columns per tile


def _causal_mask(i0: int, i1: int, j0: int, j1: int, offset: int, device) -> torch.Tensor:
    """True where query row i may see key j: j <= i + offset (offset = Tk - Tq, bottom-right aligned)."""
    rows = torch.arange(i0, i1, device=device)[:, None]
    cols = torch.arange(j0, j1, device=device)[None, :]
    return cols <= rows + offset


def _key_end(i1: int, tk: int, offset: int, is_causal: bool) -> int:
    """One past the last key any row < i1 can see."""
    return min(tk, i1 + offset) if is_causal else tk


class FlashAttentionPytorch(torch.autograd.Function):
    """Tiled attention: ``FlashAttentionPytorch.apply(q, k, v, is_causal) -> o`` of q's shape and dtype."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False):
        ctx.in_dtypes = (q.dtype, k.dtype, v.dtype)  # gradients go back in these
        ctx.in_shapes = (q.shape, k.shape, v.shape)
        q_shape = q.shape
        q, k, v = as_heads(*autocast_inputs(q, k, v))
        b, h, tq, d, hkv, tk = check_attention_inputs(q, k, v, is_causal)
        g = h // hkv
        scale = 1.0 / math.sqrt(d)
        offset = tk - tq
        qg = q.reshape(b, hkv, g, tq, d)  # group axis: query heads sharing one K/V head
        kg, vg = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, Tk, D): broadcast over the group
        out = torch.empty(b, hkv, g, tq, d, device=q.device, dtype=q.dtype)
        lse = torch.empty(b, hkv, g, tq, device=q.device, dtype=torch.float32)
        for i0 in range(0, tq, BLOCK_M):
            i1 = min(i0 + BLOCK_M, tq)
            qi = qg[..., i0:i1, :].float()
            m = torch.full(qi.shape[:-1], -math.inf, device=q.device)  # running row max
            l = torch.zeros_like(m)  # running row sum of exp(s - m)
            acc = torch.zeros_like(qi)  # running unnormalised output
            for j0 in range(0, _key_end(i1, tk, offset, is_causal), BLOCK_N):
                j1 = min(j0 + BLOCK_N, tk)
                s = qi @ kg[..., j0:j1, :].float().transpose(-1, -2) * scale  # S = Q K^T / sqrt(D)
                if is_causal:
                    s = s.masked_fill(~_causal_mask(i0, i1, j0, j1, offset, q.device), -math.inf)
                m_new = torch.maximum(m, s.amax(-1))
                m_safe = m_new.masked_fill(m_new == -math.inf, 0.0)  # rows with nothing seen yet
                p = torch.exp(s - m_safe[..., None])
                alpha = torch.exp(m - m_safe)  # rescales what was summed under the old max
                l = alpha * l + p.sum(-1)
                acc = alpha[..., None] * acc + p @ vg[..., j0:j1, :].float()
                m = m_new
            out[..., i0:i1, :] = (acc / l[..., None]).to(q.dtype)  # O = diag(l)^-1 acc
            lse[..., i0:i1] = m + torch.log(l)  # L = m + log(l)
        ctx.save_for_backward(q, k, v, out, lse.reshape(q_shape[:-1]))
        ctx.is_causal = is_causal
        return out.reshape(q_shape)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        is_causal = ctx.is_causal
        b, hkv, g, tq, d = out.shape
        tk = k.shape[2]
        lse = lse.reshape(b, hkv, g, tq)
        scale = 1.0 / math.sqrt(d)
        offset = tk - tq
        qg = q.reshape(b, hkv, g, tq, d)
        do = grad_out.reshape(b, hkv, g, tq, d).float()
        delta = (do * out.float()).sum(-1)  # D_i = rowsum(dO * O) = sum_j P_ij dP_ij
        dq = torch.zeros(b, hkv, g, tq, d, device=q.device)
        dk = torch.zeros(b, hkv, tk, d, device=q.device)
        dv = torch.zeros(b, hkv, tk, d, device=q.device)
        for j0 in range(0, tk, BLOCK_N):
            j1 = min(j0 + BLOCK_N, tk)
            kj = k[:, :, None, j0:j1].float()
            vj = v[:, :, None, j0:j1].float()
            # causal: only query rows i with i + offset >= j0 see this key tile
            i_start = max(0, j0 - offset) // BLOCK_M * BLOCK_M if is_causal else 0
            for i0 in range(i_start, tq, BLOCK_M):
                i1 = min(i0 + BLOCK_M, tq)
                qi = qg[..., i0:i1, :].float()
                s = qi @ kj.transpose(-1, -2) * scale
                if is_causal:
                    s = s.masked_fill(~_causal_mask(i0, i1, j0, j1, offset, q.device), -math.inf)
                p = torch.exp(s - lse[..., i0:i1, None])  # P recomputed from L, never stored
                doi = do[..., i0:i1, :]
                dv[:, :, j0:j1] += (p.transpose(-1, -2) @ doi).sum(2)  # dV = P^T dO, summed over the group
                dp = doi @ vj.transpose(-1, -2)  # dP = dO V^T
                ds = p * (dp - delta[..., i0:i1, None])  # dS = P * (dP - D)
                dq[..., i0:i1, :] += ds @ kj * scale  # dQ = dS K / sqrt(D)
                dk[:, :, j0:j1] += (ds.transpose(-1, -2) @ qi).sum(2) * scale  # dK = dS^T Q / sqrt(D)
        (dt_q, dt_k, dt_v), (sq, sk, sv) = ctx.in_dtypes, ctx.in_shapes
        return dq.reshape(sq).to(dt_q), dk.reshape(sk).to(dt_k), dv.reshape(sv).to(dt_v), None
