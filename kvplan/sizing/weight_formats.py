"""How a checkpoint stores a linear layer's weight (bits, scales, zero points), and the GEMM and fused-MoE kernel
families each weight dtype runs on.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from kvplan.errors import KvplanError, did_you_mean
from kvplan.values import frozen_dataclass


@frozen_dataclass
class WeightFormat:
    """How a checkpoint stores a linear layer's weight: bits per element plus its scales and zero points."""

    name: str
    bits: int
    description: str
    scale_group: Optional[int] = None  # elements along the input dim sharing one scale
    scale_bytes: float = 0.0
    zero_bits: int = 0  # packed zero point per group
    block: Optional[int] = None  # square block sharing one scale (DeepSeek's 128x128)
    per_channel_scale_bytes: int = 0
    per_tensor_scale_bytes: int = 0

    def matrix_bytes(self, out_dim: int, in_dim: int) -> int:
        n = out_dim * in_dim
        total = math.ceil(n * self.bits / 8) + self.per_tensor_scale_bytes + out_dim * self.per_channel_scale_bytes
        if self.scale_group:
            groups = out_dim * math.ceil(in_dim / self.scale_group)
            total += math.ceil(groups * self.scale_bytes) + math.ceil(groups * self.zero_bits / 8)
        if self.block:
            total += math.ceil(out_dim / self.block) * math.ceil(in_dim / self.block) * 4
        return total


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in [
        WeightFormat("bf16", 16, "bfloat16"),
        WeightFormat("fp16", 16, "float16"),
        WeightFormat("fp32", 32, "float32"),
        WeightFormat("fp8", 8, "fp8 e4m3, one fp32 scale per tensor (vLLM --quantization fp8)", per_tensor_scale_bytes=4),
        WeightFormat("fp8_block128", 8, "fp8 e4m3, one fp32 scale per 128x128 block (DeepSeek-V3, Kimi-K2)", block=128),
        WeightFormat("fp8_channel", 8, "fp8 e4m3, one fp32 scale per output channel", per_channel_scale_bytes=4),
        WeightFormat("int8", 8, "int8, one fp32 scale per output channel (W8A8)", per_channel_scale_bytes=4),
        WeightFormat("int8_tensor", 8, "int8, one fp32 scale per tensor (W8A8 per-tensor)", per_tensor_scale_bytes=4),
        WeightFormat(
            "int4_g128", 4, "int4, fp16 scale and 4-bit zero point per 128 inputs (AWQ/GPTQ)",
            scale_group=128, scale_bytes=2, zero_bits=4,
        ),
        WeightFormat("nf4", 4, "bitsandbytes NF4, one fp32 absmax per 64", scale_group=64, scale_bytes=4),
        WeightFormat("nf4_double", 4, "bitsandbytes NF4 with double quantization: one 8-bit absmax per 64, an fp32 "
                     "per 256 of those", scale_group=64, scale_bytes=1 + 4 / 256),
        WeightFormat("mxfp4", 4, "e2m1, one e8m0 scale byte per 32 (OCP MX; gpt-oss experts)", scale_group=32, scale_bytes=1),
        WeightFormat(
            "nvfp4", 4, "e2m1, one fp8 e4m3 scale per 16, fp32 global scale per tensor",
            scale_group=16, scale_bytes=1, per_tensor_scale_bytes=4,
        ),
    ]
}


def _int4_format(key: str) -> Optional[WeightFormat]:
    """int4 with a 16-bit scale per `g` inputs (int4_g<g>) or per output channel (int4_channel), with a 4-bit zero
    point per group unless symmetric (_sym): compressed-tensors W4A16 and GPTQ/AWQ, as Marlin keeps them."""
    m = re.fullmatch(r"int4_(?:g([0-9]+)|channel)(_sym)?", key)
    if not m or (m.group(1) and not 1 <= int(m.group(1)) <= 1 << 20):
        return None
    group, sym = (int(m.group(1)) if m.group(1) else None), bool(m.group(2))
    where = f"per {group} inputs" if group else "per output channel"
    if group is None:
        return WeightFormat(key, 4, f"int4, a 16-bit scale {where}" + ("" if sym else " and a 4-bit zero point"),
                            per_channel_scale_bytes=2 if sym else 3)
    return WeightFormat(key, 4, f"int4, a 16-bit scale {where}" + ("" if sym else " and a 4-bit zero point"),
                        scale_group=group, scale_bytes=2, zero_bits=0 if sym else 4)


def weight_format(name: str) -> WeightFormat:
    key = name.lower()
    if key not in WEIGHT_FORMATS and _int4_format(key) is not None:
        return _int4_format(key)
    if key not in WEIGHT_FORMATS:
        raise KvplanError(
            f"unknown weight dtype '{name}'{did_you_mean(name, list(WEIGHT_FORMATS))}; "
            f"choose one of: {', '.join(WEIGHT_FORMATS)}"
        )
    return WEIGHT_FORMATS[key]



def gemm_family(weight_dtype: str) -> tuple[str, str]:
    """The GEMM kernel family a weight dtype runs on, and the family it falls back to where a profile lacks it: the
    one owner of that fact for the step model's fits and the roofline's compute peak. 8-bit integers (W8A8) run on
    the 8-bit tensor cores, at fp8's rate where the GPU has it."""
    w = weight_dtype.lower()
    if w in ("bf16", "fp16", "fp32", "bfloat16", "float16"):
        return "bfloat16", "bfloat16"
    if w == "fp8_block128":
        return "fp8_block", "fp8"
    if w.startswith("fp8") or w.startswith("int8"):
        return "fp8", "bfloat16"
    if w in ("nvfp4", "mxfp4"):
        return "nvfp4", "int4_wo"
    return "int4_wo", "bfloat16"  # int4 (AWQ, GPTQ, W4A16), NF4


def moe_family(weight_dtype: str) -> str:
    """The fused-MoE kernel fit that prices routed experts stored in `weight_dtype`: the GEMM family's, except that
    weight-only 4-bit integer experts (W4A16: AWQ, GPTQ, compressed-tensors pack-quantized) are priced as the
    16-bit fused MoE reading their 4-bit bytes, as mxfp4 experts are where a GPU has no fp4 fit. Measured serving
    agrees with that and not with the collected Marlin MoE timings: Kimi-K2.5 (int4, group 32) on TP 8 adds 18 ms
    (B200) and 21 ms (H200) of TPOT from 4 to 64 clients (1,024 in, 1,024 out), where those timings (moe_perf,
    vllm_marlin_int4_moe, 4 -> 64 tokens: 0.133 -> 1.072 ms per layer on B200, 0.130 -> 1.210 on H200, x 60 MoE
    layers) would add 56 and 65 ms."""
    family = gemm_family(weight_dtype)[0]
    return "bfloat16" if family == "int4_wo" else family
