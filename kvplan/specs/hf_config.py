"""Read a model's architecture from its Hugging Face config.json into ModelSpec fields.

Every field is read with its type checked: a value of the wrong type (a string where a number belongs, a list
where an object belongs) is one error line naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from kvplan.errors import KvplanError, UnmodelledWeights
from kvplan.files import type_name
from kvplan.specs.hf_fields import _Fields, _is_int, _name_from_path, _served_dtype
from kvplan.specs.hf_layers import (
    _GRANITE_SHARED,
    _HYBRIDS_READ,
    _STATE_SPACE_MODELS,
    _SWA_SIZES,
    _deepseek_v4,
    _gemma4_layers,
    _hybrid_layers,
    _indexed_layers,
    _lightning_layers,
    _nas_layers,
    _refuse_unmodelled_layers,
    _state_space_model,
    _swa_layers,
    _zamba2_model,
)
from kvplan.specs.hf_vision import vision_params

# model types of configurations written for a checkpoint's own modelling code, read as the family transformers
# later gave the same architecture: phi-msft (phi-1.5 and phi-2 before their transformers port) names its sizes
# n_embd, n_layer, n_head, n_head_kv, n_inner and n_positions, with the LayerNorm-parallel-block layout of PhiConfig
_LEGACY_FAMILIES = {"phi-msft": "phi"}
# transformers' config defaults
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text", "falcon"}


def compressed_tensors_format(q: "_Fields", path: Path | str) -> str:
    """The weight format of a compressed-tensors checkpoint (llm-compressor's quantization_config), from the scheme
    its config groups give the Linear layers: int or float, bits, strategy (tensor, channel, group, block,
    tensor_group) and group size. vLLM loads each as the matching CompressedTensors scheme (W8A8Int8, W8A8Fp8,
    WNA16 through Marlin, NVFP4, W4A16 MXFP4); what it keeps per weight is the packed values and their scales.
    The `ignore` list (lm_head, vision tower, projector) stays in the model dtype, as kvplan keeps it."""
    groups = q.section("config_groups")
    if groups is None or not groups.data:
        raise KvplanError(f"{path}: field 'quantization_config.config_groups' is missing; a compressed-tensors "
                          f"checkpoint names its schemes there")
    schemes = set()
    for name in groups.data:
        g = groups.section(name)
        w = g.section("weights") if g is not None else None
        if w is None or not w.data:
            continue
        bits = w.integer("num_bits", minimum=1)
        kind = (w.text("type") or "int").lower()
        strategy = (w.text("strategy") or "tensor").lower()
        size = w.integer("group_size", minimum=1)
        block = w.items("block_structure", _is_int, "a list of whole numbers such as [128, 128]")
        symmetric = w.flag("symmetric")
        if kind == "float" and bits == 8:
            fmt = {"tensor": "fp8", "channel": "fp8_channel", "block": "fp8_block128"}.get(strategy)
            if strategy == "block" and block and list(block) != [128, 128]:
                fmt = None
        elif kind == "int" and bits == 8 and strategy in ("channel", "tensor"):
            fmt = "int8" if strategy == "channel" else "int8_tensor"
        elif kind == "int" and bits == 4 and strategy in ("group", "channel"):
            g_size = size if strategy == "group" else None
            fmt = f"int4_g{g_size}" if g_size else "int4_channel"
            fmt += "_sym" if symmetric is not False else ""
        elif kind == "float" and bits == 4 and strategy in ("tensor_group", "group") and size == 16:
            fmt = "nvfp4"
        elif kind == "float" and bits == 4 and size == 32:
            fmt = "mxfp4"
        else:
            fmt = None
        if fmt is None:
            what = (f"compressed-tensors weights of type {kind}, {bits} bits, strategy {strategy}"
                    + (f", group size {size}" if size else ""))
            raise UnmodelledWeights(f"{path}: quantization_config.config_groups.{name}: {what} are not modelled",
                                    what)
        schemes.add(fmt)
    if not schemes:
        raise KvplanError(f"{path}: quantization_config.config_groups holds no weights scheme")
    if len(schemes) > 1:
        raise KvplanError(f"{path}: quantization_config mixes weight schemes ({', '.join(sorted(schemes))}) across "
                          f"layers; kvplan sizes one scheme per checkpoint: pass --weight-dtype with the main one")
    return schemes.pop()


# a layer of each kind, as a checkpoint names it, to try an ignore list on
_SAMPLE_MODULES = {"attention": "model.layers.1.self_attn.o_proj", "dense": "model.layers.1.mlp.down_proj",
                   "shared": "model.layers.1.mlp.shared_experts.down_proj", "expert": "model.layers.1.mlp.experts.0.down_proj"}


def _ignored_scope(ignore: list) -> Optional[str]:
    """The layers a compressed-tensors checkpoint quantizes, from its ignore list (names, or "re:" patterns, which
    vLLM matches against each module): "experts" where attention, dense MLPs and shared experts are all left out (the
    Kimi checkpoints), "mlp" where attention alone is; None where the list leaves the decoder's layers alone."""
    import re

    def ignored(name: str) -> bool:
        for pattern in ignore:
            if pattern.startswith("re:"):
                try:
                    if re.match(pattern[3:], name):
                        return True
                except re.error:
                    continue
            elif name == pattern or name.endswith("." + pattern):
                return True
        return False

    left_out = {kind for kind, name in _SAMPLE_MODULES.items() if ignored(name)}
    if "expert" in left_out or "attention" not in left_out:
        return None
    return "experts" if {"dense", "shared"} <= left_out else "mlp"


# ModelOpt's per-layer algorithms, as vLLM 0.33's MIXED_PRECISION config stores them (W4A16_NVFP4 packs as NVFP4)
_MODELOPT_FORMATS = {"FP8": "fp8", "NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "FP8_PB_WO": "fp8_block128",
                     "FP8_BLOCK": "fp8_block128"}


def declared_kv_cache(q: dict, method: str) -> Optional[dict]:
    """The KV cache a quantized checkpoint declares, as each engine reads it for `--kv-cache-dtype auto` (None where
    it declares none, or none an engine reads). `q` is the quantization config (hf_quant_config.json's
    "quantization" section, or config.json's quantization_config); `method` its quant_method.

    vLLM: vllm/utils/torch_utils.py get_kv_cache_quant_algo_string (called by resolve_kv_cache_dtype_string from
    EngineArgs.create_engine_config) reads a ModelOpt config's kv_cache_scheme, else its kv_cache_quant_algo: a
    string "fp8" (any case) is fp8_e4m3 (MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP), a dict is fp8 only when static
    (dynamic false), 8 bits and of type float; anything else stays auto. For compressed-tensors,
    model_executor/layers/attention/attention.py Attention.__init__ sets the cache dtype to fp8 whenever the
    config has a kv_cache_scheme, whatever --kv-cache-dtype says.
    SGLang: mem_cache/kv_cache_dtype.py configure_kv_cache_dtype takes fp8_e4m3 when the quantization config's
    kv_cache_quant_algo is "FP8": ModelOpt's (layers/quantization/modelopt_quant.py from_config: a kv_cache_scheme
    dict of type float and 8 bits, else kv_cache_quant_algo) or compressed-tensors' (compressed_tensors.py
    kv_cache_quant_algo: a static, symmetric, per-tensor 8-bit float kv_cache_scheme, from 0.5.19). A flat
    config.json quantization_config's kv_cache_quant_algo is read by ModelOptFp8Config.from_config and
    ModelOptFp4Config.from_config from 0.5.15 only (0.5.9 to 0.5.14 read a dict kv_cache_scheme there, or nothing):
    kvplan.specs.catalog marks that case."""
    scheme, algo = q.get("kv_cache_scheme"), q.get("kv_cache_quant_algo")
    if method == "compressed-tensors":
        if not isinstance(scheme, dict):
            return None
        sglang = (scheme.get("type") == "float" and scheme.get("num_bits") == 8 and scheme.get("strategy") == "tensor"
                  and scheme.get("symmetric", True) and not scheme.get("dynamic", False))
        # SGLang reads it from 0.5.19: CompressedTensorsConfig.kv_cache_quant_algo, the property
        # configure_kv_cache_dtype asks for, is absent from 0.5.9 to 0.5.18 (so auto stays the model dtype there)
        return {"dtype": "fp8", "source": f"kv_cache_scheme {_scheme_text(scheme)} (compressed-tensors)",
                "engines": ("vllm", "sglang") if sglang else ("vllm",), "forced_in": ("vllm",),
                **({"sglang_since": "0.5.19"} if sglang else {})}
    if method != "modelopt":
        return None
    declared = scheme or algo
    if isinstance(declared, dict):
        vllm = declared.get("dynamic") is False and declared.get("num_bits") == 8 and declared.get("type") == "float"
    else:
        vllm = isinstance(declared, str) and declared.lower() == "fp8"
    if isinstance(scheme, dict):
        sglang = scheme.get("type") == "float" and scheme.get("num_bits") == 8
    else:
        sglang = isinstance(algo, str) and algo.upper() == "FP8"
    engines = tuple(e for e, reads in (("vllm", vllm), ("sglang", sglang)) if reads)
    if not engines:
        return None
    key = "kv_cache_scheme" if scheme else "kv_cache_quant_algo"
    return {"dtype": "fp8_e4m3", "source": f"{key} {_scheme_text(declared)}", "engines": engines}


def _scheme_text(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in value.items()) + "}"
    return str(value)


def _modelopt_mixed(q: "_Fields", path: Path | str) -> dict:
    """A ModelOpt MIXED_PRECISION checkpoint: quantized_layers names each linear layer's algorithm, which vLLM
    (ModelOptMixedPrecisionConfig) loads layer by layer; a layer it does not name stays in the model dtype. kvplan
    reads one format for the MLPs and experts, one for the attention and state mixers, and the LM head's."""
    layers = q.section("quantized_layers")
    if layers is None or not layers.data:
        raise KvplanError(f"{path}: field '{q.prefix}quantized_layers' is missing; a ModelOpt MIXED_PRECISION "
                          f"checkpoint names each layer's algorithm there")
    found: dict[str, set] = {"mlp": set(), "attention": set(), "lm_head": set()}
    for name in layers.data:
        entry = layers.section(name)
        algo = ((entry.text("quant_algo") if entry is not None else None) or "").upper()
        if algo not in _MODELOPT_FORMATS:
            raise UnmodelledWeights(f"{path}: {q.prefix}quantized_layers.{name}: ModelOpt quant_algo '{algo or '?'}' "
                                    f"is not modelled", f"ModelOpt quant_algo '{algo or '?'}'", "fp8, nvfp4, mxfp4, ...")
        role = ("lm_head" if name.endswith("lm_head") else
                "mlp" if any(k in name for k in (".mlp", "expert", "feed_forward")) else
                "attention" if any(k in name for k in ("attn", "mixer", "attention")) else None)
        if role is None:
            raise KvplanError(f"{path}: {q.prefix}quantized_layers.{name}: kvplan cannot tell whether this layer "
                              f"is attention or MLP; pass --weight-dtype")
        found[role].add(_MODELOPT_FORMATS[algo])
    for role, fmts in found.items():
        if len(fmts) > 1:
            raise KvplanError(f"{path}: {q.prefix}quantized_layers mixes {', '.join(sorted(fmts))} across the "
                              f"{role} layers; kvplan sizes one format per kind of layer: pass --weight-dtype")
    one = lambda role: next(iter(found[role]), None)  # noqa: E731
    out: dict[str, Any] = {}
    if one("mlp"):
        out.update(weight_dtype=one("mlp"), weight_scope="mlp", attention_weight_dtype=one("attention"))
    elif one("attention"):
        out.update(weight_dtype=one("attention"))
    if one("lm_head"):
        out["lm_head_weight_dtype"] = one("lm_head")
    return out


def model_from_hf_config(cfg: Any, path: Path | str) -> dict:
    """A config.json read into ModelSpec fields, in named steps: the wrapper and the families with readers of their
    own, the core sizes (each field under every name transformers' configurations give it, which is what makes this
    function long), the dtypes, then _read_quantization, _read_attention_layout, MLA and DeepSeek-V4, _read_moe,
    _read_biases_and_norms and the vision tower."""
    if not isinstance(cfg, dict):
        raise KvplanError(f"{path}: expected a JSON object (a Hugging Face config.json), found {type_name(cfg)}")
    top = _Fields(cfg, path)
    model_type = (top.text("model_type") or "").lower()
    c = top
    text_config = top.section("text_config")
    if text_config is not None and "num_hidden_layers" not in cfg:  # multimodal wrappers (Gemma 3, Llama 4)
        c = text_config
        model_type = (c.text("model_type") or model_type).lower()

    if model_type == "zamba2":
        return _zamba2_model(c, top, path)
    lightning = _lightning_layers(c, model_type, path)
    _refuse_unmodelled_layers(top, c, model_type, path)
    if model_type in _STATE_SPACE_MODELS:
        return _state_space_model(c, top, model_type, path)
    listed = c.text("hybrid_override_pattern") or c.data.get("layers_block_type")
    if model_type == "nemotron_h" and not c.has("num_hidden_layers") and isinstance(listed, (str, list)):
        layers = len(listed)  # Nemotron-H lists its blocks; the count is theirs
    else:
        layers = c.need("num_hidden_layers", "n_layer", "num_layers")
    hidden = c.need("hidden_size", "n_embd", "d_model")
    heads = c.need("num_attention_heads", "n_head")
    # ChatGLM / GLM-4 embed padded_vocab_size rows (vocab_size there is the tokenizer's)
    vocab = c.integer("padded_vocab_size", minimum=1) or c.need("vocab_size")
    family = _LEGACY_FAMILIES.get(model_type, model_type) or "unknown"
    nas = _nas_layers(c, layers, hidden, heads, path) if c.data.get("block_configs") is not None else {}
    falcon = family in ("falcon", "refinedweb", "refinedwebmodel")

    if falcon and c.flag("multi_query") and not c.flag("new_decoder_architecture"):
        kv_heads = 1
    elif family == "gpt_bigcode" and c.flag("multi_query") is not False:
        kv_heads = 1  # GPTBigCodeConfig.multi_query defaults to True
    elif family == "chatglm" and c.flag("multi_query_attention"):
        kv_heads = c.need("multi_query_group_num")
    else:
        kv_heads = (c.integer("num_key_value_heads") or c.integer("num_kv_heads") or c.integer("n_head_kv")
                    or max(nas.get("kv_heads_per_layer") or [heads]))
    # transformers' own definition when the config omits it (ChatGLM calls it kv_channels)
    head_dim = c.integer("head_dim") or c.integer("kv_channels") or hidden // heads
    # n_inner null (or absent) means 4 x n_embd in these configurations
    legacy_mlp = family in ("gpt2", "gptj", "gpt_bigcode", "codegen", "gpt_neox") or model_type in _LEGACY_FAMILIES
    intermediate = (c.integer("dense_intermediate_size")  # MiniMax-M3: the dense layers' own width
                    or c.integer("intermediate_size") or c.integer("ffn_hidden_size")
                    or c.integer("ff_intermediate_size") or c.integer("n_inner")
                    or (4 * hidden if falcon or legacy_mlp else None)
                    or max(nas.get("intermediate_sizes") or [0]) or None  # a NAS model: its widest layer
                    # a MoE model with no dense layer (Qwen3.5's MoE) has no dense width to give
                    or (c.integer("moe_intermediate_size") if (c.has("num_experts") or c.has("n_routed_experts"))
                        and not c.integer("first_k_dense_replace") else None))
    if intermediate is None:
        raise KvplanError(f"{path}: field '{c.prefix}intermediate_size' is missing")
    for f in (top, c):  # read by nothing here, but a wrong type means a broken config
        f.section("rope_scaling")

    tied = c.flag("tie_word_embeddings")
    if tied is None:
        tied = top.flag("tie_word_embeddings")
    out: dict[str, Any] = {
        "name": top.text("_name_or_path") or _name_from_path(path),
        "family": family,
        "num_layers": layers,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "tie_word_embeddings": family in _TIED_BY_DEFAULT if tied is None else tied,
        "max_position_embeddings": (c.integer("max_position_embeddings") or c.integer("n_positions")
                                    or c.integer("seq_length") or (2048 if falcon else None)
                                    or c.need("max_position_embeddings")),
    }
    out["dtype"], downcast = _served_dtype(c.text("torch_dtype") or top.text("torch_dtype") or c.text("dtype")
                                           or top.text("dtype"))
    if downcast:
        out.setdefault("notes", []).extend(downcast)
    out["weight_dtype"] = out["dtype"]

    _read_quantization(top, c, layers, out, path)

    window = c.integer("sliding_window")
    _read_attention_layout(c, family, layers, kv_heads, head_dim, window, lightning, nas, out, path)

    # MLA
    if c.integer("kv_lora_rank"):
        out["mla"] = {k: c.integer(k) for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                                                "qk_nope_head_dim", "v_head_dim")}
        if c.flag("mla_use_output_gate"):
            out["mla"]["output_gate"] = True
        if c.integer("index_n_heads"):
            out["mla"].update({k: c.need(k) for k in ("index_n_heads", "index_head_dim", "index_topk")})
            indexed = _indexed_layers(c, layers, path)
            if not all(indexed):
                out["indexed"] = indexed
        out["head_dim"] = None

    if c.data.get("compress_ratios") is not None:
        out.update(_deepseek_v4(c, top, layers, out, path))

    _read_moe(c, family, layers, intermediate, out, path)

    _read_biases_and_norms(c, family, hidden, tied, falcon, out)
    if c is not top:  # a multimodal wrapper: the vision tower and projector are held beside the language model
        sharded, rep, notes, encoder = vision_params(top, hidden)
        if encoder:
            out["vision"] = encoder
        if sharded:
            out["extra_params"] = sharded
        if rep:
            out["replicated_params"] = rep
        if notes:
            out.setdefault("notes", []).extend(notes)
    if family == "phi3" and window:
        out.setdefault("notes", []).append("Phi-3 config sets a sliding window; engines differ on honouring it")
    return out


def int4_format(method: str, group: int = 128, sym=None) -> str:
    """The weight format of a 4-bit AWQ or GPTQ checkpoint (groups of `group` input channels, -1 one per channel).
    Marlin keeps AWQ's zero points; a symmetric GPTQ checkpoint's are dropped at load, and GPTQ is symmetric unless
    its config says sym: false (GPTQConfig's default)."""
    sym = method.startswith("gptq") and sym is not False
    return (f"int4_g{group}" if group and group > 0 else "int4_channel") + ("_sym" if sym else "")


def _read_quantization(top: _Fields, c: _Fields, layers: int, out: dict, path) -> None:
    """A quantized checkpoint's weight format, the layers it leaves unquantized and its declared KV cache."""
    q = top.section("quantization_config")
    if not (q and q.data):
        q = c.section("quantization_config")
    if q and q.data:
        method = (q.text("quant_method") or "").lower()
        if not method and q.text("quant_algo"):  # ModelOpt's own config (producer modelopt) names an algorithm
            method = "modelopt"
        block = q.items("weight_block_size", _is_int, "a list of whole numbers such as [128, 128]")
        bits = q.integer("bits", minimum=1)
        declared = declared_kv_cache(q.data, method)
        if declared:
            out["kv_cache_dtype_declared"] = declared
        if method == "compressed-tensors":
            out["weight_dtype"] = compressed_tensors_format(q, path)
            scope = _ignored_scope(q.items("ignore", lambda x: isinstance(x, str), "a list of module names") or [])
            if scope:
                out["weight_scope"] = scope
        elif method == "modelopt":
            algo = (q.text("quant_algo") or "").upper()
            if algo == "MIXED_PRECISION":
                out.update(_modelopt_mixed(q, path))
            elif algo not in _MODELOPT_FORMATS:
                raise UnmodelledWeights(f"{path}: ModelOpt quant_algo '{algo or '?'}' is not modelled",
                                        f"ModelOpt quant_algo '{algo or '?'}'", "fp8, nvfp4, ...")
            else:
                out["weight_dtype"] = _MODELOPT_FORMATS[algo]
            # hf_quant_config.json names them exclude_modules, a config.json's quantization_config ignore
            excluded = (q.items("exclude_modules", lambda x: isinstance(x, str), "a list of module names")
                        or q.items("ignore", lambda x: isinstance(x, str), "a list of module names") or [])
            if algo != "MIXED_PRECISION" and sum(1 for x in excluded if "self_attn" in x or ".attn" in x) >= layers:
                out["weight_scope"] = "mlp"  # every layer's attention kept in the model dtype
        elif method in ("awq", "gptq"):
            bits = bits or 4
            raw = q.data.get("group_size", 128)
            group = -1 if raw == -1 else (q.integer("group_size") if q.has("group_size") else 128)  # -1: per channel
            if bits != 4 or group == 0:
                what = f"{method.upper()} with {bits} bits" + (" and no groups" if group == 0 else "")
                raise UnmodelledWeights(f"{path}: {what} is not modelled", what, "int4_g128, int8, ...")
            out["weight_dtype"] = int4_format(method, group, q.flag("sym"))
        elif method == "bitsandbytes":
            if q.flag("load_in_4bit"):
                out["weight_dtype"] = "nf4_double" if q.flag("bnb_4bit_use_double_quant") else "nf4"
            elif q.flag("load_in_8bit"):
                out["weight_dtype"] = "int8"
            else:
                raise KvplanError(f"{path}: quantization_config: bitsandbytes without load_in_4bit or load_in_8bit")
        elif method == "fp8":
            out["weight_dtype"] = "fp8_block128" if block else "fp8"
        elif method == "mxfp4":
            out["weight_dtype"], out["weight_scope"] = "mxfp4", "experts"
        else:
            raise UnmodelledWeights(f"{path}: quantization_config.quant_method '{method}' is not modelled",
                                    f"quant_method '{method}'")


def _read_attention_layout(c: _Fields, family: str, layers: int, kv_heads: int, head_dim: int, window,
                           lightning: dict, nas: dict, out: dict, path) -> None:
    """Which layers slide, chunk or attend fully (and the hybrids' and NAS models' own layers)."""
    pattern = None
    layer_types = c.items("layer_types", lambda t: isinstance(t, str),
                          'a list of attention types such as ["sliding_attention", "full_attention"]')
    if family in _HYBRIDS_READ:
        out.update(_hybrid_layers(c, family, layers, path))
        layer_types = None
    if layer_types:
        names = {"sliding_attention": "sliding", "full_attention": "full", "chunked_attention": "chunked",
                 "deepseek_sparse_attention": "full"}
        try:
            pattern = [names[t] for t in layer_types]
        except KeyError as e:
            raise KvplanError(f"{path}: {c.prefix}layer_types holds an attention type kvplan does not size, "
                              f"{e.args[0]!r} (it knows full_attention, sliding_attention, chunked_attention)") from None
    elif family in ("gemma3", "gemma3_text") and c.integer("sliding_window_pattern"):
        n = c.integer("sliding_window_pattern") or 1
        # the pattern repeats over the layers: one longer than the model means every layer slides
        pattern = ["sliding"] * (n - 1) + ["full"] if n <= layers else ["sliding"]
    elif family == "gemma2":
        pattern = ["sliding", "full"]
    elif c.data.get("hybrid_layer_pattern") is not None:  # MiMo-V2-Flash's spelling: 1 a sliding-window layer
        hybrid = c.items("hybrid_layer_pattern", lambda t: _is_int(t) and t in (0, 1),
                         "a list of 0 (full attention) and 1 (sliding window)") or []
        if len(hybrid) != layers:
            raise KvplanError(f"{path}: {c.prefix}hybrid_layer_pattern lists {len(hybrid)} layers; "
                              f"num_hidden_layers is {layers}")
        pattern = ["sliding" if t else "full" for t in hybrid]
    elif family == "mimo_v2_flash":  # MiMoV2FlashConfig's default: full attention in layer 0 and every 6th
        pattern = ["full" if i == 0 or (i + 1) % 6 == 0 else "sliding" for i in range(layers)]
    elif family in ("llama4", "llama4_text") and c.integer("attention_chunk_size"):
        rope = c.items("no_rope_layers", lambda r: isinstance(r, (int, bool)), "a list of 0s and 1s") or [1, 1, 1, 0]
        pattern = ["chunked" if r else "full" for r in rope]
    elif window and c.flag("use_sliding_window") is not False:
        pattern = ["sliding"]
    if lightning:
        out.update(lightning)
        layer_types = None
    # a NAS model's blocks; sizes every layer shares are the model's own
    out.update({k: v for k, v in nas.items() if k in ("mixers", "mlps", "norms") or len(set(v)) > 1})
    if family in ("gemma4", "gemma4_text") and pattern:
        out.update(_gemma4_layers(c, pattern, layers, kv_heads, head_dim))
    if pattern and (family == "mimo_v2_flash" or any(c.has(k) for k in _SWA_SIZES)):
        out.update(_swa_layers(c, family, pattern, layers, kv_heads, head_dim, path))
    if pattern:
        att: dict[str, Any] = {"pattern": pattern}
        if "sliding" in pattern:
            att["sliding_window"] = c.integer("sliding_window_size", minimum=1) or window
        if "chunked" in pattern:
            att["chunk_size"] = c.integer("attention_chunk_size")
        out["attention"] = att


def _read_moe(c: _Fields, family: str, layers: int, intermediate: int, out: dict, path) -> None:
    """The routed and shared experts and the layers that hold them."""
    experts = c.integer("num_local_experts") or c.integer("n_routed_experts") or c.integer("num_experts")
    if experts:
        moe: dict[str, Any] = {
            "num_experts": experts,
            "experts_per_token": c.need("num_experts_per_tok", "experts_per_token", "top_k_experts",
                                        "num_experts_per_token"),
            "expert_intermediate_size": c.integer("moe_intermediate_size") or intermediate,
        }
        # Qwen2-MoE and Qwen3-Next name one shared expert by its width alone (with a sigmoid gate of its own)
        shared_width = (c.integer("shared_expert_intermediate_size") or c.integer("moe_shared_expert_intermediate_size")
                        # Granite's shared MLP beside the experts (GraniteMoeSharedMLP)
                        or (c.integer("shared_intermediate_size") if family in _GRANITE_SHARED else None)
                        or (1024 if family == "granitemoehybrid" and not c.has("shared_intermediate_size") else None))
        shared = (c.integer("n_shared_experts") or c.integer("num_shared_experts")
                  or (1 if family in ("llama4", "llama4_text") else 0)
                  or (1 if shared_width else 0))
        if shared:
            moe["shared_experts"] = shared
            if shared_width:
                moe["shared_expert_intermediate_size"] = shared_width
            if family in ("qwen2_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"):
                moe["shared_expert_gate"] = True
        if c.integer("moe_latent_size") or c.integer("routed_expert_hidden_size"):
            moe["latent_size"] = c.integer("moe_latent_size") or c.integer("routed_expert_hidden_size")
            moe["latent_norm"] = bool(c.flag("latent_moe_use_norm"))
        if family == "qwen2_moe" and c.items("mlp_only_layers", _is_int, "a list of layer indices"):
            raise KvplanError(f"{path}: mlp_only_layers: dense layers at chosen indices are not modelled yet")
        if c.integer("first_k_dense_replace"):
            moe["first_dense_layers"] = c.integer("first_k_dense_replace")
        if family == "gpt_oss":
            moe["router_bias"] = moe["expert_bias"] = True
        if (c.text("topk_method") == "noaux_tc" and "compressed" not in out) or family in ("glm4_moe", "kimi_linear"):
            moe["score_correction_bias"] = True
        if family in ("gemma4", "gemma4_text"):
            # Gemma 4's MoE block runs beside a dense MLP of intermediate_size: that MLP is a shared expert
            moe.update(shared_experts=1, shared_expert_intermediate_size=intermediate, router_scales=True)
        out["moe"] = moe
        if family in ("llama4", "llama4_text") and c.integer("intermediate_size_mlp"):
            out["intermediate_size"] = c.integer("intermediate_size_mlp")
        # a MoE flag per layer (MiMo-V2-Flash's moe_layer_freq list; transformers' mlp_layer_types)
        flags = c.data.get("moe_layer_freq")
        types = c.items("mlp_layer_types", lambda t: t in ("dense", "sparse"), 'a list of "dense" / "sparse"')
        if isinstance(flags, list) or types:
            flags = [t == "sparse" for t in types] if types else c.items(
                "moe_layer_freq", lambda t: _is_int(t) and t in (0, 1), "a list of 0 (dense MLP) and 1 (MoE)")
            if len(flags) != layers:
                raise KvplanError(f"{path}: {c.prefix}{'mlp_layer_types' if types else 'moe_layer_freq'} lists "
                                  f"{len(flags)} layers; num_hidden_layers is {layers}")
            out["mlps"] = tuple("moe" if f else "dense" for f in flags)
        elif family == "mimo_v2_flash":  # MiMoV2FlashConfig's default: a dense first layer, MoE after
            out["mlps"] = ("dense",) + ("moe",) * (layers - 1)
        step = c.integer("interleave_moe_layer_step", minimum=1) if family in ("llama4", "llama4_text") else None
        if step and step > 1:  # Llama 4 Maverick: MoE every step-th layer, dense MLPs between
            out["mlps"] = tuple("moe" if (i + 1) % step == 0 else "dense" for i in range(layers))


def _read_biases_and_norms(c: _Fields, family: str, hidden: int, tied, falcon: bool, out: dict) -> None:
    """The biases and norms the architecture carries, and the older layouts as their modelling code builds them."""
    attention_bias = bool(c.flag("attention_bias"))
    out["qkv_bias"] = attention_bias or family in ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl") or bool(
        c.flag("qkv_bias"))
    out["o_bias"] = attention_bias and family != "glm4_moe"
    out["qk_norm"] = (family in ("qwen3", "qwen3_moe", "qwen3_vl_text", "qwen3_vl_moe_text", "gemma3", "gemma3_text", "gemma4", "gemma4_text",
                                 "qwen3_next", "qwen3_5",
                                 "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
                      or bool(c.flag("use_qk_norm") and c.text("qk_norm_type") == "per_head")
                      or bool(c.flag("use_qk_norm") and family == "glm4_moe"))
    if family in ("gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text"):
        out["norms_per_layer"] = 4
    if family in ("gemma4", "gemma4_text") and out.get("moe"):
        out["norms_per_layer"] = 7  # the MoE block's pre-norm and the post-norms of both branches
    if falcon:
        out.update(norms_per_layer=1, norm_bias=True, gated_mlp=False)
    # the older layouts, as their transformers modelling code builds them (and vLLM's, weight for weight)
    if family in ("gpt2", "gpt_bigcode"):  # fused qkv and proj with biases, LayerNorms, learned positions, tied
        out.update(qkv_bias=True, o_bias=True, mlp_bias=True, norm_bias=True, gated_mlp=False,
                   tie_word_embeddings=True if tied is None else tied)
        out.setdefault("replicated_params", {})["position_embeddings"] = out["max_position_embeddings"] * hidden
    elif family == "gptj":  # one LayerNorm per (parallel) block, biased MLP and LM head, no attention biases
        out.update(norms_per_layer=1, norm_bias=True, mlp_bias=True, gated_mlp=False, lm_head_bias=True)
    elif family == "phi":  # phi-1/phi-2: like GPT-J with attention biases
        out.update(norms_per_layer=1, norm_bias=True, mlp_bias=True, gated_mlp=False, lm_head_bias=True,
                   qkv_bias=True, o_bias=True)
    elif family == "starcoder2":
        bias = c.flag("use_bias") is not False
        out.update(qkv_bias=bias, o_bias=bias, mlp_bias=bias, norm_bias=True, gated_mlp=False,
                   tie_word_embeddings=True if tied is None else tied)
    elif family == "cohere":  # one LayerNorm (no bias) per parallel block; embeddings tied by default
        out.update(norms_per_layer=1, tie_word_embeddings=True if tied is None else tied)
    elif family == "chatglm":  # GLM-4: qkv biases (add_qkv_bias), no others (add_bias_linear false)
        out.update(qkv_bias=c.flag("add_qkv_bias") is not False, o_bias=bool(c.flag("add_bias_linear")))
    elif family == "olmo2":  # q and k normed across all heads; the norms after attention and after the MLP
        out.update(qk_norm=False, qk_norm_full=True)
    if c.flag("use_qk_norm") and c.text("qk_norm_type") == "per_layer":  # MiniMax-M2: across all heads, from sums
        out.update(qk_norm=False, qk_norm_full=True, qk_norm_sums=True)
    if family == "gpt_oss":
        out["attention_sinks"] = True
