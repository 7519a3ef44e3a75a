"""The time of one engine step on one GPU: the kernels it runs, each priced by a fit of the form
t = t0 + bytes / (eta x peak bandwidth) (plus the few terms each kernel family needs), summed over a rank's layers.

Kernel families and what a step runs of each (per rank, per layer unless said):
* weight GEMMs: one per fused weight matrix (vLLM's QKV and gate-up) and the LM head, at m = tokens in the step:
  t0 + (memory^q + compute^q)^(1/q), memory = bytes / rate and compute = flops / (mu F), with (t0, eta, cap, mu,
  q) per range of m (decode batches to 512, then prefill chunks to 32,768; where the kernels also change at a
  depth of k, a second set for the deeper weights), the rate a grid of n output columns
  walking k deep sustains, cap(n, k), limiting eta B (at once, or softly where the walk shows beside the stream)
  and, where a range has them, the compute run as whole tiles in waves over the SMs and m rounded up to blocks of
  rows whose emptier last block costs more; larger m are held to the large-GEMM compute rate at least;
* fused MoE: the routed experts the tokens touch (under a router's skew: kvplan.sizing.routing),
  t0 + c_e x touched + max(bytes / (eta B), flops / (mu F));
* decode attention: one call per attention layer, t0 + (fixed^p + stream^p)^(1/p), fixed = c_seq x (sequences x KV
  heads) + c_q x (sequences x query heads) and stream = max(bytes / min(eta B, streams), c_tok x context), the
  context walked in whole tiles and the streams the rate the kernel's grid sustains per KV head and per (sequence,
  KV head), and where the fit has them the programs of an unsplit grid in waves over the SMs, or the context split
  over the SMs the pairs leave free (each split walking its share, the splits' results combined at a cost per
  split); one fit per head size and range of query heads per KV head (and for calls with a single KV head where
  the timings set them apart); for an fp8 cache also the kernel that quantizes the query; a state layer (Mamba,
  gated delta net) reads and writes its state at the same rate;
* all-reduce: two per layer under tensor parallelism (after attention and after the MLP), t0 + bytes / rate: the
  engines' custom all-reduce replayed in a CUDA graph where the step is one the graphs replay and the message is
  below its 8 MiB (graph_tokens), NCCL's otherwise;
* the layer's small kernels (two fused norm+residual, rotary with the cache write, the activation; a MoE layer's
  top-k, expert sort, activation and top-k sum): a fixed cost each;
* the engine's own share of a step: the sampler over the vocabulary, and the host time async scheduling does not hide.

Profiles: the bundled fits for A100, H100, H200, B200, B300 and GB200 (hardware/profiles/step-time.yaml, fitted
from public timings of vLLM's own kernels by benchmarks/fit_step_profiles.py; H200's decode attention from H100's
timings, the same chip, where H200's own ran small grids without splitting the context), or a profile `kvplan
measure` wrote, whose measured GEMV and decode families replace the bundled ones. Cache formats the bundled tables
lack take the bf16 kernel's fit with their own bytes plus fp8's measured conversion cost per element, and are marked
estimated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from kvplan.errors import KvplanError
from kvplan.rules.sglang import fused_shared_experts
from kvplan.sizing.kernel_seconds import (
    allreduce_seconds,
    attention_call_seconds,
    gemm_call_seconds,
    prefill_attention_seconds,
)
from kvplan.sizing.kv_cache import format_bytes_per_token, kv_layers
from kvplan.sizing.model_tensors import model_tensors
from kvplan.sizing.routing import experts_touched
from kvplan.sizing.step_fits import (
    StepProfile,
    allreduce_fit,
    attention_fit,
    bundled_gpus,
    bundled_profile,
    gemm_fit,
    prefill_attention_fit,
    with_calibration,
)
from kvplan.sizing.weight_formats import gemm_family, moe_family
from kvplan.sizing.weights import (
    _own_format,
    _quantized,
    format_and_scope,
    tensor_bytes_per_rank,
)
from kvplan.specs.catalog import ModelSpec
from kvplan.specs.kv_formats import kv_format
from kvplan.units import DTYPE_BYTES
from kvplan.xp import SCALAR

SMALL_KERNELS_PER_LAYER = 4  # fused add+RMSNorm twice, rotary + cache write, SiLU-and-mul
# Between NVLink domains: one 400 Gb/s NIC per GPU (DGX and HGX H100, H200, B200 nodes; AIConfigurator's system
# files give inter_node_bw 50e9 B/s) and about 10 us per message hop (their p2p_latency)
NET_BYTES_PER_S = 50e9
NET_LATENCY_S = 10e-6
# DeepEP's fixed cost per dispatch or combine call: low-latency ~15 us, high-throughput (normal) ~165 us on average
# of its dispatch (~250 us, with the layout notify) and combine (~80 us) at small token counts (AIConfigurator's
# SGLang 0.5.6 and vLLM 0.24 DeepEP tables, H200 and B200, hidden 7168, top-8 of 256)
DEEPEP_LL_CALL_S = 15e-6
DEEPEP_HT_CALL_S = 165e-6
NVLINK_A2A_BYTES_PER_S = 250e9  # a GPU without a catalogued NVLink rate
SAMPLER_KERNELS = 8  # logits copy, temperature, top-k/top-p, softmax, sampling, argmax (vLLM v1 Sampler)
# Host time per step that vLLM's async scheduling does not overlap (input preparation, CUDA-graph launch). An
# estimate: no public table measures it; it is a small share of a step at any realistic batch.
HOST_GAP_S = 100e-6
# The small kernels a MoE layer runs besides its two expert GEMMs, which the fused-MoE timings the profiles are
# fitted on leave out: the router's top-k selection (vLLM's topk_softmax or grouped_topk), the sort of the tokens by
# expert into blocks (moe_align_block_size), the activation between the two GEMMs (silu_and_mul) and the weighted
# sum of each token's top-k outputs (moe_sum): vllm/model_executor/layers/fused_moe/fused_moe.py
# fused_experts_impl, as SGLang's fused_moe_triton. Each costs what the kernel tables' smallest kernels take.
SMALL_KERNELS_PER_MOE_LAYER = 4
QK_NORM_FULL_KERNELS = 2  # a norm of q and k across all heads (_qk_norm_exchange): before its exchange and after


# ----------------------------------------------------------------------------------------------------------------
# Which fit a format or a weight dtype takes


# the world sizes the engines' custom all-reduce runs on (vLLM's distributed/device_communicators/
# custom_all_reduce.py CustomAllreduce._SUPPORTED_WORLD_SIZES; SGLang's custom_all_reduce.py the same)
CUSTOM_ALLREDUCE_WORLDS = (2, 4, 6, 8)


def graph_tokens(d) -> int:
    """The most tokens a step of `d` replays from a CUDA graph (0: none): vLLM's largest capture size, 512, or
    rules.max_capture_sm100 on Blackwell, at most twice max_num_seqs, 1,024 for gpt-oss (config/compilation.py,
    GptOssForCausalLMConfig; piecewise graphs take mixed steps too), nothing with --enforce-eager; SGLang's
    cuda_graph_max_bs (decode batches only: a prefill batch runs eagerly; kvplan gives a prefill step of no more
    tokens the graph's price too)."""
    if getattr(d, "enforce_eager", False):
        return 0
    gpu = d.gpu
    if d.engine == "sglang":
        from kvplan.rules.sglang import default_chunked_prefill_and_decode_bs

        return default_chunked_prefill_and_decode_bs((gpu.smi_total_mib or gpu.memory_total_gib * 1024) / 1024,
                                                     d.tp)[1]
    from kvplan.sizing.vllm_cudagraphs import max_capture_size
    from kvplan.specs.gpu import cc_family

    rules = getattr(d, "rules", None)
    return max_capture_size(d.model, cc_family(gpu) if rules is not None else None, rules, d.max_num_seqs)


# ----------------------------------------------------------------------------------------------------------------
# The work of a step, and its time


@dataclass
class StepTime:
    """Seconds of one step on one rank, by kernel family."""

    gemm_s: float = 0.0
    moe_s: float = 0.0
    attention_s: float = 0.0
    allreduce_s: float = 0.0
    small_kernels_s: float = 0.0
    engine_s: float = 0.0
    estimated: list = field(default_factory=list)  # families priced without a measured fit

    @property
    def total_s(self) -> float:
        return (self.gemm_s + self.moe_s + self.attention_s + self.allreduce_s + self.small_kernels_s
                + self.engine_s)

    def to_dict(self) -> dict:
        return {"total_ms": self.total_s * 1e3, "gemm_ms": self.gemm_s * 1e3, "moe_ms": self.moe_s * 1e3,
                "attention_ms": self.attention_s * 1e3, "allreduce_ms": self.allreduce_s * 1e3,
                "small_kernels_ms": self.small_kernels_s * 1e3, "engine_ms": self.engine_s * 1e3}


TOKEN_BLOCK = 256  # token counts StepModel.step_seconds prices at once


def _gemm_calls(m: ModelSpec, weight_dtype, tp, profile: StepProfile, estimated_out: list, engine: str = "vllm"):
    """The GEMMs one step runs on a rank, as both engines fuse them (q, k and v one call, gate and up one, and MLA's
    q_a and kv_a projections one: vLLM 0.19 model_executor/models/deepseek_v2.py DeepseekV2MLAAttention's
    fused_qkv_a_proj, SGLang's fused_qkv_a_proj_with_mqa), each on the kernel `engine` runs: (the dense
    calls, the experts' calls, the experts' format, the model part of each dense call), each call (fit, matrix
    bytes, n, k, count, activation bytes).
    The weight formats priced without a measured fit are added to `estimated_out`."""
    fmt, scope = format_and_scope(m, weight_dtype)
    mixed = weight_dtype is None  # a checkpoint's own mixed formats (quantized LM head, FP8 attention, ...)
    dense, experts = [], []
    merged: dict = {}
    expert_format = None
    for t in model_tensors(m):
        lm_head = t.part == "lm_head" or (t.part == "embed" and m.tie_word_embeddings)  # a tied head: the table
        if not (t.is_matrix or lm_head) or (t.part in ("embed", "extra") and not lm_head):
            continue
        n, k = t.shape_per_rank(tp)
        own = _own_format(m, t) if mixed else None
        held = own.name if own else fmt.name if _quantized(m, t, scope) else m.dtype
        fit, estimated = gemm_fit(profile, held, engine)
        if estimated and f"{held} GEMMs" not in estimated_out:
            estimated_out.append(f"{held} GEMMs")
        act = 1.0 if gemm_family(held)[0] in ("fp8", "fp8_block", "nvfp4") else 2.0
        mb = tensor_bytes_per_rank(m, replace(t, count=1), tp, fmt, scope, mixed)  # what weight_bytes holds
        if t.part == "expert":
            expert_format = held
        # q, k and v run as one GEMM (vLLM's QKVParallelLinear), gate and up as one (MergedColumnParallelLinear)
        leaf = t.name.rsplit(".", 1)[-1]
        group = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up",
                 "up_proj": "gate_up", "q_a_proj": "qkv_a", "kv_a_proj_with_mqa": "qkv_a"}.get(leaf, leaf)
        key = (t.name.rsplit(".", 1)[0], group, k, 1 if lm_head else t.count, t.part)
        if key in merged:
            f0, mb0, n0, k0, c0, a0 = merged[key]
            merged[key] = (f0, mb0 + mb, n0 + n, k0, c0, a0)
        else:
            merged[key] = (fit, float(mb), n, k, key[3], act)
    parts = []  # the part of each dense call, in order
    for key, row in merged.items():
        (experts if key[4] == "expert" else dense).append(row)
        if key[4] != "expert":
            parts.append("lm_head" if key[3] == 1 and key[4] == "embed" else key[4])
    return dense, experts, expert_format, parts


def _layer_classes(layers) -> tuple:
    """The cache layers grouped as the step prices them: one layer of each attention shape, each layer's shape in
    layer order, and the layers a prompt's tokens attend through by (window, tokens per entry, count)."""
    shapes: dict = {}
    order = []
    for lay in layers:
        key = (lay.kind, lay.format, lay.window, lay.bytes_per_token, lay.entry_bytes, lay.entry_tokens,
               lay.residual_tokens, lay.residual_extra_bytes_per_token, lay.fixed_bytes)
        order.append(shapes.setdefault(key, (len(shapes), lay))[0])
    # the layers a prompt's tokens attend through, by window and tokens per stored entry: (window, entry, count)
    classes: dict = {}
    for lay in layers:
        if lay.kind != "state" and lay.format not in ("indexer", "compressor"):
            classes[(lay.window, lay.entry_tokens)] = classes.get((lay.window, lay.entry_tokens), 0) + 1
    return [lay for _, lay in shapes.values()], order, tuple((w, e, c) for (w, e), c in classes.items())


class StepModel:
    """Prices the steps of one deployment: built once (the tensor list, the layer caches), then asked for any batch,
    context and prefill chunk."""

    def __init__(self, d, profile: StepProfile):
        self.profile = profile
        self._remembered: dict = {}  # step_seconds' parts
        m: ModelSpec = d.model
        self.model = m
        lay = d.parallel
        self.layout = lay
        tp = lay.attn_tp  # the attention's degree: its heads and the KV heads a rank reads
        self.tp = tp
        self.estimated: list[str] = []
        # (fit, matrix bytes, n, k, count, activation bytes) per GEMM call kind, the experts' format, the parts
        self.dense, self.experts, expert_format, parts = _gemm_calls(m, d.weight_dtype, lay, profile, self.estimated,
                                                                     d.engine)
        # the tokens each call multiplies, per token of this rank: a part split over more GPUs than the attention
        # (SGLang's dense layers and LM head over the whole TP group under data-parallel attention) runs on the
        # tokens of every attention group gathered
        self.dense_scale = [lay.tp_for(p) / tp if p in ("mlp", "shared_expert", "embed", "lm_head") else 1.0
                            for p in parts]
        # shared experts the engine runs inside the routed experts' fused MoE instead of as GEMMs of their own
        self.fused_shared = fused_shared_experts(m, lay, d.a2a_backend) if d.engine == "sglang" else 0
        if self.fused_shared:
            kept = [i for i, p in enumerate(parts) if p != "shared_expert"]
            self.dense = [self.dense[i] for i in kept]
            self.dense_scale = [self.dense_scale[i] for i in kept]
        self.moe_scale = lay.moe_group / tp  # the MoE layers see every attention group's tokens
        self.gathers = self.moe_scale != 1 or any(g != 1 for g in self.dense_scale)
        self.a2a = d.a2a_backend
        self.moe_fit = None
        if self.experts and m.moe:
            key = moe_family(expert_format)
            self.moe_fit = profile.moe.get(key) or profile.moe.get("bfloat16")
            if key not in profile.moe:
                self.estimated.append(f"{expert_format} MoE")
        dfit, _ = gemm_fit(profile, "bf16")
        self.layers = kv_layers(m, d.kv, tp, d.skip)
        self._attention_shapes, self._attention_order, self._prefill_classes = _layer_classes(self.layers)
        fam = d.kv.family
        self.attn_family = "float" if d.kv.is_model_dtype or d.kv.name in ("bfloat16", "float16") else fam
        if m.compressed is not None:  # DeepSeek-V4: one fp8_ds_mla cache whatever the dtype named, read as it is
            self.attn_family = fam = "float"
        attn = m.base_attention  # the shape the decode kernel is fitted by, and the FLOPs per cached token
        head_dim = attn.kernel_head_dim
        self.kv_heads = attn.kv_heads_per_rank(tp)
        self.q_heads = max(1, m.num_heads // tp) if m.num_heads else 1
        # the query heads each KV head serves on this rank (1: multi-head attention) choose the kernel's tiles
        group = max(1, round(self.q_heads / self.kv_heads))
        self.attn_fit, self.dequant_s, est = attention_fit(profile, self.attn_family, head_dim, group, self.kv_heads)
        mla_fit = mla_attention_fit(profile, m, self.attn_family) if d.engine == "vllm" else None
        if mla_fit is not None:  # the latent attention module's own fit, beside the projections priced as GEMMs
            self.attn_fit, self.dequant_s = mla_fit, 0.0
        elif est:
            self.estimated.append(f"{d.kv.name} decode attention")
        elif m.mla:  # no MLA kernel fit: the GQA kernel's on the latent's bytes, one KV head
            self.estimated.append("MLA decode attention")
        elif m.compressed is not None:  # no sparse-MLA kernel fit: the GQA kernel's on the entries' bytes
            self.estimated.append("DeepSeek-V4 sparse decode attention")
        # vLLM quantizes the query to fp8 in its own kernel before an fp8 cache's attention call
        # (model_executor/layers/attention/attention.py: Attention.query_quant, FlashAttention and FlashInfer)
        self.query_quant = fam == "fp8" and not m.mla
        self.ar_fit = allreduce_fit(profile, tp)
        # the engines' custom all-reduce inside a CUDA graph, for a step the graphs replay (kernel timings of vLLM's
        # custom all-reduce replayed in a graph: no launch or staging copy, about 5 us on 8 Hopper GPUs where NCCL's
        # call costs 18); NCCL's fit for larger messages and eager steps
        self.graph_ar = (profile.graph_allreduce.get(tp) if tp in CUSTOM_ALLREDUCE_WORLDS and d.gpu is not None
                         else None)
        self.graph_tokens = graph_tokens(d) if self.graph_ar else 0
        # a prompt's attention FLOPs per (query head, key): MLA runs it unabsorbed, as multi-head attention (vLLM
        # 0.19 MLACommonImpl._forward_prefill, SGLang's MHA path for extends)
        self.prefill_flops = attn.prefill_flops_per_token_head
        self.decode_flops = attn.flops_per_token_head
        # MLA's prompt attention runs on the up-projected keys and values in the model's dtype whatever the cache
        # stores (vLLM 0.19 MLACommonMetadataBuilder.determine_prefill_query_data_type: fp8 only with
        # use_prefill_query_quantization, off by default; the cached context is dequantized as it is gathered)
        self.prefill_fit = prefill_attention_fit(profile, "bfloat16" if m.mla else self.attn_family,
                                                 self.prefill_flops)
        self.eplb = d.eplb
        # the all-to-all's sustained NVLink rate per GPU: 60% of one direction of the GPU's NVLink (DeepEP's
        # low-latency kernels reach 230-270 GB/s on an H200 of 450 GB/s each way: AIConfigurator's DeepEP tables)
        self.gpu_nvlink = (0.6 * d.gpu.nvlink_gbps / 2 * 1e9) if d.gpu is not None and d.gpu.nvlink_gbps else None
        self.small_fit = dfit
        self.moe_layers = sum(1 for x in m.mlp_kinds if x == "moe") if m.moe else 0
        # a norm of q and k across all heads: two passes over q and k of their own (the sums or the gathered heads,
        # then the scaling), where a per-head norm rides with the rotary kernel
        self.full_norm_kernels = QK_NORM_FULL_KERNELS * len(m.attention_layers) if m.qk_norm_full else 0
        self.elem_bytes = DTYPE_BYTES[m.dtype]
        self.bf16_bytes_per_token = format_bytes_per_token(m, kv_format("auto"), tp)

    # -- pieces ----------------------------------------------------------------------------------------------

    def _weights(self, tokens, xp=SCALAR, decoding=None) -> tuple:
        """The GEMMs' and MoE layers' seconds for a step of `tokens` on this rank, `decoding` of them decode tokens
        (default: all). A part that spans several attention groups also runs the other groups' decode tokens,
        alike this rank's; their prompt chunks are the lockstep's wait (kvplan.plan.serving), not this step's."""
        bw = self.profile.peak_bandwidth_bytes_per_s
        if decoding is None:
            decoding = tokens

        def seen(scale):
            return tokens + decoding * (scale - 1) if scale != 1 else tokens
        dense = sum(c * gemm_call_seconds(f, bw, seen(g), n, k, mb, a, xp)
                    for (f, mb, n, k, c, a), g in zip(self.dense, self.dense_scale))
        moe = 0.0
        m = self.model
        if self.experts and m.moe:
            e, kk = m.moe.num_experts, m.moe.experts_per_token
            lay = self.layout
            tokens = seen(self.moe_scale)
            if lay.ep > 1:  # whole experts on this rank: the pairs routed to its share, the busiest rank's
                local = lay.local_experts(e)
                pairs = tokens * kk * local / e * routing_imbalance(tokens * kk * local / e, lay.ep, self.eplb, xp)
                # the experts this rank holds that its tokens touch: the layer's count under the router's skew,
                # this rank's share of it, at most what the busiest rank's pairs can touch
                touched = xp.minimum(experts_touched(e, kk, tokens) * local / e,
                                     local * (1.0 - (1.0 - 1.0 / local) ** pairs))
            else:  # and the shared experts folded in, every token's
                pairs = tokens * (kk + self.fused_shared)
                touched = experts_touched(e, kk, tokens) + self.fused_shared
            layers = self.moe_layers
            per_layer_bytes = sum(mb * c for _, mb, _, _, c, _ in self.experts) / max(layers, 1) / e * touched
            flops = sum(2.0 * n * k * c for _, _, n, k, c, _ in self.experts) / max(layers, 1) / e * pairs
            f = self.moe_fit
            if f is not None:
                t = per_layer_bytes / (f.eta * bw)
                if f.mu and f.peak_flops:
                    t = xp.maximum(t, flops / (f.mu * f.peak_flops))
                moe = layers * (f.t0_s + f.per_expert_s * touched + t)
            else:  # each touched expert's matrices as GEMMs
                moe = sum(c / e * touched * gemm_call_seconds(f2, bw, pairs / touched, n, k, mb, a, xp)
                          for f2, mb, n, k, c, a in self.experts)
        return dense, moe

    def _attention(self, batch, context, xp=SCALAR):
        # layers that differ only by their index take the same time: priced once, added per layer in layer order
        times = [self._layer_attention(lay, batch, context, xp) for lay in self._attention_shapes]
        total = 0.0
        for i in self._attention_order:
            total += times[i]
        return total

    def _layer_attention(self, lay, batch, context, xp=SCALAR):
        """One cache layer's decode attention: `batch` sequences of `context` cached tokens."""
        bw = self.profile.peak_bandwidth_bytes_per_s
        f = self.attn_fit
        if lay.kind == "state":  # read and write the state once per sequence
            return f.t0_s + batch * 2 * lay.fixed_bytes / (f.eta * bw)
        if lay.format == "compressor":  # a compressor's unfinished entries: read and written once a step
            return batch * 2 * lay.fixed_bytes / (f.eta * bw)
        n = context if lay.window is None else xp.minimum(context, lay.window)
        # a cache of its own layout (DeepSeek-V4) holds entry_bytes per entry_tokens tokens, windowed or not
        byt = batch * n * (lay.bytes_per_token or lay.entry_bytes / lay.entry_tokens)
        if lay.residual_tokens:
            byt = byt + batch * xp.minimum(n, lay.residual_tokens) * lay.residual_extra_bytes_per_token
        heads = self.kv_heads if lay.format != "indexer" else 1
        t = attention_call_seconds(f, bw, batch, heads, self.q_heads, n, byt, xp)
        if self.query_quant and lay.format != "indexer":
            t += self.small_fit.t0_s
        if self.dequant_s and lay.format != "indexer":
            # the cached K and V values dequantized, counted as 16-bit elements (fp8's cost is per element)
            t += batch * n * self.bf16_bytes_per_token / 2 * self.dequant_s
        return t

    def _allreduce(self, tokens, xp=SCALAR):
        """The step's collectives: the layers' (_layer_collectives) and, where q and k are normed across all heads
        under TP, that norm's exchange (_qk_norm_exchange)."""
        return self._layer_collectives(tokens, xp) + self._qk_norm_exchange(tokens, xp)

    def _qk_norm_exchange(self, tokens, xp=SCALAR):
        """A norm of q and k across all their heads needs every attention rank's heads: MiniMax-M2 all-reduces each
        token's sums of squares of q and k (two fp32 values: vLLM 0.19 minimax_m2.py MiniMaxText01RMSNormTP.forward_qk,
        SGLang's MiniMaxM2RMSNormTP), OLMo 2 all-gathers q and k themselves (olmo2.py _apply_qk_norm), an all-gather
        moving half the bytes an all-reduce of its output does; one exchange per attention layer, in a CUDA graph
        where the step replays one."""
        m, tp = self.model, self.layout.attn_tp
        if tp <= 1 or not m.qk_norm_full:
            return 0.0
        if m.qk_norm_sums:
            calls, nbytes = 1, tokens * 2 * 4
        else:
            a = m.base_attention
            calls, nbytes = 2, tokens * (a.heads + a.kv_heads) * a.head_dim * self.elem_bytes / 4
        f = allreduce_fit(self.profile, min(tp, self.layout.domain))
        if f is None:
            return 0.0
        return calls * len(m.attention_layers) * self._replayed(allreduce_seconds(f, nbytes, xp), tokens, nbytes, xp)

    def _replayed(self, t, tokens, nbytes, xp=SCALAR):
        """An all-reduce of `nbytes` over the attention group that NCCL takes `t` for: in a step of `tokens` the
        CUDA graphs replay, the graphs' custom all-reduce where the message is within its size and it is faster."""
        if not self.graph_tokens:
            return t
        fit, most = self.graph_ar
        graphed = (tokens <= self.graph_tokens) & (nbytes < most)
        return xp.where(graphed, xp.minimum(t, allreduce_seconds(fit, nbytes, xp)), t)

    def _layer_collectives(self, tokens, xp=SCALAR):
        """Under plain TP within one NVLink domain, two all-reduces per layer (after the attention and after the
        MLP); otherwise each part's own (kvplan.specs.parallel.Parallel): the attention's all-reduce over its group,
        the dense layers' over theirs (a gather and a scatter of every attention group's tokens where they span more
        GPUs), and the MoE layers' over the GPUs they span, or DeepEP's dispatch and combine."""
        lay, m = self.layout, self.model
        row = m.hidden_size * self.elem_bytes  # one token's hidden state
        if lay.tp_only and lay.attn_tp <= lay.domain:
            if self.ar_fit is None:
                return 0.0
            return 2 * m.num_layers * self._replayed(allreduce_seconds(self.ar_fit, tokens * row, xp), tokens,
                                                     tokens * row, xp)
        kinds = m.mlp_kinds
        n_moe = sum(1 for x in kinds if x == "moe")
        n_dense = sum(1 for x in kinds if x == "dense")
        t = m.num_layers * self._collective(lay.attn_tp, tokens * row, xp)
        dense_g = lay.dense_tp
        t = t + n_dense * self._collective(dense_g, tokens * dense_g / lay.attn_tp * row, xp)
        if n_moe:
            if self.a2a in ("deepep_low_latency", "deepep_high_throughput", "deepep"):
                t = t + n_moe * self._all_to_all(tokens)
            else:
                g = lay.moe_group
                t = t + n_moe * self._collective(g, tokens * g / lay.attn_tp * row, xp)
        return t

    def _collective(self, ranks: int, nbytes, xp=SCALAR):
        """One all-reduce (or an all-gather and a reduce-scatter of the same bytes) over `ranks` GPUs: the NVLink
        fit for the group's size; across NVLink domains, the network's share on top (each node's GPUs carry their
        slice over their own NICs: 2 (N - 1) / N of the bytes / GPUs per node, per GPU) and its latency."""
        if ranks <= 1:
            return 0.0
        lay = self.layout
        f = allreduce_fit(self.profile, min(ranks, lay.domain))
        t = 0.0 if f is None else allreduce_seconds(f, nbytes, xp)
        nodes = lay.domains(ranks)
        if nodes > 1:
            per_node = min(ranks, lay.domain)
            t = t + 2 * NET_LATENCY_S + 2 * (nodes - 1) / nodes * nbytes / per_node / NET_BYTES_PER_S
        return t

    def _all_to_all(self, tokens):
        """DeepEP's dispatch (fp8 values and their scales) and combine (bf16) of one MoE layer: each of this rank's
        tokens goes to its top-k experts, the share on other GPUs over NVLink, the share on other nodes over the
        network, after a fixed cost per call."""
        lay, m = self.layout, self.model
        kk, h = m.moe.experts_per_token, m.hidden_size
        remote = (lay.ep - 1) / lay.ep
        nodes = lay.domains(lay.moe_group)
        off_node = (nodes - 1) / nodes
        nvlink = NVLINK_A2A_BYTES_PER_S if self.gpu_nvlink is None else self.gpu_nvlink
        t0 = DEEPEP_LL_CALL_S if self.a2a != "deepep_high_throughput" else DEEPEP_HT_CALL_S
        out = 0.0
        for per_value in (1 + 4 / 128, 2):  # dispatch in fp8 with a scale per 128, combine in bf16
            nbytes = tokens * kk * (h * per_value + 16)
            out = out + t0 + nbytes * (remote - off_node) / nvlink + nbytes * off_node / NET_BYTES_PER_S
        return out

    def _prefill_attention(self, tokens, context, xp=SCALAR):
        """Attention of `tokens` new tokens that see `context` earlier tokens each on average: the profile's
        prompt-attention fit (prefill_attention_seconds) per attention layer, a compressed layer's entries counted
        as its keys; without one, compute-bound: QK^T and PV at the bf16 GEMM's achieved FLOP/s."""
        pf = self.prefill_fit
        if pf is not None:
            if xp is SCALAR and not tokens:
                return 0.0
            total = 0.0
            for window, entry_tokens, count in self._prefill_classes:
                n = context if window is None else xp.minimum(context, window)
                total = total + count * prefill_attention_seconds(pf, tokens, self.q_heads, n / entry_tokens,
                                                                  self.prefill_flops, xp)
            return total if xp is SCALAR else xp.where(tokens > 0, total, 0.0)
        f = self.small_fit
        if not (f.mu and f.peak_flops):
            return 0.0
        per = self.decode_flops * self.q_heads
        total = 0.0
        for window, entry_tokens, count in self._prefill_classes:
            n = context if window is None else xp.minimum(context, window)
            total = total + tokens * n / entry_tokens * per * count  # a compressed layer's entries
        return total / (f.mu * f.peak_flops)

    # -- the step ------------------------------------------------------------------------------------------------

    @property
    def fitted_tokens(self) -> Optional[int]:
        """The most tokens a step that the timings behind its GEMM fits reach (the largest range of m they were
        fitted over), the fewest over its GEMMs; None where the fits keep no ranges (a measured GEMV fit)."""
        reach = [max(b["max_tokens"] for b in f.buckets) for f, *_ in self.dense if f.buckets]
        return min(reach) if reach else None

    def step(self, batch, context, prefill_tokens=0.0, prefill_context=0.0, xp=SCALAR) -> StepTime:
        """One step with `batch` decoding sequences of `context` cached tokens each, plus `prefill_tokens` new
        prompt tokens (a chunked-prefill chunk) that attend to `prefill_context` tokens each on average. Numbers, or
        numpy arrays with xp=numpy (a sweep's grid)."""
        tokens = batch + prefill_tokens
        s = StepTime(estimated=list(self.estimated))
        s.gemm_s, s.moe_s = self._weights(tokens, xp, batch)
        s.attention_s = (self._attention(batch, context, xp)
                         + self._prefill_attention(prefill_tokens, prefill_context, xp))
        s.allreduce_s = self._allreduce(tokens, xp)
        s.small_kernels_s = self._small_kernels(tokens)
        s.engine_s = self._engine(batch)
        return s

    def _small_kernels(self, tokens):
        """Norms, activations, rotary and the like: a few small kernels per layer, each streaming the activations."""
        m = self.model
        bw = self.profile.peak_bandwidth_bytes_per_s
        small = self.small_fit.t0_s + 6 * tokens * m.hidden_size * self.elem_bytes / (self.small_fit.eta * bw)
        return (SMALL_KERNELS_PER_LAYER * m.num_layers * small
                + (SMALL_KERNELS_PER_MOE_LAYER * self.moe_layers + self.full_norm_kernels) * self.small_fit.t0_s)

    def _engine(self, batch):
        """The host's gap between steps and the sampler's kernels."""
        bw = self.profile.peak_bandwidth_bytes_per_s
        sampler_bytes = 4 * batch * self.model.vocab_size * 4  # fp32 logits read by ~4 passes (penalties, top-k/p,
        # softmax, sample)
        return HOST_GAP_S + SAMPLER_KERNELS * self.small_fit.t0_s + sampler_bytes / (self.small_fit.eta * bw)

    def step_seconds(self, batch: float, context: float, prefill_tokens: float = 0.0,
                     prefill_context: float = 0.0) -> float:
        """step(...).total_s for plain numbers, with the parts a simulated benchmark asks for again and again
        remembered: those of the step's tokens (whole token counts priced TOKEN_BLOCK at a time with numpy),
        those of its decode batch and context."""
        tokens = batch + prefill_tokens
        if self.gathers and prefill_tokens:  # the other groups' decode tokens join this rank's chunk
            by_mix = self._remembered.setdefault("mixed", {})
            key = (batch, prefill_tokens)
            w = by_mix.get(key)
            if w is None:
                w = by_mix[key] = (*self._weights(tokens, decoding=batch), self._allreduce(tokens),
                                   self._small_kernels(tokens))
            gemm, moe, allreduce, small = w
        elif float(tokens).is_integer():
            i = int(tokens)
            blocks = self._remembered.setdefault("tokens", {})
            block = blocks.get(i // TOKEN_BLOCK)
            if block is None:
                import numpy as np

                start = i // TOKEN_BLOCK * TOKEN_BLOCK
                n = np.arange(start, start + TOKEN_BLOCK, dtype=np.float64)
                block = blocks[i // TOKEN_BLOCK] = tuple(
                    np.broadcast_to(np.asarray(x, dtype=np.float64), n.shape).tolist()
                    for x in (*self._weights(n, np), self._allreduce(n, np), self._small_kernels(n)))
            j = i % TOKEN_BLOCK
            gemm, moe, allreduce, small = block[0][j], block[1][j], block[2][j], block[3][j]
        else:  # a pipeline stage's share of the tokens
            gemm, moe = self._weights(tokens)
            allreduce, small = self._allreduce(tokens), self._small_kernels(tokens)
        by_decode = self._remembered.setdefault("decode", {})
        a = by_decode.get((batch, context))
        if a is None:
            a = by_decode[(batch, context)] = (self._attention(batch, context), self._engine(batch))
        attention = a[0] + self._prefill_attention(prefill_tokens, prefill_context)
        return gemm + moe + attention + allreduce + small + a[1]


# How many standard deviations of a rank's routed pairs above their mean the rank that sets an EP step's pace
# carries. A rank's count is about binomial; independent counts would put the largest of 8 at sqrt(2 ln 8) = 2.0,
# but routers spread a token's top-k over distinct experts and groups, and the timings of vLLM's fused MoE with its
# experts spread 8 ways against split 8 ways, under a power-law token distribution (AIConfigurator's
# moe_perf tables, H200, DeepSeek-V3's shapes, 1 to 1,024 tokens), fit 0.7 best.
ROUTING_SD = 0.7


def routing_imbalance(pairs, ranks: int, balanced: bool = False, xp=SCALAR):
    """How much more than its share the expert-parallel rank that sets the step's pace receives when `pairs`
    token-expert pairs are routed over `ranks` ranks (ROUTING_SD standard deviations of its binomial count above
    the mean); 1 under EPLB, which places replicas so that the load evens out."""
    if balanced or ranks <= 1:
        return 1.0
    mean = xp.maximum(pairs / ranks, 1e-12)
    return 1.0 + ROUTING_SD * xp.sqrt(mean * (1 - 1 / ranks)) / mean


def mla_attention_fit(profile: StepProfile, m: ModelSpec, family: str):
    """The profile's fit of MLA's decode attention for a dense-MLA model's cache family ("float": the model dtype's,
    "fp8"), or None: a sparse MLA (DeepSeek-V3.2's indexer) or a profile without one. The fit is of vLLM's MLA
    module (the AIConfigurator tables' mla_generation_module: DeepSeek-V3's shapes, 1 to 128 heads per rank) less
    its four projections as the GEMM fits price them, so it holds the rope, the latent's norms, the cache write and
    vLLM's latent attention kernel. vLLM's alone: SGLang runs MLA on backends of its own (trtllm_mla on Blackwell,
    whose measured DeepSeek runs on B200 this module's fixed cost of about 50 us a layer over-prices by 20-30%), so
    its deployments keep the GQA kernel's fit on the latent's bytes."""
    if m.mla is None or m.sparse_mla or m.compressed is not None:
        return None
    return profile.mla.get("fp8" if family == "fp8" else "bfloat16")


def has_profile(d) -> bool:
    """Whether a profile prices this deployment's steps: a calibration, or the bundled fits for its GPU."""
    return d.gpu is not None and (d.calibration is not None or bundled_profile(d.gpu) is not None)


def profile_for(d) -> StepProfile:
    """The profile a resolved deployment's steps are priced with: the user's calibration over the bundled fits for
    its GPU. A GPU with neither is refused."""
    if d.gpu is None:
        raise KvplanError("step times are a GPU's: give the deployment a GPU (gpu=load_gpu('h100'); --gpu on the "
                          "command line)")
    base = bundled_profile(d.gpu)
    if d.calibration is not None:
        return with_calibration(base, d.calibration, d.calibration_source or "calibration profile", d.gpu)
    if base is None:
        known = ", ".join(bundled_gpus())
        raise KvplanError(f"no step-time profile for {d.gpu.name}: kvplan bundles fits for {known}; run `kvplan measure` "
                          f"on the GPU and pass --calibration, or choose one of those with --gpu")
    return base


def step_model(d) -> StepModel:
    """The step model of a resolved deployment, with the profile it says it uses (profile_for)."""
    return StepModel(d, profile_for(d))
