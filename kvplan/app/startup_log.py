"""Reading a serving engine's startup log: the configuration it ran with and every memory figure it measured.

vLLM V1 prints "Available KV cache memory: X GiB" and "GPU KV cache size: N tokens" with "Maximum concurrency for
L tokens per request: Cx" (one line from 0.28, two before); older V1 and V0 releases print a memory-profiling
summary ("the current vLLM instance can use total_gpu_memory (T GiB) x gpu_memory_utilization (U) = R GiB",
"model weights take W GiB; non_torch_memory takes ...; PyTorch activation peak memory takes ...; the rest of the
memory reserved for KV Cache is K GiB"; V0 0.6 "Memory profiling results: total_gpu_memory=T GiB ...
kv_cache_size=K GiB gpu_memory_utilization=U"), and V0 "# GPU blocks: N". Lines that each rank prints (prefixed
"(VllmWorker rank=N pid=P)") count at their smallest, as the engine sizes the pool by its tightest rank. SGLang
prints "Load weight end. ... avail mem=A GB, mem usage=W GB", "KV Cache is allocated. dtype: D, #tokens: N, K
size: ...", and "max_total_num_tokens=N, ... available_gpu_mem=X GB". A pure parser: text in, figures out.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from kvplan.errors import KvplanError

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def _f(s: str) -> float:
    value = float(s.replace(",", ""))
    if not math.isfinite(value):
        raise KvplanError(f"the number {s[:20]}... is too large to be a memory figure or a count")
    return value


# the kind of value each configuration setting holds, by kvplan's name for it
_WHOLE = {"tp", "pp", "dcp", "dp_size", "max_model_len", "block_size", "page_size", "max_num_seqs",
          "max_num_batched_tokens", "num_gpu_blocks_override", "chunked_prefill_size", "max_running_requests",
          "max_total_tokens"}
_FRACTION = {"gpu_memory_utilization", "mem_fraction_static", "swa_full_tokens_ratio"}
_FLAG = {"enforce_eager"}


def _check_config(config: dict[str, Any]) -> None:
    """Refuse a setting of the wrong kind (tensor_parallel_size=auto): everything downstream does arithmetic."""
    for key, value in config.items():
        if key in _WHOLE and (isinstance(value, bool) or not isinstance(value, int)):
            expected = "a whole number"
        elif key in _FRACTION and (isinstance(value, bool) or not isinstance(value, (int, float))
                                   or not math.isfinite(value)):
            expected = "a number"
        elif key in _FLAG and not isinstance(value, bool):
            expected = "True or False"
        else:
            continue
        shown = " ".join(str(value).split())
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise KvplanError(f"the engine's configuration sets {key} to '{shown}', expected {expected}; pass the log "
                          "as the engine wrote it")


@dataclass
class StartupLog:
    engine: str  # "vllm" or "sglang"
    version: Optional[str] = None
    v0: bool = False  # vLLM's V0 engine (before V1 became the default in 0.8)
    config: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    failure: Optional[dict[str, Any]] = None  # the engine's own error, when it stopped: kind, message, figures
    startups: int = 1  # how many startups the text holds (a restarted server appending to one file)
    first_line: int = 1  # the line where the startup read begins (the last one)

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------------------------------------------
# vLLM


_VLLM_FIGURES = [
    ("available_kv_gib", rf"Available KV cache memory: {_NUM} GiB"),
    ("kv_tokens", rf"GPU KV cache size: {_NUM} tokens"),
    ("max_concurrency", rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x"),
    ("weights_gib", rf"(?:Model loading took|Loading model weights took) {_NUM} ?Gi?B"),
    ("num_gpu_blocks", rf"# GPU blocks: {_NUM}"),
    ("total_gpu_memory_gib", rf"total_gpu_memory(?: \(|=){_NUM} ?GiB"),
    ("requested_gib", rf"gpu_memory_utilization \({_NUM}\) = {_NUM} ?GiB"),
    ("non_torch_gib", rf"non_torch_memory(?: takes |=){_NUM} ?GiB"),
    ("activation_peak_gib", rf"PyTorch activation peak memory takes {_NUM} ?GiB"),
    ("kv_reserved_gib", rf"(?:memory reserved for KV Cache is |kv_cache_size=){_NUM} ?GiB"),
    ("cudagraph_actual_gib", rf"CUDA graph pool memory: {_NUM} GiB \(actual\)"),
    ("available_kv_gib", rf"reserved {_NUM} GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
    ("cudagraph_estimated_gib", rf"{_NUM} GiB \(estimated\)"),
    ("graph_capture_gib", rf"Graph capturing finished in [0-9.]+ secs?, took {_NUM} GiB"),
    # 0.19+: the worker's snapshot before loading, and the profile's summary
    ("init_free_gib", rf"init memory snapshot:.*?free_memory={_NUM} ?GiB"),
    ("total_gpu_memory_gib", rf"init memory snapshot:.*?total_memory={_NUM} ?GiB"),
    ("init_used_gib", rf"init memory snapshot:.*?cuda_memory={_NUM} ?GiB"),
    ("requested_gib", rf"worker requested memory: {_NUM} ?GiB"),
    ("non_kv_gib", rf"Total non KV cache memory: {_NUM} ?GiB"),
    ("activation_peak_gib", rf"torch peak memory increase: {_NUM} ?GiB"),
    ("non_torch_gib", rf"non-torch forward increase memory: {_NUM} ?GiB"),
    ("cudagraph_estimated_gib", rf"Estimated CUDA graph memory: {_NUM} ?GiB total"),
]

_FIGURE_UNITS = ("GiB", "GB", "tokens", "blocks")  # one of them on every line a _VLLM_FIGURES pattern matches

_PER_RANK_MIN = {"available_kv_gib", "kv_reserved_gib", "num_gpu_blocks", "init_free_gib"}

_VLLM_CONFIG_KEYS = {
    # key in the engine's config dump -> kvplan's name
    "model": "model", "dtype": "dtype", "max_seq_len": "max_model_len", "max_model_len": "max_model_len",
    "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "decode_context_parallel_size": "dcp",
    "quantization": "quantization", "enforce_eager": "enforce_eager", "kv_cache_dtype": "kv_cache_dtype",
    "gpu_memory_utilization": "gpu_memory_utilization", "block_size": "block_size",
    "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
    "num_gpu_blocks_override": "num_gpu_blocks_override", "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "data_parallel_size": "data_parallel_size", "data_parallel_size_local": "data_parallel_size_local",
    "enable_expert_parallel": "enable_expert_parallel", "all2all_backend": "all2all_backend",
    "enable_eplb": "enable_eplb", "num_redundant_experts": "num_redundant_experts",
    "attention_backend": "attention_backend",
}


def _value(raw: str) -> Any:
    raw = raw.strip().rstrip(",").strip()
    if raw in ("None", "null"):
        return None
    if raw in ("True", "False"):
        return raw == "True"
    if (raw.startswith("'") and raw.endswith("'")) or (raw.startswith('"') and raw.endswith('"')):
        return raw[1:-1]
    if raw.startswith("torch."):
        return raw[len("torch."):]
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def _key_values(text: str) -> dict[str, Any]:
    """key=value pairs of a config dump (vLLM's "with config: ...", SGLang's "ServerArgs(...)") and dict-style
    "'key': value" pairs (vLLM's "non-default args: {...}")."""
    out: dict[str, Any] = {}
    for m in re.finditer(r"(?<![\w.])([a-z_][a-z0-9_]*)=('[^']*'|\"[^\"]*\"|[^,()\s]+)", text):
        out.setdefault(m.group(1), _value(m.group(2)))
    for m in re.finditer(r"'([a-z_][a-z0-9_]*)': ('[^']*'|[^,{}]+)", text):
        out[m.group(1)] = _value(m.group(2))
    return out


# the errors that stop vLLM's start-up, each with what it names (the engine's own wording)
_VLLM_FAILURES = [
    ("free_memory", rf"Free memory on device (?:cuda:)?\S+ \({_NUM}/{_NUM} ?GiB\) on startup is less than desired GPU "
                    rf"memory utilization \({_NUM}, {_NUM} ?GiB\)", ("free_gib", "total_gib", "utilization", "requested_gib")),
    ("sampler_warmup", r"CUDA out of memory occurred when warming up sampler with ([0-9]+) dummy requests",
     ("rows",)),
    ("max_model_len", r"User-specified max_model_len \(([0-9]+)\) is greater than the derived max_model_len",
     ("max_model_len",)),
    ("not_divisible", r"AssertionError: ([0-9]+) is not divisible by ([0-9]+)", ("value", "by")),
    ("out_of_memory", r"(?:torch\.OutOfMemoryError|CUDA out of memory)", ()),
]


def _vllm_failure(text: str) -> Optional[dict[str, Any]]:
    for kind, pattern, names in _VLLM_FAILURES:
        found = list(re.finditer(pattern, text))
        if not found:
            continue
        if kind == "free_memory":  # each refused rank prints its own; the scarcest names the problem
            found.sort(key=lambda m: _f(m.group(1)))
        m = found[0]
        line = text[text.rfind("\n", 0, m.start()) + 1:text.find("\n", m.end()) % (len(text) + 1)]
        message = re.sub(r"^.*?(?=[A-Za-z_.]*(?:Error|Exception): |User-specified|Free memory|CUDA out of)", "",
                         line.strip(), count=1)
        figures = {n: _f(v) for n, v in zip(names, m.groups())}
        return {"kind": kind, "message": " ".join(message.split())[:400], **figures}
    return None


def _parse_vllm(text: str) -> StartupLog:
    log = StartupLog("vllm")
    log.v0 = bool(re.search(r"Initializing an LLM engine|# GPU blocks:", text))
    if re.search(r"api_server|API server", text):
        log.config["entrypoint"] = "serve"
    elif re.search(r"\[llm\.py:\d+\]|entrypoints/llm\.py", text):
        log.config["entrypoint"] = "llm"
    m = re.search(r"(?:engine \(v|vLLM API server version |version[ =]v?)([0-9]+\.[0-9]+(?:\.[0-9]+)?)", text)
    if m:
        log.version = m.group(1)
    for line in text.splitlines():
        if "with config:" in line or "non-default args:" in line or "Initializing" in line:
            for k, v in _key_values(line).items():
                if k in _VLLM_CONFIG_KEYS and v is not None:
                    log.config.setdefault(_VLLM_CONFIG_KEYS[k], v)
    m = re.search(r"gpu_memory_utilization=([0-9.]+)", text)  # V0 0.6's "Memory profiling results" line
    if m:
        log.config.setdefault("gpu_memory_utilization", float(m.group(1).rstrip(".")))
    # every figure is one line's and names its unit (GiB, GB, tokens or blocks): the patterns search those lines
    # alone; the snapshot line's own fields (non_torch_memory=...) are not the profile's figures of the same name
    lines = [line for line in text.splitlines() if any(u in line for u in _FIGURE_UNITS)]
    figures = "\n".join(lines)
    body = "\n".join(line for line in lines if "init memory snapshot" not in line)
    for key, pattern in _VLLM_FIGURES:
        found = re.findall(pattern, figures if "snapshot" in pattern else body)
        if not found:
            continue
        last = found[-1]
        if key in _PER_RANK_MIN:  # every rank prints its own; the engine sizes the pool by the smallest
            last = min(found, key=lambda f: _f(f if isinstance(f, str) else f[0]))
        if key == "max_concurrency":
            log.config.setdefault("max_model_len", int(_f(last[0])))
            log.measured[key] = _f(last[1])
        elif key == "requested_gib" and not isinstance(last, str):
            log.config.setdefault("gpu_memory_utilization", _f(last[0]))
            log.measured[key] = _f(last[1])
        else:
            log.measured[key] = _f(last if isinstance(last, str) else last[0])
    if "kv_tokens" in log.measured:
        log.measured["kv_tokens"] = int(log.measured["kv_tokens"])
    # the backend the selector took (platforms/cuda.py get_attn_backend_cls, 0.19+)
    used = re.findall(r"Using (\w+) attention backend out of potential backends", text)
    if used:
        log.config["attention_backend_used"] = used[-1]
    if re.search(r"Engine core initialization failed|WorkerProc failed|ValidationError|Error: ", text):
        log.failure = _vllm_failure(text)
    if log.config.get("dtype") == "auto":
        log.config.pop("dtype")
    return log


# ----------------------------------------------------------------------------------------------------------------
# SGLang


_SGLANG_FIGURES = [
    ("free_before_load_gb", rf"Load weight begin\..*?avail mem={_NUM} GB"),
    ("weights_load_avail_gb", rf"Load weight end\..*?avail mem={_NUM} GB"),
    ("weights_gb", rf"Load weight end\..*?mem usage={_NUM} GB"),
    ("kv_tokens", rf"KV Cache is allocated\..*?#tokens: {_NUM}"),
    ("k_size_gb", rf"K size: {_NUM} GB"),
    ("v_size_gb", rf"V size: {_NUM} GB"),
    ("kv_size_gb", rf"KV size: {_NUM} GB"),
    ("memory_pool_end_avail_gb", rf"Memory pool end\. avail mem={_NUM} GB"),
    ("max_total_num_tokens", rf"max_total_num_tokens={_NUM}"),
    ("max_running_requests", rf"max_running_requests={_NUM}"),
    ("available_gpu_mem_gb", rf"available_gpu_mem={_NUM} GB"),
    ("baseline_mem_usage_gb", rf"Memory baseline taken\. mem usage={_NUM} GB"),
]

_SGLANG_CONFIG_KEYS = {
    "model_path": "model", "tp_size": "tp", "pp_size": "pp", "dp_size": "dp_size", "mem_fraction_static":
    "mem_fraction_static", "kv_cache_dtype": "kv_cache_dtype", "context_length": "max_model_len", "page_size":
    "page_size", "chunked_prefill_size": "chunked_prefill_size", "max_running_requests": "max_running_requests",
    "dtype": "dtype", "quantization": "quantization", "swa_full_tokens_ratio": "swa_full_tokens_ratio",
    "max_total_tokens": "max_total_tokens", "enable_dp_attention": "enable_dp_attention", "ep_size": "ep_size",
    "moe_a2a_backend": "moe_a2a_backend", "ep_num_redundant_experts": "ep_num_redundant_experts",
    "moe_dense_tp_size": "moe_dense_tp_size", "enable_dp_lm_head": "enable_dp_lm_head",
}


def _parse_sglang(text: str) -> StartupLog:
    log = StartupLog("sglang")
    m = re.search(r"sglang(?:[ =]|==|\s+version\s+)v?([0-9]+\.[0-9]+(?:\.[0-9]+)?)", text, re.IGNORECASE)
    if m:
        log.version = m.group(1)
    for line in text.splitlines():
        if "server_args=" in line or "ServerArgs(" in line:
            for k, v in _key_values(line).items():
                if k in _SGLANG_CONFIG_KEYS and v is not None:
                    log.config.setdefault(_SGLANG_CONFIG_KEYS[k], v)
    m = re.search(r"KV Cache is allocated\. dtype: (?:torch\.)?([a-z0-9_]+)", text)
    if m:
        log.config.setdefault("kv_storage_dtype", m.group(1))
    m = re.search(r"context_len=([0-9]+)", text)
    if m:
        log.config.setdefault("max_model_len", int(m.group(1)))
    for key, pattern in _SGLANG_FIGURES:
        found = re.findall(pattern, text)
        if found:
            log.measured[key] = _f(found[-1])
    for key in ("kv_tokens", "max_total_num_tokens", "max_running_requests"):
        if key in log.measured:
            log.measured[key] = int(log.measured[key])
    return log


# ----------------------------------------------------------------------------------------------------------------


def _parse(parser, text: str, source: str) -> StartupLog:
    """Run one engine's parser; what is wrong with the log is one line naming it."""
    try:
        log = parser(text)
        _check_config(log.config)
    except KvplanError as e:
        raise KvplanError(f"{source}: {e}") from None
    return log


# the line each startup begins with: vLLM's API server announcing its version (the banner's "version X" from
# 0.19), or, without an API server (the offline LLM class), the engine's initialization; SGLang's server arguments
_VLLM_STARTS = (r"vLLM API server version \S|\u2588\s+version v?[0-9]", r"Initializing (?:an|a V1) LLM engine")
_SGLANG_STARTS = (r"server_args=ServerArgs\(|^\S*\s*ServerArgs\(",)


def _last_startup(text: str, starts: tuple[str, ...]) -> tuple[str, int, int]:
    """The last startup in a file a restarted server appended to, how many it holds and the line where the last
    begins. Each pattern is tried in turn: the first one the text has marks the startups."""
    for pattern in starts:
        offsets = [m.start() for m in re.finditer(rf"^.*(?:{pattern})", text, re.MULTILINE)]
        if offsets:
            break
    else:
        return text, 1, 1
    if len(offsets) == 1:
        return text, 1, 1
    start = offsets[-1]
    return text[start:], len(offsets), text.count("\n", 0, start) + 1


def _parse_last(parser, text: str, source: str, starts: tuple[str, ...]) -> StartupLog:
    last, count, line = _last_startup(text, starts)
    log = _parse(parser, last, source)
    log.startups, log.first_line = count, line
    return log


def parse_startup_log(text: str, source: str = "log") -> StartupLog:
    """The engine, configuration and measured figures of a vLLM or SGLang startup log; of a file holding several
    startups (a restarted server appending to it), the last."""
    if re.search(r"KV Cache is allocated|max_total_num_tokens=|ServerArgs\(", text):
        log = _parse_last(_parse_sglang, text, source, _SGLANG_STARTS)
        need = [("max_total_num_tokens", "max_total_num_tokens=N (the scheduler's summary line)")]
    elif re.search(r"KV cache memory|KV cache size|# GPU blocks|vLLM|vllm", text):
        log = _parse_last(_parse_vllm, text, source, _VLLM_STARTS)
        need = []
        if log.failure is not None:
            return log  # the engine stopped: what it printed before is all there is
        if not ({"available_kv_gib", "kv_reserved_gib", "num_gpu_blocks"} & set(log.measured)):
            need.append(("available_kv_gib", "'Available KV cache memory: X GiB' (or the memory-profiling summary, "
                         "or V0's '# GPU blocks: N')"))
        if not ({"kv_tokens", "num_gpu_blocks"} & set(log.measured)):
            need.append(("kv_tokens", "'GPU KV cache size: N tokens' (or '# GPU blocks: N')"))
    else:
        raise KvplanError(f"{source}: not a vLLM or SGLang startup log (none of their KV-cache lines is in it)")
    missing = [what for key, what in need if key not in log.measured]
    if missing:
        where = f" (its last startup, from line {log.first_line})" if log.startups > 1 else ""
        raise KvplanError(f"{source}: the {log.engine} log{where} lacks {'; '.join(missing)}; pass the whole startup "
                          f"log, from the engine's start to its first request")
    return log
