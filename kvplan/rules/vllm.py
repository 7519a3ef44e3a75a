"""What changed between vLLM versions in how the KV pool is planned and reported: one value per version.

Sources: the vLLM releases 0.19.0 to 0.31.0 (0.22.1, 0.25.1 and 0.27.1 aside), 0.32.0 and 0.33.0
(vllm/v1/core/kv_cache_utils.py and kv_cache_planning.py, v1/kv_cache_interface.py, platforms/interface.py,
config/vllm.py, utils/mem_utils.py, v1/worker/gpu/model_runner.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Optional

from kvplan.errors import KvplanError, check_whole
from kvplan.specs.kv_formats import CATALOG
from kvplan.specs.parallel import Parallel
from kvplan.units import GiB
from kvplan.values import frozen_dataclass

if TYPE_CHECKING:
    from kvplan.specs.catalog import GPUSpec


@frozen_dataclass
class VllmRules:
    """What one range of vLLM releases does where it sizes, schedules and refuses."""

    version: str
    label: str
    # sliding-window layers keep window - 1 + batches x max_num_batched_tokens tokens per request: async scheduling
    # (0.30+) keeps two batches in flight
    batches_in_flight: int
    # 0.30+ raises the block size so a skip layer's block fits the quantized layers' page
    raise_block_for_skip_layers: bool
    # "GPU KV cache size: N tokens": 0.20 prints num_blocks // groups x block_size; 0.25+ concurrency x max_model_len
    reported_tokens: Literal["blocks", "concurrency"]
    # 0.20 and 0.25 print the size and the concurrency on two lines; 0.28+ on one
    one_log_line: bool
    # 0.20's SlidingWindowSpec has no nvfp4 branch: sliding layers cost (head + head_v) bytes, like fp8
    sliding_nvfp4_packed: bool
    cache_dtypes_missing: frozenset[str]
    # the scheduler runs one step ahead of the GPU (async scheduling: on unless speculative decoding or the executor
    # rules it out, VllmConfig.__post_init__ in vllm/config/vllm.py, 0.19 and later), so a request that arrives
    # while a step runs misses the step already scheduled and starts in the one after it
    async_scheduling: bool = True
    # --- what the profile run executes and which measured term each allocation lands in (kvplan.sizing.vllm_memory) ---
    # which models the V2 model runner (MRV2) profiles by default rather than the classic V1 runner (runner_for;
    # vllm/config/vllm.py VllmConfig.use_v2_model_runner and _is_default_v2_model_runner_model, with
    # VLLM_USE_V2_MODEL_RUNNER unset): "never" through 0.21 (vllm/envs.py defaults it to "0"); "dense" from 0.25:
    # every generative model that is not MoE, hybrid or attention-free, plus the MoE architectures of
    # DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES (mrv2_moe_families); "all" from 0.29, which drops the per-model rule.
    # 0.22 to 0.24 default a short architecture list to it (0.22: Qwen3ForCausalLM unquantized; 0.23: + Llama and
    # Mistral; 0.24: + DeepseekV2, Qwen2Moe and GraniteMoe, quantized too), which the "0.20" rules (standing for
    # 0.20 to 0.24) do not model: they plan every model of those releases with the V1 runner
    mrv2_default: Literal["never", "dense", "all"] = "never"
    # the model families (HF model_type) of the MoE architectures that default to MRV2 under "dense":
    # DeepseekV2ForCausalLM, Qwen2MoeForCausalLM and GraniteMoeForCausalLM (0.25 to 0.28)
    mrv2_moe_families: frozenset[str] = frozenset({"deepseek_v2", "qwen2_moe", "granitemoe"})
    # MRV2 estimates its CUDA graphs (v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory) from 0.29; before,
    # its GPUModelRunner.profile_cudagraph_memory returns 0 ("It is TBD whether we keep this API or not"), so nothing
    # is subtracted for the graphs its capture then takes
    mrv2_estimates_cudagraphs: bool = True
    # how memory_profiling (vllm/utils/mem_utils.py) adds up the non-KV memory: "peak" through 0.26, weights_memory
    # + the torch peak's increase over the profile run + the non-torch increase, so a torch buffer allocated after
    # the weights are measured but before the profile run (MRV2's sampler state, made in load_model) is charged
    # nowhere; "consumed" from 0.27, the free memory gone since the baseline snapshot (total_consumed) + the peak
    # above what stays allocated (transient_peak_headroom), which charges every buffer that persists
    memory_accounting: Literal["peak", "consumed"] = "consumed"
    # MRV2 in 0.33 runs the dummy sampler a second time with every sampling feature on (fp32 logits, top-k mask,
    # probs); before, it runs only the default pass (_dummy_sampler_run, the same in 0.22 to 0.31), which keeps the
    # logits in the model dtype
    sampler_warmup_pass: bool = False
    # the CUDA-graph estimate is subtracted from the budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS: "0" in 0.19,
    # "1" from 0.20); before that it is at most logged
    subtracts_cudagraphs: bool = True
    # where the main stream's cuBLAS workspace (32 MiB on SM90/SM100) lands: created by the first GEMM of the
    # profile run and counted in its torch peak (V1 runner), charged as consumed memory (0.30), or made by a dummy
    # matmul before the baseline snapshot and not charged at all (0.33)
    cublas_workspace: Literal["peak", "consumed", "before_snapshot"] = "peak"
    # VLLM_ALLREDUCE_USE_FLASHINFER defaults to 1 from 0.29 (vllm/envs.py): the standalone FlashInfer all-reduce
    # makes its workspace even without the compiled AR+RMSNorm fusion pass; before, only the fusion pass does, and
    # only with DP = PP = 1
    flashinfer_allreduce_standalone: bool = False
    # `vllm serve` defaults on GPUs with 160 GiB or more: 8,192 batched tokens before 0.28, 16,384 from 0.28
    # (engine/arg_utils.py get_batch_defaults: the >= 160 GiB tier is new in 0.28)
    batched_tokens_160gib: int = 8192
    # the largest CUDA-graph capture size on SM100-family GPUs: 512 before 0.28, 1,024 from 0.28 (config/vllm.py
    # _set_cudagraph_sizes default_max_graph_size)
    max_capture_sm100: int = 512
    # CacheConfig.gpu_memory_utilization's default: 0.92 in 0.20 and later (vllm/config/cache.py), 0.9 before
    default_gpu_memory_utilization: float = 0.92
    # torch's NCCL process group for the device groups: made lazily at the first torch.distributed collective (the
    # logits all-gather inside the profile run, so it is charged as non-torch memory) before 0.30; eagerly at
    # init_process_group(device_id=...) from 0.30, before the baseline snapshot
    lazy_torch_nccl: bool = False
    # a state layer's pages per request and group (v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes): one
    # in mamba_cache_mode "none", 2 + the layer's prefill-checkpoint pages in "align", the mode
    # model_executor/models/config.py MambaModelConfig sets when prefix caching is on. Prefix caching is on by
    # default for hybrid generative models from 0.26 (config/model.py is_prefix_caching_supported: "Hybrid models
    # do not support prefix caching" through 0.25, "Generative hybrid models support prefix caching" from 0.26),
    # never for attention-free ones ("Attention free models do not support prefix caching", 0.19 to 0.33)
    hybrid_prefix_caching: bool = True
    # the state mixers whose MambaSpec carries num_prefill_checkpoint_blocks = 1 (0 for every other): Mamba-2 from
    # 0.32 (layers/mamba/mamba_mixer2.py MambaMixer2.get_kv_cache_spec), gated delta nets from 0.33 where FlashInfer's
    # GDN prefill runs (qwen_gdn_linear_attn.py get_kv_cache_spec; GatedDeltaNet.vllm_prefill_checkpoint); the
    # field exists from 0.29 (KDA's flashkda prefill only, which kvplan does not select)
    checkpoint_state_kinds: frozenset[str] = frozenset({"mamba2", "gdn"})
    # Nemotron-H's SSM state dtype when its config names none: float16 before 0.30 (models/config.py), float32 after
    nemotron_ssm_default: str = "fp32"
    # a V head smaller than K's (MiMo-V2-Flash's v_head_dim) is padded to the K head size before the Attention layer
    # and cached so in 0.19 (models/mimo_v2_flash.py); from 0.20 the layer takes head_size_v and caches V at its size
    pads_small_v: bool = False

    def runner_for(self, model) -> Literal["v1", "mrv2"]:
        """The model runner that profiles `model` by default in this release (see mrv2_default): MRV2 for every
        model from 0.29; from 0.25 for generative models that are neither MoE (a few MoE architectures excepted),
        hybrid (state layers beside attention) nor attention-free; never before."""
        if self.mrv2_default == "all":
            return "mrv2"
        if self.mrv2_default == "never":
            return "v1"
        if not model.attention_layers:  # attention-free (Mamba, RWKV)
            return "v1"
        listed = model.family in self.mrv2_moe_families
        if model.state_layers and not listed:  # hybrid
            return "v1"
        moe = model.moe is not None and "moe" in model.mlp_kinds
        return "mrv2" if listed or not moe else "v1"

    def state_pages(self, kind: str, attention_free: bool, compute_capability: Optional[str] = None,
                    key_head_dim: int = 0) -> int:
        """The pages one request holds in each state group: 1 without prefix caching (attention-free models, and
        hybrids through 0.25), else 2 (the running state and the next block's) plus the layer's prefill checkpoint
        (MambaSpec.max_memory_usage_bytes in align mode)."""
        if attention_free or not self.hybrid_prefix_caching:
            return 1
        from kvplan.specs.mixers import STATE_MIXERS  # the spec classes load with the model, not with the CLI

        checkpoint = kind in self.checkpoint_state_kinds and \
            STATE_MIXERS[kind].vllm_prefill_checkpoint(compute_capability, key_head_dim)
        return 2 + int(checkpoint)

    def ssm_cache_default(self, model) -> Optional[str]:
        """The SSM state's dtype where the config leaves it to the engine (None: the model dtype)."""
        return self.nemotron_ssm_default if model.family == "nemotron_h" else None

    def log_lines(self, available_bytes: int, kv_tokens: int, max_model_len: int, concurrency: float) -> list[str]:
        """The startup lines vLLM prints for this pool, digit for digit (gpu_worker.py's "Available KV cache memory",
        formatted as round(GiB, 2); kv_cache_utils' KV cache size and concurrency)."""
        avail = f"Available KV cache memory: {round(available_bytes / GiB, 2)} GiB"
        size = f"GPU KV cache size: {kv_tokens:,} tokens"
        conc = f"Maximum concurrency for {max_model_len:,} tokens per request: {concurrency:.2f}x"
        return [avail] + ([f"{size}, {conc}"] if self.one_log_line else [size, conc])


def version_key(v: str) -> tuple[int, int]:
    parts = [int(p) for p in v.split(".")[:2]]
    return (parts + [0])[0], (parts + [0, 0])[1]


def _missing(version: str) -> frozenset[str]:
    """The --kv-cache-dtype names of kvplan's catalog a release lacks: those its vllm/config/cache.py CacheDType (the
    Literal --kv-cache-dtype is checked against) does not list yet, each format's first release on its catalog entry
    (KVFormat.vllm_since)."""
    return frozenset(f.name for f in CATALOG.values()
                     if f.vllm_since and version_key(version) < version_key(f.vllm_since))


_LAZY = dict(lazy_torch_nccl=True, nemotron_ssm_default="fp16", checkpoint_state_kinds=frozenset())
_NO_HYBRID_PREFIX = dict(hybrid_prefix_caching=False, **_LAZY)
# MRV2 for dense models (0.25 to 0.28), without its CUDA-graph estimate
_MRV2_DENSE = dict(mrv2_default="dense", mrv2_estimates_cudagraphs=False)
# 0.28: `vllm serve` takes 16,384 batched tokens on GPUs of 160 GiB or more (engine/arg_utils.py
# get_batch_defaults gains its >= 160 GiB tier) and captures up to 1,024 on SM100 (config/vllm.py
# _set_cudagraph_sizes: default_max_graph_size = 1024 on data-centre Blackwell)
_028 = dict(batched_tokens_160gib=16384, max_capture_sm100=1024)
# 0.29: MRV2 for every model (config/vllm.py use_v2_model_runner drops _is_default_v2_model_runner_model) with its
# CUDA-graph estimate, and VLLM_ALLREDUCE_USE_FLASHINFER defaults to "1" (vllm/envs.py)
_MRV2 = dict(mrv2_default="all", flashinfer_allreduce_standalone=True, **_028)
VLLM: dict[str, VllmRules] = {r.version: r for r in [
    VllmRules("0.19", "vLLM 0.19 and earlier", 1, False, "blocks", False, False, _missing("0.19"),
              subtracts_cudagraphs=False, default_gpu_memory_utilization=0.9, pads_small_v=True,
              memory_accounting="peak", **_NO_HYBRID_PREFIX),
    VllmRules("0.20", "vLLM 0.20 to 0.24", 1, False, "blocks", False, False, _missing("0.20"), memory_accounting="peak",
              **_NO_HYBRID_PREFIX),
    VllmRules("0.25", "vLLM 0.25", 1, False, "concurrency", False, True,
              _missing("0.25"), memory_accounting="peak", **_MRV2_DENSE, **_NO_HYBRID_PREFIX),
    VllmRules("0.26", "vLLM 0.26", 1, False, "concurrency", False, True,
              _missing("0.26"), memory_accounting="peak", **_MRV2_DENSE, **_LAZY),
    VllmRules("0.27", "vLLM 0.27", 1, False, "concurrency", False, True,
              _missing("0.27"), **_MRV2_DENSE, **_LAZY),
    VllmRules("0.28", "vLLM 0.28", 1, False, "concurrency", True, True, _missing("0.28"),
              **_MRV2_DENSE, **_028, **_LAZY),
    VllmRules("0.29", "vLLM 0.29", 1, False, "concurrency", True, True, _missing("0.29"),
              **_MRV2, **_LAZY),
    VllmRules("0.30", "vLLM 0.30 and 0.31", 2, True, "concurrency", True, True, _missing("0.30"),
              cublas_workspace="consumed", checkpoint_state_kinds=frozenset(), **_MRV2),
    VllmRules("0.32", "vLLM 0.32", 2, True, "concurrency", True, True, _missing("0.32"),
              cublas_workspace="consumed", checkpoint_state_kinds=frozenset({"mamba2"}), **_MRV2),
    VllmRules("0.33", "vLLM 0.33 and later", 2, True, "concurrency", True, True, _missing("0.33"),
              sampler_warmup_pass=True, cublas_workspace="before_snapshot", **_MRV2),
]}


DEFAULT_VLLM = max(VLLM, key=version_key)  # the newest catalogued release


def versions_text() -> str:
    """The catalogued releases as --engine-version's help names them."""
    names = sorted(VLLM, key=version_key)
    return ", ".join([f"{names[0]} (and earlier)", *names[1:-1], f"{names[-1]} (default, newest)"])


def vllm_rules(version: str | None) -> VllmRules:
    """The rules of a vLLM version: any 'X.Y[.Z]' maps to the newest catalogued version not after it (releases
    before 0.19 are planned the way 0.19 plans them)."""
    if version is None:
        return VLLM[DEFAULT_VLLM]
    try:
        key = version_key(version.strip().lstrip("v"))
    except ValueError:
        raise KvplanError(f"--engine-version '{version}': give a vLLM version such as 0.20, 0.28 or 0.33") from None
    known = sorted(VLLM.values(), key=lambda r: version_key(r.version))
    if key[0] != 0:
        raise KvplanError(f"--engine-version '{version}': kvplan knows vLLM 0.x releases up to {known[-1].version}")
    earlier = [r for r in known if version_key(r.version) <= key]
    return earlier[-1] if earlier else known[0]


def release_adding(dtype: str) -> Optional[str]:
    """The first vLLM release whose CacheDType lists `dtype` (its catalog entry's vllm_since); None where every
    release kvplan plans has it or the catalog has no such dtype."""
    f = CATALOG.get(dtype)
    return f.vllm_since if f is not None else None


def missing_dtype_message(dtype: str, rules: VllmRules) -> str:
    """The one-line refusal of a --kv-cache-dtype the release does not have (its vllm/config/cache.py CacheDType does
    not list it), naming the release that adds it."""
    first = release_adding(dtype)
    later = f"; vLLM adds it in {first} (choose --engine-version {first} or later)" if first else ""
    return f"KV cache dtype '{dtype}' does not exist in {rules.label}{later}"


def newer_release_note(version: str | None) -> Optional[str]:
    """The note for a vLLM version newer than the newest catalogued one, whose rules then stand in for it."""
    newest = max(VLLM, key=version_key)
    if version is None or version_key(version.strip().lstrip("v")) <= version_key(newest):
        return None
    return (f"vLLM {version.strip().lstrip('v')} is newer than the releases kvplan knows (up to {newest}): "
            f"planned with {newest}'s rules")


@frozen_dataclass
class ServeDefaults:
    """The scheduler budget `vllm serve` or `LLM(...)` takes when the user sets none."""

    max_num_batched_tokens: int
    max_num_seqs: int


def serve_defaults(total_bytes: int, gpu: Optional[GPUSpec], version: str | VllmRules, max_model_len: int,
                   entrypoint: str = "serve") -> ServeDefaults:
    """The batch defaults (engine/arg_utils.get_batch_defaults) of `vllm serve` or of the offline `LLM` class
    ("llm"), then capped at max_num_seqs x max_model_len."""
    if entrypoint not in ("serve", "llm"):
        raise KvplanError(f"--entrypoint '{entrypoint}': choose serve (vllm serve, the API server) or llm (the "
                          f"offline LLM class)")
    rules = version if isinstance(version, VllmRules) else vllm_rules(version)
    gib = total_bytes / GiB
    is_a100 = bool(gpu and "A100" in gpu.name.upper())
    llm = entrypoint == "llm"
    if gib >= 160:
        tokens, seqs = (16384 if llm else rules.batched_tokens_160gib), 1024
    elif gib >= 70 and not is_a100:
        tokens, seqs = (16384 if llm else 8192), 1024
    else:
        tokens, seqs = (8192 if llm else 2048), 256
    return ServeDefaults(min(tokens, seqs * max_model_len), seqs)


# ----------------------------------------------------------------------------------------------------------------
# Data and expert parallelism (vllm/config/parallel.py ParallelConfig, vllm/engine/arg_utils.py,
# vllm/model_executor/layers/fused_moe/config.py FusedMoEParallelConfig.make)

# --all2all-backend: how the MoE layers of DP ranks exchange tokens when experts are spread over them
# (ParallelConfig.all2all_backend; naive and pplx are rewritten to allgather_reducescatter with a warning)
ALL2ALL_BACKENDS = ("allgather_reducescatter", "naive", "pplx", "deepep_high_throughput", "deepep_low_latency",
                    "mori", "nixl_ep", "flashinfer_all2allv", "flashinfer_nvlink_two_sided",
                    "flashinfer_nvlink_one_sided")
DEFAULT_ALL2ALL = "allgather_reducescatter"


def vllm_parallel(model, tp: int, pp: int, dp: int, dp_local: Optional[int], expert_parallel: bool, eplb: bool,
                  redundant: Optional[int], backend: Optional[str], nvlink_domain: int, notes: list[str]):
    """The layout `vllm serve --tensor-parallel-size tp --pipeline-parallel-size pp --data-parallel-size dp
    [--enable-expert-parallel]` builds, checked as ParallelConfig checks it; returns (Parallel, all2all backend).

    DP ranks are engines of tp x pp GPUs each, with their own requests and KV pool; attention, dense MLPs, shared
    experts and the vocabulary are split tp ways inside each. The MoE layers span all tp x dp GPUs of a stage: the
    experts split tp x dp ways without expert parallelism (FusedMoEParallelConfig.make flattens TP across DP),
    or whole experts over EP = tp x dp ranks with it."""
    check_whole("--data-parallel-size", dp)
    check_whole("--data-parallel-size-local", dp_local)
    check_whole("--num-redundant-experts", redundant, 0)
    moe = model.moe is not None and "moe" in model.mlp_kinds
    if dp_local is not None and dp % dp_local:
        raise KvplanError(f"--data-parallel-size-local {dp_local} must divide --data-parallel-size {dp} (the DP ranks "
                          f"of each node; vLLM starts dp / dp_local nodes)")
    if expert_parallel and not moe:
        raise KvplanError(f"--enable-expert-parallel: {model.name} has no MoE layers, so there are no experts to "
                          f"spread; drop it (data parallelism alone runs replicas)")
    if eplb and not expert_parallel:
        raise KvplanError("--enable-eplb balances experts over expert-parallel ranks: vLLM refuses it without "
                          "--enable-expert-parallel (ParallelConfig: 'enable_expert_parallel must be True to use "
                          "EPLB')")
    if eplb and tp * dp <= 1:
        raise KvplanError(f"--enable-eplb: vLLM refuses EPLB on one GPU (ParallelConfig: 'EPLB requires tensor, "
                          f"prefill-context, or data parallelism', the EP group being TP x DP ranks; got TP={tp}, "
                          f"DP={dp}); raise --tp or --data-parallel-size, or drop --enable-eplb")
    if redundant and not eplb:
        raise KvplanError(f"--num-redundant-experts {redundant}: vLLM places redundant experts only with EPLB "
                          f"(ParallelConfig refuses num_redundant_experts > 0 without --enable-eplb); add "
                          f"--enable-eplb or drop it")
    if backend is not None:
        backend = str(backend).lower()
        if backend not in ALL2ALL_BACKENDS:
            raise KvplanError(f"--all2all-backend '{backend}': vLLM takes {', '.join(ALL2ALL_BACKENDS)}")
        if backend in ("naive", "pplx"):
            notes.append(f"--all2all-backend {backend}: vLLM replaces it with allgather_reducescatter (with a "
                         f"warning; ParallelConfig)")
            backend = DEFAULT_ALL2ALL
        if not (expert_parallel and dp > 1):
            notes.append(f"--all2all-backend {backend} has no effect here: vLLM exchanges tokens all-to-all only "
                         f"with expert parallelism across DP ranks (--enable-expert-parallel and "
                         f"--data-parallel-size > 1)")
    if dp_local is not None and dp == 1:
        notes.append(f"--data-parallel-size-local {dp_local} has no effect without --data-parallel-size > 1")
    group = tp * dp
    ep = group if expert_parallel else 1
    if moe and dp > 1 and not expert_parallel and model.moe.expert_intermediate_size % group:
        raise KvplanError(f"--data-parallel-size {dp}: without expert parallelism vLLM splits each expert's "
                          f"{model.moe.expert_intermediate_size:,} intermediate channels over tp x dp = {group} ranks, "
                          f"which do not divide them; add --enable-expert-parallel or choose a size that divides")
    if moe and expert_parallel and ep > model.moe.num_experts + (redundant or 0):
        raise KvplanError(f"--enable-expert-parallel over tp x dp = {ep} ranks: {model.name} has "
                          f"{model.moe.num_experts} experts, fewer than the ranks (vLLM leaves ranks without one); "
                          f"use fewer GPUs")
    if eplb and moe and (model.moe.num_experts + (redundant or 0)) % ep:
        e = model.moe.num_experts
        need = (redundant or 0) + ep - (e + (redundant or 0)) % ep  # the next count that divides
        raise KvplanError(f"--enable-eplb: vLLM spreads experts evenly under EPLB ('EPLB currently only supports even "
                          f"distribution of experts across ranks'), and {e} experts + {redundant or 0} redundant do "
                          f"not divide over {ep} EP ranks; give --num-redundant-experts {need}")
    if dp > 1 and not moe:
        notes.append(f"data parallelism on a dense model: {dp} independent replicas of TP {tp}")
    world = tp * pp * dp
    # --data-parallel-size-local says how many DP ranks share a node: the node's GPUs are its NVLink domain
    domain = min(nvlink_domain, dp_local * tp * pp) if dp_local else nvlink_domain
    layout = Parallel(attn_tp=tp, dense_tp=tp, vocab_tp=tp, moe_tp=1 if expert_parallel else (group if moe else tp),
                      ep=ep, redundant_experts=int(redundant or 0), dp=dp, world=world, domain=domain)
    return layout, (backend or DEFAULT_ALL2ALL) if expert_parallel and dp > 1 else None


def scheduler_rules(seqs: int, batched: int, max_model_len, notes: list[str], seqs_given: bool,
                    batched_given: bool) -> None:
    """vLLM's SchedulerConfig checks at start (vllm/config/scheduler.py, SchedulerConfig.verify_max_model_len,
    called from __post_init__), in its words. Its refusal of max_num_batched_tokens < max_model_len applies only
    with chunked prefill off, which kvplan does not plan (vLLM turns it on for every generative model)."""
    if batched < seqs:
        defaults = [f"{v} {o}" for o, v, given in (("max_num_batched_tokens", batched, batched_given),
                                                   ("max_num_seqs", seqs, seqs_given)) if not given]
        default = f"; {' and '.join(defaults)} is vllm serve's default here" if defaults else ""
        raise KvplanError(f"vLLM refuses to start: max_num_batched_tokens ({batched}) must be greater than or equal "
                          f"to max_num_seqs ({seqs}) (SchedulerConfig in vllm/config/scheduler.py{default}); raise "
                          f"--max-num-batched-tokens to {seqs} or lower --max-num-seqs to {batched}")
    if isinstance(max_model_len, int) and batched > seqs * max_model_len:
        notes.append(f"vLLM warns: max_num_batched_tokens ({batched}) exceeds max_num_seqs * max_model_len "
                     f"({seqs * max_model_len}). This may lead to unexpected behavior.")
