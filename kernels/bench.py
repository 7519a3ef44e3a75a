"""Timing the kernels: one workload per family at a given size, timed with L2 flushed between samples (a buffer at
least twice the L2 written before each), CUDA events on a GPU (wall clock elsewhere), warm-up first, the median
with p10 and p90 kept. Out of memory at a size backs off to the next smaller one."""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from kvplan.calibration import MB, FamilyFit, MeasurePlan, fit_family

HEAD_DIM, KV_HEADS, HEADS, BLOCK = 128, 8, 32, 16


def _timer(device: torch.device) -> Callable[[Callable[[], None], torch.Tensor], float]:
    if device.type == "cuda":
        def timed(fn, flush):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def timed(fn, flush):
            flush.zero_()
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
    return timed


def workload(family: str, size_bytes: int, device: torch.device) -> tuple[Callable[[], None], int]:
    """A callable that runs one kernel call reading about `size_bytes`, and the bytes it really moves."""
    from .gemv import gemv, quantize_fp8_weights
    from .stream import copy_probe, read_probe

    if family in ("stream_read", "stream_copy"):
        buf = torch.randint(0, 255, (size_bytes // 4 * 4,), dtype=torch.uint8, device=device)
        if family == "stream_read":
            return (lambda: read_probe(buf)), buf.numel()
        return (lambda: copy_probe(buf)), 2 * buf.numel()
    if family.startswith("gemv_"):
        k = 4096 if size_bytes >= 8 * MB else 256
        n = max(32, size_bytes // (k * (1 if family == "gemv_fp8" else 2)))
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / 64
        x = torch.randn(8, k, device=device, dtype=torch.bfloat16)
        if family == "gemv_fp8":
            wq, sc = quantize_fp8_weights(w)
            return (lambda: gemv(x, wq, sc)), wq.numel()
        return (lambda: gemv(x, w)), w.numel() * 2
    if family.startswith("decode_"):
        return _decode_workload(family.removeprefix("decode_"), size_bytes, device)
    raise ValueError(f"unknown kernel family {family}")


def _decode_workload(fmt: str, size_bytes: int, device: torch.device):
    from .layouts import slot_layout
    from .paged_attention import paged_decode

    layout = slot_layout(fmt, HEAD_DIM)
    per_token = layout.slot_bytes * KV_HEADS
    ctx = 4096 if size_bytes >= 64 * MB else max(BLOCK, size_bytes // per_token // 4 // BLOCK * BLOCK)
    seqs = max(1, size_bytes // (per_token * ctx))
    blocks = seqs * ctx // BLOCK
    cache = torch.randint(0, 120, (blocks, BLOCK, KV_HEADS, layout.slot_bytes), dtype=torch.uint8, device=device)
    table = torch.arange(blocks, dtype=torch.int32, device=device).view(seqs, ctx // BLOCK)
    lens = torch.full((seqs,), ctx, dtype=torch.int32, device=device)
    q = torch.randn(seqs, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    moved = cache.numel()
    name = layout.fmt.family
    if name == "per_token_head" and fmt.startswith("int4"):
        from .int4_attention import paged_decode_int4
        return (lambda: paged_decode_int4(q, cache, layout, table, lens)), moved
    if name == "nvfp4":
        from .nvfp4_attention import paged_decode_nvfp4
        cache.view(-1, layout.slot_bytes)[:, :] &= 0x77  # finite e2m1 codes and e4m3 scales
        return (lambda: paged_decode_nvfp4(q, cache, layout, table, lens, 1e-2, 1e-2)), moved
    if name == "turboquant":
        from .turboquant_attention import paged_decode_turboquant
        return (lambda: paged_decode_turboquant(q, cache, layout, table, lens)), moved
    if name == "kivi":
        from .kivi_attention import make_residual, paged_decode_kivi
        res = make_residual(seqs, layout, KV_HEADS).to(device)
        return (lambda: paged_decode_kivi(q, cache, res, layout, table, lens)), moved
    return (lambda: paged_decode(q, cache, layout, table, lens)), moved


def run_plan(plan: MeasurePlan, device: torch.device, peak_bytes_per_s: float,
             progress: Callable[[str], None] = lambda _: None) -> dict[str, FamilyFit]:
    """Every point of the plan, timed; then one fit per family."""
    timed = _timer(device)
    flush = torch.empty(plan.flush_bytes // 4, dtype=torch.int32, device=device)
    points: dict[str, list[tuple[float, float, float, float]]] = {}
    for item in plan.items:
        progress(f"{item.family} {item.size_bytes / MB:,.0f} MB")
        size = item.size_bytes
        while True:
            try:
                fn, moved = workload(item.family, size, device)
                break
            except torch.OutOfMemoryError:
                if size <= 8 * MB:
                    raise
                size //= 2  # back off, and try the half
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        for _ in range(plan.warmup):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times = sorted(timed(fn, flush) for _ in range(item.samples))
        points.setdefault(item.family, []).append((float(moved), _quantile(times, 0.5), _quantile(times, 0.1),
                                                   _quantile(times, 0.9)))
        del fn
    return {fam: fit_family(fam, pts, peak_bytes_per_s) for fam, pts in points.items()}


def _quantile(sorted_times: list[float], f: float) -> float:
    return sorted_times[min(len(sorted_times) - 1, int(math.floor(f * (len(sorted_times) - 1))))]


def device_info(device: torch.device) -> dict:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "device_type": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        info.update(name=props.name, compute_capability=f"{props.major}.{props.minor}",
                    memory_total_bytes=int(total), memory_free_bytes=int(free), sm_count=props.multi_processor_count,
                    driver=torch.version.cuda)
        try:
            import pynvml  # optional: clocks when NVML is there

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            info.update(sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                        mem_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                        driver=pynvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - clocks are a nicety
            pass
    else:
        info["name"] = "cpu (Triton interpreter)"
    return info
