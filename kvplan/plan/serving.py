"""What a serving benchmark measures, simulated step by step: the engine's scheduler deciding each step which
requests run and how many prompt tokens each takes, every step priced for exactly its batch, and the benchmark's
clients sending requests as `vllm bench serve` (or `sglang.bench_serving`) does.

The scheduler (vLLM V1, vllm/v1/core/sched/scheduler.py `Scheduler.schedule`), as modelled:
- one token budget per step (max_num_batched_tokens); the RUNNING requests first, in the order they were admitted:
  a decoding request takes one token, a request part-way through its prompt takes what is left of it, up to the
  budget (chunked prefill); then WAITING requests in arrival order (FCFS), while budget is left and fewer than
  max_num_seqs run, each taking as much of its prompt as the budget leaves;
- KV blocks are allocated for the tokens a step computes (KVCacheManager.allocate_slots), not for the whole
  request, but a waiting request is admitted only when the free blocks hold its whole prompt (and, for a preempted
  one, the tokens it had generated: --scheduler-reserve-full-isl, on by default in 0.19 to 0.33,
  KVCacheManager.can_fit_full_sequence), and stops the admission of later ones when they do not;
- a running request that finds no free block for its next tokens preempts the newest running request (the last
  admitted: RECOMPUTE, its blocks freed and it goes back to the front of the waiting queue, its prompt and the
  tokens it had generated computed again when it is readmitted), and is itself preempted when it is the newest;
  no request is admitted in a step that preempted;
- the step that computes a prompt's last token samples the first output token (TTFT ends there); every later step
  gives each decoding request one token; a request ends after its output length (the benchmark's ignore_eos);
- when a request can first be scheduled (EngineLimits.admit_delay): one sent to an idle engine at once; one sent
  while a step runs arrives during the next step (a closed loop's client answers the last token it streamed) and
  waits for the step after it, or, with async scheduling (vLLM's default: the scheduler plans the next step while
  the GPU runs this one, VllmConfig.__post_init__), for the step after that. An open loop's arrival counts from the
  step it arrived in.
Left out: prefix caching (every prompt computed in full), speculative decoding, priorities,
long_prefill_token_threshold (0, the default, leaves it off), encoder inputs.

SGLang (python/sglang/srt/managers/scheduler.py `get_next_batch_to_run`, schedule_policy.py `PrefillAdder`), as
modelled: a step is either a prefill batch or a decode batch. Whenever requests wait and the token pool and
max_running_requests admit one, the next step is a prefill batch of waiting requests (FCFS) up to
chunked_prefill_size prompt tokens, a longer prompt split into chunks that continue in the next prefill batches;
otherwise all running requests decode. The token pool is per token (page size 1); a request is admitted only when
what the pool has free, less what the running requests are expected to add (new_token_ratio x their remaining
output, at most 4,096 each) and what the batch's earlier requests take (prompt and output up to 4,096), exceeds its
prompt and its output up to 4,096 (PrefillAdder.add_one_req, _update_prefill_budget). new_token_ratio starts at 0.7
and each decode batch lowers it toward 0.098 over 600 batches (Scheduler.update_running_batch); a refusal while
requests run stops the prefill batches until one of them finishes (running_batch.batch_is_full); a decode batch
whose next tokens the pool cannot hold retracts the requests with the fewest output tokens until it can, keeping at
least one (ScheduleBatch.retract_decode): their KV freed, they rejoin the waiting queue's end and compute their
prompt and outputs again, and new_token_ratio becomes (tokens decoded + 20 per request) / (max_new_tokens + 1)
over the requests left.

Clients, as the benchmarks drive them:
- a closed loop of C clients (`--max-concurrency C`): all C send at once, each sends its next request when the last
  one finishes, until `num_prompts` requests have been sent;
- an open loop at `request_rate` requests/s: Poisson arrivals (exponential gaps, a fixed seed), as
  `vllm bench serve --request-rate R` draws them (burstiness 1).
Every request has `isl` prompt and `osl` output tokens.

The metrics are the benchmark's (vllm/benchmarks/serve.py `calculate_metrics`): per request TTFT, TPOT =
(latency - TTFT) / (output tokens - 1), end-to-end latency; ITL over every gap between two output tokens; each as
mean, median, p90 and p99; output and total tokens/s and requests/s over the benchmark's duration (first request
sent to last one finished).

Speed: between events (a request arriving, finishing, completing its prompt, or a block running out) every step
is the same batch decoding one token more; such a stretch of k steps is advanced at once, priced at its middle
context. A closed loop of identical requests becomes periodic once its first wave has passed: when a whole
generation of C requests repeats the previous one's figures, the remaining requests are given that generation's
figures instead of being simulated again.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict
from typing import Callable, Optional

from kvplan.plan.schedulers import (
    SGLANG_INIT_NEW_TOKEN_RATIO,
    SGLANG_MIN_NEW_TOKEN_RATIO,
    SGLANG_NEW_TOKEN_RATIO_DECAY,
    EngineLimits,
    schedule_sglang,
    schedule_vllm,
    steps_with_blocks,
)
from kvplan.values import frozen_dataclass

PERCENTILES = (50, 90, 99)
VLLM_BENCH_NUM_PROMPTS = 1000  # vllm bench serve --num-prompts' default (benchmarks/serve.py)
CONTEXT_GRID = 16  # tokens between the contexts a step is priced at (and interpolated between)
STEADY_TOLERANCE = 1e-3  # two generations whose mean figures agree this closely are one periodic pattern


@frozen_dataclass
class Stats:
    mean: float
    median: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values, weights=None) -> "Stats":
        import numpy as np

        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            return cls(math.nan, math.nan, math.nan, math.nan)
        if weights is None:
            p = np.percentile(v, PERCENTILES)
            return cls(float(v.mean()), float(p[0]), float(p[1]), float(p[2]))
        w = np.asarray(weights, dtype=np.float64)
        order = np.argsort(v, kind="stable")
        v, w = v[order], w[order]
        cum = np.cumsum(w)
        total = cum[-1]

        def at(i):  # the i-th of the values each repeated w times (w are counts)
            return v[min(int(np.searchsorted(cum, i, side="right")), v.size - 1)]

        qs = []
        for q in PERCENTILES:  # numpy's default (linear) percentile over the repeated values
            idx = q / 100 * (total - 1)
            lo = math.floor(idx)
            qs.append(at(lo) + (at(lo + 1) - at(lo)) * (idx - lo) if idx > lo else at(lo))
        return cls(float((v * w).sum() / total), float(qs[0]), float(qs[1]), float(qs[2]))


@frozen_dataclass
class BenchResult:
    """The figures a serving benchmark prints for one run (times in seconds)."""

    num_prompts: int
    duration_s: float
    ttft: Stats
    tpot: Stats
    itl: Stats
    e2e: Stats
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float
    mean_running: float  # requests running at once, averaged over the benchmark's duration
    max_running: int
    capped_by: Optional[str]  # "kv pool" or "max_num_seqs" where requests waited for it, else None
    preemptions: int
    steps: int  # steps simulated (a stretch of identical decode steps counts each of its steps)
    simulated_prompts: int  # requests simulated; the rest repeat the last generation's figures
    # (sent, first token, finished) of each simulated request, in the order they finished (seconds)
    per_request: tuple = ()

    def to_dict(self) -> dict:
        return asdict(self)


@frozen_dataclass
class Workload:
    """What the benchmark's clients send: `num_prompts` requests of `isl` prompt and `osl` output tokens (after
    `warmup` left out of the figures), all at once up to the concurrency, or as Poisson arrivals at
    `request_rate` requests/s (`seed` fixing them)."""

    isl: int
    osl: int
    num_prompts: int = VLLM_BENCH_NUM_PROMPTS
    warmup: int = 0
    request_rate: Optional[float] = None
    seed: int = 0
    # each request's lengths drawn uniformly from [isl x lo, isl x hi] and [osl x lo, osl x hi] (whole tokens);
    # vllm bench serve's --random-range-ratio r is (1 - r, 1 + r)
    span: tuple = (1.0, 1.0)

    def run(self, price, limits: EngineLimits, concurrency: Optional[int],
            step_cache: Optional[dict] = None) -> "BenchResult":
        return simulate(price, limits, isl=self.isl, osl=self.osl, concurrency=concurrency,
                        request_rate=self.request_rate, num_prompts=self.num_prompts, warmup=self.warmup,
                        seed=self.seed, step_cache=step_cache, span=self.span)


def simulate(price: Callable[[float, float, float, float], float], limits: EngineLimits, *, isl: int, osl: int,
             concurrency: Optional[int] = None, request_rate: Optional[float] = None,
             num_prompts: int = VLLM_BENCH_NUM_PROMPTS, warmup: int = 0, seed: int = 0,
             step_cache: Optional[dict] = None, span: tuple = (1.0, 1.0)) -> BenchResult:
    """Run the benchmark: `price(decoding, their mean context, prompt tokens, their mean attended context)` gives a
    step's seconds. A closed loop with `concurrency`, an open loop at `request_rate` (or both: arrivals at the rate,
    at most `concurrency` in flight, as vllm bench serve does with both options). `step_cache` keeps the priced
    steps for the next run with the same `price`. `warmup` requests are sent first and left out of the figures
    (a client's warm-up: the measured requests then start with the clients out of step, as they run).

    The loop over the steps stays one function, its state in local variables (a benchmark is thousands of steps,
    and throughput's default sweep is held to a second); each policy's schedule is a function of its own
    (kvplan.plan.schedulers: schedule_vllm, schedule_sglang), and so are the figures (_result)."""
    import numpy as np

    if isl < 1 or osl < 1 or num_prompts < 1:
        raise ValueError("isl, osl and num_prompts must be at least 1")
    if concurrency is None and request_rate is None:
        raise ValueError("give a concurrency (closed loop) or a request rate (open loop)")
    n = num_prompts + warmup
    C = min(concurrency or n, n)
    rng = np.random.default_rng(seed)
    # when each request may be sent: all at once in a closed loop, Poisson arrivals in an open one
    gaps = rng.exponential(1.0 / request_rate, n) if request_rate else np.zeros(n)
    release = np.cumsum(gaps) - (gaps[0] if request_rate else 0.0)

    in_len, out_len = request_lengths(isl, osl, n, span, rng)
    fixed = span == (1.0, 1.0)
    prompt_len = in_len.copy()  # what a (re)admitted request computes before it samples again
    computed = np.zeros(n, dtype=np.int64)  # tokens whose KV the request holds
    outputs = np.zeros(n, dtype=np.int64)
    held = np.zeros(n, dtype=np.int64)  # blocks
    sent = np.full(n, math.nan)
    first = np.full(n, math.nan)
    done_at = np.full(n, math.nan)
    finished_order: list[int] = []
    eligible = np.zeros(n, dtype=np.int64)  # the first step a request can be scheduled in

    waiting: deque[int] = deque()
    running: list[int] = []
    free = limits.blocks
    t = 0.0
    next_send = 0  # the next request a client sends
    in_flight = 0
    itl_v: list[float] = []
    itl_w: list[int] = []
    steps = 0
    preemptions = 0
    busy_area = 0.0  # integral of requests running over time
    max_running = 0
    capped: set[str] = set()
    step_cache = {} if step_cache is None else step_cache
    sim_end = n
    gen_stats: list[tuple] = []
    # lockstep (mean field): the share of this rank's steps that carry prompt tokens, and how much longer those
    # steps are, as running means; the other ranks, alike, make a decode step wait that long as often as one of
    # them has a chunk: 1 - (1 - share)^others
    lock_steps, lock_chunks, lock_extra = 0, 0, 0.0
    sg_ratio = SGLANG_INIT_NEW_TOKEN_RATIO  # SGLang's new_token_ratio
    sg_full = False  # SGLang's running_batch.batch_is_full: no prefill is tried until the running batch shrinks

    def lock_wait() -> float:
        """What a decode step of this rank waits for the other ranks' chunks, on average."""
        if not lock_chunks:
            return 0.0
        share = lock_chunks / lock_steps
        return (1 - (1 - share) ** limits.lockstep) * lock_extra / lock_chunks

    def send_due(now: float) -> None:
        nonlocal next_send, in_flight
        busy = bool(running or waiting)
        while next_send < n and in_flight < C and release[next_send] <= now + 1e-12:
            r = next_send
            sent[r] = max(now, release[r]) if request_rate else now
            # a request sent while the engine runs arrives during its next step (a closed loop's client answers
            # the last token) or arrived during the step just run (an open loop's)
            eligible[r] = steps + (limits.admit_delay - (1 if request_rate else 0) if busy else 0)
            waiting.append(r)
            next_send += 1
            in_flight += 1

    def priced(b: int, ctx: int, p: int, pctx: int) -> float:
        key = (b, ctx, p, pctx)
        s = step_cache.get(key)
        if s is None:
            s = step_cache[key] = price(b, ctx, p, pctx)
        return s

    def cost(b: int, ctx: float, p: int, pctx: float) -> float:
        """A step's seconds: a decode step interpolated between contexts CONTEXT_GRID tokens apart (the step grows
        smoothly with the context), a step with prompt tokens at the nearest contexts of a grid 4x as coarse."""
        g = CONTEXT_GRID
        if p:  # (a coarser grid: these steps are as many as their prompts, and the chunk's tokens dominate them)
            gp = 4 * g
            return priced(b, gp * round(ctx / gp), p, gp * round(pctx / gp))
        lo = g * math.floor(ctx / g)
        f0 = priced(b, lo, 0, 0)
        return f0 + (priced(b, lo + g, 0, 0) - f0) * (ctx - lo) / g

    # the blocks a request holding n tokens needs, for every n it can hold (a table read instead of the pool's rule)
    longest = int((in_len + out_len).max())
    table = np.asarray(limits.blocks_for(np.arange(longest + 2, dtype=np.int64))).astype(np.int64)

    send_due(0.0)
    while len(finished_order) < sim_end:
        if not running and not waiting:  # idle until the next arrival
            t = max(t, release[next_send])
            send_due(t)
            continue
        if not running and waiting:  # an idle engine takes what arrives at once
            eligible[list(waiting)] = np.minimum(eligible[list(waiting)], steps)
        # -- the step's schedule ------------------------------------------------------------------------------------
        if limits.policy == "sglang":
            sched_r, sched_k, sg_ratio, sg_full, lost = schedule_sglang(
                running, waiting, prompt_len, computed, outputs, out_len, limits, capped, sg_ratio, sg_full, in_len)
            preemptions += lost
            preempted = lost > 0
        else:
            sched_r, sched_k, free, lost = schedule_vllm(running, waiting, prompt_len, computed, outputs, held, free,
                                                          limits, table, in_len, capped, eligible, steps)
            preemptions += lost
            preempted = lost > 0
        rs = np.concatenate(sched_r) if len(sched_r) > 1 else sched_r[0]
        ks = np.concatenate(sched_k) if len(sched_k) > 1 else sched_k[0]
        if not rs.size:  # nothing can run (a request larger than the pool): it never will
            raise ValueError("a request does not fit the KV pool even alone")
        decoding = computed[rs] >= prompt_len[rs]
        dec = rs[decoding]
        pre, pre_k = rs[~decoding], ks[~decoding]
        b = int(dec.size)
        ctx = int(computed[dec].sum()) / b if b else 0.0
        p = int(pre_k.sum())
        pctx = float(((computed[pre] + pre_k / 2) * pre_k).sum() / p) if p else 0.0
        # -- a stretch of identical decode steps: nothing arrives, completes a prompt or waits to be admitted -------
        # (a request still waiting was refused admission this step, and stays refused until one finishes: the free
        # blocks only shrink as the batch grows; SGLang tries no prefill until the running batch shrinks)
        k_steps = 1
        if p == 0 and b == len(running) and not preempted:
            k_steps = int((out_len[dec] - outputs[dec]).min())
            if next_send < n and in_flight < C:  # an open loop's next arrival
                est = cost(b, ctx, 0, 0.0)
                k_steps = max(1, min(k_steps, int((release[next_send] - t) / est)))
            if waiting and eligible[waiting[0]] > steps:  # the stretch ends where the queue's front (a preempted
                # request, or the earliest to arrive) can be scheduled; one refused for blocks waits for a finish
                k_steps = max(1, min(k_steps, int(eligible[waiting[0]]) - steps))
            if limits.policy == "vllm":
                k_steps = steps_with_blocks(table, computed[dec], held[dec], free, k_steps)
            else:  # the token pool holds every request's next k tokens; each of the k batches lowers the ratio
                k_steps = max(1, min(k_steps, (limits.blocks - int(computed[dec].sum())) // b))
                sg_ratio = max(sg_ratio - (k_steps - 1) * SGLANG_NEW_TOKEN_RATIO_DECAY, SGLANG_MIN_NEW_TOKEN_RATIO)
        if k_steps > 1:
            dt_each = cost(b, ctx + (k_steps - 1) / 2, 0, 0.0)
            if limits.lockstep:
                lock_steps += k_steps
                dt_each += lock_wait()
            dt = dt_each * k_steps
            need = table[computed[dec] + k_steps] - held[dec]
            held[dec] += need
            free -= int(need.sum())
            computed[dec] += k_steps
            outputs[dec] += k_steps
            itl_v.append(dt_each)
            itl_w.append(b * k_steps)
        else:
            dt = cost(b, ctx, p, pctx)
            if limits.lockstep:
                lock_steps += 1
                if p:  # a chunk of this rank's, which the others wait for (as this one waits for theirs)
                    lock_chunks += 1
                    lock_extra += max(0.0, dt - cost(b, ctx, 0, 0.0))
                elif lock_steps > 1:
                    dt += lock_wait()
            computed[rs] += ks
            if b:
                outputs[dec] += 1
                itl_v.append(dt)
                itl_w.append(b)
        busy_area += len(running) * dt
        max_running = max(max_running, len(running))
        t += dt
        steps += k_steps
        # prompts completed this step sample their first token (a readmitted request its next one)
        if p:
            fin = pre[computed[pre] >= prompt_len[pre]]
            for r in fin:
                if math.isnan(first[r]):
                    first[r] = t
                outputs[r] += 1
        # -- requests that have their osl tokens end; their clients send again ------------------------------------
        ended = dec[outputs[dec] >= out_len[dec]].tolist() if b else []
        if p:
            ended += [r for r in fin.tolist() if outputs[r] >= out_len[r]]
        if ended:
            now = np.fromiter(running, dtype=np.int64, count=len(running))
            running = now[outputs[now] < out_len[now]].tolist()
            done_at[ended] = t
            free += int(held[ended].sum())
            held[ended] = 0
            finished_order += ended
            in_flight -= len(ended)
            sg_full = False
            send_due(t)
            if request_rate is None and fixed and len(finished_order) >= C:
                sim_end = _steady_end(finished_order, sent, first, done_at, C, gen_stats, sim_end, t, busy_area)
        elif request_rate:
            send_due(t)

    return _result(n, C, in_len, out_len, sent, first, done_at, finished_order, itl_v, itl_w, steps, preemptions,
                   busy_area, max_running, capped, gen_stats, warmup)


def _steady_end(order, sent, first, done_at, C, gen_stats, sim_end, t, busy_area) -> int:
    """Where a closed loop may stop simulating: once two generations of C finished requests after the start-up
    wave agree on their mean TTFT and latency. Each generation's record: (mean TTFT, mean latency, its end, the
    running-request area up to its end)."""
    g = len(order) // C
    if len(gen_stats) >= g or len(order) % C:
        return sim_end
    rs = order[(g - 1) * C:g * C]
    ttft = sum(first[r] - sent[r] for r in rs) / C
    e2e = sum(done_at[r] - sent[r] for r in rs) / C
    gen_stats.append((ttft, e2e, t, busy_area))
    if len(gen_stats) >= 3:  # the first generation is the start-up wave; compare the two after it
        a, b = gen_stats[-2], gen_stats[-1]
        if all(abs(x - y) <= STEADY_TOLERANCE * max(abs(x), 1e-9) for x, y in zip(a[:2], b[:2])):
            return len(order)
    return sim_end


def _result(n, C, in_len, out_len, sent, first, done_at, order, itl_v, itl_w, steps, preemptions, busy_area,
            max_running, capped, gen_stats, warmup=0) -> BenchResult:
    import numpy as np

    simulated = len(order)
    rs = np.asarray(order, dtype=np.int64)
    rs = rs[rs >= warmup]  # the measured requests (sent after the warm-up's)
    ttft = first[rs] - sent[rs]
    e2e = done_at[rs] - sent[rs]
    ins, outs = in_len[rs], out_len[rs]
    duration = float(done_at[rs].max() - sent[rs].min())
    if simulated < n:  # periodic (fixed lengths): the rest repeat the last generation, one generation's time each
        last = rs[-C:]
        reps = n - simulated
        idx = np.resize(np.arange(C), reps)
        ttft = np.concatenate([ttft, (first[last] - sent[last])[idx]])
        e2e = np.concatenate([e2e, (done_at[last] - sent[last])[idx]])
        ins = np.concatenate([ins, in_len[last][idx]])
        outs = np.concatenate([outs, out_len[last][idx]])
        (_, _, end0, area0), (_, _, end1, area1) = gen_stats[-2:]
        duration += (end1 - end0) * reps / C
        busy_area += (area1 - area0) * reps / C
    # TPOT per request of more than one output token (vllm/benchmarks/serve.py calculate_metrics)
    several = outs > 1
    tpot = (e2e - ttft)[several] / (outs[several] - 1) if several.any() else np.zeros_like(e2e)
    m = n - warmup
    out_tokens = float(outs.sum())
    in_tokens = float(ins.sum())
    whole = duration + (float(sent[rs].min()) if warmup else 0.0)  # the whole run's, for the running average
    mean_running = busy_area / whole if whole > 0 else 0.0
    return BenchResult(
        num_prompts=m, duration_s=duration, ttft=Stats.of(ttft), tpot=Stats.of(tpot),
        itl=Stats.of(itl_v, itl_w), e2e=Stats.of(e2e), output_tokens_per_s=out_tokens / duration,
        total_tokens_per_s=(in_tokens + out_tokens) / duration, requests_per_s=m / duration,
        mean_running=mean_running, max_running=max_running,
        capped_by=("kv pool" if "kv pool" in capped else "max_num_seqs" if "max_num_seqs" in capped else None),
        preemptions=preemptions, steps=steps, simulated_prompts=simulated,
        per_request=tuple((float(sent[r]), float(first[r]), float(done_at[r])) for r in order if r >= warmup))


def request_lengths(isl: int, osl: int, n: int, span: tuple, rng):
    """Each request's prompt and output tokens: `isl` and `osl` (span (1, 1)), or drawn uniformly from the whole
    numbers in [isl x lo, isl x hi] and [osl x lo, osl x hi] (at least 1), prompts first, as vllm bench serve's
    random dataset draws them (vllm/benchmarks/datasets.py RandomDataset.get_sampling_params)."""
    import numpy as np

    lo, hi = span
    if (lo, hi) == (1.0, 1.0):
        return np.full(n, isl, dtype=np.int64), np.full(n, osl, dtype=np.int64)

    def draw(length):
        low, high = max(math.floor(length * lo), 1), max(math.ceil(length * hi), 1)
        return rng.integers(low, high + 1, size=n).astype(np.int64)

    return draw(isl), draw(osl)
