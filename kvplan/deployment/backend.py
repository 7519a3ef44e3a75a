"""The attention backend vLLM runs for a deployment: --attention-backend checked, else the selector's choice."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from kvplan.errors import KvplanError
from kvplan.rules.vllm_backends import Choice, backend_for, facts_of, what_if


def resolve_attention_backend(args, common: dict, release: str, notes: list[str]) -> tuple[Choice, Optional[str]]:
    """The attention backend vLLM runs (kvplan.rules.vllm_backends.backend_for) for `args`, a DeploymentArgs, and
    the deployment's resolved parts in `common`: --attention-backend validated alone, refused in one line where it
    cannot serve; else the selector's first that serves. Where none serves the format on this GPU, vLLM refuses to
    start: the plan goes on as a what-if, said so, with the blocks of a backend that lists the format elsewhere
    (kvplan.rules.vllm_backends.what_if). Returns the choice and, for a what-if, why vLLM cannot run it.""" 
    m, g, fmt, layout = common["model"], common["gpu"], common["kv"], common["parallel"]
    asked = args.attention_backend
    asked = None if asked is None or str(asked).strip().lower() == "auto" else str(asked)
    platform = "rocm" if g is not None and g.vendor == "amd" else "cuda"
    block = int(args.block_size) if args.block_size is not None else None
    facts = facts_of(m, layout.attn_tp, common["dcp"])
    try:
        return backend_for(facts, g.compute_capability if g else None, fmt.name, release, asked, block, platform,
                           g.name if g else "this GPU"), None
    except KvplanError as e:
        if asked is not None:
            raise
        plan = what_if(facts, fmt.name, release)
        why = f"what-if: {e}"
        if not fmt.unserved("vllm", g, args.engine_version):  # (a format no engine serves is said to be a what-if)
            notes.append(f"{why}; planned as if one did, with {plan.family.split(', ')[-1]} ({plan.block_size})")
        return replace(plan, block_size=block or plan.block_size), why
