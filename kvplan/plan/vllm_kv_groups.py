"""vLLM's KV-cache groups: how its KV-cache manager turns a rank's layer caches into pages, groups of layers and
blocks of one shared pool (0.30 and later), and how many blocks a request takes in each group. Pure functions."""

from __future__ import annotations

import math
from typing import Literal, Optional, Sequence

from kvplan.errors import KvplanError
from kvplan.sizing.kv_cache import LayerKV
from kvplan.values import frozen_dataclass
from kvplan.xp import SCALAR


@frozen_dataclass
class _LayerSpec:
    """A layer as vLLM's KV-cache manager sees it: its attention type, how many tokens one block of it holds,
    and the bytes of that block (its page)."""

    kind: Literal["full", "sliding", "chunked", "state"]
    window: Optional[int]  # a sliding layer's window, a chunked layer's chunk
    tokens_per_block: int
    page_bytes: int
    state_blocks: int = 1  # a state layer's pages per request (VllmRules.state_pages: 1, 2 or 3)


def _blocks_per_request(spec: _LayerSpec, max_model_len, in_flight: int, xp=SCALAR, dcp: int = 1):
    if spec.kind == "state":  # MambaSpec: the sequence's state, whatever its length
        return spec.state_blocks + 0 * max_model_len
    if spec.kind == "full":
        # decode-context parallelism spreads each sequence's tokens over dcp ranks
        length = max_model_len if dcp == 1 else xp.ceil(max_model_len / dcp)
        return xp.ceil(length / spec.tokens_per_block)
    if spec.kind == "chunked":  # ChunkedLocalAttentionSpec: one chunk plus the tokens in flight
        return xp.ceil(xp.minimum(spec.window + in_flight, max_model_len) / spec.tokens_per_block)
    # SlidingWindowSpec: the window, plus the tokens in flight, plus one block because the window may start mid-block
    tokens = xp.minimum(spec.window - 1 + in_flight, max_model_len)
    return xp.ceil(tokens / spec.tokens_per_block) + 1


@frozen_dataclass
class KVCacheGroups:
    bytes_per_block: int
    num_groups: int
    padding_layers: int
    groups: tuple[tuple[_LayerSpec, int], ...]  # (spec, number of groups of this spec)
    group_size: int
    block_size: int  # tokens per block of the format's own layers (raised when skip layers need it)
    layer_specs: tuple[_LayerSpec, ...]

    def blocks_per_request(self, max_model_len, in_flight: int, xp=SCALAR, dcp: int = 1):
        # one group: every layer has the same attention type and block, so any layer's count is the group's
        return sum(n * _blocks_per_request(s, max_model_len, in_flight, xp, dcp) for s, n in self.groups)


def one_state_shape(model) -> None:
    """Refuse a model whose state layers use different mixers: vLLM sizes one state shape per model (the model
    class's get_mamba_state_shape_from_config, from which HybridAttentionMambaModelConfig pads every state page
    alike), so how it would page several is not known."""
    if len(model.state_mixers) > 1:
        kinds = ", ".join(st.label if st.label != "state" else st.kind for st in model.state_mixers)
        raise KvplanError(f"{model.name}'s state layers use {len(model.state_mixers)} different mixers ({kinds}): "
                          f"vLLM pages one state shape per model, so kvplan plans no vLLM pool for it (its weights, "
                          f"state bytes and crossover are still priced)")


def state_pages(rules, model, gpu) -> int:
    """The pages a request holds in each of `model`'s state groups under `rules` (VllmRules.state_pages)."""
    one_state_shape(model)
    st = model.state_mixers[0] if model.state_mixers else None
    return rules.state_pages(st.kind if st else "", not model.attention_layers,
                             gpu.compute_capability if gpu else None, st.state_size if st else 0)


def hybrid_state_groups(layers: Sequence[LayerKV], block_size: int, align: int, state_blocks: int,
                        max_model_len: int = 0) -> KVCacheGroups:
    """vLLM's pages and groups for attention beside fixed-state layers (Mamba, gated delta net): the attention block
    grows to B = align x cdiv(state page, align x attention bytes per token) tokens so that one attention page holds a
    state page, and the state page is padded to it (models/config.py HybridAttentionMambaModelConfig); then layers of
    each kind are bucketed, group_size = the larger count if it is below 1.5x the smaller, else the smaller, each
    kind in cdiv(count, group_size) groups, and every block of the shared pool holds one page of each layer of a
    group (kv_cache_utils). A request needs cdiv(max_model_len, B) blocks per attention group and `state_blocks` per
    state group."""
    attn = [lay for lay in layers if lay.kind != "state"]
    state = [lay for lay in layers if lay.kind == "state"]
    if not attn:  # attention-free: one group of every state layer; a MambaSpec block spans max_model_len tokens
        page = max(lay.fixed_bytes for lay in state)
        spec = _LayerSpec("state", None, max_model_len, page, state_blocks)
        return KVCacheGroups(len(state) * page, 1, 0, ((spec, 1),), len(state), max_model_len,
                             tuple(spec for _ in state))
    per_token = max(lay.bytes_per_token for lay in attn)
    if len({lay.bytes_per_token for lay in attn}) > 1 or any(lay.kind != "full" for lay in attn):
        raise KvplanError("a hybrid of fixed-state layers with sliding-window or mixed-size attention layers is not "
                          "modelled yet; plan it without --kv-cache-dtype-skip-layers")
    state_page = max(lay.fixed_bytes for lay in state)
    block = max(block_size, align * math.ceil(state_page / (align * per_token)))
    page = math.ceil(block * per_token)
    specs = [_LayerSpec("full", None, block, page) for _ in attn] + \
        [_LayerSpec("state", None, block, page, state_blocks) for _ in state]
    lo, hi = sorted((len(attn), len(state)))
    group_size = hi if hi < 1.5 * lo else lo
    groups = ((specs[0], math.ceil(len(attn) / group_size)), (specs[-1], math.ceil(len(state) / group_size)))
    num_groups = sum(n for _, n in groups)
    return KVCacheGroups(group_size * page, num_groups, num_groups * group_size - len(specs), groups, group_size,
                         block, tuple(specs))


def _approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """vLLM's chunk size with the least upward padding over `values` (ties: the larger), tried from lower_bound up to
    the largest value (kv_cache_planning._approximate_gcd)."""
    best, best_pad = lower_bound, None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def packed_kv_cache_groups(layers: Sequence[LayerKV]) -> KVCacheGroups:
    """vLLM 0.33's groups for caches whose pages differ and are packed side by side in each block (the block-outermost
    layout a DeepSeek-V4 backend declares; kv_cache_planning._get_packed_kv_cache_groups):

    * caches are bucketed by type: the same tokens per block, and full attention or one sliding window;
    * a bucket is balanced when it holds as many caches of each page size; the largest balanced bucket of several page
      sizes sets the fewest pattern repeats a group may hold, and the repeats per group are the number from there up
      that pads the balanced buckets' counts least; a balanced bucket splits into cdiv(count, repeats) groups (caches
      [i::n] of it), any other bucket is one group;
    * every block of the shared pool holds one page of each cache of the widest group, so a block is the largest sum
      of pages over the groups, and a request takes blocks in every group by that group's rule."""
    specs = [_LayerSpec("sliding" if lay.kind == "sliding" else "full", lay.window if lay.kind == "sliding" else None,
                        lay.block_tokens, lay.own_page_bytes) for lay in layers]
    buckets: dict[tuple, list[_LayerSpec]] = {}
    for sp in specs:
        buckets.setdefault((sp.kind, sp.window, sp.tokens_per_block), []).append(sp)
    bucketed = []
    for members in buckets.values():
        by_page: dict[int, list[_LayerSpec]] = {}
        for sp in members:
            by_page.setdefault(sp.page_bytes, []).append(sp)
        most = max(len(v) for v in by_page.values())
        bucketed.append((members, by_page, most, len({len(v) for v in by_page.values()}) == 1))
    least = max((most for _, by_page, most, balanced in bucketed if balanced and len(by_page) > 1), default=0)
    repeats = _approximate_gcd([most for *_, most, balanced in bucketed if balanced], least) if least else None
    groups: list[list[_LayerSpec]] = []
    for members, by_page, most, balanced in bucketed:
        n = -(-most // repeats) if balanced and repeats else 1
        if repeats is None and members[0].kind == "sliding" and len(bucketed) > 1:
            raise KvplanError("vLLM packs sliding-window caches of this layout by a rule kvplan does not model")
        if n == 1:
            groups.append(members)
            continue
        pattern = list(zip(*by_page.values(), strict=True))
        groups += [[sp for rep in pattern[i::n] for sp in rep] for i in range(n)]
    per_group = [sum(sp.page_bytes for sp in g) for g in groups]
    counted: dict[_LayerSpec, int] = {}
    for g in groups:  # a group's caches share one type, so any of them counts its blocks per request
        rep = _LayerSpec(g[0].kind, g[0].window, g[0].tokens_per_block, max(sp.page_bytes for sp in g))
        counted[rep] = counted.get(rep, 0) + 1
    growing = [sp.tokens_per_block for sp in specs if sp.kind == "full"] or [specs[0].tokens_per_block]
    return KVCacheGroups(max(per_group), len(groups), 0, tuple(counted.items()), 1, max(growing), tuple(specs))


def kv_cache_groups(layers: Sequence[LayerKV], block_size: int, primary_format: Optional[str] = None,
                    raise_block_for_skip_layers: bool = True) -> KVCacheGroups:
    """vLLM's pages and KV-cache groups (0.30+: platforms' _align_heterogeneous_kv_block_size, then
    kv_cache_planning.get_kv_cache_groups).

    Skip layers: when some layers keep the model dtype (more bytes per token than the format's layers), vLLM raises
    the block size to block_size x cdiv(skip bytes per token, format bytes per token), so that the format's page
    (new block size x its bytes per token) holds at least one kernel block of a skip layer. Full-attention skip
    layers keep that many tokens per block at their own size; sliding-window skip layers are padded to the shared
    page and hold the largest multiple of block_size tokens that fits.
    Chunked-local layers (Llama 4) are a type of their own: vLLM keeps its hybrid manager on for them
    (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 1 in envs.py, 0.19 to 0.33), and a request holds
    at most one chunk plus the tokens in flight of such a layer.
    One attention type: a single group, a block spans every layer. Several types (sliding + full): pages are made
    equal (scaled when one divides the other, padded otherwise), layers are split into groups of `group_size`
    layers of one type, short groups are padded, and every block of the shared pool holds one page of each layer of
    a group.
    """
    primary = [lay.bytes_per_token for lay in layers if lay.format == primary_format] or [layers[0].bytes_per_token]
    primary_1tok = max(primary)
    largest = max(lay.bytes_per_token for lay in layers)
    raise_block = raise_block_for_skip_layers and largest > primary_1tok
    block = block_size * math.ceil(largest / primary_1tok) if raise_block else block_size
    shared_page = math.ceil(block * primary_1tok)
    specs = []
    for lay in layers:
        kind = lay.kind if lay.kind in ("sliding", "chunked") else "full"
        window = lay.window if kind != "full" else None
        if lay.bytes_per_token <= primary_1tok or kind == "full" or not raise_block:
            specs.append(_LayerSpec(kind, window, block, math.ceil(block * lay.bytes_per_token)))
        else:
            fits = block_size * max(1, int(shared_page // (block_size * lay.bytes_per_token)))
            specs.append(_LayerSpec(kind, window, fits, shared_page))
    if len({(s.kind, s.window) for s in specs}) == 1:
        # UniformTypeKVCacheSpecs: one group; a block holds one page of every layer, whatever their sizes
        return KVCacheGroups(sum(s.page_bytes for s in specs), 1, 0, ((specs[0], 1),), len(specs), block,
                             tuple(specs))
    # Hybrid: one page size for every group (unify_kv_cache_spec_page_size)
    max_page = max(s.page_bytes for s in specs)
    unified = []
    for s in specs:
        if s.page_bytes == max_page:
            unified.append(s)
        elif max_page % s.page_bytes == 0:  # a larger block of the same layer fills the page exactly
            unified.append(_LayerSpec(s.kind, s.window, s.tokens_per_block * (max_page // s.page_bytes), max_page))
        else:  # padded: the same tokens in a larger page
            unified.append(_LayerSpec(s.kind, s.window, s.tokens_per_block, max_page))
    counts: dict[_LayerSpec, int] = {}
    for s in unified:
        counts[s] = counts.get(s, 0) + 1
    lo, hi = min(counts.values()), max(counts.values())
    group_size = hi if hi < 1.5 * lo else lo
    groups = tuple((s, math.ceil(n / group_size)) for s, n in counts.items())
    num_groups = sum(n for _, n in groups)
    return KVCacheGroups(group_size * max_page, num_groups, num_groups * group_size - len(unified), groups,
                         group_size, min(s.tokens_per_block for s in unified), tuple(unified))
