"""Where each byte of a cache slot sits, computed from the format catalog (kvplan.specs.kv_formats), so that what a
kernel
reads and what the planner counts are one description.

A slot is one token of one KV head: the K side's components in catalog order, then the V side's. The paged cache
is a uint8 tensor [num_blocks, block_size, num_kv_heads, slot_bytes].
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.specs.kv_formats import KVFormat, kv_format

# formats the paged decode kernel reads, and its mode number for each
KERNEL_MODES = {"bfloat16": 0, "auto": 0, "float16": 5, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 2,
                "int8_per_token_head": 3, "fp8_per_token_head": 4, "int4_per_token_head": 6, "nvfp4": 7,
                "nvfp4_4over6": 7, "turboquant_k8v4": 8, "turboquant_4bit_nc": 8, "turboquant_k3v4_nc": 8,
                "turboquant_3bit_nc": 8, "kivi2": 9, "kivi4": 9}


@dataclass(frozen=True)
class SlotLayout:
    fmt: KVFormat
    head_dim: int
    k_data: int  # byte offset of K's values
    k_scale: int  # byte offset of K's per-token fp32 scale, -1 when the format has none
    v_data: int
    v_scale: int
    slot_bytes: int

    @property
    def mode(self) -> int:
        return KERNEL_MODES[self.fmt.name]


def slot_layout(fmt: KVFormat | str, head_dim: int, model_bits: int = 16) -> SlotLayout:
    fmt = kv_format(fmt) if isinstance(fmt, str) else fmt
    if fmt.name not in KERNEL_MODES:
        raise NotImplementedError(f"no decode kernel reads {fmt.name} yet")
    offsets: dict[str, int] = {}
    at = 0
    for side, comps in (("k", fmt.k), ("v", fmt.v)):
        for c in comps:
            key = f"{side}_{'scale' if c.per in ('vector', 'group', 'token_group') else 'data'}"
            offsets.setdefault(key, at)
            at += int(c.size_bytes(head_dim, model_bits))
    layout = SlotLayout(fmt, head_dim, offsets["k_data"], offsets.get("k_scale", -1), offsets["v_data"],
                        offsets.get("v_scale", -1), at)
    assert layout.slot_bytes == fmt.bytes_per_token_per_kv_head(head_dim, model_bits=model_bits)
    return layout
