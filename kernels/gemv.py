"""Weight streaming: the decode-shaped skinny GEMM y[B, N] = x[B, K] W[N, K]^T for batch 1 to 64, with bf16
weights or fp8 e4m3 weights and one fp32 scale per output channel. Every weight byte is read once per call; the
batch rides along. Kernel, launcher and torch reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, scale_ptr, y_ptr, B, N, K, stride_xb, stride_wn, stride_yb,
                 B_PAD: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FP8: tl.constexpr):
    pid = tl.program_id(0)
    n = pid * BN + tl.arange(0, BN)
    b = tl.arange(0, B_PAD)
    n_ok = n < N
    acc = tl.zeros([B_PAD, BN], tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        k_ok = k < K
        x = tl.load(x_ptr + b[:, None] * stride_xb + k[None, :], mask=(b < B)[:, None] & k_ok[None, :], other=0.0)
        if FP8:
            raw = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
            w = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            w = tl.load(w_ptr + n[:, None] * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
        acc += tl.dot(x.to(tl.float32), tl.trans(w))
    if FP8:
        acc = acc * tl.load(scale_ptr + n, mask=n_ok, other=0.0)[None, :]
    tl.store(y_ptr + b[:, None] * stride_yb + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(b < B)[:, None] & n_ok[None, :])


def quantize_fp8_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 [N, K] -> (fp8 e4m3 bytes [N, K], fp32 scale per output channel [N])."""
    scale = (w.float().abs().amax(1) / 448.0).clamp_min(1e-12)
    q = (w.float() / scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.view(torch.uint8), scale


def gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, bn: int = 32,
         bk: int = 64, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, K] (B <= 64) times W^T: W bf16 [N, K], or fp8 bytes [N, K] with `scale` [N]; into `out` [B, N] (x's
    dtype) where given."""
    b, k = x.shape
    n = w.shape[0]
    if b > 64:
        raise ValueError(f"the decode GEMV takes batches up to 64, got {b}")
    fp8 = w.dtype == torch.uint8
    if fp8 and scale is None:
        raise ValueError("fp8 weights need their per-channel scales")
    y = out if out is not None else torch.empty(b, n, dtype=x.dtype, device=x.device)
    dummy = scale if scale is not None else y  # never read without fp8
    _gemv_kernel[(triton.cdiv(n, bn),)](x, w, dummy, y, b, n, k, x.stride(0), w.stride(0), y.stride(0),
                                        B_PAD=max(16, triton.next_power_of_2(b)), BN=bn, BK=bk, FP8=fp8)
    return y


def gemv_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    if w.dtype == torch.uint8:
        w = w.view(torch.float8_e4m3fn).float() * scale[:, None]
    return (x.float() @ w.float().T).to(x.dtype)
