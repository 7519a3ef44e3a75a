"""The bandwidth ceiling: a read-only streaming probe (every word read once, summed per program so nothing can be
skipped) and a copy probe. Kernel, launcher and torch reference side by side."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _read_kernel(x_ptr, partial_ptr, n_words, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    words = tl.load(x_ptr + offs, mask=offs < n_words, other=0)
    tl.store(partial_ptr + pid, tl.sum(words, axis=0))  # int32 sum, wrapping


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n_words, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_words
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def read_probe(buf: torch.Tensor, block: int = 4096, out: torch.Tensor | None = None) -> torch.Tensor:
    """Reads `buf` (bytes, a multiple of 4) once as int32 words; returns the per-program wrapped sums (into `out`,
    int32 [ceil(words / block)], where given)."""
    words = buf.view(torch.int32)
    n = words.numel()
    grid = triton.cdiv(n, block)
    partial = out if out is not None else torch.empty(grid, dtype=torch.int32, device=buf.device)
    assert partial.numel() >= grid
    _read_kernel[(grid,)](words, partial, n, BLOCK=block)
    return partial


def read_probe_reference(buf: torch.Tensor, block: int = 4096) -> torch.Tensor:
    words = buf.view(torch.int32).to(torch.int64)
    pad = (-words.numel()) % block
    sums = torch.nn.functional.pad(words, (0, pad)).view(-1, block).sum(dim=1)
    return ((sums + 2**31) % 2**32 - 2**31).to(torch.int32)  # int32 wrap-around, as the kernel adds


def copy_probe(src: torch.Tensor, block: int = 4096, out: torch.Tensor | None = None) -> torch.Tensor:
    """Copies `src` (bytes, a multiple of 4) as int32 words, into `out` (like `src`) where given."""
    words = src.view(torch.int32)
    dst = (out if out is not None else torch.empty_like(src)).view(torch.int32)
    n = words.numel()
    _copy_kernel[(triton.cdiv(n, block),)](words, dst, n, BLOCK=block)
    return dst.view(src.dtype)
