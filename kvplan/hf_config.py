"""Read a model's architecture from its Hugging Face config.json into ModelSpec fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import KvplanError

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "falcon"}  # transformers' config defaults


def model_from_hf_config(cfg: Any, path: Path | str) -> dict:
    if not isinstance(cfg, dict):
        raise KvplanError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    model_type = str(cfg.get("model_type", "")).lower()
    c = dict(cfg)
    if "text_config" in cfg and "num_hidden_layers" not in cfg:  # multimodal wrappers (Gemma 3, Llama 4)
        c = {**cfg["text_config"]}
        model_type = str(c.get("model_type") or model_type).lower()

    def need(key: str, *alts: str) -> int:
        for k in (key, *alts):
            if c.get(k) is not None:
                return c[k]
        raise KvplanError(f"{path}: field '{key}' is missing; a Hugging Face config.json for a decoder has it")

    layers = need("num_hidden_layers", "n_layer")
    hidden = need("hidden_size", "d_model")
    heads = need("num_attention_heads", "n_head")
    vocab = need("vocab_size")
    family = model_type or "unknown"
    falcon = family in ("falcon", "refinedweb", "refinedwebmodel")

    if falcon and c.get("multi_query") and not c.get("new_decoder_architecture"):
        kv_heads = 1
    else:
        kv_heads = c.get("num_key_value_heads") or c.get("num_kv_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads  # transformers' own definition when the config omits it
    intermediate = c.get("intermediate_size") or (4 * hidden if falcon else None)
    if intermediate is None and c.get("ffn_hidden_size"):
        intermediate = c["ffn_hidden_size"]
    if intermediate is None:
        raise KvplanError(f"{path}: field 'intermediate_size' is missing")

    out: dict[str, Any] = {
        "name": str(cfg.get("_name_or_path") or Path(path).resolve().parent.name or "config.json"),
        "family": family,
        "num_layers": layers,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", cfg.get("tie_word_embeddings", family in _TIED_BY_DEFAULT))),
        "max_position_embeddings": c.get("max_position_embeddings") or (2048 if falcon else None) or need("max_position_embeddings"),
    }
    dtype = str(c.get("torch_dtype") or cfg.get("torch_dtype") or c.get("dtype") or cfg.get("dtype") or "bfloat16")
    out["dtype"] = _DTYPES.get(dtype.replace("torch.", ""), "bf16")
    out["weight_dtype"] = out["dtype"]

    # Quantized checkpoints
    q = cfg.get("quantization_config") or c.get("quantization_config")
    if q:
        method = str(q.get("quant_method", "")).lower()
        if method == "fp8":
            out["weight_dtype"] = "fp8_block128" if q.get("weight_block_size") else "fp8"
        elif method == "mxfp4":
            out["weight_dtype"], out["weight_scope"] = "mxfp4", "experts"
        elif method in ("awq", "gptq") and q.get("bits", 4) == 4:
            out["weight_dtype"] = "int4_g128"
        else:
            raise KvplanError(
                f"{path}: quantization_config.quant_method '{method}' is not modelled; "
                "use the unquantized config and pass --weight-dtype (fp8, int8, int4_g128, mxfp4, nvfp4)"
            )

    # Attention layout
    pattern = None
    window = c.get("sliding_window")
    if c.get("layer_types"):
        names = {"sliding_attention": "sliding", "full_attention": "full", "chunked_attention": "chunked"}
        try:
            pattern = [names[t] for t in c["layer_types"]]
        except KeyError as e:
            raise KvplanError(f"{path}: layer_types holds an unknown attention type {e.args[0]!r}") from None
    elif family in ("gemma3", "gemma3_text") and c.get("sliding_window_pattern"):
        n = c["sliding_window_pattern"]
        pattern = ["sliding"] * (n - 1) + ["full"]
    elif family == "gemma2":
        pattern = ["sliding", "full"]
    elif family in ("llama4", "llama4_text") and c.get("attention_chunk_size"):
        rope = c.get("no_rope_layers") or [1, 1, 1, 0]
        pattern = ["chunked" if r else "full" for r in rope]
    elif window and c.get("use_sliding_window", True):
        pattern = ["sliding"]
    if pattern:
        att: dict[str, Any] = {"pattern": pattern}
        if "sliding" in pattern:
            att["sliding_window"] = window
        if "chunked" in pattern:
            att["chunk_size"] = c.get("attention_chunk_size")
        out["attention"] = att

    # MLA
    if c.get("kv_lora_rank"):
        out["mla"] = {k: c.get(k) for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
        out["head_dim"] = None

    # MoE
    experts = c.get("num_local_experts") or c.get("n_routed_experts") or c.get("num_experts")
    if experts:
        moe: dict[str, Any] = {
            "num_experts": experts,
            "experts_per_token": need("num_experts_per_tok", "experts_per_token"),
            "expert_intermediate_size": c.get("moe_intermediate_size") or intermediate,
        }
        shared = c.get("n_shared_experts") or (1 if family in ("llama4", "llama4_text") else 0)
        if shared:
            moe["shared_experts"] = shared
            if c.get("shared_expert_intermediate_size"):
                moe["shared_expert_intermediate_size"] = c["shared_expert_intermediate_size"]
        if c.get("first_k_dense_replace"):
            moe["first_dense_layers"] = c["first_k_dense_replace"]
        if family == "gpt_oss":
            moe["router_bias"] = moe["expert_bias"] = True
        if c.get("topk_method") == "noaux_tc" or family == "glm4_moe":
            moe["score_correction_bias"] = True
        out["moe"] = moe
        if family in ("llama4", "llama4_text") and c.get("intermediate_size_mlp"):
            out["intermediate_size"] = c["intermediate_size_mlp"]

    # Biases and norms the architecture carries
    attention_bias = bool(c.get("attention_bias", False))
    out["qkv_bias"] = attention_bias or family == "qwen2" or bool(c.get("qkv_bias"))
    out["o_bias"] = attention_bias and family != "glm4_moe"
    out["qk_norm"] = family in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text") or bool(c.get("use_qk_norm") and family == "glm4_moe")
    if family in ("gemma2", "gemma3", "gemma3_text"):
        out["norms_per_layer"] = 4
    if falcon:
        out.update(norms_per_layer=1, norm_bias=True, gated_mlp=False)
    if family == "gpt_oss":
        out["attention_sinks"] = True
    if family == "phi3" and c.get("sliding_window"):
        out.setdefault("notes", []).append("Phi-3 config sets a sliding window; engines differ on honouring it")
    return out
