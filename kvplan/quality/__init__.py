"""What a KV format costs in accuracy: each format's store on the torch references (formats), the figures compared
(metrics), a transformers model run with its cache stored in each format (run), and K/V drawn with the structure
the literature reports, for a first look without a model (synthetic). Needs torch (and transformers for a model):
the `quality` extra."""

# The catalog families kvplan has no store for: vLLM's packed ROCm caches (UltraQuant's e2m1 + UE8M0 slots,
# Octave's rotated Lloyd-Max slots), whose encoders are ROCm kernels (v1/attention/ops/ultraquant/, csrc/attention/
# octave_attn.cu) kvplan does not reproduce. `quality -d all` leaves them out; naming one is refused in one line.
UNMEASURED_FAMILIES = frozenset({"ultraquant", "octave"})
