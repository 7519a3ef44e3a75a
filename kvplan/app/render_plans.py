"""The planning commands' tables: crossover, capacity (vLLM's and SGLang's), throughput and layouts."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from kvplan.app.render import (
    Table,
    _layer_list,
    console,
    gb,
    gib,
    num,
    pct,
    print_table,
    sci,
    tokens,
)


def crossover_tables(results: Sequence, model, gpu) -> None:
    """`kvplan crossover`'s output: the weights read per step, the N* table, and the operating points' table."""
    con = console()
    r0 = results[0]
    convention = ("every parameter once (--weight-read all)" if r0.weight_read == "all"
                  else "what a step streams (--weight-read streamed): no input-embedding table"
                  + (", touched experts only" if model.moe else ""))
    title = f"{model.name}  TP {r0.tp}  weights {r0.weight_dtype}"
    con.print(f"[bold]{title}[/bold]  weight read per step: {convention}")
    con.print(f"weights held per rank: {gib(r0.weight_bytes_held)}   read per step at batch 1: "
              f"{gb(r0.weight_bytes)} ({sci(r0.weight_bytes, 4)} B)")

    _nstar_table(con, results, model)
    if r0.operating_points:
        _operating_points_table(con, results, model, gpu)


def _nstar_table(con, results: Sequence, model) -> None:
    """The crossover table: each KV dtype's bytes per token and N*, and with skip layers the N* without them."""
    r0 = results[0]
    t = Table(title="Crossover N*: cached tokens of one sequence at which the KV read equals the weight read",
              title_justify="left")
    t.add_column("KV dtype", no_wrap=True)
    t.add_column("bits/elem", justify="right", no_wrap=True)
    t.add_column("KV B/token", justify="right", no_wrap=True)
    ck = _auto_from_checkpoint(results)
    t.add_column(f"vs {_dname(r0.baseline_dtype, model, checkpoint=ck)}", justify="right", no_wrap=True)
    t.add_column("N*", justify="right", no_wrap=True)
    any_skip = any(r.skip_layers for r in results)
    if any_skip:
        t.add_column("skip layers", justify="left")
        t.add_column("N* if none skipped", justify="right", no_wrap=True)
    for r in results:
        nstar = tokens(r.crossover_tokens)
        if r.crossover_tokens is None and r.crossover_batch:
            nstar = f"never at batch 1 (>= {r.crossover_batch:,.1f} full-window sequences)"
        row = [_rname(r, model, ck), "-" if r.bits_per_element is None else f"{r.bits_per_element:.2f}",
               num(r.kv_bytes_per_token), f"{r.kv_ratio:.2f}x", nstar]
        if any_skip:
            row += [_layer_list(r.skip_layers), tokens(r.crossover_tokens_without_skip) if r.skip_layers else ""]
        t.add_row(*row)
    print_table(con, t)
    con.print("KV B/token: this rank, all layers, skip layers included. `kvplan formats` has the byte layouts.")


def _operating_points_table(con, results: Sequence, model, gpu) -> None:
    """The bytes (and with a GPU the roofline time) of one decode step at each operating point per KV dtype, then
    the results' notes, the break-even contexts and what the columns mean."""
    ck = _auto_from_checkpoint(results)
    r0 = results[0]
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
            row = [f"{p.batch:,} x {p.context:,}" if j == 0 else "", _rname(r, model, ck),
                   gb(p.weight_bytes, unit=False), gb(p.kv_bytes, unit=False), gb(p.step_bytes, unit=False),
                   pct(p.saving), "KV" if p.bound == "kv" else "weights"]
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
            mine, theirs = _rname(r, model, ck), _dname(r.baseline_dtype, model, checkpoint=ck)
            faster = ", ".join(f"{tokens(c)} at batch {b}" for b, c in r.breakeven_context.items() if c)
            never = ", ".join(f"{b}" for b, c in r.breakeven_context.items() if not c)
            said = [f"{mine} steps faster than {theirs} from context {faster}"] if faster else []
            if never:
                said.append(f"{mine} is never faster than {theirs} at batch {never}" if not faster
                            else f"never at batch {never}")
            con.print(f"{'; '.join(said)} (expected step times; the byte crossover ignores each kernel's fixed "
                      f"costs)")
    note = f"saving: step bytes saved against {_dname(r0.baseline_dtype, model, checkpoint=ck)}."
    if timed:
        note += " step ms: roofline max(bytes / peak bandwidth, FLOPs / peak dense compute), the floor."
    if calibrated:
        note += " expected ms: the step model (see the note naming its profile)."
    con.print(note)

def _rname(r, model, checkpoint: bool = False) -> str:
    """The dtype of a planned result (crossover, capacity, SGLang's pool), marked where its deployment is a what-if;
    `auto` that the engine resolved from the checkpoint's declared KV-cache quantization says so (and, where it
    did, `checkpoint`: the model's own dtype is named as itself, not as auto)."""
    dep = r.deployment or {}
    if dep.get("kv_cache_dtype_from_checkpoint") and r.dtype != "auto":
        return _from_checkpoint(r.dtype)
    return _dname(r.dtype, model, dep.get("what_if"), checkpoint)


def _auto_from_checkpoint(results) -> bool:
    """Whether any of the results is `auto` resolved from the checkpoint's declaration."""
    return any((r.deployment or {}).get("kv_cache_dtype_from_checkpoint") for r in results)


def _from_checkpoint(dtype: str) -> str:
    """`auto` resolved to the checkpoint's declared KV-cache quantization, stored as `dtype`."""
    return f"auto ({'fp8' if dtype.startswith('fp8') else dtype} from the checkpoint)"


def _dname(dtype: str, model, what_if: Optional[str] = None, checkpoint: bool = False) -> str:
    """'auto' is the model's dtype (DeepSeek-V4's fp8_ds_mla on vLLM): say which (only which, where `checkpoint`:
    auto is then the checkpoint's declared dtype, named apart); a dtype the engine does not serve here is marked a
    what-if (its note says why)."""
    if dtype == "auto" and checkpoint and getattr(model, "compressed", None) is None:
        return str(model.dtype)
    if dtype == "auto":
        return "auto (fp8_ds_mla)" if getattr(model, "compressed", None) is not None else f"auto ({model.dtype})"
    return f"{dtype} (what-if)" if what_if else dtype


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
    dp, ep, world = r.dp, r.ep, r.world_size
    if dp == 1 and ep == 1:
        return ""
    return (f"  DP {dp}" if dp > 1 else "") + (f"  EP {ep}" if ep > 1 else "") + f"  ({world} GPUs)"


def _capacity_dtypes(con, results: Sequence, model, r0) -> None:
    t = Table(title=f"KV cache per dtype, sequences of {r0.max_model_len:,} tokens", title_justify="left")
    any_skip = any(r.skip_layers for r in results)
    cols = ["KV dtype", "B/token", "block B", "blocks", "token slots", "KV tokens", "concurrency"]
    dp = max(r.dp for r in results)
    if dp > 1:  # several attention groups, each its own pool: the deployment's totals too
        cols += [f"total tokens (x{dp})", "total concurrency"]
    for col in cols + (["skip layers"] if any_skip else []):
        t.add_column(col, justify="left" if col in ("KV dtype", "skip layers") else "right",
                     no_wrap=col != "skip layers")
    for r in results:
        row = [_rname(r, model), num(r.kv_bytes_per_token), f"{r.bytes_per_block:,}", f"{r.num_blocks:,}",
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
        t.add_row(_rname(r, model), num(r.cell_bytes), f"{r.max_total_num_tokens:,}",
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
    if r.random_range_ratio:
        sent += f", lengths drawn within {r.random_range_ratio:g} of isl and osl"
    client = "sglang.bench_serving" if r.engine == "sglang" else "vllm bench serve"
    t = Table(title=f"{client}, simulated: {r.num_prompts:,} requests per concurrency, {sent}{which}",
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
            label = ("" if j else _from_checkpoint(name) if x.kv_cache_dtype_from_checkpoint
                     else _dname(name, model, x.what_if))
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
