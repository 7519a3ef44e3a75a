"""Fit kvplan's bundled step-time profiles (hardware/profiles/step-time.yaml) from public kernel timings.

The timings are NVIDIA AIConfigurator's measurements of vLLM's own kernels (repository ai-dynamo/aiconfigurator,
commit 095f58a51c4ca8e61b66ec108d86f223f8d559ce, aic-core/src/aiconfigurator_core/systems/data/<gpu>/; vLLM 0.19.0
on H100, H200, B200 and 0.14.0 on A100; for B300 and GB200, aiconfigurator-core 0.12.0's wheel,
aiconfigurator_core/systems/data/{b300_sxm,gb200}/: gemm, attention and moe of vllm/0.24.0, comm/vllm/0.24.0's
custom all-reduce and comm/nccl/2.29.2, the NCCL table whose rows carry the version its folder names). Point SILICON
at a folder holding one sub-folder per GPU with the parquet tables renamed <family>-<table>.parquet, and a
collection_meta.yaml naming the vLLM version (runtime: version), then:

    python benchmarks/fit_step_profiles.py SILICON > hardware/profiles/step-time.yaml

or, to refit only the prompt-attention fits and the large all-reduces' line of a profile (seconds), keeping the
rest as it is:

    python benchmarks/fit_step_profiles.py SILICON --prefill-only hardware/profiles/step-time.yaml > new.yaml

or only the fused-MoE fits (the experts' routing: kvplan.sizing.routing):

    python benchmarks/fit_step_profiles.py SILICON --moe-only hardware/profiles/step-time.yaml > new.yaml

or only the all-reduce the engines replay in their CUDA graphs (graph_allreduce: vLLM's custom all-reduce, from
<gpu>/comm-custom_allreduce_perf.parquet, the table aiconfigurator-core 0.12.0's wheel ships as
systems/data/<gpu>/comm/vllm/0.19.0/custom_allreduce_perf.parquet, 0.14.0 for A100):

    python benchmarks/fit_step_profiles.py SILICON --graph-allreduce-only hardware/profiles/step-time.yaml > new.yaml

or only the decode attention of the GPUs whose own table it is fitted from another's (DECODE_TABLE_OF):

    python benchmarks/fit_step_profiles.py SILICON --decode-attention-only hardware/profiles/step-time.yaml > new.yaml

or only MLA's decode module, where a GPU's folder times it (mla_decode):

    python benchmarks/fit_step_profiles.py SILICON --mla-only hardware/profiles/step-time.yaml > new.yaml

or only the GPUs of GPUS that SILICON holds and the profile lacks (every family fitted; the profile's GPUs kept
byte for byte):

    python benchmarks/fit_step_profiles.py SILICON --add-gpus hardware/profiles/step-time.yaml > new.yaml

Needs pandas, pyarrow and scipy (`pip install -e '.[parquet]' scipy`); about forty minutes on two cores. Each
family is t = t0 + bytes / (eta x peak bandwidth) with the extra terms its function below names, fitted by least
squares on relative error (log time); the share of rows of at least 64 MiB that the fit reproduces within 10% is
written beside each fit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from kvplan.sizing.routing import ROUTING_ALPHA, experts_touched
from kvplan.sizing.kernel_seconds import (
    attention_call_seconds,
    gemm_call_seconds,
    prefill_attention_seconds,
)
from kvplan.sizing.step_fits import SPLIT_FIELDS, Fit

MB = 2**20
# silicon folder -> (kvplan GPU name, peak bandwidth B/s, dense bf16 FLOP/s, dense fp8 FLOP/s, L2 bytes, SMs):
# hardware/*.yaml
GPUS = {
    "a100_sxm": ("A100-SXM4-80GB", 2.039e12, 312e12, None, 40e6, 108),
    "h100_sxm": ("H100-SXM5-80GB", 3.35e12, 989.4e12, 1978.9e12, 50e6, 132),
    "h200_sxm": ("H200-SXM-141GB", 4.8e12, 989.4e12, 1978.9e12, 50e6, 132),
    "b200_sxm": ("B200", 8.0e12, 2250e12, 4500e12, 126.5e6, 148),
    # hardware/b300.yaml and gb200.yaml (bandwidth, dense bf16 and fp8 FLOP/s) give neither L2 nor SMs (launch
    # material says 160 SMs for Blackwell Ultra's full chip): B200's 126.5 MB and 148 SMs, the same two-die
    # Blackwell. Their GEMM tables agree with 148 SMs and not with 160: fp8, m = 256, k = 16,384 (vLLM 0.24.0) runs
    # flat to n = 4,096 and steps up at n = 5,120 and 10,240 (B300: 29.4 -> 40.8 us, 45.2 -> 57.0 us; GB200 alike),
    # where a grid of 128 x 64 tiles grows from 128 to 160 and from 256 to 320 tiles: past one and two waves of 148
    # SMs, within those of 160
    "b300_sxm": ("B300", 8.0e12, 2250e12, 4500e12, 126.5e6, 148),
    "gb200": ("GB200", 8.0e12, 2500e12, 5000e12, 126.5e6, 148),
}
WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0 + 4 / 128**2, "int8_wo": 1.0, "int4_wo": 0.5,
                "nvfp4": 0.5 + 1 / 16}
ACT_BYTES = {"fp8": 1, "fp8_block": 1, "nvfp4": 0.5}


def _lstsq(columns, y, weight):
    a = np.vstack(columns).T
    coef, *_ = np.linalg.lstsq(a * weight[:, None], y * weight, rcond=None)
    return coef, a @ coef


def _share(pred, y, big):
    """(share of the rows of >= 64 MiB reproduced within 10%, their count); None where there are none."""
    if not big.any():
        return None, 0
    err = np.abs(pred / y - 1)
    return round(float(np.mean(err[big] < 0.10)), 3), int(big.sum())


def _better(share, best) -> bool:
    return best is None or (share or 0.0) > (best[0] or 0.0)


# a fit split in two (by depth of k, or by a single KV head) is kept where the halves reproduce this share more of
# the rows than the one fit
SPLIT_GAIN = 0.02


def _split_share(halves, rows, share):
    """The share of `rows` two halves' fits, each (share, rows), reproduce together where it beats the one fit's
    `share` by SPLIT_GAIN; None where it does not."""
    split = sum((s or 0.0) * n for s, n in halves) / rows
    return split if split >= (share or 0.0) + SPLIT_GAIN else None
# query heads per KV head (the rows of a KV head's attention product): the kernels pick their tiles and splits by
# it, as GEMMs do by tokens; 1 is multi-head attention
GROUP_BUCKETS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 128))


def _attention_params(p, tile, slots, split=0) -> Fit:
    """A decode-attention fit from the least-squares vector (p in us, ns, ps, GB/s and MB; with a split, two more:
    the combine's cost per split in us, within a cluster and through global memory)."""
    t0, c_seq, c_q, eta, c_tok, per_head, per_seq, blend, l2_mb, l2_cost, wave = (float(v) for v in p[:11])
    combine, combine_global = (float(v) for v in p[11:]) if split else (0.0, 0.0)
    return Fit(t0_s=t0 * 1e-6, eta=eta, per_sequence_head_s=c_seq * 1e-9, per_query_head_s=c_q * 1e-9,
               per_token_chain_s=c_tok * 1e-12, tile_tokens=int(tile), stream_per_kv_head_bytes_per_s=per_head * 1e9,
               stream_per_sequence_head_bytes_per_s=per_seq * 1e9, blend_exponent=blend, l2_bytes=l2_mb * 1e6,
               l2_cost=l2_cost, wave_slots=int(slots), wave_exponent=wave if slots else 0.0, split_slots=int(split),
               combine_per_split_s=combine * 1e-6, combine_per_split_global_s=combine_global * 1e-6)


def _attention_model(p, x, peak, tile, slots=0, split=0):
    """kvplan's own decode-attention time for the table's replayed calls (their cache warm in L2 as far as it fits)."""
    batch, kvh, heads, n, per_token = x
    return attention_call_seconds(_attention_params(p, tile, slots, split), peak, batch, kvh, heads, n,
                                  batch * kvh * n * per_token, xp=np, replayed=True)


# The decode kernels whose rule for splitting the context the fits try: FlashInfer's TRT-LLM kernels (vLLM's
# FlashInfer backend on Blackwell) split each (sequence, KV head) pair's context into
# min(ceil(context / (2 x 128-token tile)), max(1, SMs // pairs)) programs and combine the splits in a cluster's
# shared memory up to 16 splits, through global memory beyond (flashinfer 0.6.6,
# include/flashinfer/trtllm/fmha/fmhaKernels.cuh, computeCtaAndClusterConfig; the 256 tokens are Fit.split_tokens'
# default). FlashAttention's own rule differs, and its fits keep a single serial walk over the context.
SPLIT_KERNELS = ("vllm_flashinfer",
                 # the same kernels as vLLM 0.24's tables name them (FlashInfer's TRT-LLM decode path)
                 "vllm_flashinfer_trtllmdecode")


def attention(df, peak, l2, sms):
    """Decode attention: t = t0 + (fixed^p + stream^p)^(1/p), fixed = c_seq x (batch x KV heads) + c_q x (batch x
    query heads), stream = max(bytes / min(eta x B, max(KV heads x R_head, batch x KV heads x R_seq)), c_tok x
    context), the context rounded up to the kernel's tile of tokens. c_seq is each (sequence, KV head) pair's own
    work (block-table walk, split combine), c_q each query head's; p blends them with the streaming, which other
    programs overlap with that work (p = 1 adds them); the streaming rate is capped by how many streams the kernel's
    grid runs at once (per KV head and per sequence-head pair); c_tok is one split's serial walk over a sequence.
    The tables replay one call on the same cache, so a cache smaller than the L2 is read from it: a share
    1 / (1 + (bytes / C)^12) of the bytes costs l2_cost of a DRAM byte, C (held to 0.2-1.2 x the L2) and l2_cost
    fitted. A serving step reads every layer's cache and weights between two calls of a layer, so kvplan's step model
    leaves this term out.
    Where it reproduces the rows better, the streaming also runs in waves: a kernel that stops splitting the context
    once (sequences x KV heads) fills 80% of its program slots (FlashAttention-2: two per SM) runs one program per
    pair, and a last partial wave slows the stream by util^w, util = pairs / (waves x slots).
    For the kernels of SPLIT_KERNELS, the context may also be split by their rule: splits = min(ceil(context / 256),
    max(1, SMs // pairs)), each program walking context / splits (c_tok per token), the splits' partial results
    combined at a cost per split (two, within a cluster of up to 16 and through global memory beyond).
    Fitted by least squares on log time (scipy), rows of >= 64 MiB weighted 1 and smaller ones 0.3; one fit per head
    size and range of query heads per KV head. Where the calls with a single KV head (multi-query attention, or a
    tensor-parallel rank holding one) run differently enough, they get a fit of their own (one_kv_head): kept where
    it and the rest's refit reproduce SPLIT_GAIN more of the rows, each half holding at least ONE_KV_HEAD_ROWS."""
    out = {}
    full = df[df.window_size == 0] if "window_size" in df else df
    group = full.num_heads // full.num_key_value_heads
    for kv, eb in (("bfloat16", 2), ("fp8", 1)):
        groups, one_kv_head, hits, total = {}, {}, 0.0, 0
        for lo, hi in GROUP_BUCKETS:
            rows = full[(group >= lo) & (group <= hi)]
            for hd in sorted(rows.head_dim.unique()):
                d = rows[(rows.kv_cache_dtype == kv) & (rows.head_dim == hd)]
                if d.empty:
                    continue
                # the split rule where every row of this head size and range ran a kernel of SPLIT_KERNELS (vLLM
                # 0.24 on Blackwell runs Triton's for the head size FlashInfer's decode kernels lack)
                split_slots = sms if "kernel_source" in d and d.kernel_source.isin(SPLIT_KERNELS).all() else 0
                fit = _attention_fit(d, eb, peak, l2, sms, split_slots)
                share, n = fit["within_10pct"] or 0.0, fit["rows_64mib"]
                one, rest = d[d.num_key_value_heads == 1], d[d.num_key_value_heads > 1]
                if min(_attention_big(one, eb).sum(), _attention_big(rest, eb).sum()) >= ONE_KV_HEAD_ROWS:
                    halves = [_attention_fit(h, eb, peak, l2, sms, split_slots) for h in (one, rest)]
                    split = _split_share([(h["within_10pct"], h["rows_64mib"]) for h in halves], n, share)
                    if split is not None:
                        one_kv_head.setdefault(hi, {})[int(hd)], fit = halves
                        share = split
                groups.setdefault(hi, {})[int(hd)] = fit
                hits, total = hits + share * n, total + n
        if groups:
            out[kv] = dict(groups=groups, within_10pct=round(hits / total, 3) if total else None,
                           rows_64mib=int(total))
            if one_kv_head:
                out[kv]["one_kv_head"] = one_kv_head
    return out


ONE_KV_HEAD_ROWS = 20


def _attention_big(d, eb) -> np.ndarray:
    """Which of the rows read at least 64 MiB of cache (the rows the shares count)."""
    return (d.batch_size * d.num_key_value_heads * (d.step + 1) * d.head_dim * 2 * eb >= 64 * MB).to_numpy()


def _attention_fit(d, eb, peak, l2, sms, split=0) -> dict:
    from scipy.optimize import least_squares

    n = (d.step + 1).to_numpy(float)
    kvh = d.num_key_value_heads.to_numpy(float)
    batch = d.batch_size.to_numpy(float)
    per_token = (d.head_dim * 2 * eb).to_numpy(float)
    x = (batch, kvh, d.num_heads.to_numpy(float), n, per_token)
    y = d.latency.to_numpy(float) / 1e3
    big = _attention_big(d, eb)
    w = np.where(big, 1.0, 0.3)
    l2_mb = l2 / 1e6
    best = None
    for sp, slots in ((sp, slots) for sp in sorted({0, split}) for slots in (0, sms, 2 * sms)):
        # no waves, or one or two programs per SM; and where the kernel splits by its rule, with the split and without
        lower = [0, 0, 0, 0.2, 0, 1, 1, 1, 0.2 * l2_mb, 0.05, 0] + [0, 0] * bool(sp)
        upper = [50, 200, 10, 1.2, 5000, 20000, 20000, 8, 1.2 * l2_mb, 1.0, 1.0 if slots else 1e-9] + [5, 5] * bool(sp)
        for tile in (1, 64, 128):
            for start in ((9, 15, 0.3, 0.85, 300, 1000, 50, 1, 0.8 * l2_mb, 0.4, 0.5 * bool(slots)),
                          (9, 15, 0.3, 0.85, 300, 3000, 1000, 1, 0.8 * l2_mb, 0.4, 0.5 * bool(slots)),
                          (9, 15, 0.3, 0.85, 300, 3000, 1000, 3, 0.8 * l2_mb, 0.4, 0.5 * bool(slots))):
                start = np.array(start + ((0.2, 0.15) if sp else ()))
                r = least_squares(lambda p: np.log(_attention_model(p, x, peak, tile, slots, sp) / y) * w,
                                  start, bounds=(lower, upper), loss="soft_l1", f_scale=0.05, max_nfev=400)
                share, rows = _share(_attention_model(r.x, x, peak, tile, slots, sp), y, big)
                if _better(share, best):
                    best = (share, rows, tile, slots, sp, r.x)
    share, rows, tile, slots, sp, p = best
    fit = _attention_params(p, tile, slots, sp)
    fields = ATTENTION_FIELDS + (SPLIT_FIELDS if sp else ())
    return dict({f: getattr(fit, f) for f in fields}, within_10pct=share, rows_64mib=rows)


ATTENTION_FIELDS = ("t0_s", "eta", "per_sequence_head_s", "per_query_head_s", "per_token_chain_s", "tile_tokens",
                    "stream_per_kv_head_bytes_per_s", "stream_per_sequence_head_bytes_per_s", "blend_exponent",
                    "l2_bytes", "l2_cost", "wave_slots", "wave_exponent")


# tokens per GEMM: m = 1 to 512 (decode batches), then the prefill chunks a step carries beside them (to 32,768,
# the tables' largest); the kernel configurations change between these ranges
GEMM_BUCKETS = ((1, 16), (17, 32), (33, 64), (65, 128), (129, 256), (257, 512),
                (513, 1024), (1025, 2048), (2049, 4096), (4097, 32768))
DECODE_TOKENS = 512  # the decode-sized GEMMs: each fit's within_10pct counts their rows, prefill_within_10pct the rest


def _gemm_bucket(p, max_tokens, tile, sms, pad=None) -> dict:
    """One range of m's GEMM fit from the least-squares vector (t0 in us, the cap's log in GB/s; with a block of
    `pad` rows, four more: pad_eta, its exponent, log2 of pad_from_n and pad_steepness)."""
    t0, eta, a, b, mu, q, c, soft = (float(v) for v in p[:8])
    bucket = dict(max_tokens=max_tokens, t0_s=t0 * 1e-6, eta=eta, cap_log_bytes_per_s=a + float(np.log(1e9)),
                  cap_exponent=b, cap_k_exponent=c, cap_softness=soft, mu=mu, blend_exponent=q)
    if tile:
        bucket.update(tile_m=tile[0], tile_n=tile[1], sm_count=sms)
    if pad:
        bucket.update(pad_rows=pad, pad_eta=float(p[8]), pad_exponent=float(p[9]), pad_from_n=float(2 ** p[10]),
                      pad_steepness=float(p[11]))
    return bucket


def _gemm_model(p, x, peak, flops_peak, tile=None, sms=0, pad=None):
    """kvplan's own GEMM time for a range of m fitted alone."""
    m, n, k, matrix_bytes, act_bytes = x
    fit = Fit(t0_s=0.0, peak_flops=flops_peak, buckets=(_gemm_bucket(p, 1 << 30, tile, sms, pad),))
    return gemm_call_seconds(fit, peak, m, n, k, matrix_bytes, act_bytes, xp=np)


TILES = (None,) + tuple((tm, tn) for tm in (64, 128, 256) for tn in (64, 128, 256))
# where a range's rows of k at least one of these run a kernel of their own (split-K, another tile), the range is
# fitted in two halves; a split is kept where it reproduces at least SPLIT_GAIN more of the range's rows and each
# half holds at least SPLIT_ROWS rows of >= 64 MiB
DEEP_K = (8192, 16384)
SPLIT_ROWS = 40
# blocks of rows a kernel may round m up to (tile rows x cluster) where an emptier last block costs more, the
# largest first: where the rows cannot tell them apart (past 256 tokens the tables hold only multiples of 256 and
# one more), the fit keeps the largest, the block of vLLM's fp8 kernel on Hopper (128-row tiles in clusters of two)
PAD_ROWS = (256, 128, 64)
PAD_TILES = 1


def _gemm_big(d, wb, ab) -> np.ndarray:
    """Which of the rows move at least 64 MiB (weight, activations in, output out: the rows the shares count)."""
    return (d.n * d.k * wb + d.m * d.k * ab + d.m * d.n * 2 >= 64 * MB).to_numpy()


def _fit_gemm_range(d, wb, ab, peak, flops_peak, sms, tiles=TILES):
    """(share, rows of >= 64 MiB, least-squares vector, tile, block of rows or None) of the best fit of one
    range's rows."""
    from scipy.optimize import least_squares

    n, k, m = (d[c].to_numpy(float) for c in ("n", "k", "m"))
    x = (m, n, k, n * k * wb, ab)
    y = d.latency.to_numpy(float) / 1e3
    big = _gemm_big(d, wb, ab)
    w = np.where(big, 1.0, 0.3)
    best, per_tile = None, {}
    lower, upper = [0, 0.1, -30, 0, 0.05, 1, -3, 1], [50, 1.0, 40, 8, 1.0, 20, 3, 12]
    for tile in tiles:
        # a start with mu at what the rows achieve on the tile grid, and one with the compute term out of
        # the way (mu = 1, q = 20): the memory-bound fit alone
        achieved = (_gemm_model([0, 1e9, 40, 0, 1.0, 20, 0, 0], x, peak, flops_peak, tile, sms) / y)[big]
        mu0 = float(np.clip(np.median(achieved), 0.06, 0.99)) if big.any() else 0.5
        # a hard cap on n alone, a soft one that also walks k, and (without tiles) the memory-bound fit alone
        starts = [([4, 0.85, 3, 0.5, mu0, 8, 0, 12], lower, upper),
                  ([4, 0.85, 10, 0.3, mu0, 3, 0.2, 4], lower, upper),
                  ([1, 0.85, -3, 0.9, mu0, 8, 0.6, 1.3], lower, upper)]
        if tile is None:
            starts += [([4, 0.85, 3, 0.5, 1.0, 20, 0, 2], lower[:4] + [0.999, 19.9] + lower[6:], upper),
                       ([4, 0.85, 3, 0.5, 0.5, 2, 0, 12], lower, upper)]
        for start, lo_, hi_ in starts:
            r = least_squares(lambda p: np.log(_gemm_model(p, x, peak, flops_peak, tile, sms) / y) * w,
                              start, bounds=(lo_, hi_), loss="soft_l1", f_scale=0.05)
            share, rows = _share(_gemm_model(r.x, x, peak, flops_peak, tile, sms), y, big)
            if _better(share, best):
                best = (share, rows, r.x, tile, None)
            if _better(share, per_tile.get(tile)):
                per_tile[tile] = (share, r.x)
    # the cost of an emptier last block of rows (PAD_ROWS), tried on the PAD_TILES best tile grids from their fits:
    # kept where it reproduces SPLIT_GAIN more of the rows than the best fit without it, and a smaller block only
    # where it reproduces SPLIT_GAIN more than the larger one
    rows = best[1]
    lower, upper = lower + [0.01, 0.2, 4, 0.5], upper + [10, 6, 18, 16]
    for tile, (_, p) in sorted(per_tile.items(), key=lambda kv: -(kv[1][0] or 0.0))[:PAD_TILES]:
        for pad in PAD_ROWS:
            for extra in ([0.3, 1.5, 10, 3], [1.0, 3.0, 12, 8]):
                start = np.clip(np.r_[p, extra], np.array(lower) + 1e-9, np.array(upper) - 1e-9)
                r = least_squares(lambda q: np.log(_gemm_model(q, x, peak, flops_peak, tile, sms, pad) / y) * w,
                                  start, bounds=(lower, upper), loss="soft_l1", f_scale=0.05)
                padded, _ = _share(_gemm_model(r.x, x, peak, flops_peak, tile, sms, pad), y, big)
                if (_better(padded, best) if best[4] == pad else (padded or 0.0) >= (best[0] or 0.0) + SPLIT_GAIN):
                    best = (padded, rows, r.x, tile, pad)
    return best


def gemm(df, peak, f16, f8, sms):
    """GEMMs: t = t0 + (memory^q + compute^q)^(1/q), memory = bytes / rate and compute = flops / (mu x F), rate =
    (1/(eta x B)^s + 1/cap^s)^(-1/s), cap = exp(a) x n^b x k^c, one (t0, eta, a, b, c, s, mu, q) per range of m
    (decode-sized <= 16, 32, 64, 128, 256, 512; prefill chunks <= 1,024, 2,048, 4,096, 32,768: the kernels'
    configurations change at these bounds) and, where the kernels also change at a depth of k (DEEP_K), a second
    set for the range's rows of k at least that deep. The cap is the rate a grid of n output columns walking k deep
    sustains; s is how sharply it takes over from the bandwidth (s = 1: its time adds to the stream's, as a serial
    walk over k that the stream does not hide; s = 12: nearly their minimum); q blends the two limits where a kernel
    is neither purely memory- nor compute-bound (q -> infinity is their max, q = 1 their sum). Where it fits the
    range better, the compute runs as a grid of tile_m x tile_n output tiles: m padded to whole tiles, the tiles in
    waves over the SMs (a last, partial wave costs a whole one). Where it reproduces SPLIT_GAIN more of a range's
    rows, m is also rounded up to blocks of R rows (64, 128 or 256: a kernel's tile rows times its cluster), and an
    emptier last block costs e^x x bytes / (pad_eta x B x (1 + (n0 / n)^h)), e its empty share: vLLM's CUTLASS fp8
    kernel for m > 128 on Hopper (128-row tiles in clusters of two) takes 302 us at m = 257 and 182 us at m = 512
    (n = k = 16,384, H200), and grids narrower than about n0 columns do not pay it. mu_large is the achieved
    fraction of peak FLOP/s on large compute-bound rows (m, n, k >= 4096), the floor past the last range."""
    out = {}
    for dt in sorted(df.gemm_dtype.unique()):
        wb, ab = WEIGHT_BYTES.get(dt), ACT_BYTES.get(dt, 2)
        if wb is None:
            continue
        flops_peak = (f8 if ab < 2 and f8 else f16) * (2 if dt == "nvfp4" else 1)
        buckets, hits, total, pre_hits, pre_total = [], 0, 0, 0, 0
        for lo, hi in GEMM_BUCKETS:
            d = df[(df.gemm_dtype == dt) & (df.m >= lo) & (df.m <= hi)]
            if d.empty:
                continue
            share, rows, p, tile, pad = _fit_gemm_range(d, wb, ab, peak, flops_peak, sms)
            bucket = _gemm_bucket(p, hi, tile, sms, pad)
            for deep_k in DEEP_K if hi <= DECODE_TOKENS else ():
                parts = (d[d.k < deep_k], d[d.k >= deep_k])
                if min(_gemm_big(h, wb, ab).sum() for h in parts) < SPLIT_ROWS:
                    continue
                # the two halves, each on its own tiles or the range's
                halves = [_fit_gemm_range(h, wb, ab, peak, flops_peak, sms,
                                          tiles=(None,) if tile is None else (None, tile)) for h in parts]
                split = _split_share([h[:2] for h in halves], rows, share)
                if split is not None:
                    (_, _, p0, t0_, pad0), (_, _, p1, t1, pad1) = halves
                    share = round(split, 3)
                    bucket = dict(_gemm_bucket(p0, hi, t0_, sms, pad0),
                                  deep=dict(_gemm_bucket(p1, hi, t1, sms, pad1), min_k=deep_k))
            if hi <= DECODE_TOKENS:
                hits, total = hits + (share or 0.0) * rows, total + rows
            else:
                pre_hits, pre_total = pre_hits + (share or 0.0) * rows, pre_total + rows
            buckets.append(dict(bucket, within_10pct=share, rows_64mib=rows))
        # what kvplan gives the step's small kernels (norms, rotary, activation, the sampler's, the query's fp8
        # conversion): the fixed cost of a kernel that moves almost nothing, the median time of the m <= 16 GEMMs of
        # weights under 256 KiB; and the achieved fraction of peak bandwidth of a weight read at a few tokens
        # (m <= 16, >= 64 MiB)
        few = df[(df.gemm_dtype == dt) & (df.m <= 16)]
        byt = (few.n * few.k * wb + few.m * few.k * ab + few.m * few.n * 2).to_numpy(float)
        small_t0 = float(np.median(few.latency.to_numpy(float)[(few.n * few.k * wb < 256 * 1024).to_numpy()]) / 1e3)
        sec = few.latency.to_numpy(float) / 1e3 - small_t0
        eta = float(np.median((byt / sec)[byt >= 64 * MB]) / peak)
        large = df[(df.gemm_dtype == dt) & (df.m >= 4096) & (df.n >= 4096) & (df.k >= 4096)]
        t0 = buckets[-1]["t0_s"]
        fl = (2.0 * large.m * large.n * large.k).to_numpy(float)
        mu = float(np.median(fl / (flops_peak * (large.latency.to_numpy(float) / 1e3 - t0)))) if len(large) else 0.5
        out[dt] = dict(t0_s=small_t0, eta=eta, mu=mu, peak_flops=flops_peak,
                       buckets=buckets, within_10pct=round(hits / total, 3) if total else None,
                       rows_64mib=int(total),
                       prefill_within_10pct=round(pre_hits / pre_total, 3) if pre_total else None,
                       prefill_rows_64mib=int(pre_total))
    return out


def moe(df, peak, f16, f8):
    """Fused MoE layer (routed as real routers route, no expert parallelism): t = t0 + c_e x experts touched
    + max(bytes / (eta x B), flops / (mu x F)), the experts the tokens touch under the power-law routing of the
    tables' power_law_1.01 rows (kvplan.sizing.routing.experts_touched, the count the step model prices with),
    their bytes the three matrices each holds on this rank; c_e is each touched expert's own block walk (narrow
    experts under a large MoE TP run far below the bandwidth). The balanced rows (uniform routing) are left out:
    no router spreads tokens evenly, and at decode batches of tens to hundreds of tokens the skew touches a
    third fewer experts (the power-law rows run 75-90% of the balanced rows' time there)."""
    out = {}
    df = df[(df.distribution == f"power_law_{ROUTING_ALPHA}") & (df.moe_ep_size == 1)]
    for dt in sorted(df.moe_dtype.unique()):
        wb = WEIGHT_BYTES.get(dt)
        if wb is None:
            continue
        flops_peak = f8 if dt.startswith("fp8") and f8 else f16

        def feats(d):
            inter = d.inter_size / d.moe_tp_size
            e, k, t = d.num_experts, d.topk, d.num_tokens
            touched = np.array([experts_touched(int(a), int(b), float(c)) for a, b, c in zip(e, k, t)])
            return (touched, touched * (3 * d.hidden_size * inter * wb).to_numpy(float),
                    (t * k * 6.0 * d.hidden_size * inter).to_numpy(float), d.latency.to_numpy(float) / 1e3)
        d = df[(df.moe_dtype == dt) & (df.num_tokens <= 64)]
        touched, byt, fl, y = feats(d)
        big = byt >= 64 * MB
        coef, _ = _lstsq([np.ones_like(y), touched, byt], y, 1 / y * np.where(big, 1.0, 0.3))
        t0, c_e, eta = float(coef[0]), float(max(coef[1], 0.0)), float(1 / (coef[2] * peak))
        tl, _, fll, yl = feats(df[(df.moe_dtype == dt) & (df.num_tokens >= 4096)])
        mu = float(np.median(fll / (flops_peak * (yl - t0 - c_e * tl)))) if len(yl) else 0.5
        pred = t0 + c_e * touched + np.maximum(byt / (eta * peak), fl / (mu * flops_peak))
        share, rows = _share(pred, y, big)
        out[dt] = dict(t0_s=t0, per_expert_s=c_e, eta=eta, mu=mu, peak_flops=flops_peak, within_10pct=share,
                       rows_64mib=rows)
    return out


def allreduce(df):
    """NCCL all-reduce of 16-bit values by world size: t = t0 + bytes / rate, from messages of 256 B to 64 MiB.
    message_size counts elements (2 bytes each): read as bytes, 8 H100s would reach only 222 GB/s of bus bandwidth
    at 512 MiB, half of what NCCL reaches over NVLink."""
    out = {}
    d = df[(df.op_name == "all_reduce") & (df.nccl_dtype == "half") & (df.message_size <= 32 * MB)]
    for n in sorted(d.num_gpus.unique()):
        x = d[d.num_gpus == n]
        byt, y = (x.message_size * 2).to_numpy(float), x.latency.to_numpy(float) / 1e3
        coef, pred = _lstsq([np.ones_like(y), byt], y, 1 / y)
        share, rows = _share(pred, y, np.ones_like(y, dtype=bool))
        out[int(n)] = dict(t0_s=float(coef[0]), bytes_per_s=float(1 / coef[1]), within_10pct=share, rows=rows)
    return out


# vLLM's custom all-reduce takes messages below 8 MiB (distributed/device_communicators/custom_all_reduce.py:
# CustomAllreduce max_size 8192 x 1024, should_custom_ar), on 2, 4, 6 or 8 GPUs (_SUPPORTED_WORLD_SIZES)
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * MB


def graph_allreduce(df):
    """vLLM's custom all-reduce of 16-bit values replayed in a CUDA graph (kernel_source vLLM_custom_graph), by world
    size: t = t0 + bytes / rate over the messages it takes (below CUSTOM_ALLREDUCE_MAX_BYTES; message_size counts
    elements, as in the NCCL table). No launch or staging copy: a third of NCCL's fixed cost on 8 H200s."""
    out = {}
    d = df[(df.op_name == "all_reduce") & (df.kernel_source == "vLLM_custom_graph")
           & (df.message_size * 2 < CUSTOM_ALLREDUCE_MAX_BYTES)]
    for n in sorted(d.num_gpus.unique()):
        x = d[d.num_gpus == n]
        byt, y = (x.message_size * 2).to_numpy(float), x.latency.to_numpy(float) / 1e3
        coef, pred = _lstsq([np.ones_like(y), byt], y, 1 / y)
        share, rows = _share(pred, y, np.ones_like(y, dtype=bool))
        out[int(n)] = dict(t0_s=float(coef[0]), bytes_per_s=float(1 / coef[1]),
                           max_bytes=CUSTOM_ALLREDUCE_MAX_BYTES, within_10pct=share, rows=rows)
    return out


def _rewrite(profile: Path, edit) -> None:
    """Write `profile` to standard output with `edit(gpus)` applied to its GPUs' fits, its first line (the header
    saying what wrote it) kept: the one frame of every partial refit below."""
    text = profile.read_text()
    doc = yaml.safe_load(text)
    edit(doc["gpus"])
    head = text.splitlines(keepends=True)[0]
    sys.stdout.write(head + yaml.safe_dump(doc, sort_keys=False, width=120))


def update_moe(silicon: Path, profile: Path) -> None:
    """Refit only the fused-MoE fits of an existing profile, the rest kept as it is."""

    def edit(gpus: dict) -> None:
        for folder, (name, peak, f16, f8, *_) in GPUS.items():
            table = silicon / folder / "moe-moe_perf.parquet"
            if table.is_file() and name in gpus:
                gpus[name]["moe"] = moe(pd.read_parquet(table), peak, f16, f8)

    _rewrite(profile, edit)


def update_graph_allreduce(silicon: Path, profile: Path) -> None:
    """Add (or refit) only the graph_allreduce fits of an existing profile, the rest kept as it is."""

    def edit(gpus: dict) -> None:
        for folder, (name, *_) in GPUS.items():
            table = silicon / folder / "comm-custom_allreduce_perf.parquet"
            if table.is_file() and name in gpus:
                gpus[name]["graph_allreduce"] = graph_allreduce(pd.read_parquet(table))

    _rewrite(profile, edit)


def _prefill_big(d) -> np.ndarray:
    """Which rows move at least 64 MiB of queries, keys, values and outputs (the rows the shares count)."""
    return (d.batch_size * d.isl * (2 * d.num_heads + 2 * d.num_key_value_heads) * d.head_dim * 2
            >= 64 * MB).to_numpy()


def _prefill_model(p, x, flops_peak, tile):
    tokens, heads, context, per_key = x
    t0, c_q, mu, c_chain = (float(v) for v in p)
    fit = Fit(t0_s=t0 * 1e-6, per_query_head_s=c_q * 1e-9, mu=mu, peak_flops=flops_peak, tile_tokens=tile,
              per_token_chain_s=c_chain * 1e-9)
    return prefill_attention_seconds(fit, tokens, heads, context, per_key, xp=np), fit


def prefill_attention(df, f16):
    """Prompt attention (the context-attention tables: batch x isl new tokens, causal, no cached prefix): t = t0 +
    max(tokens x heads x (c_q + keys x 4 x head size / (mu x F)), c_chain x keys), keys = (isl + 1) / 2 per query
    on average, walked in whole tiles (1, 64 or 128 tokens: the one that reproduces the rows best); c_q is a query
    row's own cost, c_chain the longest program's serial walk where too few programs run to fill the GPU. Fitted by
    least squares on log time (scipy), rows of >= 64 MiB of queries, keys, values and outputs weighted 1, smaller
    ones 0.3; one fit per KV-cache dtype and head size, on full attention (window 0)."""
    from scipy.optimize import least_squares

    out = {}
    full = df[df.window_size == 0] if "window_size" in df else df
    for kv in ("bfloat16", "fp8"):
        by_dim = {}
        for hd in sorted(full.head_dim.unique()):
            d = full[(full.kv_cache_dtype == kv) & (full.head_dim == hd)]
            if d.empty:
                continue
            isl = d.isl.to_numpy(float)
            x = (d.batch_size.to_numpy(float) * isl, d.num_heads.to_numpy(float), (isl + 1) / 2, 4.0 * hd)
            y = d.latency.to_numpy(float) / 1e3
            big = _prefill_big(d)
            w = np.where(big, 1.0, 0.3)
            best = None
            for tile in (1, 64, 128):
                for start in ((8, 0.3, 0.5, 50), (10, 0.1, 0.7, 0)):
                    r = least_squares(lambda p: np.log(_prefill_model(p, x, f16, tile)[0] / y) * w, start,
                                      bounds=([0, 0, 0.01, 0], [50, 100, 1.0, 1e5]), loss="soft_l1", f_scale=0.05)
                    pred, fit = _prefill_model(r.x, x, f16, tile)
                    share, rows = _share(pred, y, big)
                    if _better(share, best):
                        best = (share, rows, fit)
            share, rows, fit = best
            by_dim[int(hd)] = dict({f: getattr(fit, f) for f in PREFILL_FIELDS}, within_10pct=share,
                                   rows_64mib=rows)
        if by_dim:
            out[kv] = by_dim
    return out


PREFILL_FIELDS = ("t0_s", "per_query_head_s", "mu", "peak_flops", "tile_tokens", "per_token_chain_s")
# GPUs whose context-attention table contradicts itself, and the table of the same chip their prompt attention is
# fitted from instead: H200's (vLLM 0.19) takes longer the more KV heads a call has at the same query heads (16
# query heads, batch 1 x 8,192 tokens: 0.023 ms with 1 KV head, 1.236 ms with 16), where the attention's FLOPs do
# not depend on them, and its rows with a KV head per query head run at a third of H100's FLOP/s (H100: 0.418 ms;
# H200 is the same Hopper chip at the same clocks, and prompt attention is compute-bound)
PREFILL_TABLE_OF = {"h200_sxm": "h100_sxm"}


# GPUs whose decode-attention table runs small grids without splitting the context, and the table of the same chip
# their decode attention is fitted from instead: H200's (vLLM 0.19) takes 44 us for 16 sequences x 4,096 tokens of
# one KV head (0.76 TB/s), H100's 17 us on the same 132 SMs; measured serving on H200 agrees with H100's (MiniMax-M2.5
# on 8 H200s, one KV head a rank: TPOT moves less than 0.1 ms from 1,536 to 5,120 tokens of mean context at 16
# clients). The fit keeps its efficiencies relative to the peak bandwidth, so it runs at the GPU's own.
DECODE_TABLE_OF = {"h200_sxm": "h100_sxm"}


def decode_attention_for(silicon: Path, folder: str) -> dict:
    own = DECODE_TABLE_OF.get(folder, folder)
    _, peak, _, _, l2, sms = GPUS[own]
    return attention(pd.read_parquet(silicon / own / "attention-generation_attention_perf.parquet"), peak, l2, sms)


def prefill_for(silicon: Path, folder: str, f16: float) -> dict:
    own = PREFILL_TABLE_OF.get(folder, folder)
    return prefill_attention(pd.read_parquet(silicon / own / "attention-context_attention_perf.parquet"), f16)


def update_prefill(silicon: Path, profile: Path) -> None:
    """Refit only the prompt-attention fits and the large all-reduces' line of an existing profile (the rest of it
    kept as it is)."""

    def edit(gpus: dict) -> None:
        for folder, (name, peak, f16, f8, l2, sms) in GPUS.items():
            if not (silicon / folder).is_dir() or name not in gpus:
                continue
            gpus[name]["prefill_attention"] = prefill_for(silicon, folder, f16)
            if folder in PREFILL_TABLE_OF:
                gpus[name]["prefill_attention_table"] = PREFILL_TABLE_OF[folder]
            large = allreduce_large(pd.read_parquet(silicon / folder / "comm-nccl_perf.parquet"))
            for n, f in gpus[name]["allreduce"].items():
                f.update(large.get(int(n), {}))

    _rewrite(profile, edit)


def update_decode_attention(silicon: Path, profile: Path) -> None:
    """Refit only the decode-attention fits of the GPUs of DECODE_TABLE_OF in an existing profile (the rest of it
    kept as it is)."""

    def edit(gpus: dict) -> None:
        for folder, (name, *_) in GPUS.items():
            if folder in DECODE_TABLE_OF and (silicon / DECODE_TABLE_OF[folder]).is_dir() and name in gpus:
                gpu = gpus[name]
                gpu["attention"] = decode_attention_for(silicon, folder)
                gpu["attention_table"] = DECODE_TABLE_OF[folder]

    _rewrite(profile, edit)


# MLA's decode module (AIConfigurator's mla_generation_module: vLLM's MLA attention for DeepSeek-V3, from the hidden
# state in to o_proj's output) less its four projections, which kvplan prices as GEMMs: fused q_a + kv_a
# (1,536 + 576 x 7,168), q_b (heads x 192 x 1,536), the absorbed k/v up-projections (heads x 256 x 512) and o_proj
# (7,168 x heads x 128). What is left (rope, the latent's norms, the cache write and the latent attention kernel) is
# t0 + c_seq x sequences + c_head x sequences x heads + max(bytes / (eta x B), c_chain x context), the bytes the
# cache rows read: 576 elements a token, 2 bytes each in bf16, 1 in fp8 (kvplan.sizing.kv_cache)
MLA_PROJECTIONS = lambda heads: ((2112, 7168), (heads * 192, 1536), (heads * 256, 512), (7168, heads * 128))  # noqa
MLA_LATENT = 576
MLA_CACHES = {"bfloat16": 2, "fp8": 1}
# GPUs whose module table kvplan leaves out (their MLA decode keeps the GQA kernel's fit on the latent's bytes):
# B200's rows carry about 50 us a layer beyond their projections at any batch (H100 20, H200 16), which measured vLLM
# serving on B200 does not pay: Kimi-K2.5 NVFP4 on 4 B200s, 4 clients, 1,024 in and out, measures a TPOT of 8.4 ms
# where pricing its 61 layers with that module gives 12.3
MLA_LEFT_OUT = ("b200_sxm",)


def mla_decode(df, gemm_fits: dict, peak: float) -> dict:
    """MLA decode fits by cache dtype from the module table (its block-fp8 projections' rows, DeepSeek-V3's
    checkpoint format), least squares on the module's relative error."""
    from scipy.optimize import least_squares

    from kvplan.sizing.kernel_seconds import gemm_call_seconds
    from kvplan.sizing.step_fits import _fits

    gemm = _fits(gemm_fits)["fp8_block"]
    out = {}
    df = df[df.gemm_type == "fp8_block"]
    for kv, eb in MLA_CACHES.items():
        d = df[df.kv_cache_dtype == kv]
        if d.empty:
            continue
        b, ctx, h = (d[c].to_numpy(float) for c in ("batch_size", "step", "num_heads"))
        y = d.latency.to_numpy(float) / 1e3
        proj = np.array([sum(gemm_call_seconds(gemm, peak, bb, n, k, n * k * (1 + 4 / 128 ** 2), 1.0)
                             for n, k in MLA_PROJECTIONS(int(hh))) for bb, hh in zip(b, h)])
        byt = b * ctx * MLA_LATENT * eb

        def module(p):
            t0, cs, ch, eta, cc = p
            return proj + t0 + cs * b + ch * b * h + np.maximum(byt / (eta * peak), cc * ctx)

        fit = least_squares(lambda p: module(p) / y - 1, [1e-5, 1e-7, 1e-9, 0.7, 1e-9],
                            bounds=([0, 0, 0, 0.05, 0], [1e-3, 1e-5, 1e-6, 1.0, 1e-6])).x
        share = float(np.mean(np.abs(module(fit) / y - 1) < 0.10))
        out[kv] = dict(t0_s=float(fit[0]), per_sequence_head_s=float(fit[1]), per_query_head_s=float(fit[2]),
                       eta=float(fit[3]), per_token_chain_s=float(fit[4]), module_within_10pct=round(share, 3),
                       rows=int(len(y)))
    return out


def update_mla(silicon: Path, profile: Path) -> None:
    """Fit only MLA's decode module where a GPU's folder has its table (the rest of the profile kept as it is)."""

    def edit(gpus: dict) -> None:
        for folder, (name, peak, *_) in GPUS.items():
            table = silicon / folder / "mla-mla_generation_module_perf.parquet"
            if table.is_file() and name in gpus and folder not in MLA_LEFT_OUT:
                gpus[name]["mla"] = mla_decode(pd.read_parquet(table), gpus[name]["gemm"], peak)

    _rewrite(profile, edit)


LARGE_MESSAGE_BYTES = 32 * MB


def allreduce_large(df) -> dict:
    """The line of large all-reduces (16-bit values, messages of 32 MiB to the table's largest, 512 MiB), by world
    size: t = t0 + bytes / rate, fitted as allreduce's line. NCCL's rate keeps rising past the 64 MiB the small line
    is fitted to (8 H200s: 210 GB/s at 64 MiB, 263 GB/s at 512 MiB), so a step's all-reduce of a prompt chunk's
    hidden states (8,192 tokens of 7,168: 117 MB) takes the faster of the two lines."""
    out = {}
    d = df[(df.op_name == "all_reduce") & (df.nccl_dtype == "half") & (df.message_size * 2 >= LARGE_MESSAGE_BYTES)]
    for n in sorted(d.num_gpus.unique()):
        x = d[d.num_gpus == n]
        byt, y = (x.message_size * 2).to_numpy(float), x.latency.to_numpy(float) / 1e3
        coef, pred = _lstsq([np.ones_like(y), byt], y, 1 / y)
        share, rows = _share(pred, y, np.ones_like(y, dtype=bool))
        out[int(n)] = dict(large_message_t0_s=float(coef[0]), large_message_bytes_per_s=float(1 / coef[1]),
                           large_message_within_10pct=share, large_message_rows=rows)
    return out


# GEMM weight dtypes whose table times something other than the kernel, left out of a GPU's fits (kvplan then prices
# them with the fallback dtype's fit, marked estimated). B300's and GB200's fp8_block rows (vLLM 0.24.0, DeepGEMM's
# block-scaled kernel for every row of n >= 64 and k >= 128) take 160-220 us (B300) and 270-430 us (GB200) whatever
# the shape: B300, k = 7,168, m = 8: 177 us at n = 32 and 189 us at n = 65,536, where fp8 per tensor takes 9.7 and
# 77.7 us; a fixed cost per call outside the GEMM, which a serving step replaying its CUDA graph does not pay
GEMM_LEFT_OUT = {"b300_sxm": ("fp8_block",), "gb200": ("fp8_block",)}


def fit_gpu(silicon: Path, folder: str) -> dict:
    """One GPU's profile: every family fitted from its folder's tables (graph_allreduce where the folder has vLLM's
    custom all-reduce table)."""
    name, peak, f16, f8, l2, sms = GPUS[folder]
    base = silicon / folder
    read = lambda stem: pd.read_parquet(base / f"{stem}.parquet")  # noqa: E731
    vllm = yaml.safe_load((base / "collection_meta.yaml").read_text())["runtime"]["version"]
    gemms = read("gemm-gemm_perf")
    fits = {
        "silicon": f"{folder} (vLLM {vllm})", "peak_bandwidth_bytes_per_s": peak,
        "attention": decode_attention_for(silicon, folder),
        "gemm": gemm(gemms[~gemms.gemm_dtype.isin(GEMM_LEFT_OUT.get(folder, ()))], peak, f16, f8, sms),
        "moe": moe(read("moe-moe_perf"), peak, f16, f8),
        "allreduce": {n: dict(f, **allreduce_large(read("comm-nccl_perf")).get(n, {}))
                      for n, f in allreduce(read("comm-nccl_perf")).items()},
    }
    if folder in GEMM_LEFT_OUT:
        fits["gemm_left_out"] = list(GEMM_LEFT_OUT[folder])
    fits["prefill_attention"] = prefill_for(silicon, folder, f16)
    if folder in PREFILL_TABLE_OF:
        fits["prefill_attention_table"] = PREFILL_TABLE_OF[folder]
    if folder in DECODE_TABLE_OF:
        fits["attention_table"] = DECODE_TABLE_OF[folder]
    if (base / "comm-custom_allreduce_perf.parquet").is_file():
        fits["graph_allreduce"] = graph_allreduce(read("comm-custom_allreduce_perf"))
    if (base / "mla-mla_generation_module_perf.parquet").is_file() and folder not in MLA_LEFT_OUT:
        fits["mla"] = mla_decode(read("mla-mla_generation_module_perf"), fits["gemm"], peak)
    return fits


def main(silicon: Path) -> None:
    doc = {"schema": "kvplan-step-profiles/1",
           "source": "fits of AIConfigurator's vLLM kernel timings (ai-dynamo/aiconfigurator @095f58a, Apache-2.0); "
                     "benchmarks/fit_step_profiles.py", "gpus": {}}
    for folder, (name, *_) in GPUS.items():
        if (silicon / folder).is_dir():
            doc["gpus"][name] = fit_gpu(silicon, folder)
    sys.stdout.write("# kvplan's bundled step-time profiles: written by benchmarks/fit_step_profiles.py, do not edit\n")
    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, width=120))


def add_gpus(silicon: Path, profile: Path) -> None:
    """Add the GPUs of GPUS whose folder SILICON holds and the profile lacks, every family fitted; the profile's
    GPUs are kept as they are, byte for byte."""

    def edit(gpus: dict) -> None:
        for folder, (name, *_) in GPUS.items():
            if (silicon / folder).is_dir() and name not in gpus:
                print(f"fitting {folder} as {name}", file=sys.stderr)
                gpus[name] = fit_gpu(silicon, folder)

    _rewrite(profile, edit)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[2] == "--prefill-only":
        update_prefill(Path(sys.argv[1]), Path(sys.argv[3]))
    elif len(sys.argv) > 3 and sys.argv[2] == "--mla-only":
        update_mla(Path(sys.argv[1]), Path(sys.argv[3]))
    elif len(sys.argv) > 3 and sys.argv[2] == "--decode-attention-only":
        update_decode_attention(Path(sys.argv[1]), Path(sys.argv[3]))
    elif len(sys.argv) > 3 and sys.argv[2] == "--moe-only":
        update_moe(Path(sys.argv[1]), Path(sys.argv[3]))
    elif len(sys.argv) > 3 and sys.argv[2] == "--graph-allreduce-only":
        update_graph_allreduce(Path(sys.argv[1]), Path(sys.argv[3]))
    elif len(sys.argv) > 3 and sys.argv[2] == "--add-gpus":
        add_gpus(Path(sys.argv[1]), Path(sys.argv[3]))
    else:
        main(Path(sys.argv[1]))
