"""How many routed experts a MoE layer's tokens touch, under a router whose expert popularity follows a power law.

Real routers are skewed: a few experts take a large share of the tokens and many take few, so a batch touches fewer
distinct experts than uniform routing would (less weight traffic at decode batches of tens to hundreds of tokens).
kvplan takes the skew of NVIDIA AIConfigurator's timings of vLLM's fused-MoE kernel under routed workloads:
expert i of E (by popularity) is picked with probability proportional to i^-alpha, alpha = 1.01, the
`power_law_1.01` distribution of its moe_perf tables, the one it predicts DeepSeek-family serving with
(aiconfigurator_core/sdk/models/deepseek.py: _power_law_alpha). kvplan's fused-MoE fits are fitted on those rows
(benchmarks/fit_step_profiles.py), and the step model prices a step with the same count, so the two agree.

A token picks k distinct experts; expert i is among them with probability q_i = min(1, k p_i), p_i = i^-alpha /
sum_j j^-alpha (the top experts, whose k p_i reaches 1, are in nearly every token's pick). T tokens touch
sum_i 1 - (1 - q_i)^T experts in expectation; alpha = 0 gives uniform routing's E (1 - (1 - k/E)^T).
"""

from __future__ import annotations

from functools import lru_cache

ROUTING_ALPHA = 1.01


@lru_cache(maxsize=None)
def _probabilities(e: int, k: int, alpha: float) -> tuple:
    w = [i ** -alpha for i in range(1, e + 1)]
    s = sum(w)
    return tuple(min(1.0, k * x / s) for x in w)


def _exact(q: tuple, tokens: float) -> float:
    return sum(1.0 - (1.0 - x) ** tokens for x in q)


def experts_touched(e: int, k: int, tokens, alpha: float = ROUTING_ALPHA):
    """Expected distinct experts of `e` that `tokens` tokens, each routed to `k` of them, touch: a float for a
    number, an array for a numpy array (each distinct count computed once, exactly as for a number)."""
    if alpha == 0:
        return e * (1.0 - (1.0 - k / e) ** tokens)
    q = _probabilities(e, k, alpha)
    if isinstance(tokens, (int, float)):
        return _exact(q, tokens)
    import numpy as np

    t = np.asarray(tokens, dtype=np.float64)
    values, where = np.unique(t, return_inverse=True)
    qa = np.asarray(q)
    out = np.empty(values.shape)
    for i in range(0, values.size, 1024):  # at most 1,024 x E terms at once
        v = values[i:i + 1024]
        out[i:i + 1024] = (1.0 - (1.0 - qa[None, :]) ** v[:, None]).sum(axis=1)
    return out[where].reshape(t.shape)
