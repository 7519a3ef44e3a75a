"""The crossover question: where one KV dtype's KV read overtakes the weight read (N*, kvplan.sizing.kv_cache's byte
model), the step bytes and roofline time at operating points against a baseline dtype, and, where a step-time
profile prices the GPU (kvplan.sizing.step_time), the expected step and the context from which the dtype's step is the
faster
(break-even). Takes a resolved kvplan.deployment.Deployment."""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Literal, Optional, Sequence

from kvplan.errors import KvplanError
from kvplan.search import last_true
from kvplan.sizing.kv_cache import (
    LayerKV,
    WeightRead,
    _ranges,
    _solve_crossover,
    crossover_at_batch,
    kv_bytes_per_token,
    kv_layers,
    kv_read_bytes,
    skipped_indices,
    step_figures,
    weight_read_bytes,
)
from kvplan.sizing.weights import WeightBytes, weight_bytes
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.kv_formats import KVFormat, kv_format
from kvplan.units import DTYPE_BYTES, GiB
from kvplan.values import frozen_dataclass


@frozen_dataclass
class OperatingPoint:
    """One batch x context point of a crossover: the bytes a decode step reads there, and its roofline time."""

    batch: int
    context: int
    resident_tokens: int
    weight_bytes: float
    kv_bytes: float
    step_bytes: float
    baseline_kv_bytes: float
    baseline_step_bytes: float
    saving: float  # fraction of step bytes saved against the baseline dtype
    bound: Literal["weights", "kv"]
    crossover_tokens: Optional[float]  # N* at this batch's weight read (differs from batch 1 for MoE)
    step_ms: Optional[float] = None  # roofline: max(bytes / peak bandwidth, FLOPs / peak compute)
    memory_ms: Optional[float] = None
    compute_ms: Optional[float] = None
    limiter: Optional[Literal["memory", "compute"]] = None
    calibrated_step_ms: Optional[float] = None  # from a measured calibration profile (kvplan measure)


@frozen_dataclass
class CrossoverResult:
    """One KV dtype on one model: bytes per token, the crossover N*, and the operating points asked for."""

    model: str
    dtype: str
    baseline_dtype: str
    tp: int
    weight_dtype: str
    weight_read: WeightRead
    kv_bytes_per_token: float  # this rank, all layers, skip layers included
    kv_bytes_per_token_per_kv_head_layer: float  # the format alone, one layer, one KV head (or one MLA latent)
    bits_per_element: Optional[float]
    skip_layers: list[int]
    weight_bytes: float  # read per step at batch 1 under `weight_read`
    weight_bytes_held: int
    crossover_tokens: Optional[float]
    crossover_batch: Optional[float]  # when N* does not exist: sequences at full window needed
    crossover_tokens_without_skip: Optional[float]  # N* had every layer used this format (skip layers 'none')
    kv_ratio: float  # baseline KV bytes per token / this format's
    gpu: Optional[str] = None
    # context from which this dtype's expected step is faster than the baseline's, by batch (None: never up to the
    # model's context); the fixed costs of each format's kernels move it away from the byte crossover
    breakeven_context: dict = field(default_factory=dict)
    operating_points: list[OperatingPoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deployment: dict = field(default_factory=dict)  # the resolved deployment these figures are for (its what_if:
    # why no engine, release or GPU of it serves this dtype, where none does)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_frame(self):
        """One row per operating point, with the dtype's summary figures beside it (needs pandas)."""
        import pandas as pd

        summary = {k: v for k, v in self.to_dict().items()
                   if k not in ("operating_points", "notes", "skip_layers", "deployment")}
        rows = [{**summary, **{f"point_{k}" if k == "crossover_tokens" else k: v for k, v in asdict(p).items()}}
                for p in self.operating_points]
        return pd.DataFrame(rows or [summary])


def step_point(model: ModelSpec, layers: Sequence[LayerKV], base_layers: Sequence[LayerKV], wb: WeightBytes,
               batch: int, context: int, mode: WeightRead, tp: int, gpu: Optional[GPUSpec],
               weight_dtype: str) -> OperatingPoint:
    if batch < 1 or context < 1:
        raise KvplanError(f"operating points need batch >= 1 and context >= 1, got batch {batch}, context {context}")
    fig = step_figures(model, layers, base_layers, wb, batch, context, mode, tp, gpu, weight_dtype)
    fig["bound"] = "kv" if fig.pop("kv_bound") else "weights"
    if gpu is not None:
        fig["limiter"] = "compute" if fig.pop("compute_bound") else "memory"
    return OperatingPoint(batch=batch, context=context, resident_tokens=batch * context,
                          crossover_tokens=crossover_at_batch(layers, fig["weight_bytes"], batch), **fig)


def roofline_step_ms(d, batch: float, context: float, weight_read: WeightRead = "streamed") -> float:
    """The roofline time of one decode step of a resolved deployment, `batch` sequences (rounded, at least 1) of
    `context` cached tokens: what crossover's operating point at that batch and context says."""
    m, tp = d.model, d.parallel.attn_tp
    layers = kv_layers(m, d.kv, tp, d.skip)
    base = kv_layers(m, kv_format("auto"), tp, ("none",))
    fig = step_figures(m, layers, base, weight_bytes(m, d.parallel, d.weight_dtype), max(1, round(batch)),
                       max(1, round(context)), weight_read, tp, d.gpu, d.weight_dtype or m.weight_dtype)
    return fig["step_ms"]


def crossover_of(d, *, batches: Sequence[int] = (1,), contexts: Sequence[int] = (),
                 weight_read: WeightRead = "streamed", baseline: str = "auto") -> CrossoverResult:
    """The crossover of a resolved Deployment."""
    if weight_read not in ("streamed", "all"):
        raise KvplanError(f"--weight-read '{weight_read}': choose 'streamed' or 'all'")
    # per rank: the attention's TP sets the KV heads a rank reads, the layout the weights it holds
    model, tp, weight_dtype, gpu, skip = d.model, d.parallel.attn_tp, d.weight_dtype, d.gpu, d.skip
    dtype = d.kv
    fmt = dtype if isinstance(dtype, KVFormat) else kv_format(dtype)
    base_fmt = kv_format(baseline)
    layers = kv_layers(model, fmt, tp, skip)
    base_layers = kv_layers(model, base_fmt, tp, ("none",))
    wdtype = weight_dtype or model.weight_dtype
    wb = weight_bytes(model, d.parallel, weight_dtype)
    w1 = weight_read_bytes(model, wb, 1, weight_read)
    nstar = _solve_crossover(layers, w1)
    crossover_batch = None
    if nstar is None:
        saturated = kv_read_bytes(layers, 1, 10**12)
        crossover_batch = w1 / saturated if saturated else None
    per_token = kv_bytes_per_token(layers)
    base_per_token = kv_bytes_per_token(base_layers)
    bits = DTYPE_BYTES[model.dtype] * 8
    if model.mla:
        unit = fmt.mla_bytes_per_token(model.mla.kv_lora_rank, model.mla.qk_rope_head_dim, bits)
        bpe = None
    else:
        unit = fmt.bytes_per_token_per_kv_head(model.head_dim, model_bits=bits)
        bpe = fmt.bits_per_element(model.head_dim, bits)
    points = [step_point(model, layers, base_layers, wb, b, c, weight_read, tp, gpu, wdtype)
              for b in batches for c in contexts]
    notes = []
    longer = [c for c in contexts if c > model.max_position_embeddings and model.attention_layers]
    if longer:
        notes.append(f"context {max(longer):,} exceeds {model.name}'s max_position_embeddings "
                     f"{model.max_position_embeddings:,}: vLLM refuses such sequences; the figures are a what-if")
    notes += _memory_notes(points, wb.total, d)
    if not d.parallel.tp_only:
        p = d.parallel
        notes.append(f"per rank of {p.world} GPUs ({p.dp} attention groups, experts over {p.ep} ranks): the roofline "
                     f"reads this rank's weights for its own batch; the expected step times also carry the MoE "
                     f"layers' tokens from every attention group and their exchange")
    points, breakeven, expected = _expected_steps(d, fmt, base_fmt, points, batches)
    notes += expected
    skipped = skipped_indices(layers, fmt)
    nstar_all = nstar
    if skipped and fmt.name != "auto":
        notes.append(f"{fmt.name}: layers {_ranges(skipped)} stay in {model.dtype} (--kv-cache-dtype-skip-layers)")
        nstar_all = _solve_crossover(kv_layers(model, fmt, tp, ("none",)), w1)
    if fmt.residual_tokens:
        notes.append(f"the newest {fmt.residual_tokens} tokens of each sequence stay in {model.dtype}")
    if d.unserved:
        notes.append(f"{fmt.name}: {d.unserved}")
    return CrossoverResult(
        model=model.name, dtype=fmt.name, baseline_dtype=base_fmt.name, tp=tp, weight_dtype=wdtype,
        weight_read=weight_read, kv_bytes_per_token=per_token, kv_bytes_per_token_per_kv_head_layer=unit,
        bits_per_element=bpe, skip_layers=skipped, weight_bytes=w1, weight_bytes_held=wb.total,
        crossover_tokens=nstar, crossover_batch=crossover_batch, crossover_tokens_without_skip=nstar_all,
        kv_ratio=base_per_token / per_token if per_token else 1.0,
        gpu=gpu.name if gpu else None, operating_points=points, notes=notes, deployment=d.to_dict(),
        breakeven_context=breakeven,
    )


def _memory_notes(points: Sequence[OperatingPoint], weights_held: int, d) -> list[str]:
    """Where the weights, or an operating point's KV read with them, exceed the GPU's memory: what-ifs, said so."""
    gpu, tp = d.gpu, d.tp
    notes: list[str] = []
    over = _beyond_memory(points, weights_held, d.total_bytes if gpu is not None else 0)
    memory = f"{d.total_bytes / 1e9:,.1f} GB ({d.total_bytes / GiB:,.1f} GiB) the {gpu.name} holds" if gpu else ""
    if over and weights_held > d.total_bytes:
        notes.append(f"the weights held ({weights_held / 1e9:,.1f} GB per rank) alone exceed the {memory}: no vLLM pool "
                     f"holds any operating point at TP {tp}; their step times are a what-if")
    elif over:
        p = over[0]
        more = f" (and {len(over) - 1} more of the operating points)" if len(over) > 1 else ""
        notes.append(f"batch {p.batch:,} x context {p.context:,}{more}: the KV cache a step reads "
                     f"({p.kv_bytes / 1e9:,.1f} GB per rank) and the weights held ({weights_held / 1e9:,.1f} GB) exceed the "
                     f"{memory}: no vLLM pool holds it; its step times are a what-if")
    return notes


def _expected_steps(d, fmt: KVFormat, base_fmt: KVFormat, points: list, batches: Sequence[int]):
    """The step model's time at each operating point, the break-even context by batch and their notes, where a
    profile prices the GPU: (points, breakeven, notes)."""
    notes: list[str] = []
    breakeven = {}
    sm = _step_models(d, fmt, base_fmt)
    if sm is not None:
        from dataclasses import replace as _replace

        mine, base = sm
        points = [_replace(p, calibrated_step_ms=mine.step(p.batch, p.context).total_s * 1e3) for p in points]
        if fmt.name != base_fmt.name:
            for b in sorted({1, *batches}):
                breakeven[str(b)] = breakeven_context(mine, base, b, d.model.max_position_embeddings)
        notes.append(f"expected step ms: {mine.profile.name}")
        reach = mine.fitted_tokens
        past = [p for p in points if reach and p.batch > reach]
        if past:
            notes.append(f"batch {max(p.batch for p in past):,} is beyond the {reach:,} tokens a step that the step "
                         f"model's kernel timings reach: its expected ms extrapolate the fits")
        if d.calibration is not None:
            key = {"float": "bfloat16", "fp8": "fp8"}.get(mine.attn_family)
            if key and f"attention {key}" not in mine.profile.measured:
                notes.append(f"the calibration profile has no {fmt.name} decode measurement: the bundled fit "
                             f"prices its attention")
        est = [e for e in mine.estimated]
        if est:
            notes.append("estimated (no measured fit): " + ", ".join(est))
    return points, breakeven, notes


def _beyond_memory(points: Sequence[OperatingPoint], weights_held: int, memory: int) -> list[OperatingPoint]:
    """The operating points whose KV read and the weights held exceed the GPU's memory (none where it is unknown),
    smallest KV first."""
    if not memory:
        return []
    return sorted((p for p in points if p.kv_bytes + weights_held > memory), key=lambda p: p.kv_bytes)


def _step_models(d, fmt: KVFormat, base_fmt: KVFormat):
    """The expected-step models of a deployment and of its baseline dtype, where a profile prices its GPU."""
    from dataclasses import replace

    if d.gpu is None:  # no GPU, no step times (and the step model's module is not loaded for nothing)
        return None
    from kvplan.sizing.step_time import has_profile, step_model

    if not has_profile(d):
        return None
    return step_model(d), step_model(replace(d, kv=base_fmt, skip=("none",)))


def breakeven_context(mine, base, batch: int, longest: int) -> Optional[int]:
    """The context (cached tokens per sequence) from which `mine`'s step stays faster than `base`'s at `batch`, up to
    `longest`; None where it is not faster at `longest`. Where the two steps run within a hair of each other at short
    contexts (their fixed costs nearly equal), they may cross back and forth there: the answer is the last crossing
    on a doubling grid, refined by bisection."""
    def faster(c: int) -> bool:
        return mine.step(batch, c).total_s < base.step(batch, c).total_s

    if not faster(longest):
        return None
    grid, c = [], 1
    while c < longest:
        grid.append(c)
        c *= 2
    # the last grid context where it is not faster, found from the long end down
    lo = next((g for g in reversed(grid) if not faster(g)), None)
    if lo is None:
        return 1
    return last_true(lambda c: not faster(c), lo, min(lo * 2, longest)) + 1
