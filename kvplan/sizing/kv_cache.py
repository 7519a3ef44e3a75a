"""The analytic engine: pure functions of specs and options. No I/O, no printing.

Everything is per tensor-parallel rank: the weights one GPU holds and streams, the KV heads it stores, the pool it
carves out of its own memory.

Conventions
-----------
* Weight read per decode step (`weight_read`):
  - "streamed" (default): what a step really streams: every decoder layer and the LM head in full, the routed
    experts its tokens touch, and only the gathered rows of an untied input embedding (one row per sequence).
    Weights that decode never reads (a vision tower) are held but not read.
  - "all": every parameter once, the convention of the back-of-envelope crossover arithmetic.
* MoE routing: each of the batch's tokens picks `experts_per_token` distinct experts uniformly and independently,
  so a layer touches E * (1 - (1 - k/E)^B) experts in expectation. Real routers are skewed and touch fewer, so
  this is an upper bound on expert traffic.
* KV read per step: a full-attention layer reads every cached token of every sequence; a sliding-window layer at
  most its window; a chunked-local layer at most its chunk (the last step of a chunk, the worst case).
* Crossover N*: the number of cached tokens of one sequence (batch 1) at which the step's KV read equals its
  weight read. With sliding-window layers the KV read grows more slowly past the window; when every layer slides,
  the KV read stops growing at the window and N* may not exist: then `crossover_batch` says how many sequences of
  at least one window each it takes for the KV pile to reach the weight pile.
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence

from kvplan.errors import KvplanError
from kvplan.memo import per_spec
from kvplan.sizing.model_tensors import VOCAB_PADDING, model_tensors, padded_vocab
from kvplan.sizing.weight_formats import gemm_family
from kvplan.sizing.weights import WeightBytes
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.kv_formats import KVFormat, kv_format, whole
from kvplan.specs.layers import AttentionMixer
from kvplan.values import frozen_dataclass
from kvplan.xp import SCALAR

WeightRead = Literal["streamed", "all"]



# ----------------------------------------------------------------------------------------------------------------
# Parallelism


def check_tp(model: ModelSpec, tp: int) -> None:
    """vLLM's rules, in the order its workers meet them: the vocabulary (padded to 64 rows) splits evenly across the
    ranks (VocabParallelEmbedding is built first), TP divides the attention heads, and the KV heads divide TP or TP
    divides them."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise KvplanError(f"--tp must be at least 1, got {tp}")
    ok = [t for t in range(1, 65) if _tp_ok(model, t) and _vocab_ok(model, t)]
    if not _vocab_ok(model, tp):
        rows = padded_vocab(model.vocab_size)
        raise KvplanError(
            f"--tp {tp} does not divide {model.name}'s vocabulary of {rows:,} rows (padded to a multiple of "
            f"{VOCAB_PADDING}): vLLM's workers stop with '{rows} is not divisible by {tp}'; "
            f"valid: {', '.join(map(str, ok[:12]))}")
    if not model.attention_layers and model.state_mixers:  # attention-free: the mixers' channels split
        for st in model.state_mixers:
            split, unit = st.tp_split()
            if split % tp:
                raise KvplanError(f"--tp {tp} does not split {model.name}'s {split:,} {unit} evenly")
        return
    if not _tp_ok(model, tp):
        kv = "" if model.is_mla else f" and {'/'.join(map(str, model.attention_kv_heads))} KV heads"
        raise KvplanError(
            f"--tp {tp} does not split {model.name}'s {model.num_heads} attention heads{kv} the way vLLM requires "
            f"(heads % tp == 0, and kv_heads % tp == 0 or tp % kv_heads == 0); valid: {', '.join(map(str, ok[:12]))}"
        )


def _vocab_ok(model: ModelSpec, tp: int) -> bool:
    return padded_vocab(model.vocab_size) % tp == 0


def _tp_ok(model: ModelSpec, tp: int) -> bool:
    if model.num_heads % tp:
        return False
    if model.is_mla:
        return True
    return all(kv % tp == 0 or tp % kv == 0 for kv in model.attention_kv_heads)


def kv_heads_per_rank(model: ModelSpec, tp: int, layer: Optional[int] = None) -> int:
    """vLLM replicates KV heads when TP exceeds them; the MLA latent is one 'head', whole on every rank. With
    `layer`, that layer's heads (where layers differ)."""
    return _attention_of(model, layer).kv_heads_per_rank(tp)


def _attention_of(model: ModelSpec, layer: Optional[int]) -> AttentionMixer:
    """Layer `layer`'s attention (the model's num_kv_heads and head_dim where `layer` is None)."""
    if layer is None:
        return model.base_attention
    a = model.layers[layer].attention
    return a if a is not None else model._attention_mixer("full", model.layer_kv_heads(layer),
                                                          model.layer_head_dim(layer))


# ----------------------------------------------------------------------------------------------------------------
# KV bytes per layer


@frozen_dataclass
class LayerKV:
    """What one layer caches per sequence: its kind, window and bytes per token (or per sequence, for a state)."""

    index: int
    kind: str  # full, sliding, chunked, or state (a fixed state per sequence)
    window: Optional[int]  # most tokens of a sequence this layer reads and keeps (None: all of them)
    format: str
    bytes_per_token: float  # this rank, K and V, all of its KV heads
    residual_tokens: int = 0  # newest tokens held in the model dtype instead (KIVI)
    residual_extra_bytes_per_token: float = 0.0  # model-dtype bytes minus format bytes, for those tokens
    fixed_bytes: int = 0  # a state layer's cache per sequence (conv and SSM state), whatever the context
    # A cache whose page vLLM lays out itself (DeepSeek-V4): one stored entry covers entry_tokens tokens in
    # entry_bytes, a block holds block_tokens tokens whatever --block-size says, and the page is padded up to a
    # multiple of page_align bytes. A windowed one of these (kind "sliding") costs nothing per token beyond its
    # window: its window's bytes are fixed_bytes.
    entry_tokens: int = 1
    entry_bytes: int = 0
    block_tokens: int = 0
    page_align: int = 1

    @property
    def own_page_bytes(self) -> int:
        """The page vLLM gives this cache (its spec's block of entries, padded), for a cache with block_tokens."""
        raw = self.block_tokens // self.entry_tokens * self.entry_bytes
        return -(-raw // self.page_align) * self.page_align


SkipLayers = Optional[tuple]  # None: the format's default; ("none",); ("sliding_window",); or layer indices


def parse_skip_layers(value: Optional[str]) -> SkipLayers:
    """--kv-cache-dtype-skip-layers: layer indices ('0,1,30,31'), 'sliding_window', 'none', or None (default)."""
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("none", "sliding_window"):
        return (v,)
    try:
        idx = tuple(sorted({int(p) for p in v.replace(" ", ",").split(",") if p}))
    except ValueError:
        raise KvplanError(
            f"--kv-cache-dtype-skip-layers '{value}': give layer indices (e.g. 0,1,30,31), 'sliding_window' or 'none'"
        ) from None
    return idx


def skipped_layers(model: ModelSpec, fmt: KVFormat, skip: SkipLayers) -> frozenset[int]:
    """Layers kept in the model dtype. vLLM adds the first and last min(2, L // 2) layers for the turboquant presets
    on models without Mamba or linear-attention layers (TurboQuantConfig.get_boundary_skip_layers)."""
    L = model.num_layers
    if skip is None:
        if fmt.default_skip == "boundary" and not model.state_layers:  # "without Mamba or linear-attention layers"
            n = min(2, L // 2)
            return frozenset(list(range(n)) + list(range(L - n, L)))
        return frozenset()
    if skip == ("none",):
        return frozenset()
    if skip == ("sliding_window",):
        return frozenset(i for i, k in enumerate(model.layer_kinds) if k == "sliding")
    bad = [i for i in skip if not 0 <= i < L]
    if bad:
        raise KvplanError(f"--kv-cache-dtype-skip-layers: layer {bad[0]} does not exist; {model.name} has layers 0-{L - 1}")
    return frozenset(skip)


def format_bytes_per_token(model: ModelSpec, fmt: KVFormat, tp: int, layer: Optional[int] = None,
                           v_padded: bool = False) -> float:
    """One layer's KV bytes per token on one rank in `fmt` (layer `layer`'s, where layers differ in KV heads or
    head size): the layer's own (Attention.cache_bytes_per_token), once the format is one the model's attention
    takes. `v_padded`: V padded to the K head size (what vLLM 0.19 does for MiMo-V2-Flash)."""
    _check_format(model, fmt)
    return _attention_of(model, layer).cache_bytes_per_token(fmt, tp, model.dtype, v_padded)


def _check_format(model: ModelSpec, fmt: KVFormat) -> None:
    """A format for MLA's latent refused on a model of KV heads."""
    if fmt.applies_to == "mla" and not model.mla:
        raise KvplanError(f"KV cache dtype '{fmt.name}' applies only to MLA models; {model.name} uses "
                          f"{'multi-query' if model.num_kv_heads == 1 else 'grouped-query'} attention")


@per_spec
def kv_layers(model: ModelSpec, fmt: KVFormat, tp: int = 1, skip: SkipLayers = None,
              ssm_default: Optional[str] = None) -> tuple[LayerKV, ...]:
    auto = kv_format("auto")
    skipped = skipped_layers(model, fmt, skip)
    sized = {}  # (format, attention): bytes per token, for the layers' few shapes

    def per_token(f: KVFormat, a: AttentionMixer) -> float:
        key = (f.name, a)
        if key not in sized:
            _check_format(model, f)
            sized[key] = a.cache_bytes_per_token(f, tp, model.dtype)  # the layer's own (kvplan.specs.layers)
        return sized[key]

    if model.compressed is not None:
        return compressed_kv_layers(model, fmt)
    out = []
    state = {}  # each state mixer's cache per sequence, in its own dtype whatever the KV cache dtype
    for lay in model.layers:
        i, st, a = lay.index, lay.state, lay.attention
        if st is not None:  # a fixed state per sequence
            if id(st) not in state:
                state[id(st)] = sum(st.cache_bytes(tp, model.dtype, ssm_default))
            out.append(LayerKV(i, "state", 0, "state", 0.0, fixed_bytes=state[id(st)]))
            continue
        if a is None:  # an MLP-only block
            continue
        f = auto if i in skipped else fmt
        b = per_token(f, a)
        # the layer reads its read_window (a sparse layer: the tokens its indexer picks), the newest of them in the
        # model dtype where the format keeps a residual window
        extra = (per_token(auto, a) - b) if f.residual_tokens else 0.0
        out.append(LayerKV(i, a.kind, a.read_window, f.name, b, f.residual_tokens, extra))
        if a.indexer_bytes_per_token:  # an indexer's own keys: a second cache of the layer, all of them read
            out.append(LayerKV(i, a.kind, None, "indexer", float(a.indexer_bytes_per_token)))
    return tuple(out)


# DeepSeek-V4 on vLLM (vllm/models/deepseek_v4): the fp8_ds_mla entry is 448 fp8 no-RoPE values, 64 bf16 RoPE values
# and 8 bytes of UE8M0 scales (584 B), in pages padded to 576 B; blocks of 256 tokens for the compressed caches
# (DeepseekV4SparseMLABackend's only kernel block size), 64 for the sliding window (DeepseekV4SWACache), 4 and 8 for
# the ratio-4 and ratio-128 compressor states (CompressorStateCache).
DSV4_ENTRY_BYTES, DSV4_PAGE_ALIGN, DSV4_BLOCK, DSV4_SWA_BLOCK = 584, 576, 256, 64
DSV4_STATE_BLOCK = {4: 4, 128: 8}
DSV4_FORMATS = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")


def compressed_kv_layers(model: ModelSpec, fmt: KVFormat) -> tuple[LayerKV, ...]:
    """DeepSeek-V4's caches per layer as vLLM 0.33 allocates them (every one whole on every TP rank):

    * every layer: the last sliding_window tokens uncompressed, one fp8_ds_mla entry per token
      (DeepseekV4SWACache.get_kv_cache_spec, a SlidingWindowMLASpec);
    * a layer of compress ratio r > 1: one fp8_ds_mla entry per r tokens (DeepseekV4Attention.get_kv_cache_spec, an
      MLAAttentionSpec with tokens_per_state r), and its compressor's unfinished entries: a window of coff x r tokens
      of float32 kv and score rows, 2 x coff x head_dim wide (CompressorStateCache);
    * a ratio-4 layer's lightning indexer: one key per 4 tokens, index_head_dim fp8 values and a float32 scale per
      128 (DeepseekV4IndexerCache), and its compressor's state (2 x 2 x index_head_dim float32 per token, window 8).

    vLLM's FlashMLA backend (the default on Hopper and Blackwell) keeps them in fp8_ds_mla whatever the KV cache
    dtype, and refuses a 16-bit one."""
    if fmt.name not in DSV4_FORMATS:
        raise KvplanError(f"--kv-cache-dtype {fmt.name}: vLLM's FlashMLA backend keeps DeepSeek-V4's caches in "
                          f"fp8_ds_mla only (use auto, fp8 or fp8_ds_mla)")
    a = model.compressed
    assert a is not None
    name, entry = fmt.name, DSV4_ENTRY_BYTES
    index_entry = a.index_head_dim + a.index_head_dim // 128 * 4
    out = []
    for i, r in enumerate(a.compress_ratios):
        if r > 1:
            out.append(LayerKV(i, "full", a.index_topk * r if r == 4 else None, name, entry / r, entry_tokens=r,
                               entry_bytes=entry, block_tokens=DSV4_BLOCK, page_align=DSV4_PAGE_ALIGN))
            if r == 4:
                out.append(LayerKV(i, "full", None, "indexer", index_entry / r, entry_tokens=r, entry_bytes=index_entry,
                                   block_tokens=DSV4_BLOCK, page_align=DSV4_PAGE_ALIGN))
        out.append(LayerKV(i, "sliding", a.sliding_window, name, 0.0, fixed_bytes=a.sliding_window * entry,
                           entry_bytes=entry, block_tokens=DSV4_SWA_BLOCK, page_align=DSV4_PAGE_ALIGN))
        if r > 1:
            widths = [a.head_dim] + ([a.index_head_dim] if r == 4 else [])
            for w in widths:
                window, row = a.coff(r) * r, 2 * a.coff(r) * w * 4
                out.append(LayerKV(i, "sliding", window, "compressor", 0.0, fixed_bytes=window * row, entry_bytes=row,
                                   block_tokens=DSV4_STATE_BLOCK[r], page_align=DSV4_PAGE_ALIGN))
    return tuple(out)


def state_bytes(model: ModelSpec, tp: int = 1, ssm_default: Optional[str] = None,
                layer: Optional[int] = None) -> tuple[int, int]:
    """One state layer's cache for one sequence on one rank, as vLLM's MambaSpec holds it: the causal conv's last
    (kernel - 1) inputs of its channels, in the model dtype, and the SSM (or gated delta net recurrent) state in
    mamba_ssm_cache_dtype (the model dtype unless the config or the user names another). Heads and channels split
    across TP ranks. With `layer`, that layer's (where state layers differ). Returns (conv bytes, state bytes)."""
    if layer is not None:
        st = model.layer_state(layer)
    elif len(model.state_mixers) > 1:
        raise KvplanError(f"{model.name}'s state layers differ ({', '.join(st.label for st in model.state_mixers)}): "
                          f"name the layer")
    else:
        st = model.state
    if st is None:
        return 0, 0
    return st.cache_bytes(tp, model.dtype, ssm_default)  # the mixer's own (kvplan.specs.mixers)


def skipped_indices(layers: Sequence[LayerKV], fmt: KVFormat) -> list[int]:
    """The cache layers `kv_layers` left in the model dtype rather than `fmt` (a DSA indexer keeps its own)."""
    return sorted(lay.index for lay in layers
                  if lay.kind != "state" and lay.format not in (fmt.name, "indexer", "compressor"))


def kv_bytes_per_token(layers: Sequence[LayerKV]) -> float:
    """KV bytes one more cached token costs on this rank, summed over layers (windows not applied)."""
    return whole(sum(lay.bytes_per_token for lay in layers))


def layer_classes(layers: Sequence[LayerKV]) -> list[tuple[Optional[int], int, float, int, float]]:
    """Layers that read alike, merged: (window, count, bytes per token, residual tokens, residual extra bytes), the
    byte figures summed over the class. Sums of whole byte counts are exact, so merging changes no result."""
    merged: dict[tuple, list] = {}
    for lay in layers:
        if lay.kind == "state":
            continue
        key = (lay.window, lay.residual_tokens)
        acc = merged.setdefault(key, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += lay.bytes_per_token
        acc[2] += lay.residual_extra_bytes_per_token
    return [(w, n, b, r, rb) for (w, r), (n, b, rb) in merged.items()]


def kv_read_bytes(layers: Sequence[LayerKV], batch, context, xp=SCALAR):
    """KV bytes one decode step reads on this rank: `batch` sequences of `context` cached tokens each.
    (`batch` and `context` may be numpy arrays, with xp=numpy.)"""
    total = float(sum(lay.fixed_bytes for lay in layers))  # state layers: read whatever the context
    for window, _, b, residual, residual_b in layer_classes(layers):
        n = context if window is None else xp.minimum(context, window)
        total = total + n * b
        if residual:
            total = total + xp.minimum(n, residual) * residual_b
    return batch * total


# ----------------------------------------------------------------------------------------------------------------
# Weight read


def experts_touched(model: ModelSpec, batch):
    """Expected distinct routed experts per MoE layer for `batch` tokens under uniform independent routing."""
    if not model.moe:
        return 0.0
    e, k = model.moe.num_experts, model.moe.experts_per_token
    return e * (1.0 - (1.0 - k / e) ** batch)


def weight_read_bytes(model: ModelSpec, wb: WeightBytes, batch, mode: WeightRead = "streamed", xp=SCALAR):
    """Weight bytes one decode step reads on this rank."""
    if mode == "all":
        return float(wb.total) + 0.0 * batch
    read = float(wb.streamed_dense) + 0.0 * batch
    if wb.experts and model.moe:
        read = read + wb.experts * experts_touched(model, batch) / model.moe.num_experts
    if wb.embed:
        read = read + xp.minimum(batch * wb.embed_row, wb.embed)
    return read


# ----------------------------------------------------------------------------------------------------------------
# Crossover and step


def _solve_crossover(layers: Sequence[LayerKV], weight: float) -> Optional[float]:
    """Smallest single-sequence context at which the KV read reaches `weight` (piecewise linear, exact)."""
    return crossover_curve(layers).solve(weight)


@frozen_dataclass
class CrossoverCurve:
    """A single sequence's KV read against its context, as the piecewise-linear curve it is: the contexts where its
    slope changes (0, every window, every residual length), the read at each, and the slope past the last. Built once
    per set of layers, it solves for any number of weight reads without pricing the layers again."""

    points: tuple[int, ...]
    reads: tuple[float, ...]
    final_slope: float

    def solve(self, weight: float) -> Optional[float]:
        """Smallest context at which the read reaches `weight`; None where it never does."""
        points, reads = self.points, self.reads
        if reads[0] >= weight:  # a hybrid whose fixed state alone outweighs the weights
            return 0.0
        for i in range(len(points) - 1):
            f_lo, f_hi = reads[i], reads[i + 1]
            if f_hi >= weight:
                lo, hi = points[i], points[i + 1]
                return lo + (weight - f_lo) / (f_hi - f_lo) * (hi - lo)
        slope = self.final_slope
        return None if slope <= 0 else points[-1] + (weight - reads[-1]) / slope


def crossover_curve(layers: Sequence[LayerKV]) -> CrossoverCurve:
    f = lambda s: kv_read_bytes(layers, 1, s)  # noqa: E731
    points = sorted({0, *(lay.window for lay in layers if lay.window),
                     *(lay.residual_tokens for lay in layers if lay.residual_tokens)})
    reads = tuple(f(p) for p in points)
    return CrossoverCurve(tuple(points), reads, f(points[-1] + 1) - reads[-1])


def _flops_per_step(model: ModelSpec, layers: Sequence[LayerKV], batch, context, tp: int, params_read: float,
                    xp=SCALAR):
    """Dense FLOPs of one decode step on this rank: 2 per weight per token, plus QK^T and PV over the cache."""
    flops = 2.0 * params_read * batch
    per_token_head = model.base_attention.flops_per_token_head  # QK^T and PV
    heads = model.num_heads // tp
    for window, count, *_ in layer_classes(layers):
        n = context if window is None else xp.minimum(context, window)
        flops = flops + batch * n * (count * heads * per_token_head)
    return flops


@per_spec
def params_read_per_token(model: ModelSpec, tp: int) -> float:
    """Parameters one token multiplies on this rank (for the compute roofline)."""
    total = 0.0
    for t in model_tensors(model):
        if t.part in ("embed", "extra"):
            continue
        o, i = t.shape_per_rank(tp)
        n = o * i * t.count
        if t.part == "expert" and model.moe:
            n = n * model.moe.experts_per_token / model.moe.num_experts
        total += n
    return total


def step_figures(model: ModelSpec, layers: Sequence[LayerKV], base_layers: Sequence[LayerKV], wb: WeightBytes,
                 batch, context, mode: WeightRead, tp: int, gpu: Optional[GPUSpec], weight_dtype: str,
                 xp=SCALAR, params_read: Optional[float] = None) -> dict:
    """The figures of one decode step at (batch, context): plain numbers, or numpy arrays with xp=numpy."""
    w = weight_read_bytes(model, wb, batch, mode, xp)
    kv = kv_read_bytes(layers, batch, context, xp)
    kv_base = kv_read_bytes(base_layers, batch, context, xp)
    step, step_base = w + kv, w + kv_base
    out = dict(weight_bytes=w, kv_bytes=kv, step_bytes=step, baseline_kv_bytes=kv_base,
               baseline_step_bytes=step_base, saving=1.0 - step / step_base, kv_bound=kv > w)
    if gpu is not None:
        memory_s = step / gpu.peak_bandwidth_bytes_per_s
        if params_read is None:
            params_read = params_read_per_token(model, tp)
        peak = _peak_flops(gpu, weight_dtype)
        compute_s = _flops_per_step(model, layers, batch, context, tp, params_read, xp) / peak if peak else 0.0 * step
        out.update(memory_ms=memory_s * 1e3, compute_ms=compute_s * 1e3,
                   step_ms=xp.maximum(memory_s, compute_s) * 1e3, compute_bound=compute_s > memory_s)
    return out


def crossover_at_batch(layers: Sequence[LayerKV] | CrossoverCurve, weight_read: float,
                       batch: int) -> Optional[float]:
    """Resident tokens (batch x context) at which the KV read equals `weight_read`, sequences growing together
    (`layers` may be their crossover_curve, built once for many batches)."""
    curve = layers if isinstance(layers, CrossoverCurve) else crossover_curve(layers)
    nstar = curve.solve(weight_read / batch)
    return nstar * batch if nstar is not None else None


def _peak_flops(gpu: GPUSpec, weight_dtype: str) -> float:
    """The dense tensor-core rate the weights' GEMMs run at (their family: gemm_family)."""
    eight_bit = gemm_family(weight_dtype)[0] in ("fp8", "fp8_block")
    key = "fp8" if eight_bit and gpu.fp8_support and "fp8" in gpu.dense_tflops else "bf16"
    return gpu.dense_tflops.get(key, 0.0) * 1e12


def _ranges(xs: Sequence[int]) -> str:
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)
