"""The commands around the plans: log import, measure, quality, and the formats, models and GPU catalogs."""

from __future__ import annotations

import sys
from typing import Annotated, List, Optional

import typer

from kvplan.app.options import (  # noqa: F401 (names typer reads from the annotations)
    JSON_HELP,
    JsonOpt,
    PlotDtypesOpt,
    SkipOpt,
    _one_size,
    _show,
    _sizes,
    _takes,
    app,
    gpus_app,
    models_app,
)


def _read_log(file: str) -> str:
    """A startup log's text; a gzipped one (docker or logrotate archives) is read through gzip."""
    import gzip
    import io
    import zlib

    from kvplan.errors import KvplanError

    try:
        with open(file, "rb") as f:
            data = f.read()
    except OSError as e:
        raise KvplanError(f"cannot read {file}: {e.strerror}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise KvplanError(f"{file} is gzip-compressed but cannot be decompressed ({e}): is it cut short?") from None
    # as a text-mode read does: universal newlines (CRLF and CR to LF), undecodable bytes replaced
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline=None).read()


def _check_config_folder(folder: str) -> None:
    """A --configs folder exists and holds at least one config.json in a layout the log's model is looked up in."""
    from pathlib import Path

    from kvplan.errors import KvplanError

    p = Path(folder)
    if not p.exists():
        raise KvplanError(f"--configs {folder}: no such folder; give the folder that holds the config.json files")
    if not p.is_dir():
        raise KvplanError(f"--configs {folder} is a file, not a folder: give the folder that holds it, or pass a "
                          f"config.json as --model")
    held = (any(p.glob("*config.json")) or any(p.glob("*/config.json"))
            or any(p.glob("models--*/snapshots/*/config.json")))
    if not held:
        raise KvplanError(f"--configs {folder} holds no config.json files (<org>--<name>.config.json, "
                          f"<org>--<name>/config.json or a Hugging Face cache's models--<org>--<name>)")


@app.command("log")
def log_import(
    files: List[str] = typer.Argument(..., help="vLLM (V0 or V1) or SGLang startup logs, or - for stdin"),
    model: Optional[str] = typer.Option(None, "--model", help="the model, when the log's name is not in the catalog"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="the GPU (default: the one the log names, else the "
                                      "catalog GPU nearest the memory total it states; needed when it states none)"),
    configs: Optional[List[str]] = typer.Option(None, "--configs", help="a folder of config.json files "
                                                "(<org>--<name>.config.json, <org>--<name>/config.json or a Hugging "
                                                "Face cache) where each log's model is looked up before the catalog"),
    summary: bool = typer.Option(False, "--summary", help="one line per log (available KV memory and weights, "
                                 "measured, predicted, error; failures and whether kvplan predicts them), then the "
                                 "median and worst error"),
    save_profile: Optional[str] = typer.Option(None, "--save-profile", help="keep the measured overheads here "
                                               "(YAML) for `kvplan capacity --profile`"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Read startup logs: the configuration each ran and every figure it measured, kvplan's prediction for the same
    configuration beside each with the error, and (--save-profile) a deployment profile for what-if runs. A log that
    ends in the engine's error is checked against kvplan's refusal of the same configuration."""
    from kvplan.app.log_import import import_log, log_summary
    from kvplan.errors import KvplanError
    from kvplan.specs.profile import save_profile as write_profile

    if save_profile and len(files) > 1:
        raise KvplanError("--save-profile keeps one log's figures: give one log")
    for folder in configs or ():
        _check_config_folder(folder)
    if files.count("-") > 1:
        raise KvplanError("stdin (-) can be read once")
    results = []
    for file in files:
        if file == "-":
            text = sys.stdin.read()
        else:
            text = _read_log(file)
        source = file if file != "-" else "stdin"
        if summary:
            try:
                results.append((source, import_log(text, source, model=model, gpu=gpu, configs=configs or ())))
            except KvplanError as e:  # a log kvplan cannot read is one line of the summary, not the end of it
                results.append((source, str(e)))
            continue
        result = import_log(text, source, model=model, gpu=gpu, configs=configs or ())
        if save_profile:
            if result.profile is None:
                raise KvplanError(f"{source}: the engine stopped before measuring its pool; no profile to save")
            write_profile(result.profile, save_profile)
            print(f"wrote the deployment profile {save_profile}", file=sys.stderr)
        results.append((source, result))
    if summary:
        data = log_summary(results)
        _show(as_json, data, "log_summary_table", data)
        return
    if as_json:
        _show(True, results[0][1].to_dict() if len(results) == 1 else [r.to_dict() for _, r in results], "")
        return
    for _, result in results:
        _show(False, None, "log_table", result)


@app.command()
def measure(
    quick: Annotated[bool, typer.Option("--quick", help="4 sizes up to 1 GB, 10 samples each (--dry-run --quick "
                                        "prints its expected duration); the full sweep goes to 2 GB with 30 "
                                        "samples")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan (kernels, sizes, bytes, expected "
                                          "duration) and measure nothing; works without a GPU")] = False,
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="where to write the calibration profile "
                                                  "(default: kvplan's cache directory, named after the GPU)")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="for --dry-run: the GPU to plan for (default: H100 "
                                               "SXM)")] = None,
    device: Annotated[str, typer.Option("--device", hidden=True, help="cpu runs the kernels under Triton's "
                                        "interpreter with tiny sizes: a check of the pipeline, not a "
                                        "measurement")] = "cuda",
    validate: Annotated[Optional[str], typer.Option("--validate", help="MODEL: time a synthetic decode step of its "
                                                    "shapes and print it beside the roofline and the calibrated "
                                                    "prediction")] = None,
    dtype: Annotated[Optional[str], typer.Option("--kv-cache-dtype", "--dtype", "-d", help="with --validate: the KV "
                                                 "dtype (default auto)")] = None,
    batch: Annotated[Optional[int], typer.Option("--batch", "-b", help="with --validate: sequences (default "
                                                 "8)")] = None,
    context: Annotated[Optional[str], typer.Option("--context", "-c", help="with --validate: cached tokens per "
                                                   "sequence (default 4096)")] = None,
    layers: Annotated[Optional[int], typer.Option("--layers", help="with --validate: layers to run (default: as "
                                                  "many as fit in 40% of the free memory)")] = None,
    calibration: Annotated[Optional[str], typer.Option("--calibration", help="with --validate: the profile to check "
                                                       "(default: the one saved for this GPU)")] = None,
    probe: Annotated[bool, typer.Option("--probe", help="sweep the bf16 and fp8 decode kernels' tile sizes, warps, "
                                        "pipeline stages and splits, and the L2 flush methods (read, write, none), "
                                        "at 64 sequences x 8 KV heads x 4,096 tokens, and write what was found as "
                                        "JSON to --output (default: kvplan's cache directory, named after the "
                                        "GPU); about two minutes")] = False,
    budget: Annotated[Optional[float], typer.Option("--budget", help="with --probe: seconds after which no new "
                                                    "configuration starts (default 90; the one running finishes, "
                                                    "then the flush comparison runs)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure this GPU: streaming probes, weight GEMVs and the paged decode kernel of every KV format over sizes
    from 8 MB up, with L2 flushed between samples; fit t = t0 + bytes / (eta x peak bandwidth) per kernel family
    and write a calibration profile that `crossover --calibration` (and the cache) use."""
    from kvplan.errors import KvplanError

    _refuse_measure_mixes(quick, dry_run, output, gpu, device, validate, probe, budget,
                          {"--kv-cache-dtype": dtype, "--batch": batch, "--context": context, "--layers": layers,
                           "--calibration": calibration})
    if output is not None:  # refused now, not after minutes on the GPU
        from kvplan.files import check_writable

        check_writable(output)
    if dry_run:
        _measure_dry_run(gpu, quick, as_json)
        return
    if validate is not None:  # a misspelt model, dtype or size before torch and the GPU
        batch, ctx = _validate_sizes(validate, dtype, batch, context, layers)
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError:
        raise KvplanError("kvplan measure needs torch and triton: pip install torch triton (the gpu extra; "
                          "--dry-run works without them)") from None
    if probe:
        _measure_probe(output, budget, as_json)
    elif validate is not None:
        _measure_validate(validate, dtype or "auto", batch, ctx, layers, device, calibration, as_json)
    else:
        _measure_sweep(quick, output, device, as_json)


def _refuse_measure_mixes(quick, dry_run, output, gpu, device, validate, probe, budget, validate_only) -> None:
    """measure's four paths (--dry-run, --probe, --validate, the calibration sweep) each take their own options: one
    meant for another path is refused, not ignored."""
    from kvplan.errors import KvplanError

    if validate is None:
        stray = [k for k, v in validate_only.items() if v is not None]
        if stray:
            raise KvplanError(f"{stray[0]} applies with --validate MODEL; add --validate or drop it")
    if dry_run and validate is not None:
        raise KvplanError("--dry-run plans the calibration sweep; --validate times a model's decode step on the GPU: "
                          "give one of the two")
    if gpu is not None and not dry_run:
        raise KvplanError("--gpu names the GPU to plan for with --dry-run; a measurement runs on the GPU torch sees")
    if device != "cuda" and dry_run:
        raise KvplanError("--device picks where the kernels run; --dry-run runs none")
    if output is not None and (dry_run or validate is not None):
        raise KvplanError("--output is where a measurement writes its calibration profile; --dry-run and --validate "
                          "write none")
    if quick and validate is not None:
        raise KvplanError("--quick shortens the calibration sweep; --validate times one decode step: drop --quick")
    if budget is not None and not probe:
        raise KvplanError("--budget bounds the kernel sweep of --probe; add --probe or drop it")
    if probe:
        if dry_run or validate is not None or quick:
            raise KvplanError("--probe sweeps the decode kernels' settings on its own: drop "
                              + ("--dry-run" if dry_run else "--validate" if validate is not None else "--quick"))
        if device != "cuda":
            raise KvplanError("--probe times the kernels on a CUDA GPU; --device cpu runs none of it")
        if budget is not None and not 0 < budget < float("inf"):
            raise KvplanError(f"--budget {budget:g}: give a positive number of seconds")


def _measure_dry_run(gpu: Optional[str], quick: bool, as_json: bool) -> None:
    """The calibration sweep's plan for a GPU, measuring nothing."""
    from kvplan.specs.calibration import MB, measure_plan
    from kvplan.specs.catalog import load_gpu

    spec = load_gpu(gpu or "h100")
    plan = measure_plan(quick, l2_bytes=int((spec.l2_mb or 50) * MB),
                        bandwidth_bytes_per_s=spec.peak_bandwidth_bytes_per_s)
    if as_json:
        from dataclasses import asdict

        _show(True, {"gpu": spec.name, **asdict(plan), "total_bytes": plan.total_bytes,
                     "expected_seconds": plan.expected_seconds()}, "")
        return
    from kvplan.app.render_tools import measure_plan_table

    measure_plan_table(plan, spec)


def _validate_sizes(validate: str, dtype: Optional[str], batch: Optional[int], context: Optional[str],
                    layers: Optional[int]) -> tuple[int, int]:
    """--validate's batch and context, checked with its model and dtype."""
    from kvplan.errors import KvplanError

    batch = 8 if batch is None else batch
    if batch < 1 or (layers is not None and layers < 1):
        raise KvplanError("--batch and --layers must be positive")
    ctx = _sizes([context or "4096"], "--context")
    if len(ctx) != 1:
        raise KvplanError("--context: give one length")
    from kvplan.measure.run import validate_target

    validate_target(validate, dtype or "auto")
    return batch, ctx[0]


def _measure_probe(output: Optional[str], budget: Optional[float], as_json: bool) -> None:
    """--probe: the decode kernels' settings swept, the fastest of each format printed and written as JSON."""
    from kvplan.measure.run import run_probe

    path, found = run_probe(output, budget)
    if as_json:
        _show(True, found, "")
    else:
        for fmt, row in found["best"].items():
            print(f"fastest {fmt}: tile {row['tile']}, {row['num_warps']} warps, {row['num_stages']} stages, "
                  f"{row['splits_used']} splits: {row['seconds'] * 1e6:,.1f} us, "
                  f"{row['bytes_per_s'] / 1e12:.2f} TB/s")
        for method, row in found.get("flush", {}).items():
            if "seconds" in row:
                print(f"after a {method} flush: {row['seconds'] * 1e6:,.1f} us, "
                      f"{row['bytes_per_s'] / 1e12:.2f} TB/s")
        print(f"timed {found['timed']} of {found['planned']} configurations in {found['elapsed_s']:.0f} s"
              + (" (the budget ran out)" if found["stopped_at_budget"] else ""))
    print(f"wrote the probe's findings {path}", file=sys.stderr)


def _measure_validate(model: str, dtype: str, batch: int, context: int, layers: Optional[int], device: str,
                      calibration: Optional[str], as_json: bool) -> None:
    """--validate: one synthetic decode step of the model's shapes timed, beside the roofline and the prediction."""
    from kvplan.measure.run import run_validate

    result = run_validate(model, dtype, batch, context, layers, device, calibration)
    if as_json:
        _show(True, result, "")
        return
    from kvplan.app.render_tools import validate_table

    validate_table(result)


def _measure_sweep(quick: bool, output: Optional[str], device: str, as_json: bool) -> None:
    """The calibration sweep: every kernel family timed over its sizes, fitted, and the profile written."""
    from kvplan.app.render import console
    from kvplan.app.render_tools import calibration_table
    from kvplan.measure.run import run_measure

    path, profile = run_measure(quick=quick, output=output, device_name=device, console=console())
    calibration_table(profile)
    if as_json:
        _show(True, {"calibration_profile": str(path)}, "")
    print(f"wrote the calibration profile {path}", file=sys.stderr)


@app.command()
def quality(
    model: Annotated[Optional[str], typer.Argument(help="a Hugging Face id or snapshot folder (its weights are "
                                                   "loaded); with --synthetic, optional: a model whose shapes are "
                                                   "drawn")] = None,
    dtype: PlotDtypesOpt = None,  # the same default as the plots': auto and fp8
    text: Annotated[Optional[str], typer.Option("--text", help="a text file the model runs over")] = None,
    dataset: Annotated[Optional[str], typer.Option("--dataset", help="a Hugging Face data set's text instead: "
                                                   "wikitext2, or org/name[:config[:split]] (needs the datasets "
                                                   "package)")] = None,
    context: Annotated[Optional[str], typer.Option("--context", "-c", help="tokens per window: the text is cut into "
                                                   "windows this long, each from an empty cache (default 4096); "
                                                   "with --synthetic, the tokens drawn")] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="cuda or cpu (default: cuda where torch sees "
                                                  "a GPU; cpu with --synthetic)")] = None,
    synthetic: Annotated[bool, typer.Option("--synthetic", help="no model: K/V drawn with the structure the "
                                            "literature reports (outlier key channels, RoPE, a sink, outlier value "
                                            "tokens), and the tensor-level errors; a proxy, never a verdict")] = False,
    skip_layers: SkipOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What each KV format costs in accuracy on your model and text: the model runs teacher-forced with its cache
    stored in each format (post-RoPE keys, the format's scales and skip layers) and read back through the format's
    reference dequantizer; next-token KL to the model-dtype run, top-1 agreement, perplexity, per-layer errors of
    keys, values and attention, beside bits, capacity gain and the published evidence (the `quality` extra)."""
    from kvplan.errors import KvplanError
    from kvplan.specs.kv_formats import parse_dtypes

    from kvplan.quality import measurable

    # 'all': the catalog formats that store K and V and kvplan can store (MLA latents are not measured)
    formats = parse_dtypes(dtype, default="auto,fp8", served=measurable)
    tokens = _one_size(context, "--context") if context is not None else 4096
    if synthetic:
        given = [o for o, v in (("--text", text), ("--dataset", dataset), ("--kv-cache-dtype-skip-layers",
                                                                             skip_layers)) if v is not None]
        if given:
            raise KvplanError(f"{given[0]} applies to a model run; --synthetic draws one layer's K/V without a model")
    elif model is None:
        raise KvplanError("kvplan quality needs MODEL (a Hugging Face id or snapshot folder), or --synthetic")
    from kvplan.sizing.kv_cache import parse_skip_layers

    skip = parse_skip_layers(skip_layers)
    missing = [name for name in (("torch", "triton") if synthetic else ("torch", "triton", "transformers"))
               if not _importable(name)]
    if missing:
        raise KvplanError(f"kvplan quality needs {' and '.join(missing)} (the quality extra): pip install "
                          f"{' '.join(missing)}")
    from kvplan.app import render_tools

    if synthetic:
        from kvplan.quality.run import resolve_device
        from kvplan.quality.synthetic import run_synthetic

        spec = None
        shape = {}
        if model is not None:
            from kvplan.specs.catalog import load_model

            spec = load_model(model)
            shape = {"head_dim": spec.head_dim, "kv_heads": spec.num_kv_heads, "heads": spec.num_heads}
        result = run_synthetic(formats, tokens, device=resolve_device(device or "cpu"), model=spec, **shape)
        _show(as_json, result.to_dict(), "synthetic_table", result)
        return
    from kvplan.quality.run import load_text, run_quality

    body = load_text(text, dataset)
    result = run_quality(model, formats, body, tokens, device, skip, progress=render_tools.QualityProgress())
    _show(as_json, result.to_dict(), "quality_table", result)


def _importable(name: str) -> bool:
    """Whether `import name` works (an extra's package), without keeping a half-imported module."""
    try:
        __import__(name)
    except ImportError:
        return False
    return True


FormatsEngineOpt = Annotated[Optional[str], typer.Option(
    "--engine", help="with --gpu: the engine whose support matrix is shown: vllm (default) or sglang")]


@app.command()
@_takes("engine", "engine_version", engine=FormatsEngineOpt)
def formats(
    name: Optional[str] = typer.Argument(None, help="one format: its layout, who serves it, and the published "
                                         "accuracy results for it (with --gpu: its row of the support matrix)"),
    head_dim: Optional[int] = typer.Option(None, "--head-dim", help="head dimension the byte figures are computed "
                                           "at (default 128)"),
    kv_lora_rank: Optional[int] = typer.Option(None, "--kv-lora-rank", help="MLA latent width (no-RoPE part; "
                                               "default 512)"),
    rope_dim: Optional[int] = typer.Option(None, "--qk-rope-head-dim", help="MLA RoPE width (default 64)"),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", help="show the support matrix on this GPU: per KV dtype, whether the engine serves it there "
        "(served, what-if or refused, and why), and for vLLM the attention backend its selector picks, the block size "
        "it sets and the other backends that store it"),
    model: Optional[str] = typer.Option(
        None, "--model", help="with --gpu: the model the matrix plans each dtype on (default: llama3-8b, a dense GQA "
        "model, and deepseek-v3, an MLA one)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    **deployment,
) -> None:
    """The KV-cache format catalog: bytes per token per KV head (K+V, every scale and pad included), honest bits
    per element, the MLA latent size, and the layers each keeps in the model dtype by default. With --gpu (and
    --engine, --engine-version, --model): the support matrix, each dtype as kvplan plans it there."""
    from kvplan.errors import KvplanError
    from kvplan.specs.kv_formats import CATALOG, kv_format

    matrix = {"--gpu": gpu, "--model": model, "--engine": deployment["engine"],
              "--engine-version": deployment["engine_version"]}
    if any(v is not None for v in matrix.values()):
        _formats_matrix(name, gpu, model, deployment, {"--head-dim": head_dim, "--kv-lora-rank": kv_lora_rank,
                                                       "--qk-rope-head-dim": rope_dim}, as_json)
        return
    head_dim = 128 if head_dim is None else head_dim
    kv_lora_rank = 512 if kv_lora_rank is None else kv_lora_rank
    rope_dim = 64 if rope_dim is None else rope_dim
    if head_dim < 1 or kv_lora_rank < 1 or rope_dim < 0:
        raise KvplanError("--head-dim and --kv-lora-rank must be positive, --qk-rope-head-dim not negative")
    rows = []
    for f in CATALOG.values() if name is None else [kv_format(name)]:
        mha = f.applies_to != "mla"
        row = {
            "name": f.name,
            "family": f.family,
            "engines": list(f.engines),
            "applies_to": f.applies_to,
            "k_bytes": f.k_bytes(head_dim) if mha else None,
            "v_bytes": f.v_bytes(head_dim) if mha else None,
            "bytes_per_token_per_kv_head": f.bytes_per_token_per_kv_head(head_dim) if mha else None,
            "bits_per_element": f.bits_per_element(head_dim) if mha else None,
            "mla_bytes_per_token": f.mla_bytes_per_token(kv_lora_rank, rope_dim) if f.applies_to != "mha" else None,
            "residual_tokens": f.residual_tokens,
            "default_skip": "first 2 + last 2" if f.default_skip == "boundary" else "none",
            "description": f.description,
        }
        rows.append(row)
    if name is not None:
        from dataclasses import asdict

        from kvplan.specs.kv_evidence import evidence_for, notes_for

        f = kv_format(name)
        detail = {**rows[0], "serves": [{"engine": x.engine, "platform": x.platform, "where": x.where(),
                                         "source": x.source, "until": x.until} for x in f.serves],
                  "evidence": [asdict(e) for e in evidence_for(f.name)],
                  "notes": [asdict(n) for n in notes_for(f.name)]}
        _show(as_json, detail, "format_detail", detail, head_dim)
        return
    _show(as_json, rows, "formats_table", rows, head_dim, (kv_lora_rank, rope_dim))


def _formats_matrix(name: Optional[str], gpu: Optional[str], model: Optional[str], deployment: dict,
                    byte_options: dict, as_json: bool) -> None:
    """`formats --gpu G [--engine E] [--engine-version V] [--model M] [NAME]`: the support matrix
    (kvplan.plan.format_support), every catalog format or the one named."""
    from kvplan.errors import KvplanError
    from kvplan.plan.format_support import support_matrix
    from kvplan.specs.kv_formats import kv_format

    given = [k for k, v in byte_options.items() if v is not None]
    if given:
        raise KvplanError(f"{given[0]} sets the byte figures of the format listing; the support matrix plans each "
                          f"dtype on a model (--model): drop one of the two")
    if gpu is None:
        said = "--model" if model is not None else "--engine" if deployment["engine"] is not None else \
            "--engine-version"
        raise KvplanError(f"{said}: the support matrix is per GPU; add --gpu (e.g. --gpu h100), or drop {said} for "
                          f"the format listing")
    fmts = [kv_format(name)] if name is not None else None
    sm = support_matrix(gpu, deployment["engine"], deployment["engine_version"], [model] if model else None, fmts)
    _show(as_json, sm.to_dict(), "formats_matrix_table", sm)


def _model_row(key: str, m) -> dict:
    from kvplan.sizing.kv_cache import kv_bytes_per_token, kv_layers
    from kvplan.sizing.model_tensors import param_count
    from kvplan.specs.kv_formats import kv_format

    kinds = m.layer_kinds
    if m.is_mla:
        att = f"MLA {m.mla.latent_dim}"
    elif not m.is_hybrid and kinds[0] == "full":
        att = "full"
    else:
        short = {"sliding": "SW", "chunked": "chunk", "full": "full"}
        parts = []
        for k in ("sliding", "chunked", "full"):
            n = kinds.count(k)
            if n:
                w = m.window_of(k)
                parts.append(f"{n} {short[k]}" + (f"{w}" if w else ""))
        parts += [f"{len(layers)} {st.label}" for st, layers in m.state_groups]  # each state mixer's layers
        att = " + ".join(parts)
    return {
        "key": key, "name": m.name, "params": param_count(m), "layers": m.num_layers,
        "heads": f"{m.num_heads}/{m.num_kv_heads if not m.is_mla else '-'}",
        "head_dim": str(m.head_dim) if m.head_dim else "-",
        "attention": att,
        "moe": f"{m.moe.experts_per_token}/{m.moe.num_experts}" + (f"+{m.moe.shared_experts}" if m.moe.shared_experts else "") if m.moe else "-",
        "weights": m.weight_dtype + ("" if m.weight_scope == "linear" else f" {m.weight_scope}"),
        "context": m.max_position_embeddings,
        "kv_bytes_per_token": kv_bytes_per_token(kv_layers(m, kv_format("auto"))),
    }


@models_app.callback()
def models_list(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the bundled models."""
    if ctx.invoked_subcommand:
        return
    from kvplan.specs.catalog import catalog_entries

    rows = [_model_row(k, m) for k, m in catalog_entries("models")]
    _show(as_json, rows, "models_table", rows)


def _group_json(ctx: typer.Context) -> bool:
    """`kvplan models --json show NAME`: the group's --json applies to its show as well."""
    return bool(ctx.parent is not None and ctx.parent.params.get("as_json"))


@models_app.command("show")
def models_show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="catalog name, Hugging Face id (org/name or org/name@revision), "
                                          "config.json, snapshot folder or YAML spec"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Show one model spec, with its computed parameter count and, for a snapshot folder or a Hugging Face id, the
    checkpoint's own from its safetensors headers (no weights downloaded), and whether the two agree."""
    from kvplan.errors import KvplanError, UnmodelledWeights
    from kvplan.sizing.model_tensors import active_param_count, param_count
    from kvplan.specs.catalog import load_model

    try:
        m = load_model(name, checkpoint=True)
    except UnmodelledWeights as e:
        raise KvplanError(f"{e.problem}; `models show` shows the checkpoint as it is: capacity, crossover, "
                          f"throughput and sweep plan it with --weight-dtype") from None
    extra = {"computed_params": param_count(m)}
    table = {}
    if m.checkpoint_params:  # what the safetensors hold, beside the architecture's count
        extra["checkpoint_params"] = m.checkpoint_params
        extra["checkpoint_agrees"] = _checkpoint_agrees(m, extra["computed_params"])
    elif m.checkpoint_unavailable:
        table = {"checkpoint_unavailable": None, "checkpoint_params": f"unavailable: {m.checkpoint_unavailable}"}
    if m.moe:
        extra["active_params"] = active_param_count(m)
    _show(as_json or _group_json(ctx), {**m.model_dump(), **extra}, "spec_detail", m, {**extra, **table})


def _checkpoint_agrees(m, computed: int) -> str:
    """Whether a snapshot's tensors match the architecture's count (packed quantized weights hold fewer elements;
    extra layers, such as multi-token prediction, more)."""
    diff = m.checkpoint_params - computed
    if abs(diff) <= 0.001 * computed:
        return "yes"
    if m.weight_dtype not in ("bf16", "fp16", "fp32"):
        return f"not comparable: {m.weight_dtype} packs its weights ({diff:+,} elements)"
    if diff < 0:
        return f"no: the checkpoint holds {-diff:,} fewer elements than the architecture (missing shards or layers?)"
    return f"no: the checkpoint holds {diff:+,} elements beyond the architecture (extra layers or heads?)"


@gpus_app.callback()
def gpus_list(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the bundled GPUs."""
    if ctx.invoked_subcommand:
        return
    from kvplan.specs.catalog import catalog_entries

    gpus = catalog_entries("hardware")
    data = [{"key": k, **g.model_dump(), "memory_total_gib": g.memory_total_gib} for k, g in gpus]
    _show(as_json, data, "gpus_table", gpus)


@gpus_app.command("show")
def gpus_show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="GPU name, alias or YAML spec path"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Show one GPU spec."""
    from kvplan.specs.catalog import load_gpu

    g = load_gpu(name)
    extra = {"memory_total_gib (used)": f"{g.memory_total_gib:.2f} ({g.memory_source})"}
    data = {**g.model_dump(), "memory_total_gib": g.memory_total_gib, "memory_source": g.memory_source}
    _show(as_json or _group_json(ctx), data, "spec_detail", g, extra)
