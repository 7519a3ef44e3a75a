"""Units of memory, one definition each: GiB and MiB are what CUDA, torch and the engines' logs mean by "GiB" and
"MiB" (and what vLLM's logs print as GiB); GB is 10^9 bytes, as GPU datasheets count; and rounding up to a
granularity."""

import math

MiB = 2**20
GiB = 2**30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # bytes per element of a model or state dtype


def round_up(n: float, unit: int) -> int:
    """`n` rounded up to a whole number of `unit`s (an allocation granularity)."""
    return math.ceil(n / unit) * unit
