"""Capacity: the memory budget, pages, blocks, token slots and concurrency of one rank's KV pool, by vLLM's rules
(v0.30 and later), with the notes and problems a reader of those figures needs. Pure functions, no I/O."""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Optional

from kvplan.plan.totals import deployment_totals, layout_note
from kvplan.plan.vllm_kv_groups import state_pages
from kvplan.plan.vllm_pool import PoolPlan, plan_for
from kvplan.plan.vllm_problems import (
    length_problem,
    longest_fitting,
    pool_problem,
    sampler_problem,
)
from kvplan.rules.vllm import DEFAULT_VLLM
from kvplan.sizing.kv_cache import kv_bytes_per_token, skipped_indices
from kvplan.values import frozen_dataclass


@frozen_dataclass
class CapacityResult:
    model: str
    gpu: Optional[str]
    dtype: str
    tp: int
    weight_dtype: str
    total_bytes: int  # device memory the budget is a fraction of
    memory_source: str
    gpu_memory_utilization: float
    requested_bytes: int  # ceil(total x utilization)
    weight_bytes: int  # held on this rank
    activation_bytes: int
    available_kv_bytes: int
    kv_bytes_per_token: float  # this rank, all layers
    page_bytes: int  # one block of one layer (the largest layer page)
    bytes_per_block: int  # one block across the layers of a KV-cache group
    block_size: int
    num_kv_cache_groups: int
    padding_layers: int
    num_blocks: int  # vLLM's num_gpu_blocks: the pool every KV-cache group draws from (one page a layer of a group)
    token_slots: int  # num_blocks x block_size
    kv_tokens: int  # as vLLM reports "GPU KV cache size: N tokens" (concurrency x max_model_len)
    max_model_len: int
    blocks_per_request: int
    max_concurrency: float  # sequences of max_model_len the pool holds at once
    max_num_batched_tokens: int
    fits: bool
    problem: Optional[str] = None  # why it does not fit, and what to change
    longest_fitting_len: Optional[int] = None
    skip_layers: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    engine: str = "vllm"
    engine_version: str = DEFAULT_VLLM
    pp: int = 1
    dcp: int = 1
    stage_layers: list[list[int]] = field(default_factory=list)  # [first, last + 1] per pipeline stage
    state_layers: int = 0  # layers with a fixed state per sequence (Mamba, gated delta net)
    state_bytes_per_sequence: int = 0  # their state for one sequence on this rank
    log_lines: list[str] = field(default_factory=list)  # what the engine's startup log prints for this pool
    non_kv: dict = field(default_factory=dict)  # weights, activation, persistent, non_torch, cudagraph, total
    deployment: dict = field(default_factory=dict)  # the resolved deployment these figures are for
    # the whole deployment: attention groups (DP ranks, each its own pool), expert-parallel ranks, GPUs
    dp: int = 1
    ep: int = 1
    world_size: int = 1
    total_kv_tokens: int = 0  # kv_tokens x dp
    total_max_concurrency: float = 0.0  # max_concurrency x dp

    def to_dict(self) -> dict:
        return asdict(self)

    def to_frame(self):
        """The result as a one-row DataFrame (needs pandas); `pd.concat` several to compare."""
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in self.to_dict().items()
                             if k not in ("notes", "skip_layers", "deployment")}])


def capacity_of(d) -> CapacityResult:
    """The capacity of a resolved vLLM Deployment."""
    model = d.model
    plan = plan_for(d)
    auto = d.max_model_len == "auto"
    if auto:  # vLLM's -1: the longest length the pool holds one sequence of, up to the model's own
        fitted = longest_fitting(plan.blocks_per_request, plan.num_blocks - 1, model.max_position_embeddings)
        mlen = fitted or model.max_position_embeddings  # nothing fits: the problem below says why
    else:
        mlen = model.max_position_embeddings if d.max_model_len is None else int(d.max_model_len)
    fig = plan.per_length(mlen)
    per_request, num_blocks, groups = fig["blocks_per_request"], plan.num_blocks, plan.groups
    problem, longest = pool_problem(d, plan), None
    if problem is None and not fig["fits"]:
        longest = longest_fitting(plan.blocks_per_request, num_blocks - 1, mlen)
        problem = length_problem(plan, mlen, per_request, longest)
    notes = list(d.notes)
    if problem is None:
        problem, risk = sampler_problem(d, plan)
        if risk:
            notes.append(risk)
    if auto and mlen < model.max_position_embeddings:
        notes.append(f"Auto-fit max_model_len: reduced from {model.max_position_embeddings:,} to {mlen:,}, the "
                     f"longest one sequence of which the pool holds (vLLM's --max-model-len -1)")
    fmt, layers = plan.fmt, plan.layers
    skipped = skipped_indices(layers, fmt)
    state = [lay for lay in layers if lay.kind == "state"]
    notes += _layout_notes(d, plan, skipped)
    notes += layout_note(d, fig["kv_tokens"], plan.weights)
    nk = plan.non_kv.to_dict()
    nk["weights_measured"] = bool(d.measured is not None and d.measured.weights is not None)
    return CapacityResult(
        model=model.name, gpu=d.gpu.name if d.gpu else None, dtype=fmt.name, tp=d.tp, weight_dtype=plan.weight_dtype,
        total_bytes=plan.total, memory_source=plan.memory_source,
        gpu_memory_utilization=plan.gpu_memory_utilization,
        requested_bytes=plan.requested, weight_bytes=plan.weights, activation_bytes=plan.non_kv.activation,
        available_kv_bytes=plan.available, kv_bytes_per_token=kv_bytes_per_token(layers),
        page_bytes=max(s.page_bytes for s in groups.layer_specs), bytes_per_block=groups.bytes_per_block,
        block_size=plan.block_size, num_kv_cache_groups=groups.num_groups, padding_layers=groups.padding_layers,
        num_blocks=num_blocks, token_slots=num_blocks * plan.block_size, kv_tokens=fig["kv_tokens"],
        max_model_len=mlen, blocks_per_request=per_request, max_concurrency=fig["max_concurrency"],
        max_num_batched_tokens=plan.max_num_batched_tokens, fits=problem is None, problem=problem,
        longest_fitting_len=longest, skip_layers=skipped if fmt.name != "auto" else [], notes=notes,
        engine="vllm", engine_version=plan.rules.version, pp=d.pp, dcp=d.dcp,
        stage_layers=[[st.layers_range.start, st.layers_range.stop] for st in plan.stages],
        state_layers=len(state), state_bytes_per_sequence=sum(lay.fixed_bytes for lay in state),
        non_kv=nk,
        log_lines=plan.rules.log_lines(plan.available, int(fig["kv_tokens"]), mlen, fig["max_concurrency"]),
        deployment=d.to_dict(), **deployment_totals(d, fig["kv_tokens"], fig["max_concurrency"]),
    )


def _layout_notes(d, plan: PoolPlan, skipped: list[int]) -> list[str]:
    """What the pool's layout does that a reader of its figures should know: state layers and their pages, caches of
    their own layout, padding layers, a raised block, an overridden block count, pipeline stages, chunked layers."""
    model, fmt, layers, groups, num_blocks = d.model, plan.fmt, plan.layers, plan.groups, plan.num_blocks
    notes: list[str] = []
    b = d.attention_backend
    if b is not None and b.name != "none":  # the backend vLLM runs and the block it set (or --block-size)
        given = (" (--block-size)" if d.block_size_given else "") + (" (--attention-backend)" if b.requested else "")
        notes.append(f"attention backend for {fmt.name}: {b.label}, block {d.block_size}{given}")
    state = [lay for lay in layers if lay.kind == "state"]
    if state:
        per_seq = sum(lay.fixed_bytes for lay in state)
        held = (f"{len(state)} state layers hold {state[0].fixed_bytes:,} B each per sequence ({per_seq / 2**20:.1f} "
                f"MiB a sequence, whatever its length)")
        if model.attention_layers:
            notes.append(f"{held}; vLLM raises the attention block to {plan.block_size:,} tokens so that one page "
                         f"({groups.layer_specs[0].page_bytes:,} B) holds a state page, and a request takes "
                         f"{state_pages(plan.rules, model, plan.gpu)} page(s) per state group")
        else:
            notes.append(f"{held}; with no attention, a block is one sequence's state in every layer and a request "
                         f"takes {state_pages(plan.rules, model, plan.gpu)} of them")
    own = [lay for lay in layers if lay.block_tokens]
    if own:
        growing = [lay for lay in own if lay.kind == "full"]
        ratios = "/".join(str(r) for r in sorted({lay.entry_tokens for lay in growing}))
        notes.append(f"{len(own)} caches over {len({lay.index for lay in own})} layers ({len(growing)} growing by an "
                     f"entry per {ratios} tokens, {len(own) - len(growing)} windowed: the sliding window and the "
                     f"compressor states, {sum(lay.fixed_bytes for lay in own):,} B a sequence); vLLM packs their "
                     f"pages ({', '.join(f'{p:,}' for p in sorted({lay.own_page_bytes for lay in own}))} B) side by "
                     f"side in {groups.num_groups} KV-cache groups sharing blocks of {groups.bytes_per_block:,} B; a "
                     f"request takes blocks in every group, the windowed ones for their window plus the "
                     f"{plan.in_flight:,} tokens in flight")
    if groups.padding_layers:
        notes.append(f"{groups.num_groups} KV-cache groups of {groups.group_size} layers; "
                     f"{groups.padding_layers} padding layers")
    if plan.block_size > d.block_size and skipped:
        notes.append(f"block size raised from {d.block_size} to {plan.block_size} so a skip layer's block fits the "
                     f"{fmt.name} page (vLLM 0.30+)")
    if plan.overridden:
        notes.append(f"--num-gpu-blocks-override: {num_blocks:,} blocks whatever the memory (vLLM does not clamp it)")
    if d.pp > 1:
        b = plan.binding.layers_range
        notes.append(f"pipeline stages of {', '.join(str(len(st.layers_range)) for st in plan.stages)} layers; the "
                     f"stage with layers {b.start}-{b.stop - 1} holds the fewest blocks and sets the pool")
    return notes

