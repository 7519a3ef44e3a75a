"""Capacity, whichever engine: the figures every engine's KV pool names alike (PoolResult), and the one function
that plans a resolved deployment's pool with its engine's rules (vLLM: kvplan.plan.vllm_capacity; SGLang:
kvplan.plan.sglang_pool). Each engine's result carries its own figures beside these (vLLM's KV-cache groups and
non-KV parts, SGLang's mem_fraction_static and Mamba state pool)."""

from __future__ import annotations

from typing import Optional, Protocol, Union

from kvplan.plan.sglang_pool import SglangPool, sglang_capacity
from kvplan.plan.vllm_capacity import CapacityResult, capacity_of


class PoolResult(Protocol):
    """One rank's KV pool as every engine's result names it."""

    model: str
    gpu: Optional[str]
    engine: str
    dtype: str  # the KV format stored
    tp: int
    weight_dtype: str
    weight_bytes: int  # held on this rank
    activation_bytes: int  # what the engine keeps outside the pool for activations (and CUDA graphs)
    available_kv_bytes: int  # the pool
    kv_bytes_per_token: float  # this rank, all layers
    page_bytes: int  # one block (page) of one layer
    block_size: int  # tokens a block (page) holds
    num_blocks: int
    kv_tokens: int  # tokens the pool holds, as the engine's log reports them
    max_model_len: int  # the sequence length the concurrency counts
    max_concurrency: float  # sequences of max_model_len the pool holds at once
    fits: bool
    problem: Optional[str]  # why the engine does not start with this pool, and what to change
    notes: list[str]
    log_lines: list[str]  # what the engine's startup log prints for this pool
    deployment: dict  # the resolved deployment these figures are for
    # the whole deployment: attention groups (DP ranks, each its own pool), expert-parallel ranks, GPUs
    dp: int
    ep: int
    world_size: int
    total_kv_tokens: int  # kv_tokens x dp
    total_max_concurrency: float  # max_concurrency x dp

    def to_dict(self) -> dict: ...


SHARED_KEYS = tuple(PoolResult.__annotations__)


def pool_capacity(d) -> Union[CapacityResult, SglangPool]:
    """The KV pool of a resolved Deployment (kvplan.deployment), by its engine's rules: a PoolResult."""
    return sglang_capacity(d) if d.engine == "sglang" else capacity_of(d)
