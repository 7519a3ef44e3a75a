"""Model and GPU specs: immutable pydantic models, loaded from the bundled YAML catalogs, a YAML path, or a
Hugging Face config.json.

A model spec holds the architecture only; everything derived from it (parameter count, weight bytes, KV bytes)
lives in `weights` and `engine`.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Literal, Optional, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvplan.errors import HubUnavailable, KvplanError, UnmodelledWeights, did_you_mean
from kvplan.files import check_finite, read_json, read_yaml, type_name  # noqa: F401  (read_yaml: also imported from here)
from kvplan.memo import per_spec
from kvplan.units import GiB

LayerKind = Literal["full", "sliding", "chunked"]  # the attention layers, whose cache grows with the sequence
MixerKind = Literal["full", "sliding", "chunked", "state", "none"]  # and layers with a fixed state, or no mixer
MlpKind = Literal["dense", "moe", "none"]
ATTENTION_KINDS = ("full", "sliding", "chunked")


class _Frozen(BaseModel):
    # Validators are built on first use, so a command pays only for the spec kinds it loads.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class AttentionLayout(_Frozen):
    """Which attention each layer uses. `pattern` repeats over the layers: ["sliding", "full"] alternates starting
    with a sliding layer; ["full"] is a plain decoder."""

    pattern: tuple[LayerKind, ...] = ("full",)
    sliding_window: Optional[int] = Field(None, gt=0, description="tokens a sliding layer attends to")
    chunk_size: Optional[int] = Field(None, gt=0, description="chunk of a chunked-local layer")

    @model_validator(mode="after")
    def _sizes_present(self) -> "AttentionLayout":
        if not self.pattern:  # every layer takes its kind from the pattern
            raise ValueError("the pattern is empty; give at least one layer kind: full, sliding or chunked")
        if "sliding" in self.pattern and self.sliding_window is None:
            raise ValueError("a 'sliding' layer needs sliding_window")
        if "chunked" in self.pattern and self.chunk_size is None:
            raise ValueError("a 'chunked' layer needs chunk_size")
        return self


class MLASpec(_Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3): the cache holds one latent of kv_lora_rank + qk_rope_head_dim
    per token per layer, shared by all heads."""

    kv_lora_rank: int = Field(gt=0)
    q_lora_rank: Optional[int] = Field(None, gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)
    # DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): a lightning indexer scores every cached token with keys of
    # its own (cached in fp8 with a 4-byte scale per 128) and the attention reads only the index_topk best
    index_n_heads: Optional[int] = Field(None, gt=0)
    index_head_dim: Optional[int] = Field(None, gt=0)
    index_topk: Optional[int] = Field(None, gt=0)
    output_gate: bool = Field(False, description="a sigmoid gate on the attention output, projected from the hidden "
                              "state (heads x v_head_dim; Kimi-K3's mla_use_output_gate)")

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def indexer_bytes_per_token(self) -> int:
        """The indexer's cache per token per layer (DeepseekV32IndexerCache: uint8 of head_dim + head_dim / 128 x 4)."""
        return 0 if not self.index_head_dim else self.index_head_dim + self.index_head_dim // 128 * 4


class CompressedAttentionSpec(_Frozen):
    """DeepSeek-V4's attention: one shared K=V head of head_dim (the last rope_head_dim of it rotated), queries
    through a q_lora_rank latent, the output through o_groups grouped projections of o_lora_rank. Every layer keeps
    the last sliding_window tokens uncompressed; a layer with compress ratio r > 1 also caches one compressed entry
    per r tokens, made by a compressor that holds its unfinished entries (r, or 2r overlapping for r = 4). The
    ratio-4 layers (compressed sparse attention) carry a lightning indexer with compressed keys of its own and read
    the index_topk entries it picks; the ratio-128 layers (heavily compressed attention) read every entry."""

    head_dim: int = Field(gt=0)
    rope_head_dim: int = Field(gt=0)
    q_lora_rank: int = Field(gt=0)
    o_lora_rank: int = Field(gt=0)
    o_groups: int = Field(gt=0)
    sliding_window: int = Field(gt=0)
    compress_ratios: tuple[int, ...] = Field(description="per layer: tokens per compressed entry; 1: the sliding "
                                             "window alone")
    index_n_heads: int = Field(gt=0)
    index_head_dim: int = Field(gt=0)
    index_topk: int = Field(gt=0)
    hc_mult: int = Field(1, gt=0, description="hyper-connections: the residual stream is hc_mult copies wide, mixed "
                         "before and after each block")

    @model_validator(mode="after")
    def _ratios(self) -> "CompressedAttentionSpec":
        bad = sorted({r for r in self.compress_ratios if r not in (1, 4, 128)})
        if bad:
            raise ValueError(f"compress ratio {bad[0]}: vLLM's compressor takes 4 or 128 (1: no compression)")
        return self

    def coff(self, ratio: int) -> int:
        """Entries a compressor builds at once: 2 overlapping for ratio 4, else 1."""
        return 2 if ratio == 4 else 1


class MoESpec(_Frozen):
    num_experts: int = Field(gt=0)
    experts_per_token: int = Field(gt=0)
    expert_intermediate_size: int = Field(gt=0)
    shared_experts: int = Field(0, ge=0)
    shared_expert_intermediate_size: Optional[int] = Field(
        None, gt=0, description="per shared expert; defaults to expert_intermediate_size"
    )
    first_dense_layers: int = Field(0, ge=0, description="leading layers with a dense MLP (first_k_dense_replace)")
    router_bias: bool = False
    expert_bias: bool = Field(False, description="experts' projections carry biases (gpt-oss)")
    score_correction_bias: bool = Field(False, description="router has e_score_correction_bias (noaux_tc routing)")
    latent_size: Optional[int] = Field(None, gt=0, description="routed experts work in a narrower latent space, "
                                       "projected in and out per layer (Nemotron-3's moe_latent_size)")
    shared_expert_gate: bool = Field(False, description="a sigmoid gate (hidden x 1) on the shared expert's output "
                                     "(Qwen2-MoE, Qwen3-Next)")
    latent_norm: bool = Field(False, description="an RMSNorm on the latent the routed experts return (Kimi-K3)")
    router_scales: bool = Field(False, description="a learned scale on the router's input (hidden) and one per "
                                "expert on its weights (Gemma 4)")

    @model_validator(mode="after")
    def _k_le_e(self) -> "MoESpec":
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token exceeds num_experts")
        return self

    @property
    def shared_intermediate(self) -> int:
        return self.shared_expert_intermediate_size or self.expert_intermediate_size


class StateSpec(_Frozen):
    """The mixer of a layer that keeps a fixed state per sequence instead of a growing KV cache: Mamba-2 (heads x
    head_dim channels, n_groups groups of a state_size-wide SSM state), gated delta net (value heads x value head
    dim, n_groups key heads of state_size-wide keys), Mamba (one intermediate_size-wide channel set), lightning
    attention (MiniMax: heads of a head_dim x state_size key-value state, no convolution) or Kimi delta attention
    (KDA: heads of head_dim x state_size, short convolutions on q, k and v)."""

    kind: Literal["mamba2", "gdn", "mamba", "lightning", "kda"]
    num_heads: int = Field(gt=0, description="Mamba-2 heads; gated delta net value heads; lightning and KDA heads")
    head_dim: int = Field(gt=0, description="Mamba-2 head dim; gated delta net value head dim; lightning and KDA "
                          "head dim")
    state_size: int = Field(gt=0, description="SSM state width (d_state); gated delta net key head dim; lightning "
                            "and KDA: the head dim again")
    n_groups: int = Field(1, gt=0, description="Mamba-2 B/C groups; gated delta net key heads")
    conv_kernel: int = Field(4, gt=0)
    intermediate_size: Optional[int] = Field(None, gt=0, description="Mamba: d_inner")
    dt_rank: Optional[int] = Field(None, gt=0, description="Mamba: the rank of the time-step projection")
    conv_bias: bool = True
    proj_bias: bool = False
    dt_bc_norms: bool = Field(False, description="RMSNorms on the time step, B and C (Jamba's Mamba)")
    full_rank_gate: bool = Field(False, description="KDA: the output gate one hidden -> heads x head_dim projection, "
                                 "fused with q, k and v (Kimi-K3), instead of a low-rank pair")
    ssm_cache_dtype: Optional[Literal["bf16", "fp16", "fp32"]] = Field(
        None, description="the SSM/recurrent state's dtype in the cache (mamba_ssm_cache_dtype); None: the model's")

    @property
    def inner(self) -> int:
        """The channels the mixer works on (its conv sees inner plus the B/C or key channels)."""
        if self.kind == "mamba":
            return self.intermediate_size or 0
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        if self.kind == "lightning":
            return 0
        if self.kind == "kda":  # q, k and v each convolved
            return 3 * self.inner
        if self.kind == "mamba":
            return self.inner
        return self.inner + 2 * self.n_groups * self.state_size


class SharedAttentionSpec(_Frozen):
    """Attention blocks whose weights the attention layers share in turn (Zamba2's num_mem_blocks): `blocks` copies
    of an attention layer and its MLP, which read the hidden state concatenated with the input embeddings
    (input_size wide, normed there). Each layer using one keeps its own KV cache, a projection of the block's output
    (hidden x hidden) and LoRA adapters of adapter_rank on the MLP's gate and up (and on q, k and v with
    attention_adapters)."""

    blocks: int = Field(gt=0)
    input_size: int = Field(gt=0)
    adapter_rank: Optional[int] = Field(None, gt=0)
    attention_adapters: bool = False


class VisionSpec(_Frozen):
    """A vision encoder as vLLM's profile run exercises it: one dummy item at the processor's largest size."""

    kind: Literal["siglip", "clip", "pixtral"]
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_layers: int = Field(gt=0, description="encoder layers built (a LLaVA model stops at its deepest feature layer)")
    tokens_per_item: int = Field(gt=0, description="language-model embeddings of one largest item")
    patches_per_item: int = Field(gt=0, description="encoder tokens of one largest item (all its tiles)")
    pixels_per_item: int = Field(gt=0, description="pixel values of one largest item (channels x height x width)")
    keeps_hidden_states: bool = Field(False, description="features from several layers: every hidden state kept")


class KVCacheDeclared(_Frozen):
    """The KV-cache quantization a checkpoint declares (ModelOpt's kv_cache_quant_algo or kv_cache_scheme, an
    llm-compressor kv_cache_scheme): the cache dtype an engine takes for `--kv-cache-dtype auto`."""

    dtype: str = Field(description="the KV format the engines store (a `kvplan formats` name)")
    source: str = Field(description="where the checkpoint says so, e.g. hf_quant_config.json kv_cache_quant_algo FP8")
    engines: tuple[Literal["vllm", "sglang"], ...] = Field(description="the engines that read this declaration")
    forced_in: tuple[Literal["vllm", "sglang"], ...] = Field(
        (), description="engines that store it whatever --kv-cache-dtype says (vLLM for a compressed-tensors scheme)")


class ModelSpec(_Frozen):
    name: str
    aliases: tuple[str, ...] = ()
    hf_repo: Optional[str] = None
    family: str = "llama"
    # upper bounds far beyond any real model, so that a mistyped figure is refused instead of exhausting memory
    num_layers: int = Field(gt=0, le=10_000)
    hidden_size: int = Field(gt=0, le=2**24)
    intermediate_size: int = Field(gt=0, le=2**26, description="dense MLP width")
    num_heads: int = Field(gt=0, le=2**16)
    num_kv_heads: int = Field(gt=0, le=2**16)
    head_dim: Optional[int] = Field(None, gt=0, le=2**16, description="explicit; never derived from hidden_size/num_heads")
    vocab_size: int = Field(gt=0, le=2**30)
    tie_word_embeddings: bool
    max_position_embeddings: int = Field(gt=0, le=2**40)
    dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="dtype of unquantized tensors and of 'auto' KV")
    weight_dtype: str = Field("bf16", description="checkpoint format of the quantized tensors (weight catalog name)")
    weight_scope: Literal["linear", "experts", "mlp"] = Field(
        "linear", description="which tensors weight_dtype covers: every decoder linear layer, MoE experts only, or "
        "the MLPs and experts (attention left in the model dtype)"
    )
    attention_weight_dtype: Optional[str] = Field(
        None, description="with weight_scope 'mlp': the checkpoint format of the attention and state-mixer linear "
        "layers (a ModelOpt MIXED_PRECISION checkpoint's FP8 attention); None: the model dtype")
    shared_expert_weight_dtype: Optional[str] = Field(None, description="the shared experts' checkpoint format, where "
                                                      "it differs from the routed experts' (DeepSeek-V4's fp8 beside "
                                                      "FP4 experts)")
    lm_head_weight_dtype: Optional[str] = Field(None, description="the LM head's checkpoint format, where it is "
                                                "quantized (ModelOpt MIXED_PRECISION)")
    declared_params: Optional[int] = Field(None, gt=0)
    checkpoint_params: Optional[int] = Field(None, gt=0, description="elements in the checkpoint's safetensors "
                                             "headers, where a snapshot folder or the Hub has them")
    checkpoint_dtypes: Optional[dict[str, int]] = Field(None, description="the checkpoint's elements per safetensors "
                                                        "dtype (BF16, F8_E4M3, U8, ...)")
    checkpoint_unavailable: Optional[str] = Field(None, description="why the checkpoint count of a snapshot "
                                                  "folder or a Hugging Face id could not be read")
    attention: AttentionLayout = AttentionLayout()
    mla: Optional[MLASpec] = None
    compressed: Optional[CompressedAttentionSpec] = None
    moe: Optional[MoESpec] = None
    vision: Optional[VisionSpec] = None
    state: Optional[StateSpec] = None
    shared_attention: Optional[SharedAttentionSpec] = None
    mixers: Optional[tuple[MixerKind, ...]] = Field(
        None, description="each layer's mixer, where layers differ beyond the attention pattern (hybrids)")
    mlps: Optional[tuple[MlpKind, ...]] = Field(
        None, description="each layer's MLP, where it is not one per layer (Nemotron-H's separate blocks)")
    kv_heads_per_layer: Optional[tuple[int, ...]] = Field(
        None, description="each layer's KV heads, where attention layers differ (Gemma 4's global layers, NAS models); "
        "num_kv_heads elsewhere")
    head_dims: Optional[tuple[int, ...]] = Field(
        None, description="each layer's head size, where attention layers differ (Gemma 4's global layers)")
    v_from_k: Optional[tuple[bool, ...]] = Field(
        None, description="layers whose checkpoint has no v_proj, V being K (Gemma 4's attention_k_eq_v global "
        "layers): vLLM still allocates the V slot and loads K into it, and caches K and V apart")
    indexed: Optional[tuple[bool, ...]] = Field(
        None, description="layers with a sparse-attention indexer of their own, where only some have one (the others "
        "reuse the top-k an earlier indexer chose: index_topk_freq)")
    intermediate_sizes: Optional[tuple[int, ...]] = Field(
        None, description="each layer's dense MLP width, where layers differ (NAS models' ffn_mult)")
    norms: Optional[tuple[int, ...]] = Field(
        None, description="each layer's norms, where layers differ (a NAS block without attention or MLP has none "
        "for it); norms_per_layer elsewhere")
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = Field(False, description="per-head RMSNorm on q and k (weights of head_dim)")
    qk_norm_full: bool = Field(False, description="q and k normed across all their heads (OLMo 2: weights of "
                               "heads x head_dim)")
    mlp_bias: bool = Field(False, description="biases on the dense MLP's projections (GPT-2, GPT-J, phi-2)")
    attention_residuals: bool = Field(False, description="attention residuals (Kimi-K3's attn_res_block_size): "
                                      "before the attention and before the MLP of each layer, and before the final "
                                      "norm, a norm and a 1 x hidden projection weighing the earlier blocks' outputs")
    attn_output_gate: bool = Field(False, description="q_proj also yields a sigmoid gate on the attention output "
                                   "(Qwen3-Next, Qwen3.5): twice the query width")
    lm_head_bias: bool = False
    norms_per_layer: int = Field(2, ge=0)
    norm_bias: bool = Field(False, description="LayerNorm with bias (Falcon) rather than RMSNorm")
    gated_mlp: bool = Field(True, description="SwiGLU-style gate+up+down; False: up+down only")
    attention_sinks: Union[bool, Literal["sliding"]] = Field(
        False, description="one learned sink logit per query head in every attention layer (gpt-oss), or in the "
        "sliding-window layers only ('sliding': MiMo-V2-Flash); no KV storage")
    v_head_dim: Optional[int] = Field(
        None, gt=0, le=2**16, description="V head size where it is smaller than the K head size (MiMo-V2-Flash): "
        "v_proj and o_proj are that wide; vLLM pads V to the K head size in the cache, so the KV figures keep "
        "the K head size for both")
    extra_params: dict[str, int] = Field(
        default_factory=dict, description="held in memory, never read by a decode step (vision tower, projector); "
        "split across tensor-parallel ranks"
    )
    replicated_params: dict[str, int] = Field(
        default_factory=dict, description="like extra_params, but whole on every rank (patch convolutions, norms)"
    )
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    origin: Optional[str] = Field(None, description="how this spec was found, when it stands in for the one named")
    kv_cache_dtype_declared: Optional[KVCacheDeclared] = Field(
        None, description="the KV-cache quantization the checkpoint declares (what `auto` resolves to)")
    vllm_until: Optional[str] = Field(None, description="the last vLLM release that serves this architecture, where "
                                      "a later one removed it")

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSpec":
        if self.mla is None and self.head_dim is None:
            raise ValueError("head_dim is required (it is never assumed to be hidden_size / num_heads)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.moe and self.moe.first_dense_layers > self.num_layers:
            raise ValueError("moe.first_dense_layers exceeds num_layers")
        for name, kinds in (("mixers", self.mixers), ("mlps", self.mlps), ("kv_heads_per_layer", self.kv_heads_per_layer),
                            ("head_dims", self.head_dims), ("v_from_k", self.v_from_k), ("indexed", self.indexed),
                            ("intermediate_sizes", self.intermediate_sizes), ("norms", self.norms)):
            if kinds is not None and len(kinds) != self.num_layers:
                raise ValueError(f"{name} lists {len(kinds)} layers; the model has {self.num_layers}")
        for name, sizes in (("kv_heads_per_layer", self.kv_heads_per_layer), ("head_dims", self.head_dims),
                            ("intermediate_sizes", self.intermediate_sizes)):
            if sizes is not None and any(isinstance(n, bool) or n < 1 for n in sizes):
                raise ValueError(f"{name} holds a size below 1")
        if self.norms is not None and any(n < 0 for n in self.norms):
            raise ValueError("norms holds a negative count")
        for kv in set(self.kv_heads_per_layer or ()):
            if self.num_heads % kv:
                raise ValueError(f"num_heads {self.num_heads} is not a multiple of a layer's {kv} KV heads")
        if self.mixers is not None:
            if "state" in self.mixers and self.state is None:
                raise ValueError("a 'state' layer needs the state mixer described (state: kind, heads, ...)")
            for kind, size in (("sliding", self.attention.sliding_window), ("chunked", self.attention.chunk_size)):
                if kind in self.mixers and size is None:
                    raise ValueError(f"a '{kind}' layer needs attention.{'sliding_window' if kind == 'sliding' else 'chunk_size'}")
        if self.shared_attention is not None and any(
                mlp == "dense" and mixer not in ATTENTION_KINDS for mixer, mlp in zip(self.layer_kinds, self.mlp_kinds)):
            raise ValueError("with shared_attention, only the attention layers (the shared blocks) have a dense MLP")
        if self.compressed is not None and len(self.compressed.compress_ratios) != self.num_layers:
            raise ValueError(f"compressed.compress_ratios lists {len(self.compressed.compress_ratios)} layers; the "
                             f"model has {self.num_layers}")
        if self.mlps is not None and "moe" in self.mlps and self.moe is None:
            raise ValueError("a 'moe' layer needs moe (experts, experts_per_token, ...)")
        return self

    @property
    def is_mla(self) -> bool:
        return self.mla is not None

    @property
    @per_spec
    def layer_kinds(self) -> tuple[MixerKind, ...]:
        if self.mixers is not None:
            return self.mixers
        p = self.attention.pattern
        return tuple(p[i % len(p)] for i in range(self.num_layers))

    @property
    @per_spec
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of the layers whose cache grows with the sequence."""
        return tuple(i for i, k in enumerate(self.layer_kinds) if k in ATTENTION_KINDS)

    @property
    @per_spec
    def state_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == "state")

    @property
    @per_spec
    def mlp_kinds(self) -> tuple[MlpKind, ...]:
        if self.mlps is not None:
            return self.mlps
        first = self.moe.first_dense_layers if self.moe else self.num_layers
        return tuple("dense" if i < first else "moe" for i in range(self.num_layers))

    def layer_kv_heads(self, i: int) -> int:
        """Layer i's KV heads (num_kv_heads unless the layers differ)."""
        return self.kv_heads_per_layer[i] if self.kv_heads_per_layer is not None else self.num_kv_heads

    def layer_head_dim(self, i: int) -> Optional[int]:
        return self.head_dims[i] if self.head_dims is not None else self.head_dim

    def layer_intermediate(self, i: int) -> int:
        """Layer i's dense MLP width."""
        return self.intermediate_sizes[i] if self.intermediate_sizes is not None else self.intermediate_size

    @property
    @per_spec
    def indexer_layers(self) -> tuple[int, ...]:
        """The attention layers holding a sparse-attention indexer (and its key cache)."""
        if self.mla is None or not self.mla.index_head_dim:
            return ()
        return tuple(i for i in self.attention_layers if self.indexed is None or self.indexed[i])

    def layer_norms(self, i: int) -> int:
        return self.norms[i] if self.norms is not None else self.norms_per_layer

    @property
    @per_spec
    def attention_kv_heads(self) -> tuple[int, ...]:
        """The distinct KV head counts of the attention layers."""
        return tuple(sorted({self.layer_kv_heads(i) for i in self.attention_layers})) or (self.num_kv_heads,)

    @property
    def is_hybrid(self) -> bool:
        return len(set(self.layer_kinds)) > 1

    def window_of(self, kind: LayerKind) -> Optional[int]:
        return {"full": None, "sliding": self.attention.sliding_window, "chunked": self.attention.chunk_size}.get(kind)


class GPUSpec(_Frozen):
    name: str
    aliases: tuple[str, ...] = ()
    vendor: Literal["nvidia", "amd", "other"] = "nvidia"
    arch: str
    compute_capability: Optional[str] = None
    smi_name: Optional[str] = None
    memory_gb: float = Field(gt=0, description="marketed capacity")
    smi_total_mib: Optional[int] = Field(None, gt=0, description="total as nvidia-smi (or rocm-smi) prints it")
    cuda_total_gib: Optional[float] = Field(None, gt=0, description="total as cudaMemGetInfo reports it")
    memory_type: Optional[str] = None
    peak_bandwidth_tbps: float = Field(gt=0, description="datasheet peak, 1e12 B/s")
    measured_bandwidth_tbps: Optional[float] = Field(None, gt=0, description="a published stream benchmark")
    dense_tflops: dict[str, float] = Field(default_factory=dict, description="dense tensor-core TFLOP/s per dtype")
    fp8_support: bool = False
    fp4_support: bool = False
    l2_mb: Optional[float] = None
    sm_count: Optional[int] = None
    nvlink_gbps: Optional[float] = None
    nvlink_domain: Optional[int] = Field(None, gt=0, description="GPUs one NVLink domain joins (GB200 NVL72: 72); "
                                         "default 8 with NVLink, else 1")
    pcie_gen: Optional[int] = None
    tdp_w: Optional[float] = None
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    # GPUs lose a little memory to the driver between the nvidia-smi total and what CUDA reports
    # (0.3-0.7 GiB across the GPUs whose both figures are known); used only when CUDA's figure is unknown.
    DRIVER_RESERVE_GIB: ClassVar[float] = 0.5

    @property
    def nvlink_domain_size(self) -> int:
        """GPUs that reach each other over NVLink: an HGX node's 8, a rack-scale system's whole domain, or 1 (PCIe)."""
        return self.nvlink_domain or (8 if self.nvlink_gbps else 1)

    @property
    def memory_total_bytes(self) -> int:
        """Total device memory as vLLM sees it (cudaMemGetInfo), the base of gpu_memory_utilization."""
        return int(round(self.memory_total_gib * GiB))

    @property
    def memory_total_gib(self) -> float:
        if self.cuda_total_gib is not None:
            return self.cuda_total_gib
        if self.smi_total_mib is not None:
            return self.smi_total_mib / 1024 - self.DRIVER_RESERVE_GIB
        return self.memory_gb - self.DRIVER_RESERVE_GIB

    @property
    def memory_source(self) -> str:
        if self.cuda_total_gib is not None:
            return "CUDA total"
        if self.smi_total_mib is not None:
            return "nvidia-smi total - 0.5 GiB (estimate)"
        return "marketed capacity - 0.5 GiB (estimate)"

    @property
    def peak_bandwidth_bytes_per_s(self) -> float:
        return self.peak_bandwidth_tbps * 1e12


# ---------------------------------------------------------------------------------------------------------------
# Loading


def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent


def catalog_dir(kind: Literal["models", "hardware"]) -> Path:
    """The bundled catalog: inside the installed package, or beside it in a source checkout."""
    override = os.environ.get(f"KVPLAN_{kind.upper()}_DIR")
    if override:
        return Path(override)
    bundled = _package_root() / "_bundled" / kind
    if bundled.is_dir():
        return bundled
    return _package_root().parent / kind


def _validation_message(path: Path | str, e: ValidationError, cls) -> str:
    errors = sorted(e.errors(), key=lambda err: err["type"] != "extra_forbidden")  # a typo shows as extra + missing
    err = errors[0]
    field = ".".join(str(p) for p in err["loc"]) or "(top level)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if err["type"] == "extra_forbidden":
        fields = list(cls.model_fields)
        for part in err["loc"][:-1]:  # nested: suggest among the nested model's fields
            sub = cls.model_fields.get(str(part))
            ann = getattr(sub, "annotation", None)
            for cand in getattr(ann, "__args__", (ann,)):
                if isinstance(cand, type) and issubclass(cand, BaseModel):
                    fields, cls = list(cand.model_fields), cand
        return f"{path}: field '{field}' is not a spec field{did_you_mean(str(err['loc'][-1]), fields)}{more}"
    msg = " ".join(err["msg"].removeprefix("Value error, ").split())
    return f"{path}: field '{field}': {msg}{more}"


def _build(cls, data, path):
    if not isinstance(data, dict):
        raise KvplanError(f"{path}: expected a mapping of fields at the top level, found {type_name(data)}")
    check_finite(data, path)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        missing = [".".join(str(p) for p in err["loc"]) for err in e.errors() if err["type"] == "missing"]
        if cls is ModelSpec and data.get("head_dim") is None and data.get("mla") is None and missing:
            missing.append("head_dim")  # checked once the fields are read, so its error would come only later
        if len(missing) > 1 and len(e.errors()) == len(missing) - (missing[-1] == "head_dim"):
            # only fields missing (a typo, extra and missing, is reported as one): every one at once
            raise KvplanError(f"{path}: fields {', '.join(repr(m) for m in missing[:-1])} and {missing[-1]!r} are "
                              f"required") from None
        raise KvplanError(_validation_message(path, e, cls)) from None


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _catalog_files(kind: str) -> list[Path]:
    d = catalog_dir(kind)  # type: ignore[arg-type]
    return sorted(d.glob("*.yaml")) if d.is_dir() else []


@lru_cache(maxsize=None)
def _load_catalog_file(kind: str, path: Path):
    cls = ModelSpec if kind == "models" else GPUSpec
    return _build(cls, _catalog_data(path), path)


# Bump when read_yaml would parse the same text differently, so that no earlier parse is taken from the cache.
_CATALOG_CACHE_VERSION = 1


def _catalog_cache_file(path: Path) -> Optional[Path]:
    """Where a catalog file's parse is kept: KVPLAN_CACHE_DIR, else XDG_CACHE_HOME/kvplan, else ~/.cache/kvplan;
    None when that would be under a home directory that does not exist (kvplan makes no home directory)."""
    base = os.environ.get("KVPLAN_CACHE_DIR")
    if not base:
        root = os.environ.get("XDG_CACHE_HOME")
        if not root:
            home = os.path.expanduser("~")
            if not os.path.isdir(home):
                return None
            root = os.path.join(home, ".cache")
        base = os.path.join(root, "kvplan")
    return Path(base) / "catalog" / f"{path.parent.name}-{path.stem}.marshal"


def _catalog_data(path: Path):
    """A catalog file's YAML, parsed. The parse is a function of the text alone, so it is kept, with the text it
    came from, in kvplan's cache directory: a later run that finds the same text there takes the kept parse and
    never imports PyYAML (a tenth of a planning command's start-up beyond typer's). It is kept with `marshal`, as
    Python keeps its .pyc files: built in, so nothing to import, and it gives back every type YAML builds (dates
    aside, which are not kept) exactly. A cache that cannot be read or written is no cache; a file that does not
    parse is never kept, so its error is read_yaml's every time."""
    import marshal
    import sys

    from kvplan.files import read_text

    tag = (_CATALOG_CACHE_VERSION, tuple(sys.version_info[:2]))
    text = read_text(path, "YAML file")
    cached = _catalog_cache_file(path)
    if cached is None:
        return read_yaml(path)
    try:
        entry = marshal.loads(cached.read_bytes())
        if entry[0] == tag and entry[1] == text:
            return entry[2]
    except (OSError, ValueError, EOFError, TypeError, IndexError, KeyError):
        pass
    data = read_yaml(path)
    try:
        blob = marshal.dumps((tag, text, data))  # ValueError for what marshal cannot keep (a date)
        if read_text(path, "YAML file") == text:  # keep only the text that was parsed
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
            try:
                tmp.write_bytes(blob)
                os.replace(tmp, cached)
            finally:
                if tmp.exists():
                    tmp.unlink()
    except (OSError, ValueError, KvplanError):
        pass
    return data


def catalog_entries(kind: Literal["models", "hardware"]) -> list[tuple[str, ModelSpec | GPUSpec]]:
    """(short name, spec) for every bundled spec; the short name is the file stem, what a user types."""
    return [(p.stem, _load_catalog_file(kind, p)) for p in _catalog_files(kind)]


def load_catalog(kind: Literal["models", "hardware"]) -> list:
    return [spec for _, spec in catalog_entries(kind)]


def _resolve(kind: Literal["models", "hardware"], name: str):
    """A catalog entry by file stem, name or alias (case, dashes and dots ignored). Reads one file when the name
    matches a file stem; scans the aliases otherwise, building only the entries whose text holds the name."""
    import re

    key = _norm(name)
    files = _catalog_files(kind)
    for p in files:
        if _norm(p.stem) == key:
            return _load_catalog_file(kind, p)
    for p in files:
        try:  # the name's letters and digits, in order, lie in the text of any file naming it ([\W_]: not isalnum)
            if key not in re.sub(r"[\W_]+", "", p.read_text(encoding="utf-8", errors="replace").lower()):
                continue
        except OSError:
            pass  # let loading the file say what is wrong with it
        spec = _load_catalog_file(kind, p)
        if key in {_norm(spec.name), *(_norm(a) for a in spec.aliases)}:
            return spec
    entries = load_catalog(kind)
    for spec in entries:
        if key in {_norm(spec.name), *(_norm(a) for a in spec.aliases)}:
            return spec
    names = [p.stem for p in _catalog_files(kind)] + [a for s in entries for a in s.aliases]
    what = "model" if kind == "models" else "GPU"
    listing = "kvplan models" if kind == "models" else "kvplan gpus"
    raise KvplanError(
        f"unknown {what} '{name}'{did_you_mean(name, names)}; `{listing}` lists the catalog, "
        f"or pass a path to a YAML spec{' or a config.json' if kind == 'models' else ''}"
    )


def _looks_like_path(name: str) -> bool:
    """A file name, or a name that is a file or a snapshot folder here: what exists on disk wins over a catalog
    entry of the same name (a snapshot folder named Llama-3.1-8B is that folder's model)."""
    if name.endswith((".yaml", ".yml", ".json")) or os.sep in name or name.startswith("."):
        return True
    try:
        path = Path(name)
        return path.is_file() or (path / "config.json").is_file()
    except (OSError, ValueError):  # a name no file system can hold (NUL, too long)
        return False


def load_model(name_or_path: str, checkpoint: bool = False, unquantized: bool = False) -> ModelSpec:
    """A model by catalog name or alias, a path to a YAML spec, a Hugging Face config.json or snapshot folder, or a
    Hugging Face id (org/name: the local Hugging Face cache, else the Hub with the hub extra, else the catalog
    model of that architecture). With `checkpoint`, a Hugging Face id's checkpoint count comes from its safetensors
    headers on the Hub (or kvplan's cache of them) where its snapshot holds no weights. With `unquantized`, a
    config.json's quantization_config is set aside (the weights' format is given separately: --weight-dtype)."""
    if "/" in name_or_path:  # a Hugging Face id has one (the Hub's module is loaded only for names that might be one)
        from kvplan.specs.hub import looks_like_repo_id

        if looks_like_repo_id(name_or_path):
            return _model_for_repo_id(name_or_path, checkpoint, unquantized)
    if _looks_like_path(name_or_path):
        m = _model_from_path(name_or_path, unquantized)
        shadowed = _shadowed_catalog_name(name_or_path)
        if shadowed is None:
            return m
        note = (f"'{name_or_path}' is the {'folder' if _is_dir(name_or_path) else 'file'} of that name here, not the "
                f"catalog's {shadowed} (a path on disk wins; run elsewhere, or rename it, for the catalog model)")
        return m.model_copy(update={"origin": "; ".join(filter(None, (m.origin, note)))})
    try:
        return _resolve("models", name_or_path)
    except KvplanError:
        if _is_dir(name_or_path):
            raise KvplanError(f"unknown model '{name_or_path}': the folder {name_or_path} holds no config.json; pass a "
                              "snapshot folder (config.json inside), a config.json or a YAML spec, or name a catalog "
                              "model (`kvplan models` lists them)") from None
        raise


def _shadowed_catalog_name(name: str) -> Optional[str]:
    """The catalog model a bare name read from disk (a folder or file here, no path spelled) would otherwise name."""
    if name.endswith((".yaml", ".yml", ".json")) or os.sep in name or name.startswith("."):
        return None  # spelled as a path: no catalog name was meant
    try:
        return _resolve("models", name).name
    except KvplanError:
        return None


def _model_from_path(name_or_path: str, unquantized: bool) -> ModelSpec:
    """A model read from a YAML spec, a config.json or a snapshot folder."""
    path = Path(name_or_path)
    hint = "name a catalog model, a YAML spec or a config.json"
    if path.is_dir() and (path / "config.json").is_file():  # a local snapshot
        path = path / "config.json"
    if path.suffix == ".json":
        from kvplan.specs.hf_config import model_from_hf_config

        cfg = read_json(path, "file", hint)
        quant = _modelopt_file(path)
        if quant is not None and isinstance(cfg, dict) and not cfg.get("quantization_config"):
            q = read_json(quant, "file", "pass the hf_quant_config.json ModelOpt wrote beside the config")
            q = q.get("quantization", q) if isinstance(q, dict) else q
            cfg = {**cfg, "quantization_config": {"quant_method": "modelopt", **q} if isinstance(q, dict) else q}
            declared_in = "hf_quant_config.json"
        else:
            declared_in = "config.json quantization_config"
        if unquantized and isinstance(cfg, dict):
            cfg = _without_quantization(cfg)
        fields = model_from_hf_config(cfg, path)
        if fields.get("kv_cache_dtype_declared"):
            decl = fields["kv_cache_dtype_declared"]
            fields["kv_cache_dtype_declared"] = {**decl, "source": f"{declared_in} {decl['source']}"}
        held, unreadable = checkpoint_tensors(path.parent)
        if held:
            fields["checkpoint_params"], fields["checkpoint_dtypes"] = held["elements"], held["dtypes"]
        elif unreadable:
            fields["checkpoint_unavailable"] = unreadable
        return _build(ModelSpec, fields, path)
    return _build(ModelSpec, read_yaml(path, "file", hint), path)


def _is_dir(name: str) -> bool:
    try:
        return Path(name).is_dir()
    except (OSError, ValueError):
        return False


def load_model_as(name_or_path: str, weight_dtype: Optional[str] = None, checkpoint: bool = False) -> ModelSpec:
    """load_model, where a weight format given (--weight-dtype) stands in for a checkpoint quantization kvplan does
    not model; the model's origin says so."""
    try:
        return load_model(name_or_path, checkpoint)
    except UnmodelledWeights as e:
        if weight_dtype is None:
            raise
        what = e.what
    m = load_model(name_or_path, checkpoint, unquantized=True)
    note = f"the checkpoint's {what} is not modelled: its weights are planned as --weight-dtype {weight_dtype}"
    return m.model_copy(update={"origin": "; ".join(filter(None, (m.origin, note)))})


def _without_quantization(cfg: dict) -> dict:
    """A config.json without its quantization_config (nor its text_config's)."""
    cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"] = {k: v for k, v in cfg["text_config"].items() if k != "quantization_config"}
    return cfg


def checkpoint_elements(folder: Path) -> Optional[int]:
    """The elements of every tensor in a snapshot's *.safetensors files (see checkpoint_tensors)."""
    held, _ = checkpoint_tensors(folder)
    return held["elements"] if held else None


def checkpoint_tensors(folder: Path) -> tuple[Optional[dict], Optional[str]]:
    """The elements of every tensor in a snapshot's *.safetensors files and the elements per dtype, read from their
    headers alone (an 8-byte little-endian length, then a JSON object of dtypes and shapes), and why not where a file
    is unreadable or model.safetensors.index.json names a shard the folder lacks (a partial download). A folder
    without safetensors files gives (None, None): there is nothing to count."""
    import json
    import math
    import struct

    total, dtypes = 0, {}
    try:
        files = sorted(folder.glob("*.safetensors"))
        index = folder / "model.safetensors.index.json"
        if files and index.is_file():
            shards = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()
            missing = sorted(str(s) for s in set(shards) if not (folder / str(s)).is_file())
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                return None, (f"model.safetensors.index.json names {missing[0]}{more}, which the folder lacks (a "
                              f"partial download?)")
    except (OSError, ValueError, AttributeError) as e:
        return None, f"model.safetensors.index.json cannot be read ({type(e).__name__})"
    if not files:
        return None, None
    for f in files:
        unreadable = f"{f.name} cannot be read as safetensors (its header is cut short or not a safetensors header)"
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if not 0 < n < 100 * 2**20:
                    return None, unreadable
                header = json.loads(fh.read(n))
        except OSError as e:
            return None, f"{f.name} cannot be read ({e.strerror or e})"
        except (ValueError, struct.error):
            return None, unreadable
        if not isinstance(header, dict):
            return None, unreadable
        for name, t in header.items():
            if name != "__metadata__" and isinstance(t, dict) and isinstance(t.get("shape"), list):
                n = math.prod(int(x) for x in t["shape"])
                total += n
                dtype = str(t.get("dtype", "?"))
                dtypes[dtype] = dtypes.get(dtype, 0) + n
    if not total:
        return None, "its safetensors files list no tensors"
    return {"elements": total, "dtypes": dict(sorted(dtypes.items()))}, None


def _model_for_repo_id(name: str, checkpoint: bool = False, unquantized: bool = False) -> ModelSpec:
    from kvplan.specs.hub import checkpoint_summary, fetch_config, split_revision

    repo, revision = split_revision(name)
    try:
        config = fetch_config(repo, revision)
    except HubUnavailable as fetch_error:
        try:  # without the Hub: the catalog model of that architecture, when there is one
            spec = catalog_model_for_repo(repo)
        except KvplanError:
            raise fetch_error from None
        return spec.model_copy(update={"origin": f"'{repo}' planned as the catalog's {spec.name} (the same "
                                                 f"architecture); {fetch_error.why}"})
    spec = load_model(str(config), unquantized=unquantized)
    if not checkpoint or spec.checkpoint_params:  # a snapshot with its weights already counts them
        return spec
    summary, why = checkpoint_summary(repo, revision, config)
    if summary is None:
        return spec.model_copy(update={"checkpoint_unavailable": why})
    return spec.model_copy(update={"checkpoint_params": summary["elements"], "checkpoint_dtypes": summary["dtypes"],
                                   "checkpoint_unavailable": None})


def model_for_repo(repo: str, folders: Sequence[str | Path] = ()) -> ModelSpec:
    """The model a Hugging Face repo id names: its config.json in `folders` (or the local Hugging Face cache), else
    the catalog model of that architecture (instruct and chat variants share the base architecture)."""
    from kvplan.specs.hub import find_config

    found = find_config(repo, folders)
    if found is not None:
        return load_model(str(found))
    return catalog_model_for_repo(repo)


_QUANT_SUFFIX = (r"(?:[-_.](?:fp8(?:-dynamic)?|fp4|nvfp4|mxfp4|awq|gptq(?:-int[48])?|int[48]|w4a16|w8a8|w8a16|"
                 r"quantized(?:\.w\d+a\d+)?|bnb-4bit|4bit|8bit))+$")


def catalog_model_for_repo(repo: str) -> ModelSpec:
    """The catalog model a Hugging Face repo id names (instruct and chat variants share the base architecture)."""
    def norm(s: str) -> str:
        s = s.lower().rstrip("/").split("/")[-1]
        s = re.sub(_QUANT_SUFFIX, "", s)  # a quantized checkpoint has the base model's architecture
        for suffix in ("-instruct-2507", "-instruct", "-chat", "-it", "-base", "-hf"):
            s = s.removesuffix(suffix)
        return "".join(ch for ch in s.replace("meta-llama-", "llama-") if ch.isalnum())

    key = norm(repo)
    for stem, spec in catalog_entries("models"):
        names = {stem, spec.name, *(spec.aliases), *([spec.hf_repo] if spec.hf_repo else [])}
        if key in {norm(n) for n in names}:
            return spec
    raise KvplanError(f"the log's model '{repo}' is not in the catalog nor in the Hugging Face cache; pass --model "
                      f"(a catalog name, a YAML spec or its config.json) or --configs (a folder of config.json files)")


def _modelopt_file(config: Path) -> Optional[Path]:
    """ModelOpt's hf_quant_config.json beside a config.json (or <stem>_hf_quant_config.json beside
    <stem>_config.json, as saved from the Hub)."""
    name = config.name
    candidates = [config.with_name("hf_quant_config.json")]
    for suffix in ("_config.json", ".config.json"):
        if name.endswith(suffix):
            candidates.append(config.with_name(name[: -len(suffix)] + "_hf_quant_config.json"))
            candidates.append(config.with_name(name[: -len(suffix)] + ".hf_quant_config.json"))
    return next((c for c in candidates if c.is_file()), None)


def load_gpu(name_or_path: str) -> GPUSpec:
    """A GPU by catalog name or alias, or a path to a YAML spec."""
    if _looks_like_path(name_or_path):
        return _build(GPUSpec, read_yaml(name_or_path, "file", "name a catalog GPU or a YAML spec"), name_or_path)
    return _resolve("hardware", name_or_path)


def gpu_by_memory(total_bytes: int, tolerance: float = 0.01) -> Optional[GPUSpec]:
    """The catalog GPU whose total memory is nearest `total_bytes`, if one lies within `tolerance` (a fraction).
    A GPU matches by the total CUDA reports or by the one nvidia-smi prints (81,559 MiB = 79.65 GiB on an H100
    SXM): users quote either. Figures a tool really printed win ties over estimated ones."""
    best = None
    for g in load_catalog("hardware"):
        totals = [(g.memory_total_bytes, not g.memory_source.startswith("CUDA"))]
        if g.smi_total_mib:
            totals.append((g.smi_total_mib * 2**20, False))
        for figure, estimated in totals:
            if not figure:
                continue
            off = abs(figure - total_bytes) / total_bytes
            key = (off, estimated)
            if off <= tolerance and (best is None or key < best[0]):
                best = (key, g)
    return best[1] if best else None
