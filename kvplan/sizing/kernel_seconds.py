"""One kernel call's time from its fit: a weight GEMM, a decode-attention call, an all-reduce and a prompt chunk's
attention (the forms kvplan.sizing.step_time's docstring spells out, and benchmarks/fit_step_profiles.py fits)."""

from __future__ import annotations

import math

from kvplan.sizing.step_fits import Fit
from kvplan.xp import SCALAR


def gemm_call_seconds(fit: Fit, peak_bw: float, m, n: int, k: int, matrix_bytes: float, act_bytes: float = 2.0,
                      xp=SCALAR):
    """One GEMM of m tokens (a number, or numpy arrays with xp=numpy) by an n x k weight of `matrix_bytes`."""
    byt = matrix_bytes + m * k * act_bytes + m * n * 2
    flops = 2.0 * m * n * k
    if not fit.buckets:
        t = byt / (fit.eta * peak_bw)
        if fit.mu and fit.peak_flops:
            t = xp.maximum(t, flops / (fit.mu * fit.peak_flops))
        return fit.t0_s + t
    # the bucket of m (larger m take the last), selected elementwise; within it, the rows of k at least min_k take
    # its deep set where it has one (the kernel changes there)
    t, below = 0.0, -1
    for i, b in enumerate(fit.buckets):
        chosen = m > below if i == len(fit.buckets) - 1 else (m > below) & (m <= b["max_tokens"])
        below = b["max_tokens"]
        if not xp.any(chosen):  # only the ranges some m falls in are priced
            continue
        tb = _gemm_bucket_seconds(b, fit.peak_flops, peak_bw, m, n, k, byt, flops, xp)
        if b.get("deep"):
            tb = xp.where(k >= b["deep"]["min_k"],
                          _gemm_bucket_seconds(b["deep"], fit.peak_flops, peak_bw, m, n, k, byt, flops, xp), tb)
        t = xp.where(chosen, tb, t)
    if fit.mu and fit.peak_flops:  # past the fitted ranges: the large-GEMM rate at least
        last = fit.buckets[-1]
        t = xp.where(m > last["max_tokens"], xp.maximum(t, last["t0_s"] + flops / (fit.mu * fit.peak_flops)), t)
    return t


def _gemm_bucket_seconds(b: dict, peak_flops, peak_bw: float, m, n, k, byt, flops, xp):
    """One range's GEMM time. The rate a grid of n output columns walking k deep sustains, exp(a) x n^b x k^c, caps
    the bandwidth: at once (a hard minimum) or, where the range has a softness s, as (1/(eta B)^s + 1/cap^s)^(-1/s)
    (s = 1: the times add, the walk over k not hidden behind the stream). Where the range has a compute term the
    two limits blend. A weight narrower or shallower than the tables' (a router's or a shared expert's gate of a
    few outputs) runs the narrowest table shape's tiles: its rate is that shape's, not the cap's extrapolation."""
    cap = (math.exp(b["cap_log_bytes_per_s"]) * max(n, TABLE_MIN_DIM) ** b["cap_exponent"]
           * max(k, TABLE_MIN_DIM) ** b.get("cap_k_exponent", 0.0))
    s = b.get("cap_softness")
    rate = xp.minimum(b["eta"] * peak_bw, cap) if not s else ((b["eta"] * peak_bw) ** -s + cap ** -s) ** (-1 / s)
    t = byt / rate
    if b.get("mu") and peak_flops:
        q, compute = b["blend_exponent"], flops / (b["mu"] * peak_flops)
        if b.get("tile_m"):  # tile_m x tile_n output tiles in waves over the SMs, m padded to whole tiles
            rows = xp.maximum(xp.ceil(m / b["tile_m"]), 1)
            tiles = rows * xp.ceil(n / b["tile_n"])
            waves = xp.ceil(tiles / b["sm_count"])
            compute = compute * (rows * b["tile_m"] / xp.maximum(m, 1)) * (waves * b["sm_count"] / tiles)
        t = (t ** q + compute ** q) ** (1 / q)
    if b.get("pad_rows"):
        # m rounded up to whole blocks of pad_rows (a kernel's tile rows x its cluster): the emptier the last block,
        # the more it costs, as if the bytes were read again at pad_eta of the bandwidth, x (empty share)^exponent;
        # a grid narrower than about pad_from_n output columns does not pay it (its tiles all run at once)
        empty = (xp.ceil(m / b["pad_rows"]) * b["pad_rows"] - m) / b["pad_rows"]
        narrow = 1 + (b.get("pad_from_n", 1.0) / n) ** b.get("pad_steepness", 1.0)
        t = t + empty ** b["pad_exponent"] * byt / (b["pad_eta"] * peak_bw * narrow)
    return b["t0_s"] + t


def attention_call_seconds(fit: Fit, peak_bw: float, batch, kv_heads: int, q_heads: int, context, nbytes,
                           xp=SCALAR, replayed: bool = False):
    """One decode-attention call: `batch` sequences of `context` cached tokens, `nbytes` of cache read. `replayed`:
    the same call run again on the same cache, as a kernel benchmark does, which reads it from L2 as far as it fits
    (in a serving step every other layer's cache and weights pass through L2 between two calls of a layer)."""
    bw = fit.eta * peak_bw
    splits = 1
    if fit.split_slots:  # the context split over the program slots the (sequence, KV head) pairs leave free
        splits = xp.minimum(xp.maximum(xp.ceil(context / fit.split_tokens), 1),
                            xp.maximum(xp.floor(fit.split_slots / xp.maximum(batch * kv_heads, 1)), 1))
    if fit.stream_per_kv_head_bytes_per_s or fit.stream_per_sequence_head_bytes_per_s:
        # each program (a pair, or one split of it) sustains its own stream
        streams = xp.maximum(kv_heads * (fit.stream_per_kv_head_bytes_per_s or 0.0),
                             batch * kv_heads * splits * (fit.stream_per_sequence_head_bytes_per_s or 0.0))
        bw = xp.minimum(bw, streams)
    if fit.tile_tokens > 1:  # a program walks whole tiles of tokens
        whole = xp.ceil(context / fit.tile_tokens) * fit.tile_tokens
        nbytes, context = nbytes * whole / xp.maximum(context, 1), whole
    if replayed and fit.l2_bytes:
        nbytes = nbytes * (1 - (1 - fit.l2_cost) / (1 + (nbytes / fit.l2_bytes) ** L2_STEEPNESS))
    fixed = fit.per_sequence_head_s * batch * kv_heads + fit.per_query_head_s * batch * q_heads
    walk = xp.ceil(context / splits) if fit.split_slots else context  # the tokens one program walks
    stream = xp.maximum(nbytes / bw, fit.per_token_chain_s * walk)
    if fit.wave_slots:
        pairs, slots = batch * kv_heads, fit.wave_slots
        util = xp.where(pairs >= 0.8 * slots, pairs / (xp.maximum(xp.ceil(pairs / slots), 1) * slots), 1.0)
        stream = stream / util ** fit.wave_exponent
    p = fit.blend_exponent
    t = fit.t0_s + (fixed + stream if p == 1.0 else (fixed ** p + stream ** p) ** (1 / p))
    if fit.split_slots:
        per_split = xp.where(splits > CLUSTER_SPLITS, fit.combine_per_split_global_s,
                             xp.where(splits > 1, fit.combine_per_split_s, 0.0))
        t = t + per_split * splits
    return t


# the narrowest n and shallowest k of the GEMM tables the fits are made from (aiconfigurator's gemm_perf: 32 each)
TABLE_MIN_DIM = 32

CLUSTER_SPLITS = 16  # the most CTAs a thread-block cluster holds (non-portable size), hence shared-memory combines


L2_STEEPNESS = 12  # how sharply a replayed cache stops fitting in L2 past l2_bytes (benchmarks/fit_step_profiles.py)


def allreduce_seconds(f: Fit, nbytes, xp=SCALAR):
    """One all-reduce of `nbytes`: t0 + bytes / rate, or the large messages' own line where it is the faster."""
    t = f.t0_s + nbytes / (f.bytes_per_s or 1e11)
    if f.large_message_bytes_per_s:
        t = xp.minimum(t, f.large_message_t0_s + nbytes / f.large_message_bytes_per_s)
    return t


def prefill_attention_seconds(fit: Fit, tokens, q_heads: int, context, flops_per_key_head: float, xp=SCALAR):
    """One layer's attention of `tokens` prompt tokens that each attend to `context` keys on average (causal over a
    prompt of L tokens: (L + 1) / 2), `q_heads` query heads on this rank, `flops_per_key_head` FLOPs per (query head,
    key): t0 + max(tokens x heads x (c_q + keys x flops / (mu F)), c_chain x context), the keys walked in whole tiles
    of tile_tokens; c_q is a query row's own cost (its load, softmax finish, output write), c_chain the serial walk
    of the longest program where too few run to fill the GPU."""
    keys = context
    if fit.tile_tokens > 1:
        keys = xp.maximum(xp.ceil(context / fit.tile_tokens), 1) * fit.tile_tokens
    work = tokens * q_heads * (fit.per_query_head_s + keys * flops_per_key_head / (fit.mu * fit.peak_flops))
    return fit.t0_s + xp.maximum(work, fit.per_token_chain_s * context)
