"""Layouts read from config.json into the per-layer description: Gemma 4's global layers, NAS block_configs,
Llama 4's default vision tower, Zamba2's shared attention, linear-attention states. The corpus test checks each
file's parameter count and KV bytes; these check what it does not: per-layer sizes, the refusals, the state bytes
per sequence worked by hand, and that the pool and weight figures take the per-layer sizes."""

import json
from pathlib import Path

import pytest

from kvplan.api import capacity
from kvplan.errors import KvplanError
from kvplan.sizing.kv_cache import check_tp, kv_bytes_per_token, kv_layers, state_bytes
from kvplan.sizing.model_tensors import param_count
from kvplan.sizing.weights import weight_bytes
from kvplan.specs.catalog import load_gpu, load_model
from kvplan.specs.kv_formats import kv_format

CORPUS = Path(__file__).resolve().parent / "fixtures" / "hf-corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())


def _write(tmp_path, name, cfg):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


# ---------------------------------------------------------------------------------------------------------------
# Gemma 4: global layers with their own KV heads and head size


def test_gemma4_global_layers_sized_apart():
    m = load_model(str(CORPUS / "google--gemma-4-26B-A4B_config.json"))
    layers = kv_layers(m, kv_format("auto"))
    full = [lay for lay in layers if lay.kind == "full"]
    sliding = [lay for lay in layers if lay.kind == "sliding"]
    assert len(full) == 5 and len(sliding) == 25
    assert {lay.bytes_per_token for lay in full} == {2 * 2 * 512 * 2}  # 2 global KV heads of 512, K and V
    assert {lay.bytes_per_token for lay in sliding} == {8 * 256 * 2 * 2}
    # at TP 4 the global layers' 2 KV heads are replicated (one per rank), the sliding layers' 8 split in 2s
    layers4 = kv_layers(m, kv_format("auto"), tp=4)
    assert {lay.bytes_per_token for lay in layers4 if lay.kind == "full"} == {1 * 512 * 2 * 2}
    assert {lay.bytes_per_token for lay in layers4 if lay.kind == "sliding"} == {2 * 256 * 2 * 2}
    check_tp(m, 8)  # 16 heads; 8 and 2 KV heads: 8 divides 8, 8 is a multiple of 2


def test_gemma4_v_slot_held_not_counted():
    # attention_k_eq_v: the checkpoint has no v_proj on the global layers; vLLM allocates the V slot and loads K into
    # it, so the weights held exceed the parameters by that slot
    m = load_model(str(CORPUS / "google--gemma-4-26B-A4B_config.json"))
    assert param_count(m) == EXPECTED["google--gemma-4-26B-A4B_config.json"]["params"]
    v_slot = 5 * 2 * 512 * 2816  # 5 global layers, 2 KV heads of 512, from hidden 2816
    assert weight_bytes(m).total == (param_count(m) + v_slot) * 2


def test_gemma4_capacity_pages():
    m = load_model(str(CORPUS / "google--gemma-4-26B-A4B_config.json"))
    r = capacity(m, load_gpu("h100"), "auto", max_model_len=32768)
    # a sliding page (16 x 8192 B) is twice a global one (16 x 4096 B): the global layers take 32 tokens a block;
    # 25 sliding and 5 global layers make groups of 5: five sliding groups and one global
    assert r.page_bytes == 16 * 8192 and r.num_kv_cache_groups == 6 and r.bytes_per_block == 5 * 16 * 8192


def test_gemma4_per_layer_inputs_refused(tmp_path):
    cfg = json.loads((CORPUS / "google--gemma-4-26B-A4B_config.json").read_text())
    cfg["text_config"]["hidden_size_per_layer_input"] = 256
    with pytest.raises(KvplanError, match="hidden_size_per_layer_input") as e:
        load_model(str(_write(tmp_path, "g4_config.json", cfg)))
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------------------------
# NAS block_configs (Llama-Nemotron Super / Ultra, DeciLM)

NAS = "nvidia--Llama-3_3-Nemotron-Super-49B-v1_config.json"


def _nas_without_linear(tmp_path):
    """The corpus file with its one linear-replacement attention made a no-op (vLLM serves that)."""
    cfg = json.loads((CORPUS / NAS).read_text())
    for b in cfg["block_configs"]:
        if b["attention"]["replace_with_linear"]:
            b["attention"].update(replace_with_linear=False, no_op=True)
    return load_model(str(_write(tmp_path, "nas_config.json", cfg)))


def test_nas_linear_replacement_refused():
    # vLLM's DeciLM builds attention from n_heads_in_group (null on a linear replacement): it cannot load the file
    with pytest.raises(KvplanError, match=r"block_configs\.77\.attention\.replace_with_linear") as e:
        load_model(str(CORPUS / NAS))
    assert "\n" not in str(e.value) and "vLLM" in str(e.value)


def test_nas_blocks(tmp_path):
    m = _nas_without_linear(tmp_path)
    # the hand count of expected.json less the linear replacement (8192 x 8192) and the norm before it
    assert param_count(m) == EXPECTED[NAS]["params"] - 8192 * 8192 - 8192
    assert kv_bytes_per_token(kv_layers(m, kv_format("auto"))) == EXPECTED[NAS]["kv_bytes_per_token_bf16"]
    assert len(m.attention_layers) == 48 and m.mlp_kinds.count("none") == 1
    # ffn_mult 5.25 -> int(2 x 5.25 x 8192 / 3) = 28672; 1.95 -> 10649, rounded up to a multiple of 256: 10752
    assert set(m.intermediate_sizes) == {28672, 14336, 10752, 7168}
    r = capacity(m, load_gpu("h200"), "auto", tp=2, max_model_len=32768)
    assert r.fits and r.page_bytes == 16 * 4 * 128 * 2 * 2  # 4 KV heads per rank
    assert r.bytes_per_block == 48 * r.page_bytes  # one group: the 48 attention layers


def test_nas_ffn_intermediate_size(tmp_path):
    cfg = json.loads((CORPUS / NAS).read_text())
    cfg["block_configs"] = [{"attention": {"n_heads_in_group": 8, "no_op": False},
                             "ffn": {"intermediate_size": 1000 + i, "no_op": False}} for i in range(80)]
    m = load_model(str(_write(tmp_path, "nas2_config.json", cfg)))
    assert m.intermediate_sizes == tuple(1000 + i for i in range(80)) and m.kv_heads_per_layer is None
    assert m.num_kv_heads == 8 and m.norms == (2,) * 80


# ---------------------------------------------------------------------------------------------------------------
# Llama 4: the vision tower vLLM builds from the config class's defaults

SCOUT = "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json"


def test_llama4_default_tower(tmp_path):
    m = load_model(str(CORPUS / SCOUT))
    e = EXPECTED[SCOUT]
    assert param_count(m) - e["params_language_model"] == e["params"] - e["params_language_model"]
    assert any("Llama4VisionConfig default" in n for n in m.notes)
    # a vision_config of its own replaces the defaults: 2 layers of (768-wide fused qkv and o with biases, a GELU MLP
    # of 5632 with biases, two LayerNorms) instead of 34
    cfg = json.loads((CORPUS / SCOUT).read_text())
    cfg["vision_config"] = {"num_hidden_layers": 2}
    small = load_model(str(_write(tmp_path, "scout_config.json", cfg)))
    layer = 4 * 768 * 768 + 4 * 768 + 2 * 768 * 5632 + 5632 + 768 + 4 * 768
    assert param_count(m) - param_count(small) == 32 * layer
    assert not any("Llama4VisionConfig default" in n for n in small.notes)


# ---------------------------------------------------------------------------------------------------------------
# Zamba2: Mamba-2 in every layer, shared attention blocks in the hybrid ones

ZAMBA2 = "Zyphra--Zamba2-2.7B_config.json"


def test_zamba2_layers_and_state():
    m = load_model(str(CORPUS / ZAMBA2))
    assert len(m.state_layers) == 54 and len(m.attention_layers) == 9
    assert m.shared_attention.blocks == 2 and m.head_dim == 160  # 2 x 2560 wide over 32 heads
    layers = kv_layers(m, kv_format("auto"))
    assert kv_bytes_per_token(layers) == 9 * 2 * 32 * 160 * 2
    # by hand, as vLLM's MambaSpec holds it: conv state (kernel 4 - 1) x (5120 + 2 x 1 x 64) channels, SSM state
    # 80 heads x 64 x 64, all in bf16
    per_layer = 3 * 5248 * 2 + 80 * 64 * 64 * 2
    assert sum(state_bytes(m)) == per_layer == 686848
    assert sum(lay.fixed_bytes for lay in layers if lay.kind == "state") == 54 * per_layer
    # TP 2: the single B/C group is replicated to both ranks, the heads split
    assert state_bytes(m, tp=2) == (3 * (5120 + 2 * 2 * 64) // 2 * 2, 40 * 64 * 64 * 2)


def test_zamba2_pool():
    m = load_model(str(CORPUS / ZAMBA2))
    r = capacity(m, load_gpu("h100"), "auto")
    # the attention block grows to 16 x cdiv(686848, 16 x 20480) = 48 tokens; 9 attention and 54 state layers make
    # groups of 9: one attention group and six state groups
    assert r.block_size == 48 and r.num_kv_cache_groups == 7 and r.bytes_per_block == 9 * 48 * 20480
    assert r.state_layers == 54 and r.state_bytes_per_sequence == 54 * 686848


def test_zamba2_attention_adapters(tmp_path):
    # use_shared_attention_adapter: LoRA adapters (rank 128) on q, k and v of each hybrid layer, 5120 -> 128 -> 5120
    cfg = json.loads((CORPUS / ZAMBA2).read_text())
    cfg["use_shared_attention_adapter"] = True
    m = load_model(str(_write(tmp_path, "z_config.json", cfg)))
    assert param_count(m) - EXPECTED[ZAMBA2]["params"] == 9 * 3 * 2 * 128 * 5120


ZAMBA2_1B = "Zyphra--Zamba2-1.2B_config.json"


def test_zamba2_derived_fields_as_transformers_derives_them(tmp_path):
    # Zamba2-1.2B's config leaves out what Zamba2Config computes: the shared attention 2 x 2048 wide in 16 heads of
    # 256, the Mamba-2 mixer's 64 heads of 2 x 2048 / 64 = 64
    m = load_model(str(CORPUS / ZAMBA2_1B))
    assert (m.head_dim, m.shared_attention.input_size, m.state.num_heads, m.state.head_dim) == (256, 4096, 64, 64)
    assert len(m.attention_layers) == 6 and len(m.state_layers) == 38
    # vLLM's mamba2_state_shape: conv (4 - 1) x (4096 + 2 x 128), SSM 64 x 64 x 128, bf16
    assert sum(state_bytes(m)) * 38 == 38 * (3 * 4352 + 64 * 64 * 128) * 2 == \
        EXPECTED[ZAMBA2_1B]["state_bytes_per_sequence_bf16"]
    # without n_mamba_heads Zamba2Config takes 8 heads, of 2 x 2048 / 8 = 512: in_proj loses 56 output rows
    # (one dt per head) and A_log, D and dt_bias 56 entries each, in every one of the 38 mixers
    cfg = json.loads((CORPUS / ZAMBA2_1B).read_text())
    del cfg["n_mamba_heads"]
    eight = load_model(str(_write(tmp_path, "z8_config.json", cfg)))
    assert (eight.state.num_heads, eight.state.head_dim) == (8, 512)
    assert EXPECTED[ZAMBA2_1B]["params"] - param_count(eight) == 38 * (56 * 2048 + 3 * 56)
    # without layers_block_type, Zamba2Config's own 54-layer layout (the 2.7B's), which this 38-layer model lacks
    del cfg["layers_block_type"]
    with pytest.raises(KvplanError, match="lists 54 blocks; num_hidden_layers is 38"):
        load_model(str(_write(tmp_path, "z_nolayout_config.json", cfg)))


# ---------------------------------------------------------------------------------------------------------------
# MiniMax-M1: lightning attention layers with a fixed per-head state

MINIMAX = "MiniMaxAI--MiniMax-M1-80k_config.json"


def test_minimax_lightning_state():
    m = load_model(str(CORPUS / MINIMAX))
    assert len(m.attention_layers) == 10 and len(m.state_layers) == 70 and m.state.kind == "lightning"
    # by hand, as vLLM's linear_attention_state_shape holds it: 64 heads x 128 x 128 in the model dtype, no conv
    assert state_bytes(m) == (0, 64 * 128 * 128 * 2)
    assert state_bytes(m, tp=8) == (0, 8 * 128 * 128 * 2)
    layers = kv_layers(m, kv_format("auto"))
    assert sum(lay.fixed_bytes for lay in layers) == 70 * 64 * 128 * 128 * 2 == \
        EXPECTED[MINIMAX]["state_bytes_per_sequence_bf16"]


def test_minimax_served_until_023():
    m = load_model(str(CORPUS / MINIMAX))
    with pytest.raises(KvplanError, match=r"up to 0\.23") as e:
        capacity(m, load_gpu("h200"), "auto", tp=8)
    assert "\n" not in str(e.value)
    r = capacity(m, load_gpu("h200"), "auto", tp=8, engine_version="0.20", max_model_len=131072)
    # at TP 8 an attention layer holds 1 KV head (512 B a token) and a state page 262144 B: blocks of 512 tokens
    assert r.fits and r.block_size == 512 and r.state_bytes_per_sequence == 70 * 262144


# ---------------------------------------------------------------------------------------------------------------
# GLM-5.2: a DSA indexer every index_topk_freq layers (the others reuse its top-k)


def test_glm52_indexer_every_fourth_layer():
    m = load_model(str(CORPUS / "zai-org--GLM-5.2_config.json"))
    # index_topk_freq 4, index_skip_topk_offset 3: layers 0, 1, 2, then 6, 10, ..., 74 (the config's indexer_types
    # names the same 21 'full')
    cfg = json.loads((CORPUS / "zai-org--GLM-5.2_config.json").read_text())
    assert m.indexer_layers == tuple(i for i, t in enumerate(cfg["indexer_types"]) if t == "full")
    assert len(m.indexer_layers) == 21
    layers = kv_layers(m, kv_format("auto"))
    indexer = [lay for lay in layers if lay.format == "indexer"]
    assert [lay.index for lay in indexer] == list(m.indexer_layers)
    assert kv_bytes_per_token(indexer) == 21 * (128 + 4)  # fp8 keys and a 4-byte scale per 128
    # the 57 layers without an indexer hold none of its weights: wq_b (32 x 128 from 2048), wk (128 from 6144),
    # k_norm (weight and bias of 128) and weights_proj (32 from 6144)
    full = load_model(str(CORPUS / "zai-org--GLM-5.1_config.json"))
    per_layer = 32 * 128 * 2048 + 128 * 6144 + 2 * 128 + 32 * 6144
    assert param_count(full) - param_count(m) == 57 * per_layer


# ---------------------------------------------------------------------------------------------------------------
# ModelOpt MIXED_PRECISION: per-layer algorithms


def test_modelopt_mixed_precision():
    m = load_model(str(CORPUS / "nvidia--Qwen3.6-35B-A3B-NVFP4_config.json"))
    # quantized_layers: W4A16_NVFP4 for the experts, shared experts and LM head, FP8 for the attention and the gated
    # delta nets' projections; what it does not name (embedding, router, b/a projections, vision tower) stays bf16
    assert (m.weight_dtype, m.weight_scope, m.attention_weight_dtype, m.lm_head_weight_dtype) == \
        ("nvfp4", "mlp", "fp8", "nvfp4")
    from kvplan.sizing.model_tensors import model_tensors
    from kvplan.sizing.weight_formats import WEIGHT_FORMATS
    from kvplan.sizing.weights import tensor_bytes_per_rank
    nvfp4, fp8 = WEIGHT_FORMATS["nvfp4"], WEIGHT_FORMATS["fp8"]
    by_name = {t.name: t for t in model_tensors(m)}
    expected = {
        "lm_head": nvfp4.matrix_bytes(248320, 2048),
        "attn.q_proj": 10 * fp8.matrix_bytes(2 * 16 * 256, 2048),
        "linear_attn.out_proj": 30 * fp8.matrix_bytes(2048, 32 * 128),
        "linear_attn.in_proj_ba": 30 * 2 * 32 * 2048 * 2,
        "moe.shared_experts.up_proj": 40 * nvfp4.matrix_bytes(512, 2048),
        "moe.router": 40 * 256 * 2048 * 2,
    }
    for name, want in expected.items():
        assert tensor_bytes_per_rank(m, by_name[name], 1, nvfp4, "mlp", mixed=True) == want, name
    # --weight-dtype replaces the checkpoint's formats: every linear layer in that one
    assert weight_bytes(m, weight_dtype="fp8").total != weight_bytes(m).total


# ---------------------------------------------------------------------------------------------------------------
# Kimi Linear: Kimi delta attention (KDA) layers between MLA layers

KIMI_FULL = [4, 8, 12, 16, 20, 24, 27]
KIMI_LINEAR = {  # the published format (linear_attn_config counts layers from 1), Kimi-Linear-48B-A3B's sizes
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": 2304,
    "intermediate_size": 9216, "moe_intermediate_size": 1024, "num_hidden_layers": 27, "num_attention_heads": 32,
    "num_key_value_heads": 32, "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True, "vocab_size": 163840,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "topk_method": "noaux_tc",
    "linear_attn_config": {"full_attn_layers": KIMI_FULL, "kda_layers": [i for i in range(1, 28) if i not in KIMI_FULL],
                           "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4}}
# transformers 5.24.0 on the meta device (KimiLinearForCausalLM.from_config of KIMI_LINEAR), summing numel; its
# e_score_correction_bias is a buffer, which vLLM's KimiMoE holds as a parameter (26 MoE layers x 256 experts)
KIMI_LINEAR_PARAMS = 49_122_675_072 + 26 * 256


def test_kimi_linear(tmp_path):
    m = load_model(str(_write(tmp_path, "kimi_config.json", KIMI_LINEAR)))
    assert param_count(m) == KIMI_LINEAR_PARAMS
    assert len(m.attention_layers) == 7 and len(m.state_layers) == 20 and m.state.kind == "kda"
    assert kv_bytes_per_token(kv_layers(m, kv_format("auto"))) == 7 * (512 + 64) * 2  # the MLA latent
    # by hand, as vLLM's kda_state_shape holds it: three conv states (kernel 4 - 1) x 32 x 128 in bf16, and the
    # recurrent state 32 heads x 128 x 128 in float32 whatever the model dtype
    assert state_bytes(m) == (3 * 3 * 4096 * 2, 32 * 128 * 128 * 4)
    assert state_bytes(m, tp=4) == (3 * 3 * 1024 * 2, 8 * 128 * 128 * 4)
    r = capacity(m, load_gpu("h200"), "auto", max_model_len=65536)
    assert r.fits and r.state_bytes_per_sequence == 20 * (73728 + 2097152)


def test_kimi_k3():
    m = load_model(str(CORPUS / "moonshotai--Kimi-K3_config.json"))
    assert len(m.attention_layers) == 24 and len(m.state_layers) == 69
    assert m.state.full_rank_gate and m.mla.output_gate and m.moe.latent_size == 3584 and m.moe.latent_norm
    assert m.attention_residuals
    assert kv_bytes_per_token(kv_layers(m, kv_format("auto"))) == 24 * (512 + 64) * 2
    # by hand: three conv states 3 x 96 x 128 wide over kernel 4 - 1 in bf16; the recurrent state 96 x 128 x 128 in
    # float32, or in bfloat16 where mamba_ssm_cache_dtype names it
    assert state_bytes(m) == (3 * 3 * 12288 * 2, 96 * 128 * 128 * 4)
    bf16_state = m.model_copy(update={"state": m.state.model_copy(update={"ssm_cache_dtype": "bf16"})})
    assert state_bytes(bf16_state)[1] == 96 * 128 * 128 * 2
    # compressed-tensors MXFP4 with attention, shared experts, dense MLPs and the LM head ignored: the routed experts
    # alone are quantized
    assert (m.weight_dtype, m.weight_scope) == ("mxfp4", "experts")


def test_zamba2_pipeline_stages_build_the_shared_blocks():
    from kvplan.sizing.weights import pipeline_stages
    m = load_model(str(CORPUS / ZAMBA2))
    one = weight_bytes(m).total
    stages = [weight_bytes(m, stage=rng).total for rng in pipeline_stages(m.num_layers, 2)]
    # each stage holds both shared blocks (its hybrid layers take them in turn): the stages together hold the blocks
    # twice, and the embedding (tied, so the last stage loads the LM head) twice
    block = (3 * 5120 * 5120 + 2560 * 5120 + 2 * 10240 * 2560 + 2560 * 10240 + 5120 + 2560) * 2
    assert sum(stages) == one + 2 * block + 32000 * 2560 * 2


# ---------------------------------------------------------------------------------------------------------------
# phi-msft: phi-2's configuration before its transformers port, in GPT-2-style names

def test_phi_msft_reads_as_phi(tmp_path):
    msft, hf = "microsoft--phi-2-msft_config.json", "microsoft--phi-2_config.json"
    m = load_model(str(CORPUS / msft))
    assert m.family == "phi" and (m.num_layers, m.hidden_size, m.intermediate_size, m.num_kv_heads) == \
        (32, 2560, 4 * 2560, 32)
    # the same model as the transformers-format config, tensor for tensor
    assert param_count(m) == EXPECTED[msft]["params"] == EXPECTED[hf]["params"]
    # n_inner given: the MLP is that wide (fc1 and fc2 with their biases shrink by 2048 columns in all 32 blocks)
    cfg = json.loads((CORPUS / msft).read_text())
    cfg["n_inner"] = 8192
    narrow = load_model(str(_write(tmp_path, "narrow_config.json", cfg)))
    assert param_count(m) - param_count(narrow) == 32 * (2 * 2560 * 2048 + 2048)


# ---------------------------------------------------------------------------------------------------------------
# MiMo-V2-Flash: sliding layers with twice the KV heads, V heads smaller than K's, sinks in the sliding layers

MIMO = "XiaomiMiMo--MiMo-V2-Flash_config.json"


def test_mimo_v2_flash_layers():
    m = load_model(str(CORPUS / MIMO))
    full = [i for i, k in enumerate(m.layer_kinds) if k == "full"]
    assert full == [0, 5, 11, 17, 23, 29, 35, 41, 47] and len(m.attention_layers) == 48
    assert {m.layer_kv_heads(i) for i in full} == {4} and m.kv_heads_per_layer.count(8) == 39
    assert m.attention.sliding_window == 128 and m.v_head_dim == 128 and m.mlp_kinds[:2] == ("dense", "moe")
    layers = kv_layers(m, kv_format("auto"))
    # K of 192 and V of 128 per KV head, as vLLM 0.20 and later cache them (head_size_v)
    assert {lay.bytes_per_token for lay in layers if lay.kind == "full"} == {4 * (192 + 128) * 2}
    assert {lay.bytes_per_token for lay in layers if lay.kind == "sliding"} == {8 * (192 + 128) * 2}
    # TP 8: one KV head per rank in both kinds of layer (the full layers' 4 replicated)
    assert kv_bytes_per_token(kv_layers(m, kv_format("auto"), tp=8)) == 48 * (192 + 128) * 2
    # vLLM 0.19 pads V from 128 to the 192 of K before its Attention layer: a page holds 192 + 192 per KV head
    for version, per_head in (("0.19", 192 + 192), ("0.20", 192 + 128)):
        r = capacity(m, load_gpu("h200"), "auto", tp=8, engine_version=version, max_model_len=65536)
        assert r.kv_bytes_per_token == 48 * per_head * 2
    from kvplan.sizing.model_tensors import model_tensors
    by_name = {}
    for t in model_tensors(m):
        by_name.setdefault(t.name, []).append(t)
    # v_proj and o_proj at V's 128: 4 (full) or 8 (sliding) KV heads x 128 from 4096; o_proj 64 x 128 -> 4096
    assert sorted(t.out_dim * t.in_dim * t.count for t in by_name["attn.v_proj"]) == \
        sorted([9 * 4 * 128 * 4096, 39 * 8 * 128 * 4096])
    assert sum(t.out_dim * t.in_dim * t.count for t in by_name["attn.o_proj"]) == 48 * 4096 * 64 * 128
    # a sink logit per query head in the 39 sliding layers only
    assert sum(t.numel for t in by_name["attn.sinks"]) == 39 * 64


# ---------------------------------------------------------------------------------------------------------------
# Granite 4 (granitemoehybrid): Mamba-2 or attention in each layer, experts beside a shared MLP

GRANITE_H = "ibm-granite--granite-4.0-h-small_config.json"
GRANITE_MICRO = "ibm-granite--granite-4.0-micro_config.json"


def test_granite4_hybrid_layers_and_state():
    m = load_model(str(CORPUS / GRANITE_H))
    assert m.attention_layers == (5, 15, 25, 35) and len(m.state_layers) == 36
    assert m.moe.num_experts == 72 and m.moe.shared_experts == 1 and m.moe.shared_expert_intermediate_size == 1024
    # vLLM's mamba2_state_shape: conv (4 - 1) x (8192 + 2 x 128), SSM 128 heads x 64 x 128, bf16
    assert sum(state_bytes(m)) == (3 * 8448 + 128 * 64 * 128) * 2 == 2147840
    r = capacity(m, load_gpu("h100"), "auto", engine_version="0.19", max_model_len=32768)
    # the attention block grows until a page (8 KV heads x 128 x 2 x 2 B = 4096 B a token) holds a state page:
    # 16 x cdiv(2147840, 16 x 4096) = 528 tokens
    assert r.fits and r.block_size == 528 and r.state_bytes_per_sequence == 36 * 2147840


def test_granite4_attention_only_and_default_layout(tmp_path):
    m = load_model(str(CORPUS / GRANITE_MICRO))
    assert m.state_layers == () and len(m.attention_layers) == 40 and m.moe is None
    assert m.intermediate_size == 8192  # no experts: the shared MLP is the dense MLP
    # without layer_types every layer is Mamba-2 (GraniteMoeHybridConfig's default): no KV cache at all
    cfg = json.loads((CORPUS / GRANITE_H).read_text())
    del cfg["layer_types"]
    allmamba = load_model(str(_write(tmp_path, "g_config.json", cfg)))
    assert len(allmamba.state_layers) == 40 and allmamba.attention_layers == ()
    # a Mamba-2 mixer (in_proj 4096 -> 2 x 8192 + 2 x 128 + 128, conv1d 8448 x 4 with bias, dt_bias, A_log, D,
    # the gated norm of 8192, out_proj 8192 -> 4096) in place of attention (q, o 4096 x 4096; k, v 4096 x 1024)
    mamba = 4096 * (2 * 8192 + 2 * 128 + 128) + 8448 * 4 + 8448 + 3 * 128 + 8192 + 8192 * 4096
    attention = 2 * 4096 * 4096 + 2 * 4096 * 1024
    assert param_count(allmamba) - EXPECTED[GRANITE_H]["params"] == 4 * (mamba - attention)


# ---------------------------------------------------------------------------------------------------------------
# Mistral 3 / Ministral 3: Pixtral tower, patch merger and two-layer projector, with Mistral3Config's defaults

MINISTRAL3 = "mistralai--Ministral-3-8B-Instruct-2512_config.json"
# by hand from transformers' Mistral3MultiModalProjector: the patch merger's merging_layer (1024 x 2 x 2 -> 1024) and
# RMSNorm, linear_1 (1024 -> 4096) and linear_2 (4096 -> 4096), no biases
PROJECTOR = 1024 * 4 * 1024 + 1024 + 1024 * 4096 + 4096 * 4096
# PixtralVisionModel: 24 layers of q, k, v, o (1024^2 each) and a gated MLP (3 x 1024 x 4096), two RMSNorms each,
# ln_pre and the 14 x 14 patch convolution
PIXTRAL = 24 * (4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024) + 1024 + 1024 * 3 * 14 * 14


@pytest.mark.parametrize("drop", [(), ("vision_config", "model_type"), ("multimodal_projector_bias",),
                                  ("vision_config",)])
def test_mistral3_tower_and_projector_counted(tmp_path, drop):
    # a field left out takes Mistral3Config's value: a pixtral tower (Mistral Small 3.1's without any vision_config),
    # a projector without biases
    cfg = json.loads((CORPUS / MINISTRAL3).read_text())
    if len(drop) == 2:
        del cfg[drop[0]][drop[1]]
    elif drop:
        del cfg[drop[0]]
    m = load_model(str(_write(tmp_path, "m3_config.json", cfg)))
    assert sum(m.extra_params.values()) + sum(m.replicated_params.values()) == PIXTRAL + PROJECTOR
    assert param_count(m) == EXPECTED[MINISTRAL3]["params"] == EXPECTED[MINISTRAL3]["params_language_model"] + \
        PIXTRAL + PROJECTOR


# ---------------------------------------------------------------------------------------------------------------
# Kimi-VL: the MoonViT tower and its projector beside the DeepSeek-V3 text model

KIMI_VL = "moonshotai--Kimi-VL-A3B-Instruct_config.json"


def test_kimi_vl_moonvit_counted():
    m = load_model(str(CORPUS / KIMI_VL))
    d, i = 1152, 4304
    # by hand from vLLM's moonvit.py: per block two LayerNorms, wqkv, wo, fc0, fc1 with biases; the patch
    # convolution with bias, the 64 x 64 position table and the final LayerNorm
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * i + i) + (i * d + d)
    tower = 27 * block + (3 * 14 * 14 * d + d) + 64 * 64 * d + 2 * d
    # kimi_vl.py's projector: LayerNorm, linear_1 over 2 x 2 merged patches, linear_2 to the text width 2048
    projector = 2 * d + (4 * d) ** 2 + 4 * d + 4 * d * 2048 + 2048
    assert m.extra_params["vision_tower"] + m.replicated_params["vision_tower"] == tower == 416866032
    assert m.replicated_params["multimodal_projector"] == projector == 30679808
    # the projector is replicated, the tower's linear layers split: one rank of TP 2 holds half of those
    assert m.extra_params["vision_tower"] == 27 * (4 * d * d + 3 * d + 2 * d * i + i)
    assert param_count(m) == pytest.approx(EXPECTED[KIMI_VL]["params_language_model"] + tower + projector, abs=26 * 64)


# ---------------------------------------------------------------------------------------------------------------
# Llama 4: chunked-local layers in KV-cache groups of their own (vLLM's hybrid manager stays on for them)

SCOUT = "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json"


def test_llama4_chunked_layers_in_their_own_groups():
    m = load_model(str(CORPUS / SCOUT))
    r = capacity(m, load_gpu("h100"), "auto", tp=4, engine_version="0.19", max_model_len=131072)
    # 12 full and 36 chunked layers of one page size (2 KV heads a rank x 128 x 2 x 2 B = 1,024 B a token): groups
    # of 12 layers, one full and three chunked (kv_cache_utils' uniform-page grouping)
    assert r.num_kv_cache_groups == 4 and r.padding_layers == 0
    assert r.bytes_per_block == 12 * 16 * 1024
    # vLLM's num_gpu_blocks: the memory over group_size pages (get_num_blocks), one pool shared by the four groups
    assert r.num_blocks == r.available_kv_bytes // (16 * 1024) // 12
    # a request: max_model_len / 16 blocks in the full group, and in each chunked group one chunk (8,192) plus the
    # 8,192 tokens in flight (ChunkedLocalAttentionSpec.max_memory_usage_bytes)
    assert r.blocks_per_request == 131072 // 16 + 3 * (8192 + 8192) // 16
    # 0.19 logs num_blocks // groups x block_size tokens (_report_kv_cache_config)
    assert r.kv_tokens == r.num_blocks // 4 * 16
    assert r.max_concurrency == r.num_blocks / r.blocks_per_request
