"""The attention backend vLLM runs for a deployment: --attention-backend checked, else the selector's choice."""

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
