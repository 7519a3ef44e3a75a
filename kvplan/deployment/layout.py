"""How each engine lays a model out over its GPUs from its data- and expert-parallel options, vLLM's rule for
decode-context parallelism, and kvplan's compact spelling of a layout (tp8, tp1,dp8,ep) for comparing several."""

from __future__ import annotations

import re
from typing import Optional

from kvplan.deployment.options import LAYOUT_OPTIONS
from kvplan.errors import KvplanError
from kvplan.rules.sglang import sglang_parallel
from kvplan.rules.vllm import vllm_parallel
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.parallel import Parallel


def layout_options(args) -> tuple:
    """The data- and expert-parallel options `args` sets, as sorted (name, value) pairs."""
    neutral = (None, False)
    return tuple(sorted((n, getattr(args, n)) for n in LAYOUT_OPTIONS if getattr(args, n) not in neutral))


def parallel_layout(args, engine: str, m: ModelSpec, g: Optional[GPUSpec], tp: int, pp: int,
                    notes: list[str]) -> tuple[Parallel, Optional[str]]:
    """The layout the engine builds from the data- and expert-parallel options of `args`, a DeploymentArgs
    (kvplan.rules.vllm.vllm_parallel, kvplan.rules.sglang.sglang_parallel): a plain TP layout when none is given."""
    domain = g.nvlink_domain_size if g is not None else 8
    if engine == "vllm":
        dp = args.data_parallel_size if args.data_parallel_size is not None else 1
        layout, a2a = vllm_parallel(m, tp, pp, dp, args.data_parallel_size_local, bool(args.enable_expert_parallel),
                                    bool(args.enable_eplb), args.num_redundant_experts, args.all2all_backend, domain,
                                    notes)
    else:
        dp = args.dp_size if args.dp_size is not None else 1
        dpa = bool(args.enable_dp_attention)
        if m.sparse_mla and dp > 1 and not dpa:  # server_args.py: DP attention is enabled for DeepSeek NSA
            notes.append(f"--dp-size {dp}: SGLang enables DP attention for DeepSeek sparse attention, so the {tp} GPUs "
                         f"run attention in {dp} groups")
            dpa = True
        layout, a2a = sglang_parallel(m, tp, dp, dpa, args.ep_size, args.moe_a2a_backend,
                                      args.ep_num_redundant_experts, args.moe_dense_tp_size,
                                      bool(args.enable_dp_lm_head), domain, notes)
    return layout, a2a


def check_dcp(m: ModelSpec, tp: int, dcp: int) -> None:
    """vLLM's rule (config/parallel.py, config/model.py): decode-context parallelism reuses TP ranks, so it divides
    TP; on GQA and MQA models it shards the tokens of KV heads that TP replicates, so TP must exceed the KV heads,
    DCP cannot exceed tp // kv_heads, and it divides the query heads per KV head. MLA has none of these limits."""
    if tp % dcp:
        raise KvplanError(f"--dcp {dcp} must divide --tp {tp} (decode-context parallelism reuses the TP ranks)")
    if not m.is_mla:
        most = tp // m.num_kv_heads
        if most < dcp:
            raise KvplanError(
                f"--dcp {dcp}: vLLM shards the tokens of KV heads that TP replicates, and TP {tp} over "
                f"{m.name}'s {m.num_kv_heads} KV heads replicates " + ("none" if most <= 1 else f"each {most}x")
                + f"; the largest DCP at TP {tp} is {max(1, most)} (raise --tp to {m.num_kv_heads * dcp})")
        q_per_kv = m.num_heads // m.num_kv_heads
        if q_per_kv % dcp:
            raise KvplanError(f"--dcp {dcp} must divide {m.name}'s {q_per_kv} query heads per KV head (vLLM's rule "
                              f"for GQA/MQA)")


_LAYOUT_TOKEN = re.compile(r"^(tp|pp|dp|ep)(\d*)$")


def parse_layout(spec: str, engine: str = "vllm") -> dict:
    """A layout written compactly, for comparing several in one command: comma-separated tp<N>, pp<N>, dp<N> and ep
    (vLLM: --enable-expert-parallel, experts over tp x dp) or ep<N> (SGLang: --ep-size N). Under SGLang, dp<N> is
    data-parallel attention in N groups of the --tp GPUs (--dp-size N --enable-dp-attention). Returns the
    DeploymentArgs fields it sets: 'tp8' -> {tp: 8}; 'tp1,dp8,ep' -> {tp: 1, data_parallel_size: 8,
    enable_expert_parallel: True}."""
    out: dict = {}
    for raw in str(spec).lower().replace(" ", "").split(","):
        m = _LAYOUT_TOKEN.match(raw)
        if not m or (m.group(1) != "ep" and not m.group(2)) or (m.group(2) and int(m.group(2)) < 1):
            raise KvplanError(f"--layout '{spec}': '{raw}' is not tp<N>, pp<N>, dp<N> or ep[<N>] (e.g. tp8, or "
                              f"tp1,dp8,ep)")
        kind, n = m.group(1), int(m.group(2)) if m.group(2) else None
        if kind in out or (kind == "ep" and ("enable_expert_parallel" in out or "ep_size" in out)):
            raise KvplanError(f"--layout '{spec}': {kind} given twice")
        if kind in ("tp", "pp"):
            out[kind] = n
        elif kind == "dp":
            if engine == "sglang":
                out.update(dp_size=n, enable_dp_attention=True)
            else:
                out["data_parallel_size"] = n
        elif engine == "sglang":
            if n is None:
                raise KvplanError(f"--layout '{spec}': SGLang's expert parallelism takes a size: ep<N>")
            out["ep_size"] = n
        else:
            out["enable_expert_parallel"] = True
            if n is not None:
                out["_ep_check"] = n
    check = out.pop("_ep_check", None)
    if check is not None:
        tp, dp = out.get("tp", 1), out.get("data_parallel_size", 1)
        if check != tp * dp:
            raise KvplanError(f"--layout '{spec}': vLLM's expert parallelism spans tp x dp = {tp * dp} GPUs, not "
                              f"{check}; write ep alone")
    return out


def layout_label(fields_: dict) -> str:
    """The compact spelling of a layout's fields (parse_layout's inverse, for tables)."""
    parts = [f"tp{fields_.get('tp', 1)}"]
    if fields_.get("pp", 1) > 1:
        parts.append(f"pp{fields_['pp']}")
    dp = fields_.get("data_parallel_size") or fields_.get("dp_size")
    if dp and dp > 1:
        parts.append(f"dp{dp}")
    if fields_.get("enable_expert_parallel"):
        parts.append("ep")
    if fields_.get("ep_size"):
        parts.append(f"ep{fields_['ep_size']}")
    return ",".join(parts)
