"""The per-layer view of a model (ModelSpec.layers): each layer's mixer and MLP as values, built once from the spec's
tuples (mixers or the attention pattern, kv_heads_per_layer, head_dims, v_from_k, indexed, state_of, mlps,
intermediate_sizes, norms), so that code over the layers reads one record per layer instead of indexing each tuple.

A layer's mixer is an attention mixer (AttentionMixer: full, sliding or chunked; an Attention of K and V heads or a
LatentAttention, MLA's one latent per token), a state mixer (a kvplan.specs.mixers class) or None (an MLP-only
block); its MLP is a Dense one, a MoE one or None. Each class owns what its layer costs, as the state mixers do: the
cache it holds per token on one of `tp` ranks in a KV format (cache_bytes_per_token), its tensors (tensors: names,
shapes, how TP splits them) and the figures a step's price is made of (an attention's FLOPs per cached token and the
head size its decode kernel walks; the GEMMs' shapes are its tensors'). kvplan.sizing asks the layers for these
instead of branching on their kind, so that a new mixer or MLP is one class here and its mapping: from the spec to
the class (ModelSpec._attention_mixer, ModelSpec._mlp_block) and from config.json to the spec
(kvplan.specs.hf_layers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from kvplan.specs.mixers import StateSpec
from kvplan.specs.tensors import Part, Tensor, linear
from kvplan.units import DTYPE_BYTES
from kvplan.values import frozen_dataclass

if TYPE_CHECKING:
    from kvplan.specs.kv_formats import KVFormat

LayerKind = Literal["full", "sliding", "chunked"]  # the attention layers, whose cache grows with the sequence


def mlp_tensors(prefix: str, width: int, hidden: int, count: int, part: Part, gated: bool, bias: bool = False,
                layers: tuple[int, ...] = ()) -> list[Tensor]:
    """An MLP of `width` channels: gate and up (or up alone, not `gated`) and down, `count` of them."""
    ts: list[Tensor] = []
    if gated:
        if bias:  # gpt-oss stores gate and up fused, with one bias of 2*width
            ts += linear(f"{prefix}.gate_up_proj", 2 * width, hidden, count, "col", part, bias=True, layers=layers)
        else:
            ts += linear(f"{prefix}.gate_proj", width, hidden, count, "col", part, layers=layers)
            ts += linear(f"{prefix}.up_proj", width, hidden, count, "col", part, layers=layers)
    else:
        ts += linear(f"{prefix}.up_proj", width, hidden, count, "col", part, bias=bias, layers=layers)
    ts += linear(f"{prefix}.down_proj", hidden, width, count, "row", part, bias=bias, layers=layers)
    return ts


# ----------------------------------------------------------------------------------------------------------------
# The attention mixers


class AttentionMixer:
    """What every attention mixer answers, its cache growing with the sequence (or up to its window); each kind a
    frozen value of its own fields, among them `kind` (full, sliding or chunked), `window` (a sliding layer's window,
    a chunked layer's chunk; None: every token), `indexed` (a sparse-attention indexer of its own) and `heads` (its
    query heads). The defaults here answer for a kind with nothing of its own there (no indexer, no q/k norms)."""

    # -- its cache -------------------------------------------------------------------------------------------------

    def kv_heads_per_rank(self, tp: int) -> int:
        """The KV heads one of `tp` ranks caches (a latent counts as one, whole on every rank)."""
        raise NotImplementedError

    def cache_bytes_per_token(self, fmt: "KVFormat", tp: int, dtype: str, v_padded: bool = False) -> float:
        """One token's cache on one of `tp` ranks in `fmt`, in a model of `dtype` (`v_padded`: V padded to the K
        head size, where the layer's V head is smaller)."""
        raise NotImplementedError

    @property
    def read_window(self) -> Optional[int]:
        """The most cached tokens of a sequence one decode step reads (None: all of them)."""
        return self.window  # type: ignore[attr-defined]

    @property
    def indexer_bytes_per_token(self) -> int:
        """A second cache of the layer's own, a sparse-attention indexer's keys, per token (0: none)."""
        return 0

    # -- its tensors -----------------------------------------------------------------------------------------------

    @property
    def tensor_shape(self) -> tuple:
        """What sets the layer's tensors apart from another attention layer's of the model: layers alike in it
        share their tensors' records."""
        return ()

    def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = (),
                input_size: Optional[int] = None) -> list[Tensor]:
        """`count` layers' projections, as vLLM builds them (`layers`: the layers holding them, where others hold
        another shape's; `input_size`: what the projections read, where wider than the hidden state)."""
        raise NotImplementedError

    def norm_tensors(self, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
        """The q and k norms of `count` layers."""
        return []

    def indexer_tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
        """A sparse-attention indexer's tensors, `count` of the layers holding one."""
        return []

    # -- its step --------------------------------------------------------------------------------------------------

    @property
    def kernel_head_dim(self) -> int:
        """The head size the decode attention kernel walks."""
        raise NotImplementedError

    @property
    def flops_per_token_head(self) -> int:
        """FLOPs one query head spends on one cached token in decode."""
        raise NotImplementedError

    @property
    def prefill_flops_per_token_head(self) -> int:
        """FLOPs one query head spends on one earlier token of a prompt."""
        raise NotImplementedError


@frozen_dataclass
class Attention(AttentionMixer):
    """An attention layer whose cache grows with the sequence (or up to its window): `heads` query heads over
    `kv_heads` KV heads of `head_dim`, and the projections every attention layer of the model shares the form of."""

    kind: LayerKind
    kv_heads: int
    head_dim: Optional[int]  # None where the model names none
    window: Optional[int]  # a sliding layer's window, a chunked layer's chunk; None: every token
    v_from_k: bool = False  # no v_proj in the checkpoint, V loaded from K (Gemma 4's global layers)
    indexed: bool = False  # a sparse-attention indexer of its own, with its own key cache (DeepSeek-V3.2)
    heads: int = 0  # query heads
    v_head_dim: Optional[int] = None  # V's head size where smaller than K's (MiMo-V2-Flash)
    q_gate: bool = False  # q_proj also yields a gate on the output: twice the query width (Qwen3-Next)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: Optional[Literal["head", "full"]] = None  # RMSNorm on q and k per head, or across all heads

    # -- its cache -------------------------------------------------------------------------------------------------

    def kv_heads_per_rank(self, tp: int) -> int:
        """The KV heads one of `tp` ranks caches: vLLM replicates them where TP exceeds them."""
        return max(1, self.kv_heads // tp)

    def cache_bytes_per_token(self, fmt: "KVFormat", tp: int, dtype: str, v_padded: bool = False) -> float:
        """One token's K and V on one of `tp` ranks in `fmt`, in a model of `dtype`. V is cached at v_head_dim where
        the layer has one (vLLM's head_size_v), or, `v_padded`, padded to the K head size (vLLM 0.19)."""
        from kvplan.specs.kv_formats import whole  # loaded with the format already

        assert self.head_dim is not None
        dv = None if v_padded else self.v_head_dim
        bits = DTYPE_BYTES[dtype] * 8
        return whole(self.kv_heads_per_rank(tp) * fmt.bytes_per_token_per_kv_head(self.head_dim, dv, model_bits=bits))

    # -- its tensors -----------------------------------------------------------------------------------------------

    @property
    def tensor_shape(self) -> tuple:
        return self.kv_heads, self.head_dim, self.v_from_k

    def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = (),
                input_size: Optional[int] = None) -> list[Tensor]:
        d, kv, h_in = self.head_dim, self.kv_heads, input_size or hidden
        assert d is not None
        ts = linear("attn.q_proj", self.heads * d * (2 if self.q_gate else 1), h_in, count, "col", "attention",
                    bias=self.qkv_bias, layers=layers)
        vd = self.v_head_dim or d
        for name, width in (("k_proj", d), ("v_proj", vd)):
            ts += linear(f"attn.{name}", kv * width, h_in, count, "kv", "attention", bias=self.qkv_bias, kv_heads=kv,
                         layers=layers, loaded_copy=self.v_from_k and name == "v_proj")
        ts += linear("attn.o_proj", hidden, self.heads * vd, count, "row", "attention", bias=self.o_bias,
                     layers=layers)
        return ts

    def norm_tensors(self, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
        """The q and k norms of `count` layers: across all heads (split with them) or per head (whole)."""
        d, kv = self.head_dim, self.kv_heads
        assert d is not None
        if self.qk_norm == "full":
            return [Tensor("attn.q_norm", self.heads * d, 1, count, "col", "norm", False, layers=layers),
                    Tensor("attn.k_norm", kv * d, 1, count, "kv", "norm", False, kv, layers=layers)]
        if self.qk_norm == "head":
            return [Tensor("attn.q_norm", d, 1, count, "rep", "norm", False, layers=layers),
                    Tensor("attn.k_norm", d, 1, count, "rep", "norm", False, layers=layers)]
        return []

    # -- its step --------------------------------------------------------------------------------------------------

    @property
    def kernel_head_dim(self) -> int:
        """The head size the decode attention kernel walks (128 where the layer names none)."""
        return self.head_dim or 128

    @property
    def flops_per_token_head(self) -> int:
        """FLOPs one query head spends on one cached token in decode: QK^T and PV."""
        return 4 * (self.head_dim or 0)

    @property
    def prefill_flops_per_token_head(self) -> int:
        """FLOPs one query head spends on one earlier token of a prompt: QK^T and PV."""
        return 4 * (self.head_dim or 128)


@frozen_dataclass
class LatentAttention(AttentionMixer):
    """Multi-head latent attention (DeepSeek-V2/V3): the cache holds one latent per token, whole on every rank,
    shared by all heads; with an indexer (DeepSeek-V3.2), a step reads the index_topk tokens it picks."""

    kind: LayerKind
    window: Optional[int]
    mla: Any  # the model's MLASpec (kvplan.specs.model)
    heads: int
    indexed: bool = False
    o_bias: bool = False

    def kv_heads_per_rank(self, tp: int) -> int:
        return 1

    def cache_bytes_per_token(self, fmt: "KVFormat", tp: int, dtype: str, v_padded: bool = False) -> float:
        return fmt.mla_bytes_per_token(self.mla.kv_lora_rank, self.mla.qk_rope_head_dim, DTYPE_BYTES[dtype] * 8)

    @property
    def sparse(self) -> bool:
        """DeepSeek sparse attention: the layers pick their keys with an indexer."""
        return bool(self.mla.index_head_dim)

    @property
    def read_window(self) -> Optional[int]:
        # sparse attention: the latent cache grows with the sequence but a step reads the index_topk best tokens
        return self.mla.index_topk if self.sparse else self.window

    @property
    def indexer_bytes_per_token(self) -> int:
        # read in full every step; a layer reusing an earlier indexer's choice has none
        return self.mla.indexer_bytes_per_token if self.indexed else 0

    def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = (),
                input_size: Optional[int] = None) -> list[Tensor]:
        a, h, H, L = self.mla, hidden, self.heads, count
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        ts: list[Tensor] = []
        if a.q_lora_rank:
            ts += linear("attn.q_a_proj", a.q_lora_rank, h, L, "rep", "attention")
            ts.append(Tensor("attn.q_a_layernorm", a.q_lora_rank, 1, L, "rep", "norm", False))
            ts += linear("attn.q_b_proj", H * qk, a.q_lora_rank, L, "col", "attention")
        else:
            ts += linear("attn.q_proj", H * qk, h, L, "col", "attention")
        ts += linear("attn.kv_a_proj_with_mqa", a.latent_dim, h, L, "rep", "attention")
        ts.append(Tensor("attn.kv_a_layernorm", a.kv_lora_rank, 1, L, "rep", "norm", False))
        ts += linear("attn.kv_b_proj", H * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, L, "col", "attention")
        ts += linear("attn.o_proj", h, H * a.v_head_dim, L, "row", "attention", bias=self.o_bias)
        if a.output_gate:
            ts += linear("attn.g_proj", H * a.v_head_dim, h, L, "col", "attention")
        return ts

    def indexer_tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
        # the lightning indexer's projections and norm, whole on every rank
        a, n, at = self.mla, count, layers
        if not (a.index_n_heads and a.index_head_dim):
            return []
        dq = a.q_lora_rank or hidden
        ts = linear("attn.indexer.wq_b", a.index_n_heads * a.index_head_dim, dq, n, "rep", "attention", layers=at)
        ts += linear("attn.indexer.wk", a.index_head_dim, hidden, n, "rep", "attention", layers=at)
        ts.append(Tensor("attn.indexer.k_norm", 2 * a.index_head_dim, 1, n, "rep", "norm", False, layers=at))
        ts += linear("attn.indexer.weights_proj", a.index_n_heads, hidden, n, "rep", "attention", layers=at)
        return ts

    @property
    def kernel_head_dim(self) -> int:
        return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim

    @property
    def flops_per_token_head(self) -> int:
        # absorbed: the score over latent and rope, the value over the latent
        return 2 * self.mla.latent_dim + 2 * self.mla.kv_lora_rank

    @property
    def prefill_flops_per_token_head(self) -> int:
        # a prompt runs unabsorbed, as multi-head attention over keys of the nope and rope parts and values of
        # v_head_dim
        return 2 * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim) + 2 * self.mla.v_head_dim


# ----------------------------------------------------------------------------------------------------------------
# The MLPs


@frozen_dataclass
class Dense:
    """A dense MLP of `width` intermediate channels."""

    width: int
    gated: bool = True  # gate, up and down (SwiGLU); False: up and down
    bias: bool = False

    @property
    def tensor_shape(self) -> tuple:
        """What sets its tensors apart from another dense MLP's of the model."""
        return (self.width,)

    def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
        """`count` layers' projections (`layers`: the layers holding them, where others hold another width's)."""
        return mlp_tensors("mlp", self.width, hidden, count, "mlp", self.gated, bias=self.bias, layers=layers)


@frozen_dataclass
class MoE:
    """A mixture-of-experts MLP (the model's one MoESpec)."""

    spec: Any  # the model's MoESpec (kvplan.specs.model)
    gated: bool = True  # the experts' and shared experts' form, as Dense's
    bias: bool = False  # biases on the latent projections (the model's dense MLP biases)

    def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
        """`count` layers' router, experts (each expert one record of the `count` x experts), latent projections,
        shared experts and gates."""
        moe, h, n, g = self.spec, hidden, count, self.gated
        e = moe.num_experts
        ts = linear("moe.router", e, h, n, "rep", "router", bias=moe.router_bias)
        if moe.score_correction_bias:
            ts.append(Tensor("moe.e_score_correction_bias", e, 1, n, "rep", "router", False))
        ts += mlp_tensors("moe.experts", moe.expert_intermediate_size, moe.latent_size or h, n * e, "expert", g,
                          bias=moe.expert_bias)
        if moe.latent_size:
            ts += linear("moe.fc1_latent_proj", moe.latent_size, h, n, "rep", "router", bias=self.bias)
            ts += linear("moe.fc2_latent_proj", h, moe.latent_size, n, "rep", "router", bias=self.bias)
            if moe.latent_norm:
                ts.append(Tensor("moe.latent_norm", moe.latent_size, 1, n, "rep", "norm", False))
        if moe.shared_experts:
            ts += mlp_tensors("moe.shared_experts", moe.shared_intermediate, h, n * moe.shared_experts,
                              "shared_expert", g)
        if moe.shared_expert_gate:
            ts.append(Tensor("moe.shared_expert_gate", 1, h, n, "rep", "router", True))
        if moe.router_scales:
            ts.append(Tensor("moe.router_scales", h + e, 1, n, "rep", "router", False))
        return ts


Mixer = Union[AttentionMixer, StateSpec, None]
Mlp = Union[Dense, MoE, None]


@frozen_dataclass
class Layer:
    index: int
    mixer: Mixer
    mlp: Mlp
    norms: int

    @property
    def attention(self) -> Optional[AttentionMixer]:
        return self.mixer if isinstance(self.mixer, AttentionMixer) else None

    @property
    def state(self) -> Optional[StateSpec]:
        return self.mixer if isinstance(self.mixer, StateSpec) else None
