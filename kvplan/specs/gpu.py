"""The GPU spec: memory as CUDA reports it, bandwidth, tensor-core rates, NVLink and its domain."""

from typing import ClassVar, Literal, Optional

from pydantic import Field

from kvplan.files import check_finite, read_json, read_yaml, type_name  # noqa: F401  (read_yaml: also imported from here)
from kvplan.specs.model import _Frozen
from kvplan.units import GiB


class GPUSpec(_Frozen):
    name: str
    aliases: tuple[str, ...] = ()
    vendor: Literal["nvidia", "amd", "other"] = "nvidia"
    arch: str
    compute_capability: Optional[str] = None
    smi_name: Optional[str] = None
    memory_gb: float = Field(gt=0, description="marketed capacity")
    smi_total_mib: Optional[int] = Field(None, gt=0, description="total as nvidia-smi (or rocm-smi) prints it")
    cuda_total_gib: Optional[float] = Field(None, gt=0, description="total as cudaMemGetInfo reports it")
    memory_type: Optional[str] = None
    peak_bandwidth_tbps: float = Field(gt=0, description="datasheet peak, 1e12 B/s")
    measured_bandwidth_tbps: Optional[float] = Field(None, gt=0, description="a published stream benchmark")
    dense_tflops: dict[str, float] = Field(default_factory=dict, description="dense tensor-core TFLOP/s per dtype")
    fp8_support: bool = False
    fp4_support: bool = False
    l2_mb: Optional[float] = None
    sm_count: Optional[int] = None
    nvlink_gbps: Optional[float] = None
    nvlink_domain: Optional[int] = Field(None, gt=0, description="GPUs one NVLink domain joins (GB200 NVL72: 72); "
                                         "default 8 with NVLink, else 1")
    pcie_gen: Optional[int] = None
    tdp_w: Optional[float] = None
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    # GPUs lose a little memory to the driver between the nvidia-smi total and what CUDA reports
    # (0.3-0.7 GiB across the GPUs whose both figures are known); used only when CUDA's figure is unknown.
    DRIVER_RESERVE_GIB: ClassVar[float] = 0.5

    @property
    def nvlink_domain_size(self) -> int:
        """GPUs that reach each other over NVLink: an HGX node's 8, a rack-scale system's whole domain, or 1 (PCIe)."""
        return self.nvlink_domain or (8 if self.nvlink_gbps else 1)

    @property
    def memory_total_bytes(self) -> int:
        """Total device memory as vLLM sees it (cudaMemGetInfo), the base of gpu_memory_utilization."""
        return int(round(self.memory_total_gib * GiB))

    @property
    def memory_total_gib(self) -> float:
        if self.cuda_total_gib is not None:
            return self.cuda_total_gib
        if self.smi_total_mib is not None:
            return self.smi_total_mib / 1024 - self.DRIVER_RESERVE_GIB
        return self.memory_gb - self.DRIVER_RESERVE_GIB

    @property
    def memory_source(self) -> str:
        if self.cuda_total_gib is not None:
            return "CUDA total"
        if self.smi_total_mib is not None:
            return "nvidia-smi total - 0.5 GiB (estimate)"
        return "marketed capacity - 0.5 GiB (estimate)"

    @property
    def peak_bandwidth_bytes_per_s(self) -> float:
        return self.peak_bandwidth_tbps * 1e12


def cc_family(gpu: Optional[GPUSpec]) -> Optional[str]:
    """The architecture family the engines' and FlashInfer's per-GPU tables key on ("sm90" Hopper, "sm100" and
    "sm103" Blackwell), from the compute capability; None for other GPUs and for none."""
    cc = (gpu.compute_capability or "") if gpu else ""
    if cc.startswith("9."):
        return "sm90"
    if cc == "10.3":
        return "sm103"
    if cc.startswith("10."):
        return "sm100"
    return None
