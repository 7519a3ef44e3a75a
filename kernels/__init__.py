"""kvplan's GPU kernels, installed as `kvplan.kernels` (they need torch and triton: `pip install 'kvplan[gpu]'`).

One module per kernel family, each with its launcher and a plain torch reference beside it:
  layouts               where each byte of a cache slot sits, computed from the format catalog (kvplan.specs.kv_formats)
  common                what the decode kernels share: slot addressing, the online-softmax step, packed codes,
                        and the split of each context over several programs with the kernel that folds the splits
  paged_attention       paged decode attention (GQA, ragged lengths) over bf16, fp16, fp8 e4m3/e5m2 with per-tensor
                        scales, and int8/fp8 with per-token-head scales; the write path that quantizes a token into
                        its slot, in torch and as a Triton kernel (reshape_and_cache)
  int4_attention        int4 per-token-head: Hadamard-rotated, two values a byte, zero-point in the scale's low bits;
                        its write path in torch and as a Triton kernel (reshape_and_cache_int4)
  nvfp4_attention       NVFP4: e2m1 pairs, an e4m3 scale per 16 values, an fp32 global scale; its write path in
                        torch and as a Triton kernel (reshape_and_cache_nvfp4)
  turboquant_attention  the TurboQuant presets: Lloyd-Max keys on rotated coordinates with a stored norm, uniform
                        asymmetric values (k8v4: fp8 keys); its write path in torch and as a Triton kernel
                        (reshape_and_cache_turboquant)
  kivi_attention        KIVI: per-channel key groups, per-token values, a full-precision residual window; a whole
                        group's write in torch and as a Triton kernel (reshape_and_cache_kivi)
  gemv                  weight streaming at decode batch sizes, bf16 and fp8 weights
  stream                read-only and copy probes: the bandwidth ceiling
  bench                 the timed workloads of `kvplan measure` and `kvplan measure --validate`
The tests run them on the CPU under Triton's interpreter (TRITON_INTERPRET=1), and compile them for sm_90.
"""
