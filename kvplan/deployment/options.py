"""Which deployment options each engine reads, and how each is spelled on the command line."""

from __future__ import annotations

from kvplan.errors import KvplanError

ENGINES = ("vllm", "sglang")
ENTRYPOINTS = ("serve", "llm")
# vLLM takes a block size its attention backends support: FlashAttention and Triton take multiples of 16
# (v1/attention/backends: MultipleOf(16)); the MLA backends pick theirs among multiples of 16 as well
VLLM_BLOCK_MULTIPLE = 16
# Options one engine reads and the other does not. kvplan plans SGLang's pool at PP 1, without vLLM's memory
# profile, so vLLM's budget options have no SGLang meaning; SGLang's two have no vLLM one.
VLLM_ONLY = ("pp", "dcp", "block_size", "gpu_memory_utilization", "num_gpu_blocks_override", "kv_cache_memory_gib",
             "max_num_seqs", "max_num_batched_tokens", "entrypoint", "enforce_eager", "activation_gib",
             "non_torch_gib", "cudagraph_gib", "kv_cache_dtype_skip_layers", "language_model_only",
             "mamba_ssm_cache_dtype", "data_parallel_size", "data_parallel_size_local", "enable_expert_parallel",
             "all2all_backend", "enable_eplb", "num_redundant_experts")
SGLANG_ONLY = ("mem_fraction_static", "page_size", "enable_mixed_chunk", "max_prefill_tokens", "max_running_requests",
               "disable_radix_cache", "dp_size", "enable_dp_attention", "ep_size", "moe_a2a_backend",
               "ep_num_redundant_experts", "moe_dense_tp_size", "enable_dp_lm_head")
LAYOUT_OPTIONS = ("data_parallel_size", "data_parallel_size_local", "enable_expert_parallel", "all2all_backend",
                  "enable_eplb", "num_redundant_experts", "dp_size", "enable_dp_attention", "ep_size",
                  "moe_a2a_backend", "ep_num_redundant_experts", "moe_dense_tp_size", "enable_dp_lm_head")
# each engine's spelling of the same idea, for the hint when the other engine's is given
OTHER_SPELLING = {"data_parallel_size": "dp_size", "dp_size": "data_parallel_size",
                  "enable_expert_parallel": "ep_size", "ep_size": "enable_expert_parallel",
                  "all2all_backend": "moe_a2a_backend", "moe_a2a_backend": "all2all_backend",
                  "num_redundant_experts": "ep_num_redundant_experts",
                  "ep_num_redundant_experts": "num_redundant_experts"}
# what a field is called on the command line (and, with underscores, in a gate file)
FLAGS = {"kv_cache_dtype": "--kv-cache-dtype", "kv_cache_memory_gib": "--kv-cache-memory"}


def flag(name: str) -> str:
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def check_positive(name: str, value, *, zero_ok: bool = False, integer: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise KvplanError(f"{flag(name)} must be a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise KvplanError(f"{flag(name)} must be a whole number, got {value}")
    if value < 0 or (value == 0 and not zero_ok) or value in (float("inf"),):
        raise KvplanError(f"{flag(name)} must be {'non-negative' if zero_ok else 'positive'}, got {value}")
