"""What vLLM's startup holds on one rank outside torch's caching allocator: the CUDA context, the NCCL and PyNccl
communicators, the custom and symmetric-memory all-reduce buffers, FlashInfer's all-reduce workspace, the libraries'
own memory, and the expert-parallel all-to-all buffers.

Driver- and library-internal where no source constant sizes it; each such figure is what real startup logs show,
and a log of the user's own deployment replaces them.
"""

from __future__ import annotations

from typing import Optional

from kvplan.rules.vllm import VllmRules, vllm_rules
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.gpu import cc_family
from kvplan.units import MiB, round_up

# FlashInfer's all-reduce workspace size per rank (FI_ALLREDUCE_FUSION_MAX_SIZE_MB, in MiB), by arch and TP; SM103
# (B300) doubled its TP 8 size in 0.33
_FI_ALLREDUCE_MB = {"sm90": {2: 64, 4: 2, 8: 0.5}, "sm100": {2: 64, 4: 32, 8: 1}, "sm103": {2: 64, 4: 64, 8: 4}}

# After vLLM's baseline snapshot a single GPU grows by the cuBLAS/cuBLASLt handles made at the first GEMM and the
# CUDA modules loaded lazily at first use (FlashAttention, Inductor's Triton kernels, vLLM's custom ops): vLLM 0.19's
# "non-torch forward increase memory" is 0.24-0.26 GiB in 17 TP-1 runs of 7 models on H100 (0.46 GiB for the Granite
# text models, unexplained), against 0.13 GiB in 0.10's summary line.
LIBRARY_NON_TORCH = 256 * MiB
# The physical granularity of symmetric (multicast-capable) device memory: FlashInfer's all-reduce workspace and
# torch's symmetric-memory buffer are cuMemCreate'd in multiples of cuMulticastGetGranularity(RECOMMENDED)
# (flashinfer/comm/mnnvl.py SymmDeviceMemory). 512 MiB on H100 NVSwitch systems: vLLM 0.19's TP-2 runs grow by the
# same 1.81-1.82 GiB over their TP-1 runs whatever the hidden size (FlashInfer asked for 362 MiB for gpt-oss-20b,
# 450 for Qwen2.5-7B, 514 for Mistral-Small: three buffers of 512 MiB each), and the init snapshot holds 1.02 GiB
# more at TP 2 and 4 alike (the 64 and 32 MiB symmetric-memory buffers both take 512 MiB).
MULTICAST_GRANULARITY = 512 * MiB
# An NCCL communicator's own buffers per rank (channels x peers x protocol buffers; NVLS buffers on NVSwitch systems
# with multicast), by transport. "nvls": vLLM 0.19 with NCCL 2.27.5 on H100 SXM. Torch's process group, made lazily
# inside the profile run before vLLM 0.30: the TP-2 non-torch increase less the libraries (0.25) and FlashInfer's
# 1.5 GiB leaves 0.31-0.36 GiB in five runs. vLLM's PyNccl communicator, made at init: the TP-2 snapshot's 1.02 GiB
# over TP 1, less the 512 MiB symmetric-memory buffer and the custom all-reduce's 24 MiB, leaves 0.49 GiB (and MoE
# models, which make an expert-parallel group too, hold 0.48-0.52 GiB more). Other transports have no measurement:
# NCCL's ring and tree buffers without NVLS (about 9 MiB per channel and peer, 24-32 channels over NVLink, 2-4 over
# PCIe) give the estimates.
# Over PCIe without NVLink (a TP-4 run there shows about 1.4 GiB more non-torch memory than these figures give) vLLM's
# source settles only what is absent: no custom all-reduce beyond two PCIe GPUs, no symmetric-memory buffer, no
# multicast; from 0.29 a single node's FlashInfer all-reduce falls back from mnnvl to its trtllm IPC workspace
# (flashinfer_all_reduce.py get_fi_ar_workspace, allow_trtllm_fallback) on SM90/SM100, tens of MiB at TP 4 where
# P2P lets it be made. The rest is NCCL's own buffers (channels x peers x protocol buffers), which NCCL sizes from the
# topology it detects, not vLLM: the "pcie" figures stay estimates.
TORCH_NCCL_COMMUNICATOR = {"nvls": 328 * MiB, "nvlink": 300 * MiB, "pcie": 64 * MiB}
PYNCCL_COMMUNICATOR = {"nvls": 500 * MiB, "nvlink": 300 * MiB, "pcie": 64 * MiB}
CUSTOM_ALLREDUCE = 24 * MiB  # 8 MiB IPC metadata + 8 MiB IPC buffer + 8 MiB rank_data (custom_all_reduce.py)
# torch symmetric memory's all-reduce buffer by architecture and world size (all_reduce_utils.py
# SYMM_MEM_ALL_REDUCE_MAX_SIZES, MiB), before rounding to the multicast granularity
_SYMM_MEM_MB = {"sm90": {2: 64, 4: 32, 6: 64, 8: 64}, "sm100": {2: 8, 4: 32, 6: 128, 8: 128},
                "sm103": {2: 4, 4: 32, 6: 32, 8: 64}}
# The CUDA context: 0.51 GiB used at vLLM 0.19's init snapshot of every TP-1 run on H100 (driver-internal)
CUDA_CONTEXT = 522 * MiB


def transport(gpu: Optional[GPUSpec], tp: int = 1) -> str:
    """How the `tp` GPUs of one group talk, as NCCL and the symmetric-memory allocators see it: NVSwitch with
    multicast (Hopper and Blackwell SXM at 900 GB/s and up), NVLink without it (A100's NVSwitch, NVLink bridges),
    else PCIe: also a group wider than the GPUs NVLink joins (PCIe cards bridged in pairs, 4 of them at TP 4). vLLM's
    custom all-reduce then stays off (custom_all_reduce.py CustomAllreduce: "not supported on more than two PCIe-only
    GPUs" unless every pair is NVLink-connected)."""
    if gpu is None or gpu.vendor != "nvidia" or tp > gpu.nvlink_domain_size:
        return "pcie"
    bw = gpu.nvlink_gbps or 0
    if bw >= 900 and gpu.arch.startswith(("hopper", "blackwell")):
        return "nvls"
    return "nvlink" if bw >= 600 else "pcie"



# Pipeline stages beyond the weights (a PP-4 run of Qwen3-235B-FP8 on PCIe GPUs leaves about 10% less KV cache than
# kvplan plans): besides the PP group's PyNccl communicator (below) and the IntermediateTensors a later stage keeps
# (vllm_memory), the MRV2 runner's pipeline handler (v1/worker/gpu/pp_utils.py, 0.24 and later) opens a second
# torch NCCL process group over the same PP ranks, "pp_broadcast" (GroupCoordinator.make_sibling_device_group), for
# the sampled-token broadcast. vLLM's source settles that the communicator exists, not what NCCL allocates for it
# (nor whether torch creates it eagerly or at the first broadcast, after the KV cache is sized), so kvplan does not
# charge it; over PCIe NCCL's buffers are the same unknown as below.


def pre_snapshot_bytes(gpu: Optional[GPUSpec], tp: int, version: "str | VllmRules", moe: bool = False,
                       pp: int = 1) -> int:
    """Device memory in use when vLLM takes its baseline snapshot: the CUDA context; with pipeline stages the PP
    group's PyNccl communicator (sends and receives only); with TP > 1 the TP group's PyNccl communicator (a second
    one for a MoE model's expert-parallel group), the custom all-reduce's buffers and the symmetric-memory buffer
    (world sizes 2, 4, 6, 8), and from 0.30 torch's NCCL process group too."""
    kind, fam = transport(gpu, tp), cc_family(gpu)
    # the PP group joins ranks tp apart, one per stage: NVLink-joined only where the whole tp x pp world is
    stages = PYNCCL_COMMUNICATOR[transport(gpu, tp * pp)] if pp > 1 else 0
    if tp < 2:
        return CUDA_CONTEXT + stages
    total = CUDA_CONTEXT + stages + PYNCCL_COMMUNICATOR[kind] * (2 if moe else 1)
    if tp in (2, 4, 6, 8) and kind != "pcie":
        total += CUSTOM_ALLREDUCE
        if kind == "nvls" and tp in _SYMM_MEM_MB.get(fam or "", {}):
            total += round_up(_SYMM_MEM_MB[fam][tp] * MiB, MULTICAST_GRANULARITY)
    if not rules_of(version).lazy_torch_nccl:
        total += TORCH_NCCL_COMMUNICATOR[kind]
    return total



def rules_of(version: str | VllmRules) -> VllmRules:
    """The rules of `version`: a VllmRules as it is, a version string looked up (kvplan.rules.vllm.vllm_rules)."""
    return version if isinstance(version, VllmRules) else vllm_rules(version)


def flashinfer_allreduce_workspace(fam: Optional[str], tp: int, max_bytes: Optional[int] = None,
                                   kind: str = "nvls") -> int:
    """FlashInfer's single-node all-reduce workspace on one rank (trtllm_ar's three buffers: tp x S, tp x 256 fp32
    flags, 3 x tp x S), where S is FI_ALLREDUCE_FUSION_MAX_SIZE_MB for the architecture and TP degree, capped at
    `max_bytes` (the fusion pass caps it at one batch's hidden states). Each buffer is symmetric device memory,
    rounded up to 2 MiB and then to the multicast granularity; without NVSwitch multicast the workspace cannot be
    made and vLLM goes on without it."""
    if tp < 2 or fam not in _FI_ALLREDUCE_MB or kind != "nvls":
        return 0
    table = _FI_ALLREDUCE_MB[fam]
    size = table.get(tp, min(table.values())) * MiB
    if max_bytes is not None:
        size = min(size, max_bytes)
    buffers = (tp * size, tp * 256 * 4, 3 * tp * size)
    return sum(round_up(round_up(n, 2 * MiB), MULTICAST_GRANULARITY) for n in buffers)



def non_torch_memory(rules: VllmRules, gpu: Optional[GPUSpec], fam, tp: int, batch_bytes: int, pp: int,
               enforce_eager: bool, parts: dict) -> int:
    """The memory outside torch's allocator on one rank: the libraries', torch's NCCL communicator and FlashInfer's
    all-reduce workspace (`batch_bytes`: one batch's hidden states). Its parts are added to `parts`."""
    # FlashInfer's all-reduce workspace, made inside the profile run: by the compiled AR+RMSNorm fusion pass
    # (capped at one batch's hidden states; before 0.30 only with a single pipeline stage), or by the standalone
    # FlashInfer all-reduce (0.30+), uncapped, when nothing is compiled
    fusion = not enforce_eager and (rules.flashinfer_allreduce_standalone or pp == 1)
    link = transport(gpu, tp)
    if fusion:
        fi_workspace = flashinfer_allreduce_workspace(fam, tp, batch_bytes, link)
    elif rules.flashinfer_allreduce_standalone:
        fi_workspace = flashinfer_allreduce_workspace(fam, tp, kind=link)
    else:
        fi_workspace = 0
    # torch's NCCL communicator for the TP group, made during the profile run before 0.30; a pipeline-only
    # deployment sends with PyNccl (made at init) and gathers nothing
    torch_nccl = TORCH_NCCL_COMMUNICATOR[link] if tp > 1 and rules.lazy_torch_nccl else 0
    non_torch = LIBRARY_NON_TORCH + torch_nccl + fi_workspace
    parts.update(library_non_torch=LIBRARY_NON_TORCH, torch_nccl_communicator=torch_nccl,
                 flashinfer_allreduce_workspace=fi_workspace, transport=link)

    return non_torch



# DeepEP's buffers, per GPU (vllm/distributed/device_communicators/all2all.py DeepEPHTAll2AllManager and
# DeepEPLLAll2AllManager, vllm/envs.py): VLLM_DEEPEP_BUFFER_SIZE_MB (1024) of NVLink buffer for either mode, the same
# again as RDMA buffer for high-throughput mode across nodes, and for low-latency mode the RDMA buffer DeepEP's
# get_low_latency_rdma_size_hint asks for: double-buffered dispatch (fp8 values, a scale per 128, a 16-byte header)
# and combine (bf16 plus a header) slots for every expert x VLLM_MOE_DP_CHUNK_SIZE (256) tokens, about
# 4 x E x T x (2 x hidden + 16) bytes (deep_ep 1.0.0 csrc/kernels/internode_ll.cu). They are made with cudaMalloc and
# NVSHMEM after vLLM's memory snapshot (prepare_communication_buffer_for_model), so they come out of the KV pool.
DEEPEP_BUFFER_BYTES = 1024 * MiB
MOE_DP_CHUNK_TOKENS = 256


def all2all_buffer_bytes(m: ModelSpec, backend: Optional[str], cross_node: bool) -> int:
    """The all-to-all buffers one rank's MoE layers allocate under `backend` (0 for the NCCL-based ones)."""
    if backend == "deepep_high_throughput":
        return DEEPEP_BUFFER_BYTES * (2 if cross_node else 1)
    if backend == "deepep_low_latency" and m.moe is not None:
        return DEEPEP_BUFFER_BYTES + 4 * m.moe.num_experts * MOE_DP_CHUNK_TOKENS * (2 * m.hidden_size + 16)
    return 0
