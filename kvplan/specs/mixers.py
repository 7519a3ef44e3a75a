"""The state mixers: the mixers of layers that keep a fixed state per sequence instead of a growing KV cache, one class
per kind. Each class owns what its kind costs: its channels, its cache per layer per rank, its tensors, how tensor
parallelism splits it, its share of vLLM's profile run and its name in tables.

A spec names its mixer by `kind` (models/*.yaml, the Hugging Face reader of kvplan.specs.hf_layers); the fields are
those of StateSpec, whatever the kind, and ModelSpec turns the validated StateSpec into the kind's class
(`state_mixer`). A new state mixer is one subclass here (its KIND and its methods, made by a function of its own
that _KIND_MAKERS lists and _KIND_CLASSES names) and its config mapping in kvplan.specs.hf_layers.

The kinds' classes are made the first time one is asked for (`_kinds`: a spec's kind validated, STATE_MIXERS or a
class read from this module), so that a command on a model without state layers never builds them."""


import threading
from typing import ClassVar, Literal, Optional

from pydantic import Field, field_validator, model_validator

from kvplan.specs.frozen import _Frozen
from kvplan.specs.tensors import Tensor, linear
from kvplan.units import DTYPE_BYTES

# kind -> class, in the order the classes are defined (the order an unknown kind's message lists them): STATE_MIXERS,
# filled by _kinds()
_KINDS: dict[str, type["StateSpec"]] = {}
_KIND_CLASSES = ("Mamba2", "GatedDeltaNet", "Mamba", "LightningAttention", "KimiDeltaAttention")
_DEFINING = threading.Lock()
_KINDS_MADE = False


class StateSpec(_Frozen):
    """The mixer of a layer that keeps a fixed state per sequence instead of a growing KV cache: Mamba-2 (heads x
    head_dim channels, n_groups groups of a state_size-wide SSM state), gated delta net (value heads x value head
    dim, n_groups key heads of state_size-wide keys), Mamba (one intermediate_size-wide channel set), lightning
    attention (MiniMax: heads of a head_dim x state_size key-value state, no convolution) or Kimi delta attention
    (KDA: heads of head_dim x state_size, short convolutions on q, k and v).

    Validated, a spec becomes its kind's class (state_mixer), whose methods give what the kind costs."""

    kind: str = Field(description="the mixer: a kind of STATE_MIXERS (mamba2, gdn, mamba, lightning, kda)",
                      json_schema_extra=lambda schema: schema.update(enum=list(_kinds())))
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

    KIND: ClassVar[str] = ""  # the `kind` a subclass stands for
    label: ClassVar[str] = "state"  # its name in the models table
    tp_unit: ClassVar[str] = "Mamba-2 heads"  # what TP splits, as an attention-free model's message names it
    # sglang 0.5.6 has a Mamba pool shape for it (configs/mamba_utils.py Mamba2StateShape)
    sglang_pool: ClassVar[bool] = False
    # sglang divides its state slots among the data-parallel attention groups (hybrid_gdn_config)
    sglang_slots_per_dp_group: ClassVar[bool] = False

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.KIND:
            _KINDS[cls.KIND] = cls

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, v):
        if not isinstance(v, str) or v not in _kinds():
            names = [repr(k) for k in _kinds()]
            raise ValueError(f"Input should be {', '.join(names[:-1])} or {names[-1]}")
        return v

    @model_validator(mode="after")
    def _own_kind(self) -> "StateSpec":
        if self.KIND and self.kind != self.KIND:
            raise ValueError(f"a {type(self).__name__} mixer has kind '{self.KIND}', not '{self.kind}'")
        return self

    # ------------------------------------------------------------------------------------------------------------
    # what every kind answers

    @property
    def inner(self) -> int:
        """The channels the mixer works on (its conv sees inner plus the B/C or key channels)."""
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """The channels its causal convolution sees (0: none)."""
        raise NotImplementedError(self.kind)

    def tp_split(self) -> tuple[int, str]:
        """What tensor parallelism splits evenly across ranks where no attention layer constrains it: the count and
        its name."""
        return self.num_heads, self.tp_unit

    def cache_bytes(self, tp: int, dtype: str, ssm_default: Optional[str] = None) -> tuple[int, int]:
        """One layer's cache for one sequence on one of `tp` ranks, as vLLM's MambaSpec holds it, in a model of
        `dtype` (ssm_default: the engine's SSM state dtype where the spec names none). Returns (conv bytes, state
        bytes)."""
        raise NotImplementedError(self.kind)

    def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
        """`count` layers' tensors, as transformers' and vLLM's modelling code builds them (`layers`: the layers
        holding them, where other state layers hold another mixer's)."""
        raise NotImplementedError(self.kind)

    @classmethod
    def vllm_prefill_checkpoint(cls, compute_capability: Optional[str], key_head_dim: int) -> bool:
        """Whether vLLM's prefill kernel for it on this GPU keeps a prefill checkpoint block, in the releases that give
        the mixer one (VllmRules.checkpoint_state_kinds)."""
        return True

    def profile_peak(self, tokens: int, hidden: int, tp: int, b: int) -> int:
        """Its layer's live tensors in vLLM's profile run for `tokens` tokens of `b` bytes: the projections run, the
        state kernels skip the profile run."""
        proj = 2 * self.inner + 2 * self.n_groups * self.state_size + self.num_heads
        return tokens * b * (2 * hidden + proj // tp + self.conv_channels // tp + self.inner // tp)

    # ------------------------------------------------------------------------------------------------------------
    # shared by the kinds

    def _ssm_bytes(self, dtype: str, ssm_default: Optional[str]) -> int:
        """The SSM (or recurrent) state's element: mamba_ssm_cache_dtype, the model dtype unless the config or the
        user names another."""
        return DTYPE_BYTES[self.ssm_cache_dtype or ssm_default or dtype]

    def _conv(self, channels: int, count: int, layers: tuple[int, ...]) -> list[Tensor]:
        """The depthwise causal convolution (channels x kernel), kept in the model dtype by every checkpoint
        format."""
        ts = [Tensor("mixer.conv1d", channels, self.conv_kernel, count, "col", "state", False, layers=layers)]
        if self.conv_bias:
            ts.append(Tensor("mixer.conv1d.bias", channels, 1, count, "col", "state", False, layers=layers))
        return ts


# Each kind's class, made by a function of its own when a kind is first asked for (_kinds)


def _mamba2() -> type[StateSpec]:
    class Mamba2(StateSpec):
        """Mamba-2 (NemotronHMamba2Mixer, vLLM's MambaMixer2): heads x head_dim channels, n_groups B/C groups of a
        state_size-wide SSM state."""

        KIND: ClassVar[str] = "mamba2"
        label: ClassVar[str] = "Mamba-2"
        sglang_pool: ClassVar[bool] = True

        @property
        def conv_channels(self) -> int:
            return self.inner + 2 * self.n_groups * self.state_size

        def cache_bytes(self, tp: int, dtype: str, ssm_default: Optional[str] = None) -> tuple[int, int]:
            groups = self.n_groups
            if groups % tp:  # vLLM replicates a single B/C group to every rank (mamba_utils)
                groups += tp - groups
            channels = self.inner + 2 * groups * self.state_size
            conv = (self.conv_kernel - 1) * (channels // tp) * DTYPE_BYTES[dtype]
            # heads x head_dim x d_state
            return conv, (self.num_heads // tp) * self.head_dim * self.state_size * self._ssm_bytes(dtype, ssm_default)

        def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
            inner, conv, at = self.inner, self.conv_channels, layers
            # in_proj: z (inner) + x, B, C (conv channels) + dt (one per head)
            ts = linear("mixer.in_proj", inner + conv + self.num_heads, hidden, count, "col", "state",
                        bias=self.proj_bias, layers=at)
            ts += self._conv(conv, count, at)
            for name in ("dt_bias", "A_log", "D"):
                ts.append(Tensor(f"mixer.{name}", self.num_heads, 1, count, "col", "state", False, layers=at))
            ts.append(Tensor("mixer.norm", inner, 1, count, "col", "state", False, layers=at))
            ts += linear("mixer.out_proj", hidden, inner, count, "row", "state", bias=self.proj_bias, layers=at)
            return ts

    return Mamba2


def _gated_delta_net() -> type[StateSpec]:
    class GatedDeltaNet(StateSpec):
        """Gated delta net (Qwen3NextGatedDeltaNet): value heads x value head dim, n_groups key heads of state_size-wide
        keys; its recurrent state is value heads x value dim x key dim."""

        KIND: ClassVar[str] = "gdn"
        label: ClassVar[str] = "GDN"
        sglang_pool: ClassVar[bool] = True
        sglang_slots_per_dp_group: ClassVar[bool] = True

        @property
        def conv_channels(self) -> int:  # q and k (key heads x key dim) and v
            return self.inner + 2 * self.n_groups * self.state_size

        def cache_bytes(self, tp: int, dtype: str, ssm_default: Optional[str] = None) -> tuple[int, int]:
            conv = (self.conv_kernel - 1) * (self.conv_channels // tp) * DTYPE_BYTES[dtype]
            return conv, (self.num_heads // tp) * self.head_dim * self.state_size * self._ssm_bytes(dtype, ssm_default)

        def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
            inner, at = self.inner, layers
            k_dim = self.n_groups * self.state_size
            # q, k (key heads x key dim), v and z (value heads x value dim); b and a (one per value head)
            ts = linear("linear_attn.in_proj_qkvz", 2 * k_dim + 2 * inner, hidden, count, "col", "state", layers=at)
            ts += linear("linear_attn.in_proj_ba", 2 * self.num_heads, hidden, count, "col", "state", layers=at)
            ts += self._conv(2 * k_dim + inner, count, at)
            for name in ("dt_bias", "A_log"):
                ts.append(Tensor(f"linear_attn.{name}", self.num_heads, 1, count, "col", "state", False, layers=at))
            ts.append(Tensor("linear_attn.norm", self.head_dim, 1, count, "rep", "state", False, layers=at))
            ts += linear("linear_attn.out_proj", hidden, inner, count, "row", "state", layers=at)
            return ts

        @classmethod
        def vllm_prefill_checkpoint(cls, compute_capability: Optional[str], key_head_dim: int) -> bool:
            return gdn_prefill_flashinfer(compute_capability, key_head_dim)  # Triton's prefill keeps none

    return GatedDeltaNet


def _mamba() -> type[StateSpec]:
    class Mamba(StateSpec):
        """Mamba (MambaMixer): one intermediate_size-wide channel set, each with a state_size-wide SSM state."""

        KIND: ClassVar[str] = "mamba"
        label: ClassVar[str] = "Mamba"
        tp_unit: ClassVar[str] = "Mamba channels"

        @property
        def inner(self) -> int:
            return self.intermediate_size or 0

        @property
        def conv_channels(self) -> int:
            return self.inner

        def tp_split(self) -> tuple[int, str]:
            return self.inner, self.tp_unit

        def cache_bytes(self, tp: int, dtype: str, ssm_default: Optional[str] = None) -> tuple[int, int]:
            conv = (self.conv_kernel - 1) * (self.conv_channels // tp) * DTYPE_BYTES[dtype]
            return conv, (self.inner // tp) * self.state_size * self._ssm_bytes(dtype, ssm_default)

        def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
            inner, at = self.inner, layers
            rank = self.dt_rank or -(-hidden // 16)
            ts = linear("mixer.in_proj", 2 * inner, hidden, count, "col", "state", bias=self.proj_bias, layers=at)
            ts += self._conv(inner, count, at)
            ts += linear("mixer.x_proj", rank + 2 * self.state_size, inner, count, "row", "state", layers=at)
            ts += linear("mixer.dt_proj", inner, rank, count, "col", "state", bias=True, layers=at)
            ts.append(Tensor("mixer.A_log", inner, self.state_size, count, "col", "state", False, layers=at))
            ts.append(Tensor("mixer.D", inner, 1, count, "col", "state", False, layers=at))
            ts += linear("mixer.out_proj", hidden, inner, count, "row", "state", bias=self.proj_bias, layers=at)
            if self.dt_bc_norms:
                ts.append(Tensor("mixer.dt_b_c_layernorms", rank + 2 * self.state_size, 1, count, "rep", "state", False,
                                 layers=at))
            return ts

        def profile_peak(self, tokens: int, hidden: int, tp: int, b: int) -> int:
            proj = 2 * self.inner
            return tokens * b * (2 * hidden + proj // tp + self.conv_channels // tp + self.inner // tp)

    return Mamba


def _lightning_attention() -> type[StateSpec]:
    class LightningAttention(StateSpec):
        """MiniMax's linear attention (MiniMaxText01LinearAttention): heads of a head_dim x state_size key-value state,
        no convolution."""

        KIND: ClassVar[str] = "lightning"

        @property
        def conv_channels(self) -> int:
            return 0

        def cache_bytes(self, tp: int, dtype: str, ssm_default: Optional[str] = None) -> tuple[int, int]:
            # one state per head in mamba_cache_dtype (the model dtype), no convolution
            return 0, (self.num_heads // tp) * self.head_dim * self.state_size * DTYPE_BYTES[dtype]

        def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
            inner, at = self.inner, layers
            ts = linear("linear_attn.qkv_proj", 3 * inner, hidden, count, "col", "state", layers=at)
            ts += linear("linear_attn.output_gate", inner, hidden, count, "col", "state", layers=at)
            ts.append(Tensor("linear_attn.norm", inner, 1, count, "col", "state", False, layers=at))
            ts += linear("linear_attn.out_proj", hidden, inner, count, "row", "state", layers=at)
            return ts

    return LightningAttention


def _kimi_delta_attention() -> type[StateSpec]:
    class KimiDeltaAttention(StateSpec):
        """Kimi delta attention (KimiDeltaAttention): heads of head_dim x state_size, short convolutions on q, k and v,
        low-rank forget (f) and output (g) gates (or a full-rank output gate)."""

        KIND: ClassVar[str] = "kda"

        @property
        def conv_channels(self) -> int:  # q, k and v each convolved
            return 3 * self.inner

        def cache_bytes(self, tp: int, dtype: str, ssm_default: Optional[str] = None) -> tuple[int, int]:
            # q, k and v conv states in the model dtype; the recurrent state in float32 unless named
            conv = (self.conv_kernel - 1) * (self.conv_channels // tp) * DTYPE_BYTES[dtype]
            rb = DTYPE_BYTES[self.ssm_cache_dtype] if self.ssm_cache_dtype else 4
            return conv, (self.num_heads // tp) * self.head_dim * self.state_size * rb

        def tensors(self, hidden: int, count: int, layers: tuple[int, ...] = ()) -> list[Tensor]:
            inner, d, at = self.inner, self.head_dim, layers
            ts = linear("linear_attn.qkv_proj", 3 * inner, hidden, count, "col", "state", layers=at)
            ts += linear("linear_attn.b_proj", self.num_heads, hidden, count, "col", "state", layers=at)
            for gate in ("f",) if self.full_rank_gate else ("f", "g"):
                ts += linear(f"linear_attn.{gate}_a_proj", d, hidden, count, "rep", "state", layers=at)
                ts += linear(f"linear_attn.{gate}_b_proj", inner, d, count, "col", "state", layers=at)
            if self.full_rank_gate:
                ts += linear("linear_attn.g_proj", inner, hidden, count, "col", "state", layers=at)
            ts += self._conv(self.conv_channels, count, at)
            ts.append(Tensor("linear_attn.dt_bias", inner, 1, count, "col", "state", False, layers=at))
            ts.append(Tensor("linear_attn.A_log", self.num_heads, 1, count, "col", "state", False, layers=at))
            ts.append(Tensor("linear_attn.o_norm", d, 1, count, "rep", "state", False, layers=at))
            ts += linear("linear_attn.o_proj", hidden, inner, count, "row", "state", layers=at)
            return ts

    return KimiDeltaAttention


# one per name of _KIND_CLASSES, in its order
_KIND_MAKERS = (_mamba2, _gated_delta_net, _mamba, _lightning_attention, _kimi_delta_attention)


def _define_kinds() -> None:
    """The kinds' classes, made in the order of _KIND_CLASSES, each registered in _KINDS by
    StateSpec.__pydantic_init_subclass__ and kept as a name of this module."""
    for make in _KIND_MAKERS:
        cls = make()
        globals()[cls.__name__] = cls


def _kinds() -> dict[str, type[StateSpec]]:
    """STATE_MIXERS: kind -> class, the classes made on the first call."""
    global _KINDS_MADE
    if not _KINDS_MADE:
        with _DEFINING:
            if not _KINDS_MADE:
                _define_kinds()
                _KINDS_MADE = True
    return _KINDS


def __getattr__(name: str):
    """STATE_MIXERS and the kinds' classes, made on first use."""
    if name == "STATE_MIXERS":
        return _kinds()
    if name in _KIND_CLASSES:
        _kinds()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gdn_prefill_flashinfer(compute_capability: Optional[str], key_head_dim: int) -> bool:
    """Whether vLLM 0.33 runs FlashInfer's gated-delta-net prefill, whose layers then keep a prefill checkpoint
    (layers/mamba/gdn/qwen_gdn_linear_attn.py _resolve_gdn_prefill_backend, "auto"): on Hopper always, on Blackwell
    (10.x, 12.x) with 128-wide key heads (and a CUDA 13 runtime, which kvplan assumes there); Triton elsewhere."""
    cc = compute_capability or ""
    return cc.startswith("9.") or (cc.startswith(("10.", "12.")) and key_head_dim == 128)


def state_mixer(spec: Optional[StateSpec]) -> Optional[StateSpec]:
    """A validated StateSpec as its kind's class (the same value where it is one already)."""
    if spec is None or type(spec) is not StateSpec:
        return spec
    return _kinds()[spec.kind].model_construct(_fields_set=spec.model_fields_set, **dict(spec))
