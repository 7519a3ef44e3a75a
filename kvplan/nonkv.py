"""What vLLM subtracts from ceil(total x gpu_memory_utilization) before the KV cache gets the rest, in closed form
from what its startup actually executes (vLLM 0.20, 0.30, 0.33; a pure function, no I/O):

  weights     parameters on this rank in their checkpoint format, plus the rotary cos/sin caches
  activation  the peak of the profile run: one forward over max_num_batched_tokens (the widest layer's live
              tensors, the MoE workspace) and the dummy sampler over min(max_num_seqs, tokens) rows x vocab
  persistent  torch buffers charged outside the peak: 0.30+ allocates the sampler's penalty state
              (max_num_seqs x vocab int32); 0.30 charges the main stream's cuBLAS workspace
  non_torch   memory that appears after vLLM's baseline snapshot outside torch: the FlashInfer all-reduce
              workspace with TP > 1 on SM90/SM100 (driver and library internals are not modelled)
  cudagraph   the CUDA-graph estimate the engine subtracts (0.20 and later): two samples of the largest capture
              sizes, extrapolated over every size

The per-graph capture cost has no source constant beyond vLLM's 1 MiB floor; kvplan assumes 4 MiB per piecewise
graph. A startup log pins all of it (`kvplan` reads one and keeps the measured overheads as a profile).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from .specs import GPUSpec, ModelSpec
from .weights import DTYPE_BYTES, VOCAB_PADDING

MiB = 2**20
GiB = 2**30
PIECEWISE_GRAPH_BYTES = 4 * MiB  # assumed steady cost of one piecewise CUDA graph (uncalibrated)
FULL_GRAPH_MIN_BYTES = 1 * MiB  # vLLM's _MIN_PER_GRAPH_BYTES
# FlashInfer's all-reduce fusion workspace size per rank (FI_ALLREDUCE_FUSION_MAX_SIZE_MB), by arch and TP
_FI_ALLREDUCE_MB = {"sm90": {2: 64, 4: 2, 8: 0.5}, "sm100": {2: 64, 4: 32, 8: 1}}


@dataclass(frozen=True)
class ServeDefaults:
    max_num_batched_tokens: int
    max_num_seqs: int


def serve_defaults(total_bytes: int, gpu: Optional[GPUSpec], version: str, max_model_len: int) -> ServeDefaults:
    """`vllm serve`'s defaults (engine/arg_utils.get_batch_defaults), then capped at max_num_seqs x max_model_len."""
    gib = total_bytes / GiB
    is_a100 = bool(gpu and "A100" in gpu.name.upper())
    if gib >= 160:
        tokens, seqs = (16384 if version >= "0.30" else 8192), 1024
    elif gib >= 70 and not is_a100:
        tokens, seqs = 8192, 1024
    else:
        tokens, seqs = 2048, 256
    return ServeDefaults(min(tokens, seqs * max_model_len), seqs)


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
    if cc.startswith("10."):
        return "sm100"
    return None


def _forward_peak(m: ModelSpec, tokens: int, tp: int, b: int, with_moe_workspace: bool = True) -> tuple[int, dict]:
    """The widest layer's live tensors for `tokens` tokens (compiled forward), and the MoE workspace."""
    H = m.hidden_size
    if m.mla:
        q = m.num_heads * (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim) // tp
        kv = m.mla.latent_dim
    else:
        q = m.num_heads * (m.head_dim or 0) // tp
        kv = max(1, m.num_kv_heads // tp) * (m.head_dim or 0)
    attn = tokens * b * (2 * H + 3 * q + 3 * kv)
    dense = tokens * b * (H + 3 * m.intermediate_size // tp) if (not m.moe or m.moe.first_dense_layers) else 0
    moe = workspace = 0
    if m.moe:
        e, k, ie = m.moe.num_experts, m.moe.experts_per_token, m.moe.expert_intermediate_size
        workspace = tokens * k * (max(ie // tp, H) + max(2 * ie // tp, H)) * b  # Triton experts, persistent
        shared = tokens * b * 3 * m.moe.shared_intermediate * m.moe.shared_experts // tp
        moe = tokens * b * 2 * H + tokens * e * b + 8 * tokens * k + shared
        if with_moe_workspace:
            moe += workspace
    peak = max(attn, dense, moe) + (tokens * H * b if tp > 1 else 0)  # all-reduce output beside its input
    return peak, {"attention": attn, "mlp": dense, "moe": moe, "moe_workspace": workspace}


def _sampler_peak(m: ModelSpec, rows: int, tp: int, b: int, version: str, gpu: Optional[GPUSpec]) -> int:
    V = m.vocab_size
    v_pad = math.ceil(V / VOCAB_PADDING) * VOCAB_PADDING
    sms = (gpu.sm_count if gpu and gpu.sm_count else 132)
    p = min(1 << max(0, math.ceil(math.log2(max(1, min(sms, rows))))), sms)
    logits = b * rows * v_pad
    if version >= "0.33":
        sampler = logits + 12 * rows * V  # fp32 copy, top-k mask, probs (FlashInfer path)
    elif version >= "0.30":
        sampler = logits  # the default pass keeps the logits in the model dtype
    else:
        sampler = logits + 12 * rows * V + (4 * p * V if rows >= 8 else 0)  # fp32 logits, probs, q; Triton buffer
    gather = (2 * rows * v_pad * b + b * rows * v_pad // tp) if tp > 1 else 0
    return max(sampler, gather)


def _capture_sizes(max_cg: int) -> list[int]:
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_cg + 1, 16))
    return [s for s in sizes if s <= max_cg]


def non_kv_memory(m: ModelSpec, gpu: Optional[GPUSpec], *, total_bytes: int, tp: int, weights: int,
                  version: str, max_model_len: int, max_num_batched_tokens: Optional[int] = None,
                  max_num_seqs: Optional[int] = None, last_stage: bool = True,
                  enforce_eager: bool = False) -> NonKVMemory:
    """vLLM's non-KV memory on one rank, part by part (see the module docstring)."""
    d = serve_defaults(total_bytes, gpu, version, max_model_len)
    T = max_num_batched_tokens or d.max_num_batched_tokens
    R_max = max_num_seqs or d.max_num_seqs
    R = min(R_max, T)
    b = DTYPE_BYTES[m.dtype]
    H = m.hidden_size
    fam = _cc_family(gpu)

    # rotary cos/sin cache: max_position x rotary dims in the model dtype, one per distinct RoPE (Gemma 3: two)
    rot_dim = m.mla.qk_rope_head_dim if m.mla else (m.head_dim or 0)
    rotary = m.max_position_embeddings * rot_dim * b * (2 if m.family.startswith("gemma3") else 1)

    forward, parts = _forward_peak(m, T, tp, b)
    if last_stage:
        hold = T * H * b + 2 * R * H * b  # hidden states, sampled rows and their random copy
        activation = max(forward, hold + _sampler_peak(m, R, tp, b, version, gpu))
    else:
        activation = forward + 2 * T * H * b  # intermediate tensors handed to the next stage

    cublas = 32 * MiB if fam in ("sm90", "sm100") else 8 * MiB + 128 * 1024
    persistent = 0
    if version >= "0.30":
        V = m.vocab_size
        persistent += 4 * R_max * V + 4 * R_max * math.ceil(V / 32)  # PenaltiesState (output bins, prompt mask)
        if version < "0.33":
            persistent += cublas  # the main stream's workspace, after the snapshot in 0.30
    non_torch = 0
    if tp > 1 and fam in _FI_ALLREDUCE_MB:
        per_rank_mb = _FI_ALLREDUCE_MB[fam].get(tp, min(_FI_ALLREDUCE_MB[fam].values()))
        non_torch = int(4 * tp * per_rank_mb * MiB + 2 * MiB)  # FlashInfer all-reduce (fusion) workspace

    cudagraph = 0
    n_pw = n_full = 0
    if not enforce_eager:
        cap_max = min(R_max * 2, 1024 if (fam == "sm100" and version >= "0.30") else 512, T)
        sizes = _capture_sizes(cap_max)
        n_pw, n_full = len(sizes), len([s for s in sizes if s <= R_max])
        f_cg, _ = _forward_peak(m, max(sizes), tp, b, with_moe_workspace=False)
        if version >= "0.30":
            cudagraph = (2 * f_cg + cublas + (n_pw - 1) * PIECEWISE_GRAPH_BYTES
                         + (n_full - 1) * FULL_GRAPH_MIN_BYTES)
        else:
            cudagraph = f_cg + cublas + (n_pw + n_full - 2) * PIECEWISE_GRAPH_BYTES
    parts.update(rotary_cache=rotary, capture_sizes=n_pw, full_graphs=n_full, sampler_rows=R)
    return NonKVMemory(weights + rotary, activation, persistent, non_torch, cudagraph, T, R_max, "model", parts)


def flat_allowance(weights: int, allowance_bytes: int, max_num_batched_tokens: int, max_num_seqs: int) -> NonKVMemory:
    """The back-of-envelope budget: weights plus one allowance for activations, CUDA graphs, NCCL and the CUDA
    context (6.0 GiB in the seeds' arithmetic)."""
    return NonKVMemory(weights, allowance_bytes, 0, 0, 0, max_num_batched_tokens, max_num_seqs, "flat allowance")
