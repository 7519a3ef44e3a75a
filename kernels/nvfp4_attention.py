"""Paged decode attention over NVFP4 caches (vLLM's nvfp4 and nvfp4_4over6 layouts).

Each side of a slot is head_dim/2 bytes of e2m1 codes (element 2i in the low nibble, 2i+1 in the high), then one
fp8 e4m3 scale per 16 values; an fp32 global scale per layer (a kernel argument) keeps the block scales inside
e4m3's range. A value is code x block scale x global scale. nvfp4_4over6 stores the same layout; its writer picks,
per block of 16, whichever of max/6 and max/4 scaling reconstructs the block with the smaller squared error.

The decode kernel multiplies on the tensor cores: each tile of codes is read as 4-byte words and decoded in registers
into exact fp16 values (code x block scale), two codes per 32-bit operation, K [tile, d] against the query; the query
and the probabilities are each split into two fp16 parts (hi + lo), side by side as the columns of one product, which
keeps the products close to fp32.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import (
    combine_splits,
    e4m3_byte,
    fold_pairs,
    known_occupancy,
    program_coords,
    remember_occupancy,
    safe_sum,
    slot_offsets,
    softmax_step,
    split_bounds,
    split_buffers,
    split_fp16,
    store_split_stats,
)
from .layouts import SlotLayout

TILE = 128  # tokens a decode program reads per step (the M of its tensor-core products)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # magnitudes of codes 0..7; bit 3 is the sign


def global_scale(x: torch.Tensor) -> float:
    """A per-layer scale that maps the largest block scale (amax / 6) onto e4m3's largest normal (448)."""
    return max(float(x.abs().max()) / (6.0 * 448.0), 1e-12)


def _nearest_codes(y: torch.Tensor) -> torch.Tensor:
    mag = (y.abs().unsqueeze(-1) - E2M1.to(y.device)).abs().argmin(-1)
    return (mag | ((y < 0) & (mag > 0)).to(mag.dtype) << 3).to(torch.uint8)


def _decode_codes(codes: torch.Tensor) -> torch.Tensor:
    mag = E2M1.to(codes.device)[(codes & 7).long()]
    return torch.where((codes >> 3) == 1, -mag, mag)


def encode_nvfp4(x: torch.Tensor, g: float, four_over_six: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., d] -> (packed e2m1 codes [..., d/2], e4m3 block scales [..., d/16]) as bytes."""
    blocks = x.float().unflatten(-1, (-1, 16))  # [..., d/16, 16]
    amax = blocks.abs().amax(-1, keepdim=True)
    candidates = [6.0, 4.0] if four_over_six else [6.0]
    best_codes = best_scale = best_err = None
    for top in candidates:
        scale = (amax / top / g).clamp(max=448.0).to(torch.float8_e4m3fn)
        s = scale.float() * g
        codes = _nearest_codes(torch.where(s > 0, blocks / s.clamp_min(1e-30), torch.zeros_like(blocks)))
        err = ((_decode_codes(codes) * s - blocks) ** 2).sum(-1, keepdim=True)
        if best_err is None:
            best_codes, best_scale, best_err = codes, scale, err
        else:
            better = err < best_err
            best_codes = torch.where(better, codes, best_codes)
            best_scale = torch.where(better, scale.float(), best_scale.float()).to(torch.float8_e4m3fn)
            best_err = torch.minimum(err, best_err)
    codes = best_codes.flatten(-2)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, best_scale.squeeze(-1).view(torch.uint8)


def decode_nvfp4(packed: torch.Tensor, scales: torch.Tensor, g: float) -> torch.Tensor:
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)
    vals = _decode_codes(codes).unflatten(-1, (-1, 16))
    return (vals * scales.contiguous().view(torch.float8_e4m3fn).float().unsqueeze(-1) * g).flatten(-2)


def write_kv_nvfp4(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   k_global: float, v_global: float) -> None:
    nb, bs, h, slot = cache.shape
    flat = cache.view(nb * bs, h, slot)
    half, nsc = layout.head_dim // 2, layout.head_dim // 16
    four_over_six = layout.fmt.name == "nvfp4_4over6"
    for data_off, x, g in ((layout.k_data, k, k_global), (layout.v_data, v, v_global)):
        packed, scales = encode_nvfp4(x, g, four_over_six)
        flat[slots, :, data_off:data_off + half] = packed
        flat[slots, :, data_off + half:data_off + half + nsc] = scales


@triton.jit
def _e4m3_value(byte):
    man = (byte & 7).to(tl.float32)
    ex = byte >> 3
    return tl.where(ex == 0, man / 512.0, (1.0 + man / 8.0) * tl.exp2((ex - 7).to(tl.float32)))


@triton.jit
def _e2m1_code(y):
    """The nearest e2m1 code (ties to the smaller magnitude, as torch's argmin over the magnitudes picks)."""
    a = tl.abs(y)
    mag = ((a > 0.25).to(tl.int32) + (a > 0.75).to(tl.int32) + (a > 1.25).to(tl.int32) + (a > 1.75).to(tl.int32)
           + (a > 2.5).to(tl.int32) + (a > 3.5).to(tl.int32) + (a > 5.0).to(tl.int32))
    return mag | tl.where((y < 0) & (mag > 0), 8, 0)


@triton.jit
def _nvfp4_candidate(xe, xo, amax, g, top):
    """Codes, scale byte and squared error of one block scaling (amax / top) for blocks [NB, 8] x 2."""
    byte = e4m3_byte(tl.minimum(amax / top / g, 448.0))
    sc = _e4m3_value(byte) * g
    div = tl.where(sc > 0, sc, 1.0)[:, None]
    ce = _e2m1_code(tl.where(sc[:, None] > 0, xe / div, 0.0))
    co = _e2m1_code(tl.where(sc[:, None] > 0, xo / div, 0.0))
    re = _e2m1(ce) * sc[:, None] - xe
    ro = _e2m1(co) * sc[:, None] - xo
    return ce, co, byte, tl.sum(re * re, axis=1) + tl.sum(ro * ro, axis=1)


@triton.jit
def _nvfp4_store_side(cache_ptr, base, DATA: tl.constexpr, x_ptr, g, NB: tl.constexpr, HALF: tl.constexpr,
                      FOUR_OVER_SIX: tl.constexpr):
    """`encode_nvfp4` for one head: blocks of 16 as [NB, 8] even and odd elements (pairs pack into bytes)."""
    b = tl.arange(0, NB)
    e = tl.arange(0, 8)
    off = b[:, None] * 16 + 2 * e[None, :]
    xe = tl.load(x_ptr + off).to(tl.float32)
    xo = tl.load(x_ptr + off + 1).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(xe), axis=1), tl.max(tl.abs(xo), axis=1))
    ce, co, byte, err = _nvfp4_candidate(xe, xo, amax, g, 6.0)
    if FOUR_OVER_SIX:
        ce4, co4, byte4, err4 = _nvfp4_candidate(xe, xo, amax, g, 4.0)
        better = err4 < err
        ce = tl.where(better[:, None], ce4, ce)
        co = tl.where(better[:, None], co4, co)
        byte = tl.where(better, byte4, byte)
    tl.store(cache_ptr + base + DATA + b[:, None] * 8 + e[None, :], (ce | (co << 4)).to(tl.uint8))
    tl.store(cache_ptr + base + DATA + HALF + b, byte.to(tl.uint8))


@triton.jit
def _nvfp4_write_kernel(k_ptr, v_ptr, slots_ptr, cache_ptr, k_global, v_global, stride_kt, stride_kh, stride_vt,
                        stride_vh, NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr, K_DATA: tl.constexpr,
                        V_DATA: tl.constexpr, D: tl.constexpr, FOUR_OVER_SIX: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    base = (tl.load(slots_ptr + t).to(tl.int64) * NUM_KV_HEADS + h) * SLOT
    _nvfp4_store_side(cache_ptr, base, K_DATA, k_ptr + t * stride_kt + h * stride_kh, k_global, D // 16, D // 2,
                      FOUR_OVER_SIX)
    _nvfp4_store_side(cache_ptr, base, V_DATA, v_ptr + t * stride_vt + h * stride_vh, v_global, D // 16, D // 2,
                      FOUR_OVER_SIX)


def reshape_and_cache_nvfp4(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, k_global: float, v_global: float) -> None:
    """`write_kv_nvfp4` as a kernel, one program per token and KV head. Divisions on a GPU may round differently
    from torch's in the last bit, so a block scale can sit one e4m3 step off where it lies on a boundary."""
    tokens, kv_heads, d = k.shape
    assert d == layout.head_dim and cache.shape[3] == layout.slot_bytes
    assert d % 16 == 0 and (d // 16) & (d // 16 - 1) == 0, "head_dim / 16 must be a power of two"
    k, v = k.contiguous(), v.contiguous()
    _nvfp4_write_kernel[(tokens, kv_heads)](
        k, v, slots.to(device=cache.device, dtype=torch.int64).contiguous(), cache, float(k_global), float(v_global),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), NUM_KV_HEADS=kv_heads, SLOT=layout.slot_bytes,
        K_DATA=layout.k_data, V_DATA=layout.v_data, D=d, FOUR_OVER_SIX=layout.fmt.name == "nvfp4_4over6",
    )


@triton.jit
def _e2m1(code):
    """The value of 4-bit e2m1 codes: 0, 0.5 (subnormal), then (1 + m/2) x 2^(e-1); bit 3 the sign."""
    idx = code & 7
    e = idx >> 1
    m = (idx & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * tl.exp2((e - 1).to(tl.float32)))
    return tl.where((code >> 3) == 1, -mag, mag)


@triton.jit
def _nvfp4_tile(cache_ptr, off, b, j, t_ok, HALF: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    """A side's values [N, D] as fp16 tensor-core operands, block scales applied and 2^-14 times their value (global
    scale not applied), in the column order of `_nvfp4_column_element`. Block b's 16 codes are the 4-byte words 2b and
    2b + 1 (element 8w + n in bits 4n..4n+3 of word w), read [N, D/16, 2]; its e4m3 scale is read once.

    An e2m1 code (sign s, exponent ee, mantissa m) becomes the fp16 bits s000 eem0 0000 0000, its value times 2^-14
    (the subnormal 0.5 included); the products with an e4m3 scale are exact in fp16. Codes n and n + 4 of a word sit
    16 bits apart, so one shift and mask of a 32-bit word makes both halves at once. First each byte's two codes are
    brought into shape: `ev` keeps the low code's magnitude at bits 0..2 and moves its sign to bit 6, `od` moves the
    high code's magnitude to bits 1..3 next to its sign at bit 7 (each the word with the bits under one mask taken
    from the word shifted; the other bits are never read). Then ev << 9, ev << 1, od << 8 and od, each masked with
    0x8E008E00, are codes (0, 4), (2, 6), (1, 5) and (3, 7) as fp16 pairs."""
    x = tl.load((cache_ptr + off[:, None, None]).to(tl.pointer_type(tl.int32)) + (2 * b)[None, :, None]
                + j[None, None, :], mask=t_ok[:, None, None], other=0)
    sc = tl.load(cache_ptr + off[:, None] + HALF + b[None, :], mask=t_ok[:, None], other=0)
    scale = sc.to(tl.float8e4nv, bitcast=True).to(tl.float32).to(tl.float16)
    ev = x ^ ((x ^ (x << 3)) & 0x40404040)
    od = x ^ ((x ^ (x >> 3)) & 0x0E0E0E0E)
    pairs = tl.join(tl.join((ev << 9) & -1912566272, (ev << 1) & -1912566272),
                    tl.join((od << 8) & -1912566272, od & -1912566272))  # -1912566272 is 0x8E008E00
    codes = tl.join(pairs.to(tl.uint16), (pairs >> 16).to(tl.uint16)).to(tl.float16, bitcast=True)
    return tl.reshape(codes * scale[:, :, None, None, None, None], (N, D))


@triton.jit
def _nvfp4_column_element(i):
    """The element that column i of `_nvfp4_tile`'s tile holds: of each word's 8 columns, 2k and 2k + 1 hold its
    elements k and k + 4."""
    return (i & -8) | ((i >> 1) & 3) | ((i & 1) << 2)


@triton.jit
def _query_columns(q_ptr, seq, kv_head, group, stride_qs, stride_qh, e, G_PAD: tl.constexpr):
    """The GQA group's queries [D, 2G] as `split_fp16` lays them out (column 2g + h part h of head g), row r
    element e[r] (query heads past the group are 0)."""
    c = tl.arange(0, 2 * G_PAD)
    q = tl.load(q_ptr + seq * stride_qs + (kv_head * group + c // 2)[None, :] * stride_qh + e[:, None],
                mask=(c // 2 < group)[None, :], other=0.0)
    hi = q.to(tl.float16)
    return tl.where((c % 2 == 0)[None, :], hi, (q - hi.to(tl.float32)).to(tl.float16))


@triton.jit
def _nvfp4_decode_kernel(
    q_ptr, cache_ptr, block_table_ptr, lens_ptr, out_ptr, ml_ptr, k_global, v_global, sm_scale, max_blocks, group,
    split_len, stride_qs, stride_qh, stride_os, stride_oh,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr,
    K_DATA: tl.constexpr, V_DATA: tl.constexpr, HALF: tl.constexpr, G_PAD: tl.constexpr, TILE: tl.constexpr,
):
    seq, kv_head, split, row, heads, g_ok = program_coords(group, G_PAD)
    D: tl.constexpr = 2 * HALF
    i = tl.arange(0, D)
    b = tl.arange(0, D // 16)
    j = tl.arange(0, 2)
    e = _nvfp4_column_element(i)
    # the query as the B operand [D, 2G] of K [TILE, D] x q^T: the tile's tokens fill the M dimension
    q2 = _query_columns(q_ptr, seq, kv_head, group, stride_qs, stride_qh, e, G_PAD)
    lo, hi = split_bounds(split, split_len, tl.load(lens_ptr + seq))
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    # the output transposed, rows in the tile's column order, [D, 2G] as the probabilities' fp16 parts (column 2g + h
    # the sum over part h of head g's)
    acc = tl.zeros([D, 2 * G_PAD], tl.float32)
    k_factor = k_global * sm_scale * 16384.0  # the values come 2^-14 times their size
    for start in range(lo, hi, TILE):
        t = start + tl.arange(0, TILE)
        t_ok = t < hi
        slot = slot_offsets(block_table_ptr, seq, max_blocks, t, t_ok, kv_head, BLOCK_SIZE, NUM_KV_HEADS, SLOT)
        k = _nvfp4_tile(cache_ptr, slot + K_DATA, b, j, t_ok, HALF, TILE, D)
        raw = fold_pairs(tl.dot(k, q2))  # [TILE, G] on the tensor cores, fp32 accumulation
        scores = tl.where(t_ok[:, None], raw * k_factor, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v = _nvfp4_tile(cache_ptr, slot + V_DATA, b, j, t_ok, HALF, TILE, D)
        alpha2 = tl.reshape(tl.join(alpha, alpha), (2 * G_PAD,))
        acc = tl.dot(tl.trans(v), split_fp16(p), acc * alpha2[None, :])
        m_i = m_new
    o = fold_pairs(acc) * (v_global * 16384.0 / safe_sum(l_i))[None, :]
    tl.store(out_ptr + row * stride_os + heads[None, :] * stride_oh + e[:, None], o, mask=g_ok[None, :])
    store_split_stats(ml_ptr, row, heads, g_ok, group * NUM_KV_HEADS, m_i, l_i)


def paged_decode_nvfp4(q: torch.Tensor, cache: torch.Tensor, layout: SlotLayout, block_table: torch.Tensor,
                       context_lens: torch.Tensor, k_global: float, v_global: float, tile: int = TILE,
                       splits: int | None = None,
                       workspace: dict | None = None) -> torch.Tensor:
    seqs, heads, d = q.shape
    nb, bs, kv_heads, slot = cache.shape
    assert slot == layout.slot_bytes and d == layout.head_dim
    # the codes are read as 4-byte words: V's codes start 9 d / 16 bytes into the slot, a multiple of 4 when d is of 64
    assert d % 64 == 0, f"NVFP4 decode reads its codes as 4-byte words: head_dim {d} must be a multiple of 64"
    key = ("nvfp4", q.device, layout.fmt.name, d, bs, kv_heads, heads // kv_heads, tile)  # its occupancy
    n_split, split_len, part, ml = split_buffers(q, kv_heads, block_table.shape[1] * bs, tile, splits, workspace,
                                                 q.dtype, blocks_per_sm=known_occupancy(key))
    q32 = q.float().contiguous()
    compiled = _nvfp4_decode_kernel[(seqs, kv_heads, n_split)](
        q32, cache, block_table, context_lens, part, ml, k_global, v_global, 1.0 / math.sqrt(d), block_table.shape[1],
        heads // kv_heads, split_len, q32.stride(0), q32.stride(1), part.stride(0), part.stride(1),
        BLOCK_SIZE=bs, NUM_KV_HEADS=kv_heads, SLOT=slot, K_DATA=layout.k_data, V_DATA=layout.v_data, HALF=d // 2,
        G_PAD=max(8, triton.next_power_of_2(heads // kv_heads)), TILE=tile,
    )
    remember_occupancy(key, compiled, q.device)
    return combine_splits(part, ml, seqs, n_split, q.dtype, workspace)


def dequantize_cache_nvfp4(cache: torch.Tensor, layout: SlotLayout, k_global: float,
                           v_global: float) -> tuple[torch.Tensor, torch.Tensor]:
    half, nsc = layout.head_dim // 2, layout.head_dim // 16
    return tuple(decode_nvfp4(cache[..., off:off + half], cache[..., off + half:off + half + nsc], g)
                 for off, g in ((layout.k_data, k_global), (layout.v_data, v_global)))
