"""kvplan's GPU kernels, installed as `kvplan.kernels` (they need torch and triton: `pip install 'kvplan[gpu]'`).

One module per kernel family, each with its launcher and a plain torch reference beside it:
  layouts          where each byte of a cache slot sits, computed from the format catalog (kvplan.formats)
  paged_attention  paged decode attention (GQA, ragged lengths) over bf16, fp16, fp8 e4m3/e5m2 with per-tensor
                   scales, and int8/fp8 with per-token-head scales; the write path that quantizes a token into its
                   slot
  stream           read-only and copy probes: the bandwidth ceiling
The tests run them on the CPU under Triton's interpreter (TRITON_INTERPRET=1).
"""
