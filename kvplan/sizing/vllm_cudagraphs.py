"""What vLLM's CUDA graphs take on one rank: the estimate its budget subtracts (two samples per mode, extrapolated
over the capture sizes) and what the capture really holds (the eager warm-ups and their captured copies, every
graph's driver memory, FlashAttention 3's split-KV accumulators, FlashInfer's attention workspace)."""

from __future__ import annotations

from typing import Optional

from kvplan.rules.vllm import VllmRules
from kvplan.sizing.vllm_activation import forward_peak
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.gpu import cc_family
from kvplan.units import MiB

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
    if m.moe and m.weight_dtype == "mxfp4" and cc_family(gpu) == "sm90":
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
    if (cc_family(gpu) != "sm90" or m.mla or not m.attention_layers or not 0 < hd <= 256
            or not 0 < tokens <= FA3_DYNAMIC_SPLIT_MAX_BATCH):
        return 0
    return FA3_MAX_NUM_SPLITS * (m.num_heads // tp) * tokens * (hd + 1) * 4



FLASHINFER_ATTENTION_WORKSPACE = 394 * MiB  # VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE


def _capture_sizes(max_cg: int) -> list[int]:
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_cg + 1, 16))
    return [s for s in sizes if s <= max_cg]



def max_capture_size(m: ModelSpec, fam: Optional[str], rules: VllmRules, max_num_seqs: Optional[int]) -> int:
    """vLLM's largest CUDA-graph capture size (config/compilation.py): twice max_num_seqs, at most 512 (or
    rules.max_capture_sm100 on Blackwell, `fam` sm100 or sm103); gpt-oss raises it to 1,024
    (GptOssForCausalLMConfig)."""
    if m.family == "gpt_oss":
        return 1024
    cap = rules.max_capture_sm100 if fam in ("sm100", "sm103") else 512
    return min(2 * max_num_seqs, cap) if max_num_seqs else cap


def cudagraph_memory(m: ModelSpec, gpu: Optional[GPUSpec], tp: int, b: int, fam, rules: VllmRules, T: int,
                      R_max: int, cublas: int, enforce_eager: bool, num_layers: Optional[int] = None) -> tuple:
    """What vLLM's CUDA graphs take on one rank: (the estimate its budget subtracts, what the capture holds, FA3's
    split accumulators, the piecewise and the full graph counts); nothing with enforce_eager. `num_layers`: the
    layers this rank compiles (a pipeline stage's own; all of the model's by default), which set the pieces every
    graph is split into."""
    estimate = capture = splits = 0
    n_pw = n_full = 0
    if not enforce_eager:
        cap_max = min(max_capture_size(m, fam, rules, R_max), T)  # gpt-oss: 1,024, 83 graphs per mode
        sizes = _capture_sizes(cap_max)
        full_sizes = [s for s in sizes if s <= R_max]
        n_pw, n_full = len(sizes), len(full_sizes)
        f_cg, _ = forward_peak(m, max(sizes), tp, b, with_moe_workspace=False)
        kernels = piece_kernels(m, gpu)
        layers = m.num_layers if num_layers is None else num_layers
        g_pw = per_graph_bytes(layers, "piecewise", kernels)
        g_full = per_graph_bytes(layers, "full", kernels)
        # mrv2 captures every piecewise graph for real after one eager warm-up each (the capture activations
        # twice); the older runner takes two samples per mode and extrapolates
        runner = rules.runner_for(m)
        warmups = 2 if runner == "mrv2" else 1
        first = warmups * f_cg + cublas
        if runner == "v1" and full_sizes:
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
        capture = 2 * f_cg + cublas + splits + n_pw * g_pw + n_full * g_full if runner == "v1" else estimate
        if fam in ("sm100", "sm103") and not m.mla:
            # FlashInfer is the SM100 backend for multi-head attention; its workspace is made at the first FULL
            # warm-up, inside the estimate's first sample
            estimate += FLASHINFER_ATTENTION_WORKSPACE
            capture += FLASHINFER_ATTENTION_WORKSPACE
        if runner == "mrv2" and not rules.mrv2_estimates_cudagraphs:
            # MRV2 before 0.29 makes no estimate (its profile_cudagraph_memory returns 0): the capture still takes
            # what the 0.29 estimate measures, outside the budget
            estimate = 0
    return estimate, capture, splits, n_pw, n_full

