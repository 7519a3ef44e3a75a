"""DeepSeek-V4 (tests/fixtures/hf-corpus, DeepseekV4ForCausalLM): kvplan's reading of compress_ratios, its caches
per layer as vLLM 0.33 lays them out (vllm/models/deepseek_v4, v1/kv_cache_interface.py), and one pool worked by
hand through vLLM 0.33's packed grouping (v1/core/kv_cache_planning.py: _get_packed_kv_cache_groups)."""

import json
import math
from pathlib import Path

import pytest

from kvplan.api import capacity
from kvplan.deployment import DeploymentArgs
from kvplan.errors import KvplanError
from kvplan.plan.vllm_kv_groups import packed_kv_cache_groups
from kvplan.sizing.kv_cache import kv_bytes_per_token, kv_layers
from kvplan.sizing.model_tensors import param_count
from kvplan.specs.catalog import load_model
from kvplan.specs.kv_formats import kv_format

CORPUS = Path(__file__).resolve().parent / "fixtures" / "hf-corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
FLASH = CORPUS / "deepseek-ai--DeepSeek-V4-Flash_config.json"
PRO = CORPUS / "deepseek-ai--DeepSeek-V4-Pro_config.json"
SIX = ["deepseek-ai--DeepSeek-V4-Flash", "deepseek-ai--DeepSeek-V4-Pro", "nvidia--DeepSeek-V4-Flash-NVFP4",
       "nvidia--DeepSeek-V4-Pro-NVFP4", "sgl-project--DeepSeek-V4-Flash-FP8", "sgl-project--DeepSeek-V4-Pro-FP8"]


def up(x, k):
    return -(-x // k) * k


@pytest.mark.parametrize("name", SIX)
def test_reads_and_counts_exactly(name):
    m = load_model(str(CORPUS / f"{name}_config.json"))
    e = EXPECTED[f"{name}_config.json"]
    assert param_count(m) == e["params"]  # transformers 5.24 on the meta device, exactly
    ratios = m.compressed.compress_ratios
    assert len(ratios) == m.num_layers  # the next-token-prediction layer's entry is not the model's
    counts = {r: ratios.count(r) for r in (1, 4, 128)}
    kinds = e["kv_layers"]
    assert counts == {1: kinds["sliding"], 4: kinds["compressed_sparse"], 128: kinds["heavily_compressed"]}


def test_flash_caches_and_bytes_per_token_by_hand():
    m = load_model(str(FLASH))
    layers = kv_layers(m, kv_format("auto"))
    # per layer: a 128-token sliding window; ratio 4: an entry per 4 tokens, indexer keys, two compressor states;
    # ratio 128: an entry per 128 tokens and one compressor state
    assert len(layers) == 43 + 21 * 4 + 20 * 2
    # fp8_ds_mla entry: 448 fp8 + 64 bf16 RoPE values + 8 scale bytes = 584; indexer key 128 fp8 + 4 B scale = 132
    assert 448 + 64 * 2 + 8 == 584 and 128 + 128 // 128 * 4 == 132
    assert kv_bytes_per_token(layers) == 21 * 584 / 4 + 20 * 584 / 128 + 21 * 132 / 4 == 3850.25
    # the windowed caches, per sequence: 43 windows of 128 entries; float32 kv+score rows of the compressors,
    # ratio 4: 8 rows of 2 x 2 x 512 (attention) and of 2 x 2 x 128 (indexer); ratio 128: 128 rows of 2 x 512
    fixed = sum(lay.fixed_bytes for lay in layers)
    assert fixed == 43 * 128 * 584 + 21 * (8 * 2048 * 4 + 8 * 512 * 4) + 20 * 128 * 1024 * 4 == 15_420_416
    # pages, padded to 576 B: 64 entries of a ratio-4 cache or 64 window rows; 2 entries of a ratio-128 one;
    # 64 indexer keys; 4 (ratio 4) or 8 (ratio 128) compressor rows
    pages = {(lay.format, lay.entry_tokens, lay.block_tokens): lay.own_page_bytes for lay in layers}
    assert pages[("auto", 4, 256)] == pages[("auto", 1, 64)] == up(64 * 584, 576) == 37_440
    assert pages[("auto", 128, 256)] == up(2 * 584, 576) == 1_728
    assert pages[("indexer", 4, 256)] == up(64 * 132, 576) == 8_640
    states = sorted({lay.own_page_bytes for lay in layers if lay.format == "compressor"})
    assert states == sorted({up(4 * 8192, 576), up(4 * 2048, 576), up(8 * 4096, 576)}) == [8_640, 32_832]


def test_flash_pool_by_hand():
    """B200, TP 8, a 100 GiB pool, max_model_len 131,072, 8,192 batched tokens (two batches in flight: 16,384)."""
    m = load_model(str(FLASH))
    g = packed_kv_cache_groups(kv_layers(m, kv_format("auto")))
    # buckets: compressed + indexer (256-token blocks; 21:21:20 caches of 37,440, 8,640 and 1,728 B: unbalanced),
    # sliding window (64; 43 of 37,440), ratio-4 states (4; 21:21 of 32,832 and 8,640: balanced, 2 page sizes),
    # ratio-128 states (8; 20 of 32,832). Repeats per group: at least 21, padding least over (43, 21, 20): 22
    # (pad 1 + 1 + 2) -> the window splits in 2 groups (22 + 21), the others stay whole: 5 groups
    assert sum((d - x % d) % d for x in (43, 21, 20) for d in [22]) == 4
    assert g.num_groups == 5
    compressed = 21 * 37_440 + 21 * 8_640 + 20 * 1_728
    assert compressed == 1_002_240 > 21 * (32_832 + 8_640) > 22 * 37_440 > 20 * 32_832
    assert g.bytes_per_block == compressed

    r = capacity(m, "b200", tp=8, kv_cache_memory_gib=100, max_model_len=131_072, max_num_batched_tokens=8_192)
    blocks = 100 * 2**30 // compressed
    assert r.num_blocks == blocks == 107_134
    in_flight = 2 * 8_192
    per_request = (math.ceil(131_072 / 256)  # compressed caches: every token
                   + 2 * (math.ceil((128 - 1 + in_flight) / 64) + 1)  # the window, in two groups
                   + math.ceil((8 - 1 + in_flight) / 4) + 1  # ratio-4 compressor states
                   + math.ceil((128 - 1 + in_flight) / 8) + 1)  # ratio-128 compressor states
    assert per_request == 512 + 2 * 259 + 4_099 + 2_065 == 7_194
    assert r.blocks_per_request == per_request
    assert r.max_concurrency == pytest.approx(blocks / per_request)
    assert r.kv_tokens == math.floor(blocks / per_request * 131_072)
    assert r.fits and r.dtype == "auto" and r.block_size == 256


def test_pro_groups_by_hand():
    m = load_model(str(PRO))
    g = packed_kv_cache_groups(kv_layers(m, kv_format("fp8")))
    # 61 windows, 30:30 ratio-4 states, 31 ratio-128 states: repeats from 30, least padding at 31 (pad 1 + 1 + 0)
    assert g.num_groups == 5
    assert g.bytes_per_block == 30 * 37_440 + 30 * 8_640 + 31 * 1_728 == 1_435_968


def test_what_vllm_refuses_is_refused_in_one_line():
    m = load_model(str(FLASH))
    for kwargs, says in [({"kv_cache_dtype": "bfloat16"}, "fp8_ds_mla only"),
                         ({"block_size": 64}, "blocks of 256 tokens only"),
                         ({"engine_version": "0.30"}, "vLLM 0.33's rules only")]:
        dtype = kwargs.pop("kv_cache_dtype", None)
        with pytest.raises(KvplanError, match=says) as e:
            capacity(m, "b200", dtype, tp=8, **kwargs)
        assert "\n" not in str(e.value)
    with pytest.raises(KvplanError, match="plan it with --engine vllm"):
        DeploymentArgs(model=m, gpu="b200", engine="sglang", tp=8).resolve(needs_memory=True)
