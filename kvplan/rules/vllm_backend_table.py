"""vLLM's attention backends and its selector's priority lists, as data: one Backend entry per backend as the first
read release has it, and again where a later release changed it (each naming the vLLM file it is read from), and the
priority lists of platforms/cuda.py and platforms/rocm.py per release. A release that changes nothing of an entry or
a list reuses the earlier one by reference. kvplan.rules.vllm_backends walks them as vLLM's selector does.

Paths are relative to the vllm package.
"""

from __future__ import annotations

from dataclasses import replace

from kvplan.rules.vllm_backend_rules import E4M3, FLOAT, FP8, PER_TOKEN_HEAD, TURBOQUANT, Backend

_B = "v1/attention/backends/"
_CUDA = "platforms/cuda.py _get_backend_priorities"
_ROCM = "platforms/rocm.py _get_backend_priorities (VLLM_ROCM_USE_AITER off, the default)"

# ---------------------------------------------------------------------------------------------------------------
# The backends, each as 0.19 reads it and again where a later release changed it

_FA = Backend("FLASH_ATTN", "FlashAttention", _B + "flash_attn.py FlashAttentionBackend (supports_kv_cache_dtype, "
              "supports_head_size, get_supported_kernel_block_sizes, supports_compute_capability, supports_sink, "
              "supports_combination); fa_utils.py", FLOAT | FP8, block_multiple=16, cc_min=(8, 0),
              checks=("fa_head", "fa_fp8", "fa_sinks"), fails=("fa_cache_view",), sliding_window=True)
_FLASHINFER = Backend("FLASHINFER", "FlashInfer", _B + "flashinfer.py FlashInferBackend (supported_kv_cache_dtypes, "
                      "get_supported_head_sizes, get_supported_kernel_block_sizes, supports_compute_capability, "
                      "supports_sink)", FLOAT | FP8, blocks=(16, 32, 64), head_sizes=(64, 128, 256), cc_min=(7, 5),
                      cc_max=(12, 1), checks=("flashinfer_sinks",), sliding_window=True)
_TRITON = Backend("TRITON_ATTN", "Triton", _B + "triton_attn.py TritonAttentionBackend (supported_kv_cache_dtypes, "
                  "supports_head_size, get_supported_kernel_block_sizes, supports_sink)", FLOAT | FP8,
                  block_multiple=16, head_min=32, sinks=True, sliding_window=True)
_FLEX = Backend("FLEX_ATTENTION", "FlexAttention (torch)", _B + "flex_attention.py FlexAttentionBackend "
                "(supported_kv_cache_dtypes, get_supported_head_sizes)", FLOAT, sliding_window=True)
_TURBOQUANT = Backend("TURBOQUANT", "TurboQuant (Triton)", _B + "turboquant_attn.py TurboQuantAttentionBackend "
                      "(supports_kv_cache_dtype, supports_head_size, get_supported_kernel_block_sizes)", TURBOQUANT,
                      blocks=(16, 32, 64, 128), head_min=1, since="0.20")
_MLA_HEADS = (320, 576)  # model_executor/layers/attention/mla_attention.py MLACommonBackend.get_supported_head_sizes
_FA_MLA = Backend("FLASH_ATTN_MLA", "FlashAttention 3 MLA", _B + "mla/flashattn_mla.py FlashAttnMLABackend "
                  "(supported_kv_cache_dtypes, supports_compute_capability, supports_combination)", FLOAT, mla=True,
                  block_multiple=16, head_sizes=_MLA_HEADS, cc_majors=(9,), checks=("mla_fa3",))
_FLASHMLA = Backend("FLASHMLA", "FlashMLA", _B + "mla/flashmla.py FlashMLABackend (supported_kv_cache_dtypes, "
                    "get_supported_kernel_block_sizes, supports_compute_capability)", FLOAT | E4M3, mla=True,
                    blocks=(64,), head_sizes=_MLA_HEADS, cc_majors=(9, 10))
_FLASHINFER_MLA = Backend("FLASHINFER_MLA", "FlashInfer MLA (TRTLLM)", _B + "mla/flashinfer_mla.py "
                          "FlashInferMLABackend "
                          "(supported_kv_cache_dtypes, get_supported_kernel_block_sizes, supports_compute_capability, "
                          "supports_combination)", FLOAT | E4M3, mla=True, blocks=(32, 64), head_sizes=_MLA_HEADS,
                          cc_majors=(10,), checks=("flashinfer_mla_nope",))
_CUTLASS_MLA = Backend("CUTLASS_MLA", "CUTLASS MLA", _B + "mla/cutlass_mla.py CutlassMLABackend "
                       "(supported_kv_cache_dtypes, get_supported_kernel_block_sizes, supports_compute_capability)",
                       FLOAT | E4M3, mla=True, blocks=(128,), head_sizes=_MLA_HEADS, cc_majors=(10,))
_TRITON_MLA = Backend("TRITON_MLA", "Triton MLA", _B + "mla/triton_mla.py TritonMLABackend (supported_kv_cache_dtypes, "
                      "get_supported_head_sizes, get_supported_kernel_block_sizes)", FLOAT | E4M3, mla=True,
                      block_multiple=16)
_TOKENSPEED = Backend("TOKENSPEED_MLA", "TokenSpeed MLA", _B + "mla/tokenspeed_mla.py TokenspeedMLABackend "
                      "(supported_kv_cache_dtypes, supports_compute_capability, supports_combination)", E4M3,
                      mla=True, blocks=(32, 64), head_sizes=_MLA_HEADS, cc_majors=(10,), checks=("tokenspeed",),
                      since="0.25")
_FLASHMLA_SPARSE = Backend("FLASHMLA_SPARSE", "FlashMLA sparse", _B + "mla/flashmla_sparse.py FlashMLASparseBackend "
                           "(supported_kv_cache_dtypes, get_supported_kernel_block_sizes, get_supported_head_sizes, "
                           "supports_compute_capability)", frozenset({"auto", "bfloat16", "fp8_ds_mla", "fp8"}),
                           mla=True, sparse=True, blocks=(64,), head_sizes=(576,), cc_majors=(9, 10))
_FLASHINFER_MLA_SPARSE = Backend(
    "FLASHINFER_MLA_SPARSE", "FlashInfer sparse MLA (TRTLLM)", _B + "mla/flashinfer_mla_sparse.py "
    "FlashInferMLASparseBackend (supported_kv_cache_dtypes, get_supported_kernel_block_sizes, "
    "get_supported_head_sizes, supports_compute_capability, supports_combination)", FLOAT | E4M3, mla=True,
    sparse=True, blocks=(32, 64), head_sizes=(576,), cc_majors=(10,), checks=("sparse_indexed",))
_FA_MLA_SPARSE = Backend("FLASH_ATTN_MLA_SPARSE", "FlashAttention sparse MLA", _B + "mla/flashattn_mla_sparse.py "
                         "FlashAttnMLASparseBackend (supported_kv_cache_dtypes, get_supported_kernel_block_sizes, "
                         "supports_compute_capability, supports_combination)", FLOAT, mla=True, sparse=True,
                         block_multiple=64, cc_majors=(9,), checks=("mla_fa3", "sparse_indexed"), since="0.30")
_FI_MLA_SPARSE_SM90 = Backend("FLASHINFER_MLA_SPARSE_SM90", "FlashInfer sparse MLA (SM90)", _B +
                              "mla/flashinfer_mla_sparse_sm90.py FlashInferMLASparseSM90Backend",
                              frozenset({"auto", "bfloat16", "fp8", "fp8_e4m3"}), mla=True, sparse=True,
                              block_multiple=64, head_sizes=(512, 576), cc_majors=(9,), since="0.30")
_FA4_MLA_SPARSE = Backend("FLASH_ATTN_MLA_SPARSE_FA4", "FlashAttention 4 sparse MLA", _B +
                          "mla/flashattn_mla_sparse.py FlashAttnMLASparseFA4Backend (supported_kv_cache_dtypes, "
                          "get_supported_kernel_block_sizes, supports_combination)", frozenset({"auto", "bfloat16"}),
                          mla=True, sparse=True, block_multiple=64, head_sizes=(576,), cc_majors=(10,),
                          checks=("sparse_fa4", "sparse_indexed"), since="0.33")
_FI_MLA_SPARSE_SM120 = Backend("FLASHINFER_MLA_SPARSE_SM120", "FlashInfer sparse MLA (SM120)", _B +
                               "mla/flashinfer_mla_sparse.py FlashInferMLASparseSM120Backend",
                               frozenset({"auto", "fp8", "fp8_e4m3", "fp8_ds_mla"}), mla=True, sparse=True,
                               blocks=(64, 256), head_sizes=(576,), cc_majors=(12,), since="0.25")
# DeepSeek-V4's attention layers name their backend (0.33, the release kvplan plans them with)
_DSV4 = Backend("FLASHMLA_SPARSE_DSV4", "FlashMLA sparse (DeepSeek-V4)", "models/deepseek_v4/sparse_mla.py "
                "DeepseekV4SparseMLABackend (supported_kv_cache_dtypes, get_supported_kernel_block_sizes, "
                "get_supported_head_sizes, supports_compute_capability)", frozenset({"auto", "fp8_ds_mla", "fp8"}),
                mla=True, sparse=True, blocks=(256,), head_sizes=(512,), cc_majors=(9, 10), sinks=True, since="0.33")
# UltraQuant (0.32): TurboQuantAttentionBackend's scaffolding (its kernel blocks 16/32/64/128, any head size, no
# capability check) with a block of its own (get_preferred_block_size: 64, its FlyDSL decode's), bf16 models only
# (supported_dtypes), no sinks (supports_sink) and no sliding window (the base's supports_sliding_window). It ends
# platforms/rocm.py's list; platforms/cuda.py lists it nowhere, and kvplan does not plan it on CUDA (its decode
# kernel is ROCm's FlyDSL, its CUDA path a fallback vLLM's selector never takes).
_ULTRAQUANT = Backend("ULTRAQUANT", "UltraQuant (FlyDSL / Triton)", _B + "ultraquant_attn.py UltraQuantAttentionBackend "
                      "(supported_kv_cache_dtypes, supported_dtypes, get_preferred_block_size, supports_sink); "
                      "turboquant_attn.py TurboQuantAttentionBackend", frozenset({"ultraquant_4bit"}),
                      blocks=(16, 32, 64, 128), head_min=1, dtypes=frozenset({"bfloat16"}), preferred=64,
                      fails=("ultraquant_head",), platform="rocm", since="0.32")
# Octave (0.33): ROCm's own kernels for the octave_* caches, on CDNA3 (gfx942) and RDNA3 (gfx11*) only
# (supports_compute_capability: get_cdna_version() == 3 or get_rdna_version() == 3), head 256 only, kernel blocks
# MultipleOf(16), fp16/bf16 models, no sinks, no sliding window (the base's defaults)
_OCTAVE = Backend("ROCM_OCTAVE", "Octave (ROCm)", _B + "rocm_octave_attn.py RocmOctaveAttentionBackend "
                  "(supported_kv_cache_dtypes, get_supported_head_sizes, get_supported_kernel_block_sizes, "
                  "supports_compute_capability)", frozenset({"octave_k3v4", "octave_k3v3", "octave_k3v3_compact"}),
                  block_multiple=16, head_sizes=(256,), gcn_archs=("gfx942", "gfx11"), platform="rocm", since="0.33")
# ROCm (platforms/rocm.py; AITER's backends are used only with VLLM_ROCM_USE_AITER=1)
_ROCM_ATTN = Backend("ROCM_ATTN", "ROCm paged attention", _B + "rocm_attn.py RocmAttentionBackend "
                     "(supported_kv_cache_dtypes, get_supported_head_sizes, get_supported_kernel_block_sizes)",
                     FLOAT | FP8, block_multiple=16, head_sizes=(32, 64, 80, 96, 128, 160, 192, 224, 256),
                     platform="rocm", sliding_window=True)

# what later releases changed, each read from that release's file
_CHANGES = [
    # 0.20: FlashAttention's selector check takes every quantized cache on FA3 (supports_kv_cache_dtype:
    # is_quantized_kv_cache -> flash_attn_supports_fp8), though it reads only fp8/fp8_e4m3 (fails: fa_cache_view),
    # heads up to 512 where FA4 exists; Triton takes int8/fp8 per-token-head; the sparse FlashMLA takes head 512
    # too. nvfp4 is a CacheDType name here that no backend stores: FlashInfer does not list it (its metadata
    # builder raises "nvfp4 KV cache is not yet supported") and FlashAttention cannot read it
    replace(_FA, since="0.20", kv_dtypes=FLOAT | FP8 | {"int8_per_token_head", "fp8_per_token_head", "nvfp4"}),
    replace(_TRITON, since="0.20", kv_dtypes=FLOAT | FP8 | {"int8_per_token_head", "fp8_per_token_head"}),
    replace(_FLASHMLA_SPARSE, since="0.20", head_sizes=(512, 576)),
    # 0.25: FlashAttention's fp8 is fp8/fp8_e4m3 only; FlashInfer takes nvfp4 (10.x), head 512 and only 8.0+
    # (supports_compute_capability); Triton takes int4 per-token-head; FlashInfer's sparse MLA refuses
    # fp8_ds_mla; the sparse FlashMLA takes only head 576 again
    replace(_FA, since="0.25", kv_dtypes=FLOAT | E4M3, fails=()),
    replace(_FLASHINFER, since="0.25", kv_dtypes=FLOAT | FP8 | {"nvfp4"}, head_sizes=(64, 128, 256, 512),
            cc_min=(8, 0), checks=("flashinfer_sinks", "flashinfer_nvfp4")),
    replace(_TRITON, since="0.25", kv_dtypes=FLOAT | FP8 | PER_TOKEN_HEAD),
    replace(_FLASHINFER_MLA_SPARSE, since="0.25", head_sizes=(576,), checks=("sparse_indexed", "no_fp8_ds_mla")),
    replace(_FLASHMLA_SPARSE, since="0.25", head_sizes=(576,)),
    # 0.26 to 0.33 change no entry's lists below but for those named; what else each changed is a rule of
    # kvplan.rules.vllm_backend_rules keyed by its release: 0.26 the sliding-window check of validate_configuration,
    # 0.27 FlashAttention's fp8 cache on FA4 (10.x) and FA4 at head 256, 0.28 FA2 at head 256 again and FlashInfer's
    # sinks on 12.x, 0.29 FA4's hd256 kernel and its 128-token block, 0.30 FlashInfer's sinks on 9.0, 0.31 FA4's fp8
    # cache at head 512 on 9.x, 0.32 FlashInfer's nvfp4 on its FA2 path.
    # 0.28 (flashinfer.py): FlashInfer lists nvfp4_4over6 and takes it on 10.x as nvfp4 (supports_kv_cache_dtype:
    # kv_cache_dtype.startswith("nvfp4"))
    replace(_FLASHINFER, since="0.28", kv_dtypes=FLOAT | FP8 | {"nvfp4", "nvfp4_4over6"},
            head_sizes=(64, 128, 256, 512), cc_min=(8, 0), checks=("flashinfer_sinks", "flashinfer_nvfp4")),
    # 0.30: the sparse FlashMLA takes nvfp4_ds_mla (10.x); MLACommonBackend (model_executor/layers/attention/
    # mla_attention.py get_supported_head_sizes) and _FlashInferMLASparseBackendBase (mla/flashinfer_mla_sparse.py)
    # take head 512 too
    replace(_FLASHMLA_SPARSE, since="0.30", kv_dtypes=_FLASHMLA_SPARSE.kv_dtypes | {"nvfp4_ds_mla"},
            checks=("nvfp4_ds_mla",)),
    *[replace(b, since="0.30", head_sizes=(320, 512, 576)) for b in (_FA_MLA, _FLASHMLA, _FLASHINFER_MLA,
                                                                      _CUTLASS_MLA, _TOKENSPEED)],
    replace(_FLASHINFER_MLA_SPARSE, since="0.30", head_sizes=(512, 576), checks=("sparse_indexed", "no_fp8_ds_mla")),
    replace(_FI_MLA_SPARSE_SM120, since="0.30", head_sizes=(512, 576)),
    # 0.31 (mla/flashmla_sparse.py): the sparse FlashMLA takes head 512 again, for a RoPE-free model with a 16-bit
    # cache on 9.x (supports_combination; 0.32 adds fp8_ds_mla)
    replace(_FLASHMLA_SPARSE, since="0.31", kv_dtypes=_FLASHMLA_SPARSE.kv_dtypes | {"nvfp4_ds_mla"},
            checks=("nvfp4_ds_mla", "flashmla_sparse_512"), head_sizes=(512, 576)),
    # 0.32: FlashInfer's sparse MLA takes any multiple of 32, its SM120 variant and the sparse FlashMLA any multiple
    # of 64 (get_supported_kernel_block_sizes; FlashMLA keeps 64 for a quantized cache on 10.x, the same choice)
    replace(_FLASHMLA_SPARSE, since="0.32", kv_dtypes=_FLASHMLA_SPARSE.kv_dtypes | {"nvfp4_ds_mla"},
            checks=("nvfp4_ds_mla", "flashmla_sparse_512"), blocks=(), block_multiple=64, head_sizes=(512, 576)),
    replace(_FLASHINFER_MLA_SPARSE, since="0.32", blocks=(), block_multiple=32, head_sizes=(512, 576),
            checks=("sparse_indexed", "no_fp8_ds_mla")),
    replace(_FI_MLA_SPARSE_SM120, since="0.32", blocks=(), block_multiple=64, head_sizes=(512, 576)),
]
BACKENDS: tuple[Backend, ...] = (_FA, _FLASHINFER, _TRITON, _FLEX, _TURBOQUANT, _FA_MLA, _FLASHMLA, _FLASHINFER_MLA,
                                 _CUTLASS_MLA, _TRITON_MLA, _TOKENSPEED, _FLASHMLA_SPARSE, _FLASHINFER_MLA_SPARSE,
                                 _FA_MLA_SPARSE, _FI_MLA_SPARSE_SM90, _FA4_MLA_SPARSE, _FI_MLA_SPARSE_SM120,
                                 _DSV4, _ROCM_ATTN, _ULTRAQUANT, _OCTAVE, *_CHANGES)

# ---------------------------------------------------------------------------------------------------------------
# The selector's priority lists: (platform, layout, arch) -> backend names, keyed by release. Layout: "mha",
# "mla" (dense MLA) or "sparse" (a sparse-MLA model reaches only the sparse backends: validate_configuration
# refuses the others with "sparse not supported", so their place in the one list does not matter); arch: the
# compute capability major, or None for the rest. Sparse on 10.x also depends on the cache and the head count
# ("sparse", 10, "quantized" | "few_heads" | None).
_MHA = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
_MHA10 = ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION")
_P019 = {("mha", 10): _MHA10, ("mha", None): _MHA,
         ("mla", 10): ("FLASHINFER_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"),
         ("mla", None): ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"),
         ("sparse", 10, "quantized"): ("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
         ("sparse", 10, "few_heads"): ("FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE"),
         ("sparse", 10, None): ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"),
         ("sparse", None): ("FLASHMLA_SPARSE",)}
_P020 = {**_P019, ("mha", 10): _MHA10 + ("TURBOQUANT",), ("mha", None): _MHA + ("TURBOQUANT",)}
_P025 = {**_P020,
         ("mla", 10): ("FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"),
         ("mla", 12): ("TRITON_MLA",), ("sparse", 12): ("FLASHINFER_MLA_SPARSE_SM120",)}
_P030 = {**_P025, ("sparse", None): ("FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM90"),
         ("sparse", None, 512): ("FLASHINFER_MLA_SPARSE_SM90", "FLASH_ATTN_MLA_SPARSE", "FLASHMLA_SPARSE")}
_P033 = {**_P030, ("dsv4", None): ("FLASHMLA_SPARSE_DSV4",),
         ("sparse", 10, "few_heads"): ("FLASH_ATTN_MLA_SPARSE_FA4", "FLASHINFER_MLA_SPARSE", "FLASHMLA_SPARSE")}
_ROCM_P = {("mha", None): ("ROCM_ATTN", "TRITON_ATTN"), ("mla", None): ("TRITON_MLA",)}
# platforms/cuda.py's lists are 0.25's in 0.26 to 0.29 (0.26 adds use_non_causal, which moves FLASHINFER from the
# head of the 10.x list for non-causal models only, kvplan plans decoders) and 0.30's in 0.31 and 0.32
PRIORITIES: dict[str, dict] = {"0.19": _P019, "0.20": _P020, "0.25": _P025, "0.26": _P025, "0.27": _P025,
                               "0.28": _P025, "0.29": _P025, "0.30": _P030, "0.31": _P030, "0.32": _P030,
                               "0.33": _P033}
PRIORITY_SOURCES = {r: f"vLLM {r}.0 {_CUDA}" for r in PRIORITIES}
_ROCM_020 = ("ROCM_ATTN", "TRITON_ATTN", "TURBOQUANT")
ROCM_PRIORITIES = {"0.19": {("mha", None): ("ROCM_ATTN", "TRITON_ATTN"), ("mla", None): ("TRITON_MLA",)},
                   "0.20": {**_ROCM_P, ("mha", None): _ROCM_020},
                   "0.32": {**_ROCM_P, ("mha", None): _ROCM_020 + ("ULTRAQUANT",)},
                   "0.33": {**_ROCM_P, ("mha", None): _ROCM_020 + ("ROCM_OCTAVE", "ULTRAQUANT")}}
ROCM_SOURCE = (f"vLLM 0.19.0 to 0.33.0 {_ROCM}: ROCM_ATTN, TRITON_ATTN (and TURBOQUANT from 0.20, ULTRAQUANT from "
               "0.32, ROCM_OCTAVE before it from 0.33); MLA: TRITON_MLA; sparse MLA: ROCM_AITER_MLA_SPARSE, which "
               "kvplan does not plan")

