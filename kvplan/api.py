"""The library's keyword facades: each question asked of a model and a GPU with options, as the command line asks
it. Each resolves one kvplan.deployment.Deployment (per KV dtype) from its arguments and hands it to the question's
own function (crossover_of, pool_capacity, plan_for, throughput_of), which takes a resolved Deployment only."""

from __future__ import annotations

from typing import Optional, Sequence

from kvplan.deployment import Deployment, DeploymentArgs, deployments, engine_of
from kvplan.errors import KvplanError
from kvplan.files import type_name
from kvplan.plan.crossover import CrossoverResult, crossover_of
from kvplan.plan.throughput import ThroughputResult, throughput_of
from kvplan.plan.capacity import PoolResult, pool_capacity
from kvplan.plan.vllm_pool import PoolPlan, plan_for
from kvplan.sizing.kv_cache import SkipLayers, WeightRead
from kvplan.specs.catalog import GPUSpec, ModelSpec, load_model_as
from kvplan.specs.kv_formats import KVFormat, comparison_dtypes


def crossover(model, dtype: str | KVFormat = "auto", *, tp: int = 1, weight_dtype: Optional[str] = None,
              gpu: Optional[GPUSpec] = None, batches: Sequence[int] = (1,), contexts: Sequence[int] = (),
              weight_read: WeightRead = "streamed", baseline: str = "auto", skip: SkipLayers = None,
              calibration=None) -> CrossoverResult:
    """Where the KV pile overtakes the weight pile, and the step bytes (and roofline time) at operating points.

    `model` is a resolved kvplan.deployment.Deployment, or a model (resolved here with the KV dtype, tp,
    weight_dtype, gpu, skip layers and calibration given)."""
    batches, contexts = _whole_numbers("batches", batches), _whole_numbers("contexts", contexts)
    if isinstance(model, Deployment):
        d = model
    else:
        d = DeploymentArgs(model=model, gpu=gpu, kv_cache_dtype=_one_dtype(dtype), tp=tp, weight_dtype=weight_dtype,
                           kv_cache_dtype_skip_layers=skip, calibration=calibration).resolve()
    return crossover_of(d, batches=batches, contexts=contexts, weight_read=weight_read, baseline=baseline)


def capacity(model, gpu: Optional[GPUSpec] = None, dtype: str | KVFormat | None = None,
             **options) -> PoolResult:
    """How many tokens and sequences the KV pool of one rank holds, by the engine's rules: vLLM's budget, pages and
    blocks (kvplan.plan.vllm_capacity.CapacityResult), or with engine="sglang" SGLang's pool
    (kvplan.plan.sglang_pool.SglangPool); both name their shared figures alike (kvplan.plan.capacity.PoolResult).

    Takes a resolved kvplan.deployment.Deployment, or a model, GPU, KV dtype and any option of
    kvplan.deployment.DeploymentArgs (tp, pp, dcp, max_model_len, gpu_memory_utilization, block_size,
    profile, ...), resolved the way the command line resolves them: the KV dtype defaults to the profile's, or
    auto.

    A configuration that does not fit comes back with `fits=False` and `problem` set, so a listing over many models
    can show it; raise on it where a single answer was asked for.

    With a deployment `profile` (kvplan.specs.profile), the total memory, the engine version and the measured weights
    and
    overheads of that deployment stand in for the model of them."""
    return pool_capacity(_deployment(model, gpu, dtype, options))


def pool_plan(model_or_deployment, gpu: Optional[GPUSpec] = None, dtype: str | KVFormat | None = None,
              **options) -> PoolPlan:
    """The budget, pages, groups and blocks of the KV pool per rank (vLLM's rules), for a resolved Deployment (or a
    model, GPU, dtype and the options of kvplan.deployment.DeploymentArgs, resolved here)."""
    return plan_for(_deployment(model_or_deployment, gpu, dtype, options))


def throughput(model, gpu, *, isl: int, osl: int, kv_cache_dtypes: Optional[Sequence[str]] = None,
               concurrency: Optional[Sequence[int]] = None, tpot_ms: Optional[float] = None,
               ttft_ms: Optional[float] = None, percentile: str = "mean", num_prompts: Optional[int] = None,
               request_rate: Optional[float] = None, random_range_ratio: float = 0.0,
               **options) -> ThroughputResult:
    """The throughput table for a model on a GPU, as `kvplan throughput` prints it: `kv_cache_dtypes` defaults to
    the model's own and the engine's fp8 cache, `options` are kvplan.deployment.DeploymentArgs fields (tp,
    weight_dtype, engine, calibration, max_num_batched_tokens, ...).

        >>> r = throughput("llama-3.1-8b", "h100", isl=1024, osl=1024, concurrency=[16])
        >>> [round(x.tpot_ms, 1) for x in r.rows]   # doctest: +SKIP
    """
    if not isinstance(model, ModelSpec):
        model = load_model_as(model, options.get("weight_dtype"))
    args = DeploymentArgs(model=model, gpu=gpu, **options)
    if kv_cache_dtypes is None:
        kv_cache_dtypes = comparison_dtypes(model, engine_of(args))
    ds = deployments(args, list(kv_cache_dtypes), needs_memory=True)
    return throughput_of(ds, isl, osl, concurrency, tpot_ms, ttft_ms, percentile, num_prompts,
                         request_rate=request_rate, random_range_ratio=random_range_ratio)


def _one_dtype(dtype):
    """The one KV dtype a question takes (a name or a KVFormat); a list is refused with what to do instead."""
    if dtype is not None and not isinstance(dtype, (str, KVFormat)):
        raise KvplanError(f"the KV dtype is one name such as 'fp8' (or a KVFormat), not {type_name(dtype)} "
                          f"{dtype!r}: ask once per dtype, or use kvplan.throughput(kv_cache_dtypes=[...]) or "
                          f"kvplan.sweep(dtypes=[...]) for several")
    return dtype


def _whole_numbers(name: str, values) -> list[int]:
    """Batches or contexts: whole numbers of sequences or tokens (the library takes 8192, not the CLI's '8k')."""
    import operator

    example = "[1, 32]" if name == "batches" else "[8192, 131072]"
    out = []
    for v in [values] if isinstance(values, (int, str)) else values:
        try:
            n = operator.index(v)
        except TypeError:
            n = 0
        if isinstance(v, bool) or n < 1:
            raise KvplanError(f"{name} takes whole numbers of at least 1, such as {example}; got {v!r}"
                              + (" (the library does not read the command line's 8k)" if isinstance(v, str) else ""))
        out.append(n)
    return out


def _deployment(model, gpu, dtype, options: dict):
    dtype = _one_dtype(dtype)
    if isinstance(model, Deployment):
        if gpu is not None or options or dtype is not None:
            raise TypeError("a Deployment carries its own options")
        return model
    if "skip" in options:
        options["kv_cache_dtype_skip_layers"] = options.pop("skip")
    args = DeploymentArgs(model=model, gpu=gpu, kv_cache_dtype=dtype, **{"engine": "vllm", **options})
    return args.resolve(needs_memory=True)
