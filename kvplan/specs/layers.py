"""The per-layer view of a model (ModelSpec.layers): each layer's mixer and MLP as values, built once from the spec's
tuples (mixers or the attention pattern, kv_heads_per_layer, head_dims, v_from_k, indexed, state_of, mlps,
intermediate_sizes, norms), so that code over the layers reads one record per layer instead of indexing each tuple.

A layer's mixer is an Attention (full, sliding or chunked: its KV heads, head size, window), a state mixer (a
kvplan.specs.mixers class: its cache, tensors and TP split are its methods) or None (an MLP-only block); its MLP is a
Dense one, a MoE one or None."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from kvplan.specs.mixers import StateSpec
from kvplan.values import frozen_dataclass

LayerKind = Literal["full", "sliding", "chunked"]  # the attention layers, whose cache grows with the sequence


@frozen_dataclass
class Attention:
    """An attention layer whose cache grows with the sequence (or up to its window)."""

    kind: LayerKind
    kv_heads: int
    head_dim: Optional[int]  # None for MLA, whose cache is the latent
    window: Optional[int]  # a sliding layer's window, a chunked layer's chunk; None: every token
    v_from_k: bool = False  # no v_proj in the checkpoint, V loaded from K (Gemma 4's global layers)
    indexed: bool = False  # a sparse-attention indexer of its own, with its own key cache (DeepSeek-V3.2)


@frozen_dataclass
class Dense:
    """A dense MLP of `width` intermediate channels."""

    width: int


@frozen_dataclass
class MoE:
    """A mixture-of-experts MLP (the model's one MoESpec)."""

    spec: Any  # the model's MoESpec (kvplan.specs.model)


Mixer = Union[Attention, StateSpec, None]
Mlp = Union[Dense, MoE, None]


@frozen_dataclass
class Layer:
    index: int
    mixer: Mixer
    mlp: Mlp
    norms: int

    @property
    def attention(self) -> Optional[Attention]:
        return self.mixer if isinstance(self.mixer, Attention) else None

    @property
    def state(self) -> Optional[StateSpec]:
        return self.mixer if isinstance(self.mixer, StateSpec) else None
