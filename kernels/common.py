"""Pieces every paged decode kernel shares: where a token's slot is, one step of the online softmax, split-lane
query loads and stores, and packed b-bit codes."""

import triton
import triton.language as tl


@triton.jit
def slot_offsets(block_table_ptr, seq, max_blocks, t, t_ok, kv_head, BLOCK_SIZE: tl.constexpr,
                 NUM_KV_HEADS: tl.constexpr, SLOT: tl.constexpr):
    """Byte offsets of tokens `t` of sequence `seq`, KV head `kv_head`, through the block table."""
    block = tl.load(block_table_ptr + seq * max_blocks + t // BLOCK_SIZE, mask=t_ok, other=0)
    return ((block.to(tl.int64) * BLOCK_SIZE + t % BLOCK_SIZE) * NUM_KV_HEADS + kv_head) * SLOT


@triton.jit
def softmax_step(m_i, l_i, scores):
    """Fold a tile of scores [G, N] into the running max and sum: the new max, the factor that rescales the
    accumulator, the tile's probabilities, and the new sum."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def load_query_lanes(q_ptr, seq, heads, g_ok, stride_qs, stride_qh, j):
    """The even- and odd-indexed query elements [G, D/2] of a GQA group (formats that pack two values a byte)."""
    base = q_ptr + seq * stride_qs + heads[:, None] * stride_qh
    even = tl.load(base + 2 * j[None, :], mask=g_ok[:, None], other=0.0).to(tl.float32)
    odd = tl.load(base + 2 * j[None, :] + 1, mask=g_ok[:, None], other=0.0).to(tl.float32)
    return even, odd


@triton.jit
def store_lanes(out_ptr, seq, heads, g_ok, stride_os, stride_oh, j, even, odd):
    base = out_ptr + seq * stride_os + heads[:, None] * stride_oh
    tl.store(base + 2 * j[None, :], even, mask=g_ok[:, None])
    tl.store(base + 2 * j[None, :] + 1, odd, mask=g_ok[:, None])


@triton.jit
def packed_codes(cache_ptr, base, d_offs, t_ok, BITS: tl.constexpr):
    """b-bit codes [N, D] from a little-endian bit stream starting at byte offsets `base` [N]."""
    bit = d_offs * BITS
    ptr = cache_ptr + base[:, None] + (bit // 8)[None, :]
    lo = tl.load(ptr, mask=t_ok[:, None], other=0).to(tl.int32)
    hi = tl.load(ptr + 1, mask=t_ok[:, None], other=0).to(tl.int32)
    return ((lo | (hi << 8)) >> (bit % 8)[None, :]) & ((1 << BITS) - 1)
