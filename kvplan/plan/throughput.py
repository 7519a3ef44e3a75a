"""Throughput at a latency target: for each KV cache dtype and concurrency, what a serving benchmark prints for a
closed loop of `concurrency` clients, each sending a request of `isl` prompt tokens and `osl` output tokens as soon as
the last one finished (`vllm bench serve --max-concurrency C --num-prompts N`, every client starting at once).

The figures come from kvplan.plan.serving's step-by-step simulation of the engine's scheduler (vLLM V1's chunked prefill
and block allocation, with recompute preemption; SGLang's prefill and decode batches and token pool), every step
priced by kvplan.sizing.step_time for exactly its batch. TPOT, TTFT, ITL and latency are the benchmark's per-request
figures
(mean, median, p90, p99); output tokens/s are over the benchmark's duration, per GPU divided by TP x PP. A
concurrency the KV pool cannot hold at once still runs, as in the engine: requests wait for blocks (or are
preempted and recomputed), TTFT grows, and the row is marked kv_limited with how many ran at once.
With pipeline parallelism each of the PP batches in flight carries 1/PP of the requests through every stage.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Optional, Sequence

from kvplan.errors import KvplanError
from kvplan.values import frozen_dataclass


@frozen_dataclass
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
    # the benchmark's distributions (ms) and counts, beside the means above
    ttft_p50_ms: Optional[float] = None
    ttft_p90_ms: Optional[float] = None
    ttft_p99_ms: Optional[float] = None
    tpot_p50_ms: Optional[float] = None
    tpot_p90_ms: Optional[float] = None
    tpot_p99_ms: Optional[float] = None
    itl_ms: Optional[float] = None
    itl_p50_ms: Optional[float] = None
    itl_p90_ms: Optional[float] = None
    itl_p99_ms: Optional[float] = None
    e2e_ms: Optional[float] = None
    e2e_p50_ms: Optional[float] = None
    e2e_p90_ms: Optional[float] = None
    e2e_p99_ms: Optional[float] = None
    requests_per_s: Optional[float] = None
    total_tokens_per_s: Optional[float] = None
    mean_running: Optional[float] = None  # requests running at once, averaged over the benchmark
    capped_by: Optional[str] = None  # "kv pool" or "max_num_seqs" where requests waited for it
    preemptions: int = 0
    num_prompts: int = 0
    # why no engine, release or GPU of the deployment serves this dtype (None: served): a what-if, never the verdict
    what_if: Optional[str] = None
    # where --kv-cache-dtype auto took the checkpoint's declared KV-cache quantization: the declaration
    kv_cache_dtype_from_checkpoint: Optional[str] = None


@frozen_dataclass
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
    percentile: str = "mean"  # the figure the limits hold: the mean, or a percentile of the requests
    num_prompts: int = 0  # requests each concurrency's benchmark sends
    request_rate: Optional[float] = None  # Poisson arrivals per second (None: every client at once)
    random_range_ratio: float = 0.0  # lengths drawn from [(1 - r) x, (1 + r) x] the isl and osl (0: fixed)
    dp: int = 1  # data-parallel ranks (attention groups), the clients spread over them
    ep: int = 1  # expert-parallel ranks
    world_size: int = 1  # GPUs of the deployment (output tokens/s per GPU divide by it)

    def to_dict(self) -> dict:
        d = asdict(self)
        for row in [*d["rows"], *(x for x in d["best"].values() if x)]:
            for key in ("what_if", "kv_cache_dtype_from_checkpoint"):  # said only where they hold
                if row[key] is None:
                    del row[key]
        d["best_by_dtype"] = d["best"]
        d["best"] = d["best"].get(self.winner) if self.winner else None
        return d


def pool_limit(d, isl: int, osl: int) -> int:
    """Requests of isl + osl tokens the deployment's KV pool holds at once (and its engine admits)."""
    length = isl + osl
    if d.engine == "sglang":
        from kvplan.plan.sglang_pool import sglang_capacity

        r = sglang_capacity(d)
        return int(min(r.max_total_num_tokens // length, r.max_running_requests))
    from kvplan.plan.vllm_pool import plan_for

    plan = plan_for(d)
    conc = plan.per_length(length)["max_concurrency"]
    limit = int(math.floor(conc + 1e-9))
    return min(limit, d.max_num_seqs) if d.max_num_seqs else limit


def _no_room(d, length: int) -> str:
    """Why the pool holds no request of `length` tokens: the capacity problem (weights that do not fit, ...)."""
    why = None
    if d.engine == "vllm":
        from kvplan.plan.vllm_capacity import capacity_of

        r = capacity_of(replace(d, max_model_len=length))
        why = r.problem
    return why or (f"the KV pool cannot hold one request of {length:,} tokens on {d.gpu.name} with TP {d.tp}: "
                   f"shorten the request, or add GPUs (--tp)")


def engine_limits(d):
    """What the deployment's scheduler works within (kvplan.plan.schedulers.EngineLimits): vLLM's token budget,
    max_num_seqs and usable blocks (the pool `capacity` plans, its null block left out); SGLang's
    chunked_prefill_size, max_running_requests and token pool."""
    import numpy as np

    from kvplan.plan.schedulers import EngineLimits

    if d.engine == "sglang":
        from kvplan.plan.sglang_pool import sglang_capacity
        from kvplan.rules.sglang import default_chunked_prefill_size

        r = sglang_capacity(d)
        chunk = default_chunked_prefill_size(d.gpu, d.tp)
        if d.parallel.attn_tp < d.tp:  # data-parallel attention: each group's chunk is 1/dp of it (server_args.py)
            chunk //= d.parallel.dp
        return EngineLimits("sglang", chunk, int(r.max_running_requests), int(r.max_total_num_tokens), lambda n: n,
                            lockstep=_lockstep(d), mixed_chunk=d.mixed_chunk,
                            input_budget=d.max_prefill_tokens)
    from kvplan.plan.vllm_pool import plan_for

    plan = plan_for(d)
    # a request sent while a step runs arrives during the next one (its client answering the last token) and waits
    # for the step after it, or the one after that with async scheduling
    return EngineLimits("vllm", int(d.max_num_batched_tokens), int(d.max_num_seqs), int(plan.num_blocks) - 1,
                        lambda n: plan.blocks_per_request(n, np), admit_delay=2 if d.rules.async_scheduling else 1,
                        lockstep=_lockstep(d), reserve_full_prompt=True)


def _lockstep(d) -> int:
    """The other DP ranks a rank steps in lockstep with: those its MoE layers exchange tokens with (vLLM runs a dummy
    batch on an idle rank while any has work; dense replicas run free)."""
    p = d.parallel
    return p.dp - 1 if p.dp > 1 and d.model.moe is not None and p.moe_group > p.attn_tp else 0


def _price(sm, pp: int):
    """A simulated step's seconds: decoding requests, their mean context, prompt tokens, their mean attended
    context. With PP, each batch in flight carries 1/PP of them through every stage."""
    def price(b, ctx, p, pctx):
        return sm.step_seconds(b / pp, ctx, p / pp, pctx)
    return price


def _row(sm, d, c: int, work, limit: int, gpus: int, limits, step_cache: Optional[dict] = None) -> ThroughputRow:
    """The benchmark of `work` (kvplan.plan.serving.Workload) with at most c requests in flight under the scheduler's
    `limits` (engine_limits), simulated."""
    isl, osl = work.isl, work.osl
    # data-parallel ranks, each its own engine: the clients spread evenly over them (vLLM's load balancer sends a
    # request to the rank with the least 4 x waiting + running, SGLang's round robin), so one rank runs c / dp of
    # them, stepping in lockstep with the others, and the deployment delivers dp times its throughput
    dp = d.parallel.dp
    mine = -(-c // dp)
    if dp > 1:
        work = replace(work, num_prompts=-(-work.num_prompts // dp), warmup=-(-work.warmup // dp),
                       request_rate=None if work.request_rate is None else work.request_rate / dp)
    res = work.run(_price(sm, d.pp), limits, mine, step_cache)
    spread = c / mine
    n = work.num_prompts
    ctx = isl + osl / 2
    running = max(res.mean_running, 1.0)
    plain = sm.step(running / d.pp, ctx)
    itl = res.itl.mean
    out = res.output_tokens_per_s * spread

    def ms(x):
        return x * 1e3

    return ThroughputRow(
        d.kv.name, c, tpot_ms=ms(res.tpot.mean), ttft_ms=ms(res.ttft.mean), output_tokens_per_s=out,
        output_tokens_per_s_per_gpu=out / gpus, tokens_per_s_per_user=1 / res.tpot.mean,
        kv_limited=res.capped_by == "kv pool" or res.preemptions > 0, profile=sm.profile.name, pool_limit=limit,
        step_ms=ms(itl), decode_step_ms=ms(plain.total_s), prefill_share=max(0.0, 1 - plain.total_s / itl),
        mean_context=ctx, breakdown=plain.to_dict(),
        estimated=list(plain.estimated),
        ttft_p50_ms=ms(res.ttft.median), ttft_p90_ms=ms(res.ttft.p90), ttft_p99_ms=ms(res.ttft.p99),
        tpot_p50_ms=ms(res.tpot.median), tpot_p90_ms=ms(res.tpot.p90), tpot_p99_ms=ms(res.tpot.p99),
        itl_ms=ms(itl), itl_p50_ms=ms(res.itl.median), itl_p90_ms=ms(res.itl.p90), itl_p99_ms=ms(res.itl.p99),
        e2e_ms=ms(res.e2e.mean), e2e_p50_ms=ms(res.e2e.median), e2e_p90_ms=ms(res.e2e.p90),
        e2e_p99_ms=ms(res.e2e.p99), requests_per_s=res.requests_per_s * spread,
        total_tokens_per_s=res.total_tokens_per_s * spread, mean_running=res.mean_running, capped_by=res.capped_by,
        preemptions=res.preemptions, num_prompts=n if dp == 1 else work.num_prompts * dp, what_if=d.unserved,
        kv_cache_dtype_from_checkpoint=d.kv_from_checkpoint)


PERCENTILE_KEYS = {"mean": "", "p50": "_p50", "median": "_p50", "p90": "_p90", "p99": "_p99"}


def _figure(r: ThroughputRow, metric: str, percentile: str) -> float:
    return getattr(r, f"{metric}{PERCENTILE_KEYS[percentile]}_ms")


def _meets(r: ThroughputRow, tpot: Optional[float], ttft: Optional[float], percentile: str = "mean") -> bool:
    return ((tpot is None or _figure(r, "tpot", percentile) <= tpot)
            and (ttft is None or _figure(r, "ttft", percentile) <= ttft))


def throughput_of(ds: Sequence, isl: int, osl: int, concurrency: Optional[Sequence[int]] = None,
                  tpot_ms: Optional[float] = None, ttft_ms: Optional[float] = None, percentile: str = "mean",
                  num_prompts: Optional[int] = None, warmup: int = 0,
                  request_rate: Optional[float] = None, random_range_ratio: float = 0.0) -> ThroughputResult:
    """The throughput table of resolved deployments that differ only in their KV dtype: each concurrency's benchmark
    simulated (kvplan.plan.serving), `percentile` (mean, p50, p90, p99) naming the figure the limits hold; `warmup`
    requests run before the `num_prompts` measured ones; with `request_rate`, requests arrive as a Poisson process
    at that rate, the concurrency capping those in flight (vllm bench serve --request-rate with --max-concurrency)."""
    from kvplan.plan.crossover import roofline_step_ms
    from kvplan.plan.serving import VLLM_BENCH_NUM_PROMPTS, Workload
    from kvplan.sizing.step_time import step_model

    _check_benchmark(isl, osl, tpot_ms, ttft_ms, percentile, num_prompts, request_rate, random_range_ratio)
    r = random_range_ratio
    work = Workload(isl, osl, num_prompts or VLLM_BENCH_NUM_PROMPTS, warmup, request_rate, span=(1 - r, 1 + r))
    longest = math.ceil(isl * (1 + r)) + max(math.ceil(osl * (1 + r)), 1)
    d0 = ds[0]
    m = d0.model
    _check_length(d0, isl, osl, r, longest)
    if d0.gpu is None:
        raise KvplanError("throughput needs --gpu (the step times and the pool are the GPU's)")
    gpus = d0.parallel.world
    models = [step_model(d) for d in ds]
    # the whole deployment's; none where the pool cannot hold the longest request the benchmark sends
    limits = [pool_limit(d, isl, osl) * d.parallel.dp if not r or pool_limit(d, longest, 0) else 0 for d in ds]
    if max(limits) < 1:  # not one request: say why, as `capacity` does
        raise KvplanError(_no_room(d0, longest))
    if concurrency:
        cs = sorted(set(int(c) for c in concurrency))
        if cs[0] < 1:
            raise KvplanError(f"--concurrency must be at least 1 (got {cs[0]})")
    else:  # per dtype: powers of two up to what its pool holds at once, that limit, and the others' within it
        cs = None

    rows, best, runs = [], {}, {}
    for d, sm, lim in zip(ds, models, limits):
        if lim < 1:  # this dtype's pool holds no request of this length: it cannot run at all
            continue
        def roofline(b, ctx, d=d):
            return roofline_step_ms(d, b, ctx)
        run = runs[d.kv.name] = _Runs(sm, d, work, lim, gpus, roofline)
        shown = cs or sorted({2**i for i in range(0, int(math.log2(lim)) + 1)} | {x for x in limits if 1 <= x <= lim})
        mine = [replace(run.at(c, shown=True), meets_limits=_meets(run.at(c), tpot_ms, ttft_ms, percentile))
                for c in shown]
        rows += mine
        best[d.kv.name] = _best(run, mine, lim, tpot_ms, ttft_ms, percentile)

    def step_at(name: str, c: int) -> Optional[float]:
        return runs[name].at(c).tpot_ms
    winner, verdict = _verdict(best, rows, ds, tpot_ms, ttft_ms, isl, osl, step_at, percentile)
    profiles = sorted({sm.profile.name for sm in models})
    notes = []
    est = sorted({e for sm in models for e in sm.estimated})
    if est:
        notes.append("estimated (no measured fit): " + ", ".join(est) + "; `kvplan measure` replaces them")
    for d, lim in zip(ds, limits):
        if lim < 1:
            notes.append(f"{d.kv.name}: {_no_room(d, longest)}")
        if d.unserved:
            notes.append(f"{d.kv.name}: {d.unserved}; left out of the verdict")
    return ThroughputResult(model=m.name, gpu=d0.gpu.name, tp=d0.tp, pp=d0.pp, isl=isl, osl=osl, engine=d0.engine,
                            tpot_limit_ms=tpot_ms, ttft_limit_ms=ttft_ms, rows=rows, best=best, winner=winner,
                            verdict=verdict, profile="; ".join(profiles), notes=notes, percentile=percentile,
                            num_prompts=work.num_prompts, request_rate=request_rate, random_range_ratio=r,
                            dp=d0.parallel.dp, ep=d0.parallel.ep, world_size=gpus)


def _check_benchmark(isl, osl, tpot_ms, ttft_ms, percentile, num_prompts, request_rate, random_range_ratio) -> None:
    """The benchmark's figures refused where vllm bench serve (or kvplan's limits) cannot take them."""
    if isl < 1 or osl < 1:
        raise KvplanError(f"--isl and --osl must be at least 1 (got {isl} and {osl})")
    for name, v in (("--tpot-ms", tpot_ms), ("--ttft-ms", ttft_ms)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise KvplanError(f"{name} must be a positive number of milliseconds (got {v})")
    if percentile not in PERCENTILE_KEYS:
        raise KvplanError(f"--percentile '{percentile}': choose one of {', '.join(PERCENTILE_KEYS)}")
    if num_prompts is not None and num_prompts < 1:
        raise KvplanError(f"--num-prompts must be at least 1 (got {num_prompts})")
    if request_rate is not None and not (request_rate > 0 and math.isfinite(request_rate)):
        raise KvplanError(f"--request-rate must be a positive number of requests per second (got {request_rate})")
    if not 0 <= random_range_ratio < 1:
        raise KvplanError(f"--random-range-ratio must be at least 0 and below 1, as vllm bench serve takes it "
                          f"(got {random_range_ratio})")


def _check_length(d0, isl: int, osl: int, r: float, longest: int) -> None:
    """The longest request the benchmark sends refused where it exceeds the deployment's max_model_len."""
    m = d0.model
    mlen = d0.max_model_len if isinstance(d0.max_model_len, int) else m.max_position_embeddings
    if longest > mlen:
        fix = (f"shorten the request or raise --max-model-len (up to the model's {m.max_position_embeddings:,})"
               if mlen < m.max_position_embeddings else f"shorten the request: {m.name} takes no longer sequences")
        what = (f"--isl {isl:,} + --osl {osl:,} = {isl + osl:,} tokens" if not r else
                f"the longest request --random-range-ratio {r:g} draws ({longest:,} tokens)")
        raise KvplanError(f"{what} exceeds the max_model_len {mlen:,} of {m.name}: {fix}")


class _Runs:
    """One dtype's simulated benchmarks by concurrency, each run once (the table, the search for the best and the
    verdict ask for the same ones)."""

    def __init__(self, sm, d, work, limit, gpus, roofline):
        self.sm, self.d, self.work, self.limit, self.gpus, self.roofline = sm, d, work, limit, gpus, roofline
        self.limits = engine_limits(d)
        self.rows: dict = {}
        self.steps: dict = {}  # the priced steps, shared by every concurrency's run

    def at(self, c: int, shown: bool = False) -> ThroughputRow:
        if c not in self.rows:
            self.rows[c] = _row(self.sm, self.d, c, self.work, self.limit, self.gpus, self.limits, self.steps)
        r = self.rows[c]
        if shown and r.roofline_step_ms is None:  # the roofline floor, for the rows a table shows
            r = self.rows[c] = replace(r, roofline_step_ms=self.roofline(max(r.mean_running, 1.0), r.mean_context))
        return r


def _best(run: _Runs, rows, limit, tpot, ttft, percentile) -> Optional[ThroughputRow]:
    """The highest-throughput concurrency meeting the limits: the sweep's best, refined toward the largest
    concurrency up to what the pool holds that still meets them (TPOT and TTFT grow with the concurrency), to
    within 3% of it. Each try is a simulated benchmark, so the next one is interpolated from how far the bracketing
    ones miss the limits (regula falsi), each try at least 3% inside the bracket."""
    ok = [r for r in rows if r.meets_limits]
    if tpot is None and ttft is None:  # no limits: the best of the concurrencies asked for
        return max(ok, key=lambda r: r.output_tokens_per_s) if ok else None

    def excess(r: ThroughputRow) -> float:  # how far over a limit (> 0) or under both, as a share: the guesses' weight
        return max((_figure(r, "tpot", percentile) / tpot - 1) if tpot else -1.0,
                   (_figure(r, "ttft", percentile) / ttft - 1) if ttft else -1.0)

    def meets(c: int) -> bool:  # the rows' own test, so the search and the table never disagree at a limit
        return _meets(run.at(c), tpot, ttft, percentile)

    if not meets(1):
        return None
    # between the largest concurrency shown that meets them and the next one shown that does not (or the pool's)
    lo = max([r.concurrency for r in ok if r.concurrency <= limit] + [1])
    hi = min([r.concurrency for r in rows if r.concurrency > lo and not r.meets_limits] + [limit])
    if hi <= lo or meets(hi):
        lo = max(lo, hi)
    e_lo, e_hi = excess(run.at(lo)), excess(run.at(hi))
    while hi - lo > max(1, lo // 32):
        step = max(1, lo // 32)  # each try moves an end by at least this: a near guess closes the bracket next
        guess = lo + round((hi - lo) * -e_lo / (e_hi - e_lo)) if e_hi > e_lo else (lo + hi) // 2
        mid = min(max(guess, lo + step), hi - step) if hi - lo > 2 * step else (lo + hi) // 2
        if meets(mid):
            lo, e_lo = mid, excess(run.at(mid))
        else:
            hi, e_hi = mid, excess(run.at(mid))
    ok.append(run.at(lo, shown=True))
    return replace(max(ok, key=lambda r: r.output_tokens_per_s), meets_limits=True)


def _step_change(x: float) -> str:
    """A step time's change as a share, in words: "12% faster steps", "3% slower steps", or "steps as fast"."""
    if _rounds_to_zero(x):
        return "steps as fast"
    return f"{abs(x):.0%} {'faster' if x > 0 else 'slower'} steps"


def _verdict(best: dict, rows: list, ds, tpot, ttft, isl, osl, step_at=None,
             percentile: str = "mean") -> tuple[Optional[str], str]:
    runnable = {d.kv.name for d in ds if not d.unserved}  # a what-if is never the verdict
    found = {k: v for k, v in best.items() if v is not None and k in runnable}
    which = "" if percentile == "mean" else f" {percentile}"
    limits = " and ".join(x for x in (f"TPOT{which} <= {tpot:g} ms" if tpot else "",
                                      f"TTFT{which} <= {ttft:g} ms" if ttft else "") if x) or "no latency limit"
    if not found:
        if not runnable:
            return None, ("no verdict: no engine serves " + ", ".join(d.kv.name for d in ds) + " here (what-if); "
                          "compare with a dtype the engine serves, e.g. -d auto")
        if not (tpot or ttft):
            return None, "no KV dtype ran at any concurrency: add GPUs or shorten the requests"
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
        more = "as many output tokens/s as" if _rounds_to_zero(gain) else f"{gain:.0%} more output tokens/s than"
        return win.kv_cache_dtype, (f"{win.kv_cache_dtype}: {more} {second.kv_cache_dtype} under {limits} "
                                    f"({win.concurrency} vs {second.concurrency} sequences)")
    seqs = win.concurrency / base.concurrency
    gain = win.output_tokens_per_s / base.output_tokens_per_s - 1
    faster = ""
    if win.concurrency != base.concurrency and step_at is not None:  # both steps at the baseline's concurrency
        mine, theirs = step_at(win.kv_cache_dtype, base.concurrency), step_at(base_name, base.concurrency)
        if mine is not None and theirs is not None:
            faster = f", and {_step_change(1 - mine / theirs)} at {base.concurrency} sequences"
    if win.concurrency == base.concurrency:
        how = f"at the same {win.concurrency} sequences, with {_step_change(1 - win.tpot_ms / base.tpot_ms)}"
    else:
        how = f"with {seqs:.2g}x the sequences ({win.concurrency} vs {base.concurrency}){faster}"
    more = (f"as many output tokens/s per GPU as {base_name}" if _rounds_to_zero(gain) else
            f"{gain:+.0%} output tokens/s per GPU over {base_name}")
    return win.kv_cache_dtype, (f"{win.kv_cache_dtype}: {more} under {limits}, {how}; mean context "
                                f"{isl + osl // 2:,} tokens")


def _rounds_to_zero(share: float) -> bool:
    """A change that prints as 0% is no difference to a reader ('as many', 'steps as fast'), not a win of +0%."""
    return round(abs(share) * 100) == 0


@dataclass
class LayoutComparison:
    """The throughput of several layouts of one model on one GPU type, and the one that delivers the most output
    tokens per GPU under the latency limits (layouts of different GPU counts compare per GPU)."""

    layouts: list  # (label, ThroughputResult)
    winner: Optional[str]  # the winning layout's label
    winner_dtype: Optional[str]
    verdict: str

    def to_dict(self) -> dict:
        return {"layouts": [{"layout": label, **r.to_dict()} for label, r in self.layouts],
                "winner_layout": self.winner, "winner_dtype": self.winner_dtype, "verdict": self.verdict}


def compare_layouts(results: Sequence, tpot_ms: Optional[float], ttft_ms: Optional[float]) -> LayoutComparison:
    """The best row of each layout (its own verdict's winner, under the limits) against the others' per GPU."""
    best = []
    for label, r in results:
        row = r.best.get(r.winner) if r.winner else None
        if row is not None:
            best.append((label, row))
    limits = " and ".join(x for x in (f"TPOT <= {tpot_ms:g} ms" if tpot_ms else "",
                                      f"TTFT <= {ttft_ms:g} ms" if ttft_ms else "") if x) or "no latency limit"
    if not best:
        return LayoutComparison(list(results), None, None, f"no layout meets {limits} at any concurrency")
    best.sort(key=lambda x: -x[1].output_tokens_per_s_per_gpu)
    (label, row), rest = best[0], best[1:]
    verdict = (f"{label} with {row.kv_cache_dtype}: {row.output_tokens_per_s_per_gpu:,.0f} output tokens/s per GPU "
               f"at {row.concurrency} concurrent requests under {limits}")
    if rest:
        other, orow = rest[0]
        gain = row.output_tokens_per_s_per_gpu / orow.output_tokens_per_s_per_gpu - 1
        verdict += (f", {gain:+.0%} per GPU over {other} ({orow.output_tokens_per_s_per_gpu:,.0f} at "
                    f"{orow.concurrency}, {orow.kv_cache_dtype})")
    return LayoutComparison(list(results), label, row.kv_cache_dtype, verdict)
