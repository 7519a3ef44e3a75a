"""Why vLLM does not start with a pool, or does not serve one sequence of a length from it: a --kv-cache-memory beyond
the GPU, too little free memory, no budget left after the weights, a max_model_len beyond the pool, the sampler's
warm-up running out of memory; and the longest length a pool serves."""

from __future__ import annotations

import math
from typing import Optional

from kvplan.plan.vllm_pool import PoolPlan
from kvplan.sizing.vllm_memory import FRAGMENTATION_SEEN, sampler_warmup
from kvplan.sizing.vllm_non_torch import pre_snapshot_bytes
from kvplan.units import GiB


def _free_after_context(d) -> int:
    """The memory free when vLLM's worker checks it: after its CUDA context and communicators exist."""
    return d.free_memory_bytes - pre_snapshot_bytes(d.gpu, d.tp, d.rules, moe=d.model.moe is not None, pp=d.pp)


def pool_problem(d, plan: PoolPlan) -> Optional[str]:
    """Why vLLM does not start with this pool whatever the max_model_len (None when it does): a --kv-cache-memory
    beyond the GPU, too little free memory for the utilization, or weights that leave no budget."""
    model = d.model
    if d.kv_cache_memory_bytes is not None and d.total_bytes and plan.weights + plan.available > d.total_bytes:
        return (
            f"--kv-cache-memory {plan.available / GiB:.2f} GiB and {model.name}'s weights "
            f"({plan.weights / GiB:.2f} GiB per rank) exceed the GPU's {d.total_bytes / GiB:.2f} GiB; vLLM would "
            f"run out of memory allocating the pool (lower --kv-cache-memory)"
        )
    if (d.free_memory_bytes is not None and d.kv_cache_memory_bytes is None
            and (seen := _free_after_context(d)) < plan.requested):
        fits_util = math.floor(max(0, seen) / d.total_bytes * 100) / 100
        return (
            f"vLLM refuses to start: {d.free_memory_bytes / GiB:.2f} GiB free, {seen / GiB:.2f} GiB once its CUDA "
            f"{'context and communicators exist' if d.tp > 1 else 'context exists'}, is less than the "
            f"{plan.requested / GiB:.2f} GiB --gpu-memory-utilization {d.gpu_memory_utilization:g} asks for (of "
            f"{d.total_bytes / GiB:.2f} GiB); "
            + (f"--gpu-memory-utilization {fits_util:.2f} fits, or " if fits_util > 0 else "")
            + "free the memory another process holds"
        )
    if plan.available <= 0 and not plan.overridden:
        return (
            f"{model.name}'s weights ({plan.weights / GiB:.2f} GiB per rank) and the "
            f"{(plan.non_kv.total - plan.non_kv.weights) / GiB:.2f} GiB beyond them exceed the "
            f"{plan.requested / GiB:.2f} GiB budget; raise --tp, use a smaller --weight-dtype, or raise "
            f"--gpu-memory-utilization"
        )
    return None


def length_problem(plan: PoolPlan, mlen: int, per_request: int, longest: Optional[int]) -> str:
    """Why a pool that vLLM allocates does not serve one sequence of `mlen` (per_request blocks each; `longest`:
    the longest length that fits, None when not even one block does)."""
    fix = f"the longest that fits is {longest:,} tokens" if longest else "not even one block fits"
    return (
        f"the {plan.available / GiB:.2f} GiB pool holds not one sequence of --max-model-len {mlen:,} "
        f"({per_request:,} blocks needed, {max(0, plan.num_blocks - 1):,} usable); {fix}: lower --max-model-len, "
        f"raise --tp, or quantize the KV cache"
    )


def sampler_problem(d, plan: PoolPlan) -> tuple[Optional[str], Optional[str]]:
    """vLLM's sampler warm-up after the pool is allocated: (why it runs out of memory, or None; the note when its
    margin is thin, or None)."""
    if plan.non_kv.source != "model" or plan.overridden or d.kv_cache_memory_bytes is not None:
        return None, None
    free, need = sampler_warmup(d.model, d.gpu, plan.non_kv, total_bytes=plan.total, requested=plan.requested,
                                tp=d.tp, version=d.rules,
                                kv_tensor_bytes=plan.available // max(1, plan.groups.group_size))
    fix = "lower --max-num-seqs or --gpu-memory-utilization"
    if free < need:
        return (f"vLLM would run out of memory warming up the sampler with {plan.non_kv.max_num_seqs:,} dummy "
                f"requests: it needs {need / GiB:.2f} GiB and {free / GiB:.2f} GiB are left after the KV "
                f"cache and CUDA graphs; {fix}"), None
    if free - need < FRAGMENTATION_SEEN:
        return None, (f"sampler warm-up at risk: {free / GiB:.2f} GiB are left after the KV cache and CUDA graphs "
                      f"for its {need / GiB:.2f} GiB ({plan.non_kv.max_num_seqs:,} dummy requests), a margin "
                      f"of {(free - need) / GiB:.2f} GiB, less than the {FRAGMENTATION_SEEN / GiB:.1f} GiB the "
                      f"profile run's allocator fragments (up to 0.95 GiB in vLLM 0.19's runs) and the CUDA-graph "
                      f"capture's spread (0.2 GiB) can take; {fix} for a margin")
    return None, None


def longest_fitting(bpr, usable_blocks: int, upper: int) -> Optional[int]:
    """Largest max_model_len whose per-request blocks fit in `usable_blocks` (binary search; bpr is monotone)."""
    if usable_blocks < 1 or bpr(1) > usable_blocks:
        return None
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bpr(mid) <= usable_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo
