"""The model spec: an architecture as immutable pydantic values (attention layout, MLA, compressed attention,
experts, state layers, vision tower), and the per-layer view derived from it. Everything a model costs
(parameters, weight bytes, KV bytes) lives in kvplan.sizing."""

from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_serializer, model_validator

from kvplan.files import check_finite, read_json, read_yaml, type_name  # noqa: F401  (read_yaml: also imported from here)
from kvplan.memo import per_spec
from kvplan.specs.frozen import _Frozen
from kvplan.specs.layers import Attention, AttentionMixer, Dense, LatentAttention, Layer, LayerKind, MoE
from kvplan.specs.mixers import StateSpec, state_mixer  # noqa: F401 (StateSpec: importable from here)

MixerKind = Literal["full", "sliding", "chunked", "state", "none"]  # and layers with a fixed state, or no mixer
MlpKind = Literal["dense", "moe", "none"]
ATTENTION_KINDS = ("full", "sliding", "chunked")


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
    sglang_since: Optional[str] = Field(
        None, description="the first SGLang release that reads this declaration, where earlier ones do not")


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
    attention: AttentionLayout = AttentionLayout.model_construct()  # AttentionLayout(), without building its validator
    mla: Optional[MLASpec] = None
    compressed: Optional[CompressedAttentionSpec] = None
    moe: Optional[MoESpec] = None
    vision: Optional[VisionSpec] = None
    state: Optional[StateSpec] = Field(None, description="the state layers' mixer (kvplan.specs.mixers), where every "
                                       "state layer has the same; else `states` and `state_of`")
    states: Optional[tuple[StateSpec, ...]] = Field(
        None, description="the state mixers, where state layers differ (two kinds, or two sizes of one); each state "
        "layer names its own in state_of")
    state_of: Optional[tuple[Optional[int], ...]] = Field(
        None, description="with `states`: each layer's index into states (null for a layer without a state)")
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
    qk_norm_sums: bool = Field(False, description="the norm across all heads takes each rank's sums of squares, "
                               "all-reduced under TP (MiniMax-M2), rather than gathering q and k (OLMo 2)")
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

    @field_validator("state", mode="after")
    @classmethod
    def _state_mixer(cls, v: Optional[StateSpec]) -> Optional[StateSpec]:
        return state_mixer(v)  # the kind's class, whose methods give what it costs

    @field_validator("states", mode="after")
    @classmethod
    def _state_mixers(cls, v: Optional[tuple[StateSpec, ...]]) -> Optional[tuple[StateSpec, ...]]:
        return None if v is None else tuple(state_mixer(st) for st in v)

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """The fields as given; `states` and `state_of` only where a model has several state mixers, so that a spec
        of one (or none) dumps as it did before they existed."""
        data = handler(self)
        if isinstance(data, dict) and self.states is None:
            data.pop("states", None)
            data.pop("state_of", None)
        return data

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
                            ("intermediate_sizes", self.intermediate_sizes), ("norms", self.norms),
                            ("state_of", self.state_of)):
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
            if "state" in self.mixers and self.state is None and self.states is None:
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
        self._check_states()
        return self

    def _check_states(self) -> None:
        """`states` and `state_of` together, instead of `state`, every state layer naming one of them."""
        if self.states is None:
            if self.state_of is not None:
                raise ValueError("state_of names each layer's mixer among `states`; give states too, or drop it")
            return
        if self.state is not None:
            raise ValueError("give `state` (one mixer for every state layer) or `states` with `state_of`, not both")
        if not self.states:
            raise ValueError("states is empty; give at least one state mixer")
        if self.state_of is None:
            raise ValueError("with `states`, state_of names each layer's mixer (its index in states; null for a "
                             "layer without a state)")
        for i, (kind, j) in enumerate(zip(self.layer_kinds, self.state_of)):
            if kind == "state" and (isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < len(self.states)):
                raise ValueError(f"state_of: layer {i} is a state layer; give it an index below {len(self.states)} "
                                 f"into states, not {j}")
            if kind != "state" and j is not None:
                raise ValueError(f"state_of: layer {i} is a '{kind}' layer, without a state; give it null, not {j}")

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
    def layers(self) -> tuple[Layer, ...]:
        """Each layer's mixer and MLP as values (kvplan.specs.layers), built once per spec."""
        indexers = frozenset(self.indexer_layers)
        blocks: dict = {}  # one MLP value per kind and width
        out = []
        for i, (kind, mlp) in enumerate(zip(self.layer_kinds, self.mlp_kinds)):
            mixer: "AttentionMixer | StateSpec | None" = None
            if kind in ATTENTION_KINDS:
                mixer = self._attention_mixer(kind, self.layer_kv_heads(i), self.layer_head_dim(i),
                                              bool(self.v_from_k and self.v_from_k[i]), i in indexers)
            elif kind == "state":
                mixer = self.layer_state(i)
            key = (mlp, self.layer_intermediate(i) if mlp == "dense" else 0)
            if key not in blocks:
                blocks[key] = self._mlp_block(*key)
            out.append(Layer(i, mixer, blocks[key], self.layer_norms(i)))
        return tuple(out)

    def _mlp_block(self, kind: MlpKind, width: int) -> "Dense | MoE | None":
        """An MLP of `kind` (a dense one `width` wide), of the model's form."""
        if kind == "dense":
            return Dense(width, self.gated_mlp, self.mlp_bias)
        if kind == "moe":
            return MoE(self.moe, self.gated_mlp, self.mlp_bias)
        return None

    def _attention_mixer(self, kind: LayerKind, kv_heads: int, head_dim: Optional[int], v_from_k: bool = False,
                         indexed: bool = False) -> AttentionMixer:
        """An attention layer of `kind` and these heads, with the projections the model's attention layers share:
        a LatentAttention on an MLA model, an Attention otherwise."""
        qk_norm = "full" if self.qk_norm_full else "head" if self.qk_norm else None
        if self.mla is not None:
            return LatentAttention(kind, self.window_of(kind), self.mla, self.num_heads, indexed, self.o_bias)
        return Attention(kind, kv_heads, head_dim, self.window_of(kind), v_from_k, indexed, self.num_heads,
                         self.v_head_dim, self.attn_output_gate, self.qkv_bias, self.o_bias, qk_norm)

    @property
    @per_spec
    def base_attention(self) -> AttentionMixer:
        """A full-attention layer of the model's num_kv_heads and head_dim: what model-wide figures take where the
        layers differ (the bytes per token a deployment checks a format by, the decode kernel's head size and
        FLOPs per cached token)."""
        return self._attention_mixer("full", self.num_kv_heads, self.head_dim)

    @property
    def state_mixers(self) -> tuple[StateSpec, ...]:
        """The state mixers: `states`, or the one `state` (none in a model without state layers)."""
        if self.states is not None:
            return self.states
        return (self.state,) if self.state is not None else ()

    def state_index(self, i: int) -> int:
        """Which of state_mixers state layer i uses."""
        return self.state_of[i] if self.state_of is not None else 0  # type: ignore[return-value]

    def layer_state(self, i: int) -> Optional[StateSpec]:
        """Layer i's state mixer (None for a layer without a state)."""
        if self.layer_kinds[i] != "state":
            return None
        return self.state_mixers[self.state_index(i)]

    @property
    @per_spec
    def state_groups(self) -> tuple[tuple[StateSpec, tuple[int, ...]], ...]:
        """Each state mixer the layers use, with its layers, in the order of state_mixers."""
        mixers = self.state_mixers
        layers: list[list[int]] = [[] for _ in mixers]
        for i in self.state_layers:
            layers[self.state_index(i)].append(i)
        return tuple((st, tuple(at)) for st, at in zip(mixers, layers) if at)

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
    def sparse_mla(self) -> bool:
        """DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): MLA whose layers pick their keys with an indexer."""
        return self.mla is not None and bool(self.mla.index_head_dim)

    @property
    @per_spec
    def indexer_layers(self) -> tuple[int, ...]:
        """The attention layers holding a sparse-attention indexer (and its key cache)."""
        if not self.sparse_mla:
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
