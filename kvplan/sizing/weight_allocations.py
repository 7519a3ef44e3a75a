"""What one rank's weights take in torch's caching allocator: the parameter tensors in the order vLLM's model
constructors allocate them, and the allocator's blocks beyond their bytes."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from kvplan.memo import per_spec
from kvplan.sizing.caching_allocator import allocated_bytes
from kvplan.sizing.model_tensors import Tensor, model_tensors
from kvplan.sizing.weights import (
    _quantized,
    format_and_scope,
    rank_count,
    tensor_bytes_per_rank,
)
from kvplan.specs.catalog import ModelSpec
from kvplan.specs.parallel import Parallel, layout_of
from kvplan.units import DTYPE_BYTES

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
                t.layers if t.part == "state" and t.layers else layers_of.get(t.part, range(m.num_layers))
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
