"""vLLM's planning rules per version, pipeline and decode-context parallelism, the block override, and the startup
log lines as vLLM prints them (worked examples from vLLM's own code paths)."""

import pytest

from kvplan import capacity, load_gpu, load_model
from kvplan.errors import KvplanError
from kvplan.rules.vllm import vllm_rules

GiB = 2**30
GPT_OSS_POOL = 110_136 * 576 * 1024 / GiB  # 110,136 blocks of 18 layers x 32 KiB


@pytest.mark.parametrize("version, rules", [("0.19", "0.19"), ("0.10.1", "0.19"), ("0.20.1", "0.20"), ("0.25.1", "0.25"),
                                            ("0.26", "0.26"), ("0.27.1", "0.27"), ("0.28", "0.28"), ("0.29.1", "0.29"),
                                            ("0.31.2", "0.30"), ("0.32.1", "0.32"), ("0.33", "0.33"), ("0.40", "0.33"), (None, "0.33")])
def test_version_mapping(version, rules):
    assert vllm_rules(version).version == rules


@pytest.mark.parametrize("bad", ["abc", "1.0", "v2"])
def test_bad_version(bad):
    with pytest.raises(KvplanError, match="--engine-version"):
        vllm_rules(bad)


def test_gpt_oss_tokens_by_version():
    m = load_model("gpt-oss-120b")
    kw = dict(kv_cache_memory_gib=GPT_OSS_POOL, max_model_len=131072, max_num_batched_tokens=8192)
    new = capacity(m, None, "auto", **kw)
    # 0.30+: 8,192 full blocks + cdiv(127 + 2 x 8192, 16) + 1 = 1,033 sliding; int(110136 / 9225 x 131072)
    assert (new.blocks_per_request, new.kv_tokens) == (9225, 1_564_850)
    assert new.log_lines[1] == ("GPU KV cache size: 1,564,850 tokens, Maximum concurrency for 131,072 tokens per "
                                "request: 11.94x")
    old = capacity(m, None, "auto", engine_version="0.20", **kw)
    # 0.20: no second batch in flight: cdiv(127 + 8192, 16) + 1 = 521 sliding blocks; tokens (110136 // 2) x 16
    assert old.blocks_per_request == 8192 + 521
    assert old.kv_tokens == 881_088
    assert old.log_lines[1:] == ["GPU KV cache size: 881,088 tokens",
                                 f"Maximum concurrency for 131,072 tokens per request: {110136 / 8713:.2f}x"]


def test_llama_log_lines():
    r = capacity(load_model("llama-3.1-8b"), None, "auto", kv_cache_memory_gib=60.5, max_model_len=131072)
    assert r.log_lines == ["Available KV cache memory: 60.5 GiB",
                           "GPU KV cache size: 495,616 tokens, Maximum concurrency for 131,072 tokens per request: "
                           "3.78x"]
    r25 = capacity(load_model("llama-3.1-8b"), None, "auto", kv_cache_memory_gib=60.5, max_model_len=131072,
                   engine_version="0.25")
    assert r25.log_lines[1:] == ["GPU KV cache size: 495,616 tokens",
                                 "Maximum concurrency for 131,072 tokens per request: 3.78x"]


def test_skip_layer_block_raise_only_from_030():
    m = load_model("llama3-8b")
    assert capacity(m, None, "turboquant_k8v4", kv_cache_memory_gib=10).block_size == 48
    old = capacity(m, None, "turboquant_k8v4", kv_cache_memory_gib=10, engine_version="0.28")
    assert old.block_size == 16 and old.bytes_per_block == 16 * (28 * 1568 + 4 * 4096)


def test_dtype_missing_in_old_version():
    with pytest.raises(KvplanError, match="does not exist in vLLM 0.20"):
        capacity(load_model("llama3-8b"), load_gpu("h100"), "int4_per_token_head", engine_version="0.20")


def test_v020_sliding_nvfp4_unpacked():
    # 0.20's SlidingWindowSpec has no nvfp4 branch: Gemma-3's sliding layers cost 16 heads x 256 x 1 B = 4,096 B
    m = load_model("gemma-3-27b")
    new = capacity(m, None, "nvfp4", kv_cache_memory_gib=10, max_model_len=8192)
    old = capacity(m, None, "nvfp4", kv_cache_memory_gib=10, max_model_len=8192, engine_version="0.20")
    assert new.kv_bytes_per_token == 62 * 16 * 144
    assert old.kv_bytes_per_token == 10 * 16 * 144 + 52 * 16 * 256


def test_pipeline_parallel_halves_the_layers():
    # 2 stages of 16 layers: a block spans 16 layers (1 MiB), so the same 60.5 GiB holds twice the blocks
    m = load_model("llama-3.1-8b")
    r = capacity(m, None, "auto", pp=2, kv_cache_memory_gib=60.5, max_model_len=131072)
    assert r.bytes_per_block == 16 * 16 * 8 * 256 * 2
    assert r.num_blocks == 61_952 and r.stage_layers == [[0, 16], [16, 32]]
    assert r.kv_tokens == 991_232


def test_pipeline_stages_take_the_fewest_blocks():
    # DeepSeek-V3's 61 layers over 4 stages: 15, 15, 16, 15 (vLLM gives the remainder to the stage before last).
    # Each stage's rank budgets its own weights; vLLM takes the fewest blocks over ranks.
    from kvplan.api import pool_plan
    from kvplan.sizing.weights import weight_bytes

    m, h200 = load_model("deepseek-v3"), load_gpu("h200")
    plan = pool_plan(m, h200, "fp8_ds_mla", tp=8, pp=4, activation_gib=6)
    assert [(st.layers_range.start, st.layers_range.stop) for st in plan.stages] == [(0, 15), (15, 30), (30, 46),
                                                                                      (46, 61)]
    requested = -(-h200.memory_total_bytes * 92 // 100)
    for st in plan.stages:
        assert st.weights == weight_bytes(m, 8, stage=st.layers_range).total
        pool = requested - st.weights - 6 * GiB
        # 64-token blocks of one 656-byte latent per layer: no dense-MLA backend of vLLM 0.33 lists fp8_ds_mla, so
        # the plan is a what-if with the blocks of the one that does, the sparse FlashMLA ([64])
        assert st.num_blocks == pool // (len(st.layers_range) * 64 * 656)
    # the embedding sits on the first stage and the LM head on the last; the 16-layer stage binds
    assert plan.binding.layers_range == range(30, 46)
    r = capacity(m, h200, "fp8_ds_mla", tp=8, pp=4, max_model_len=32768, activation_gib=6)
    assert r.num_blocks == min(st.num_blocks for st in plan.stages) and r.bytes_per_block == 16 * 64 * 656
    # every layer's weights are counted once over the stages
    assert sum(st.weights for st in plan.stages) == weight_bytes(m, 8).total


def test_decode_context_parallel():
    # DCP 8 spreads each sequence over 8 ranks: a 32,768-token request needs cdiv(4096, 64) = 64 of the sparse
    # FlashMLA kernel's 64-token blocks per rank, instead of 512
    m = load_model("deepseek-v3")
    base = capacity(m, None, "fp8_ds_mla", tp=8, kv_cache_memory_gib=20, max_model_len=32768)
    dcp = capacity(m, None, "fp8_ds_mla", tp=8, dcp=8, kv_cache_memory_gib=20, max_model_len=32768)
    assert base.block_size == 64
    assert base.blocks_per_request == 512 and dcp.blocks_per_request == 64
    assert dcp.max_concurrency == 8 * base.max_concurrency
    with pytest.raises(KvplanError, match="--dcp 3 must divide --tp 8"):
        capacity(m, None, "fp8_ds_mla", tp=8, dcp=3, kv_cache_memory_gib=20)


def test_num_gpu_blocks_override():
    m = load_model("llama-3.1-8b")
    r = capacity(m, load_gpu("h100"), "auto", num_gpu_blocks_override=1000, max_model_len=8192)
    assert r.num_blocks == 1000 and r.kv_tokens == int(1000 / 512 * 8192)


def test_capacity_cli_new_options(cli):
    r = cli("capacity", "gpt-oss-120b", "--kv-cache-memory", str(GPT_OSS_POOL), "--max-model-len", "131072",
            "--max-num-batched-tokens", "8192", "--engine-version", "0.20", "--json")
    assert r.code == 0, r.err
    import json

    d = json.loads(r.out)
    assert d["kv_tokens"] == 881_088 and d["engine_version"] == "0.20" and d["num_kv_cache_groups"] == 2
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "--engine", "tgi")
    assert r.code == 2 and "--engine tgi" in r.err
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "--pp", "40")
    assert r.code == 2 and "--pp must be between 1 and" in r.err


@pytest.mark.parametrize("gpu, dtype, block", [("h200", "auto", 16), ("h200", "fp8", 64), ("b200", "auto", 32),
                                               ("a100", "auto", 16), ("a100", "fp8_ds_mla", 64)])
def test_mla_backend_block_sizes(gpu, dtype, block):
    # vLLM 0.33's selector (platforms/cuda.py _get_backend_priorities) on SM90 tries FLASH_ATTN_MLA first, which
    # stores only a 16-bit cache in MultipleOf(16) blocks (16), then FlashMLA ([64]) for fp8; on SM100 FlashInfer
    # MLA ([32, 64]: 16 does not divide by 32, so 32); Triton MLA elsewhere (16). No dense MLA backend lists
    # fp8_ds_mla: a what-if, planned with the blocks of the sparse FlashMLA that does ([64])
    r = capacity(load_model("deepseek-v3"), load_gpu(gpu), dtype, tp=8, kv_cache_memory_gib=20, max_model_len=8192)
    assert r.block_size == block
    assert capacity(load_model("llama3-8b"), load_gpu(gpu), tp=1).block_size == 16


def test_default_utilization_by_version():
    # CacheConfig's default: 0.92 from 0.20 (vllm/config/cache.py), 0.9 before
    m, h100 = load_model("llama-3.1-8b"), load_gpu("h100")
    assert capacity(m, h100, max_model_len=8192).gpu_memory_utilization == 0.92
    old = capacity(m, h100, max_model_len=8192, engine_version="0.10")
    assert old.gpu_memory_utilization == 0.9 and old.requested_bytes == -(-h100.memory_total_bytes * 9 // 10)
    assert capacity(m, h100, max_model_len=8192, engine_version="0.10",
                    gpu_memory_utilization=0.8).gpu_memory_utilization == 0.8


@pytest.mark.parametrize("argv", [
    ["capacity", "llama3-8b", "--gpu", "h100", "--engine-version", "0.99", "--json"],
    ["throughput", "llama3-8b", "--gpu", "h100", "--isl", "1k", "--osl", "1k", "-n", "1", "--engine-version", "0.99",
     "--json"],
])
def test_version_newer_than_catalogued_is_noted(argv):
    # 0.99 is planned with the newest catalogued rules (0.33), and the output says so; 0.33.2 is 0.33 itself
    import json

    from tests.test_options import _run

    code, out, _ = _run(argv)
    note = "vLLM 0.99 is newer than the releases kvplan knows (up to 0.33): planned with 0.33's rules"
    assert code == 0 and note in json.loads(out)["notes"]
    code, out, _ = _run([a if a != "0.99" else "0.33.2" for a in argv])
    assert code == 0 and not any("newer than" in n for n in json.loads(out)["notes"])


def test_sweep_notes_a_version_newer_than_catalogued():
    from tests.test_options import _run

    code, _, err = _run(["sweep", "-m", "llama3-8b", "-g", "h100", "--engine-version", "0.99"])
    assert code == 0 and "note: vLLM 0.99 is newer than the releases kvplan knows (up to 0.33)" in err
