"""Paged decode attention over KIVI caches (arXiv:2402.02750): keys quantized per channel over groups of G
consecutive tokens, values per token over groups of G channels, b-bit codes with fp16 scale and zero, and the
newest tokens kept in full precision.

Slot layout (the catalog's kivi2 / kivi4): K codes (d x b bits), then this token's share of its token group's
per-channel fp16 scales and zeros (d / G channels each: token r of a group holds channels [r d/G, (r+1) d/G)), then
V codes and V's fp16 scales and zeros per G channels. A sequence's first floor((n - R) / G) x G tokens are in the
paged cache; the rest (fewer than R + G) wait in a full-precision residual buffer [seqs, R + G, kv_heads, d], and
move into the cache a whole group at a time.

The decode kernel takes one token group a step and never rebuilds a key or a value. Its codes, read 16 bytes at a
time, become fp16 in registers (the integers 0..15 are exact) and meet the query and the probabilities on the tensor
cores:
  q . k_t = sum_c (q_c s_c) code_tc + sum_c q_c z_c        keys: the group's per-channel scale folds into the query,
                                                           the zeros add one q . z per group;
  sum_t p_t v_tc = sum_t (p_t s_tj) code_tc + sum_t p_t z_tj   values: each token's scale for channel group j folds
                                                           into its probability, the zeros add once per group.
The scaled query and probabilities are split into fp16 hi and lo halves that sit side by side in the N of one
product, which keeps the sums close to fp32. The residual window takes the same products, its fp32 keys and values
split the same way.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import (
    combine_splits,
    fold_pairs,
    known_occupancy,
    pack_codes,
    program_coords,
    remember_occupancy,
    safe_sum,
    split_bounds,
    split_buffers,
    split_fp16,
    store_split_stats,
    uniform_codes,
    uniform_scale_zero,
)
from .layouts import SlotLayout
from .turboquant_attention import _pack, _unpack


def _params(layout: SlotLayout) -> tuple[int, int, int]:
    p = layout.fmt.params
    return p["bits"], p["group"], p["residual"]


def quantized_len(n: int, group: int, residual: int) -> int:
    """Tokens of a sequence of n that sit quantized in the cache; the rest are in the residual buffer."""
    return max(0, (n - residual) // group) * group


def _offsets(layout: SlotLayout) -> dict[str, int]:
    bits, g, _ = _params(layout)
    d = layout.head_dim
    codes, share, vmeta = d * bits // 8, d // g * 2, -(-d // g) * 2
    return {"k_codes": 0, "k_scale": codes, "k_zero": codes + share, "v_codes": codes + 2 * share,
            "v_scale": 2 * codes + 2 * share, "v_zero": 2 * codes + 2 * share + vmeta, "codes": codes,
            "share": share, "vmeta": vmeta}


def encode_group(k: torch.Tensor, v: torch.Tensor, layout: SlotLayout) -> torch.Tensor:
    """One token group: K and V [G, kv_heads, d] -> slot bytes [G, kv_heads, slot]."""
    bits, g, _ = _params(layout)
    d = layout.head_dim
    levels = 2**bits - 1
    o = _offsets(layout)
    # keys: per channel over the group's tokens
    lo, hi = k.float().amin(0, keepdim=True), k.float().amax(0, keepdim=True)  # [1, h, d]
    ks = ((hi - lo) / levels).to(torch.float16).float().clamp_min(1e-6)
    kz = lo.to(torch.float16).float()
    kq = torch.round((k.float() - kz) / ks).clamp(0, levels)
    # values: per token over groups of g channels
    vg = v.float().unflatten(-1, (-1, g))  # [G, h, d/g, g]
    vlo, vhi = vg.amin(-1, keepdim=True), vg.amax(-1, keepdim=True)
    vs = ((vhi - vlo) / levels).to(torch.float16).float().clamp_min(1e-6)
    vz = vlo.to(torch.float16).float()
    vq = torch.round((vg - vz) / vs).clamp(0, levels).flatten(-2)
    out = torch.zeros(g, k.shape[1], layout.slot_bytes, dtype=torch.uint8, device=k.device)
    out[..., : o["codes"]] = _pack(kq.to(torch.int32), bits)
    per = d // g  # channels whose scale and zero token r carries
    ks16 = ks.to(torch.float16).squeeze(0).unflatten(-1, (g, per))  # [h, G, per]
    kz16 = kz.to(torch.float16).squeeze(0).unflatten(-1, (g, per))
    out[..., o["k_scale"]:o["k_zero"]] = ks16.permute(1, 0, 2).contiguous().view(torch.uint8)
    out[..., o["k_zero"]:o["v_codes"]] = kz16.permute(1, 0, 2).contiguous().view(torch.uint8)
    out[..., o["v_codes"]:o["v_scale"]] = _pack(vq.to(torch.int32), bits)
    out[..., o["v_scale"]:o["v_zero"]] = vs.squeeze(-1).to(torch.float16).contiguous().view(torch.uint8)
    out[..., o["v_zero"]:] = vz.squeeze(-1).to(torch.float16).contiguous().view(torch.uint8)
    return out


def decode_group(slots: torch.Tensor, layout: SlotLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot bytes [G, kv_heads, slot] of one token group -> K, V [G, kv_heads, d] in fp32."""
    bits, g, _ = _params(layout)
    d = layout.head_dim
    o = _offsets(layout)
    ks = slots[..., o["k_scale"]:o["k_zero"]].contiguous().view(torch.float16).float()  # [G, h, per]
    kz = slots[..., o["k_zero"]:o["v_codes"]].contiguous().view(torch.float16).float()
    ks = ks.permute(1, 0, 2).flatten(-2)  # [h, d]
    kz = kz.permute(1, 0, 2).flatten(-2)
    k = _unpack(slots[..., : o["codes"]], bits, d).float() * ks + kz
    vs = slots[..., o["v_scale"]:o["v_zero"]].contiguous().view(torch.float16).float()  # [G, h, d/g]
    vz = slots[..., o["v_zero"]:].contiguous().view(torch.float16).float()
    vq = _unpack(slots[..., o["v_codes"]:o["v_scale"]], bits, d).float().unflatten(-1, (-1, g))
    v = (vq * vs.unsqueeze(-1) + vz.unsqueeze(-1)).flatten(-2)
    return k, v


def write_sequence(cache: torch.Tensor, residual: torch.Tensor, layout: SlotLayout, table_row: torch.Tensor,
                   seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store a sequence's K and V [n, kv_heads, d]: whole groups into the cache, the rest into the residual."""
    bits, g, r = _params(layout)
    nb, bs, h, slot = cache.shape
    flat = cache.view(nb * bs, h, slot)
    n = k.shape[0]
    nq = quantized_len(n, g, r)
    for start in range(0, nq, g):
        pos = torch.arange(start, start + g)
        flat[table_row[pos // bs].long() * bs + pos % bs] = encode_group(k[start:start + g], v[start:start + g],
                                                                          layout)
    residual[seq, : n - nq, :, 0] = k[nq:].to(residual.dtype)
    residual[seq, : n - nq, :, 1] = v[nq:].to(residual.dtype)


@triton.jit
def _kivi_write_kernel(k_ptr, v_ptr, slots_ptr, cache_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
                       NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr,
                       G: tl.constexpr, K_SCALE: tl.constexpr, K_ZERO: tl.constexpr, V_CODES: tl.constexpr,
                       V_SCALE: tl.constexpr, V_ZERO: tl.constexpr, NB_PAD: tl.constexpr):
    """`encode_group` for one token of a group and one KV head: its key codes against the group's per-channel
    scales and zeros (and its share of them), its value codes, scales and zeros per G channels."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    r = t % G  # this token's place in its group
    base = (tl.load(slots_ptr + t).to(tl.int64) * NUM_KV_HEADS + h) * SLOT
    c = tl.arange(0, D)
    rows = (t - r) + tl.arange(0, G)
    kg = tl.load(k_ptr + rows[:, None] * stride_kt + h * stride_kh + c[None, :]).to(tl.float32)  # the group [G, D]
    ks, kz = uniform_scale_zero(tl.min(kg, axis=0), tl.max(kg, axis=0), BITS)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + c).to(tl.float32)
    kq = uniform_codes(k, ks, kz, BITS)
    j = tl.arange(0, NB_PAD)
    nbytes: tl.constexpr = D * BITS // 8
    tl.store(cache_ptr + base + j, pack_codes(kq, BITS, D, NB_PAD).to(tl.uint8), mask=j < nbytes)
    per: tl.constexpr = D // G  # token r carries the scales and zeros of channels [r per, (r + 1) per)
    mine = (c >= r * per) & (c < (r + 1) * per)
    tl.store((cache_ptr + base + K_SCALE).to(tl.pointer_type(tl.float16)) + (c - r * per), ks.to(tl.float16),
             mask=mine)
    tl.store((cache_ptr + base + K_ZERO).to(tl.pointer_type(tl.float16)) + (c - r * per), kz.to(tl.float16),
             mask=mine)
    # values: this token's channels in groups of G, as [D / G, G]
    NV: tl.constexpr = D // G
    vg = tl.load(v_ptr + t * stride_vt + h * stride_vh + tl.arange(0, NV)[:, None] * G
                 + tl.arange(0, G)[None, :]).to(tl.float32)
    vs, vz = uniform_scale_zero(tl.min(vg, axis=1), tl.max(vg, axis=1), BITS)
    vq = uniform_codes(vg, vs[:, None], vz[:, None], BITS)
    tl.store(cache_ptr + base + V_CODES + j, pack_codes(tl.reshape(vq, [D]), BITS, D, NB_PAD).to(tl.uint8),
             mask=j < nbytes)
    g_idx = tl.arange(0, NV)
    tl.store((cache_ptr + base + V_SCALE).to(tl.pointer_type(tl.float16)) + g_idx, vs.to(tl.float16))
    tl.store((cache_ptr + base + V_ZERO).to(tl.pointer_type(tl.float16)) + g_idx, vz.to(tl.float16))


def reshape_and_cache_kivi(cache: torch.Tensor, layout: SlotLayout, slots: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor) -> None:
    """`encode_group` as a kernel: K and V [groups x G, kv_heads, d], whole token groups in order, stored at
    `slots` (one program per token and KV head). Each program reads its whole group for the key statistics."""
    bits, g, _ = _params(layout)
    tokens, kv_heads, d = k.shape
    assert d == layout.head_dim and cache.shape[3] == layout.slot_bytes and tokens % g == 0
    assert d % g == 0 and (d // g) & (d // g - 1) == 0, "head_dim / group must be a power of two"
    o = _offsets(layout)
    k, v = k.contiguous(), v.contiguous()
    _kivi_write_kernel[(tokens, kv_heads)](
        k, v, slots.to(device=cache.device, dtype=torch.int64).contiguous(), cache, k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), NUM_KV_HEADS=kv_heads, SLOT=layout.slot_bytes, D=d, BITS=bits, G=g,
        K_SCALE=o["k_scale"], K_ZERO=o["k_zero"], V_CODES=o["v_codes"], V_SCALE=o["v_scale"], V_ZERO=o["v_zero"],
        NB_PAD=triton.next_power_of_2(d * bits // 8),
    )


@triton.jit
def _codes_f16(b, K: tl.constexpr, BITS: tl.constexpr, PORTABLE: tl.constexpr):
    """Code K of each byte of `b` (uint8; the code at bits [K BITS, (K + 1) BITS)) as an fp16 value: four bytes at
    a time, one shift and one mask leave the four codes in the low bits of their bytes, a byte permute makes each
    the low byte of the fp16 1024 + code, and 1024 is subtracted from two at once (exact). `PORTABLE`: by Triton's
    own integer and bitcast operations, which the interpreter runs."""
    if PORTABLE:
        c = ((b.to(tl.int16) >> (K * BITS)) & ((1 << BITS) - 1)) | 0x6400
        return c.to(tl.float16, bitcast=True) - 1024.0
    elif BITS == 2:
        if K == 0:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 x, m; mov.b32 m, 0x64006400; and.b32 x, $2, 0x03030303; "
                "prmt.b32 $0, x, 0x64646464, 0x5150; prmt.b32 $1, x, 0x64646464, 0x5352; "
                "sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
                "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)
        elif K == 1:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 x, m; mov.b32 m, 0x64006400; shr.b32 x, $2, 2; and.b32 x, x, 0x03030303; "
                "prmt.b32 $0, x, 0x64646464, 0x5150; prmt.b32 $1, x, 0x64646464, 0x5352; "
                "sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
                "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)
        elif K == 2:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 x, m; mov.b32 m, 0x64006400; shr.b32 x, $2, 4; and.b32 x, x, 0x03030303; "
                "prmt.b32 $0, x, 0x64646464, 0x5150; prmt.b32 $1, x, 0x64646464, 0x5352; "
                "sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
                "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)
        else:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 x, m; mov.b32 m, 0x64006400; shr.b32 x, $2, 6; and.b32 x, x, 0x03030303; "
                "prmt.b32 $0, x, 0x64646464, 0x5150; prmt.b32 $1, x, 0x64646464, 0x5352; "
                "sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
                "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)
    else:
        if K == 0:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 x, m; mov.b32 m, 0x64006400; and.b32 x, $2, 0x0f0f0f0f; "
                "prmt.b32 $0, x, 0x64646464, 0x5150; prmt.b32 $1, x, 0x64646464, 0x5352; "
                "sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
                "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)
        else:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 x, m; mov.b32 m, 0x64006400; shr.b32 x, $2, 4; and.b32 x, x, 0x0f0f0f0f; "
                "prmt.b32 $0, x, 0x64646464, 0x5150; prmt.b32 $1, x, 0x64646464, 0x5352; "
                "sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }",
                "=r,=r,r", [b], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _unpack_f16(b, BITS: tl.constexpr, N: tl.constexpr, NB: tl.constexpr, PORTABLE: tl.constexpr):
    """Packed codes [N, NB] (bytes, 8 / BITS codes each, the first in the low bits) as fp16 values
    [N, NB x 8 / BITS], code k of every byte before code k + 1 of any: position k NB + i holds channel
    (8 / BITS) i + k. Each position's neighbours come from the same register, so the tile reaches shared memory
    (on its way to the tensor cores) 16 bytes at a time."""
    if BITS == 2:
        lo = tl.join(_codes_f16(b, 0, BITS, PORTABLE), _codes_f16(b, 1, BITS, PORTABLE))
        hi = tl.join(_codes_f16(b, 2, BITS, PORTABLE), _codes_f16(b, 3, BITS, PORTABLE))
        return tl.reshape(tl.permute(tl.join(lo, hi), [0, 3, 2, 1]), [N, NB * 4])
    else:
        return tl.reshape(tl.permute(tl.join(_codes_f16(b, 0, BITS, PORTABLE), _codes_f16(b, 1, BITS, PORTABLE)),
                                     [0, 2, 1]), [N, NB * 2])


@triton.jit
def _kivi_decode_kernel(
    q_ptr, cache_ptr, resid_ptr, block_table_ptr, lens_ptr, out_ptr, ml_ptr, sm_scale, max_blocks, group, split_len,
    stride_qs, stride_qh, stride_os, stride_oh, stride_rs, stride_rt, stride_rh, stride_rkv,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr, D: tl.constexpr,
    BITS: tl.constexpr, G: tl.constexpr, RESIDUAL: tl.constexpr, RTILE: tl.constexpr,
    K_SCALE: tl.constexpr, K_ZERO: tl.constexpr, V_CODES: tl.constexpr, V_SCALE: tl.constexpr,
    V_ZERO: tl.constexpr, G_PAD: tl.constexpr, WIDEN: tl.constexpr,
):
    """One (sequence, KV head, split): the split's token groups, then (in the last split) the residual window.
    G_PAD: the GQA group padded to a power of two, 4 at least (its hi and lo halves side by side fill the 8 columns
    of a tensor-core product); WIDEN: the interpreter's path for the codes (`_unpack_f16`).
    It stays one function: both loops update the same online-softmax state (m_i, l_i and the [PER, G, 2 G_PAD]
    accumulator, whose layout changes between them) in registers, and Triton inlines every @triton.jit helper, so
    splitting the loops out would only pass that state and a dozen constexprs through parameter lists without
    changing the compiled kernel; the pieces that stand alone (program_coords, _unpack_f16, split_fp16,
    fold_pairs, store_split_stats) already are helpers."""
    seq, kv_head, split, row, heads, g_ok = program_coords(group, G_PAD)
    NB: tl.constexpr = D * BITS // 8  # code bytes per token and side
    PER: tl.constexpr = D // G  # key channels whose scale and zero a token carries; value channel groups per token
    CPB: tl.constexpr = 8 // BITS  # codes per byte
    # position i of the channel axis holds channel c[i]: the order in which `_unpack_f16` leaves the codes
    i = tl.arange(0, D)
    c = (i % NB) * CPB + i // NB
    # the query [D, G] (transposed, channels in position order), with the softmax scale
    q = tl.load(q_ptr + seq * stride_qs + heads[None, :] * stride_qh + c[:, None], mask=g_ok[None, :],
                other=0.0).to(tl.float32) * sm_scale
    n = tl.load(lens_ptr + seq)
    nq = tl.maximum(n - RESIDUAL, 0) // G * G
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    # [value channel group, its channels in position order, query head x (hi, lo)]: the sums against the hi and lo
    # halves of the scaled probabilities side by side, added up at the end
    acc = tl.zeros([PER, G, 2 * G_PAD], tl.float32)
    acc_zero = tl.zeros([PER, G_PAD], tl.float32)  # the value zeros' share, the same for every channel of a group
    nb = tl.arange(0, NB)
    r = tl.arange(0, G)
    j = tl.arange(0, PER)
    lo, hi = split_bounds(split, split_len, nq)  # split_len is a whole number of groups: every tile is whole
    for start in range(lo, hi, G):  # one token group per tile
        t = start + r
        block = tl.load(block_table_ptr + seq * max_blocks + t // BLOCK_SIZE)
        slot = ((block.to(tl.int64) * BLOCK_SIZE + t % BLOCK_SIZE) * NUM_KV_HEADS + kv_head) * SLOT
        base = cache_ptr + slot[:, None]
        kb = tl.load(base + nb[None, :])  # K code bytes [G, NB], 16 bytes a load (slots are 16-byte multiples)
        vb = tl.load(base + V_CODES + nb[None, :])  # V code bytes [G, NB]
        # the group's per-channel key scales and zeros [D] in position order: token r holds channels
        # [r PER, (r + 1) PER)
        ksz = tl.join(tl.load((base + K_SCALE).to(tl.pointer_type(tl.float16)) + j[None, :]),
                      tl.load((base + K_ZERO).to(tl.pointer_type(tl.float16)) + j[None, :]))  # [G, PER, 2]
        ks, kz = tl.split(tl.reshape(tl.permute(tl.reshape(ksz, [NB, CPB, 2]), [1, 0, 2]), [D, 2]).to(tl.float32))
        # each token's value scales and zeros per channel group [PER, G]
        vs = tl.trans(tl.load((base + V_SCALE).to(tl.pointer_type(tl.float16)) + j[None, :]).to(tl.float32))
        vz = tl.trans(tl.load((base + V_ZERO).to(tl.pointer_type(tl.float16)) + j[None, :]).to(tl.float32))
        # keys: the scale folds into the query, the product runs on the raw codes, and the zero adds q . zero
        kc = _unpack_f16(kb, BITS, G, NB, WIDEN)
        scores = fold_pairs(tl.dot(kc, split_fp16(q * ks[:, None])))  # [G tokens, G_PAD]
        scores += tl.sum(q * kz[:, None], axis=0)[None, :]
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        # values: each token's scale folds into its probability, per value channel group; the zeros add
        # sum_t p_t zero_t once per group of channels
        ps = split_fp16(vs[:, :, None] * p[None, :, :])  # [PER, G tokens, 2 G_PAD]
        # [PER, G channels, G tokens]: channel group j holds bytes [j NB / PER, (j + 1) NB / PER) of each code k
        vc = tl.reshape(_unpack_f16(vb, BITS, G, NB, WIDEN), [G, CPB, PER, NB // PER])
        vc = tl.reshape(tl.permute(vc, [2, 1, 3, 0]), [PER, G, G])
        acc = tl.dot(vc, ps, acc * tl.reshape(tl.join(alpha, alpha), [2 * G_PAD])[None, None, :])
        acc_zero = acc_zero * alpha[None, :] + tl.sum(vz[:, :, None] * p[None, :, :], axis=1)
        m_i = m_new
    # [D, 2 G_PAD] in channel order, the value zeros' share added to the hi columns
    acc = tl.reshape(tl.permute(tl.reshape(acc, [PER, CPB, NB // PER, 2 * G_PAD]), [0, 2, 1, 3]), [D, 2 * G_PAD])
    zero = tl.reshape(tl.broadcast_to(acc_zero[:, None, :], [PER, G, G_PAD]), [D, G_PAD])
    acc += tl.reshape(tl.join(zero, tl.zeros([D, G_PAD], tl.float32)), [D, 2 * G_PAD])
    # the full-precision residual, tokens nq .. n: the last split's, a tile of RTILE tokens at a time, on the tensor
    # cores as fp16 hi and lo halves of keys, values, query and probabilities
    cn = tl.arange(0, D)
    qn = split_fp16(tl.load(q_ptr + seq * stride_qs + heads[None, :] * stride_qh + cn[:, None], mask=g_ok[None, :],
                             other=0.0).to(tl.float32) * sm_scale)  # [D, 2 G_PAD]
    n_res = tl.where(split == tl.num_programs(2) - 1, n - nq, 0)
    for r0 in range(0, n_res, RTILE):
        rt = r0 + tl.arange(0, RTILE)
        r_ok = rt < n_res
        rbase = resid_ptr + seq * stride_rs + rt[:, None] * stride_rt + kv_head * stride_rh + cn[None, :]
        k = tl.load(rbase, mask=r_ok[:, None], other=0.0).to(tl.float32)
        v = tl.load(rbase + stride_rkv, mask=r_ok[:, None], other=0.0).to(tl.float32)
        k_hi = k.to(tl.float16)
        scores = tl.dot((k - k_hi.to(tl.float32)).to(tl.float16), qn, tl.dot(k_hi, qn))
        scores = tl.where(r_ok[:, None], fold_pairs(scores), float("-inf"))  # [RTILE, G_PAD]
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, axis=0)
        ps = split_fp16(p)
        vt = tl.trans(v)
        vt_hi = vt.to(tl.float16)
        acc = tl.dot(vt_hi, ps, acc * tl.reshape(tl.join(alpha, alpha), [2 * G_PAD])[None, :])
        acc = tl.dot((vt - vt_hi.to(tl.float32)).to(tl.float16), ps, acc)
        m_i = m_new
    out = fold_pairs(acc) / safe_sum(l_i)[None, :]
    tl.store(out_ptr + row * stride_os + heads[None, :] * stride_oh + cn[:, None], out, mask=g_ok[None, :])
    store_split_stats(ml_ptr, row, heads, g_ok, group * NUM_KV_HEADS, m_i, l_i)


_INTERPRETED = type(_kivi_decode_kernel).__name__ == "InterpretedFunction"  # chosen when the kernel was defined


def paged_decode_kivi(q: torch.Tensor, cache: torch.Tensor, residual: torch.Tensor, layout: SlotLayout,
                      block_table: torch.Tensor, context_lens: torch.Tensor, splits: int | None = None,
                      workspace: dict | None = None) -> torch.Tensor:
    seqs, heads, d = q.shape
    nb, bs, kv_heads, slot = cache.shape
    bits, g, r = _params(layout)
    assert slot == layout.slot_bytes and d == layout.head_dim and d % g == 0 and residual.shape[1] >= r + g - 1
    assert bits in (2, 4) and g >= 16 and g & (g - 1) == 0 and d & (d - 1) == 0, \
        "2- or 4-bit codes, a power-of-two head_dim and a token group of 16 or more (whole tensor-core tiles)"
    o = _offsets(layout)
    key = ("kivi", q.device, layout.fmt.name, d, bs, kv_heads, heads // kv_heads, g)  # its occupancy
    n_split, split_len, part, ml = split_buffers(q, kv_heads, block_table.shape[1] * bs, g, splits, workspace,
                                                 q.dtype, blocks_per_sm=known_occupancy(key))
    q32 = q.float().contiguous()
    g_pad = max(4, triton.next_power_of_2(heads // kv_heads))
    compiled = _kivi_decode_kernel[(seqs, kv_heads, n_split)](
        q32, cache, residual, block_table, context_lens, part, ml, 1.0 / math.sqrt(d), block_table.shape[1],
        heads // kv_heads, split_len, q32.stride(0), q32.stride(1), part.stride(0), part.stride(1),
        residual.stride(0), residual.stride(1), residual.stride(2), residual.stride(3),
        BLOCK_SIZE=bs, NUM_KV_HEADS=kv_heads, SLOT=slot, D=d, BITS=bits, G=g, RESIDUAL=r,
        RTILE=16, K_SCALE=o["k_scale"], K_ZERO=o["k_zero"], V_CODES=o["v_codes"], V_SCALE=o["v_scale"],
        V_ZERO=o["v_zero"],
        G_PAD=g_pad,
        # Triton's interpreter runs no inline assembly: under it the codes become fp16 by Triton's own integer and
        # bitcast operations, on a GPU by a shift, a mask, two byte permutes and two paired subtractions per four
        WIDEN=_INTERPRETED,
        # one warp takes a whole group (head_dim 128, GQA groups up to 4): the scaled query and probabilities are
        # built once (not once per warp) and no reduction crosses warps; 8 programs share an SM, each with its next
        # group's copies in flight (two stages: a third costs the registers that keep the warp from spilling).
        # Wider heads and larger groups take more warps, in proportion, and spill no more than it
        num_warps=max(1, d // 128) * (g_pad // 4), num_stages=2,
    )
    remember_occupancy(key, compiled, q.device)
    return combine_splits(part, ml, seqs, n_split, q.dtype, workspace)


def make_residual(seqs: int, layout: SlotLayout, kv_heads: int, dtype=torch.bfloat16) -> torch.Tensor:
    """[seqs, R + G, kv_heads, 2, d]: K (0) and V (1) of each sequence's newest tokens, in full precision."""
    _, g, r = _params(layout)
    return torch.zeros(seqs, r + g, kv_heads, 2, layout.head_dim, dtype=dtype)
