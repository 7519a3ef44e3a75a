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
from kvplan.rules.sglang import (CONTEXT_GIB, MAMBA_EMPTY_STATE_SLOTS, MAMBA_FULL_MEMORY_RATIO,
                                 MAMBA_SLOTS_PER_REQUEST, NSA_QUANT_BLOCK, SGLANG_DTYPES, SWA_FULL_TOKENS_RATIO,
                                 mamba_state_bytes)
from kvplan.sizing.kv_cache import check_tp
from kvplan.sizing.weights import weight_bytes
from kvplan.units import DTYPE_BYTES
from kvplan.specs.catalog import ATTENTION_KINDS, GPUSpec, ModelSpec
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
        # DeepSeek sparse attention: each layer's indexer keys beside the latent, fp8 with a float32 scale per 128
        # (model_runner.py profile_max_num_token: index_head_dim + index_head_dim // quant_block_size x 4 uint8)
        per_layer += model.mla.indexer_bytes_per_token
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
    if model.state_layers:  # a hybrid's pool counts its full-attention layers only (config.full_attention_layer_ids)
        full = sum(1 for k in kinds if k in ATTENTION_KINDS and k != "sliding")
        if not full:  # profile_max_num_token would divide by a cell of 0 bytes
            raise KvplanError(f"{model.name} has no full-attention layers: SGLang's hybrid pool sizes the KV of its "
                              f"full-attention layers beside the Mamba state and has none to size; plan it with "
                              f"--engine vllm")
        return per_layer * full, per_layer, full, sum(1 for k in kinds if k == "sliding")
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
    # a hybrid's Mamba state pool (SglangStatePool's fields), an NSA model's indexer cache; absent from to_dict
    # where the model has none
    state: Optional[dict] = None
    indexer: Optional[dict] = None

    # the figures every engine's result names alike (kvplan.plan.capacity.PoolResult), in SGLang's terms
    @property
    def available_kv_bytes(self) -> int:
        return self.available_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.cell_bytes

    @property
    def max_model_len(self) -> int:
        return self.context_len

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
        d = {**asdict(self), **{k: getattr(self, k) for k in shared}}
        for k in ("state", "indexer"):
            if d[k] is None:
                del d[k]
        return d


def sglang_pool(model: ModelSpec, gpu: Optional[GPUSpec], dtype: str | KVFormat = "auto", *, tp: int = 1,
                mem_fraction_static: Optional[float], context_len: Optional[int] = None, page_size: int = 1,
                free_before_load_gib: Optional[float] = None, weight_gib: Optional[float] = None,
                avail_after_load_gib: Optional[float] = None, swa_full_tokens_ratio: float = SWA_FULL_TOKENS_RATIO,
                max_running_requests: Optional[int] = None, weight_dtype: Optional[str] = None,
                total_gib: Optional[float] = None, layout: Optional[Parallel] = None,
                radix_cache: bool = True) -> SglangPool:
    """SGLang's max_total_num_tokens for a model on a GPU (one rank's: with data-parallel attention, one attention
    group's rank, `layout`); measured free memories (from a log) replace the estimates. `mem_fraction_static`: as
    resolved (kvplan.deployment decides SGLang's default). `max_running_requests`: --max-running-requests as given
    (all DP-attention groups'), None for SGLang's own; `radix_cache`: False with --disable-radix-cache."""
    layout = layout or Parallel.tensor(tp)
    check_tp(model, layout.attn_tp)
    fmt = dtype if isinstance(dtype, KVFormat) else kv_format(dtype)
    if page_size < 1:
        raise KvplanError(f"--page-size must be positive, got {page_size}")
    if gpu is None and free_before_load_gib is None:
        raise KvplanError("SGLang's pool needs --gpu (or the free memory a startup log measured)")
    f = mem_fraction_static
    if f is None:
        raise KvplanError("SGLang's pool needs --mem-fraction-static, or --gpu for SGLang's default")
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
    # --max-running-requests per rank: split over the DP-attention groups (model_runner.py init_memory_pool)
    given = None if max_running_requests is None else max(1, max_running_requests // _dp_groups(layout, tp))
    state = (state_pool(model, layout, available, tp, radix_cache=radix_cache, requests=given)
             if model.state_layers else None)
    kv_room = available - (state["pool_bytes"] if state else 0)
    swa_tokens = None
    if n_swa and n_full:
        cell = full_cell + swa_full_tokens_ratio * swa_cell * n_swa
        tokens = max(0, int(kv_room // cell)) // page_size * page_size
        swa_tokens = int(tokens * swa_full_tokens_ratio) // page_size * page_size
    else:
        cell = full_cell + swa_cell * n_swa
        tokens = max(0, int(kv_room // cell)) // page_size * page_size
    # init_memory_pool: the request pool (max_num_reqs), at most the state slots // 3 with the radix cache on (// 1
    # without); model_runner.py then runs at most max_total_num_tokens // 2 of them, or the number given
    requests = given if given is not None else max(2048, min(4096, int(tokens / ctx * 512)))
    if state:
        requests = min(requests, state["max_running_requests_cap"])
    max_running_requests = min(given if given is not None else tokens // 2, requests)
    k_size = (tokens + page_size) * full_cell / 2 / GiB
    indexer = nsa_pool(model, fmt, tokens, page_size) if model.sparse_mla else None
    if indexer:  # what NSATokenToKVPool allocates, which is not quite what the profile counted
        k_size = indexer["allocated_bytes"] / 2 / GiB
    lines = _log_lines(model, fmt, state, tokens, k_size, max_running_requests, ctx)
    problem, notes = _problem_and_notes(model, fmt, f, weights, available, tokens, ctx, state, indexer)
    pool = SglangPool(model.name, fmt.name, tp, f, int(free_before), int(weights), available, cell, tokens,
                      swa_tokens, page_size, max_running_requests, ctx, round(k_size, 2), lines,
                      gpu=gpu.name if gpu else None, weight_dtype=weight_dtype or model.weight_dtype,
                      fits=problem is None, problem=problem, notes=notes, dp=layout.dp, ep=layout.ep,
                      world_size=layout.world, total_kv_tokens=tokens * layout.dp, state=state, indexer=indexer)
    pool.total_max_concurrency = pool.max_concurrency * layout.dp
    return pool


# SGLang's KV storage dtypes as its log names them (torch's dtype names)
_TORCH_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32",
                 "fp8_e4m3": "torch.float8_e4m3fn", "fp8": "torch.float8_e4m3fn", "mxfp8": "torch.float8_e4m3fn",
                 "fp8_e5m2": "torch.float8_e5m2", "nvfp4": "torch.float4_e2m1fn_x2",
                 "fp4_mx_block16": "torch.float4_e2m1fn_x2", "fp4_e2m1": "torch.float4_e2m1fn_x2"}


def _log_lines(model: ModelSpec, fmt: KVFormat, state: Optional[dict], tokens: int, k_size: float,
               max_running_requests: int, ctx: int) -> list[str]:
    """The lines SGLang's startup log prints for this pool: the Mamba cache's (a hybrid's), the KV cache's and the
    scheduler's token and request limits."""
    storage = {"auto": model.dtype, "bfloat16": "bf16"}.get(fmt.name, fmt.name)
    torch_dtype = _TORCH_DTYPES.get(storage, storage)
    lines = [f"KV Cache is allocated. dtype: {torch_dtype}, #tokens: {tokens}, "
             + (f"KV size: {2 * k_size:.2f} GB" if model.mla else f"K size: {k_size:.2f} GB, V size: {k_size:.2f} GB"),
             f"max_total_num_tokens={tokens}, max_running_requests={max_running_requests}, context_len={ctx}"]
    if state:  # MambaPool.__init__'s line: slots + 1 (a padding slot), GB = 2^30
        lines.insert(0, f"Mamba Cache is allocated. max_mamba_cache_size: {state['slots']}, conv_state size: "
                        f"{(state['slots'] + 1) * state['conv_bytes'] * state['layers'] / GiB:.2f}GB, ssm_state size: "
                        f"{(state['slots'] + 1) * state['temporal_bytes'] * state['layers'] / GiB:.2f}GB")
    return lines


def _problem_and_notes(model: ModelSpec, fmt: KVFormat, f: float, weights: float, available: int, tokens: int,
                       ctx: int, state: Optional[dict], indexer: Optional[dict]) -> tuple[Optional[str], list[str]]:
    """Why SGLang does not start with this pool (None when it does), and what a reader of its figures should know:
    a pool shorter than one sequence, the Mamba state's share, an fp8 latent stored larger than budgeted."""
    problem, notes = None, []
    if state and state["sized_by_requests"] and state["pool_bytes"] >= available:
        problem = (f"{model.name}'s Mamba state for {state['slots']:,} requests ({state['pool_bytes'] / GiB:.2f} GiB "
                   f"per rank) leaves SGLang no KV pool; lower --max-running-requests or raise --tp")
    elif tokens < 1:
        problem = (f"{model.name}'s weights ({weights / GiB:.2f} GiB per rank) leave SGLang no KV pool at "
                   f"--mem-fraction-static {f:g}; raise --tp, use a smaller --weight-dtype, or raise "
                   f"--mem-fraction-static")
    elif state and state["slots"] < state["slots_per_request"]:
        problem = (f"{model.name}'s Mamba state ({state['bytes_per_request'] / GiB:.2f} GiB per request per rank) "
                   f"leaves SGLang {state['slots']} state slots, too few for one request (max_mamba_cache_size // "
                   f"{state['slots_per_request']}); raise --tp or --mem-fraction-static")
    elif tokens < ctx:  # SGLang caps a request's input at max_total_num_tokens - 1 (scheduler.max_req_input_len)
        notes.append(f"the pool holds {tokens:,} tokens, fewer than one sequence of {ctx:,}: SGLang caps each "
                     f"request's input at {tokens - 1:,} tokens")
    if state:
        share = ("as --max-running-requests asks, with --disable-radix-cache" if state["sized_by_requests"]
                 else f"{state['memory_ratio']:g} / {1 + state['memory_ratio']:g} of the pool")
        notes.append(f"Mamba state: {state['layers']} layers x ({state['conv_bytes']:,} B conv + "
                     f"{state['temporal_bytes']:,} B ssm) = {state['bytes_per_request']:,} B per request per rank; "
                     f"{state['slots']:,} slots ({share}), so max_running_requests <= {state['slots']:,} // "
                     f"{state['slots_per_request']}")
    if indexer and indexer["latent_bytes_per_token_per_layer"] != model.mla.latent_dim * fmt.k[0].bits // 8:
        notes.append(f"SGLang budgets the fp8 latent at {model.mla.latent_dim} B per token per layer but stores "
                     f"{indexer['latent_bytes_per_token_per_layer']} (scales and a bf16 rope part): the pool "
                     f"allocates {indexer['allocated_bytes'] / GiB:.2f} GiB, beyond the {available / GiB:.2f} GiB "
                     f"budget")
    return problem, notes


def _dp_groups(layout: Parallel, tp: int) -> int:
    """The DP-attention groups SGLang divides request counts by (1 without --enable-dp-attention)."""
    return layout.dp if layout.attn_tp < tp else 1


def state_pool(model: ModelSpec, layout: Parallel, available: float, tp: int, *, radix_cache: bool = True,
               requests: Optional[int] = None) -> dict:
    """A hybrid's Mamba state pool on one rank, as sglang 0.5.6 to 0.5.9 split the pool's memory (model_runner.py
    handle_max_mamba_cache, no speculative decoding): the state takes ratio / (1 + ratio) of it
    (mamba_full_memory_ratio 0.9), in whole requests' states (max_mamba_cache_size; a gated delta net's divided by
    the DP-attention groups), and the full-attention KV pool the rest; max_running_requests is then at most
    max_mamba_cache_size // 3 with the radix cache on, // 1 without (init_memory_pool). With --disable-radix-cache
    and --max-running-requests (`requests`, per rank) the state pool is that many requests' states instead."""
    conv, temporal = mamba_state_bytes(model, layout.attn_tp)
    n = len(model.state_layers)
    per_req = (conv + temporal) * n
    ratio = MAMBA_FULL_MEMORY_RATIO
    st = model.state  # one mixer: mamba_state_bytes refuses several
    sized_by_requests = not radix_cache and requests is not None
    if sized_by_requests:
        slots = requests
    else:
        raw_gib = available / GiB * ratio / (1 + ratio)  # handle_max_mamba_cache works in GiB
        # a state of no bytes: max_mamba_cache_size is max_running_requests, or 512 when unset
        slots = max(0, int((raw_gib * GiB) // per_req)) if per_req else MAMBA_EMPTY_STATE_SLOTS
        if st.sglang_slots_per_dp_group:  # with --enable-dp-attention
            slots //= _dp_groups(layout, tp)
    per_request = MAMBA_SLOTS_PER_REQUEST if radix_cache else 1
    return {"kind": st.kind, "layers": n, "conv_bytes": conv, "temporal_bytes": temporal,
            "bytes_per_request": per_req, "memory_ratio": ratio, "slots": slots, "pool_bytes": slots * per_req,
            "slots_per_request": per_request, "sized_by_requests": sized_by_requests,
            "max_running_requests_cap": slots // per_request}


def nsa_pool(model: ModelSpec, fmt: KVFormat, tokens: int, page_size: int) -> dict:
    """An NSA model's pool as NSATokenToKVPool allocates it (mem_cache/memory_pool.py) for the tokens the profile
    counted: per layer the latent buffer of tokens + one page (bf16: (kv_lora_rank + rope) x 2 bytes; fp8: the
    latent in fp8, a float32 scale per 128 of it and the rope part in bf16), and the indexer's buffer of
    (tokens + page + 1) // page pages of page x (index_head_dim + index_head_dim // 128 x 4) bytes. The profile
    (profile_max_num_token) counts an fp8 latent at (kv_lora_rank + rope) bytes, so the pool allocates more than it
    budgeted."""
    a, L = model.mla, model.num_layers
    if fmt.k[0].bits == 8:
        latent = a.kv_lora_rank + a.kv_lora_rank // NSA_QUANT_BLOCK * 4 + a.qk_rope_head_dim * 2
    else:
        latent = a.latent_dim * 2
    index_row = a.indexer_bytes_per_token
    pages = (tokens + page_size + 1) // page_size
    allocated = L * ((tokens + page_size) * latent + pages * page_size * index_row)
    return {"index_head_dim": a.index_head_dim, "indexer_bytes_per_token_per_layer": index_row,
            "latent_bytes_per_token_per_layer": latent, "index_pages": pages, "allocated_bytes": allocated}


def sglang_capacity(d, logged: Optional[dict] = None) -> SglangPool:
    """SGLang's pool for a resolved Deployment (kvplan.deployment) with engine sglang. `logged`: the memory a startup
    log measured, in GiB as SGLang prints it (free_before_load_gib, weight_gib, avail_after_load_gib), in place of
    the deployment's estimates."""
    from dataclasses import replace

    measured_w = d.measured.weights if d.measured is not None else None
    memory = {"free_before_load_gib": None if d.free_before_load_bytes is None else d.free_before_load_bytes / GiB,
              "weight_gib": None if measured_w is None else measured_w / GiB, **(logged or {})}
    pool = sglang_pool(
        d.model, d.gpu, d.kv, tp=d.tp, layout=d.parallel, mem_fraction_static=d.mem_fraction_static,
        context_len=d.max_model_len, page_size=d.page_size or 1, weight_dtype=d.weight_dtype,
        total_gib=d.total_bytes / GiB if d.total_bytes else None, max_running_requests=d.max_running_requests,
        radix_cache=d.radix_cache, **memory)
    return replace(pool, notes=list(d.notes) + pool.notes + layout_note(d, pool.kv_tokens, pool.weight_bytes),
                   deployment=d.to_dict())
