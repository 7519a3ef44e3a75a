"""Paged decode attention over a block table: one query token per sequence, grouped-query heads, ragged context
lengths, the cache stored as bytes in the layouts of kernels/layouts.py.

Modes (one kernel, the storage layout a compile-time constant):
  0 bf16 and 5 fp16: plain values;
  1 fp8 e4m3 and 2 fp8 e5m2 with per-tensor k/v scales: the codes become fp16 in registers and meet an fp16
    query on the tensor cores; K's scale multiplies the fp32 scores and V's the fp32 output, once;
  3 int8 and 4 fp8 per-token-head: an fp32 scale after each head's values, the codes fp16 as above; K's scale
    multiplies the scores and V's the probabilities, never the tiles.
A program walks its share of the context in tiles of 64 tokens (the launcher's default), the block ids of each
tile read one tile ahead so that the copies of the next tiles' K and V are in flight while one tile is computed.
Told top to bottom: the Triton kernel, the write path (quantize a token's K and V into its slot), the launcher,
and the plain torch reference the tests hold it to.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import (
    combine_splits,
    known_occupancy,
    program_coords,
    remember_occupancy,
    safe_sum,
    slot_offsets,
    softmax_step,
    split_bounds,
    split_buffers,
    store_split_stats,
)
from .layouts import SlotLayout, slot_layout


@triton.jit
def _codes_to_f16(raw, MODE: tl.constexpr):
    """Codes (uint8) as fp16 values, four to a 32-bit register: e4m3 pairs by the hardware's paired conversion,
    e5m2 as the high byte of an fp16 (a byte permute), int8 offset by 128 into the mantissa of 1024 + 128 and
    subtracted back in fp16 pairs. The conversions are marked impure so that they stay where they are, on the
    loaded tile: the tile reaches shared memory as fp16 and the tensor-core operands (V's transposed) are read
    from it with matrix loads, not byte by byte."""
    if MODE == 1 or MODE == 4:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 a, b; mov.b32 {a, b}, $2; cvt.rn.f16x2.e4m3x2 $0, a; cvt.rn.f16x2.e4m3x2 $1, b; }",
            "=r,=r,r", [raw], dtype=tl.float16, is_pure=False, pack=4)
    elif MODE == 2:
        return tl.inline_asm_elementwise(
            "{ prmt.b32 $0, $2, 0, 0x1404; prmt.b32 $1, $2, 0, 0x3424; }",
            "=r,=r,r", [raw], dtype=tl.float16, is_pure=False, pack=4)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 u, c; xor.b32 u, $2, 0x80808080; mov.b32 c, 0x64806480; prmt.b32 $0, u, 0x64646464, 0x5150; "
            "prmt.b32 $1, u, 0x64646464, 0x5352; sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; }",
            "=r,=r,r", [raw], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _load_values(cache_ptr, byte_off, d_offs, d_mask, MODE: tl.constexpr, PORTABLE: tl.constexpr):
    """A [N, D] tile of values starting at byte offsets `byte_off` [N] (before any scale), in the tensor-core
    operand type: bf16 for a bf16 cache, fp16 otherwise (fp8 and int8 values are exact in fp16). Codes are loaded
    16 bytes at a time and become fp16 in registers (`_codes_to_f16`; `PORTABLE`: by Triton's own conversions,
    which the interpreter runs)."""
    if MODE == 0:
        p = (cache_ptr + byte_off[:, None]).to(tl.pointer_type(tl.bfloat16)) + d_offs[None, :]
        return tl.load(p, mask=d_mask, other=0.0)
    elif MODE == 5:
        p = (cache_ptr + byte_off[:, None]).to(tl.pointer_type(tl.float16)) + d_offs[None, :]
        return tl.load(p, mask=d_mask, other=0.0)
    else:
        raw = tl.load(cache_ptr + byte_off[:, None] + d_offs[None, :], mask=d_mask, other=0)
        if not PORTABLE:
            return _codes_to_f16(raw, MODE)
        elif MODE == 1 or MODE == 4:
            return raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        elif MODE == 2:  # e5m2 is an fp16 with its low byte dropped
            return (raw.to(tl.int16) << 8).to(tl.float16, bitcast=True)
        else:
            return raw.to(tl.int8, bitcast=True).to(tl.float16)


@triton.jit
def _paged_decode_kernel(
    q_ptr, cache_ptr, block_table_ptr, lens_ptr, out_ptr, ml_ptr, k_tensor_scale, v_tensor_scale,
    sm_scale, max_blocks, group, split_len,
    stride_qs, stride_qh, stride_os, stride_oh,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr,
    K_DATA: tl.constexpr, K_SCALE: tl.constexpr, V_DATA: tl.constexpr, V_SCALE: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, G_PAD: tl.constexpr, TILE: tl.constexpr, MODE: tl.constexpr,
    WIDEN: tl.constexpr,
):
    seq, kv_head, split, row, heads, g_mask = program_coords(group, G_PAD)
    d_offs = tl.arange(0, D_PAD)
    d_ok = d_offs < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d_offs[None, :],
                mask=g_mask[:, None] & d_ok[None, :], other=0.0)
    qk_scale = sm_scale
    if WIDEN and MODE == 0:
        q = q.to(tl.float32)
    elif MODE == 0:
        q = q.to(tl.bfloat16)
    else:
        q = q.to(tl.float16)
    if MODE == 1 or MODE == 2:
        qk_scale = sm_scale * k_tensor_scale  # the per-tensor scale, once on the fp32 scores
    lo, hi = split_bounds(split, split_len, tl.load(lens_ptr + seq))
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    # the block ids of each tile are loaded one tile ahead: the K/V addresses of a tile depend on no load of its
    # own trip, so the pipeliner can keep several tiles' K/V copies in flight
    table = block_table_ptr + seq * max_blocks
    t = lo + tl.arange(0, TILE)
    block = tl.load(table + t // BLOCK_SIZE, mask=t < hi, other=0)
    for start in range(lo, hi, TILE):
        t = start + tl.arange(0, TILE)
        t_ok = t < hi
        slot = ((block.to(tl.int64) * BLOCK_SIZE + t % BLOCK_SIZE) * NUM_KV_HEADS + kv_head) * SLOT
        block = tl.load(table + (t + TILE) // BLOCK_SIZE, mask=t + TILE < hi, other=0)
        tile_mask = t_ok[:, None] & d_ok[None, :]
        k = _load_values(cache_ptr, slot + K_DATA, d_offs, tile_mask, MODE, WIDEN)
        if WIDEN and MODE == 0:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k)) * qk_scale  # [G, TILE] on the tensor cores, fp32 accumulation
        if MODE == 3 or MODE == 4:
            ks = tl.load((cache_ptr + slot + K_SCALE).to(tl.pointer_type(tl.float32)), mask=t_ok, other=0.0)
            scores = scores * ks[None, :]
        scores = tl.where(t_ok[None, :], scores, float("-inf"))
        m_new, alpha, p, l_i = softmax_step(m_i, l_i, scores)
        v = _load_values(cache_ptr, slot + V_DATA, d_offs, tile_mask, MODE, WIDEN)
        if MODE == 3 or MODE == 4:
            vs = tl.load((cache_ptr + slot + V_SCALE).to(tl.pointer_type(tl.float32)), mask=t_ok, other=0.0)
            p = p * vs[None, :]
        if WIDEN and MODE == 0:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / safe_sum(l_i)[:, None]
    if MODE == 1 or MODE == 2:
        out = out * v_tensor_scale
    tl.store(out_ptr + row * stride_os + heads[:, None] * stride_oh + d_offs[None, :], out,
             mask=g_mask[:, None] & d_ok[None, :])
    store_split_stats(ml_ptr, row, heads, g_mask, group * NUM_KV_HEADS, m_i, l_i)


_INTERPRETED = type(_paged_decode_kernel).__name__ == "InterpretedFunction"  # chosen when the kernel was defined


# ----------------------------------------------------------------------------------------------------------------
# The write path


_FP8 = {1: torch.float8_e4m3fn, 2: torch.float8_e5m2, 4: torch.float8_e4m3fn}
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _encode_side(x: torch.Tensor, mode: int, tensor_scale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Values [..., D] as stored bytes [..., D * elem], and the per-token-head fp32 scale as 4 bytes (or None)."""
    if mode == 0:
        return x.to(torch.bfloat16).view(torch.uint8), None
    if mode == 5:
        return x.to(torch.float16).view(torch.uint8), None
    if mode in (1, 2):
        dt = _FP8[mode]
        q = (x.float() / tensor_scale).clamp(-_FP8_MAX[dt], _FP8_MAX[dt]).to(dt)
        return q.view(torch.uint8), None
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    if mode == 3:
        scale = amax / 127.0
        q = torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8)
    else:
        dt = _FP8[mode]
        scale = amax / _FP8_MAX[dt]
        q = (x.float() / scale).clamp(-_FP8_MAX[dt], _FP8_MAX[dt]).to(dt)
    return q.view(torch.uint8), scale.to(torch.float32).contiguous().view(torch.uint8)


def write_kv(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Quantize K and V [tokens, kv_heads, D] and store them at cache slots `slots` [tokens] (block x block_size +
    offset), in `layout`."""
    nb, bs, h, slot = cache.shape
    flat = cache.view(nb * bs, h, slot)
    d = layout.head_dim
    for data_off, scale_off, x, ts in ((layout.k_data, layout.k_scale, k, k_scale),
                                       (layout.v_data, layout.v_scale, v, v_scale)):
        data, scale = _encode_side(x, layout.mode, ts)
        width = data.shape[-1]
        flat[slots, :, data_off:data_off + width] = data
        if scale is not None:
            flat[slots, :, scale_off:scale_off + 4] = scale
        assert width == (2 if layout.mode in (0, 5) else 1) * d


@triton.jit
def _store_side(cache_ptr, base, DATA: tl.constexpr, SCALE: tl.constexpr, x, d_offs, d_ok, tensor_scale,
                MODE: tl.constexpr):
    """Quantize one head's values x [D] (fp32) as `_encode_side` does and store them, and the scale, at `base`."""
    if MODE == 0:
        tl.store((cache_ptr + base + DATA).to(tl.pointer_type(tl.bfloat16)) + d_offs, x.to(tl.bfloat16), mask=d_ok)
    elif MODE == 5:
        tl.store((cache_ptr + base + DATA).to(tl.pointer_type(tl.float16)) + d_offs, x.to(tl.float16), mask=d_ok)
    else:
        if MODE == 2:
            lim = 57344.0
        elif MODE == 3:
            lim = 127.0
        else:
            lim = 448.0
        if MODE == 1 or MODE == 2:
            y = x / tensor_scale
        else:  # per token and head: the scale is amax / the format's largest value, stored as fp32 after the values
            s = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / lim
            tl.store((cache_ptr + base + SCALE).to(tl.pointer_type(tl.float32)), s)
            y = x / s
        y = tl.minimum(tl.maximum(y, -lim), lim)
        if MODE == 3:
            code = tl.where(y >= 0, tl.floor(y + 0.5), tl.ceil(y - 0.5)).to(tl.int8).to(tl.uint8, bitcast=True)
        elif MODE == 2:
            code = y.to(tl.float8e5).to(tl.uint8, bitcast=True)
        else:
            code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        tl.store(cache_ptr + base + DATA + d_offs, code, mask=d_ok)


@triton.jit
def _reshape_and_cache_kernel(
    k_ptr, v_ptr, slots_ptr, cache_ptr, k_scale, v_scale, stride_kt, stride_kh, stride_vt, stride_vh,
    NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr, K_DATA: tl.constexpr, K_SCALE: tl.constexpr,
    V_DATA: tl.constexpr, V_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, MODE: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    d_offs = tl.arange(0, D_PAD)
    d_ok = d_offs < HEAD_DIM
    base = (tl.load(slots_ptr + t).to(tl.int64) * NUM_KV_HEADS + h) * SLOT
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d_offs, mask=d_ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d_offs, mask=d_ok, other=0.0).to(tl.float32)
    _store_side(cache_ptr, base, K_DATA, K_SCALE, k, d_offs, d_ok, k_scale, MODE)
    _store_side(cache_ptr, base, V_DATA, V_SCALE, v, d_offs, d_ok, v_scale, MODE)


def reshape_and_cache(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """The write path as a kernel (vLLM's name for it): what `write_kv` does, one program per token and KV head.
    int8 rounds halves away from zero and the GPU's division may differ from torch's in the last bit, so a code
    can differ from `write_kv`'s by one step; the scales are the same."""
    tokens, kv_heads, d = k.shape
    assert d == layout.head_dim and cache.shape[2] == kv_heads and cache.shape[3] == layout.slot_bytes
    k, v = k.contiguous(), v.contiguous()
    _reshape_and_cache_kernel[(tokens, kv_heads)](
        k, v, slots.to(device=cache.device, dtype=torch.int64).contiguous(), cache, float(k_scale), float(v_scale),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        NUM_KV_HEADS=kv_heads, SLOT=layout.slot_bytes, K_DATA=layout.k_data, K_SCALE=max(layout.k_scale, 0),
        V_DATA=layout.v_data, V_SCALE=max(layout.v_scale, 0), HEAD_DIM=d, D_PAD=triton.next_power_of_2(d),
        MODE=layout.mode,
    )


# ----------------------------------------------------------------------------------------------------------------
# The launcher


def paged_decode(q: torch.Tensor, cache: torch.Tensor, layout: SlotLayout, block_table: torch.Tensor,
                 context_lens: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0, tile: int = 64,
                 splits: int | None = None, workspace: dict | None = None, num_warps: int | None = None,
                 num_stages: int | None = None) -> torch.Tensor:
    """Attention of q [seqs, heads, D] over each sequence's cached tokens; returns [seqs, heads, D] in q's dtype.
    `tile`: the tokens a program takes at a time (a power of two, 16 at least; split lengths are multiples of it).
    `splits`: programs per sequence and KV head along the context (default: enough to fill the GPU's SMs in whole
    waves at the kernel's occupancy, which the first launch on a GPU reports and later calls use). The per-tensor
    scales travel as kernel arguments (no tensor is built per call); `workspace` (see `split_buffers`) keeps the
    split buffers and the output from call to call. `num_warps`, `num_stages`: Triton's launch options (its
    defaults, 4 and 3, where not given)."""
    seqs, heads, d = q.shape
    nb, bs, kv_heads, slot = cache.shape
    assert slot == layout.slot_bytes and d == layout.head_dim and heads % kv_heads == 0
    group = heads // kv_heads
    consts = dict(
        BLOCK_SIZE=bs, NUM_KV_HEADS=kv_heads, SLOT=slot,
        K_DATA=layout.k_data, K_SCALE=max(layout.k_scale, 0), V_DATA=layout.v_data, V_SCALE=max(layout.v_scale, 0),
        HEAD_DIM=d, D_PAD=max(16, triton.next_power_of_2(d)), G_PAD=max(16, triton.next_power_of_2(group)),
        TILE=tile, MODE=layout.mode,
        # Triton's interpreter (3.9) multiplies bf16 tiles wrongly in tl.dot and runs no inline assembly: under it
        # a bf16 cache's operands are widened to fp32 (exactly) and codes become fp16 by Triton's conversions; on a
        # GPU bf16 stays bf16 for the tensor cores. Every other mode multiplies fp16 operands, under the
        # interpreter too
        WIDEN=_INTERPRETED,
    )
    options = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    key = (q.device, q.dtype, num_warps, num_stages, *sorted(consts.items()))
    n_split, split_len, part, ml = split_buffers(q, kv_heads, block_table.shape[1] * bs, tile, splits, workspace,
                                                 q.dtype, blocks_per_sm=known_occupancy(key))
    compiled = _paged_decode_kernel[(seqs, kv_heads, n_split)](
        q, cache, block_table, context_lens, part, ml, float(k_scale), float(v_scale),
        1.0 / math.sqrt(d), block_table.shape[1], group, split_len,
        q.stride(0), q.stride(1), part.stride(0), part.stride(1), **consts, **options,
    )
    remember_occupancy(key, compiled, q.device)
    return combine_splits(part, ml, seqs, n_split, q.dtype, workspace)


# ----------------------------------------------------------------------------------------------------------------
# The torch reference


def _decode_side(raw: torch.Tensor, scale: torch.Tensor | None, mode: int, tensor_scale: float) -> torch.Tensor:
    if mode == 0:
        x = raw.contiguous().view(torch.bfloat16).float()
    elif mode == 5:
        x = raw.contiguous().view(torch.float16).float()
    elif mode == 3:
        x = raw.contiguous().view(torch.int8).float()
    else:
        x = raw.contiguous().view(_FP8[mode]).float()
    if mode in (1, 2):
        x = x * tensor_scale
    if scale is not None:
        x = x * scale.contiguous().view(torch.float32)
    return x


def dequantize_cache(cache: torch.Tensor, layout: SlotLayout, k_scale: float = 1.0,
                     v_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [blocks, block_size, kv_heads, D] in fp32: plain and slow, obviously right."""
    width = (2 if layout.mode in (0, 5) else 1) * layout.head_dim
    scaled = layout.mode in (3, 4)
    out = []
    for data, sc, ts in ((layout.k_data, layout.k_scale, k_scale), (layout.v_data, layout.v_scale, v_scale)):
        raw = cache[..., data:data + width]
        scale = cache[..., sc:sc + 4] if scaled else None
        out.append(_decode_side(raw, scale, layout.mode, ts))
    return out[0], out[1]


def paged_decode_reference(q: torch.Tensor, cache: torch.Tensor, layout: SlotLayout, block_table: torch.Tensor,
                           context_lens: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    k_all, v_all = dequantize_cache(cache, layout, k_scale, v_scale)
    seqs, heads, d = q.shape
    kv_heads = cache.shape[2]
    bs = cache.shape[1]
    out = torch.empty(seqs, heads, d, dtype=torch.float32)
    for s in range(seqs):
        n = int(context_lens[s])
        blocks = block_table[s, : (n + bs - 1) // bs].long()
        k = k_all[blocks].reshape(-1, kv_heads, d)[:n]
        v = v_all[blocks].reshape(-1, kv_heads, d)[:n]
        k = k.repeat_interleave(heads // kv_heads, dim=1)  # [n, heads, d]
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[s].float(), k) / math.sqrt(d)
        out[s] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)
    return out.to(q.dtype)


def make_cache(fmt: str, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
               device: str = "cpu") -> tuple[torch.Tensor, SlotLayout]:
    layout = slot_layout(fmt, head_dim)
    cache = torch.zeros(num_blocks, block_size, kv_heads, layout.slot_bytes, dtype=torch.uint8, device=device)
    return cache, layout
