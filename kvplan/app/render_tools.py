"""The other commands' tables: formats, models, GPUs, gates, startup logs, measure and quality."""

from __future__ import annotations

import math
import re
import sys
from typing import Any, Iterable, Optional

from kvplan.app.render import Table, _layer_list, console, gb, num, print_table, sci


def formats_table(rows: Iterable[dict], head_dim: int, mla_dims: tuple[int, int]) -> None:
    con = console()
    t = Table(title=f"KV cache formats: bytes per token per KV head (K+V) at head_dim {head_dim}; "
              f"MLA latent {mla_dims[0]}+{mla_dims[1]} per token per layer", title_justify="left")
    for col in ["name", "engines", "K B", "V B", "K+V B", "bits/elem", "MLA B", "default skip layers"]:
        t.add_column(col, justify="right" if col.endswith("B") or col == "bits/elem" else "left",
                     no_wrap=col != "default skip layers")
    for r in rows:
        t.add_row(r["name"], ",".join(r["engines"]), _opt(r["k_bytes"]), _opt(r["v_bytes"]),
                  _opt(r["bytes_per_token_per_kv_head"]), _opt(r["bits_per_element"], ".3g"),
                  _opt(r["mla_bytes_per_token"]), r["default_skip"])
    print_table(con, t)
    con.print("K+V B: one token of one KV head, every scale, zero point, norm and pad byte included. MLA B: one "
              "token's latent in one layer. `kvplan formats --json` adds each layout's description.")


def formats_matrix_table(sm) -> None:
    """The support matrix (kvplan.plan.format_support.SupportMatrix): one table per model, a row per KV dtype."""
    con = console()
    engine = "vLLM" if sm.engine == "vllm" else "SGLang"
    cc = "" if not sm.compute_capability else f" ({sm.compute_capability})" if sm.platform == "rocm" else \
        f" (compute capability {sm.compute_capability})"
    shown: dict[str, str] = {}  # backend -> its source, for the lines under the tables
    for ms in sm.models:
        if not ms.rows:
            continue
        t = Table(title=f"{engine} {sm.engine_version} on {sm.gpu}{cc}, {ms.model} ({ms.attention}): each KV cache "
                  f"dtype as kvplan plans it", title_justify="left")
        cols = ["dtype", "status", "selector's backend", "block", "also stored by", "why not served"] \
            if sm.engine == "vllm" else ["dtype", "status", "--kv-cache-dtype", "backend", "page", "why not served"]
        for col in cols:
            t.add_column(col, justify="right" if col in ("block", "page") else "left",
                         no_wrap=col in ("dtype", "status", "block", "page"))
        reasons, shared = _shared_tails([r.reason or "" for r in ms.rows])
        for r, why in zip(ms.rows, reasons):
            dtype = r.dtype + (f" (as {r.stored_as})" if r.stored_as else "")
            if sm.engine == "sglang":
                b = r.backend
                if b is not None and b.source:
                    shown.setdefault(b.name, b.source)
                t.add_row(dtype, r.status, r.engine_dtype or "-", b.name if b is not None else "-",
                          str(r.block_size) if b is not None else "-", why)
                continue
            b = r.backend
            others = [c.name for c in r.backends if b is None or c.name != b.name]
            for c in r.backends:
                shown.setdefault(c.name, c.source)
            t.add_row(dtype, r.status, _backend_label(b, sm.backends_release), "-" if b is None else str(r.block_size),
                      ", ".join(others) or "-", why)
        print_table(con, t)
        for mark, tail in shared:
            con.print(f"{mark} {tail}")
        if ms.not_applicable:
            con.print(f"not for {ms.model} ({'MLA' if ms.attention.startswith('MLA') else 'not MLA'}): "
                      f"{', '.join(ms.not_applicable)}")
        for n in ms.notes:
            con.print(f"note: {n}")
    for n in sm.notes:
        con.print(f"note: {n}")
    con.print("served: the engine runs it here; what-if: it cannot (kvplan plans it as if it could, and leaves it "
              "out of verdicts); refused: kvplan will not plan it. `kvplan formats NAME` shows the catalog's entries "
              "and their sources; --json adds each row's source.")
    if sm.engine == "sglang" and shown:
        con.print(f"backend: SGLang's default for the model and GPU ({sm.selector_source}), or --attention-backend's; "
                  f"page: the page size it sets")
    if sm.engine == "vllm":
        con.print(f"rules: {sm.rules}; attention backends as vLLM {sm.backends_release}.0's source has them; the "
                  f"selector's order: {sm.selector_source}")
    for name, source in shown.items():
        con.print(f"{name}: {source.split(' (')[0]}")


def _backend_label(c, release: Optional[str]) -> str:
    """A backend the selector chose, with its kernel family where the choice settles one (FlashAttention's
    version); "none" where no backend stores the format (a what-if)."""
    from kvplan.rules.vllm_backends import backend

    if c is None:
        return "-"
    entry = backend(c.name, release) if c.name != "none" else None
    return c.label if entry is not None and entry.family != c.family else c.name


def _shared_tails(reasons: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Reasons whose second part (after the first '; ' outside parentheses) several rows share, with that part
    replaced by a mark; returns the reasons and (mark, part) for each part replaced."""
    def split(text: str) -> tuple[str, str]:
        depth = 0
        for i, ch in enumerate(text):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0 and text.startswith("; ", i):
                return text[:i], text[i + 2:]
        return text, ""

    parts = [split(r) for r in reasons]
    tails = [tail for _, tail in parts if tail]
    marks: dict[str, str] = {}
    for tail in tails:
        if tails.count(tail) > 1 and tail not in marks:
            marks[tail] = "(" + "*" * (len(marks) + 1) + ")"
    out = [f"{head} {marks[tail]}" if tail in marks else r for (head, tail), r in zip(parts, reasons)]
    return out, [(m, t) for t, m in marks.items()]


def _opt(x, fmt: str = ",") -> str:
    if x is None:
        return "-"
    return format(x, fmt) if fmt != "," else num(x)


def models_table(rows: Iterable[dict]) -> None:
    con = console()
    t = Table(title="Models (name: what to type; heads: query/KV x head dim; KV B/token: all layers, model dtype)", title_justify="left")
    for col in ["name", "params", "layers", "heads", "attention", "MoE k/E", "weights", "context", "KV B/token"]:
        t.add_column(col, justify="right" if col in ("params", "layers", "context", "KV B/token") else "left",
                     no_wrap=col in ("name", "params"))
    for r in rows:
        heads = r["heads"] + (f" x{r['head_dim']}" if r["head_dim"] != "-" else "")
        t.add_row(r["key"], f"{r['params'] / 1e9:,.1f}B", str(r["layers"]), heads, r["attention"], r["moe"],
                  r["weights"], f"{r['context']:,}", num(r["kv_bytes_per_token"]))
    print_table(con, t)


def gpus_table(rows: Iterable[tuple[str, Any]]) -> None:
    con = console()
    t = Table(title="GPUs (name: what to type; memory: the total vLLM budgets against, est. where CUDA's figure "
              "is unknown)", title_justify="left")
    for col in ["name", "GPU", "memory", "TB/s", "bf16 TF", "fp8 TF", "fp4 TF", "L2 MB", "SMs"]:
        t.add_column(col, justify="left" if col in ("name", "GPU") else "right", no_wrap=col in ("name", "memory"))
    for key, g in rows:
        mem = f"{g.memory_total_gib:.2f} GiB" + ("" if g.cuda_total_gib else " est.")
        tf = g.dense_tflops
        t.add_row(key, g.name, mem, f"{g.peak_bandwidth_tbps:g}", _opt(tf.get("bf16"), "g"),
                  _opt(tf.get("fp8"), "g"), _opt(tf.get("fp4"), "g"), _opt(g.l2_mb, "g"), _opt(g.sm_count))
    print_table(con, t)


def spec_detail(spec, extra: dict) -> None:
    con = console()
    t = Table(title=spec.name, title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    data = spec.model_dump(exclude={"notes", "sources"})
    for k, v in {**data, **extra}.items():
        if v in (None, {}, (), []):
            continue
        t.add_row(k, _fmt_value(v))
    print_table(con, t)
    for n in spec.notes:
        con.print(f"note: {n}")
    for s in spec.sources:
        con.print(f"source: {s}")


def _fmt_value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:g}" if not math.isfinite(v) or abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt_value(x)}" for k, x in v.items() if x not in (None, False))
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def gate_table(report) -> None:
    from kvplan.app.gates import _fmt

    con = console()
    t = Table(title="Capacity gates", title_justify="left")
    for col in ["gate", "figure", "measured", "required", "result"]:
        t.add_column(col, justify="right" if col in ("measured", "required") else "left")
    for g in report.gates:
        for i, c in enumerate(g.checks):
            at = f" at {c.at}" if c.at else ""
            req = f"{'>=' if c.kind == 'min' else '<='} {_fmt(c.required)}"
            res = "[green]pass[/green]" if c.passed else "[red bold]FAIL[/red bold]"
            t.add_row(g.name if i == 0 else "", f"{c.figure}{at}", _fmt(c.measured), req, res,
                      end_section=i == len(g.checks) - 1)
    print_table(con, t)
    for r in report.regressions:
        at = f" at {r['at']}" if r["at"] else ""
        con.print(f"[red]regression[/red]: {r['gate']}: {r['figure']}{at} {_fmt(r['before'])} -> {_fmt(r['now'])} "
                  f"({r['regression_pct']:.1f}% worse)")
    n_fail = sum(1 for g in report.gates if not g.passed)
    con.print(f"{len(report.gates) - n_fail} of {len(report.gates)} gates passed"
              + (f"; {len(report.regressions)} regression(s)" if report.regressions else ""))


def log_table(result) -> None:
    con = console()
    cfg = ", ".join(f"{k}={v}" for k, v in result.config.items() if v not in (None, False))
    version = f" {result.version}" if result.version else " (version not stated)"
    con.print(f"[bold]{result.engine}{version}[/bold] startup log: {cfg}")
    t = Table(title="Measured by the engine, and kvplan's prediction for the same configuration",
              title_justify="left")
    for col in ["figure", "measured", "kvplan", "error"]:
        t.add_column(col, justify="left" if col == "figure" else "right")
    def fmt(v) -> str:
        if v is None:
            return "-"
        return f"{v:,.0f}" if float(v).is_integer() and abs(v) >= 100 else f"{v:,.2f}"

    for f in result.figures:
        unit = f" {f.unit}" if f.unit else ""
        err = "-" if f.error_pct is None else f"{f.error_pct:+.2f}%"
        t.add_row(f.name, fmt(f.measured) + (unit if f.measured is not None else ""),
                  fmt(f.predicted) + (unit if f.predicted is not None else ""), err)
    if result.figures:
        print_table(con, t)
    if result.failure is not None:
        con.print(f"the engine stopped: {result.failure.get('message')}")
        if result.predicted_failure:
            con.print(f"kvplan predicts it: {result.predicted_failure}")
        else:
            con.print("kvplan does not predict this failure: it plans the configuration as one that starts")
    for n in result.notes:
        con.print(f"note: {n}")


def measure_plan_table(plan, gpu) -> None:
    from kvplan.specs.calibration import MB

    con = console()
    t = Table(title=f"kvplan measure plan for {gpu.name} ({gpu.peak_bandwidth_tbps} TB/s peak, L2 flushed with "
              f"{plan.flush_bytes / MB:,.0f} MB between samples)", title_justify="left")
    for col in ["kernel family", "sizes", "samples", "bytes read"]:
        t.add_column(col, justify="left" if col != "bytes read" else "right")
    families: dict[str, list] = {}
    for i in plan.items:
        families.setdefault(i.family, []).append(i)
    for fam, items in families.items():
        sizes = ", ".join(f"{i.size_bytes / MB:,.0f}" for i in items) + " MB"
        total = sum(i.size_bytes * (i.samples + plan.warmup) for i in items)
        t.add_row(fam, sizes, f"{items[0].samples} (+{plan.warmup} warm-up)", gb(total))
    print_table(con, t)
    con.print(f"{len(plan.items)} points, {gb(plan.total_bytes)} read; expected about "
              f"{plan.expected_seconds() / 60:.1f} minutes")
    for n in plan.notes:
        con.print(f"note: {n}")


def calibration_table(profile) -> None:
    con = console()
    t = Table(title=f"Calibration of {profile.device.get('name')}: t = t0 + bytes / (eta x "
              f"{profile.peak_bandwidth_bytes_per_s / 1e12:g} TB/s)", title_justify="left")
    for col in ["kernel family", "t0 us", "eta", "GB/s at the largest size", "of peak", "of stream read"]:
        t.add_column(col, justify="left" if col == "kernel family" else "right")
    for fam, f in profile.families.items():
        big = max(f.points, key=lambda p: p[0])
        sf = profile.stream_fraction(fam)
        t.add_row(fam, f"{f.t0_s * 1e6:,.1f}", f"{f.eta:.3f}", f"{big[0] / big[1] / 1e9:,.0f}",
                  f"{profile.peak_fraction(fam):.2f}", "-" if sf is None else f"{sf:.2f}")
    print_table(con, t)
    con.print("of peak: at the largest size, against the datasheet bandwidth. of stream read: against the streaming "
              "read at the same number of bytes (interpolated between its sizes), averaged over sizes of 256 MB and "
              "more.")


def validate_table(r: dict) -> None:
    con = console()
    con.print(f"[bold]{r['model']}[/bold] decode step on {r['device']}: {r['layers']} layer{'s' if r['layers'] != 1 else ''}, batch {r['batch']} x "
              f"{r['context']:,} tokens, KV {r['dtype']}; {gb(r['weight_bytes'])} of weights and {gb(r['kv_bytes'])} "
              f"of KV read")
    t = Table(title="Measured against predicted", title_justify="left")
    for col in ["", "ms", "error vs measured"]:
        t.add_column(col, justify="left" if not col else "right")
    t.add_row("measured (median)", f"{r['measured_ms']:.3f}", "")
    for key, label in (("roofline_ms", "roofline (datasheet bandwidth)"), ("calibrated_ms", "calibrated")):
        v = r[key]
        err = "-" if v is None else f"{(v - r['measured_ms']) / r['measured_ms'] * 100:+.1f}%"
        t.add_row(label, "-" if v is None else f"{v:.3f}", err)
    print_table(con, t)
    if r["calibrated_ms"] is None:
        con.print("no calibration profile for this GPU: `kvplan measure` writes one")


def log_summary_table(data: dict) -> None:
    con = console()
    t = Table(title="Startup logs: available KV memory and weights, the log's against kvplan's", title_justify="left")
    for col in ["log", "tp", "KV log", "KV kvplan", "error", "weights error", "outcome"]:
        t.add_column(col, justify="left" if col in ("log", "outcome") else "right",
                     overflow="fold" if col == "log" else "ellipsis")
    failures = []

    def first(sentence: Optional[str]) -> str:
        return re.split(r"(?<=[a-z0-9)])[.;] ", sentence or "", maxsplit=1)[0]

    for row in data["logs"]:
        kv, w = row.get("available_kv"), row.get("weights")
        if row["status"] == "unread":
            outcome = "not read"
            failures.append(f"{row['log']}: not read: {row['problem']}")
        elif row["status"] == "failed":
            outcome = "failed, predicted" if row["failure_predicted"] else "failed, NOT predicted"
            failures.append(f"{row['log']}: the engine: {first(row['failure'])}"
                            + (f"; kvplan: {first(row['predicted_failure'])}" if row["predicted_failure"] else ""))
        else:
            outcome = "ran"
        t.add_row(row["log"], str(row.get("tp", "-")), f"{kv['measured_gib']:.2f} GiB" if kv else "-",
                  f"{kv['predicted_gib']:.2f} GiB" if kv else "-",
                  f"{kv['error_pct']:+.2f}%" if kv and kv["error_pct"] is not None else "-",
                  f"{w['error_pct']:+.2f}%" if w and w["error_pct"] is not None else "-", outcome)
    print_table(con, t)
    for key, name in (("available_kv", "available KV memory"), ("weights", "weights")):
        s = data[key]
        if s["compared"]:
            con.print(f"{name}: {s['compared']} logs, |error| median {s['median_abs_error_pct']:.2f}%, worst "
                      f"{s['worst_abs_error_pct']:.2f}%")
    f = data["failures"]
    if f["logs"]:
        con.print(f"failures: {f['predicted']} of {f['logs']} predicted")
    for line in failures:
        con.print(f"  {line}")


def format_detail(d: dict, head_dim: int) -> None:
    """One format: its layout and bytes, who serves it, and what is published about its accuracy."""
    con = console()
    t = Table(title=f"{d['name']}: {d['description']}", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    t.add_row("family", d["family"])
    if d["k_bytes"] is not None:
        t.add_row(f"K + V bytes per token per KV head (head_dim {head_dim})",
                  f"{_opt(d['k_bytes'])} + {_opt(d['v_bytes'])} = {_opt(d['bytes_per_token_per_kv_head'])}")
        t.add_row("bits per element", _opt(d["bits_per_element"], ".4g"))
    if d["mla_bytes_per_token"] is not None:
        t.add_row("MLA latent bytes per token per layer", _opt(d["mla_bytes_per_token"]))
    if d["residual_tokens"]:
        t.add_row("newest tokens kept in the model dtype", f"{d['residual_tokens']:,}")
    t.add_row("default skip layers", d["default_skip"])
    for x in d["serves"]:
        until = f" (up to {x['until']})" if x["until"] else ""
        t.add_row(f"served by {x['engine']}{until}", f"{x['where']}: {x['source']}")
    if not d["serves"]:
        t.add_row("served by", f"no engine (a {', '.join(d['engines'])} format)")
    print_table(con, t)
    evidence_table(con, {d["name"]: d["evidence"]})
    for n in d["notes"]:
        con.print(f"note: {n['text']} ({n['source']})")
    if not d["evidence"]:
        how = (f"measure it on your model with `kvplan quality MODEL -d {d['name']} --text FILE`"
               if d["applies_to"] != "mla" else "and `kvplan quality` measures K and V caches, not MLA latents")
        con.print(f"no published accuracy figure kvplan can cite for {d['name']}: {how}")


def evidence_table(con, evidence: dict) -> None:
    """The published results for each format of `evidence` (name -> rows of kv_evidence.Evidence as dicts)."""
    rows = [(name, e) for name, es in evidence.items() for e in es]
    if not rows:
        return
    t = Table(title="Published accuracy results (as their sources state them)", title_justify="left")
    for col in ("KV dtype", "model", "benchmark", "against", "result", "source"):
        t.add_column(col)
    for name, e in rows:
        t.add_row(name, e["model"], e["benchmark"], e["baseline"], e["result"], e["source"])
    print_table(con, t)


def _ratio(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.2f}x"


def _err(x: float) -> str:
    return "0" if x == 0 else f"{x:.2e}" if x < 1e-3 else f"{x:.4f}"


def quality_table(r) -> None:
    con = console()
    con.print(f"{r.model} on {r.device} ({r.model_dtype}): {r.tokens:,} next-token predictions over {r.windows:,} "
              f"window{'s' if r.windows != 1 else ''} of up to {r.context:,} tokens (chunks of {r.chunk_tokens}); "
              f"model-dtype perplexity {r.perplexity:,.3f}")
    t = Table(title="What each KV format costs: against the model-dtype run", title_justify="left")
    for col in ("KV dtype", "bits/elem", "capacity", "skip layers", "KL mean", "KL p99", "top-1 agree", "perplexity",
                "ppl change", "K err", "V err", "attn err", "s"):
        t.add_column(col, justify="left" if col in ("KV dtype", "skip layers") else "right")
    for x in r.rows:
        t.add_row(x.kv_cache_dtype, f"{x.bits_per_element:.3g}", _ratio(x.capacity_gain),
                  _layer_list(x.skip_layers) if x.skip_layers else "-", sci(x.kl_mean), sci(x.kl_p99),
                  f"{x.top1_agreement * 100:.2f}%", f"{x.perplexity:,.3f}", f"{x.perplexity_delta_pct:+.2f}%",
                  _err(x.key_rel_error), _err(x.value_rel_error), _err(x.attention_rel_error), f"{x.seconds:.1f}")
    print_table(con, t)
    ranges = [(b["from"], b["to"]) for b in (r.rows[0].kl_by_position if r.rows else [])]
    if len(ranges) > 1:
        t = Table(title="KL mean by position in the window (a query at a later position attends over more of the "
                        "stored cache)", title_justify="left")
        t.add_column("KV dtype")
        for lo, hi in ranges:
            t.add_column(f"{lo:,}-{min(hi, r.context) - 1:,}", justify="right")
        for x in r.rows:
            t.add_row(x.kv_cache_dtype, *(sci(b["kl_mean"]) for b in x.kl_by_position))
        print_table(con, t)
    layers = [x for x in r.layers if any(y.kv_cache_dtype == x.kv_cache_dtype and y.key_rel_error + y.value_rel_error
                                         for y in r.layers)]
    if layers:
        t = Table(title="Per layer: relative error of the cached keys and values, and of the attention output "
                        "against attention over the layer's exact K and V", title_justify="left")
        for col in ("KV dtype", "layer", "K err", "V err", "attn err", ""):
            t.add_column(col, justify="left" if col in ("KV dtype", "") else "right")
        last = None
        for x in layers:
            t.add_row(x.kv_cache_dtype if x.kv_cache_dtype != last else "", str(x.layer), _err(x.key_rel_error),
                      _err(x.value_rel_error), _err(x.attention_rel_error), "model dtype (skip)" if x.skipped else "")
            last = x.kv_cache_dtype
        print_table(con, t)
    evidence_table(con, r.evidence)
    for n in r.notes:
        con.print(f"note: {n}")
    _no_evidence(con, r.evidence)
    con.print("KL: next-token KL divergence from the model-dtype run (nats), mean and 99th percentile over the "
              "positions; top-1 agree: positions whose most likely next token is the same; capacity: tokens a KV "
              f"pool holds against the model dtype (bytes per token, skip layers included). {r.seconds:.1f} s in all.")


def _no_evidence(con, evidence: dict) -> None:
    none = [name for name, es in evidence.items() if not es and name != "auto"]
    if none:
        con.print(f"no published accuracy figure kvplan can cite for {', '.join(none)}: the figures above are "
                  f"the only evidence here")


def synthetic_table(r) -> None:
    con = console()
    shape = f"{r.model}'s shapes" if r.model else "shapes"
    con.print(f"synthetic K/V, a proxy: {r.tokens:,} tokens, {shape} head_dim {r.head_dim}, {r.kv_heads} KV heads, "
              f"{r.heads} query heads; attention of the last {r.queries:,} positions, on {r.device}")
    t = Table(title="Tensor-level relative errors on synthetic K/V (not a model's accuracy)", title_justify="left")
    gains = any(x.capacity_gain is not None for x in r.rows)
    for col in ("KV dtype", "bits/elem") + (("capacity",) if gains else ()) + ("K err", "V err", "attn err"):
        t.add_column(col, justify="left" if col == "KV dtype" else "right")
    for x in r.rows:
        t.add_row(x.kv_cache_dtype, f"{x.bits_per_element:.3g}", *([_ratio(x.capacity_gain)] if gains else []),
                  _err(x.key_rel_error), _err(x.value_rel_error), _err(x.attention_rel_error))
    print_table(con, t)
    for p in r.parameters:
        con.print(f"drawn: {p['name']}: {p['value']} ({p['source']})")
    evidence_table(con, r.evidence)
    for n in r.notes:
        con.print(f"note: {n}")


class QualityProgress:
    """`kvplan quality`'s progress on stderr: the estimate once the first chunk is timed, then a bar (a line per
    format where stderr is not a terminal)."""

    def __init__(self):
        self.bar = None
        self.task = None
        self.label: Optional[str] = None

    def estimate(self, seconds: float, steps: int) -> None:
        print(f"kvplan quality: about {seconds:,.0f} s for {steps:,} chunks (the model-dtype run and one per "
              f"format), from the first chunk's time", file=sys.stderr)
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                                "{task.total}"), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("model dtype", total=steps)

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=label)
            if self.bar.finished:
                self.bar.stop()
        elif label != self.label:
            print(f"kvplan quality: {label}", file=sys.stderr)
        self.label = label
