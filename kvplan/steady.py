"""Throughput at a latency target: for each KV cache dtype and concurrency, the steady state of a closed loop of
`concurrency` users, each sending a request of `isl` prompt tokens and `osl` output tokens as soon as the last one
finished, on an engine with chunked prefill.

Per request, the prompt takes n_chunks = ceil(isl / (max_num_batched_tokens - decoding)) steps and the output osl
steps, so a share osl / (osl + n_chunks) of the users decode at any step. The prompts arrive as
concurrency x n_chunks / (osl + n_chunks) chunks per step. A step carries every decoding sequence (at the mean
context of the running requests, isl + osl / 2), and each chunk adds what a step carrying it costs beyond the plain
decode step (kvplan.step prices both):
* TPOT = the mean step time (each decoding sequence gets one token per step);
* TTFT = half a step of waiting for the next step, the wait for a free prefill slot (an M/D/1 queue: prompts arrive
  at the rate above, a step serves as many as its token budget holds), then n_chunks steps that each carry a chunk;
* output tokens/s = decoding sequences / step time; per GPU, divided by TP x PP; per user, 1 / TPOT.
With pipeline parallelism each of the PP batches in flight carries 1/PP of the requests through every stage.
A concurrency above what the KV pool holds for requests of isl + osl tokens (the same engine rules as `capacity`)
is marked kv_limited and priced at nothing: the engine would queue or preempt those requests.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Optional, Sequence

from .errors import KvplanError


@dataclass(frozen=True)
class ThroughputRow:
    kv_cache_dtype: str
    concurrency: int
    tpot_ms: Optional[float]
    ttft_ms: Optional[float]
    output_tokens_per_s: Optional[float]
    output_tokens_per_s_per_gpu: Optional[float]
    tokens_per_s_per_user: Optional[float]
    kv_limited: bool
    profile: str
    pool_limit: int  # requests of isl + osl tokens the pool holds at once
    step_ms: Optional[float] = None  # the mean step (equals TPOT)
    decode_step_ms: Optional[float] = None  # the same step without its prefill share
    prefill_share: Optional[float] = None  # of each step's time, under chunked prefill
    mean_context: float = 0.0
    roofline_step_ms: Optional[float] = None  # bytes / peak bandwidth: the floor
    breakdown: dict = field(default_factory=dict)  # ms per kernel family
    estimated: list = field(default_factory=list)  # kernel families priced without a measured fit
    meets_limits: Optional[bool] = None


@dataclass(frozen=True)
class ThroughputResult:
    model: str
    gpu: str
    tp: int
    pp: int
    isl: int
    osl: int
    engine: str
    tpot_limit_ms: Optional[float]
    ttft_limit_ms: Optional[float]
    rows: list[ThroughputRow]
    best: dict  # KV dtype -> the best row under the limits (None where none meets them)
    winner: Optional[str]
    verdict: str
    profile: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["best_by_dtype"] = d["best"]
        d["best"] = d["best"].get(self.winner) if self.winner else None
        return d


def pool_limit(d, isl: int, osl: int) -> int:
    """Requests of isl + osl tokens the deployment's KV pool holds at once (and its engine admits)."""
    length = isl + osl
    if d.engine == "sglang":
        from .sglang import sglang_capacity

        r = sglang_capacity(d)
        return int(min(r.max_total_num_tokens // length, r.max_running_requests))
    from .pool import plan_for

    plan = plan_for(d)
    conc = plan.per_length(length)["max_concurrency"]
    limit = int(math.floor(conc + 1e-9))
    return min(limit, d.max_num_seqs) if d.max_num_seqs else limit


def _no_room(d, length: int) -> str:
    """Why the pool holds no request of `length` tokens: the capacity problem (weights that do not fit, ...)."""
    why = None
    if d.engine == "vllm":
        from .pool import capacity_of

        r = capacity_of(replace(d, max_model_len=length))
        why = r.problem
    return why or (f"the KV pool cannot hold one request of {length:,} tokens on {d.gpu.name} with TP {d.tp}: "
                   f"shorten the request, or add GPUs (--tp)")


def _chunk_budget(d) -> int:
    return int(d.max_num_batched_tokens or 8192)


def _row(sm, d, c: int, isl: int, osl: int, limit: int, gpus: int, roofline=None) -> ThroughputRow:
    """The steady state at concurrency c; the roofline floor only where `roofline` is given (rows shown)."""
    name = d.kv.name
    profile = sm.profile.name
    if c > limit:
        return ThroughputRow(name, c, None, None, None, None, None, True, profile, limit,
                             mean_context=isl + osl / 2)
    budget = _chunk_budget(d)
    ctx = isl + osl / 2
    # with pipeline parallelism vLLM keeps one batch in flight per stage: each carries 1/pp of the requests through
    # every stage, so a token's interval is the whole model's step for that share
    share = c / d.pp
    n_chunks = math.ceil(isl / max(budget - share, 1))
    chunk = isl / n_chunks
    decoding = share * osl / (osl + n_chunks)
    plain = sm.step(decoding, ctx)
    full = sm.step(decoding, ctx, chunk, isl / 2)
    # prompt chunks arrive at share x n_chunks / (osl + n_chunks) per step; each adds what a step carrying it costs
    chunks_per_step = share * n_chunks / (osl + n_chunks)
    t = plain.total_s + chunks_per_step * (full.total_s - plain.total_s)
    # a prompt waits for the next step, then for a free prefill slot: a step takes max(1, room // isl) prompts
    # (or one chunk of a longer one); arrivals at chunks_per_step queue as in an M/D/1 queue of step-long service
    slots = max(1, (budget - decoding) // isl) if isl <= budget - decoding else 1
    load = chunks_per_step / slots
    # a closed loop holds at most the other users' prompts ahead of this one
    worst = (c - 1) * n_chunks * full.total_s / slots
    queue = min(t * load / (2 * (1 - load)), worst) if load < 1 else worst
    ttft = 0.5 * t + queue + n_chunks * full.total_s
    out = decoding * d.pp / t
    return ThroughputRow(
        name, c, tpot_ms=t * 1e3, ttft_ms=ttft * 1e3, output_tokens_per_s=out, output_tokens_per_s_per_gpu=out / gpus,
        tokens_per_s_per_user=1 / t, kv_limited=False, profile=profile, pool_limit=limit, step_ms=t * 1e3,
        decode_step_ms=plain.total_s * 1e3, prefill_share=max(0.0, 1 - plain.total_s / t), mean_context=ctx,
        roofline_step_ms=roofline(decoding, ctx) if roofline else None, breakdown=plain.to_dict(),
        estimated=list(plain.estimated))


def _meets(r: ThroughputRow, tpot: Optional[float], ttft: Optional[float]) -> bool:
    if r.kv_limited:
        return False
    return (tpot is None or r.tpot_ms <= tpot) and (ttft is None or r.ttft_ms <= ttft)


def throughput_of(ds: Sequence, isl: int, osl: int, concurrency: Optional[Sequence[int]] = None,
                  tpot_ms: Optional[float] = None, ttft_ms: Optional[float] = None) -> ThroughputResult:
    """The throughput table of resolved deployments that differ only in their KV dtype."""
    from .kv_crossover import crossover_of
    from .step import step_model

    if isl < 1 or osl < 1:
        raise KvplanError(f"--isl and --osl must be at least 1 (got {isl} and {osl})")
    for name, v in (("--tpot-ms", tpot_ms), ("--ttft-ms", ttft_ms)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise KvplanError(f"{name} must be a positive number of milliseconds (got {v})")
    d0 = ds[0]
    m = d0.model
    mlen = d0.max_model_len if isinstance(d0.max_model_len, int) else m.max_position_embeddings
    if isl + osl > mlen:
        raise KvplanError(f"--isl {isl:,} + --osl {osl:,} = {isl + osl:,} tokens exceeds the max_model_len "
                          f"{mlen:,} of {m.name}: shorten the request or raise --max-model-len (up to the model's "
                          f"{m.max_position_embeddings:,})")
    if d0.gpu is None:
        raise KvplanError("throughput needs --gpu (the step times and the pool are the GPU's)")
    gpus = d0.tp * d0.pp
    models = [step_model(d) for d in ds]
    limits = [pool_limit(d, isl, osl) for d in ds]
    if max(limits) < 1:  # not one request: say why, as `capacity` does
        raise KvplanError(_no_room(d0, isl + osl))
    if concurrency:
        cs = sorted(set(int(c) for c in concurrency))
        if cs[0] < 1:
            raise KvplanError(f"--concurrency must be at least 1 (got {cs[0]})")
        if all(c > lim for c in cs for lim in limits):
            raise KvplanError(
                f"the KV pool holds at most {max(limits):,} requests of {isl + osl:,} tokens "
                f"({', '.join(f'{d.kv.name}: {lim:,}' for d, lim in zip(ds, limits))}); --concurrency "
                f"{cs[0]:,} cannot run: ask for {max(limits):,} or fewer")
    else:
        top = max(limits)
        cs = [2**i for i in range(0, int(math.log2(top)) + 1)]
        cs += [lim for lim in limits if lim >= 1 and lim not in cs]
        cs = sorted(set(cs))

    rows, best = [], {}
    for d, sm, lim in zip(ds, models, limits):
        def roofline(b, ctx, d=d):
            r = crossover_of(d, batches=[max(1, round(b))], contexts=[max(1, round(ctx))])
            return r.operating_points[0].step_ms
        mine = [_row(sm, d, c, isl, osl, lim, gpus, roofline) for c in cs]
        mine = [replace(r, meets_limits=_meets(r, tpot_ms, ttft_ms)) for r in mine]
        rows += mine
        best[d.kv.name] = _best(sm, d, mine, isl, osl, lim, gpus, tpot_ms, ttft_ms, roofline)
    by_name = {d.kv.name: (d, sm, lim) for d, sm, lim in zip(ds, models, limits)}

    def step_at(name: str, c: int) -> Optional[float]:
        d, sm, lim = by_name[name]
        r = _row(sm, d, c, isl, osl, lim, gpus)
        return None if r.kv_limited else r.tpot_ms
    winner, verdict = _verdict(best, rows, ds, tpot_ms, ttft_ms, isl, osl, step_at)
    profiles = sorted({sm.profile.name for sm in models})
    notes = []
    est = sorted({e for sm in models for e in sm.estimated})
    if est:
        notes.append("estimated (no measured fit): " + ", ".join(est) + "; `kvplan measure` replaces them")
    return ThroughputResult(model=m.name, gpu=d0.gpu.name, tp=d0.tp, pp=d0.pp, isl=isl, osl=osl, engine=d0.engine,
                            tpot_limit_ms=tpot_ms, ttft_limit_ms=ttft_ms, rows=rows, best=best, winner=winner,
                            verdict=verdict, profile="; ".join(profiles), notes=notes)


def _best(sm, d, rows, isl, osl, limit, gpus, tpot, ttft, roofline) -> Optional[ThroughputRow]:
    """The highest-throughput concurrency meeting the limits: the sweep's best, refined by bisection on the
    largest concurrency that still meets them (TPOT and TTFT grow with the concurrency)."""
    ok = [r for r in rows if r.meets_limits]
    if limit < 1:
        return None
    if tpot is None and ttft is None:  # no limits: the best of the concurrencies asked for
        return max(ok, key=lambda r: r.output_tokens_per_s) if ok else None
    if not _meets(_row(sm, d, 1, isl, osl, limit, gpus), tpot, ttft):
        return None
    lo, hi = 1, limit
    if _meets(_row(sm, d, hi, isl, osl, limit, gpus), tpot, ttft):
        lo = hi
    while hi - lo > 1:  # the largest concurrency meeting the limits
        mid = (lo + hi) // 2
        if _meets(_row(sm, d, mid, isl, osl, limit, gpus), tpot, ttft):
            lo = mid
        else:
            hi = mid
    ok.append(_row(sm, d, lo, isl, osl, limit, gpus, roofline))
    return replace(max(ok, key=lambda r: r.output_tokens_per_s), meets_limits=True)


def _verdict(best: dict, rows: list, ds, tpot, ttft, isl, osl, step_at=None) -> tuple[Optional[str], str]:
    found = {k: v for k, v in best.items() if v is not None}
    limits = " and ".join(x for x in (f"TPOT <= {tpot:g} ms" if tpot else "",
                                      f"TTFT <= {ttft:g} ms" if ttft else "") if x) or "no latency limit"
    if not found:
        return None, f"no KV dtype meets {limits} at any concurrency: relax the limit or add GPUs"
    win = max(found.values(), key=lambda r: r.output_tokens_per_s)
    base_name = ds[0].kv.name
    base = found.get(base_name)
    if base is None or win.kv_cache_dtype == base_name:
        others = [r for r in found.values() if r is not win]
        if not others:
            return win.kv_cache_dtype, (f"{win.kv_cache_dtype}: {win.output_tokens_per_s_per_gpu:,.0f} output "
                                        f"tokens/s per GPU at concurrency {win.concurrency} under {limits}")
        second = max(others, key=lambda r: r.output_tokens_per_s)
        gain = win.output_tokens_per_s / second.output_tokens_per_s - 1
        return win.kv_cache_dtype, (f"{win.kv_cache_dtype}: {gain:.0%} more output tokens/s than "
                                    f"{second.kv_cache_dtype} under {limits} ({win.concurrency} vs "
                                    f"{second.concurrency} sequences)")
    seqs = win.concurrency / base.concurrency
    gain = win.output_tokens_per_s / base.output_tokens_per_s - 1
    faster = ""
    if win.concurrency != base.concurrency and step_at is not None:  # both steps at the baseline's concurrency
        mine, theirs = step_at(win.kv_cache_dtype, base.concurrency), step_at(base_name, base.concurrency)
        if mine is not None and theirs is not None:
            x = 1 - mine / theirs
            faster = f", and {abs(x):.0%} {'faster' if x >= 0 else 'slower'} steps at {base.concurrency} sequences"
    if win.concurrency == base.concurrency:
        how = f"at the same {win.concurrency} sequences, with {1 - win.tpot_ms / base.tpot_ms:.0%} faster steps"
    else:
        how = f"with {seqs:.2g}x the sequences ({win.concurrency} vs {base.concurrency}){faster}"
    return win.kv_cache_dtype, (f"{win.kv_cache_dtype}: {gain:+.0%} output tokens/s per GPU over {base_name} "
                                f"under {limits}, {how}; mean context {isl + osl // 2:,} tokens")
