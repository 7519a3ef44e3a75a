"""Pieces every paged decode kernel shares: where a token's slot is, one step of the online softmax, split-lane
query loads and stores, packed b-bit codes, and the split of each sequence's context over several programs.

Splitting the context (flash-decoding): a decode step has only seqs x kv_heads independent (sequence, KV head)
pairs, 8 at batch 1 on Llama-3-8B, far fewer than a GPU has SMs. Each kernel therefore runs a third grid axis over
splits of the context; split s of sequence q covers tokens [s x split_len, (s + 1) x split_len) and writes its
normalized output with its running max and sum to row q x num_splits + s of a float32 partial buffer, and
`combine_splits` folds the rows of each sequence into the answer. A split past the end of a sequence writes max
-inf and sum 0, and weighs nothing.
"""

import functools

import torch
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


@triton.jit
def pack_codes(codes, BITS: tl.constexpr, D: tl.constexpr, NB_PAD: tl.constexpr):
    """The little-endian bit stream `packed_codes` reads, from b-bit codes [D] (int32): bytes [NB_PAD], of which
    the first ceil(D x b / 8) are meant. A code spans at most two bytes; the bits of different codes do not
    overlap, so summing the contributions is OR-ing them."""
    i = tl.arange(0, D)
    j = tl.arange(0, NB_PAD)
    bit = i * BITS
    shifted = codes << (bit % 8)
    low = tl.where((bit // 8)[None, :] == j[:, None], (shifted & 0xFF)[None, :], 0)
    high = tl.where((bit // 8 + 1)[None, :] == j[:, None], (shifted >> 8)[None, :], 0)
    return tl.sum(low + high, axis=1)


@triton.jit
def round_half_even(t):
    """Round to nearest, halves to even (torch.round, and what float conversions do)."""
    r = tl.floor(t + 0.5)
    return tl.where((r - t == 0.5) & (r - 2.0 * tl.floor(r * 0.5) == 1.0), r - 1.0, r)


@triton.jit
def uniform_scale_zero(lo, hi, BITS: tl.constexpr):
    """The b-bit uniform asymmetric quantizer for values in [lo, hi], as the torch writers store it: the scale
    (hi - lo) / (2^b - 1) rounded to fp16 and held at 1e-6 at least, the zero lo rounded to fp16 (both in fp32)."""
    scale = tl.maximum(((hi - lo) / ((1 << BITS) - 1)).to(tl.float16).to(tl.float32), 1e-6)
    return scale, lo.to(tl.float16).to(tl.float32)


@triton.jit
def uniform_codes(x, scale, zero, BITS: tl.constexpr):
    """round((x - zero) / scale), halves to even, clamped to [0, 2^b - 1]."""
    return tl.minimum(tl.maximum(round_half_even((x - zero) / scale), 0.0), (1 << BITS) - 1.0).to(tl.int32)


@triton.jit
def split_fp16(x):
    """x [..., N] (fp32) as fp16 pairs [..., 2N]: column 2n holds x[n] rounded to fp16 (hi), column 2n + 1 what
    that leaves (lo). One tensor-core product against exact fp16 operands computes both halves' sums side by side
    (`fold_pairs` adds them), keeping about 22 significant bits of x where |x| >= 2^-3 (below it the lo part is
    subnormal: about 2^-25 absolute)."""
    hi = x.to(tl.float16)
    both = tl.join(hi, (x - hi.to(tl.float32)).to(tl.float16))
    return tl.reshape(both, both.shape[:-2] + [both.shape[-2] * 2])


@triton.jit
def fold_pairs(x):
    """[..., 2N] -> [..., N]: the sum of columns 2n and 2n + 1 (the hi and lo halves of `split_fp16`)."""
    hi, lo = tl.split(tl.reshape(x, x.shape[:-1] + [x.shape[-1] // 2, 2]))
    return hi + lo


@triton.jit
def e4m3_byte(v):
    """The e4m3 byte nearest v (0 <= v <= 448), computed exactly from v's exponent bits e: 8 (e + 6) + round(v /
    2^(e - 3)); a mantissa that rounds up to 16 lands on the next exponent's 0, and with e held at -6 below the
    normals the same formula gives the subnormals, round(v / 2^-9). Float conversions in Triton's interpreter are
    unreliable, so no conversion is used."""
    e = tl.maximum(((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    return (8.0 * (e + 6).to(tl.float32) + round_half_even(v * tl.exp2((3 - e).to(tl.float32)))).to(tl.int32)


@triton.jit
def program_coords(group, G_PAD: tl.constexpr):
    """A decode program's place: its sequence, KV head, context split and partial-output row, and the query heads
    of its GQA group [G_PAD] with their mask (the group padded to G_PAD)."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, G_PAD)
    return seq, kv_head, split, seq * tl.num_programs(2) + split, kv_head * group + g, g < group


@triton.jit
def split_bounds(split, split_len, n_ctx):
    """The tokens [lo, hi) of the context that split `split` covers."""
    lo = split * split_len
    return lo, tl.minimum(n_ctx, lo + split_len)


@triton.jit
def store_split_stats(ml_ptr, row, heads, g_ok, num_heads, m_i, l_i):
    """A split's running max and sum per head, for `combine_splits`."""
    base = ml_ptr + (row * num_heads + heads) * 2
    tl.store(base, m_i, mask=g_ok)
    tl.store(base + 1, l_i, mask=g_ok)


@triton.jit
def safe_sum(l_i):
    """The softmax sum to divide by: 1 where a split saw no token (its output is then 0 and its weight 0)."""
    return tl.where(l_i > 0, l_i, 1.0)


@triton.jit
def _combine_kernel(part_ptr, ml_ptr, out_ptr, num_heads, num_splits,
                    D: tl.constexpr, D_PAD: tl.constexpr, S_PAD: tl.constexpr):
    seq = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    s_ok = s < num_splits
    rows = seq * num_splits + s
    ml = ml_ptr + (rows * num_heads + h) * 2
    m = tl.load(ml, mask=s_ok, other=float("-inf"))
    l_s = tl.load(ml + 1, mask=s_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    m_ref = tl.where(m_max > float("-inf"), m_max, 0.0)  # no split saw a token: every weight is 0 below
    w = tl.where(l_s > 0, tl.exp(m - m_ref) * l_s, 0.0)
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    part = tl.load(part_ptr + (rows[:, None] * num_heads + h) * D + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                   other=0.0)
    w_sum = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.where(w_sum > 0, w_sum, 1.0)  # an empty sequence attends to nothing
    tl.store(out_ptr + (seq * num_heads + h) * D + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The device's SM count, asked once (the split plan reads it on every call)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


# What one SM holds when the device does not say (Hopper's figures): registers, shared memory in bytes, threads,
# resident blocks
_SM_DEFAULTS = {"regs": 65536, "smem": 233472, "threads": 2048, "blocks": 32}


@functools.lru_cache(maxsize=None)
def sm_limits(device: torch.device) -> dict:
    """Per-SM registers, shared memory, threads and blocks of a CUDA device, from its properties where torch
    reports them."""
    props = torch.cuda.get_device_properties(device)
    return {"regs": getattr(props, "regs_per_multiprocessor", None) or _SM_DEFAULTS["regs"],
            "smem": getattr(props, "shared_memory_per_multiprocessor", None) or _SM_DEFAULTS["smem"],
            "threads": getattr(props, "max_threads_per_multi_processor", None) or _SM_DEFAULTS["threads"],
            "blocks": _SM_DEFAULTS["blocks"]}


def occupancy(regs: int, shared: int, warps: int, limits: dict | None = None) -> int:
    """Blocks of a kernel resident on one SM at once: the fewest its registers (allocated 256 a warp at a time),
    shared memory (plus the 1 KB the hardware reserves per block) and warps allow, and at least one."""
    lim = limits or _SM_DEFAULTS
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    return max(1, min(lim["regs"] // (per_warp * warps), lim["smem"] // (shared + 1024),
                      lim["threads"] // (32 * warps), lim["blocks"]))


# Blocks per SM of each compiled decode kernel, by the launcher's key (its device and compile-time constants),
# learned from the compiled kernel its first launch returns
_OCCUPANCY: dict = {}


def known_occupancy(key) -> int | None:
    """The blocks per SM recorded for a launcher's `key` (None before its first launch on a GPU)."""
    return _OCCUPANCY.get(key)


def remember_occupancy(key, compiled, device: torch.device) -> None:
    """Record the blocks per SM of `compiled` (what a Triton launch returns: its registers, `n_regs`, are known once
    it is loaded on the GPU; its shared memory and warps are in its metadata) under `key`, on a GPU only. The
    launches of one key differ in what the key leaves out (the output's dtype with one split or several, integer
    arguments the runtime specializes): the lowest occupancy seen is kept."""
    if device.type != "cuda":
        return
    regs = getattr(compiled, "n_regs", None)
    meta = getattr(compiled, "metadata", None)
    if not regs or meta is None:
        return
    blocks = occupancy(int(regs), int(meta.shared), int(meta.num_warps), sm_limits(device))
    _OCCUPANCY[key] = min(blocks, _OCCUPANCY.get(key, blocks))


def _split_count(max_ctx: int, splits: int, unit: int) -> tuple[int, int]:
    """(splits, tokens per split) once the split length is rounded up to a multiple of `unit`."""
    per = -(-max(max_ctx, 1) // max(1, splits))
    per = -(-per // unit) * unit
    return -(-max(max_ctx, 1) // per), per


@functools.lru_cache(maxsize=4096)
def wave_splits(sms: int, blocks_per_sm: int, seqs: int, kv_heads: int, max_ctx: int, unit: int,
                min_split_tokens: int = 256) -> int:
    """The split count that fills the GPU in whole waves: the seqs x kv_heads x splits programs run
    sms x blocks_per_sm at a time, and a last wave only partly full leaves SMs idle while it runs. Among the split
    counts the context allows (no split shorter than `min_split_tokens`, lengths a multiple of `unit`), each is
    scored by the fraction of the waves' program slots it fills; the fewest splits within 5% of the best score win
    (each split adds a partial row to write and combine)."""
    slots = max(1, sms * blocks_per_sm)
    pairs = max(1, seqs * kv_heads)
    fill = {}
    for s in range(1, max(1, max_ctx // max(1, min_split_tokens)) + 1):
        n = _split_count(max_ctx, s, unit)[0]
        programs = pairs * n
        fill[n] = programs / (-(-programs // slots) * slots)
    best = max(fill.values())
    return min(n for n, f in fill.items() if f >= 0.95 * best)


def split_plan(seqs: int, kv_heads: int, max_ctx: int, unit: int, device: torch.device,
               splits: int | None = None, min_split_tokens: int = 256,
               blocks_per_sm: int | None = None) -> tuple[int, int]:
    """(number of splits, tokens per split): on a GPU, the split count `wave_splits` picks for the device's SMs and
    the kernel's `blocks_per_sm` (its occupancy; 4 where the launcher does not know it yet), no split shorter than
    `min_split_tokens` (so the partial rows stay a small fraction of the bytes read), split lengths a multiple of
    `unit` (the kernel's tile). One split off the GPU unless `splits` says otherwise."""
    if splits is None:
        splits = 1
        if device.type == "cuda":
            splits = wave_splits(sm_count(device), blocks_per_sm or 4, seqs, kv_heads, max_ctx, unit,
                                 min_split_tokens)
    return _split_count(max_ctx, splits, unit)


def _output(seqs: int, heads: int, d: int, dtype: torch.dtype, device: torch.device,
            workspace: dict | None) -> torch.Tensor:
    key = ("out", seqs, heads, d, dtype, device)
    out = workspace.get(key) if workspace is not None else None
    if out is None:
        out = torch.empty(seqs, heads, d, dtype=dtype, device=device)
        if workspace is not None:
            workspace[key] = out
    return out


def split_buffers(q: torch.Tensor, kv_heads: int, max_ctx: int, unit: int, splits: int | None = None,
                  workspace: dict | None = None,
                  out_dtype: torch.dtype | None = None,
                  blocks_per_sm: int | None = None) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """For queries q [seqs, heads, d]: the split plan (`split_plan`) and its buffers, the partial outputs
    [seqs x splits, heads, d] (float32) and their (max, sum) [seqs x splits, heads, 2]: (splits, split_len, part,
    ml). With one split and an `out_dtype`, `part` is the answer itself [seqs, heads, d] in that dtype: the kernel
    writes it and `combine_splits` launches nothing. With a `workspace` (a dict the caller keeps), the buffers are
    allocated on the first call and reused on every later call of the same shapes. `blocks_per_sm`: the kernel's
    occupancy, for the split plan."""
    seqs, heads, d = q.shape
    n_split, split_len = split_plan(seqs, kv_heads, max_ctx, unit, q.device, splits, blocks_per_sm=blocks_per_sm)
    key = ("split", seqs * n_split, heads, d, q.device)
    bufs = workspace.get(key) if workspace is not None else None
    if bufs is None:
        part = None if n_split == 1 and out_dtype is not None else torch.empty(
            seqs * n_split, heads, d, dtype=torch.float32, device=q.device)
        bufs = (part, torch.empty(seqs * n_split, heads, 2, dtype=torch.float32, device=q.device))
        if workspace is not None:
            workspace[key] = bufs
    part = bufs[0] if bufs[0] is not None else _output(seqs, heads, d, out_dtype, q.device, workspace)
    return n_split, split_len, part, bufs[1]


def combine_splits(part: torch.Tensor, ml: torch.Tensor, seqs: int, num_splits: int,
                   dtype: torch.dtype, workspace: dict | None = None) -> torch.Tensor:
    """Fold each sequence's split rows into its attention output [seqs, heads, d] in `dtype` (with a `workspace`,
    into the same output tensor on every call of the same shapes: each call overwrites the last one's answer).
    One split already written as the answer (`split_buffers` with `out_dtype`) is returned as it is."""
    _, heads, d = part.shape
    if num_splits == 1 and part.dtype == dtype and part.shape[0] == seqs:
        return part
    out = _output(seqs, heads, d, dtype, part.device, workspace)
    _combine_kernel[(seqs, heads)](part, ml, out, heads, num_splits, D=d, D_PAD=triton.next_power_of_2(d),
                                   S_PAD=max(2, triton.next_power_of_2(num_splits)))
    return out
