"""Every tensor of a model, its parameter count, and its bytes per tensor-parallel rank in a checkpoint format.

The architecture is expanded into a list of `Tensor` records once; the parameter count, the bytes held per rank,
and the bytes a decode step reads (with MoE experts touched) are all sums over that one list.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, insort
from dataclasses import dataclass, replace
from typing import Literal, Optional

from kvplan.errors import KvplanError, did_you_mean
from kvplan.memo import per_spec
from kvplan.specs.parallel import Parallel, layout_of
from kvplan.specs.catalog import ModelSpec
from kvplan.units import DTYPE_BYTES  # noqa: F401 (also imported from here)

Shard = Literal["col", "row", "rep", "kv", "vocab"]
Part = Literal["embed", "lm_head", "attention", "state", "mlp", "expert", "shared_expert", "router", "norm", "extra"]


# vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to a multiple of 64 (DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64


def padded_vocab(rows: int) -> int:
    """The vocabulary rows vLLM allocates: `rows` rounded up to a multiple of VOCAB_PADDING."""
    return -(-rows // VOCAB_PADDING) * VOCAB_PADDING


@dataclass(frozen=True)
class Tensor:
    """`count` identical tensors of shape [out_dim, in_dim] (1-D tensors have in_dim 1)."""

    name: str
    out_dim: int
    in_dim: int
    count: int
    shard: Shard
    part: Part
    is_matrix: bool = True  # a linear layer's weight (quantizable); False for biases, norms, sinks
    kv_heads: int = 0  # for shard "kv": the heads out_dim spans
    layers: tuple[int, ...] = ()  # the layers holding one each, where only some of the part's layers do
    loaded_copy: bool = False  # memory vLLM fills from another tensor of the checkpoint: held, not a parameter
    shared: bool = False  # one per weight block the attention layers share in turn (Zamba2), not one per layer

    @property
    def numel(self) -> int:
        return self.out_dim * self.in_dim * self.count

    def shape_per_rank(self, tp: "int | Parallel") -> tuple[int, int]:
        """One rank's [out, in] under `tp` ranks, or under a layout (each part split by its own degree)."""
        if isinstance(tp, Parallel):
            tp = tp.tp_for(self.part)
        if self.shard == "col":
            return self.out_dim // tp, self.in_dim
        if self.shard == "row":
            return self.out_dim, self.in_dim // tp
        if self.shard == "kv":
            # vLLM keeps max(1, kv_heads // tp) KV heads per rank, replicating them when TP exceeds them.
            per_head = self.out_dim // self.kv_heads
            return max(1, self.kv_heads // tp) * per_head, self.in_dim
        if self.shard == "vocab":
            return math.ceil(padded_vocab(self.out_dim) / tp), self.in_dim
        return self.out_dim, self.in_dim


# ----------------------------------------------------------------------------------------------------------------
# Weight formats


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores a linear layer's weight: bits per element plus its scales and zero points."""

    name: str
    bits: int
    description: str
    scale_group: Optional[int] = None  # elements along the input dim sharing one scale
    scale_bytes: float = 0.0
    zero_bits: int = 0  # packed zero point per group
    block: Optional[int] = None  # square block sharing one scale (DeepSeek's 128x128)
    per_channel_scale_bytes: int = 0
    per_tensor_scale_bytes: int = 0

    def matrix_bytes(self, out_dim: int, in_dim: int) -> int:
        n = out_dim * in_dim
        total = math.ceil(n * self.bits / 8) + self.per_tensor_scale_bytes + out_dim * self.per_channel_scale_bytes
        if self.scale_group:
            groups = out_dim * math.ceil(in_dim / self.scale_group)
            total += math.ceil(groups * self.scale_bytes) + math.ceil(groups * self.zero_bits / 8)
        if self.block:
            total += math.ceil(out_dim / self.block) * math.ceil(in_dim / self.block) * 4
        return total


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in [
        WeightFormat("bf16", 16, "bfloat16"),
        WeightFormat("fp16", 16, "float16"),
        WeightFormat("fp32", 32, "float32"),
        WeightFormat("fp8", 8, "fp8 e4m3, one fp32 scale per tensor (vLLM --quantization fp8)", per_tensor_scale_bytes=4),
        WeightFormat("fp8_block128", 8, "fp8 e4m3, one fp32 scale per 128x128 block (DeepSeek-V3, Kimi-K2)", block=128),
        WeightFormat("fp8_channel", 8, "fp8 e4m3, one fp32 scale per output channel", per_channel_scale_bytes=4),
        WeightFormat("int8", 8, "int8, one fp32 scale per output channel (W8A8)", per_channel_scale_bytes=4),
        WeightFormat("int8_tensor", 8, "int8, one fp32 scale per tensor (W8A8 per-tensor)", per_tensor_scale_bytes=4),
        WeightFormat(
            "int4_g128", 4, "int4, fp16 scale and 4-bit zero point per 128 inputs (AWQ/GPTQ)",
            scale_group=128, scale_bytes=2, zero_bits=4,
        ),
        WeightFormat("nf4", 4, "bitsandbytes NF4, one fp32 absmax per 64", scale_group=64, scale_bytes=4),
        WeightFormat("nf4_double", 4, "bitsandbytes NF4 with double quantization: one 8-bit absmax per 64, an fp32 "
                     "per 256 of those", scale_group=64, scale_bytes=1 + 4 / 256),
        WeightFormat("mxfp4", 4, "e2m1, one e8m0 scale byte per 32 (OCP MX; gpt-oss experts)", scale_group=32, scale_bytes=1),
        WeightFormat(
            "nvfp4", 4, "e2m1, one fp8 e4m3 scale per 16, fp32 global scale per tensor",
            scale_group=16, scale_bytes=1, per_tensor_scale_bytes=4,
        ),
    ]
}


def _int4_format(key: str) -> Optional[WeightFormat]:
    """int4 with a 16-bit scale per `g` inputs (int4_g<g>) or per output channel (int4_channel), with a 4-bit zero
    point per group unless symmetric (_sym): compressed-tensors W4A16 and GPTQ/AWQ, as Marlin keeps them."""
    m = re.fullmatch(r"int4_(?:g([0-9]+)|channel)(_sym)?", key)
    if not m or (m.group(1) and not 1 <= int(m.group(1)) <= 1 << 20):
        return None
    group, sym = (int(m.group(1)) if m.group(1) else None), bool(m.group(2))
    where = f"per {group} inputs" if group else "per output channel"
    if group is None:
        return WeightFormat(key, 4, f"int4, a 16-bit scale {where}" + ("" if sym else " and a 4-bit zero point"),
                            per_channel_scale_bytes=2 if sym else 3)
    return WeightFormat(key, 4, f"int4, a 16-bit scale {where}" + ("" if sym else " and a 4-bit zero point"),
                        scale_group=group, scale_bytes=2, zero_bits=0 if sym else 4)


def weight_format(name: str) -> WeightFormat:
    key = name.lower()
    if key not in WEIGHT_FORMATS and _int4_format(key) is not None:
        return _int4_format(key)
    if key not in WEIGHT_FORMATS:
        raise KvplanError(
            f"unknown weight dtype '{name}'{did_you_mean(name, list(WEIGHT_FORMATS))}; "
            f"choose one of: {', '.join(WEIGHT_FORMATS)}"
        )
    return WEIGHT_FORMATS[key]


# ----------------------------------------------------------------------------------------------------------------
# The tensor list


def _linear(name, out_dim, in_dim, count, shard, part, bias=False, bias_shard=None, kv_heads=0,
            layers: tuple[int, ...] = (), loaded_copy: bool = False) -> list[Tensor]:
    ts = [Tensor(name, out_dim, in_dim, count, shard, part, True, kv_heads, layers, loaded_copy)]
    if bias:
        # A column-parallel bias is split with its outputs; a row-parallel bias is added once, so every rank holds it.
        bshard = bias_shard or (shard if shard in ("col", "kv") else "rep")
        ts.append(Tensor(name + ".bias", out_dim, 1, count, bshard, part, False, kv_heads, layers, loaded_copy))
    return ts


def _mlp(prefix, m: ModelSpec, width: int, count: int, part: Part, bias: bool = False,
         hidden: Optional[int] = None, layers: tuple[int, ...] = ()) -> list[Tensor]:
    h = hidden or m.hidden_size
    ts: list[Tensor] = []
    if m.gated_mlp:
        if bias:  # gpt-oss stores gate and up fused, with one bias of 2*width
            ts += _linear(f"{prefix}.gate_up_proj", 2 * width, h, count, "col", part, bias=True, layers=layers)
        else:
            ts += _linear(f"{prefix}.gate_proj", width, h, count, "col", part, layers=layers)
            ts += _linear(f"{prefix}.up_proj", width, h, count, "col", part, layers=layers)
    else:
        ts += _linear(f"{prefix}.up_proj", width, h, count, "col", part, bias=bias, layers=layers)
    ts += _linear(f"{prefix}.down_proj", h, width, count, "row", part, bias=bias, layers=layers)
    return ts


def _by_shape(layers, shape) -> list[tuple[tuple, tuple[int, ...]]]:
    """`layers` grouped by shape(i), in order of first appearance: [(shape, layers of that shape)]. One group (and
    no layer list, the part's every layer) where all agree."""
    groups: dict[tuple, list[int]] = {}
    for i in layers:
        groups.setdefault(shape(i), []).append(i)
    if len(groups) == 1:
        return [(next(iter(groups)), ())]
    return [(k, tuple(v)) for k, v in groups.items()]


def _conv(channels: int, st, count: int) -> list[Tensor]:
    """The depthwise causal convolution (channels x kernel), kept in the model dtype by every checkpoint format."""
    ts = [Tensor("mixer.conv1d", channels, st.conv_kernel, count, "col", "state", False)]
    if st.conv_bias:
        ts.append(Tensor("mixer.conv1d.bias", channels, 1, count, "col", "state", False))
    return ts


def _state_mixer(m: ModelSpec, count: int) -> list[Tensor]:
    """A state layer's tensors, as transformers' and vLLM's modelling code builds them (NemotronHMamba2Mixer /
    MambaMixer2; Qwen3NextGatedDeltaNet; MambaMixer). The heads split across TP ranks with their channels."""
    st, h = m.state, m.hidden_size
    assert st is not None
    ts: list[Tensor] = []
    inner, conv = st.inner, st.conv_channels
    if st.kind == "mamba2":
        # in_proj: z (inner) + x, B, C (conv channels) + dt (one per head)
        ts += _linear("mixer.in_proj", inner + conv + st.num_heads, h, count, "col", "state", bias=st.proj_bias)
        ts += _conv(conv, st, count)
        for name in ("dt_bias", "A_log", "D"):
            ts.append(Tensor(f"mixer.{name}", st.num_heads, 1, count, "col", "state", False))
        ts.append(Tensor("mixer.norm", inner, 1, count, "col", "state", False))
        ts += _linear("mixer.out_proj", h, inner, count, "row", "state", bias=st.proj_bias)
    elif st.kind == "gdn":
        k_dim = st.n_groups * st.state_size
        # q, k (key heads x key dim), v and z (value heads x value dim); b and a (one per value head)
        ts += _linear("linear_attn.in_proj_qkvz", 2 * k_dim + 2 * inner, h, count, "col", "state")
        ts += _linear("linear_attn.in_proj_ba", 2 * st.num_heads, h, count, "col", "state")
        ts += _conv(2 * k_dim + inner, st, count)
        for name in ("dt_bias", "A_log"):
            ts.append(Tensor(f"linear_attn.{name}", st.num_heads, 1, count, "col", "state", False))
        ts.append(Tensor("linear_attn.norm", st.head_dim, 1, count, "rep", "state", False))
        ts += _linear("linear_attn.out_proj", h, inner, count, "row", "state")
    elif st.kind == "kda":  # Kimi delta attention (KimiDeltaAttention): low-rank forget (f) and output (g) gates
        d = st.head_dim
        ts += _linear("linear_attn.qkv_proj", 3 * inner, h, count, "col", "state")
        ts += _linear("linear_attn.b_proj", st.num_heads, h, count, "col", "state")
        for gate in ("f",) if st.full_rank_gate else ("f", "g"):
            ts += _linear(f"linear_attn.{gate}_a_proj", d, h, count, "rep", "state")
            ts += _linear(f"linear_attn.{gate}_b_proj", inner, d, count, "col", "state")
        if st.full_rank_gate:
            ts += _linear("linear_attn.g_proj", inner, h, count, "col", "state")
        ts += _conv(conv, st, count)
        ts.append(Tensor("linear_attn.dt_bias", inner, 1, count, "col", "state", False))
        ts.append(Tensor("linear_attn.A_log", st.num_heads, 1, count, "col", "state", False))
        ts.append(Tensor("linear_attn.o_norm", d, 1, count, "rep", "state", False))
        ts += _linear("linear_attn.o_proj", h, inner, count, "row", "state")
    elif st.kind == "lightning":  # MiniMax's linear attention (MiniMaxText01LinearAttention)
        ts += _linear("linear_attn.qkv_proj", 3 * inner, h, count, "col", "state")
        ts += _linear("linear_attn.output_gate", inner, h, count, "col", "state")
        ts.append(Tensor("linear_attn.norm", inner, 1, count, "col", "state", False))
        ts += _linear("linear_attn.out_proj", h, inner, count, "row", "state")
    else:  # Mamba
        rank = st.dt_rank or -(-h // 16)
        ts += _linear("mixer.in_proj", 2 * inner, h, count, "col", "state", bias=st.proj_bias)
        ts += _conv(inner, st, count)
        ts += _linear("mixer.x_proj", rank + 2 * st.state_size, inner, count, "row", "state")
        ts += _linear("mixer.dt_proj", inner, rank, count, "col", "state", bias=True)
        ts.append(Tensor("mixer.A_log", inner, st.state_size, count, "col", "state", False))
        ts.append(Tensor("mixer.D", inner, 1, count, "col", "state", False))
        ts += _linear("mixer.out_proj", h, inner, count, "row", "state", bias=st.proj_bias)
        if st.dt_bc_norms:
            ts.append(Tensor("mixer.dt_b_c_layernorms", rank + 2 * st.state_size, 1, count, "rep", "state", False))
    return ts


def _compressed_attention(m: ModelSpec) -> list[Tensor]:
    """DeepSeek-V4's attention, hyper-connections and their compressors, as transformers' DeepseekV4 modelling code
    builds them and vLLM's (vllm/models/deepseek_v4: DeepseekV4Attention, DeepseekCompressor, DeepseekV4Indexer)
    splits them: the query up-projection, the grouped output projections and the sinks split across TP ranks; the
    fused q_a/kv projection, the compressors and the indexer are whole on every rank, and vLLM keeps the
    compressors' and the indexer's weights_proj unquantized."""
    a, h, H, L = m.compressed, m.hidden_size, m.num_heads, m.num_layers
    d = a.head_dim
    ts: list[Tensor] = [Tensor("attn.sinks", H, 1, L, "col", "attention", False)]
    ts += _linear("attn.q_a_proj", a.q_lora_rank, h, L, "rep", "attention")
    ts.append(Tensor("attn.q_a_norm", a.q_lora_rank, 1, L, "rep", "norm", False))
    ts += _linear("attn.q_b_proj", H * d, a.q_lora_rank, L, "col", "attention")
    ts += _linear("attn.kv_proj", d, h, L, "rep", "attention")
    ts.append(Tensor("attn.kv_norm", d, 1, L, "rep", "norm", False))
    ts += _linear("attn.o_a_proj", a.o_groups * a.o_lora_rank, H * d // a.o_groups, L, "col", "attention")
    ts += _linear("attn.o_b_proj", h, a.o_groups * a.o_lora_rank, L, "row", "attention")
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
            ts += _linear("attn.indexer.q_b_proj", a.index_n_heads * a.index_head_dim, a.q_lora_rank, n, "rep",
                          "attention", layers=at)
            ts.append(Tensor("attn.indexer.weights_proj", a.index_n_heads, h, n, "rep", "attention", False, layers=at))
    if a.hc_mult > 1:  # before attention and before the MLP: a mixing projection, its bias and 3 scales
        mix = (2 + a.hc_mult) * a.hc_mult
        ts.append(Tensor("hc.fn", mix, a.hc_mult * h, 2 * L, "rep", "norm", False))
        ts.append(Tensor("hc.base_scale", mix + 3, 1, 2 * L, "rep", "norm", False))
        ts.append(Tensor("hc_head", a.hc_mult * (a.hc_mult * h + 1) + 1, 1, 1, "rep", "norm", False))
    return ts


def _mla_attention(m: ModelSpec, L: int) -> list[Tensor]:
    """An MLA layer's projections and norms (and a lightning indexer's, whole on every rank), L layers."""
    h = m.hidden_size
    ts: list[Tensor] = []
    a = m.mla
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    if a.q_lora_rank:
        ts += _linear("attn.q_a_proj", a.q_lora_rank, h, L, "rep", "attention")
        ts.append(Tensor("attn.q_a_layernorm", a.q_lora_rank, 1, L, "rep", "norm", False))
        ts += _linear("attn.q_b_proj", m.num_heads * qk, a.q_lora_rank, L, "col", "attention")
    else:
        ts += _linear("attn.q_proj", m.num_heads * qk, h, L, "col", "attention")
    ts += _linear("attn.kv_a_proj_with_mqa", a.latent_dim, h, L, "rep", "attention")
    ts.append(Tensor("attn.kv_a_layernorm", a.kv_lora_rank, 1, L, "rep", "norm", False))
    ts += _linear("attn.kv_b_proj", m.num_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, L, "col", "attention")
    ts += _linear("attn.o_proj", h, m.num_heads * a.v_head_dim, L, "row", "attention", bias=m.o_bias)
    if a.output_gate:
        ts += _linear("attn.g_proj", m.num_heads * a.v_head_dim, h, L, "col", "attention")
    if a.index_n_heads and a.index_head_dim:  # the lightning indexer (whole on every rank)
        dq = a.q_lora_rank or h
        indexed = m.indexer_layers
        n, at = len(indexed), (indexed if len(indexed) < L else ())
        ts += _linear("attn.indexer.wq_b", a.index_n_heads * a.index_head_dim, dq, n, "rep", "attention", layers=at)
        ts += _linear("attn.indexer.wk", a.index_head_dim, h, n, "rep", "attention", layers=at)
        ts.append(Tensor("attn.indexer.k_norm", 2 * a.index_head_dim, 1, n, "rep", "norm", False, layers=at))
        ts += _linear("attn.indexer.weights_proj", a.index_n_heads, h, n, "rep", "attention", layers=at)
    return ts


def _head_attention(m: ModelSpec, L: int) -> list[Tensor]:
    """Attention by query and KV heads: one record per shape of layer (KV heads, head size, V loaded from K),
    the shared blocks' copies where the layers share them."""
    h = m.hidden_size
    ts: list[Tensor] = []
    # layers of one shape (KV heads, head size, V loaded from K) share their tensors' records
    shape = lambda i: (m.layer_kv_heads(i), m.layer_head_dim(i), bool(m.v_from_k and m.v_from_k[i]))  # noqa: E731
    shared = m.shared_attention
    h_in = shared.input_size if shared else h
    for (kv, d, v_from_k), layers in _by_shape(m.attention_layers, shape):
        assert d is not None
        n = len(layers) or L
        if shared:  # the layers share `blocks` copies of the weights
            n, layers = min(n, shared.blocks), ()
        start = len(ts)
        ts += _linear("attn.q_proj", m.num_heads * d * (2 if m.attn_output_gate else 1), h_in, n, "col",
                      "attention", bias=m.qkv_bias, layers=layers)
        vd = m.v_head_dim or d
        for name, width in (("k_proj", d), ("v_proj", vd)):
            ts += _linear(f"attn.{name}", kv * width, h_in, n, "kv", "attention", bias=m.qkv_bias, kv_heads=kv,
                          layers=layers, loaded_copy=v_from_k and name == "v_proj")
        ts += _linear("attn.o_proj", h, m.num_heads * vd, n, "row", "attention", bias=m.o_bias, layers=layers)
        if shared:
            ts[start:] = [replace(t, shared=True) for t in ts[start:]]
        if m.qk_norm_full:  # across all heads: split with them
            ts.append(Tensor("attn.q_norm", m.num_heads * d, 1, n, "col", "norm", False, layers=layers))
            ts.append(Tensor("attn.k_norm", kv * d, 1, n, "kv", "norm", False, kv, layers=layers))
        elif m.qk_norm:
            ts.append(Tensor("attn.q_norm", d, 1, n, "rep", "norm", False, layers=layers))
            ts.append(Tensor("attn.k_norm", d, 1, n, "rep", "norm", False, layers=layers))
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
    ts += _linear("shared.projection", h, h, L, "rep", "attention")
    if shared.adapter_rank:
        r = shared.adapter_rank
        ts += _linear("shared.gate_up_adapter.A", r, h, L, "col", "mlp")
        ts += _linear("shared.gate_up_adapter.B", 2 * m.intermediate_size, r, L, "col", "mlp")
        if shared.attention_adapters:
            ts += _linear("shared.qkv_adapters.A", r, shared.input_size, 3 * L, "col", "attention")
            ts += _linear("shared.qkv_adapters.B", shared.input_size, r, 3 * L, "col", "attention")
    # the shared blocks' norms: before attention (input_size wide) and before the MLP
    ts.append(Tensor("shared.norms", shared.input_size + h, 1, min(L, shared.blocks), "rep", "norm", False,
                     shared=True))
    return ts


def _mlp_tensors(m: ModelSpec) -> list[Tensor]:
    """The dense MLPs by width, and the MoE layers' router, experts, shared experts and latent projections."""
    h = m.hidden_size
    ts: list[Tensor] = []
    moe = m.moe
    mlps = m.mlp_kinds
    dense = tuple(i for i, k in enumerate(mlps) if k == "dense")
    for (width,), layers in _by_shape(dense, lambda i: (m.layer_intermediate(i),)):
        n = len(layers) or len(dense)
        if m.shared_attention:  # the MLPs of the shared attention blocks
            n, layers = min(n, m.shared_attention.blocks), ()
        mlp = _mlp("mlp", m, width, n, "mlp", bias=m.mlp_bias, layers=layers)
        ts += [replace(t, shared=True) for t in mlp] if m.shared_attention else mlp
    if moe and "moe" in mlps:
        n = mlps.count("moe")
        e = moe.num_experts
        ts += _linear("moe.router", e, h, n, "rep", "router", bias=moe.router_bias)
        if moe.score_correction_bias:
            ts.append(Tensor("moe.e_score_correction_bias", e, 1, n, "rep", "router", False))
        ts += _mlp("moe.experts", m, moe.expert_intermediate_size, n * e, "expert", bias=moe.expert_bias,
                   hidden=moe.latent_size)
        if moe.latent_size:
            ts += _linear("moe.fc1_latent_proj", moe.latent_size, h, n, "rep", "router", bias=m.mlp_bias)
            ts += _linear("moe.fc2_latent_proj", h, moe.latent_size, n, "rep", "router", bias=m.mlp_bias)
            if moe.latent_norm:
                ts.append(Tensor("moe.latent_norm", moe.latent_size, 1, n, "rep", "norm", False))
        if moe.shared_experts:
            ts += _mlp("moe.shared_experts", m, moe.shared_intermediate, n * moe.shared_experts, "shared_expert")
        if moe.shared_expert_gate:
            ts.append(Tensor("moe.shared_expert_gate", 1, h, n, "rep", "router", True))
        if moe.router_scales:
            ts.append(Tensor("moe.router_scales", h + e, 1, n, "rep", "router", False))
    return ts


@per_spec
def model_tensors(m: ModelSpec) -> tuple[Tensor, ...]:
    """Every parameter tensor of the model (main model only: no MTP/draft layers)."""
    h = m.hidden_size
    L = len(m.attention_layers)  # the attention tensors' count: every layer but a hybrid's state and MLP-only ones
    ts: list[Tensor] = [Tensor("embed_tokens", m.vocab_size, h, 1, "vocab", "embed", False)]
    if m.state_layers:
        ts += _state_mixer(m, len(m.state_layers))

    # Attention
    if m.mla:
        ts += _mla_attention(m, L)
    elif m.compressed:
        ts += _compressed_attention(m)
    else:
        ts += _head_attention(m, L)
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


def _quantized(m: ModelSpec, t: Tensor, scope: str) -> bool:
    if not t.is_matrix or t.part in ("embed", "lm_head", "router", "extra"):
        return False
    if scope == "mlp":  # attention left in the model dtype (ModelOpt NVFP4 checkpoints of MLA models)
        return t.part in ("mlp", "expert", "shared_expert")
    return scope == "linear" or t.part == "expert"


def _own_format(m: ModelSpec, t: Tensor) -> Optional[WeightFormat]:
    """The format a checkpoint of mixed formats keeps `t` in, where it is not weight_dtype's scope."""
    if t.name == "lm_head" and m.lm_head_weight_dtype:
        return weight_format(m.lm_head_weight_dtype)
    if not t.is_matrix:
        return None
    if t.part == "shared_expert" and m.shared_expert_weight_dtype:
        return weight_format(m.shared_expert_weight_dtype)
    if t.part in ("attention", "state") and m.weight_scope == "mlp" and m.attention_weight_dtype:
        # a gated delta net's b and a projections (one output per head) are not among the layers a ModelOpt
        # MIXED_PRECISION checkpoint quantizes: vLLM keeps them in the model dtype
        return weight_format(m.dtype if t.name == "linear_attn.in_proj_ba" else m.attention_weight_dtype)
    return None


def format_and_scope(m: ModelSpec, weight_dtype: Optional[str] = None) -> tuple[WeightFormat, str]:
    """The format quantized layers are held in and which layers it covers: the checkpoint's own, or with
    `weight_dtype` every decoder linear layer in that format."""
    if weight_dtype is None:
        return weight_format(m.weight_dtype), m.weight_scope
    return weight_format(weight_dtype), "linear"


def rank_count(m: ModelSpec, t: Tensor, count: int, tp: "int | Parallel") -> int:
    """How many of `count` copies of `t` one rank holds: all of them, but under expert parallelism only the fullest
    EP rank's share of each MoE layer's routed experts (whole experts, redundant replicas included)."""
    if t.part == "expert" and isinstance(tp, Parallel) and tp.ep > 1 and m.moe:
        e = m.moe.num_experts
        return count // e * tp.local_experts(e)
    return count


def tensor_bytes_per_rank(m: ModelSpec, t: Tensor, tp: "int | Parallel", fmt: WeightFormat, scope: str,
                          mixed: bool = False) -> int:
    """One rank's bytes of `t` in `fmt` over `scope`; with `mixed`, the checkpoint's own format for the tensors a
    checkpoint of mixed formats keeps apart (attention in FP8, a quantized LM head)."""
    out_dim, in_dim = t.shape_per_rank(tp)
    own = _own_format(m, t) if mixed else None
    if own is not None:
        return own.matrix_bytes(out_dim, in_dim) * t.count
    if _quantized(m, t, scope):
        return fmt.matrix_bytes(out_dim, in_dim) * t.count
    return out_dim * in_dim * t.count * DTYPE_BYTES[m.dtype]


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of one rank's weights, split the way a decode step touches them."""

    total: int  # held in memory
    embed: int  # the input embedding table (gathered, not streamed, unless tied to the LM head)
    experts: int  # routed experts (a step reads only the experts its tokens touch)
    extra: int  # held, never read by a decode step (vision tower, projector)
    embed_row: int  # one embedding row: what a token gathers

    @property
    def streamed_dense(self) -> int:
        """Read in full every step: everything but the input embedding, routed experts and extras."""
        return self.total - self.embed - self.experts - self.extra


def gemm_family(weight_dtype: str) -> tuple[str, str]:
    """The GEMM kernel family a weight dtype runs on, and the family it falls back to where a profile lacks it: the
    one owner of that fact for the step model's fits and the roofline's compute peak. 8-bit integers (W8A8) run on
    the 8-bit tensor cores, at fp8's rate where the GPU has it."""
    w = weight_dtype.lower()
    if w in ("bf16", "fp16", "fp32", "bfloat16", "float16"):
        return "bfloat16", "bfloat16"
    if w == "fp8_block128":
        return "fp8_block", "fp8"
    if w.startswith("fp8") or w.startswith("int8"):
        return "fp8", "bfloat16"
    if w in ("nvfp4", "mxfp4"):
        return "nvfp4", "int4_wo"
    return "int4_wo", "bfloat16"  # int4 (AWQ, GPTQ, W4A16), NF4


def moe_family(weight_dtype: str) -> str:
    """The fused-MoE kernel fit that prices routed experts stored in `weight_dtype`: the GEMM family's, except that
    weight-only 4-bit integer experts (W4A16: AWQ, GPTQ, compressed-tensors pack-quantized) are priced as the
    16-bit fused MoE reading their 4-bit bytes, as mxfp4 experts are where a GPU has no fp4 fit. Measured serving
    agrees with that and not with the collected Marlin MoE timings: Kimi-K2.5 (int4, group 32) on TP 8 adds 18 ms
    (B200) and 21 ms (H200) of TPOT from 4 to 64 clients (1,024 in, 1,024 out), where those timings (moe_perf,
    vllm_marlin_int4_moe, 4 -> 64 tokens: 0.133 -> 1.072 ms per layer on B200, 0.130 -> 1.210 on H200, x 60 MoE
    layers) would add 56 and 65 ms."""
    family = gemm_family(weight_dtype)[0]
    return "bfloat16" if family == "int4_wo" else family


def _stage_count(m: ModelSpec, t: Tensor, stage: range) -> int:
    """How many of `t`'s tensors a pipeline stage holding layers `stage` has (vLLM: the embedding on the first
    stage, the final norm and LM head on the last)."""
    L = m.num_layers
    first, last = stage.start == 0, stage.stop == L
    if t.part in ("embed", "extra"):
        return t.count if first else 0
    if t.part == "lm_head" or t.name == "final_norm":
        return t.count if last else 0
    mlps = m.mlp_kinds
    if t.name == "layer_norms":
        return sum(m.layer_norms(i) for i in stage)
    if t.shared:  # a stage builds the shared blocks its attention layers take in turn
        return min(t.count, sum(1 for i in m.attention_layers if i in stage))
    if t.layers:
        layers = list(t.layers)
    elif t.part == "mlp":
        layers = [i for i, k in enumerate(mlps) if k == "dense"]
    elif t.part in ("router", "expert", "shared_expert"):
        layers = [i for i, k in enumerate(mlps) if k == "moe"]
    elif t.part == "attention":
        layers = list(m.attention_layers)
    elif t.part == "state":
        layers = list(m.state_layers)
    else:
        layers = list(range(L))
    inside = sum(1 for i in layers if i in stage)
    return t.count * inside // len(layers) if layers else 0


@per_spec
def weight_bytes(m: ModelSpec, tp: "int | Parallel" = 1, weight_dtype: Optional[str] = None,
                 stage: Optional[range] = None) -> WeightBytes:
    """One rank's weights in the model's checkpoint format, or with every quantizable layer in `weight_dtype`.
    With `stage`, only the layers of that pipeline stage (and the embedding or LM head it holds)."""
    fmt, scope = format_and_scope(m, weight_dtype)
    stage = stage if stage is not None else range(0, m.num_layers)
    last_only = stage.start > 0 and stage.stop == m.num_layers
    sums = {"total": 0, "embed": 0, "experts": 0, "extra": 0}
    embed_row = 0
    for t in model_tensors(m):
        count = _stage_count(m, t, stage)
        if t.part == "embed" and m.tie_word_embeddings and last_only:
            count = t.count  # a later stage cannot share the first stage's table: it loads the LM head itself
        if not count:
            continue
        count = rank_count(m, t, count, tp)
        if count != t.count:
            t = replace(t, count=count)
        b = tensor_bytes_per_rank(m, t, tp, fmt, scope, mixed=weight_dtype is None)
        sums["total"] += b
        if t.part == "embed" and not m.tie_word_embeddings:
            sums["embed"] += b
        if t.part == "embed":
            embed_row = m.hidden_size * DTYPE_BYTES[m.dtype]
        if t.part == "expert":
            sums["experts"] += b
        if t.part == "extra":
            sums["extra"] += b
    return WeightBytes(embed_row=embed_row, **sums)


def pipeline_stages(num_layers: int, pp: int) -> list[range]:
    """vLLM's split of the layers over pipeline stages (distributed/utils.get_pp_indices): an even share each, the
    remainder one layer apiece to the stages before the last."""
    per = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        per[-i] += 1
    out, start = [], 0
    for n in per:
        out.append(range(start, start + n))
        start += n
    return out


# ----------------------------------------------------------------------------------------------------------------
# What the weights take in torch's caching allocator


# torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, default settings: no expandable segments, no
# max_split_size): every request is rounded up to 512 bytes (round_size); requests up to 1 MiB (kSmallSize) come from
# 2 MiB segments of the small pool; a larger request under 10 MiB (kMinLargeAlloc) opens a 20 MiB segment
# (kLargeBuffer), a larger one a segment rounded up to 2 MiB (kRoundLarge); a cached free block is reused best-fit
# (get_free_block); and a large-pool block is split only when more than 1 MiB would be left over (should_split), so a
# tensor whose segment is at most 1 MiB bigger holds the whole segment. torch.cuda.memory_allocated counts blocks.
_MIN_BLOCK = 512
_SMALL_SIZE = 1 << 20
_LARGE_BUFFER = 20 << 20
_MIN_LARGE_ALLOC = 10 << 20
_ROUND_LARGE = 2 << 20


class CachingAllocator:
    """torch's CUDA caching allocator, block by block (see the constants above): segments, the blocks split off
    them, best-fit reuse of cached free blocks (the smallest that fits; among equal sizes the first in segment and
    address order), merging of freed neighbours, and empty_cache() returning the segments with nothing allocated in
    them. Free blocks are kept in a sorted index per pool, so a model of thousands of tensors replays quickly."""

    def __init__(self) -> None:
        self._segments: list[dict] = []  # {"id", "size", "small", "blocks": [[offset, size, allocated], ...]}
        self._where: dict[int, tuple[dict, int]] = {}  # block id -> (segment, offset)
        self._next = 0
        self._seg_ids = 0
        self._free: dict[bool, list] = {True: [], False: []}  # pool -> sorted [(size, segment id, offset)]
        self._blocks: dict[tuple[int, int], tuple[dict, list]] = {}  # (segment id, offset) -> (segment, block)

    def _index(self, seg: dict, blk: list) -> None:
        insort(self._free[seg["small"]], (blk[1], seg["id"], blk[0]))
        self._blocks[(seg["id"], blk[0])] = (seg, blk)

    def _unindex(self, seg: dict, blk: list) -> None:
        pool = self._free[seg["small"]]
        key = (blk[1], seg["id"], blk[0])
        del pool[bisect_left(pool, key)]
        del self._blocks[(seg["id"], blk[0])]

    def malloc(self, size: int) -> int:
        r = max(_MIN_BLOCK, -(-size // _MIN_BLOCK) * _MIN_BLOCK)
        small = r <= _SMALL_SIZE
        pool = self._free[small]
        j = bisect_left(pool, (r, -1, -1))
        if j < len(pool):
            seg, blk = self._blocks[pool[j][1:]]
            self._unindex(seg, blk)
        else:
            size_seg = (2 * _SMALL_SIZE if small else _LARGE_BUFFER if r < _MIN_LARGE_ALLOC
                        else -(-r // _ROUND_LARGE) * _ROUND_LARGE)
            self._seg_ids += 1
            seg = {"id": self._seg_ids, "size": size_seg, "small": small, "blocks": [[0, size_seg, False]]}
            self._segments.append(seg)
            blk = seg["blocks"][0]
        rest = blk[1] - r
        if rest >= _MIN_BLOCK if small else rest > _SMALL_SIZE:
            i = next(i for i, b in enumerate(seg["blocks"]) if b[0] == blk[0])
            tail = [blk[0] + r, rest, False]
            seg["blocks"].insert(i + 1, tail)
            blk[1] = r
            self._index(seg, tail)
        blk[2] = True
        self._next += 1
        self._where[self._next] = (seg, blk[0])
        return self._next

    def free(self, block: int) -> None:
        seg, offset = self._where.pop(block)
        blocks = seg["blocks"]
        i = next(i for i, blk in enumerate(blocks) if blk[0] == offset)
        blocks[i][2] = False
        if i + 1 < len(blocks) and not blocks[i + 1][2]:
            self._unindex(seg, blocks[i + 1])
            blocks[i][1] += blocks.pop(i + 1)[1]
        if i > 0 and not blocks[i - 1][2]:
            self._unindex(seg, blocks[i - 1])
            blocks[i - 1][1] += blocks.pop(i)[1]
            i -= 1
        self._index(seg, blocks[i])

    def empty_cache(self) -> None:
        for seg in self._segments:
            if not any(blk[2] for blk in seg["blocks"]):
                for blk in seg["blocks"]:
                    self._unindex(seg, blk)
        self._segments = [seg for seg in self._segments if any(blk[2] for blk in seg["blocks"])]

    @property
    def allocated(self) -> int:
        return sum(blk[1] for seg in self._segments for blk in seg["blocks"] if blk[2])

    @property
    def reserved(self) -> int:
        return sum(seg["size"] for seg in self._segments)

    @property
    def largest_free_block(self) -> int:
        return max((blk[1] for seg in self._segments for blk in seg["blocks"] if not blk[2]), default=0)


def allocated_bytes(sizes) -> int:
    """torch.cuda.memory_allocated after allocating tensors of `sizes` bytes in turn, none freed, from an empty cache
    (the caching allocator's block sizes: see the constants above)."""
    alloc = CachingAllocator()
    for size in sizes:
        alloc.malloc(size)
    return alloc.allocated


# the checkpoint's tensors vLLM loads into one parameter (QKVParallelLinear, MergedColumnParallelLinear, FusedMoE's
# w13 over all experts of a layer)
_FUSED = {"attn.q_proj": "attn.qkv_proj", "attn.k_proj": "attn.qkv_proj", "attn.v_proj": "attn.qkv_proj",
          "mlp.gate_proj": "mlp.gate_up_proj", "mlp.up_proj": "mlp.gate_up_proj",
          "moe.experts.gate_proj": "moe.experts.w13", "moe.experts.up_proj": "moe.experts.w13",
          "moe.experts.gate_up_proj": "moe.experts.w13", "moe.experts.down_proj": "moe.experts.w2",
          "moe.shared_experts.gate_proj": "moe.shared_experts.gate_up_proj",
          "moe.shared_experts.up_proj": "moe.shared_experts.gate_up_proj"}


def load_allocations(m: ModelSpec, tp: "int | Parallel" = 1, weight_dtype: Optional[str] = None,
                     stage: Optional[range] = None) -> list[int]:
    """One rank's parameter tensors, in bytes, in the order vLLM's model constructors allocate them (the vision
    tower and projector first, then the embedding, layer by layer its mixer's and its MLP's parameters, the final
    norm and the LM head), with the checkpoint's tensors fused the way vLLM fuses them (q/k/v, gate/up, a layer's
    experts); a quantized weight and its scales are separate tensors. With `stage`, a pipeline stage's."""
    fmt, scope = format_and_scope(m, weight_dtype)
    stage = stage if stage is not None else range(0, m.num_layers)
    first, last = stage.start == 0, stage.stop == m.num_layers
    moe_layers = [i for i, k in enumerate(m.mlp_kinds) if k == "moe"]
    layers_of = {"mlp": [i for i, k in enumerate(m.mlp_kinds) if k == "dense"], "attention": list(m.attention_layers),
                 "state": list(m.state_layers), "router": moe_layers, "expert": moe_layers,
                 "shared_expert": moe_layers}

    def sizes_of(t: Tensor, count: int) -> list[int]:
        count = rank_count(m, t, count, tp)
        one = replace(t, count=1)
        total = tensor_bytes_per_rank(m, one, tp, fmt, scope) * count
        if _quantized(m, one, scope):
            out_dim, in_dim = one.shape_per_rank(tp)
            w = math.ceil(out_dim * in_dim * fmt.bits / 8) * count
            return [w, total - w]
        return [total]

    tensors = model_tensors(m)
    out: list[int] = []
    if first:
        out += _encoder_allocations(m, layout_of(tp).attn_tp) if m.vision is not None else []
        for t in tensors:
            if t.part == "extra" and not (m.vision is not None and t.name in _ENCODER_LUMPS):
                out += sizes_of(t, t.count)
        out += [s for t in tensors if t.part == "embed" for s in sizes_of(t, t.count)]
    per_layer = [t for t in tensors if t.part not in ("embed", "extra", "lm_head") and t.name != "final_norm"]
    for i in stage:
        groups: dict[str, list[int]] = {}  # the fused parameters of layer i, in construction order
        for t in per_layer:
            layers = layers_of["attention"] if t.part == "norm" and t.name.startswith("attn.") else \
                layers_of.get(t.part, range(m.num_layers))
            if i not in layers:
                continue
            name, bias = (t.name[:-5], ".bias") if t.name.endswith(".bias") else (t.name, "")
            sizes = sizes_of(t, t.count // len(layers))
            g = groups.setdefault(_FUSED.get(name, name) + bias, [])
            g += [0] * (len(sizes) - len(g))
            for j, n in enumerate(sizes):
                g[j] += n
        out += [n for g in groups.values() for n in g if n]
    if last:
        for t in tensors:
            if t.name == "final_norm" or t.part == "lm_head" or (
                    t.part == "embed" and m.tie_word_embeddings and not first):
                out += sizes_of(t, t.count)
    return out


@per_spec  # grids and sweeps plan one model many times
def allocator_rounding(m: ModelSpec, tp: "int | Parallel" = 1, weight_dtype: Optional[str] = None,
                       stage: Optional[range] = None) -> int:
    """What torch's caching allocator holds for one rank's parameters beyond their bytes (see allocated_bytes): vLLM
    measures "Model loading took" with torch.cuda.memory_allocated (DeviceMemoryProfiler, platforms/cuda.py
    get_current_memory_usage), blocks and all."""
    stage = stage if stage is not None else range(0, m.num_layers)
    sizes = load_allocations(m, tp, weight_dtype, stage)
    return allocated_bytes(sizes) - sum(sizes)


_ENCODER_LUMPS = ("extra.vision_tower", "extra.multimodal_projector")


def _encoder_allocations(m: ModelSpec, tp: int) -> list[int]:
    """The vision tower's and projector's parameters on one rank, in bytes, in construction order: the patch
    convolution and position embedding, then layer by layer the attention's fused qkv and output projections and the
    MLP's (SigLIP/CLIP: fc1 and fc2 with biases and two LayerNorms, siglip.py/clip.py; Pixtral: fused gate_up and
    down with two RMSNorms, pixtral.py), then the projector's two linear layers (its second one hidden x hidden)."""
    v = m.vision
    assert v is not None
    b = DTYPE_BYTES[m.dtype]
    d, i, layers, th = v.hidden_size, v.intermediate_size, v.num_layers, m.hidden_size
    if v.kind == "pixtral":
        sharded = [3 * d * d // tp, d * d // tp, 2 * i * d // tp, i * d // tp]
        whole = [d, d]
    else:
        sharded = [3 * d * d // tp, 3 * d // tp, d * d // tp, i * d // tp, i // tp, d * i // tp]
        whole = [d, d, d, d, d, d]  # out_proj's and fc2's biases, two LayerNorms' weights and biases
    tower_sharded = m.extra_params.get("vision_tower", 0) // tp - layers * sum(sharded)
    tower_whole = m.replicated_params.get("vision_tower", 0) - layers * sum(whole)
    out = [n * b for n in (tower_whole, tower_sharded) if n > 0]
    for _ in range(layers):
        out += [n * b for n in sharded + whole]
    proj = m.extra_params.get("multimodal_projector", 0) // tp
    second = th * th // tp if proj > th * th // tp else 0  # a projector of one layer (Gemma 3's) has no second
    out += [n * b for n in (m.replicated_params.get("multimodal_projector", 0), proj - second, second) if n > 0]
    return out
