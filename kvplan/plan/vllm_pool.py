"""Capacity: the memory budget, pages, blocks, token slots and concurrency of one rank's KV pool, by vLLM's rules
(v0.30 and later). Pure functions, no I/O."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Literal, Optional, Sequence

from kvplan.errors import KvplanError
from kvplan.memo import per_spec
from kvplan.plan.totals import deployment_totals, layout_note
from kvplan.rules.vllm import DEFAULT_VLLM, VllmRules
from kvplan.sizing.kv_cache import (
    LayerKV,
    format_bytes_per_token,
    kv_bytes_per_token,
    kv_heads_per_rank,
    kv_layers,
    skipped_indices,
)
from kvplan.sizing.vllm_memory import (
    FRAGMENTATION_SEEN,
    NonKVMemory,
    all2all_buffer_bytes,
    flat_allowance,
    non_kv_memory,
    pre_snapshot_bytes,
    sampler_warmup,
)
from kvplan.sizing.weights import pipeline_stages, weight_bytes
from kvplan.specs.catalog import ATTENTION_KINDS, GPUSpec, ModelSpec
from kvplan.specs.kv_formats import KVFormat, kv_format
from kvplan.units import GiB
from kvplan.xp import SCALAR


@dataclass(frozen=True)
class _LayerSpec:
    """A layer as vLLM's KV-cache manager sees it: its attention type, how many tokens one block of it holds,
    and the bytes of that block (its page)."""

    kind: Literal["full", "sliding", "chunked", "state"]
    window: Optional[int]  # a sliding layer's window, a chunked layer's chunk
    tokens_per_block: int
    page_bytes: int
    state_blocks: int = 1  # a state layer's pages per request (VllmRules.state_pages: 1, 2 or 3)


def _blocks_per_request(spec: _LayerSpec, max_model_len, in_flight: int, xp=SCALAR, dcp: int = 1):
    if spec.kind == "state":  # MambaSpec: the sequence's state, whatever its length
        return spec.state_blocks + 0 * max_model_len
    if spec.kind == "full":
        # decode-context parallelism spreads each sequence's tokens over dcp ranks
        length = max_model_len if dcp == 1 else xp.ceil(max_model_len / dcp)
        return xp.ceil(length / spec.tokens_per_block)
    if spec.kind == "chunked":  # ChunkedLocalAttentionSpec: one chunk plus the tokens in flight
        return xp.ceil(xp.minimum(spec.window + in_flight, max_model_len) / spec.tokens_per_block)
    # SlidingWindowSpec: the window, plus the tokens in flight, plus one block because the window may start mid-block
    tokens = xp.minimum(spec.window - 1 + in_flight, max_model_len)
    return xp.ceil(tokens / spec.tokens_per_block) + 1


@dataclass(frozen=True)
class KVCacheGroups:
    bytes_per_block: int
    num_groups: int
    padding_layers: int
    groups: tuple[tuple[_LayerSpec, int], ...]  # (spec, number of groups of this spec)
    group_size: int
    block_size: int  # tokens per block of the format's own layers (raised when skip layers need it)
    layer_specs: tuple[_LayerSpec, ...]

    def blocks_per_request(self, max_model_len, in_flight: int, xp=SCALAR, dcp: int = 1):
        # one group: every layer has the same attention type and block, so any layer's count is the group's
        return sum(n * _blocks_per_request(s, max_model_len, in_flight, xp, dcp) for s, n in self.groups)


def state_pages(rules, model, gpu) -> int:
    """The pages a request holds in each of `model`'s state groups under `rules` (VllmRules.state_pages)."""
    st = model.state
    return rules.state_pages(st.kind if st else "", not model.attention_layers,
                             gpu.compute_capability if gpu else None, st.state_size if st else 0)


def hybrid_state_groups(layers: Sequence[LayerKV], block_size: int, align: int, state_blocks: int,
                        max_model_len: int = 0) -> KVCacheGroups:
    """vLLM's pages and groups for attention beside fixed-state layers (Mamba, gated delta net): the attention block
    grows to B = align x cdiv(state page, align x attention bytes per token) tokens so that one attention page holds a
    state page, and the state page is padded to it (models/config.py HybridAttentionMambaModelConfig); then layers of
    each kind are bucketed, group_size = the larger count if it is below 1.5x the smaller, else the smaller, each
    kind in cdiv(count, group_size) groups, and every block of the shared pool holds one page of each layer of a
    group (kv_cache_utils). A request needs cdiv(max_model_len, B) blocks per attention group and `state_blocks` per
    state group."""
    attn = [lay for lay in layers if lay.kind != "state"]
    state = [lay for lay in layers if lay.kind == "state"]
    if not attn:  # attention-free: one group of every state layer; a MambaSpec block spans max_model_len tokens
        page = max(lay.fixed_bytes for lay in state)
        spec = _LayerSpec("state", None, max_model_len, page, state_blocks)
        return KVCacheGroups(len(state) * page, 1, 0, ((spec, 1),), len(state), max_model_len,
                             tuple(spec for _ in state))
    per_token = max(lay.bytes_per_token for lay in attn)
    if len({lay.bytes_per_token for lay in attn}) > 1 or any(lay.kind != "full" for lay in attn):
        raise KvplanError("a hybrid of fixed-state layers with sliding-window or mixed-size attention layers is not "
                          "modelled yet; plan it without --kv-cache-dtype-skip-layers")
    state_page = max(lay.fixed_bytes for lay in state)
    block = max(block_size, align * math.ceil(state_page / (align * per_token)))
    page = math.ceil(block * per_token)
    specs = [_LayerSpec("full", None, block, page) for _ in attn] + \
        [_LayerSpec("state", None, block, page, state_blocks) for _ in state]
    lo, hi = sorted((len(attn), len(state)))
    group_size = hi if hi < 1.5 * lo else lo
    groups = ((specs[0], math.ceil(len(attn) / group_size)), (specs[-1], math.ceil(len(state) / group_size)))
    num_groups = sum(n for _, n in groups)
    return KVCacheGroups(group_size * page, num_groups, num_groups * group_size - len(specs), groups, group_size,
                         block, tuple(specs))


def _approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """vLLM's chunk size with the least upward padding over `values` (ties: the larger), tried from lower_bound up to
    the largest value (kv_cache_planning._approximate_gcd)."""
    best, best_pad = lower_bound, None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def packed_kv_cache_groups(layers: Sequence[LayerKV]) -> KVCacheGroups:
    """vLLM 0.33's groups for caches whose pages differ and are packed side by side in each block (the block-outermost
    layout a DeepSeek-V4 backend declares; kv_cache_planning._get_packed_kv_cache_groups):

    * caches are bucketed by type: the same tokens per block, and full attention or one sliding window;
    * a bucket is balanced when it holds as many caches of each page size; the largest balanced bucket of several page
      sizes sets the fewest pattern repeats a group may hold, and the repeats per group are the number from there up
      that pads the balanced buckets' counts least; a balanced bucket splits into cdiv(count, repeats) groups (caches
      [i::n] of it), any other bucket is one group;
    * every block of the shared pool holds one page of each cache of the widest group, so a block is the largest sum
      of pages over the groups, and a request takes blocks in every group by that group's rule."""
    specs = [_LayerSpec("sliding" if lay.kind == "sliding" else "full", lay.window if lay.kind == "sliding" else None,
                        lay.block_tokens, lay.own_page_bytes) for lay in layers]
    buckets: dict[tuple, list[_LayerSpec]] = {}
    for sp in specs:
        buckets.setdefault((sp.kind, sp.window, sp.tokens_per_block), []).append(sp)
    bucketed = []
    for members in buckets.values():
        by_page: dict[int, list[_LayerSpec]] = {}
        for sp in members:
            by_page.setdefault(sp.page_bytes, []).append(sp)
        most = max(len(v) for v in by_page.values())
        bucketed.append((members, by_page, most, len({len(v) for v in by_page.values()}) == 1))
    least = max((most for _, by_page, most, balanced in bucketed if balanced and len(by_page) > 1), default=0)
    repeats = _approximate_gcd([most for *_, most, balanced in bucketed if balanced], least) if least else None
    groups: list[list[_LayerSpec]] = []
    for members, by_page, most, balanced in bucketed:
        n = -(-most // repeats) if balanced and repeats else 1
        if repeats is None and members[0].kind == "sliding" and len(bucketed) > 1:
            raise KvplanError("vLLM packs sliding-window caches of this layout by a rule kvplan does not model")
        if n == 1:
            groups.append(members)
            continue
        pattern = list(zip(*by_page.values(), strict=True))
        groups += [[sp for rep in pattern[i::n] for sp in rep] for i in range(n)]
    per_group = [sum(sp.page_bytes for sp in g) for g in groups]
    counted: dict[_LayerSpec, int] = {}
    for g in groups:  # a group's caches share one type, so any of them counts its blocks per request
        rep = _LayerSpec(g[0].kind, g[0].window, g[0].tokens_per_block, max(sp.page_bytes for sp in g))
        counted[rep] = counted.get(rep, 0) + 1
    growing = [sp.tokens_per_block for sp in specs if sp.kind == "full"] or [specs[0].tokens_per_block]
    return KVCacheGroups(max(per_group), len(groups), 0, tuple(counted.items()), 1, max(growing), tuple(specs))


def kv_cache_groups(layers: Sequence[LayerKV], block_size: int, primary_format: Optional[str] = None,
                    raise_block_for_skip_layers: bool = True) -> KVCacheGroups:
    """vLLM's pages and KV-cache groups (0.30+: platforms' _align_heterogeneous_kv_block_size, then
    kv_cache_planning.get_kv_cache_groups).

    Skip layers: when some layers keep the model dtype (more bytes per token than the format's layers), vLLM raises
    the block size to block_size x cdiv(skip bytes per token, format bytes per token), so that the format's page
    (new block size x its bytes per token) holds at least one kernel block of a skip layer. Full-attention skip
    layers keep that many tokens per block at their own size; sliding-window skip layers are padded to the shared
    page and hold the largest multiple of block_size tokens that fits.
    Chunked-local layers (Llama 4) are a type of their own: vLLM keeps its hybrid manager on for them
    (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 1 in envs.py, 0.19 to 0.33), and a request holds
    at most one chunk plus the tokens in flight of such a layer.
    One attention type: a single group, a block spans every layer. Several types (sliding + full): pages are made
    equal (scaled when one divides the other, padded otherwise), layers are split into groups of `group_size`
    layers of one type, short groups are padded, and every block of the shared pool holds one page of each layer of
    a group.
    """
    primary = [lay.bytes_per_token for lay in layers if lay.format == primary_format] or [layers[0].bytes_per_token]
    primary_1tok = max(primary)
    largest = max(lay.bytes_per_token for lay in layers)
    raise_block = raise_block_for_skip_layers and largest > primary_1tok
    block = block_size * math.ceil(largest / primary_1tok) if raise_block else block_size
    shared_page = math.ceil(block * primary_1tok)
    specs = []
    for lay in layers:
        kind = lay.kind if lay.kind in ("sliding", "chunked") else "full"
        window = lay.window if kind != "full" else None
        if lay.bytes_per_token <= primary_1tok or kind == "full" or not raise_block:
            specs.append(_LayerSpec(kind, window, block, math.ceil(block * lay.bytes_per_token)))
        else:
            fits = block_size * max(1, int(shared_page // (block_size * lay.bytes_per_token)))
            specs.append(_LayerSpec(kind, window, fits, shared_page))
    if len({(s.kind, s.window) for s in specs}) == 1:
        # UniformTypeKVCacheSpecs: one group; a block holds one page of every layer, whatever their sizes
        return KVCacheGroups(sum(s.page_bytes for s in specs), 1, 0, ((specs[0], 1),), len(specs), block,
                             tuple(specs))
    # Hybrid: one page size for every group (unify_kv_cache_spec_page_size)
    max_page = max(s.page_bytes for s in specs)
    unified = []
    for s in specs:
        if s.page_bytes == max_page:
            unified.append(s)
        elif max_page % s.page_bytes == 0:  # a larger block of the same layer fills the page exactly
            unified.append(_LayerSpec(s.kind, s.window, s.tokens_per_block * (max_page // s.page_bytes), max_page))
        else:  # padded: the same tokens in a larger page
            unified.append(_LayerSpec(s.kind, s.window, s.tokens_per_block, max_page))
    counts: dict[_LayerSpec, int] = {}
    for s in unified:
        counts[s] = counts.get(s, 0) + 1
    lo, hi = min(counts.values()), max(counts.values())
    group_size = hi if hi < 1.5 * lo else lo
    groups = tuple((s, math.ceil(n / group_size)) for s, n in counts.items())
    num_groups = sum(n for _, n in groups)
    return KVCacheGroups(group_size * max_page, num_groups, num_groups * group_size - len(unified), groups,
                         group_size, min(s.tokens_per_block for s in unified), tuple(unified))


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


def _free_after_context(d) -> int:
    """The memory free when vLLM's worker checks it: after its CUDA context and communicators exist."""
    return d.free_memory_bytes - pre_snapshot_bytes(d.gpu, d.tp, d.rules, moe=d.model.moe is not None, pp=d.pp)


def capacity_of(d) -> CapacityResult:
    """The capacity of a resolved vLLM Deployment."""
    model = d.model
    plan = plan_for(d)
    auto = d.max_model_len == "auto"
    if auto:  # vLLM's -1: the longest length the pool holds one sequence of, up to the model's own
        fitted = _longest_fitting(plan.blocks_per_request, plan.num_blocks - 1, model.max_position_embeddings)
        mlen = fitted or model.max_position_embeddings  # nothing fits: the problem below says why
    else:
        mlen = model.max_position_embeddings if d.max_model_len is None else int(d.max_model_len)
    fig = plan.per_length(mlen)
    per_request, num_blocks, groups = fig["blocks_per_request"], plan.num_blocks, plan.groups
    problem, longest = pool_problem(d, plan), None
    if problem is None and not fig["fits"]:
        longest = _longest_fitting(plan.blocks_per_request, num_blocks - 1, mlen)
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


def _longest_fitting(bpr, usable_blocks: int, upper: int) -> Optional[int]:
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
