"""Which KV format the engine stores: a checkpoint's declared KV-cache quantization under `auto`, SGLang's dtype for
DeepSeek sparse attention, and the layers kept out of a quantized cache."""

from __future__ import annotations

from typing import Optional

from kvplan.errors import KvplanError
from kvplan.rules.sglang import NSA_DTYPES, SGLANG_DTYPES, nsa_default_kv_dtype
from kvplan.sizing.kv_cache import parse_skip_layers
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.kv_formats import KVFormat, kv_format, release_key


def skip_value(v) -> Optional[tuple]:
    """The skip-layer option in any of its spellings: '0,1,30', 'none', 'sliding_window', 5, [0, 1]."""
    if v is None or isinstance(v, tuple):
        return v
    if isinstance(v, bool):
        raise KvplanError(f"--kv-cache-dtype-skip-layers: expected layer indices, 'none' or 'sliding_window', got {v}")
    if isinstance(v, int):
        v = str(v)
    elif isinstance(v, list):
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
            raise KvplanError(f"--kv-cache-dtype-skip-layers: expected a list of layer indices, got {v}")
        v = ",".join(map(str, v))
    return parse_skip_layers(str(v))


def nsa_kv(asked, m: ModelSpec, g: Optional[GPUSpec], fmt: KVFormat, notes: list[str]) -> KVFormat:
    """The KV dtype SGLang stores for an NSA model (server_args.py _handle_model_specific_adjustments): auto is
    bfloat16 on Hopper and fp8_e4m3 from SM 10, whatever the checkpoint declares; only those two are served."""
    name = asked.name if isinstance(asked, KVFormat) else (asked or "auto")
    if kv_format(name).name == "auto":
        fmt = kv_format(nsa_default_kv_dtype(g))
        notes.append(f"auto: SGLang stores DeepSeek sparse attention's latent in {fmt.name} on "
                     f"{g.name if g is not None else 'this GPU'} (bfloat16 before SM 10, fp8_e4m3 from it)")
        return fmt
    if SGLANG_DTYPES.get(fmt.name, fmt.name) not in NSA_DTYPES:
        raise KvplanError(f"--kv-cache-dtype {fmt.name}: SGLang serves DeepSeek sparse attention ({m.name}) with "
                          f"bfloat16 or fp8_e4m3 only (server_args.py asserts it)")
    return fmt


def declared_kv(m: ModelSpec, fmt: KVFormat, engine: str, notes: list[str],
                version: Optional[str] = None) -> KVFormat:
    """The KV format the engine stores for a checkpoint that declares its KV-cache quantization: `auto` becomes
    the declared format where the engine reads the declaration (vLLM: EngineArgs.create_engine_config ->
    resolve_kv_cache_dtype_string; SGLang: configure_kv_cache_dtype; see hf_config.declared_kv_cache), and vLLM
    stores fp8 for a compressed-tensors kv_cache_scheme whatever was asked (Attention.__init__). An explicit
    dtype wins otherwise, as in the engines."""
    decl = m.kv_cache_dtype_declared
    if decl is None:
        return fmt
    name = "vLLM" if engine == "vllm" else "SGLang"
    if engine in decl.forced_in and fmt.name not in ("auto", decl.dtype):
        notes.append(f"{name} stores an {decl.dtype} KV cache for this checkpoint whatever --kv-cache-dtype says "
                     f"({decl.source}; model_executor/layers/attention/attention.py): {fmt.name} planned as "
                     f"{decl.dtype}")
        return kv_format(decl.dtype)
    if fmt.name != "auto":
        return fmt
    if engine not in decl.engines:
        notes.append(f"auto: the checkpoint's KV-cache declaration ({decl.source}) is not one {name} reads, so it "
                     f"stores the model dtype")
        return fmt
    since = decl.sglang_since if engine == "sglang" else None
    if since is not None and version is not None and release_key(version) < release_key(since):
        notes.append(f"auto: SGLang {version} does not read the checkpoint's KV-cache declaration ({decl.source}; "
                     f"SGLang does from {since}), so it stores the model dtype")
        return fmt
    notes.append(f"auto: the checkpoint declares an fp8 KV cache ({decl.source}), so {name} stores "
                 f"{decl.dtype}; --kv-cache-dtype bfloat16 keeps a 16-bit cache")
    return kv_format(decl.dtype)
