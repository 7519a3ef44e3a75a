"""SGLang's KV pool (v0.5): the budget from free memory before weight loading and --mem-fraction-static, the cell
size per token, the page floor, the sliding-window pool ratio, the padding page, and what its log prints.

Sources: sglang v0.5.23, srt/mem_cache/kv_cache_configurator.py (_profile_available_bytes, token constraints),
srt/model_executor/pool_configurator.py (_compute_cell_size, hybrid SWA), srt/mem_cache/memory_pool.py (allocation
with one padding page). SGLang's defaults and accepted dtypes are in sglang_rules.py. A pure module: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from kvplan.errors import KvplanError
from kvplan.plan.totals import layout_note
from kvplan.rules.sglang import CONTEXT_GIB, SGLANG_DTYPES, SWA_FULL_TOKENS_RATIO, default_mem_fraction_static
from kvplan.sizing.kv_cache import check_tp
from kvplan.sizing.weights import DTYPE_BYTES, weight_bytes
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.kv_formats import KVFormat, kv_format
from kvplan.specs.parallel import Parallel
from kvplan.units import GiB


def cell_bytes(model: ModelSpec, fmt: KVFormat, tp: int, dcp: int = 1) -> tuple[float, float, int, int]:
    """Bytes per token of SGLang's pool on one rank: (full-attention cell, sliding-window cell per token, number of
    full layers, number of sliding layers). SGLang keeps max(1, kv_heads // (tp // dcp)) heads per rank."""
    if fmt.name not in SGLANG_DTYPES:
        raise KvplanError(f"SGLang has no KV cache dtype '{fmt.name}'; it takes "
                          f"{', '.join(sorted(set(SGLANG_DTYPES.values())))}")
    bits = DTYPE_BYTES[model.dtype] * 8
    L = model.num_layers
    if model.mla:
        latent = model.mla.latent_dim
        if fmt.family in ("nvfp4", "mx") and fmt.name != "mxfp8":
            per_layer = latent / 2 + latent // 16
        else:  # the latent in the format's element size (fp8: 1 byte, bf16 and auto: 2)
            data = fmt.k[0]
            per_layer = latent * (bits if data.bits is None else data.bits) // 8
        return per_layer * L, 0.0, L, 0
    if model.kv_heads_per_layer is not None or model.head_dims is not None:
        raise KvplanError(f"{model.name}'s attention layers differ in KV heads or head size; kvplan sizes SGLang's "
                          f"pool for one attention shape only (plan it for vLLM)")
    n = max(1, model.num_kv_heads // max(1, tp // dcp))
    # K and V of one head, every scale included, from the format catalog (the same bytes SGLang's
    # _compute_cell_size counts: fp8 1 byte per element, mxfp8 one e8m0 scale per 32, fp4 two per byte plus an
    # fp8 scale per 16)
    per_layer = n * fmt.bytes_per_token_per_kv_head(model.head_dim or 0, model_bits=bits)
    kinds = model.layer_kinds
    full = sum(1 for k in kinds if k != "sliding")
    return per_layer * full, per_layer, full, L - full


@dataclass
class SglangPool:
    model: str
    dtype: str
    tp: int
    mem_fraction_static: float
    free_before_load_bytes: int
    weight_bytes: int
    available_bytes: int  # what the pool may take: free after load - (1 - f) x free before
    cell_bytes: float  # bytes per token, all full layers (plus the sliding share on hybrid models)
    max_total_num_tokens: int
    swa_tokens: Optional[int]
    page_size: int
    max_running_requests: int
    context_len: int
    k_size_gb: float  # the K buffers as logged (GB = 2^30), padding page included
    log_lines: list[str] = field(default_factory=list)
    gpu: Optional[str] = None
    weight_dtype: Optional[str] = None
    fits: bool = True
    problem: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    engine: str = "sglang"
    deployment: dict = field(default_factory=dict)
    # the whole deployment: attention groups (DP ranks, each its own pool), expert-parallel ranks, GPUs
    dp: int = 1
    ep: int = 1
    world_size: int = 1
    total_kv_tokens: int = 0  # kv_tokens x dp
    total_max_concurrency: float = 0.0  # max_concurrency x dp

    # the quantities every engine's result names alike (kvplan.plan.vllm_pool.CapacityResult's keys)
    @property
    def available_kv_bytes(self) -> int:
        return self.available_bytes

    @property
    def kv_tokens(self) -> int:
        return self.max_total_num_tokens

    @property
    def block_size(self) -> int:
        return self.page_size

    @property
    def num_blocks(self) -> int:
        return self.max_total_num_tokens // self.page_size

    @property
    def page_bytes(self) -> int:
        return math.ceil(self.cell_bytes * self.page_size)

    @property
    def max_concurrency(self) -> float:
        """Sequences of the full context the pool holds at once (SGLang also caps them at max_running_requests)."""
        return min(self.max_total_num_tokens / self.context_len, self.max_running_requests) if self.context_len else 0

    @property
    def activation_bytes(self) -> int:
        """What SGLang leaves outside the pool for activations and CUDA graphs: (1 - f) x free before loading."""
        return int(self.free_before_load_bytes * (1 - self.mem_fraction_static))

    def to_dict(self) -> dict:
        shared = ("available_kv_bytes", "kv_tokens", "num_blocks", "block_size", "page_bytes", "max_concurrency",
                  "activation_bytes")
        return {**asdict(self), **{k: getattr(self, k) for k in shared}}


def sglang_pool(model: ModelSpec, gpu: Optional[GPUSpec], dtype: str | KVFormat = "auto", *, tp: int = 1,
                mem_fraction_static: Optional[float] = None, context_len: Optional[int] = None, page_size: int = 1,
                free_before_load_gib: Optional[float] = None, weight_gib: Optional[float] = None,
                avail_after_load_gib: Optional[float] = None, swa_full_tokens_ratio: float = SWA_FULL_TOKENS_RATIO,
                max_running_requests: Optional[int] = None, weight_dtype: Optional[str] = None,
                total_gib: Optional[float] = None, layout: Optional[Parallel] = None) -> SglangPool:
    """SGLang's max_total_num_tokens for a model on a GPU (one rank's: with data-parallel attention, one attention
    group's rank, `layout`); measured free memories (from a log) replace the estimates."""
    layout = layout or Parallel.tensor(tp)
    check_tp(model, layout.attn_tp)
    fmt = dtype if isinstance(dtype, KVFormat) else kv_format(dtype)
    if page_size < 1:
        raise KvplanError(f"--page-size must be positive, got {page_size}")
    if gpu is None and free_before_load_gib is None:
        raise KvplanError("SGLang's pool needs --gpu (or the free memory a startup log measured)")
    f = (mem_fraction_static if mem_fraction_static is not None else
         default_mem_fraction_static(model, gpu, tp, dp_attention=layout.dp if layout.attn_tp < tp else 0))
    if not 0 < f <= 1:
        raise KvplanError(f"--mem-fraction-static must be in (0, 1], got {f}")
    total = total_gib * GiB if total_gib is not None else (gpu.memory_total_bytes if gpu is not None else None)
    free_before = (free_before_load_gib * GiB if free_before_load_gib is not None
                   else total - CONTEXT_GIB * GiB)
    weights = weight_gib * GiB if weight_gib is not None else weight_bytes(model, layout, weight_dtype).total
    after_load = avail_after_load_gib * GiB if avail_after_load_gib is not None else free_before - weights
    # _profile_available_bytes works in GiB floats and truncates once
    available = int((after_load / GiB - free_before / GiB * (1 - f)) * GiB)
    full_cell, swa_cell, n_full, n_swa = cell_bytes(model, fmt, layout.attn_tp)
    ctx = context_len or model.max_position_embeddings
    swa_tokens = None
    if n_swa and n_full:
        cell = full_cell + swa_full_tokens_ratio * swa_cell * n_swa
        tokens = max(0, int(available // cell)) // page_size * page_size
        swa_tokens = int(tokens * swa_full_tokens_ratio) // page_size * page_size
    else:
        cell = full_cell + swa_cell * n_swa
        tokens = max(0, int(available // cell)) // page_size * page_size
    if max_running_requests is None:
        max_running_requests = min(max(2048, min(4096, int(tokens / ctx * 512))), tokens // 2)
    k_size = (tokens + page_size) * full_cell / 2 / GiB
    storage = {"auto": model.dtype, "bfloat16": "bf16"}.get(fmt.name, fmt.name)
    torch_dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32",
                   "fp8_e4m3": "torch.float8_e4m3fn", "fp8": "torch.float8_e4m3fn", "mxfp8": "torch.float8_e4m3fn",
                   "fp8_e5m2": "torch.float8_e5m2", "nvfp4": "torch.float4_e2m1fn_x2",
                   "fp4_mx_block16": "torch.float4_e2m1fn_x2", "fp4_e2m1": "torch.float4_e2m1fn_x2"}.get(storage, storage)
    lines = [f"KV Cache is allocated. dtype: {torch_dtype}, #tokens: {tokens}, "
             + (f"KV size: {2 * k_size:.2f} GB" if model.mla else f"K size: {k_size:.2f} GB, V size: {k_size:.2f} GB"),
             f"max_total_num_tokens={tokens}, max_running_requests={max_running_requests}, context_len={ctx}"]
    problem, notes = None, []
    if tokens < 1:
        problem = (f"{model.name}'s weights ({weights / GiB:.2f} GiB per rank) leave SGLang no KV pool at "
                   f"--mem-fraction-static {f:g}; raise --tp, use a smaller --weight-dtype, or raise "
                   f"--mem-fraction-static")
    elif tokens < ctx:  # SGLang caps a request's input at max_total_num_tokens - 1 (scheduler.max_req_input_len)
        notes.append(f"the pool holds {tokens:,} tokens, fewer than one sequence of {ctx:,}: SGLang caps each "
                     f"request's input at {tokens - 1:,} tokens")
    pool = SglangPool(model.name, fmt.name, tp, f, int(free_before), int(weights), available, cell, tokens,
                      swa_tokens, page_size, max_running_requests, ctx, round(k_size, 2), lines,
                      gpu=gpu.name if gpu else None, weight_dtype=weight_dtype or model.weight_dtype,
                      fits=problem is None, problem=problem, notes=notes, dp=layout.dp, ep=layout.ep,
                      world_size=layout.world, total_kv_tokens=tokens * layout.dp)
    pool.total_max_concurrency = pool.max_concurrency * layout.dp
    return pool


def sglang_capacity(d) -> SglangPool:
    """SGLang's pool for a resolved Deployment (kvplan.deployment) with engine sglang."""
    from dataclasses import replace

    measured_w = d.measured.weights if d.measured is not None else None
    pool = sglang_pool(
        d.model, d.gpu, d.kv, tp=d.tp, layout=d.parallel, mem_fraction_static=d.mem_fraction_static,
        context_len=d.max_model_len, page_size=d.page_size or 1,
        free_before_load_gib=None if d.free_before_load_bytes is None else d.free_before_load_bytes / GiB,
        weight_gib=None if measured_w is None else measured_w / GiB, weight_dtype=d.weight_dtype,
        total_gib=d.total_bytes / GiB if d.total_bytes else None)
    return replace(pool, notes=list(d.notes) + pool.notes + layout_note(d, pool.kv_tokens, pool.weight_bytes),
                   deployment=d.to_dict())
