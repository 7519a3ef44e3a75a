"""A grid over models, GPUs, TP, KV dtypes, max_model_len, batch and context, as a pandas DataFrame.

The per-configuration parts (weights, KV layers, the pool's budget and blocks, N*) come from the same functions
`capacity` and `crossover` use; the numeric axes (max_model_len, batch, context) go through the same formulas
with numpy arrays, so every row equals what `capacity` and `crossover` answer for it.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple, Sequence

from kvplan.deployment import DeploymentArgs, max_len_refusal
from kvplan.errors import KvplanError
from kvplan.plan.vllm_pool import plan_for
from kvplan.plan.vllm_problems import length_problem, longest_fitting, pool_problem, sampler_problem
from kvplan.sizing.kv_cache import (
    SkipLayers,
    WeightRead,
    crossover_at_batch,
    crossover_curve,
    kv_bytes_per_token,
    kv_layers,
    params_read_per_token,
    step_figures,
)
from kvplan.sizing.weights import weight_bytes
from kvplan.specs.catalog import GPUSpec, ModelSpec, load_gpu, load_model_as
from kvplan.specs.kv_formats import KVFormat, kv_format

COLUMNS = (
    "model", "gpu", "tp", "dtype", "max_model_len", "batch", "context",
    "weight_bytes_held", "available_kv_bytes", "kv_bytes_per_token", "num_blocks", "blocks_per_request",
    "max_concurrency", "kv_tokens", "fits", "problem", "what_if",
    "crossover_tokens", "weight_bytes", "kv_bytes", "step_bytes", "saving", "bound", "crossover_tokens_at_batch",
    "step_ms", "expected_step_ms",
)


def sweep(models: Sequence[str | ModelSpec], gpus: Sequence[str | GPUSpec], *, tps: Sequence[int] = (1,),
          dtypes: Sequence[str | KVFormat] = ("auto",), max_model_lens: Sequence[int] = (8192,),
          batches: Sequence[int] = (1,), contexts: Sequence[int] = (8192,),
          weight_read: WeightRead = "streamed", baseline: str = "auto", skip: SkipLayers = None, **options):
    """One row per combination, in the order of the arguments (the last axis varies fastest). (This function is the
    pass over the configurations; a configuration's decode-step figures are _step_figures', they join the columns
    in _append, the axes are checked in _axes and the columns assembled in _frame.)

    Every other option of a vLLM deployment (kvplan.deployment.DeploymentArgs: gpu_memory_utilization, block_size,
    activation_gib, weight_dtype, pp, dcp, engine_version, max_num_batched_tokens, ...) applies to every row, and
    each combination is resolved the way `capacity` resolves it, so every row equals what `capacity` answers.

    Combinations that cannot run (a TP that does not split the heads, a dtype for the other attention layout) are
    left out and listed in `df.attrs["skipped"]`. A configuration vLLM would refuse (weights that leave no pool, a
    max_model_len beyond the model's or the pool's) stays in, with `fits` False and `problem` saying why in
    `capacity`'s words (empty where it fits).

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

    mspecs = _unique_by_name([m if isinstance(m, ModelSpec) else load_model_as(m, options.get("weight_dtype"))
                              for m in models])
    gspecs = _unique_by_name([g if isinstance(g, GPUSpec) else load_gpu(g) for g in gpus])
    fmts = _unique_by_name([d if isinstance(d, KVFormat) else kv_format(d) for d in dtypes])
    grid = _Grid.of(*_axes(max_model_lens, batches, contexts))
    skipped: list[str] = []
    profiles: dict[str, str] = {}
    problems: dict[str, int] = {}  # why a row does not fit -> its code in the `problem` column
    what_ifs: dict[str, int] = {}  # why no engine serves a row's dtype there -> its code in the `what_if` column
    base_fmt = kv_format(baseline)
    _check_options(weight_read, options)
    weight_dtype = options.get("weight_dtype")
    # one entry per configuration kept: its constant figures, its figures over max_model_len, over (batch, context)
    const, per_len, per_bc = ({c: [] for c in cols} for cols in (_CONST, _PER_LEN, _PER_BC))
    option_notes: dict = {}
    for (mi, m), (gi, g), tp, (fi, fmt) in itertools.product(enumerate(mspecs), enumerate(gspecs), tps,
                                                               enumerate(fmts)):
        try:
            d = DeploymentArgs(model=m, gpu=g, kv_cache_dtype=fmt, tp=tp, kv_cache_dtype_skip_layers=skip,
                               **options).resolve(needs_memory=True)
            plan = plan_for(d)
            option_notes.update(dict.fromkeys(n for n in d.notes if n.startswith("--")))  # what an option did not do
        except KvplanError as e:
            skipped.append(f"{m.name} {g.name} tp{tp} {fmt.name}: {e}")
            continue
        lay = d.parallel  # with data or expert parallelism, a rank's: the attention's TP, the layout's weights
        base_layers = kv_layers(m, base_fmt, lay.attn_tp, ("none",))
        wb = weight_bytes(m, lay, weight_dtype)
        try:
            cap = plan.per_length(grid.lens, np)  # over max_model_len
            _check_int64(plan.weights, plan.available, plan.num_blocks, cap["blocks_per_request"], cap["kv_tokens"])
        except OverflowError:
            skipped.append(f"{m.name} {g.name} tp{tp} {fmt.name}: its pool figures exceed the sweep's 64-bit "
                           "columns; lower the sizes given (memory, --max-num-batched-tokens, --max-num-seqs)")
            continue
        step, nstar_b, nstar = _step_figures(m, g, plan, base_layers, wb, lay.attn_tp, weight_read,
                                             weight_dtype or m.weight_dtype, grid)
        const["what_if"].append(what_ifs.setdefault(d.unserved, len(what_ifs)) if d.unserved else -1)
        _append((const, per_len, per_bc), (mi, gi, fi, tp), plan, grid, cap, step, nstar_b, nstar,
                _problem_codes(d, plan, grid.lens, cap, problems), _expected_ms(d, grid.bf, grid.cf, profiles))

    categories = {"model": [m.name for m in mspecs], "gpu": [g.name for g in gspecs], "dtype": [f.name for f in fmts]}
    categories["what_if"] = list(what_ifs)  # code -1: a dtype the engine serves there, an empty cell
    frame = _frame(const, per_len, per_bc, categories, problems, grid.lens.size, grid.b.size)
    df = pd.DataFrame(frame, copy=False)
    df.attrs.update(skipped=skipped, whole_columns=[c for c in BYTE_COUNTS if c in df.columns],
                    notes=list(option_notes), weight_read=weight_read,
                    step_profiles=profiles)  # step_profiles: GPU -> the profile its expected_step_ms come from
    return df


def _check_options(weight_read: str, options: dict) -> None:
    """The sweep's own refusals: a --weight-read it does not know, an engine other than vLLM."""
    if weight_read not in ("streamed", "all"):
        raise KvplanError(f"--weight-read '{weight_read}': choose 'streamed' or 'all'")
    if "engine" in options and options["engine"] not in (None, "vllm"):
        raise KvplanError("sweep plans vLLM's pool; --engine sglang is not swept (use `kvplan capacity --engine sglang`)")


class _Grid(NamedTuple):
    """The numeric axes: max_model_len (slowest), and (batch, context) flattened with context fastest, as integers
    and as floats."""

    lens: Any
    bs: Any
    cs: Any
    b: Any  # the batch of each (batch, context)
    c: Any  # the context of each (batch, context)
    bf: Any
    cf: Any

    @classmethod
    def of(cls, lens, bs, cs) -> "_Grid":
        import numpy as np

        b, c = np.repeat(bs, cs.size), np.tile(cs, bs.size)
        return cls(lens, bs, cs, b, c, b.astype(np.float64), c.astype(np.float64))


def _step_figures(m: ModelSpec, g: GPUSpec, plan, base_layers, wb, kv_tp: int, weight_read: WeightRead,
                  wdtype: str, grid: _Grid):
    """One configuration's decode-step figures over (batch, context), N* at each batch's weight read, and N* at
    batch 1 (its crossover_tokens)."""
    import numpy as np

    layers = plan.layers
    # in floating point, as the scalar path's figures are: batch x context x bytes would overflow 64-bit integers
    step = step_figures(m, layers, base_layers, wb, grid.bf, grid.cf, weight_read, kv_tp, g, wdtype, xp=np,
                        params_read=params_read_per_token(m, kv_tp))
    curve = crossover_curve(layers)  # N* at each batch's weight read, the curve built once
    nstar_b = [crossover_at_batch(curve, w, int(b)) for b, w in zip(grid.bs, step["weight_bytes"][::grid.cs.size],
                                                                        strict=True)]
    w1 = step_figures(m, layers, base_layers, wb, 1, 1, weight_read, kv_tp, None, wdtype)["weight_bytes"]
    return step, nstar_b, curve.solve(w1)


def _append(columns: tuple, ids: tuple, plan, grid: _Grid, cap: dict, step: dict, nstar_b: list, nstar, codes,
            expected_ms) -> None:
    """One configuration's figures added to the columns: its constants, its figures over max_model_len (`cap`, the
    problem `codes`), and over (batch, context) (`step`, N* per batch, the step model's `expected_ms`)."""
    import numpy as np

    const, per_len, per_bc = columns
    for key, value in zip(("model", "gpu", "dtype", "tp"), ids, strict=True):
        const[key].append(value)
    const["weight_bytes_held"].append(plan.weights)
    const["available_kv_bytes"].append(plan.available)
    const["kv_bytes_per_token"].append(kv_bytes_per_token(plan.layers))
    const["num_blocks"].append(plan.num_blocks)
    const["crossover_tokens"].append(nstar)
    per_len["max_model_len"].append(grid.lens)
    for key in ("blocks_per_request", "max_concurrency", "kv_tokens"):
        per_len[key].append(cap[key])
    per_len["problem"].append(codes)
    per_len["fits"].append(codes < 0)
    per_bc["batch"].append(grid.b)
    per_bc["context"].append(grid.c)
    for key in ("weight_bytes", "kv_bytes", "step_bytes", "saving", "step_ms"):
        per_bc[key].append(step[key])
    per_bc["bound"].append(step["kv_bound"])
    per_bc["expected_step_ms"].append(expected_ms)
    per_bc["crossover_tokens_at_batch"].append(np.repeat([np.nan if x is None else x for x in nstar_b],
                                                         grid.cs.size))


# The columns by how they vary: one value per configuration, one per max_model_len, one per (batch, context)
_CONST = ("model", "gpu", "dtype", "tp", "what_if", "weight_bytes_held", "available_kv_bytes", "kv_bytes_per_token",
          "num_blocks", "crossover_tokens")
_PER_LEN = ("max_model_len", "blocks_per_request", "max_concurrency", "kv_tokens", "fits", "problem")
_PER_BC = ("batch", "context", "weight_bytes", "kv_bytes", "step_bytes", "saving", "bound", "crossover_tokens_at_batch",
           "step_ms", "expected_step_ms")
# counts (and bytes) are whole numbers, `fits` a yes/no, the categories their codes; every other column is a real
# number
_DTYPES = {"model": "int32", "gpu": "int32", "dtype": "int32", "problem": "int32", "what_if": "int32", "bound": "int8",
           "fits": "bool",
           **{c: "int64" for c in ("tp", "max_model_len", "batch", "context", "weight_bytes_held",
                                   "available_kv_bytes", "num_blocks", "blocks_per_request", "kv_tokens")}}


def _stack(parts: list, n_cfg: int, width: int, dtype):
    """The configurations' arrays of one column as an (n_cfg, width) array of `dtype`."""
    import numpy as np

    if not parts:
        return np.empty((0, width), dtype=dtype)
    return np.asarray(np.stack(parts), dtype=dtype).reshape(n_cfg, width)


def _problem_codes(d, plan, lens, cap: dict, problems: dict):
    """Per max_model_len, the code of why vLLM refuses the row (capacity's problem, collected in `problems`), -1
    where it runs. One message per configuration, or per length that does not fit: never one per row."""
    import numpy as np

    def code(message: str) -> int:
        return problems.setdefault(message, len(problems))

    codes = np.full(lens.size, -1, dtype=np.int32)
    for i in np.flatnonzero(lens > d.model.max_position_embeddings):  # refused before any memory is planned
        refused = max_len_refusal(d.model, int(lens[i]))
        if refused:
            codes[i] = code(refused)
    whole = pool_problem(d, plan)
    if whole is not None:
        codes[codes < 0] = code(whole)
        return codes
    for i in np.flatnonzero(~np.asarray(cap["fits"], dtype=bool) & (codes < 0)):
        mlen = int(lens[i])
        longest = longest_fitting(plan.blocks_per_request, plan.num_blocks - 1, mlen)
        codes[i] = code(length_problem(plan, mlen, int(cap["blocks_per_request"][i]), longest))
    if (codes < 0).any():
        sampler, _ = sampler_problem(d, plan)
        if sampler is not None:
            codes[codes < 0] = code(sampler)
    return codes


def _axes(max_model_lens, batches, contexts):
    """The numeric axes as int64 arrays, each checked: non-empty, positive, whole numbers float64 holds exactly."""
    import numpy as np

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
    return lens, bs, cs


def _frame(const: dict, per_len: dict, per_bc: dict, categories: dict, problems: dict, n_len: int,
           n_bc: int) -> dict:
    """The sweep's columns, each built once from the configurations' figures: a constant per configuration repeated
    over its rows, a figure per max_model_len repeated over (batch, context), a figure per (batch, context) the same
    for every max_model_len."""
    import numpy as np
    import pandas as pd

    rows_per_config = n_len * n_bc
    n_cfg = len(const["model"])
    frame: dict = {}
    for c in COLUMNS:
        dtype = _DTYPES.get(c, np.float64)
        if c in const:  # one value per configuration, repeated over its rows
            values = np.repeat(np.array([np.nan if x is None else x for x in const[c]], dtype=np.float64
                                        if c == "crossover_tokens" else dtype), rows_per_config)
        elif c in per_len:  # over max_model_len (slower than batch and context)
            values = np.repeat(_stack(per_len[c], n_cfg, n_len, dtype).ravel(), n_bc)
        else:  # over (batch, context), the same for every max_model_len
            values = np.broadcast_to(_stack(per_bc[c], n_cfg, n_bc, dtype)[:, None, :],
                                     (n_cfg, n_len, n_bc)).reshape(-1)
        if c in categories:
            frame[c] = pd.Categorical.from_codes(values, categories=categories[c])
        elif c == "problem":  # code -1: the row fits, an empty cell
            frame[c] = pd.Categorical.from_codes(values, categories=list(problems))
        elif c == "bound":
            frame[c] = pd.Categorical.from_codes(values, categories=["weights", "kv"])
        else:
            frame[c] = values
    return frame


# Byte counts held as float64 (a custom format's bytes per token may be fractional), written as integers in CSV,
# JSON and markdown when every value is whole (kvplan.files.write_frame)
BYTE_COUNTS = ("kv_bytes_per_token", "weight_bytes", "kv_bytes", "step_bytes")


def _expected_ms(d, batches, contexts, profiles: dict):
    """The step model's time at each (batch, context), NaN where no profile prices the GPU; `profiles` collects the
    profile each GPU's times come from."""
    import numpy as np

    from kvplan.sizing.step_time import has_profile, step_model

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
