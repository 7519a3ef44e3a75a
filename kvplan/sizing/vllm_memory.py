"""What vLLM subtracts from ceil(total x gpu_memory_utilization) before the KV cache gets the rest, in closed form
from what its startup actually executes (a pure function, no I/O). What differs between releases (the runner that
profiles, the sampler passes, where cuBLAS's workspace lands, whether the CUDA-graph estimate is subtracted) is a
field of the version's rules in kvplan.rules.vllm. This module adds the parts up; the activation peaks are
kvplan.sizing.vllm_activation's, the CUDA graphs kvplan.sizing.vllm_cudagraphs', the memory outside torch
kvplan.sizing.vllm_non_torch's, and gpt-oss's converted MXFP4 experts on Hopper kvplan.sizing.vllm_mxfp4_hopper's:

  weights     parameters on this rank in their checkpoint format, plus the rotary cos/sin caches, in the torch
              caching allocator's blocks (kvplan.sizing.caching_allocator.allocated_bytes: what memory_allocated
              counts)
  activation  the peak of the profile run: one forward over max_num_batched_tokens (the widest layer's live
              tensors, the MoE workspace) and the dummy sampler over min(max_num_seqs, tokens) rows x vocab (on top
              of the MoE workspace, which the workspace manager keeps)
  persistent  torch buffers charged outside the peak: the MRV2 runner's sampler penalty state (max_num_seqs x
              vocab int32), charged from 0.27 (MRV2 profiles dense models from 0.25 and every model from 0.29);
              0.30 charges the main stream's cuBLAS workspace
  non_torch   memory that appears after vLLM's baseline snapshot outside torch: the libraries' own device memory
              (cuBLAS handles, CUDA modules loaded lazily at first use), with TP > 1 torch's NCCL communicator
              where it is made lazily (before 0.30) and the FlashInfer all-reduce workspace on SM90/SM100
  cudagraph   the CUDA-graph estimate the engine subtracts (0.20 and later; 0.19 measures it but does not
              subtract it; MRV2 makes none before 0.29): the capture activations, the capture stream's cuBLAS
              workspace, FlashAttention 3's split-KV accumulators in the FULL graphs (Hopper), FlashInfer's attention
              workspace where that backend runs (SM100 multi-head attention), and a cost per graph

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
from dataclasses import asdict, field
from typing import Optional

from kvplan.rules.vllm import VllmRules
from kvplan.sizing.model_tensors import padded_vocab
from kvplan.sizing.vllm_activation import encoder_profile, forward_peak, sampler_peak
from kvplan.sizing.vllm_cudagraphs import cudagraph_memory
from kvplan.sizing.vllm_mxfp4_hopper import mxfp4_hopper_load, mxfp4_hopper_repack
from kvplan.sizing.vllm_non_torch import non_torch_memory, pre_snapshot_bytes, rules_of
from kvplan.sizing.weight_allocations import allocator_rounding
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.gpu import cc_family
from kvplan.units import DTYPE_BYTES, GiB, MiB
from kvplan.values import frozen_dataclass

# models whose rotary cos/sin cache vLLM keeps in float32 (get_rope(..., dtype=torch.float32) in gpt_oss.py,
# minimax_text_01.py, bailing_moe_linear.py)
_FP32_ROTARY = ("gpt_oss", "minimax_text_01", "bailing_moe_linear")


@frozen_dataclass
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


def mrv2_sampler_state(m: ModelSpec, rules: VllmRules, max_num_seqs: int) -> int:
    """The MRV2 runner's PenaltiesState (v1/worker/gpu/sample/penalties.py: output_bin_counts [max_num_seqs, vocab]
    and prompt_bin_mask [max_num_seqs, ceil(vocab / 32)], int32), made in load_model after the weights are measured;
    0 where the V1 runner profiles. From 0.27 it is charged as consumed memory; the peak accounting before
    (mem_utils.memory_profiling) charges it nowhere, though it stays allocated."""
    if rules.runner_for(m) != "mrv2":
        return 0
    V = m.vocab_size
    return 4 * max_num_seqs * V + 4 * max_num_seqs * math.ceil(V / 32)


def non_kv_memory(m: ModelSpec, gpu: Optional[GPUSpec], *, total_bytes: int, tp: int, weights: int,
                  version: str | VllmRules, max_model_len: int, max_num_batched_tokens: int,
                  max_num_seqs: int, first_stage: bool = True, last_stage: bool = True,
                  pp: int = 1, enforce_eager: bool = False, weight_dtype: Optional[str] = None,
                  stage: Optional[range] = None, layout=None) -> NonKVMemory:
    """vLLM's non-KV memory on one rank, part by part (see the module docstring). `weight_dtype`, `stage` and
    `layout` (a kvplan.specs.parallel.Parallel, where experts are spread) say which tensors `weights` counts (as
    kvplan.sizing.weights.weight_bytes takes them), for the allocator's blocks. The batch limits are the resolved
    deployment's (kvplan.deployment decides their defaults, kvplan.rules.vllm.serve_defaults)."""
    rules = rules_of(version)
    T = max_num_batched_tokens
    R_max = max_num_seqs
    R = min(R_max, T)
    b = DTYPE_BYTES[m.dtype]
    H = m.hidden_size
    fam = cc_family(gpu)

    # rotary cos/sin cache: max_position x rotary dims in the model dtype, one per distinct RoPE (Gemma 3: two);
    # float32 where the model asks get_rope for it (gpt_oss.py OAIAttention)
    rot_dim = m.mla.qk_rope_head_dim if m.mla else (m.head_dim or 0)
    rotary = (m.max_position_embeddings * rot_dim * (4 if m.family in _FP32_ROTARY else b)
              * (2 if m.family.startswith("gemma3") else 1))

    # cuBLAS's workspace per stream (torch's default: 32 MiB on SM90 and SM100, 8 MiB + 128 KiB elsewhere)
    cublas = 32 * MiB if fam else 8 * MiB + 128 * 1024
    forward, parts = forward_peak(m, T, tp, b, eager=enforce_eager)
    activation = _profile_activation(m, gpu, rules, tp, b, T, R, R_max, max_model_len, forward, parts, cublas,
                                     first_stage, last_stage)

    persistent = 0
    if rules.memory_accounting == "consumed" and last_stage:
        # the Sampler and its PenaltiesState exist on the last pipeline stage only (v1/worker/gpu/model_runner.py
        # load_model: `if self.is_last_pp_rank and not self.is_pooling_model`, 0.25 to 0.33 alike)
        persistent += mrv2_sampler_state(m, rules, R_max)
    if rules.cublas_workspace == "consumed":
        persistent += cublas  # the main stream's workspace, after the snapshot in 0.30

    non_torch = non_torch_memory(rules, gpu, fam, tp, T * H * b, pp, enforce_eager, parts)

    # a pipeline stage compiles and captures only its own layers (the others are PPMissingLayer)
    stage_layers = len(stage) if stage is not None else m.num_layers
    estimate, capture, splits, n_pw, n_full = cudagraph_memory(m, gpu, tp, b, fam, rules, T, R_max, cublas,
                                                                enforce_eager, stage_layers)
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


def _profile_activation(m, gpu, rules, tp, b, T, R, R_max, max_model_len, forward, parts, cublas, first_stage,
                        last_stage) -> int:
    """The profile run's torch peak beyond the weights on one rank: the forward over T tokens, on the last stage the
    sampler over R rows, a later stage's intermediate tensors, a vision encoder's pass, and cuBLAS's workspace where
    the run creates it.

    Below 70 GiB (and on A100s) `vllm serve` profiles 2,048 tokens and 256 rows in every release (arg_utils.py
    get_batch_defaults). What MRV2's profile run allocates there in 0.29 to 0.31 (model_runner.py profile_run,
    _dummy_run, _dummy_sampler_run: the forward over 2,048 tokens, the bf16 logits of 256 rows, the sampler's default
    pass) is what this adds up; startup logs of 0.30/0.31 on such GPUs still show about 0.6 GiB more non-KV memory
    than this model. What 0.30's source allocates beyond it, none near that size, so no term is added:
    - the sampler's default pass (sample/sampler.py): no dummy request needs processing, so apply_sampling_params
      returns the bf16 logits (no fp32 copy), top_k/top_p are None (no sort, no FlashInfer top-k mask), no logprobs;
      gumbel.py keeps [256, ceil(V / 1024)] int64 + fp32 partials (0.4 MiB for V = 128,256);
    - logits_processor.py: the bf16 [256, V] head output (an fp32 head only with hf_overrides head_dtype), soft-cap
      and scale elementwise; the TP gather as below;
    - the runner's persistent buffers besides the PenaltiesState: StructuredOutputsWorker's grammar bitmask
      [256, ceil(V / 32)] int32 (3.9 MiB), LogitBiasState (256 x (2 x 1,024 + 1,024 + 128) x 4 = 3.1 MiB),
      BadWordsState (256 x 1,153 x 4 = 1.1 MiB), the input buffers (a few MiB); RequestState.all_token_ids
      [max_num_seqs, max_model_len] is UVA host memory (states.py), SamplingStates are UVA too;
    - gpu_worker.py determine_available_memory: reserve_mm_ipc_gpu_memory subtracts after the logged figure and is
      0 by default (MultiModalConfig.mm_ipc_gpu_memory_gb = 0); the startup plan is off (VLLM_ENABLE_STARTUP_PLAN);
    - torch's caching allocator: the main stream's cuBLAS workspace off SM90/SM100 (8 MiB + 128 KiB) opens a 20 MiB
      segment that mem_get_info counts whole (up to 12 MiB more), and segments a live block pins past the profile's
      empty_cache() count as consumed (0.30 caps splits at 20 MiB around load_model only; 0.33 around profile_run
      too, for this reason); neither is sized by the source;
    - Inductor's first compile runs inside the profile run (benchmark_combo_kernel, config/compilation.py), its
      benchmark inputs of the 2,048-token example size, a layer's tensors each (tens of MiB for an 8B model).
    """
    H = m.hidden_size
    if last_stage:
        hold = T * H * b + 2 * R * H * b  # hidden states, sampled rows and their random copy
        # the MoE workspace is the workspace manager's persistent buffer: still allocated while the sampler runs
        activation = max(forward, parts["moe_workspace"] + hold + sampler_peak(m, R, tp, b, rules, gpu))
    else:
        activation = forward
    if not first_stage:
        activation += 2 * T * H * b  # the persistent IntermediateTensors (hidden + residual) a later stage receives
    elif m.vision is not None:
        encoder, held, items = encoder_profile(m, T, R_max, max_model_len, tp, b)
        parts.update(encoder_peak=encoder, encoder_outputs_held=held, encoder_items=items)
        activation = max(encoder, activation + held)
    if rules.cublas_workspace == "peak":
        activation += cublas  # the profile run's first GEMM creates it, inside the measured torch peak
    return activation


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
    rules = rules_of(version)
    V = m.vocab_size
    v_pad = padded_vocab(V)
    b = DTYPE_BYTES[m.dtype]
    R = nk.max_num_seqs
    sms = (gpu.sm_count if gpu and gpu.sm_count else 132)
    # persistent: the hidden-state buffer, the Triton top-k buffer, and the MoE workspace the workspace manager keeps;
    # MRV2's sampler state too where the peak accounting (before 0.27) left it out of the budget
    persist = nk.max_num_batched_tokens * m.hidden_size * b + 4 * sms * V + nk.parts.get("moe_workspace", 0)
    if rules.memory_accounting == "peak":
        persist += mrv2_sampler_state(m, rules, R)
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

