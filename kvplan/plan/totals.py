"""What a whole deployment holds when it has several attention groups (data-parallel ranks), each with its own
requests and KV pool: the totals beside the per-rank figures, and a note saying where they come from."""

from __future__ import annotations

from kvplan.units import GiB


def deployment_totals(d, kv_tokens: float, max_concurrency: float) -> dict:
    """The deployment's KV tokens and concurrency: one rank's pool times the attention groups (DP ranks)."""
    p = d.parallel
    return {"dp": p.dp, "ep": p.ep, "world_size": p.world, "total_kv_tokens": int(kv_tokens) * p.dp,
            "total_max_concurrency": max_concurrency * p.dp}


def layout_note(d, kv_tokens: float, weights: int) -> list[str]:
    """Why the totals are what they are, for a layout other than plain TP."""
    p, m = d.parallel, d.model
    if p.tp_only:
        return []
    out = []
    if p.dp > 1:
        cached = ("its own requests' MLA latents" if m.is_mla else "its own requests' KV") + \
            (f" (the attention split {p.attn_tp} ways inside each)" if p.attn_tp > 1 else "")
        why = (f"; under TP {p.attn_tp * p.dp} every rank would keep the same latent for every request, so the pool "
               f"would not grow with the GPUs" if m.is_mla else "")
        out.append(f"{p.dp} attention groups (data parallel): each caches {cached}, so the deployment holds "
                   f"{p.dp} x {int(kv_tokens):,} = {int(kv_tokens) * p.dp:,} tokens{why}")
    if p.ep > 1 and m.moe:
        e = m.moe.num_experts
        local = p.local_experts(e)
        spare = f" and {p.redundant_experts} redundant replicas" if p.redundant_experts else ""
        whole = []
        if p.attn_tp == 1:
            whole.append("attention")
        if p.dense_tp == 1:
            whole.append("dense MLP and shared-expert")
        held = (f"; each rank holds the {' and '.join(whole)} weights whole" if whole else "")
        out.append(f"expert parallel over {p.ep} ranks: {local} whole experts per rank of the {e} routed{spare}, "
                   f"{weights / GiB:.2f} GiB of weights on the fullest rank{held}")
    return out
