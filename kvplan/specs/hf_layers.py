"""Per-layer readers of config.json: which layers hold attention of which kind, a fixed state (Mamba, gated
delta nets, lightning attention), or another block (Nemotron's NAS layers, Zamba2's shared blocks,
DeepSeek-V4's compressed caches), as vLLM builds each family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.files import type_name
from kvplan.specs.hf_fields import (
    _dt_rank,
    _dtype_of,
    _Fields,
    _is_int,
    _name_from_path,
    _served_dtype,
)


def _indexed_layers(c: "_Fields", layers: int, path: Path | str) -> tuple[bool, ...]:
    """The layers vLLM builds a DeepSeek sparse-attention indexer in (deepseek_v2.py / deepseek_v32, IndexCache):
    with index_topk_pattern, those marked other than "S"; else those where max(layer - index_skip_topk_offset + 1,
    0) is a multiple of index_topk_freq (1 and 2 by default: every layer). The others reuse the top-k of the last
    indexer before them, and vLLM drops their indexer weights. (indexer_types, where a config has it, says the same
    in words; vLLM does not read it.)"""
    pattern = c.data.get("index_topk_pattern")
    if pattern is not None:
        if not isinstance(pattern, (str, list)) or len(pattern) != layers:
            raise KvplanError(f"{path}: field '{c.prefix}index_topk_pattern': expected one letter per layer "
                              f"({layers}), found {type_name(pattern)}")
        return tuple(p != "S" for p in pattern)
    freq = c.integer("index_topk_freq", minimum=1) or 1
    offset = c.integer("index_skip_topk_offset")
    offset = 2 if offset is None else offset
    return tuple(max(i - offset + 1, 0) % freq == 0 for i in range(layers))


def _nas_layers(c: "_Fields", layers: int, hidden: int, heads: int, path: Path | str) -> dict:
    """A NAS model's blocks (Llama-Nemotron's DeciLM, `block_configs`), as vLLM builds them (nemotron_nas.py):
    each layer's attention with num_attention_heads / n_heads_in_group KV heads, or none (no_op), and its gated MLP
    of ffn_mult (2/3 x ffn_mult x hidden, rounded up to a multiple of 256) or intermediate_size, or none; a norm
    before each of the two that is present. vLLM builds no linear replacement (replace_with_linear) of either."""
    blocks = c.items("block_configs", lambda b: isinstance(b, dict), "a list of per-layer block objects")
    if len(blocks) != layers:
        raise KvplanError(f"{path}: {c.prefix}block_configs lists {len(blocks)} blocks; num_hidden_layers is {layers}")
    mixers, mlps, kv_heads, widths, norms = [], [], [], [], []
    for i in range(layers):
        block = _Fields(blocks[i], path, f"{c.prefix}block_configs.{i}.")
        attn, ffn = block.section("attention"), block.section("ffn")
        if attn is None or ffn is None:
            raise KvplanError(f"{path}: field '{block.prefix}{'attention' if attn is None else 'ffn'}' is missing; "
                              f"a block_configs entry has attention and ffn")
        for part in (attn, ffn):
            if part.flag("replace_with_linear") and not part.flag("no_op"):
                raise KvplanError(f"{path}: field '{part.prefix}replace_with_linear': vLLM builds no linear "
                                  f"replacement of a block (nemotron_nas.py), so it does not serve this model")
        if attn.flag("no_op"):
            mixers.append("none")
            kv_heads.append(None)
        else:
            group = attn.need("n_heads_in_group")
            if heads % group:
                raise KvplanError(f"{path}: field '{attn.prefix}n_heads_in_group': {group} does not divide "
                                  f"num_attention_heads {heads}")
            mixers.append("full")
            kv_heads.append(heads // group)
        if ffn.flag("no_op"):
            mlps.append("none")
            widths.append(None)
        else:
            mult = ffn.data.get("ffn_mult")
            if mult is not None:
                if isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult <= 0:
                    raise KvplanError(f"{path}: field '{ffn.prefix}ffn_mult': expected a positive number, found "
                                      f"{type_name(mult)}")
                width = int(2 * mult * hidden / 3)
                width = width if width % 256 == 0 else width + 256 - width % 256
            else:
                width = ffn.need("intermediate_size")
            mlps.append("dense")
            widths.append(width)
        norms.append((mixers[-1] != "none") + (mlps[-1] != "none"))
    # a block without attention (or MLP) takes the largest size of the others, which nothing reads
    fill = lambda sizes: tuple(max((n for n in sizes if n), default=1) if n is None else n for n in sizes)  # noqa: E731
    return {"mixers": tuple(mixers), "mlps": tuple(mlps), "norms": tuple(norms), "kv_heads_per_layer": fill(kv_heads),
            "intermediate_sizes": fill(widths)}


def _gemma4_layers(c: "_Fields", pattern: list, layers: int, kv_heads: int, head_dim: int) -> dict:
    """Gemma 4's global (full-attention) layers: heads of global_head_dim, and with attention_k_eq_v no v_proj (V is
    K) and num_global_key_value_heads KV heads. vLLM builds each layer with its own sizes (gemma4.py), loads K into
    the V slot and caches K and V apart."""
    full = [pattern[i % len(pattern)] == "full" for i in range(layers)]
    k_eq_v = bool(c.flag("attention_k_eq_v"))
    global_dim = c.integer("global_head_dim", minimum=1) or head_dim
    global_kv = (c.integer("num_global_key_value_heads", minimum=1) or kv_heads) if k_eq_v else kv_heads
    out: dict[str, Any] = {}
    if global_dim != head_dim:
        out["head_dims"] = tuple(global_dim if f else head_dim for f in full)
    if global_kv != kv_heads:
        out["kv_heads_per_layer"] = tuple(global_kv if f else kv_heads for f in full)
    if k_eq_v and any(full):
        out["v_from_k"] = tuple(full)
    return out


_SWA_SIZES = ("swa_num_key_value_heads", "swa_head_dim", "swa_num_attention_heads", "swa_v_head_dim")


def _swa_layers(c: "_Fields", family: str, pattern: list, layers: int, kv_heads: int, head_dim: int,
                path: Path | str) -> dict:
    """Sliding-window layers with sizes of their own, in MiMo-V2-Flash's names (vLLM's mimo_v2_flash.py):
    swa_num_key_value_heads and swa_head_dim beside the full layers' num_key_value_heads and head_dim, and a V head
    of v_head_dim (swa_v_head_dim) where K's is larger. MiMoV2FlashConfig gives a sliding layer twice the full
    layers' KV heads and V heads of 128 where the config names none."""
    kinds = [pattern[i % len(pattern)] for i in range(layers)]
    swa_kv = c.integer("swa_num_key_value_heads", minimum=1) or (2 * kv_heads if family == "mimo_v2_flash"
                                                                 else kv_heads)
    swa_dim = c.integer("swa_head_dim", minimum=1) or head_dim
    heads = c.need("num_attention_heads")
    if (c.integer("swa_num_attention_heads", minimum=1) or heads) != heads:
        raise KvplanError(f"{path}: {c.prefix}swa_num_attention_heads differs from num_attention_heads ({heads}): "
                          f"sliding layers with query heads of their own are not modelled")
    v_dim = c.integer("v_head_dim", minimum=1) or (128 if family == "mimo_v2_flash" else None)
    if (c.integer("swa_v_head_dim", minimum=1) or v_dim) != v_dim:
        raise KvplanError(f"{path}: {c.prefix}swa_v_head_dim differs from v_head_dim: V heads of two sizes are "
                          f"not modelled")
    out: dict[str, Any] = {}
    if swa_kv != kv_heads:
        out["kv_heads_per_layer"] = tuple(swa_kv if k == "sliding" else kv_heads for k in kinds)
    if swa_dim != head_dim:
        out["head_dims"] = tuple(swa_dim if k == "sliding" else head_dim for k in kinds)
    if v_dim and v_dim != max(swa_dim, head_dim):
        if v_dim > min(swa_dim, head_dim):
            raise KvplanError(f"{path}: {c.prefix}v_head_dim {v_dim} is larger than the K head size: not modelled")
        out["v_head_dim"] = v_dim
    if c.flag("add_full_attention_sink_bias"):
        out["attention_sinks"] = True
    elif c.flag("add_swa_attention_sink_bias"):
        out["attention_sinks"] = "sliding"
    return out


# architectures whose layers keep a fixed per-sequence state (Mamba, Mamba-2, linear attention, short convolutions)
# beside or instead of attention: vLLM serves them with its hybrid KV-cache manager, which kvplan does not model yet
_STATE_SPACE_TYPES = {
    "zamba": "Zamba (Mamba + shared attention)",
    "bamba": "Bamba (Mamba-2 + attention)",
    "falcon_h1": "Falcon-H1 (Mamba-2 + attention)",
    "lfm2": "LFM2 (short convolution + attention)",
    "plamo2": "PLaMo 2 (Mamba + attention)",
}
# hybrids kvplan reads layer by layer (_hybrid_layers)
_HYBRIDS_READ = {"nemotron_h", "jamba", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
                 "kimi_linear", "granitemoehybrid"}
_STATE_LAYER_TYPES = {"linear_attention", "mamba", "mamba2", "conv", "short_conv", "gated_delta_net",
                      "lightning_attention", "kda", "ssm"}


def _refuse_unmodelled_layers(top: "_Fields", c: "_Fields", model_type: str, path: Path | str) -> None:
    """A layout kvplan cannot size is refused with the field that describes it, never priced as attention."""
    def refuse(what: str) -> None:
        raise KvplanError(f"{path}: {what}: kvplan does not model layers that keep a per-sequence state (vLLM's "
                          f"hybrid KV-cache manager) yet, and will not price them as attention")

    for f in (c, top):
        mt = (f.text("model_type") or "").lower()
        if mt in _STATE_SPACE_TYPES:
            refuse(f"model_type '{mt}' is {_STATE_SPACE_TYPES[mt]}")
    if model_type in _HYBRIDS_READ or model_type in _MINIMAX_LINEAR:
        return
    pattern = c.text("hybrid_override_pattern")
    if pattern and "M" in pattern:
        refuse(f"hybrid_override_pattern '{pattern[:24]}...' has Mamba layers ('M')")
    blocks = c.data.get("layers_block_type")
    if isinstance(blocks, list) and any(str(b).lower() in ("mamba", "mamba2", "linear_attention") for b in blocks):
        refuse("layers_block_type has Mamba layers")
    kinds = c.data.get("attn_type_list")
    if isinstance(kinds, list) and any(k == 0 for k in kinds):
        refuse("attn_type_list has linear (lightning) attention layers (0)")
    period = c.data.get("attn_layer_period")
    if _is_int(period) and period > 1:
        refuse(f"attn_layer_period {period}: attention every {period} layers, Mamba between")
    types = c.data.get("layer_types")
    if isinstance(types, list):
        state = sorted({str(t) for t in types} & _STATE_LAYER_TYPES)
        if state:
            refuse(f"layer_types has {', '.join(repr(t) for t in state)} layers")
    if c.data.get("linear_attn_config") is not None:
        refuse("linear_attn_config describes linear-attention layers")
    if c.data.get("index_n_heads") is not None and not c.has("kv_lora_rank") and c.data.get("compress_ratios") is None:
        raise KvplanError(f"{path}: index_n_heads: an indexed sparse attention without MLA is not modelled")
    if model_type.startswith("gemma4"):
        if c.integer("hidden_size_per_layer_input"):
            raise KvplanError(f"{path}: {c.prefix}hidden_size_per_layer_input: Gemma 4's per-layer input embeddings "
                              f"are not modelled yet")
        if c.integer("num_kv_shared_layers"):
            raise KvplanError(f"{path}: {c.prefix}num_kv_shared_layers: layers reading an earlier layer's KV cache "
                              f"(Gemma 4) are not modelled yet")
    elif c.data.get("global_head_dim") is not None or c.data.get("num_global_key_value_heads") is not None:
        raise KvplanError(f"{path}: global_head_dim / num_global_key_value_heads: layers with their own KV heads "
                          f"and head sizes outside Gemma 4 are not modelled")


def _deepseek_v4(c: "_Fields", top: "_Fields", layers: int, out: dict, path: Path | str) -> dict:
    """DeepSeek-V4 (DeepseekV4ForCausalLM): compress_ratios gives each layer's tokens per compressed entry (0: the
    sliding window alone); the list also covers the next-token-prediction layers, which are not part of the model.
    The routed experts are MXFP4 when expert_dtype is "fp4" (vLLM's DeepseekV4 quantization config), NVFP4 in
    NVIDIA's ModelOpt checkpoints, and the other linear layers FP8 in 128x128 blocks."""
    ratios = c.items("compress_ratios", _is_int, "a list of whole numbers such as [0, 0, 4, 128, ...]") or []
    if len(ratios) < layers:
        raise KvplanError(f"{path}: {c.prefix}compress_ratios lists {len(ratios)} layers; the model has {layers}")
    ratios = [max(1, r) for r in ratios[:layers]]
    bad = sorted({r for r in ratios if r not in (1, 4, 128)})
    if bad:
        raise KvplanError(f"{path}: {c.prefix}compress_ratios holds {bad[0]}: vLLM's DeepSeek-V4 compressor takes "
                          f"ratios 4 and 128 (0: no compression)")
    window = c.need("sliding_window")
    spec = {"head_dim": c.need("head_dim"), "rope_head_dim": c.need("qk_rope_head_dim"),
            "q_lora_rank": c.need("q_lora_rank"), "o_lora_rank": c.need("o_lora_rank"), "o_groups": c.need("o_groups"),
            "sliding_window": window, "compress_ratios": tuple(ratios),
            "index_n_heads": c.need("index_n_heads"), "index_head_dim": c.need("index_head_dim"),
            "index_topk": c.need("index_topk"), "hc_mult": c.integer("hc_mult", minimum=1) or 1}
    res: dict[str, Any] = {
        "compressed": spec, "num_kv_heads": 1, "head_dim": spec["head_dim"],
        "attention": {"pattern": ["sliding"], "sliding_window": window},
        "mixers": tuple("sliding" if r == 1 else "full" for r in ratios),
    }
    q = top.section("quantization_config")
    if q is not None and q.data:
        algo = (q.text("quant_algo") or "").upper()
        experts = "nvfp4" if algo == "MIXED_PRECISION" and (q.text("moe_quant_algo") or "").upper() == "NVFP4" else (
            "mxfp4" if (c.text("expert_dtype") or "").lower() == "fp4" else None)
        if experts:
            res.update(weight_dtype=experts, weight_scope="mlp", attention_weight_dtype="fp8_block128",
                       shared_expert_weight_dtype="fp8_block128")
        else:
            res["weight_dtype"] = "fp8_block128"
    return res


def _hybrid_layers(c: "_Fields", family: str, layers: int, path: Path | str) -> dict:
    """Each layer's mixer and MLP, and the state mixer, of the hybrids kvplan reads: Nemotron-H (one block per
    layer: Mamba-2 'M', attention '*', MLP '-', MoE 'E', from hybrid_override_pattern or layers_block_type) and
    Qwen3-Next / Qwen3.5 (gated delta net layers with an attention layer every full_attention_interval, each with
    its MLP or MoE, from layer_types)."""
    out: dict[str, Any] = {}
    if family == "nemotron_h":
        pattern = c.text("hybrid_override_pattern")
        blocks = c.items("layers_block_type", lambda t: isinstance(t, str), "a list of block types")
        if pattern:
            kinds = list(pattern)
        elif blocks:
            kinds = [{"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}.get(b.lower(), b) for b in blocks]
        else:
            raise KvplanError(f"{path}: field 'hybrid_override_pattern' (or 'layers_block_type') is missing; "
                              f"Nemotron-H names each layer's block there")
        bad = sorted({k for k in kinds if k not in "M*-E"})
        if bad:
            raise KvplanError(f"{path}: hybrid_override_pattern holds a block kvplan does not know: {bad[0]!r} "
                              f"(M Mamba-2, * attention, - MLP, E MoE)")
        if len(kinds) != layers:
            raise KvplanError(f"{path}: hybrid_override_pattern has {len(kinds)} blocks; num_hidden_layers is {layers}")
        out["mixers"] = tuple({"M": "state", "*": "full"}.get(k, "none") for k in kinds)
        out["mlps"] = tuple({"-": "dense", "E": "moe"}.get(k, "none") for k in kinds)
        heads = c.need("mamba_num_heads")
        out["state"] = {
            "kind": "mamba2", "num_heads": heads, "head_dim": c.need("mamba_head_dim"),
            "state_size": c.need("ssm_state_size"), "n_groups": c.integer("n_groups", minimum=1) or 1,
            "conv_kernel": c.integer("conv_kernel", minimum=1) or 4, "conv_bias": c.flag("use_conv_bias") is not False,
            "proj_bias": bool(c.flag("use_bias") or c.flag("mamba_proj_bias")),
            "ssm_cache_dtype": _dtype_of(c.text("mamba_ssm_cache_dtype")),
        }
        out.update(norms_per_layer=1, gated_mlp=False, mlp_bias=bool(c.flag("mlp_bias")))
        return out
    if family == "jamba":  # attention every attn_layer_period layers, MoE every expert_layer_period, Mamba between
        period, offset = c.integer("attn_layer_period", minimum=1) or 8, c.integer("attn_layer_offset") or 4
        eperiod, eoffset = c.integer("expert_layer_period", minimum=1) or 2, c.integer("expert_layer_offset") or 1
        experts = (c.integer("num_experts") or 1) > 1
        out["mixers"] = tuple("full" if i % period == offset else "state" for i in range(layers))
        out["mlps"] = tuple("moe" if experts and i % eperiod == eoffset else "dense" for i in range(layers))
        hidden = c.need("hidden_size")
        out["state"] = {
            "kind": "mamba", "num_heads": 1, "head_dim": 1, "state_size": c.integer("mamba_d_state", minimum=1) or 16,
            "intermediate_size": (c.integer("mamba_expand", minimum=1) or 2) * hidden,
            "dt_rank": _dt_rank(c, "mamba_dt_rank", hidden),
            "conv_kernel": c.integer("mamba_d_conv", minimum=1) or 4, "conv_bias": c.flag("mamba_conv_bias") is not False,
            "proj_bias": bool(c.flag("mamba_proj_bias")), "dt_bc_norms": True,
        }
        return out
    if family == "kimi_linear":
        return _kimi_linear_layers(c, layers, path)
    if family == "granitemoehybrid":
        return _granite4_layers(c, layers, path)
    # Qwen3-Next / Qwen3.5: layer_types, or an attention layer every full_attention_interval
    types = c.items("layer_types", lambda t: isinstance(t, str), "a list of layer types")
    if not types:
        every = c.integer("full_attention_interval", minimum=1) or 4
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    bad = sorted({t for t in types if t not in ("linear_attention", "full_attention")})
    if bad or len(types) != layers:
        raise KvplanError(f"{path}: layer_types: expected {layers} of linear_attention / full_attention"
                          + (f", found {bad[0]!r}" if bad else f", found {len(types)}"))
    out["mixers"] = tuple("state" if t == "linear_attention" else "full" for t in types)
    out["state"] = {
        "kind": "gdn", "num_heads": c.need("linear_num_value_heads"), "head_dim": c.need("linear_value_head_dim"),
        "state_size": c.need("linear_key_head_dim"), "n_groups": c.need("linear_num_key_heads"),
        "conv_kernel": c.integer("linear_conv_kernel_dim", minimum=1) or 4, "conv_bias": False,
        # Qwen3.5 names the recurrent state's dtype (mamba_ssm_dtype), which vLLM takes; Qwen3-Next leaves it
        "ssm_cache_dtype": _dtype_of(c.text("mamba_ssm_dtype") or c.text("mamba_ssm_cache_dtype")),
    }
    out["attn_output_gate"] = c.flag("attn_output_gate") is not False
    return out


# Granite 4's layer names (layer_types, also read as layers_block_type), in transformers' and vLLM's spellings
_GRANITE_SHARED = {"granitemoehybrid", "granitemoeshared"}
_GRANITE4_MIXERS = {"mamba": "state", "linear_attention": "state", "attention": "full", "full_attention": "full"}


def _granite4_layers(c: "_Fields", layers: int, path: Path | str) -> dict:
    """Granite 4 (GraniteMoeHybridForCausalLM, vLLM's granitemoehybrid.py): each layer a Mamba-2 mixer or attention
    (layer_types; every layer Mamba-2 without it, as GraniteMoeHybridConfig has it), then the routed experts
    (num_local_experts of intermediate_size, none when 0) beside a shared MLP of shared_intermediate_size, which is
    the dense MLP of the variants without experts. Variants whose layers are all attention have no state."""
    types = (c.items("layer_types", lambda t: t in _GRANITE4_MIXERS, 'a list of "mamba" / "attention"')
             or c.items("layers_block_type", lambda t: t in _GRANITE4_MIXERS, 'a list of "mamba" / "attention"')
             or ["mamba"] * layers)
    if len(types) != layers:
        raise KvplanError(f"{path}: {c.prefix}layer_types lists {len(types)} layers; num_hidden_layers is {layers}")
    out: dict[str, Any] = {"mixers": tuple(_GRANITE4_MIXERS[t] for t in types)}
    experts = c.integer("num_local_experts") or 0
    shared = c.integer("shared_intermediate_size")
    shared = 1024 if shared is None else shared  # GraniteMoeHybridConfig's default
    if not experts:
        if shared:
            out["intermediate_size"] = shared
        else:
            out["mlps"] = ("none",) * layers
    if "state" in out["mixers"]:
        hidden = c.need("hidden_size")
        expand = c.integer("mamba_expand", minimum=1) or 2
        heads = c.integer("mamba_n_heads", minimum=1) or 128
        head_dim = (expand * hidden // heads if c.data.get("mamba_d_head", "auto") == "auto"
                    else c.integer("mamba_d_head", minimum=1))
        if heads * head_dim != expand * hidden:
            raise KvplanError(f"{path}: mamba_n_heads x mamba_d_head ({heads} x {head_dim}) is not mamba_expand x "
                              f"hidden_size ({expand} x {hidden}) (transformers and vLLM refuse it)")
        out["state"] = {
            "kind": "mamba2", "num_heads": heads, "head_dim": head_dim,
            "state_size": c.integer("mamba_d_state", minimum=1) or 256,
            "n_groups": c.integer("mamba_n_groups", minimum=1) or 1,
            "conv_kernel": c.integer("mamba_d_conv", minimum=1) or 4,
            "conv_bias": c.flag("mamba_conv_bias") is not False, "proj_bias": bool(c.flag("mamba_proj_bias")),
        }
    return out


def _kimi_linear_layers(c: "_Fields", layers: int, path: Path | str) -> dict:
    """Kimi Linear and Kimi-K3's text model, as vLLM builds them (kimi_linear.py; vllm/models/kimi_k3 in later
    releases): MLA layers at linear_attn_config.full_attn_layers and Kimi delta attention at kda_layers (both counted
    from 1), a KDA layer keeping three short-convolution states and a float32 head_dim x head_dim state per head.
    Kimi-K3 adds a full-rank KDA output gate (use_full_rank_gate), an MLA output gate (mla_use_output_gate),
    routed experts in a latent space (routed_expert_hidden_size, normed with latent_moe_use_norm) and attention
    residuals (attn_res_block_size)."""
    kda = c.section("linear_attn_config")
    if kda is None:
        raise KvplanError(f"{path}: field '{c.prefix}linear_attn_config' is missing; Kimi Linear names its KDA and "
                          f"MLA layers there")
    full = kda.items("full_attn_layers", _is_int, "a list of layer numbers (from 1)") or []
    linear = kda.items("kda_layers", _is_int, "a list of layer numbers (from 1)") or []
    if sorted(full + linear) != list(range(1, layers + 1)):
        raise KvplanError(f"{path}: {kda.prefix}full_attn_layers and kda_layers do not number the {layers} layers "
                          f"from 1 once each")
    out: dict[str, Any] = {"mixers": tuple("full" if i + 1 in full else "state" for i in range(layers))}
    freq = c.integer("moe_layer_freq", minimum=1) or 1
    if freq > 1 and c.integer("num_experts"):
        first = c.integer("first_k_dense_replace") or 0
        out["mlps"] = tuple("moe" if i >= first and i % freq == 0 else "dense" for i in range(layers))
    head_dim = kda.need("head_dim")
    out["state"] = {"kind": "kda", "num_heads": kda.need("num_heads"), "head_dim": head_dim, "state_size": head_dim,
                    "conv_kernel": kda.integer("short_conv_kernel_size", minimum=2) or 4, "conv_bias": False,
                    "full_rank_gate": bool(kda.flag("use_full_rank_gate"))}
    if c.integer("attn_res_block_size", minimum=1):
        out["attention_residuals"] = True
    return out


# attention-free models: every layer a Mamba or Mamba-2 mixer and one norm
_STATE_SPACE_MODELS = {"mamba", "falcon_mamba", "mamba2"}
# vLLM's max_model_len when a config names no length (config/model.py _get_and_verify_max_len): 2048; a longer one
# may be asked for, since nothing positional limits a state-space model
STATE_SPACE_DEFAULT_LEN = 2048


def _state_space_model(c: "_Fields", top: "_Fields", family: str, path: Path | str) -> dict:
    layers = c.need("num_hidden_layers", "n_layer")
    hidden = c.need("hidden_size", "d_model")
    if family == "mamba2":
        heads, head_dim = c.need("num_heads"), c.need("head_dim")
        state = {"kind": "mamba2", "num_heads": heads, "head_dim": head_dim, "state_size": c.need("state_size"),
                 "n_groups": c.integer("n_groups", minimum=1) or 1}
    else:
        heads, head_dim = 1, 1
        state = {"kind": "mamba", "num_heads": 1, "head_dim": 1, "state_size": c.need("state_size"),
                 "intermediate_size": c.integer("intermediate_size") or (c.integer("expand") or 2) * hidden,
                 "dt_rank": _dt_rank(c, "time_step_rank", hidden)}
    state.update(conv_kernel=c.integer("conv_kernel", minimum=1) or 4, conv_bias=c.flag("use_conv_bias") is not False,
                 proj_bias=bool(c.flag("use_bias")))
    tied = c.flag("tie_word_embeddings")
    dtype, notes = _served_dtype(c.text("torch_dtype") or c.text("dtype"))
    return {
        "name": top.text("_name_or_path") or _name_from_path(path), "family": family, "num_layers": layers,
        "hidden_size": hidden, "intermediate_size": state.get("intermediate_size") or heads * head_dim,
        "num_heads": heads, "num_kv_heads": heads, "head_dim": head_dim, "vocab_size": c.need("vocab_size"),
        "tie_word_embeddings": family == "mamba" if tied is None else tied,
        "max_position_embeddings": STATE_SPACE_DEFAULT_LEN, "dtype": dtype,
        "weight_dtype": dtype, "mixers": ("state",) * layers,
        "mlps": ("none",) * layers, "state": state, "norms_per_layer": 1, "notes": notes,
    }


_MINIMAX_LINEAR = {"minimax", "minimax_text_01", "minimax_m1"}


def _lightning_layers(c: "_Fields", model_type: str, path: Path | str) -> dict:
    """MiniMax-Text-01 / MiniMax-M1: softmax attention layers (1 in attn_type_list, or full_attention in
    layer_types) between lightning linear-attention layers (0, linear_attention), each keeping one head_dim x
    head_dim state per head (vLLM's minimax_text_01.py; vLLM serves it until 0.23, and later releases refuse it)."""
    if model_type not in _MINIMAX_LINEAR:
        return {}
    layers = c.need("num_hidden_layers")
    kinds = c.items("attn_type_list", lambda t: _is_int(t) and t in (0, 1),
                    "a list of 0 (linear) and 1 (softmax attention)")
    if kinds is None:
        types = c.items("layer_types", lambda t: t in ("linear_attention", "full_attention"),
                        'a list of "linear_attention" / "full_attention"')
        kinds = [1 if t == "full_attention" else 0 for t in types] if types else [1] * layers
    if len(kinds) != layers:
        raise KvplanError(f"{path}: {c.prefix}attn_type_list lists {len(kinds)} layers; num_hidden_layers is {layers}")
    heads = c.need("num_attention_heads")
    head_dim = c.integer("head_dim", minimum=1) or c.need("hidden_size") // heads
    if c.integer("shared_intermediate_size"):
        raise KvplanError(f"{path}: {c.prefix}shared_intermediate_size: MiniMax's shared MLP beside the experts is "
                          f"not modelled yet")
    return {"mixers": tuple("full" if k else "state" for k in kinds),
            "state": {"kind": "lightning", "num_heads": heads, "head_dim": head_dim, "state_size": head_dim,
                      "conv_kernel": 1, "conv_bias": False},
            "vllm_until": "0.23"}


def _zamba2_model(c: "_Fields", top: "_Fields", path: Path | str) -> dict:
    """Zamba2, as vLLM builds it (zamba2.py): every layer a Mamba-2 mixer with its norm; the `hybrid` layers of
    layers_block_type also run one of num_mem_blocks shared transformer blocks (attention over the hidden state
    concatenated with the embeddings, 2 x hidden wide, in attention_head_dim heads, and a gated GELU MLP), each
    such layer with its own KV cache, output projection and LoRA adapters. kvplan lays a hybrid layer out as two: the
    shared block's attention and MLP, then the Mamba-2 mixer; the layer count is so the figure's, not vLLM's.
    A field the config leaves out takes the value transformers' Zamba2Config derives for it (vLLM reads the
    configuration transformers built): attention_hidden_size 2 x hidden_size, attention_head_dim 2 x hidden_size
    over num_attention_heads, n_mamba_heads 8, mamba_headdim mamba_expand x hidden_size over n_mamba_heads, and
    without layers_block_type its 54-layer default layout; "linear_attention" is the newer name of a "mamba" block."""
    layers = c.need("num_hidden_layers")
    blocks = c.items("layers_block_type", lambda t: t in ("mamba", "linear_attention", "hybrid"),
                     'a list of "mamba" / "hybrid"')
    if blocks is None:
        blocks = ["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 3 \
            + ["hybrid"] + ["mamba"] * 2
    blocks = ["mamba" if b == "linear_attention" else b for b in blocks]
    if len(blocks) != layers:
        raise KvplanError(f"{path}: field '{c.prefix}layers_block_type' lists {len(blocks)} blocks; "
                          f"num_hidden_layers is {layers}" + ("" if c.has("layers_block_type") else
                                                              " (Zamba2Config's default layout has 54)"))
    hidden, heads = c.need("hidden_size"), c.need("num_attention_heads")
    width = c.integer("attention_hidden_size", minimum=1) or 2 * hidden
    head_dim = c.integer("attention_head_dim", minimum=1) or 2 * hidden // heads
    if head_dim * heads != width:
        raise KvplanError(f"{path}: attention_hidden_size {width} is not num_attention_heads {heads} x "
                          f"attention_head_dim {head_dim} (vLLM refuses it)")
    mixers, mlps, norms = [], [], []
    for b in blocks:
        if b == "hybrid":
            mixers.append("full"), mlps.append("dense"), norms.append(0)  # the shared block's norms are its own
        mixers.append("state"), mlps.append("none"), norms.append(1)
    expand = c.integer("mamba_expand", minimum=1) or 2
    mamba_heads = c.integer("n_mamba_heads", minimum=1) or 8
    mamba_head_dim = c.integer("mamba_headdim", minimum=1) or expand * hidden // mamba_heads
    if mamba_heads * mamba_head_dim != expand * hidden:
        raise KvplanError(f"{path}: n_mamba_heads x mamba_headdim ({mamba_heads} x {mamba_head_dim}) is not "
                          f"mamba_expand x hidden_size ({expand} x {hidden})")
    use_adapters = c.flag("use_shared_attention_adapter")
    tied = c.flag("tie_word_embeddings")
    dtype, notes = _served_dtype(c.text("torch_dtype") or c.text("dtype"))
    return {
        "name": top.text("_name_or_path") or _name_from_path(path), "family": "zamba2", "num_layers": len(mixers),
        "hidden_size": hidden, "intermediate_size": c.integer("intermediate_size", minimum=1) or 4 * hidden,
        "num_heads": heads, "num_kv_heads": heads,  # vLLM's Zamba2Attention keeps a KV head per attention head
        "head_dim": head_dim, "vocab_size": c.need("vocab_size"),
        "tie_word_embeddings": True if tied is None else tied,
        "max_position_embeddings": c.integer("max_position_embeddings", minimum=1) or 4096,
        "dtype": dtype, "weight_dtype": dtype, "mixers": tuple(mixers), "mlps": tuple(mlps), "norms": tuple(norms),
        "shared_attention": {"blocks": c.integer("num_mem_blocks", minimum=1) or 1, "input_size": width,
                             "adapter_rank": c.integer("adapter_rank", minimum=1) or 128,
                             "attention_adapters": bool(use_adapters)},
        "state": {"kind": "mamba2", "num_heads": mamba_heads, "head_dim": mamba_head_dim,
                  "state_size": c.integer("mamba_d_state", minimum=1) or 64,
                  "n_groups": c.integer("mamba_ngroups", minimum=1) or 1,
                  "conv_kernel": c.integer("mamba_d_conv", minimum=1) or 4,
                  "conv_bias": c.flag("use_conv_bias") is not False, "proj_bias": bool(c.flag("add_bias_linear"))},
        "notes": notes + [f"each of the {blocks.count('hybrid')} hybrid layers is laid out as two, the shared "
                          f"attention block and the Mamba-2 mixer"],
    }
