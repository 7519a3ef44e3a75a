"""Startup logs against kvplan's prediction: the configuration each ran, every figure it measured beside kvplan's
figure for the same configuration, and the deployment profile (kvplan.specs.profile) of the overheads it measured, kept
so
that later "what if" questions (another KV dtype, max_model_len or utilization) start from them."""

from __future__ import annotations

import hashlib
import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from kvplan.app.startup_log import StartupLog, parse_startup_log
from kvplan.deployment import DeploymentArgs
from kvplan.deployment.options import LAYOUT_OPTIONS, SGLANG_ONLY, VLLM_ONLY, flag
from kvplan.errors import KvplanError
from kvplan.plan.sglang_pool import sglang_capacity
from kvplan.plan.vllm_capacity import capacity_of
from kvplan.rules.vllm import version_key, vllm_rules
from kvplan.sizing.vllm_non_torch import pre_snapshot_bytes
from kvplan.specs.catalog import (
    GPUSpec,
    ModelSpec,
    gpu_by_memory,
    load_catalog,
    load_gpu,
    load_model,
    model_for_repo,
)
from kvplan.specs.hf_config import int4_format
from kvplan.specs.profile import DeploymentProfile
from kvplan.units import GiB

# the data- and expert-parallel options each engine's startup log states, as the engine names them
VLLM_LAYOUT = tuple(n for n in LAYOUT_OPTIONS if n in VLLM_ONLY)
SGLANG_LAYOUT = tuple(n for n in LAYOUT_OPTIONS if n in SGLANG_ONLY)


def _layout_given(c: dict, names: tuple, notes: list) -> dict:
    """The layout options a log's configuration `c` sets beyond the engine's defaults, said in a note."""
    default = {"data_parallel_size": 1, "dp_size": 1, "moe_a2a_backend": "none"}
    layout = {k: c[k] for k in names if c.get(k) not in (None, False, default.get(k))}
    if layout:
        notes.append("the layout the log started with: " + ", ".join(f"{flag(k)} {v}" if v is not True else flag(k)
                                                                      for k, v in layout.items()))
    return layout


@dataclass
class Figure:
    name: str
    measured: Optional[float]
    predicted: Optional[float]
    unit: str = ""

    @property
    def error_pct(self) -> Optional[float]:
        if self.measured in (None, 0) or self.predicted is None:
            return None
        return (self.predicted - self.measured) / self.measured * 100


@dataclass
class LogImport:
    engine: str
    version: Optional[str]
    model: str
    config: dict
    figures: list[Figure]
    profile: Optional[DeploymentProfile]
    notes: list[str] = field(default_factory=list)
    failure: Optional[dict] = None  # the engine's own error, when the log shows it stopping
    predicted_failure: Optional[str] = None  # kvplan's refusal of the same configuration (None: kvplan says it runs)

    @property
    def failure_predicted(self) -> Optional[bool]:
        return None if self.failure is None else self.predicted_failure is not None

    def figure(self, name: str) -> Optional[Figure]:
        return next((f for f in self.figures if f.name == name), None)

    def to_dict(self) -> dict:
        return {"engine": self.engine, "version": self.version, "model": self.model, "config": self.config,
                "figures": [{**asdict(f), "error_pct": f.error_pct} for f in self.figures],
                "profile": self.profile.model_dump(by_alias=True, exclude_none=True) if self.profile else None,
                "failure": self.failure, "predicted_failure": self.predicted_failure,
                "failure_predicted": self.failure_predicted, "notes": self.notes}


# the log names the method, not its groups: 128, the common one, as a config without group_size means
_WEIGHT_DTYPES = {"fp8": "fp8", "fbgemm_fp8": "fp8_channel", "mxfp4": "mxfp4", "modelopt_fp4": "nvfp4",
                  "modelopt": "fp8", **{m: int4_format(m) for m in ("awq", "gptq", "awq_marlin", "gptq_marlin")}}
# compressed-tensors checkpoints say what they hold in their names (llm-compressor's naming)
_COMPRESSED_TENSORS = [(r"nvfp4|fp4", "nvfp4"), (r"fp8", "fp8_channel"), (r"w4a16|int4", "int4_g128"),
                       (r"w8a8|w8a16|int8", "int8")]


def human_bytes(value) -> int:
    """vLLM's human-readable byte counts: an integer, or one with a suffix, upper case binary (1G = 2^30), lower
    case decimal (1g = 10^9)."""
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgGtT]?)\s*", str(value))
    if not m:
        raise KvplanError(f"kv_cache_memory_bytes '{value}': expected a byte count such as 4294967296, 4G or 4g")
    unit = m.group(2)
    power = " kmgt".index(unit.lower()) if unit else 0
    return int(float(m.group(1)) * (1024 if unit.isupper() else 1000) ** power)


def _weight_dtype(quant: Optional[str], repo: str) -> Optional[str]:
    q = str(quant).lower()
    if q == "compressed-tensors":
        for pattern, dtype in _COMPRESSED_TENSORS:
            if re.search(pattern, repo.lower()):
                return dtype
        return None
    return _WEIGHT_DTYPES.get(q)


def _gpu_named_in(text: str) -> Optional[GPUSpec]:
    """A catalog GPU whose nvidia-smi name the log mentions (driver or library messages sometimes print it)."""
    for g in load_catalog("hardware"):
        if g.smi_name and re.search(re.escape(g.smi_name) + r"(?![\w-])", text):
            return g
    return None


def import_log(text: str, source: str = "log", model: Optional[str] = None,
               gpu: Optional[str] = None, configs: Sequence[str | Path] = ()) -> LogImport:
    """Read a startup log, predict the same configuration, and keep what it measured as a profile. `configs`:
    folders of config.json files where the log's model is looked up before the catalog."""
    log = parse_startup_log(text, source)
    m = load_model(model) if model else model_for_repo(str(log.config.get("model", "")), configs)
    if model and log.config.get("model"):
        _check_same_model(m, str(log.config["model"]))
    g = load_gpu(gpu) if gpu else _gpu_named_in(text)
    sha = hashlib.sha256(text.encode()).hexdigest()
    importer = _import_sglang if log.engine == "sglang" else _import_vllm
    result = importer(log, m, g, Path(source).name, sha)
    if log.startups > 1:
        result.notes.insert(0, f"the log holds {log.startups} startups (a restarted server appending to one file); "
                               f"read the last, from line {log.first_line}")
    return result


def _import_vllm(log: StartupLog, m: ModelSpec, g: Optional[GPUSpec], source: str, sha: str) -> LogImport:
    """A vLLM log: the deployment it started (_vllm_deployment), kvplan's plan of it, what the engine measured in
    bytes consistent with its block count (_vllm_available), and the figures side by side (_vllm_figures)."""
    c, meas = log.config, log.measured
    rules = vllm_rules(log.version)
    notes: list[str] = []
    kw, layout, total_gib = _vllm_deployment(log, m, g, rules, notes)
    util = kw.get("gpu_memory_utilization", c.get("gpu_memory_utilization") or rules.default_gpu_memory_utilization)
    tp, pp, weight_dtype = kw["tp"], kw["pp"], kw["weight_dtype"]
    dtype = str(c.get("kv_cache_dtype") or "auto")

    if log.failure is not None:
        return _vllm_failure(log, m, g, kw, dtype, notes)
    d = DeploymentArgs(model=m, gpu=g, kv_cache_dtype=dtype, engine="vllm", **kw).resolve(needs_memory=True)
    pred = capacity_of(d)
    used = c.get("attention_backend_used")
    if used and d.attention_backend is not None and used != d.attention_backend.name:
        notes.append(f"the log's vLLM ran the {used} attention backend; kvplan planned {d.attention_backend.label}, "
                     f"block {d.block_size} (pass --attention-backend {used} to plan the log's)")
    if pred.problem:
        notes.append(f"kvplan predicts a failure the log does not show: {pred.problem}")
    blocks, available, avail_gib = _vllm_available(meas, pred, rules, notes)
    mlen = pred.max_model_len
    total = int(round(total_gib * GiB)) if total_gib is not None else pred.total_bytes
    requested = math.ceil(total * float(util))
    weights = int(round(meas["weights_gib"] * GiB)) if "weights_gib" in meas else pred.non_kv["weights"]
    if c.get("kv_cache_memory_bytes") is None and requested - weights - available < 0:
        raise KvplanError(f"the log's weights ({weights / GiB:.2f} GiB) and KV cache ({available / GiB:.2f} GiB) "
                          f"exceed its budget ({requested / GiB:.2f} GiB): the figures do not belong to {m.name} on "
                          f"this memory (is --model the model the log ran? is --gpu its GPU?)")
    profile = DeploymentProfile(
        engine="vllm", engine_version=rules.version, model=m.name, gpu=pred.gpu, tp=tp, pp=pp,
        weight_dtype=weight_dtype, kv_cache_dtype=dtype, max_model_len=mlen, gpu_memory_utilization=float(util),
        total_memory_bytes=total, weights_bytes=weights, overhead_bytes=requested - weights - available,
        available_kv_bytes=available, max_num_batched_tokens=pred.non_kv["max_num_batched_tokens"],
        max_num_seqs=pred.non_kv["max_num_seqs"], layout=layout, source=source, source_sha256=sha)
    figures = _vllm_figures(meas, pred, blocks, available if avail_gib is not None else None,
                            requested - weights - available)
    config = {"model": m.name, "gpu": pred.gpu, "total_memory_gib": _gib(total), **kw, "kv_cache_dtype": dtype}
    return LogImport("vllm", log.version, m.name, config, figures, profile, notes + pred.notes)


def _vllm_deployment(log: StartupLog, m: ModelSpec, g: Optional[GPUSpec], rules, notes: list[str]):
    """The deployment a vLLM log started, as DeploymentArgs keywords: (the keywords, the layout options it gave,
    the GPU's total memory the log states in GiB or None)."""
    c, meas = log.config, log.measured
    if log.v0 or (log.version and version_key(log.version) < (0, 19)):
        notes.append(f"vLLM {log.version or '(version not printed)'}: {'the V0 engine' if log.v0 else 'this release'}"
                     f" is planned with the rules of {rules.label}; the profile saved from this log keeps what it "
                     f"measured")
    total_gib = meas.get("total_gpu_memory_gib")
    if total_gib is None and g is None and log.failure is None:
        raise KvplanError("the log does not state the GPU's total memory; pass --gpu")
    util = c.get("gpu_memory_utilization") or rules.default_gpu_memory_utilization
    quant = c.get("quantization")
    if m.weight_dtype not in ("bf16", "fp16", "fp32"):
        quant = None  # the model's own config says how its weights are stored
    weight_dtype = _weight_dtype(quant, str(c.get("model", ""))) if quant else None
    if quant and weight_dtype is None:
        notes.append(f"quantization '{quant}' is not modelled; weights are predicted in the checkpoint's format")
    tp, pp = int(c.get("tp", 1)), int(c.get("pp", 1))
    kw = dict(tp=tp, pp=pp, dcp=int(c.get("dcp") or 1), engine_version=log.version,
              gpu_memory_utilization=float(util),
              max_model_len=int(c.get("max_model_len") or m.max_position_embeddings),
              block_size=int(c["block_size"]) if c.get("block_size") else None, weight_dtype=weight_dtype,
              max_num_seqs=c.get("max_num_seqs"), max_num_batched_tokens=c.get("max_num_batched_tokens"),
              enforce_eager=bool(c.get("enforce_eager", False)), entrypoint=c.get("entrypoint", "serve"))
    if c.get("attention_backend"):  # --attention-backend: plan with the backend the log's run was given
        kw["attention_backend"] = str(c["attention_backend"])
    layout = _layout_given(c, VLLM_LAYOUT, notes)
    kw.update(layout)
    if "entrypoint" not in c and not (c.get("max_num_batched_tokens") and c.get("max_num_seqs")):
        notes.append("the log does not show how vLLM was started: `vllm serve`'s batch defaults assumed (the "
                     "offline LLM class batches twice the tokens)")
    if total_gib is not None:
        kw["gpu_memory_gib"] = total_gib
    if c.get("kv_cache_memory_bytes"):  # the pool given directly: vLLM skips the memory profile
        kw["kv_cache_memory_gib"] = human_bytes(c["kv_cache_memory_bytes"]) / GiB
        kw.pop("gpu_memory_utilization")
        notes.append("kv_cache_memory_bytes set: the pool is the size given, not what the profile leaves")
    return kw, layout, total_gib


def _vllm_available(meas: dict, pred, rules, notes: list[str]):
    """What the engine measured for the pool, in bytes consistent with its block count: (blocks, available bytes,
    the available GiB the log printed or None)."""
    bpb = pred.bytes_per_block
    blocks = meas.get("num_gpu_blocks")
    if blocks is None and "kv_tokens" in meas:
        blocks = _blocks_from_tokens(int(meas["kv_tokens"]), pred, rules.reported_tokens)
    avail_gib = meas.get("available_kv_gib", meas.get("kv_reserved_gib"))
    if avail_gib is not None:
        available = int(round(avail_gib * GiB))
        if blocks is not None:  # the log rounds to 0.01 GiB; the block count pins it closer
            available = min(max(available, int(blocks) * bpb), (int(blocks) + 1) * bpb - 1)
    elif blocks is not None:
        available = int(blocks) * bpb + bpb // 2
        notes.append("the log prints no KV memory figure: taken from its block count")
    else:  # pragma: no cover - parse_startup_log refuses such logs
        raise KvplanError("the log has neither the available KV memory nor the block count")
    return blocks, available, avail_gib


def _vllm_figures(meas: dict, pred, blocks, available: Optional[int], beyond_weights: int) -> list:
    """Each figure the log printed beside kvplan's prediction of it."""
    nk = pred.non_kv
    return [
        Figure("available KV cache memory", _gib(available) if available is not None else None,
               _gib(pred.available_kv_bytes), "GiB"),
        Figure("KV blocks", blocks, pred.num_blocks),
        Figure("GPU KV cache size", meas.get("kv_tokens"), pred.kv_tokens, "tokens"),
        Figure("maximum concurrency", meas.get("max_concurrency"), round(pred.max_concurrency, 2), "x"),
        Figure("model weights", meas.get("weights_gib"), _gib(nk["weights"]), "GiB"),
        Figure("activation peak", meas.get("activation_peak_gib"), _gib(nk["activation"]), "GiB"),
        Figure("non-torch memory", meas.get("non_torch_gib"), _gib(nk["non_torch"]), "GiB"),
        Figure("CUDA-graph estimate", meas.get("cudagraph_estimated_gib"),
               _gib(nk["parts"].get("cudagraph_estimate", nk["cudagraph"])), "GiB"),
        # what the capture then took: "Graph capturing finished in N secs, took X GiB" (0.19), or the "(actual)"
        # of "CUDA graph pool memory"
        Figure("CUDA-graph capture", meas.get("graph_capture_gib", meas.get("cudagraph_actual_gib")),
               _gib(nk["parts"].get("cudagraph_capture", nk["cudagraph"])), "GiB"),
        Figure("non-KV memory beyond the weights", _gib(beyond_weights), _gib(nk["total"] - nk["weights"]), "GiB"),
    ]


def _vllm_failure(log: StartupLog, m: ModelSpec, g: Optional[GPUSpec], kw: dict, dtype: str,
                  notes: list[str]) -> LogImport:
    """A log that ends in the engine's error: kvplan plans the same configuration (with the free memory the refused
    rank saw) and says whether it refuses it too, and why."""
    fail = dict(log.failure or {})
    if fail.get("kind") == "free_memory":  # the rank saw this much free after its context and communicators
        seen_on = g or (gpu_by_memory(int(fail["total_gib"] * GiB)) if "total_gib" in fail else None)
        before = fail["free_gib"] + pre_snapshot_bytes(seen_on, int(kw.get("tp") or 1), vllm_rules(log.version),
                                                       moe=m.moe is not None) / GiB
        kw = {**kw, "free_memory_gib": round(before, 2),
              "gpu_memory_gib": fail.get("total_gib", kw.get("gpu_memory_gib"))}
    if kw.get("gpu_memory_gib") is None and g is None:
        kw["gpu_memory_gib"] = log.measured.get("total_gpu_memory_gib")
    config = {"model": m.name, "gpu": g.name if g else None, **kw, "kv_cache_dtype": dtype}
    try:
        d = DeploymentArgs(model=m, gpu=g, kv_cache_dtype=dtype, engine="vllm", **kw).resolve()
        if not d.total_bytes:  # nothing says how much memory: only the configuration's own checks apply
            return LogImport("vllm", log.version, m.name, config, [], None, notes, failure=fail)
        pred = capacity_of(d)
        predicted = pred.problem
        if predicted is None and fail.get("kind") == "sampler_warmup":
            predicted = next((n for n in pred.notes if n.startswith("sampler warm-up at risk")), None)
        figures = [
            Figure("available KV cache memory", log.measured.get("available_kv_gib"), _gib(pred.available_kv_bytes),
                   "GiB"),
            Figure("model weights", log.measured.get("weights_gib"), _gib(pred.non_kv["weights"]), "GiB")]
        if "graph_capture_gib" in log.measured and "cudagraph_capture" in pred.non_kv.get("parts", {}):
            figures.append(Figure("CUDA-graph capture", log.measured["graph_capture_gib"],
                                  _gib(pred.non_kv["parts"]["cudagraph_capture"]), "GiB"))
        config["gpu"] = pred.gpu
    except KvplanError as e:
        predicted, figures = str(e), []
    return LogImport("vllm", log.version, m.name, config, figures, None, notes, failure=fail,
                     predicted_failure=predicted)


_ARCHITECTURE = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
                 "intermediate_size", "mla", "moe")


def _check_same_model(m: ModelSpec, repo: str) -> None:
    """--model must describe the model the log ran: its figures are that model's."""
    try:
        ran = model_for_repo(repo)
    except KvplanError:
        return  # not in the catalog: --model is how the user names it
    if any(getattr(ran, f) != getattr(m, f) for f in _ARCHITECTURE):
        raise KvplanError(f"the log ran {repo} ({ran.name}), not {m.name}: its figures are that model's; drop "
                          f"--model (or give a spec of {ran.name})")


def _blocks_from_tokens(tokens: int, pred, reported: str) -> int:
    """The block count behind a reported token figure (0.25+: int(blocks / per_request x max_model_len);
    0.20: blocks // groups x block_size)."""
    if reported == "blocks":
        return tokens // pred.block_size * pred.num_kv_cache_groups
    bpr, mlen = pred.blocks_per_request, pred.max_model_len
    b = tokens * bpr // mlen
    while int(b / bpr * mlen) < tokens:
        b += 1
    return b


def _gib(b: float) -> float:
    return round(b / GiB, 4)


def _import_sglang(log: StartupLog, m: ModelSpec, g: Optional[GPUSpec], source: str, sha: str) -> LogImport:
    """An SGLang log: the deployment it started, resolved as `kvplan capacity --engine sglang` resolves it, planned
    from the free memories the log measured (and, with a GPU, end to end), beside the log's figures."""
    c, meas = log.config, log.measured
    notes: list[str] = []
    f = c.get("mem_fraction_static")
    dtype = str(c.get("kv_cache_dtype") or "auto")
    dtype = {"bf16": "bfloat16"}.get(dtype, dtype)
    if "free_before_load_gb" not in meas or "weights_load_avail_gb" not in meas:
        raise KvplanError("the SGLang log lacks the 'Load weight begin. ... avail mem=' and 'Load weight end. ... "
                          "avail mem=' lines; pass the whole startup log")
    if f is None and g is None:  # SGLang's default fraction depends on the GPU's memory
        raise KvplanError("the SGLang log states no mem_fraction_static (its server_args line) and no GPU to take "
                          "SGLang's default from; pass --gpu, or the whole startup log")
    layout = _layout_given(c, SGLANG_LAYOUT, notes)
    # planned with SGLang 0.5's rules whatever release the log names (reported as the log printed it)
    d = DeploymentArgs(model=m, gpu=g, engine="sglang", kv_cache_dtype=dtype, tp=int(c.get("tp", 1)),
                       max_model_len=c.get("max_model_len"), mem_fraction_static=f, page_size=c.get("page_size"),
                       **layout).resolve()
    notes += d.notes
    measured = sglang_capacity(d, logged=dict(free_before_load_gib=meas["free_before_load_gb"],
                                              weight_gib=meas.get("weights_gb"),
                                              avail_after_load_gib=meas["weights_load_avail_gb"]))
    figures = [Figure("max_total_num_tokens (from the log's free memory)", meas.get("max_total_num_tokens"),
                      measured.max_total_num_tokens, "tokens"),
               Figure("max_running_requests", meas.get("max_running_requests"), measured.max_running_requests),
               Figure("K size", meas.get("k_size_gb"), measured.k_size_gb, "GB")]
    if g is not None:
        e2e = sglang_capacity(d)
        figures.insert(0, Figure("max_total_num_tokens (end to end)", meas.get("max_total_num_tokens"),
                                 e2e.max_total_num_tokens, "tokens"))
        figures.append(Figure("free memory before loading", meas["free_before_load_gb"],
                              _gib(e2e.free_before_load_bytes), "GiB"))
    else:
        notes.append("pass --gpu to also predict the pool end to end, from the GPU's memory")
    profile = DeploymentProfile(
        engine="sglang", engine_version=log.version, model=m.name, gpu=g.name if g else None, tp=d.tp,
        kv_cache_dtype=d.kv.name, max_model_len=measured.context_len,
        mem_fraction_static=measured.mem_fraction_static, weights_bytes=measured.weight_bytes,
        free_before_load_bytes=measured.free_before_load_bytes, available_kv_bytes=measured.available_bytes,
        layout=layout, source=source, source_sha256=sha)
    config = {"model": m.name, "gpu": g.name if g else None, "tp": d.tp, "kv_cache_dtype": d.kv.name,
              "mem_fraction_static": measured.mem_fraction_static, "context_len": measured.context_len,
              "page_size": d.page_size, **layout}
    return LogImport("sglang", log.version, m.name, config, figures, profile, notes)


def log_summary(results: Sequence[tuple[str, "LogImport | str"]]) -> dict:
    """One row per log (available KV memory and weights, measured and predicted; a failure and whether kvplan
    refuses the same configuration; or why the log could not be read), and the median and worst errors."""
    rows = []
    for source, r in results:
        row: dict = {"log": Path(source).name}
        if isinstance(r, str):
            rows.append({**row, "status": "unread", "problem": r})
            continue
        row.update(model=r.model, tp=r.config.get("tp"), status="failed" if r.failure else "ok")
        for key, name in (("available_kv", "available KV cache memory"), ("weights", "model weights")):
            f = r.figure(name)
            if f is not None and f.measured is not None and r.failure is None:
                row[key] = {"measured_gib": f.measured, "predicted_gib": f.predicted, "error_pct": f.error_pct}
        if r.failure:
            row.update(failure=r.failure.get("message"), predicted_failure=r.predicted_failure,
                       failure_predicted=r.failure_predicted)
        rows.append(row)

    def stats(key: str) -> dict:
        errs = sorted(abs(row[key]["error_pct"]) for row in rows if key in row and row[key]["error_pct"] is not None)
        if not errs:
            return {"compared": 0, "median_abs_error_pct": None, "worst_abs_error_pct": None}
        return {"compared": len(errs), "median_abs_error_pct": statistics.median(errs), "worst_abs_error_pct": errs[-1]}

    failed = [row for row in rows if row["status"] == "failed"]
    return {"logs": rows, "available_kv": stats("available_kv"), "weights": stats("weights"),
            "failures": {"logs": len(failed), "predicted": sum(1 for row in failed if row["failure_predicted"])},
            "unread": sum(1 for row in rows if row["status"] == "unread")}
