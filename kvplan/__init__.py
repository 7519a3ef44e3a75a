"""kvplan: what a KV-cache format buys on a given model, GPU and parallelism.

The questions the CLI answers are functions of the package:

    >>> import kvplan
    >>> m = kvplan.load_model("llama3-8b")
    >>> r = kvplan.crossover(m, "fp8", weight_read="all")
    >>> round(r.crossover_tokens)
    245064
    >>> c = kvplan.capacity(m, kvplan.load_gpu("h100"), "fp8", gpu_memory_gib=79.65, max_model_len=8192,
    ...                     activation_gib=6.0)
    >>> round(c.max_concurrency, 1)
    104.6

Names are imported on first use, so `import kvplan` stays cheap for the command line.
"""

from __future__ import annotations

import importlib
import os as _os

__version__ = "0.1.0"

# Installed, the GPU kernels are kvplan/kernels; a source checkout keeps them in kernels/ beside this package, so
# the checkout's root joins the package's search path and `kvplan.kernels` finds them there.
_pkg = _os.path.dirname(_os.path.abspath(__file__))
if not _os.path.isdir(_os.path.join(_pkg, "kernels")) and _os.path.isdir(_os.path.join(_pkg, "..", "kernels")):
    __path__.append(_os.path.dirname(_pkg))  # noqa: F821 - a package's own __path__

_EXPORTS = {
    "crossover": "api", "CrossoverResult": "plan.crossover", "OperatingPoint": "plan.crossover",
    "capacity": "api", "CapacityResult": "plan.vllm_capacity", "PoolResult": "plan.capacity",
    "sweep": "plan.sweep",
    "throughput": "api", "ThroughputResult": "plan.throughput", "ThroughputRow": "plan.throughput",
    "step_model": "sizing.step_time", "StepModel": "sizing.step_time",
    "gate": "app.gates", "GateReport": "app.gates",
    "kv_format": "specs.kv_formats", "KVFormat": "specs.kv_formats", "KV_FORMATS": "specs.kv_formats",
    "ModelSpec": "specs.catalog", "GPUSpec": "specs.catalog", "load_model": "specs.catalog",
    "load_gpu": "specs.catalog",
    "param_count": "sizing.model_tensors", "weight_bytes": "sizing.weights",
    "run_quality": "quality.run", "QualityResult": "quality.run", "run_synthetic": "quality.synthetic",
    "evidence_for": "specs.kv_evidence",
    "KvplanError": "errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvplan' has no attribute {name!r}")
    module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
    value = getattr(module, "CATALOG" if name == "KV_FORMATS" else name)
    globals()[name] = value
    return value
