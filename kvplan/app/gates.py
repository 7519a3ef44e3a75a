"""Capacity gates: a YAML file of configurations, each with the figures it must reach, checked in CI.

    defaults: {gpu: h100, engine: vllm, gpu_memory_utilization: 0.9}
    gates:
      - name: chat-8b-fp8-32k
        model: llama3-8b
        kv_cache_dtype: fp8
        max_model_len: 32768
        require:
          min_concurrency: 12
          max_step_ms: {batch: 32, context: 8192, ms: 25}

Loading and running are pure: `load_gates` checks the file, `run_gates` computes every figure and returns a
report; the CLI renders it, writes JUnit XML and compares with a baseline.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kvplan.errors import KvplanError, did_you_mean
from kvplan.units import GiB
from kvplan.values import frozen_dataclass


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OperatingPointLimit(_Strict):
    batch: int = Field(1, ge=1)
    context: int = Field(ge=1)


class StepMs(OperatingPointLimit):
    ms: float = Field(gt=0)


class StepGB(OperatingPointLimit):
    gb: float = Field(gt=0)


class SavingPct(OperatingPointLimit):
    pct: float


class Workload(_Strict):
    isl: int = Field(ge=1, description="prompt tokens per request")
    osl: int = Field(ge=1, description="output tokens per request")


class TpotMs(Workload):
    concurrency: int = Field(ge=1)
    ms: float = Field(gt=0)


class ThroughputPerGpu(Workload):
    tokens_per_s: float = Field(gt=0, description="output tokens per second per GPU")
    tpot_ms: Optional[float] = Field(None, gt=0, description="at the best concurrency meeting this TPOT")
    ttft_ms: Optional[float] = Field(None, gt=0)


class Require(_Strict):
    """What a gate must reach. min_* figures must be at least, max_* at most, the given value."""

    min_concurrency: Optional[float] = Field(None, description="sequences of max_model_len the pool holds")
    min_kv_tokens: Optional[int] = Field(None, description="tokens as vLLM reports 'GPU KV cache size'")
    min_num_blocks: Optional[int] = None
    min_available_kv_gib: Optional[float] = None
    min_crossover_tokens: Optional[float] = Field(None, description="N* at batch 1")
    max_step_ms: Optional[StepMs] = Field(None, description="roofline step time at an operating point (needs gpu)")
    max_step_gb: Optional[StepGB] = Field(None, description="bytes one decode step moves, GB")
    min_saving_pct: Optional[SavingPct] = Field(None, description="step bytes saved against the baseline dtype")
    max_tpot_ms: Optional[TpotMs] = Field(None, description="expected TPOT at a concurrency (kvplan throughput)")
    min_throughput_per_gpu: Optional[ThroughputPerGpu] = Field(
        None, description="best output tokens/s per GPU under the latency limits given (kvplan throughput)")

    @model_validator(mode="after")
    def _not_empty(self) -> "Require":
        if not any(getattr(self, k) is not None for k in type(self).model_fields):
            raise ValueError("require names no figure; give at least one of " + ", ".join(type(self).model_fields))
        return self


class Options(_Strict):
    """Any option `capacity` or `crossover` takes, by its long name with underscores."""

    model: Optional[str] = None
    gpu: Optional[str] = None
    engine: Literal["vllm"] = "vllm"
    engine_version: Optional[str] = None
    tp: Optional[int] = Field(None, ge=1)  # default: the profile's, or 1
    pp: Optional[int] = Field(None, ge=1)
    dcp: Optional[int] = Field(None, ge=1)
    num_gpu_blocks_override: Optional[int] = Field(None, ge=1)
    kv_cache_dtype: Optional[str] = None
    dtype: Optional[str] = None
    max_model_len: Optional[Union[Literal["auto"], int]] = Field(None, ge=1)
    gpu_memory_utilization: Optional[float] = Field(None, gt=0, le=1)  # default: the engine version's
    block_size: Optional[int] = Field(None, ge=1)
    attention_backend: Optional[str] = None  # vLLM's --attention-backend (auto: the selector's)
    activation_gib: Optional[float] = Field(None, ge=0)
    non_torch_gib: Optional[float] = Field(None, ge=0)
    cudagraph_gib: Optional[float] = Field(None, ge=0)
    max_num_seqs: Optional[int] = Field(None, ge=1)
    enforce_eager: bool = False
    language_model_only: bool = False
    mamba_ssm_cache_dtype: Optional[str] = None
    gpu_memory_gib: Optional[float] = Field(None, gt=0)
    free_memory_gib: Optional[float] = Field(None, gt=0)
    kv_cache_memory: Optional[float] = Field(None, gt=0)
    weight_dtype: Optional[str] = None
    kv_cache_dtype_skip_layers: Optional[Union[str, int, list[int]]] = None
    max_num_batched_tokens: Optional[int] = Field(None, ge=1)
    entrypoint: Optional[Literal["serve", "llm"]] = None
    data_parallel_size: Optional[int] = Field(None, ge=1)
    data_parallel_size_local: Optional[int] = Field(None, ge=1)
    enable_expert_parallel: bool = False
    all2all_backend: Optional[str] = None
    enable_eplb: bool = False
    num_redundant_experts: Optional[int] = Field(None, ge=0)
    profile: Optional[str] = Field(None, description="a deployment profile (`kvplan log ... --save-profile`)")
    calibration: Optional[str] = Field(None, description="a calibration profile (`kvplan measure`)")
    weight_read: Literal["streamed", "all"] = "streamed"
    baseline: str = "auto"

    def deployment_args(self):
        """The deployment this gate describes (kvplan.deployment.DeploymentArgs)."""
        from kvplan.deployment import DeploymentArgs

        fields = self.model_dump(exclude={"require", "name", "weight_read", "baseline", "dtype", "kv_cache_dtype",
                                          "kv_cache_memory"})
        return DeploymentArgs(**fields, kv_cache_dtype=self.kv_cache_dtype or self.dtype,
                              kv_cache_memory_gib=self.kv_cache_memory)


class Gate(Options):
    name: str = Field(min_length=1)
    require: Require

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if v.strip() != v or "\n" in v:
            raise ValueError("a gate name is one line without surrounding spaces")
        return v


class GateFile(_Strict):
    defaults: Options = Options()
    gates: list[dict[str, Any]] = Field(min_length=1)


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _first_error(e: ValidationError) -> dict:
    return sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")[0]  # a typo shows as extra + missing


def _error_line(path: str, e: ValidationError, where: str, fields: list[str]) -> str:
    err = _first_error(e)
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        parts = [str(p) for p in err["loc"]]
        if parts[:1] == ["require"]:
            fields = list(Require.model_fields)
            nested = Require.model_fields.get(parts[1]) if len(parts) > 2 else None
            for cand in getattr(nested and nested.annotation, "__args__", ()):  # require.max_step_ms.<typo>
                if isinstance(cand, type) and issubclass(cand, BaseModel):
                    fields = list(cand.model_fields)
        return f"{path}: {where}: field '{loc}' is not allowed{did_you_mean(parts[-1] if parts else '', fields)}"
    if err["loc"][:1] == ("kv_cache_dtype_skip_layers",):  # a union: pydantic's error names one of its members
        return (f"{path}: {where}: field 'kv_cache_dtype_skip_layers': expected layer indices such as [0, 1, 30, 31],"
                " one index, or a string such as 'sliding_window' or 'none'")
    msg = " ".join(err["msg"].removeprefix("Value error, ").split())
    return f"{path}: {where}: field '{loc}': {msg}"


def load_gates(source: str | Path | dict) -> list[Gate]:
    """The gates of a file (or an already parsed mapping), each with the defaults applied."""
    from kvplan.files import check_finite, read_yaml, type_name

    path = "gates" if isinstance(source, dict) else str(source)
    if isinstance(source, dict):
        data = source
    else:
        data = read_yaml(source, "gates file")
    if not isinstance(data, dict):
        raise KvplanError(f"{path}: expected a mapping with 'gates' (and optionally 'defaults') at the top level, "
                          f"found {type_name(data)}")
    check_finite(data, path)
    try:
        doc = GateFile.model_validate(data)
    except ValidationError as e:
        in_defaults = _first_error(e)["loc"][:1] == ("defaults",)
        fields = list(Options.model_fields) if in_defaults else list(GateFile.model_fields)
        raise KvplanError(_error_line(path, e, "defaults" if in_defaults else "top level", fields)) from None
    defaults = doc.defaults.model_dump(exclude_unset=True)
    gates, seen = [], set()
    for i, raw in enumerate(doc.gates):
        name = raw.get("name")
        plain = isinstance(name, str) and name and "\n" not in name and "\r" not in name
        where = f"gate '{name}'" if plain else f"gate #{i + 1}"
        try:
            g = Gate.model_validate({**defaults, **raw})
        except ValidationError as e:
            raise KvplanError(_error_line(path, e, where, list(Gate.model_fields))) from None
        if g.name in seen:
            raise KvplanError(f"{path}: {where}: the name is used twice; gate names must be unique")
        if g.model is None:
            raise KvplanError(f"{path}: {where}: field 'model' is missing (a catalog name, spec or config.json)")
        if g.kv_cache_dtype and g.dtype and g.kv_cache_dtype != g.dtype:
            raise KvplanError(f"{path}: {where}: kv_cache_dtype and dtype disagree; they are one option")
        seen.add(g.name)
        gates.append(g)
    return gates


# ----------------------------------------------------------------------------------------------------------------
# The requirement catalog: each requirement reads one figure from a gate's results


@frozen_dataclass
class Requirement:
    key: str
    figure: str  # what is measured, for people
    kind: Literal["min", "max"]
    needs: Literal["capacity", "crossover", "throughput"]
    read: Callable[[Any, Any], Optional[float]]  # (result, limit) -> measured figure
    threshold: Callable[[Any], float]  # limit -> required value


def _op(result, limit):
    return next(p for p in result.operating_points if p.batch == limit.batch and p.context == limit.context)


REQUIREMENTS: dict[str, Requirement] = {r.key: r for r in [
    Requirement("min_concurrency", "max concurrency (sequences)", "min", "capacity",
                lambda c, _: c.max_concurrency if c.fits else 0.0, float),
    Requirement("min_kv_tokens", "KV tokens", "min", "capacity", lambda c, _: c.kv_tokens if c.fits else 0, float),
    Requirement("min_num_blocks", "KV blocks", "min", "capacity", lambda c, _: c.num_blocks, float),
    Requirement("min_available_kv_gib", "KV pool GiB", "min", "capacity",
                lambda c, _: c.available_kv_bytes / GiB, float),
    Requirement("min_crossover_tokens", "crossover N* (tokens)", "min", "crossover",
                lambda x, _: x.crossover_tokens if x.crossover_tokens is not None else math.inf, float),
    Requirement("max_step_ms", "step ms", "max", "crossover", lambda x, lim: _op(x, lim).step_ms, lambda lim: lim.ms),
    Requirement("max_step_gb", "step GB", "max", "crossover", lambda x, lim: _op(x, lim).step_bytes / 1e9,
                lambda lim: lim.gb),
    Requirement("min_saving_pct", "saving %", "min", "crossover", lambda x, lim: _op(x, lim).saving * 100,
                lambda lim: lim.pct),
    Requirement("max_tpot_ms", "TPOT ms", "max", "throughput", lambda d, lim: _tpot(d, lim), lambda lim: lim.ms),
    Requirement("min_throughput_per_gpu", "output tokens/s per GPU", "min", "throughput",
                lambda d, lim: _best_per_gpu(d, lim), lambda lim: lim.tokens_per_s),
]}


def _tpot(d, lim) -> float:
    from kvplan.plan.throughput import throughput_of

    return throughput_of([d], lim.isl, lim.osl, [lim.concurrency]).rows[0].tpot_ms


def _best_per_gpu(d, lim) -> float:
    from kvplan.plan.throughput import throughput_of

    best = throughput_of([d], lim.isl, lim.osl, None, lim.tpot_ms, lim.ttft_ms).best[d.kv.name]
    return best.output_tokens_per_s_per_gpu if best is not None else 0.0


@dataclass
class Check:
    requirement: str
    figure: str
    measured: float
    required: float
    kind: str
    passed: bool
    at: Optional[str] = None  # "batch x context" for operating-point requirements
    note: Optional[str] = None


@dataclass
class GateResult:
    name: str
    model: str
    passed: bool
    checks: list[Check]
    config: dict
    deployment: dict = field(default_factory=dict)  # the resolved deployment the figures are for


@dataclass
class GateReport:
    gates: list[GateResult]
    regressions: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates) and not self.regressions

    def failures(self) -> list[tuple[str, Check]]:
        return [(g.name, c) for g in self.gates for c in g.checks if not c.passed]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "gates": [asdict(g) for g in self.gates], "regressions": self.regressions}

    def to_frame(self):
        """One row per check."""
        import pandas as pd

        return pd.DataFrame([{"gate": g.name, **asdict(c)} for g in self.gates for c in g.checks])


def run_gates(gates: list[Gate], source: str = "gates") -> GateReport:
    from kvplan.plan.crossover import crossover_of
    from kvplan.plan.capacity import pool_capacity

    results = []
    for g in gates:
        needed = {REQUIREMENTS[k].needs for k in _set_requirements(g)}
        try:
            d = g.deployment_args().resolve(needs_memory=bool(needed & {"capacity", "throughput"}))
            priced = [k for k in _set_requirements(g) if REQUIREMENTS[k].needs == "throughput"]
            if priced and d.gpu is not None:
                from kvplan.sizing.step_fits import bundled_gpus
                from kvplan.sizing.step_time import has_profile

                if not has_profile(d):
                    raise KvplanError(
                        f"require.{priced[0]} needs step times, and kvplan has no step-time profile for "
                        f"{d.gpu.name} (it bundles fits for {', '.join(bundled_gpus())}): run `kvplan measure` on "
                        f"that GPU and give the gate `calibration: PROFILE.yaml`, or choose one of those GPUs")
            cap = xover = None
            if "capacity" in needed:
                cap = pool_capacity(d)
            if "crossover" in needed:
                points = sorted({(lim.batch, lim.context) for k in _set_requirements(g)
                                 if isinstance((lim := getattr(g.require, k)), OperatingPointLimit)})
                if g.require.max_step_ms is not None and d.gpu is None:
                    raise KvplanError("max_step_ms needs a gpu (in the gate or in defaults)")
                xover = crossover_of(d, batches=sorted({b for b, _ in points}),
                                     contexts=sorted({c for _, c in points}), weight_read=g.weight_read,
                                     baseline=g.baseline)
        except KvplanError as e:
            raise KvplanError(f"{source}: gate '{g.name}': {e}") from None
        checks = []
        for key in _set_requirements(g):
            req, limit = REQUIREMENTS[key], getattr(g.require, key)
            result = {"capacity": cap, "crossover": xover, "throughput": d}[req.needs]
            measured = float(req.read(result, limit))
            required = float(req.threshold(limit))
            ok = measured >= required if req.kind == "min" else measured <= required
            at = f"{limit.batch} x {limit.context}" if isinstance(limit, OperatingPointLimit) else None
            if isinstance(limit, Workload):
                at = f"{limit.isl}/{limit.osl}" + (f" at {limit.concurrency}" if isinstance(limit, TpotMs) else "")
            note = cap.problem if (req.needs == "capacity" and cap is not None and not cap.fits) else None
            if req.needs == "throughput":  # which step times the figure rests on
                from kvplan.sizing.step_time import profile_for

                note = f"step times: {profile_for(d).name}"
            checks.append(Check(key, req.figure, measured, required, req.kind, ok, at, note))
        config = g.model_dump(exclude={"require", "name"}, exclude_none=True)
        results.append(GateResult(g.name, d.model.name, all(c.passed for c in checks), checks, config,
                                  d.to_dict()))
    return GateReport(results)


def _set_requirements(g: Gate) -> list[str]:
    return [k for k in Require.model_fields if getattr(g.require, k) is not None]


def gate(source: str | Path | dict) -> GateReport:
    """Load a gates file (or mapping) and check every gate.

    >>> import kvplan
    >>> report = kvplan.gate({"defaults": {"gpu": "h100", "activation_gib": 6}, "gates": [
    ...     {"name": "8b-fp8", "model": "llama3-8b", "kv_cache_dtype": "fp8", "require": {"min_concurrency": 100}},
    ...     {"name": "8b-bf16", "model": "llama3-8b", "require": {"min_concurrency": 100}}]})
    >>> report.passed, [g.passed for g in report.gates]
    (False, [True, False])
    """
    return run_gates(load_gates(source), "gates" if isinstance(source, dict) else str(source))


# ----------------------------------------------------------------------------------------------------------------
# Baseline comparison


def compare_baseline(report: GateReport, baseline: dict, max_regression_pct: float) -> list[dict]:
    """Figures that got worse than an earlier `--json` report by more than `max_regression_pct` percent."""
    from kvplan.files import type_name

    old = {}
    for i, g in enumerate(baseline.get("gates", [])):
        checks = g.get("checks") if isinstance(g, dict) else None
        for j, c in enumerate(checks if isinstance(checks, list) else []):
            if isinstance(c, dict):
                key = (g.get("name"), c.get("requirement"), c.get("at"))
                for where, value in zip((f"gates.{i}.name", f"gates.{i}.checks.{j}.requirement",
                                         f"gates.{i}.checks.{j}.at"), key):
                    if isinstance(value, (list, dict)):  # `kvplan gate --json` writes text (or null) there
                        raise KvplanError(f"--baseline: field '{where}' is {type_name(value)}, not text; use a "
                                          "`kvplan gate --json` result as the baseline")
                old[key] = c
    regressions = []
    for g in report.gates:
        for c in g.checks:
            prev = old.get((g.name, c.requirement, c.at))
            if prev is None or isinstance(prev.get("measured"), bool) or not isinstance(prev.get("measured"),
                                                                                        (int, float)):
                continue
            before, now = float(prev["measured"]), c.measured
            if not math.isfinite(before) or before == 0:
                continue
            worse = (before - now) / abs(before) if c.kind == "min" else (now - before) / abs(before)
            if worse * 100 > max_regression_pct:
                regressions.append({"gate": g.name, "requirement": c.requirement, "figure": c.figure, "at": c.at,
                                    "before": before, "now": now, "regression_pct": worse * 100})
    return regressions


# ----------------------------------------------------------------------------------------------------------------
# Reports for CI


def junit_xml(report: GateReport, suite: str = "kvplan gates") -> str:
    from xml.sax.saxutils import escape, quoteattr

    failures = sum(1 for g in report.gates if not g.passed)
    cases = []
    for g in report.gates:
        regress = [r for r in report.regressions if r["gate"] == g.name]
        body = ""
        failed = [c for c in g.checks if not c.passed]
        if failed or regress:
            lines = [_check_line(g.name, c) for c in failed]
            lines += [f"{g.name}: {r['figure']} regressed {r['regression_pct']:.1f}% ({_fmt(r['before'])} -> "
                      f"{_fmt(r['now'])})" for r in regress]
            body = (f"<failure message={quoteattr(lines[0])} type=\"CapacityGate\">{escape(chr(10).join(lines))}"
                    "</failure>")
        detail = "\n".join(f"{c.figure}{' at ' + c.at if c.at else ''}: {_fmt(c.measured)} "
                           f"({'>=' if c.kind == 'min' else '<='} {_fmt(c.required)})" for c in g.checks)
        cases.append(f'  <testcase classname="kvplan.gate" name={quoteattr(g.name)} time="0">{body}'
                     f"<system-out>{escape(detail)}</system-out></testcase>")
    failures += sum(1 for g in report.gates if g.passed and any(r["gate"] == g.name for r in report.regressions))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name={quoteattr(suite)} '
            f'tests="{len(report.gates)}" failures="{failures}" errors="0" skipped="0">\n'
            + "\n".join(cases) + "\n</testsuite>\n")


def _fmt(x: float) -> str:
    if x == math.inf:
        return "never"
    return f"{x:,.0f}" if abs(x) >= 1000 or float(x).is_integer() else f"{x:,.2f}"


def _check_line(gate_name: str, c: Check) -> str:
    at = f" at {c.at}" if c.at else ""
    rel = "below the required" if c.kind == "min" else "above the allowed"
    line = f"{gate_name}: {c.figure}{at} is {_fmt(c.measured)}, {rel} {_fmt(c.required)}"
    return line + (f" ({c.note})" if c.note else "")


def failure_lines(report: GateReport) -> list[str]:
    lines = [_check_line(name, c) for name, c in report.failures()]
    lines += [f"{r['gate']}: {r['figure']}{' at ' + r['at'] if r['at'] else ''} regressed {r['regression_pct']:.1f}% "
              f"({_fmt(r['before'])} -> {_fmt(r['now'])})" for r in report.regressions]
    return lines


def markdown_summary(report: GateReport) -> str:
    head = "## kvplan capacity gates: " + ("all passed" if report.passed else "FAILED") + "\n\n"
    rows = ["| gate | figure | measured | required | result |", "|---|---|---:|---:|---|"]
    for g in report.gates:
        for c in g.checks:
            at = f" at {c.at}" if c.at else ""
            req = f"{'≥' if c.kind == 'min' else '≤'} {_fmt(c.required)}"
            rows.append(f"| {g.name} | {c.figure}{at} | {_fmt(c.measured)} | {req} | "
                        f"{'pass' if c.passed else '**fail**'} |")
    text = head + "\n".join(rows) + "\n"
    if report.regressions:
        text += "\nRegressions against the baseline:\n\n" + "\n".join(
            f"- {r['gate']}: {r['figure']} {_fmt(r['before'])} -> {_fmt(r['now'])} ({r['regression_pct']:.1f}% worse)"
            for r in report.regressions) + "\n"
    return text
