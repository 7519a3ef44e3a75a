"""SGLang's rules (v0.5), as data: the KV cache dtypes it accepts, the default --mem-fraction-static by GPU memory,
the memory its CUDA context takes before the baseline, and the sliding-window pool ratio. The SGLang twin of
engines.py; the pool arithmetic that reads them is sglang.py.

Sources: sglang v0.5.23, srt/arg_groups/memory_hook.py (the default mem_fraction_static, chunked_prefill_size and
the largest decode graph batch), srt/model_executor/pool_configurator.py (the hybrid SWA pool's ratio).
"""

from __future__ import annotations

from kvplan.specs.catalog import GPUSpec, ModelSpec

SGLANG_VERSION = "0.5"  # the release whose rules these are
CONTEXT_GIB = 0.5  # CUDA context and NCCL before SGLang's baseline (not a source constant; a log pins it)
SWA_FULL_TOKENS_RATIO = 0.8

# kvplan format -> SGLang's --kv-cache-dtype (the formats SGLang accepts)
SGLANG_DTYPES = {"auto": "auto", "bfloat16": "bf16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "fp8": "fp8_e4m3",
                 "mxfp8": "mxfp8", "nvfp4": "nvfp4", "fp4_mx_block16": "fp4_mx_block16",
                 "fp4_e2m1": "fp4_e2m1"}  # fp4_e2m1: up to 0.5.15 (its catalog entry's Serves.until)


def default_chunked_prefill_and_decode_bs(gpu_mem_gb: float, tp: int) -> tuple[int, int]:
    """SGLang's defaults by GPU memory (memory_hook.py): chunked_prefill_size and the largest decode graph batch."""
    if gpu_mem_gb < 20:
        return 2048, 8
    if gpu_mem_gb < 35:
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_gb < 60:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_gb < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_chunked_prefill_size(gpu: GPUSpec, tp: int) -> int:
    """SGLang's chunked_prefill_size for this GPU (memory_hook.py, by nvidia-smi's total)."""
    return default_chunked_prefill_and_decode_bs((gpu.smi_total_mib or gpu.memory_total_gib * 1024) / 1024, tp)[0]


def default_mem_fraction_static(model: ModelSpec, gpu: GPUSpec, tp: int, pp: int = 1) -> float:
    """memory_hook.py: reserve 512 MB + 1.5 x chunked prefill + tp x pp / 8 GB + the graphs' share, at least 10 GB
    on GPUs over 60 GB, out of nvidia-smi's total."""
    gpu_mem = gpu.smi_total_mib or gpu.memory_total_gib * 1024
    chunked, decode_bs = default_chunked_prefill_and_decode_bs(gpu_mem / 1024, tp)
    graphs = 1536 if model.is_mla else 2 * decode_bs
    reserved = 512 + 1.5 * max(chunked, 2048) + tp * pp / 8 * 1024 + graphs
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem - reserved) / gpu_mem, 3)
