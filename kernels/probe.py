"""The kernel probe (`kvplan measure --probe`): on a CUDA GPU, the bf16 and fp8 paged decode kernels timed over
their tile sizes, warps, pipeline stages and context splits at one large shape (64 sequences x 8 KV heads x 128
head_dim x 4,096 tokens: 1 GiB of bf16 cache, 512 MiB of fp8), and the L2 flush methods compared on the fastest
bf16 configuration, within a time budget; what it found is written as JSON: every configuration's time and
achieved bytes per second, the fastest per format, the flush comparison.

The sweep starts from the launcher's defaults (64-token tiles, 4 warps, 3 stages, the planned splits), then varies
one setting at a time, then two, and so on, so that a budget that runs out leaves the most telling configurations
timed. Each configuration's answer is compared with the default configuration's: one that disagrees is kept in the
file but never chosen as the fastest.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from kvplan.errors import error_line

PROBE_FORMATS = ("bfloat16", "fp8_e4m3")
SEQS, KV_HEADS, HEADS, HEAD_DIM, CONTEXT = 64, 8, 32, 128, 4096
# each setting's values, the launcher's default first; splits None: the launcher's own plan (whole waves of SMs at
# the kernel's occupancy)
TILES = (64, 128, 32, 16)
WARPS = (4, 8)
STAGES = (3, 2, 4)
SPLITS = (None, 1, 2, 3, 4, 8)
FLUSH_METHODS = ("read", "write", "none")
BUDGET_S = 90.0


@dataclass(frozen=True)
class Config:
    fmt: str
    tile: int
    num_warps: int
    num_stages: int
    splits: Optional[int]  # None: the launcher's plan


def configurations(formats: tuple[str, ...] = PROBE_FORMATS, tiles: tuple[int, ...] = TILES,
                   warps: tuple[int, ...] = WARPS, stages: tuple[int, ...] = STAGES,
                   splits: tuple[Optional[int], ...] = SPLITS) -> list[Config]:
    """Every configuration of the sweep, in the order it is timed: by how many settings differ from the defaults
    (each tuple's first value), then in the tuples' order; the formats interleaved."""
    grid = list(itertools.product(tiles, warps, stages, splits))
    defaults = (tiles[0], warps[0], stages[0], splits[0])
    grid.sort(key=lambda g: sum(a != b for a, b in zip(g, defaults)))  # stable: the tuples' order within a rank
    return [Config(fmt, *g) for g in grid for fmt in formats]


def sweep(configs: list[Config], measure: Callable[[Config], dict], moved: Callable[[Config], int],
          budget_s: float = BUDGET_S, clock: Callable[[], float] = time.monotonic) -> dict:
    """Time `configs` in order with `measure` (a configuration -> {"seconds": ..., "matches": whether its answer
    agrees with the default configuration's, and anything else worth keeping}) until `budget_s` seconds have gone
    by on `clock`; a configuration that raises (too much shared memory, say) is kept with its error. Returns every
    row (with the bytes `moved` and bytes per second), the fastest agreeing configuration per format, and whether
    the budget cut the sweep short."""
    start = clock()
    rows = []
    stopped = False
    for c in configs:
        if clock() - start >= budget_s:
            stopped = True
            break
        row = asdict(c)
        try:
            row.update(measure(c))
            row["bytes"] = moved(c)
            row["bytes_per_s"] = row["bytes"] / row["seconds"]
        except Exception as e:  # noqa: BLE001 - a configuration that cannot run is a finding, not a failure
            row["error"] = error_line(e)
        rows.append(row)
    best = {}
    for row in rows:
        if "seconds" not in row or row.get("matches") is False:
            continue
        if row["fmt"] not in best or row["seconds"] < best[row["fmt"]]["seconds"]:
            best[row["fmt"]] = row
    return {"configurations": rows, "best": best, "planned": len(configs), "timed": len(rows),
            "stopped_at_budget": stopped, "budget_s": budget_s, "elapsed_s": clock() - start}


def compare_flushes(measure: Callable[[str], float], moved: int,
                    methods: tuple[str, ...] = FLUSH_METHODS) -> dict:
    """The same call timed after each L2 flush method (`measure(method)` -> seconds): read (a read of a buffer
    larger than L2, which leaves clean lines), write (zeroing it, which leaves dirty lines written back during the
    next call) and none (the call's own bytes partly still in L2)."""
    out = {}
    for m in methods:
        try:
            t = measure(m)
            out[m] = {"seconds": t, "bytes_per_s": moved / t}
        except Exception as e:  # noqa: BLE001
            out[m] = {"error": error_line(e)}
    return out


# ----------------------------------------------------------------------------------------------------------------
# On the GPU


def _cache(fmt: str, device):
    """The probe's cache in `fmt`, K and V drawn from a normal distribution (so that every configuration's answer
    can be compared), a block table of consecutive blocks, every sequence CONTEXT tokens long, bf16 queries."""
    import torch

    from .bench import BLOCK
    from .layouts import slot_layout

    layout = slot_layout(fmt, HEAD_DIM)
    dtype = {"bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}[fmt]
    width = layout.slot_bytes // dtype.itemsize
    assert width == 2 * HEAD_DIM, f"{fmt}: the probe builds plain K and V slots"
    blocks = SEQS * CONTEXT // BLOCK
    gen = torch.Generator(device=device).manual_seed(0)
    values = torch.randn(blocks, BLOCK, KV_HEADS, width, dtype=torch.bfloat16, device=device, generator=gen)
    cache = values.to(dtype).view(torch.uint8)
    del values
    table = torch.arange(blocks, dtype=torch.int32, device=device).view(SEQS, CONTEXT // BLOCK)
    lens = torch.full((SEQS,), CONTEXT, dtype=torch.int32, device=device)
    q = torch.randn(SEQS, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device, generator=gen)
    return layout, cache, table, lens, q


def run_probe(device, flush_bytes: int, budget_s: float = BUDGET_S, samples: int = 10,
              progress: Callable[[str], None] = lambda _: None) -> dict:
    """The sweep and the flush comparison on `device` (a CUDA device)."""
    import torch

    from . import common
    from .bench import as_graph, decode_bytes, flush_reader, time_samples
    from .paged_attention import paged_decode

    data = {fmt: _cache(fmt, device) for fmt in PROBE_FORMATS}
    flushes = {"read": flush_reader(flush_bytes, device), "none": lambda: None}
    scratch = torch.empty(max(4, flush_bytes), dtype=torch.uint8, device=device)
    flushes["write"] = scratch.zero_
    reference: dict = {}

    def call(c: Config, ws: dict):
        layout, cache, table, lens, q = data[c.fmt]
        # per-tensor fp8 scales of 1: the values are stored as they are
        return lambda: paged_decode(q, cache, layout, table, lens, 1.0, 1.0, tile=c.tile, splits=c.splits,
                                    workspace=ws, num_warps=c.num_warps, num_stages=c.num_stages)

    def timed(c: Config, flush: str = "read") -> tuple[float, dict]:
        ws: dict = {}
        fn = call(c, ws)
        before = set(common._OCCUPANCY)
        out = fn()
        first = set(ws)
        fn()  # the second call plans its splits with the occupancy the first one reported
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        learned = [common._OCCUPANCY[k] for k in set(common._OCCUPANCY) - before]
        # the split buffers the second call (the one timed) added, or the first call's where it reused them
        used = max(k[1] for k in (set(ws) - first or first) if k[0] == "split") // SEQS
        times = sorted(time_samples(as_graph(fn, device), flushes[flush], samples, device))
        info = {"splits_used": used}
        if learned:
            info["blocks_per_sm"] = learned[0]
        return times[len(times) // 2], {"out": out, **info}

    def measure(c: Config) -> dict:
        progress(f"{c.fmt} tile {c.tile}, {c.num_warps} warps, {c.num_stages} stages, "
                 f"{'planned' if c.splits is None else c.splits} splits")
        seconds, info = timed(c)
        out = info.pop("out").float()
        if c.fmt not in reference:
            reference[c.fmt] = out.clone()
        ok = bool(torch.isfinite(out).all()) and torch.allclose(out, reference[c.fmt], atol=2e-2, rtol=2e-2)
        return {"seconds": seconds, "matches": ok, **info}

    def moved(c: Config) -> int:
        return decode_bytes(data[c.fmt][0], SEQS, CONTEXT, KV_HEADS)

    result = sweep(configurations(), measure, moved, budget_s)
    best = result["best"].get("bfloat16")
    if best is not None:
        c = Config(best["fmt"], best["tile"], best["num_warps"], best["num_stages"], best["splits"])
        progress("L2 flush methods")
        result["flush"] = {"configuration": asdict(c),
                           **compare_flushes(lambda m: timed(c, m)[0], moved(c))}
    result["shape"] = {"seqs": SEQS, "kv_heads": KV_HEADS, "heads": HEADS, "head_dim": HEAD_DIM,
                       "context": CONTEXT, "flush_bytes": flush_bytes, "samples": samples}
    return result
