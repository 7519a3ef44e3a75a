"""Read a model's architecture from its Hugging Face config.json into ModelSpec fields.

Every field is read with its type checked: a value of the wrong type (a string where a number belongs, a list
where an object belongs) is one error line naming the file and the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from kvplan.errors import KvplanError, UnmodelledWeights
from kvplan.files import type_name

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


def _dtype_of(text: Optional[str], default: Optional[str] = None) -> Optional[str]:
    """kvplan's name for a config's dtype string ("bfloat16", "torch.float16", ...)."""
    return _DTYPES.get(str(text or "").replace("torch.", ""), default)


def _served_dtype(text: Optional[str]) -> tuple[str, list[str]]:
    """The dtype vLLM's --dtype auto runs a checkpoint in, with a note where that is not the checkpoint's own: it
    downcasts float32 to the platform's first dtype, bfloat16 on every GPU from Ampere on (config/model.py
    _resolve_auto_dtype; platforms/cuda.py supported_dtypes)."""
    dtype = _dtype_of(text or "bfloat16", "bf16")
    if dtype == "fp32":
        return "bf16", ["a float32 checkpoint: vLLM runs it in bfloat16 (--dtype auto)"]
    return dtype, []


def _dt_rank(c: "_Fields", key: str, hidden: int) -> int:
    """A Mamba mixer's dt projection rank: the config's, or ceil(hidden / 16) where it says "auto" or nothing."""
    return -(-hidden // 16) if c.data.get(key, "auto") == "auto" else c.integer(key, minimum=1)


# model types of configurations written for a checkpoint's own modelling code, read as the family transformers
# later gave the same architecture: phi-msft (phi-1.5 and phi-2 before their transformers port) names its sizes
# n_embd, n_layer, n_head, n_head_kv, n_inner and n_positions, with the LayerNorm-parallel-block layout of PhiConfig
_LEGACY_FAMILIES = {"phi-msft": "phi"}

# transformers' config defaults
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text", "falcon"}


class _Fields:
    """One object of a config.json, read field by field with the type checked. A field that is absent or null
    reads as None."""

    def __init__(self, data: dict, path: Path | str, prefix: str = ""):
        self.data, self.path, self.prefix = data, path, prefix

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _error(self, key: str, expected: str, value: Any) -> KvplanError:
        return KvplanError(f"{self.path}: field '{self.prefix}{key}': expected {expected}, found {type_name(value)}")

    def integer(self, key: str, minimum: int = 0) -> Optional[int]:
        v = self.data.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._error(key, "a whole number", v)
        if v < minimum:
            raise self._error(key, f"a whole number of at least {minimum}", v)
        return v

    def need(self, key: str, *alts: str) -> int:
        """A positive whole number the config must have, under `key` or one of its older names."""
        for k in (key, *alts):
            if self.has(k):
                return self.integer(k, minimum=1)  # type: ignore[return-value]
        raise KvplanError(f"{self.path}: field '{self.prefix}{key}' is missing; a Hugging Face config.json for a "
                          "decoder has it")

    def flag(self, key: str) -> Optional[bool]:
        v = self.data.get(key)
        if v is None or isinstance(v, bool):
            return v
        raise self._error(key, "true or false", v)

    def text(self, key: str) -> Optional[str]:
        v = self.data.get(key)
        if v is None or isinstance(v, str):
            return v
        raise self._error(key, "a string", v)

    def section(self, key: str) -> Optional["_Fields"]:
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self._error(key, "an object ({...})", v)
        return _Fields(v, self.path, f"{self.prefix}{key}.")

    def items(self, key: str, ok: Callable[[Any], bool], expected: str) -> Optional[list]:
        """A list whose every item passes `ok`; `expected` describes such a list."""
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list):
            raise self._error(key, expected, v)
        for i, item in enumerate(v):
            if not ok(item):
                raise KvplanError(f"{self.path}: field '{self.prefix}{key}.{i}': expected {expected}, found "
                                  f"{type_name(item)} in it")
        return v


def _name_from_path(path: Path | str) -> str:
    """A config without _name_or_path is named after its file (<org>--<name>.config.json, as saved from the Hub,
    reads as org/name) or, for a plain config.json, its folder (a snapshot's revision folder names the repo above
    it: models--<org>--<name>/snapshots/<revision>/config.json)."""
    p = Path(os.path.abspath(path))  # not resolved: a cache's snapshot links to a blob named by its hash
    stem = p.name
    for suffix in (".config.json", "_config.json", "-config.json", ".json"):
        if stem.lower().endswith(suffix) and stem.lower() != "config.json":
            return stem[: -len(suffix)].replace("--", "/")
    folder = p.parent
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name[len("models--"):].replace("--", "/")
    return folder.name or "config.json"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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


# transformers' defaults for what a vision_config may leave out (SiglipVisionConfig, CLIPVisionConfig,
# PixtralVisionConfig)
_VISION_DEFAULTS = {
    "siglip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "patch_size": 16,
               "image_size": 224, "num_channels": 3},
    "clip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "patch_size": 32,
             "image_size": 224, "num_channels": 3},
    "pixtral": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "patch_size": 16,
                "image_size": 1024, "num_channels": 3},
}


# the tower a wrapper's configuration class builds where vision_config names no model_type (LlavaConfig,
# LlavaNextConfig, LlavaOnevisionConfig, Mistral3Config, Gemma3Config)
_WRAPPER_TOWERS = {"llava": "clip_vision_model", "llava_next": "clip_vision_model",
                   "llava_onevision": "siglip_vision_model", "mistral3": "pixtral", "gemma3": "siglip_vision_model"}
# and where there is no vision_config at all: Mistral3Config's sub-config defaults (Mistral Small 3.1's tower)
_DEFAULT_TOWERS = {"mistral3": {"model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096,
                                "patch_size": 14, "image_size": 1540, "num_hidden_layers": 24,
                                "num_attention_heads": 16, "head_dim": 64}}


def _vit_layers(v: "_Fields", feature_layer: Any, kind: str) -> int:
    """The encoder layers vLLM builds: a LLaVA-style model stops at the deepest layer it takes features from
    (vision_feature_layer -2 of 24 builds 23)."""
    total = v.integer("num_hidden_layers", minimum=1) or _VISION_DEFAULTS[kind]["num_hidden_layers"]
    wanted = feature_layer if isinstance(feature_layer, list) else [feature_layer]
    deepest = 0
    for f in wanted:
        if not _is_int(f):
            return total
        deepest = max(deepest, f if f >= 0 else total + f + 1)
    return min(total, deepest) or total


_QWEN_VL_TOWERS = {"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"}


def _qwen3_vl_tower(v: "_Fields") -> tuple[dict, dict, list[str], None]:
    """Qwen3-VL's (and Qwen3.5's) vision tower as transformers builds it (Qwen3VLVisionModel): a Conv3d patch
    embedding (with bias), learned position embeddings, `depth` blocks (two LayerNorms, fused qkv and proj, a GELU
    MLP, all with biases), the patch merger (a LayerNorm, then merge^2 x hidden wide fc1 and fc2 to the text width)
    and one more merger per deepstack layer (its LayerNorm over the merged width). vLLM splits the linear layers
    across TP ranks."""
    d, i = v.need("hidden_size"), v.need("intermediate_size")
    depth = v.need("depth")
    patch, temporal = v.need("patch_size"), v.integer("temporal_patch_size", minimum=1) or 2
    channels = v.integer("in_channels", minimum=1) or 3
    merged = d * (v.integer("spatial_merge_size", minimum=1) or 2) ** 2
    out = v.need("out_hidden_size")
    deep = v.items("deepstack_visual_indexes", _is_int, "a list of layer indices") or []
    sharded = depth * (4 * d * d + 3 * d + 2 * d * i + i) + (1 + len(deep)) * (merged * merged + merged + merged * out)
    rep = (depth * (4 * d + 2 * d) + channels * temporal * patch * patch * d + d
           + v.need("num_position_embeddings") * d + 2 * d + len(deep) * 2 * merged + (1 + len(deep)) * out)
    return ({"vision_tower": sharded}, {"vision_tower": rep},
            ["the vision encoder's profile run (Qwen3-VL's dynamic resolution) is not modelled: the activation peak "
             "counts the language model's alone"], None)


def _moonvit_tower(v: "_Fields", text_hidden: int) -> tuple[dict, dict, list[str], None]:
    """Kimi-VL's MoonViT tower and projector as vLLM builds them (moonvit.py, kimi_vl.py), with MoonViTConfig's
    defaults: a patch convolution with bias, a learned init_pos_emb_height x init_pos_emb_width position table,
    num_hidden_layers blocks (two LayerNorms, fused wqkv and wo, a GELU MLP fc0 / fc1, all with biases; the linear
    layers tensor-parallel) and a final LayerNorm; then the projector, replicated: a LayerNorm over the tower width,
    linear_1 over the merge_kernel_size patches merged and linear_2 to the text width, both with biases."""
    d, i = v.integer("hidden_size", minimum=1) or 1152, v.integer("intermediate_size", minimum=1) or 4304
    layers, patch = v.integer("num_hidden_layers", minimum=1) or 27, v.integer("patch_size", minimum=1) or 14
    table = (v.integer("init_pos_emb_height", minimum=1) or 64) * (v.integer("init_pos_emb_width", minimum=1) or 64)
    kernel = v.items("merge_kernel_size", _is_int, "a list of two whole numbers such as [2, 2]") or [2, 2]
    if len(kernel) != 2:
        raise KvplanError(f"{v.path}: {v.prefix}merge_kernel_size: expected two whole numbers, found {len(kernel)}")
    merged = d * kernel[0] * kernel[1]
    sharded = layers * (4 * d * d + 3 * d + 2 * d * i + i)  # wqkv, wo, fc0, fc1; the column biases
    rep = layers * 6 * d + 3 * patch * patch * d + d + table * d + 2 * d  # norms, row biases, conv, positions
    projector = 2 * d + merged * merged + merged + merged * text_hidden + text_hidden
    return ({"vision_tower": sharded}, {"vision_tower": rep, "multimodal_projector": projector},
            ["the vision encoder's profile run (MoonViT's native resolution) is not modelled: the activation peak "
             "counts the language model's alone"], None)


def vision_params(top: "_Fields", text_hidden: int) -> tuple[dict, dict, list[str], Optional[dict]]:
    """The vision tower's and projector's parameters, split across TP ranks and whole on each, as vLLM builds them
    (siglip.py, clip.py, pixtral.py; llava.py, llava_next.py, mistral3.py, gemma3_mm.py): the attention and MLP
    linear layers and the position embedding are tensor-parallel, the patch convolution, the norms and Mistral 3's
    patch merger are not. An encoder kvplan cannot size is named in a note and left out."""
    v = top.section("vision_config")
    arch = (top.text("model_type") or "").lower()
    if arch == "llama4":  # built from the config class's defaults where the file names no vision_config
        return _llama4_tower(v or _Fields({}, top.path, "vision_config."), text_hidden)
    if (v is None or not v.data) and arch in _DEFAULT_TOWERS:
        v = _Fields(dict(_DEFAULT_TOWERS[arch]), top.path, "vision_config.")
    if v is None or not v.data:
        return {}, {}, [], None
    kind = (v.text("model_type") or _WRAPPER_TOWERS.get(arch) or "").lower()
    if kind in _QWEN_VL_TOWERS or (arch in _QWEN_VL_TOWERS and v.has("deepstack_visual_indexes")):
        return _qwen3_vl_tower(v)
    if kind == "moonvit":
        return _moonvit_tower(v, text_hidden)
    if kind == "gemma4_vision":
        sharded, rep, notes, encoder = _gemma4_tower(v, text_hidden)
        if top.section("audio_config") is not None and top.section("audio_config").data:
            notes.append("the audio tower (audio_config) is not counted: its weights are missing from the figures")
        return sharded, rep, notes, encoder
    family = kind.removesuffix("_vision_model")
    if family not in _VISION_DEFAULTS:
        return {}, {}, [f"the vision tower (vision_config.model_type '{kind or '?'}') is not counted: its weights "
                        f"and its profile run are missing from the figures"], None
    defaults = _VISION_DEFAULTS[family]

    def field(key: str) -> int:  # a field the config leaves out takes its transformers config class's default
        value = v.integer(key, minimum=1)
        return value if value is not None else defaults.get(key) or v.need(key)

    d, i, patch = field("hidden_size"), field("intermediate_size"), field("patch_size")
    channels = field("num_channels")
    feature_layer = top.data.get("vision_feature_layer", -1)
    sharded: dict[str, int] = {}
    rep: dict[str, int] = {}
    if kind in ("siglip_vision_model", "siglip", "clip_vision_model", "clip"):
        layers = _vit_layers(v, feature_layer, family)
        image = field("image_size")
        positions = (image // patch) ** 2 + (1 if kind.startswith("clip") else 0)
        per_layer_sharded = 4 * d * d + 3 * d + 2 * d * i + i  # q, k, v, o and fc1, fc2; column biases
        per_layer_rep = 4 * d + 2 * d  # two LayerNorms; the row-parallel biases of o and fc2
        sharded["vision_tower"] = layers * per_layer_sharded + positions * d
        rep["vision_tower"] = (layers * per_layer_rep + d * channels * patch * patch
                               + (d if kind.startswith("siglip") else 0)  # SigLIP's conv has a bias
                               + (3 * d if kind.startswith("clip") else 0)  # CLIP: class embedding, pre-LayerNorm
                               + (2 * d if arch == "gemma3" else 0))  # Gemma 3 keeps the post-LayerNorm
    elif kind == "pixtral":
        layers = _vit_layers(v, feature_layer, "pixtral")
        sharded["vision_tower"] = layers * (4 * d * d + 3 * d * i)  # no biases; gated SiLU MLP
        rep["vision_tower"] = layers * 2 * d + d + d * channels * patch * patch  # RMSNorms, ln_pre, patch conv
    else:
        return {}, {}, [f"the vision tower (vision_config.model_type '{kind or '?'}') is not counted: its weights "
                        f"and its profile run are missing from the figures"], None
    encoder = _vision_profile(top, v, family, arch, d, i, patch, channels, layers, feature_layer)
    bias = top.flag("multimodal_projector_bias")
    bias = arch != "mistral3" if bias is None else bias  # LlavaConfig's default True, Mistral3Config's False
    features = len(feature_layer) if isinstance(feature_layer, list) else 1
    if arch in ("llava", "llava_next", "llava_onevision"):
        sharded["multimodal_projector"] = d * features * text_hidden + text_hidden * text_hidden + \
            (text_hidden if bias else 0)
        rep["multimodal_projector"] = (text_hidden if bias else 0) + \
            (text_hidden if arch != "llava" and top.flag("use_image_newline_parameter") is not False else 0)
    elif arch == "mistral3":
        merge = top.integer("spatial_merge_size") or 2
        sharded["multimodal_projector"] = d * text_hidden + text_hidden * text_hidden + (text_hidden if bias else 0)
        rep["multimodal_projector"] = d + d * merge * merge * d + (text_hidden if bias else 0)
    elif arch == "gemma3":
        rep["multimodal_projector"] = d * text_hidden + d  # mm_input_projection_weight and its soft-embedding norm
    else:
        return sharded, rep, [f"the projector of a '{arch}' model is not counted"], encoder
    return sharded, rep, [], encoder


def _vision_profile(top: "_Fields", v: "_Fields", family: str, arch: str, d: int, i: int, patch: int, channels: int,
                    layers: int, feature_layer: Any) -> Optional[dict]:
    """What one largest dummy item costs vLLM's profile run: its language-model embeddings (the encoder budget
    counts these), its encoder tokens and pixels. Pixtral (Mistral 3) takes the processor's largest square and
    merges 2 x 2 patches; LLaVA-NeXT tiles the largest of its image_grid_pinpoints plus a base tile, with a newline
    embedding per feature row; LLaVA and Gemma 3 take one square image."""
    image = v.integer("image_size", minimum=1) or _VISION_DEFAULTS[family]["image_size"]
    side = image // patch
    if family == "pixtral":
        merge = top.integer("spatial_merge_size") or 1
        return {"kind": "pixtral", "hidden_size": d, "intermediate_size": i, "num_layers": layers,
                "tokens_per_item": (side // merge) ** 2, "patches_per_item": side * side,
                "pixels_per_item": channels * image * image}
    cls = 1 if family == "clip" else 0
    tiles, tokens = 1, side * side
    if arch == "llava_next":
        pins = top.items("image_grid_pinpoints", lambda p: isinstance(p, list) and len(p) == 2
                         and all(_is_int(x) for x in p), "a list of [height, width] pairs") or [[image, image]]
        best = max(((h // image) * (w // image) * side * side + (h // image) * side, (h // image) * (w // image))
                   for h, w in pins)
        tokens, tiles = side * side + best[0], 1 + best[1]
    elif arch == "gemma3":
        tokens = top.integer("mm_tokens_per_image") or 256
    elif arch not in ("llava", "llava_onevision"):
        return None
    return {"kind": family, "hidden_size": d, "intermediate_size": i, "num_layers": layers,
            "tokens_per_item": tokens, "patches_per_item": tiles * (side * side + cls),
            "pixels_per_item": tiles * channels * image * image, "keeps_hidden_states": isinstance(feature_layer, list)}


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
    kv_cache_quant_algo: a static, symmetric, per-tensor 8-bit float kv_cache_scheme)."""
    scheme, algo = q.get("kv_cache_scheme"), q.get("kv_cache_quant_algo")
    if method == "compressed-tensors":
        if not isinstance(scheme, dict):
            return None
        sglang = (scheme.get("type") == "float" and scheme.get("num_bits") == 8 and scheme.get("strategy") == "tensor"
                  and scheme.get("symmetric", True) and not scheme.get("dynamic", False))
        return {"dtype": "fp8", "source": f"kv_cache_scheme {_scheme_text(scheme)} (compressed-tensors)",
                "engines": ("vllm", "sglang") if sglang else ("vllm",), "forced_in": ("vllm",)}
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


# transformers' Llama4VisionConfig defaults, which vLLM's Llama4ForConditionalGeneration builds the tower from when
# a config.json has no vision_config (the published Llama 4 files)
_LLAMA4_VISION = {"hidden_size": 768, "num_hidden_layers": 34, "num_channels": 3, "intermediate_size": 5632,
                  "vision_output_dim": 7680, "image_size": 448, "patch_size": 14, "projector_input_dim": 4096,
                  "projector_output_dim": 4096}


def _llama4_tower(v: "_Fields", text_hidden: int) -> tuple[dict, dict, list[str], None]:
    """Llama 4's vision tower as vLLM builds it (mllama4.py): an unfold patch embedding (a linear layer without
    bias), class and position embeddings, pre- and post-LayerNorms, `num_hidden_layers` layers of fused qkv and o
    (with biases), a GELU MLP (with biases) and two LayerNorms; the pixel-shuffle adapter's two linear layers and the
    projector to the text width (biases per multi_modal_projector_bias, default none). The linear layers split
    across TP ranks (mm_encoder_tp_mode "weights"); the embeddings, norms and row-parallel biases do not."""
    def field(key: str) -> int:
        value = v.integer(key, minimum=1)
        return value if value is not None else _LLAMA4_VISION[key]

    d, i, layers = field("hidden_size"), field("intermediate_size"), field("num_hidden_layers")
    patch, image, channels = field("patch_size"), field("image_size"), field("num_channels")
    p_in, p_out, out = field("projector_input_dim"), field("projector_output_dim"), field("vision_output_dim")
    bias = bool(v.flag("multi_modal_projector_bias"))
    positions = (image // patch) ** 2 + 1
    sharded = (layers * (4 * d * d + 3 * d + 2 * d * i + i) + channels * patch * patch * d
               + i * p_in + p_in * p_out + (p_in if bias else 0))
    rep = layers * (d + d + 4 * d) + d + positions * d + 4 * d + (p_out if bias else 0)
    notes = ["the vision encoder's profile run (Llama 4) is not modelled: the activation peak counts the language "
             "model's alone"]
    if not v.data:
        notes.append("no vision_config: the vision tower is transformers' Llama4VisionConfig default, which vLLM "
                     "builds")
    return ({"vision_tower": sharded, "multimodal_projector": out * text_hidden}, {"vision_tower": rep}, notes, None)


def _gemma4_tower(v: "_Fields", text_hidden: int) -> tuple[dict, dict, list[str], None]:
    """Gemma 4's vision tower, which vLLM builds with transformers' own module (AutoModel.from_config, whole on
    every rank): a patch projection (3 x patch^2 to hidden, no bias), a two-axis table of position embeddings,
    `num_hidden_layers` layers of q, k, v, o (no biases), q and k norms of head_dim, a gated MLP and four norms; and
    the embedder's projection to the text width."""
    d, i, layers = v.need("hidden_size"), v.need("intermediate_size"), v.need("num_hidden_layers")
    head = v.integer("head_dim", minimum=1) or d // v.need("num_attention_heads")
    patch, positions = v.need("patch_size"), v.need("position_embedding_size")
    tower = layers * (4 * d * d + 3 * d * i + 4 * d + 2 * head) + 3 * patch * patch * d + 2 * positions * d
    return ({}, {"vision_tower": tower, "multimodal_projector": d * text_hidden},
            ["the vision encoder's profile run (Gemma 4) is not modelled: the activation peak counts the language "
             "model's alone"], None)


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
    if family == "gpt_oss":
        out["attention_sinks"] = True
