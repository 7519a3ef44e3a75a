"""Published config.json files of current models (tests/fixtures/hf-corpus, sources in its README and in
expected.json): kvplan's parameter count within 0.1% of transformers' own count on the meta device, and its KV
bytes per token exactly the architecture's, or a clean refusal of a layout it cannot size."""

import json
from pathlib import Path

import pytest

from kvplan.errors import KvplanError
from kvplan.sizing.kv_cache import kv_bytes_per_token, kv_layers
from kvplan.sizing.model_tensors import param_count
from kvplan.specs.catalog import load_model
from kvplan.specs.kv_formats import kv_format

CORPUS = Path(__file__).resolve().parent / "fixtures" / "hf-corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
CONFIGS = sorted(n for n in EXPECTED if "hf_quant_config" not in n)


def _load(name):
    try:
        return load_model(str(CORPUS / name)), None
    except KvplanError as e:
        return None, str(e)


@pytest.mark.parametrize("name", CONFIGS)
def test_corpus_config(name):
    e = EXPECTED[name]
    m, refusal = _load(name)
    if m is None:  # one line naming the file and what kvplan cannot size
        assert refusal.startswith(str(CORPUS / name)) and "\n" not in refusal
        return
    if e.get("params"):
        assert param_count(m) == pytest.approx(e["params"], rel=1e-3), e.get("params_method")
    if e.get("kv_bytes_per_token_bf16") is not None:
        # the attention cache proper; a sparse-attention indexer's own keys are listed apart in expected.json
        layers = [lay for lay in kv_layers(m, kv_format("auto")) if lay.format != "indexer"]
        if m.compressed is not None:
            # DeepSeek-V4: vLLM keeps the entries in fp8_ds_mla (584 B); the architecture's figure is one bf16 K=V
            # head of head_dim per compressed entry, the sliding window and compressor states apart
            growing = [lay for lay in layers if lay.kind == "full"]
            assert sum(lay.entry_bytes / lay.entry_tokens for lay in growing) == kv_bytes_per_token(layers)
            assert sum(m.compressed.head_dim * 2 / lay.entry_tokens for lay in growing) == e["kv_bytes_per_token_bf16"]
            assert sum(lay.window for lay in layers if lay.format == "auto" and lay.kind == "sliding") \
                * m.compressed.head_dim * 2 == e["sliding_window_bytes_per_sequence_bf16"]
            return
        assert kv_bytes_per_token(layers) * (2 / {"bf16": 2, "fp16": 2, "fp32": 4}[m.dtype]) \
            == e["kv_bytes_per_token_bf16"]


def test_corpus_coverage():
    # at least 40 real configs priced and matched, every family of the layouts kvplan reads among them
    matched = [n for n in CONFIGS if _load(n)[0] is not None and EXPECTED[n].get("params")]
    assert len(CONFIGS) >= 40 and len(matched) >= 40
    families = {load_model(str(CORPUS / n)).family for n in matched}
    for fam in ("llama", "qwen3_moe", "deepseek_v3", "gpt_oss", "nemotron_h", "gptj", "phi", "starcoder2", "cohere",
                "olmo2", "qwen2_moe", "qwen3_vl", "gemma4", "zamba2", "minimax_m1", "glm_moe_dsa", "llama4", "deepseek_v4",
                "mimo_v2_flash", "granitemoehybrid"):
        assert any(f == fam or f.startswith(fam) for f in families), fam


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.startswith("Qwen--Qwen3-VL-")])
def test_qwen3_vl_text_models_keep_their_qk_norms(name):
    # every Qwen3 decoder layer holds a q_norm and a k_norm of head_dim weights, the VL text models too: with them
    # the count is transformers' own to the element (without them it falls short by layers x 2 x head_dim)
    m = load_model(str(CORPUS / name))
    assert m.qk_norm
    assert param_count(m) == EXPECTED[name]["params"]


@pytest.mark.parametrize("name", ["MiniMaxAI--MiniMax-M2.7_config.json", "allenai--OLMo-2-1124-7B_config.json"])
def test_q_and_k_normed_across_all_heads_hold_their_norms(name):
    # MiniMax-M2 (use_qk_norm, qk_norm_type per_layer) and OLMo 2 norm q and k across all heads: weights of
    # heads x head_dim and kv_heads x head_dim per layer (MiniMax-M2: 62 x (48 + 8) x 128 = 444,416), to the element
    m = load_model(str(CORPUS / name))
    assert m.qk_norm_full and not m.qk_norm
    assert m.qk_norm_sums == name.startswith("MiniMax")
    assert param_count(m) == EXPECTED[name]["params"]
