"""One deployment: what the user asked for, and the validated value every question about it is answered from.

`DeploymentArgs` is what was said (on the command line, in a gate, a sweep row or a saved profile), `None` where
nothing was said. `resolve()` is the one place where kvplan decides every default, applies a deployment profile
and a calibration profile, infers the GPU from a memory total, and checks every value and every combination
against the engine's rules. It returns a frozen `Deployment` that `capacity`, `crossover`, `sweep`, `gate`, the
plots and the log import all take, so an option means the same thing everywhere, and an option the chosen engine
does not read is refused by name rather than dropped.

    >>> from kvplan.deployment import DeploymentArgs
    >>> d = DeploymentArgs(model="llama3-8b", gpu="h100", kv_cache_dtype="fp8").resolve()
    >>> d.engine, d.block_size, d.gpu_memory_utilization, d.max_num_batched_tokens
    ('vllm', 16, 0.92, 8192)
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Optional, Union

from kvplan.deployment.backend import resolve_attention_backend
from kvplan.deployment.kv import declared_kv, skip_value
from kvplan.deployment.layout import check_dcp, layout_options, parallel_layout
from kvplan.deployment.options import (
    ENGINES,
    ENTRYPOINTS,
    LAYOUT_OPTIONS,
    OTHER_SPELLING,
    SGLANG_ONLY,
    VLLM_BLOCK_MULTIPLE,
    VLLM_ONLY,
    check_positive,
    flag,
)
from kvplan.deployment.sglang import _refuse_unmodelled_sglang_pools, _resolve_sglang
from kvplan.deployment.value import Deployment, Measured
from kvplan.errors import KvplanError, check_whole
from kvplan.rules.vllm import (
    missing_dtype_message,
    newer_release_note,
    scheduler_rules,
    serve_defaults,
    version_key,
    vllm_rules,
)
from kvplan.sizing.kv_cache import check_tp, format_bytes_per_token, skipped_layers
from kvplan.sizing.weight_formats import weight_format
from kvplan.specs.catalog import (
    GPUSpec,
    ModelSpec,
    gpu_by_memory,
    load_catalog,
    load_gpu,
    load_model_as,
)
from kvplan.specs.kv_formats import KVFormat, kv_format
from kvplan.units import GiB
from kvplan.values import frozen_dataclass


@frozen_dataclass
class DeploymentArgs:
    """What the user said; None (or the neutral value: TP 1, PP 1, DCP 1, not eager) where nothing was."""

    model: Union[str, ModelSpec, None] = None
    gpu: Union[str, GPUSpec, None] = None
    engine: Optional[str] = None
    engine_version: Optional[str] = None
    kv_cache_dtype: Union[str, KVFormat, None] = None
    kv_cache_dtype_skip_layers: Union[str, int, tuple, list, None] = None
    weight_dtype: Optional[str] = None
    tp: Optional[int] = None  # None: the profile's, or 1
    pp: Optional[int] = None
    dcp: Optional[int] = None
    max_model_len: Union[int, str, None] = None
    gpu_memory_utilization: Optional[float] = None
    mem_fraction_static: Optional[float] = None
    gpu_memory_gib: Optional[float] = None
    free_memory_gib: Optional[float] = None
    kv_cache_memory_gib: Optional[float] = None
    num_gpu_blocks_override: Optional[int] = None
    block_size: Optional[int] = None
    attention_backend: Optional[str] = None  # vLLM's --attention-backend: a backend name, or auto
    page_size: Optional[int] = None
    enable_mixed_chunk: bool = False  # SGLang: prompt chunks share their step with the running requests' decodes
    max_prefill_tokens: Optional[int] = None  # SGLang: the prompt tokens one prefill batch takes
    max_running_requests: Optional[int] = None  # SGLang: the requests it runs at once (all DP-attention groups')
    disable_radix_cache: bool = False  # SGLang: no prefix cache (a hybrid's state slots then serve one request each)
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    entrypoint: Optional[str] = None
    enforce_eager: bool = False
    language_model_only: bool = False
    mamba_ssm_cache_dtype: Optional[str] = None
    # data and expert parallelism, in each engine's own spelling (vLLM's first, then SGLang's)
    data_parallel_size: Optional[int] = None
    data_parallel_size_local: Optional[int] = None
    enable_expert_parallel: bool = False
    all2all_backend: Optional[str] = None
    enable_eplb: bool = False
    num_redundant_experts: Optional[int] = None
    dp_size: Optional[int] = None
    enable_dp_attention: bool = False
    ep_size: Optional[int] = None
    moe_a2a_backend: Optional[str] = None
    ep_num_redundant_experts: Optional[int] = None
    moe_dense_tp_size: Optional[int] = None
    enable_dp_lm_head: bool = False
    activation_gib: Optional[float] = None
    non_torch_gib: Optional[float] = None
    cudagraph_gib: Optional[float] = None
    profile: Any = None  # a path, or a kvplan.specs.profile.DeploymentProfile
    calibration: Any = None  # a path, or a kvplan.specs.calibration.CalibrationProfile

    def given(self) -> list[str]:
        """The fields the user set: anything but None, a flag's default (off), and one stage or rank (pp, dcp 1)."""
        neutral = {"pp": 1, "dcp": 1}
        return [f.name for f in fields(self) if (v := getattr(self, f.name)) is not None
                and not (v is False and f.default is False) and v != neutral.get(f.name)]

    def resolve(self, *, needs_memory: bool = False) -> "Deployment":
        return resolve(self, needs_memory=needs_memory)


# ----------------------------------------------------------------------------------------------------------------


def _load_profile(p):
    if p is None or not isinstance(p, str):
        return p
    from kvplan.specs.profile import (
        load_profile,  # (only a deployment given a profile reads one)
    )

    return load_profile(p)


def engine_of(args: DeploymentArgs, prof=None) -> str:
    """The engine the arguments name: --engine, else the deployment profile's (`prof`, when already read), else
    vLLM."""
    if args.engine:
        return str(args.engine).lower()
    prof = prof if prof is not None else _load_profile(args.profile)
    return prof.engine.lower() if prof is not None else "vllm"


def resolve(args: DeploymentArgs, *, needs_memory: bool = False) -> Deployment:
    """Every default decided and every value checked, once, in named steps (each refusal in the order a user meets
    it). `needs_memory`: the question is the pool's size, so a GPU (or a memory total, a pool size or a block count)
    is required."""
    notes: list[str] = []
    prof = _load_profile(args.profile)
    engine = engine_of(args, prof)
    given = set(args.given())
    _check_engine(args, prof, engine, given)
    m = _resolve_model(args, prof, notes)
    g = _resolve_gpu(args, prof, notes)
    fmt = _resolve_kv(args, prof, m, engine, g, notes)
    asked = args.kv_cache_dtype if args.kv_cache_dtype is not None else getattr(prof, "kv_cache_dtype", None)
    asked = asked.name if isinstance(asked, KVFormat) else kv_format(asked or "auto").name
    decl = m.kv_cache_dtype_declared
    from_checkpoint = decl.source if decl is not None and asked == "auto" and fmt.name != "auto" else None
    tp, pp, dcp, weight_dtype, args, layout, a2a = _resolve_layout(args, prof, given, engine, m, g, notes)
    format_bytes_per_token(m, fmt, layout.attn_tp)  # refuses a format for the other attention layout (MLA or heads)
    skip = skip_value(args.kv_cache_dtype_skip_layers)
    skipped_layers(m, fmt, skip)  # checks the indices
    _check_numbers(args, prof, given)
    mlen = _resolve_max_model_len(args, prof, m, engine)
    cal, cal_source = _calibration(args.calibration, g)  # the one asked for, or one saved for this GPU
    total, source, g, inferred = _resolve_memory(args, prof, g, cal, cal_source, engine, needs_memory, notes)
    free = _resolve_free_memory(args, total, notes)
    common = dict(model=m, gpu=g, engine=engine, kv=fmt, skip=skip, weight_dtype=weight_dtype, tp=tp,
                  pp=pp, dcp=dcp, total_bytes=total, memory_source=source, free_memory_bytes=free, max_model_len=mlen,
                  calibration=cal, calibration_source=cal_source, inferred_gpu=inferred, parallel=layout,
                  a2a_backend=a2a, eplb=bool(args.enable_eplb), layout_options=layout_options(args),
                  unserved=fmt.unserved(engine, g, args.engine_version), kv_from_checkpoint=from_checkpoint)
    if weight_dtype is not None:
        weight_format(weight_dtype)  # an unknown name is refused here, whichever question is asked
    if engine == "sglang":
        _refuse_unmodelled_sglang_pools(m)
        return _resolve_sglang(args, prof, common, notes)
    return _resolve_vllm(args, prof, common, notes)


def _check_engine(args: DeploymentArgs, prof, engine: str, given: set) -> None:
    """A known engine, the profile's own, and no option spelled for the other engine."""
    if engine not in ENGINES:
        raise KvplanError(f"--engine {args.engine}: choose vllm or sglang")
    if prof is not None and prof.engine != engine:
        raise KvplanError(f"the profile was measured with {prof.engine}, not {engine}: its overheads are "
                          f"{prof.engine}'s (drop --engine, or import a {engine} startup log)")
    foreign = [n for n in (VLLM_ONLY if engine == "sglang" else SGLANG_ONLY) if n in given]
    if foreign:
        other = "vllm" if engine == "sglang" else "sglang"
        own = OTHER_SPELLING.get(foreign[0])
        hint = f"{engine}'s spelling is {flag(own)}" if own else "drop it"
        raise KvplanError(f"{flag(foreign[0])} applies to --engine {other}, not {engine}; {hint} (or plan with "
                          f"--engine {other})")


def _resolve_model(args: DeploymentArgs, prof, notes: list[str]) -> ModelSpec:
    """The model named (or the profile's), with the SSM state's dtype and --language-model-only applied."""
    model = args.model
    if model is None and prof is not None:
        model = prof.model
    if model is None:
        raise KvplanError("no model: name one (a catalog name, a YAML spec or a config.json)")
    m = model if isinstance(model, ModelSpec) else load_model_as(model, args.weight_dtype)
    if m.origin:
        notes.append(m.origin)
    if prof is not None and prof.model != m.name:
        raise KvplanError(f"the profile was measured on {prof.model}, not {m.name}; its overheads do not carry "
                          f"over (import a startup log of {m.name})")
    if args.mamba_ssm_cache_dtype is not None:
        chosen = str(args.mamba_ssm_cache_dtype).lower()
        names = {"float32": "fp32", "fp32": "fp32", "float16": "fp16", "fp16": "fp16", "bfloat16": "bf16",
                 "bf16": "bf16", "auto": None}
        if chosen not in names:
            raise KvplanError(f"--mamba-ssm-cache-dtype '{args.mamba_ssm_cache_dtype}': choose auto, float32, float16 "
                              f"or bfloat16")
        if not m.state_mixers:
            raise KvplanError(f"--mamba-ssm-cache-dtype: {m.name} has no Mamba or linear-attention state; drop it")
        dtype = {"ssm_cache_dtype": names[chosen]}
        m = m.model_copy(update={"states": tuple(st.model_copy(update=dtype) for st in m.states)} if m.states else
                         {"state": m.state.model_copy(update=dtype)})
        notes.append(f"state layers' SSM state in {chosen} (--mamba-ssm-cache-dtype)")
    if args.language_model_only:
        if m.vision is None and not m.extra_params and not m.replicated_params:
            raise KvplanError(f"--language-model-only: {m.name} has no vision encoder to leave out; drop it")
        m = m.model_copy(update={"vision": None, "extra_params": {}, "replicated_params": {}})
        notes.append("language model only: the vision tower and projector are neither built nor profiled (vLLM's "
                     "--language-model-only, or --limit-mm-per-prompt with every modality at 0)")
    return m


def _resolve_gpu(args: DeploymentArgs, prof, notes: list[str]) -> Optional[GPUSpec]:
    """The GPU named, else the profile's or the calibration profile's (None: no GPU yet)."""
    gpu = args.gpu
    g = gpu if isinstance(gpu, GPUSpec) or gpu is None else load_gpu(gpu)
    if prof is not None and prof.gpu:
        measured_on = load_gpu(prof.gpu)
        if g is not None and g.name != measured_on.name:
            raise KvplanError(f"the profile was measured on {measured_on.name}, not {g.name}: its memory and "
                              f"overheads are that GPU's (drop --gpu, or import a startup log from {g.name})")
        g = measured_on
    if g is None and args.calibration is not None:  # the GPU the calibration profile was measured on
        g = _calibration_gpu(args.calibration)
        notes.append(f"GPU taken from the calibration profile: {g.name}, the GPU it was measured on")
    return g


def _resolve_kv(args: DeploymentArgs, prof, m: ModelSpec, engine: str, g: Optional[GPUSpec],
                notes: list[str]) -> KVFormat:
    """The KV format the engine stores: the one named (or the profile's), `auto` as the checkpoint declares it."""
    fmt_arg = args.kv_cache_dtype
    if fmt_arg is None and prof is not None:
        fmt_arg = prof.kv_cache_dtype
    fmt = fmt_arg if isinstance(fmt_arg, KVFormat) else kv_format(fmt_arg or "auto")
    fmt = declared_kv(m, fmt, engine, notes, args.engine_version if engine == "sglang" else None)
    if m.sparse_mla and fmt.name in ("fp8", "fp8_e4m3") and engine != "sglang":
        # vLLM's sparse-MLA backend stores an fp8 latent as fp8_ds_mla (mla_attention.py converts it)
        fmt = kv_format("fp8_ds_mla")
        notes.append("fp8 on a sparse-attention MLA model is vLLM's fp8_ds_mla: 656 B per token per layer")
    unserved = fmt.unserved(engine, g, args.engine_version)
    if unserved:  # planned when named, as a what-if (the verdicts leave it out)
        notes.append(f"{unserved}; planned with {'vLLM' if engine == 'vllm' else 'SGLang'}'s rules as if it did")
    return fmt


def _resolve_layout(args: DeploymentArgs, prof, given: set, engine: str, m: ModelSpec, g: Optional[GPUSpec],
                    notes: list[str]):
    """Parallelism and the weights' format: what was said, else what the profile measured. Returns (tp, pp, dcp,
    weight dtype, the arguments with the profile's layout applied, the Parallel layout, the all-to-all backend)."""
    sizes = {}
    for name in ("tp", "pp", "dcp"):
        v = getattr(args, name)
        if v is None:
            v = getattr(prof, name, 1) if prof is not None else 1
        check_whole(flag(name), v)
        sizes[name] = v
    tp, pp, dcp = sizes["tp"], sizes["pp"], sizes["dcp"]
    weight_dtype = args.weight_dtype
    if weight_dtype is None and prof is not None:
        weight_dtype = prof.weight_dtype
    if prof is not None and prof.layout and not any(n in given for n in LAYOUT_OPTIONS):
        args = replace(args, **prof.layout)  # the layout the profile's deployment ran
    layout, a2a = parallel_layout(args, engine, m, g, tp, pp, notes)
    check_tp(m, layout.attn_tp)
    if not 1 <= pp <= m.num_layers:
        raise KvplanError(f"--pp must be between 1 and {m.name}'s {m.num_layers} layers, got {pp}")
    if dcp > 1:
        check_dcp(m, tp, dcp)
    return tp, pp, dcp, weight_dtype, args, layout, a2a


def _check_numbers(args: DeploymentArgs, prof, given: set) -> None:
    """Each number in its range, and no combination of options vLLM would ignore without a word."""
    for name in ("gpu_memory_utilization", "mem_fraction_static"):
        v = getattr(args, name)
        try:
            check_positive(name, v)
        except KvplanError:
            raise KvplanError(f"{flag(name)} must be in (0, 1], got {v}") from None
        if v is not None and v > 1:
            raise KvplanError(f"{flag(name)} must be in (0, 1], got {v}")
    for name in ("gpu_memory_gib", "kv_cache_memory_gib", "free_memory_gib"):
        check_positive(name, getattr(args, name))
    for name in ("activation_gib", "non_torch_gib", "cudagraph_gib"):
        check_positive(name, getattr(args, name), zero_ok=True)
    for name in ("num_gpu_blocks_override", "block_size", "page_size", "max_num_seqs", "max_num_batched_tokens",
                 "max_prefill_tokens", "max_running_requests"):
        check_positive(name, getattr(args, name), integer=True)
    if args.entrypoint is not None and args.entrypoint not in ENTRYPOINTS:
        raise KvplanError(f"--entrypoint '{args.entrypoint}': choose serve (vllm serve, the API server) or llm (the "
                          f"offline LLM class)")
    if args.kv_cache_memory_gib is not None:
        for name in ("gpu_memory_utilization", "activation_gib", "non_torch_gib", "cudagraph_gib",
                     "num_gpu_blocks_override"):
            if name in given:
                raise KvplanError(f"--kv-cache-memory sets the pool's size directly, so {flag(name)} has no effect "
                                  f"on it; give one of the two")
    if args.enforce_eager and args.cudagraph_gib is not None:
        raise KvplanError("--enforce-eager captures no CUDA graphs, so --cudagraph-gib has no effect; give one")
    if prof is not None:
        for name in ("activation_gib", "non_torch_gib", "cudagraph_gib"):
            if name in given:
                raise KvplanError(f"the profile's measured non-KV memory replaces the modelled one, so {flag(name)} "
                                  f"has no effect with --profile; give one of the two")


def _resolve_max_model_len(args: DeploymentArgs, prof, m: ModelSpec, engine: str):
    """max_model_len: a token count the model accepts, "auto" (vLLM: the longest that fits), or None (the
    model's)."""
    mlen = args.max_model_len
    if mlen is None and prof is not None:
        mlen = prof.max_model_len
    if isinstance(mlen, str):
        if mlen.strip().lower() in ("auto", "-1"):
            mlen = "auto"
        else:
            raise KvplanError(f"--max-model-len '{mlen}': give a token count or auto")
    elif mlen == -1:
        mlen = "auto"
    elif mlen is not None:
        check_positive("max_model_len", mlen, integer=True)
        mlen = int(mlen)
        refused = max_len_refusal(m, mlen, engine)
        if refused:
            raise KvplanError(refused)
    if mlen == "auto" and engine == "sglang":
        raise KvplanError("--max-model-len auto is vLLM's; SGLang takes a context length (or its model's)")
    return mlen


def _resolve_memory(args: DeploymentArgs, prof, g: Optional[GPUSpec], cal, cal_source, engine: str,
                    needs_memory: bool, notes: list[str]):
    """The memory total and where it came from (--gpu-memory-gib, the profile's measured total, the calibration's,
    the GPU's), and the GPU a total alone suggests. Returns (total bytes, source, GPU, whether the GPU was
    inferred)."""
    total, source = 0, "not used"
    if args.gpu_memory_gib is not None:
        total, source = int(round(args.gpu_memory_gib * GiB)), "--gpu-memory-gib"
    elif prof is not None and prof.total_memory_bytes:
        total, source = prof.total_memory_bytes, f"measured ({prof.source or 'the profile'})"
    elif cal is not None and cal.device.get("memory_total_bytes") and g is not None:
        total, source = int(cal.device["memory_total_bytes"]), f"measured by kvplan measure ({cal_source})"
        notes.append(f"total memory as `kvplan measure` read it on this GPU ({cal_source})")
    elif g is not None:
        total, source = g.memory_total_bytes, f"{g.name}: {g.memory_source}"
    inferred = False
    if g is None and total:
        # the architecture sets vLLM's batch defaults and its workspaces: take the GPU this much memory suggests
        g = gpu_by_memory(total)
        if g is not None:
            inferred = True
            notes.append(f"GPU taken to be {g.name}, the catalog GPU nearest {total / GiB:g} GiB (its architecture "
                         f"sets the engine's batch defaults and workspaces); pass --gpu to name another")
        elif engine == "vllm" and args.kv_cache_memory_gib is None:
            notes.append(f"no catalog GPU has {total / GiB:g} GiB: architecture-dependent defaults and workspaces "
                         f"are those of an unknown GPU; pass --gpu (a catalog name or a YAML spec)")
    if engine == "vllm" and args.kv_cache_memory_gib is not None and not total:
        source = "not used (--kv-cache-memory)"
    measured_free = prof is not None and prof.free_before_load_bytes is not None  # SGLang's, from its log
    if (needs_memory and not total and not measured_free and args.kv_cache_memory_gib is None
            and args.num_gpu_blocks_override is None):
        raise KvplanError("capacity needs --gpu (or --gpu-memory-gib" + (", or --kv-cache-memory)" if engine == "vllm"
                                                                       else ")"))
    return total, source, g, inferred


def _resolve_free_memory(args: DeploymentArgs, total: int, notes: list[str]) -> Optional[int]:
    """--free-memory-gib in bytes, within the GPU's total (a few tenths above it: the whole GPU)."""
    free = _gib_bytes(args.free_memory_gib)
    if free is not None and total and total < free <= total * 1.01:
        notes.append(f"--free-memory-gib {args.free_memory_gib:g} is above the {total / GiB:.2f} GiB total taken for "
                     f"this GPU (drivers differ by a few tenths): the whole GPU taken to be free")
        free = total
    if free is not None and total and free > total:
        raise KvplanError(f"--free-memory-gib {args.free_memory_gib:g} exceeds the GPU's {total / GiB:.2f} GiB in all; "
                          f"give what nvidia-smi or torch.cuda.mem_get_info() shows free")
    return free


def _resolve_vllm(args: DeploymentArgs, prof, common: dict, notes: list[str]) -> Deployment:
    m, g, fmt = common["model"], common["gpu"], common["kv"]
    version = args.engine_version or (prof.engine_version if prof is not None else None)
    rules = vllm_rules(version)
    if newer_release_note(version):
        notes.append(newer_release_note(version))
    if m.vllm_until and version_key(rules.version) > version_key(m.vllm_until):
        raise KvplanError(f"{m.name}: vLLM serves this architecture up to {m.vllm_until} and removed it after; "
                          f"plan it with --engine-version {m.vllm_until} or earlier")
    if m.compressed is not None and args.block_size not in (None, 256):
        raise KvplanError(f"--block-size {args.block_size}: vLLM's DeepSeek-V4 sparse MLA backend takes blocks of 256 "
                          f"tokens only")
    if m.compressed is not None and version_key(rules.version) < version_key("0.33"):
        raise KvplanError(f"{m.name}: DeepSeek-V4's caches are planned with vLLM 0.33's rules only (the release "
                          f"whose layout kvplan follows); use --engine-version 0.33")
    if fmt.name in rules.cache_dtypes_missing:
        raise KvplanError(missing_dtype_message(fmt.name, rules))
    util = args.gpu_memory_utilization
    if util is None and prof is not None and prof.gpu_memory_utilization and args.kv_cache_memory_gib is None:
        util = prof.gpu_memory_utilization
    if util is None:
        util = rules.default_gpu_memory_utilization
    if args.block_size is not None and int(args.block_size) % VLLM_BLOCK_MULTIPLE:
        raise KvplanError(f"--block-size {args.block_size}: vLLM's attention backends take multiples of "
                          f"{VLLM_BLOCK_MULTIPLE} (16, 32, 48, 64, ...); no backend supports it")
    backend, no_backend = resolve_attention_backend(args, common, rules.version, notes)
    common = {**common, "unserved": common["unserved"] or no_backend}
    block = int(args.block_size) if args.block_size is not None else backend.block_size
    entrypoint = args.entrypoint or "serve"
    # batch defaults are taken at the model's own length, so that the pool does not depend on max_model_len
    defaults = serve_defaults(common["total_bytes"], g, rules, m.max_position_embeddings, entrypoint)
    batched = int(args.max_num_batched_tokens) if args.max_num_batched_tokens is not None else None
    seqs = int(args.max_num_seqs) if args.max_num_seqs is not None else None
    seqs_final, batched_final = seqs or defaults.max_num_seqs, batched or defaults.max_num_batched_tokens
    scheduler_rules(seqs_final, batched_final, common["max_model_len"] or m.max_position_embeddings, notes,
                     seqs is not None, batched is not None)
    d = Deployment(
        **common, engine_version=rules.version, gpu_memory_utilization=float(util), block_size=block,
        block_size_given=args.block_size is not None, attention_backend=backend,
        max_num_seqs=seqs or defaults.max_num_seqs,
        max_num_batched_tokens=batched or defaults.max_num_batched_tokens, entrypoint=entrypoint,
        enforce_eager=bool(args.enforce_eager), language_model_only=bool(args.language_model_only),
        kv_cache_memory_bytes=None if args.kv_cache_memory_gib is None else int(round(args.kv_cache_memory_gib * GiB)),
        num_gpu_blocks_override=None if args.num_gpu_blocks_override is None else int(args.num_gpu_blocks_override),
        activation_bytes=_gib_bytes(args.activation_gib), non_torch_bytes=_gib_bytes(args.non_torch_gib),
        cudagraph_bytes=_gib_bytes(args.cudagraph_gib), notes=tuple(notes),
    )
    if prof is not None:
        d = _with_profile(d, prof)
    return d


def _with_profile(d: Deployment, prof) -> Deployment:
    """The profile's measured weights and overhead; re-based where this deployment differs from the measured one in
    what the non-KV memory depends on (layout, batch sizes, eager mode)."""
    source = prof.source or "a startup log"
    then_layout = tuple(sorted(prof.layout.items()))
    same_layout = (d.tp, d.pp, d.weight_dtype, d.layout_options) == (prof.tp, prof.pp, prof.weight_dtype, then_layout)
    differs = [name for name, now, then in (
        ("--tp", d.tp, prof.tp), ("--pp", d.pp, prof.pp), ("--weight-dtype", d.weight_dtype, prof.weight_dtype),
        ("the data- and expert-parallel options", d.layout_options, then_layout),
        ("--max-num-batched-tokens", d.max_num_batched_tokens, prof.max_num_batched_tokens or d.max_num_batched_tokens),
        ("--max-num-seqs", d.max_num_seqs, prof.max_num_seqs or d.max_num_seqs),
        ("--enforce-eager", d.enforce_eager, False)) if now != then]
    base = None
    note = f"non-KV memory measured by {source}"
    if differs:
        if d.layout_options != then_layout:  # the measured configuration's own layout, resolved as this one's
            args = DeploymentArgs(model=d.model, gpu=d.gpu, engine=d.engine, tp=prof.tp, pp=prof.pp, **prof.layout)
            base_layout = args.resolve().parallel
        else:
            base_layout = d.parallel
        base = replace(d, tp=prof.tp, pp=prof.pp, weight_dtype=prof.weight_dtype, parallel=base_layout,
                       layout_options=then_layout,
                       max_num_batched_tokens=prof.max_num_batched_tokens or d.max_num_batched_tokens,
                       max_num_seqs=prof.max_num_seqs or d.max_num_seqs, enforce_eager=False, measured=None)
        note += (f", re-based for {', '.join(differs)} (the measured overhead plus the modelled change"
                 + ("; weights modelled" if not same_layout else "") + ")")
    measured = Measured(prof.weights_bytes if same_layout else None, prof.overhead_bytes or 0, source, base)
    return replace(d, measured=measured, notes=d.notes + (note,))


def _gib_bytes(v: Optional[float]) -> Optional[int]:
    return None if v is None else int(round(v * GiB))


def _calibration(path, gpu: Optional[GPUSpec]) -> tuple:
    """The calibration profile asked for, or one saved for this GPU (kvplan.specs.calibration.calibration_for);
    (None, "") with neither a profile nor a GPU, without reading the calibration module."""
    if path is None and gpu is None:
        return None, ""
    from kvplan.specs.calibration import calibration_for

    return calibration_for(path, gpu)


def _calibration_gpu(path) -> GPUSpec:
    """The catalog GPU a calibration profile was measured on (its device name: the catalog's, or nvidia-smi's)."""
    from kvplan.specs.calibration import CalibrationProfile, load_calibration

    cal = path if isinstance(path, CalibrationProfile) else load_calibration(path)
    where = "the calibration profile" if isinstance(path, CalibrationProfile) else f"the calibration profile {path}"
    measured = str(cal.device.get("name") or "")
    if not measured:
        raise KvplanError(f"{where} does not name the GPU it was measured on; pass --gpu")
    for g in load_catalog("hardware"):
        if measured in (g.name, g.smi_name):
            return g
    raise KvplanError(f"{where} was measured on {measured}, a GPU kvplan's catalog does not hold; pass --gpu (a "
                      f"catalog name or a YAML spec)")


def deployments(args: DeploymentArgs, dtypes, *, needs_memory: bool = False) -> list[Deployment]:
    """One resolved deployment per KV dtype asked for (a profile file is read once for all of them)."""
    args = replace(args, profile=_load_profile(args.profile))
    return [resolve(replace(args, kv_cache_dtype=f), needs_memory=needs_memory) for f in dtypes]


def max_len_refusal(m, mlen: int, engine: str = "vllm") -> Optional[str]:
    """Why the engine refuses a max_model_len beyond the model's own (None when it takes it); nothing positional
    limits a state-space model."""
    if mlen <= m.max_position_embeddings or not m.attention_layers:
        return None
    return (f"--max-model-len {mlen} exceeds {m.name}'s max_position_embeddings {m.max_position_embeddings}; "
            f"{'vLLM' if engine == 'vllm' else 'SGLang'} refuses it (lower it, or use a spec with a longer context)")


