"""Hybrid models whose state layers keep a fixed state per sequence beside attention: their parameters against
transformers, and their pool worked by hand from vLLM's rules (models/config.py HybridAttentionMambaModelConfig,
v1/kv_cache_interface.py MambaSpec, model_executor/layers/mamba/mamba_utils.py, v1/core/kv_cache_utils.py)."""

import json
from pathlib import Path

import pytest

from kvplan import capacity, crossover, load_gpu, load_model
from kvplan.errors import KvplanError
from kvplan.sizing.kv_cache import state_bytes
from kvplan.sizing.model_tensors import param_count

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"
NANO = str(CONFIGS / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.config.json")
QWEN35 = str(CONFIGS / "Qwen--Qwen3.5-35B-A3B.config.json")
GiB = 2**30


def test_parameters_as_transformers_counts_them():
    # transformers 5.24 on the meta device: NemotronHForCausalLM 31,577,937,344; Qwen3.5-35B-A3B's language model
    # (Qwen3_5MoeForCausalLM) 34,660,610,688 and with its vision tower (the ForConditionalGeneration) 35,107,181,936
    nano, qwen = load_model(NANO), load_model(QWEN35)
    assert param_count(nano) == 31_577_937_344
    assert param_count(qwen) == 35_107_181_936
    assert param_count(qwen) - sum(qwen.extra_params.values()) - sum(qwen.replicated_params.values()) == 34_660_610_688
    # the layouts: Nemotron-H's 52 blocks (23 Mamba-2, 6 attention, 23 MoE); Qwen3.5's 40 layers, attention every 4th
    assert (len(nano.state_layers), len(nano.attention_layers), nano.mlp_kinds.count("moe")) == (23, 6, 23)
    assert nano.attention_layers == (5, 12, 19, 26, 33, 42)
    assert (len(qwen.state_layers), qwen.attention_layers[:3]) == (30, (3, 7, 11))


def test_state_per_sequence():
    # Nemotron-3-Nano's Mamba-2: conv state (4 - 1) x (64 x 64 + 2 x 8 x 128 = 6,144 channels) x 2 B = 36,864;
    # SSM state 64 heads x 64 x 128 in float32 (its config's mamba_ssm_cache_dtype) = 2,097,152
    assert state_bytes(load_model(NANO), 1) == (36_864, 2_097_152)
    # Qwen3.5's gated delta net: conv (4 - 1) x (2 x 16 x 128 + 32 x 128 = 8,192) x 2 B = 49,152; recurrent state
    # 32 value heads x 128 x 128 keys in float32 (mamba_ssm_dtype) = 2,097,152; at TP 2 every head count halves
    assert state_bytes(load_model(QWEN35), 1) == (49_152, 2_097_152)
    assert state_bytes(load_model(QWEN35), 2) == (24_576, 1_048_576)


def _pool(path, version, **kw):
    return capacity(path, load_gpu("b200"), kv_cache_memory_gib=60, max_model_len=32768, engine_version=version,
                    **kw)


def test_nemotron_nano_pool_by_hand():
    # 60 GiB = 64,424,509,440 B for the pool. Attention: 2 (K, V) x 2 KV heads x 128 x 2 B = 1,024 B per token per
    # layer. State page 36,864 + 2,097,152 = 2,134,016 B, so the attention block grows to
    # 16 x cdiv(2,134,016, 16 x 1,024) = 16 x 131 = 2,096 tokens: a page of 2,096 x 1,024 = 2,146,304 B, and the
    # state page is padded to it. 6 attention and 23 state layers: 23 >= 1.5 x 6, so groups of 6: one attention
    # group and cdiv(23, 6) = 4 state groups (one padding layer); a block is 6 pages = 12,877,824 B:
    # 64,424,509,440 // 12,877,824 = 5,002 blocks
    r = _pool(NANO, "0.19")
    assert (r.block_size, r.page_bytes, r.bytes_per_block) == (2_096, 2_146_304, 12_877_824)
    assert (r.num_kv_cache_groups, r.padding_layers, r.num_blocks) == (5, 1, 5_002)
    # 0.19 prints num_blocks // groups x block tokens: 1,000 x 2,096; a request: cdiv(32,768, 2,096) = 16 attention
    # blocks and one page per state group (prefix caching is off for hybrids in 0.19): 20, so 5,002 / 20 = 250.1
    assert (r.kv_tokens, r.blocks_per_request, r.max_concurrency) == (2_096_000, 20, 250.1)
    assert r.state_layers == 23 and r.state_bytes_per_sequence == 23 * 2_134_016
    # 0.33: prefix caching aligns the state (three pages per state group): 16 + 12 = 28 blocks a request,
    # 5,002 / 28 = 178.64 sequences, int(178.642857 x 32,768) = 5,853,769 tokens
    r33 = _pool(NANO, "0.33")
    assert (r33.blocks_per_request, r33.kv_tokens) == (28, 5_853_769)


def test_qwen35_pool_by_hand():
    # attention: 2 x 2 KV heads x 256 x 2 B = 2,048 B per token; state page 49,152 + 2,097,152 = 2,146,304 B:
    # block 16 x cdiv(2,146,304, 32,768) = 16 x 66 = 1,056 tokens, page 2,162,688 B. 10 attention and 30 state
    # layers: groups of 10, one attention and three state groups; a block = 21,626,880 B: 2,978 blocks;
    # 2,978 // 4 x 1,056 = 785,664 tokens; a request cdiv(32,768, 1,056) = 32 + 3 = 35 blocks: 85.09 sequences
    r = _pool(QWEN35, "0.19")
    assert (r.block_size, r.page_bytes, r.num_kv_cache_groups, r.num_blocks) == (1_056, 2_162_688, 4, 2_978)
    assert (r.kv_tokens, r.blocks_per_request) == (785_664, 35)
    assert r.max_concurrency == pytest.approx(2_978 / 35)


@pytest.mark.parametrize("version, pages", [("0.25", 1), ("0.26", 2), ("0.27", 2), ("0.28", 2), ("0.29", 2),
                                            ("0.30", 2), ("0.31", 2), ("0.32", 2), ("0.33", 3)])
def test_qwen35_state_pages_per_release(version, pages):
    # A gated-delta-net request holds `pages` state pages per state group (MambaSpec.max_memory_usage_bytes): one
    # through 0.25 (prefix caching off for hybrids, mamba_cache_mode "none"); two from 0.26 ("align": the running
    # state and the next block's), as a 0.29 log needs; three in 0.33, where FlashInfer's GDN prefill (on B200 with
    # 128-wide key heads) adds a prefill checkpoint. The pool is the same 2,978 blocks (test_qwen35_pool_by_hand);
    # a request takes cdiv(32,768, 1,056) = 32 attention blocks + 3 state groups x pages:
    #   1 page: 35 blocks, 2,978 / 35 = 85.086 sequences, int(85.0857 x 32,768) = 2,788,088 tokens
    #   2 pages: 38 blocks, 2,978 / 38 = 78.368, int(78.3684 x 32,768) = 2,567,976
    #   3 pages: 41 blocks, 2,978 / 41 = 72.634, int(72.6341 x 32,768) = 2,380,075
    r = _pool(QWEN35, version)
    blocks = 32 + 3 * pages
    tokens = {1: 2_788_088, 2: 2_567_976, 3: 2_380_075}[pages]
    assert (r.num_blocks, r.blocks_per_request, r.kv_tokens) == (2_978, blocks, tokens)
    assert r.max_concurrency == pytest.approx(2_978 / blocks)


def test_state_pages_by_gpu_and_mixer():
    from kvplan.rules.vllm import vllm_rules

    # 0.33's checkpoint page for a gated delta net follows FlashInfer's GDN prefill: Hopper always, Blackwell with
    # 128-wide key heads; an A100 runs Triton's prefill and keeps two pages
    v33 = vllm_rules("0.33")
    assert (v33.state_pages("gdn", False, "9.0", 64), v33.state_pages("gdn", False, "10.0", 128)) == (3, 3)
    assert (v33.state_pages("gdn", False, "10.0", 64), v33.state_pages("gdn", False, "8.0", 128)) == (2, 2)
    r = capacity(QWEN35, load_gpu("a100-sxm-80gb"), kv_cache_memory_gib=60, max_model_len=32768,
                 engine_version="0.33")
    assert r.blocks_per_request == 32 + 3 * 2
    # Mamba-2 layers keep a checkpoint from 0.32 (mamba_mixer2.py), gated delta nets not until 0.33
    assert (vllm_rules("0.31").state_pages("mamba2", False), vllm_rules("0.32").state_pages("mamba2", False)) == (2, 3)
    assert vllm_rules("0.32").state_pages("gdn", False, "9.0", 128) == 2
    # attention-free models never cache prefixes: one page in every release
    assert {vllm_rules(v).state_pages("mamba2", True) for v in ("0.19", "0.26", "0.33")} == {1}


def test_nemotron_ssm_dtype_default_by_version(tmp_path):
    # without mamba_ssm_cache_dtype in the config, vLLM 0.19 keeps Nemotron-H's SSM state in float16 and 0.33 in
    # float32: 64 x 64 x 128 x 2 B = 1,048,576 against 2,097,152
    cfg = json.loads(Path(NANO).read_text())
    del cfg["mamba_ssm_cache_dtype"]
    p = tmp_path / "nano.config.json"
    p.write_text(json.dumps(cfg))
    assert _pool(str(p), "0.19").state_bytes_per_sequence == 23 * (36_864 + 1_048_576)
    assert _pool(str(p), "0.33").state_bytes_per_sequence == 23 * (36_864 + 2_097_152)


def test_state_read_in_every_step():
    # a decode step reads every sequence's state: 23 x 2,134,016 B per sequence beside its KV
    m = load_model(NANO)
    x = crossover(m, "auto", batches=[1, 8], contexts=[1024])
    p1, p8 = x.operating_points
    per_seq = 23 * 2_134_016 + 1024 * 6 * 1024  # the state, and 1,024 tokens of 6 attention layers x 1,024 B
    assert p1.kv_bytes == per_seq and p8.kv_bytes == 8 * per_seq


def test_sglang_refuses_state_layers_it_has_no_shape_for():
    # SGLang 0.5.6's Mamba pool holds Mamba-2 and gated-delta-net states (configs/mamba_utils.py
    # Mamba2StateShape); Jamba's Mamba-1 layers have no shape there
    from kvplan.deployment import DeploymentArgs

    jamba = str(Path(__file__).resolve().parent / "fixtures" / "hf-corpus" / "ai21labs--AI21-Jamba-Mini-1.5_config.json")
    with pytest.raises(KvplanError, match="Mamba-2 and gated delta net layers only"):
        DeploymentArgs(model=jamba, gpu="h100", tp=2, engine="sglang").resolve(needs_memory=True)


def test_jamba_pool_by_hand():
    # Jamba-Mini-1.5 at TP 2: attention every 8th layer from layer 4 (4 layers), Mamba in the other 28, MoE every
    # 2nd layer from layer 1. transformers counts 51,570,323,328 parameters.
    path = str(Path(__file__).resolve().parent / "fixtures" / "hf-corpus" / "ai21labs--AI21-Jamba-Mini-1.5_config.json")
    m = load_model(path)
    assert param_count(m) == 51_570_323_328 and m.attention_layers == (4, 12, 20, 28)
    # per rank: attention 2 x 4 KV heads x 128 x 2 B = 2,048 B per token; Mamba conv (4 - 1) x 8,192 / 2 x 2 B =
    # 24,576 and SSM 4,096 x 16 x 2 B (bf16: the model's) = 131,072, a state page of 155,648 B. Block
    # 16 x cdiv(155,648, 16 x 2,048) = 80 tokens, page 80 x 2,048 = 163,840 B. Groups of 4 (28 >= 1.5 x 4): one
    # attention, seven Mamba; a block 4 x 163,840 = 655,360 B; 60 GiB // 655,360 = 98,304 blocks. 0.19 reports
    # 98,304 // 8 x 80 = 983,040 tokens; a request of 65,536 tokens takes cdiv(65,536, 80) = 820 + 7 = 827 blocks
    r = capacity(path, load_gpu("h100"), tp=2, kv_cache_memory_gib=60, max_model_len=65536, engine_version="0.19")
    assert (r.block_size, r.page_bytes, r.num_kv_cache_groups, r.num_blocks) == (80, 163_840, 8, 98_304)
    assert (r.kv_tokens, r.blocks_per_request) == (983_040, 827)
    assert r.max_concurrency == pytest.approx(98_304 / 827)


def test_attention_free_mamba2_by_hand():
    # Mamba-Codestral-7B: 64 Mamba-2 layers, no attention. transformers counts 7,285,403,648 parameters. A layer's
    # state: conv (4 - 1) x (128 x 64 + 2 x 8 x 128 = 10,240 channels) x 2 B = 61,440 and SSM 128 heads x 64 x 128
    # x 2 B (bf16, the model's) = 2,097,152: 2,158,592 B. One group of all 64 layers, a block being one sequence's
    # state in every layer: 138,149,888 B; 60 GiB // 138,149,888 = 466 blocks = 466 sequences at any length (0.19:
    # one block a request); 0.19 reports 466 blocks x a block of max_model_len tokens
    path = str(Path(__file__).resolve().parent / "fixtures" / "hf-corpus" / "mistralai--Mamba-Codestral-7B-v0.1_config.json")
    m = load_model(path)
    assert param_count(m) == 7_285_403_648 and not m.attention_layers
    r = capacity(path, load_gpu("b200"), kv_cache_memory_gib=60, max_model_len=65536, engine_version="0.19")
    assert (r.page_bytes, r.bytes_per_block, r.num_blocks) == (2_158_592, 138_149_888, 466)
    assert (r.blocks_per_request, r.max_concurrency, r.kv_tokens) == (1, 466, 466 * 65536)
    # nothing positional limits it: a length beyond vLLM's 2,048 default is planned, not refused
    assert r.fits


def test_mamba_ssm_cache_dtype_option():
    # --mamba-ssm-cache-dtype float16 halves Nemotron-3-Nano's SSM state (its config says float32):
    # 23 x (36,864 + 64 x 64 x 128 x 2 B) = 24,965,120 B a sequence
    from kvplan.deployment import DeploymentArgs
    from kvplan.plan.vllm_capacity import capacity_of

    d = DeploymentArgs(model=NANO, gpu="b200", mamba_ssm_cache_dtype="float16").resolve(needs_memory=True)
    assert capacity_of(d).state_bytes_per_sequence == 23 * (36_864 + 1_048_576)
    with pytest.raises(KvplanError, match="choose auto, float32"):
        DeploymentArgs(model=NANO, gpu="b200", mamba_ssm_cache_dtype="int4").resolve()
