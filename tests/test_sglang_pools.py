"""SGLang's two pools beside the KV cache, worked by hand from sglang 0.5.6's source:

- hybrids that keep a fixed state per request in some layers (Mamba-2, gated delta net: Qwen3-Next, Qwen3.5,
  Nemotron-H): model_executor/model_runner.py profile_max_num_token and handle_max_mamba_cache split the pool's
  memory between the Mamba state pool (mamba_full_memory_ratio 0.9 of the full-attention pool: 0.9 / 1.9 of it, in
  whole requests' states, max_mamba_cache_size) and the full-attention layers' KV; init_memory_pool caps
  max_running_requests at max_mamba_cache_size // 3 (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, radix cache on).
  The state per layer per rank is configs/mamba_utils.py Mamba2StateShape.create: conv (intermediate +
  2 x n_groups x state_size) / tp x (conv_kernel - 1) in bfloat16 (CONV_DTYPE), temporal heads / tp x head_dim x
  state_size in float32 (server_args.py mamba_ssm_dtype), as configs/qwen3_next.py mamba2_cache_params shapes it.
- DeepSeek sparse attention (DeepSeek-V3.2): profile_max_num_token counts (kv_lora_rank + rope) x the KV dtype's
  element size plus the indexer's index_head_dim + index_head_dim // 128 x 4 bytes (NSATokenToKVPool: fp8 keys
  and a float32 scale per 128, uint8 storage) per layer; server_args.py _handle_model_specific_adjustments sets
  page size 64 and --kv-cache-dtype auto to bfloat16 on Hopper, fp8_e4m3 from SM 10, and accepts only those two.

The pool's memory is given (free before loading, weights, mem_fraction_static) so that every figure follows by
hand: available = free after loading - (1 - f) x free before.
"""

from pathlib import Path

import pytest

from kvplan import load_gpu, load_model
from kvplan.deployment import DeploymentArgs
from kvplan.errors import KvplanError
from kvplan.plan.sglang_pool import sglang_capacity, sglang_pool
from kvplan.plan.throughput import engine_limits
from kvplan.rules.sglang import mamba_state_bytes
from kvplan.specs.parallel import Parallel

CORPUS = Path(__file__).resolve().parent / "fixtures" / "hf-corpus"
QWEN35 = str(CORPUS / "Qwen--Qwen3.5-35B-A3B_config.json")
NEXT = str(CORPUS / "Qwen--Qwen3-Next-80B-A3B-Instruct_config.json")
NEMOTRON_H = str(CORPUS / "nvidia--Nemotron-H-8B-Base-8K_config.json")
DSV32 = str(CORPUS / "deepseek-ai--DeepSeek-V3.2_config.json")
GiB = 1 << 30


def test_qwen35_35b_mamba_state_per_request_tp2():
    # 40 layers, a full-attention layer every 4th: 30 gated-delta-net layers, 10 attention layers. Per GDN layer
    # at TP 2: conv_dim = 32 value heads x 128 + 2 x 16 key heads x 128 = 8,192, / 2 = 4,096 channels x (4 - 1)
    # x 2 B = 24,576 B; temporal (32 / 2) x 128 x 128 x 4 B (float32) = 1,048,576 B
    m = load_model(QWEN35)
    assert (len(m.state_layers), len(m.attention_layers)) == (30, 10)
    assert mamba_state_bytes(m, 2) == (24_576, 1_048_576)


def test_qwen35_35b_pool_on_h100_tp2_by_hand():
    # free before loading 80 GiB, weights 40 GiB, f = 0.9: available = 40 - 0.1 x 80 = 32 GiB = 34,359,738,368 B.
    # State per request: 30 x (24,576 + 1,048,576) = 32,194,560 B. handle_max_mamba_cache: 32 GiB x 0.9 / 1.9 =
    # 16,275,665,542.7 B // 32,194,560 = 505 slots (505 x 32,194,560 = 16,258,252,800 B).
    # KV per token: 10 attention layers x max(1, 2 KV heads // 2) x 256 x 2 (K, V) x 2 B = 10,240 B;
    # (34,359,738,368 - 16,258,252,800) = 18,101,485,568 B // 10,240 = 1,767,723 tokens (page 1).
    # max_running_requests: min(max(int(1,767,723 / 262,144 x 512) = 3,452, 2048), 4096) = 3,452, then
    # min(3,452, 505 // 3 = 168) = 168
    r = sglang_pool(load_model(QWEN35), load_gpu("h100"), tp=2, mem_fraction_static=0.9, free_before_load_gib=80,
                    weight_gib=40)
    assert r.state["bytes_per_request"] == 32_194_560
    assert r.state["slots"] == 505 and r.state["pool_bytes"] == 16_258_252_800
    assert r.cell_bytes == 10_240
    assert r.max_total_num_tokens == 1_767_723
    assert r.max_running_requests == 168
    assert r.fits and "Mamba Cache is allocated. max_mamba_cache_size: 505" in r.log_lines[0]


def test_disable_radix_cache_lets_every_state_slot_run_a_request():
    # model_runner_kv_cache_mixin.py init_memory_pool (0.5.9): with --disable-radix-cache the ratio is 1, so the same
    # pool as test_qwen35_35b_pool_on_h100_tp2_by_hand runs min(3,452, 505 // 1) = 505 requests; the pool itself is
    # unchanged (handle_max_mamba_cache splits the memory the same way)
    r = sglang_pool(load_model(QWEN35), load_gpu("h100"), tp=2, mem_fraction_static=0.9, free_before_load_gib=80,
                    weight_gib=40, radix_cache=False)
    assert r.state["slots"] == 505 and r.max_total_num_tokens == 1_767_723
    assert r.max_running_requests == 505


def test_max_running_requests_sizes_the_state_pool_without_the_radix_cache():
    # handle_max_mamba_cache: --disable-radix-cache with --max-running-requests 128 makes max_mamba_cache_size 128:
    # 128 x 32,194,560 = 4,120,903,680 B of state; the KV layers get 34,359,738,368 - 4,120,903,680 =
    # 30,238,834,688 B // 10,240 = 2,953,011 tokens; max_running_requests min(128, 128 // 1) = 128
    m, g = load_model(QWEN35), load_gpu("h100")
    r = sglang_pool(m, g, tp=2, mem_fraction_static=0.9, free_before_load_gib=80, weight_gib=40, radix_cache=False,
                    max_running_requests=128)
    assert r.state["slots"] == 128 and r.state["pool_bytes"] == 4_120_903_680
    assert r.max_total_num_tokens == 2_953_011 and r.max_running_requests == 128
    # with the radix cache on the number given only caps: min(128, 505 // 3 = 168) = 128 requests, the same 505 slots
    on = sglang_pool(m, g, tp=2, mem_fraction_static=0.9, free_before_load_gib=80, weight_gib=40,
                     max_running_requests=128)
    assert on.state["slots"] == 505 and on.max_total_num_tokens == 1_767_723 and on.max_running_requests == 128
    # a dense model: the number given, whatever the pool (min(R, req_to_token_pool.size = R))
    dense = sglang_pool(load_model("llama-3.1-8b"), g, tp=1, mem_fraction_static=0.9, max_running_requests=100)
    assert dense.max_running_requests == 100


def test_the_options_reach_the_pool_and_the_benchmark_limits():
    d = DeploymentArgs(model=QWEN35, gpu="h100", engine="sglang", tp=2, disable_radix_cache=True,
                       max_running_requests=64).resolve()
    assert (d.radix_cache, d.max_running_requests) == (False, 64)
    r = sglang_capacity(d)
    assert r.state["slots"] == 64 and r.max_running_requests == 64
    assert engine_limits(d).max_seqs == 64
    with pytest.raises(KvplanError, match="--max-running-requests"):
        DeploymentArgs(model="llama-3.1-8b", gpu="h100", max_running_requests=64).resolve()


def test_qwen3_next_80b_pool_on_h200_tp4_by_hand():
    # 48 layers: 36 GDN, 12 attention. Per GDN layer at TP 4: conv 8,192 / 4 = 2,048 x 3 x 2 B = 12,288 B;
    # temporal (32 / 4) x 128 x 128 x 4 B = 524,288 B; x 36 = 19,316,736 B per request.
    # free 140 GiB, weights 40 GiB, f = 0.9: available = 100 - 14 = 86 GiB = 92,341,796,864 B.
    # Slots: 86 GiB x 0.9 / 1.9 = 43,740,956,537.3 B // 19,316,736 = 2,264 (43,733,090,304 B).
    # KV: 12 layers x max(1, 2 // 4) = 1 head x 256 x 2 x 2 B = 12,288 B per token;
    # (92,341,796,864 - 43,733,090,304) = 48,608,706,560 // 12,288 = 3,955,786 tokens.
    # max_running_requests: int(3,955,786 / 262,144 x 512) = 7,726 -> 4,096, then min(4,096, 2,264 // 3 = 754)
    m = load_model(NEXT)
    assert mamba_state_bytes(m, 4) == (12_288, 524_288)
    r = sglang_pool(m, load_gpu("h200"), tp=4, mem_fraction_static=0.9, free_before_load_gib=140, weight_gib=40)
    assert r.state["bytes_per_request"] == 19_316_736 and r.state["slots"] == 2_264
    assert r.cell_bytes == 12_288 and r.max_total_num_tokens == 3_955_786
    assert r.max_running_requests == 754


def test_gated_delta_net_slots_divide_over_dp_attention_groups():
    # handle_max_mamba_cache: a hybrid GDN config's max_mamba_cache_size // dp_size with --enable-dp-attention.
    # Qwen3-Next, --tp 4 --dp-size 2 --enable-dp-attention: attention TP 2, conv 4,096 x 3 x 2 = 24,576 B,
    # temporal 16 x 128 x 128 x 4 = 1,048,576 B; x 36 = 38,633,472 B per request. 86 GiB as above:
    # 43,740,956,537.3 // 38,633,472 = 1,132 slots, // 2 groups = 566; cap 566 // 3 = 188
    m = load_model(NEXT)
    lay = Parallel(attn_tp=2, dense_tp=4, vocab_tp=4, moe_tp=4, ep=1, dp=2, world=4)
    r = sglang_pool(m, load_gpu("h200"), tp=4, layout=lay, mem_fraction_static=0.9, free_before_load_gib=140,
                    weight_gib=40)
    assert r.state["bytes_per_request"] == 38_633_472 and r.state["slots"] == 566
    assert r.max_running_requests == 188


def test_mamba2_groups_replicated_where_tp_does_not_divide_them():
    # Nemotron-H-8B: 128 Mamba-2 heads of 64, 8 groups of state 128, kernel 4. TP 1: conv (8,192 + 2 x 8 x 128)
    # = 10,240 x 3 x 2 B = 61,440 B; temporal 128 x 64 x 128 x 4 B = 4,194,304 B. TP 16: 8 groups do not divide,
    # so 16 (extra_groups_for_head_shards): conv (8,192 + 2 x 16 x 128) / 16 = 768 x 3 x 2 B = 4,608 B; temporal
    # 8 x 64 x 128 x 4 B = 262,144 B
    m = load_model(NEMOTRON_H)
    assert mamba_state_bytes(m, 1) == (61_440, 4_194_304)
    assert mamba_state_bytes(m, 16) == (4_608, 262_144)


def test_dsv32_nsa_pool_on_h200_tp8_by_hand():
    # bfloat16 on Hopper (auto): per layer (512 + 64) x 2 B = 1,152 B of latent + the indexer's 128 + 128 / 128 x 4
    # = 132 B = 1,284 B; x 61 layers = 78,324 B per token. free 140 GiB, weights 80 GiB, f = 0.9: available
    # 60 - 14 = 46 GiB = 49,392,123,904 B // 78,324 = 630,612 tokens, in pages of 64: 9,853 pages = 630,592 tokens.
    # max_running_requests: int(630,592 / 163,840 x 512) = 1,970 -> 2,048.
    # NSATokenToKVPool allocates per layer (630,592 + 64) x 1,152 B and (630,592 + 64 + 1) // 64 = 9,854 index
    # pages of 64 x 132 B: 61 x (726,515,712 + 83,246,592) = 49,395,500,544 B
    d = DeploymentArgs(model=DSV32, gpu="h200", tp=8, engine="sglang", mem_fraction_static=0.9,
                       free_memory_gib=140.5).resolve(needs_memory=True)
    assert d.kv.name == "bfloat16" and d.page_size == 64
    r = sglang_pool(d.model, d.gpu, d.kv, tp=8, mem_fraction_static=0.9, free_before_load_gib=140, weight_gib=80,
                    page_size=d.page_size)
    assert r.cell_bytes == 78_324
    assert r.max_total_num_tokens == 630_592 and r.num_blocks == 9_853
    assert r.max_running_requests == 2_048
    assert r.indexer["index_pages"] == 9_854 and r.indexer["allocated_bytes"] == 49_395_500_544


def test_dsv32_fp8_on_b200_profiles_576_bytes_of_latent():
    # auto from SM 10 is fp8_e4m3: the profile counts (512 + 64) x 1 B + 132 = 708 B per layer, x 61 = 43,188 B.
    # free 180 GiB, weights 80, f = 0.9: 100 - 18 = 82 GiB = 88,046,829,568 B // 43,188 = 2,038,687 -> 31,854
    # pages = 2,038,656 tokens. The fp8 latent is stored as 512 + 512 / 128 x 4 + 64 x 2 = 656 B (memory_pool.py
    # NSATokenToKVPool override_dim), so the pool allocates 61 x ((2,038,656 + 64) x 656 + 31,855 x 64 x 132)
    # = 97,997,192,960 B, more than the 82 GiB it budgeted
    d = DeploymentArgs(model=DSV32, gpu="b200", tp=8, engine="sglang").resolve(needs_memory=True)
    assert d.kv.name == "fp8_e4m3"
    r = sglang_pool(d.model, d.gpu, d.kv, tp=8, mem_fraction_static=0.9, free_before_load_gib=180, weight_gib=80,
                    page_size=d.page_size)
    assert r.cell_bytes == 43_188 and r.max_total_num_tokens == 2_038_656
    assert r.indexer["latent_bytes_per_token_per_layer"] == 656
    assert r.indexer["allocated_bytes"] == 97_997_192_960
    assert any("stores 656" in n for n in r.notes)


def test_nsa_page_size_is_64_whatever_was_asked():
    d = DeploymentArgs(model=DSV32, gpu="h200", tp=8, engine="sglang", page_size=16).resolve(needs_memory=True)
    assert d.page_size == 64 and any("page size 64" in n for n in d.notes)


def test_nsa_refuses_other_kv_dtypes():
    # server_args.py asserts kv_cache_dtype in ["bfloat16", "fp8_e4m3"] for DeepSeek NSA
    with pytest.raises(KvplanError, match="bfloat16 or fp8_e4m3 only"):
        DeploymentArgs(model=DSV32, gpu="h200", tp=8, engine="sglang", kv_cache_dtype="fp8_e5m2").resolve()


def test_state_heads_tp_must_divide():
    # Qwen3.5-35B: 32 value heads; TP 64 would not split them (mamba_utils.py divide asserts); kvplan's own
    # attention-head check refuses first or the state check does, with exit 2 either way
    with pytest.raises(KvplanError):
        DeploymentArgs(model=QWEN35, gpu="h100", tp=64, engine="sglang").resolve(needs_memory=True)
    with pytest.raises(KvplanError, match="does not split"):
        mamba_state_bytes(load_model(QWEN35), 64)


def test_capacity_cli_prints_the_pools(cli):
    r = cli("capacity", DSV32, "--gpu", "h200", "--tp", "8", "--engine", "sglang")
    assert r.code == 0, r.err
    assert "page size 64" in r.out and "78,324" in r.out and "not modelled" not in r.out
    r = cli("capacity", NEXT, "--gpu", "h200", "--tp", "4", "--engine", "sglang")
    assert r.code == 0, r.err
    assert "12,288" in r.out and "Mamba Cache is allocated" in r.out


def test_capacity_cli_refuses_a_bad_nsa_dtype_in_one_line(cli):
    r = cli("capacity", DSV32, "--gpu", "h200", "--tp", "8", "--engine", "sglang", "-d", "fp8_e5m2")
    assert r.code == 2 and r.out == ""
    assert r.err.count("\n") == 1 and "bfloat16 or fp8_e4m3 only" in r.err


def test_scheduler_admits_no_more_than_the_mamba_slots_allow(cli):
    # the scheduler works within max_running_requests = slots // 3 (init_memory_pool): a benchmark at a
    # concurrency above it runs at most that many at once and says the cap held it
    import json

    d = DeploymentArgs(model=NEXT, gpu="h200", tp=4, engine="sglang").resolve(needs_memory=True)
    pool = sglang_capacity(d)
    cap = pool.state["slots"] // 3
    assert engine_limits(d).max_seqs == pool.max_running_requests == cap < 2048
    r = cli("throughput", NEXT, "--gpu", "h200", "--tp", "4", "--engine", "sglang", "--isl", "256", "--osl", "64",
            "-n", "2048", "--json")
    assert r.code == 0, r.err
    row = json.loads(r.out)["rows"][0]
    assert row["pool_limit"] <= cap and row["mean_running"] <= cap


def test_both_engines_name_the_shared_figures_alike():
    # kvplan.capacity plans either engine's pool, and each result carries every key of PoolResult under one name
    import kvplan
    from kvplan.plan.capacity import SHARED_KEYS

    vllm = kvplan.capacity("llama-3.1-8b", "h100", "fp8")
    sglang = kvplan.capacity("llama-3.1-8b", "h100", "fp8", engine="sglang")
    assert (vllm.engine, sglang.engine) == ("vllm", "sglang")
    for r in (vllm, sglang):
        assert all(hasattr(r, k) for k in SHARED_KEYS), [k for k in SHARED_KEYS if not hasattr(r, k)]
    d = DeploymentArgs(model="llama-3.1-8b", gpu="h100", kv_cache_dtype="fp8", engine="sglang").resolve()
    same = sglang_capacity(d)
    assert (sglang.kv_tokens, sglang.max_model_len, sglang.kv_bytes_per_token) == (
        same.max_total_num_tokens, same.context_len, same.cell_bytes)
