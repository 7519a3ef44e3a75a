"""Configurations the engine refuses at start are refused by kvplan, in the engine's words (one line, exit 2).
Each rule is listed with the engine source it comes from (vLLM 0.19.0 and the newest release read; SGLang 0.5.x):
the file and the function whose check raises."""

import pytest

from kvplan.app.cli import main
from kvplan.deployment import DeploymentArgs
from kvplan.errors import KvplanError

# (rule, source, deployment options, words of the refusal); on Llama-3-8B (32 heads, 8 KV heads, 32 layers,
# 8,192 positions) and an H100 unless the options name another model
RULES = [
    ("max_num_batched_tokens >= max_num_seqs", "vllm/config/scheduler.py SchedulerConfig.verify_max_model_len",
     dict(max_num_seqs=256, max_num_batched_tokens=64),
     "vLLM refuses to start: max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (256)"),
    ("max_num_batched_tokens >= max_num_seqs, against serve's default", "vllm/config/scheduler.py "
     "SchedulerConfig.verify_max_model_len; engine/arg_utils.py get_batch_defaults", dict(max_num_seqs=9000),
     "max_num_batched_tokens (8192) must be greater than or equal to max_num_seqs (9000)"),
    ("gpu_memory_utilization in (0, 1]", "vllm/config/cache.py CacheConfig.gpu_memory_utilization Field(gt=0, le=1)",
     dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization must be in (0, 1]"),
    ("max_num_seqs >= 1", "vllm/config/scheduler.py SchedulerConfig.max_num_seqs Field(ge=1)",
     dict(max_num_seqs=0), "--max-num-seqs must be positive"),
    ("max_num_batched_tokens >= 1", "vllm/config/scheduler.py SchedulerConfig.max_num_batched_tokens Field(ge=1)",
     dict(max_num_batched_tokens=0), "--max-num-batched-tokens must be positive"),
    ("attention heads divisible by TP", "vllm/config/model.py ModelConfig.verify_with_parallel_config ('Total "
     "number of attention heads (32) must be divisible by tensor parallel size (3)')", dict(tp=3),
     "--tp 3 does not split Llama-3-8B's 32 attention heads"),
    ("max_model_len within the model's", "vllm/config/model.py _get_and_verify_max_len ('User-specified "
     "max_model_len ... is greater than the derived max_model_len')", dict(max_model_len=100_000),
     "--max-model-len 100000 exceeds Llama-3-8B's max_position_embeddings 8192"),
    ("DCP divides TP", "vllm/config/parallel.py ParallelConfig._validate_parallel_config ('tp_size=2 must be "
     "divisible by dcp_size=4')", dict(tp=2, dcp=4), "--dcp 4 must divide --tp 2"),
    ("DCP on GQA needs TP above the KV heads", "vllm/config/model.py ModelConfig.verify_with_parallel_config "
     "(assert 'tensor parallel size 8 must be greater than total num kv heads 8')", dict(tp=8, dcp=2),
     "TP 8 over Llama-3-8B's 8 KV heads replicates none"),
    ("block size a multiple of 16", "vllm/v1/attention/backends/*.py get_supported_kernel_block_sizes "
     "(MultipleOf(16))", dict(block_size=24), "--block-size 24: vLLM's attention backends take multiples of 16"),
    ("a KV dtype the release has", "vllm/config/cache.py CacheDType (the Literal each release lists)",
     dict(kv_cache_dtype="nvfp4_4over6", engine_version="0.26"),
     "KV cache dtype 'nvfp4_4over6' does not exist in vLLM 0.26"),
    ("EPLB needs expert parallelism", "vllm/config/parallel.py ParallelConfig._validate_parallel_config "
     "('enable_expert_parallel must be True to use EPLB.')", dict(model="qwen3-30b-a3b", tp=2, enable_eplb=True),
     "vLLM refuses it without --enable-expert-parallel"),
    ("EPLB needs more than one rank", "vllm/config/parallel.py ParallelConfig._validate_parallel_config ('EPLB "
     "requires tensor, prefill-context, or data parallelism'; 0.19: 'EPLB requires tensor_parallel_size or "
     "data_parallel_size to be greater than 1')",
     dict(model="qwen3-30b-a3b", enable_expert_parallel=True, enable_eplb=True), "vLLM refuses EPLB on one GPU"),
    ("redundant experts need EPLB", "vllm/config/parallel.py ParallelConfig._validate_parallel_config "
     "('num_redundant_experts is set to 2 but EPLB is not enabled')",
     dict(model="qwen3-30b-a3b", tp=2, enable_expert_parallel=True, num_redundant_experts=2),
     "vLLM places redundant experts only with EPLB"),
    ("EPLB spreads experts evenly", "vllm/model_executor/layers/fused_moe/layer.py FusedMoE.__init__ ('EPLB currently only supports even "
     "distribution of experts across ranks')",
     dict(model="qwen3-30b-a3b", tp=4, enable_expert_parallel=True, enable_eplb=True, num_redundant_experts=1),
     "128 experts + 1 redundant do not divide over 4 EP ranks; give --num-redundant-experts 4"),
    ("SGLang's KV dtypes", "sglang/srt/server_args.py ServerArgs.add_cli_args (--kv-cache-dtype choices)",
     dict(engine="sglang", kv_cache_dtype="fp8_per_token_head"), "SGLang has no KV cache dtype 'fp8_per_token_head'"),
    ("SGLang: DP attention groups divide TP", "sglang/srt/server_args.py ServerArgs._handle_data_parallelism "
     "(assert self.tp_size % self.dp_size == 0)",
     dict(model="qwen3-30b-a3b", engine="sglang", tp=4, dp_size=3, enable_dp_attention=True),
     "--dp-size 3 must divide --tp 4 with --enable-dp-attention"),
    ("SGLang: the DP LM head needs DP attention", "sglang/srt/server_args.py ServerArgs._handle_data_parallelism "
     "('Please enable dp attention when setting enable_dp_lm_head.')",
     dict(model="qwen3-30b-a3b", engine="sglang", tp=4, dp_size=2, enable_dp_lm_head=True),
     "--enable-dp-lm-head applies with --enable-dp-attention"),
    ("SGLang: moe_dense_tp_size 1 or unset", "sglang/srt/server_args.py ServerArgs.check_server_args "
     "('moe_dense_tp_size only support 1 and None currently')",
     dict(model="qwen3-30b-a3b", engine="sglang", tp=4, dp_size=2, enable_dp_attention=True, moe_dense_tp_size=4),
     "--moe-dense-tp-size 4: SGLang supports only 1"),
]


@pytest.mark.parametrize("rule, source, options, words", RULES, ids=[r[0] for r in RULES])
def test_rule(rule, source, options, words):
    with pytest.raises(KvplanError) as e:
        DeploymentArgs(**{"model": "llama3-8b", "gpu": "h100", **options}).resolve()
    assert words in str(e.value)


def test_cli_refuses_in_one_line(capsys):
    assert main(["capacity", "llama3-8b", "--gpu", "h100", "--max-num-seqs", "256",
                 "--max-num-batched-tokens", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "SchedulerConfig" in err and "raise --max-num-batched-tokens to 256 or lower --max-num-seqs to 64" in err


def test_equal_is_accepted_and_the_warning_is_a_note():
    DeploymentArgs(model="llama3-8b", gpu="h100", max_num_seqs=256, max_num_batched_tokens=256).resolve()
    d = DeploymentArgs(model="llama3-8b", gpu="h100", max_num_seqs=2, max_num_batched_tokens=30000).resolve()
    assert any("exceeds max_num_seqs * max_model_len (16384)" in n for n in d.notes)
