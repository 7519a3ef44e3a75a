"""Rich tables and JSON for the CLI. The only module that formats numbers for people."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, is_dataclass
from typing import Any, Iterable, Optional, Sequence

from rich.console import Console
from rich.table import Table

GiB = 2**30


def console() -> Console:
    return Console(highlight=False)


def print_json(obj: Any) -> None:
    def default(o):
        if is_dataclass(o):
            return asdict(o)
        if hasattr(o, "model_dump"):
            return o.model_dump()
        raise TypeError(type(o).__name__)

    sys.stdout.write(json.dumps(obj, indent=2, default=default) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# Number formats


def sci(x: Optional[float], digits: int = 3) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.{digits - 1}e}".replace("e+0", "e").replace("e+", "e")


def gb(x: float) -> str:
    """Decimal gigabytes: how bandwidth is quoted (1 GB/s = 1e9 B/s)."""
    return f"{x / 1e9:,.3g} GB" if x < 1e12 else f"{x / 1e9:,.0f} GB"


def gib(x: float) -> str:
    return f"{x / GiB:,.2f} GiB"


def num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def pct(x: float) -> str:
    return f"{x * 100:.1f}%" if abs(x) >= 0.1 else f"{x * 100:.2f}%"


def tokens(x: Optional[float]) -> str:
    if x is None:
        return "never"
    return f"{x:,.0f} ({sci(x)})"


# ----------------------------------------------------------------------------------------------------------------
# crossover


def crossover_tables(results: Sequence, model, gpu) -> None:
    con = console()
    r0 = results[0]
    convention = ("every parameter once (--weight-read all)" if r0.weight_read == "all"
                  else "what a step streams (--weight-read streamed): no input-embedding table, touched experts only")
    title = f"{model.name}  TP {r0.tp}  weights {r0.weight_dtype}"
    con.print(f"[bold]{title}[/bold]  weight read per step: {convention}")
    con.print(f"weights held per rank: {gib(r0.weight_bytes_held)}   read per step at batch 1: "
              f"{gb(r0.weight_bytes)} ({sci(r0.weight_bytes, 4)} B)")

    t = Table(title="Crossover: where the KV read overtakes the weight read (one sequence, batch 1)",
              title_justify="left")
    t.add_column("KV dtype")
    t.add_column("B/token/KV head" if not model.is_mla else "B/token/layer (latent)", justify="right")
    t.add_column("bits/elem", justify="right")
    t.add_column("KV B/token (rank)", justify="right")
    t.add_column(f"vs {r0.baseline_dtype}", justify="right")
    t.add_column("N* tokens", justify="right")
    t.add_column("kept in model dtype", justify="left")
    for r in results:
        nstar = tokens(r.crossover_tokens)
        if r.crossover_tokens is None and r.crossover_batch:
            nstar = f"never at batch 1 (≥{r.crossover_batch:,.1f} full-window seqs)"
        t.add_row(r.dtype, num(r.kv_bytes_per_token_per_kv_head_layer),
                  "-" if r.bits_per_element is None else f"{r.bits_per_element:.2f}", num(r.kv_bytes_per_token),
                  f"{r.kv_ratio:.2f}x", nstar, _layer_list(r.skip_layers))
    con.print(t)

    if not r0.operating_points:
        return
    timed = r0.operating_points[0].step_ms is not None
    t = Table(title="Operating points: bytes one decode step moves on one rank"
              + (f", roofline on {gpu.name} ({gpu.peak_bandwidth_tbps} TB/s peak)" if timed else ""),
              title_justify="left")
    for col, just in [("batch x context", "left"), ("KV dtype", "left"), ("weights", "right"), ("KV", "right"),
                      ("step", "right"), (f"saving vs {r0.baseline_dtype}", "right"), ("bound", "left")]:
        t.add_column(col, justify=just)
    moe = model.moe is not None
    if moe:
        t.add_column("N* at batch", justify="right")
    if timed:
        t.add_column("step ms", justify="right")
    n_points = len(r0.operating_points)
    for i in range(n_points):
        for j, r in enumerate(results):
            p = r.operating_points[i]
            row = [f"{p.batch} x {p.context:,}" if j == 0 else "", r.dtype, gb(p.weight_bytes), gb(p.kv_bytes),
                   gb(p.step_bytes), pct(p.saving), "KV" if p.bound == "kv" else "weights"]
            if moe:
                row.append(tokens(p.crossover_tokens))
            if timed:
                row.append(f"{p.step_ms:.3f}" + (" (compute)" if p.limiter == "compute" else ""))
            t.add_row(*row, end_section=(j == len(results) - 1 and i < n_points - 1))
    con.print(t)
    for note in dict.fromkeys(n for r in results for n in r.notes):
        con.print(f"note: {note}")
    if timed:
        con.print("step ms: roofline max(bytes / peak bandwidth, FLOPs / peak dense compute); uncalibrated")


def _layer_list(xs: Sequence[int]) -> str:
    if not xs:
        return "-"
    from .engine import _ranges

    return f"layers {_ranges(xs)}"


# ----------------------------------------------------------------------------------------------------------------
# capacity


def capacity_table(results: Sequence, model, gpu) -> None:
    con = console()
    r0 = results[0]
    con.print(f"[bold]{model.name}[/bold] on {gpu.name if gpu else 'a GPU'}  TP {r0.tp}  "
              f"weights {r0.weight_dtype}  max_model_len {r0.max_model_len:,}  block_size {r0.block_size}")
    t = Table(title="Budget per rank (vLLM): ceil(total x utilization) - weights - activation allowance",
              title_justify="left")
    t.add_column("")
    t.add_column("", justify="right")
    t.add_row("total memory", f"{gib(r0.total_bytes)}  ({r0.memory_source})")
    t.add_row(f"x gpu_memory_utilization {r0.gpu_memory_utilization:g}", gib(r0.requested_bytes))
    t.add_row("- weights", gib(r0.weight_bytes))
    t.add_row("- activation allowance", gib(r0.activation_bytes))
    t.add_row("= KV cache pool", gib(r0.available_kv_bytes))
    con.print(t)

    t = Table(title=f"KV cache per dtype, sequences of {r0.max_model_len:,} tokens", title_justify="left")
    for col in ["KV dtype", "B/token (rank)", "page B", "blocks", "token slots", "GPU KV cache size (tokens)",
                "max concurrency", "kept in model dtype"]:
        t.add_column(col, justify="left" if col in ("KV dtype", "kept in model dtype") else "right")
    for r in results:
        if not r.fits:
            t.add_row(r.dtype, num(r.kv_bytes_per_token), f"{r.bytes_per_block:,}", f"{r.num_blocks:,}",
                      f"{r.token_slots:,}", "-", "does not fit", _layer_list(r.skip_layers))
            continue
        t.add_row(r.dtype, num(r.kv_bytes_per_token), f"{r.bytes_per_block:,}", f"{r.num_blocks:,}",
                  f"{r.token_slots:,}", f"{r.kv_tokens:,}", f"{r.max_concurrency:.2f}x", _layer_list(r.skip_layers))
    con.print(t)
    con.print("page B: bytes of one block across the layers of a KV-cache group; blocks include vLLM's null block")
    for note in dict.fromkeys(n for r in results for n in r.notes):
        con.print(f"note: {note}")
    for r in results:
        if not r.fits:
            con.print(f"[yellow]{r.dtype}: {r.problem}[/yellow]")


def capacity_listing(rows: Sequence[tuple[str, Any]], gpu, tp: int, dtype: str) -> None:
    con = console()
    t = Table(title=f"KV capacity on {gpu.name if gpu else 'the given memory'}, TP {tp}, KV dtype {dtype}",
              title_justify="left")
    for col in ["model", "weights/rank", "KV pool", "B/token", "max_model_len", "blocks", "max concurrency", "fits"]:
        t.add_column(col, justify="left" if col in ("model", "fits") else "right")
    for key, r in rows:
        if isinstance(r, str):
            t.add_row(key, "-", "-", "-", "-", "-", "-", f"[red]no[/red]: {r}")
            continue
        fits = "yes" if r.fits else (
            f"[red]no[/red]: longest {r.longest_fitting_len:,}" if r.longest_fitting_len else "[red]no[/red]: weights")
        t.add_row(key, gib(r.weight_bytes), gib(r.available_kv_bytes) if r.available_kv_bytes > 0 else "-",
                  num(r.kv_bytes_per_token), f"{r.max_model_len:,}", f"{r.num_blocks:,}",
                  f"{r.max_concurrency:.2f}x" if r.fits else "-", fits)
    con.print(t)


# ----------------------------------------------------------------------------------------------------------------
# catalogs


def formats_table(rows: Iterable[dict], head_dim: int, mla_dims: tuple[int, int]) -> None:
    con = console()
    t = Table(title=f"KV cache formats: bytes per token per KV head (K+V) at head_dim {head_dim}; "
              f"MLA latent {mla_dims[0]}+{mla_dims[1]} per token per layer", title_justify="left")
    for col in ["name", "family", "engines", "K B", "V B", "K+V B", "bits/elem", "MLA B", "default skip",
                "layout"]:
        t.add_column(col, justify="right" if col.endswith("B") or col == "bits/elem" else "left",
                     overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["family"], ",".join(r["engines"]), _opt(r["k_bytes"]), _opt(r["v_bytes"]),
                  _opt(r["bytes_per_token_per_kv_head"]), _opt(r["bits_per_element"], ".3g"),
                  _opt(r["mla_bytes_per_token"]), r["default_skip"], r["description"])
    con.print(t)


def _opt(x, fmt: str = ",") -> str:
    if x is None:
        return "-"
    return format(x, fmt) if fmt != "," else num(x)


def models_table(rows: Iterable[dict]) -> None:
    con = console()
    t = Table(title="Models", title_justify="left")
    for col in ["name", "params", "layers", "heads q/kv", "head dim", "attention", "MoE", "weights", "context",
                "KV B/token (model dtype)"]:
        t.add_column(col, justify="right" if col in ("params", "layers", "head dim", "context",
                                                      "KV B/token (model dtype)") else "left")
    for r in rows:
        t.add_row(r["key"], f"{r['params'] / 1e9:,.2f}B", str(r["layers"]), r["heads"], r["head_dim"],
                  r["attention"], r["moe"], r["weights"], f"{r['context']:,}", num(r["kv_bytes_per_token"]))
    con.print(t)


def gpus_table(gpus: Iterable) -> None:
    con = console()
    t = Table(title="GPUs", title_justify="left")
    for col in ["name", "aliases", "memory (CUDA)", "nvidia-smi MiB", "TB/s", "bf16 TF", "fp8 TF", "fp4 TF",
                "L2 MB", "SMs"]:
        t.add_column(col, justify="left" if col in ("name", "aliases") else "right")
    for g in gpus:
        mem = f"{g.memory_total_gib:.2f} GiB" + ("" if g.cuda_total_gib else " est.")
        tf = g.dense_tflops
        t.add_row(g.name, ", ".join(g.aliases), mem, _opt(g.smi_total_mib), f"{g.peak_bandwidth_tbps:g}",
                  _opt(tf.get("bf16"), "g"), _opt(tf.get("fp8"), "g"), _opt(tf.get("fp4"), "g"),
                  _opt(g.l2_mb, "g"), _opt(g.sm_count))
    con.print(t)


def spec_detail(spec, extra: dict) -> None:
    con = console()
    t = Table(title=spec.name, title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    data = spec.model_dump(exclude={"notes", "sources"})
    for k, v in {**data, **extra}.items():
        if v in (None, {}, (), []):
            continue
        t.add_row(k, _fmt_value(v))
    con.print(t)
    for n in spec.notes:
        con.print(f"note: {n}")
    for s in spec.sources:
        con.print(f"source: {s}")


def _fmt_value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:g}" if not math.isfinite(v) or abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt_value(x)}" for k, x in v.items() if x not in (None, False))
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)
