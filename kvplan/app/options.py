"""The command line's application object and what its commands share: each option declared once (the deployment's
in one table that commands take by name), and the readers of sizes, lengths and dtype lists. No arithmetic here."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from kvplan.rules.vllm import versions_text

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
    "--engine-version", help=f"vLLM version whose rules apply: {versions_text()}; SGLang is planned with 0.5's "
    "rules")]
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
    "--block-size", help="vLLM: tokens per KV block, a multiple of 16 (default: the attention backend's, e.g. 16 "
    "on FlashAttention, 32 on FlashInfer MLA, 64 on FlashMLA, 128 on CUTLASS MLA)")]
AttentionBackendOpt = Annotated[Optional[str], typer.Option(
    "--attention-backend", help="vLLM: the attention backend, as vLLM names it (FLASH_ATTN, FLASHINFER, TRITON_ATTN, "
    "FLASHMLA, CUTLASS_MLA, FLASHINFER_MLA, TRITON_MLA, ...; any case); refused where it cannot serve the model, "
    "dtype and GPU. Default auto: the one vLLM's selector picks. SGLang: its names (fa3, fa4, flashinfer, triton, "
    "trtllm_mha, trtllm_mla, flashmla, cutlass_mla, aiter); default auto: SGLang's default for the model and GPU")]
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
SgMixedChunkOpt = Annotated[bool, typer.Option(
    "--enable-mixed-chunk", help="SGLang: a prompt chunk's step also runs the running requests' decode tokens "
    "(mixed chunked prefill) instead of pausing them")]
SgMaxPrefillOpt = Annotated[Optional[int], typer.Option(
    "--max-prefill-tokens", help="SGLang: the prompt tokens one prefill batch takes beyond its first request (default "
    "16384)")]
SgMaxRunningOpt = Annotated[Optional[int], typer.Option(
    "--max-running-requests", help="SGLang: the most requests it runs at once, over all DP-attention groups (default: "
    "what the pool and, for a hybrid model, its state slots allow)")]
SgNoRadixOpt = Annotated[bool, typer.Option(
    "--disable-radix-cache", help="SGLang: no prefix cache; a hybrid model's state slots then each serve a running "
    "request (a third of them with the cache on), and --max-running-requests sizes its state pool")]
SgDpLmHeadOpt = Annotated[bool, typer.Option(
    "--enable-dp-lm-head", help="SGLang, with --enable-dp-attention: the LM head whole in each attention group")]

# The deployment options by name, each declared once: (declaration, default). A command takes the ones it names with
# @_takes, and receives them as its **deployment, the keyword arguments of kvplan.deployment.DeploymentArgs.
DEPLOYMENT_OPTIONS: dict = {
    "tp": (TpOpt, None), "pp": (PpOpt, None), "dcp": (DcpOpt, None), "weight_dtype": (WeightDtypeOpt, None),
    "engine": (EngineOpt, None), "engine_version": (EngineVersionOpt, None),
    "gpu_memory_utilization": (UtilOpt, None), "max_model_len": (MaxModelLenOpt, None),
    "max_num_seqs": (MaxSeqsOpt, None), "max_num_batched_tokens": (BatchedOpt, None),
    "block_size": (BlockSizeOpt, None), "attention_backend": (AttentionBackendOpt, None),
    "skip_layers": (SkipOpt, None),
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
    "max_running_requests": (SgMaxRunningOpt, None), "disable_radix_cache": (SgNoRadixOpt, False),
    "enable_mixed_chunk": (SgMixedChunkOpt, False), "max_prefill_tokens": (SgMaxPrefillOpt, None),
}
VLLM_LAYOUT = ("data_parallel_size", "data_parallel_size_local", "enable_expert_parallel", "all2all_backend",
               "enable_eplb", "num_redundant_experts")
# every option of the deployment's pool: what `capacity` takes (and `throughput`, with the scheduler's own)
SCHEDULER = ("enable_mixed_chunk", "max_prefill_tokens")
DEPLOYMENT = tuple(n for n in DEPLOYMENT_OPTIONS if n not in SCHEDULER)
# the memory options of vLLM's pool: what `sweep` and `plot capacity` take beside their own
VLLM_MEMORY = ("gpu_memory_utilization", "block_size", "activation_gib", "non_torch_gib",
               "cudagraph_gib", "max_num_seqs", "enforce_eager", "language_model_only", "mamba_ssm_cache_dtype",
               "entrypoint", "gpu_memory_gib", "weight_dtype", "skip_layers", "max_num_batched_tokens",
               "engine_version", "pp", "dcp")


def _takes(*names: str, **declared):
    """Give a command the named deployment options (with `declared`, another declaration of some: a help text that
    suits the command), placed before its --output and --json; it receives them as its **deployment."""
    import inspect

    def add(command):
        sig = inspect.signature(command)  # (the commands' modules hold their annotations evaluated)
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
    if as_json:
        from kvplan.app.render import print_json

        print_json(data)
        return
    from kvplan.app import render_plans

    draw = getattr(render_plans, table, None)
    if draw is None:
        from kvplan.app import render_tools

        draw = getattr(render_tools, table)
    draw(*args)


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
    asked for; any GPU where it names none), in its release: a vLLM dtype the release does not have is left out
    (the attention backends' word comes with each deployment: _served_here). With several, formats for the other
    attention layout (MLA or heads) are left out; a single one that does not apply is an error, raised where it is
    used."""
    from kvplan.errors import KvplanError
    from kvplan.specs.kv_formats import parse_dtypes

    served = None
    if args is not None:
        from kvplan.rules.vllm import vllm_rules
        from kvplan.specs.catalog import load_gpu

        prof = args.profile if not isinstance(args.profile, str) else None
        engine = (args.engine or getattr(prof, "engine", None) or "vllm").lower()
        gpu = args.gpu or getattr(prof, "gpu", None)
        gpu = load_gpu(gpu) if isinstance(gpu, str) else gpu
        version = args.engine_version or getattr(prof, "engine_version", None)
        missing = vllm_rules(version).cache_dtypes_missing if engine == "vllm" else frozenset()

        def served(f):
            return f.served_on(engine, gpu, version) and f.name not in missing
    fmts = parse_dtypes(values or default, served=served)
    if len(fmts) == 1:
        return fmts
    kept = [f for f in fmts if f.applies_to == "both" or (f.applies_to == "mla") == model.is_mla]
    if not kept:
        raise KvplanError(f"none of the chosen KV dtypes applies to {model.name}")
    return kept


def _served_here(ds: list, values: Optional[List[str]]) -> list:
    """The deployments to plan: with 'all' among the dtypes asked for, those the engine, release and GPU run (a
    Deployment's `unserved` is None; the catalog's and the attention backends' word together); a dtype named by
    itself is kept, planned as a what-if and marked so. Each format the engine stores is planned once.""" 
    from kvplan.specs.kv_formats import dtype_names, kv_format

    names = dtype_names(values) if values else []
    if not any(n.lower() == "all" for n in names):
        return ds
    named = {kv_format(n).name for n in names if n.lower() != "all"}
    kept, seen = [], set()
    for d in ds:  # once per stored format (fp8 and fp8_e4m3 are fp8_ds_mla on a sparse-attention MLA model)
        if (d.unserved is None or d.kv.name in named) and d.kv.name not in seen:
            kept.append(d)
            seen.add(d.kv.name)
    return kept or ds


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


# the serving benchmark's own options
IslOpt = Annotated[Optional[str], typer.Option("--isl", help="prompt tokens per request (e.g. 1024, 8k)")]
OslOpt = Annotated[Optional[str], typer.Option("--osl", help="output tokens per request (e.g. 1024, 1k)")]
ConcurrencyOpt = Annotated[Optional[List[str]], typer.Option(
    "--concurrency", "-n", help="concurrent requests (e.g. 4,16,64); default: powers of two up to what the KV pool "
    "holds")]
TpotOpt = Annotated[Optional[float], typer.Option(
    "--tpot-ms", help="time-per-output-token limit: pick each dtype's best concurrency that meets it")]
TtftOpt = Annotated[Optional[float], typer.Option(
    "--ttft-ms", help="time-to-first-token limit, with or without --tpot-ms")]
PercentileOpt = Annotated[str, typer.Option(
    "--percentile", help="the figure --tpot-ms and --ttft-ms hold: mean (default), p50, p90 or p99 of the requests")]
NumPromptsOpt = Annotated[Optional[int], typer.Option(
    "--num-prompts", help="requests each concurrency's benchmark sends (default 1000, as vllm bench serve)")]
RequestRateOpt = Annotated[Optional[float], typer.Option(
    "--request-rate", help="requests per second, as Poisson arrivals (an open loop; the concurrency caps those in "
    "flight); default: every client sends at once")]
RangeRatioOpt = Annotated[float, typer.Option(
    "--random-range-ratio", help="draw each request's prompt and output lengths uniformly from (1 - r) to (1 + r) "
    "times --isl and --osl, as vllm bench serve's random dataset does (default 0: every request the same)")]


def _names(values: Optional[List[str]]) -> list[str]:
    return [p.strip() for v in values or [] for p in v.split(",") if p.strip()]
