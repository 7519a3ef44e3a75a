"""Checkpoints as published: quantization_config schemes, vision towers and projectors, names, and the start-up
checks that depend on the machine (free memory, the vocabulary split)."""

import json
from pathlib import Path

import pytest

from kvplan import capacity, load_gpu, load_model
from kvplan.errors import KvplanError
from kvplan.sizing.model_tensors import param_count
from kvplan.sizing.weight_formats import weight_format
from kvplan.sizing.weights import weight_bytes

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"
GiB = 2**30
MiB = 2**20


def _ct(weights: dict, tmp_path, name="ct") -> Path:
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "ignore": ["lm_head"],
                                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    p = tmp_path / f"{name}.config.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize("weights, fmt", [
    ({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}, "int8"),
    ({"num_bits": 8, "type": "int", "strategy": "tensor"}, "int8_tensor"),
    ({"num_bits": 8, "type": "float", "strategy": "channel"}, "fp8_channel"),
    ({"num_bits": 8, "type": "float", "strategy": "tensor"}, "fp8"),
    ({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}, "fp8_block128"),
    ({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}, "int4_g128_sym"),
    ({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": False}, "int4_g32"),
    ({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}, "nvfp4"),
])
def test_compressed_tensors_schemes(tmp_path, weights, fmt):
    assert load_model(str(_ct(weights, tmp_path))).weight_dtype == fmt


def test_w8a8_bytes_by_hand():
    # Llama-3.1-8B W8A8: the 32 layers' linear weights (6,979,321,856 of them) at one byte plus an fp32 scale per
    # output channel (32 x (6144 + 4096 + 28672 + 4096) = 1,376,256 channels), the embedding and LM head in bf16
    # (2 x 525,336,576 x 2 B), the norms (266,240 x 2 B); vLLM's log: 8.49 GiB with the 32 MiB rotary cache
    m = load_model(str(CONFIGS / "RedHatAI--Meta-Llama-3.1-8B-Instruct-quantized.w8a8.config.json"))
    linear = 32 * (4096 * 6144 + 4096 * 4096 + 2 * 4096 * 14336 + 14336 * 4096)
    assert linear == 6_979_321_856
    expected = linear + 4 * 32 * (6144 + 4096 + 28672 + 4096) + 2 * 2 * 525_336_576 + 2 * 266_240
    assert weight_bytes(m, 1).total == expected
    assert (expected + 32 * MiB) / GiB == pytest.approx(8.49, abs=0.005)


def test_int4_group_formats_by_name():
    # 4 bits per weight, a 16-bit scale per group, and a 4-bit zero point unless symmetric
    f = weight_format("int4_g64_sym")
    assert f.matrix_bytes(128, 256) == 128 * 256 // 2 + 128 * (256 // 64) * 2
    g = weight_format("int4_g64")
    assert g.matrix_bytes(128, 256) == 128 * 256 // 2 + 128 * 4 * 2 + 128 * 4 // 2
    with pytest.raises(KvplanError, match="unknown weight dtype 'int4_gx'"):
        weight_format("int4_gx")


@pytest.mark.parametrize("patch, says", [
    ({"quant_method": "gguf"}, "quant_method 'gguf' is not modelled"),
    ({"quant_method": "compressed-tensors"}, "quantization_config.config_groups' is missing"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 3, "type": "int"}}}},
     "type int, 3 bits, strategy tensor are not modelled"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": "eight"}}}},
     "config_groups.g.weights.num_bits"),
    ({"quant_method": "compressed-tensors", "config_groups": ["g"]}, "quantization_config.config_groups"),
])
def test_quantization_config_refusals_name_the_field(tmp_path, patch, says):
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    cfg["quantization_config"] = patch
    p = tmp_path / "q.config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(KvplanError, match=says.replace("(", r"\(").replace(".", r"\.")):
        load_model(str(p))


def test_vision_tower_and_projector_counts():
    # Mistral-Small-3.1: transformers builds 24,011,361,280 parameters on the meta device. Pixtral: the 14 px patch
    # conv (1024 x 3 x 14 x 14), ln_pre, 24 layers of 4 x 1024^2 attention + 3 x 1024 x 4096 gated MLP + 2 norms
    # = 403,305,472; projector: norm 1024 + merger 4096 x 1024 + 1024 x 5120 + 5120 x 5120 = 35,652,608
    m = load_model(str(CONFIGS / "RedHatAI--Mistral-Small-3.1-24B-Instruct-2503-quantized.w8a8.config.json"))
    assert param_count(m) == 24_011_361_280
    assert sum(m.extra_params.values()) + sum(m.replicated_params.values()) == 403_305_472 + 35_652_608
    # granite-vision: SigLIP conv 1152 x 588 + 1152, 27 x 27 positions x 1152, 27 layers of 15,239,504 (no pooling
    # head, no post-norm: vLLM's LLaVA takes the layers' own outputs) = 412,984,944; projector from 4 feature
    # layers: 4608 x 2048 + 2048 + 2048 x 2048 + 2048 = 13,635,584, and the image-newline vector (2048)
    g = load_model(str(CONFIGS / "ibm-granite--granite-vision-3.3-2b.config.json"))
    tower = g.extra_params["vision_tower"] + g.replicated_params["vision_tower"]
    assert tower == 678_528 + 729 * 1152 + 27 * 15_239_504 == 412_984_944
    proj = g.extra_params["multimodal_projector"] + g.replicated_params["multimodal_projector"]
    assert proj == 13_635_584 + 2048
    # the profile's largest item: a 384 x 3840 pinpoint = 10 tiles + the base tile of 27 x 27 features, with a
    # newline per feature row: 729 + 7,290 + 270 = 8,289 embeddings (vLLM's log: "budget 8289")
    assert (g.vision.tokens_per_item, g.vision.patches_per_item) == (8289, 11 * 729)


def test_vision_config_errors_name_the_field(tmp_path):
    cfg = json.loads((CONFIGS / "ibm-granite--granite-vision-3.3-2b.config.json").read_text())
    cfg["vision_config"]["hidden_size"] = "wide"
    p = tmp_path / "v.config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(KvplanError, match="vision_config.hidden_size"):
        load_model(str(p))
    cfg["vision_config"] = {"model_type": "mystery_vit", "hidden_size": 8, "intermediate_size": 8, "patch_size": 2}
    p.write_text(json.dumps(cfg))
    m = load_model(str(p))  # an encoder kvplan cannot size is named, never guessed
    assert any("mystery_vit" in n for n in m.notes) and not m.extra_params


def test_config_named_after_its_file(tmp_path):
    cfg = json.loads((CONFIGS / "RedHatAI--Qwen2.5-7B-Instruct-fp8-dynamic.config.json").read_text())
    assert "_name_or_path" not in cfg
    assert load_model(str(CONFIGS / "RedHatAI--Qwen2.5-7B-Instruct-fp8-dynamic.config.json")).name == \
        "RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic"
    snap = tmp_path / "models--acme--tiny-8b" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(snap / "config.json")).name == "acme/tiny-8b"


def test_free_memory_below_the_request():
    # an H100 (79.11 GiB as CUDA reports it) at utilization 0.95 requests ceil(0.95 x 79.11 GiB) = 75.15 GiB; the
    # worker sees what is free less its CUDA context (522 MiB = 0.51 GiB): 75.5 GiB free leaves 74.99 < 75.15
    h100 = load_gpu("h100")
    r = capacity("llama-3.1-8b", h100, gpu_memory_utilization=0.95, free_memory_gib=75.5)
    assert not r.fits and "74.99 GiB once its CUDA context exists" in r.problem
    assert "--gpu-memory-utilization 0.94 fits" in r.problem  # floor(74.99 / 79.11, 2)
    ok = capacity("llama-3.1-8b", h100, gpu_memory_utilization=0.95, free_memory_gib=75.8)
    assert ok.fits and ok.num_blocks == capacity("llama-3.1-8b", h100, gpu_memory_utilization=0.95).num_blocks


def test_sglang_result_has_the_shared_keys():
    from kvplan.deployment import DeploymentArgs
    from kvplan.plan.sglang_pool import sglang_capacity

    r = sglang_capacity(DeploymentArgs(model="llama-3.1-8b", gpu="h100", engine="sglang", page_size=16)
                        .resolve(needs_memory=True))
    d = r.to_dict()
    for key in ("available_kv_bytes", "kv_tokens", "num_blocks", "block_size", "page_bytes", "max_concurrency",
                "weight_bytes", "activation_bytes", "max_total_num_tokens", "max_running_requests"):
        assert key in d, key
    # pages of 16 tokens of Llama-3.1-8B's 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 128 KiB per token
    assert d["block_size"] == 16 and d["page_bytes"] == 16 * 131_072
    assert d["num_blocks"] * 16 == d["kv_tokens"] == d["max_total_num_tokens"]
    assert d["max_concurrency"] == pytest.approx(d["kv_tokens"] / 131_072)


def test_modelopt_beside_the_config(tmp_path):
    # ModelOpt writes its scheme to hf_quant_config.json beside config.json; an NVFP4 checkpoint of an MLA model
    # that excludes every layer's attention keeps attention in bf16 and quantizes the MLPs and experts
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "config.json").write_text(json.dumps(cfg))
    (snap / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "NVFP4", "group_size": 16,
                          "exclude_modules": ["lm_head"] + [f"model.layers.{i}.self_attn.q_proj" for i in range(32)]}}))
    m = load_model(str(snap))  # a snapshot folder is a model too
    assert (m.weight_dtype, m.weight_scope) == ("nvfp4", "mlp")
    # attention in bf16: 32 x (4096 x 6144 + 4096 x 4096) x 2 B; the MLPs in NVFP4: half a byte per weight, one fp8
    # scale per 16, an fp32 global scale per tensor (3 per layer)
    attn = 32 * (4096 * 6144 + 4096 * 4096) * 2
    mlp = 32 * 3 * 4096 * 14336
    embed = 2 * 525_336_576 * 2 + 266_240 * 2
    assert weight_bytes(m, 1).total == attn + mlp // 2 + mlp // 16 + 32 * 3 * 4 + embed
    (snap / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "W4A8_AWQ"}}))
    with pytest.raises(KvplanError, match="ModelOpt quant_algo 'W4A8_AWQ' is not modelled"):
        load_model(str(snap))


@pytest.mark.parametrize("q, fmt", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, "int4_g128"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}, "int4_g32_sym"),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": True}, "int4_channel_sym"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}, "nf4_double"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8"),
])
def test_other_quantization_methods(tmp_path, q, fmt):
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    cfg["quantization_config"] = q
    p = tmp_path / "q.config.json"
    p.write_text(json.dumps(cfg))
    assert load_model(str(p)).weight_dtype == fmt


def test_language_model_only():
    # granite-vision without its tower: the weights drop by the tower and projector (412,984,944 + 13,637,632
    # parameters in bf16 = 0.79 GiB) and the profile run no longer holds the 8,289 image embeddings
    from kvplan.deployment import DeploymentArgs
    from kvplan.plan.vllm_capacity import capacity_of

    path = str(CONFIGS / "ibm-granite--granite-vision-3.3-2b.config.json")
    kw = dict(model=path, gpu="h100", gpu_memory_gib=79.19, gpu_memory_utilization=0.95, max_model_len=8192,
              engine_version="0.19")
    full = capacity_of(DeploymentArgs(**kw).resolve(needs_memory=True))
    text = capacity_of(DeploymentArgs(**kw, language_model_only=True).resolve(needs_memory=True))
    assert full.weight_bytes - text.weight_bytes == (412_984_944 + 13_637_632) * 2
    assert text.non_kv["activation"] < full.non_kv["activation"]
    assert text.deployment["language_model_only"] is True
    with pytest.raises(KvplanError, match="has no vision encoder"):
        DeploymentArgs(model="llama-3.1-8b", gpu="h100", language_model_only=True).resolve()


def test_float32_checkpoints_run_in_bfloat16(tmp_path):
    # vLLM's --dtype auto: a float32 config is served in bfloat16 on Ampere and later, weights and KV alike
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    cfg["torch_dtype"] = "float32"
    p = tmp_path / "f32.config.json"
    p.write_text(json.dumps(cfg))
    m = load_model(str(p))
    assert m.dtype == "bf16" and weight_bytes(m, 1).total == 2 * 8_030_261_248
    assert any("float32" in n for n in m.notes)


@pytest.mark.parametrize("patch, says", [
    ({"model_type": "zamba"}, "model_type 'zamba' is Zamba"),
    ({"model_type": "zamba2"}, "field 'layers_block_type' lists 54 blocks; num_hidden_layers is 32"),
    ({"hybrid_override_pattern": "M-M*-M-"}, "hybrid_override_pattern 'M-M*-M-...' has Mamba layers"),
    ({"layer_types": ["linear_attention"] * 3 + ["full_attention"]}, "layer_types has 'linear_attention' layers"),
    ({"attn_type_list": [0, 0, 1]}, "attn_type_list has linear (lightning) attention layers"),
    ({"attn_layer_period": 8, "attn_layer_offset": 4}, "attn_layer_period 8"),
    ({"block_configs": [{"attention": {"no_op": True}}]}, "block_configs lists 1 blocks; num_hidden_layers is 32"),
    ({"layer_types": ["mystery_attention"]}, "'mystery_attention'"),
    ({"compress_ratios": [4, 128]}, "compress_ratios lists 2 layers; the model has 32"),
    ({"compress_ratios": [2] * 32}, "compress_ratios holds 2: vLLM's DeepSeek-V4 compressor takes ratios 4 and 128"),
    ({"index_n_heads": 64}, "indexed sparse attention without MLA"),
    ({"global_head_dim": 512}, "global_head_dim / num_global_key_value_heads"),
])
def test_layouts_kvplan_cannot_size_are_refused(tmp_path, patch, says):
    # never priced as attention: each is one line naming the field
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    cfg.update(patch)
    p = tmp_path / "h.config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(KvplanError, match=says.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
                       .replace("*", r"\*").replace("[", r"\[")):
        load_model(str(p))


def test_deepseek_sparse_attention():
    # DeepSeek-V3.2: transformers counts 671,877,929,216 parameters, DeepSeek-V3's 671,026,404,352 plus the lightning
    # indexer's 13,959,424 a layer (wq_b 1,536 -> 64 x 128, wk 7,168 -> 128, a LayerNorm of 128, weights_proj
    # 7,168 -> 64). Its cache per token per layer: the bf16 latent (512 + 64) x 2 = 1,152 B and the indexer's fp8
    # key with a 4-byte scale per 128, 132 B (vLLM's DeepseekV32IndexerCache): 61 x 1,284 = 78,324 B a token on
    # every rank. A step reads every indexer key but only the index_topk = 2,048 best tokens of the latent.
    from kvplan.sizing.kv_cache import kv_bytes_per_token, kv_layers, kv_read_bytes
    from kvplan.specs.kv_formats import kv_format

    path = Path(__file__).resolve().parent / "fixtures" / "hf-corpus" / "deepseek-ai--DeepSeek-V3.2_config.json"
    m = load_model(str(path))
    assert param_count(m) == pytest.approx(671_026_404_352 + 61 * 13_959_424, rel=1e-7)
    layers = kv_layers(m, kv_format("auto"), tp=8)
    assert kv_bytes_per_token(layers) == 61 * (1_152 + 132)
    assert kv_read_bytes(layers, 1, 131_072) == 61 * (2_048 * 1_152 + 131_072 * 132)
    # fp8 for the latent is vLLM's fp8_ds_mla: 656 B
    assert kv_bytes_per_token(kv_layers(m, kv_format("fp8_ds_mla"), tp=8)) == 61 * (656 + 132)


def test_sparse_mla_fp8_is_fp8_ds_mla():
    from kvplan.deployment import DeploymentArgs

    path = str(Path(__file__).resolve().parent / "fixtures" / "hf-corpus" / "deepseek-ai--DeepSeek-V3.2_config.json")
    d = DeploymentArgs(model=path, gpu="b200", tp=8, kv_cache_dtype="fp8").resolve()
    assert d.kv.name == "fp8_ds_mla" and any("fp8_ds_mla" in n for n in d.notes)
    # SGLang keeps its own fp8 layout (NSATokenToKVPool), not vLLM's fp8_ds_mla
    assert DeploymentArgs(model=path, gpu="b200", tp=8, engine="sglang", kv_cache_dtype="fp8").resolve().kv.name == "fp8"
