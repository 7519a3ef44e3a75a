"""Each engine's scheduling policy for one step of the simulated benchmark (kvplan.plan.serving.simulate): what it
works within (EngineLimits), vLLM V1's running-first token budget with block-granular admission and preemption, and
SGLang's separate prefill and decode batches with its output reservation. The rules modelled, with their sources, are
listed in kvplan.plan.serving's docstring."""

from __future__ import annotations

from collections import deque
from typing import Callable, Literal

from kvplan.search import last_true
from kvplan.values import frozen_dataclass

Policy = Literal["vllm", "sglang"]
# SGLang's output reservation (sglang 0.5.9 srt/environ.py, managers/scheduler.py Scheduler.__init__ and
# update_running_batch): new_token_ratio starts at SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness (1.0), and
# each decode batch lowers it by (init - min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS down to
# init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR; a retraction resets it (ScheduleBatch.retract_decode)
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO = 0.7 * 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY = (SGLANG_INIT_NEW_TOKEN_RATIO - SGLANG_MIN_NEW_TOKEN_RATIO) / 600
SGLANG_RETRACT_DECODE_STEPS = 20
SGLANG_CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py CLIP_MAX_NEW_TOKENS: the most output tokens one reserves


@frozen_dataclass
class EngineLimits:
    """What the scheduler works within: the per-step token budget, the most requests running at once, and the KV
    pool, as whole blocks (vLLM) or tokens (SGLang), with the blocks a request holding n tokens needs."""

    policy: Policy
    token_budget: int  # vLLM max_num_batched_tokens; SGLang chunked_prefill_size
    max_seqs: int  # vLLM max_num_seqs; SGLang max_running_requests
    blocks: int  # usable KV blocks (vLLM's, less its null block) or pool tokens (SGLang)
    blocks_for: Callable  # tokens held (a numpy array) -> blocks needed (numpy array)
    # steps a request sent while the engine runs waits beyond the running step before it can be scheduled
    admit_delay: int = 0
    # SGLang's --enable-mixed-chunk: a prefill step also decodes the running requests, its chunk smaller by them
    mixed_chunk: bool = False
    # SGLang's --max-prefill-tokens: the prompt tokens one prefill batch takes beyond its first request (0: no cap)
    input_budget: int = 0
    # vLLM's --scheduler-reserve-full-isl: a waiting request is admitted only when the free blocks hold its whole
    # prompt, not just its first chunk
    reserve_full_prompt: bool = False
    # other data-parallel ranks stepping in lockstep with this one (vLLM's DPEngineCoreProc, SGLang's attention
    # groups): each step lasts as long as the slowest rank's, so a rank's decode steps also wait out the others'
    # prompt chunks, as often as its own come (the ranks are alike)
    lockstep: int = 0


def schedule_vllm(running: list, waiting: deque, prompt_len, computed, outputs, held, free: int,
                   limits: EngineLimits, table, in_len, capped: set, eligible=None, step: int = 0):
    """One step of vLLM V1's scheduler (see the module's docstring): the running requests' tokens, preempting the
    newest where the blocks run out, then waiting requests FCFS. Updates the requests' blocks, the running list and
    the waiting queue in place; returns (the scheduled requests, their tokens), the blocks left free and the count
    preempted."""
    import numpy as np

    budget = limits.token_budget
    preemptions = 0
    preempted = False
    # the running requests in order, each up to what the budget leaves: at once where the free blocks hold
    # every request's next tokens, else one by one, preempting (below)
    ra = np.fromiter(running, dtype=np.int64, count=len(running))
    n_run = len(running)
    held_run, computed_run = held[ra], computed[ra]
    pending = prompt_len[ra] - computed_run
    demand = np.where(pending > 0, pending, 1)
    if int(demand.sum()) <= budget:  # the budget holds every one's tokens
        ks_run = demand
        on = np.ones(n_run, dtype=bool)
        need_run = table[computed_run + demand] - held_run
    else:
        ks_run = np.minimum(np.maximum(budget - (np.cumsum(demand) - demand), 0), demand)
        on = ks_run > 0
        need_run = np.where(on, table[computed_run + ks_run] - held_run, 0)
    need_total = int(need_run.sum())
    if need_total > free:
        # vLLM walks the running requests in order; one whose blocks are not free preempts the newest
        # (from the end) until they are, or preempts itself when it is the newest left. With A_i the
        # blocks the first i+1 need and F_v what is free once the v newest are preempted, request i needs
        # v_i = min{v: F_v >= A_i} victims and is scheduled while v_i leaves it standing (i < n - v_i)
        freed = np.concatenate([[free], free + np.cumsum(held_run[::-1])])
        victims = np.searchsorted(freed, np.cumsum(need_run), side="left")
        standing = np.arange(n_run) < n_run - victims
        stop = int(np.argmin(standing)) if not standing.all() else n_run
        v = n_run - stop if stop < n_run else int(victims[on].max(initial=0))
        for victim in reversed(running[n_run - v:]):  # the newest first, so the oldest ends up in front
            waiting.appendleft(victim)
        out = ra[n_run - v:]
        free += int(held[out].sum())
        held[out] = 0
        computed[out] = 0
        prompt_len[out] = in_len[out] + outputs[out]
        del running[n_run - v:]
        preemptions += v
        preempted = v > 0
        keep = np.arange(n_run) < n_run - v
        on &= keep
        need_run = np.where(keep, need_run, 0)
        ks_run = np.where(keep, ks_run, 0)
        need_total = int(need_run.sum())
    sched_r, sched_k = [ra[on]], [ks_run[on]]
    held[ra] += need_run
    free -= need_total
    budget -= int(ks_run.sum())
    while not preempted and waiting and budget > 0:
        if len(running) >= limits.max_seqs:
            capped.add("max_num_seqs")
            break
        r = waiting[0]
        if eligible is not None and eligible[r] > step:  # not arrived yet, as the scheduler sees it
            break
        k = min(int(prompt_len[r] - computed[r]), budget)
        need = int(table[computed[r] + k]) - held[r]
        # admitted only where the free blocks hold its whole prompt (and the tokens a preempted request had
        # generated), not just this chunk: --scheduler-reserve-full-isl, on by default from 0.19 to 0.33
        # (v1/core/sched/scheduler.py, KVCacheManager.can_fit_full_sequence)
        if (int(table[prompt_len[r]]) - held[r] if limits.reserve_full_prompt else need) > free:
            capped.add("kv pool")
            break
        waiting.popleft()
        running.append(r)
        sched_r.append(np.array([r]))
        sched_k.append(np.array([k]))
        free -= need
        held[r] += need
        budget -= k
    return sched_r, sched_k, free, preemptions


def schedule_sglang(running: list, waiting: deque, prompt_len, computed, outputs, out_len,
                     limits: EngineLimits, capped: set, ratio: float, full: bool, in_len):
    """One step of SGLang's scheduler (see the module's docstring): a prefill batch where one can be admitted, else a
    decode batch of every running request, retracting where the pool cannot hold their next tokens; with mixed
    chunks (--enable-mixed-chunk), the prefill batch decodes the running requests too, its chunk budget less one
    token for each (sglang 0.5.6 managers/scheduler.py get_new_batch_prefill: mix_with_running, PrefillAdder's
    mixed_with_decode_tokens). A prefill batch refused a request (the pool or max_running_requests) while requests
    ran marks the running batch full, and no prefill is tried again until it shrinks (a request finishing or
    retracted) or a prompt is part-way (get_new_batch_prefill: batch_is_full; a refusal while none ran is lost
    when the prefill batch becomes the running batch, get_next_batch_to_run, as it is after a mixed one). Returns (the scheduled requests, their
    tokens), the new new_token_ratio and batch_is_full, and the count retracted."""
    import numpy as np

    sched: dict[int, int] = {}
    decoding = [r for r in running if computed[r] >= prompt_len[r]]
    mixed = len(decoding) if limits.mixed_chunk else 0
    inputs = limits.input_budget - mixed if limits.input_budget else None
    chunked = len(decoding) < len(running)
    prefill, cap = [], None
    if waiting and not full or chunked:
        prefill, cap = _sglang_prefill(waiting, running, prompt_len, computed, outputs, out_len, limits,
                                       limits.token_budget - mixed, inputs, ratio)
    if cap:
        capped.add(cap)
        # (with mixed chunks the running batch's requests join the prefill batch, which becomes the running batch)
        full = full or (bool(decoding) and not (limits.mixed_chunk and prefill))
    retracted = 0
    if prefill:
        for r, k in prefill:
            sched[r] = k
            if r not in running:
                running.append(r)
                waiting.remove(r)
    elif decoding:  # a decode batch (Scheduler.update_running_batch)
        free = limits.blocks - int(computed[running].sum())
        if free < len(decoding):  # check_decode_mem fails: retract_decode
            # (most outputs first, then the shorter prompt: alike here; the sort keeps the running order of ties)
            keep = sorted(decoding, key=lambda r: int(outputs[r]), reverse=True)
            while len(keep) > 1 and (not retracted or free < len(keep)):
                r = keep.pop()
                free += int(computed[r])
                computed[r] = 0
                prompt_len[r] = in_len[r] + outputs[r]
                running.remove(r)
                waiting.append(r)
                retracted += 1
            full = False
            decoding = keep
            ratio = min(1.0, (int(outputs[keep].sum()) + SGLANG_RETRACT_DECODE_STEPS * len(keep))
                        / (int(out_len[keep].sum()) + 1))
            capped.add("kv pool")
        else:
            ratio = max(ratio - SGLANG_NEW_TOKEN_RATIO_DECAY, SGLANG_MIN_NEW_TOKEN_RATIO)
    if not prefill or limits.mixed_chunk:
        for r in decoding:
            sched[r] = 1
    return ([np.fromiter(sched, dtype=np.int64, count=len(sched))],
            [np.fromiter(sched.values(), dtype=np.int64, count=len(sched))], ratio, full, retracted)


def steps_with_blocks(table, tokens, held, free: int, k: int) -> int:
    """The most decode steps, up to k, that the free blocks carry every decoding request through (`table`: the
    blocks a request holding n tokens needs, by n)."""
    def fits(j: int) -> bool:
        return int((table[tokens + j] - held).sum()) <= free

    if fits(k):
        return k
    return max(1, last_true(fits, 0, k))  # (0 steps always fit)


def _sglang_prefill(waiting, running, prompt_len, computed, outputs, out_len, limits, budget, inputs=None,
                    ratio: float = SGLANG_INIT_NEW_TOKEN_RATIO):
    """SGLang's next prefill batch, and what stopped it short (None, "kv pool", "max_num_seqs"): a request part-way
    through its prompt first, then waiting ones (FCFS) while chunked_prefill_size (`budget`), max_prefill_tokens
    (`inputs`: a request beyond the batch's first whose prompt left is as large stays waiting), max_running_requests
    and the token pool admit them (PrefillAdder: rem_total_tokens, the free pool less the running requests'
    expected output, `ratio` x what is left of it up to CLIP_MAX_NEW_TOKENS, less what the batch's requests took:
    their prompt tokens and output up to CLIP_MAX_NEW_TOKENS; a request is admitted while its prompt left and that
    output are below it)."""
    clip = SGLANG_CLIP_MAX_NEW_TOKENS
    batch = []
    held = sum(int(computed[r]) for r in running)
    expected = ratio * sum(min(int(out_len[r] - outputs[r]), clip) for r in running)
    room = limits.blocks - held - expected
    for r in [r for r in running if computed[r] < prompt_len[r]]:
        k = min(int(prompt_len[r] - computed[r]), budget)
        if k <= 0:  # (mixed chunks: the running requests' decodes took the budget)
            break
        batch.append((r, k))
        budget -= k
        room -= k
        if inputs is not None:
            inputs -= k
    cap = None
    for r in list(waiting):
        if budget <= 0 or (inputs is not None and inputs <= 0):
            break
        if inputs is not None and batch and int(prompt_len[r] - computed[r]) >= inputs:
            break
        if len(running) + len(batch) >= limits.max_seqs:
            cap = "max_num_seqs"
            break
        out_left = min(int(out_len[r] - outputs[r]), clip)
        if int(prompt_len[r] - computed[r]) + out_left >= room:
            cap = "kv pool"
            break
        k = min(int(prompt_len[r] - computed[r]), budget)
        batch.append((r, k))
        room -= k + (out_left if k == int(prompt_len[r] - computed[r]) else 0)
        budget -= k
        if inputs is not None:
            inputs -= k
    return batch, cap
