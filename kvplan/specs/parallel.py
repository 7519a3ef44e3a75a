"""How a deployment cuts a model across its GPUs, as one rank sees it: the tensor-parallel degree of each part of
the model, how the routed experts are spread, and how many data-parallel attention groups there are.

Plain tensor parallelism (`--tp N`) splits every part N ways. The layouts MoE models are served with cut the parts
differently, and each engine has its own spelling for them (kvplan.deployment reads both):

* vLLM `--data-parallel-size D --tensor-parallel-size T`: D engines, each of T GPUs, each with its own requests and
  its own KV pool; attention, dense MLPs, shared experts and the vocabulary are split T ways inside each. The MoE
  layers span all T x D GPUs: with `--enable-expert-parallel` every GPU holds whole experts (EP = T x D, each
  expert unsplit), without it every expert is split T x D ways (vllm/model_executor/layers/fused_moe/config.py,
  FusedMoEParallelConfig.make: the TP group flattened across DP).
* SGLang `--tp T --dp-size D --enable-dp-attention`: T GPUs in all; attention runs data-parallel in D groups of T/D
  GPUs (each group its own requests and KV pool), while the dense MLPs and the vocabulary stay split T ways and the
  MoE layers T ways as `--ep-size E` x (T / E) (python/sglang/srt/layers/dp_attention.py, server_args.py).

The KV cache follows attention: a rank holds the KV heads of its attention TP (an MLA latent whole on every rank of
the group), and the deployment holds as many independent pools as it has attention groups.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Parallel(NamedTuple):
    """One rank's share of each part of a model. Every degree is >= 1; a TP-only deployment has them all equal. A
    plain tuple underneath: equal layouts are equal (and remembered alike by kvplan.memo)."""

    attn_tp: int = 1  # attention and state mixers: heads and their projections, the KV heads a rank caches
    dense_tp: int = 1  # dense MLP layers and the shared experts
    vocab_tp: int = 1  # the input embedding and the LM head
    moe_tp: int = 1  # each routed expert's intermediate size
    ep: int = 1  # ranks the routed experts are spread over, whole
    redundant_experts: int = 0  # extra expert replicas EPLB places over the EP ranks
    dp: int = 1  # attention groups: each its own requests and KV pool
    world: int = 1  # GPUs of the whole deployment
    domain: int = 8  # GPUs one NVLink domain joins (an HGX node's 8; a GB200 NVL72 rack's 72)

    @classmethod
    def tensor(cls, tp: int, pp: int = 1, domain: int = 8) -> "Parallel":
        """Plain tensor parallelism: every part split `tp` ways."""
        return cls(tp, tp, tp, tp, 1, 0, 1, tp * pp, domain)

    @property
    def tp_only(self) -> bool:
        return self.ep == 1 and self.dp == 1 and len({self.attn_tp, self.dense_tp, self.vocab_tp, self.moe_tp}) == 1

    @property
    def moe_group(self) -> int:
        """The GPUs one MoE layer spans: EP x the experts' own TP."""
        return self.ep * self.moe_tp

    def tp_for(self, part: str) -> int:
        """The tensor-parallel degree a tensor of `part` (kvplan.sizing.model_tensors.Part) is split by."""
        if part in ("attention", "state", "extra", "norm"):
            return self.attn_tp
        if part in ("mlp", "shared_expert"):
            return self.dense_tp
        if part in ("embed", "lm_head"):
            return self.vocab_tp
        if part == "expert":
            return self.moe_tp
        return 1  # the router: whole on every rank

    def domains(self, ranks: int) -> int:
        """NVLink domains a group of `ranks` consecutive GPUs spans (more than one: its traffic crosses the network)."""
        return max(1, -(-ranks // max(1, self.domain)))

    def local_experts(self, num_experts: int) -> int:
        """Routed experts on the fullest EP rank: vLLM's determine_expert_map gives the first (E mod EP) ranks one
        more than E // EP; EPLB's redundant replicas count as experts."""
        return math.ceil((num_experts + self.redundant_experts) / self.ep)


def layout_of(tp) -> Parallel:
    """A Parallel for a plain TP degree (an int), or the layout itself."""
    return tp if isinstance(tp, Parallel) else Parallel.tensor(int(tp))
