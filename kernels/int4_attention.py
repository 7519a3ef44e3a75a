"""Paged decode attention over int4 per-token-head caches (vLLM's int4_per_token_head layout).

Each side of a slot is head_dim/2 bytes (two values per byte, element 2i in the low nibble, 2i+1 in the high)
followed by one fp32 scale whose low 4 mantissa bits hold the 4-bit zero point. Values are stored after a
randomized Hadamard rotation y = H D x (H the unnormalized Walsh-Hadamard matrix, D fixed random signs), quantized
asymmetrically: y ~ s (q - z). The kernel never rebuilds a value:
  <q', s (q_k - z)> = s (<q', q_k> - z sum(q'))        on the scores,
  sum_t p_t s_t (q_v,t - z_t) = sum_t (p_t s_t) q_v,t - sum_t p_t s_t z_t        on the accumulator (the second sum
  kept apart and subtracted once at the end),
with q' = H D q. H D is orthogonal up to sqrt(d), so the softmax scale is divided by d, and the output
o = D H o' / d is rotated back in the launcher. The sums over codes, <q', q_k> and sum_t (p_t s_t) q_v,t, run on the
tensor cores: the codes are read as 4-byte words and become exact fp16 operands two per 32-bit mask (`_int4_codes`),
and the query and the probabilities are each split into two fp16 parts (hi + lo), side by side as the columns of one
product, which keeps the products close to fp32.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import triton
import triton.language as tl

from .common import (
    combine_splits,
    fold_pairs,
    known_occupancy,
    program_coords,
    remember_occupancy,
    round_half_even,
    safe_sum,
    slot_offsets,
    softmax_step,
    split_bounds,
    split_buffers,
    split_fp16,
    store_split_stats,
)
from .layouts import SlotLayout

SIGN_SEED = 0x9E3779B9  # fixed: the same signs on every rank and every restart
TILE = 128  # tokens a decode program reads per step (the M of its tensor-core products)


def hadamard(d: int, device="cpu") -> torch.Tensor:
    """The unnormalized Sylvester Hadamard matrix (entries +-1), d a power of two. Built once per size and device
    and shared (read-only: never modify it in place)."""
    if d & (d - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim, got {d}")
    return _hadamard(d, torch.device(device))


@lru_cache(maxsize=None)
def _hadamard(d: int, device: torch.device) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h.to(device)


def rht_signs(d: int, device="cpu") -> torch.Tensor:
    """The fixed random signs D of the rotation, built once per size and device (read-only)."""
    return _rht_signs(d, torch.device(device))


@lru_cache(maxsize=None)
def _rht_signs(d: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(SIGN_SEED)
    return (torch.randint(0, 2, (d,), generator=g) * 2 - 1).to(torch.float32).to(device)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """y = H D x over the last dimension (norm grows by sqrt(d))."""
    d = x.shape[-1]
    return (x.float() * rht_signs(d, x.device)) @ hadamard(d, x.device)  # H is symmetric


def unrotate(y: torch.Tensor) -> torch.Tensor:
    """x = D H y / d, the inverse of rotate."""
    d = y.shape[-1]
    return (y.float() @ hadamard(d, y.device)) * rht_signs(d, y.device) / d


def encode_int4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., d] -> (packed bytes [..., d/2], fp32 scale with the zero point in its low 4 mantissa bits, as 4 bytes)."""
    y = rotate(x)
    lo, hi = y.amin(-1, keepdim=True), y.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp_min(1e-8)
    zp = torch.round(-lo / scale).clamp(0, 15)
    scale_bits = scale.contiguous().view(torch.int32)
    packed_scale = (scale_bits & ~0xF) | zp.to(torch.int32)
    s = packed_scale.view(torch.float32)  # the scale the reader will see: low mantissa bits replaced
    q = torch.round(y / s + zp).clamp(0, 15).to(torch.uint8)
    data = q[..., 0::2] | (q[..., 1::2] << 4)
    return data, packed_scale.view(torch.uint8)


def decode_int4(data: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """The rotated values s (q - z) [..., d] a slot side stores (still rotated)."""
    bits = scale_bytes.contiguous().view(torch.int32)
    zp = (bits & 0xF).float()
    s = (bits & ~0xF).view(torch.float32)
    q = torch.stack([data & 0xF, data >> 4], dim=-1).flatten(-2).float()
    return s * (q - zp)


def write_kv_int4(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor) -> None:
    nb, bs, h, slot = cache.shape
    flat = cache.view(nb * bs, h, slot)
    half = layout.head_dim // 2
    for data_off, scale_off, x in ((layout.k_data, layout.k_scale, k), (layout.v_data, layout.v_scale, v)):
        data, scale = encode_int4(x)
        flat[slots, :, data_off:data_off + half] = data
        flat[slots, :, scale_off:scale_off + 4] = scale


@triton.jit
def _int4_store_side(cache_ptr, base, DATA: tl.constexpr, SCALE: tl.constexpr, x_ptr, signs_ptr, had_ptr,
                     D: tl.constexpr, HALF: tl.constexpr):
    """`encode_int4` for one head: rotate x [D] (y = H D x, as even and odd halves, so that pairs pack into bytes),
    find the asymmetric scale and zero point, fold the zero point into the scale's low mantissa bits, store."""
    i = tl.arange(0, D)
    j = tl.arange(0, HALF)
    xs = tl.load(x_ptr + i).to(tl.float32) * tl.load(signs_ptr + i)
    y0 = tl.sum(xs[:, None] * tl.load(had_ptr + i[:, None] * D + 2 * j[None, :]), axis=0)  # elements 2j
    y1 = tl.sum(xs[:, None] * tl.load(had_ptr + i[:, None] * D + 2 * j[None, :] + 1), axis=0)  # elements 2j + 1
    lo = tl.minimum(tl.min(y0, axis=0), tl.min(y1, axis=0))
    hi = tl.maximum(tl.max(y0, axis=0), tl.max(y1, axis=0))
    scale = tl.maximum((hi - lo) / 15.0, 1e-8)
    zp = tl.minimum(tl.maximum(round_half_even(-lo / scale), 0.0), 15.0)
    bits = (scale.to(tl.int32, bitcast=True) & -16) | zp.to(tl.int32)
    s = bits.to(tl.float32, bitcast=True)  # the scale the reader sees
    tl.store((cache_ptr + base + SCALE).to(tl.pointer_type(tl.int32)), bits)
    q0 = tl.minimum(tl.maximum(round_half_even(y0 / s + zp), 0.0), 15.0).to(tl.int32)
    q1 = tl.minimum(tl.maximum(round_half_even(y1 / s + zp), 0.0), 15.0).to(tl.int32)
    tl.store(cache_ptr + base + DATA + j, (q0 | (q1 << 4)).to(tl.uint8))


@triton.jit
def _int4_write_kernel(k_ptr, v_ptr, slots_ptr, cache_ptr, signs_ptr, had_ptr, stride_kt, stride_kh, stride_vt,
                       stride_vh, NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr, K_DATA: tl.constexpr,
                       K_SCALE: tl.constexpr, V_DATA: tl.constexpr, V_SCALE: tl.constexpr, D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    base = (tl.load(slots_ptr + t).to(tl.int64) * NUM_KV_HEADS + h) * SLOT
    _int4_store_side(cache_ptr, base, K_DATA, K_SCALE, k_ptr + t * stride_kt + h * stride_kh, signs_ptr, had_ptr,
                     D, D // 2)
    _int4_store_side(cache_ptr, base, V_DATA, V_SCALE, v_ptr + t * stride_vt + h * stride_vh, signs_ptr, had_ptr,
                     D, D // 2)


def reshape_and_cache_int4(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor) -> None:
    """`write_kv_int4` as a kernel, one program per token and KV head. The rotation sums in another order than
    torch's matmul, so a scale can differ in its last bits and a code by one step where a value sits on a rounding
    boundary."""
    tokens, kv_heads, d = k.shape
    assert d == layout.head_dim and cache.shape[2] == kv_heads and cache.shape[3] == layout.slot_bytes
    k, v = k.contiguous(), v.contiguous()
    _int4_write_kernel[(tokens, kv_heads)](
        k, v, slots.to(device=cache.device, dtype=torch.int64).contiguous(), cache, rht_signs(d, cache.device),
        hadamard(d, cache.device).contiguous(), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        NUM_KV_HEADS=kv_heads, SLOT=layout.slot_bytes, K_DATA=layout.k_data, K_SCALE=layout.k_scale,
        V_DATA=layout.v_data, V_SCALE=layout.v_scale, D=d,
    )


@triton.jit
def _scale_and_zero(cache_ptr, off, mask):
    bits = tl.load((cache_ptr + off).to(tl.pointer_type(tl.int32)), mask=mask, other=0)
    zp = (bits & 15).to(tl.float32)
    s = (bits & -16).to(tl.float32, bitcast=True)
    return s, zp


@triton.jit
def _int4_codes(cache_ptr, off, w, t_ok, N: tl.constexpr, D: tl.constexpr):
    """The codes of a side [N, D] as exact fp16 tensor-core operands, from 4-byte words (word w holds elements 8w + n
    in bits 4n..4n+3), two codes per 32-bit operation: column 8w + 2k + h of the tile holds element 8w + k + 4h, times
    16 where that element is odd (k odd). With 0x6400 set in each 16-bit half of the word (and of the word shifted
    right by 8), one mask (0x640F640F for the even elements, 0x64F064F0 for the odd) makes a column pair as the fp16
    values 1024 + c (or 1024 + 16c), from which 1024 is subtracted. No integer-to-float conversion, and no code is
    moved alone."""
    x = tl.load((cache_ptr + off[:, None]).to(tl.pointer_type(tl.int32)) + w[None, :], mask=t_ok[:, None], other=0)
    y = x | 0x64006400
    y8 = (x >> 8) | 0x64006400
    pairs = tl.join(tl.join(y & 0x640F640F, y8 & 0x640F640F), tl.join(y & 0x64F064F0, y8 & 0x64F064F0))
    halves = tl.join(pairs.to(tl.uint16), (pairs >> 16).to(tl.uint16)).to(tl.float16, bitcast=True)
    return tl.reshape(halves - 1024.0, (N, D))


@triton.jit
def _int4_column_element(i):
    """The element that column i of `_int4_codes`'s tile holds, and the factor (1, or 1/16 for the odd elements,
    which the tile holds 16 times larger) that brings a product with it back to code x query."""
    e = (i & -8) | ((i >> 1) & 3) | ((i & 1) << 2)
    return e, tl.where((e & 1) == 1, 1.0 / 16.0, 1.0)


@triton.jit
def _query_columns(q_ptr, seq, kv_head, group, stride_qs, stride_qh, e, factor, G_PAD: tl.constexpr):
    """The GQA group's queries [D, 2G] as `split_fp16` lays them out (column 2g + h part h of head g), row r
    element e[r] times `factor` [D] (query heads past the group are 0)."""
    c = tl.arange(0, 2 * G_PAD)
    q = tl.load(q_ptr + seq * stride_qs + (kv_head * group + c // 2)[None, :] * stride_qh + e[:, None],
                mask=(c // 2 < group)[None, :], other=0.0) * factor[:, None]
    hi = q.to(tl.float16)
    return tl.where((c % 2 == 0)[None, :], hi, (q - hi.to(tl.float32)).to(tl.float16))


@triton.jit
def _int4_decode_kernel(
    q_ptr, cache_ptr, block_table_ptr, lens_ptr, out_ptr, ml_ptr, sm_scale, max_blocks, group, split_len,
    stride_qs, stride_qh, stride_os, stride_oh,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr,
    K_DATA: tl.constexpr, K_SCALE: tl.constexpr, V_DATA: tl.constexpr, V_SCALE: tl.constexpr,
    HALF: tl.constexpr, G_PAD: tl.constexpr, TILE: tl.constexpr,
):
    seq, kv_head, split, row, heads, g_ok = program_coords(group, G_PAD)
    D: tl.constexpr = 2 * HALF
    i = tl.arange(0, D)
    w = tl.arange(0, D // 8)
    e, f = _int4_column_element(i)
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + i[None, :], mask=g_ok[:, None], other=0.0)
    q_sum = tl.sum(q, axis=1)  # for the zero-point correction
    # the query as the B operand [D, 2G] of K [TILE, D] x q^T (its rows in the tile's column order, the odd elements
    # divided by 16 as the tile's are 16 times theirs): the tile's tokens fill the M dimension
    q2 = _query_columns(q_ptr, seq, kv_head, group, stride_qs, stride_qh, e, f, G_PAD)
    lo, hi = split_bounds(split, split_len, tl.load(lens_ptr + seq))
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    # sum_t p_t s_t q_v,t transposed, rows in the tile's column order, [D, 2G] as the fp16 parts of p_t s_t (column
    # 2g + h the sum over part h of head g's)
    acc = tl.zeros([D, 2 * G_PAD], tl.float32)
    corr = tl.zeros([G_PAD], tl.float32)  # sum_t p_t s_t z_t
    for start in range(lo, hi, TILE):
        t = start + tl.arange(0, TILE)
        t_ok = t < hi
        slot = slot_offsets(block_table_ptr, seq, max_blocks, t, t_ok, kv_head, BLOCK_SIZE, NUM_KV_HEADS, SLOT)
        k = _int4_codes(cache_ptr, slot + K_DATA, w, t_ok, TILE, D)
        ks, kz = _scale_and_zero(cache_ptr, slot + K_SCALE, t_ok)
        # <codes, q'> on the tensor cores (fp32 accumulation) [TILE, G], then the scale and zero point per token
        raw = fold_pairs(tl.dot(k, q2))
        scores = (raw - kz[:, None] * q_sum[None, :]) * (ks[:, None] * sm_scale)
        scores = tl.where(t_ok[:, None], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v = _int4_codes(cache_ptr, slot + V_DATA, w, t_ok, TILE, D)
        vs, vz = _scale_and_zero(cache_ptr, slot + V_SCALE, t_ok)
        ps = p * vs[:, None]
        corr = corr * alpha + tl.sum(ps * vz[:, None], axis=0)
        alpha2 = tl.reshape(tl.join(alpha, alpha), (2 * G_PAD,))
        acc = tl.dot(tl.trans(v), split_fp16(ps), acc * alpha2[None, :])
        m_i = m_new
    l_safe = safe_sum(l_i)[None, :]
    o = (fold_pairs(acc) * f[:, None] - corr[None, :]) / l_safe
    tl.store(out_ptr + row * stride_os + heads[None, :] * stride_oh + e[:, None], o, mask=g_ok[None, :])
    store_split_stats(ml_ptr, row, heads, g_ok, group * NUM_KV_HEADS, m_i, l_i)


def paged_decode_int4(q: torch.Tensor, cache: torch.Tensor, layout: SlotLayout, block_table: torch.Tensor,
                      context_lens: torch.Tensor, tile: int = TILE, splits: int | None = None,
                      workspace: dict | None = None) -> torch.Tensor:
    seqs, heads, d = q.shape
    nb, bs, kv_heads, slot = cache.shape
    assert slot == layout.slot_bytes and d == layout.head_dim
    group = heads // kv_heads
    q_rot = rotate(q).contiguous()
    key = ("int4", q.device, layout.fmt.name, d, bs, kv_heads, heads // kv_heads, tile)  # its occupancy
    n_split, split_len, part, ml = split_buffers(q, kv_heads, block_table.shape[1] * bs, tile, splits, workspace,
                                                 torch.float32, blocks_per_sm=known_occupancy(key))
    compiled = _int4_decode_kernel[(seqs, kv_heads, n_split)](
        q_rot, cache, block_table, context_lens, part, ml, 1.0 / math.sqrt(d) / d, block_table.shape[1], group,
        split_len, q_rot.stride(0), q_rot.stride(1), part.stride(0), part.stride(1),
        BLOCK_SIZE=bs, NUM_KV_HEADS=kv_heads, SLOT=slot, K_DATA=layout.k_data, K_SCALE=layout.k_scale,
        V_DATA=layout.v_data, V_SCALE=layout.v_scale, HALF=d // 2, G_PAD=max(8, triton.next_power_of_2(group)),
        TILE=tile,
    )
    remember_occupancy(key, compiled, q.device)
    return unrotate(combine_splits(part, ml, seqs, n_split, torch.float32, workspace)).to(q.dtype)


def dequantize_cache_int4(cache: torch.Tensor, layout: SlotLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V in the original (unrotated) basis, fp32: what the attention sees."""
    half = layout.head_dim // 2
    out = []
    for data_off, scale_off in ((layout.k_data, layout.k_scale), (layout.v_data, layout.v_scale)):
        y = decode_int4(cache[..., data_off:data_off + half], cache[..., scale_off:scale_off + 4])
        out.append(unrotate(y))
    return out[0], out[1]
