"""The `kvplan` command line: parse, call the library, render. No arithmetic here."""

from __future__ import annotations

import os
import sys
from typing import Annotated, List, Optional

import typer

app = typer.Typer(
    name="kvplan",
    help="What a KV-cache format buys on a given model, GPU and parallelism with vLLM or SGLang: the crossover "
    "where KV traffic overtakes weight traffic, the pool's tokens, blocks and concurrency, measured kernel speed, "
    "and capacity gates for CI.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
def _fold_option_names() -> None:
    """In --help, an option name wider than its column (--kv-cache-dtype-skip-layers at 80 columns) continues on
    the next line instead of being cut with an ellipsis, so that the whole name can be read and typed."""
    try:
        import typer.rich_utils as rich_help
    except ImportError:  # typer without rich: click's plain help never cuts names
        return
    for name in ("highlighter", "negative_highlighter"):
        shown = getattr(rich_help, name, None)
        if shown is None or getattr(shown, "folds", False):
            continue

        class Folding(type(shown)):  # type: ignore[misc]
            folds = True

            def __call__(self, text):
                out = super().__call__(text)
                if hasattr(out, "overflow"):
                    out.overflow = "fold"
                return out

        setattr(rich_help, name, Folding())


# The exit status of the running command so far: a command that will exit non-zero after printing sets it first,
# so that output cut short by a closed pipe (`kvplan gate gates.yaml | head -1`) still exits with it.
_exit = {"status": 0}


def _print_version(value: bool) -> None:
    if value:
        from kvplan import __version__

        typer.echo(f"kvplan {__version__}")
        raise typer.Exit()


@app.callback()
def _kvplan(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print kvplan's version and exit"),
) -> None:
    pass


models_app = typer.Typer(help="The model catalog: `kvplan models` lists it, `kvplan models show NAME` shows one.",
                         invoke_without_command=True, no_args_is_help=False)
gpus_app = typer.Typer(help="The GPU catalog: `kvplan gpus` lists it, `kvplan gpus show NAME` shows one.",
                       invoke_without_command=True, no_args_is_help=False)
plot_app = typer.Typer(help="Draw the diagnosis figures: PNG or SVG with --output (needs matplotlib: pip install "
                        "matplotlib), a character chart in the terminal otherwise.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(gpus_app, name="gpus")
app.add_typer(plot_app, name="plot")

# Options shared by several commands: each is declared once here, and every command that takes it uses the same
# declaration, so an option means the same thing everywhere (its meaning lives in kvplan.deployment).
DTYPE_HELP = ("KV cache dtype: a name from `kvplan formats`, several (repeat the option or separate with commas), "
              "'all', or custom:bits=4,group=32,...")
SKIP_HELP = ("layers kept in the model dtype: indices (0,1,30,31), 'sliding_window', or 'none'; "
             "default: the format's own (the turboquant presets keep the first and last two layers)")
JSON_HELP = "print machine-readable JSON instead of tables"

ModelArg = Annotated[str, typer.Argument(help="catalog name (e.g. llama3-8b), a YAML spec path, or a config.json path")]
GpuOpt = Annotated[Optional[str], typer.Option("--gpu", help="GPU name or YAML spec (memory total as CUDA reports it)")]
DtypesOpt = Annotated[Optional[List[str]], typer.Option("--kv-cache-dtype", "--dtype", "-d", help=DTYPE_HELP)]
PlotDtypesOpt = Annotated[Optional[List[str]], typer.Option("--kv-cache-dtype", "--dtype", "-d",
                                                            help=DTYPE_HELP + " (default: auto and fp8)")]
TpOpt = Annotated[Optional[int], typer.Option("--tp", help="tensor-parallel size (figures are per rank; default: "
                                              "the profile's, or 1)")]
TpNoProfileOpt = Annotated[Optional[int], typer.Option("--tp", help="tensor-parallel size (figures are per rank; "
                                                       "default 1)")]
WeightDtypeOpt = Annotated[Optional[str], typer.Option(
    "--weight-dtype", help="store every decoder linear layer in this format (bf16, fp8, int8, int4_g128, mxfp4, "
    "nvfp4, ...); default: the checkpoint's own")]
SkipOpt = Annotated[Optional[str], typer.Option("--kv-cache-dtype-skip-layers", help=SKIP_HELP)]
JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
CalibrationOpt = Annotated[Optional[str], typer.Option(
    "--calibration", help="a profile from `kvplan measure`: step times from measured bandwidth and per-call cost, "
    "and its measured memory total (default: one saved for --gpu in kvplan's cache, if any)")]
WeightReadOpt = Annotated[str, typer.Option(
    "--weight-read", help="weights a step reads: 'streamed' (no untied input-embedding table, only touched experts) "
    "or 'all' (every parameter, the back-of-envelope convention)")]
EngineOpt = Annotated[Optional[str], typer.Option(
    "--engine", help="serving engine whose rules plan the pool: vllm (default) or sglang")]
EngineVersionOpt = Annotated[Optional[str], typer.Option(
    "--engine-version", help="vLLM version whose rules apply: 0.19 (and earlier), 0.20, 0.25, 0.28, 0.30, 0.33 "
    "(default, newest); SGLang is planned with 0.5's rules")]
PpOpt = Annotated[Optional[int], typer.Option("--pp", help="vLLM pipeline-parallel size: layers split over stages, "
                                              "the fewest blocks of any rank set the pool (default 1)")]
DcpOpt = Annotated[Optional[int], typer.Option(
    "--dcp", help="vLLM decode-context-parallel size (default 1; divides --tp, at most tp // KV heads on GQA models): "
    "each sequence's tokens spread over this many ranks")]
UtilOpt = Annotated[Optional[float], typer.Option(
    "--gpu-memory-utilization", help="vLLM: fraction of TOTAL memory it may use (default: the profile's, or vLLM's: "
    "0.92 from 0.20 on, 0.9 before)")]
UtilNoProfileOpt = Annotated[Optional[float], typer.Option(
    "--gpu-memory-utilization", help="vLLM: fraction of TOTAL memory it may use (default: vLLM's: 0.92 from 0.20 "
    "on, 0.9 before)")]
BlockSizeOpt = Annotated[Optional[int], typer.Option(
    "--block-size", help="vLLM: tokens per KV block, a multiple of 16 (default: the attention backend's: 16, or 64 "
    "for MLA on FlashMLA, 128 on CUTLASS MLA)")]
ActivationOpt = Annotated[Optional[float], typer.Option(
    "--activation-gib", help="vLLM, GiB. Alone: one flat allowance for everything beyond the weights (the "
    "back-of-envelope 6.0); with --non-torch-gib or --cudagraph-gib: the activation peak only. Default: vLLM's "
    "non-KV memory modelled part by part")]
NonTorchOpt = Annotated[Optional[float], typer.Option(
    "--non-torch-gib", help="vLLM: replace the modelled non-torch memory (libraries, NCCL, all-reduce workspaces), GiB")]
CudagraphOpt = Annotated[Optional[float], typer.Option(
    "--cudagraph-gib", help="vLLM: replace the modelled CUDA-graph estimate, GiB")]
MaxSeqsOpt = Annotated[Optional[int], typer.Option(
    "--max-num-seqs", help="vLLM: sizes the sampler and its state (default: vLLM serve's for the GPU)")]
EagerOpt = Annotated[bool, typer.Option("--enforce-eager", help="vLLM: no CUDA graphs (and no estimate for them)")]
SsmDtypeOpt = Annotated[Optional[str], typer.Option(
    "--mamba-ssm-cache-dtype", help="vLLM, hybrid and state-space models: the SSM (or linear-attention) state's dtype "
    "in the cache: auto (the config's, else the version's default), float32, float16, bfloat16")]
LanguageOnlyOpt = Annotated[bool, typer.Option(
    "--language-model-only", help="vLLM, vision-language models: the vision tower and projector are neither built "
    "nor profiled (vLLM's --language-model-only, or --limit-mm-per-prompt with every modality at 0)")]
EntrypointOpt = Annotated[Optional[str], typer.Option(
    "--entrypoint", help="how vLLM is started, which sets its batch defaults: serve (the API server, default) or llm "
    "(the offline LLM class, twice the batched tokens)")]
GpuMemOpt = Annotated[Optional[float], typer.Option("--gpu-memory-gib", help="override the total memory, GiB")]
FreeMemOpt = Annotated[Optional[float], typer.Option(
    "--free-memory-gib", help="the memory free on the GPU before the engine starts, GiB (another process may hold "
    "some): vLLM refuses to start below its requested share; SGLang sizes its pool from it")]
KvMemOpt = Annotated[Optional[float], typer.Option(
    "--kv-cache-memory", help="vLLM: KV pool size in GiB, given directly (skips the budget, like vLLM's "
    "--kv-cache-memory-bytes)")]
BatchedOpt = Annotated[Optional[int], typer.Option(
    "--max-num-batched-tokens", help="vLLM: sizes the profile run and caps sliding-window allocation (default: "
    "vLLM serve's for the GPU)")]
OverrideOpt = Annotated[Optional[int], typer.Option(
    "--num-gpu-blocks-override", help="vLLM: use this many blocks, whatever the memory (like vLLM's option)")]
ProfileOpt = Annotated[Optional[str], typer.Option(
    "--profile", help="a deployment profile (`kvplan log ... --save-profile`): start from the overheads that "
    "deployment measured")]
MemFractionOpt = Annotated[Optional[float], typer.Option(
    "--mem-fraction-static", help="SGLang: the share of free memory for weights and KV (default: SGLang's rule)")]
PageSizeOpt = Annotated[Optional[int], typer.Option("--page-size", help="SGLang: tokens per page (default 1)")]
MaxModelLenOpt = Annotated[Optional[str], typer.Option(
    "--max-model-len", help="tokens per sequence, e.g. 32768 or 32k (default: the model's max_position_embeddings); "
    "auto (or -1, as in vLLM): the longest that fits the pool")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", "-o", help="a .png or .svg file")]
# data and expert parallelism, in each engine's spelling
DpOpt = Annotated[Optional[int], typer.Option(
    "--data-parallel-size", "-dp", help="vLLM: data-parallel ranks, each an engine of --tp GPUs with its own requests "
    "and KV pool (default 1)")]
DpLocalOpt = Annotated[Optional[int], typer.Option(
    "--data-parallel-size-local", help="vLLM: DP ranks per node (default: as many as an NVLink domain holds)")]
EpOpt = Annotated[bool, typer.Option(
    "--enable-expert-parallel", help="vLLM: MoE layers hold whole experts over tp x dp ranks instead of splitting "
    "each")]
A2aOpt = Annotated[Optional[str], typer.Option(
    "--all2all-backend", help="vLLM: how expert-parallel DP ranks exchange tokens: allgather_reducescatter (default), "
    "naive, pplx, deepep_high_throughput, deepep_low_latency, flashinfer_all2allv")]
EplbOpt = Annotated[bool, typer.Option("--enable-eplb", help="vLLM: expert-parallel load balancing (needs "
                                       "--enable-expert-parallel)")]
RedundantOpt = Annotated[Optional[int], typer.Option(
    "--num-redundant-experts", help="vLLM, with --enable-eplb: extra expert replicas spread over the EP ranks")]
SgDpOpt = Annotated[Optional[int], typer.Option(
    "--dp-size", help="SGLang: data-parallel size: attention groups with --enable-dp-attention, else replicas")]
SgDpAttnOpt = Annotated[bool, typer.Option(
    "--enable-dp-attention", help="SGLang: attention data parallel in --dp-size groups of tp / dp GPUs, each with its "
    "own KV pool")]
SgEpOpt = Annotated[Optional[int], typer.Option(
    "--ep-size", help="SGLang: expert-parallel size, dividing --tp (MoE layers run as ep x tp / ep)")]
SgA2aOpt = Annotated[Optional[str], typer.Option(
    "--moe-a2a-backend", help="SGLang: MoE all-to-all backend: none (default), deepep, mooncake, ascend_fuseep, "
    "flashinfer")]
SgRedundantOpt = Annotated[Optional[int], typer.Option(
    "--ep-num-redundant-experts", help="SGLang: extra expert replicas spread over the EP ranks")]
SgDenseTpOpt = Annotated[Optional[int], typer.Option(
    "--moe-dense-tp-size", help="SGLang, with --enable-dp-attention: 1 keeps dense MLPs whole in each attention group")]
SgDpLmHeadOpt = Annotated[bool, typer.Option(
    "--enable-dp-lm-head", help="SGLang, with --enable-dp-attention: the LM head whole in each attention group")]

# The deployment options by name, each declared once: (declaration, default). A command takes the ones it names with
# @_takes, and receives them as its **deployment, the keyword arguments of kvplan.deployment.DeploymentArgs.
DEPLOYMENT_OPTIONS: dict = {
    "tp": (TpOpt, None), "pp": (PpOpt, None), "dcp": (DcpOpt, None), "weight_dtype": (WeightDtypeOpt, None),
    "engine": (EngineOpt, None), "engine_version": (EngineVersionOpt, None),
    "gpu_memory_utilization": (UtilOpt, None), "max_model_len": (MaxModelLenOpt, None),
    "max_num_seqs": (MaxSeqsOpt, None), "max_num_batched_tokens": (BatchedOpt, None),
    "block_size": (BlockSizeOpt, None), "skip_layers": (SkipOpt, None),
    "mamba_ssm_cache_dtype": (SsmDtypeOpt, None), "activation_gib": (ActivationOpt, None),
    "non_torch_gib": (NonTorchOpt, None), "cudagraph_gib": (CudagraphOpt, None), "enforce_eager": (EagerOpt, False),
    "language_model_only": (LanguageOnlyOpt, False), "entrypoint": (EntrypointOpt, None),
    "gpu_memory_gib": (GpuMemOpt, None), "free_memory_gib": (FreeMemOpt, None), "kv_cache_memory": (KvMemOpt, None),
    "num_gpu_blocks_override": (OverrideOpt, None), "profile": (ProfileOpt, None),
    "mem_fraction_static": (MemFractionOpt, None), "page_size": (PageSizeOpt, None),
    "data_parallel_size": (DpOpt, None), "data_parallel_size_local": (DpLocalOpt, None),
    "enable_expert_parallel": (EpOpt, False), "all2all_backend": (A2aOpt, None), "enable_eplb": (EplbOpt, False),
    "num_redundant_experts": (RedundantOpt, None), "dp_size": (SgDpOpt, None),
    "enable_dp_attention": (SgDpAttnOpt, False), "ep_size": (SgEpOpt, None), "moe_a2a_backend": (SgA2aOpt, None),
    "ep_num_redundant_experts": (SgRedundantOpt, None), "moe_dense_tp_size": (SgDenseTpOpt, None),
    "enable_dp_lm_head": (SgDpLmHeadOpt, False), "calibration": (CalibrationOpt, None),
}
VLLM_LAYOUT = ("data_parallel_size", "data_parallel_size_local", "enable_expert_parallel", "all2all_backend",
               "enable_eplb", "num_redundant_experts")
# every option of the deployment: what `capacity` and `throughput` take
DEPLOYMENT = tuple(DEPLOYMENT_OPTIONS)
# the memory options of vLLM's pool: what `sweep` and `plot capacity` take beside their own
VLLM_MEMORY = ("gpu_memory_utilization", "block_size", "activation_gib", "non_torch_gib", "cudagraph_gib",
               "max_num_seqs", "enforce_eager", "language_model_only", "mamba_ssm_cache_dtype", "entrypoint",
               "gpu_memory_gib", "weight_dtype", "skip_layers", "max_num_batched_tokens", "engine_version", "pp", "dcp")


def _takes(*names: str, **declared):
    """Give a command the named deployment options (with `declared`, another declaration of some: a help text that
    suits the command), placed before its --output and --json; it receives them as its **deployment."""
    import inspect

    def add(command):
        sig = inspect.signature(command, eval_str=True)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        at = next((i for i, p in enumerate(own) if p.name in ("output", "as_json")), len(own))
        taken = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=DEPLOYMENT_OPTIONS[n][1],
                                   annotation=declared.get(n, DEPLOYMENT_OPTIONS[n][0])) for n in names]
        tail = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[at:]]
        command.__signature__ = sig.replace(parameters=own[:at] + taken + tail)
        return command
    return add


def _show(as_json: bool, data, table: str, *args) -> None:
    """Print `data` as JSON, or call the named table renderer with `args`."""
    from kvplan.app import render

    if as_json:
        render.print_json(data)
    else:
        getattr(render, table)(*args)


MAX_SIZE = 2**53  # the largest token count or batch: beyond it float64 arithmetic no longer holds whole numbers


def _sizes(values: Optional[List[str]], option: str) -> list[int]:
    """Token counts from the command line: 131072, 128k (x1024), 2m (x1024^2), comma-separated or repeated; each a
    whole number (1.5k is 1,536; 1.5 is refused), read exactly, at most 2**53; exponent notation (1e6) is refused."""
    import re
    from fractions import Fraction

    from kvplan.errors import KvplanError

    out: list[int] = []
    for v in values or []:
        for part in filter(None, (p.strip().lower() for p in v.split(","))):
            m = re.fullmatch(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([km]?)", part)
            if m is None:
                e = re.fullmatch(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)e[+-]?[0-9]{1,4})([km]?)", part)
                if e:
                    x = Fraction(e.group(1)) * {"k": 1024, "m": 1024**2, "": 1}[e.group(2)]
                    digits = (f"write the digits ({int(x)})" if x.denominator == 1 and 1 <= x <= MAX_SIZE else
                              f"write a whole number from 1 to 2**53 ({MAX_SIZE:,})")
                    raise KvplanError(f"{option} '{part}': exponent notation is not taken; {digits} or use k or m "
                                      f"(128k, 2m)")
                raise KvplanError(f"{option} '{part}': expected a whole number such as 8192 or 128k")
            x = Fraction(m.group(2)) * {"k": 1024, "m": 1024**2, "": 1}[m.group(3)] * (-1 if m.group(1) == "-" else 1)
            if x.denominator != 1:
                raise KvplanError(f"{option} '{part}': expected a whole number such as 8192 or 128k")
            if x < 1:
                raise KvplanError(f"{option} must be at least 1, got {part}")
            if x > MAX_SIZE:
                raise KvplanError(f"{option} '{part}': at most 2**53 ({MAX_SIZE:,}), the largest whole number "
                                  f"kvplan's arithmetic holds exactly")
            out.append(int(x))
    return out


def _one_size(value: str, option: str) -> int:
    """One token count or batch size (an operating point): 8192 or 8k, not a list."""
    from kvplan.errors import KvplanError

    sizes = _sizes([value], option)
    if len(sizes) != 1:
        raise KvplanError(f"{option} '{value}': give one whole number, such as 8192 or 8k")
    return sizes[0]


def _model_len(value: Optional[str]) -> Optional[int | str]:
    """--max-model-len: a token count (32768, 32k), or auto / -1 for the longest that fits."""
    from kvplan.errors import KvplanError

    if value is None:
        return None
    if value.strip().lower() in ("auto", "-1"):
        return "auto"
    if value.strip().lstrip("-").isdigit() and int(value) < 1:
        raise KvplanError(f"--max-model-len must be positive (or auto, the longest that fits), got {value}")
    sizes = _sizes([value], "--max-model-len")
    if len(sizes) != 1:
        raise KvplanError(f"--max-model-len '{value}': give one length (or auto)")
    return sizes[0]


def _formats_for(model, values: Optional[List[str]], default: Optional[List[str]] = None, args=None) -> list:
    """The KV formats asked for. 'all' means the formats the engine serves on the GPU of `args` (the deployment
    asked for; any GPU where it names none). With several, formats for the other attention layout (MLA or heads)
    are left out; a single one that does not apply is an error, raised where it is used."""
    from kvplan.errors import KvplanError
    from kvplan.specs.kv_formats import parse_dtypes

    served = None
    if args is not None:
        from kvplan.specs.catalog import load_gpu

        prof = args.profile if not isinstance(args.profile, str) else None
        engine = (args.engine or getattr(prof, "engine", None) or "vllm").lower()
        gpu = args.gpu or getattr(prof, "gpu", None)
        gpu = load_gpu(gpu) if isinstance(gpu, str) else gpu

        def served(f):
            return f.served_on(engine, gpu)
    fmts = parse_dtypes(values or default, served=served)
    if len(fmts) == 1:
        return fmts
    kept = [f for f in fmts if f.applies_to == "both" or (f.applies_to == "mla") == model.is_mla]
    if not kept:
        raise KvplanError(f"none of the chosen KV dtypes applies to {model.name}")
    return kept


def _deployment_args(**given):
    """The deployment the command line describes (kvplan.deployment.DeploymentArgs): every command builds it the
    same way, from the options it declares."""
    from kvplan.deployment import DeploymentArgs

    if "max_model_len" in given:
        given["max_model_len"] = _model_len(given["max_model_len"])
    if "kv_cache_memory" in given:
        given["kv_cache_memory_gib"] = given.pop("kv_cache_memory")
    if "skip_layers" in given:
        given["kv_cache_dtype_skip_layers"] = given.pop("skip_layers")
    return DeploymentArgs(**given)


def _unfit(results) -> None:
    """Dtypes whose pool does not hold the configuration: one line, exit 2 (after the tables, when others fit)."""
    from kvplan.errors import KvplanError

    bad = [r for r in results if not r.fits]
    if not bad:
        return
    if len(results) == 1:
        raise KvplanError(bad[0].problem)
    others = f" (and {', '.join(r.dtype for r in bad[1:])})" if len(bad) > 1 else ""
    raise KvplanError(f"{bad[0].dtype} does not fit{others}: {bad[0].problem}")


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
    ds = deployments(args, _formats_for(m, dtype, args=args))
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

        results.insert(0, run(replace(ds[0], kv=kv_format(baseline), skip=None)))
    _show(as_json, data, "crossover_tables", results, m, ds[0].gpu)


IslOpt = Annotated[Optional[str], typer.Option("--isl", help="prompt tokens per request (e.g. 1024, 8k)")]
OslOpt = Annotated[Optional[str], typer.Option("--osl", help="output tokens per request (e.g. 1024, 1k)")]
ConcurrencyOpt = Annotated[Optional[List[str]], typer.Option(
    "--concurrency", "-n", help="concurrent requests (e.g. 4,16,64); default: powers of two up to what the KV pool "
    "holds")]
TpotOpt = Annotated[Optional[float], typer.Option(
    "--tpot-ms", help="time-per-output-token limit: pick each dtype's best concurrency that meets it")]
TtftOpt = Annotated[Optional[float], typer.Option(
    "--ttft-ms", help="time-to-first-token limit, with or without --tpot-ms")]


def _throughput(model: str, gpu: Optional[str], isl: Optional[str], osl: Optional[str], concurrency, dtype,
                tpot_ms, ttft_ms, percentile: str = "mean", num_prompts: Optional[int] = None,
                request_rate: Optional[float] = None, **deployment):
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
    ds = deployments(args, _formats_for(m, dtype, comparison_dtypes(m, engine_of(args)), args), needs_memory=True)
    r = throughput_of(ds, _one_size(isl, "--isl"), _one_size(osl, "--osl"),
                      _sizes(concurrency, "--concurrency") or None, tpot_ms, ttft_ms, percentile, num_prompts,
                      request_rate=request_rate)
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


PercentileOpt = Annotated[str, typer.Option(
    "--percentile", help="the figure --tpot-ms and --ttft-ms hold: mean (default), p50, p90 or p99 of the requests")]
NumPromptsOpt = Annotated[Optional[int], typer.Option(
    "--num-prompts", help="requests each concurrency's benchmark sends (default 1000, as vllm bench serve)")]
RequestRateOpt = Annotated[Optional[float], typer.Option(
    "--request-rate", help="requests per second, as Poisson arrivals (an open loop; the concurrency caps those in "
    "flight); default: every client sends at once")]


@app.command()
@_takes(*DEPLOYMENT)
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
                           request_rate, **opts)
        _show(as_json, r.to_dict(), "throughput_table", r, m)
        return
    from kvplan.deployment import engine_of, layout_label, parse_layout
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
                           request_rate, **{**opts, **fields_})
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
    ds = deployments(replace(args, model=m), fmts, needs_memory=True)
    if ds[0].engine == "sglang":
        from kvplan.plan.sglang_pool import sglang_capacity

        results = [sglang_capacity(d) for d in ds]
        table = "sglang_table"
    else:
        from kvplan.plan.vllm_pool import capacity_of

        results = [capacity_of(d) for d in ds]
        table = "capacity_table"
    if all(not r.fits for r in results):
        _unfit(results)
    data = [r.to_dict() for r in results] if len(results) > 1 else results[0].to_dict()
    _exit["status"] = 2 if any(not r.fits for r in results) else 0
    _show(as_json, data, table, results, m, ds[0].gpu)
    _unfit(results)


def _capacity_listing(args, fmts, as_json: bool) -> None:
    from dataclasses import replace

    from kvplan.errors import KvplanError
    from kvplan.plan.vllm_pool import capacity_of
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
    ds = deployments(args, _formats_for(m, dtype, comparison_dtypes(m), args), needs_memory=True)
    _draw(capacity_figure(ds), output, as_json)


def _names(values: Optional[List[str]]) -> list[str]:
    return [p.strip() for v in values or [] for p in v.split(",") if p.strip()]


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
    from kvplan.app.render import measure_plan_table

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
    from kvplan.app.render import validate_table

    validate_table(result)


def _measure_sweep(quick: bool, output: Optional[str], device: str, as_json: bool) -> None:
    """The calibration sweep: every kernel family timed over its sizes, fitted, and the profile written."""
    from kvplan.app.render import calibration_table, console
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

    # 'all': the catalog formats that store K and V (MLA latents are not measured)
    formats = parse_dtypes(dtype, default="auto,fp8", served=lambda f: f.applies_to != "mla")
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
    from kvplan.app import render

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
    result = run_quality(model, formats, body, tokens, device, skip, progress=render.QualityProgress())
    _show(as_json, result.to_dict(), "quality_table", result)


def _importable(name: str) -> bool:
    """Whether `import name` works (an extra's package), without keeping a half-imported module."""
    try:
        __import__(name)
    except ImportError:
        return False
    return True


@app.command()
def formats(
    name: Optional[str] = typer.Argument(None, help="one format: its layout, who serves it, and the published "
                                         "accuracy results for it"),
    head_dim: int = typer.Option(128, "--head-dim", help="head dimension the byte figures are computed at"),
    kv_lora_rank: int = typer.Option(512, "--kv-lora-rank", help="MLA latent width (no-RoPE part)"),
    rope_dim: int = typer.Option(64, "--qk-rope-head-dim", help="MLA RoPE width"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The KV-cache format catalog: bytes per token per KV head (K+V, every scale and pad included), honest bits
    per element, the MLA latent size, and the layers each keeps in the model dtype by default."""
    from kvplan.errors import KvplanError
    from kvplan.specs.kv_formats import CATALOG, kv_format

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


def _model_row(key: str, m) -> dict:
    from kvplan.sizing.kv_cache import kv_bytes_per_token, kv_layers
    from kvplan.sizing.weights import param_count
    from kvplan.specs.kv_formats import kv_format

    kinds = m.layer_kinds
    if m.is_mla:
        att = f"MLA {m.mla.latent_dim}"
    elif not m.is_hybrid and kinds[0] == "full":
        att = "full"
    else:
        state = {"mamba2": "Mamba-2", "gdn": "GDN", "mamba": "Mamba"}.get(m.state.kind, "state") if m.state else ""
        short = {"sliding": "SW", "chunked": "chunk", "full": "full", "state": state}
        parts = []
        for k in ("sliding", "chunked", "full", "state"):
            n = kinds.count(k)
            if n:
                w = m.window_of(k)
                parts.append(f"{n} {short[k]}" + (f"{w}" if w else ""))
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
    from kvplan.sizing.weights import active_param_count, param_count
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


def _join_wrapped_lines(command) -> None:
    """Help texts are wrapped in the source; join each paragraph into one line, so that the command listing reflows
    to the terminal's width instead of breaking where the source did."""
    import re

    for sub in getattr(command, "commands", {}).values():
        if sub.help:
            sub.help = re.sub(r"(?<!\n)\n(?!\n)\s*", " ", sub.help)
        _join_wrapped_lines(sub)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback. Output cut short by a
    closed pipe (`kvplan ... | head`) ends quietly, with the status the command had."""
    import errno

    from kvplan.errors import KvplanError

    args = sys.argv[1:] if argv is None else argv
    command = _command_for(args)
    if "-h" in args or "--help" in args or not args:
        _fold_option_names()
    _join_wrapped_lines(command)
    _flags_without_type(command)
    _usage_names(command)
    _exit["status"] = 0
    streams = sys.stdout, sys.stderr
    try:
        rv = command.main(args=argv, prog_name="kvplan", standalone_mode=False)
    except KvplanError as e:
        print(f"kvplan: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _discard_stdout()
    except SystemExit as e:
        # typer answers a closed pipe with status 1, whatever the command's own
        if getattr(e.__context__, "errno", None) == errno.EPIPE:
            sys.stdout, sys.stderr = streams
            return _discard_stdout()
        raise
    except Exception as e:  # click's usage errors (vendored inside typer) and Ctrl-C
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            message = e.format_message() or "no command given: the help above lists them (`kvplan COMMAND --help`)"
            message = _whole_number_advice(e, message, args)
            print(f"kvplan: error: {_one_line(message)}", file=sys.stderr)
            return 2
        if type(e).__name__ == "Abort":
            print("kvplan: interrupted", file=sys.stderr)
            return 130
        raise
    return rv if isinstance(rv, int) else 0


def _whole_number_advice(e, message: str, args: List[str]) -> str:
    """An integer option given something else: the value and what to write instead (the digits of 1e3), rather than
    the parser's 'Input should be a valid integer, unable to parse string as an integer'."""
    import re

    param = getattr(e, "param", None)
    if param is None or "valid integer" not in message:
        return message
    opts = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    value = None
    for i, a in enumerate(args):
        if a in opts and i + 1 < len(args):
            value = args[i + 1]
        elif "=" in a and a.split("=", 1)[0] in opts:
            value = a.split("=", 1)[1]
    name = max(opts, key=len) if opts else "the option"
    if value is None:
        return f"{name}: expected a whole number such as 8"
    exp = re.fullmatch(r"[+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][+]?([0-9]{1,3})", value.strip())
    if exp:
        from fractions import Fraction

        x = Fraction(exp.group(1)) * 10 ** int(exp.group(2))
        if x.denominator == 1:
            return f"{name} '{value}': exponent notation is not taken; write the digits ({int(x)})"
    return f"{name} '{value}': expected a whole number such as 8"


def _command_for(args: List[str]):
    """The click command for these arguments: the app with only the command asked for when the first argument
    names one (building all fifteen costs a start-up its time), the whole app otherwise (help, errors)."""
    if args:
        for info in app.registered_commands:
            if (info.name or info.callback.__name__.replace("_", "-")) == args[0]:
                break
        else:
            info = next((g for g in app.registered_groups if g.name == args[0]), None)
        if info is not None:
            one = typer.Typer()
            one.info, one.registered_callback = app.info, app.registered_callback
            if isinstance(info, typer.models.CommandInfo):
                one.registered_commands = [info]
            else:
                one.registered_groups = [info]
            return typer.main.get_command(one)
    return typer.main.get_command(app)


_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines() breaks at


def _one_line(message: str) -> str:
    """An error is one line: a line break inside it (from a value the user gave, such as a name in a file) is
    shown escaped, as \\n."""
    return "".join(c.encode("unicode_escape").decode() if c in _LINE_BREAKS else c for c in message)


def _flags_without_type(command) -> None:
    """A flag takes no value, so its help line shows no type (such as `<bool>`) beside it."""
    for param in command.params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    get_help_option = command.get_help_option

    def help_option(ctx):
        option = get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _flags_without_type(sub)


def _usage_names(command) -> None:
    """The usage line names an argument as the convention has it: MODEL when it is required, [FILES]... when it is
    optional or repeats (click's get_usage_pieces; typer would write {model})."""
    for param in command.params:
        if getattr(param, "param_type_name", None) == "argument":
            name = (param.metavar or param.name or "").upper()
            piece = (name if param.required else f"[{name}]") + ("..." if param.nargs != 1 else "")
            param.get_usage_pieces = lambda ctx, piece=piece: [piece]
    for sub in getattr(command, "commands", {}).values():
        _usage_names(sub)


def _discard_stdout() -> int:
    """stdout's reader has gone: whatever is still buffered for it goes nowhere, so that exiting raises no second
    error. Returns the status the command had."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return _exit["status"]
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return _exit["status"]


def entry() -> None:
    # The command line validates only kvplan's own catalogs, so it does not scan every installed package's entry
    # points for pydantic plugins (observability hooks for an application's models) on its first validation, as
    # typer already does not for its own; a value set in the environment is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "1")
    status = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
    sys.exit(status)


if __name__ == "__main__":
    entry()
