"""The facts vLLM's attention-backend selector weighs, as kvplan holds them: the Backend entry (one backend as one
release reads it), the model's AttentionFacts, the Choice the selector makes, the releases read, FlashAttention's
version, and the rules of a backend that take more than a list (its supports_combination, supports_kv_cache_dtype,
supports_sink), each a function of the release keyed by the release that changed it. The entries themselves are
kvplan.rules.vllm_backend_table's; the selector walking them is kvplan.rules.vllm_backends'.

Paths are relative to the vllm package.
"""

from __future__ import annotations

from functools import lru_cache

from kvplan.values import frozen_dataclass

# the releases whose source the matrix is read from (0.21 to 0.24 are planned with 0.20's reading)
READ = ("0.19", "0.20", "0.25", "0.26", "0.27", "0.28", "0.29", "0.30", "0.31", "0.32", "0.33")
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
    list (_CHECKS below). `fails` name rules of the same form for what validate_configuration
    lets through but the backend raises on once it runs (the engine then fails at start: kvplan plans no such
    backend, and says why). `sliding_window`: supports_sliding_window (validate_configuration refuses a layer with
    a sliding window on a backend without it from 0.26). `dtypes`: supported_dtypes, the model dtypes it takes (empty:
    float16 and bfloat16). `gcn_archs`: on ROCm, the GPU architectures its supports_compute_capability takes, as
    prefixes of the gfx name (empty: any). `preferred`: a get_preferred_block_size of its own (0: the default rule).
    `since`: the first read release this entry describes."""

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
    sliding_window: bool = False
    dtypes: frozenset = frozenset()
    gcn_archs: tuple[str, ...] = ()
    preferred: int = 0
    platform: str = "cuda"
    since: str = "0.19"

    def preferred_block(self, default: int = 16) -> int:
        """AttentionBackend.get_preferred_block_size: the default where the backend takes it, else its smallest
        kernel size; a backend's own rule where it has one."""
        if self.preferred:
            return self.preferred
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
    sliding: bool = False  # a layer with a sliding window (the selector's has_sliding_window, from 0.26)
    dtype: str = "bfloat16"  # the model dtype (the selector's dtype: supported_dtypes)


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
                       sinks: bool = False, dcp: int = 1, sliding: bool = False) -> int | None:
    """FA3 on 9.x, FA4 on 10.x, FA2 elsewhere from 8.0 (None below); FA4 on 10.x falls back to FA2 above head 128
    (192 excepted up to 0.26; from 0.27 only with a V head of 128, which kvplan's K-and-V models never have). From
    0.25 a 9.x head above 256 moves FA3 up to FA4. Head 256 on 10.x: FA2 up to 0.26; FA4 in 0.27 except for a layer
    with a sliding window (requires_local_attention, which FlashAttentionImpl passes); FA2 again in 0.28 ("FA4 on
    Blackwell is temporarily disabled for head_size=256"); from 0.29 FA4's hd256 kernel (uses_fa4_hd256_kernel: 10.x
    and 11.x) unless the cache is quantized, the model has sinks or DCP > 1 (_fa4_hd256_fallback_reason; FA2 then)."""
    if cc < (8, 0):
        return None
    version = 3 if cc[0] == 9 else 4 if cc[0] == 10 else 2
    if version == 3 and _from(release, "0.25") and head > 256:
        version = 4
    if version == 4 and cc[0] in (10, 11) and head == 256:
        if _from(release, "0.29"):
            return 2 if quantized or sinks or dcp > 1 else 4
        if _from(release, "0.28"):
            return 2
        if _from(release, "0.27"):
            return 2 if sliding else 4
    if version == 4 and cc[0] >= 10 and head > 128 and (head != 192 or _from(release, "0.27")):
        version = 2
    return version


def _fa_fp8(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashAttention stores an fp8 cache with FA3 on 9.x (0.19: every fp8 name; 0.25: fp8 and fp8_e4m3 only),
    from 0.27 also with FA4 on 10.x (fa_utils.py flash_attn_supports_kv_cache_dtype, which supports_combination
    asks with the head size and sinks), and from 0.31 with FA4 at head 512 on 9.x (sm90_fp8_kv_supported)."""
    if dtype in FLOAT:
        return None
    v = flash_attn_version(release, cc, f.head_size, quantized=True, sinks=f.sinks, dcp=f.dcp)
    ok = (v == 3 and cc[0] == 9) or (_from(release, "0.27") and v == 4 and cc[0] == 10) or \
        (_from(release, "0.31") and v == 4 and cc[0] == 9 and f.head_size == 512)
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
    """FlashInferBackend.supports_sink: TRTLLM attention on 10.x (0.19 on), its XQA decode kernel on 12.x (0.28 on)
    and on 9.0 (0.30 on; vllm/utils/flashinfer.py supports_trtllm_attention)."""
    if not f.sinks:
        return None
    ok = cc[0] == 10 or (_from(release, "0.28") and cc[0] == 12) or (_from(release, "0.30") and cc == (9, 0))
    return None if ok else "attention sinks need its TRTLLM kernels (10.x)"


def _flashinfer_nvfp4(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """supports_kv_cache_dtype: NVFP4 (nvfp4 from 0.25, nvfp4_4over6 from 0.28) on 10.x through TRTLLM; from 0.32
    nvfp4 (not nvfp4_4over6) also through its FA2 path on 8.x, 9.x and 12.x (_nvfp4_kv_on_fa2), refused there at head
    64 or with sinks (supports_combination)."""
    if not dtype.startswith("nvfp4"):
        return None
    if cc[0] == 10:
        return None
    if _from(release, "0.32") and cc[0] in (8, 9, 12) and dtype == "nvfp4":
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
    (FlashInferMLASparseBackend.supports_combination; FlashAttnMLASparseBackend: no DCP); from 0.30 a RoPE-free
    latent (qk_rope_head_dim 0) with qk_nope_head_dim 256 and kv_lora_rank 512 too (FlashInfer's native no-rope MLA)."""
    if f.index_topk is None:
        return "needs a model with index_topk"
    if f.mla and f.qk_rope_head_dim == 0 and _from(release, "0.30"):
        ok = (f.qk_nope_head_dim, f.kv_lora_rank) == (256, 512)
        return None if ok else "a no-rope latent needs qk_nope_head_dim 256 and kv_lora_rank 512"
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


def _flashmla_sparse_512(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashMLASparseBackend.supports_combination (0.31 on): head 512 only for a RoPE-free model on 9.x with a 16-bit
    cache (and fp8_ds_mla from 0.32)."""
    if f.head_size != 512:
        return None
    caches = FLOAT | ({"float16", "fp8_ds_mla"} if _from(release, "0.32") else {"float16"})
    ok = dtype in caches and cc[0] == 9 and f.qk_rope_head_dim == 0
    return None if ok else "head 512 needs a RoPE-free model with a 16-bit (or, from 0.32, fp8_ds_mla) cache on 9.x"


def _ultraquant_head(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """What UltraQuantAttentionBackend takes (its supports_head_size, TurboQuant's, takes any) but cannot store:
    ops/ultraquant/format.py n_groups raises unless the head is a multiple of 32 (customize_spec sizes the slot with
    it), and ops/ultraquant/triton_store.py raises "ultraquant store requires power-of-two dim"."""
    h = f.head_size
    return None if h % 32 == 0 and h & (h - 1) == 0 else f"ultraquant_4bit stores power-of-two heads of 32 or more, " \
        f"not {h}"


def _no_fp8_ds_mla(release: str, f: AttentionFacts, cc, dtype: str) -> str | None:
    """FlashInferMLASparseTRTLLMBackend.supports_combination (0.25 on): no fp8_ds_mla on 10.x."""
    return "no fp8_ds_mla cache" if dtype == "fp8_ds_mla" else None


_CHECKS = {"fa_fp8": _fa_fp8, "fa_cache_view": _fa_cache_view, "fa_sinks": _fa_sinks, "fa_head": _fa_head,
           "flashinfer_sinks": _flashinfer_sinks, "flashinfer_nvfp4": _flashinfer_nvfp4, "mla_fa3": _mla_fa3,
           "flashinfer_mla_nope": _flashinfer_mla_nope,
           "tokenspeed": _tokenspeed, "sparse_indexed": _sparse_indexed, "sparse_fa4": _sparse_fa4,
           "nvfp4_ds_mla": _nvfp4_ds_mla, "no_fp8_ds_mla": _no_fp8_ds_mla, "flashmla_sparse_512": _flashmla_sparse_512,
           "ultraquant_head": _ultraquant_head}

