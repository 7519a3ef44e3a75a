"""Rich tables and JSON for the CLI. The only module that formats numbers for people."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from kvplan.units import GiB

if TYPE_CHECKING:  # rich is imported where a table is drawn, so --json output never loads it
    from rich.console import Console
    from rich.table import Table as _RichTable



def Table(**kwargs) -> _RichTable:  # noqa: N802 - one look for every table
    from kvplan.app.text_table import PlainTable, plain_output

    if plain_output():  # a pipe or a file: drawn without importing rich (kvplan.app.text_table), the same characters
        return PlainTable(**kwargs)  # type: ignore[return-value]
    from rich import box
    from rich.table import Table as _RichTable

    kwargs.setdefault("box", box.SIMPLE_HEAD)
    kwargs.setdefault("pad_edge", False)
    return _RichTable(**kwargs)


def console() -> Console:
    from kvplan.app.text_table import PlainConsole, plain_output

    if plain_output():
        return PlainConsole()  # type: ignore[return-value]
    from rich.console import Console

    # emoji=False: no text kvplan prints means an emoji code, and resolving ':name:' would load rich's emoji table
    return Console(highlight=False, emoji=False)


def print_table(con: Console, table: _RichTable, keys: int = 1) -> None:
    """Print a table within the console's width without cutting any cell short.

    Right-aligned columns hold numbers: they never wrap and are never truncated. Other columns hold text, which
    may wrap between words but never inside one. When the table is wider than the console, the text columns give
    up their width first; when even the narrowest such layout does not fit, the columns after the first `keys`
    (the row labels) continue in a second table below the first, and a third below that, each repeating the row
    labels under the one title, so that every line fits (only a single cell wider than the console can make one longer).
    """
    import copy

    from kvplan.app.text_table import PlainTable

    if isinstance(table, PlainTable):
        lines = table.render(con.width)
        if lines is not None:
            sys.stdout.write("".join(ln + "\n" for ln in lines))
            return
        from rich.console import Console as _Console

        table, con = table.to_rich(), _Console(highlight=False, emoji=False, width=con.width)
    for col in table.columns:
        if col.justify == "right":
            col.no_wrap = True

    def part(indices: list[int], first: bool) -> _RichTable:
        sub = copy.copy(table)
        sub.columns = []
        for k, i in enumerate(indices):
            col = copy.copy(table.columns[i])
            col._index = k
            sub.columns.append(col)
        if not first:
            sub.title = None
        return sub

    whole = part(list(range(len(table.columns))), True)
    needed = _fit(con, whole)
    if needed > con.width and len(table.columns) <= keys + 1:
        needed = _fit(con, whole, fold_words=True)
    if needed <= con.width or len(table.columns) <= keys + 1:
        return _print_at(con, whole, needed)
    keys = max(1, min(keys, len(table.columns) - 1))
    rest = list(range(keys, len(table.columns)))
    if table.title:  # the title spans the console, not the first part's width
        con.print(table.title)
    first = False
    while rest:
        take = [rest[0]]
        for i in rest[1:]:
            if _fit(con, part([*range(keys), *take, i], first)) > con.width:
                break
            take.append(i)
        sub = part([*range(keys), *take], first)
        needed = _fit(con, sub)
        if needed > con.width:  # one column beside the labels does not fit: its words (and the labels') fold
            needed = _fit(con, sub, fold_words=True)
        _print_at(con, sub, needed)
        rest, first = rest[len(take):], False


def _fit(con: Console, table: _RichTable, fold_words: bool = False) -> int:
    """Set the widths of a table's text columns for the console (numbers whole, text wrapped between words, the
    narrowest text column widened first); the width the table then takes. A column made to fold (a path, a list)
    breaks a word that does not fit, and so does every text column with fold_words; a number never breaks."""
    cols = table.columns
    for col in cols:
        col.width = None
    unbounded = con.options.update_width(10**6)
    ranges = [table._measure_column(con, unbounded, col) for col in cols]
    room = con.width - table._extra_width
    if sum(r.maximum for r in ranges) <= room:
        return sum(r.maximum for r in ranges) + table._extra_width
    widths = [r.maximum if col.no_wrap else r.minimum for col, r in zip(cols, ranges)]
    excess = sum(widths) - room
    for i, col in enumerate(cols):  # a text column that may fold a word (a path, a list) gives it up, numbers kept
        if excess > 0 and (col.overflow == "fold" or fold_words) and not col.no_wrap:
            col.overflow = "fold"
            cut = min(excess, widths[i] - _fold_floor(col) - table._get_padding_width(i))
            if cut > 0:
                widths[i] -= cut
                excess -= cut
    wrap = [i for i, col in enumerate(cols) if not col.no_wrap and ranges[i].maximum > widths[i]]
    spare = room - sum(widths)
    while spare > 0 and wrap:
        # widen the narrowest text column that still wraps, one character at a time
        i = min(wrap, key=lambda k: widths[k])
        widths[i] += 1
        spare -= 1
        if widths[i] >= ranges[i].maximum:
            wrap.remove(i)
    for i, col in enumerate(cols):
        col.width = max(widths[i] - table._get_padding_width(i), 1)
    return sum(widths) + table._extra_width


_NUMBER = re.compile(r"[-+~]?\d[\d,._]*(?:e[-+]?\d+)?[x%]?")


def _fold_floor(col) -> int:
    """The narrowest a folding text column may be: its longest number stays whole (and 8 characters at least)."""
    return max([8] + [len(m) for cell in col._cells for m in _NUMBER.findall(str(cell))])


def _print_at(con: Console, table: _RichTable, needed: int) -> None:
    """Print a table laid out by _fit; one whose narrowest layout is wider than the console prints at the width it
    needs (a line longer than the terminal is better than a lost digit)."""
    if needed <= con.width:
        con.print(table)
        return
    width = con.width
    con.width = needed
    try:
        con.print(table)
    finally:
        con.width = width


def print_json(obj: Any) -> None:
    import json

    def default(o):
        if is_dataclass(o):
            return asdict(o)
        if hasattr(o, "model_dump"):
            return o.model_dump()
        raise TypeError(type(o).__name__)

    sys.stdout.write(json.dumps(_whole_numbers(obj), indent=2, default=default) + "\n")


def _whole_numbers(obj: Any) -> Any:
    """Byte counts computed in floating point print as integers when they are whole."""
    if is_dataclass(obj):
        obj = asdict(obj)
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: _whole_numbers(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_whole_numbers(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------------------------
# Number formats


def sci(x: Optional[float], digits: int = 3) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.{digits - 1}e}".replace("e+0", "e").replace("e+", "e")


def gb(x: float, unit: bool = True) -> str:
    """Decimal gigabytes, 4 significant digits: how bandwidth is quoted (1 GB/s = 1e9 B/s)."""
    s = f"{x / 1e9:#,.4g}".rstrip(".") if x < 1e13 else f"{x / 1e9:,.0f}"
    return s + " GB" if unit else s


def gib(x: float) -> str:
    return f"{x / GiB:,.2f} GiB"


def num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def pct(x: float) -> str:
    return f"{x * 100:.1f}%" if abs(x) >= 0.1 else f"{x * 100:.2f}%"


def tokens(x: Optional[float]) -> str:
    if x is None:
        return "never"
    return f"{x:,.0f}"


# ----------------------------------------------------------------------------------------------------------------
# crossover


def crossover_tables(results: Sequence, model, gpu) -> None:
    con = console()
    r0 = results[0]
    convention = ("every parameter once (--weight-read all)" if r0.weight_read == "all"
                  else "what a step streams (--weight-read streamed): no input-embedding table"
                  + (", touched experts only" if model.moe else ""))
    title = f"{model.name}  TP {r0.tp}  weights {r0.weight_dtype}"
    con.print(f"[bold]{title}[/bold]  weight read per step: {convention}")
    con.print(f"weights held per rank: {gib(r0.weight_bytes_held)}   read per step at batch 1: "
              f"{gb(r0.weight_bytes)} ({sci(r0.weight_bytes, 4)} B)")

    t = Table(title="Crossover N*: cached tokens of one sequence at which the KV read equals the weight read",
              title_justify="left")
    t.add_column("KV dtype", no_wrap=True)
    t.add_column("bits/elem", justify="right", no_wrap=True)
    t.add_column("KV B/token", justify="right", no_wrap=True)
    t.add_column(f"vs {_dname(r0.baseline_dtype, model)}", justify="right", no_wrap=True)
    t.add_column("N*", justify="right", no_wrap=True)
    any_skip = any(r.skip_layers for r in results)
    if any_skip:
        t.add_column("skip layers", justify="left")
        t.add_column("N* if none skipped", justify="right", no_wrap=True)
    for r in results:
        nstar = tokens(r.crossover_tokens)
        if r.crossover_tokens is None and r.crossover_batch:
            nstar = f"never at batch 1 (>= {r.crossover_batch:,.1f} full-window sequences)"
        row = [_dname(r.dtype, model), "-" if r.bits_per_element is None else f"{r.bits_per_element:.2f}",
               num(r.kv_bytes_per_token), f"{r.kv_ratio:.2f}x", nstar]
        if any_skip:
            row += [_layer_list(r.skip_layers), tokens(r.crossover_tokens_without_skip) if r.skip_layers else ""]
        t.add_row(*row)
    print_table(con, t)
    con.print("KV B/token: this rank, all layers, skip layers included. `kvplan formats` has the byte layouts.")

    if not r0.operating_points:
        return
    timed = r0.operating_points[0].step_ms is not None
    t = Table(title="Operating points: bytes one decode step moves per rank"
              + (f", roofline on {gpu.name} ({gpu.peak_bandwidth_tbps} TB/s peak)" if timed else ""),
              title_justify="left")
    for col, just in [("batch x ctx", "left"), ("KV dtype", "left"), ("weights GB", "right"), ("KV GB", "right"),
                      ("step GB", "right"), ("saving", "right"), ("bound", "left")]:
        t.add_column(col, justify=just, no_wrap=True)
    moe = model.moe is not None
    if moe:
        t.add_column("N* at batch", justify="right", no_wrap=True)
    if timed:
        t.add_column("step ms", justify="right", no_wrap=True)
    calibrated = any(p.calibrated_step_ms is not None for r in results for p in r.operating_points)
    if calibrated:
        t.add_column("expected ms", justify="right", no_wrap=True)
    n_points = len(r0.operating_points)
    for i in range(n_points):
        for j, r in enumerate(results):
            p = r.operating_points[i]
            row = [f"{p.batch:,} x {p.context:,}" if j == 0 else "", _dname(r.dtype, model), gb(p.weight_bytes, unit=False),
                   gb(p.kv_bytes, unit=False), gb(p.step_bytes, unit=False), pct(p.saving),
                   "KV" if p.bound == "kv" else "weights"]
            if moe:
                row.append(tokens(p.crossover_tokens))
            if timed:
                row.append(f"{p.step_ms:.3f}" + (" (compute)" if p.limiter == "compute" else ""))
            if calibrated:
                row.append("-" if p.calibrated_step_ms is None else f"{p.calibrated_step_ms:.3f}")
            t.add_row(*row, end_section=(j == len(results) - 1 and i < n_points - 1))
    print_table(con, t, keys=2)
    for note in dict.fromkeys(n for r in results for n in r.notes):
        con.print(f"note: {note}")
    for r in results:
        if r.breakeven_context:
            mine, theirs = _dname(r.dtype, model), _dname(r.baseline_dtype, model)
            faster = ", ".join(f"{tokens(c)} at batch {b}" for b, c in r.breakeven_context.items() if c)
            never = ", ".join(f"{b}" for b, c in r.breakeven_context.items() if not c)
            said = [f"{mine} steps faster than {theirs} from context {faster}"] if faster else []
            if never:
                said.append(f"{mine} is never faster than {theirs} at batch {never}" if not faster
                            else f"never at batch {never}")
            con.print(f"{'; '.join(said)} (expected step times; the byte crossover ignores each kernel's fixed "
                      f"costs)")
    note = f"saving: step bytes saved against {_dname(r0.baseline_dtype, model)}."
    if timed:
        note += " step ms: roofline max(bytes / peak bandwidth, FLOPs / peak dense compute), the floor."
    if calibrated:
        note += " expected ms: the step model (see the note naming its profile)."
    con.print(note)


def _dname(dtype: str, model) -> str:
    """'auto' is the model's dtype (DeepSeek-V4's fp8_ds_mla on vLLM): say which."""
    if dtype == "auto":
        return "auto (fp8_ds_mla)" if getattr(model, "compressed", None) is not None else f"auto ({model.dtype})"
    return dtype


def _layer_list(xs: Sequence[int]) -> str:
    if not xs:
        return "-"
    from kvplan.sizing.kv_cache import _ranges

    return _ranges(xs)


# ----------------------------------------------------------------------------------------------------------------
# capacity


def capacity_table(results: Sequence, model, gpu) -> None:
    con = console()
    r0 = results[0]
    par = f"TP {r0.tp}" + (f"  PP {r0.pp}" if r0.pp > 1 else "") + (f"  DCP {r0.dcp}" if r0.dcp > 1 else "") + \
        _layout_words(r0)
    where = gpu.name if gpu else (r0.gpu or "a GPU")
    con.print(f"[bold]{model.name}[/bold] on {where}  {par}  weights {r0.weight_dtype}  "
              f"max_model_len {r0.max_model_len:,}  vLLM {r0.engine_version} rules")
    t = Table(title="KV pool per rank", title_justify="left", show_header=False)
    t.add_column("")
    t.add_column("", justify="right", no_wrap=True)
    nk = r0.non_kv
    if r0.deployment.get("kv_cache_memory_bytes") is not None:
        # the pool's size was given: vLLM skips the budget; what the rest of the GPU keeps is what is left
        if r0.total_bytes:
            t.add_row(f"total memory ({r0.memory_source})", gib(r0.total_bytes))
            t.add_row("- weights", gib(nk["weights"]))
            t.add_row("- KV cache pool (--kv-cache-memory)", gib(r0.available_kv_bytes))
            t.add_row("= left for activations, graphs and the rest",
                      gib(r0.total_bytes - nk["weights"] - r0.available_kv_bytes))
        else:
            t.add_row("KV cache pool (--kv-cache-memory)", gib(r0.available_kv_bytes))
        print_table(con, t)
        _capacity_dtypes(con, results, model, r0)
        return
    t.add_row(f"total memory ({r0.memory_source})", gib(r0.total_bytes))
    t.add_row(f"ceil(x gpu_memory_utilization {r0.gpu_memory_utilization:g})", gib(r0.requested_bytes))
    if nk.get("source") == "profile":
        t.add_row("- weights (measured)" if nk.get("weights_measured") else "- weights (modelled)",
                  gib(nk["weights"]))
        t.add_row("- other non-KV memory (measured)", gib(nk["activation"]))
    elif nk.get("source") == "flat allowance":
        t.add_row("- weights", gib(nk["weights"]))
        t.add_row("- flat allowance (activations, graphs, NCCL, context)", gib(nk["activation"]))
    elif nk:
        t.add_row("- weights (and rotary caches)", gib(nk["weights"]))
        t.add_row(f"- activation peak (profile run: {nk['max_num_batched_tokens']:,} tokens, "
                  f"{min(nk['max_num_seqs'], nk['max_num_batched_tokens']):,} sampled rows)", gib(nk["activation"]))
        t.add_row("- persistent buffers (sampler state, cuBLAS)", gib(nk["persistent"]))
        t.add_row("- non-torch (libraries, NCCL, all-reduce workspaces)", gib(nk["non_torch"]))
        parts = nk.get("parts", {})
        if parts.get("cudagraph_estimate") and not parts.get("cudagraph_subtracted"):
            t.add_row(f"- CUDA-graph estimate ({gib(parts['cudagraph_estimate'])} logged, not subtracted)",
                      gib(nk["cudagraph"]))
        else:
            t.add_row("- CUDA-graph estimate", gib(nk["cudagraph"]))
    t.add_row("= KV cache pool", gib(r0.available_kv_bytes))
    print_table(con, t)
    _capacity_dtypes(con, results, model, r0)


def _layout_words(r) -> str:
    """'  DP 8  EP 8  (8 GPUs)' for a deployment with data or expert parallelism; '' for plain TP."""
    dp, ep, world = getattr(r, "dp", 1), getattr(r, "ep", 1), getattr(r, "world_size", 1)
    if dp == 1 and ep == 1:
        return ""
    return (f"  DP {dp}" if dp > 1 else "") + (f"  EP {ep}" if ep > 1 else "") + f"  ({world} GPUs)"


def _capacity_dtypes(con, results: Sequence, model, r0) -> None:
    t = Table(title=f"KV cache per dtype, sequences of {r0.max_model_len:,} tokens", title_justify="left")
    any_skip = any(r.skip_layers for r in results)
    cols = ["KV dtype", "B/token", "block B", "blocks", "token slots", "KV tokens", "concurrency"]
    dp = max(getattr(r, "dp", 1) for r in results)
    if dp > 1:  # several attention groups, each its own pool: the deployment's totals too
        cols += [f"total tokens (x{dp})", "total concurrency"]
    for col in cols + (["skip layers"] if any_skip else []):
        t.add_column(col, justify="left" if col in ("KV dtype", "skip layers") else "right",
                     no_wrap=col != "skip layers")
    for r in results:
        row = [_dname(r.dtype, model), num(r.kv_bytes_per_token), f"{r.bytes_per_block:,}", f"{r.num_blocks:,}",
               f"{r.token_slots:,}", f"{r.kv_tokens:,}" if r.fits else "-",
               f"{r.max_concurrency:,.2f}x" if r.fits else "does not fit"]
        if dp > 1:
            row += [f"{r.total_kv_tokens:,}" if r.fits else "-", f"{r.total_max_concurrency:,.2f}x" if r.fits else "-"]
        t.add_row(*row, *([_layer_list(r.skip_layers)] if any_skip else []))
    print_table(con, t)
    con.print("B/token: this rank, all layers. block B: one block across the layers of a KV-cache group. blocks: "
              "vLLM's '# GPU blocks' (null block included). KV tokens and concurrency: as vLLM's startup log "
              "prints them ('GPU KV cache size', 'Maximum concurrency')")
    for note in dict.fromkeys(n for r in results for n in r.notes):
        con.print(f"note: {note}")
    for r in results:
        if not r.fits:
            con.print(f"[yellow]{r.dtype}: {r.problem}[/yellow]")
    con.print(f"vLLM {r0.engine_version} would log (per dtype):", highlight=False)
    for r in results:
        if r.fits:
            con.print(f"  {_dname(r.dtype, model)}: " + " | ".join(r.log_lines), highlight=False)


def capacity_listing(rows: Sequence[tuple[str, Any]], gpu, tp: int, dtype: str, max_model_len) -> None:
    con = console()
    t = Table(title=f"KV capacity on {gpu.name if gpu else 'the given memory'}, TP {tp}, KV dtype {dtype}"
              + (", max_model_len auto (the longest that fits)" if max_model_len == "auto" else
                 f", max_model_len {max_model_len:,}" if max_model_len else ", each model's own context"),
              title_justify="left")
    for col in ["model", "weights/rank", "KV pool", "B/token", "context", "concurrency", "fits"]:
        t.add_column(col, justify="left" if col in ("model", "fits") else "right", no_wrap=col == "model",
                     min_width=12 if col == "fits" else None)
    for key, r in rows:
        if isinstance(r, str):
            t.add_row(key, "-", "-", "-", "-", "-", f"[red]no[/red]: {r}")
            continue
        if r.fits:
            fits = ("yes" if max_model_len in (None, "auto") or r.max_model_len == max_model_len
                    else "yes (its max context)")
        elif r.longest_fitting_len:
            fits = f"[red]no[/red]: {r.longest_fitting_len:,} tokens fit"
        else:
            fits = "[red]no[/red]: weights > budget"
        t.add_row(key, gib(r.weight_bytes), gib(r.available_kv_bytes) if r.available_kv_bytes > 0 else "-",
                  num(r.kv_bytes_per_token), f"{r.max_model_len:,}",
                  f"{r.max_concurrency:,.2f}x" if r.fits else "-", fits)
    print_table(con, t)


# ----------------------------------------------------------------------------------------------------------------
# catalogs


def formats_table(rows: Iterable[dict], head_dim: int, mla_dims: tuple[int, int]) -> None:
    con = console()
    t = Table(title=f"KV cache formats: bytes per token per KV head (K+V) at head_dim {head_dim}; "
              f"MLA latent {mla_dims[0]}+{mla_dims[1]} per token per layer", title_justify="left")
    for col in ["name", "engines", "K B", "V B", "K+V B", "bits/elem", "MLA B", "default skip layers"]:
        t.add_column(col, justify="right" if col.endswith("B") or col == "bits/elem" else "left",
                     no_wrap=col != "default skip layers")
    for r in rows:
        t.add_row(r["name"], ",".join(r["engines"]), _opt(r["k_bytes"]), _opt(r["v_bytes"]),
                  _opt(r["bytes_per_token_per_kv_head"]), _opt(r["bits_per_element"], ".3g"),
                  _opt(r["mla_bytes_per_token"]), r["default_skip"])
    print_table(con, t)
    con.print("K+V B: one token of one KV head, every scale, zero point, norm and pad byte included. MLA B: one "
              "token's latent in one layer. `kvplan formats --json` adds each layout's description.")


def _opt(x, fmt: str = ",") -> str:
    if x is None:
        return "-"
    return format(x, fmt) if fmt != "," else num(x)


def models_table(rows: Iterable[dict]) -> None:
    con = console()
    t = Table(title="Models (name: what to type; heads: query/KV x head dim; KV B/token: all layers, model dtype)", title_justify="left")
    for col in ["name", "params", "layers", "heads", "attention", "MoE k/E", "weights", "context", "KV B/token"]:
        t.add_column(col, justify="right" if col in ("params", "layers", "context", "KV B/token") else "left",
                     no_wrap=col in ("name", "params"))
    for r in rows:
        heads = r["heads"] + (f" x{r['head_dim']}" if r["head_dim"] != "-" else "")
        t.add_row(r["key"], f"{r['params'] / 1e9:,.1f}B", str(r["layers"]), heads, r["attention"], r["moe"],
                  r["weights"], f"{r['context']:,}", num(r["kv_bytes_per_token"]))
    print_table(con, t)


def gpus_table(rows: Iterable[tuple[str, Any]]) -> None:
    con = console()
    t = Table(title="GPUs (name: what to type; memory: the total vLLM budgets against, est. where CUDA's figure "
              "is unknown)", title_justify="left")
    for col in ["name", "GPU", "memory", "TB/s", "bf16 TF", "fp8 TF", "fp4 TF", "L2 MB", "SMs"]:
        t.add_column(col, justify="left" if col in ("name", "GPU") else "right", no_wrap=col in ("name", "memory"))
    for key, g in rows:
        mem = f"{g.memory_total_gib:.2f} GiB" + ("" if g.cuda_total_gib else " est.")
        tf = g.dense_tflops
        t.add_row(key, g.name, mem, f"{g.peak_bandwidth_tbps:g}", _opt(tf.get("bf16"), "g"),
                  _opt(tf.get("fp8"), "g"), _opt(tf.get("fp4"), "g"), _opt(g.l2_mb, "g"), _opt(g.sm_count))
    print_table(con, t)


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
    print_table(con, t)
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


def gate_table(report) -> None:
    from kvplan.app.gates import _fmt

    con = console()
    t = Table(title="Capacity gates", title_justify="left")
    for col in ["gate", "figure", "measured", "required", "result"]:
        t.add_column(col, justify="right" if col in ("measured", "required") else "left")
    for g in report.gates:
        for i, c in enumerate(g.checks):
            at = f" at {c.at}" if c.at else ""
            req = f"{'>=' if c.kind == 'min' else '<='} {_fmt(c.required)}"
            res = "[green]pass[/green]" if c.passed else "[red bold]FAIL[/red bold]"
            t.add_row(g.name if i == 0 else "", f"{c.figure}{at}", _fmt(c.measured), req, res,
                      end_section=i == len(g.checks) - 1)
    print_table(con, t)
    for r in report.regressions:
        at = f" at {r['at']}" if r["at"] else ""
        con.print(f"[red]regression[/red]: {r['gate']}: {r['figure']}{at} {_fmt(r['before'])} -> {_fmt(r['now'])} "
                  f"({r['regression_pct']:.1f}% worse)")
    n_fail = sum(1 for g in report.gates if not g.passed)
    con.print(f"{len(report.gates) - n_fail} of {len(report.gates)} gates passed"
              + (f"; {len(report.regressions)} regression(s)" if report.regressions else ""))


def log_table(result) -> None:
    con = console()
    cfg = ", ".join(f"{k}={v}" for k, v in result.config.items() if v not in (None, False))
    version = f" {result.version}" if result.version else " (version not stated)"
    con.print(f"[bold]{result.engine}{version}[/bold] startup log: {cfg}")
    t = Table(title="Measured by the engine, and kvplan's prediction for the same configuration",
              title_justify="left")
    for col in ["figure", "measured", "kvplan", "error"]:
        t.add_column(col, justify="left" if col == "figure" else "right")
    def fmt(v) -> str:
        if v is None:
            return "-"
        return f"{v:,.0f}" if float(v).is_integer() and abs(v) >= 100 else f"{v:,.2f}"

    for f in result.figures:
        unit = f" {f.unit}" if f.unit else ""
        err = "-" if f.error_pct is None else f"{f.error_pct:+.2f}%"
        t.add_row(f.name, fmt(f.measured) + (unit if f.measured is not None else ""),
                  fmt(f.predicted) + (unit if f.predicted is not None else ""), err)
    if result.figures:
        print_table(con, t)
    if result.failure is not None:
        con.print(f"the engine stopped: {result.failure.get('message')}")
        if result.predicted_failure:
            con.print(f"kvplan predicts it: {result.predicted_failure}")
        else:
            con.print("kvplan does not predict this failure: it plans the configuration as one that starts")
    for n in result.notes:
        con.print(f"note: {n}")


def sglang_table(results, model, gpu) -> None:
    con = console()
    r0 = results[0]
    con.print(f"[bold]{model.name}[/bold] on {gpu.name if gpu else 'the measured GPU'}  TP {r0.tp}{_layout_words(r0)}"
              f"  SGLang rules  "
              f"mem_fraction_static {r0.mem_fraction_static}")
    con.print(f"free before weights {gib(r0.free_before_load_bytes)}; weights {gib(r0.weight_bytes)}; pool "
              f"= free after weights - (1 - f) x free before = {gib(r0.available_bytes)}")
    t = Table(title=f"KV pool, context_len {r0.context_len:,}, page size {r0.page_size}", title_justify="left")
    dp = max(r.dp for r in results)
    cols = ["KV dtype", "B/token", "max_total_num_tokens", "sequences of context_len", "max_running_requests"]
    for col in cols + ([f"total tokens (x{dp})", "total sequences"] if dp > 1 else []):
        t.add_column(col, justify="left" if col == "KV dtype" else "right", no_wrap=True)
    for r in results:
        t.add_row(_dname(r.dtype, model), num(r.cell_bytes), f"{r.max_total_num_tokens:,}",
                  f"{r.max_total_num_tokens / r.context_len:.2f}", f"{r.max_running_requests:,}",
                  *([f"{r.total_kv_tokens:,}", f"{r.total_kv_tokens / r.context_len:.2f}"] if dp > 1 else []))
    print_table(con, t)
    for note in dict.fromkeys(n for r in results for n in r.notes):
        con.print(f"note: {note}")
    for r in results:
        if not r.fits:
            con.print(f"[yellow]{r.dtype}: {r.problem}[/yellow]")
    con.print("SGLang would log (per dtype):")
    for r in results:
        con.print(f"  {_dname(r.dtype, model)}: " + " | ".join(r.log_lines))


def measure_plan_table(plan, gpu) -> None:
    from kvplan.specs.calibration import MB

    con = console()
    t = Table(title=f"kvplan measure plan for {gpu.name} ({gpu.peak_bandwidth_tbps} TB/s peak, L2 flushed with "
              f"{plan.flush_bytes / MB:,.0f} MB between samples)", title_justify="left")
    for col in ["kernel family", "sizes", "samples", "bytes read"]:
        t.add_column(col, justify="left" if col != "bytes read" else "right")
    families: dict[str, list] = {}
    for i in plan.items:
        families.setdefault(i.family, []).append(i)
    for fam, items in families.items():
        sizes = ", ".join(f"{i.size_bytes / MB:,.0f}" for i in items) + " MB"
        total = sum(i.size_bytes * (i.samples + plan.warmup) for i in items)
        t.add_row(fam, sizes, f"{items[0].samples} (+{plan.warmup} warm-up)", gb(total))
    print_table(con, t)
    con.print(f"{len(plan.items)} points, {gb(plan.total_bytes)} read; expected about "
              f"{plan.expected_seconds() / 60:.1f} minutes")
    for n in plan.notes:
        con.print(f"note: {n}")


def calibration_table(profile) -> None:
    con = console()
    t = Table(title=f"Calibration of {profile.device.get('name')}: t = t0 + bytes / (eta x "
              f"{profile.peak_bandwidth_bytes_per_s / 1e12:g} TB/s)", title_justify="left")
    for col in ["kernel family", "t0 us", "eta", "GB/s at the largest size", "of peak", "of stream read"]:
        t.add_column(col, justify="left" if col == "kernel family" else "right")
    for fam, f in profile.families.items():
        big = max(f.points, key=lambda p: p[0])
        sf = profile.stream_fraction(fam)
        t.add_row(fam, f"{f.t0_s * 1e6:,.1f}", f"{f.eta:.3f}", f"{big[0] / big[1] / 1e9:,.0f}",
                  f"{profile.peak_fraction(fam):.2f}", "-" if sf is None else f"{sf:.2f}")
    print_table(con, t)
    con.print("of peak: at the largest size, against the datasheet bandwidth. of stream read: against the streaming "
              "read at the same number of bytes (interpolated between its sizes), averaged over sizes of 256 MB and "
              "more.")


def validate_table(r: dict) -> None:
    con = console()
    con.print(f"[bold]{r['model']}[/bold] decode step on {r['device']}: {r['layers']} layer{'s' if r['layers'] != 1 else ''}, batch {r['batch']} x "
              f"{r['context']:,} tokens, KV {r['dtype']}; {gb(r['weight_bytes'])} of weights and {gb(r['kv_bytes'])} "
              f"of KV read")
    t = Table(title="Measured against predicted", title_justify="left")
    for col in ["", "ms", "error vs measured"]:
        t.add_column(col, justify="left" if not col else "right")
    t.add_row("measured (median)", f"{r['measured_ms']:.3f}", "")
    for key, label in (("roofline_ms", "roofline (datasheet bandwidth)"), ("calibrated_ms", "calibrated")):
        v = r[key]
        err = "-" if v is None else f"{(v - r['measured_ms']) / r['measured_ms'] * 100:+.1f}%"
        t.add_row(label, "-" if v is None else f"{v:.3f}", err)
    print_table(con, t)
    if r["calibrated_ms"] is None:
        con.print("no calibration profile for this GPU: `kvplan measure` writes one")


def log_summary_table(data: dict) -> None:
    con = console()
    t = Table(title="Startup logs: available KV memory and weights, the log's against kvplan's", title_justify="left")
    for col in ["log", "tp", "KV log", "KV kvplan", "error", "weights error", "outcome"]:
        t.add_column(col, justify="left" if col in ("log", "outcome") else "right",
                     overflow="fold" if col == "log" else "ellipsis")
    failures = []

    def first(sentence: Optional[str]) -> str:
        return re.split(r"(?<=[a-z0-9)])[.;] ", sentence or "", maxsplit=1)[0]

    for row in data["logs"]:
        kv, w = row.get("available_kv"), row.get("weights")
        if row["status"] == "unread":
            outcome = "not read"
            failures.append(f"{row['log']}: not read: {row['problem']}")
        elif row["status"] == "failed":
            outcome = "failed, predicted" if row["failure_predicted"] else "failed, NOT predicted"
            failures.append(f"{row['log']}: the engine: {first(row['failure'])}"
                            + (f"; kvplan: {first(row['predicted_failure'])}" if row["predicted_failure"] else ""))
        else:
            outcome = "ran"
        t.add_row(row["log"], str(row.get("tp", "-")), f"{kv['measured_gib']:.2f} GiB" if kv else "-",
                  f"{kv['predicted_gib']:.2f} GiB" if kv else "-",
                  f"{kv['error_pct']:+.2f}%" if kv and kv["error_pct"] is not None else "-",
                  f"{w['error_pct']:+.2f}%" if w and w["error_pct"] is not None else "-", outcome)
    print_table(con, t)
    for key, name in (("available_kv", "available KV memory"), ("weights", "weights")):
        s = data[key]
        if s["compared"]:
            con.print(f"{name}: {s['compared']} logs, |error| median {s['median_abs_error_pct']:.2f}%, worst "
                      f"{s['worst_abs_error_pct']:.2f}%")
    f = data["failures"]
    if f["logs"]:
        con.print(f"failures: {f['predicted']} of {f['logs']} predicted")
    for line in failures:
        con.print(f"  {line}")


def throughput_table(r, model) -> None:
    con = console()
    limits = ", ".join(x for x in (f"TPOT <= {r.tpot_limit_ms:g} ms" if r.tpot_limit_ms else "",
                                   f"TTFT <= {r.ttft_limit_ms:g} ms" if r.ttft_limit_ms else "") if x)
    con.print(f"[bold]{model.name}[/bold]  {r.gpu}  TP {r.tp}" + (f"  PP {r.pp}" if r.pp > 1 else "")
              + _layout_words(r) + f"  {r.engine}  isl {r.isl:,}  osl {r.osl:,}"
              + (f"  limits: {limits}" if limits else ""))
    con.print(f"step times: {r.profile}")
    which = "" if r.percentile == "mean" else f" ({r.percentile} for the limits)"
    sent = (f"Poisson arrivals at {r.request_rate:g} requests/s, at most conc. in flight" if r.request_rate else
            "every client starting at once")
    t = Table(title=f"vllm bench serve, simulated: {r.num_prompts:,} requests per concurrency, {sent}{which}",
              title_justify="left")
    for col, just in [("KV dtype", "left"), ("conc.", "right"), ("TPOT ms", "right"), ("TTFT ms", "right"),
                      ("TTFT p99", "right"), ("out tok/s", "right"), ("per GPU", "right"), ("per user", "right"),
                      ("running", "right"), ("floor ms", "right")]:
        t.add_column(col, justify=just, no_wrap=True)

    def cells(x, mark: str = "") -> list[str]:
        ran = f"{x.mean_running:,.0f}" + (" kv" if x.kv_limited else " seqs" if x.capped_by == "max_num_seqs" else "")
        return [f"{x.tpot_ms:.2f}{mark}", f"{x.ttft_ms:,.1f}", f"{x.ttft_p99_ms:,.1f}", f"{x.output_tokens_per_s:,.0f}",
                f"{x.output_tokens_per_s_per_gpu:,.0f}", f"{x.tokens_per_s_per_user:.1f}", ran,
                f"{x.roofline_step_ms:.2f}"]

    names = list(dict.fromkeys(x.kv_cache_dtype for x in r.rows))
    for i, name in enumerate(names):
        rows = [x for x in r.rows if x.kv_cache_dtype == name]
        best = r.best.get(name)
        for j, x in enumerate(rows):
            label = _dname(name, model) if j == 0 else ""
            mark = "" if x.meets_limits or not limits else " x"
            t.add_row(label, f"{x.concurrency:,}", *cells(x, mark))
        if best is not None:
            t.add_row("", f"best {best.concurrency:,}", *cells(best), end_section=i < len(names) - 1)
    print_table(con, t, keys=2)
    con.print(f"verdict: {r.verdict}")
    for note in r.notes:
        con.print(f"note: {note}")
    seqs = any(x.capped_by == "max_num_seqs" and not x.kv_limited for x in r.rows)
    con.print("TPOT, TTFT: the benchmark's means over its requests; running: requests running at once on average "
              "('kv': requests waited for KV blocks or were preempted"
              + ("; 'seqs': requests queued for one of the scheduler's max_num_seqs slots, the pool not full"
                 if seqs else "") + "); floor ms: the roofline (bytes / peak "
              "bandwidth) of a decode step at that batch" + ("; x: over the limits" if limits else "") + ".")

def layout_tables(cmp, model) -> None:
    """Each layout's throughput table under its label, then the layout verdict."""
    con = console()
    for label, r in cmp.layouts:
        con.print(f"[bold]layout {label}[/bold]")
        throughput_table(r, model)
        con.print("")
    con.print(f"[bold]layout verdict:[/bold] {cmp.verdict}")
# ----------------------------------------------------------------------------------------------------------------
# formats NAME and quality


def format_detail(d: dict, head_dim: int) -> None:
    """One format: its layout and bytes, who serves it, and what is published about its accuracy."""
    con = console()
    t = Table(title=f"{d['name']}: {d['description']}", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    t.add_row("family", d["family"])
    if d["k_bytes"] is not None:
        t.add_row(f"K + V bytes per token per KV head (head_dim {head_dim})",
                  f"{_opt(d['k_bytes'])} + {_opt(d['v_bytes'])} = {_opt(d['bytes_per_token_per_kv_head'])}")
        t.add_row("bits per element", _opt(d["bits_per_element"], ".4g"))
    if d["mla_bytes_per_token"] is not None:
        t.add_row("MLA latent bytes per token per layer", _opt(d["mla_bytes_per_token"]))
    if d["residual_tokens"]:
        t.add_row("newest tokens kept in the model dtype", f"{d['residual_tokens']:,}")
    t.add_row("default skip layers", d["default_skip"])
    for x in d["serves"]:
        until = f" (up to {x['until']})" if x["until"] else ""
        t.add_row(f"served by {x['engine']}{until}", f"{x['where']}: {x['source']}")
    if not d["serves"]:
        t.add_row("served by", f"no engine (a {', '.join(d['engines'])} format)")
    print_table(con, t)
    evidence_table(con, {d["name"]: d["evidence"]})
    for n in d["notes"]:
        con.print(f"note: {n['text']} ({n['source']})")
    if not d["evidence"]:
        how = (f"measure it on your model with `kvplan quality MODEL -d {d['name']} --text FILE`"
               if d["applies_to"] != "mla" else "and `kvplan quality` measures K and V caches, not MLA latents")
        con.print(f"no published accuracy figure kvplan can cite for {d['name']}: {how}")


def evidence_table(con, evidence: dict) -> None:
    """The published results for each format of `evidence` (name -> rows of kv_evidence.Evidence as dicts)."""
    rows = [(name, e) for name, es in evidence.items() for e in es]
    if not rows:
        return
    t = Table(title="Published accuracy results (as their sources state them)", title_justify="left")
    for col in ("KV dtype", "model", "benchmark", "against", "result", "source"):
        t.add_column(col)
    for name, e in rows:
        t.add_row(name, e["model"], e["benchmark"], e["baseline"], e["result"], e["source"])
    print_table(con, t)


def _ratio(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.2f}x"


def _err(x: float) -> str:
    return "0" if x == 0 else f"{x:.2e}" if x < 1e-3 else f"{x:.4f}"


def quality_table(r) -> None:
    con = console()
    con.print(f"{r.model} on {r.device} ({r.model_dtype}): {r.tokens:,} next-token predictions over {r.windows:,} "
              f"window{'s' if r.windows != 1 else ''} of up to {r.context:,} tokens (chunks of {r.chunk_tokens}); "
              f"model-dtype perplexity {r.perplexity:,.3f}")
    t = Table(title="What each KV format costs: against the model-dtype run", title_justify="left")
    for col in ("KV dtype", "bits/elem", "capacity", "skip layers", "KL mean", "KL p99", "top-1 agree", "perplexity",
                "ppl change", "K err", "V err", "attn err", "s"):
        t.add_column(col, justify="left" if col in ("KV dtype", "skip layers") else "right")
    for x in r.rows:
        t.add_row(x.kv_cache_dtype, f"{x.bits_per_element:.3g}", _ratio(x.capacity_gain),
                  _layer_list(x.skip_layers) if x.skip_layers else "-", sci(x.kl_mean), sci(x.kl_p99),
                  f"{x.top1_agreement * 100:.2f}%", f"{x.perplexity:,.3f}", f"{x.perplexity_delta_pct:+.2f}%",
                  _err(x.key_rel_error), _err(x.value_rel_error), _err(x.attention_rel_error), f"{x.seconds:.1f}")
    print_table(con, t)
    ranges = [(b["from"], b["to"]) for b in (r.rows[0].kl_by_position if r.rows else [])]
    if len(ranges) > 1:
        t = Table(title="KL mean by position in the window (a query at a later position attends over more of the "
                        "stored cache)", title_justify="left")
        t.add_column("KV dtype")
        for lo, hi in ranges:
            t.add_column(f"{lo:,}-{min(hi, r.context) - 1:,}", justify="right")
        for x in r.rows:
            t.add_row(x.kv_cache_dtype, *(sci(b["kl_mean"]) for b in x.kl_by_position))
        print_table(con, t)
    layers = [x for x in r.layers if any(y.kv_cache_dtype == x.kv_cache_dtype and y.key_rel_error + y.value_rel_error
                                         for y in r.layers)]
    if layers:
        t = Table(title="Per layer: relative error of the cached keys and values, and of the attention output "
                        "against attention over the layer's exact K and V", title_justify="left")
        for col in ("KV dtype", "layer", "K err", "V err", "attn err", ""):
            t.add_column(col, justify="left" if col in ("KV dtype", "") else "right")
        last = None
        for x in layers:
            t.add_row(x.kv_cache_dtype if x.kv_cache_dtype != last else "", str(x.layer), _err(x.key_rel_error),
                      _err(x.value_rel_error), _err(x.attention_rel_error), "model dtype (skip)" if x.skipped else "")
            last = x.kv_cache_dtype
        print_table(con, t)
    evidence_table(con, r.evidence)
    for n in r.notes:
        con.print(f"note: {n}")
    _no_evidence(con, r.evidence)
    con.print("KL: next-token KL divergence from the model-dtype run (nats), mean and 99th percentile over the "
              "positions; top-1 agree: positions whose most likely next token is the same; capacity: tokens a KV "
              f"pool holds against the model dtype (bytes per token, skip layers included). {r.seconds:.1f} s in all.")


def _no_evidence(con, evidence: dict) -> None:
    none = [name for name, es in evidence.items() if not es and name != "auto"]
    if none:
        con.print(f"no published accuracy figure kvplan can cite for {', '.join(none)}: the figures above are "
                  f"the only evidence here")


def synthetic_table(r) -> None:
    con = console()
    shape = f"{r.model}'s shapes" if r.model else "shapes"
    con.print(f"synthetic K/V, a proxy: {r.tokens:,} tokens, {shape} head_dim {r.head_dim}, {r.kv_heads} KV heads, "
              f"{r.heads} query heads; attention of the last {r.queries:,} positions, on {r.device}")
    t = Table(title="Tensor-level relative errors on synthetic K/V (not a model's accuracy)", title_justify="left")
    gains = any(x.capacity_gain is not None for x in r.rows)
    for col in ("KV dtype", "bits/elem") + (("capacity",) if gains else ()) + ("K err", "V err", "attn err"):
        t.add_column(col, justify="left" if col == "KV dtype" else "right")
    for x in r.rows:
        t.add_row(x.kv_cache_dtype, f"{x.bits_per_element:.3g}", *([_ratio(x.capacity_gain)] if gains else []),
                  _err(x.key_rel_error), _err(x.value_rel_error), _err(x.attention_rel_error))
    print_table(con, t)
    for p in r.parameters:
        con.print(f"drawn: {p['name']}: {p['value']} ({p['source']})")
    evidence_table(con, r.evidence)
    for n in r.notes:
        con.print(f"note: {n}")


class QualityProgress:
    """`kvplan quality`'s progress on stderr: the estimate once the first chunk is timed, then a bar (a line per
    format where stderr is not a terminal)."""

    def __init__(self):
        self.bar = None
        self.task = None
        self.label: Optional[str] = None

    def estimate(self, seconds: float, steps: int) -> None:
        print(f"kvplan quality: about {seconds:,.0f} s for {steps:,} chunks (the model-dtype run and one per "
              f"format), from the first chunk's time", file=sys.stderr)
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                                "{task.total}"), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("model dtype", total=steps)

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=label)
            if self.bar.finished:
                self.bar.stop()
        elif label != self.label:
            print(f"kvplan quality: {label}", file=sys.stderr)
        self.label = label
