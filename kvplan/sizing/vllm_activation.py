"""The peak of vLLM's profile run on one rank: the widest layer's live tensors and the MoE workspace for a batch,
the multimodal encoder's dummy items, and the dummy sampler's rows x vocabulary."""

from __future__ import annotations

import math
from typing import Optional

from kvplan.rules.vllm import VllmRules
from kvplan.sizing.model_tensors import padded_vocab
from kvplan.specs.catalog import GPUSpec, ModelSpec


def forward_peak(m: ModelSpec, tokens: int, tp: int, b: int, with_moe_workspace: bool = True,
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
    if m.state_layers:  # the projections run; the state kernels skip the profile run
        state = max(st.profile_peak(tokens, H, tp, b) for st, _ in m.state_groups)
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


def encoder_profile(m: ModelSpec, tokens: int, max_num_seqs: int, max_model_len: int, tp: int,
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


def sampler_peak(m: ModelSpec, rows: int, tp: int, b: int, rules: VllmRules, gpu: Optional[GPUSpec]) -> int:
    V = m.vocab_size
    v_pad = padded_vocab(V)
    sms = (gpu.sm_count if gpu and gpu.sm_count else 132)
    p = min(1 << max(0, math.ceil(math.log2(max(1, min(sms, rows))))), sms)
    logits = b * rows * v_pad
    runner = rules.runner_for(m)
    if runner == "mrv2" and rules.sampler_warmup_pass:
        sampler = logits + 12 * rows * V  # fp32 copy, top-k mask, probs (FlashInfer path)
    elif runner == "mrv2":
        sampler = logits  # the default pass keeps the logits in the model dtype
    else:
        sampler = logits + 12 * rows * V + (4 * p * V if rows >= 8 else 0)  # fp32 logits, probs, q; Triton buffer
    gather = (2 * rows * v_pad * b + b * rows * v_pad // tp) if tp > 1 else 0
    return max(sampler, gather)

