"""What vLLM subtracts from ceil(total x gpu_memory_utilization) before the KV cache gets the rest, in closed form
from what its startup actually executes (a pure function, no I/O). What differs between releases (the runner that
profiles, the sampler passes, where cuBLAS's workspace lands, whether the CUDA-graph estimate is subtracted) is a
field of the version's rules in kvplan.rules.vllm:

  weights     parameters on this rank in their checkpoint format, plus the rotary cos/sin caches, in the torch
              caching allocator's blocks (kvplan.sizing.caching_allocator.allocated_bytes: what memory_allocated
              counts)
  activation  the peak of the profile run: one forward over max_num_batched_tokens (the widest layer's live
              tensors, the MoE workspace) and the dummy sampler over min(max_num_seqs, tokens) rows x vocab (on top
              of the MoE workspace, which the workspace manager keeps)
  persistent  torch buffers charged outside the peak: 0.30+ allocates the sampler's penalty state
              (max_num_seqs x vocab int32); 0.30 charges the main stream's cuBLAS workspace
  non_torch   memory that appears after vLLM's baseline snapshot outside torch: the libraries' own device memory
              (cuBLAS handles, CUDA modules loaded lazily at first use), with TP > 1 torch's NCCL communicator
              where it is made lazily (before 0.30) and the FlashInfer all-reduce workspace on SM90/SM100
  cudagraph   the CUDA-graph estimate the engine subtracts (0.20 and later; 0.19 measures it but does not
              subtract it): the capture activations, the capture stream's cuBLAS workspace, FlashAttention 3's
              split-KV accumulators in the FULL graphs (Hopper), FlashInfer's attention workspace where that backend
              runs (SM100 multi-head attention), and a cost per graph

What the capture then really takes (parts["cudagraph_capture"], which the sampler warm-up after it has to live
with) differs from the estimate: the eager warm-up's activations and their captured copy sit in two pools, every
graph costs its own driver memory, and FlashAttention 3 keeps its split-KV accumulators for the largest FULL graph
of at most 992 requests, which vLLM's two samples miss when the largest capture size is above that (gpt-oss).

The per-graph capture cost has no source constant beyond vLLM's 1 MiB floor; kvplan takes it per piece of the
compiled model from what vLLM 0.19 prints, scaled by the kernels a piece launches (per_graph_bytes). A startup log
pins all of it (`kvplan` reads one and keeps the measured overheads as a profile).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from kvplan.memo import per_spec
from kvplan.rules.vllm import VllmRules, serve_defaults, vllm_rules  # noqa: F401 (serve_defaults: re-exported)
from kvplan.sizing.model_tensors import padded_vocab
from kvplan.sizing.weight_allocations import allocator_rounding
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.units import DTYPE_BYTES, GiB, MiB

# models whose rotary cos/sin cache vLLM keeps in float32 (get_rope(..., dtype=torch.float32) in gpt_oss.py,
# minimax_text_01.py, bailing_moe_linear.py)
_FP32_ROTARY = ("gpt_oss", "minimax_text_01", "bailing_moe_linear")
FULL_GRAPH_MIN_BYTES = 1 * MiB  # vLLM's _MIN_PER_GRAPH_BYTES


# Kernels one compiled decoder layer launches outside attention (a piecewise graph's piece): the two fused
# residual-add + RMSNorms, the QKV and output projections, the rotary embedding, and the MLP's gate_up GEMM,
# SiLU-and-mul and down GEMM
DENSE_PIECE_KERNELS = 8
# what a FULL graph adds per layer: the KV-cache write, FlashAttention's forward and its split-KV combine
ATTENTION_GRAPH_KERNELS = 3
# gpt-oss's MXFP4 experts on Hopper (the TRITON backend, fused_moe/gpt_oss_triton_kernels_moe.py
# triton_kernel_moe_forward) launch ten kernels where a dense MLP launches three: the router GEMM, triton_kernels'
# top-k, two bitmatrix-metadata kernels (tensor_details/bitmatrix.py), two ragged-metadata kernels
# (tensor_details/ragged_tensor.py), the gate-scale gather, two matmul_ogs and the reduce that folds the scattered
# top-k rows (matmul_ogs.py: a scatter with more than one expert per token goes through a scratchpad)
MXFP4_TRITON_MOE_KERNELS = 10


def piece_kernels(m: ModelSpec, gpu: Optional[GPUSpec] = None) -> int:
    """Kernels one layer's piece of the compiled model launches (DENSE_PIECE_KERNELS, or more for gpt-oss's MXFP4
    experts on Hopper)."""
    if m.moe and m.weight_dtype == "mxfp4" and _cc_family(gpu) == "sm90":
        return DENSE_PIECE_KERNELS - 3 + MXFP4_TRITON_MOE_KERNELS
    return DENSE_PIECE_KERNELS


def per_graph_bytes(num_layers: int, mode: str, kernels: int = DENSE_PIECE_KERNELS) -> int:
    """The steady cost of one more captured CUDA graph: its nodes' driver allocations, which grow with the pieces
    the compiled model is split into (one per layer plus one) and the kernels each launches. vLLM 0.19 prints both
    samples on H100 ("Estimated PIECEWISE/FULL CUDA graph memory: F MiB first-capture + (n-1) x d MiB per-graph"):
    piecewise 4-6 MiB at 24-32 layers, 8 at 40, 18-20 at 80; full 4-6 at 28-32, 6-8 at 40, 10-14 at 80. About
    0.2 MiB (piecewise) and 0.15 MiB (full) per piece of a dense layer's kernels, to the nearest 2 MiB page the
    driver maps, and never below vLLM's 1 MiB floor; a layer that launches more kernels costs more in proportion
    (`kernels`, from piece_kernels; a FULL graph counts the attention's kernels too)."""
    if mode == "piecewise":
        per_piece = 0.2 * kernels / DENSE_PIECE_KERNELS
    else:
        per_piece = 0.15 * (kernels + ATTENTION_GRAPH_KERNELS) / (DENSE_PIECE_KERNELS + ATTENTION_GRAPH_KERNELS)
    return max(FULL_GRAPH_MIN_BYTES, round(per_piece * (num_layers + 1) / 2) * 2 * MiB)


# FlashAttention 3 under FULL CUDA graphs (Hopper): vLLM caps the split-KV count for every batch up to the largest
# capture size (v1/attention/backends/flash_attn.py FlashAttentionMetadataBuilder: max_num_splits =
# AttentionConfig.flash_attn_max_num_splits_for_cuda_graph, 32 in config/attention.py), and FA3's mha_fwd then
# allocates its accumulators for that many splits: out_accum [splits, heads, tokens, head_dim] and softmax_lse_accum
# [splits, heads, tokens], float32. FA3 splits dynamically only for varlen batches of at most 992 requests; above
# that it keeps one split and allocates none. Inside a capture they come from the graph pool and stay there.
FA3_MAX_NUM_SPLITS = 32
FA3_DYNAMIC_SPLIT_MAX_BATCH = 992


def fa3_split_accumulators(m: ModelSpec, gpu: Optional[GPUSpec], tp: int, tokens: int) -> int:
    """FlashAttention 3's split-KV accumulators for one FULL graph of `tokens` decode requests: 32 splits x query
    heads on this rank x tokens x (head_dim + 1 for the log-sum-exp) x 4 bytes; 0 off Hopper, for MLA (FlashMLA),
    for heads FA3 does not take (above 256), and above FA3's 992-request dynamic-split limit. Llama-3.1-8B at 512:
    32 x 32 x 512 x 129 x 4 = 258 MiB, what vLLM 0.19's first FULL sample printed (260 MiB)."""
    hd = m.head_dim or 0
    if (_cc_family(gpu) != "sm90" or m.mla or not m.attention_layers or not 0 < hd <= 256
            or not 0 < tokens <= FA3_DYNAMIC_SPLIT_MAX_BATCH):
        return 0
    return FA3_MAX_NUM_SPLITS * (m.num_heads // tp) * tokens * (hd + 1) * 4


FLASHINFER_ATTENTION_WORKSPACE = 394 * MiB  # VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE
# FlashInfer's all-reduce workspace size per rank (FI_ALLREDUCE_FUSION_MAX_SIZE_MB, in MiB), by arch and TP; SM103
# (B300) doubled its TP 8 size in 0.33
_FI_ALLREDUCE_MB = {"sm90": {2: 64, 4: 2, 8: 0.5}, "sm100": {2: 64, 4: 32, 8: 1}, "sm103": {2: 64, 4: 64, 8: 4}}


# --- communication and library memory outside torch (driver- and library-internal where no source constant sizes
# it; each such figure is what real startup logs show, and a log of the user's own deployment replaces them) -------
#
# After vLLM's baseline snapshot a single GPU grows by the cuBLAS/cuBLASLt handles made at the first GEMM and the
# CUDA modules loaded lazily at first use (FlashAttention, Inductor's Triton kernels, vLLM's custom ops): vLLM 0.19's
# "non-torch forward increase memory" is 0.24-0.26 GiB in 17 TP-1 runs of 7 models on H100 (0.46 GiB for the Granite
# text models, unexplained), against 0.13 GiB in 0.10's summary line.
LIBRARY_NON_TORCH = 256 * MiB
# The physical granularity of symmetric (multicast-capable) device memory: FlashInfer's all-reduce workspace and
# torch's symmetric-memory buffer are cuMemCreate'd in multiples of cuMulticastGetGranularity(RECOMMENDED)
# (flashinfer/comm/mnnvl.py SymmDeviceMemory). 512 MiB on H100 NVSwitch systems: vLLM 0.19's TP-2 runs grow by the
# same 1.81-1.82 GiB over their TP-1 runs whatever the hidden size (FlashInfer asked for 362 MiB for gpt-oss-20b,
# 450 for Qwen2.5-7B, 514 for Mistral-Small: three buffers of 512 MiB each), and the init snapshot holds 1.02 GiB
# more at TP 2 and 4 alike (the 64 and 32 MiB symmetric-memory buffers both take 512 MiB).
MULTICAST_GRANULARITY = 512 * MiB
# An NCCL communicator's own buffers per rank (channels x peers x protocol buffers; NVLS buffers on NVSwitch systems
# with multicast), by transport. "nvls": vLLM 0.19 with NCCL 2.27.5 on H100 SXM. Torch's process group, made lazily
# inside the profile run before vLLM 0.30: the TP-2 non-torch increase less the libraries (0.25) and FlashInfer's
# 1.5 GiB leaves 0.31-0.36 GiB in five runs. vLLM's PyNccl communicator, made at init: the TP-2 snapshot's 1.02 GiB
# over TP 1, less the 512 MiB symmetric-memory buffer and the custom all-reduce's 24 MiB, leaves 0.49 GiB (and MoE
# models, which make an expert-parallel group too, hold 0.48-0.52 GiB more). Other transports have no measurement:
# NCCL's ring and tree buffers without NVLS (about 9 MiB per channel and peer, 24-32 channels over NVLink, 2-4 over
# PCIe) give the estimates.
TORCH_NCCL_COMMUNICATOR = {"nvls": 328 * MiB, "nvlink": 300 * MiB, "pcie": 64 * MiB}
PYNCCL_COMMUNICATOR = {"nvls": 500 * MiB, "nvlink": 300 * MiB, "pcie": 64 * MiB}
CUSTOM_ALLREDUCE = 24 * MiB  # 8 MiB IPC metadata + 8 MiB IPC buffer + 8 MiB rank_data (custom_all_reduce.py)
# torch symmetric memory's all-reduce buffer by architecture and world size (all_reduce_utils.py
# SYMM_MEM_ALL_REDUCE_MAX_SIZES, MiB), before rounding to the multicast granularity
_SYMM_MEM_MB = {"sm90": {2: 64, 4: 32, 6: 64, 8: 64}, "sm100": {2: 8, 4: 32, 6: 128, 8: 128},
                "sm103": {2: 4, 4: 32, 6: 32, 8: 64}}
# The CUDA context: 0.51 GiB used at vLLM 0.19's init snapshot of every TP-1 run on H100 (driver-internal)
CUDA_CONTEXT = 522 * MiB


def transport(gpu: Optional[GPUSpec], tp: int = 1) -> str:
    """How the `tp` GPUs of one group talk, as NCCL and the symmetric-memory allocators see it: NVSwitch with
    multicast (Hopper and Blackwell SXM at 900 GB/s and up), NVLink without it (A100's NVSwitch, NVLink bridges),
    else PCIe: also a group wider than the GPUs NVLink joins (PCIe cards bridged in pairs, 4 of them at TP 4). vLLM's
    custom all-reduce then stays off (custom_all_reduce.py CustomAllreduce: "not supported on more than two PCIe-only
    GPUs" unless every pair is NVLink-connected)."""
    if gpu is None or gpu.vendor != "nvidia" or tp > gpu.nvlink_domain_size:
        return "pcie"
    bw = gpu.nvlink_gbps or 0
    if bw >= 900 and gpu.arch.startswith(("hopper", "blackwell")):
        return "nvls"
    return "nvlink" if bw >= 600 else "pcie"


def _round_up(n: float, unit: int) -> int:
    return math.ceil(n / unit) * unit


def pre_snapshot_bytes(gpu: Optional[GPUSpec], tp: int, version: "str | VllmRules", moe: bool = False,
                       pp: int = 1) -> int:
    """Device memory in use when vLLM takes its baseline snapshot: the CUDA context; with pipeline stages the PP
    group's PyNccl communicator (sends and receives only); with TP > 1 the TP group's PyNccl communicator (a second
    one for a MoE model's expert-parallel group), the custom all-reduce's buffers and the symmetric-memory buffer
    (world sizes 2, 4, 6, 8), and from 0.30 torch's NCCL process group too."""
    kind, fam = transport(gpu, tp), _cc_family(gpu)
    stages = PYNCCL_COMMUNICATOR[kind] if pp > 1 else 0
    if tp < 2:
        return CUDA_CONTEXT + stages
    total = CUDA_CONTEXT + stages + PYNCCL_COMMUNICATOR[kind] * (2 if moe else 1)
    if tp in (2, 4, 6, 8) and kind != "pcie":
        total += CUSTOM_ALLREDUCE
        if kind == "nvls" and tp in _SYMM_MEM_MB.get(fam or "", {}):
            total += _round_up(_SYMM_MEM_MB[fam][tp] * MiB, MULTICAST_GRANULARITY)
    if not _rules(version).lazy_torch_nccl:
        total += TORCH_NCCL_COMMUNICATOR[kind]
    return total


def _rules(version: str | VllmRules) -> VllmRules:
    return version if isinstance(version, VllmRules) else vllm_rules(version)


@dataclass(frozen=True)
class NonKVMemory:
    weights: int
    activation: int
    persistent: int
    non_torch: int
    cudagraph: int
    max_num_batched_tokens: int
    max_num_seqs: int
    source: str  # "model" or "flat allowance"
    parts: dict = field(default_factory=dict)  # the terms behind the figures, for people

    @property
    def total(self) -> int:
        return self.weights + self.activation + self.persistent + self.non_torch + self.cudagraph

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def _cc_family(gpu: Optional[GPUSpec]) -> Optional[str]:
    cc = (gpu.compute_capability or "") if gpu else ""
    if cc.startswith("9."):
        return "sm90"
    if cc == "10.3":
        return "sm103"
    if cc.startswith("10."):
        return "sm100"
    return None


def flashinfer_allreduce_workspace(fam: Optional[str], tp: int, max_bytes: Optional[int] = None,
                                   kind: str = "nvls") -> int:
    """FlashInfer's single-node all-reduce workspace on one rank (trtllm_ar's three buffers: tp x S, tp x 256 fp32
    flags, 3 x tp x S), where S is FI_ALLREDUCE_FUSION_MAX_SIZE_MB for the architecture and TP degree, capped at
    `max_bytes` (the fusion pass caps it at one batch's hidden states). Each buffer is symmetric device memory,
    rounded up to 2 MiB and then to the multicast granularity; without NVSwitch multicast the workspace cannot be
    made and vLLM goes on without it."""
    if tp < 2 or fam not in _FI_ALLREDUCE_MB or kind != "nvls":
        return 0
    table = _FI_ALLREDUCE_MB[fam]
    size = table.get(tp, min(table.values())) * MiB
    if max_bytes is not None:
        size = min(size, max_bytes)
    buffers = (tp * size, tp * 256 * 4, 3 * tp * size)
    return sum(_round_up(_round_up(n, 2 * MiB), MULTICAST_GRANULARITY) for n in buffers)


def _forward_peak(m: ModelSpec, tokens: int, tp: int, b: int, with_moe_workspace: bool = True,
                  eager: bool = False) -> tuple[int, dict]:
    """The widest layer's live tensors for `tokens` tokens, and the MoE workspace. Compiled, the MLP holds the
    residual, gate_up and the activation; eager, the caller still holds the normed input too."""
    H = m.hidden_size
    if m.mla:
        q = m.num_heads * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim) // tp
        kv = m.mla.latent_dim
    else:
        q = m.num_heads * (m.head_dim or 0) // tp
        kv = max(1, m.num_kv_heads // tp) * (m.head_dim or 0)
    attn = tokens * b * (2 * H + 3 * q + 3 * kv) if m.attention_layers else 0
    dense = tokens * b * ((2 if eager else 1) * H + 3 * m.intermediate_size // tp) \
        if "dense" in m.mlp_kinds else 0
    state = 0
    if m.state_layers and m.state is not None:  # the projections run; the state kernels skip the profile run
        st = m.state
        proj = (2 * st.inner + 2 * st.n_groups * st.state_size + st.num_heads) if st.kind != "mamba" else 2 * st.inner
        state = tokens * b * (2 * H + proj // tp + st.conv_channels // tp + st.inner // tp)
    moe = workspace = 0
    if m.moe and "moe" in m.mlp_kinds:
        e, k, ie = m.moe.num_experts, m.moe.experts_per_token, m.moe.expert_intermediate_size
        # the fused-MoE Triton experts' workspace, which the workspace manager keeps; MXFP4 experts (gpt-oss) run
        # through triton_kernels' matmul_ogs instead and take none (vLLM 0.19's gpt-oss peak is the sampler's alone)
        workspace = 0 if m.weight_dtype == "mxfp4" else tokens * k * (max(ie // tp, H) + max(2 * ie // tp, H)) * b
        shared = tokens * b * 3 * m.moe.shared_intermediate * m.moe.shared_experts // tp
        # matmul_ogs (MXFP4, triton_kernels) writes the fused SwiGLU's [tokens x k, I] output and scatters the
        # second GEMM through a [tokens x k, H] scratchpad before reducing the k rows (matmul_ogs.py init_allocation)
        ogs = tokens * k * (ie // tp + H) * b if m.weight_dtype == "mxfp4" else 0
        moe = tokens * b * 2 * H + tokens * e * b + 8 * tokens * k + shared + ogs
        if with_moe_workspace:
            moe += workspace
    peak = max(attn, dense, moe, state) + (tokens * H * b if tp > 1 else 0)  # all-reduce output beside its input
    return peak, {"attention": attn, "mlp": dense, "moe": moe, "moe_workspace": workspace, "state": state}


def _encoder_profile(m: ModelSpec, tokens: int, max_num_seqs: int, max_model_len: int, tp: int,
                     b: int) -> tuple[int, int, int]:
    """The multimodal part of vLLM's profile run (gpu_model_runner.profile_run, multimodal/encoder_budget.py): as
    many largest dummy items as the encoder budget (max(max_num_batched_tokens, one item's embeddings)) holds, run
    through the encoder eagerly; their outputs and pixels stay alive while the language model's dummy batch and the
    sampler run. Returns the encoder's own peak, what it leaves held, and the number of items."""
    v = m.vision
    per = v.tokens_per_item
    items = max(1, min(max(tokens, per) // per, max_num_seqs * max(1, max_model_len // per)))
    n, D, inter = items * v.patches_per_item, v.hidden_size, v.intermediate_size
    pixels = items * v.pixels_per_item * b
    held = items * per * m.hidden_size * b + pixels
    mlp = n * (2 * inter // tp) * b + 2 * n * (inter // tp) * b
    if v.kind == "pixtral":
        # without xformers vLLM's Pixtral builds the dense N x N block-diagonal mask, whole on every rank
        peak = n * n * b + pixels + 6 * n * D * b + mlp + 2 * n * 64 * b
    else:
        states = (v.num_layers + 1) if v.keeps_hidden_states else 2
        peak = pixels + states * n * D * b + 2 * n * D * b + 2 * n * (inter // tp) * b
    return peak, held, items


def _sampler_peak(m: ModelSpec, rows: int, tp: int, b: int, rules: VllmRules, gpu: Optional[GPUSpec]) -> int:
    V = m.vocab_size
    v_pad = padded_vocab(V)
    sms = (gpu.sm_count if gpu and gpu.sm_count else 132)
    p = min(1 << max(0, math.ceil(math.log2(max(1, min(sms, rows))))), sms)
    logits = b * rows * v_pad
    if rules.runner == "mrv2" and rules.sampler_warmup_pass:
        sampler = logits + 12 * rows * V  # fp32 copy, top-k mask, probs (FlashInfer path)
    elif rules.runner == "mrv2":
        sampler = logits  # the default pass keeps the logits in the model dtype
    else:
        sampler = logits + 12 * rows * V + (4 * p * V if rows >= 8 else 0)  # fp32 logits, probs, q; Triton buffer
    gather = (2 * rows * v_pad * b + b * rows * v_pad // tp) if tp > 1 else 0
    return max(sampler, gather)


def _capture_sizes(max_cg: int) -> list[int]:
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_cg + 1, 16))
    return [s for s in sizes if s <= max_cg]


def non_kv_memory(m: ModelSpec, gpu: Optional[GPUSpec], *, total_bytes: int, tp: int, weights: int,
                  version: str | VllmRules, max_model_len: int, max_num_batched_tokens: Optional[int] = None,
                  max_num_seqs: Optional[int] = None, first_stage: bool = True, last_stage: bool = True,
                  pp: int = 1, enforce_eager: bool = False, weight_dtype: Optional[str] = None,
                  stage: Optional[range] = None, layout=None) -> NonKVMemory:
    """vLLM's non-KV memory on one rank, part by part (see the module docstring). `weight_dtype`, `stage` and
    `layout` (a kvplan.specs.parallel.Parallel, where experts are spread) say which tensors `weights` counts (as
    kvplan.sizing.weights.weight_bytes takes them), for the allocator's blocks."""
    rules = _rules(version)
    d = serve_defaults(total_bytes, gpu, rules, max_model_len)
    T = max_num_batched_tokens or d.max_num_batched_tokens
    R_max = max_num_seqs or d.max_num_seqs
    R = min(R_max, T)
    b = DTYPE_BYTES[m.dtype]
    H = m.hidden_size
    fam = _cc_family(gpu)

    # rotary cos/sin cache: max_position x rotary dims in the model dtype, one per distinct RoPE (Gemma 3: two);
    # float32 where the model asks get_rope for it (gpt_oss.py OAIAttention)
    rot_dim = m.mla.qk_rope_head_dim if m.mla else (m.head_dim or 0)
    rotary = (m.max_position_embeddings * rot_dim * (4 if m.family in _FP32_ROTARY else b)
              * (2 if m.family.startswith("gemma3") else 1))

    # cuBLAS's workspace per stream (torch's default: 32 MiB on SM90 and SM100, 8 MiB + 128 KiB elsewhere)
    cublas = 32 * MiB if fam else 8 * MiB + 128 * 1024
    forward, parts = _forward_peak(m, T, tp, b, eager=enforce_eager)
    if last_stage:
        hold = T * H * b + 2 * R * H * b  # hidden states, sampled rows and their random copy
        # the MoE workspace is the workspace manager's persistent buffer: still allocated while the sampler runs
        activation = max(forward, parts["moe_workspace"] + hold + _sampler_peak(m, R, tp, b, rules, gpu))
    else:
        activation = forward
    if not first_stage:
        activation += 2 * T * H * b  # the persistent IntermediateTensors (hidden + residual) a later stage receives
    elif m.vision is not None:
        encoder, held, items = _encoder_profile(m, T, R_max, max_model_len, tp, b)
        parts.update(encoder_peak=encoder, encoder_outputs_held=held, encoder_items=items)
        activation = max(encoder, activation + held)
    if rules.cublas_workspace == "peak":
        activation += cublas  # the profile run's first GEMM creates it, inside the measured torch peak

    persistent = 0
    if rules.runner == "mrv2":
        V = m.vocab_size
        persistent += 4 * R_max * V + 4 * R_max * math.ceil(V / 32)  # PenaltiesState (output bins, prompt mask)
    if rules.cublas_workspace == "consumed":
        persistent += cublas  # the main stream's workspace, after the snapshot in 0.30

    non_torch = _non_torch(rules, gpu, fam, tp, T * H * b, pp, enforce_eager, parts)

    estimate, capture, splits, n_pw, n_full = _cudagraph_memory(m, gpu, tp, b, fam, rules, T, R_max, cublas,
                                                                enforce_eager)
    cudagraph = estimate if rules.subtracts_cudagraphs else 0
    parts.update(rotary_cache=rotary, capture_sizes=n_pw, full_graphs=n_full, sampler_rows=R,
                 cudagraph_estimate=estimate, cudagraph_capture=capture, fa3_split_accumulators=splits,
                 cudagraph_subtracted=rules.subtracts_cudagraphs and not enforce_eager,
                 cublas_workspace=rules.cublas_workspace)
    repack = mxfp4_hopper_repack(m, tp) if fam == "sm90" else 0
    # the caching allocator's blocks beyond the parameters' bytes: vLLM's "Model loading took" is
    # torch.cuda.memory_allocated's growth over the load (worker/gpu_model_runner.py load_model, DeviceMemoryProfiler)
    blocks = allocator_rounding(m, layout if layout is not None else tp, weight_dtype, stage)
    fragments = largest_fragment = 0
    if repack and pp == 1 and weight_dtype is None:
        # the MXFP4 experts converted on Hopper: the blocks are those of the converted layout, and what the conversion
        # leaves reserved but unallocated is outside the budget (vLLM counts allocated bytes) but not free for what
        # runs after the KV cache either
        held, fragments, largest_fragment = mxfp4_hopper_load(m, tp, rotary)
        blocks = held - (weights + rotary + repack)
    parts.update(mxfp4_repack=repack, allocator_rounding=blocks, load_fragmentation=fragments,
                 load_fragment_largest=largest_fragment)
    return NonKVMemory(weights + rotary + repack + blocks, activation, persistent, non_torch, cudagraph, T, R_max,
                       "model", parts)


def _non_torch(rules: VllmRules, gpu: Optional[GPUSpec], fam, tp: int, batch_bytes: int, pp: int,
               enforce_eager: bool, parts: dict) -> int:
    """The memory outside torch's allocator on one rank: the libraries', torch's NCCL communicator and FlashInfer's
    all-reduce workspace (`batch_bytes`: one batch's hidden states). Its parts are added to `parts`."""
    # FlashInfer's all-reduce workspace, made inside the profile run: by the compiled AR+RMSNorm fusion pass
    # (capped at one batch's hidden states; before 0.30 only with a single pipeline stage), or by the standalone
    # FlashInfer all-reduce (0.30+), uncapped, when nothing is compiled
    fusion = not enforce_eager and (rules.flashinfer_allreduce_standalone or pp == 1)
    link = transport(gpu, tp)
    if fusion:
        fi_workspace = flashinfer_allreduce_workspace(fam, tp, batch_bytes, link)
    elif rules.flashinfer_allreduce_standalone:
        fi_workspace = flashinfer_allreduce_workspace(fam, tp, kind=link)
    else:
        fi_workspace = 0
    # torch's NCCL communicator for the TP group, made during the profile run before 0.30; a pipeline-only
    # deployment sends with PyNccl (made at init) and gathers nothing
    torch_nccl = TORCH_NCCL_COMMUNICATOR[link] if tp > 1 and rules.lazy_torch_nccl else 0
    non_torch = LIBRARY_NON_TORCH + torch_nccl + fi_workspace
    parts.update(library_non_torch=LIBRARY_NON_TORCH, torch_nccl_communicator=torch_nccl,
                 flashinfer_allreduce_workspace=fi_workspace, transport=link)

    return non_torch


def _cudagraph_memory(m: ModelSpec, gpu: Optional[GPUSpec], tp: int, b: int, fam, rules: VllmRules, T: int,
                      R_max: int, cublas: int, enforce_eager: bool) -> tuple:
    """What vLLM's CUDA graphs take on one rank: (the estimate its budget subtracts, what the capture holds, FA3's
    split accumulators, the piecewise and the full graph counts); nothing with enforce_eager."""
    estimate = capture = splits = 0
    n_pw = n_full = 0
    if not enforce_eager:
        # gpt-oss raises the largest capture size to 1,024 (GptOssForCausalLMConfig): 83 graphs per mode
        cap_max = 1024 if m.family == "gpt_oss" else min(
            R_max * 2, rules.max_capture_sm100 if fam in ("sm100", "sm103") else 512)
        cap_max = min(cap_max, T)
        sizes = _capture_sizes(cap_max)
        full_sizes = [s for s in sizes if s <= R_max]
        n_pw, n_full = len(sizes), len(full_sizes)
        f_cg, _ = _forward_peak(m, max(sizes), tp, b, with_moe_workspace=False)
        kernels = piece_kernels(m, gpu)
        g_pw = per_graph_bytes(m.num_layers, "piecewise", kernels)
        g_full = per_graph_bytes(m.num_layers, "full", kernels)
        # mrv2 captures every piecewise graph for real after one eager warm-up each (the capture activations
        # twice); the older runner takes two samples per mode and extrapolates
        warmups = 2 if rules.runner == "mrv2" else 1
        first = warmups * f_cg + cublas
        if rules.runner == "v1" and full_sizes:
            # FlashAttention 3's split-KV accumulators: the older runner's estimate keeps the larger of its first
            # PIECEWISE and first FULL samples (gpu_model_runner.profile_cudagraph_memory), and the first FULL
            # sample holds them where the largest FULL graph is within FA3's dynamic-split limit; the capture itself
            # keeps them for the largest FULL graph within it
            first = max(first, fa3_split_accumulators(m, gpu, tp, max(full_sizes)))
            splits = fa3_split_accumulators(
                m, gpu, tp, max([s for s in full_sizes if s <= FA3_DYNAMIC_SPLIT_MAX_BATCH], default=0))
        estimate = first + (n_pw - 1) * g_pw + (n_full - 1) * g_full
        # what capture_model's free-memory drop holds (gpu_model_runner.capture_model measures before its
        # empty_cache): each size's eager warm-up (cudagraph_num_of_warmups = 1, config/vllm.py) in the default pool
        # and its captured copy in the graph pool (_warmup_and_capture), the capture stream's cuBLAS workspace,
        # FA3's accumulators, and every graph's own driver memory; kvplan has not traced MRV2's capture and takes
        # its estimate for it
        capture = 2 * f_cg + cublas + splits + n_pw * g_pw + n_full * g_full if rules.runner == "v1" else estimate
        if fam in ("sm100", "sm103") and not m.mla:
            # FlashInfer is the SM100 backend for multi-head attention; its workspace is made at the first FULL
            # warm-up, inside the estimate's first sample
            estimate += FLASHINFER_ATTENTION_WORKSPACE
            capture += FLASHINFER_ATTENTION_WORKSPACE
    return estimate, capture, splits, n_pw, n_full


def mxfp4_hopper_repack(m: ModelSpec, tp: int) -> int:
    """What vLLM's TRITON MXFP4 MoE backend (Hopper) holds beyond the checkpoint's MXFP4 experts once it has
    converted them (oracle/mxfp4.py convert_to_mxfp4_moe_kernel_format, triton_kernels' Hopper layouts): the
    intermediate size padded to 64 per rank; the values transposed and padded to multiples of 64 in both dims; the
    checkpoint's scales kept beside their swizzled copy (rows padded to 256); the biases recast to float32. vLLM 0.19
    on H100 loads gpt-oss-20b at 13.64 GiB where its tensors take 12.83 (7.01 against 6.43 at TP 2)."""
    if m.weight_dtype != "mxfp4" or m.moe is None or "moe" not in m.mlp_kinds:
        return 0
    e, h, i = m.moe.num_experts, m.hidden_size, m.moe.expert_intermediate_size
    n = m.mlp_kinds.count("moe")
    raw_i = i // tp
    ir = _round_up(raw_i, 64)
    scale_blocks, raw_scale_blocks = _round_up(ir, 32) // 32, _round_up(raw_i, 32) // 32  # one scale per 32 values
    values = ((_round_up(h // 2, 64) * _round_up(2 * ir, 64) - 2 * raw_i * h // 2)
              + (_round_up(ir // 2, 64) * _round_up(h, 64) - h * raw_i // 2))
    scales_grown = (2 * ir - 2 * raw_i) * (h // 32) + h * (scale_blocks - raw_scale_blocks)
    swizzled_scales = _round_up(2 * ir, 256) * (h // 32) + _round_up(h, 256) * scale_blocks
    biases = (2 * ir + h) * 2  # float32 copies in place of bfloat16
    return n * e * (values + scales_grown + swizzled_scales + biases)


# The allocations and frees of triton_kernels' HopperMXValueLayout.swizzle_data
# (third_party/triton_kernels/tensor_details/layout_details/hopper_value.py) in the order eager torch makes them, for
# an input whose padded size is S bytes: the pad to multiples of 64, the pad to the mma tile (a copy even when
# nothing is padded: constant_pad_nd clones), permute().contiguous(), then _pack_bits: four int32 fields of S bytes
# each built from the uint8 values (every `&`, `<<`, `>>`, `|` a new tensor; the `x >> 4` slices S/4). "+n"
# allocates S bytes as tensor n, "*n" S/4 bytes, "-n" frees tensor n; tensor 75 is the result that stays.
_HOPPER_VALUE_SWIZZLE = (
    "+0 +1 -0 +2 -1 +3 +4 +5 -4 +6 +7 -6 +8 -5 -7 -3 *9 +10 -9 +11 +12 -11 +13 +14 -13 +15 -12 -14 -10 +16 -15 +17 -8 "
    "-16 +18 +19 +20 -19 +21 +22 -21 +23 -20 -22 -18 *24 +25 -24 +26 +27 -26 +28 +29 -28 +30 -27 -29 -25 +31 -30 +32 "
    "-23 -31 +33 +34 +35 -34 +36 +37 -36 +38 -35 -37 -33 *39 +40 -39 +41 +42 -41 +43 +44 -43 +45 -42 -44 -40 +46 -45 "
    "+47 -38 -46 +48 +49 +50 -49 +51 +52 -51 +53 -50 -52 +54 +55 -54 +56 -53 -55 -48 *57 +58 -57 +59 +60 -59 +61 +62 "
    "-61 +63 -60 -62 +64 +65 -64 +66 -63 -65 -58 +67 -66 +68 -56 -67 +69 +70 -69 +71 -70 +72 +73 -72 +74 -71 -73 +75 "
    "-74 -17 -32 -47 -68 -2")


def _swizzle_value(alloc, S: int) -> int:
    live = {}
    for tok in _HOPPER_VALUE_SWIZZLE.split():
        n = int(tok[1:])
        if tok[0] == "-":
            alloc.free(live.pop(n))
        else:
            live[n] = alloc.malloc(S if tok[0] == "+" else S // 4)
    (kept,) = live.values()
    return kept


def _swizzle_scale(alloc, E: int, rows: int, cols: int) -> int:
    """HopperMXScaleLayout.swizzle_data (hopper_scale.py) on [E, rows, cols] uint8 scales read along rows: the
    transposed view made contiguous twice, padded (rows to 256, cols to 2), and flattened out of its permutation
    (a copy)."""
    raw, padded = E * rows * cols, E * _round_up(rows, 256) * _round_up(cols, 2)
    a = alloc.malloc(raw)
    b = alloc.malloc(raw)
    alloc.free(a)
    c = alloc.malloc(padded)
    alloc.free(b)
    d = alloc.malloc(padded)
    alloc.free(c)
    return d


@per_spec
def mxfp4_hopper_load(m: ModelSpec, tp: int, rotary: int = 0) -> tuple[int, int, int]:
    """What torch holds allocated once vLLM has loaded an MXFP4 MoE model on Hopper (the TRITON backend), the memory
    that stays reserved but unallocated, and the largest free block in that (`rotary`: the rotary cache's bytes).
    Every layer's experts are swizzled into triton_kernels'
    Hopper layouts (Mxfp4MoEMethod.process_weights_after_loading, oracle/mxfp4.py convert_to_mxfp4_moe_kernel_format,
    quantization/utils/mxfp4_utils.py _swizzle_mxfp4) through temporaries as large as the experts, and the
    checkpoint-layout experts are freed only after; later layers' results and temporaries land in those freed
    segments, and the segments they leave partly used survive the empty_cache() of DeviceMemoryProfiler. Replayed
    through kvplan.sizing.caching_allocator.CachingAllocator in construction order (gpt_oss.py: the embedding; per layer the
    sinks, qkv
    and o projections, the router, w13, its scales, w2, its scales and the biases (Mxfp4MoEMethod.create_weights),
    the norms; the final norm and the LM head), then the conversion layer by layer. Returns zeros for other models."""
    if m.weight_dtype != "mxfp4" or m.moe is None or "moe" not in m.mlp_kinds:
        return 0, 0, 0
    from kvplan.sizing.caching_allocator import CachingAllocator

    b, H, E = DTYPE_BYTES[m.dtype], m.hidden_size, m.moe.num_experts
    Ir = _round_up(m.moe.expert_intermediate_size // tp, 64)  # mxfp4_round_up_hidden_size_and_intermediate_size
    hd = m.head_dim or H // m.num_heads
    q, kv = m.num_heads // tp, max(1, m.num_kv_heads // tp)
    alloc = CachingAllocator()
    alloc.malloc(-(-padded_vocab(m.vocab_size) // tp) * H * b)
    experts = []
    for i, kind in enumerate(m.mlp_kinds):
        if i == 0 and rotary:
            alloc.malloc(rotary)  # the rotary cache (one, shared by the layers)
        if m.attention_sinks is True or (m.attention_sinks == "sliding" and m.layer_kinds[i] == "sliding"):
            alloc.malloc(q * b)
        alloc.malloc((q + 2 * kv) * hd * H * b)
        if m.qkv_bias:
            alloc.malloc((q + 2 * kv) * hd * b)
        alloc.malloc(H * q * hd * b)
        if m.o_bias:
            alloc.malloc(H * b)
        if kind == "moe":
            alloc.malloc(E * H * b)
            if m.moe.router_bias:
                alloc.malloc(E * b)
            w13, _ = alloc.malloc(E * 2 * Ir * H // 2), alloc.malloc(E * 2 * Ir * H // 32)
            w2, _ = alloc.malloc(E * H * Ir // 2), alloc.malloc(E * H * Ir // 32)
            biases = (alloc.malloc(E * 2 * Ir * b), alloc.malloc(E * H * b)) if m.moe.expert_bias else ()
            experts.append((w13, w2, biases))
        alloc.malloc(H * b)
        alloc.malloc(H * b)
    alloc.malloc(H * b)
    if not m.tie_word_embeddings:
        alloc.malloc(-(-padded_vocab(m.vocab_size) // tp) * H * b)
    for w13, w2, biases in experts:
        if biases:  # the biases in float32 first
            alloc.malloc(E * 2 * Ir * 4)
            alloc.malloc(E * H * 4)
        _swizzle_value(alloc, E * _round_up(H // 2, 64) * _round_up(2 * Ir, 64))
        _swizzle_scale(alloc, E, 2 * Ir, H // 32)
        _swizzle_value(alloc, E * _round_up(Ir // 2, 64) * _round_up(H, 64))
        _swizzle_scale(alloc, E, H, Ir // 32)
        for blk in biases + (w13, w2):  # replace_parameter drops the bf16 biases; the old experts go last
            alloc.free(blk)
    alloc.empty_cache()
    return alloc.allocated, alloc.reserved - alloc.allocated, alloc.largest_free_block


# The torch memory the real logs show still reserved after the profile run's empty_cache(), beyond the persistent
# buffers and beyond what a weight conversion leaves (mxfp4_hopper_load: 1.9 and 1.4 GiB for gpt-oss-20b at
# TP 1 and 2, against 1.75 and 1.56 GiB in its logs): 0.0-0.1 GiB in some runs and about 0.95 GiB in others of the
# same models (vLLM 0.19, H100; a freshly compiled Llama-3.1-8B holds it, a cached compile does not, a freshly
# compiled Granite does not). Which allocations pin it is not known; with kvplan's figure for what the CUDA-graph
# capture takes (parts["cudagraph_capture"], within 0.2 GiB of the 24 logs that print it) that makes 1.1 GiB: a
# margin below this figure is flagged as a risk.
FRAGMENTATION_SEEN = int(1.1 * GiB)


def sampler_warmup(m: ModelSpec, gpu: Optional[GPUSpec], nk: NonKVMemory, *, total_bytes: int, requested: int,
                   tp: int, version: str | VllmRules, kv_tensor_bytes: Optional[int] = None) -> tuple[int, int]:
    """After the KV cache is allocated and the CUDA graphs captured, vLLM warms the sampler up with max_num_seqs
    dummy requests (gpu_worker.compile_or_warm_up_model): the bf16 logits, then fp32 logits, probabilities and q.
    Returns (the memory free for it, what it needs). Free: what utilization leaves outside the budget, less the
    memory in use before the snapshot, plus the profile's peak (released), less the torch buffers that persist (the
    hidden-state buffer, the Triton top-k buffer) and what the CUDA-graph capture took beyond what the budget
    subtracted."""
    rules = _rules(version)
    V = m.vocab_size
    v_pad = padded_vocab(V)
    b = DTYPE_BYTES[m.dtype]
    R = nk.max_num_seqs
    sms = (gpu.sm_count if gpu and gpu.sm_count else 132)
    # persistent: the hidden-state buffer, the Triton top-k buffer, and the MoE workspace the workspace manager keeps
    persist = nk.max_num_batched_tokens * m.hidden_size * b + 4 * sms * V + nk.parts.get("moe_workspace", 0)
    # what the capture took beyond what the budget subtracted (all of it in 0.19, which subtracts nothing)
    graphs = max(0, nk.parts.get("cudagraph_capture", nk.parts.get("cudagraph_estimate", 0)) - nk.cudagraph)
    # segments the weights' conversion left partly used stay reserved: the KV cache's tensors (one per layer of a
    # group, kv_tensor_bytes each) fill their free blocks where they fit, and the sampler's tensors fit none of them
    # when the largest is smaller than the bf16 logits
    logits = R * v_pad * b
    largest = nk.parts.get("load_fragment_largest", 0)
    fits_kv = kv_tensor_bytes is not None and largest >= kv_tensor_bytes
    fragments = nk.parts.get("load_fragmentation", 0) if largest < logits and not fits_kv else 0
    free = (total_bytes - requested - pre_snapshot_bytes(gpu, tp, rules, moe=m.moe is not None)
            + nk.activation - persist - graphs - fragments)
    need = logits + 12 * R * V
    return free, need


def flat_allowance(weights: int, allowance_bytes: int, max_num_batched_tokens: int, max_num_seqs: int) -> NonKVMemory:
    """The back-of-envelope budget: weights plus one allowance for activations, CUDA graphs, NCCL and the CUDA
    context (6.0 GiB in the seeds' arithmetic)."""
    return NonKVMemory(weights, allowance_bytes, 0, 0, 0, max_num_batched_tokens, max_num_seqs, "flat allowance")


# DeepEP's buffers, per GPU (vllm/distributed/device_communicators/all2all.py DeepEPHTAll2AllManager and
# DeepEPLLAll2AllManager, vllm/envs.py): VLLM_DEEPEP_BUFFER_SIZE_MB (1024) of NVLink buffer for either mode, the same
# again as RDMA buffer for high-throughput mode across nodes, and for low-latency mode the RDMA buffer DeepEP's
# get_low_latency_rdma_size_hint asks for: double-buffered dispatch (fp8 values, a scale per 128, a 16-byte header)
# and combine (bf16 plus a header) slots for every expert x VLLM_MOE_DP_CHUNK_SIZE (256) tokens, about
# 4 x E x T x (2 x hidden + 16) bytes (deep_ep 1.0.0 csrc/kernels/internode_ll.cu). They are made with cudaMalloc and
# NVSHMEM after vLLM's memory snapshot (prepare_communication_buffer_for_model), so they come out of the KV pool.
DEEPEP_BUFFER_BYTES = 1024 * MiB
MOE_DP_CHUNK_TOKENS = 256


def all2all_buffer_bytes(m: ModelSpec, backend: Optional[str], cross_node: bool) -> int:
    """The all-to-all buffers one rank's MoE layers allocate under `backend` (0 for the NCCL-based ones)."""
    if backend == "deepep_high_throughput":
        return DEEPEP_BUFFER_BYTES * (2 if cross_node else 1)
    if backend == "deepep_low_latency" and m.moe is not None:
        return DEEPEP_BUFFER_BYTES + 4 * m.moe.num_experts * MOE_DP_CHUNK_TOKENS * (2 * m.hidden_size + 16)
    return 0
