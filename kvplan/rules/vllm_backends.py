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

Read from the vLLM releases 0.19.0, 0.20.0, 0.25.0, 0.30.0 and 0.33.0 (0.34.0 has 0.33's priority lists and
backend entries). A release between two read ones is planned with the newest read release not after it. Where
a backend's fact is the same in every release read, its one entry holds; `since` keys the entries that changed.
Paths are relative to the vllm package.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from kvplan.errors import KvplanError
from kvplan.values import frozen_dataclass

_B = "v1/attention/backends/"
_CUDA = "platforms/cuda.py _get_backend_priorities"
_ROCM = "platforms/rocm.py _get_backend_priorities (VLLM_ROCM_USE_AITER off, the default)"
READ = ("0.19", "0.20", "0.25", "0.30", "0.33")  # the releases whose source the matrix is read from
FLOAT = frozenset({"auto", "float16", "bfloat16"})
FP8 = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})
E4M3 = frozenset({"fp8", "fp8_e4m3"})
PER_TOKEN_HEAD = frozenset({"int4_per_token_head", "int8_per_token_head", "fp8_per_token_head"})
TURBOQUANT = frozenset({"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"})


@frozen_dataclass
class Backend:
    """One attention backend as one vLLM release's selector sees it.

    `blocks`: the fixed kernel block sizes; `block_multiple`: MultipleOf(n) (either or both may be empty/0: any).
    `head_sizes`: the listed head sizes (empty: any), `head_multiple`, `head_min`, `head_max` the rule a backend
    writes as a formula. `cc_majors` (empty: any) and `cc_min`/`cc_max` bound the compute capability. `checks`
    name the rules of its supports_combination / supports_kv_cache_dtype / supports_sink that need more than a
    list (kvplan.rules.vllm_backends._CHECKS). `fails` name rules of the same form for what validate_configuration
    lets through but the backend raises on once it runs (the engine then fails at start: kvplan plans no such
    backend, and says why). `since`: the first read release this entry describes."""

    name: str
    family: str  # the kernel family, as a user reads it ("FlashAttention", "FlashInfer", "Triton", ...)
    source: str  # file and functions the entry is read from
    kv_dtypes: frozenset
    mla: bool = False
    sparse: bool = False
    blocks: tuple[int, ...] = ()
    block_multiple: int = 0
    head_sizes: tuple[int, ...] = ()
    head_multiple: int = 1
    head_min: int = 0
    head_max: int = 0
    cc_majors: tuple[int, ...] = ()
    cc_min: tuple[int, int] = (0, 0)
    cc_max: tuple[int, int] = (99, 99)
    sinks: bool = False  # supports_sink without a further rule (a rule in `checks` otherwise)
    checks: tuple[str, ...] = ()
    fails: tuple[str, ...] = ()
    platform: str = "cuda"
    since: str = "0.19"

    def preferred_block(self, default: int = 16) -> int:
        """AttentionBackend.get_preferred_block_size: the default where the backend takes it, else its smallest
        kernel size."""
        if self.takes_block(default):
            return default
        return min([*self.blocks, *([self.block_multiple] if self.block_multiple else [])])

    def takes_block(self, block: int) -> bool:
        """AttentionBackend.supports_block_size: the block is a multiple of one kernel size (hybrid blocks)."""
        sizes = [*self.blocks, *([self.block_multiple] if self.block_multiple else [])]
        return not sizes or any(block % s == 0 for s in sizes)

    def takes_head(self, head: int) -> bool:
        if self.head_sizes:
            return head in self.head_sizes
        return head % self.head_multiple == 0 and head >= self.head_min and (not self.head_max or head <= self.head_max)


@frozen_dataclass
class AttentionFacts:
    """What the selector reads of the model (AttentionSelectorConfig and the hf config the backends consult)."""

    head_size: int  # per head; MLA: kv_lora_rank + qk_rope_head_dim (the latent the cache stores)
    num_heads: int  # query heads per tensor-parallel rank
    mla: bool = False
    sparse: bool = False
    sinks: bool = False
    hybrid: bool = False
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    kv_lora_rank: int = 0
    index_topk: int | None = None
    dcp: int = 1
    compressed: bool = False  # DeepSeek-V4's compressed sparse attention, whose model file names its backend


@frozen_dataclass
class Choice:
    """The backend vLLM runs: its name, the kernel family (FlashAttention's version where it is FLASH_ATTN), the
    block size it sets when --block-size is not given, and the release read."""

    name: str
    family: str
    block_size: int
    release: str
    requested: bool = False
    source: str = ""

    @property
    def label(self) -> str:
        return f"{self.name} ({self.family})"


def _cc(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


@lru_cache(maxsize=None)
def _key(v: str) -> tuple[int, int]:
    major, minor = (v.strip().lstrip("v").split(".") + ["0"])[:2]
    return int(major), int(minor)


def read_release(version: str) -> str:
    """The newest read release not after `version` (releases before 0.19 are read as 0.19)."""
    earlier = [r for r in READ if _key(r) <= _key(version)]
    return earlier[-1] if earlier else READ[0]


def _from(release: str, first: str) -> bool:
    """Whether `release` is `first` or later."""
    return _key(read_release(release)) >= _key(first)


# ---------------------------------------------------------------------------------------------------------------
# FlashAttention's version (v1/attention/backends/fa_utils.py get_flash_attn_version; FA3 needs 9.x and FA4 9.x,
# 10.x or 11.x in vllm_flash_attn/flash_attn_interface.py _is_fa3_supported / _is_fa4_supported)

def flash_attn_version(release: str, cc: tuple[int, int], head: int, quantized: bool = False,
                       sinks: bool = False, dcp: int = 1) -> int | None:
    """FA3 on 9.x, FA4 on 10.x, FA2 elsewhere from 8.0 (None below); FA4 on 10.x+ falls back to FA2 above head
    128 (192 excepted in 0.19 to 0.25). From 0.25 a 9.x head above 256 moves FA3 up to FA4. From 0.30 head 256 on
    10.x/11.x runs FA4's hd256 kernel unless the cache is quantized, the model has sinks or DCP > 1 (FA2 then)."""
    if cc < (8, 0):
        return None
    version = 3 if cc[0] == 9 else 4 if cc[0] == 10 else 2
    if version == 3 and _from(release, "0.25") and head > 256:
        version = 4
    if version == 4 and _from(release, "0.30") and head == 256 and cc[0] in (10, 11):
        return 2 if quantized or sinks or dcp > 1 else 4
    if version == 4 and cc[0] >= 10 and head > 128 and head != 192:
        version = 2
    return version


def _fa_fp8(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashAttention stores an fp8 cache with FA3 on 9.x (0.19: every fp8 name; 0.25: fp8 and fp8_e4m3 only),
    from 0.30 also with FA4 on 10.x (flash_attn_supports_kv_cache_dtype), and from 0.33 with FA4 at head 512 on
    9.x."""
    if dtype in FLOAT:
        return None
    v = flash_attn_version(release, cc, f.head_size, quantized=True, sinks=f.sinks, dcp=f.dcp)
    ok = (v == 3 and cc[0] == 9) or (_from(release, "0.30") and v == 4 and cc[0] == 10) or \
        (_from(release, "0.33") and v == 4 and cc[0] == 9 and f.head_size == 512)
    if _from(release, "0.25") and dtype == "fp8_e5m2":
        ok = False
    return None if ok else "its fp8 cache needs FA3 on 9.x or FA4 on 10.x"


def _fa_cache_view(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """What FlashAttention cannot read though its selector check takes it: 0.19's supports_kv_cache_dtype takes
    every fp8 name on FA3 (kv_cache_dtype.startswith("fp8") -> flash_attn_supports_fp8) and 0.20's every quantized
    cache (utils/torch_utils.py is_quantized_kv_cache: fp8*, *_per_token_head, nvfp4), but FlashAttentionImpl.forward
    (and the FA3 metadata builder's AOT schedule) view the cache through
    FlashAttentionBackend.get_fp8_dtype_for_flashattn, which knows fp8 and fp8_e4m3 only and raises ValueError
    ("Unrecognized FP8 dtype") for the rest. 0.25 lists fp8 and fp8_e4m3 only, so the selector moves on."""
    if dtype in FLOAT or dtype in E4M3:
        return None
    return f"flash_attn.py get_fp8_dtype_for_flashattn raises 'Unrecognized FP8 dtype: {dtype}'"


def _fa_sinks(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """flash_attn_supports_sinks: FA3 (0.19), FA3 or FA4 (0.20 on); supports_combination: compute capability
    9.0 or later."""
    if not f.sinks:
        return None
    v = flash_attn_version(release, cc, f.head_size, sinks=True, dcp=f.dcp)
    ok = v == 3 or (_from(release, "0.20") and v == 4)
    return None if ok and cc >= (9, 0) else "attention sinks need FA3 (or FA4 from 0.20) on 9.0 or later"


def _fa_head(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """supports_head_size: a multiple of 8, at most 256; from 0.20 up to 512 where FA4 exists (9.x, 10.x, 11.x)."""
    limit = 512 if _from(release, "0.20") and cc[0] in (9, 10, 11) else 256
    return None if f.head_size % 8 == 0 and f.head_size <= limit else f"head size {f.head_size} not supported"


def _flashinfer_sinks(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashInferBackend.supports_sink: TRTLLM attention, on 10.x (0.19 on), also 9.0 and 12.x (0.33)."""
    if not f.sinks:
        return None
    ok = cc[0] == 10 or (_from(release, "0.33") and (cc == (9, 0) or cc[0] == 12))
    return None if ok else "attention sinks need its TRTLLM kernels (10.x)"


def _flashinfer_nvfp4(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """supports_kv_cache_dtype: NVFP4 on 10.x through TRTLLM; from 0.33 nvfp4 (not nvfp4_4over6) also through its
    FA2 path on 8.x, 9.x and 12.x (_nvfp4_kv_on_fa2), refused there at head 64 or with sinks (supports_combination)."""
    if not dtype.startswith("nvfp4"):
        return None
    if cc[0] == 10:
        return None
    if _from(release, "0.33") and cc[0] in (8, 9, 12) and dtype == "nvfp4":
        return "NVFP4 at head 64 or with sinks is misread by its FA2 prefill" if f.head_size == 64 or f.sinks else None
    return f"{dtype} needs its TRTLLM kernels (10.x)"


def _mla_fa3(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """flash_attn_supports_mla: FA3 on 9.x."""
    return None if cc[0] == 9 else "FlashAttention MLA needs FA3 (9.x)"


def _flashinfer_mla_nope(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashInferMLABackend.supports_combination: qk_nope_head_dim in 64, 128, 192."""
    ok = f.qk_nope_head_dim in (64, 128, 192)
    return None if ok else f"qk_nope_head_dim {f.qk_nope_head_dim} (its kernel takes 64, 128, 192)"


def _tokenspeed(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """TokenspeedMLABackend.supports_combination: the tokenspeed_mla package, which a vLLM install does not
    bring (`uv pip install tokenspeed-mla`); kvplan plans the install without it."""
    return "needs the tokenspeed_mla package (not part of a vLLM install)"


def _sparse_indexed(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashInfer's and FlashAttention's sparse MLA: a model with index_topk, qk_nope_head_dim 128 or 192
    (FlashInferMLASparseBackend.supports_combination; FlashAttnMLASparseBackend: no DCP)."""
    if f.index_topk is None:
        return "needs a model with index_topk"
    if f.qk_nope_head_dim not in (128, 192):
        return f"qk_nope_head_dim {f.qk_nope_head_dim} (its kernel takes 128, 192)"
    return None


def _sparse_fa4(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashAttnMLASparseFA4Backend.supports_combination: index_topk a multiple of 128, (kv_lora_rank,
    qk_rope_head_dim) = (512, 64), gathered query heads (heads x dcp) in 8, 16, 32, 64 (and 128 without DCP)."""
    heads = (8, 16, 32, 64) if f.dcp > 1 else (8, 16, 32, 64, 128)
    if not f.index_topk or f.index_topk % 128 or (f.kv_lora_rank, f.qk_rope_head_dim) != (512, 64):
        return "needs index_topk % 128 == 0 and (kv_lora_rank, qk_rope_head_dim) = (512, 64)"
    return None if f.num_heads * f.dcp in heads else f"needs {heads} gathered query heads"


def _nvfp4_ds_mla(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashMLASparseBackend.supports_combination: nvfp4_ds_mla on 10.x only."""
    return "nvfp4_ds_mla needs 10.x" if dtype == "nvfp4_ds_mla" and cc[0] != 10 else None


def _no_fp8_ds_mla(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashInferMLASparseTRTLLMBackend.supports_combination (0.25 on): no fp8_ds_mla on 10.x."""
    return "no fp8_ds_mla cache" if dtype == "fp8_ds_mla" else None


_CHECKS = {"fa_fp8": _fa_fp8, "fa_cache_view": _fa_cache_view, "fa_sinks": _fa_sinks, "fa_head": _fa_head,
           "flashinfer_sinks": _flashinfer_sinks, "flashinfer_nvfp4": _flashinfer_nvfp4, "mla_fa3": _mla_fa3,
           "flashinfer_mla_nope": _flashinfer_mla_nope,
           "tokenspeed": _tokenspeed, "sparse_indexed": _sparse_indexed, "sparse_fa4": _sparse_fa4,
           "nvfp4_ds_mla": _nvfp4_ds_mla, "no_fp8_ds_mla": _no_fp8_ds_mla}


# ---------------------------------------------------------------------------------------------------------------
# The backends, each as 0.19 reads it and again where a later release changed it

_FA = Backend("FLASH_ATTN", "FlashAttention", _B + "flash_attn.py FlashAttentionBackend (supports_kv_cache_dtype, "
              "supports_head_size, get_supported_kernel_block_sizes, supports_compute_capability, supports_sink, "
              "supports_combination); fa_utils.py", FLOAT | FP8, block_multiple=16, cc_min=(8, 0),
              checks=("fa_head", "fa_fp8", "fa_sinks"), fails=("fa_cache_view",))
_FLASHINFER = Backend("FLASHINFER", "FlashInfer", _B + "flashinfer.py FlashInferBackend (supported_kv_cache_dtypes, "
                      "get_supported_head_sizes, get_supported_kernel_block_sizes, supports_compute_capability, "
                      "supports_sink)", FLOAT | FP8, blocks=(16, 32, 64), head_sizes=(64, 128, 256), cc_min=(7, 5),
                      cc_max=(12, 1), checks=("flashinfer_sinks",))
_TRITON = Backend("TRITON_ATTN", "Triton", _B + "triton_attn.py TritonAttentionBackend (supported_kv_cache_dtypes, "
                  "supports_head_size, get_supported_kernel_block_sizes, supports_sink)", FLOAT | FP8,
                  block_multiple=16, head_min=32, sinks=True)
_FLEX = Backend("FLEX_ATTENTION", "FlexAttention (torch)", _B + "flex_attention.py FlexAttentionBackend "
                "(supported_kv_cache_dtypes, get_supported_head_sizes)", FLOAT)
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
# ROCm (platforms/rocm.py; AITER's backends are used only with VLLM_ROCM_USE_AITER=1)
_ROCM_ATTN = Backend("ROCM_ATTN", "ROCm paged attention", _B + "rocm_attn.py RocmAttentionBackend "
                     "(supported_kv_cache_dtypes, get_supported_head_sizes, get_supported_kernel_block_sizes)",
                     FLOAT | FP8, block_multiple=16, head_sizes=(32, 64, 80, 96, 128, 160, 192, 224, 256),
                     platform="rocm")

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
    # 0.30: FlashInfer takes nvfp4_4over6 (10.x; vLLM added it in 0.28, planned here with 0.25's entries); the
    # sparse FlashMLA takes nvfp4_ds_mla (10.x)
    replace(_FLASHINFER, since="0.30", kv_dtypes=FLOAT | FP8 | {"nvfp4", "nvfp4_4over6"},
            head_sizes=(64, 128, 256, 512), cc_min=(8, 0), checks=("flashinfer_sinks", "flashinfer_nvfp4")),
    replace(_FLASHMLA_SPARSE, since="0.30", kv_dtypes=_FLASHMLA_SPARSE.kv_dtypes | {"nvfp4_ds_mla"},
            checks=("nvfp4_ds_mla",)),
    # 0.33: MLACommonBackend takes head 512 too; FlashInfer's sparse MLA any multiple of 32; the sparse FlashMLA
    # multiples of 64 and head 512
    replace(_FLASHMLA_SPARSE, since="0.33", kv_dtypes=_FLASHMLA_SPARSE.kv_dtypes | {"nvfp4_ds_mla"},
            checks=("nvfp4_ds_mla",), blocks=(), block_multiple=64, head_sizes=(512, 576)),
    replace(_FLASHINFER_MLA_SPARSE, since="0.33", blocks=(), block_multiple=32, head_sizes=(576,),
            checks=("sparse_indexed", "no_fp8_ds_mla")),
    replace(_FI_MLA_SPARSE_SM120, since="0.33", blocks=(), block_multiple=64),
    *[replace(b, since="0.33", head_sizes=(320, 512, 576)) for b in (_FA_MLA, _FLASHMLA, _FLASHINFER_MLA,
                                                                      _CUTLASS_MLA, _TOKENSPEED)],
]
BACKENDS: tuple[Backend, ...] = (_FA, _FLASHINFER, _TRITON, _FLEX, _TURBOQUANT, _FA_MLA, _FLASHMLA, _FLASHINFER_MLA,
                                 _CUTLASS_MLA, _TRITON_MLA, _TOKENSPEED, _FLASHMLA_SPARSE, _FLASHINFER_MLA_SPARSE,
                                 _FA_MLA_SPARSE, _FI_MLA_SPARSE_SM90, _FA4_MLA_SPARSE, _FI_MLA_SPARSE_SM120,
                                 _DSV4, _ROCM_ATTN, *_CHANGES)


@lru_cache(maxsize=None)
def backend(name: str, release: str) -> Backend | None:
    """The entry of backend `name` in `release` (the newest entry not after it; None before it exists)."""
    rel = _key(read_release(release))
    entries = [b for b in BACKENDS if b.name == name and _key(b.since) <= rel]
    return max(entries, key=lambda b: _key(b.since)) if entries else None


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
PRIORITIES: dict[str, dict] = {"0.19": _P019, "0.20": _P020, "0.25": _P025, "0.30": _P030, "0.33": _P033}
PRIORITY_SOURCES = {r: f"vLLM {r}.0 {_CUDA}" for r in PRIORITIES}
ROCM_PRIORITIES = {"0.19": {("mha", None): ("ROCM_ATTN", "TRITON_ATTN"), ("mla", None): ("TRITON_MLA",)},
                   "0.20": {**_ROCM_P, ("mha", None): ("ROCM_ATTN", "TRITON_ATTN", "TURBOQUANT")}}
ROCM_SOURCE = (f"vLLM 0.19.0 to 0.33.0 {_ROCM}: ROCM_ATTN, TRITON_ATTN (and TURBOQUANT from 0.20); MLA: TRITON_MLA; "
               "sparse MLA: ROCM_AITER_MLA_SPARSE, which kvplan does not plan")


def priorities(release: str, cc: tuple[int, int] | None, f: AttentionFacts, dtype: str,
               platform: str = "cuda") -> tuple[str, ...]:
    """The backends the selector tries, in order, for this model and cache on this GPU."""
    layout = "dsv4" if f.compressed else "sparse" if f.sparse else "mla" if f.mla else "mha"
    rel = read_release(release)
    if platform == "rocm":
        table = ROCM_PRIORITIES["0.20" if _from(rel, "0.20") else "0.19"]
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
             block: int | None = None) -> list[str]:
    """Why backend `b` refuses this configuration (AttentionBackend.validate_configuration), in its words; empty
    where it serves it. `cc` None (a GPU of unknown capability) passes the capability checks."""
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
    if cc is not None and not ((not b.cc_majors or cc[0] in b.cc_majors) and b.cc_min <= cc <= b.cc_max):
        why.append(f"compute capability {cc[0]}.{cc[1]} not supported")
    if cc is not None and not why:
        why += [r for c in b.checks if (r := _CHECKS[c](release, f, cc, dtype))]
    return why


def _family(b: Backend, release: str, cc: tuple[int, int] | None, f: AttentionFacts, dtype: str) -> str:
    if b.name != "FLASH_ATTN" or cc is None:
        return b.family
    v = flash_attn_version(release, cc, f.head_size, quantized=dtype not in FLOAT, sinks=f.sinks, dcp=f.dcp)
    return f"FA{v}"


def _block(b: Backend, release: str, cc, f: AttentionFacts, dtype: str) -> int:
    """Platform.update_block_size_for_backend: 16 for hybrid models (their block is managed by the model
    config), else the backend's preferred block; FlashAttention from 0.30 sets 128 where FA4's hd256 kernel runs
    (get_preferred_block_size: _get_fa4_hd256_block_size) and, from 0.33, 64 for an fp8 cache at head 512 on
    9.x (_get_sm90_fa4_fp8_kv_block_size)."""
    if f.hybrid:
        return 16
    if b.name == "FLASH_ATTN" and cc is not None and _from(release, "0.30"):
        v = flash_attn_version(release, cc, f.head_size, quantized=dtype not in FLOAT, sinks=f.sinks, dcp=f.dcp)
        if v == 4 and f.head_size == 256 and cc[0] in (10, 11):
            return 128
        if v == 4 and f.head_size == 512 and cc[0] == 9 and dtype in E4M3 and _from(release, "0.33"):
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
    rel = read_release(release)
    if requested is not None:
        name = requested.strip().upper()
        b = backend(name, rel)
        if b is None or (b.platform != platform and name not in ("TRITON_ATTN", "TRITON_MLA", "TURBOQUANT")):
            names = ", ".join(n for n in backend_names(rel) if (backend(n, rel).platform == platform
                                                                or n in ("TRITON_ATTN", "TRITON_MLA", "TURBOQUANT")))
            raise KvplanError(f"--attention-backend {requested}: kvplan plans vLLM {rel}'s {names} on {platform} "
                              f"(or auto, the selector's choice)")
        why = refusals(b, rel, cc, facts, cache_dtype, block_size)
        if why:
            alt = _first_valid(rel, cc, facts, cache_dtype, block_size, platform, running=True)
            hint = f"; {alt.name} serves it (drop --attention-backend or choose it)" if alt else ""
            raise KvplanError(f"--attention-backend {name}: vLLM {rel} refuses it for {cache_dtype} on {gpu_name} "
                              f"({', '.join(why)}; {b.source.split(' (')[0]}){hint}")
        broken = failures(b, rel, cc, facts, cache_dtype)
        if broken:
            alt = _first_valid(rel, cc, facts, cache_dtype, block_size, platform, running=True)
            hint = f"; {alt.name} serves it (choose it)" if alt else ""
            raise KvplanError(f"--attention-backend {name}: vLLM {rel} takes it for {cache_dtype} on {gpu_name}, then "
                              f"fails at start ({', '.join(broken)}){hint}")
        return Choice(b.name, _family(b, rel, cc, facts, cache_dtype),
                      block_size or _block(b, rel, cc, facts, cache_dtype), rel, True, b.source)
    chosen = _first_valid(rel, cc, facts, cache_dtype, block_size, platform)
    broken = failures(backend(chosen.name, rel), rel, cc, facts, cache_dtype) if chosen is not None else []
    if broken:
        alt = _first_valid(rel, cc, facts, cache_dtype, block_size, platform, running=True)
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
    `cc` None (a GPU of unknown capability) passes, as in refusals."""
    if cc is None:
        return []
    return [r for c in b.fails if (r := _CHECKS[c](release, f, cc, dtype))]


def _first_valid(rel: str, cc, facts: AttentionFacts, dtype: str, block: int | None,
                 platform: str, running: bool = False) -> Choice | None:
    """The selector's choice: the first of the priority list that validates; `running`: the first that also runs
    (the one --attention-backend could name instead of a choice that fails at start)."""
    for name in priorities(rel, cc, facts, dtype, platform):
        b = backend(name, rel)
        if b is not None and not refusals(b, rel, cc, facts, dtype, block) and \
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
                          dcp=dcp)


def what_if(facts: AttentionFacts, cache_dtype: str, release: str) -> Choice:
    """The plan where no backend serves the format here (vLLM would refuse to start): the block of the first backend
    of this attention kind (MLA or not) that lists the format anywhere, else CacheConfig.DEFAULT_BLOCK_SIZE."""
    for name in backend_names(release):
        b = backend(name, release)
        if b.mla == facts.mla and cache_dtype in b.kv_dtypes:
            return Choice("none", f"what-if, {b.name}'s blocks", b.preferred_block(16), read_release(release))
    return Choice("none", "what-if, the default block", 16, read_release(release))
