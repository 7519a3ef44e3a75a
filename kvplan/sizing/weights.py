"""One rank's weight bytes in a checkpoint format: per tensor, per pipeline stage, and split the way a decode step
touches them (the tensors come from kvplan.sizing.model_tensors, their formats from kvplan.sizing.weight_formats).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from kvplan.memo import per_spec
from kvplan.sizing.model_tensors import Tensor, model_tensors
from kvplan.sizing.weight_formats import WeightFormat, weight_format
from kvplan.specs.catalog import ModelSpec
from kvplan.specs.parallel import Parallel
from kvplan.units import DTYPE_BYTES
from kvplan.values import frozen_dataclass


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


@frozen_dataclass
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

