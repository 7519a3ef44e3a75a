"""The attention backend the engine runs for a deployment: --attention-backend checked, else vLLM's selector's choice
or SGLang's default."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from kvplan.errors import KvplanError
from kvplan.rules.vllm_backends import AttentionFacts, Choice, backend_for, backend_names, facts_of, what_if


def _selector_inputs(model, gpu, parallel, dcp: int) -> tuple[AttentionFacts, Optional[str], str, str]:
    """What vLLM's selector reads of a deployment: the model's attention facts on one rank, the GPU's compute
    capability, the platform (ROCm for an AMD GPU, else CUDA) and the GPU's name for messages."""
    platform = "rocm" if gpu is not None and gpu.vendor == "amd" else "cuda"
    return (facts_of(model, parallel.attn_tp, dcp), gpu.compute_capability if gpu else None, platform,
            gpu.name if gpu else "this GPU")


def resolve_attention_backend(args, common: dict, release: str, notes: list[str]) -> tuple[Choice, Optional[str]]:
    """The attention backend vLLM runs (kvplan.rules.vllm_backends.backend_for) for `args`, a DeploymentArgs, and
    the deployment's resolved parts in `common`: --attention-backend validated alone, refused in one line where it
    cannot serve; else the selector's first that serves. Where none serves the format on this GPU, vLLM refuses to
    start: the plan goes on as a what-if, said so, with the blocks of a backend that lists the format elsewhere
    (kvplan.rules.vllm_backends.what_if). Returns the choice and, for a what-if, why vLLM cannot run it.""" 
    g, fmt = common["gpu"], common["kv"]
    asked = args.attention_backend
    asked = None if asked is None or str(asked).strip().lower() == "auto" else str(asked)
    block = int(args.block_size) if args.block_size is not None else None
    facts, cc, platform, gpu_name = _selector_inputs(common["model"], g, common["parallel"], common["dcp"])
    try:
        return backend_for(facts, cc, fmt.name, release, asked, block, platform, gpu_name), None
    except KvplanError as e:
        if asked is not None:
            raise
        plan = what_if(facts, fmt.name, release)
        why = f"what-if: {e}"
        if not fmt.unserved("vllm", g, args.engine_version):  # (a format no engine serves is said to be a what-if)
            notes.append(f"{why}; planned as if one did, with {plan.family.split(', ')[-1]} ({plan.block_size})")
        return replace(plan, block_size=block or plan.block_size), why


def backends_storing(d) -> list[Choice]:
    """Every attention backend of the deployment's vLLM release that --attention-backend could name for `d`, a
    resolved vLLM Deployment: each validated alone, as resolve_attention_backend validates the one asked for
    (the model, the KV format vLLM stores, the GPU and its platform, --block-size where given), in the order
    kvplan.rules.vllm_backends lists them. Empty where none serves it."""
    facts, cc, platform, gpu_name = _selector_inputs(d.model, d.gpu, d.parallel, d.dcp)
    block = d.block_size if d.block_size_given else None
    found = []
    for name in backend_names(d.engine_version):
        try:
            found.append(backend_for(facts, cc, d.kv.name, d.engine_version, name, block, platform, gpu_name))
        except KvplanError:
            continue
    return found


def resolve_sglang_backend(args, m, g, fmt, page: int, unserved: Optional[str],
                           notes: list[str]) -> tuple[Choice, int, Optional[str]]:
    """The attention backend SGLang runs (kvplan.rules.sglang_backends) for `args`, a DeploymentArgs, the model `m`
    on GPU `g` storing `fmt` with page size `page` asked: --attention-backend checked, else SGLang's default (fa3
    handing fp8_e5m2 to triton, as SGLang does). Returns the choice, the page size that backend sets, and why the
    plan is a what-if where SGLang's default backend does not read the cache (the backend that would, named);
    --attention-backend naming one that cannot serve it is refused in one line."""
    from kvplan.rules import sglang_backends as sb
    from kvplan.rules.sglang import SGLANG_DTYPES

    release = sb.read_release(args.engine_version)
    platform = "rocm" if g is not None and g.vendor == "amd" else "cuda"
    cc = sb.cc_of(g.compute_capability) if g is not None else None
    gpu_name = g.name if g is not None else "this GPU"
    dtype, mla = SGLANG_DTYPES.get(fmt.name, fmt.name), m.is_mla
    since = sb.missing_dtype(dtype, args.engine_version)
    if since is not None:
        raise KvplanError(f"SGLang {args.engine_version} has no --kv-cache-dtype {dtype} (its server_args.py choices "
                          f"gain it in {since}): plan it with --engine-version {since}"
                          + (", or -d fp4_e2m1 for the FP4 cache of this release" if "fp4" in dtype else ""))
    asked = args.attention_backend
    asked = None if asked is None or str(asked).strip().lower() == "auto" else str(asked)
    if asked is not None:
        name = sb.check_name(asked, release, platform)
    else:
        heads = max(1, m.num_kv_heads // max(1, int(args.tp or 1)))
        name = sb.default_backend(release, mla, cc, platform, m.family, bool(m.attention_sinks),
                                  kv_heads=heads)
        if name == "fa3" and dtype == "fp8_e5m2":
            notes.append("fp8_e5m2: SGLang runs triton instead of fa3, which takes fp8_e4m3 only (FlashAttention3 only "
                         "supports fp8_e4m3 if using FP8)")
            name = "triton"
    b = sb.backend(name, release, platform)
    why = sb.refusal(b, name, release, mla, dtype, cc, platform, gpu_name)
    alt = [n for n in sb.serving(release, mla, dtype, cc, platform) if n != name]
    hint = f"; --attention-backend {alt[0]} serves it" if alt else f"; no SGLang {release} backend serves it here"
    if why and asked is not None:
        raise KvplanError(f"--attention-backend {asked}: SGLang {release} cannot serve --kv-cache-dtype {dtype} on "
                          f"{gpu_name} with it ({why}){hint}")
    what_if = None
    if why and not unserved:
        source = sb.DEFAULT_SOURCES[release].split(" ", 2)[-1]
        what_if = f"what-if: SGLang {release}'s default attention backend here is {name} ({source}), and {why}{hint}"
        notes.append(f"{what_if}; planned with its page size as if it did")
    if b is None:  # (a what-if on a platform kvplan plans no such backend for)
        return Choice(name, name, page, release, asked is not None, ""), page, what_if
    set_page = b.page(page)
    if set_page != page:
        notes.append(f"attention backend {name}: SGLang sets page size {set_page}"
                     + (f" (--page-size {page} is not one it takes)" if args.page_size is not None else ""))
    return (Choice(name, b.family, set_page, release, asked is not None, f"SGLang {b.since} {b.source}"), set_page,
            what_if)
