"""Which attention backend vLLM runs a model with, and the block size that backend sets: the selector's support
matrix as data, one entry per backend and release.

vLLM picks the backend at start (vllm/v1/attention/selector.py get_attn_backend -> platforms/cuda.py
CudaPlatformBase.get_attn_backend_cls): it walks the platform's priority list (_get_backend_priorities) and takes
the first backend whose validate_configuration (vllm/v1/attention/backend.py AttentionBackend) finds no reason to
refuse: the KV cache dtype (supported_kv_cache_dtypes / supports_kv_cache_dtype), the head size
(get_supported_head_sizes / supports_head_size), the block size when --block-size is given
(get_supported_kernel_block_sizes), MLA or not (is_mla), sparse or not (is_sparse), attention sinks
(supports_sink), the compute capability (supports_compute_capability) and the backend's own supports_combination.
--attention-backend NAME skips the walk and validates that one backend, refusing to start if it cannot serve.
A backend the selector takes may still fail once it runs (an entry's `fails`: FlashAttention 0.19 and 0.20 take
caches their forward cannot read): vLLM then fails at start, and kvplan says so instead of planning that backend.
Without --block-size, Platform.update_block_size_for_backend (platforms/interface.py) then sets the block to the
backend's get_preferred_block_size(16): 16 where a kernel block size divides it, else the smallest kernel size.

Read from the vLLM releases 0.19.0, 0.20.0 and each of 0.25.0 to 0.33.0 (0.34.0 has 0.33's priority lists and
backend entries); 0.21 to 0.24 are planned with 0.20's reading. Where a backend's fact is the same in every
release read, its one entry holds; `since` keys the entries that changed (kvplan.rules.vllm_backend_table), and a
rule that changed is keyed by its release in kvplan.rules.vllm_backend_rules.
Paths are relative to the vllm package.
"""

from __future__ import annotations

from functools import lru_cache

from kvplan.errors import KvplanError
from kvplan.rules.vllm_backend_rules import (  # noqa: F401 (the selector's facts, imported from here by kvplan)
    E4M3, FLOAT, FP8, PER_TOKEN_HEAD, READ, TURBOQUANT, AttentionFacts, Backend, Choice, _cc, _CHECKS, _from, _key,
    flash_attn_version, read_release,
)
from kvplan.rules.vllm_backend_table import (  # noqa: F401
    BACKENDS, PRIORITIES, PRIORITY_SOURCES, ROCM_PRIORITIES, ROCM_SOURCE,
)

@lru_cache(maxsize=None)
def backend(name: str, release: str) -> Backend | None:
    """The entry of backend `name` in `release` (the newest entry not after it; None before it exists)."""
    rel = _key(read_release(release))
    entries = [b for b in BACKENDS if b.name == name and _key(b.since) <= rel]
    return max(entries, key=lambda b: _key(b.since)) if entries else None



def priorities(release: str, cc: tuple[int, int] | None, f: AttentionFacts, dtype: str,
               platform: str = "cuda") -> tuple[str, ...]:
    """The backends the selector tries, in order, for this model and cache on this GPU."""
    layout = "dsv4" if f.compressed else "sparse" if f.sparse else "mla" if f.mla else "mha"
    rel = read_release(release)
    if platform == "rocm":
        table = ROCM_PRIORITIES[max((r for r in ROCM_PRIORITIES if _from(rel, r)), key=_key, default="0.19")]
        return () if f.sparse else table[(layout, None)]
    table = PRIORITIES[rel]
    major = cc[0] if cc else None
    if layout == "sparse" and major == 10:
        kind = "quantized" if dtype not in FLOAT else "few_heads" if f.num_heads <= 16 else None
        return table[("sparse", 10, kind)]
    if layout == "sparse" and major not in (10, 12) and f.head_size == 512 and ("sparse", None, 512) in table:
        return table[("sparse", None, 512)]
    return table.get((layout, major), table[(layout, None)]) if (layout, None) in table else ()


def refusals(b: Backend, release: str, cc: tuple[int, int] | None, f: AttentionFacts, dtype: str,
             block: int | None = None, gcn: str | None = None) -> list[str]:
    """Why backend `b` refuses this configuration (AttentionBackend.validate_configuration), in its words; empty
    where it serves it. `cc` None (a GPU of unknown capability) passes the capability checks; `gcn`, an AMD GPU's
    gfx name, is what a ROCm backend's supports_compute_capability reads (platforms/rocm.py get_cdna_version,
    get_rdna_version). From 0.26 a layer with a sliding window needs a backend whose supports_sliding_window says so
    (vllm/v1/attention/backend.py validate_configuration; model_executor/layers/attention/attention.py passes
    has_sliding_window=sliding_window is not None)."""
    why = []
    if not b.takes_head(f.head_size):
        why.append(f"head size {f.head_size} not supported")
    if dtype not in b.kv_dtypes:
        why.append(f"kv_cache_dtype {dtype} not supported")
    if block is not None and not b.takes_block(block):
        why.append(f"block size {block} not supported")
    if f.mla != b.mla:
        why.append("MLA not supported" if f.mla else "non-MLA not supported")
    if f.sparse != b.sparse:
        why.append("sparse not supported" if f.sparse else "non-sparse not supported")
    if f.sinks and not b.sinks and not any(c.endswith("sinks") for c in b.checks):
        why.append("attention sinks not supported")
    if f.sliding and not b.sliding_window and _from(release, "0.26"):
        why.append("sliding window not supported")
    if b.dtypes and f.dtype not in b.dtypes:
        why.append(f"dtype {f.dtype} not supported")
    if gcn is not None and b.gcn_archs and not gcn.startswith(b.gcn_archs):
        why.append(f"compute capability {gcn} not supported")
    if cc is not None and not ((not b.cc_majors or cc[0] in b.cc_majors) and b.cc_min <= cc <= b.cc_max):
        why.append(f"compute capability {cc[0]}.{cc[1]} not supported")
    if cc is not None and not why:
        why += [r for c in b.checks if (r := _CHECKS[c](release, f, cc, dtype))]
    return why


def _family(b: Backend, release: str, cc: tuple[int, int] | None, f: AttentionFacts, dtype: str) -> str:
    if b.name != "FLASH_ATTN" or cc is None:
        return b.family
    v = flash_attn_version(release, cc, f.head_size, quantized=dtype not in FLOAT, sinks=f.sinks, dcp=f.dcp,
                           sliding=f.sliding)
    return f"FA{v}"


def _block(b: Backend, release: str, cc, f: AttentionFacts, dtype: str) -> int:
    """Platform.update_block_size_for_backend: 16 for hybrid models (their block is managed by the model
    config), else the backend's preferred block; FlashAttention from 0.29 sets 128 where FA4's hd256 kernel runs
    (get_preferred_block_size: _get_fa4_hd256_block_size) and, from 0.31, 64 for an fp8 cache at head 512 on
    9.x (_get_sm90_fa4_fp8_kv_block_size)."""
    if f.hybrid:
        return 16
    if b.name == "FLASH_ATTN" and cc is not None and _from(release, "0.29"):
        v = flash_attn_version(release, cc, f.head_size, quantized=dtype not in FLOAT, sinks=f.sinks, dcp=f.dcp)
        if v == 4 and f.head_size == 256 and cc[0] in (10, 11):
            return 128
        if v == 4 and f.head_size == 512 and cc[0] == 9 and dtype in E4M3 and _from(release, "0.31"):
            return 64
    return b.preferred_block(16)


def backend_names(release: str) -> tuple[str, ...]:
    """The backend names kvplan plans for `release` (each a name of vLLM's AttentionBackendEnum)."""
    rel = _key(read_release(release))
    return tuple(dict.fromkeys(b.name for b in BACKENDS if _key(b.since) <= rel))


@lru_cache(maxsize=4096)  # a pure function of hashable values: a sweep asks it once per configuration
def backend_for(facts: AttentionFacts, compute_capability: str | None, cache_dtype: str, release: str,
                requested: str | None = None, block_size: int | None = None, platform: str = "cuda",
                gpu_name: str = "this GPU") -> Choice:
    """The backend vLLM 'release' runs `facts` with on a GPU of `compute_capability`, storing `cache_dtype`:
    `requested` (--attention-backend) validated alone, else the first of the priority list that serves it;
    `block_size` is --block-size where given (it takes part in the validation, as vLLM's
    user_specified_block_size). Raises KvplanError, in one line naming why and what would serve, where none does."""
    cc = _cc(compute_capability)
    gcn = compute_capability if platform == "rocm" and (compute_capability or "").startswith("gfx") else None
    rel = read_release(release)
    if requested is not None:
        name = requested.strip().upper()
        b = backend(name, rel)
        if b is None or (b.platform != platform and name not in ("TRITON_ATTN", "TRITON_MLA", "TURBOQUANT")):
            names = ", ".join(n for n in backend_names(rel) if (backend(n, rel).platform == platform
                                                                or n in ("TRITON_ATTN", "TRITON_MLA", "TURBOQUANT")))
            raise KvplanError(f"--attention-backend {requested}: kvplan plans vLLM {rel}'s {names} on {platform} "
                              f"(or auto, the selector's choice)")
        why = refusals(b, rel, cc, facts, cache_dtype, block_size, gcn)
        if why:
            alt = _first_valid(rel, cc, facts, cache_dtype, block_size, platform, running=True, gcn=gcn)
            hint = f"; {alt.name} serves it (drop --attention-backend or choose it)" if alt else ""
            raise KvplanError(f"--attention-backend {name}: vLLM {rel} refuses it for {cache_dtype} on {gpu_name} "
                              f"({', '.join(why)}; {b.source.split(' (')[0]}){hint}")
        broken = failures(b, rel, cc, facts, cache_dtype)
        if broken:
            alt = _first_valid(rel, cc, facts, cache_dtype, block_size, platform, running=True, gcn=gcn)
            hint = f"; {alt.name} serves it (choose it)" if alt else ""
            raise KvplanError(f"--attention-backend {name}: vLLM {rel} takes it for {cache_dtype} on {gpu_name}, then "
                              f"fails at start ({', '.join(broken)}){hint}")
        return Choice(b.name, _family(b, rel, cc, facts, cache_dtype),
                      block_size or _block(b, rel, cc, facts, cache_dtype), rel, True, b.source)
    chosen = _first_valid(rel, cc, facts, cache_dtype, block_size, platform, gcn=gcn)
    broken = failures(backend(chosen.name, rel), rel, cc, facts, cache_dtype) if chosen is not None else []
    if broken:
        alt = _first_valid(rel, cc, facts, cache_dtype, block_size, platform, running=True, gcn=gcn)
        hint = f"; --attention-backend {alt.name} serves it" if alt else \
            _served_elsewhere(rel, facts, cache_dtype, platform)
        picked = chosen.label if chosen.name == "FLASH_ATTN" else chosen.name
        raise KvplanError(f"vLLM {rel}'s selector picks {picked} for {cache_dtype} on {gpu_name}, which then fails at "
                          f"start ({', '.join(broken)}){hint}")
    if chosen is None:
        tried = priorities(rel, cc, facts, cache_dtype, platform)
        served = _served_elsewhere(rel, facts, cache_dtype, platform)
        raise KvplanError(f"vLLM {rel} has no attention backend for {cache_dtype} on {gpu_name} (tried "
                          f"{', '.join(tried) or 'none'}){served}")
    return chosen


def failures(b: Backend, release: str, cc: tuple[int, int] | None, f: AttentionFacts, dtype: str) -> list[str]:
    """Why backend `b`, once the selector has taken it, fails at start (its `fails` rules); empty where it runs.
    `cc` None (a GPU of unknown capability) passes, as in refusals; a ROCm backend's rules read no CUDA capability."""
    if cc is None and b.platform != "rocm":
        return []
    return [r for c in b.fails if (r := _CHECKS[c](release, f, cc or (0, 0), dtype))]


def _first_valid(rel: str, cc, facts: AttentionFacts, dtype: str, block: int | None,
                 platform: str, running: bool = False, gcn: str | None = None) -> Choice | None:
    """The selector's choice: the first of the priority list that validates; `running`: the first that also runs
    (the one --attention-backend could name instead of a choice that fails at start)."""
    for name in priorities(rel, cc, facts, dtype, platform):
        b = backend(name, rel)
        if b is not None and not refusals(b, rel, cc, facts, dtype, block, gcn) and \
                not (running and failures(b, rel, cc, facts, dtype)):
            return Choice(b.name, _family(b, rel, cc, facts, dtype), block or _block(b, rel, cc, facts, dtype), rel,
                          False, b.source)
    return None


def _served_elsewhere(rel: str, facts: AttentionFacts, dtype: str, platform: str) -> str:
    """'; BACKEND serves it on X.x' for the first capability major where one does, or a later release's."""
    for major in (8, 9, 10, 12):
        c = _first_valid(rel, (major, 0), facts, dtype, None, platform, running=True)
        if c is not None:
            return f"; {c.name} serves it on compute capability {major}.x"
    for later in READ[READ.index(rel) + 1:]:
        for major in (8, 9, 10):
            c = _first_valid(later, (major, 0), facts, dtype, None, platform, running=True)
            if c is not None:
                return f"; from vLLM {later}, {c.name} serves it on {major}.x"
    return ""


_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # kvplan's model dtypes, as torch names them


def facts_of(model, tp: int = 1, dcp: int = 1) -> AttentionFacts:
    """The selector's view of a kvplan ModelSpec at tensor-parallel size tp (heads per rank)."""
    heads = max(1, model.num_heads // tp)
    if model.compressed is not None:
        return AttentionFacts(head_size=model.compressed.head_dim, num_heads=heads, mla=True, sparse=True,
                              sinks=True, compressed=True, index_topk=model.compressed.index_topk, dcp=dcp)
    if model.mla is not None:
        mla = model.mla
        return AttentionFacts(head_size=mla.kv_lora_rank + mla.qk_rope_head_dim, num_heads=heads, mla=True,
                              sparse=model.sparse_mla, hybrid=model.is_hybrid, qk_nope_head_dim=mla.qk_nope_head_dim,
                              qk_rope_head_dim=mla.qk_rope_head_dim, kv_lora_rank=mla.kv_lora_rank,
                              index_topk=mla.index_topk, dcp=dcp)
    first = next(iter(model.attention_layers), 0)
    head = model.layer_head_dim(first) or model.head_dim or model.hidden_size // model.num_heads
    return AttentionFacts(head_size=head, num_heads=heads, sinks=bool(model.attention_sinks), hybrid=model.is_hybrid,
                          dcp=dcp, sliding="sliding" in model.layer_kinds, dtype=_TORCH_DTYPE.get(model.dtype, "bfloat16"))


def what_if(facts: AttentionFacts, cache_dtype: str, release: str) -> Choice:
    """The plan where no backend serves the format here (vLLM would refuse to start): the block of the first backend
    of this attention kind (MLA or not) that lists the format anywhere, else CacheConfig.DEFAULT_BLOCK_SIZE."""
    for name in backend_names(release):
        b = backend(name, release)
        if b.mla == facts.mla and cache_dtype in b.kv_dtypes:
            return Choice("none", f"what-if, {b.name}'s blocks", b.preferred_block(16), read_release(release))
    return Choice("none", "what-if, the default block", 16, read_release(release))
