"""The planning commands: crossover, throughput, capacity, the plots, sweep and gate. Each parses, calls the library and
renders; the arithmetic is kvplan's."""


import sys
from typing import Annotated, List, Optional

import typer

from kvplan.app.options import (  # noqa: F401 (names typer reads from the annotations)
    DEPLOYMENT,
    JSON_HELP,
    SCHEDULER,
    VLLM_LAYOUT,
    VLLM_MEMORY,
    ConcurrencyOpt,
    DtypesOpt,
    GpuOpt,
    IslOpt,
    JsonOpt,
    ModelArg,
    NumPromptsOpt,
    OslOpt,
    OutputOpt,
    PercentileOpt,
    PlotDtypesOpt,
    RangeRatioOpt,
    RequestRateOpt,
    TpNoProfileOpt,
    TpotOpt,
    TtftOpt,
    UtilNoProfileOpt,
    WeightReadOpt,
    _deployment_args,
    _exit,
    _formats_for,
    _names,
    _one_size,
    _served_here,
    _show,
    _sizes,
    _takes,
    _unfit,
    app,
    plot_app,
)


@app.command()
@_takes("tp", "weight_dtype", "skip_layers", "calibration", *VLLM_LAYOUT, "engine_version", tp=TpNoProfileOpt)
def crossover(
    model: ModelArg,
    dtype: DtypesOpt = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="add roofline step times on this GPU")] = None,
    context: Annotated[Optional[List[str]], typer.Option(
        "--context", "-c", help="cached tokens per sequence at an operating point (e.g. 2304, 128k); "
        "default 2048,8192,32768,131072 up to the model's context")] = None,
    batch: Annotated[Optional[List[str]], typer.Option(
        "--batch", "-b", help="sequences in the batch (default 1)")] = None,
    weight_read: WeightReadOpt = "streamed",
    baseline: Annotated[str, typer.Option("--baseline", help="KV dtype the saving is measured against")] = "auto",
    as_json: JsonOpt = False,
    **deployment,
) -> None:
    """Is a KV dtype a latency lever here? Bytes per token, the crossover N* where the KV read overtakes the
    weight read, and step bytes (and roofline time with --gpu) at each batch x context."""
    from kvplan.deployment import deployments
    from kvplan.errors import KvplanError
    from kvplan.plan.crossover import crossover_of
    from kvplan.specs.catalog import load_model_as

    if weight_read not in ("streamed", "all"):
        raise KvplanError(f"--weight-read '{weight_read}': choose 'streamed' or 'all'")
    m = load_model_as(model, deployment["weight_dtype"])
    args = _deployment_args(model=m, gpu=gpu, **deployment)
    ds = _served_here(deployments(args, _formats_for(m, dtype, args=args)), dtype)
    # by default, operating points up to the model's own context
    contexts = _sizes(context, "--context") or ([c for c in (2048, 8192, 32768, 131072)
                                                 if c <= m.max_position_embeddings] or [m.max_position_embeddings])
    batches = _sizes(batch, "--batch") or [1]

    def run(d):
        return crossover_of(d, batches=batches, contexts=contexts, weight_read=weight_read, baseline=baseline)

    results = [run(d) for d in ds]
    data = [r.to_dict() for r in results] if len(ds) > 1 else results[0].to_dict()
    if not as_json and not any(r.dtype == results[0].baseline_dtype for r in results):
        # the table shows the pile being compared against as well
        from dataclasses import replace

        from kvplan.specs.kv_formats import kv_format

        base = kv_format(baseline)
        results.insert(0, run(replace(ds[0], kv=base, skip=None,
                                      unserved=base.unserved(ds[0].engine, ds[0].gpu, ds[0].engine_version))))
    _show(as_json, data, "crossover_tables", results, m, ds[0].gpu)


def _throughput(model: str, gpu: Optional[str], isl: Optional[str], osl: Optional[str], concurrency, dtype,
                tpot_ms, ttft_ms, percentile: str = "mean", num_prompts: Optional[int] = None,
                request_rate: Optional[float] = None, random_range_ratio: float = 0.0, **deployment):
    """The throughput table both `throughput` and `plot throughput` show (kvplan.plan.throughput)."""
    from kvplan.deployment import deployments, engine_of
    from kvplan.errors import KvplanError
    from kvplan.plan.throughput import throughput_of
    from kvplan.rules.vllm import newer_release_note
    from kvplan.specs.catalog import load_model_as
    from kvplan.specs.kv_formats import comparison_dtypes

    for name, v in (("--isl", isl), ("--osl", osl)):
        if v is None:
            raise KvplanError(f"{name} is required: the request's {'prompt' if name == '--isl' else 'output'} "
                              f"tokens (e.g. {name} 1024)")
    if gpu is None:
        raise KvplanError("--gpu is required: step times and the pool are the GPU's (e.g. --gpu h100)")
    m = load_model_as(model, deployment.get("weight_dtype"))
    args = _with_profile(_deployment_args(model=m, gpu=gpu, **deployment))
    ds = _served_here(deployments(args, _formats_for(m, dtype, comparison_dtypes(m, engine_of(args)), args),
                                  needs_memory=True), dtype)
    r = throughput_of(ds, _one_size(isl, "--isl"), _one_size(osl, "--osl"),
                      _sizes(concurrency, "--concurrency") or None, tpot_ms, ttft_ms, percentile, num_prompts,
                      request_rate=request_rate, random_range_ratio=random_range_ratio)
    version_note = newer_release_note(args.engine_version or getattr(args.profile, "engine_version", None))
    if version_note and engine_of(args) == "vllm":  # the one deployment note the throughput table needs
        r.notes.insert(0, version_note)
    return m, r


def _with_profile(args):
    """The arguments with --profile read (once, for the model it names and for every dtype's deployment)."""
    if args.profile is None or not isinstance(args.profile, str):
        return args
    from dataclasses import replace

    from kvplan.specs.profile import load_profile

    return replace(args, profile=load_profile(args.profile))


@app.command()
@_takes(*DEPLOYMENT, *SCHEDULER)
def throughput(
    model: ModelArg,
    gpu: GpuOpt = None,
    isl: IslOpt = None,
    osl: OslOpt = None,
    concurrency: ConcurrencyOpt = None,
    dtype: DtypesOpt = None,
    tpot_ms: TpotOpt = None,
    ttft_ms: TtftOpt = None,
    percentile: PercentileOpt = "mean",
    num_prompts: NumPromptsOpt = None,
    request_rate: RequestRateOpt = None,
    random_range_ratio: RangeRatioOpt = 0.0,
    layout: Annotated[Optional[List[str]], typer.Option(
        "--layout", help="compare layouts (repeat): comma-separated tp<N>, pp<N>, dp<N>, ep (vLLM: experts over tp x "
        "dp) or ep<N> (SGLang: --ep-size), e.g. --layout tp8 --layout tp1,dp8,ep; the verdict names the layout "
        "with the most output tokens/s per GPU under the limits")] = None,
    as_json: JsonOpt = False,
    **deployment,
) -> None:
    """What `vllm bench serve` prints per KV dtype and concurrency: TPOT, TTFT, ITL and latency (mean and p50, p90,
    p99), output tokens/s per GPU, from a step-by-step simulation of the engine's scheduler priced with step times
    fitted to vLLM's own kernels (or your `kvplan measure` profile); with --tpot-ms / --ttft-ms, the best
    concurrency under them and the winner."""
    opts = deployment
    if not layout:
        m, r = _throughput(model, gpu, isl, osl, concurrency, dtype, tpot_ms, ttft_ms, percentile, num_prompts,
                           request_rate, random_range_ratio, **opts)
        _show(as_json, r.to_dict(), "throughput_table", r, m)
        return
    from kvplan.deployment import engine_of
    from kvplan.deployment.layout import layout_label, parse_layout
    from kvplan.errors import KvplanError
    from kvplan.plan.throughput import compare_layouts

    engine = engine_of(_deployment_args(engine=opts["engine"], profile=opts["profile"]))
    results = []
    for spec in layout:
        fields_ = parse_layout(spec, engine)
        clash = [k for k in fields_ if opts.get(k) not in (None, False)]
        if clash:
            raise KvplanError(f"--layout '{spec}' sets {clash[0].replace('_', '-')} that --{clash[0].replace('_', '-')}"
                              f" also gives; give it in one place")
        m, r = _throughput(model, gpu, isl, osl, concurrency, dtype, tpot_ms, ttft_ms, percentile, num_prompts,
                           request_rate, random_range_ratio, **{**opts, **fields_})
        results.append((layout_label(fields_), r))
    cmp = compare_layouts(results, tpot_ms, ttft_ms)
    _show(as_json, cmp.to_dict(), "layout_tables", cmp, m)


@app.command()
@_takes(*DEPLOYMENT)
def capacity(
    model: Annotated[Optional[str], typer.Argument(help="catalog name, YAML or config.json path; omit to list every "
                                                   "catalog model")] = None,
    gpu: GpuOpt = None,
    dtype: DtypesOpt = None,
    as_json: JsonOpt = False,
    **deployment,
) -> None:
    """How many tokens and concurrent sequences the KV pool holds: vLLM's budget, pages, blocks and concurrency (or
    SGLang's pool), side by side per KV dtype. Without MODEL, one row per catalog model."""
    from dataclasses import replace

    from kvplan.deployment import deployments
    from kvplan.specs.catalog import load_model, load_model_as
    from kvplan.specs.kv_formats import parse_dtypes

    args = _deployment_args(model=model, gpu=gpu, **deployment)
    if model is None and deployment["profile"] is None:
        _capacity_listing(args, parse_dtypes(dtype), as_json)
        return
    args = _with_profile(args)
    m = load_model_as(model, deployment["weight_dtype"]) if model else load_model(args.profile.model)
    fmts = _formats_for(m, dtype, args=args) if dtype else [None]
    ds = _served_here(deployments(replace(args, model=m), fmts, needs_memory=True), dtype)
    from kvplan.plan.capacity import pool_capacity

    results = [pool_capacity(d) for d in ds]
    table = "sglang_table" if ds[0].engine == "sglang" else "capacity_table"  # each engine's own figures
    if all(not r.fits for r in results):
        _unfit(results)
    data = [r.to_dict() for r in results] if len(results) > 1 else results[0].to_dict()
    _exit["status"] = 2 if any(not r.fits for r in results) else 0
    _show(as_json, data, table, results, m, ds[0].gpu)
    _unfit(results)


def _capacity_listing(args, fmts, as_json: bool) -> None:
    from dataclasses import replace

    from kvplan.errors import KvplanError
    from kvplan.plan.vllm_capacity import capacity_of
    from kvplan.specs.catalog import catalog_entries

    if len(fmts) != 1:
        raise KvplanError("without MODEL, capacity lists every model for one --kv-cache-dtype; pick one")
    if (args.engine or "vllm") != "vllm":
        raise KvplanError("without MODEL, capacity lists the catalog with vLLM's rules; name a model for SGLang")
    first = None
    rows = []
    for key, m in catalog_entries("models"):
        per_model = replace(args, model=m, kv_cache_dtype=fmts[0])
        if isinstance(args.max_model_len, int) and args.max_model_len > m.max_position_embeddings:
            per_model = replace(per_model, max_model_len=m.max_position_embeddings)  # the model's own; the row says
        try:
            d = per_model.resolve(needs_memory=True)
            first = first or d
            rows.append((key, capacity_of(d)))
        except KvplanError as e:
            if "capacity needs --gpu" in str(e) or "unknown GPU" in str(e):
                raise
            rows.append((key, str(e).split(";")[0]))
    data = [{"model_key": k, **(r.to_dict() if not isinstance(r, str) else {"fits": False, "problem": r})}
            for k, r in rows]
    gpu = first.gpu if first else None
    _show(as_json, data, "capacity_listing", rows, gpu, args.tp or 1, fmts[0].name, args.max_model_len)


def _draw(fig, output: Optional[str], as_json: bool = False) -> None:
    from kvplan.app.plots import figure_data, save, text_chart

    if output:
        save(fig, output)
        print(f"wrote {output}", file=sys.stderr)
    if as_json:
        from kvplan.app.render import print_json

        print_json(figure_data(fig))
    elif not output:
        from kvplan.app.text_table import console_width

        sys.stdout.write(text_chart(fig, columns=console_width()))


@plot_app.command("crossover")
@_takes("tp", "weight_dtype", "skip_layers", tp=TpNoProfileOpt)
def plot_crossover(
    model: ModelArg,
    dtype: PlotDtypesOpt = None,
    weight_read: WeightReadOpt = "streamed",
    batch: Annotated[Optional[str], typer.Option("--batch", "-b", help="operating point: sequences")] = None,
    context: Annotated[Optional[str], typer.Option("--context", "-c", help="operating point: tokens per "
                                                   "sequence")] = None,
    output: OutputOpt = None,
    as_json: JsonOpt = False,
    **deployment,
) -> None:
    """KV bytes per step against resident tokens for each dtype, the flat weight line, and the crossover N* of
    each dtype marked; an operating point if given."""
    from kvplan.app.plots import crossover_figure
    from kvplan.deployment import deployments
    from kvplan.errors import KvplanError
    from kvplan.specs.catalog import load_model_as

    weight_dtype = deployment["weight_dtype"]
    m = load_model_as(model, weight_dtype)
    from kvplan.specs.kv_formats import comparison_dtypes

    # the figure holds no engine-release figure: a model vLLM serves only up to some release is drawn with that one's
    ds = deployments(_deployment_args(model=m, engine_version=m.vllm_until, **deployment),
                     _formats_for(m, dtype, comparison_dtypes(m)))
    ctx = _one_size(context, "--context") if context else None
    b = _one_size(batch, "--batch") if batch else None
    if ctx is None and b is not None:
        raise KvplanError("an operating point needs --context (and optionally --batch)")
    if ctx is not None and b is None:
        b = 1
    fig = crossover_figure(m, [d.kv for d in ds], tp=ds[0].tp, weight_dtype=weight_dtype, weight_read=weight_read,
                           skip=ds[0].skip, batch=b, context=ctx)  # type: ignore[arg-type]
    _draw(fig, output, as_json)


@plot_app.command("throughput")
@_takes("tp", "pp", "max_model_len", "weight_dtype", "engine", "calibration", tp=TpNoProfileOpt)
def plot_throughput(
    model: ModelArg,
    gpu: GpuOpt = None,
    isl: IslOpt = None,
    osl: OslOpt = None,
    concurrency: ConcurrencyOpt = None,
    dtype: PlotDtypesOpt = None,
    tpot_ms: TpotOpt = None,
    ttft_ms: TtftOpt = None,
    output: OutputOpt = None,
    as_json: JsonOpt = False,
    **deployment,
) -> None:
    """Output tokens/s per GPU against TPOT for each KV dtype, one point per concurrency (its Pareto curve), the
    TPOT limit drawn and each dtype's best concurrency under the limits (--tpot-ms, --ttft-ms) marked."""
    from kvplan.app.plots import throughput_figure

    _, r = _throughput(model, gpu, isl, osl, concurrency, dtype, tpot_ms, ttft_ms, **deployment)
    _draw(throughput_figure(r), output, as_json)


@plot_app.command("capacity")
@_takes("tp", *VLLM_MEMORY, "kv_cache_memory", "num_gpu_blocks_override", "profile", "calibration")
def plot_capacity(
    model: ModelArg,
    gpu: GpuOpt = None,
    dtype: PlotDtypesOpt = None,
    output: OutputOpt = None,
    as_json: JsonOpt = False,
    **deployment,
) -> None:
    """Sequences the KV pool holds against max_model_len, one curve per dtype (vLLM's rules, the same plan as
    `capacity`)."""
    from kvplan.app.plots import capacity_figure
    from kvplan.deployment import deployments
    from kvplan.specs.catalog import load_model_as
    from kvplan.specs.kv_formats import comparison_dtypes

    m = load_model_as(model, deployment["weight_dtype"])
    args = _deployment_args(model=m, gpu=gpu, engine="vllm", **deployment)
    ds = _served_here(deployments(args, _formats_for(m, dtype, comparison_dtypes(m), args), needs_memory=True), dtype)
    _draw(capacity_figure(ds), output, as_json)


@app.command()
@_takes(*VLLM_MEMORY, *VLLM_LAYOUT, gpu_memory_utilization=UtilNoProfileOpt)
def sweep(
    model: Annotated[List[str], typer.Option("--model", "-m", help="models (repeat or separate with commas)")],
    gpu: Annotated[List[str], typer.Option("--gpu", "-g", help="GPUs (repeat or separate with commas)")],
    tp: Annotated[Optional[List[str]], typer.Option("--tp", help="tensor-parallel sizes (default 1)")] = None,
    dtype: DtypesOpt = None,
    max_model_len: Annotated[Optional[List[str]], typer.Option("--max-model-len", help="lengths (default "
                                                                "8192)")] = None,
    batch: Annotated[Optional[List[str]], typer.Option("--batch", "-b", help="batch sizes (default 1)")] = None,
    context: Annotated[Optional[List[str]], typer.Option("--context", "-c", help="cached tokens per sequence "
                                                         "(default 8192)")] = None,
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="file to write: .csv, .parquet, .json or .md "
                                                  "(default: CSV on stdout)")] = None,
    fmt: Annotated[Optional[str], typer.Option("--format", help="csv, parquet, json or markdown (default: from "
                                               "--output's suffix)")] = None,
    columns: Annotated[Optional[str], typer.Option("--columns", help="keep only these columns "
                                                   "(comma-separated)")] = None,
    weight_read: WeightReadOpt = "streamed",
    as_json: JsonOpt = False,
    **deployment,
) -> None:
    """A grid over models, GPUs, TP, KV dtypes, max_model_len, batch and context: one row per combination, with
    the capacity and crossover figures of each, written as CSV, Parquet, JSON or Markdown."""
    from kvplan.errors import KvplanError, did_you_mean
    from kvplan.files import frame_format, write_frame
    from kvplan.plan.sweep import sweep as run
    from kvplan.rules.vllm import newer_release_note
    from kvplan.sizing.kv_cache import parse_skip_layers
    from kvplan.specs.kv_formats import parse_dtypes

    if weight_read not in ("streamed", "all"):
        raise KvplanError(f"--weight-read '{weight_read}': choose 'streamed' or 'all'")
    if as_json:
        if fmt not in (None, "json"):
            raise KvplanError(f"--json and --format {fmt} disagree; give one")
        fmt = "json"
    kind = frame_format(output, fmt)
    options = dict(deployment)
    skip_layers = options.pop("skip_layers")
    df = run(_names(model), _names(gpu), tps=_sizes(tp, "--tp") or [1], dtypes=parse_dtypes(dtype),
             max_model_lens=_sizes(max_model_len, "--max-model-len") or [8192],
             batches=_sizes(batch, "--batch") or [1], contexts=_sizes(context, "--context") or [8192],
             weight_read=weight_read, skip=parse_skip_layers(skip_layers), **options)  # type: ignore[arg-type]
    if df.empty:
        raise KvplanError("no combination of the sweep can run: " + "; ".join(df.attrs["skipped"][:3]))
    if columns:
        keep = _names([columns])
        unknown = [c for c in keep if c not in df.columns]
        if unknown:
            raise KvplanError(f"--columns: no column '{unknown[0]}'{did_you_mean(unknown[0], list(df.columns))}; "
                              f"columns are {', '.join(df.columns)}")
        df = df[keep]
    text = write_frame(df, output, kind)
    if text is not None:
        sys.stdout.write(text)
    else:
        print(f"wrote {len(df):,} rows to {output}", file=sys.stderr)
    for why in df.attrs["skipped"]:
        print(f"left out: {why}", file=sys.stderr)
    for note in df.attrs.get("notes", []):
        print(f"note: {note}", file=sys.stderr)
    version_note = newer_release_note(options["engine_version"])
    if version_note:
        print(f"note: {version_note}", file=sys.stderr)
    dp, enable_expert_parallel = options["data_parallel_size"] or 1, options["enable_expert_parallel"]
    if dp > 1 or enable_expert_parallel:
        print(f"note: figures per rank of {dp} data-parallel rank(s), each its own KV pool: the deployment holds "
              f"{dp} x kv_tokens and {dp} x max_concurrency" + (
                  "; experts spread whole over tp x data-parallel-size ranks" if enable_expert_parallel else ""),
              file=sys.stderr)
    if "expected_step_ms" in df.columns:
        for gpu_name, prof in df.attrs.get("step_profiles", {}).items():
            print(f"expected_step_ms on {gpu_name}: {prof}", file=sys.stderr)


@app.command()
def gate(
    file: str = typer.Argument(..., help="gates file (YAML): defaults and a list of gates with requirements"),
    junit: Optional[str] = typer.Option(None, "--junit", help="also write JUnit XML here"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="an earlier `kvplan gate --json` result: "
                                           "fail when a figure got worse than it by more than --max-regression"),
    max_regression: Optional[float] = typer.Option(None, "--max-regression", help="percent a figure may get "
                                                   "worse than --baseline (default 1)"),
) -> None:
    """Check capacity gates: exit 0 when every gate passes, 1 when any fails (or regresses against --baseline),
    2 when the file is malformed. Under GitHub Actions, also a step summary and error annotations."""
    import os

    from kvplan.app.gates import (
        compare_baseline,
        failure_lines,
        junit_xml,
        load_gates,
        markdown_summary,
        run_gates,
    )
    from kvplan.errors import KvplanError
    from kvplan.files import atomic_write_text

    if max_regression is not None and not baseline:
        raise KvplanError("--max-regression sets how much worse than --baseline a figure may get; add --baseline")
    report = run_gates(load_gates(file), file)
    if baseline:
        from kvplan.files import read_json

        before = read_json(baseline, "--baseline", "`kvplan gate FILE --json > baseline.json` makes one")
        if not isinstance(before, dict) or not isinstance(before.get("gates"), list):
            raise KvplanError(f"--baseline {baseline}: not a `kvplan gate --json` result (no 'gates' list)")
        limit = 1.0 if max_regression is None else max_regression
        if limit < 0 or limit != limit:
            raise KvplanError(f"--max-regression must not be negative, got {max_regression}")
        report.regressions = compare_baseline(report, before, limit)
    if junit:
        atomic_write_text(junit, junit_xml(report))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(markdown_summary(report))
        except OSError as e:  # the gates' verdict stands; the summary is a convenience
            print(f"kvplan: warning: cannot append the step summary to GITHUB_STEP_SUMMARY={summary}: "
                  f"{e.strerror or e}", file=sys.stderr)
        for line in failure_lines(report):
            print(f"::error title=kvplan gate::{line}")
    _exit["status"] = 0 if report.passed else 1
    _show(as_json, report.to_dict(), "gate_table", report)
    if not report.passed:
        for line in failure_lines(report):
            print(f"kvplan: gate failed: {line}", file=sys.stderr)
        raise typer.Exit(1)
