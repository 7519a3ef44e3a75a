"""`kvplan quality MODEL`: the model runs over the user's text teacher-forced, once with its KV cache in the model
dtype and once per format with the cache stored in that format on write and read back through the format's
reference dequantizer (kvplan.quality.formats), and the next-token distributions are compared.

How the cache is stored, as the engine stores it: a transformers Cache whose layers quantize each chunk of keys and
values as it is written (keys arrive after RoPE, as vLLM caches them), every layer in the format except its skip
layers (the format's default, or --kv-cache-dtype-skip-layers), which stay in the model dtype. Attention then reads
the stored values for every token, the chunk's own included, as vLLM's paged attention reads its cache after
writing it; a format with a residual window (KIVI: its newest tokens and a token group not yet whole in the model
dtype) is read by each query as decoding that token would read it. The text is cut into windows of `context`
tokens, each starting from an empty cache, and each window is fed in chunks of CHUNK_TOKENS. One format's cache
is held at a time: a window runs in the model dtype, and its log-probabilities (positions x vocabulary, fp32, on
the device) are kept while the window runs in each format and is compared against them.

Per layer, the relative errors of the cached keys and values, and of the attention output against attention over
the same layer's unquantized keys and values for the same queries (the layer's own error, before it propagates).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from kvplan.errors import KvplanError, error_line
from kvplan.specs.kv_formats import KVFormat

CHUNK_TOKENS = 512  # tokens fed per forward call (a prefill chunk)
ATTENTION = "kvplan_quality"  # the attention implementation registered with transformers for the probe
DATASETS = {"wikitext2": ("wikitext", "wikitext-2-raw-v1", "test")}  # --dataset aliases: (path, config, split)


@dataclass
class FormatQuality:
    kv_cache_dtype: str
    bits_per_element: float
    capacity_gain: Optional[float]  # tokens a pool holds against the model dtype (bytes per token, skips included)
    skip_layers: list[int]
    kl_mean: float
    kl_p99: float
    top1_agreement: float
    perplexity: float
    perplexity_delta: float
    perplexity_delta_pct: float
    key_rel_error: float
    value_rel_error: float
    attention_rel_error: float
    seconds: float
    kl_by_position: list[dict] = field(default_factory=list)  # metrics.by_position: KL by position in the window


@dataclass
class LayerQuality:
    kv_cache_dtype: str
    layer: int
    skipped: bool
    key_rel_error: float
    value_rel_error: float
    attention_rel_error: float


@dataclass
class QualityResult:
    model: str
    device: str
    model_dtype: str
    tokens: int  # next-token predictions compared
    windows: int
    context: int
    chunk_tokens: int
    perplexity: float  # the model-dtype run's
    rows: list[FormatQuality]
    layers: list[LayerQuality]
    evidence: dict = field(default_factory=dict)  # format name -> the published results (kv_evidence)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class Progress:
    """What a run reports while it runs (the command line draws it; the library's default says nothing)."""

    def estimate(self, seconds: float, steps: int) -> None:
        pass

    def step(self, label: str) -> None:
        pass


# ----------------------------------------------------------------------------------------------------------------
# The text


def load_text(text: Optional[str], dataset: Optional[str]) -> str:
    """The text to run over: a file, or a Hugging Face data set's text column (an alias in DATASETS, or
    path[:config[:split]]) from the local cache or the Hub, through the `datasets` package."""
    if text is not None and dataset is not None:
        raise KvplanError("--text and --dataset both name the text to run over: give one")
    if text is None and dataset is None:
        raise KvplanError("kvplan quality runs over a text: give --text FILE or --dataset NAME (e.g. wikitext2)")
    if text is not None:
        try:
            return Path(text).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise KvplanError(f"--text {text}: cannot read it ({e.strerror})") from None
    path, config, split = DATASETS.get(dataset, (None, None, None))
    if path is None:
        parts = dataset.split(":")
        if "/" not in parts[0] or len(parts) > 3:
            raise KvplanError(f"--dataset {dataset}: give {', '.join(DATASETS)} or a Hugging Face data set as "
                              f"org/name[:config[:split]]")
        path, config, split = parts[0], (parts[1:2] or [None])[0], (parts[2:3] or ["test"])[0]
    try:
        import datasets
    except ImportError:
        raise KvplanError("--dataset reads Hugging Face data sets with the datasets package (pip install datasets); "
                          "or give --text FILE") from None
    try:
        rows = datasets.load_dataset(path, config, split=split)
    except Exception as e:  # offline, unknown, gated: the library's own reason, on one line
        raise KvplanError(f"--dataset {dataset}: {type(e).__name__}: {e}") from None
    if "text" not in rows.column_names:
        raise KvplanError(f"--dataset {dataset} has no 'text' column (it has {', '.join(rows.column_names)})")
    return "\n\n".join(t for t in rows["text"] if t)


def tokenize(model_id: str, text: str, vocab_size: int) -> tuple[list[int], Optional[int], Optional[str]]:
    """(token ids, the BOS id or None, a note or None): the model's own tokenizer; a checkpoint without one (a
    model built from a config) reads the text's UTF-8 bytes as token ids, where its vocabulary holds them."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_id)
    except Exception:
        if vocab_size < 256:
            raise KvplanError(f"{model_id} has no tokenizer, and its vocabulary ({vocab_size}) is too small to "
                              f"read the text as bytes") from None
        return list(text.encode("utf-8")), None, f"{model_id} has no tokenizer: the text's UTF-8 bytes are its tokens"
    return tok(text, add_special_tokens=False)["input_ids"], tok.bos_token_id, None


def windows_of(ids: list[int], bos: Optional[int], context: int) -> list[list[int]]:
    """The text cut into windows of `context` tokens (each led by BOS where the tokenizer has one); a last window
    of a single token predicts nothing and is dropped."""
    body = context - (bos is not None)
    if body < 1:
        raise KvplanError(f"--context {context}: a window needs room for the text after BOS")
    out = [([bos] if bos is not None else []) + ids[i:i + body] for i in range(0, len(ids), body)]
    out = [w for w in out if len(w) >= 2]
    if not out:
        raise KvplanError("the text holds fewer than two tokens: nothing to predict")
    return out


# ----------------------------------------------------------------------------------------------------------------
# The cache and the attention probe


def _register_attention() -> None:
    """The sdpa attention under kvplan's name: each layer reads its store (a residual window read per query, see
    _Probe.attend) and the probe compares the output against attention over the layer's unquantized K and V."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, attention_mask, **kwargs):
        probe = getattr(module, "_kvplan_probe", None)
        if probe is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        return probe.attend(module, query, key, value, attention_mask, kwargs)

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


class _Probe:
    """One format run's attention: what each layer reads from its store, and the per-layer error of the output
    against attention over the layer's exact K and V for the same queries."""

    def __init__(self, stores):
        from kvplan.quality.metrics import ErrorSum

        self.stores = stores
        self.attention = [ErrorSum() for _ in stores]

    def attend(self, module, query, key, value, mask, kwargs):
        """Attention for one layer's chunk of queries. A format with a residual window (KIVI) keeps each sequence's
        newest tokens in the model dtype: the query at position p reads token j < quantized_len(p + 1) from the
        format and the rest as written, as it would decoding token p. Read per query: attention over the stored
        and the written copies of every token side by side, a mask choosing one copy of each."""
        import torch
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        store = self.stores[module.layer_idx]
        if store.exact:  # the model dtype: what it reads is what was written
            return sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        raw_k = store.raw_keys.transpose(0, 1)[None].to(query.dtype)
        raw_v = store.raw_values.transpose(0, 1)[None].to(query.dtype)
        if store.windowed:
            chosen = store.read_mask(query.shape[2]).to(query.device)  # [queries, 2 x tokens]
            out, weights = sdpa_attention_forward(module, query, torch.cat([key, raw_k], 2),
                                                  torch.cat([value, raw_v], 2), chosen[None, None],
                                                  **{**kwargs, "is_causal": False})
        else:
            out, weights = sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        ref, _ = sdpa_attention_forward(module, query, raw_k, raw_v, mask, **kwargs)
        self.attention[module.layer_idx].add(out, ref)
        return out, weights


def _cache(stores):
    """A transformers Cache whose layer i stores through stores[i] on every write and returns what it reads back."""
    from transformers.cache_utils import Cache, DynamicLayer

    class StoredLayer(DynamicLayer):
        def __init__(self, store):
            super().__init__()
            self.store = store

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            # [1, kv_heads, tokens, d] <-> the store's [tokens, kv_heads, d]
            self.store.append(key_states[0].transpose(0, 1), value_states[0].transpose(0, 1))
            self.keys = self.store.keys.transpose(0, 1)[None].to(key_states.dtype)
            self.values = self.store.values.transpose(0, 1)[None].to(value_states.dtype)
            return self.keys, self.values

    return Cache(layers=[StoredLayer(s) for s in stores])


# ----------------------------------------------------------------------------------------------------------------


def resolve_device(device: Optional[str]) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise KvplanError(f"--device {device}: choose cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise KvplanError("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    return device


def _load(model_id: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    _register_attention()
    try:
        from transformers.utils import logging

        logging.disable_progress_bar()  # kvplan draws its own
    except ImportError:
        pass
    try:
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype="auto", attn_implementation=ATTENTION)
    except Exception as e:  # a missing snapshot, a gated repository, an architecture transformers lacks
        raise KvplanError(f"{model_id}: transformers cannot load it ({error_line(e)})") from None
    return model.to(device).eval(), torch


def capacity(spec, fmt: KVFormat, skip) -> tuple[Optional[float], list[int]]:
    """(pool tokens against the model dtype's, the layers kept in the model dtype): from kvplan's pool model, the
    bytes one token costs over all layers, skip layers included."""
    from kvplan.sizing.kv_cache import kv_bytes_per_token, kv_layers, skipped_layers
    from kvplan.specs.kv_formats import kv_format

    skipped = sorted(skipped_layers(spec, fmt, skip))
    ours = kv_bytes_per_token(kv_layers(spec, fmt, skip=skip))
    return kv_bytes_per_token(kv_layers(spec, kv_format("auto"))) / ours, skipped


def run_quality(model_id: str, formats: list[KVFormat], text: str, context: int = 4096,
                device: Optional[str] = None, skip=None, progress: Optional[Progress] = None) -> QualityResult:
    """The quality of each of `formats` (names or KVFormats) on `model_id` (a Hugging Face id or snapshot folder)
    over `text`."""
    from kvplan.quality.formats import check_format
    from kvplan.specs.kv_formats import kv_format
    from kvplan.quality.metrics import by_position, percentile, perplexity, token_figures
    from kvplan.specs.catalog import load_model
    from kvplan.specs.kv_evidence import evidence_for, notes_for

    formats = [kv_format(f) if isinstance(f, str) else f for f in formats]
    spec = load_model(model_id)
    if spec.is_mla or spec.is_hybrid:
        raise KvplanError(f"{spec.name} caches {'an MLA latent' if spec.is_mla else 'recurrent state beside K and V'}; "
                          f"kvplan quality measures the K and V caches of attention-only models")
    if context > spec.max_position_embeddings:
        raise KvplanError(f"--context {context:,}: {spec.name} takes at most {spec.max_position_embeddings:,} tokens "
                          f"(max_position_embeddings)")
    for f in formats:  # refused before any weight is read
        check_format(f, spec.head_dim)
    plans = {f.name: capacity(spec, f, skip) for f in formats}
    device = resolve_device(device)
    started = time.perf_counter()
    model, torch = _load(model_id, device)
    ids, bos, token_note = tokenize(model_id, text, model.config.vocab_size)
    runner = _Runner(model, windows_of(ids, bos, context), spec.head_dim, device, len(formats) + 1,
                     progress or Progress())
    from kvplan.quality.metrics import ErrorSum

    sums = {f.name: LayerSums(*([ErrorSum() for _ in range(runner.layers)] for _ in range(3))) for f in formats}
    figures: dict = {f.name: [] for f in formats}  # per chunk: KL, top-1, NLL, positions
    seconds = dict.fromkeys(sums, 0.0)
    base_nll: list = []
    for w in runner.windows:  # a window at a time: its model-dtype log-probabilities, then each format against them
        base: list = []

        def keep(logp, targets, start):
            base.append(logp)
            base_nll.append(-logp.gather(-1, targets[:, None])[:, 0])

        runner.window(w, None, frozenset(), keep, None)
        for f in formats:
            t0 = time.perf_counter()
            at = iter(base)
            runner.window(w, f, frozenset(plans[f.name][1]), lambda logp, t, start, f=f: figures[f.name].append(
                (*token_figures(next(at), logp, t), start + torch.arange(t.shape[0]))), sums[f.name])
            seconds[f.name] += time.perf_counter() - t0
        del base
    base_ppl = perplexity(torch.cat(base_nll))
    rows, layer_rows = [], []
    for f in formats:
        kl, agree, nll, positions = (torch.cat([fig[i].cpu() for fig in figures[f.name]]) for i in range(4))
        ppl = perplexity(nll)
        skipped, s = plans[f.name][1], sums[f.name]
        rows.append(FormatQuality(
            f.name, round(f.bits_per_element(spec.head_dim), 4), plans[f.name][0], skipped, float(kl.mean()),
            percentile(kl, 99), float(agree.float().mean()), ppl, ppl - base_ppl, (ppl / base_ppl - 1) * 100,
            total(s.keys), total(s.values), total(s.attention), seconds[f.name], by_position(kl, agree, positions)))
        layer_rows += [LayerQuality(f.name, i, i in skipped, s.keys[i].relative, s.values[i].relative,
                                    s.attention[i].relative) for i in range(runner.layers)]
    runner.detach()
    notes = [token_note] if token_note else []
    notes += [f"{n.text} ({n.source})" for n in dict.fromkeys(n for f in formats for n in notes_for(f.name))]
    evidence = {f.name: [asdict(e) for e in evidence_for(f.name)] for f in formats}
    return QualityResult(model_id, device, str(model.dtype).replace("torch.", ""), runner.predictions,
                         len(runner.windows), context, CHUNK_TOKENS, base_ppl, rows, layer_rows, evidence, notes,
                         time.perf_counter() - started)


@dataclass
class LayerSums:
    """One format's error sums per layer, over every window."""

    keys: list
    values: list
    attention: list


def total(sums) -> float:
    """The relative error over every layer's tensors together."""
    from kvplan.quality.metrics import ErrorSum

    return ErrorSum(sum(s.diff_sq for s in sums), sum(s.ref_sq for s in sums)).relative


class _Runner:
    """The model over the windows, chunk by chunk, with a fresh cache per window in one format at a time."""

    def __init__(self, model, windows: list[list[int]], head_dim: int, device: str, passes: int, progress: Progress):
        import inspect

        self.model, self.windows, self.head_dim, self.device, self.progress = model, windows, head_dim, device, progress
        self.layers = model.config.num_hidden_layers
        self.predictions = sum(len(w) - 1 for w in windows)
        self.steps = sum(math.ceil(len(w) / CHUNK_TOKENS) for w in windows) * passes
        self.timed = False
        # transformers 5 names the cache argument `cache` (past_key_values is deprecated there); earlier releases
        # take only past_key_values
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.attention_modules = [m for m in model.modules()
                                  if hasattr(m, "layer_idx") and type(m).__name__.endswith("Attention")]

    def window(self, w: list[int], fmt: Optional[KVFormat], skipped: frozenset, on_chunk: Callable,
               sums: Optional[LayerSums]) -> None:
        """One window from an empty cache in `fmt` (None: the model dtype), chunk by chunk: on_chunk(log-probs,
        next tokens, the chunk's first position in the window) per chunk, the layers' errors added to `sums`."""
        import torch

        from kvplan.quality.formats import layer_store
        from kvplan.specs.kv_formats import kv_format

        stores = [layer_store(fmt or kv_format("auto"), self.head_dim, i in skipped) for i in range(self.layers)]
        probe = _Probe(stores)
        for m in self.attention_modules:
            m._kvplan_probe = probe
        cache = _cache(stores)
        x = torch.tensor(w, device=self.device)[None]
        for start in range(0, len(w), CHUNK_TOKENS):
            t0 = time.perf_counter()
            with torch.no_grad():
                out = self.model(input_ids=x[:, start:start + CHUNK_TOKENS], use_cache=True, **{self.cache_arg: cache})
            targets = x[0, start + 1:start + CHUNK_TOKENS + 1]
            on_chunk(torch.log_softmax(out.logits[0, :targets.shape[0]].float(), -1), targets, start)
            if not self.timed:  # the estimate, from the first chunk's time
                self.timed = True
                self.progress.estimate((time.perf_counter() - t0) * self.steps, self.steps)
            self.progress.step(fmt.name if fmt else "model dtype")
        if sums is not None:
            for i, s in enumerate(stores):
                sums.attention[i].diff_sq += probe.attention[i].diff_sq
                sums.attention[i].ref_sq += probe.attention[i].ref_sq
                if not s.exact:
                    sums.keys[i].add(s.keys, s.raw_keys)
                    sums.values[i].add(s.values, s.raw_values)

    def detach(self) -> None:
        for m in self.attention_modules:
            m._kvplan_probe = None
