"""`kvplan quality --synthetic`: keys, values and queries drawn with the structure the literature reports for real
models, stored in each format, and the tensor-level errors: of the keys, of the values, and of causal attention over
them. A proxy for where a format loses precision, never a verdict on a model: real caches differ per model, layer
and head, and only a model run (kvplan quality MODEL) measures what the errors do to its predictions.

Each parameter stands beside its source; those marked as assumptions are kvplan's, chosen to show the structure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from kvplan.specs.kv_formats import KVFormat

_OUTLIERS = "KIVI (arXiv:2402.02750), KVQuant (arXiv:2401.18079): persistent per-channel key outliers"
PARAMETERS = (
    # (name, value, source)
    ("outlier key channels per head", 4, _OUTLIERS + ", the same few channels for every token"),
    ("outlier channel magnitude", "10x to 20x the others",
     "the rotation argument behind vLLM's int4 and TurboQuant keys: 'one coordinate ... 20x the others'"),
    ("RoPE base", 10000.0, "keys cached after RoPE, which mixes channel pairs by position (KVQuant); Llama's base"),
    ("value magnitude per token", "log-normal, sigma 0.5",
     "values vary token to token more than channel to channel (KIVI)"),
    ("outlier value tokens", "1% of tokens, 10x", "an assumption of kvplan's"),
    ("attention sink", "token 0, logit +5 for every query, value 0.1x", "an assumption of kvplan's"),
)
PROXY_NOTE = ("synthetic K/V: a proxy for where each format loses precision, not a verdict on any model; run "
              "`kvplan quality MODEL --text FILE` to measure a model")


@dataclass
class SyntheticRow:
    kv_cache_dtype: str
    bits_per_element: float
    capacity_gain: Optional[float]
    key_rel_error: float
    value_rel_error: float
    attention_rel_error: float


@dataclass
class SyntheticResult:
    tokens: int
    head_dim: int
    kv_heads: int
    heads: int
    queries: int
    device: str
    model: Optional[str]
    rows: list[SyntheticRow]
    parameters: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    proxy: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def draw(tokens: int, kv_heads: int, heads: int, d: int, seed: int = 0, device: str = "cpu"):
    """(q [queries, heads, d] at the last positions, k and v [tokens, kv_heads, d], the queries' positions)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    # keys: unit channels, and a few per head far larger, with a sign and size of their own that every token shares
    scale = torch.ones(kv_heads, d)
    chans = torch.stack([torch.randperm(d, generator=g)[:4] for _ in range(kv_heads)])
    big = 10 + 10 * torch.rand(kv_heads, 4, generator=g)
    sign = torch.where(torch.rand(kv_heads, 4, generator=g) < 0.5, -1.0, 1.0)
    k = randn(tokens, kv_heads, d)
    for h in range(kv_heads):
        k[:, h, chans[h]] = (sign[h] * big[h]) * (1 + 0.3 * k[:, h, chans[h]])
        scale[h, chans[h]] = big[h]
    queries = min(tokens, 256)
    pos = torch.arange(tokens - queries, tokens)
    q = randn(queries, heads, d)
    k, q = _rope(k, torch.arange(tokens)), _rope(q, pos)
    # the sink: token 0's key and every query share a direction u, worth 5 on the scaled logit
    u = randn(d)
    u = u / u.norm()
    amp = math.sqrt(5 * math.sqrt(d))
    k[0] += amp * u
    q += amp * u
    v = randn(tokens, kv_heads, d) * torch.exp(0.5 * randn(tokens, 1, 1))
    outliers = torch.randperm(tokens, generator=g)[:max(1, tokens // 100)]
    v[outliers] *= 10
    v[0] *= 0.1
    return q.to(device), k.to(device), v.to(device), pos.to(device)


def _rope(x, positions, base: float = 10000.0):
    """Rotary embedding in Llama's layout: channel i turns with channel i + d/2 by position x base^(-2i/d)."""
    import torch

    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d // 2, dtype=torch.float32) * 2 / d)
    angle = positions[:, None].float() * inv[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1)[:, None, :], torch.cat([angle.sin()] * 2, -1)[:, None, :]
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def attention(q, k, v, allowed):
    """Softmax attention of queries [n_q, heads, d] over keys and values [n, kv_heads, d], each query over the
    tokens `allowed` [n_q, n] marks (grouped-query heads share their KV head), fp32."""
    import torch

    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)
    vv = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,nhd->hqn", q.float(), kk) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqn,nhd->qhd", scores.softmax(-1), vv)


def read_back(q, store, positions):
    """Attention of the queries over what `store` holds, each query at its position reading the cache as decoding
    it would (a residual window: the newest tokens as written)."""
    import torch

    if store.windowed:
        both = torch.cat([store.keys, store.raw_keys]), torch.cat([store.values, store.raw_values])
        return attention(q, *both, store.read_mask(q.shape[0]))
    return attention(q, store.keys, store.values, _causal(positions, store.keys.shape[0]))


def _causal(positions, n: int):
    import torch

    return torch.arange(n, device=positions.device)[None, :] <= positions[:, None]


def run_synthetic(formats: list[KVFormat], tokens: int = 4096, head_dim: int = 128, kv_heads: int = 8,
                  heads: int = 32, device: str = "cpu", model=None, seed: int = 0) -> SyntheticResult:
    """Each format's errors (names or KVFormats) on one draw of synthetic K/V, the same draw for every format.
    `model`: a ModelSpec whose shapes are drawn, for the capacity gains too."""
    from kvplan.quality.formats import check_format, layer_store
    from kvplan.quality.metrics import relative_error
    from kvplan.quality.run import CHUNK_TOKENS, capacity
    from kvplan.specs.kv_evidence import evidence_for
    from kvplan.specs.kv_formats import kv_format

    formats = [kv_format(f) if isinstance(f, str) else f for f in formats]
    for f in formats:
        check_format(f, head_dim)
    q, k, v, pos = draw(tokens, kv_heads, heads, head_dim, seed, device)
    exact = attention(q, k, v, _causal(pos, tokens))
    rows = []
    for f in formats:
        store = layer_store(f, head_dim)
        for start in range(0, tokens, CHUNK_TOKENS):  # written as a prefill writes it, chunk by chunk
            store.append(k[start:start + CHUNK_TOKENS], v[start:start + CHUNK_TOKENS])
        gain = capacity(model, f, None)[0] if model is not None else None
        rows.append(SyntheticRow(f.name, round(f.bits_per_element(head_dim), 4), gain,
                                 relative_error(store.keys, k), relative_error(store.values, v),
                                 relative_error(read_back(q, store, pos), exact)))
    params = [{"name": n, "value": val, "source": src} for n, val, src in PARAMETERS]
    return SyntheticResult(tokens, head_dim, kv_heads, heads, q.shape[0], device,
                           getattr(model, "name", None), rows, params, [PROXY_NOTE],
                           {f.name: [asdict(e) for e in evidence_for(f.name)] for f in formats})
