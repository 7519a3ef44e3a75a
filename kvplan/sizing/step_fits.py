"""The step model's fitted numbers: a kernel family's fit, a GPU's profile of them (the bundled ones in
hardware/profiles/step-time.yaml, or one `kvplan measure` wrote), and which fit prices a weight dtype, a cache format,
an all-reduce or a prompt chunk's attention (the model itself: kvplan.sizing.step_time)."""

from __future__ import annotations

import math
from dataclasses import field
from functools import lru_cache
from typing import Optional

from kvplan.errors import KvplanError
from kvplan.memo import per_spec
from kvplan.rules.sglang import LINEAR_KERNEL_FAMILY
from kvplan.sizing.weight_formats import gemm_family
from kvplan.specs.catalog import GPUSpec, _catalog_data, catalog_dir
from kvplan.values import frozen_dataclass

# the fields of a decode-attention fit that split the context over the SMs
SPLIT_FIELDS = ("split_slots", "split_tokens", "combine_per_split_s", "combine_per_split_global_s")


@frozen_dataclass
class Fit:
    t0_s: float
    eta: float = 1.0
    per_sequence_head_s: float = 0.0
    per_query_head_s: float = 0.0
    per_token_chain_s: float = 0.0  # a split's serial walk over one sequence's tokens (the floor at low batch)
    mu: Optional[float] = None  # achieved fraction of peak FLOP/s where the kernel is compute-bound
    peak_flops: Optional[float] = None
    bytes_per_s: Optional[float] = None  # all-reduce: message bytes per second
    # all-reduce: the line of large messages (NCCL's bandwidth protocol, its pipeline full), where it is faster
    large_message_t0_s: float = 0.0
    large_message_bytes_per_s: Optional[float] = None
    # decode attention: the kernel's tile of tokens, and the streaming rate its grid sustains per KV head and per
    # (sequence, KV head) pair when it runs too few programs to load the memory system
    tile_tokens: int = 1
    stream_per_kv_head_bytes_per_s: Optional[float] = None
    stream_per_sequence_head_bytes_per_s: Optional[float] = None
    # decode attention: how the fixed per-head work and the streaming combine, (fixed^p + stream^p)^(1/p) (other
    # programs stream while one does its own work; p = 1 adds them); and the L2 a replayed call's cache is read from
    # as far as it fits (l2_bytes, each such byte costing l2_cost of a DRAM byte), which only the timing tables see
    blend_exponent: float = 1.0
    l2_bytes: float = 0.0
    l2_cost: float = 1.0
    # decode attention: a kernel that stops splitting the context once (sequences x KV heads) fills 80% of its
    # program slots runs one program per pair, in waves; a last partial wave slows the stream by util^wave_exponent
    wave_slots: int = 0
    wave_exponent: float = 0.0
    # decode attention: a kernel that splits each (sequence, KV head) pair's context over the program slots the pairs
    # leave free, splits = min(ceil(context / split_tokens), max(1, floor(split_slots / pairs))) (the TRT-LLM decode
    # kernels FlashInfer runs on Blackwell), each split walking context / splits; it then combines the splits'
    # partial results at a cost per split, in a thread-block cluster's shared memory up to CLUSTER_SPLITS splits and
    # through global memory beyond
    split_slots: int = 0
    split_tokens: int = 256
    combine_per_split_s: float = 0.0
    combine_per_split_global_s: float = 0.0
    # GEMMs: (t0, eta, cap, mu, q) per range of tokens, the kernel configuration changing between them; see
    # gemm_call_seconds
    buckets: tuple = ()
    per_expert_s: float = 0.0  # fused MoE: each touched expert's own cost
    within_10pct: Optional[float] = None  # share of the source rows of >= 64 MiB the fit reproduces within 10%
    source: str = "bundled"


@frozen_dataclass
class StepProfile:
    gpu: str
    name: str  # what the output says it used
    peak_bandwidth_bytes_per_s: float
    attention: dict  # "bfloat16" / "fp8" -> {(most query heads per KV head, head size): Fit}
    gemm: dict  # weight dtype key -> Fit
    moe: dict
    allreduce: dict  # world size -> Fit
    measured: frozenset = frozenset()  # families a calibration profile replaced
    prefill_attention: dict = field(default_factory=dict)  # "bfloat16" / "fp8" -> {head size: Fit}
    # world size -> Fit of the engines' custom all-reduce replayed in a CUDA graph (its max_bytes beside it)
    graph_allreduce: dict = field(default_factory=dict)
    # "bfloat16" / "fp8" -> Fit of MLA's decode attention beside its projections (rope, norms, cache write and the
    # latent attention kernel), where the profile's tables time vLLM's MLA module
    mla: dict = field(default_factory=dict)


@lru_cache(maxsize=1)
def _bundled() -> dict:
    return _catalog_data(catalog_dir("hardware") / "profiles" / "step-time.yaml")["gpus"]


def _fits(d: dict, keyfn=str) -> dict:
    """Fits read from the profile file (figures about the fit itself, such as its row count, left out)."""
    return {keyfn(k): Fit(**{f: x for f, x in v.items() if f in Fit.__dataclass_fields__}) for k, v in d.items()}


def _attention_fits(d: dict) -> dict:
    """One dtype's decode-attention fits by (the most query heads per KV head its range holds, head size), and those
    for calls with a single KV head where the profile has them by (..., head size, 1)."""
    fits = {(int(g), hd): f for g, by_dim in (d.get("groups") or {}).items() for hd, f in _fits(by_dim, int).items()}
    fits.update({(int(g), hd, 1): f for g, by_dim in (d.get("one_kv_head") or {}).items()
                 for hd, f in _fits(by_dim, int).items()})
    return fits


@per_spec
def bundled_profile(gpu: Optional[GPUSpec]) -> Optional[StepProfile]:
    """The bundled fits for this GPU, or None where kvplan has none."""
    if gpu is None:
        return None
    g = _bundled().get(gpu.name)
    if g is None:
        return None
    # (a GPU whose own decode-attention table ran small grids unsplit takes another's of the same chip)
    table = f"; decode attention: {g['attention_table']}'s" if g.get("attention_table") else ""
    return StepProfile(gpu=gpu.name, name=f"bundled {gpu.name} ({g['silicon']} kernel timings{table})",
                       peak_bandwidth_bytes_per_s=float(g["peak_bandwidth_bytes_per_s"]),
                       attention={k: _attention_fits(v) for k, v in g["attention"].items()},
                       gemm=_fits(g["gemm"]), moe=_fits(g["moe"]),
                       allreduce=_fits(g["allreduce"], int),
                       prefill_attention={k: _fits(v, int) for k, v in (g.get("prefill_attention") or {}).items()},
                       graph_allreduce={int(n): (Fit(t0_s=f["t0_s"], bytes_per_s=f["bytes_per_s"]), f["max_bytes"])
                                        for n, f in (g.get("graph_allreduce") or {}).items()},
                       mla=_fits(g.get("mla") or {}))


def bundled_gpus() -> list[str]:
    return list(_bundled())


def with_calibration(base: Optional[StepProfile], cal, source: str, gpu: Optional[GPUSpec]) -> StepProfile:
    """A `kvplan measure` profile over the bundled fits: its GEMV and decode families replace theirs."""
    peak = cal.peak_bandwidth_bytes_per_s
    if base is None:
        if gpu is None:
            raise KvplanError("a calibration profile needs --gpu for the parts it does not measure")
        base = StepProfile(gpu=gpu.name, name="", peak_bandwidth_bytes_per_s=peak, attention={}, gemm={}, moe={},
                           allreduce={})
    scale = base.peak_bandwidth_bytes_per_s / peak  # fits are relative to the profile's own peak
    attention, gemm, measured = {k: dict(v) for k, v in base.attention.items()}, dict(base.gemm), set()

    def measured_fit(f, old: Optional[Fit]) -> Fit:
        # the measured per-call cost and bandwidth; the terms a GEMV or decode sweep does not vary (per sequence,
        # per query head, the serial floor, the compute rate) stay the bundled fit's
        return Fit(t0_s=f.t0_s, eta=f.eta / scale,
                   per_sequence_head_s=old.per_sequence_head_s if old else 0.0,
                   per_query_head_s=old.per_query_head_s if old else 0.0,
                   per_token_chain_s=old.per_token_chain_s if old else 0.0,
                   blend_exponent=old.blend_exponent if old else 1.0, mu=old.mu if old else None,
                   peak_flops=old.peak_flops if old else None, source=source,
                   # the serial walk is per split where the bundled fit splits the context
                   **({f: getattr(old, f) for f in SPLIT_FIELDS} if old else {}))
    for fam, key in (("gemv_bf16", "bfloat16"), ("gemv_fp8", "fp8")):
        if cal.fit(fam) is not None:
            gemm[key] = measured_fit(cal.fit(fam), gemm.get(key))
            measured.add(f"gemm {key}")
    for fam, key in (("decode_bfloat16", "bfloat16"), ("decode_fp8_e4m3", "fp8")):
        if cal.fit(fam) is not None:  # measured at one head size, applied to every head size's fit
            fits = attention.get(key) or {(4, 128): None}
            attention[key] = {hd: measured_fit(cal.fit(fam), old) for hd, old in fits.items()}
            measured.add(f"attention {key}")
    name = f"{source} ({cal.device.get('name')})" + (f" over {base.name}" if base.name else "")
    return StepProfile(base.gpu, name, base.peak_bandwidth_bytes_per_s, attention, gemm, base.moe, base.allreduce,
                       frozenset(measured), base.prefill_attention, base.graph_allreduce)


def gemm_fit(profile: StepProfile, weight_dtype: str, engine: str = "vllm") -> tuple[Fit, bool]:
    """(fit, estimated): the fit of the GEMM kernel `engine` runs for `weight_dtype`."""
    key, fallback = gemm_family(weight_dtype)
    if engine == "sglang":
        key = LINEAR_KERNEL_FAMILY.get(key, key)
    if key in profile.gemm:
        return profile.gemm[key], False
    for k in (fallback, "bfloat16"):
        if k in profile.gemm:
            return profile.gemm[k], True
    raise KvplanError(f"the step profile {profile.name} has no GEMM fit")


def _by_head_dim(fits: Optional[dict], head_dim: int, group: int = 4, kv_heads: Optional[int] = None) -> Optional[Fit]:
    """The fit of the range of query heads per KV head that holds `group` (the widest range where none does) and of
    the head size nearest `head_dim` (by ratio): the kernels pick their tiles and splits by both; for a call with a
    single KV head, that range's and size's own fit where there is one (its grid has a program per sequence)."""
    if not fits:
        return None
    ranges = sorted({k[0] for k in fits})
    g = next((r for r in ranges if r >= group), ranges[-1])
    keys = [k for k in fits if k[0] == g and len(k) == 2]
    best = min(keys, key=lambda k: abs(math.log(k[1] / max(head_dim, 1))))
    if kv_heads == 1 and (g, best[1], 1) in fits:
        return fits[(g, best[1], 1)]
    return fits[best]


def attention_fit(profile: StepProfile, fmt_family: str, head_dim: int = 128, group: int = 4,
                  kv_heads: Optional[int] = None) -> tuple[Fit, float, bool]:
    """(fit, seconds of dequantization per cached element, estimated) for a cache format family, head size, number
    of query heads per KV head (1: multi-head attention) and of KV heads a call runs (on one rank)."""
    bf16 = _by_head_dim(profile.attention.get("bfloat16"), head_dim, group, kv_heads)
    if bf16 is None:
        raise KvplanError(f"the step profile {profile.name} has no decode-attention fit")
    if fmt_family == "float":
        return bf16, 0.0, False
    fp8 = _by_head_dim(profile.attention.get("fp8"), head_dim, group, kv_heads)
    if fmt_family == "fp8" and fp8 is not None:
        return fp8, 0.0, False
    # Not measured: the bf16 kernel's fixed costs and bandwidth on the format's bytes, plus fp8's measured
    # conversion cost per element (what an fp8 byte costs beyond a bf16 kernel's byte), a floor for any format
    # that dequantizes before the matmul.
    per_element = 0.0
    if fp8 is not None:
        per_element = max(0.0, 1 / (fp8.eta * profile.peak_bandwidth_bytes_per_s)
                          - 1 / (bf16.eta * profile.peak_bandwidth_bytes_per_s))
    return bf16, per_element, True


def allreduce_fit(profile: StepProfile, world: int) -> Optional[Fit]:
    if world <= 1 or not profile.allreduce:
        return None
    sizes = sorted(profile.allreduce)
    return profile.allreduce[next((s for s in sizes if s >= world), sizes[-1])]


def prefill_attention_fit(profile: StepProfile, fmt_family: str, flops_per_key_head: float) -> Optional[Fit]:
    """The prompt-attention fit for a cache format family (fp8's where the cache is fp8 and the profile has it,
    else bf16's), of the head size whose FLOPs per key (4 x head size: QK^T and PV) are nearest the model's; None
    where the profile has no prompt-attention fit."""
    by_dtype = profile.prefill_attention
    fits = (by_dtype.get("fp8") if fmt_family == "fp8" else None) or by_dtype.get("bfloat16")
    if not fits:
        return None
    hd = min(fits, key=lambda h: abs(math.log(4 * h / max(flops_per_key_head, 1))))
    return fits[hd]
