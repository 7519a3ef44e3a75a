"""The KV pool of one vLLM rank: its memory budget, the non-KV memory taken from it, and the blocks left for each
pipeline stage's KV-cache groups (kvplan.plan.vllm_kv_groups), everything that does not depend on max_model_len.
Pure functions, no I/O."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from kvplan.errors import KvplanError
from kvplan.memo import per_spec
from kvplan.plan.vllm_kv_groups import (
    KVCacheGroups,
    hybrid_state_groups,
    kv_cache_groups,
    one_state_shape,
    packed_kv_cache_groups,
    state_pages,
)
from kvplan.rules.vllm import VllmRules
from kvplan.sizing.kv_cache import LayerKV, format_bytes_per_token, kv_heads_per_rank, kv_layers
from kvplan.sizing.vllm_memory import NonKVMemory, flat_allowance, non_kv_memory
from kvplan.sizing.vllm_non_torch import all2all_buffer_bytes
from kvplan.sizing.weights import pipeline_stages, weight_bytes
from kvplan.specs.catalog import ATTENTION_KINDS, GPUSpec, ModelSpec
from kvplan.specs.kv_formats import KVFormat, kv_format
from kvplan.values import frozen_dataclass
from kvplan.xp import SCALAR


@frozen_dataclass
class StagePlan:
    """One pipeline stage's rank: its layers, weights and pool."""

    layers_range: range
    weights: int
    non_kv: NonKVMemory
    available: int
    layers: tuple[LayerKV, ...]
    groups: KVCacheGroups
    residual_blocks: int  # blocks a request needs for a full-precision residual window (KIVI)
    num_blocks: int


@frozen_dataclass
class PoolPlan:
    """The KV pool of the rank that binds (vLLM takes the fewest blocks over ranks), everything that does not depend
    on max_model_len."""

    model: ModelSpec
    fmt: KVFormat
    gpu: Optional[GPUSpec]
    rules: VllmRules
    tp: int
    pp: int
    dcp: int
    weight_dtype: str
    total: int
    memory_source: str
    gpu_memory_utilization: float
    requested: int
    stages: tuple[StagePlan, ...]
    binding: StagePlan
    num_blocks: int  # the fewest over ranks, or --num-gpu-blocks-override
    overridden: bool
    max_num_batched_tokens: int

    # the binding rank's figures
    @property
    def weights(self) -> int:
        return self.binding.weights

    @property
    def available(self) -> int:
        return self.binding.available

    @property
    def non_kv(self) -> NonKVMemory:
        return self.binding.non_kv

    @property
    def layers(self) -> tuple[LayerKV, ...]:
        return self.binding.layers

    @property
    def groups(self) -> KVCacheGroups:
        return self.binding.groups

    @property
    def block_size(self) -> int:
        return self.binding.groups.block_size

    @property
    def in_flight(self) -> int:
        return self.rules.batches_in_flight * self.max_num_batched_tokens

    def blocks_per_request(self, max_model_len, xp=SCALAR):
        return (self.groups.blocks_per_request(max_model_len, self.in_flight, xp, self.dcp)
                + self.binding.residual_blocks)

    def per_length(self, max_model_len, xp=SCALAR) -> dict:
        """Blocks per request, concurrency and vLLM's reported tokens at `max_model_len` (numbers or arrays)."""
        bpr = self.blocks_per_request(max_model_len, xp)
        concurrency = self.num_blocks / bpr
        if self.rules.reported_tokens == "concurrency":
            tokens = xp.floor(concurrency * max_model_len)
        else:  # 0.20: whole blocks per group, times the decode-context ranks
            tokens = (self.num_blocks // self.groups.num_groups) * self.block_size * self.dcp + 0 * bpr
        usable = self.num_blocks - 1  # block 0 is vLLM's null block
        return dict(blocks_per_request=bpr, max_concurrency=concurrency, kv_tokens=tokens,
                    # vLLM refuses a max_model_len beyond the model's own
                    fits=(bpr <= usable) & ((self.available > 0) | self.overridden)
                    & ((max_model_len <= self.model.max_position_embeddings) | (not self.model.attention_layers)))


def _modelled_non_kv(d, rng: range, weights: int) -> NonKVMemory:
    nk = non_kv_memory(d.model, d.gpu, total_bytes=d.total_bytes, tp=d.tp, weights=weights, version=d.rules,
                       pp=d.pp, max_model_len=d.model.max_position_embeddings,
                       max_num_batched_tokens=d.max_num_batched_tokens, max_num_seqs=d.max_num_seqs,
                       first_stage=rng.start == 0, last_stage=rng.stop == d.model.num_layers,
                       enforce_eager=d.enforce_eager, weight_dtype=d.weight_dtype, stage=rng,
                       layout=d.parallel)
    p = d.parallel
    a2a = all2all_buffer_bytes(d.model, d.a2a_backend, p.domains(p.moe_group) > 1)
    if a2a:  # the expert-parallel all-to-all's own buffers, outside torch
        nk = replace(nk, non_torch=nk.non_torch + a2a, parts={**nk.parts, "all2all_buffers": a2a})
    return replace(nk, **{k: v for k, v in (("activation", d.activation_bytes), ("non_torch", d.non_torch_bytes),
                                            ("cudagraph", d.cudagraph_bytes)) if v is not None})


def _base_overhead(base) -> int:
    """The modelled non-KV memory beyond the weights of the configuration a profile measured (its binding stage)."""
    stages = []
    for rng in pipeline_stages(base.model.num_layers, base.pp):
        wb = weight_bytes(base.model, base.parallel, base.weight_dtype, stage=rng)
        nk = _modelled_non_kv(base, rng, wb.total)
        stages.append(nk.total - nk.weights)
    return max(stages)


@per_spec  # throughput asks it for the pool and for the scheduler's blocks; sweeps per dtype
def plan_for(d) -> PoolPlan:
    """The pool of a resolved vLLM Deployment.

    The non-KV memory is vLLM's, part by part (kvplan.sizing.vllm_memory); --non-torch-gib and --cudagraph-gib replace
    those
    parts and --activation-gib the activation peak. --activation-gib alone is one flat allowance for everything
    beyond the weights, as in the back-of-envelope budget (6.0 GiB). A deployment profile's measured weights and
    overhead replace the model: measured weights when the layout is the one measured, modelled weights otherwise,
    and the overhead re-based by the modelled difference when the configuration differs from the measured one."""
    if d.engine != "vllm":
        raise KvplanError(f"the vLLM pool of an {d.engine} deployment was asked for")
    model, fmt, rules = d.model, d.kv, d.rules
    one_state_shape(model)
    requested = math.ceil(d.total_bytes * d.gpu_memory_utilization)
    kv_tp = d.parallel.attn_tp
    all_layers = _version_layers(kv_layers(model, fmt, kv_tp, d.skip, ssm_default=rules.ssm_cache_default(model)),
                                 model, fmt, kv_tp, rules)
    base_overhead = _base_overhead(d.measured.base) if d.measured and d.measured.base is not None else None
    stages = []
    for rng in pipeline_stages(model.num_layers, d.pp):
        wb = weight_bytes(model, d.parallel, d.weight_dtype, stage=rng)
        if d.measured is not None:
            w = d.measured.weights if d.measured.weights is not None else wb.total
            overhead = d.measured.overhead
            if base_overhead is not None:
                nk_now = _modelled_non_kv(d, rng, wb.total)
                overhead += (nk_now.total - nk_now.weights) - base_overhead
            nk = NonKVMemory(w, overhead, 0, 0, 0, d.max_num_batched_tokens, d.max_num_seqs, "profile")
        elif d.flat_allowance:
            nk = flat_allowance(wb.total, d.activation_bytes, d.max_num_batched_tokens, d.max_num_seqs)
        else:
            nk = _modelled_non_kv(d, rng, wb.total)
        if d.kv_cache_memory_bytes is not None:
            available = d.kv_cache_memory_bytes
        else:
            available = requested - nk.total
        layers = tuple(lay for lay in all_layers if lay.index in rng)  # a layer may hold several caches, or none
        if any(lay.block_tokens for lay in layers):  # caches that lay out their own pages (DeepSeek-V4)
            groups = packed_kv_cache_groups(layers)
        elif any(lay.kind == "state" for lay in layers):
            mlen_now = model.max_position_embeddings if d.max_model_len in (None, "auto") else int(d.max_model_len)
            groups = hybrid_state_groups(layers, d.block_size, 64 if model.is_mla else 16,
                                         state_pages(rules, model, d.gpu), mlen_now)
        else:
            groups = kv_cache_groups(layers, d.block_size, fmt.name, rules.raise_block_for_skip_layers)
        residual = sum(lay.residual_tokens * lay.residual_extra_bytes_per_token for lay in layers)
        stages.append(StagePlan(rng, wb.total, nk, available, layers, groups,
                                math.ceil(residual / groups.bytes_per_block) if residual else 0,
                                max(0, available // groups.bytes_per_block)))
    binding = min(stages, key=lambda st: st.num_blocks)
    override = d.num_gpu_blocks_override
    return PoolPlan(
        model=model, fmt=fmt, gpu=d.gpu, rules=rules, tp=d.tp, pp=d.pp, dcp=d.dcp,
        weight_dtype=d.weight_dtype or model.weight_dtype, total=d.total_bytes, memory_source=d.memory_source,
        gpu_memory_utilization=d.gpu_memory_utilization, requested=requested, stages=tuple(stages),
        binding=binding, num_blocks=override if override is not None else binding.num_blocks,
        overridden=override is not None, max_num_batched_tokens=d.max_num_batched_tokens,
    )


def _version_layers(layers: tuple[LayerKV, ...], model: ModelSpec, fmt: KVFormat, tp: int,
                    rules: VllmRules) -> tuple[LayerKV, ...]:
    """Per-version page quirks: 0.20's SlidingWindowSpec ignores nvfp4 packing, so sliding layers cost one byte per
    element (head + head_v) like fp8; 0.19 caches a V head smaller than K's padded to the K head size."""
    if rules.pads_small_v and model.v_head_dim and not model.is_mla:
        layers = tuple(replace(lay, bytes_per_token=format_bytes_per_token(
            model, fmt if lay.format == fmt.name else kv_format(lay.format), tp, lay.index, v_padded=True))
            if lay.kind in ATTENTION_KINDS and lay.format not in ("state", "indexer") else lay for lay in layers)
    if rules.sliding_nvfp4_packed or fmt.family != "nvfp4" or model.is_mla:
        return layers
    return tuple(replace(lay, bytes_per_token=kv_heads_per_rank(model, tp, lay.index) * 2
                         * (model.layer_head_dim(lay.index) or 0))
                 if lay.kind == "sliding" and lay.format == fmt.name else lay for lay in layers)

