"""SGLang's side of resolving a deployment (kvplan.deployment.resolve): its pool kinds, KV dtypes, page size, attention
backend and --mem-fraction-static, each decided once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from kvplan.deployment.backend import resolve_sglang_backend
from kvplan.deployment.kv import nsa_kv
from kvplan.deployment.value import Deployment, Measured
from kvplan.errors import KvplanError
from kvplan.rules.sglang import (
    CONTEXT_GIB,
    MAX_PREFILL_TOKENS,
    NSA_PAGE_SIZE,
    SGLANG_DTYPES,
    SGLANG_VERSION,
    default_mem_fraction_static,
    mamba_state_bytes,
)
from kvplan.units import GiB

if TYPE_CHECKING:
    from kvplan.deployment import DeploymentArgs
    from kvplan.specs.catalog import ModelSpec


def _refuse_unmodelled_sglang_pools(m: ModelSpec) -> None:
    """SGLang's pools kvplan does not model: DeepSeek-V4's compressed attention."""
    if m.compressed is not None:
        raise KvplanError(f"{m.name} uses DeepSeek-V4's compressed attention: SGLang's pool for it is not "
                          f"modelled; plan it with --engine vllm")


def _resolve_sglang(args: DeploymentArgs, prof, common: dict, notes: list[str]) -> Deployment:
    m, g, fmt = common["model"], common["gpu"], common["kv"]
    if m.state_layers:  # SGLang's Mamba pool: a state shape it has, split over the attention ranks
        mamba_state_bytes(m, common["parallel"].attn_tp)
    page = int(args.page_size) if args.page_size is not None else 1
    if m.sparse_mla:  # SGLang's NSA pool and its server defaults
        fmt = common["kv"] = nsa_kv(args.kv_cache_dtype, m, g, fmt, notes)
        common["kv_from_checkpoint"] = None  # (SGLang's NSA default, not the checkpoint's)
        common["unserved"] = fmt.unserved("sglang", g, args.engine_version)
        if page != NSA_PAGE_SIZE:
            if args.page_size is not None:
                notes.append(f"--page-size {page}: SGLang sets page size {NSA_PAGE_SIZE} for DeepSeek sparse "
                             f"attention (server_args.py)")
            page = NSA_PAGE_SIZE
    if args.engine_version is not None and not args.engine_version.strip().lstrip("v").startswith(SGLANG_VERSION):
        raise KvplanError(f"--engine-version {args.engine_version}: kvplan plans SGLang with the rules of SGLang "
                          f"{SGLANG_VERSION}; drop --engine-version (or give {SGLANG_VERSION}.x)")
    if fmt.name not in SGLANG_DTYPES:
        raise KvplanError(f"SGLang has no KV cache dtype '{fmt.name}'; it takes "
                          f"{', '.join(sorted(set(SGLANG_DTYPES)))}")
    if not m.sparse_mla:  # (an NSA model runs SGLang's nsa backend, with its own page size set above)
        backend, page, no_backend = resolve_sglang_backend(args, m, g, fmt, page, common["unserved"], notes)
        common = {**common, "unserved": common["unserved"] or no_backend, "attention_backend": backend}
    ended = fmt.refused_from("sglang", args.engine_version)
    if ended is not None:  # a dtype a later release refuses at start (its catalog entry's Serves.until)
        raise KvplanError(f"SGLang after {ended.until} refuses --kv-cache-dtype {fmt.name} at start (deprecated; "
                          f"mem_cache/kv_cache_dtype.py configure_kv_cache_dtype): use -d {ended.replaced_by} (the "
                          f"same bytes), or plan SGLang {ended.until} with --engine-version {ended.until}")
    if args.disable_radix_cache and not m.state_layers:
        notes.append("--disable-radix-cache: no effect on the figures of a model without per-request state (the pool "
                     "is the same, and kvplan simulates no prefix hits either way)")
    f = _resolve_mem_fraction(args, prof, common)
    free_before = None
    weights = None
    if prof is not None:
        free_before = prof.free_before_load_bytes
        same = (common["tp"], common["weight_dtype"]) == (prof.tp, prof.weight_dtype)
        weights = prof.weights_bytes if same else None
        notes.append(f"free memory before loading measured by {prof.source or 'a startup log'}"
                     + ("" if same else f"; weights modelled at TP {common['tp']} (the profile measured TP {prof.tp})"))
    if free_before is None and common["free_memory_bytes"] is not None:
        free_before = common["free_memory_bytes"] - int(CONTEXT_GIB * GiB)  # the CUDA context is made first
        notes.append(f"free memory before loading: the {common['free_memory_bytes'] / GiB:.2f} GiB given less "
                     f"{CONTEXT_GIB} GiB for the CUDA context and NCCL")
    if f is None and free_before is None:
        raise KvplanError("SGLang's pool needs --gpu (or the free memory a startup log measured)")
    return Deployment(**common, engine_version=SGLANG_VERSION, mem_fraction_static=f,
                      page_size=page, mixed_chunk=bool(args.enable_mixed_chunk),
                      max_prefill_tokens=int(args.max_prefill_tokens or MAX_PREFILL_TOKENS),
                      max_running_requests=args.max_running_requests, radix_cache=not args.disable_radix_cache,
                      free_before_load_bytes=free_before,
                      measured=Measured(weights, 0, prof.source or "a startup log") if prof is not None else None,
                      notes=tuple(notes))


def _resolve_mem_fraction(args: DeploymentArgs, prof, common: dict) -> Optional[float]:
    """SGLang's --mem-fraction-static: the one given, else the profile's, else SGLang's default for the GPU and the
    layout (None: no GPU to take it from)."""
    f = args.mem_fraction_static
    if f is None and prof is not None:
        f = prof.mem_fraction_static
    m, g, tp, lay = common["model"], common["gpu"], common["tp"], common["parallel"]
    if f is None and g is not None:
        f = default_mem_fraction_static(m, g, tp, dp_attention=lay.dp if lay.attn_tp < tp else 0,
                                        deepep=common["a2a_backend"] == "deepep")
    return f
