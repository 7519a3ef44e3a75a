"""What is published about each KV format's accuracy: one row per result, each with its source, quoted as the source
states it. Pure data (no torch): `kvplan formats NAME` and `kvplan quality` print it beside their own figures.

A row holds a figure only where the source gives one; what the source leaves unsaid (the model, the data set) says
so instead of being guessed. Statements without a figure are NOTES. A catalog format with no row has no published
figure that kvplan can cite (`formats_without_evidence`): measure it with `kvplan quality`.
"""

from __future__ import annotations

from kvplan.values import frozen_dataclass

NOT_NAMED = "not named"  # by the source


@frozen_dataclass
class Evidence:
    """One published accuracy result: on `model`, `benchmark` went from `baseline` to `result` with `format`."""

    format: str  # the catalog name
    model: str
    benchmark: str
    baseline: str  # what the result is measured against
    result: str  # the change, as the source states it
    source: str  # where it is published (file and lines, paper)
    quote: str  # the source's own words


@frozen_dataclass
class Note:
    """A published statement about a format's accuracy without a figure."""

    formats: tuple[str, ...]
    text: str
    source: str


# vLLM's TurboQuant presets: the docstring of vllm/model_executor/layers/quantization/turboquant/config.py lists
# each preset's capacity ratio and perplexity change (L71-L75, the same lines in v0.30 and 0.33)
_TQ_CONFIG = "vLLM quantization/turboquant/config.py"  # vllm/model_executor/layers/quantization/
_TQ_PPL = [
    ("turboquant_k8v4", "+1.17% PPL", "turboquant_k8v4:   FP8 keys + 4-bit values, 2.6x, +1.17% PPL"),
    ("turboquant_4bit_nc", "+2.71% PPL", "turboquant_4bit_nc: 4-bit MSE keys + 4-bit values + NC, 3.8x, +2.71%"),
    ("turboquant_k3v4_nc", "+10.63% PPL", "turboquant_k3v4_nc: 3-bit MSE keys + 4-bit values + NC, ~3.5x, +10.63%"),
    ("turboquant_3bit_nc", "+20.59% PPL", "turboquant_3bit_nc: 3-bit MSE keys + 3-bit values + NC, 4.9x, +20.59%"),
]

EVIDENCE: tuple[Evidence, ...] = tuple(
    Evidence(name, NOT_NAMED, "perplexity (data not named)", "unquantized cache", change,
             f"{_TQ_CONFIG} L71-L75 (the presets' docstring)", quote)
    for name, change, quote in _TQ_PPL
) + (
    # the norm correction's own price, from the same file (L83-L85)
    Evidence("turboquant_4bit_nc", NOT_NAMED, "perplexity (data not named)",
             "the same preset without norm correction", "about 0.8% lower PPL", f"{_TQ_CONFIG} L83-L85",
             "improving PPL by ~0.8% at 4-bit"),
) + tuple(
    # TurboQuantConfig.get_boundary_skip_layers' docstring: why the first and last two layers stay in bf16
    Evidence(name, "Qwen3-4B", "GSM8K", "the first and last two layers kept in bf16 (the default skip layers)",
             "about 30 points lower without the skip layers", f"{_TQ_CONFIG} get_boundary_skip_layers (docstring)",
             "Empirically required for aggressive presets (k3v4_nc, 3bit_nc) — without it GSM8K drops ~30 points on "
             "Qwen3-4B.")
    for name in ("turboquant_k3v4_nc", "turboquant_3bit_nc")
)

NOTES: tuple[Note, ...] = (
    Note(("fp8", "fp8_e4m3", "fp8_e5m2"),
         "vLLM warns at start-up that an fp8 cache 'may cause accuracy drop without a proper scaling factor'; "
         "without calibrated scales in the checkpoint every scale is 1.0 ('Using KV cache scaling factor 1.0')",
         "vLLM vllm/config/cache.py CacheConfig._validate_cache_dtype (L293-L311); "
         "vllm/model_executor/layers/quantization/kv_cache.py BaseKVCacheMethod.process_weights_after_loading"),
    Note(("kivi2", "kivi4"),
         "KIVI reports keys with persistent per-channel outliers and values without them, hence keys per channel "
         "and values per token; it validates 2-bit on Llama, Falcon and Mistral and reports memory and throughput "
         "rather than a figure kvplan can quote here",
         "KIVI, arXiv:2402.02750"),
)


def evidence_for(name: str) -> tuple[Evidence, ...]:
    """The published results for the catalog format `name`, in the table's order."""
    return tuple(e for e in EVIDENCE if e.format == name)


def notes_for(name: str) -> tuple[Note, ...]:
    return tuple(n for n in NOTES if name in n.formats)


def formats_without_evidence(names) -> list[str]:
    """Those of `names` (catalog format names) that no published result covers."""
    covered = {e.format for e in EVIDENCE}
    return [n for n in names if n not in covered]
