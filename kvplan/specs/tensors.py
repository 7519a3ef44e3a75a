"""The record of a model's parameter tensors (`Tensor`) and its helpers: what each part of a model holds, as vLLM
and transformers build it. The spec values that own tensors (the state mixers of kvplan.specs.mixers) list theirs
with these; kvplan.sizing.model_tensors gathers every part's into one list."""

from __future__ import annotations

import math
from typing import Literal

from kvplan.specs.parallel import Parallel
from kvplan.values import frozen_dataclass

Shard = Literal["col", "row", "rep", "kv", "vocab"]
Part = Literal["embed", "lm_head", "attention", "state", "mlp", "expert", "shared_expert", "router", "norm", "extra"]


# vLLM pads the vocabulary of VocabParallelEmbedding / ParallelLMHead to a multiple of 64 (DEFAULT_VOCAB_PADDING_SIZE).
VOCAB_PADDING = 64


def padded_vocab(rows: int) -> int:
    """The vocabulary rows vLLM allocates: `rows` rounded up to a multiple of VOCAB_PADDING."""
    return -(-rows // VOCAB_PADDING) * VOCAB_PADDING


@frozen_dataclass
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


def linear(name, out_dim, in_dim, count, shard, part, bias=False, bias_shard=None, kv_heads=0,
           layers: tuple[int, ...] = (), loaded_copy: bool = False) -> list[Tensor]:
    """A linear layer's weight, and its bias where it has one."""
    ts = [Tensor(name, out_dim, in_dim, count, shard, part, True, kv_heads, layers, loaded_copy)]
    if bias:
        # A column-parallel bias is split with its outputs; a row-parallel bias is added once, so every rank holds it.
        bshard = bias_shard or (shard if shard in ("col", "kv") else "rep")
        ts.append(Tensor(name + ".bias", out_dim, 1, count, bshard, part, False, kv_heads, layers, loaded_copy))
    return ts
