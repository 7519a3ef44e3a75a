"""The resolved deployment: the frozen value every question is answered from, and the non-KV memory a startup log
measured for it."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from kvplan.rules.vllm import vllm_rules
from kvplan.rules.vllm_backends import Choice
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.kv_formats import KVFormat
from kvplan.specs.parallel import Parallel
from kvplan.values import frozen_dataclass


@frozen_dataclass
class Measured:
    """Non-KV memory a startup log measured (a deployment profile): the weights (None where the layout differs
    from the one measured, so they are modelled) and everything beyond them. `base` is the profile's own
    configuration when this one differs from it in what the non-KV memory depends on: the overhead is then
    re-based by the modelled difference between the two."""

    weights: Optional[int]
    overhead: int
    source: str
    base: Optional["Deployment"] = None


@frozen_dataclass
class Deployment:
    """A resolved deployment: every default decided, every value checked. Build it with DeploymentArgs.resolve()."""

    model: ModelSpec
    gpu: Optional[GPUSpec]
    engine: Literal["vllm", "sglang"]
    engine_version: str
    kv: KVFormat
    skip: Optional[tuple]  # None: the format's own; ("none",); ("sliding_window",); or layer indices
    weight_dtype: Optional[str]  # None: the checkpoint's own
    tp: int
    pp: int
    dcp: int
    total_bytes: int  # device memory (0 where only the pool size or a block count was given)
    memory_source: str
    free_memory_bytes: Optional[int]  # free before the engine starts, where the user gave it
    max_model_len: Union[int, Literal["auto"], None]  # None: the model's own
    # how the model is cut across the GPUs (a plain TP layout unless data or expert parallelism was asked for)
    parallel: Parallel = Parallel()
    a2a_backend: Optional[str] = None  # how MoE layers exchange tokens across DP ranks, where they do
    eplb: bool = False
    layout_options: tuple = ()  # the layout options given, as sorted (name, value) pairs
    # vLLM
    gpu_memory_utilization: Optional[float] = None
    block_size: Optional[int] = None  # what was asked or the attention backend's default
    block_size_given: bool = False
    attention_backend: Optional[Choice] = None  # the backend the engine runs and the block (SGLang: page) it sets
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    entrypoint: str = "serve"
    enforce_eager: bool = False
    language_model_only: bool = False
    kv_cache_memory_bytes: Optional[int] = None
    num_gpu_blocks_override: Optional[int] = None
    activation_bytes: Optional[int] = None
    non_torch_bytes: Optional[int] = None
    cudagraph_bytes: Optional[int] = None
    # SGLang
    mem_fraction_static: Optional[float] = None
    page_size: Optional[int] = None
    mixed_chunk: bool = False  # --enable-mixed-chunk
    max_prefill_tokens: int = 0  # --max-prefill-tokens (SGLang's default when not given)
    max_running_requests: Optional[int] = None  # --max-running-requests (None: SGLang derives it from the pool)
    radix_cache: bool = True  # False with --disable-radix-cache
    free_before_load_bytes: Optional[int] = None  # measured by a profile
    # measured inputs
    measured: Optional[Measured] = None
    calibration: Any = None
    calibration_source: str = ""
    notes: tuple[str, ...] = ()
    # why the engine, release and GPU cannot run this KV format (its catalog entry, or no attention backend of vLLM's
    # serving it here): planned as a what-if, never a verdict; None where it runs
    unserved: Optional[str] = None
    inferred_gpu: bool = False
    # where `kv` is `auto` resolved from the checkpoint's declared KV-cache quantization: the declaration (e.g.
    # hf_quant_config.json kv_cache_quant_algo FP8); None otherwise
    kv_from_checkpoint: Optional[str] = None

    @property
    def flat_allowance(self) -> bool:
        """--activation-gib alone: one flat allowance for everything beyond the weights."""
        return self.activation_bytes is not None and self.non_torch_bytes is None and self.cudagraph_bytes is None

    @property
    def rules(self):
        return vllm_rules(self.engine_version)

    def to_dict(self) -> dict:
        """The deployment as plain values: what every command reports it ran."""
        out = {
            "model": self.model.name, "gpu": self.gpu.name if self.gpu else None, "engine": self.engine,
            "engine_version": self.engine_version, "kv_cache_dtype": self.kv.name,
            "kv_cache_dtype_skip_layers": list(self.skip) if self.skip is not None else None,
            "weight_dtype": self.weight_dtype or self.model.weight_dtype, "tp": self.tp, "pp": self.pp,
            "dcp": self.dcp, "total_memory_bytes": self.total_bytes, "memory_source": self.memory_source,
            "max_model_len": self.max_model_len,
        }
        if self.kv_from_checkpoint:  # --kv-cache-dtype auto, stored as the checkpoint declares
            out["kv_cache_dtype_from_checkpoint"] = self.kv_from_checkpoint
        if self.unserved:  # a dtype no engine, release or GPU of this deployment serves: its figures are a what-if
            out["what_if"] = self.unserved
        p = self.parallel
        if not p.tp_only:
            out.update(dp=p.dp, ep=p.ep, attention_tp=p.attn_tp, moe_tp=p.moe_tp, world_size=p.world,
                       nvlink_domains=p.domains(p.world),
                       redundant_experts=p.redundant_experts, a2a_backend=self.a2a_backend, eplb=self.eplb)
        if self.engine == "vllm":
            out.update(gpu_memory_utilization=self.gpu_memory_utilization, block_size=self.block_size,
                       max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                       entrypoint=self.entrypoint, enforce_eager=self.enforce_eager,
                       language_model_only=self.language_model_only,
                       kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                       num_gpu_blocks_override=self.num_gpu_blocks_override,
                       activation_bytes=self.activation_bytes, non_torch_bytes=self.non_torch_bytes,
                       cudagraph_bytes=self.cudagraph_bytes)
        else:
            out.update(mem_fraction_static=self.mem_fraction_static, page_size=self.page_size,
                       max_running_requests=self.max_running_requests, radix_cache=self.radix_cache)
            if self.attention_backend is not None:
                out["attention_backend"] = self.attention_backend.name
        out["profile"] = self.measured.source if self.measured else None
        out["calibration"] = self.calibration_source or None
        out["notes"] = list(self.notes)
        return out
