"""The vision towers and projectors of vision-language configs, counted as vLLM builds them (CLIP, SigLIP,
Pixtral, Qwen3-VL, MoonViT, Llama 4 and Gemma 4 towers)."""

from __future__ import annotations

from typing import Any, Optional

from kvplan.errors import KvplanError
from kvplan.specs.hf_fields import _Fields, _is_int

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
