"""Worked examples by hand of vLLM's KV budget on the releases people run today: a GPU under 70 GiB's profile run on
0.30, a TP 4 deployment over PCIe, and a PP 4 stage split with its overheads. Every figure is written out from the
engine's source (file named beside each term) and checked against kvplan's plan.

Constants kvplan takes from measurements rather than from a source line (the libraries' non-torch memory, NCCL's
buffers over PCIe, the per-graph driver memory) are named as such and used as inputs; the arithmetic around them
is done here."""

import math

from kvplan import load_gpu, load_model
from kvplan.api import pool_plan
from kvplan.sizing.vllm_non_torch import CUDA_CONTEXT, LIBRARY_NON_TORCH, PYNCCL_COMMUNICATOR, TORCH_NCCL_COMMUNICATOR
from kvplan.sizing.vllm_non_torch import pre_snapshot_bytes

MiB, GiB = 2**20, 2**30
V = 128_256  # Llama 3.x vocabulary, already a multiple of 64 (vocab_parallel_embedding.py pad_vocab_size)
PEN_ROW = 4 * V + 4 * math.ceil(V / 32)  # sample/penalties.py PenaltiesState: output_bin_counts + prompt_bin_mask, int32


def _mrv2_graphs(f_cg: int, cublas: int, n_pw: int, n_full: int, g_pw: int, g_full: int) -> int:
    # v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory (0.29+): each piecewise size warmed up eagerly and
    # captured (the capture activations twice), the capture stream's cuBLAS workspace, then one graph's driver memory
    # per further size and mode (g_pw, g_full: kvplan's per-graph figures, measured on vLLM 0.19)
    return 2 * f_cg + cublas + (n_pw - 1) * g_pw + (n_full - 1) * g_full


def test_llama31_8b_on_l4_profile_run_below_70_gib_030():
    """Llama-3.1-8B on one L4 (21.99 GiB, SM89), `vllm serve` with vLLM 0.30's defaults."""
    l4 = load_gpu("l4")
    total = 23_616_028_672
    assert l4.memory_total_bytes == total
    # engine/arg_utils.py get_batch_defaults: below 70 GiB 2,048 batched tokens and 256 sequences; config/cache.py
    # gpu_memory_utilization 0.92; gpu_worker.py request_memory: ceil(total x utilization)
    T, R = 2048, 256
    requested = math.ceil(total * 0.92)
    assert requested == 21_726_746_379
    # weights (model loading, bf16): 8,030,261,248 parameters x 2 B, plus the rotary cos/sin cache, 131,072 positions
    # x 128 dims x 2 B (rotary_embedding/base.py), every tensor a whole number of the allocator's 2 MiB pages
    weights = 2 * 8_030_261_248 + 131_072 * 128 * 2
    # the profile run (v1/worker/gpu/model_runner.py profile_run -> _dummy_run(2048, skip_attn=True), eager, then
    # _dummy_sampler_run on min(2048, 256) = 256 rows): the MLP's residual + gate_up + SiLU output at 2,048 tokens
    # sets the peak (the attention's projections: 2,048 x 2 x (2 x 4,096 + 3 x 4,096 + 3 x 1,024) = 92 MiB);
    # the sampler's default pass (no request asks for penalties, top-k/top-p or logprobs: sample/sampler.py
    # apply_sampling_params returns the bf16 logits as they are; gumbel.py keeps [256, 126] int64 + fp32 partials)
    # holds the hidden states, the 256 sampled rows and the bf16 logits: 16 + 4 + 62.6 MiB, under the MLP's 184 MiB
    mlp = T * 2 * (4096 + 3 * 14336)
    sampler_side = T * 4096 * 2 + 2 * R * 4096 * 2 + R * V * 2
    assert mlp == 184 * MiB and sampler_side < mlp
    activation = mlp
    # consumed memory that persists (utils/mem_utils.py memory_profiling: total_consumed + transient headroom): the
    # PenaltiesState for 256 requests, made in load_model after the weights are measured (129.2 MiB), and the main
    # stream's cuBLAS workspace, torch's default off SM90/SM100: 4,096 x 1,024 x 2 + 16 x 1,024 x 8 B
    cublas = 4096 * 1024 * 2 + 16 * 1024 * 8
    persistent = R * PEN_ROW + cublas
    assert R * PEN_ROW == 135_438_336
    # non-torch: the libraries' own memory (cuBLAS handles, lazily loaded modules: kvplan's 256 MiB from the 0.19
    # logs); one GPU, so no NCCL
    non_torch = LIBRARY_NON_TORCH
    # CUDA graphs (config/vllm.py _set_cudagraph_sizes: up to min(2 x 256, 512) = 512, [1, 2, 4] + 8..248 step 8 +
    # 256..512 step 16 = 51 piecewise sizes, the 35 of them <= 256 requests also FULL); the capture activations at
    # 512 tokens (the MLP again: 46 MiB); Llama's 32 layers give 33 pieces: 6 MiB a piecewise graph, 4 MiB a full one
    f_cg = 512 * 2 * (4096 + 3 * 14336)
    graphs = _mrv2_graphs(f_cg, cublas, 51, 35, 6 * MiB, 4 * MiB)
    assert graphs == 562_167_808  # 536.1 MiB
    available = requested - weights - activation - persistent - non_torch - graphs
    # 21,726,746,379 - 16,094,076,928 - 192,937,984 - 143,958,016 - 268,435,456 - 562,167,808
    assert available == 4_465_170_187  # 4.16 GiB
    p = pool_plan(load_model("llama-3.1-8b"), l4, "auto", engine_version="0.30")
    nk = p.non_kv
    assert (p.max_num_batched_tokens, nk.max_num_seqs, p.requested) == (T, R, requested)
    assert (nk.weights, nk.activation, nk.persistent, nk.non_torch, nk.cudagraph) == (
        weights, activation, persistent, non_torch, graphs)
    assert p.available == available
    # a block: 32 layers x 16 tokens x K and V x 8 heads x 128 x 2 B = 2 MiB; 2,129 blocks
    assert p.num_blocks == available // (32 * 16 * 2 * 8 * 128 * 2) == 2_129


def test_llama31_70b_tp4_over_pcie_030():
    """Llama-3.1-70B at TP 4 on four H100 PCIe cards (NVLink-bridged in pairs, so the group of 4 talks over PCIe),
    vLLM 0.30, `vllm serve` defaults (79.5 GiB: 8,192 batched tokens, 1,024 sequences)."""
    pcie = load_gpu("h100-pcie")
    total = pcie.memory_total_bytes
    T, R, H, tp = 8192, 1024, 8192, 4
    requested = math.ceil(total * 0.92)
    # before the baseline snapshot (gpu_worker.py init_device -> init_worker_distributed_environment): the CUDA
    # context, the TP group's PyNccl communicator, and from 0.30 torch's NCCL process group
    # (parallel_state.py init_process_group(device_id=...)), both with NCCL's PCIe buffers (estimates); no custom
    # all-reduce (custom_all_reduce.py: "not supported on more than two PCIe-only GPUs") and no symmetric-memory
    # buffer (no multicast without NVSwitch)
    assert pre_snapshot_bytes(pcie, tp, "0.30") == (
        CUDA_CONTEXT + PYNCCL_COMMUNICATOR["pcie"] + TORCH_NCCL_COMMUNICATOR["pcie"]) == (522 + 64 + 64) * MiB
    # weights per rank: each layer's qkv (10,240 x 8,192), o (8,192 x 8,192), gate_up (57,344 x 8,192) and down
    # (8,192 x 28,672) split 4 ways, its two norms (8,192 each) whole; the embedding and LM head (128,256 x 8,192)
    # split 4 ways, the final norm whole; bf16. The embedding's and LM head's 32,064 rows x 8,192 x 2 B = 501 MiB each
    # take 502 MiB blocks (torch's caching allocator rounds a request of 10 MiB and up to 2 MiB and does not split
    # off a 1 MiB remainder: c10/cuda/CUDACachingAllocator.cpp round_size, should_split); the rest are whole pages
    layer = (10_240 * 8192 + 8192 * 8192 + 57_344 * 8192 + 8192 * 28_672) // tp + 2 * 8192
    params = 80 * layer + 2 * V * 8192 // tp + 8192
    assert 2 * V * 8192 // tp == 501 * MiB
    weights = 2 * params + 2 * MiB + 131_072 * 128 * 2  # + the rotary cache (rotary_embedding/base.py)
    # the profile run's forward at 8,192 tokens: the MLP's residual + gate_up/4 + act/4 = 8,192 x 2 x (8,192 +
    # 3 x 7,168), with the all-reduce's output beside its input (8,192 x 8,192 x 2): 464 + 128 = 592 MiB
    forward = T * 2 * (H + 3 * 28_672 // tp) + T * H * 2
    # the sampler side is larger here: the hidden states and sampled rows (128 + 32 MiB) and the logits gathered
    # over TP (logits_processor.py _gather_logits: the all-gather's [4, 1,024, 32,064] output and the reshaped
    # [1,024, 128,256] copy, 2 x 250.5 MiB, beside the rank's own [1,024, 32,064] slice, 62.6 MiB)
    gather = 2 * R * V * 2 + R * V * 2 // tp
    activation = T * H * 2 + 2 * R * H * 2 + gather
    assert activation > forward and activation == 758_775_808  # 723.6 MiB
    cublas = 32 * MiB  # SM90: torch's 32 MiB cuBLAS workspace, charged as consumed in 0.30
    persistent = R * PEN_ROW + cublas  # the PenaltiesState for 1,024 requests, 516.7 MiB
    # non-torch after the snapshot: the libraries' 256 MiB only; torch's communicator exists already (0.30), and
    # FlashInfer's all-reduce workspace needs multicast (flashinfer/comm/trtllm_ar.py), which PCIe does not give
    non_torch = LIBRARY_NON_TORCH
    # CUDA graphs: 51 sizes up to 512 in both modes (all <= 1,024 requests); the capture activations at 512 tokens
    # (MLP 29 MiB + the all-reduce output 8 MiB); 80 layers, 81 pieces: 16 MiB a piecewise graph, 12 MiB a full one
    f_cg = 512 * 2 * (H + 3 * 28_672 // tp) + 512 * H * 2
    graphs = _mrv2_graphs(f_cg, cublas, 51, 51, 16 * MiB, 12 * MiB)
    assert graphs == 1_579_155_456  # 1.47 GiB
    available = requested - weights - activation - persistent - non_torch - graphs
    p = pool_plan(load_model("llama-3.1-70b"), pcie, "auto", tp=tp, engine_version="0.30")
    nk = p.non_kv
    assert (nk.weights, nk.activation, nk.persistent, nk.non_torch, nk.cudagraph) == (
        weights, activation, persistent, non_torch, graphs)
    assert nk.parts["transport"] == "pcie" and nk.parts["flashinfer_allreduce_workspace"] == 0
    # 78,533,477,008 - 35,314,483,200 - 758,775,808 - 575,307,776 - 268,435,456 - 1,579,155,456
    assert p.available == available == 40_037_319_312  # 37.29 GiB
    # a block: 80 layers x 16 tokens x K and V x 2 heads on this rank x 128 x 2 B = 1.25 MiB
    assert p.num_blocks == available // (80 * 16 * 2 * 2 * 128 * 2) == 30_546


def test_llama31_70b_pp4_stage_split_030():
    """Llama-3.1-70B over 4 pipeline stages on four H100 PCIe cards, vLLM 0.30 (8,192 tokens, 1,024 sequences). Each
    rank budgets its own stage; vLLM takes the fewest blocks over the ranks (v1/core/kv_cache_utils.py
    get_kv_cache_configs -> the minimum num_blocks)."""
    pcie = load_gpu("h100-pcie")
    T, R, H = 8192, 1024, 8192
    requested = math.ceil(pcie.memory_total_bytes * 0.92)
    # distributed/utils.py get_pp_indices: 80 layers / 4 = 20 each
    layer = 2 * (10_240 * 8192 + 8192 * 8192 + 57_344 * 8192 + 8192 * 28_672 + 2 * 8192)  # bf16
    embed = 2 * V * 8192  # the embedding on the first stage, the LM head on the last (untied)
    rotary = 131_072 * 128 * 2  # on every stage that holds attention layers
    weights = [20 * layer + embed + rotary, 20 * layer + rotary, 20 * layer + rotary,
               20 * layer + embed + 2 * 8192 + rotary]  # the final norm on the last
    # the forward at 8,192 tokens: the MLP (1,472 MiB) on every stage; a later stage also keeps its persistent
    # IntermediateTensors, hidden + residual for 8,192 tokens (model_runner.py load_model,
    # make_empty_intermediate_tensors(batch_size=max_num_tokens)): 256 MiB
    mlp = T * 2 * (H + 3 * 28_672)
    intermediates = 2 * T * H * 2
    activation = [mlp, mlp + intermediates, mlp + intermediates, mlp + intermediates]
    # the sampler runs on the last stage only and stays under the MLP there (hidden 128 MiB + rows 32 MiB + logits
    # 250.5 MiB); the Sampler and its PenaltiesState exist only on the last stage (model_runner.py load_model: `if
    # self.is_last_pp_rank and not self.is_pooling_model`), 516.7 MiB; every stage makes the 32 MiB cuBLAS workspace
    assert T * H * 2 + 2 * R * H * 2 + R * V * 2 < mlp
    cublas = 32 * MiB
    persistent = [cublas, cublas, cublas, cublas + R * PEN_ROW]
    # non-torch: the libraries' 256 MiB; the PP group's PyNccl communicator is made before the snapshot
    non_torch = LIBRARY_NON_TORCH
    # CUDA graphs: a stage compiles its own 20 layers (the others are PPMissingLayer), 21 pieces: 4 MiB a piecewise
    # graph and 4 MiB a full one (round(0.2 x 21 / 2) x 2 and round(0.15 x 21 / 2) x 2); 51 sizes in each mode
    f_cg = 512 * 2 * (H + 3 * 28_672)
    graphs = _mrv2_graphs(f_cg, cublas, 51, 51, 4 * MiB, 4 * MiB)
    assert graphs == 645_922_816  # 616 MiB
    available = [requested - w - a - pe - non_torch - graphs for w, a, pe in zip(weights, activation, persistent)]
    page = 20 * 16 * 2 * 8 * 128 * 2  # 20 layers x 16 tokens x K and V x 8 heads x 128 x 2 B = 1.25 MiB
    blocks = [a // page for a in available]
    assert blocks == [30_274, 31_672, 31_672, 29_656]
    p = pool_plan(load_model("llama-3.1-70b"), pcie, "auto", pp=4, engine_version="0.30")
    assert [(st.layers_range.start, st.layers_range.stop) for st in p.stages] == [(0, 20), (20, 40), (40, 60),
                                                                                  (60, 80)]
    assert [st.non_kv.weights for st in p.stages] == weights
    assert [st.non_kv.activation for st in p.stages] == activation
    assert [st.non_kv.persistent for st in p.stages] == persistent
    assert {st.non_kv.non_torch for st in p.stages} == {non_torch}
    assert {st.non_kv.cudagraph for st in p.stages} == {graphs}
    assert [st.available for st in p.stages] == available
    # the last stage (LM head, sampler state) binds: 29,656 blocks of 16 tokens
    assert p.binding.layers_range == range(60, 80) and p.num_blocks == 29_656
    # the PP group's PyNccl communicator sits in each rank's baseline beside the CUDA context: its 4 ranks span two
    # NVLink-bridged pairs, so NCCL's PCIe buffers (an estimate); TP 2 x PP 2 likewise, PP 2 within a pair over NVLink
    assert pre_snapshot_bytes(pcie, 1, "0.30", pp=4) == CUDA_CONTEXT + PYNCCL_COMMUNICATOR["pcie"]
    assert pre_snapshot_bytes(pcie, 1, "0.30", pp=2) == CUDA_CONTEXT + PYNCCL_COMMUNICATOR["nvlink"]
