"""The KV-cache format catalog: one value per format, its byte layout, and the sizes derived from that layout.

A format describes what one token of one KV head stores, side by side for K and V, as a list of components
(data, scales, zero points, norms). Every byte figure kvplan uses is computed from these components, so adding a
format means adding one entry here. MLA models cache one latent per token per layer instead of K and V per head;
formats that apply to it describe that latent too.
"""

from __future__ import annotations

import math
from dataclasses import field
from typing import Callable, Literal, Optional

from kvplan.errors import KvplanError, did_you_mean
from kvplan.values import frozen_dataclass

Per = Literal["element", "group", "vector", "token_group"]
Over = Literal["all", "nope", "rope"]


@frozen_dataclass
class Component:
    """Part of one side (K or V) of one token of one KV head.

    per="element": one value per element of the head (`bits` each);
    per="group":   one value per `group` consecutive elements along the head dimension;
    per="vector":  one value per token per head (a per-token-head scale or norm);
    per="token_group": one value per channel shared by `group` consecutive tokens (KIVI's per-channel keys),
                   so a token carries 1/group of it.
    `bits=None` means the model's own dtype (the "auto" format).
    `over` selects the part of an MLA latent it covers: the compressed no-RoPE part, the RoPE part, or both.
    """

    name: str
    bits: Optional[int]
    per: Per = "element"
    group: int = 1
    over: Over = "all"

    def size_bytes(self, width: int, model_bits: int) -> float:
        bits = model_bits if self.bits is None else self.bits
        if self.per == "element":
            return math.ceil(width * bits / 8)
        if self.per == "group":
            return math.ceil(math.ceil(width / self.group) * bits / 8)
        if self.per == "vector":
            return bits / 8
        return width * bits / 8 / self.group  # token_group: amortized over the tokens of a group


Side = tuple[Component, ...]


def whole(x: float) -> float:
    """An int when the byte count is whole (it nearly always is), so figures print as 264, not 264.0."""
    return int(x) if float(x).is_integer() else x


def _data(bits: Optional[int]) -> Component:
    return Component("data", bits)


Platform = Literal["cuda", "rocm", "hpu"]


@frozen_dataclass
class Serves:
    """One engine serving a format on one platform: from `min_cc` up on CUDA (compute capability, e.g. (9, 0)),
    only on the majors in `cc_majors` where given. `source` names the engine file the fact is read from. `until`:
    the last release that serves it, where a later one refuses it at start (`replaced_by` names what serves the
    same bytes there); such an entry serves only a release named as at most `until`.

    A vLLM entry on CUDA or ROCm names the platform only (no `min_cc`, `cc_majors` or `until`): which GPUs of it
    store the format, in which release, is the attention backends' to say (kvplan.rules.vllm_backends, each entry
    read from that release's backend file), and the deployment asks them (a format no backend stores there is a
    what-if with their reason). tests/test_served.py holds the two to agreement for every release and GPU family."""

    engine: Literal["vllm", "sglang"]
    platform: Platform
    source: str
    min_cc: tuple[int, int] = (0, 0)
    cc_majors: tuple[int, ...] = ()
    until: Optional[str] = None
    replaced_by: str = ""

    def in_release(self, version: Optional[str]) -> bool:
        """Whether the release `version` (None: the release whose rules kvplan plans with, the newest) serves it."""
        if self.until is None:
            return True
        return version is not None and release_key(version) <= release_key(self.until)

    def on(self, gpu) -> bool:
        if gpu is None:
            return True
        if _platform(gpu) != self.platform:
            return False
        if self.platform != "cuda":
            return True
        cc = _cc(gpu)
        if cc is None:
            return True
        return cc >= self.min_cc and (not self.cc_majors or cc[0] in self.cc_majors)

    def where(self) -> str:
        if self.platform == "hpu":
            return "Intel Gaudi (HPU)"
        if self.platform == "rocm":
            return "ROCm GPUs"
        if self.cc_majors:
            return "CUDA GPUs of compute capability " + " or ".join(f"{m}.x" for m in self.cc_majors)
        if self.min_cc > (0, 0):
            return f"CUDA GPUs of compute capability {self.min_cc[0]}.{self.min_cc[1]} and later"
        return "CUDA GPUs"


def release_key(version: str) -> tuple[int, ...]:
    """'0.5.15' -> (0, 5, 15); a release with fewer parts compares as its .0 (a 'v' prefix is dropped)."""
    try:
        parts = tuple(int(p) for p in version.strip().lstrip("v").split(".")[:3])
    except ValueError:
        raise KvplanError(f"--engine-version '{version}': give a release such as 0.5.15") from None
    return parts + (0,) * (3 - len(parts))


def _platform(gpu) -> str:
    return "rocm" if getattr(gpu, "vendor", "nvidia") == "amd" else "cuda"


def _cc(gpu) -> Optional[tuple[int, int]]:
    text = getattr(gpu, "compute_capability", None) or ""
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


@frozen_dataclass
class KVFormat:
    """One KV-cache format: its K and V components per token per head (and per MLA latent), and who serves it."""

    name: str
    family: str
    description: str
    k: Side
    v: Side
    serves: tuple[Serves, ...] = ()  # every engine and platform that serves it (none: a what-if)
    what_if: str = ""  # for a format no engine serves: where it comes from ("paper", "custom")
    applies_to: Literal["mha", "mla", "both"] = "both"
    mla: Optional[Side] = None  # explicit layout of the MLA latent; None: derived from the K side (see mla_bytes)
    align: int = 1  # K+V slot rounded up to a multiple of this many bytes
    residual_tokens: int = 0  # newest tokens of each sequence kept in the model dtype (KIVI's residual window)
    default_skip: Literal["none", "boundary"] = "none"
    aliases: tuple[str, ...] = ()
    params: dict = field(default_factory=dict, compare=False)
    # the first vLLM release whose --kv-cache-dtype takes it (vllm/config/cache.py CacheDType, the Literal the
    # option is checked against); None: every release kvplan plans (0.19 on) or none (a format vLLM never names)
    vllm_since: Optional[str] = None

    def side_bytes(self, side: Side, width: int, model_bits: int = 16) -> float:
        return sum(c.size_bytes(width, model_bits) for c in side)

    def bytes_per_token_per_kv_head(self, head_dim: int, head_dim_v: Optional[int] = None, model_bits: int = 16) -> float:
        """K and V of one token of one KV head, every scale, zero point, norm and padding byte included."""
        if self.applies_to == "mla":
            raise KvplanError(f"KV cache dtype '{self.name}' applies only to MLA models (DeepSeek-V2/V3, Kimi-K2)")
        dv = head_dim if head_dim_v is None else head_dim_v
        total = self.side_bytes(self.k, head_dim, model_bits) + self.side_bytes(self.v, dv, model_bits)
        if self.align > 1:
            total = math.ceil(total / self.align) * self.align
        return whole(total)

    def k_bytes(self, head_dim: int, model_bits: int = 16) -> float:
        return self.side_bytes(self.k, head_dim, model_bits)

    def v_bytes(self, head_dim: int, model_bits: int = 16) -> float:
        return self.side_bytes(self.v, head_dim, model_bits)

    def mla_bytes_per_token(self, kv_lora_rank: int, rope_dim: int, model_bits: int = 16) -> float:
        """One MLA latent (kv_lora_rank + rope dims) of one token of one layer.

        Formats without an explicit MLA layout store the whole latent the way they store a K head, and keep their
        per-token values for both sides: vLLM's per-token-head modes add a scale pair (8 bytes) to the single
        latent (mla_attention.py, the "+2*4" of the MLA spec)."""
        if self.applies_to == "mha":
            raise KvplanError(f"KV cache dtype '{self.name}' does not apply to MLA models; {_mla_hint()}")
        if self.mla is not None:
            widths = {"all": kv_lora_rank + rope_dim, "nope": kv_lora_rank, "rope": rope_dim}
            return whole(sum(c.size_bytes(widths[c.over], model_bits) for c in self.mla))
        latent = kv_lora_rank + rope_dim
        data = sum(c.size_bytes(latent, model_bits) for c in self.k if c.per != "vector")
        scales = sum(c.size_bytes(latent, model_bits) for c in self.k + self.v if c.per == "vector")
        return whole(data + scales)

    def bits_per_element(self, head_dim: int = 128, model_bits: int = 16) -> float:
        """Honest bits per stored K or V element, metadata included (the residual window excluded)."""
        return self.bytes_per_token_per_kv_head(head_dim, model_bits=model_bits) * 8 / (2 * head_dim)

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines that serve it anywhere, or where it comes from when none does."""
        served = tuple(dict.fromkeys(x.engine for x in self.serves))
        return served or (self.what_if,)

    def served_on(self, engine: str, gpu=None, version: Optional[str] = None) -> bool:
        """Whether `engine` serves it on `gpu` (on some GPU, where gpu is None) in release `version` (None: the
        newest, whose rules kvplan plans with)."""
        return any(x.engine == engine and x.on(gpu) and x.in_release(version) for x in self.serves)

    def refused_from(self, engine: str, version: Optional[str] = None) -> Optional[Serves]:
        """The entry of a format `engine` served up to a release and refuses at start from the next one, where
        `version` is past it; None otherwise."""
        ended = [x for x in self.serves if x.engine == engine and x.until is not None]
        if ended and not any(x.in_release(version) for x in ended) and \
                not any(x.engine == engine and x.until is None for x in self.serves):
            return ended[0]
        return None

    def unserved(self, engine: str, gpu=None, version: Optional[str] = None) -> Optional[str]:
        """Why `engine` cannot run it on `gpu` (in release `version`), in one sentence; None where it can."""
        if self.served_on(engine, gpu, version):
            return None
        if not self.serves:
            return f"what-if: no engine serves {self.name} (a {self.what_if} format)"
        name = ENGINE_NAMES.get(engine, engine)
        here = f" on {gpu.name}" if gpu is not None else ""
        ended = self.refused_from(engine, version)
        if ended is not None:
            return (f"what-if: {name} serves {self.name} only up to {ended.until}; later releases refuse it at start"
                    f" (use {ended.replaced_by}, the same bytes)")
        mine = [x.where() for x in self.serves if x.engine == engine]
        others = [ENGINE_NAMES[x.engine] for x in self.serves if x.engine != engine and x.on(gpu)]
        ended_others = [f"{ENGINE_NAMES[x.engine]} up to {x.until}" for x in self.serves
                        if x.engine != engine and x.on(gpu) and x.until is not None]
        why = f"{name} serves {self.name} only on {' and '.join(dict.fromkeys(mine))}" if mine else \
            f"{name} does not serve {self.name}"
        alt = f"; {' and '.join(dict.fromkeys(ended_others or others))} does{here}" if others else ""
        return f"what-if: {why}{alt}" if mine or others else f"what-if: {why}{here}"

    @property
    def is_model_dtype(self) -> bool:
        return all(c.bits is None for c in self.k + self.v)


def _mla_hint() -> str:
    return "MLA models take auto, bfloat16, float16, the fp8 family, fp8_ds_mla, nvfp4_ds_mla or a *_per_token_head dtype"


# ----------------------------------------------------------------------------------------------------------------
# The catalog. Byte layouts follow vLLM's attention backends (customize_spec / page sizes) and SGLang's pools.


def _same(*components: Component) -> dict:
    return {"k": tuple(components), "v": tuple(components)}


def _turboquant(name: str, key_bits: int, value_bits: int, norm_correction: bool, description: str) -> KVFormat:
    # vLLM turboquant/config.py: keys are fp8 (key_bits 8, no norm) or Lloyd-Max codes plus an fp16 vector norm;
    # values are uniform asymmetric codes with an fp16 scale and an fp16 zero per token per head; the K+V slot is
    # rounded up to an even number of bytes.
    if key_bits == 8:
        k: Side = (Component("data_fp8", 8),)
    else:
        k = (Component("lloyd_max_codes", key_bits), Component("norm_fp16", 16, "vector"))
    v: Side = (Component("codes", value_bits), Component("scale_fp16", 16, "vector"), Component("zero_fp16", 16, "vector"))
    return KVFormat(
        name, "turboquant", description, k, v, applies_to="mha", align=2, default_skip="boundary",
        vllm_since="0.20",
        # its own backend, Triton kernels: last in platforms/cuda.py's priority list and, from 0.20 too, in
        # platforms/rocm.py's (_get_backend_priorities; TurboQuantAttentionBackend has no capability check)
        serves=(Serves("vllm", "cuda", _V + "turboquant_attn.py TurboQuantAttentionBackend (its own backend, Triton "
                       "kernels)"),
                Serves("vllm", "rocm", _V + "turboquant_attn.py TurboQuantAttentionBackend; platforms/rocm.py "
                       "_get_backend_priorities")),
        params={"key_bits": key_bits, "value_bits": value_bits, "norm_correction": norm_correction},
    )


def _kivi(bits: int, group: int = 32, residual: int = 128) -> KVFormat:
    # KIVI (arXiv:2402.02750): keys quantized per channel over groups of `group` tokens, values per token over
    # groups of `group` channels, fp16 scale and zero per group; the newest `residual` tokens stay in full precision.
    return KVFormat(
        f"kivi{bits}", "kivi",
        f"KIVI {bits}-bit: keys per channel (groups of {group} tokens), values per token (groups of {group} "
        f"channels), fp16 scale+zero, {residual}-token full-precision residual",
        k=(Component("codes", bits), Component("scale_fp16", 16, "token_group", group),
           Component("zero_fp16", 16, "token_group", group)),
        v=(Component("codes", bits), Component("scale_fp16", 16, "group", group),
           Component("zero_fp16", 16, "group", group)),
        what_if="paper", applies_to="mha", residual_tokens=residual,
        params={"bits": bits, "group": group, "residual": residual},
    )



# Who serves what, read from the engines' sources. vLLM: the platforms whose attention backends store the dtype in
# some release (each backend's supported_kv_cache_dtypes / supports_kv_cache_dtype; platforms/cuda.py and rocm.py
# _get_backend_priorities); the GPUs and releases are kvplan.rules.vllm_backends'. SGLang 0.5's
# mem_cache/kv_cache_dtype.py configure_kv_cache_dtype accepts each of its dtypes without an architecture check.
_V = "vllm/v1/attention/backends/"
_SG = "sglang/srt/mem_cache/kv_cache_dtype.py configure_kv_cache_dtype"
_FLOAT = (Serves("vllm", "cuda", _V + "flash_attn.py, triton_attn.py supported_kv_cache_dtypes"),
          Serves("vllm", "rocm", _V + "rocm_attn.py supported_kv_cache_dtypes"))
# fp8: Triton (every capability) and FlashInfer (7.5 to 12.1) take fp8, fp8_e4m3 and fp8_e5m2 (FlashAttention
# only e4m3, as FA3 on 9.x); ROCm's backend takes all three
_FP8 = (Serves("vllm", "cuda", _V + "triton_attn.py, flashinfer.py supported_kv_cache_dtypes"),
        Serves("vllm", "rocm", _V + "rocm_attn.py supported_kv_cache_dtypes"))
_SGLANG = (Serves("sglang", "cuda", _SG), Serves("sglang", "rocm", _SG))
# the per-token-head modes run on the Triton backend (supports_compute_capability: every GPU)
_TRITON = (Serves("vllm", "cuda", _V + "triton_attn.py (the per-token-head modes)"),
           Serves("vllm", "rocm", _V + "triton_attn.py (the per-token-head modes)"))
# SGLang's FP4 caches are written and read with the GPU's FP4 support: Blackwell (compute capability 10.0 and later)
_FP4 = (10, 0)
# vLLM's NVFP4 cache is FlashInfer's: v1/attention/backends/flashinfer.py FlashInferBackend.supports_kv_cache_dtype
# takes nvfp4 on 10.x (TRTLLM) from 0.25 and nvfp4_4over6 there from 0.28, and from 0.33 nvfp4 (not nvfp4_4over6)
# on 8.x, 9.x and 12.x too (_nvfp4_kv_on_fa2). 0.20 lists nvfp4 in CacheDType but stores it nowhere: FlashInfer does
# not list it (and FlashInferMetadataBuilder raises "nvfp4 KV cache is not yet supported"), and FlashAttention,
# which its selector takes for it on FA3, reads a quantized cache through get_fp8_dtype_for_flashattn, which raises
# for it. Which GPU, which release: kvplan.rules.vllm_backends.
_NVFP4 = (Serves("vllm", "cuda", _V + "flashinfer.py FlashInferBackend.supports_kv_cache_dtype (the NVFP4 cache)"),)

_SCALE_PAIR = (Component("scale_fp32", 32, "vector"),)

CATALOG: dict[str, KVFormat] = {}


def _register(*formats: KVFormat) -> None:
    for f in formats:
        CATALOG[f.name] = f


_register(
    KVFormat("auto", "float", "the model's dtype (bf16 for most checkpoints)", **_same(_data(None)),
             serves=_FLOAT + _SGLANG),
    KVFormat("float16", "float", "fp16", **_same(_data(16)), serves=_FLOAT, aliases=("fp16",)),
    KVFormat("bfloat16", "float", "bf16", **_same(_data(16)), serves=_FLOAT + _SGLANG, aliases=("bf16",)),
    KVFormat("fp8", "fp8", "fp8 e4m3, per-tensor k/v scales held as layer parameters (not in the pool)",
             **_same(_data(8)), serves=_FP8 + _SGLANG),  # SGLang's fp8_e4m3 (sglang_rules.SGLANG_DTYPES)
    KVFormat("fp8_e4m3", "fp8", "fp8 e4m3, per-tensor scales", **_same(_data(8)), serves=_FP8 + _SGLANG),
    KVFormat("fp8_e5m2", "fp8", "fp8 e5m2 (wider range, less precision), per-tensor scales", **_same(_data(8)),
             serves=_FP8 + _SGLANG),
    # no CUDA or ROCm backend lists fp8_inc; vllm/config/cache.py: "Intel Gaudi (HPU) supports fp8 (using fp8_inc)"
    KVFormat("fp8_inc", "fp8", "fp8 e4m3 for Intel Gaudi (INC)", **_same(_data(8)),
             serves=(Serves("vllm", "hpu", "vllm/config/cache.py CacheConfig.cache_dtype (the Gaudi plugin)"),)),
    KVFormat("fp8_per_token_head", "per_token_head",
             "fp8 e4m3 with one fp32 scale per token per head, inline after the head (Triton backend)",
             **_same(_data(8), *_SCALE_PAIR), serves=_TRITON, vllm_since="0.20"),
    KVFormat("int8_per_token_head", "per_token_head",
             "int8 with one fp32 scale per token per head, inline after the head (Triton backend)",
             **_same(_data(8), *_SCALE_PAIR), serves=_TRITON, vllm_since="0.20"),
    KVFormat("int4_per_token_head", "per_token_head",
             "int4, two per byte, randomized-Hadamard rotated, one fp32 scale per token per head with the 4-bit "
             "zero point in its low mantissa bits",
             **_same(_data(4), *_SCALE_PAIR), serves=_TRITON, vllm_since="0.25"),
    KVFormat("nvfp4", "nvfp4", "e2m1 pairs, one fp8 e4m3 scale per 16 values, fp32 global scale per layer "
             "(FlashInfer backend)", **_same(_data(4), Component("scale_e4m3", 8, "group", 16)), applies_to="mha",
             serves=_NVFP4 + (Serves("sglang", "cuda", _SG, _FP4),), vllm_since="0.20"),
    KVFormat("nvfp4_4over6", "nvfp4", "the NVFP4 layout; each block of 16 picks max/6 or max/4 scaling at write "
             "time, whichever reconstructs better", **_same(_data(4), Component("scale_e4m3", 8, "group", 16)),
             applies_to="mha", serves=_NVFP4, vllm_since="0.28"),
    KVFormat("fp8_ds_mla", "mla", "DeepSeek MLA latent: 512 fp8 no-RoPE values, 4 fp32 scales (one per 128), "
             "64 bf16 RoPE values", k=(), v=(), applies_to="mla",
             mla=(Component("nope_fp8", 8, over="nope"), Component("scale_fp32", 32, "group", 128, over="nope"),
                  Component("rope_bf16", 16, over="rope")),
             # FlashMLASparseBackend (9.x, 10.x), FlashInferMLASparseSM120Backend (12.x, 0.25 on),
             # DeepseekV4SparseMLABackend (9.x, 10.x, 0.33): which GPU, which release, kvplan.rules.vllm_backends
             serves=(Serves("vllm", "cuda", _V + "mla/flashmla_sparse.py, mla/flashinfer_mla_sparse.py "
                            "supported_kv_cache_dtypes"),)),
    KVFormat("nvfp4_ds_mla", "mla", "DeepSeek MLA latent: 512 e2m1 no-RoPE values with an fp8 scale per 16, "
             "64 fp8 RoPE values", k=(), v=(), applies_to="mla",
             mla=(Component("nope_e2m1", 4, over="nope"), Component("scale_e4m3", 8, "group", 16, over="nope"),
                  Component("rope_fp8", 8, over="rope")),
             # FlashMLASparseBackend.supports_combination: 10.x only, from 0.30 (kvplan.rules.vllm_backends)
             serves=(Serves("vllm", "cuda", _V + "mla/flashmla_sparse.py FlashMLASparseBackend (the NVFP4 "
                            "latent)"),), vllm_since="0.30"),
    _turboquant("turboquant_k8v4", 8, 4, False, "TurboQuant: fp8 keys, 4-bit uniform values (fp16 scale+zero)"),
    _turboquant("turboquant_4bit_nc", 4, 4, True,
                "TurboQuant: Hadamard-rotated 4-bit Lloyd-Max keys with fp16 norm (norm-corrected), 4-bit values"),
    _turboquant("turboquant_k3v4_nc", 3, 4, True,
                "TurboQuant: rotated 3-bit Lloyd-Max keys with fp16 norm (norm-corrected), 4-bit values"),
    _turboquant("turboquant_3bit_nc", 3, 3, True,
                "TurboQuant: rotated 3-bit Lloyd-Max keys with fp16 norm (norm-corrected), 3-bit values"),
    # vLLM's packed ROCm caches, one slot per token per KV head whose bytes the backend's customize_spec sets as the
    # page's state_content_bytes (v1/kv_cache_interface.py AttentionSpec.state_content_size_bytes).
    # UltraQuant (0.32 on): v1/attention/ops/ultraquant/format.py slot_size: K codes (e2m1, two a byte), K scales
    # (UE8M0, one byte per 32 values), V codes, V scales: head/2 + head/32 per side, 136 bytes at head 128, 272 at
    # 256. Keys are Hadamard-rotated at store, values not. Its backend ends platforms/rocm.py's list; engine/
    # arg_utils.py keeps TurboQuant's boundary layers (the first and last two) in the model dtype for it too.
    KVFormat("ultraquant_4bit", "ultraquant", "UltraQuant: e2m1 codes with one UE8M0 scale byte per 32 values, keys "
             "Hadamard-rotated (vLLM's ROCm backend)", **_same(_data(4), Component("scale_e8m0", 8, "group", 32)),
             applies_to="mha", default_skip="boundary",
             serves=(Serves("vllm", "rocm", _V + "ultraquant_attn.py UltraQuantAttentionBackend (customize_spec: "
                            "ops/ultraquant/format.py slot_size); platforms/rocm.py _get_backend_priorities"),),
             vllm_since="0.32"),
    # Octave (0.33 on), compact K: v1/attention/ops/rocm_octave.py OctaveFormat.slot_bytes with compact=True: K and
    # V each sign-flipped and Hadamard-rotated over the whole head as 3-bit Lloyd-Max codes, then one fp16 scale
    # for K and one for V, the slot padded to 4 bytes (head 256: 96 + 96 + 4 = 196). The backend takes head 256
    # only, on CDNA3 and RDNA3 (kvplan.rules.vllm_backends); OctaveFormat also refuses, at start, a model whose
    # rotary dims are not a multiple of 64, which kvplan does not check. octave_k3v4 and octave_k3v3 are refused:
    # see UNPLANNED below.
    KVFormat("octave_k3v3_compact", "octave", "Octave compact: K and V rotated over the whole head, 3-bit Lloyd-Max "
             "codes, one fp16 scale each, slot padded to 4 bytes (vLLM's ROCm backend)",
             **_same(Component("codes", 3), Component("scale_fp16", 16, "vector")), applies_to="mha", align=4,
             serves=(Serves("vllm", "rocm", _V + "rocm_octave_attn.py RocmOctaveAttentionBackend (customize_spec: "
                            "ops/rocm_octave.py OctaveFormat.slot_bytes); platforms/rocm.py _get_backend_priorities"),),
             vllm_since="0.33"),
    KVFormat("mxfp8", "mx", "SGLang: fp8 e4m3 with one e8m0 scale byte per 32 values",
             **_same(_data(8), Component("scale_e8m0", 8, "group", 32)),
             # SM100 and later: sglang 0.5.23 arg_groups/kv_cache_hook.py handle_mxfp8_kv_cache_compatibility
             serves=(Serves("sglang", "cuda", _SG + "; arg_groups/kv_cache_hook.py handle_mxfp8_kv_cache_compatibility",
                            _FP4),),
             applies_to="mha"),
    KVFormat("fp4_mx_block16", "mx", "SGLang: e2m1 pairs with one scale byte per 16 values",
             **_same(_data(4), Component("scale_e8m0", 8, "group", 16)),
             serves=(Serves("sglang", "cuda", _SG, _FP4),), applies_to="mha"),
    # SGLang's first FP4 cache (--kv-cache-dtype fp4_e2m1, "only mxfp4" in its help): up to 0.5.15 model_runner.py
    # configure_kv_cache_dtype stores torch.float4_e2m1fn_x2 in mem_cache/memory_pool.py MHATokenToKVPoolFP4
    # (_create_buffers: K and V each [tokens, heads, head_dim // 2] uint8 and a scale buffer [tokens, heads x
    # head_dim // 16] uint8) or MLATokenToKVPoolFP4 (the latent: kv_cache_dim // 2 + kv_cache_dim // 16); from 0.5.16
    # mem_cache/kv_cache_dtype.py configure_kv_cache_dtype refuses it ("deprecated. Use
    # --kv-cache-dtype=fp4_mx_block16"), though server_args still lists it among the choices (0.5.20)
    KVFormat("fp4_e2m1", "mx", "SGLang up to 0.5.15: e2m1 pairs with one scale byte per 16 values (the layout "
             "fp4_mx_block16 took over in 0.5.16)", **_same(_data(4), Component("scale_e8m0", 8, "group", 16)),
             serves=(Serves("sglang", "cuda", "sglang 0.5.15 srt/mem_cache/memory_pool.py MHATokenToKVPoolFP4, "
                            "MLATokenToKVPoolFP4", _FP4, until="0.5.15", replaced_by="fp4_mx_block16"),)),
    _kivi(2),
    _kivi(4),
)

# vLLM cache dtypes kvplan knows and refuses to plan, each with why. Octave's block-K presets (0.33,
# v1/attention/ops/rocm_octave.py OctaveFormat.slot_bytes) store K's rotary dims at 4 bits and the rest at 3, with an
# fp16 scale per 64-dim K block and one for V, the slot padded to 8 bytes: rope_dim x 4/8 + (head - rope_dim) x 3/8 +
# head x v_bits/8 + 2 x (head/64 + 1). rope_dim is head x partial_rotary_factor (rope_dim_from_hf_config), a field
# kvplan's model specs do not hold, so the bytes cannot be settled for a model and kvplan does not guess them.
_OCTAVE_BLOCK_K = ("its slot keeps K's rotary dimensions at 4 bits and the rest at 3 (vllm/v1/attention/ops/"
                   "rocm_octave.py OctaveFormat.slot_bytes), so its size depends on the model's rotary dimension "
                   "(partial_rotary_factor), which kvplan does not read; kvplan does not plan it "
                   "(octave_k3v3_compact's slot does not depend on it)")
UNPLANNED = {"octave_k3v4": _OCTAVE_BLOCK_K, "octave_k3v3": _OCTAVE_BLOCK_K}

_BITS = {"none": 0, "int4": 4, "fp8": 8, "e4m3": 8, "e8m0": 8, "int8": 8, "fp16": 16, "bf16": 16, "fp32": 32}


def custom_format(spec: str) -> KVFormat:
    """A parametric format from 'custom:bits=4,group=32,axis=token,scale=fp16,zero=fp16'.

    Keys: bits (or k_bits / v_bits), group (elements sharing a scale), axis (token: groups along the head
    dimension of one token; channel: one scale per channel over `group` tokens; kivi: keys by channel, values by
    token; k_axis / v_axis set one side), scale and zero (none, int4, fp8, e8m0, int8, fp16, bf16, fp32),
    residual (newest tokens kept in the model dtype)."""
    body = spec.split(":", 1)[1] if ":" in spec else ""
    opts: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        if "=" not in part:
            raise KvplanError(f"custom KV format: '{part}' is not key=value (e.g. custom:bits=4,group=32,scale=fp16)")
        k, v = part.split("=", 1)
        opts[k.strip().lower()] = v.strip().lower()
    known = {"bits", "k_bits", "v_bits", "group", "axis", "k_axis", "v_axis", "scale", "zero", "residual"}
    unknown = set(opts) - known
    if unknown:
        raise KvplanError(f"custom KV format: unknown key '{sorted(unknown)[0]}'; keys are {', '.join(sorted(known))}")

    def integer(key: str, default: Optional[int]) -> Optional[int]:
        if key not in opts:
            return default
        try:
            val = int(opts[key])
        except ValueError:
            raise KvplanError(f"custom KV format: {key}={opts[key]} is not an integer") from None
        if val < 0 or (key != "residual" and val == 0):
            raise KvplanError(f"custom KV format: {key} must be positive")
        return val

    bits = integer("bits", None)
    k_bits, v_bits = integer("k_bits", bits), integer("v_bits", bits)
    if k_bits is None or v_bits is None:
        raise KvplanError("custom KV format needs bits (or k_bits and v_bits), e.g. custom:bits=4,group=32")
    if max(k_bits, v_bits) > 32:
        raise KvplanError("custom KV format: bits must be at most 32")
    group = integer("group", 0) or 0
    axis = opts.get("axis", "token")
    axes = {"token": ("token", "token"), "channel": ("channel", "channel"), "kivi": ("channel", "token")}
    if axis not in axes:
        raise KvplanError(f"custom KV format: axis={axis}; choose token, channel or kivi")
    k_axis, v_axis = opts.get("k_axis", axes[axis][0]), opts.get("v_axis", axes[axis][1])
    for a in (k_axis, v_axis):
        if a not in ("token", "channel"):
            raise KvplanError(f"custom KV format: axis {a}; choose token or channel")
    meta_bits = []
    for key in ("scale", "zero"):
        name = opts.get(key, "fp16" if key == "scale" and group else "none")
        if name not in _BITS:
            raise KvplanError(f"custom KV format: {key}={name}; choose one of {', '.join(_BITS)}")
        meta_bits.append((key, name, _BITS[name]))

    def side(bits_: int, axis_: str) -> Side:
        comps = [Component("codes", bits_)]
        for key, name, mb in meta_bits:
            if mb == 0:
                continue
            if not group:
                comps.append(Component(f"{key}_{name}", mb, "vector"))
            elif axis_ == "token":
                comps.append(Component(f"{key}_{name}", mb, "group", group))
            else:
                comps.append(Component(f"{key}_{name}", mb, "token_group", group))
        return tuple(comps)

    residual = integer("residual", 0) or 0
    canonical = "custom:" + ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
    return KVFormat(
        canonical, "custom", f"custom: K {k_bits}-bit by {k_axis}, V {v_bits}-bit by {v_axis}, group {group or 'none'}, "
        f"scale {meta_bits[0][1]}, zero {meta_bits[1][1]}" + (f", {residual}-token residual" if residual else ""),
        side(k_bits, k_axis), side(v_bits, v_axis), what_if="custom", applies_to="mha", residual_tokens=residual,
    )


def _alias_index() -> dict[str, str]:
    idx = {}
    for f in CATALOG.values():
        idx[f.name] = f.name
        for a in f.aliases:
            idx[a] = f.name
    return idx


def kv_format(name: str) -> KVFormat:
    """A catalog format by name or alias, or a parametric 'custom:...' format."""
    key = name.strip().lower()
    if key.startswith("custom"):
        return custom_format(key)
    idx = _alias_index()
    if key in idx:
        return CATALOG[idx[key]]
    if key in UNPLANNED:
        raise KvplanError(f"KV cache dtype '{key}' (vLLM 0.33, ROCm's Octave backend): {UNPLANNED[key]}")
    raise KvplanError(
        f"unknown KV cache dtype '{name}'{did_you_mean(key, list(idx))}; `kvplan formats` lists them "
        "(or use custom:bits=4,group=32,...)"
    )


def dtype_names(values: list[str] | tuple[str, ...] | None, default: str = "auto") -> list[str]:
    """The dtype names the -d / --dtype values hold: repeated options and comma-separated lists ('all' among them
    as written)."""
    names: list[str] = []
    for v in values or [default]:
        # custom formats contain commas of their own: split only on commas that start a new dtype
        parts = [v] if v.strip().lower().startswith("custom") else v.split(",")
        names += [p.strip() for p in parts if p.strip()]
    return names


def parse_dtypes(values: list[str] | tuple[str, ...] | None, default: str = "auto",
                 served: Optional[Callable[[KVFormat], bool]] = None) -> list[KVFormat]:
    """Formats named on the command line: repeated options, comma-separated lists, or 'all' (the catalog formats
    `served` keeps: those the engine serves on the GPU; every one without it). A format named is kept whatever
    serves it: planning it is a what-if, marked as one."""
    names = dtype_names(values, default)
    if not names:
        raise KvplanError("-d / --dtype is empty: name a KV dtype such as auto, fp8 or auto,fp8 (`kvplan formats` "
                          "lists them), or leave the option out")
    out: list[KVFormat] = []
    for n in names:
        fmts = [f for f in CATALOG.values() if served is None or served(f)] if n.lower() == "all" else [kv_format(n)]
        for f in fmts:
            if f not in out:
                out.append(f)
    return out


def comparison_dtypes(model, engine: str = "vllm") -> list[str]:
    """The KV dtypes a comparison shows by default: the model's own and the engine's fp8 cache for it (vLLM's
    dense MLA backends store an MLA latent as plain fp8, FlashMLA's supported_kv_cache_dtypes in
    v1/attention/backends/mla/flashmla.py; on a sparse-attention MLA model vLLM stores fp8 as fp8_ds_mla, which
    the deployment resolves; SGLang stores plain fp8). A checkpoint that declares an fp8 KV cache stores fp8 under
    auto: its comparison is with a 16-bit cache. `engine` is kept for callers; both engines compare with fp8."""
    if getattr(model, "kv_cache_dtype_declared", None) is not None:
        return ["auto", "bfloat16"]
    return ["auto", "fp8"]
