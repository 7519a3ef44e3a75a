"""SGLang's rules (v0.5), as data: the KV cache dtypes it accepts, the default --mem-fraction-static by GPU memory,
the memory its CUDA context takes before the baseline, and the sliding-window pool ratio. The SGLang twin of
engines.py; the pool arithmetic that reads them is sglang.py.

Sources: sglang v0.5.23, srt/arg_groups/memory_hook.py (the default mem_fraction_static, chunked_prefill_size and
the largest decode graph batch), srt/model_executor/pool_configurator.py (the hybrid SWA pool's ratio).
"""

from __future__ import annotations

from typing import Optional

from kvplan.errors import KvplanError, check_whole
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.kv_formats import CATALOG
from kvplan.specs.parallel import Parallel
from kvplan.units import DTYPE_BYTES

SGLANG_VERSION = "0.5"  # the release whose rules these are
CONTEXT_GIB = 0.5  # CUDA context and NCCL before SGLang's baseline (not a source constant; a log pins it)
SWA_FULL_TOKENS_RATIO = 0.8
# The GEMM kernel family SGLang's linear layers run, where it is not vLLM's (whose kernels the bundled step profiles
# time): block-scaled fp8 weights (128 x 128, DeepSeek's and Qwen's FP8 checkpoints) run on DeepGEMM on Hopper and
# Blackwell, priced as the per-tensor fp8 GEMM the profiles measure (sglang 0.5.6
# srt/layers/quantization/fp8_utils.py dispatch_w8a8_block_fp8_linear: FlashInfer's and CUTLASS's block-fp8 paths
# are off unless asked for, deep_gemm_wrapper/configurer.py: SGLANG_ENABLE_JIT_DEEPGEMM on by default from SM 90).
LINEAR_KERNEL_FAMILY = {"fp8_block": "fp8"}
# --max-prefill-tokens' default: the prompt tokens one prefill batch takes, a batch's first request whatever its size
# (server_args.py max_prefill_tokens; managers/schedule_policy.py PrefillAdder.add_one_req)
MAX_PREFILL_TOKENS = 16384


def fused_shared_experts(model: ModelSpec, parallel: Parallel, a2a_backend: Optional[str]) -> int:
    """The shared experts SGLang folds into the routed experts' fused MoE, every token routed to them as well (top-k
    + 1 of 257): DeepSeek-V3 and R1's one, where the experts are not spread over EP ranks and DeepEP is not used
    (sglang 0.5.6 models/deepseek_v2.py determine_num_fused_shared_experts: architecture DeepseekV3ForCausalLM, 256
    routed experts and 1 shared; the W4AFP8 checkpoints excepted, which kvplan does not read)."""
    moe = model.moe
    if (model.family != "deepseek_v3" or moe is None or moe.num_experts != 256 or moe.shared_experts != 1
            or parallel.ep > 1 or a2a_backend == "deepep"):
        return 0
    return 1


# Hybrid models that keep a fixed state per request in some layers (Mamba-2, gated delta net). sglang 0.5.6
# server_args.py ServerArgs: mamba_full_memory_ratio 0.9 (the state pool is 0.9 x the full-attention KV pool),
# mamba_ssm_dtype "float32" (the model config's own is not read); configs/mamba_utils.py CONV_DTYPE: the conv
# state is always bfloat16; model_runner.py MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO: with the radix cache on
# (the default) max_running_requests is at most a third of the state slots; with --disable-radix-cache it is at
# most the slots, and a --max-running-requests given there sizes the state pool itself (handle_max_mamba_cache).
MAMBA_FULL_MEMORY_RATIO = 0.9
MAMBA_SSM_DTYPE = "fp32"
MAMBA_CONV_DTYPE = "bf16"
MAMBA_SLOTS_PER_REQUEST = 3
MAMBA_EMPTY_STATE_SLOTS = 512  # handle_max_mamba_cache where mamba_cache_per_req is 0
# DeepSeek sparse attention (NSA: DeepSeek-V3.2's indexer). sglang 0.5.6 server_args.py
# _handle_model_specific_adjustments: page size 64, whatever was asked; --kv-cache-dtype auto is bfloat16 on Hopper
# and fp8_e4m3 from SM 10 (Blackwell); only those two are accepted. mem_cache/memory_pool.py NSATokenToKVPool: the
# indexer's keys in fp8 with one float32 scale per quant_block_size (128) channels, uint8 storage.
NSA_PAGE_SIZE = 64
NSA_QUANT_BLOCK = 128
NSA_DTYPES = ("bfloat16", "fp8_e4m3")


def nsa_default_kv_dtype(gpu: Optional[GPUSpec]) -> str:
    """--kv-cache-dtype auto on an NSA model (server_args.py): fp8_e4m3 on SM 10 and later, bfloat16 before."""
    cc = gpu.compute_capability if gpu is not None else None
    return "fp8_e4m3" if cc is not None and float(cc) >= 10 else "bfloat16"


def mamba_state_bytes(model: ModelSpec, attn_tp: int) -> tuple[int, int]:
    """One state layer's Mamba pool entry for one request on one attention-TP rank, as sglang 0.5.6 sizes it
    (configs/mamba_utils.py Mamba2StateShape.create, BaseLinearStateParams.mamba_cache_per_req; the shapes
    configs/qwen3_next.py and configs/nemotron_h.py mamba2_cache_params pass in): the conv state
    (intermediate + 2 x n_groups x state_size) / tp channels x (conv_kernel - 1) in bfloat16, n_groups raised to tp
    where tp does not divide it; the temporal (SSM or gated-delta-net) state heads / tp x head_dim x state_size in
    float32. Returns (conv bytes, temporal bytes). Mamba-1, lightning attention and Kimi delta attention have no
    shape here (SGLang 0.5.6 serves none of them through this pool) and are refused."""
    if len(model.state_mixers) > 1:
        raise KvplanError(f"{model.name}'s state layers use {len(model.state_mixers)} different mixers: SGLang's Mamba "
                          f"pool holds one state shape per model (mamba2_cache_params), so kvplan plans no SGLang "
                          f"pool for it")
    st = model.state
    if st is None:
        return 0, 0
    if not st.sglang_pool:
        raise KvplanError(f"{model.name}'s {st.kind} state layers: kvplan models SGLang's Mamba pool for Mamba-2 and "
                          f"gated delta net layers only; plan it with --engine vllm")
    # extra_groups_for_head_shards: n_groups + (tp - n_groups), i.e. tp groups, where tp does not divide them
    groups = st.n_groups if st.n_groups % attn_tp == 0 else attn_tp
    conv_dim = st.num_heads * st.head_dim + 2 * groups * st.state_size
    if conv_dim % attn_tp or st.num_heads % attn_tp:
        raise KvplanError(f"--tp {attn_tp} does not split {model.name}'s {st.num_heads} state heads "
                          f"({conv_dim} conv channels): SGLang asserts it (mamba_utils.py divide); choose a TP that "
                          f"divides {st.num_heads}")
    conv = conv_dim // attn_tp * (st.conv_kernel - 1) * DTYPE_BYTES[MAMBA_CONV_DTYPE]
    temporal = st.num_heads // attn_tp * st.head_dim * st.state_size * DTYPE_BYTES[MAMBA_SSM_DTYPE]
    return conv, temporal


# SGLang's --kv-cache-dtype name where it is not kvplan's (server_args.py: bf16; fp8 is its fp8_e4m3)
_SGLANG_NAMES = {"bfloat16": "bf16", "fp8": "fp8_e4m3"}
# kvplan format -> SGLang's --kv-cache-dtype: the formats whose catalog entry SGLang serves (Serves engine "sglang";
# fp4_e2m1 only up to 0.5.15, its entry's Serves.until)
SGLANG_DTYPES = {f.name: _SGLANG_NAMES.get(f.name, f.name) for f in CATALOG.values()
                 if any(s.engine == "sglang" for s in f.serves)}


def default_chunked_prefill_and_decode_bs(gpu_mem_gb: float, tp: int) -> tuple[int, int]:
    """SGLang's defaults by GPU memory (memory_hook.py): chunked_prefill_size and the largest decode graph batch."""
    if gpu_mem_gb < 20:
        return 2048, 8
    if gpu_mem_gb < 35:
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_gb < 60:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_gb < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_chunked_prefill_size(gpu: GPUSpec, tp: int) -> int:
    """SGLang's chunked_prefill_size for this GPU (memory_hook.py, by nvidia-smi's total)."""
    return default_chunked_prefill_and_decode_bs((gpu.smi_total_mib or gpu.memory_total_gib * 1024) / 1024, tp)[0]


def default_mem_fraction_static(model: ModelSpec, gpu: GPUSpec, tp: int, pp: int = 1, dp_attention: int = 0,
                                deepep: bool = False) -> float:
    """memory_hook.py: reserve 512 MB + 1.5 x chunked prefill + tp x pp / 8 GB + the graphs' share (with
    data-parallel attention over `dp_attention` groups, also the largest graph batch x dp x 3 MB, x 4.5 above a
    batch of 300: reserve_for_graph_mb), at least 10 GB on GPUs over 60 GB, then 2 GB more for DeepEP's buffers
    (reserve_for_deepep_a2a_mb), out of nvidia-smi's total."""
    gpu_mem = gpu.smi_total_mib or gpu.memory_total_gib * 1024
    chunked, decode_bs = default_chunked_prefill_and_decode_bs(gpu_mem / 1024, tp)
    graphs = 1536 if model.is_mla else 2 * decode_bs
    if dp_attention > 1:
        graphs += decode_bs * dp_attention * (4.5 if decode_bs > 300 else 3)
    reserved = 512 + 1.5 * max(chunked, 2048) + tp * pp / 8 * 1024 + graphs
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if deepep:
        reserved += 2 * 1024
    return round((gpu_mem - reserved) / gpu_mem, 3)


# --moe-a2a-backend: how MoE layers exchange tokens across expert-parallel ranks (server_args.py)
MOE_A2A_BACKENDS = ("none", "deepep", "mooncake", "ascend_fuseep", "flashinfer")


def sglang_parallel(model: ModelSpec, tp: int, dp: int, dp_attention: bool, ep: Optional[int],
                    backend: Optional[str], redundant: Optional[int], dense_tp: Optional[int], dp_lm_head: bool,
                    nvlink_domain: int, notes: list):
    """The layout `sglang.launch_server --tp tp --dp-size dp [--enable-dp-attention] --ep-size ep` builds, checked
    as ServerArgs checks it; returns (Parallel, a2a backend).

    Without --enable-dp-attention, --dp-size runs dp replicas of tp GPUs (the data-parallel controller). With it,
    the tp GPUs are one engine whose attention runs in dp groups of tp / dp GPUs, each with its own requests and
    KV pool, while the dense MLPs and the vocabulary stay split over all tp (--moe-dense-tp-size 1 and
    --enable-dp-lm-head keep them whole in each group instead), and the MoE layers span the tp GPUs as ep x
    (tp / ep)."""
    for name, v, least in (("--dp-size", dp, 1), ("--ep-size", ep, 1), ("--ep-num-redundant-experts", redundant, 0),
                           ("--moe-dense-tp-size", dense_tp, 1)):
        check_whole(name, v, least)
    moe = model.moe is not None and "moe" in model.mlp_kinds
    if backend is not None:
        backend = str(backend).lower()
        if backend not in MOE_A2A_BACKENDS:
            raise KvplanError(f"--moe-a2a-backend '{backend}': SGLang takes {', '.join(MOE_A2A_BACKENDS)}")
    if backend not in (None, "none") and not moe:
        raise KvplanError(f"--moe-a2a-backend {backend}: {model.name} has no MoE layers; drop it")
    if backend == "deepep" and ep not in (None, tp):
        notes.append(f"--moe-a2a-backend deepep: SGLang sets the expert-parallel size to the TP size ({tp}), "
                     f"not --ep-size {ep}")
    if backend == "deepep":
        ep = tp
    ep = ep or 1
    if ep > 1 and not moe:
        raise KvplanError(f"--ep-size {ep}: {model.name} has no MoE layers, so there are no experts to spread; "
                          f"drop it")
    if tp % ep:
        raise KvplanError(f"--ep-size {ep} must divide --tp {tp}: SGLang runs each MoE layer over the TP group as "
                          f"ep x (tp / ep) (moe_tp_size = tp_size // ep_size)")
    if moe and ep > 1 and ep > model.moe.num_experts + (redundant or 0):
        raise KvplanError(f"--ep-size {ep}: {model.name} has {model.moe.num_experts} experts, fewer than the EP ranks; "
                          f"choose an --ep-size of at most {model.moe.num_experts}")
    if moe and model.moe.expert_intermediate_size % (tp // ep):
        raise KvplanError(f"--tp {tp} with --ep-size {ep}: SGLang splits each expert's "
                          f"{model.moe.expert_intermediate_size:,} intermediate channels over tp / ep = {tp // ep} "
                          f"ranks, which do not divide them; raise --ep-size")
    spread = model.moe.num_experts + (redundant or 0) if moe else 0
    if moe and ep > 1 and spread % ep:
        raise KvplanError(f"--ep-size {ep}: SGLang places (experts + redundant) / ep experts per rank and asserts they "
                          f"divide; {model.moe.num_experts} + {redundant or 0} do not (give --ep-num-redundant-experts "
                          f"{(redundant or 0) + ep - spread % ep} or another --ep-size)")
    if redundant and ep == 1:
        raise KvplanError(f"--ep-num-redundant-experts {redundant}: redundant experts are placed over expert-parallel "
                          f"ranks; add --ep-size (or drop it)")
    if dp_attention:
        if dp == 1:
            notes.append("--enable-dp-attention with --dp-size 1: attention stays tensor parallel (one group)")
        if tp % dp:
            raise KvplanError(f"--dp-size {dp} must divide --tp {tp} with --enable-dp-attention: each attention group "
                              f"takes tp / dp GPUs (ServerArgs: 'tp_size must be divisible by dp_size')")
    elif dp_lm_head or dense_tp is not None:
        flag = "--enable-dp-lm-head" if dp_lm_head else "--moe-dense-tp-size"
        raise KvplanError(f"{flag} applies with --enable-dp-attention (it keeps that part whole in each attention "
                          f"group); add --enable-dp-attention or drop it")
    if dense_tp not in (None, 1):
        raise KvplanError(f"--moe-dense-tp-size {dense_tp}: SGLang supports only 1 (dense layers whole in each "
                          f"attention group) or leaving it unset")
    if dp_attention:
        attn = tp // dp
        layout = Parallel(attn_tp=attn, dense_tp=attn if dense_tp == 1 else tp, vocab_tp=attn if dp_lm_head else tp,
                          moe_tp=tp // ep, ep=ep, redundant_experts=int(redundant or 0), dp=dp, world=tp,
                          domain=nvlink_domain)
    else:
        if dp > 1:
            notes.append(f"--dp-size {dp} without --enable-dp-attention: {dp} replicas of TP {tp}, each its own engine "
                         f"and KV pool (SGLang's data-parallel controller)")
        layout = Parallel(attn_tp=tp, dense_tp=tp, vocab_tp=tp, moe_tp=tp // ep if moe else tp, ep=ep,
                          redundant_experts=int(redundant or 0), dp=dp, world=tp * dp,
                          domain=nvlink_domain)
    return layout, (backend or "none") if moe and ep > 1 else None
