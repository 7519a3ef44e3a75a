"""A grid over models, GPUs, TP, KV dtypes, max_model_len, batch and context, as a pandas DataFrame.

The per-configuration parts (weights, KV layers, the pool's budget and blocks, N*) come from the same functions
`capacity` and `crossover` use; the numeric axes (max_model_len, batch, context) go through the same formulas
with numpy arrays, so every row equals what `capacity` and `crossover` answer for it.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from .engine import (
    SkipLayers,
    WeightRead,
    _solve_crossover,
    crossover_at_batch,
    kv_bytes_per_token,
    kv_layers,
    params_read_per_token,
    step_figures,
)
from .errors import KvplanError
from .formats import KVFormat, kv_format
from .deployment import DeploymentArgs
from .pool import plan_for
from .specs import GPUSpec, ModelSpec, load_gpu, load_model
from .weights import weight_bytes

COLUMNS = (
    "model", "gpu", "tp", "dtype", "max_model_len", "batch", "context",
    "weight_bytes_held", "available_kv_bytes", "kv_bytes_per_token", "num_blocks", "blocks_per_request",
    "max_concurrency", "kv_tokens", "fits",
    "crossover_tokens", "weight_bytes", "kv_bytes", "step_bytes", "saving", "bound", "crossover_tokens_at_batch",
    "step_ms", "expected_step_ms",
)


def sweep(models: Sequence[str | ModelSpec], gpus: Sequence[str | GPUSpec], *, tps: Sequence[int] = (1,),
          dtypes: Sequence[str | KVFormat] = ("auto",), max_model_lens: Sequence[int] = (8192,),
          batches: Sequence[int] = (1,), contexts: Sequence[int] = (8192,),
          weight_read: WeightRead = "streamed", baseline: str = "auto", skip: SkipLayers = None, **options):
    """One row per combination, in the order of the arguments (the last axis varies fastest).

    Every other option of a vLLM deployment (kvplan.deployment.DeploymentArgs: gpu_memory_utilization, block_size,
    activation_gib, weight_dtype, pp, dcp, engine_version, max_num_batched_tokens, ...) applies to every row, and
    each combination is resolved the way `capacity` resolves it, so every row equals what `capacity` answers.

    Combinations that cannot run (a TP that does not split the heads, a dtype for the other attention layout) are
    left out and listed in `df.attrs["skipped"]`. A configuration whose weights or sequences do not fit stays in,
    with `fits` False.

    >>> import kvplan
    >>> df = kvplan.sweep(["llama3-8b", "qwen3-8b"], ["h100", "h200"], dtypes=["auto", "fp8"],
    ...                   max_model_lens=[8192], batches=[1, 32], contexts=[2048, 8192], activation_gib=6.0)
    >>> len(df)
    32
    >>> round(float(df.query("model == 'Llama-3-8B' and gpu == 'H100-SXM5-80GB' and dtype == 'fp8'")
    ...      ["max_concurrency"].iloc[0]), 2)
    103.65
    """
    import numpy as np
    import pandas as pd

    mspecs = _unique_by_name([m if isinstance(m, ModelSpec) else load_model(m) for m in models])
    gspecs = _unique_by_name([g if isinstance(g, GPUSpec) else load_gpu(g) for g in gpus])
    fmts = _unique_by_name([d if isinstance(d, KVFormat) else kv_format(d) for d in dtypes])
    for name, values in (("max_model_lens", max_model_lens), ("batches", batches), ("contexts", contexts)):
        too_big = [v for v in values if isinstance(v, (int, float)) and v > _MAX_AXIS]
        if too_big:  # beyond it, the 64-bit arithmetic of the grid is no longer exact
            raise KvplanError(f"sweep: {name} must be at most 2**53 ({_MAX_AXIS:,}), got {too_big[0]:,}")
    lens = np.asarray(max_model_lens, dtype=np.int64)
    bs = np.asarray(batches, dtype=np.int64)
    cs = np.asarray(contexts, dtype=np.int64)
    for name, arr in (("max_model_lens", lens), ("batches", bs), ("contexts", cs)):
        if arr.ndim != 1 or arr.size == 0 or (arr < 1).any():
            raise KvplanError(f"sweep: {name} must be a non-empty list of positive integers")
    # the numeric grid, max_model_len slowest and context fastest
    n_len, n_bc = lens.size, bs.size * cs.size
    grid_b = np.repeat(bs, cs.size)  # over (batch, context)
    grid_c = np.tile(cs, bs.size)
    rows_per_config = n_len * n_bc

    cols: dict[str, list] = {c: [] for c in COLUMNS}
    codes = {"model": [], "gpu": [], "dtype": []}
    skipped: list[str] = []
    profiles: dict[str, str] = {}
    base_fmt = kv_format(baseline)
    if weight_read not in ("streamed", "all"):
        raise KvplanError(f"--weight-read '{weight_read}': choose 'streamed' or 'all'")
    if "engine" in options and options["engine"] not in (None, "vllm"):
        raise KvplanError("sweep plans vLLM's pool; --engine sglang is not swept (use `kvplan capacity --engine sglang`)")
    weight_dtype = options.get("weight_dtype")
    for (mi, m), (gi, g), tp, (fi, fmt) in itertools.product(enumerate(mspecs), enumerate(gspecs), tps,
                                                               enumerate(fmts)):
        try:
            d = DeploymentArgs(model=m, gpu=g, kv_cache_dtype=fmt, tp=tp, kv_cache_dtype_skip_layers=skip,
                               **options).resolve(needs_memory=True)
            plan = plan_for(d)
        except KvplanError as e:
            skipped.append(f"{m.name} {g.name} tp{tp} {fmt.name}: {e}")
            continue
        layers = plan.layers
        base_layers = kv_layers(m, base_fmt, tp, ("none",))
        wb = weight_bytes(m, tp, weight_dtype)
        wdtype = weight_dtype or m.weight_dtype

        try:
            cap = plan.per_length(lens, np)  # over max_model_len
            _check_int64(plan.weights, plan.available, plan.num_blocks, cap["blocks_per_request"], cap["kv_tokens"])
        except OverflowError:
            skipped.append(f"{m.name} {g.name} tp{tp} {fmt.name}: its pool figures exceed the sweep's 64-bit "
                           "columns; lower the sizes given (memory, --max-num-batched-tokens, --max-num-seqs)")
            continue
        # in floating point, as the scalar path's figures are: batch x context x bytes would overflow 64-bit integers
        step = step_figures(m, layers, base_layers, wb, grid_b.astype(np.float64), grid_c.astype(np.float64),
                            weight_read, tp, g, wdtype, xp=np, params_read=params_read_per_token(m, tp))
        nstar_b = {int(b): crossover_at_batch(layers, w, int(b))
                   for b, w in zip(bs, step["weight_bytes"][::cs.size], strict=True)}
        w1 = step_figures(m, layers, base_layers, wb, 1, 1, weight_read, tp, None, wdtype)["weight_bytes"]
        nstar = _solve_crossover(layers, w1)

        def per_len(x):
            return np.repeat(np.asarray(x), n_bc)

        def per_bc(x):
            return np.tile(np.asarray(x), n_len)

        def const(x, dtype=None):
            return np.full(rows_per_config, np.nan if x is None else x, dtype=dtype)

        codes["model"].append(const(mi, np.int32))
        codes["gpu"].append(const(gi, np.int32))
        codes["dtype"].append(const(fi, np.int32))
        cols["tp"].append(const(tp, np.int32))
        cols["max_model_len"].append(per_len(lens))
        cols["batch"].append(per_bc(grid_b))
        cols["context"].append(per_bc(grid_c))
        cols["weight_bytes_held"].append(const(plan.weights, np.int64))
        cols["available_kv_bytes"].append(const(plan.available, np.int64))
        cols["kv_bytes_per_token"].append(const(kv_bytes_per_token(layers), np.float64))
        cols["num_blocks"].append(const(plan.num_blocks, np.int64))
        cols["blocks_per_request"].append(per_len(cap["blocks_per_request"]).astype(np.int64))
        cols["max_concurrency"].append(per_len(cap["max_concurrency"]))
        cols["kv_tokens"].append(per_len(cap["kv_tokens"]).astype(np.int64))
        cols["fits"].append(per_len(cap["fits"]))
        cols["crossover_tokens"].append(const(nstar, np.float64))
        for key in ("weight_bytes", "kv_bytes", "step_bytes", "saving", "step_ms"):
            cols[key].append(per_bc(step[key]))
        cols["bound"].append(per_bc(step["kv_bound"]).astype(np.int8))
        cols["expected_step_ms"].append(per_bc(_expected_ms(d, grid_b, grid_c, profiles)))
        cols["crossover_tokens_at_batch"].append(
            per_bc(np.array([np.nan if nstar_b[int(b)] is None else nstar_b[int(b)] for b in grid_b])))

    frame: dict = {}
    categories = {"model": [m.name for m in mspecs], "gpu": [g.name for g in gspecs], "dtype": [f.name for f in fmts]}
    # counts (and bytes) are whole numbers, `fits` a yes/no; every other column is a real number
    integers = {"tp", "max_model_len", "batch", "context", "weight_bytes_held", "available_kv_bytes", "num_blocks",
                "blocks_per_request", "kv_tokens"}
    for c in COLUMNS:
        if c in categories:
            frame[c] = pd.Categorical.from_codes(_concat(codes[c], np.int32), categories=categories[c])
        elif c == "bound":
            frame[c] = pd.Categorical.from_codes(_concat(cols[c], np.int8), categories=["weights", "kv"])
        elif c in integers:
            values = _concat(cols[c], np.int64)
            if values.dtype.kind == "f" and np.isnan(values).any():  # a figure some rows lack
                frame[c] = pd.array(values, dtype="Int64")
            else:
                frame[c] = values.astype(np.int64, copy=False)
        elif c == "fits":
            frame[c] = _concat(cols[c], np.bool_).astype(np.bool_, copy=False)
        else:
            frame[c] = _concat(cols[c], np.float64).astype(np.float64, copy=False)
    df = pd.DataFrame(frame, copy=False)
    df.attrs["skipped"] = skipped
    df.attrs["weight_read"] = weight_read
    df.attrs["step_profiles"] = profiles  # GPU -> the profile its expected_step_ms come from
    return df


def _expected_ms(d, batches, contexts, profiles: dict):
    """The step model's time at each (batch, context), NaN where no profile prices the GPU; `profiles` collects the
    profile each GPU's times come from."""
    import numpy as np

    from .step import has_profile, step_model

    if not has_profile(d):
        return np.full(len(batches), np.nan)
    sm = step_model(d)
    profiles[d.gpu.name] = sm.profile.name
    return sm.step(np.asarray(batches, dtype=np.float64), np.asarray(contexts, dtype=np.float64), xp=np).total_s * 1e3


_MAX_AXIS = 2**53  # max_model_len, batch and context: whole numbers float64 holds exactly


def _check_int64(*figures) -> None:
    """Raise OverflowError for a figure (a number or an array) the sweep's 64-bit integer columns cannot hold."""
    import numpy as np

    for x in figures:
        if np.any(np.abs(np.asarray(x, dtype=np.float64)) >= 2.0**63):
            raise OverflowError(x)


def _unique_by_name(items: list) -> list:
    seen: dict = {}
    for it in items:
        seen.setdefault(it.name, it)
    return list(seen.values())


def _concat(parts: list, dtype):
    import numpy as np

    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
