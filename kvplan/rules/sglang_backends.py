"""Which attention backend SGLang runs a model with, the KV cache dtypes each backend takes and the page size it
forces: SGLang's backend choice as data, one entry per backend and release.

SGLang picks the backend at start when --attention-backend is not given (0.5.9 server_args.py
ServerArgs._handle_attention_backend_compatibility; 0.5.23 arg_groups/model_override_base.py
get_default_attn_backend, run by arg_groups/overrides.py _attention_backend_default): by the model's attention
(MLA or not) and the GPU (is_hopper_with_cuda_12_3: 9.x; is_sm100_supported: 10.x; is_hip: ROCm), with a few
architectures choosing their own (ServerArgs._handle_model_specific_adjustments: DeepSeek-V3 on 10.x, GPT-OSS).
Unlike vLLM's selector it does not walk a list against the KV cache dtype: the dtype is checked afterwards, per
backend, and a backend that cannot take it either hands over to another (fa3 with fp8_e5m2 -> triton) or stops the
server at start (the FP4 caches: _handle_kv4_compatibility asserts the backend is one of its lists; trtllm_mla
raises for a dtype outside its list). Backends that need a fixed page size set it whatever --page-size says
(flashmla 64, cutlass_mla 128, trtllm_mla 64 unless 32 or 64, trtllm_mha 64 unless one it takes, fa4 on an MHA
model 128).

Read from SGLang 0.5.9, 0.5.12, 0.5.16, 0.5.17 and 0.5.23 (python/sglang/srt; paths below are relative to it). A
release between two read ones is planned with the newest read release not after it (0.5.10 and 0.5.11 as 0.5.9;
0.5.20 to 0.5.22 as 0.5.17, though cutlass_mla, gone from 0.5.23, may have left in one of them).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Optional

from kvplan.errors import KvplanError
from kvplan.values import frozen_dataclass

READ = ("0.5.9", "0.5.12", "0.5.16", "0.5.17", "0.5.23")
FLOAT = frozenset({"auto", "bf16"})
E4M3 = frozenset({"fp8_e4m3"})
FP8 = frozenset({"fp8_e4m3", "fp8_e5m2"})
# the FP4 caches: --kv-cache-dtype fp4_e2m1 up to 0.5.15 (0.5.9 server_args.py --kv-cache-dtype choices); from 0.5.16
# nvfp4 and fp4_mx_block16 (and mxfp8, the FA4 path's), fp4_e2m1 refused at start (mem_cache/kv_cache_dtype.py)
FP4_OLD = frozenset({"fp4_e2m1"})
FP4_NEW = frozenset({"nvfp4", "fp4_mx_block16"})
_SA = "server_args.py ServerArgs"
_OV = "arg_groups/overrides.py"


@frozen_dataclass
class SglBackend:
    """One attention backend of one SGLang release: the --kv-cache-dtype values (SGLang's spelling) it takes for an
    MHA model and for an MLA one (empty: it does not run that kind), the compute capability majors it runs on
    (empty: every CUDA GPU from `cc_min`), the page sizes it takes (empty: any) and the one it sets otherwise."""

    name: str
    family: str
    source: str
    mha: frozenset = frozenset()
    mla: frozenset = frozenset()
    cc_majors: tuple[int, ...] = ()
    cc_min: tuple[int, int] = (0, 0)
    platform: str = "cuda"
    pages: tuple[int, ...] = ()
    page_set: int = 0  # the page size SGLang sets where --page-size is not one of `pages`
    since: str = "0.5.9"

    def dtypes(self, mla: bool) -> frozenset:
        return self.mla if mla else self.mha

    def runs_on(self, cc: Optional[tuple[int, int]], platform: str) -> bool:
        if platform != self.platform:
            return False
        if cc is None:
            return True
        return (not self.cc_majors or cc[0] in self.cc_majors) and cc >= self.cc_min

    def page(self, asked: int) -> int:
        return asked if not self.pages or asked in self.pages else self.page_set


# fa3 takes fp8_e4m3 only among the fp8 caches: with fp8_e5m2 SGLang runs triton instead (0.5.9
# _handle_attention_backend_compatibility; 0.5.23 overrides.py _attention_backend_fa3_fp8_fallback)
_FA3 = SglBackend("fa3", "FlashAttention 3", f"layers/attention/flashattention_backend.py; {_SA}."
                  "_handle_attention_backend_compatibility (fp8_e5m2 -> triton)", FLOAT | E4M3, FLOAT | E4M3,
                  cc_majors=(9,))
# FA4 (Blackwell): page 128 on an MHA model (0.5.9 _handle_attention_backend_compatibility; 0.5.23 overrides.py
# _fa4_page_constraint); from 0.5.16 the mxfp8 cache is its own (server_args.py --kv-cache-dtype help: "mxfp8 is
# supported by the FA4 backend"; 0.5.23 arg_groups/kv_cache_hook.py handle_mxfp8_kv_cache_compatibility: SM100+)
_FA4 = SglBackend("fa4", "FlashAttention 4", "layers/attention/flashattention_backend.py (fa_impl_ver 4); "
                  f"{_SA}._handle_attention_backend_compatibility (page 128 for MHA)", FLOAT, cc_majors=(10,),
                  pages=(128,), page_set=128)
_FLASHINFER = SglBackend("flashinfer", "FlashInfer", "layers/attention/flashinfer_backend.py, "
                         "flashinfer_mla_backend.py; " + _SA + "._handle_kv4_compatibility (FP4 on MLA)",
                         FLOAT | FP8, FLOAT | FP8 | FP4_OLD, cc_min=(8, 0))
_TRITON = SglBackend("triton", "Triton", "layers/attention/triton_backend.py; " + _SA +
                     "._handle_kv4_compatibility (FP4 on MHA)", FLOAT | FP8 | FP4_OLD, FLOAT | FP8)
_TRITON_ROCM = SglBackend("triton", "Triton", _TRITON.source, FLOAT | FP8, FLOAT | FP8, platform="rocm")
# trtllm_mha: 10.x only in 0.5.9 (is_sm100_supported); 9.x, 10.x and 12.x from 0.5.12; page 16, 32 or 64 (128 from
# 0.5.17), else 64 (_handle_attention_backend_compatibility; 0.5.23 overrides.py _mla_backend_page_constraints);
# its fp8 path is e4m3 (trtllm_mha_backend.py: q.to(torch.float8_e4m3fn))
_TRTLLM_MHA = SglBackend("trtllm_mha", "TRT-LLM MHA", "layers/attention/trtllm_mha_backend.py; " + _SA +
                         "._handle_attention_backend_compatibility (SM100 only, page 16/32/64 else 64)",
                         FLOAT | E4M3 | FP4_OLD, cc_majors=(10,), pages=(16, 32, 64), page_set=64)
# trtllm_mla: Blackwell (is_blackwell_supported: 10.x, 11.x, 12.x); fp8_e4m3, fp4_e2m1, bf16 or auto, else it raises
# at start (0.5.16 on: nvfp4 and fp4_mx_block16 are not in that list; 0.5.23 overrides.py
# _mla_kv_cache_dtype_checks drops fp4_e2m1); page 32 or 64, else 64
_TRTLLM_MLA = SglBackend("trtllm_mla", "TRT-LLM MLA", "layers/attention/trtllm_mla_backend.py; " + _SA +
                         "._handle_attention_backend_compatibility (Blackwell, its dtypes, page 32/64 else 64)",
                         mla=FLOAT | E4M3 | FP4_OLD, cc_majors=(10, 11, 12), pages=(32, 64), page_set=64)
_FLASHMLA = SglBackend("flashmla", "FlashMLA", "layers/attention/flashmla_backend.py; " + _SA +
                       "._handle_attention_backend_compatibility (page 64)", mla=FLOAT | E4M3 | FP4_OLD,
                       cc_majors=(9, 10), pages=(64,), page_set=64)
_CUTLASS_MLA = SglBackend("cutlass_mla", "CUTLASS MLA", "layers/attention/cutlass_mla_backend.py; " + _SA +
                          "._handle_attention_backend_compatibility (page 128)", mla=FLOAT | E4M3 | FP4_OLD,
                          cc_majors=(10,), pages=(128,), page_set=128)
# ROCm: aiter (HIP stores fp8_e4m3 and fp8_e5m2 alike as its native fp8: model_runner.py configure_kv_cache_dtype)
_AITER = SglBackend("aiter", "AITER (ROCm)", "layers/attention/aiter_backend.py", FLOAT | FP8, FLOAT | FP8,
                    platform="rocm")

_NEW_FP4 = dict(since="0.5.16")
_CHANGES = [
    # 0.5.12: trtllm_mha also on 9.x and 12.x (server_args.py: "only supported on Hopper (SM90), Blackwell (SM100)
    # and (SM120) GPUs")
    replace(_TRTLLM_MHA, cc_majors=(9, 10, 12), since="0.5.12"),
    # 0.5.16: the FP4 caches become nvfp4 and fp4_mx_block16 (_handle_kv4_compatibility: MHA on triton or trtllm_mha,
    # MLA on cutlass_mla, flashinfer or trtllm_mla, the last refusing them in its dtype check); mxfp8 on fa4
    replace(_TRITON, mha=FLOAT | FP8 | FP4_NEW, **_NEW_FP4),
    replace(_FLASHINFER, mla=FLOAT | FP8 | FP4_NEW, **_NEW_FP4),
    replace(_CUTLASS_MLA, mla=FLOAT | E4M3 | FP4_NEW, **_NEW_FP4),
    replace(_TRTLLM_MLA, mla=FLOAT | E4M3, **_NEW_FP4),
    replace(_FLASHMLA, mla=FLOAT | E4M3, **_NEW_FP4),
    replace(_TRTLLM_MHA, mha=FLOAT | E4M3 | FP4_NEW, cc_majors=(9, 10, 12), **_NEW_FP4),
    replace(_FA4, mha=FLOAT | {"mxfp8"}, **_NEW_FP4),
    # 0.5.17: trtllm_mha takes page 128 too (overrides.py _mla_backend_page_constraints)
    replace(_TRTLLM_MHA, mha=FLOAT | E4M3 | FP4_NEW, cc_majors=(9, 10, 12),
                  pages=(16, 32, 64, 128), since="0.5.17"),
]
BACKENDS: tuple[SglBackend, ...] = (_FA3, _FA4, _FLASHINFER, _TRITON, _TRITON_ROCM, _TRTLLM_MHA, _TRTLLM_MLA,
                                    _FLASHMLA, _CUTLASS_MLA, _AITER, *_CHANGES)
# cutlass_mla's backend file is gone from 0.5.23 (layers/attention/ has no cutlass_mla_backend.py)
GONE = {"cutlass_mla": "0.5.23"}


# ---------------------------------------------------------------------------------------------------------------
# The default choice: (layout, what of the GPU) -> backend, per release. "9": is_hopper_with_cuda_12_3, "10":
# is_sm100_supported, "rocm": is_hip, "other": the rest (flashinfer for MHA where installed, which a CUDA install
# is; triton for MLA). Later keys refine it: "sinks" an MHA model with attention sinks off 9.x and 10.x (0.5.12 on:
# "FlashInfer does not support attention sinks"), "asymmetric" an MHA model whose K and V head sizes differ on 10.x
# (0.5.17 on: fa4, "trtllm_mha requires equal K/V row widths"). Each family's own: DeepSeek-V3 on 10.x trtllm_mla,
# GPT-OSS trtllm_mha on 10.x, fa3 on 9.x, else triton (ServerArgs._handle_model_specific_adjustments).
_D = {("mha", "9"): "fa3", ("mha", "10"): "trtllm_mha", ("mha", "other"): "flashinfer", ("mha", "rocm"): "aiter",
      ("mla", "9"): "fa3", ("mla", "10"): "flashinfer", ("mla", "other"): "triton", ("mla", "rocm"): "aiter"}
_FAMILY = {("deepseek_v3", "10"): "trtllm_mla", ("gpt_oss", "10"): "trtllm_mha", ("gpt_oss", "9"): "fa3",
           ("gpt_oss", "other"): "triton"}
DEFAULTS = {"0.5.9": _D, "0.5.12": {**_D, ("sinks", "other"): "triton"},
            "0.5.16": {**_D, ("sinks", "other"): "triton"},
            "0.5.17": {**_D, ("sinks", "other"): "triton", ("asymmetric", "10"): "fa4"}}
DEFAULTS["0.5.23"] = DEFAULTS["0.5.17"]
DEFAULT_SOURCES = {r: (f"SGLang {r} server_args.py ServerArgs._handle_attention_backend_compatibility"
                       if r != "0.5.23" else "SGLang 0.5.23 arg_groups/model_override_base.py get_default_attn_backend")
                   for r in DEFAULTS}
# the backends `--attention-backend` may name that kvplan plans (0.5.9 server_args.py ATTENTION_BACKEND_CHOICES)
NAMES = ("fa3", "fa4", "flashinfer", "triton", "trtllm_mha", "trtllm_mla", "flashmla", "cutlass_mla", "aiter")


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in (v.strip().lstrip("v").split(".") + ["0", "0"])[:3] if p.isdigit())


def read_release(version: Optional[str]) -> str:
    """The newest read release not after `version` (None: the newest read)."""
    if version is None:
        return READ[-1]
    earlier = [r for r in READ if _key(r) <= _key(version)]
    return earlier[-1] if earlier else READ[0]


@lru_cache(maxsize=None)
def backend(name: str, release: str, platform: str = "cuda") -> Optional[SglBackend]:
    """Backend `name`'s entry in `release` on `platform` (None where that release has none)."""
    rel = _key(read_release(release))
    gone = GONE.get(name)
    if gone is not None and rel >= _key(gone):
        return None
    entries = [b for b in BACKENDS if b.name == name and b.platform == platform and _key(b.since) <= rel]
    return max(entries, key=lambda b: _key(b.since)) if entries else None


def _arch(cc: Optional[tuple[int, int]], platform: str) -> str:
    if platform == "rocm":
        return "rocm"
    return str(cc[0]) if cc is not None and cc[0] in (9, 10) else "other"


def default_backend(release: str, mla: bool, cc: Optional[tuple[int, int]], platform: str, family: str = "",
                    sinks: bool = False, asymmetric: bool = False, kv_heads: int = 0) -> str:
    """The backend SGLang `release` runs when --attention-backend is not given."""
    table = DEFAULTS[read_release(release)]
    arch = _arch(cc, platform)
    if (family, arch) in _FAMILY:
        return _FAMILY[(family, arch)]
    if mla:
        if arch == "rocm":  # aiter_backend takes 16 or 128 heads per rank, else triton
            return "aiter" if kv_heads in (16, 128) else "triton"
        return table[("mla", arch)]
    if sinks and ("sinks", arch) in table:
        return table[("sinks", arch)]
    if asymmetric and ("asymmetric", arch) in table:
        return table[("asymmetric", arch)]
    return table[("mha", arch)]


def serving(release: str, mla: bool, dtype: str, cc, platform: str) -> list[str]:
    """The backends of `release` that take `dtype` for this attention on this GPU, in NAMES order."""
    out = []
    for name in NAMES:
        b = backend(name, release, platform)
        if b is not None and b.runs_on(cc, platform) and dtype in b.dtypes(mla):
            out.append(name)
    return out


def refusal(b: Optional[SglBackend], name: str, release: str, mla: bool, dtype: str, cc, platform: str,
            gpu_name: str) -> Optional[str]:
    """Why backend `name` (its entry `b`) cannot serve this cache on this GPU, in one clause; None where it can."""
    if b is None:
        return f"SGLang {release} has no {name} attention backend on {platform}"
    if not b.runs_on(cc, platform):
        return f"{name} does not run on {gpu_name}"
    if not b.dtypes(mla):
        return f"{name} is not a backend for {'MLA' if mla else 'MHA'} models"
    if dtype not in b.dtypes(mla):
        return f"{name} does not take --kv-cache-dtype {dtype}"
    return None


def cc_of(text: Optional[str]) -> Optional[tuple[int, int]]:
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def check_name(asked: str, release: str, platform: str) -> str:
    """--attention-backend NAME as SGLang spells it, refused in one line where kvplan does not plan it."""
    name = asked.strip().lower()
    if backend(name, release, platform) is None:
        names = ", ".join(n for n in NAMES if backend(n, release, platform) is not None)
        raise KvplanError(f"--attention-backend {asked}: kvplan plans SGLang {read_release(release)}'s {names} on "
                          f"{platform} (or auto, SGLang's default)")
    return name


# --kv-cache-dtype values a release's argument parser does not list yet: 0.5.9 to 0.5.15 take auto, fp8_e5m2,
# fp8_e4m3, bf16, bfloat16 and fp4_e2m1 (server_args.py --kv-cache-dtype choices); 0.5.16 adds mxfp8, nvfp4 and
# fp4_mx_block16 (server_args.py ServerArgs.kv_cache_dtype choices)
DTYPE_SINCE = {"mxfp8": "0.5.16", "nvfp4": "0.5.16", "fp4_mx_block16": "0.5.16"}


def missing_dtype(dtype: str, version: Optional[str]) -> Optional[str]:
    """The first release that takes --kv-cache-dtype `dtype` where `version` is before it; None otherwise."""
    since = DTYPE_SINCE.get(dtype)
    if since is None or version is None or _key(version) >= _key(since):
        return None
    return since
