"""What a KV format costs in accuracy: each format's store on the torch references (formats), the figures compared
(metrics), a transformers model run with its cache stored in each format (run), and K/V drawn with the structure
the literature reports, for a first look without a model (synthetic). Needs torch (and transformers for a model):
the `quality` extra."""

# The catalog families kvplan has a store for (kvplan.quality.formats.layer_store; MLA latents are not measured).
# Every other family (vLLM's packed ROCm caches: UltraQuant's e2m1 + UE8M0 slots and Octave's rotated Lloyd-Max
# slots, whose encoders are ROCm kernels, v1/attention/ops/ultraquant/ and csrc/attention/octave_attn.cu, kvplan
# does not reproduce; a family new to the catalog) has none: `quality -d all` leaves it out and naming one is refused
# in one line.
STORED_FAMILIES = frozenset({"float", "fp8", "per_token_head", "nvfp4", "mx", "turboquant", "kivi", "custom"})


def measurable(fmt) -> bool:
    """Whether kvplan quality can store this format's K and V."""
    return fmt.applies_to != "mla" and fmt.family in STORED_FAMILIES
