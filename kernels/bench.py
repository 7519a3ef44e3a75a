"""Timing the kernels: one workload per family at a given size, every buffer, table and scale built before the
clock starts. On a GPU each sample is an L2 flush (a read of a buffer at least twice the L2, so no dirty line is
left to be written back inside the next sample), a start event, the call (replayed from a CUDA graph where it can
be captured), an end event; the samples are queued back to back behind a short GPU sleep that lets the host run
ahead, and the host waits once, after the last sample. Off a GPU, the wall clock. Warm-up first, the median with
p10 and p90 kept. Out of memory at a size backs off to the next smaller one."""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from kvplan.errors import error_line
from kvplan.specs.calibration import DECODE_FORMATS, MB, FamilyFit, MeasurePlan, fit_family

HEAD_DIM, KV_HEADS, HEADS, BLOCK = 128, 8, 32, 16


def flush_reader(flush_bytes: int, device: torch.device, kernel: bool | None = None) -> Callable[[], None]:
    """A callable that evicts the L2 by reading `flush_bytes` once (the streaming read probe into a preallocated
    result): reading leaves clean lines, which the next call's loads replace without a write-back. Off a GPU
    (`kernel` false by default there) torch sums the buffer instead: the interpreter would take minutes over it."""
    from .stream import read_probe

    buf = torch.ones(max(4, flush_bytes // 4 * 4), dtype=torch.uint8, device=device)
    partial = torch.empty(-(-buf.numel() // 4 // 4096), dtype=torch.int32, device=device)
    if kernel is None:
        kernel = device.type == "cuda"
    if not kernel:
        words = buf.view(torch.int32)
        return lambda: words.sum(dtype=torch.int64)
    return lambda: read_probe(buf, out=partial)


def as_graph(fn: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """On a GPU, `fn` captured once in a CUDA graph and returned as its replay (one launch, whatever `fn`
    launches); `fn` itself where capture is not possible (off a GPU, or a call that cannot be captured). `fn`
    must have run once already (its kernels compiled, its buffers allocated)."""
    if device.type != "cuda":
        return fn
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize(device)
        return graph.replay
    except Exception:  # noqa: BLE001 - an uncapturable call is timed launch by launch
        torch.cuda.synchronize(device)
        return fn


def time_samples(fn: Callable[[], None], flush: Callable[[], None], samples: int,
                 device: torch.device) -> list[float]:
    """Seconds of `samples` calls of `fn`, each after `flush()`. On a GPU: events around each call, every sample
    queued before the host waits (once, at the end), so no host work and no synchronisation falls between two
    events; off a GPU, the wall clock around each call."""
    if device.type != "cuda":
        out = []
        for _ in range(samples):
            flush()
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return out
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:  # about 100 us of GPU time per sample at 2 GHz: the host queues every sample meanwhile
        sleep(200_000 * samples)
    for start, end in zip(starts, ends, strict=True):
        flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends, strict=True)]


def workload(family: str, size_bytes: int, device: torch.device) -> tuple[Callable[[], None], int]:
    """A callable that runs one kernel call reading about `size_bytes`, and the bytes it really moves."""
    from .gemv import gemv, quantize_fp8_weights
    from .stream import copy_probe, read_probe

    if family in ("stream_read", "stream_copy"):
        buf = torch.randint(0, 255, (size_bytes // 4 * 4,), dtype=torch.uint8, device=device)
        if family == "stream_read":
            partial = torch.empty(-(-buf.numel() // 4 // 4096), dtype=torch.int32, device=device)
            return (lambda: read_probe(buf, out=partial)), buf.numel()
        dst = torch.empty_like(buf)
        return (lambda: copy_probe(buf, out=dst)), 2 * buf.numel()
    if family.startswith("gemv_"):
        k = 4096 if size_bytes >= 8 * MB else 256
        n = max(32, size_bytes // (k * (1 if family == "gemv_fp8" else 2)))
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / 64
        x = torch.randn(8, k, device=device, dtype=torch.bfloat16)
        y = torch.empty(8, n, device=device, dtype=torch.bfloat16)
        if family == "gemv_fp8":  # the fp8 weights and their fp32 scale per output channel
            wq, sc = quantize_fp8_weights(w)
            return (lambda: gemv(x, wq, sc, out=y)), wq.numel() + 4 * sc.numel()
        return (lambda: gemv(x, w, out=y)), w.numel() * 2
    if family.startswith("decode_"):
        return _decode_workload(family.removeprefix("decode_"), size_bytes, device)
    raise ValueError(f"unknown kernel family {family}")


def _random_cache(shape: tuple, layout, device: torch.device) -> torch.Tensor:
    """A paged cache of random bytes, `shape` slots of the layout, for timing: its per-token fp32 scales set to
    1/64, so that dequantized values stay finite (random bytes read as a float32 scale reach 1e33, and the kernel's
    arithmetic then overflows into inf and NaN, which costs the same time but is no decode step)."""
    cache = torch.randint(0, 120, (*shape, layout.slot_bytes), dtype=torch.uint8, device=device)
    scale = torch.tensor([1 / 64], dtype=torch.float32).view(torch.uint8).to(device)
    for at in (layout.k_scale, layout.v_scale):
        if at >= 0 and layout.mode in (3, 4, 6):  # int8, fp8 and int4 per token and head: one fp32 scale
            cache[..., at:at + 4] = scale
    return cache


def _decode_workload(fmt: str, size_bytes: int, device: torch.device):
    from .layouts import slot_layout

    layout = slot_layout(fmt, HEAD_DIM)
    ctx, seqs = decode_shape(layout, size_bytes)
    blocks = seqs * ctx // BLOCK
    cache = _random_cache((blocks, BLOCK, KV_HEADS), layout, device)
    table = torch.arange(blocks, dtype=torch.int32, device=device).view(seqs, ctx // BLOCK)
    lens = torch.full((seqs,), ctx, dtype=torch.int32, device=device)
    q = torch.randn(seqs, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    return _decode_call(layout, q, cache, table, lens, device)


def run_plan(plan: MeasurePlan, device: torch.device, peak_bytes_per_s: float,
             progress: Callable[[str], None] = lambda _: None) -> dict[str, FamilyFit]:
    """Every point of the plan, timed; then one fit per family."""
    flush = flush_reader(plan.flush_bytes, device)
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
        for _ in range(max(1, plan.warmup)):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times = sorted(time_samples(as_graph(fn, device), flush, item.samples, device))
        points.setdefault(item.family, []).append((float(moved), _quantile(times, 0.5), _quantile(times, 0.1),
                                                   _quantile(times, 0.9)))
        del fn
    return {fam: fit_family(fam, pts, peak_bytes_per_s) for fam, pts in points.items()}


PAGED_FORMATS = ("bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head")
# the timed formats whose decode kernel dequantizes a packed slot (every timed format beyond the paged ones)
QUANTIZED_FORMATS = tuple(f for f in DECODE_FORMATS if f not in PAGED_FORMATS)
CHECK_FORMATS = PAGED_FORMATS + QUANTIZED_FORMATS


def decode_shape(layout, size_bytes: int) -> tuple[int, int]:
    """(context, sequences) of the decode workload that reads about `size_bytes` (at least that many): 4,096-token
    sequences from 64 MB up, below that four sequences of a shorter context."""
    per_token = layout.slot_bytes * KV_HEADS
    ctx = 4096 if size_bytes >= 64 * MB else max(BLOCK, size_bytes // per_token // 4 // BLOCK * BLOCK)
    return ctx, max(1, -(-size_bytes // decode_bytes(layout, 1, ctx, KV_HEADS)))


def timed_contexts(fmt: str, sizes: list[int]) -> list[int]:
    """The context lengths the plan's sizes time in `fmt`."""
    from .layouts import slot_layout

    layout = slot_layout(fmt, HEAD_DIM)
    return sorted({decode_shape(layout, s)[0] for s in sizes})


def self_check(device: torch.device, contexts: dict[str, list[int]] | list[int] | None = None,
               head_dim: int = HEAD_DIM, kv_heads: int = KV_HEADS, heads: int = HEADS,
               formats: tuple[str, ...] = CHECK_FORMATS) -> list[str]:
    """Every decode kernel `kvplan measure` times, run on `device` at the timed shape (head_dim 128, 8 KV heads,
    32 query heads, the context lengths the plan times: `contexts`, per format or for all; 4,096 tokens by
    default) beside an empty sequence, a single token and a ragged 37, over a scattered cache, with the split
    count the timing uses and with 3 splits, against the plain torch reference on the CPU: the formats that
    disagree, or return anything but zeros for the empty sequence (none, normally). On a GPU, the write kernels
    too, against the torch writers, at the same head_dim and KV heads. On a GPU its tensor-core and fp8
    conversion paths are the ones the interpreter tests cannot reach."""
    gen = torch.Generator().manual_seed(0)
    bad = []
    for fmt in formats:
        ctxs = contexts.get(fmt, [4096]) if isinstance(contexts, dict) else list(contexts or [4096])
        lens = [0, 1, 37] + sorted(ctxs)
        try:
            ok = _decode_matches(fmt, lens, head_dim, kv_heads, heads, gen, device)
        except Exception as e:  # noqa: BLE001 - a kernel that fails to run fails the check, with its reason
            bad.append(f"{fmt} ({error_line(e)})")
            continue
        if not ok:
            bad.append(fmt)
    if device.type == "cuda":
        from .paged_attention import make_cache

        for fmt in PAGED_FORMATS:
            if fmt in formats:
                cache, layout = make_cache(fmt, 4, BLOCK, kv_heads, head_dim)
                if not _write_path_matches(cache, layout, gen, device):
                    bad.append(f"{fmt} (write path)")
        bad += _quantized_write_paths(gen, device, kv_heads, head_dim,
                                      tuple(f for f in QUANTIZED_FORMATS if f in formats))
    return bad


def _decode_matches(fmt: str, lens: list[int], d: int, kv_heads: int, heads: int, gen: torch.Generator,
                    device: torch.device) -> bool:
    """One format's decode kernel on `device` against attention over the dequantized cache, on the CPU."""
    import importlib

    from .layouts import slot_layout
    from .paged_attention import make_cache

    layout = slot_layout(fmt, d)
    family = layout.fmt.family
    bs = BLOCK
    need, table = _block_table(lens, bs, gen)
    cache, _ = make_cache(fmt, max(sum(need), 1), bs, kv_heads, d)
    ctx = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), heads, d, generator=gen).to(torch.bfloat16)
    ks = [torch.randn(n, kv_heads, d, generator=gen) for n in lens]
    vs = [torch.randn(n, kv_heads, d, generator=gen) for n in lens]
    slots = [table[s, torch.arange(n) // bs].long() * bs + torch.arange(n) % bs for s, n in enumerate(lens)]
    if family == "kivi":
        kivi = importlib.import_module(f"{__package__}.kivi_attention")
        residual = kivi.make_residual(len(lens), layout, kv_heads, torch.float32)
        for s in range(len(lens)):
            kivi.write_sequence(cache, residual, layout, table[s], s, ks[s], vs[s])
        k_seq, v_seq = _kivi_sequences(kivi, cache, residual, layout, table, lens)

        def run(splits):
            return kivi.paged_decode_kivi(q.to(device), cache.to(device), residual.to(device), layout,
                                          table.to(device), ctx.to(device), splits=splits)
    else:
        write, deq, launch, extra = _format_kernels(fmt, family, ks, vs, sum(lens))
        for s in range(len(lens)):
            if lens[s]:
                write(cache, layout, slots[s], ks[s], vs[s])
        k_all, v_all = deq(cache, layout)
        k_flat, v_flat = k_all.reshape(-1, kv_heads, d), v_all.reshape(-1, kv_heads, d)
        k_seq = [k_flat[sl] for sl in slots]
        v_seq = [v_flat[sl] for sl in slots]

        def run(splits):
            return launch(q.to(device), cache.to(device), layout, table.to(device), ctx.to(device), splits=splits,
                          **extra)
    ref = _reference_decode(q, k_seq, v_seq, lens, heads, kv_heads, d)
    for splits in (None, 3):
        out = run(splits).float().cpu()
        if not torch.isfinite(out).all() or not bool((out[0] == 0).all()):
            return False  # the empty sequence (the first) attends to nothing: zeros
        if not torch.allclose(out, ref, atol=2e-2, rtol=2e-2):
            return False
    return True


def _block_table(lens: list[int], bs: int, gen: torch.Generator):
    """The blocks each sequence of `lens` tokens needs, and a block table giving them distinct blocks in random
    order."""
    need = [-(-n // bs) for n in lens]
    table = torch.zeros(len(lens), max(max(need), 1), dtype=torch.int32)
    perm = torch.randperm(max(sum(need), 1), generator=gen)
    used = 0
    for s, b in enumerate(need):
        table[s, :b] = perm[used:used + b].to(torch.int32)
        used += b
    return need, table


def _format_kernels(fmt: str, family: str, ks: list, vs: list, total: int):
    """A paged format's write, dequantize and decode functions, and the decode's extra arguments (its scales; an
    NVFP4 cache's global scales from the `total` tokens of K and V `ks`, `vs`)."""
    import importlib

    from .paged_attention import dequantize_cache, paged_decode, write_kv

    extra: dict = {}
    if fmt.startswith("int4"):
        mod = importlib.import_module(f"{__package__}.int4_attention")
        write, deq, launch = mod.write_kv_int4, mod.dequantize_cache_int4, mod.paged_decode_int4
    elif family == "nvfp4":
        mod = importlib.import_module(f"{__package__}.nvfp4_attention")
        kg = mod.global_scale(torch.cat(ks)) if total else 1.0
        vg = mod.global_scale(torch.cat(vs)) if total else 1.0
        extra = {"k_global": kg, "v_global": vg}
        write = lambda c, lay, sl, k, v: mod.write_kv_nvfp4(c, lay, sl, k, v, kg, vg)  # noqa: E731
        deq = lambda c, lay: mod.dequantize_cache_nvfp4(c, lay, kg, vg)  # noqa: E731
        launch = mod.paged_decode_nvfp4
    elif family == "turboquant":
        mod = importlib.import_module(f"{__package__}.turboquant_attention")
        write, deq, launch = mod.write_kv_turboquant, mod.dequantize_cache_turboquant, mod.paged_decode_turboquant
    else:
        extra = {"k_scale": 0.05, "v_scale": 0.05}
        write = lambda c, lay, sl, k, v: write_kv(c, lay, sl, k, v, 0.05, 0.05)  # noqa: E731
        deq = lambda c, lay: dequantize_cache(c, lay, 0.05, 0.05)  # noqa: E731
        launch = paged_decode
    return write, deq, launch, extra


def _reference_decode(q, k_seq, v_seq, lens: list[int], heads: int, kv_heads: int, d: int):
    """Attention of each sequence's query over its K and V, in float32 on the CPU (GQA: each KV head serves
    heads // kv_heads query heads); zeros for an empty sequence."""
    ref = torch.zeros(len(lens), heads, d)
    for s, n in enumerate(lens):
        if n:
            k = k_seq[s].repeat_interleave(heads // kv_heads, 1)
            v = v_seq[s].repeat_interleave(heads // kv_heads, 1)
            p = (torch.einsum("hd,nhd->hn", q[s].float(), k) / d ** 0.5).softmax(-1)
            ref[s] = torch.einsum("hn,nhd->hd", p, v)
    return ref


def _kivi_sequences(kivi, cache, residual, layout, table, lens):
    """Each sequence's K and V [n, kv_heads, d] as KIVI stores them: its whole groups decoded, then the residual."""
    _, g, r = kivi._params(layout)
    bs, kv_heads = cache.shape[1], cache.shape[2]
    flat = cache.view(-1, kv_heads, layout.slot_bytes)
    k_seq, v_seq = [], []
    for s, n in enumerate(lens):
        nq = kivi.quantized_len(n, g, r)
        kp, vp = [], []
        for start in range(0, nq, g):
            pos = torch.arange(start, start + g)
            kk, vv = kivi.decode_group(flat[table[s, pos // bs].long() * bs + pos % bs], layout)
            kp.append(kk)
            vp.append(vv)
        k_seq.append(torch.cat(kp + [residual[s, : n - nq, :, 0].float()]))
        v_seq.append(torch.cat(vp + [residual[s, : n - nq, :, 1].float()]))
    return k_seq, v_seq


def _quantized_write_paths(gen, device, kv_heads: int = 2, d: int = 128,
                           formats: tuple[str, ...] = QUANTIZED_FORMATS) -> list[str]:
    """On a GPU, the int4, NVFP4, TurboQuant and KIVI write kernels against the torch writers, byte by byte: the
    bytes may differ only where a value sits on a rounding boundary (well under 1% of them)."""
    from .int4_attention import reshape_and_cache_int4, write_kv_int4
    from .kivi_attention import encode_group, reshape_and_cache_kivi
    from .nvfp4_attention import global_scale, reshape_and_cache_nvfp4, write_kv_nvfp4
    from .paged_attention import make_cache
    from .turboquant_attention import reshape_and_cache_turboquant, write_kv_turboquant

    n = 64
    k = torch.randn(n, kv_heads, d, generator=gen) * 3
    v = torch.randn(n, kv_heads, d, generator=gen)
    bad = []
    for fmt in formats:
        ref, layout = make_cache(fmt, n // 16, 16, kv_heads, d)
        mine = torch.zeros_like(ref, device=device)
        if fmt.startswith("kivi"):  # two token groups of 32
            flat = ref.view(n, kv_heads, -1)
            flat[:32], flat[32:] = encode_group(k[:32], v[:32], layout), encode_group(k[32:], v[32:], layout)
            reshape_and_cache_kivi(mine, layout, torch.arange(n, device=device), k.to(device), v.to(device))
        elif fmt.startswith("int4"):
            write_kv_int4(ref, layout, torch.arange(n), k, v)
            reshape_and_cache_int4(mine, layout, torch.arange(n, device=device), k.to(device), v.to(device))
        elif fmt.startswith("turboquant"):
            write_kv_turboquant(ref, layout, torch.arange(n), k, v)
            reshape_and_cache_turboquant(mine, layout, torch.arange(n, device=device), k.to(device), v.to(device))
        else:
            kg, vg = global_scale(k), global_scale(v)
            write_kv_nvfp4(ref, layout, torch.arange(n), k, v, kg, vg)
            reshape_and_cache_nvfp4(mine, layout, torch.arange(n, device=device), k.to(device), v.to(device), kg, vg)
        if (mine.cpu() != ref).float().mean() > 0.01:
            bad.append(f"{fmt} (write path)")
    return bad


def _write_path_matches(cache, layout, gen, device) -> bool:
    """On a GPU, the Triton write path stores every value within one step of the format of the torch write
    path's (under the interpreter, fp8 conversions are off for a few values in a hundred, so this runs on a GPU)."""
    from .paged_attention import dequantize_cache, reshape_and_cache, write_kv

    kv_heads, d, mode = cache.shape[2], layout.head_dim, layout.mode
    n = cache.shape[0] * cache.shape[1]
    k = torch.randn(n, kv_heads, d, generator=gen) * 3
    v = torch.randn(n, kv_heads, d, generator=gen) * 3
    ref, mine = torch.zeros_like(cache), torch.zeros_like(cache, device=device)
    write_kv(ref, layout, torch.arange(n), k, v, 0.05, 0.05)
    reshape_and_cache(mine, layout, torch.arange(n, device=device), k.to(device), v.to(device), 0.05, 0.05)
    rel = {0: 2**-7, 5: 2**-10, 1: 2**-3, 2: 2**-2, 3: 0.0, 4: 2**-3}[mode]
    for a, b in zip(dequantize_cache(mine.cpu(), layout, 0.05, 0.05), dequantize_cache(ref, layout, 0.05, 0.05),
                    strict=True):
        amax = b.abs().amax(-1, keepdim=True)
        floor = {1: 2**-9 * 0.05, 2: 2**-16 * 0.05, 3: amax / 127, 4: amax / 448 * 2**-9}.get(mode, 0.0)
        if not ((a - b).abs() <= (b.abs() * rel + floor) * 1.0001).all():
            return False
    return True


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


def validate_step(model, fmt_name: str, batch: int, context: int, layers: int, device: torch.device,
                  samples: int = 5, warmup: int = 2) -> dict:
    """A synthetic decode step of `model`'s shapes on one rank: for each of `layers` layers, every weight GEMV
    (dense matrices, and the MoE experts one token touches) and the paged decode attention of `batch` sequences
    of `context` tokens in `fmt_name`, replayed as one CUDA graph where it can be captured (as the engines run
    their decode steps). Returns the measured median seconds and the bytes read."""
    from kvplan.sizing.model_tensors import model_tensors

    from .gemv import gemv, quantize_fp8_weights
    from .layouts import slot_layout

    mats = []
    per_layer_bytes = 0
    for t in model_tensors(model):
        if not t.is_matrix or t.part in ("embed", "lm_head", "extra"):
            continue
        per_layer = t.count // model.num_layers if t.part != "expert" else (
            t.count // (model.num_layers - model.moe.first_dense_layers) // model.moe.num_experts
            * min(model.moe.num_experts, model.moe.experts_per_token * batch))
        for _ in range(max(1, per_layer) if t.count else 0):
            mats.append((t.out_dim, t.in_dim))
    fp8 = model.weight_dtype.startswith("fp8")
    weights = []
    for out_dim, in_dim in mats:
        w = torch.randn(out_dim, in_dim, dtype=torch.bfloat16, device=device) / math.sqrt(in_dim)
        weights.append(quantize_fp8_weights(w) if fp8 else (w, None))
        per_layer_bytes += out_dim * in_dim * (1 if fp8 else 2)
    x = {k: torch.randn(batch, k, dtype=torch.bfloat16, device=device) for _, k in mats}
    layout = slot_layout(fmt_name if fmt_name != "auto" else "bfloat16", model.head_dim)
    blocks_per_seq = -(-context // BLOCK)
    cache = _random_cache((batch * blocks_per_seq, BLOCK, model.num_kv_heads), layout, device)
    table = torch.arange(batch * blocks_per_seq, dtype=torch.int32, device=device).view(batch, blocks_per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, model.num_heads, model.head_dim, dtype=torch.bfloat16, device=device)
    decode, _ = _decode_call(layout, q, cache, table, lens, device)
    gemv_out = {w.shape: torch.empty(batch, w.shape[0], dtype=torch.bfloat16, device=device) for w, _ in weights}

    def step() -> None:
        for _ in range(layers):
            for w, sc in weights:
                gemv(x[w.shape[1]], w, sc, out=gemv_out[w.shape])
            decode()

    flush = flush_reader(2 * 50 * MB, device)
    for _ in range(max(1, warmup)):
        step()
    times = sorted(time_samples(as_graph(step, device), flush, samples, device))
    kv_bytes = decode_bytes(layout, batch, context, model.num_kv_heads)
    return {"seconds": _quantile(times, 0.5), "weight_bytes": layers * per_layer_bytes,
            "kv_bytes": layers * kv_bytes, "layers": layers, "gemv_calls": layers * len(mats)}


def decode_bytes(layout, seqs: int, context: int, kv_heads: int) -> int:
    """The KV bytes one decode call reads for `seqs` sequences of `context` tokens: every token's slot of every KV
    head; for KIVI the quantized tokens' slots plus the full-precision residual window (K and V, in bf16) of the
    newest tokens, which the cache's slots do not hold."""
    if layout.fmt.family == "kivi":
        from .kivi_attention import _params, quantized_len

        _, g, r = _params(layout)
        nq = quantized_len(context, g, r)
        return seqs * kv_heads * (nq * layout.slot_bytes + (context - nq) * 2 * layout.head_dim * 2)
    return seqs * context * kv_heads * layout.slot_bytes


def _decode_call(layout, q, cache, table, lens, device):
    """The decode kernel for `layout`, as a zero-argument callable that only launches kernels (its split buffers
    and output kept in a workspace from call to call, its tables built before), and the KV bytes it reads."""
    family = layout.fmt.family
    ws: dict = {}
    seqs, context, kv_heads = q.shape[0], int(lens.max()), cache.shape[2]
    moved = decode_bytes(layout, seqs, context, kv_heads)
    if family == "per_token_head" and layout.fmt.name.startswith("int4"):
        from .int4_attention import paged_decode_int4
        return (lambda: paged_decode_int4(q, cache, layout, table, lens, workspace=ws)), moved
    if family == "nvfp4":
        from .nvfp4_attention import paged_decode_nvfp4
        cache.view(-1, layout.slot_bytes)[:, :] &= 0x77
        return (lambda: paged_decode_nvfp4(q, cache, layout, table, lens, 1e-2, 1e-2, workspace=ws)), moved
    if family == "turboquant":
        from .turboquant_attention import paged_decode_turboquant
        return (lambda: paged_decode_turboquant(q, cache, layout, table, lens, workspace=ws)), moved
    if family == "kivi":
        from .kivi_attention import make_residual, paged_decode_kivi
        res = make_residual(q.shape[0], layout, cache.shape[2]).to(device)
        return (lambda: paged_decode_kivi(q, cache, res, layout, table, lens, workspace=ws)), moved
    from .paged_attention import paged_decode
    return (lambda: paged_decode(q, cache, layout, table, lens, workspace=ws)), moved
