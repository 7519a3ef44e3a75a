"""Paged decode attention over TurboQuant caches (vLLM's turboquant_k8v4, _4bit_nc, _k3v4_nc, _3bit_nc presets).

A slot holds K then V. Keys (3 or 4 bits): the key's norm as fp16, and its direction rotated by the orthonormal
Hadamard matrix H/sqrt(d) (no random signs), each coordinate coded as the nearest Lloyd-Max centroid for the
N(0, 1/d) a rotated unit vector's coordinates follow; codes are packed little-endian, b bits each. With norm
correction the decoded direction is renormalized before the norm multiplies it. turboquant_k8v4 keys are plain fp8.
Values: b-bit uniform codes with an fp16 scale and fp16 zero per token per head, v ~ scale x code + zero.
Because H is symmetric and orthonormal, <q, H c / sqrt(d)> = <H q / sqrt(d), c>: the kernel rotates the query once
and scores straight against the centroids.

The decode kernel works on the tensor cores, 128 tokens a step. Each pair of neighbouring codes indexes a small
table (`pair_tables`) whose entry is the pair already as two fp16 numbers: the two centroids (and, for the norm
correction, their squares), or the two value codes. The key operand [tokens, d] multiplies the query, split into
fp16 hi and lo parts side by side [d, 2 x heads]; the squares multiply ones, which sums them per token; the value
codes, transposed, multiply p x scale (hi and lo side by side), and the zeros add sum_t p_t zero_t per head.
fp8 keys become fp16 exactly. The centroids are held at a scale (`table_scale`) at which they and their squares
round to fp16 by at most 1.7e-4 of themselves.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import triton
import triton.language as tl

from .common import (
    combine_splits,
    e4m3_byte,
    fold_pairs,
    known_occupancy,
    pack_codes,
    program_coords,
    remember_occupancy,
    safe_sum,
    slot_offsets,
    split_bounds,
    split_buffers,
    split_fp16,
    store_split_stats,
    uniform_codes,
    uniform_scale_zero,
)
from .int4_attention import hadamard
from .layouts import SlotLayout


@lru_cache(maxsize=None)
def lloyd_max_centroids(bits: int, d: int, iters: int = 300) -> tuple[float, ...]:
    """Centroids of the optimal 2^bits-level scalar quantizer for N(0, 1/d) (Lloyd's conditions: each boundary the
    midpoint of its centroids, each centroid the conditional mean of its cell)."""
    n = 2**bits
    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    c = [(-1 + (2 * i + 1) / n) * 2.5 for i in range(n)]  # for N(0, 1), scaled at the end
    for _ in range(iters):
        edges = [-math.inf] + [(a + b) / 2 for a, b in zip(c, c[1:], strict=False)] + [math.inf]
        new = []
        for a, b in zip(edges, edges[1:], strict=False):
            mass = cdf(b) - cdf(a)
            pa = 0.0 if math.isinf(a) else phi(a)
            pb = 0.0 if math.isinf(b) else phi(b)
            new.append((pa - pb) / mass)
        c = new
    return tuple(x / math.sqrt(d) for x in c)


@lru_cache(maxsize=None)
def boundary_table(bits: int, d: int, device: torch.device) -> torch.Tensor:
    """The cell boundaries between neighbouring centroids, ascending, padded to a power of two with +inf, as a
    float32 tensor on `device`, built once (read-only)."""
    cent = lloyd_max_centroids(bits, d)
    mids = [(a + b) / 2 for a, b in zip(cent, cent[1:], strict=False)] + [math.inf]
    return torch.tensor(mids, dtype=torch.float32).to(device)


def _params(layout: SlotLayout) -> tuple[int, int, bool]:
    p = layout.fmt.params
    return p["key_bits"], p["value_bits"], p["norm_correction"]


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., n] codes < 2^bits -> [..., ceil(n bits / 8)] bytes, little-endian bit stream."""
    n = codes.shape[-1]
    nbytes = (n * bits + 7) // 8
    out = torch.zeros(*codes.shape[:-1], nbytes + 1, dtype=torch.int32, device=codes.device)
    for i in range(n):
        bit = i * bits
        val = codes[..., i].to(torch.int32) << (bit % 8)
        out[..., bit // 8] |= val & 0xFF
        out[..., bit // 8 + 1] |= val >> 8
    return out[..., :nbytes].to(torch.uint8)


def _unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    b = torch.nn.functional.pad(packed.to(torch.int32), (0, 1))
    i = torch.arange(n, device=packed.device)
    word = b[..., (i * bits) // 8] | (b[..., (i * bits) // 8 + 1] << 8)
    return (word >> ((i * bits) % 8)) & (2**bits - 1)


def _rot(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    return x.float() @ hadamard(d, x.device) / math.sqrt(d)


def encode_keys(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1]
    norm = x.float().norm(dim=-1, keepdim=True)
    y = _rot(x.float() / norm.clamp_min(1e-12))
    cent = torch.tensor(lloyd_max_centroids(bits, d), device=x.device)
    codes = (y.unsqueeze(-1) - cent).abs().argmin(-1)
    return _pack(codes, bits), norm.to(torch.float16).view(torch.uint8)


def decode_keys(packed: torch.Tensor, norm_bytes: torch.Tensor, bits: int, d: int, correct: bool) -> torch.Tensor:
    cent = torch.tensor(lloyd_max_centroids(bits, d), device=packed.device)
    y = cent[_unpack(packed, bits, d)]
    u = _rot(y)  # H is symmetric: the same rotation undoes itself
    if correct:
        u = u / u.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return u * norm_bytes.contiguous().view(torch.float16).float()


def encode_values(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi = x.float().amin(-1, keepdim=True), x.float().amax(-1, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).to(torch.float16).float().clamp_min(1e-6)
    zero = lo.to(torch.float16).float()
    codes = torch.round((x.float() - zero) / scale).clamp(0, 2**bits - 1)
    meta = torch.cat([scale.to(torch.float16), zero.to(torch.float16)], -1).contiguous().view(torch.uint8)
    return _pack(codes, bits), meta


def decode_values(packed: torch.Tensor, meta: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    sz = meta.contiguous().view(torch.float16).float()
    return _unpack(packed, bits, d).float() * sz[..., :1] + sz[..., 1:2]


def write_kv_turboquant(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor) -> None:
    nb, bs, h, slot = cache.shape
    flat = cache.view(nb * bs, h, slot)
    kb, vb, _ = _params(layout)
    if kb == 8:
        kdata = k.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        flat[slots, :, layout.k_data:layout.k_data + kdata.shape[-1]] = kdata
    else:
        packed, norm = encode_keys(k, kb)
        flat[slots, :, layout.k_data:layout.k_data + packed.shape[-1]] = packed
        flat[slots, :, layout.k_scale:layout.k_scale + 2] = norm
    packed, meta = encode_values(v, vb)
    flat[slots, :, layout.v_data:layout.v_data + packed.shape[-1]] = packed
    flat[slots, :, layout.v_scale:layout.v_scale + 4] = meta


@triton.jit
def _tq_store_values(cache_ptr, base, V_DATA: tl.constexpr, V_META: tl.constexpr, x, D: tl.constexpr,
                     BITS: tl.constexpr, NB_PAD: tl.constexpr):
    """`encode_values` for one head: uniform asymmetric codes, the fp16 scale and zero after them."""
    scale, zero = uniform_scale_zero(tl.min(x, axis=0), tl.max(x, axis=0), BITS)
    codes = uniform_codes(x, scale, zero, BITS)
    j = tl.arange(0, NB_PAD)
    tl.store(cache_ptr + base + V_DATA + j, pack_codes(codes, BITS, D, NB_PAD).to(tl.uint8),
             mask=j < (D * BITS + 7) // 8)
    meta = (cache_ptr + base + V_META).to(tl.pointer_type(tl.float16))
    tl.store(meta, scale.to(tl.float16))
    tl.store(meta + 1, zero.to(tl.float16))


@triton.jit
def _tq_write_kernel(k_ptr, v_ptr, slots_ptr, cache_ptr, had_ptr, mid_ptr, stride_kt, stride_kh, stride_vt,
                     stride_vh, NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr, K_DATA: tl.constexpr,
                     K_NORM: tl.constexpr, V_DATA: tl.constexpr, V_META: tl.constexpr, D: tl.constexpr,
                     K_BITS: tl.constexpr, V_BITS: tl.constexpr, N_MID: tl.constexpr, NB_PAD: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    base = (tl.load(slots_ptr + t).to(tl.int64) * NUM_KV_HEADS + h) * SLOT
    i = tl.arange(0, D)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + i).to(tl.float32)
    if K_BITS == 8:  # fp8 e4m3 keys, rounded to nearest with saturation at 448, the sign from the sign bit
        byte = e4m3_byte(tl.minimum(tl.abs(k), 448.0)) | (((k.to(tl.int32, bitcast=True) >> 31) & 1) << 7)
        tl.store(cache_ptr + base + K_DATA + i, byte.to(tl.uint8))
    else:  # the norm as fp16, the rotated direction coded as its nearest Lloyd-Max centroid
        norm = tl.sqrt(tl.sum(k * k, axis=0))
        u = k / tl.maximum(norm, 1e-12)
        y = tl.sum(u[:, None] * tl.load(had_ptr + i[:, None] * D + i[None, :]), axis=0) / tl.sqrt(D * 1.0)
        m = tl.arange(0, N_MID)
        mids = tl.load(mid_ptr + m)  # the cell boundaries, ascending; a tie goes to the lower centroid
        codes = tl.sum((y[:, None] > mids[None, :]).to(tl.int32), axis=1)
        j = tl.arange(0, NB_PAD)
        tl.store(cache_ptr + base + K_DATA + j, pack_codes(codes, K_BITS, D, NB_PAD).to(tl.uint8),
                 mask=j < (D * K_BITS + 7) // 8)
        tl.store((cache_ptr + base + K_NORM).to(tl.pointer_type(tl.float16)), norm.to(tl.float16))
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + i).to(tl.float32)
    _tq_store_values(cache_ptr, base, V_DATA, V_META, v, D, V_BITS, NB_PAD)


def reshape_and_cache_turboquant(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor,
                                 v: torch.Tensor) -> None:
    """`write_kv_turboquant` as a kernel, one program per token and KV head. The rotation and the norm sum in
    another order than torch, so a coordinate that sits on a cell boundary can take the neighbouring centroid."""
    tokens, kv_heads, d = k.shape
    assert d == layout.head_dim and cache.shape[3] == layout.slot_bytes and d & (d - 1) == 0
    kb, vb, _ = _params(layout)
    mids = boundary_table(kb if kb != 8 else 4, d, torch.device(cache.device))
    k, v = k.contiguous(), v.contiguous()
    _tq_write_kernel[(tokens, kv_heads)](
        k, v, slots.to(device=cache.device, dtype=torch.int64).contiguous(), cache, hadamard(d, cache.device),
        mids, k.stride(0), k.stride(1), v.stride(0), v.stride(1), NUM_KV_HEADS=kv_heads, SLOT=layout.slot_bytes,
        K_DATA=layout.k_data, K_NORM=max(layout.k_scale, 0), V_DATA=layout.v_data, V_META=layout.v_scale, D=d,
        K_BITS=kb, V_BITS=vb, N_MID=mids.numel(), NB_PAD=triton.next_power_of_2((d * max(b for b in (kb, vb) if b != 8) + 7) // 8),
    )


def dequantize_cache_turboquant(cache: torch.Tensor, layout: SlotLayout) -> tuple[torch.Tensor, torch.Tensor]:
    kb, vb, nc = _params(layout)
    d = layout.head_dim
    if kb == 8:
        k = cache[..., layout.k_data:layout.k_data + d].contiguous().view(torch.float8_e4m3fn).float()
    else:
        kbytes = (d * kb + 7) // 8
        k = decode_keys(cache[..., layout.k_data:layout.k_data + kbytes], cache[..., layout.k_scale:layout.k_scale + 2],
                        kb, d, nc)
    vbytes = (d * vb + 7) // 8
    v = decode_values(cache[..., layout.v_data:layout.v_data + vbytes], cache[..., layout.v_scale:layout.v_scale + 4],
                      vb, d)
    return k, v


TILE = 128  # tokens a decode program reads per step (the M of its tensor-core products)


@lru_cache(maxsize=None)
def table_scale(bits: int) -> float:
    """The factor s, between 4 and 8 over the largest magnitude, that brings the Lloyd-Max centroids of N(0, 1)
    times s, and the squares of those fp16 values, closest to fp16 numbers (the largest relative rounding error of
    either, smallest): the key table holds the centroids at this scale, which the norm correction cancels."""
    m = torch.tensor(lloyd_max_centroids(bits, 1), dtype=torch.float64).abs().unique()
    s = torch.linspace(4, 8, 400001, dtype=torch.float64)[:, None] / m.max()
    v = (s * m).to(torch.float16).double()
    err = torch.maximum(((v - s * m) / (s * m)).abs().amax(1),
                        ((v * v).to(torch.float16).double() / (v * v) - 1).abs().amax(1))
    return float(s[int(err.argmin()), 0])


@lru_cache(maxsize=None)
def pair_tables(key_bits: int, value_bits: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Lookup tables indexed by two neighbouring codes at once (element 2i's code in the low bits, 2i+1's above it),
    built once per layout and device (read-only), each entry an fp16 pair in an int32 word:
      keys, int32 [2, 4^b]: the two Lloyd-Max centroids times sqrt(d) x `table_scale`, then the squares of those
        fp16 values (for the norm correction);
      values, int32 [4^b]: the two codes themselves (exact).
    fp8 keys (key_bits 8) use no key table; a placeholder of two entries is returned for them."""
    if key_bits == 8:
        keys = torch.zeros(4, dtype=torch.int32)
    else:
        n = 1 << key_bits
        scale = math.sqrt(d) * table_scale(key_bits)
        cent = torch.tensor(lloyd_max_centroids(key_bits, d), dtype=torch.float64) * scale
        p = torch.arange(n * n)
        pair = torch.stack([cent[p % n], cent[p // n]], -1).to(torch.float16)
        keys = torch.cat([pair, (pair.double() ** 2).to(torch.float16)]).contiguous().view(torch.int32)[:, 0]
    m = 1 << value_bits
    p = torch.arange(m * m)
    values = torch.stack([p % m, p // m], -1).to(torch.float16).contiguous().view(torch.int32)[:, 0]
    return keys.contiguous().to(device), values.contiguous().to(device)


@triton.jit
def _pair_codes(cache_ptr, base, D: tl.constexpr, BITS: tl.constexpr):
    """The codes of one side of each token, two at a time: [N, D/2] int32 indices (element 2i's b-bit code in the low
    bits, 2i+1's above it) from the little-endian bit stream at byte offsets `base` [N]. 4 bits: one byte per pair.
    3 bits: 16 codes in each run of three 16-bit words (slots are 2-byte aligned), eight 6-bit pairs."""
    if BITS == 4:
        j = tl.arange(0, D // 2)
        return tl.load(cache_ptr + base[:, None] + j[None, :]).to(tl.int32)
    else:
        a = tl.arange(0, D // 16)
        words = (cache_ptr + base[:, None] + 6 * a[None, :]).to(tl.pointer_type(tl.uint16))
        w0 = tl.load(words).to(tl.uint32)
        w1 = tl.load(words + 1).to(tl.uint32)
        w2 = tl.load(words + 2).to(tl.uint32)
        lo = w0 | (w1 << 16)  # bits 0-31 of the run: pairs 0-4
        hi = (lo >> 30) | (w2 << 2)  # bits 30-47: pairs 5-7
        # pair j at bit 6j; joined so that the pairs come out in order 0..7
        even = tl.join(tl.join(lo & 63, (lo >> 24) & 63), tl.join((lo >> 12) & 63, (hi >> 6) & 63))
        odd = tl.join(tl.join((lo >> 6) & 63, hi & 63), tl.join((lo >> 18) & 63, hi >> 12))
        return tl.reshape(tl.join(even, odd), [base.shape[0], D // 2]).to(tl.int32)


@triton.jit
def _fp16_pairs(bits, N: tl.constexpr, D: tl.constexpr):
    """int32 [N, D/2], each two fp16 (element 2i in the low half) -> fp16 [N, D]: each word's halves taken apart
    element by element (the compiler turns the shift and the two bitcasts into register moves)."""
    lo = bits.to(tl.int16).to(tl.float16, bitcast=True)
    hi = (bits >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return tl.reshape(tl.join(lo, hi), [N, D])


@triton.jit
def _tq_decode_kernel(
    q_ptr, cache_ptr, block_table_ptr, lens_ptr, out_ptr, ml_ptr, key_table_ptr, value_table_ptr, key_unscale,
    sm_scale, max_blocks, group, split_len, stride_qs, stride_qh, stride_os, stride_oh,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr,
    K_DATA: tl.constexpr, K_NORM: tl.constexpr, V_DATA: tl.constexpr, V_META: tl.constexpr,
    D: tl.constexpr, K_BITS: tl.constexpr, V_BITS: tl.constexpr, NORM_CORRECTION: tl.constexpr,
    G_PAD: tl.constexpr, TILE: tl.constexpr, KEY_ROWS: tl.constexpr,
):
    seq, kv_head, split, row, heads, g_ok = program_coords(group, G_PAD)
    d_offs = tl.arange(0, D)
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d_offs[None, :], mask=g_ok[:, None],
                other=0.0).to(tl.float32)
    # the query as the B operand [D, 2G] of K [TILE, D] x q^T, each head's fp16 hi and lo parts side by side
    # (columns 2g and 2g + 1): the tile's tokens fill the M dimension, one product gives both parts
    q_b = split_fp16(tl.trans(q))
    ones = tl.full([D, 2 * G_PAD], 1.0, tl.float16)
    lo, hi = split_bounds(split, split_len, tl.load(lens_ptr + seq))
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([D, 2 * G_PAD], tl.float32)  # the output transposed, [D, 2G]: per head a hi and a lo part
    key_rows = tl.load(key_table_ptr + tl.arange(0, KEY_ROWS))
    key_squares = tl.load(key_table_ptr + KEY_ROWS + tl.arange(0, KEY_ROWS))
    value_rows = tl.load(value_table_ptr + tl.arange(0, 1 << (2 * V_BITS)))
    for start in range(lo, hi, TILE):
        t = start + tl.arange(0, TILE)
        t_ok = t < hi
        slot = slot_offsets(block_table_ptr, seq, max_blocks, t, t_ok, kv_head, BLOCK_SIZE, NUM_KV_HEADS, SLOT)
        # the tile's values are loaded first, so that their loads are in flight with the keys' while the scores are
        # computed
        vpairs = _pair_codes(cache_ptr, slot + V_DATA, D, V_BITS)
        meta = (cache_ptr + slot + V_META).to(tl.pointer_type(tl.float16))
        vscale = tl.where(t_ok, tl.load(meta).to(tl.float32), 0.0)  # a token past the end weighs 0, whatever it holds
        vzero = tl.where(t_ok, tl.load(meta + 1).to(tl.float32), 0.0)
        if K_BITS == 8:  # fp8 keys (exact in fp16), q not rotated
            raw = tl.load(cache_ptr + slot[:, None] + K_DATA + d_offs[None, :])
            k = raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
            scores = fold_pairs(tl.dot(k, q_b))
        else:  # q arrives rotated: score against the centroids, then the stored norm (over the decoded length)
            pairs = _pair_codes(cache_ptr, slot + K_DATA, D, K_BITS)
            flat = tl.reshape(pairs, [TILE * D // 2])
            c = _fp16_pairs(tl.reshape(tl.gather(key_rows, flat, 0), [TILE, D // 2]), TILE, D)
            scores = fold_pairs(tl.dot(c, q_b))
            norm = tl.load((cache_ptr + slot + K_NORM).to(tl.pointer_type(tl.float16))).to(tl.float32)
            if NORM_CORRECTION:  # sum c^2 on the tensor cores too, in every column (so twice it per head)
                c2 = _fp16_pairs(tl.reshape(tl.gather(key_squares, flat, 0), [TILE, D // 2]), TILE, D)
                sq = fold_pairs(tl.dot(c2, ones))
                scores = scores * (norm[:, None] / tl.sqrt(0.5 * sq))
            else:
                scores = scores * (norm * key_unscale)[:, None]  # the table's centroids are scaled
        scores = tl.where(t_ok[:, None], scores * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        # sum_t p_t (s_t code_t + z_t): the codes on the tensor cores against p s (hi and lo parts side by side),
        # the zeros per head (added to the hi column)
        vrow = tl.reshape(tl.gather(value_rows, tl.reshape(vpairs, [TILE * D // 2]), 0), [TILE, D // 2])
        zero_part = tl.sum(p * vzero[:, None], axis=0)
        acc = (acc * tl.reshape(tl.join(alpha, alpha), [2 * G_PAD])[None, :]
               + tl.reshape(tl.join(zero_part, tl.zeros_like(zero_part)), [2 * G_PAD])[None, :])
        acc = tl.dot(tl.trans(_fp16_pairs(vrow, TILE, D)), split_fp16(p * vscale[:, None]), acc)
        m_i = m_new
    out = tl.trans(fold_pairs(acc)) / safe_sum(l_i)[:, None]
    tl.store(out_ptr + row * stride_os + heads[:, None] * stride_oh + d_offs[None, :], out, mask=g_ok[:, None])
    store_split_stats(ml_ptr, row, heads, g_ok, group * NUM_KV_HEADS, m_i, l_i)


def paged_decode_turboquant(q: torch.Tensor, cache: torch.Tensor, layout: SlotLayout, block_table: torch.Tensor,
                            context_lens: torch.Tensor, tile: int | None = None, splits: int | None = None,
                            workspace: dict | None = None) -> torch.Tensor:
    """Attention of q [seqs, heads, d] over a TurboQuant cache. `tile`: tokens a program takes at a time (a power of
    two, 16 at least; by default 128 up to head_dim 128 and 128 x 128 / head_dim above it, which keeps a tile's
    operands in registers)."""
    seqs, heads, d = q.shape
    nb, bs, kv_heads, slot = cache.shape
    tile = tile or (TILE if d <= 128 else max(16, TILE * 128 // d))
    assert slot == layout.slot_bytes and d == layout.head_dim
    kb, vb, nc = _params(layout)
    q_in = (q.float() if kb == 8 else _rot(q)).contiguous()
    keys, values = pair_tables(kb, vb, d, torch.device(q.device))
    unscale = 1.0 if kb == 8 else 1.0 / (math.sqrt(d) * table_scale(kb))
    key = ("turboquant", q.device, layout.fmt.name, d, bs, kv_heads, heads // kv_heads, tile)  # its occupancy
    n_split, split_len, part, ml = split_buffers(q, kv_heads, block_table.shape[1] * bs, tile, splits, workspace,
                                                 q.dtype, blocks_per_sm=known_occupancy(key))
    compiled = _tq_decode_kernel[(seqs, kv_heads, n_split)](
        q_in, cache, block_table, context_lens, part, ml, keys, values, unscale, 1.0 / math.sqrt(d),
        block_table.shape[1], heads // kv_heads, split_len, q_in.stride(0), q_in.stride(1), part.stride(0),
        part.stride(1),
        BLOCK_SIZE=bs, NUM_KV_HEADS=kv_heads, SLOT=slot, K_DATA=layout.k_data, K_NORM=max(layout.k_scale, 0),
        V_DATA=layout.v_data, V_META=layout.v_scale, D=d, K_BITS=kb, V_BITS=vb, NORM_CORRECTION=nc,
        G_PAD=max(4, triton.next_power_of_2(heads // kv_heads)), TILE=tile, KEY_ROWS=keys.shape[0] // 2,
    )
    remember_occupancy(key, compiled, q.device)
    return combine_splits(part, ml, seqs, n_split, q.dtype, workspace)
