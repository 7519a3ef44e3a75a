"""Capacity: the memory budget, pages, blocks, token slots and concurrency of one rank's KV pool, by vLLM's rules
(v0.30 and later). Pure functions, no I/O."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Literal, Optional, Sequence

from .engine import (
    GiB,
    LayerKV,
    SkipLayers,
    check_tp,
    kv_bytes_per_token,
    kv_heads_per_rank,
    kv_layers,
)
from .engines import VllmRules, backend_block_size, vllm_rules
from .errors import KvplanError
from .formats import KVFormat, kv_format
from .nonkv import NonKVMemory, flat_allowance, non_kv_memory, serve_defaults
from .specs import GPUSpec, ModelSpec, gpu_by_memory, load_gpu
from .weights import pipeline_stages, weight_bytes
from .xp import SCALAR

SEEDS_ALLOWANCE_GIB = 6.0  # the back-of-envelope allowance for activations, CUDA graphs, NCCL and the CUDA context
DEFAULT_BLOCK_SIZE = 16  # vLLM's CacheConfig.DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class _LayerSpec:
    """A layer as vLLM's KV-cache manager sees it: its attention type, how many tokens one block of it holds,
    and the bytes of that block (its page)."""

    kind: Literal["full", "sliding"]
    window: Optional[int]
    tokens_per_block: int
    page_bytes: int


def _blocks_per_request(spec: _LayerSpec, max_model_len, in_flight: int, xp=SCALAR, dcp: int = 1):
    if spec.kind == "full":
        # decode-context parallelism spreads each sequence's tokens over dcp ranks
        length = max_model_len if dcp == 1 else xp.ceil(max_model_len / dcp)
        return xp.ceil(length / spec.tokens_per_block)
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


def kv_cache_groups(layers: Sequence[LayerKV], block_size: int, primary_format: Optional[str] = None,
                    raise_block_for_skip_layers: bool = True) -> KVCacheGroups:
    """vLLM's pages and KV-cache groups (0.30+: platforms' _align_heterogeneous_kv_block_size, then
    kv_cache_planning.get_kv_cache_groups).

    Skip layers: when some layers keep the model dtype (more bytes per token than the format's layers), vLLM raises
    the block size to block_size x cdiv(skip bytes per token, format bytes per token), so that the format's page
    (new block size x its bytes per token) holds at least one kernel block of a skip layer. Full-attention skip
    layers keep that many tokens per block at their own size; sliding-window skip layers are padded to the shared
    page and hold the largest multiple of block_size tokens that fits.
    Chunked-local layers are planned as full attention: vLLM turns its hybrid manager off for them by default.
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
        kind = "sliding" if lay.kind == "sliding" else "full"
        window = lay.window if kind == "sliding" else None
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
    num_blocks: int
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
    engine_version: str = "0.33"
    pp: int = 1
    dcp: int = 1
    stage_layers: list[list[int]] = field(default_factory=list)  # [first, last + 1] per pipeline stage
    log_lines: list[str] = field(default_factory=list)  # what the engine's startup log prints for this pool
    non_kv: dict = field(default_factory=dict)  # weights, activation, persistent, non_torch, cudagraph, total

    def to_dict(self) -> dict:
        return asdict(self)

    def to_frame(self):
        """The result as a one-row DataFrame (needs pandas); `pd.concat` several to compare."""
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in self.to_dict().items() if k not in ("notes", "skip_layers")}])


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
                    & (max_model_len <= self.model.max_position_embeddings))


def pool_plan(model: ModelSpec, gpu: Optional[GPUSpec] = None, dtype: str | KVFormat = "auto", *, tp: int = 1,
              pp: int = 1, dcp: int = 1, engine_version: Optional[str] = None,
              gpu_memory_utilization: Optional[float] = None, block_size: Optional[int] = None,
              activation_gib: Optional[float] = None, non_torch_gib: Optional[float] = None,
              cudagraph_gib: Optional[float] = None, gpu_memory_gib: Optional[float] = None,
              kv_cache_memory_gib: Optional[float] = None, weight_dtype: Optional[str] = None,
              skip: SkipLayers = None, max_num_batched_tokens: Optional[int] = None,
              max_num_seqs: Optional[int] = None, enforce_eager: bool = False,
              num_gpu_blocks_override: Optional[int] = None, entrypoint: str = "serve",
              measured_non_kv: Optional[tuple[Optional[int], int]] = None) -> PoolPlan:
    """The budget, pages, groups and blocks of the KV pool per rank (vLLM's rules); checks the options.

    The non-KV memory is vLLM's, part by part (kvplan.nonkv); `non_torch_gib` and `cudagraph_gib` replace those
    parts and `activation_gib` the activation peak. `activation_gib` alone is one flat allowance for everything
    beyond the weights, as in the back-of-envelope budget (6.0 GiB). `measured_non_kv` (weights or None, overhead
    beyond them), from a deployment profile, replaces the model: measured weights when the layout is the one
    measured, modelled weights otherwise."""
    check_tp(model, tp)
    rules = vllm_rules(engine_version)
    if gpu_memory_utilization is None:
        gpu_memory_utilization = rules.default_gpu_memory_utilization
    if not 0 < gpu_memory_utilization <= 1:
        raise KvplanError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size is not None and block_size < 1:
        raise KvplanError(f"--block-size must be positive, got {block_size}")
    for name, v in (("--activation-gib", activation_gib), ("--non-torch-gib", non_torch_gib),
                    ("--cudagraph-gib", cudagraph_gib)):
        if v is not None and v < 0:
            raise KvplanError(f"{name} must not be negative, got {v}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise KvplanError(f"--max-num-seqs must be positive, got {max_num_seqs}")
    if not 1 <= pp <= model.num_layers:
        raise KvplanError(f"--pp must be between 1 and {model.name}'s {model.num_layers} layers, got {pp}")
    if dcp < 1 or tp % dcp:
        raise KvplanError(f"--dcp {dcp} must divide --tp {tp} (decode-context parallelism reuses the TP ranks)")
    if num_gpu_blocks_override is not None and num_gpu_blocks_override < 1:
        raise KvplanError(f"--num-gpu-blocks-override must be positive, got {num_gpu_blocks_override}")
    fmt = dtype if isinstance(dtype, KVFormat) else kv_format(dtype)
    if block_size is None:  # the attention backend's (FlashMLA 64, CUTLASS MLA 128, else vLLM's 16)
        block_size = backend_block_size(model.is_mla, gpu.compute_capability if gpu else None, fmt.name)
    if fmt.name in rules.cache_dtypes_missing:
        raise KvplanError(f"KV cache dtype '{fmt.name}' does not exist in {rules.label}; it arrived later "
                          f"(choose a later --engine-version)")
    if gpu_memory_gib is not None:
        if gpu_memory_gib <= 0:
            raise KvplanError(f"--gpu-memory-gib must be positive, got {gpu_memory_gib}")
        total, source = int(round(gpu_memory_gib * GiB)), "--gpu-memory-gib"
    elif gpu is not None:
        total, source = gpu.memory_total_bytes, f"{gpu.name}: {gpu.memory_source}"
    elif kv_cache_memory_gib is None and num_gpu_blocks_override is None:
        raise KvplanError("capacity needs --gpu (or --gpu-memory-gib, or --kv-cache-memory)")
    else:
        total, source = 0, "not used (--kv-cache-memory)" if kv_cache_memory_gib else "not used"
    if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
        raise KvplanError(f"--max-num-batched-tokens must be positive, got {max_num_batched_tokens}")
    if kv_cache_memory_gib is not None and kv_cache_memory_gib <= 0:
        raise KvplanError(f"--kv-cache-memory must be positive, got {kv_cache_memory_gib}")
    defaults = serve_defaults(total, gpu, rules, model.max_position_embeddings, entrypoint)
    t_batched = max_num_batched_tokens or defaults.max_num_batched_tokens
    seqs = max_num_seqs or defaults.max_num_seqs
    requested = math.ceil(total * gpu_memory_utilization)
    flat = activation_gib is not None and non_torch_gib is None and cudagraph_gib is None

    all_layers = _version_layers(kv_layers(model, fmt, tp, skip), model, fmt, tp, rules)
    stages = []
    for rng in pipeline_stages(model.num_layers, pp):
        wb = weight_bytes(model, tp, weight_dtype, stage=rng)
        if measured_non_kv is not None:
            w, overhead = measured_non_kv
            nk = NonKVMemory(w if w is not None else wb.total, overhead, 0, 0, 0, t_batched, seqs, "profile")
        elif flat:
            nk = flat_allowance(wb.total, int(round(activation_gib * GiB)), t_batched, seqs)
        else:
            nk = non_kv_memory(model, gpu, total_bytes=total, tp=tp, weights=wb.total, version=rules, pp=pp,
                               max_model_len=model.max_position_embeddings, max_num_batched_tokens=t_batched,
                               max_num_seqs=seqs, first_stage=rng.start == 0,
                               last_stage=rng.stop == model.num_layers,
                               enforce_eager=enforce_eager)
            nk = replace(nk, **{k: int(round(v * GiB)) for k, v in (("activation", activation_gib),
                                                                     ("non_torch", non_torch_gib),
                                                                     ("cudagraph", cudagraph_gib)) if v is not None})
        if kv_cache_memory_gib is not None:
            available = int(round(kv_cache_memory_gib * GiB))
        else:
            available = requested - nk.total
        layers = all_layers[rng.start:rng.stop]
        groups = kv_cache_groups(layers, block_size, fmt.name, rules.raise_block_for_skip_layers)
        residual = sum(lay.residual_tokens * lay.residual_extra_bytes_per_token for lay in layers)
        stages.append(StagePlan(rng, wb.total, nk, available, layers, groups,
                                math.ceil(residual / groups.bytes_per_block) if residual else 0,
                                max(0, available // groups.bytes_per_block)))
    binding = min(stages, key=lambda st: st.num_blocks)
    return PoolPlan(
        model=model, fmt=fmt, gpu=gpu, rules=rules, tp=tp, pp=pp, dcp=dcp,
        weight_dtype=weight_dtype or model.weight_dtype, total=total, memory_source=source,
        gpu_memory_utilization=gpu_memory_utilization, requested=requested, stages=tuple(stages), binding=binding,
        num_blocks=num_gpu_blocks_override if num_gpu_blocks_override is not None else binding.num_blocks,
        overridden=num_gpu_blocks_override is not None, max_num_batched_tokens=t_batched,
    )


def _version_layers(layers: tuple[LayerKV, ...], model: ModelSpec, fmt: KVFormat, tp: int,
                    rules: VllmRules) -> tuple[LayerKV, ...]:
    """Per-version page quirks: 0.20's SlidingWindowSpec ignores nvfp4 packing, so sliding layers cost one byte per
    element (head + head_v) like fp8."""
    if rules.sliding_nvfp4_packed or fmt.family != "nvfp4" or model.is_mla:
        return layers
    unpacked = kv_heads_per_rank(model, tp) * 2 * (model.head_dim or 0)
    return tuple(replace(lay, bytes_per_token=unpacked) if lay.kind == "sliding" and lay.format == fmt.name else lay
                 for lay in layers)


def capacity(model: ModelSpec, gpu: Optional[GPUSpec] = None, dtype: str | KVFormat = "auto", *, tp: int = 1,
             pp: int = 1, dcp: int = 1, engine_version: Optional[str] = None,
             num_gpu_blocks_override: Optional[int] = None,
             gpu_memory_utilization: Optional[float] = None,
             max_model_len: Optional[int | Literal["auto"]] = None,
             block_size: Optional[int] = None, activation_gib: Optional[float] = None,
             non_torch_gib: Optional[float] = None, cudagraph_gib: Optional[float] = None,
             gpu_memory_gib: Optional[float] = None, kv_cache_memory_gib: Optional[float] = None,
             weight_dtype: Optional[str] = None, skip: SkipLayers = None,
             max_num_batched_tokens: Optional[int] = None, max_num_seqs: Optional[int] = None,
             enforce_eager: bool = False, entrypoint: str = "serve", profile=None) -> CapacityResult:
    """How many tokens and sequences the KV pool of one rank holds (vLLM's budget, pages and blocks).

    A configuration that does not fit comes back with `fits=False` and `problem` set, so a listing over many models
    can show it; raise on it where a single answer was asked for.

    With a deployment `profile` (kvplan.deploy), the total memory, the engine version and the measured weights and
    overheads of that deployment stand in for the model of them."""
    measured = None
    if profile is not None:
        if profile.engine != "vllm":
            raise KvplanError(f"the profile was measured on {profile.engine}; use --engine {profile.engine}")
        if profile.model != model.name:
            raise KvplanError(f"the profile was measured on {profile.model}, not {model.name}; its overheads do "
                              f"not carry over (import a log of {model.name})")
        same_layout = (tp, pp, weight_dtype) == (profile.tp, profile.pp, profile.weight_dtype)
        measured = (profile.weights_bytes if same_layout else None, profile.overhead_bytes or 0)
        if gpu_memory_gib is None and profile.total_memory_bytes:
            gpu_memory_gib = profile.total_memory_bytes / GiB
        engine_version = engine_version or profile.engine_version
        if gpu is None and profile.gpu:
            gpu = load_gpu(profile.gpu)
    inferred = None
    if gpu is None and gpu_memory_gib is not None and gpu_memory_gib > 0:
        # the architecture sets vLLM's batch defaults and its workspaces: take the GPU this much memory suggests
        gpu = inferred = gpu_by_memory(int(round(gpu_memory_gib * GiB)))
    plan = pool_plan(model, gpu, dtype, tp=tp, pp=pp, dcp=dcp, engine_version=engine_version,
                     num_gpu_blocks_override=num_gpu_blocks_override, gpu_memory_utilization=gpu_memory_utilization,
                     block_size=block_size, activation_gib=activation_gib, non_torch_gib=non_torch_gib,
                     cudagraph_gib=cudagraph_gib, gpu_memory_gib=gpu_memory_gib,
                     kv_cache_memory_gib=kv_cache_memory_gib, weight_dtype=weight_dtype, skip=skip,
                     max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                     enforce_eager=enforce_eager, entrypoint=entrypoint, measured_non_kv=measured)
    auto = max_model_len in ("auto", -1)
    if auto:  # vLLM's -1: the longest length the pool holds one sequence of, up to the model's own
        fitted = _longest_fitting(plan.blocks_per_request, plan.num_blocks - 1, model.max_position_embeddings)
        mlen = fitted or model.max_position_embeddings  # nothing fits: the problem below says why
    else:
        mlen = model.max_position_embeddings if max_model_len is None else int(max_model_len)
    if mlen < 1:
        raise KvplanError(f"--max-model-len must be positive (or auto), got {mlen}")
    if mlen > model.max_position_embeddings:
        raise KvplanError(
            f"--max-model-len {mlen} exceeds {model.name}'s max_position_embeddings "
            f"{model.max_position_embeddings}; vLLM refuses it (lower it, or use a spec with a longer context)"
        )
    fig = plan.per_length(mlen)
    per_request, num_blocks, groups = fig["blocks_per_request"], plan.num_blocks, plan.groups
    problem = longest = None
    if plan.available <= 0 and not plan.overridden:
        problem = (
            f"{model.name}'s weights ({plan.weights / GiB:.2f} GiB per rank) and the "
            f"{(plan.non_kv.total - plan.non_kv.weights) / GiB:.2f} GiB beyond them exceed the "
            f"{plan.requested / GiB:.2f} GiB budget; raise --tp, use a smaller --weight-dtype, or raise "
            f"--gpu-memory-utilization"
        )
    elif not fig["fits"]:
        longest = _longest_fitting(plan.blocks_per_request, num_blocks - 1, mlen)
        fix = f"the longest that fits is {longest:,} tokens" if longest else "not even one block fits"
        problem = (
            f"the {plan.available / GiB:.2f} GiB pool holds not one sequence of --max-model-len {mlen:,} "
            f"({per_request:,} blocks needed, {max(0, num_blocks - 1):,} usable); {fix}: lower --max-model-len, "
            f"raise --tp, or quantize the KV cache"
        )
    notes = []
    if auto and mlen < model.max_position_embeddings:
        notes.append(f"Auto-fit max_model_len: reduced from {model.max_position_embeddings:,} to {mlen:,}, the "
                     f"longest one sequence of which the pool holds (vLLM's --max-model-len -1)")
    if inferred is not None:
        notes.append(f"GPU taken to be {inferred.name}, the catalog GPU nearest {gpu_memory_gib:g} GiB (its "
                     f"architecture sets vLLM's batch defaults and workspaces); pass --gpu to name another")
    elif gpu is None and gpu_memory_gib is not None and kv_cache_memory_gib is None:
        notes.append(f"no catalog GPU has {gpu_memory_gib:g} GiB: architecture-dependent defaults and workspaces "
                     f"are those of an unknown GPU; pass --gpu (a catalog name or a YAML spec)")
    fmt, layers = plan.fmt, plan.layers
    skipped = sorted(i for i, lay in enumerate(layers) if lay.format != fmt.name)
    if groups.padding_layers:
        notes.append(f"{groups.num_groups} KV-cache groups of {groups.group_size} layers; "
                     f"{groups.padding_layers} padding layers")
    asked = block_size or backend_block_size(model.is_mla, gpu.compute_capability if gpu else None, fmt.name)
    if plan.block_size > asked and skipped:
        notes.append(f"block size raised from {asked} to {plan.block_size} so a skip layer's block fits the "
                     f"{fmt.name} page (vLLM 0.30+)")
    if profile is not None:
        notes.append(f"non-KV memory measured by {profile.source or 'a startup log'}"
                     + ("" if measured[0] is not None else "; weights modelled (another layout than measured)"))
    if plan.overridden:
        notes.append(f"--num-gpu-blocks-override: {num_blocks:,} blocks whatever the memory (vLLM does not clamp it)")
    if pp > 1:
        b = plan.binding.layers_range
        notes.append(f"pipeline stages of {', '.join(str(len(st.layers_range)) for st in plan.stages)} layers; the "
                     f"stage with layers {b.start}-{b.stop - 1} holds the fewest blocks and sets the pool")
    if "vllm" not in fmt.engines:
        notes.append(f"{fmt.name} is not a vLLM cache dtype; planned with vLLM's rules as a what-if")
    if any(lay.kind == "chunked" for lay in layers):
        notes.append("chunked-local layers are allocated as full attention (vLLM's hybrid manager is off for them)")
    return CapacityResult(
        model=model.name, gpu=gpu.name if gpu else None, dtype=fmt.name, tp=tp, weight_dtype=plan.weight_dtype,
        total_bytes=plan.total,
        memory_source="measured" if profile is not None and profile.total_memory_bytes
        and plan.total == int(round(profile.total_memory_bytes / GiB * GiB)) else plan.memory_source,
        gpu_memory_utilization=plan.gpu_memory_utilization,
        requested_bytes=plan.requested, weight_bytes=plan.weights, activation_bytes=plan.non_kv.activation,
        available_kv_bytes=plan.available, kv_bytes_per_token=kv_bytes_per_token(layers),
        page_bytes=max(s.page_bytes for s in groups.layer_specs), bytes_per_block=groups.bytes_per_block,
        block_size=plan.block_size, num_kv_cache_groups=groups.num_groups, padding_layers=groups.padding_layers,
        num_blocks=num_blocks, token_slots=num_blocks * plan.block_size, kv_tokens=fig["kv_tokens"],
        max_model_len=mlen, blocks_per_request=per_request, max_concurrency=fig["max_concurrency"],
        max_num_batched_tokens=plan.max_num_batched_tokens, fits=problem is None, problem=problem,
        longest_fitting_len=longest, skip_layers=skipped if fmt.name != "auto" else [], notes=notes,
        engine="vllm", engine_version=plan.rules.version, pp=pp, dcp=dcp,
        stage_layers=[[st.layers_range.start, st.layers_range.stop] for st in plan.stages],
        non_kv=plan.non_kv.to_dict(),
        log_lines=plan.rules.log_lines(plan.available, int(fig["kv_tokens"]), mlen, fig["max_concurrency"]),
    )


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
