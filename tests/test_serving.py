"""The simulated serving benchmark (kvplan.plan.serving): the scheduler's steps worked by hand, the benchmark's figures
by their definitions, and concurrency 1 against the step model."""

import math

import numpy as np
import pytest

import kvplan.plan.serving as serving
from kvplan.deployment import DeploymentArgs
from kvplan.plan.schedulers import EngineLimits
from kvplan.plan.serving import Stats, simulate
from kvplan.plan.throughput import _price, engine_limits
from kvplan.sizing.step_time import step_model


def blocks16(n):
    return -(-np.asarray(n) // 16)


def linear_price(b, ctx, p, pctx):
    """10 ms a step, 1 ms per decoding request, 10 us per prompt token: a price whose steps a hand can add up."""
    return 0.010 + 0.001 * b + 1e-5 * p


def test_four_clients_with_chunked_prefill_step_by_step():
    # 4 clients send a 1,500-token prompt each at t = 0, 4 output tokens; 2,048 tokens a step (vLLM V1: the running
    # requests first, then waiting ones FCFS, each taking what the budget leaves):
    # step 1: r0 its 1,500 prompt tokens, r1 548 of its 1,500          b=0, p=2,048  10 + 20.48 = 30.48 ms
    #         r0's prompt is done: its first token (TTFT 30.48 ms)
    # step 2: r0 decodes; r1 its last 952; r2 1,095 (2,048 - 1 - 952)  b=1, p=2,047  10 + 1 + 20.47 = 31.47 ms
    #         r1's first token at 61.95 ms
    # step 3: r0, r1 decode; r2 its last 405; r3 its 1,500 (of 1,641)  b=2, p=1,905  10 + 2 + 19.05 = 31.05 ms
    #         r2's and r3's first tokens at 93.00 ms
    # step 4: all four decode                                           b=4           10 + 4 = 14 ms
    #         r0 has its 4 tokens (1 in step 1, 3 decoded): done at 107.00 ms
    lim = EngineLimits("vllm", token_budget=2048, max_seqs=256, blocks=10_000, blocks_for=blocks16)
    r = simulate(linear_price, lim, isl=1500, osl=4, concurrency=4, num_prompts=4)
    sent, first, done = zip(*sorted(r.per_request))  # by when each was sent, then its first token
    assert sent == (0.0, 0.0, 0.0, 0.0)
    assert first == pytest.approx((0.03048, 0.06195, 0.09300, 0.09300), abs=1e-12)
    assert r.ttft.mean == pytest.approx((0.03048 + 0.06195 + 0.093 + 0.093) / 4, abs=1e-12)
    assert min(done) == pytest.approx(0.107, abs=1e-12)
    # (num_prompts = 4: r0's client sends nothing more) step 5: r1, r2, r3 decode (13 ms), r1 has its 4 tokens at
    # 120 ms; step 6: r2, r3 (12 ms), done at 132 ms
    assert sorted(done) == pytest.approx([0.107, 0.120, 0.132, 0.132], abs=1e-12)
    assert r.tpot.mean == pytest.approx(np.mean([(d - f) / 3 for _, f, d in r.per_request]), rel=1e-12)


def test_four_clients_priced_with_the_fitted_step_model():
    # the same first wave on Llama-3.1-8B, H100, each step priced by the bundled fits for exactly its batch
    d = DeploymentArgs(model="llama-3.1-8b", gpu="h100", max_num_batched_tokens=2048).resolve(needs_memory=True)
    sm = step_model(d)
    lim = engine_limits(d)
    r = simulate(_price(sm, 1), lim, isl=1500, osl=4, concurrency=4, num_prompts=4)
    # step 1: prompts [0, 1500) and [0, 548): each token attends on average to its chunk's middle
    t1 = sm.step(0, 0, 2048, (750 * 1500 + 274 * 548) / 2048).total_s
    t2 = sm.step(1, 1500, 2047, ((548 + 476) * 952 + 547.5 * 1095) / 2047).total_s
    t3 = sm.step(2, 1500.5, 1905, ((1095 + 202.5) * 405 + 750 * 1500) / 1905).total_s
    first = sorted(f for _, f, _ in r.per_request)
    # (the simulation prices contexts on a 16-token grid: within 0.1%)
    assert first == pytest.approx([t1, t1 + t2, t1 + t2 + t3, t1 + t2 + t3], rel=1e-3)


@pytest.mark.parametrize("isl", [1024, 8192, 32768, 130000])
def test_concurrency_one_is_the_decode_step_and_the_prefill(isl):
    # one client: no other request shares its steps, so TPOT is the batch-1 decode step at the mean context and
    # TTFT the prefill's steps (the token budget's chunks, the last one sampling the first token)
    osl = 128
    d = DeploymentArgs(model="llama-3.1-8b", gpu="h100").resolve(needs_memory=True)
    sm = step_model(d)
    lim = engine_limits(d)
    r = simulate(_price(sm, 1), lim, isl=isl, osl=osl, concurrency=1, num_prompts=5)
    assert r.tpot.mean == pytest.approx(sm.step(1, isl + osl / 2).total_s, rel=0.01)
    budget = d.max_num_batched_tokens
    prefill = sum(sm.step(0, 0, min(budget, isl - s), s + min(budget, isl - s) / 2).total_s
                  for s in range(0, isl, budget))
    assert r.ttft.mean == pytest.approx(prefill, rel=2e-3)
    assert r.ttft.p99 == pytest.approx(r.ttft.mean, rel=1e-9) and r.mean_running == pytest.approx(1.0)


def test_a_pool_too_small_preempts_and_recomputes():
    # 10 blocks of 16 tokens; two requests of 50 + 60 tokens need 7 blocks each at their end: the newest is
    # preempted, recomputed when blocks free up, and every request still finishes with all its tokens
    lim = EngineLimits("vllm", token_budget=512, max_seqs=8, blocks=10, blocks_for=blocks16)
    r = simulate(linear_price, lim, isl=50, osl=60, concurrency=2, num_prompts=6)
    assert r.preemptions > 0 and r.capped_by == "kv pool"
    assert len(r.per_request) == 6 and all(s <= f < d for s, f, d in r.per_request)
    assert r.output_tokens_per_s == pytest.approx(6 * 60 / r.duration_s)


def test_max_num_seqs_caps_the_batch():
    lim = EngineLimits("vllm", token_budget=8192, max_seqs=4, blocks=10_000, blocks_for=blocks16)
    r = simulate(linear_price, lim, isl=100, osl=50, concurrency=16, num_prompts=64)
    assert r.max_running == 4 and r.capped_by == "max_num_seqs"


def test_open_loop_is_seeded_and_poisson():
    lim = EngineLimits("vllm", token_budget=8192, max_seqs=256, blocks=100_000, blocks_for=blocks16)
    a = simulate(linear_price, lim, isl=100, osl=20, request_rate=5.0, num_prompts=400, seed=3)
    b = simulate(linear_price, lim, isl=100, osl=20, request_rate=5.0, num_prompts=400, seed=3)
    assert a == b
    sent = sorted(s for s, _, _ in a.per_request)
    assert np.mean(np.diff(sent)) == pytest.approx(1 / 5.0, rel=0.15)  # 400 exponential gaps of mean 0.2 s
    # a light load: every request runs alone or nearly so, TTFT is one prefill step
    assert a.ttft.median == pytest.approx(linear_price(0, 0, 100, 50), rel=0.5)


def test_the_periodic_shortcut_equals_simulating_every_request(monkeypatch):
    d = DeploymentArgs(model="llama-3.1-8b", gpu="h100").resolve(needs_memory=True)
    sm = step_model(d)
    lim = engine_limits(d)
    short = simulate(_price(sm, 1), lim, isl=2048, osl=256, concurrency=8, num_prompts=400)
    monkeypatch.setattr(serving, "STEADY_TOLERANCE", -1.0)  # never periodic: every request simulated
    full = simulate(_price(sm, 1), lim, isl=2048, osl=256, concurrency=8, num_prompts=400)
    assert short.simulated_prompts < full.simulated_prompts == 400
    for x, y in ((short.ttft, full.ttft), (short.tpot, full.tpot), (short.e2e, full.e2e)):
        assert x.mean == pytest.approx(y.mean, rel=5e-3)
    assert short.output_tokens_per_s == pytest.approx(full.output_tokens_per_s, rel=5e-3)


def test_weighted_percentiles_are_numpys_over_the_repeated_values():
    v, w = [5.0, 1.0, 3.0], [2, 3, 1]
    s = Stats.of(v, w)
    rep = [1.0] * 3 + [3.0] + [5.0] * 2
    assert (s.mean, s.median, s.p90, s.p99) == pytest.approx(
        (np.mean(rep), *np.percentile(rep, [50, 90, 99])))
    assert math.isnan(Stats.of([]).mean)


@pytest.mark.parametrize("model, tp", [("llama-3.1-8b", 1), ("deepseek-v3", 8), ("gpt-oss-120b", 2), ("gemma-3-27b", 1)])
def test_step_seconds_is_the_step(model, tp):
    # the simulation's remembered pricing equals the step model's own, whole token counts (the table) and a
    # pipeline stage's fractions alike
    d = DeploymentArgs(model=model, gpu="h200", tp=tp).resolve(needs_memory=True)
    sm = step_model(d)
    for b, ctx, p, pctx in ((1, 1000, 0, 0), (37, 5000, 0, 0), (0, 0, 8192, 4096), (12, 3000, 700, 9000),
                            (511, 100, 1537, 200), (3.5, 4000, 10.5, 300), (2000, 64, 3000, 1500)):
        assert sm.step_seconds(b, ctx, p, pctx) == pytest.approx(sm.step(b, ctx, p, pctx).total_s, rel=1e-12)


def test_warmup_requests_are_left_out_of_the_figures():
    lim = EngineLimits("vllm", token_budget=2048, max_seqs=256, blocks=10_000, blocks_for=blocks16)
    r = simulate(linear_price, lim, isl=1500, osl=4, concurrency=4, num_prompts=4, warmup=4)
    assert r.num_prompts == 4 and len(r.per_request) == 4
    assert min(s for s, _, _ in r.per_request) > 0  # the first wave (sent at t = 0) was the warm-up
    assert r.output_tokens_per_s == pytest.approx(4 * 4 / r.duration_s)


def test_sglang_runs_prefill_batches_and_decode_batches_apart():
    # SGLang: a step is a prefill batch (waiting prompts, FCFS, up to chunked_prefill_size tokens, a longer prompt
    # continued in the next prefill batch) or, when no prompt can be admitted, a decode batch of every running request.
    # 2 clients, 1,500-token prompts, 3 output tokens, chunked_prefill_size 1,024:
    # step 1: prefill r0 [0, 1024)                      b=0, p=1,024  10 + 10.24 = 20.24 ms
    # step 2: prefill r0 [1024, 1500), r1 [0, 548)      b=0, p=1,024  20.24 ms; r0's first token at 40.48 ms
    # step 3: prefill r1 [548, 1500)                    b=0, p=952    10 + 9.52 = 19.52 ms; r1's first at 60.00 ms
    # step 4: decode r0, r1                             b=2           12 ms (72.00)
    # step 5: decode r0, r1                             b=2           12 ms (84.00): both have their 3 tokens
    lim = EngineLimits("sglang", token_budget=1024, max_seqs=64, blocks=1_000_000, blocks_for=lambda n: n)
    r = simulate(linear_price, lim, isl=1500, osl=3, concurrency=2, num_prompts=2)
    first = sorted(f for _, f, _ in r.per_request)
    done = sorted(d for _, _, d in r.per_request)
    assert first == pytest.approx([0.04048, 0.06000], abs=1e-12)
    assert done == pytest.approx([0.084, 0.084], abs=1e-12)


def test_sglang_mixed_chunks_decode_the_running_requests_in_the_prefill_step():
    # --enable-mixed-chunk (sglang 0.5.6 scheduler.py get_new_batch_prefill: mix_with_running): the same 2 clients,
    # 1,500-token prompts, 3 output tokens, chunked_prefill_size 1,024, the budget less one token per decoding request:
    # step 1: prefill r0 [0, 1024)                           b=0, p=1,024  20.24 ms
    # step 2: prefill r0 [1024, 1500), r1 [0, 548)           b=0, p=1,024  20.24 ms (40.48): r0's first token
    # step 3: r0 decodes (its 2nd token), r1 [548, 1500)     budget 1,023; b=1, p=952: 10 + 1 + 9.52 = 20.52 ms
    #         (61.00): r1's first token
    # step 4: decode r0 (its 3rd: done), r1                  b=2, 12 ms (73.00)
    # step 5: decode r1 (its 3rd)                            b=1, 11 ms (84.00)
    lim = EngineLimits("sglang", token_budget=1024, max_seqs=64, blocks=1_000_000, blocks_for=lambda n: n,
                       mixed_chunk=True)
    r = simulate(linear_price, lim, isl=1500, osl=3, concurrency=2, num_prompts=2)
    assert sorted(f for _, f, _ in r.per_request) == pytest.approx([0.04048, 0.06100], abs=1e-12)
    assert sorted(d for _, _, d in r.per_request) == pytest.approx([0.073, 0.084], abs=1e-12)


def test_sglang_max_prefill_tokens_caps_a_batch_beyond_its_first_request():
    # --max-prefill-tokens 1,200 (schedule_policy.py PrefillAdder.add_one_req: a request beyond the batch's first
    # whose prompt is at least the input tokens left waits): 3 clients, 1,000-token prompts, 2 output tokens,
    # chunked_prefill_size 8,192:
    # step 1: prefill r0 (1,000; 200 input tokens left: r1's 1,000 waits)   p=1,000  20 ms: r0's first token at 20
    # step 2: prefill r1                                                     p=1,000  20 ms (40): r1's first token
    # step 3: prefill r2                                                     p=1,000  20 ms (60): r2's first token
    # without the cap all three are one batch: p=3,000, 40 ms, every first token at 40 ms
    capped = EngineLimits("sglang", token_budget=8192, max_seqs=64, blocks=1_000_000, blocks_for=lambda n: n,
                          input_budget=1200)
    r = simulate(linear_price, capped, isl=1000, osl=2, concurrency=3, num_prompts=3)
    assert sorted(f for _, f, _ in r.per_request) == pytest.approx([0.020, 0.040, 0.060], abs=1e-12)
    free = EngineLimits("sglang", token_budget=8192, max_seqs=64, blocks=1_000_000, blocks_for=lambda n: n)
    r = simulate(linear_price, free, isl=1000, osl=2, concurrency=3, num_prompts=3)
    assert sorted(f for _, f, _ in r.per_request) == pytest.approx([0.040, 0.040, 0.040], abs=1e-12)


def test_sglang_admits_what_its_token_pool_holds_with_the_expected_output():
    # a pool of 5,000 tokens, 1,500-token prompts, 1,000 output tokens (sglang 0.5.9 schedule_policy.py
    # PrefillAdder.add_one_req: a request is admitted while its prompt + output (up to 4,096) is below what the pool
    # has left, less the running requests' new_token_ratio x remaining output and what the batch took):
    # step 1: r0 needs 2,500 < 5,000: admitted, 2,500 left; r1 needs 2,500, not below 2,500: waits
    #         prefill r0: p=1,500, 10 + 15 = 25 ms; r0's first token at 25 ms
    # step 2: 5,000 - 1,500 held - 0.7 x 999 = 2,800.7 left: r1 admitted (300.7 left), r2 waits; 25 ms (50 ms)
    # step 3: 5,000 - 3,000 - 0.7 x 999 x 2 = 601.4: r2 waits for a finish; r0 and r1 decode their 999 tokens
    #         together, 12 ms a batch: both done at 50 + 999 x 12 = 12,038 ms
    # (with 0.7 x the output reserved for a new request too, 2,200 each, r0 and r1 were one batch, first at 40 ms)
    lim = EngineLimits("sglang", token_budget=8192, max_seqs=64, blocks=5_000, blocks_for=lambda n: n)
    r = simulate(linear_price, lim, isl=1500, osl=1000, concurrency=3, num_prompts=3)
    assert r.max_running == 2 and r.capped_by == "kv pool"
    assert sorted(s for s, _, _ in r.per_request) == [0.0, 0.0, 0.0]
    first = sorted(f for _, f, _ in r.per_request)
    assert first[:2] == pytest.approx([0.025, 0.050], abs=1e-12)
    assert sorted(d for _, _, d in r.per_request)[:2] == pytest.approx([12.038, 12.038], abs=1e-9)
    assert first[2] > 12.038  # the third's first token after the two finished


def test_sglang_a_refusal_while_requests_run_waits_for_one_to_finish():
    # 2 clients, 100-token prompts, 1,000 output tokens, a pool of 1,850 tokens (sglang 0.5.9 scheduler.py
    # get_new_batch_prefill: a refusal marks the running batch full, and no prefill is tried until it shrinks):
    # step 1: r0 needs 100 + 1,000 = 1,100 < 1,850: admitted; r1 refused (750 left), but no request ran: the
    #         prefill batch becomes the running batch, not full. Prefill r0: 11 ms
    # step 2: 1,850 - 100 - 0.7 x 999 = 1,050.7 left, not above 1,100: r1 refused while r0 runs: full
    # r0 decodes its 999 tokens alone (11 ms each, though new_token_ratio falls to 0.098 and would admit r1 after
    #         80 of them): done at 11 + 999 x 11 = 11,000 ms; r1 prefilled (11 ms: first token at 11,011 ms) and
    #         decoded alone: done at 22,000 ms
    lim = EngineLimits("sglang", token_budget=8192, max_seqs=64, blocks=1_850, blocks_for=lambda n: n)
    r = simulate(linear_price, lim, isl=100, osl=1000, concurrency=2, num_prompts=2)
    assert sorted(f for _, f, _ in r.per_request) == pytest.approx([0.011, 11.011], abs=1e-9)
    assert sorted(d for _, _, d in r.per_request) == pytest.approx([11.0, 22.0], abs=1e-9)
    assert r.max_running == 1 and r.capped_by == "kv pool"


def test_sglang_retracts_when_a_decode_batch_finds_the_pool_full():
    # 2 clients, 100-token prompts, 1,000 output tokens, a pool of 1,950 tokens, chunked_prefill_size 100 (one prompt
    # a step; schedule_batch.py retract_decode):
    # step 1: prefill r0 (the chunk budget spent: r1 is not tried), 11 ms; its first token at 11 ms
    # step 2: 1,950 - 100 - 0.7 x 999 = 1,150.7 left, above r1's 1,100: prefill r1, 11 ms; first token at 22 ms
    # r0 and r1 (100 tokens each, 1 output) decode together, 12 ms a batch, until the pool is full:
    #         (1,950 - 200) / 2 = 875 batches (10,522 ms); the next batch finds no room for 2 tokens: of the two,
    #         alike (876 outputs), the later in the batch, r1, is retracted (its 975 tokens freed), to compute 100 +
    #         876 tokens again; new_token_ratio becomes (876 + 20) / 1,001 = 0.895
    # r1 needs 976 + 124 = 1,100, above 1,950 - 975 - 0.895 x 124 = 864: refused while r0 runs its last 124 tokens
    #         alone, 11 ms each: r0 done at 10,522 + 1,364 = 11,886 ms
    # r1's 976 tokens in chunks of 100: 9 x 11 + 10.76 ms (11,995.76), then its last 123 tokens, 11 ms each: done
    #         at 13,348.76 ms
    lim = EngineLimits("sglang", token_budget=100, max_seqs=64, blocks=1_950, blocks_for=lambda n: n)
    r = simulate(linear_price, lim, isl=100, osl=1000, concurrency=2, num_prompts=2)
    assert sorted(f for _, f, _ in r.per_request) == pytest.approx([0.011, 0.022], abs=1e-9)
    assert sorted(d for _, _, d in r.per_request) == pytest.approx([11.886, 13.34876], abs=1e-9)
    assert r.preemptions == 1 and r.capped_by == "kv pool"


def test_a_request_sent_while_a_step_runs_waits_for_the_scheduled_one():
    # 2 clients, 100-token prompts, 2 output tokens, 150 tokens a step, 3 requests:
    # step 0: r0 its 100, r1 50 of its 100           b=0, p=150  11.5 ms (t 11.5): r0's first token
    # step 1: r0 decodes, r1 its last 50             b=1, p=50   11.5 ms (t 23.0): r0 done, r1's first token;
    #         client 0 sends r2 at 23.0 while r1 runs: it arrives during step 2
    # without a delay r2 joins step 2: b=1, p=100, 12 ms: its first token at 35.0, TTFT 12 ms;
    # with async scheduling (admit_delay 2) step 3 was planned before it arrived, and step 2 runs r1 alone
    # (11 ms, t 34.0, r1 done); the engine is then idle and takes r2 at once: step 3, p=100, 11 ms, first token at
    # 45.0: TTFT 22 ms
    def run(delay):
        lim = EngineLimits("vllm", token_budget=150, max_seqs=8, blocks=10_000, blocks_for=blocks16, admit_delay=delay)
        r = simulate(linear_price, lim, isl=100, osl=2, concurrency=2, num_prompts=3)
        return max(r.per_request, key=lambda x: x[0])  # r2: the last sent

    sent, first, _ = run(0)
    assert (sent, first - sent) == pytest.approx((0.023, 0.012), abs=1e-12)
    sent, first, _ = run(2)
    assert (sent, first - sent) == pytest.approx((0.023, 0.022), abs=1e-12)


def test_random_range_ratio_draws_lengths_as_vllm_bench_serve_does():
    # vllm/benchmarks/datasets.py RandomDataset.get_sampling_params: integers in [floor(L (1 - r)), ceil(L (1 + r))]
    # (r = 0.5: prompts 500..1500 for isl 1000, outputs 50..150 for osl 100), the prompts drawn first
    rng = np.random.default_rng(7)
    ins, outs = serving.request_lengths(1000, 100, 20_000, (0.5, 1.5), rng)
    assert ins.min() == 500 and ins.max() == 1500 and outs.min() == 50 and outs.max() == 150
    assert ins.mean() == pytest.approx(1000, rel=0.01) and outs.mean() == pytest.approx(100, rel=0.01)
    same = np.random.default_rng(7)
    assert (same.integers(500, 1501, size=20_000) == ins).all()


def test_random_lengths_one_client_each_request_its_own_prefill_and_output():
    # one client, each request alone: its TTFT is one prefill step of its own prompt (linear_price: 10 ms + 10 us a
    # prompt token, every prompt below the 8,192-token budget), each later token a 11 ms batch-1 decode step, so its
    # TPOT is 11 ms whatever its length; the output tokens/s count every request's own output
    lim = EngineLimits("vllm", token_budget=8192, max_seqs=256, blocks=100_000, blocks_for=blocks16)
    r = simulate(linear_price, lim, isl=1000, osl=40, concurrency=1, num_prompts=30, span=(0.5, 1.5))
    ins, outs = serving.request_lengths(1000, 40, 30, (0.5, 1.5), np.random.default_rng(0))
    assert len(set(ins.tolist())) > 10  # lengths do differ
    ttfts = sorted(f - s for s, f, _ in r.per_request)
    assert ttfts == pytest.approx(sorted(0.010 + 1e-5 * ins), abs=1e-9)
    assert r.tpot.mean == pytest.approx(0.011, rel=1e-9) and r.tpot.p99 == pytest.approx(0.011, rel=1e-9)
    busy = sum(d - s for s, _, d in r.per_request)  # back to back: the run's duration
    assert r.duration_s == pytest.approx(busy, rel=1e-9)
    assert r.output_tokens_per_s == pytest.approx(outs.sum() / busy, rel=1e-9)
    assert r.total_tokens_per_s == pytest.approx((ins.sum() + outs.sum()) / busy, rel=1e-9)


def test_throughput_takes_random_range_ratio_and_refuses_a_bad_one():
    from kvplan.errors import KvplanError
    from kvplan.plan.throughput import throughput_of

    ds = [DeploymentArgs(model="llama-3.1-8b", gpu="h100", kv_cache_dtype="auto").resolve(needs_memory=True)]
    fixed = throughput_of(ds, 1024, 256, [16], num_prompts=200)
    drawn = throughput_of(ds, 1024, 256, [16], num_prompts=200, random_range_ratio=0.5)
    assert drawn.random_range_ratio == 0.5 and drawn.to_dict()["random_range_ratio"] == 0.5
    # lengths around the same means: the decode-bound TPOT moves little, the rows are not the same run
    assert drawn.rows[0].tpot_ms == pytest.approx(fixed.rows[0].tpot_ms, rel=0.15)
    assert drawn.rows[0].ttft_p99_ms != fixed.rows[0].ttft_p99_ms
    for bad in (-0.1, 1.0):
        with pytest.raises(KvplanError, match="--random-range-ratio"):
            throughput_of(ds, 1024, 256, [16], random_range_ratio=bad)
    # the longest drawn request must fit max_model_len: 8,192 + 8,192 at r = 0.5 is 24,576 tokens
    short = [DeploymentArgs(model="llama-3.1-8b", gpu="h100", max_model_len=20_000).resolve(needs_memory=True)]
    with pytest.raises(KvplanError, match="24,576 tokens"):
        throughput_of(short, 8192, 8192, [1], random_range_ratio=0.5)


def test_vllm_admits_a_request_only_when_its_whole_prompt_fits():
    # 20 blocks of 16 tokens; two 200-token prompts (13 blocks each), 10 output tokens, 128 tokens a step.
    # step 1: r0 takes 128 of its prompt (8 blocks); step 2: r0 its last 72 (13 blocks, 7 free), 56 of the budget
    # left: r1's first chunk of 56 needs 4 blocks, which are free, but its whole prompt needs 13: with vLLM's
    # --scheduler-reserve-full-isl (on by default, v1/core/sched/scheduler.py can_fit_full_sequence) r1 waits for
    # r0 to finish; admitted on its first chunk alone, it grows until the two need 27 blocks and is preempted
    def run(reserve):
        lim = EngineLimits("vllm", token_budget=128, max_seqs=8, blocks=20, blocks_for=blocks16,
                           reserve_full_prompt=reserve)
        return simulate(linear_price, lim, isl=200, osl=10, concurrency=2, num_prompts=2)

    gated, first_chunk = run(True), run(False)
    assert gated.preemptions == 0 and first_chunk.preemptions > 0
    (s0, f0, d0), (s1, f1, d1) = sorted(gated.per_request, key=lambda x: x[2])
    assert f1 > d0  # r1's prompt ran after r0 was done
    assert gated.max_running == 1 and gated.capped_by == "kv pool"


def test_a_dtype_whose_pool_cannot_hold_the_longest_drawn_request_is_left_out():
    # Llama-3.1-70B on two H100s, max_model_len 16,000: the bf16 pool holds 9,184 tokens, fp8 twice that. Prompts
    # of 7,000 +- 50% (the longest 10,500) and 10 +- 50% outputs (at most 15): fp8 runs, bf16 cannot hold the
    # longest request, so it is left out with the reason, as a dtype that holds not even the mean one is
    from kvplan.deployment import deployments
    from kvplan.errors import KvplanError
    from kvplan.plan.throughput import throughput_of

    args = DeploymentArgs(model="llama-3.1-70b", gpu="h100", tp=2, max_model_len=16_000)
    ds = deployments(args, ["fp8", "auto"], needs_memory=True)
    r = throughput_of(ds, 7000, 10, [1], num_prompts=20, random_range_ratio=0.5)
    assert {x.kv_cache_dtype for x in r.rows} == {"fp8"}
    assert any(n.startswith("auto:") and "9,184 tokens" in n for n in r.notes)
    with pytest.raises(KvplanError, match="9,184 tokens"):
        throughput_of(ds[1:], 7000, 10, [1], num_prompts=20, random_range_ratio=0.5)
