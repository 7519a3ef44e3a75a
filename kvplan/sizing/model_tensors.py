"""Every tensor of a model, as vLLM's and transformers' modelling code builds it, and its parameter count.

The architecture is expanded into a list of `Tensor` records once (model_tensors); the parameter count, the bytes
held per rank (kvplan.sizing.weights) and the bytes a decode step reads are all sums over that one list.
"""

from __future__ import annotations

from dataclasses import replace
from kvplan.memo import per_spec
from kvplan.specs.catalog import ModelSpec
from kvplan.specs.layers import Dense, MoE
from kvplan.specs.tensors import (  # noqa: F401 (VOCAB_PADDING, Shard, padded_vocab: importable from here)
    VOCAB_PADDING, Shard, Tensor, linear, padded_vocab)


def _by_shape(layers, shape) -> list[tuple[tuple, tuple[int, ...]]]:
    """`layers` grouped by shape(i), in order of first appearance: [(shape, layers of that shape)]. One group (and
    no layer list, the part's every layer) where all agree."""
    groups: dict[tuple, list[int]] = {}
    for i in layers:
        groups.setdefault(shape(i), []).append(i)
    if len(groups) == 1:
        return [(next(iter(groups)), ())]
    return [(k, tuple(v)) for k, v in groups.items()]


def _compressed_attention(m: ModelSpec) -> list[Tensor]:
    """DeepSeek-V4's attention, hyper-connections and their compressors, as transformers' DeepseekV4 modelling code
    builds them and vLLM's (vllm/models/deepseek_v4: DeepseekV4Attention, DeepseekCompressor, DeepseekV4Indexer)
    splits them: the query up-projection, the grouped output projections and the sinks split across TP ranks; the
    fused q_a/kv projection, the compressors and the indexer are whole on every rank, and vLLM keeps the
    compressors' and the indexer's weights_proj unquantized."""
    a, h, H, L = m.compressed, m.hidden_size, m.num_heads, m.num_layers
    d = a.head_dim
    ts: list[Tensor] = [Tensor("attn.sinks", H, 1, L, "col", "attention", False)]
    ts += linear("attn.q_a_proj", a.q_lora_rank, h, L, "rep", "attention")
    ts.append(Tensor("attn.q_a_norm", a.q_lora_rank, 1, L, "rep", "norm", False))
    ts += linear("attn.q_b_proj", H * d, a.q_lora_rank, L, "col", "attention")
    ts += linear("attn.kv_proj", d, h, L, "rep", "attention")
    ts.append(Tensor("attn.kv_norm", d, 1, L, "rep", "norm", False))
    ts += linear("attn.o_a_proj", a.o_groups * a.o_lora_rank, H * d // a.o_groups, L, "col", "attention")
    ts += linear("attn.o_b_proj", h, a.o_groups * a.o_lora_rank, L, "row", "attention")
    for ratio, layers in _by_shape([i for i, r in enumerate(a.compress_ratios) if r > 1],
                                   lambda i: (a.compress_ratios[i],)):
        r, = ratio
        n, at = len(layers) or sum(1 for x in a.compress_ratios if x == r), layers
        width = a.coff(r) * d  # kv and gate, 2 overlapping entries at ratio 4
        ts.append(Tensor("attn.compressor.position_bias", r, width, n, "rep", "attention", False, layers=at))
        ts.append(Tensor("attn.compressor.kv_gate_proj", 2 * width, h, n, "rep", "attention", False, layers=at))
        ts.append(Tensor("attn.compressor.kv_norm", d, 1, n, "rep", "norm", False, layers=at))
        if r == 4:  # the lightning indexer and its own compressor
            iw = a.coff(r) * a.index_head_dim
            ts.append(Tensor("attn.indexer.position_bias", r, iw, n, "rep", "attention", False, layers=at))
            ts.append(Tensor("attn.indexer.kv_gate_proj", 2 * iw, h, n, "rep", "attention", False, layers=at))
            ts.append(Tensor("attn.indexer.kv_norm", a.index_head_dim, 1, n, "rep", "norm", False, layers=at))
            ts += linear("attn.indexer.q_b_proj", a.index_n_heads * a.index_head_dim, a.q_lora_rank, n, "rep",
                          "attention", layers=at)
            ts.append(Tensor("attn.indexer.weights_proj", a.index_n_heads, h, n, "rep", "attention", False, layers=at))
    if a.hc_mult > 1:  # before attention and before the MLP: a mixing projection, its bias and 3 scales
        mix = (2 + a.hc_mult) * a.hc_mult
        ts.append(Tensor("hc.fn", mix, a.hc_mult * h, 2 * L, "rep", "norm", False))
        ts.append(Tensor("hc.base_scale", mix + 3, 1, 2 * L, "rep", "norm", False))
        ts.append(Tensor("hc_head", a.hc_mult * (a.hc_mult * h + 1) + 1, 1, 1, "rep", "norm", False))
    return ts


def _attention(m: ModelSpec, L: int) -> list[Tensor]:
    """The attention layers' tensors, each shape's the layer's own: one record per shape of layer
    (AttentionMixer.tensor_shape: an MLA model's layers one, others' their KV heads, head size and V loaded from K),
    the shared blocks' copies where the layers share them; then a sparse-attention indexer's, on the layers holding
    one."""
    ts: list[Tensor] = []
    shared = m.shared_attention
    for _, layers in _by_shape(m.attention_layers, lambda i: m.layers[i].attention.tensor_shape):
        a = m.layers[(layers or m.attention_layers)[0]].attention
        n = len(layers) or L
        if shared:  # the layers share `blocks` copies of the weights
            n, layers = min(n, shared.blocks), ()
        proj = a.tensors(m.hidden_size, n, layers, shared.input_size if shared else None)
        ts += [replace(t, shared=True) for t in proj] if shared else proj
        ts += a.norm_tensors(n, layers)
    indexed = m.indexer_layers
    if indexed:
        a = m.layers[indexed[0]].attention
        ts += a.indexer_tensors(m.hidden_size, len(indexed), indexed if len(indexed) < L else ())
    return ts


def _shared_block_tensors(m: ModelSpec, L: int) -> list[Tensor]:
    """What the layers keep of a shared attention block (Zamba2): each layer's projection and adapters, the
    shared blocks' norms."""
    h = m.hidden_size
    shared = m.shared_attention
    ts: list[Tensor] = []
    if not (shared and L):
        return ts
    # each layer's own: the projection of the shared block's output (whole on every rank) and the LoRA adapters
    ts += linear("shared.projection", h, h, L, "rep", "attention")
    if shared.adapter_rank:
        r = shared.adapter_rank
        ts += linear("shared.gate_up_adapter.A", r, h, L, "col", "mlp")
        ts += linear("shared.gate_up_adapter.B", 2 * m.intermediate_size, r, L, "col", "mlp")
        if shared.attention_adapters:
            ts += linear("shared.qkv_adapters.A", r, shared.input_size, 3 * L, "col", "attention")
            ts += linear("shared.qkv_adapters.B", shared.input_size, r, 3 * L, "col", "attention")
    # the shared blocks' norms: before attention (input_size wide) and before the MLP
    ts.append(Tensor("shared.norms", shared.input_size + h, 1, min(L, shared.blocks), "rep", "norm", False,
                     shared=True))
    return ts


def _mlp_tensors(m: ModelSpec) -> list[Tensor]:
    """The dense MLPs by width, and the MoE layers' router, experts, shared experts and latent projections: each
    the layer's own (Dense.tensors, MoE.tensors)."""
    ts: list[Tensor] = []
    dense = tuple(lay.index for lay in m.layers if isinstance(lay.mlp, Dense))
    for _, layers in _by_shape(dense, lambda i: m.layers[i].mlp.tensor_shape):
        mlp = m.layers[(layers or dense)[0]].mlp
        n = len(layers) or len(dense)
        if m.shared_attention:  # the MLPs of the shared attention blocks
            n, layers = min(n, m.shared_attention.blocks), ()
        block = mlp.tensors(m.hidden_size, n, layers)
        ts += [replace(t, shared=True) for t in block] if m.shared_attention else block
    moe = [lay.mlp for lay in m.layers if isinstance(lay.mlp, MoE)]
    if moe:
        ts += moe[0].tensors(m.hidden_size, len(moe))
    return ts


@per_spec
def model_tensors(m: ModelSpec) -> tuple[Tensor, ...]:
    """Every parameter tensor of the model (main model only: no MTP/draft layers)."""
    h = m.hidden_size
    L = len(m.attention_layers)  # the attention tensors' count: every layer but a hybrid's state and MLP-only ones
    ts: list[Tensor] = [Tensor("embed_tokens", m.vocab_size, h, 1, "vocab", "embed", False)]
    groups = m.state_groups
    for st, layers in groups:  # each mixer's own (kvplan.specs.mixers), on its layers where the mixers differ
        ts += st.tensors(h, len(layers), layers if len(groups) > 1 else ())

    # Attention
    ts += _compressed_attention(m) if m.compressed else _attention(m, L)
    if m.attention_sinks == "sliding":  # the sliding-window layers' sinks only
        sliding = tuple(i for i, k in enumerate(m.layer_kinds) if k == "sliding")
        if sliding:
            ts.append(Tensor("attn.sinks", m.num_heads, 1, len(sliding), "col", "attention", False, layers=sliding))
    elif m.attention_sinks:
        ts.append(Tensor("attn.sinks", m.num_heads, 1, L, "col", "attention", False))
    ts += _shared_block_tensors(m, L)

    ts += _mlp_tensors(m)

    # Norms
    per_norm = h * (2 if m.norm_bias else 1)
    norms = sum(m.layer_norms(i) for i in range(m.num_layers))
    if norms:
        ts.append(Tensor("layer_norms", per_norm, 1, norms, "rep", "norm", False))
    ts.append(Tensor("final_norm", per_norm, 1, 1, "rep", "norm", False))
    if m.attention_residuals:  # a norm and a 1 x hidden projection twice a layer, and once before the final norm
        ts.append(Tensor("attention_residuals", 2 * h, 1, 2 * m.num_layers + 1, "rep", "norm", False))

    if not m.tie_word_embeddings:
        ts.append(Tensor("lm_head", m.vocab_size, h, 1, "vocab", "lm_head", False))
    if m.lm_head_bias:
        ts.append(Tensor("lm_head.bias", m.vocab_size, 1, 1, "vocab", "lm_head", False))
    for name, count in m.extra_params.items():
        ts.append(Tensor(f"extra.{name}", count, 1, 1, "col", "extra", False))
    for name, count in m.replicated_params.items():
        ts.append(Tensor(f"extra.{name}", count, 1, 1, "rep", "extra", False))
    return tuple(ts)


def param_count(m: ModelSpec) -> int:
    """Unique parameters of the main model (tied embeddings counted once), computed from the architecture."""
    return sum(t.numel for t in model_tensors(m) if not t.loaded_copy)


def active_param_count(m: ModelSpec) -> int:
    """Parameters one token uses: all but the routed experts not chosen."""
    total = 0
    for t in model_tensors(m):
        if t.loaded_copy:
            continue
        if t.part == "expert" and m.moe:
            total += t.numel * m.moe.experts_per_token // m.moe.num_experts
        elif t.part != "extra":
            total += t.numel
    return total
