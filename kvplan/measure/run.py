"""Running `kvplan measure` on a device: identify it, size the plan to its memory, time every point with a progress
bar, fit, and write the calibration profile atomically (an interrupted run leaves none). Needs torch and triton."""

from __future__ import annotations

import os
import sys
from typing import Optional

from kvplan.errors import KvplanError
from kvplan.specs.calibration import (
    FAMILIES,
    MB,
    CalibrationProfile,
    cache_dir,
    measure_plan,
    profile_name,
    save_calibration,
)


def _catalog_peak(name: str) -> tuple[Optional[float], Optional[float]]:
    """Datasheet bandwidth and L2 of the catalog GPU whose nvidia-smi name matches the device's."""
    g = _catalog_gpu(name)
    return (g.peak_bandwidth_bytes_per_s, (g.l2_mb or 50) * MB) if g is not None else (None, None)


def run_measure(quick: bool = False, output: Optional[str] = None, device_name: str = "cuda",
                sizes: Optional[list[int]] = None, families: tuple[str, ...] = FAMILIES,
                samples: Optional[int] = None, warmup: int = 3, console=None):
    """Measure this GPU and save the calibration profile: (its path, the profile). `console` (a rich Console) shows
    a progress bar on a terminal."""
    import torch

    if device_name == "cuda" and not torch.cuda.is_available():
        raise KvplanError("kvplan measure needs a CUDA GPU, and torch sees none; `kvplan measure --dry-run` prints "
                          "the plan anywhere")
    from kvplan.kernels.bench import CHECK_FORMATS, device_info, run_plan, self_check, timed_contexts

    if device_name == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise KvplanError("--device cpu runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1")
    device = torch.device("cuda:0" if device_name == "cuda" else "cpu")
    info = device_info(device)
    peak, l2 = _catalog_peak(info["name"])
    free = info.get("memory_free_bytes")
    plan = measure_plan(quick, l2_bytes=int(l2 or 50 * MB), bandwidth_bytes_per_s=peak or 1e12,
                        free_bytes=free, families=families, sizes=sizes, samples=samples, warmup=warmup)
    # every decode kernel the plan times, at the timed shape and context lengths, before any timing
    timed = {i.family.removeprefix("decode_") for i in plan.items if i.family.startswith("decode_")}
    check = tuple(f for f in CHECK_FORMATS if f in timed or (f == "float16" and "bfloat16" in timed))
    plan_sizes = sorted({i.size_bytes for i in plan.items})
    bad = self_check(device, {f: timed_contexts(f, plan_sizes) for f in check}, formats=check) if check else []
    if bad:
        raise KvplanError(f"the decode kernels disagree with their torch references on {info['name']} for "
                          f"{', '.join(bad)}: the timings would not mean anything, so no profile is written "
                          f"(torch {info['torch']}, triton {info['triton']})")
    info["self_check"] = (f"{len(check)} decode kernels (and their write kernels on a GPU) match the torch "
                          "references at the timed shapes" if check else "no decode kernel timed")
    with_bar = console is not None and sys.stderr.isatty()
    if with_bar:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        prog = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeRemainingColumn(), console=console)
        task = prog.add_task("measuring", total=len(plan.items))
        prog.start()

        def step(what: str) -> None:
            prog.update(task, description=what, advance=1)
    else:
        def step(what: str) -> None:
            pass
    try:
        fits = run_plan(plan, device, peak or 1.0, step)
    finally:
        if with_bar:
            prog.stop()
    if peak is None:  # an uncatalogued GPU: eta relative to the best streaming read measured here
        best = fits["stream_read"].eta if "stream_read" in fits else 1.0
        peak = best
        for f in fits.values():
            f.eta /= best
        info["note"] = "not in the GPU catalog: eta is relative to the measured streaming read"
    profile = CalibrationProfile(info, float(peak), fits, quick)
    path = output or str(cache_dir() / profile_name(info["name"]))
    if not output:
        cache_dir().mkdir(parents=True, exist_ok=True)
    save_calibration(profile, path)
    return path, profile


def validate_target(model_name: str, fmt_name: str):
    """The model and KV format --validate times, checked without torch or a GPU: a multi-head attention model (the
    kernels --validate runs) and a known format."""
    from kvplan.specs.catalog import load_model
    from kvplan.specs.kv_formats import kv_format

    m = load_model(model_name)
    if m.is_mla or m.head_dim is None:
        raise KvplanError(f"--validate runs multi-head attention kernels; {m.name} uses MLA")
    return m, kv_format(fmt_name)


def run_validate(model_name: str, fmt_name: str = "auto", batch: int = 8, context: int = 4096,
                 layers: Optional[int] = None, device_name: str = "cuda", calibration: Optional[str] = None,
                 samples: int = 5) -> dict:
    """Time a synthetic decode step of the model's shapes; put the roofline of the bytes it read and, with a
    calibration profile, the step model's prediction of it (predicted_step_s) beside it."""
    import torch

    from kvplan.specs.calibration import find_calibration, load_calibration

    m, fmt = validate_target(model_name, fmt_name)  # a misspelt name is found before the GPU is looked for
    if device_name == "cuda" and not torch.cuda.is_available():
        raise KvplanError("kvplan measure --validate needs a CUDA GPU, and torch sees none")
    if device_name == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise KvplanError("--device cpu runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1")
    from kvplan.kernels.bench import device_info, validate_step

    device = torch.device("cuda:0" if device_name == "cuda" else "cpu")
    info = device_info(device)
    if layers is None:
        if device.type == "cuda":  # as many layers as fit in 40% of the free memory
            from kvplan.sizing.weights import weight_bytes

            per_layer = weight_bytes(m).total / m.num_layers
            layers = max(1, min(m.num_layers, int(0.4 * info["memory_free_bytes"] // per_layer)))
        else:
            layers = 1
    r = validate_step(m, fmt.name, batch, context, layers, device, samples=samples)
    peak, _ = _catalog_peak(info["name"])
    cal_path = calibration or (str(find_calibration([info["name"]]) or "") or None)
    cal = load_calibration(cal_path) if cal_path else None
    if peak is None:
        peak = cal.peak_bandwidth_bytes_per_s if cal else None
    out = {"model": m.name, "dtype": fmt.name, "batch": batch, "context": context, "layers": layers,
           "device": info.get("name"), "measured_ms": r["seconds"] * 1e3, "weight_bytes": r["weight_bytes"],
           "kv_bytes": r["kv_bytes"], "roofline_ms": None, "calibrated_ms": None, "calibration": cal_path}
    if peak:
        out["roofline_ms"] = (r["weight_bytes"] + r["kv_bytes"]) / peak * 1e3
    if cal is not None:
        out["calibrated_ms"] = predicted_step_s(m, fmt, _catalog_gpu(info["name"]), cal, cal_path, info["name"],
                                                batch, context, layers) * 1e3
    return out


def predicted_step_s(m, fmt, gpu, cal, source: str, device: str, batch: int, context: int, layers: int) -> float:
    """What the step model (kvplan.sizing.step_time, with the calibration `cal` over the bundled fits for `gpu`)
    predicts for the decode step --validate times: the weight GEMMs and decode attention of `layers` of the model's
    layers, `batch` sequences of `context` tokens on one GPU. The step model prices a whole engine step; the timed
    step is its GEMMs (less the LM head's) and attention, per layer, for `layers` layers. `device`: the name the
    profile takes where kvplan bundles no fits for the GPU (or it is not in the catalog)."""
    from kvplan.deployment import DeploymentArgs
    from kvplan.sizing.kernel_seconds import gemm_call_seconds
    from kvplan.sizing.step_fits import StepProfile, bundled_profile, with_calibration
    from kvplan.sizing.step_time import StepModel

    base = bundled_profile(gpu) or StepProfile(gpu=device, name="", peak_bandwidth_bytes_per_s=
                                               cal.peak_bandwidth_bytes_per_s, attention={}, gemm={}, moe={},
                                               allreduce={})
    d = DeploymentArgs(model=m, gpu=gpu, kv_cache_dtype=fmt).resolve()
    sm = StepModel(d, with_calibration(base, cal, source, gpu))
    step = sm.step(batch, context)
    bw = sm.profile.peak_bandwidth_bytes_per_s
    lm_head = sum(c * gemm_call_seconds(f, bw, batch, n, k, mb, a) for f, mb, n, k, c, a in sm.dense
                  if c == 1 and n >= m.vocab_size)
    return (step.gemm_s - lm_head + step.moe_s + step.attention_s) / m.num_layers * layers


def _catalog_gpu(name: str):
    """The catalog GPU whose nvidia-smi name is the device's (None: not in the catalog)."""
    from kvplan.specs.catalog import load_catalog

    return next((g for g in load_catalog("hardware") if g.smi_name and g.smi_name.lower() == name.lower()), None)


def probe_path(device_name: str) -> str:
    """Where `kvplan measure --probe` writes by default: kvplan's cache directory, named after the GPU."""
    return str(cache_dir() / ("probe-" + profile_name(device_name).removesuffix(".yaml") + ".json"))


def run_probe(output: Optional[str] = None, budget_s: Optional[float] = None,
              samples: int = 10) -> tuple[str, dict]:
    """Sweep the bf16 and fp8 paged decode kernels' tile sizes, warps, stages and splits, and the L2 flush methods,
    on the GPU torch sees, starting no configuration after `budget_s` seconds of sweep (the probe's own budget by
    default); write the findings as JSON (atomically) to `output`. Returns the path and the findings."""
    import json

    import torch

    from kvplan.files import atomic_write_text

    if not torch.cuda.is_available():
        raise KvplanError("kvplan measure --probe needs a CUDA GPU, and torch sees none")
    from kvplan.kernels.bench import device_info
    from kvplan.kernels.probe import BUDGET_S
    from kvplan.kernels.probe import run_probe as sweep_kernels

    device = torch.device("cuda:0")
    info = device_info(device)
    peak, l2 = _catalog_peak(info["name"])
    path = output or probe_path(info["name"])
    if not output:
        cache_dir().mkdir(parents=True, exist_ok=True)

    def say(what: str) -> None:
        print(f"probe: {what}", file=sys.stderr)

    found = sweep_kernels(device, max(2 * int(l2 or 50 * MB), 64 * MB), BUDGET_S if budget_s is None else budget_s,
                          samples, say)
    found = {"device": info, "peak_bytes_per_s": peak, **found}
    if peak:
        for row in found["configurations"] + [v for v in found.get("flush", {}).values() if isinstance(v, dict)]:
            if "bytes_per_s" in row:
                row["fraction_of_peak"] = row["bytes_per_s"] / peak
    atomic_write_text(path, json.dumps(found, indent=1, default=str) + "\n")
    return path, found
