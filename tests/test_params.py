"""Parameter counts computed from the architecture against the counts each spec declares (taken from the
Hugging Face safetensors totals and the architecture arithmetic in the reference notes)."""

import pytest

from kvplan.sizing.model_tensors import active_param_count, param_count
from kvplan.sizing.weights import weight_bytes
from kvplan.specs.catalog import catalog_dir, load_catalog, load_model

MODELS = load_catalog("models")


def test_catalog_is_big_enough():
    assert len(MODELS) >= 25
    assert len(load_catalog("hardware")) >= 15


@pytest.mark.parametrize("model", MODELS, ids=[m.name for m in MODELS])
def test_computed_count_equals_declared(model):
    assert model.declared_params is not None
    assert param_count(model) == model.declared_params


@pytest.mark.parametrize("name, expected", [
    ("llama3-8b", 8_030_261_248),     # HF safetensors.total, meta-llama/Meta-Llama-3-8B
    ("llama3-70b", 70_553_706_496),
    ("deepseek-v3", 671_026_419_200),  # main model, no MTP layer, no fp8 scale_inv tensors
])
def test_named_counts(name, expected):
    assert param_count(load_model(name)) == expected


def test_llama3_8b_by_hand():
    # V*H embed + 32 x (attn 41,943,040 + MLP 3*4096*14336 + norms 2*4096) + final norm + untied head
    per_layer = (4096 * 4096 * 2 + 4096 * 1024 * 2) + 3 * 4096 * 14336 + 2 * 4096
    assert per_layer == 218_112_000
    assert param_count(load_model("llama3-8b")) == 2 * 128256 * 4096 + 32 * per_layer + 4096


@pytest.mark.parametrize("name, active", [
    ("mixtral-8x7b", 12_879_925_248),      # embed + head + attention + router + 2 of 8 experts
    ("qwen3-30b-a3b", 3_353_032_704),
    ("deepseek-v3", 37_552_297_472),       # the paper says 37B
    ("gpt-oss-120b", 5_711_982_912),
    ("kimi-k2", 32_861_500_928),
])
def test_active_counts(name, active):
    assert active_param_count(load_model(name)) == active


def test_weight_bytes_formats():
    m = load_model("llama3-8b")
    assert weight_bytes(m).total == 2 * 8_030_261_248
    # fp8 per-tensor: 1 byte per linear weight + one fp32 scale per tensor; embeddings, head, norms stay bf16
    linear = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)
    rest = 8_030_261_248 - linear
    tensors = 32 * 7
    assert weight_bytes(m, weight_dtype="fp8").total == linear + 4 * tensors + 2 * rest


def test_gpt_oss_mxfp4_expert_bytes():
    # HF counts 1 e8m0 scale byte per 32 expert weights: 120,412,337,472 - 116,829,156,672 = 114,661,785,600 / 32
    m = load_model("gpt-oss-120b")
    expert_weights = 114_661_785_600
    bf16_params = 116_829_156_672 - expert_weights
    assert weight_bytes(m).total == bf16_params * 2 + expert_weights // 2 + expert_weights // 32


def test_deepseek_fp8_block_scales():
    # Every fp8 matrix carries one fp32 scale_inv per 128x128 block. The checkpoint holds 41,540,496 of them,
    # including the MTP layer kvplan does not load: its attention (q_a 12x56 + q_b 192x12 + kv_a 5x56 + kv_b 256x4
    # + o 56x128 = 11,448 blocks) and 257 experts of 3 x 896 blocks = 690,816.
    m = load_model("deepseek-v3")
    P = 671_026_419_200
    bf16 = 2 * 129280 * 7168 + 61 * (2 * 7168 + 1536 + 512) + 7168 + 58 * 256 * 7168 + 58 * 256
    fp8 = P - bf16
    scales = (weight_bytes(m).total - fp8 - 2 * bf16) / 4
    assert scales == 41_540_496 - (11_448 + 257 * 3 * 896)


def test_tp_sharding_keeps_total():
    m = load_model("llama3-70b")
    per_rank = weight_bytes(m, tp=8).total
    # norms are replicated on every rank, everything else splits 8 ways
    norms = (80 * 2 + 1) * 8192 * 2
    assert per_rank == (2 * 70_553_706_496 - norms) // 8 + norms


def test_every_catalog_file_is_a_valid_spec():
    # loading validates every field; a misspelt key fails here
    for p in catalog_dir("models").glob("*.yaml"):
        assert load_model(str(p)).num_layers > 0
