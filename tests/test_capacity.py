"""The capacity budget and vLLM's block arithmetic, against the seeds' figures and vLLM's worked examples."""

import json

import pytest

from kvplan.api import capacity
from kvplan.errors import KvplanError
from kvplan.plan.vllm_kv_groups import kv_cache_groups
from kvplan.sizing.kv_cache import kv_layers
from kvplan.specs.catalog import load_gpu, load_model
from kvplan.specs.kv_formats import kv_format

GiB = 2**30
H100 = load_gpu("h100")


def test_seed_budget_llama3_8b():
    # ceil(79.65 GiB x 0.92) = 73.28 GiB, less 2 x 8,030,261,248 B of weights (14.96 GiB), less 6.0 GiB = 52.32 GiB
    m = load_model("llama3-8b")
    bf16 = capacity(m, H100, "bfloat16", gpu_memory_gib=79.65, gpu_memory_utilization=0.92, activation_gib=6)
    expected = -(-int(round(79.65 * GiB)) * 92 // 100) - 2 * 8_030_261_248 - 6 * GiB
    assert bf16.available_kv_bytes == expected
    assert round(bf16.available_kv_bytes / GiB, 2) == 52.32
    # 8,192 tokens x 128 KiB = 1 GiB per sequence: about 52 sequences; fp8 halves the page: about 104
    assert bf16.max_model_len == 8192
    assert int(bf16.max_concurrency) == 52
    fp8 = capacity(m, H100, "fp8", gpu_memory_gib=79.65, activation_gib=6)
    assert int(fp8.max_concurrency) == 104


def test_seed_budget_llama3_70b_tp8():
    m = load_model("llama3-70b")
    r = capacity(m, H100, tp=8, gpu_memory_gib=79.65, activation_gib=6)
    assert round(r.available_kv_bytes / GiB, 2) == 50.85


def test_vllm_worked_example_llama31_8b():
    # 60.5 GiB available, bf16, block 16: page 16 x 8 x 256 x 2 = 65,536 B, x 32 layers = 2 MiB per block
    m = load_model("llama-3.1-8b")
    r = capacity(m, None, "auto", kv_cache_memory_gib=60.5, max_model_len=131072)
    assert r.bytes_per_block == 2 * 2**20
    assert r.num_blocks == 30_976
    assert r.kv_tokens == 495_616
    assert f"{r.max_concurrency:.2f}" == "3.78"


def test_vllm_tokens_with_unaligned_max_model_len():
    # max_model_len 32,001 needs cdiv(32001, 16) = 2,001 blocks; 30,000 blocks report int(30000/2001 x 32001)
    m = load_model("llama-3.1-8b")
    r = capacity(m, None, "auto", kv_cache_memory_gib=30_000 * 2 * 2**20 / GiB, max_model_len=32001)
    assert r.num_blocks == 30_000
    assert r.kv_tokens == 479_775
    assert r.token_slots == 480_000


def test_vllm_worked_example_gpt_oss_120b():
    # 18 sliding (window 128) + 18 full layers -> 2 groups of 18; page 16 x 8 x 128 x 2 = 32 KiB; block 576 KiB.
    # per request: 131072/16 = 8,192 full blocks + cdiv(127 + 2 x 8192, 16) + 1 = 1,033 sliding blocks
    m = load_model("gpt-oss-120b")
    r = capacity(m, None, "auto", kv_cache_memory_gib=110_136 * 576 * 1024 / GiB, max_model_len=131072,
                 max_num_batched_tokens=8192)
    assert r.num_kv_cache_groups == 2 and r.padding_layers == 0
    assert r.bytes_per_block == 18 * 32 * 1024
    assert r.num_blocks == 110_136
    assert r.blocks_per_request == 8192 + 1033
    assert r.kv_tokens == 1_564_850
    assert f"{r.max_concurrency:.2f}" == "11.94"


def test_gemma3_27b_grouping():
    # 52 sliding + 10 full: group_size 10 -> 1 full group + 6 sliding groups (9,9,9,9,8,8) padded to 10: 8 padding
    m = load_model("gemma-3-27b")
    g = kv_cache_groups(kv_layers(m, kv_format("auto")), 16, "auto")
    assert g.num_groups == 7 and g.group_size == 10 and g.padding_layers == 8
    assert g.bytes_per_block == 10 * 16 * 16 * 256 * 2


def test_skip_layers_raise_the_block_size():
    # vLLM 0.30+: k8v4 layers take 8 x 196 = 1,568 B/token, bf16 skip layers 4,096; the block grows to
    # 16 x cdiv(4096, 1568) = 48 tokens, and a block holds 48 tokens of every layer
    m = load_model("llama3-8b")
    r = capacity(m, None, "turboquant_k8v4", kv_cache_memory_gib=10, max_model_len=8192)
    assert r.block_size == 48
    assert r.bytes_per_block == 48 * (28 * 1568 + 4 * 4096)
    assert r.skip_layers == [0, 1, 30, 31]
    assert r.blocks_per_request == -(-8192 // 48)  # 171


def test_hybrid_with_sliding_skip_layers():
    # Gemma-3-27B, k8v4: 16 KV heads x 196 = 3,136 B/token, bf16 8,192; block 16 x cdiv(8192, 3136) = 48,
    # shared page 48 x 3,136 = 150,528 B. Skip layers 0, 1, 60, 61 are all sliding: padded to the page, they hold
    # 16 tokens (16 x 8,192 = 131,072 B fits, 32 tokens would not). Types: 48 sliding layers of 48 tokens,
    # 4 sliding of 16, 10 full of 48: group size min(48, 4, 10) = 4 -> 12 + 1 + 3 = 16 groups, 2 padding layers.
    m = load_model("gemma-3-27b")
    g = kv_cache_groups(kv_layers(m, kv_format("turboquant_k8v4")), 16, "turboquant_k8v4")
    assert sorted(s.tokens_per_block for s, _ in g.groups) == [16, 48, 48]
    assert g.block_size == 16  # vLLM reports the smallest block of its groups (cache_config.block_size)
    assert g.group_size == 4
    assert g.num_groups == 16 and g.padding_layers == 2
    assert g.bytes_per_block == 4 * 150_528
    # and the format still buys capacity over bf16 on the same pool
    bf16 = capacity(m, H100, "auto", max_model_len=32768)
    tq = capacity(m, H100, "turboquant_k8v4", max_model_len=32768)
    assert tq.max_concurrency > 1.5 * bf16.max_concurrency


def test_pool_too_small_for_one_sequence():
    m = load_model("llama-3.1-8b")
    r = capacity(m, None, "auto", kv_cache_memory_gib=10, max_model_len=131072)
    # 10 GiB / 2 MiB = 5,120 blocks; one 131,072-token request needs 8,192; 5,119 usable -> 81,904 tokens fit
    assert not r.fits
    assert r.longest_fitting_len == 5_119 * 16
    assert "81,904" in r.problem


def test_max_model_len_auto():
    m = load_model("llama-3.1-8b")
    # vLLM's -1: the longest length whose blocks fit in the pool less the null block. 10 GiB / 2 MiB = 5,120
    # blocks, 5,119 usable x 16 = 81,904 tokens, below the model's 131,072: reduced, and one sequence fits
    r = capacity(m, None, "auto", kv_cache_memory_gib=10, max_model_len="auto")
    assert r.fits and r.max_model_len == 81_904 and r.blocks_per_request == 5_119
    assert any("reduced from 131,072 to 81,904" in n for n in r.notes)
    # 60.5 GiB: 30,976 blocks hold the model's whole 131,072 (8,192 blocks): nothing to reduce
    big = capacity(m, None, "auto", kv_cache_memory_gib=60.5, max_model_len=-1)
    assert big.max_model_len == 131_072 and not any("Auto-fit" in n for n in big.notes)
    # weights that do not fit still say so
    assert not capacity(load_model("llama3-70b"), H100, max_model_len="auto").fits


def test_weights_do_not_fit():
    r = capacity(load_model("llama3-70b"), H100)
    assert not r.fits and "exceed" in r.problem


def test_bad_options():
    m = load_model("llama3-8b")
    with pytest.raises(KvplanError, match="utilization"):
        capacity(m, H100, gpu_memory_utilization=1.5)
    with pytest.raises(KvplanError, match="heads"):
        capacity(m, H100, tp=3)
    with pytest.raises(KvplanError, match="max_position_embeddings"):
        capacity(m, H100, max_model_len=100_000)


def test_capacity_cli_json_keys(cli):
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "--gpu-memory-gib", "79.65", "--activation-gib", "6", "--json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    keys = {"requested_bytes", "weight_bytes", "activation_bytes", "available_kv_bytes", "page_bytes", "block_size",
            "num_blocks", "kv_tokens", "max_model_len", "max_concurrency"}
    assert keys <= set(d)
    assert d["block_size"] == 16 and d["num_blocks"] == 26_788  # 52.32 GiB // 2 MiB


def test_capacity_cli_side_by_side(cli):
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "--kv-cache-dtype", "all")
    assert r.code == 0, r.err
    assert "turboquant_3bit_nc" in r.out and "fp8_ds_mla" not in r.out


def test_capacity_listing_marks_what_does_not_fit(cli):
    r = cli("capacity", "--gpu", "h100", "--max-model-len", "8192")
    assert r.code == 0, r.err
    assert "llama-3-8b" in r.out and "deepseek-v3" in r.out
    assert "no" in r.out


def test_capacity_cli_pool_too_small(cli):
    r = cli("capacity", "llama-3.1-8b", "--kv-cache-memory", "10", "--max-model-len", "131072")
    assert r.code == 2
    assert "81,904" in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


def test_capacity_cli_max_model_len_forms(cli):
    r = cli("capacity", "llama-3.1-8b", "--kv-cache-memory", "10", "--max-model-len", "auto", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["max_model_len"] == 81_904
    r = cli("capacity", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "32k", "--json")
    assert json.loads(r.out)["max_model_len"] == 32 * 1024
    for bad in ("3x", "8k,16k"):
        r = cli("capacity", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", bad)
        assert r.code == 2 and r.err.count("\n") == 1 and "--max-model-len" in r.err
