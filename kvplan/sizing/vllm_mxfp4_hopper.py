"""gpt-oss's MXFP4 experts on Hopper: what vLLM's TRITON MoE backend holds once it has converted them to
triton_kernels' layouts, and what the conversion leaves allocated and reserved in torch's caching allocator."""

from __future__ import annotations

from kvplan.memo import per_spec
from kvplan.sizing.caching_allocator import CachingAllocator
from kvplan.sizing.model_tensors import padded_vocab
from kvplan.specs.catalog import ModelSpec
from kvplan.units import DTYPE_BYTES, round_up


def mxfp4_hopper_repack(m: ModelSpec, tp: int) -> int:
    """What vLLM's TRITON MXFP4 MoE backend (Hopper) holds beyond the checkpoint's MXFP4 experts once it has
    converted them (oracle/mxfp4.py convert_to_mxfp4_moe_kernel_format, triton_kernels' Hopper layouts): the
    intermediate size padded to 64 per rank; the values transposed and padded to multiples of 64 in both dims; the
    checkpoint's scales kept beside their swizzled copy (rows padded to 256); the biases recast to float32. vLLM 0.19
    on H100 loads gpt-oss-20b at 13.64 GiB where its tensors take 12.83 (7.01 against 6.43 at TP 2)."""
    if m.weight_dtype != "mxfp4" or m.moe is None or "moe" not in m.mlp_kinds:
        return 0
    e, h, i = m.moe.num_experts, m.hidden_size, m.moe.expert_intermediate_size
    n = m.mlp_kinds.count("moe")
    raw_i = i // tp
    ir = round_up(raw_i, 64)
    scale_blocks, raw_scale_blocks = round_up(ir, 32) // 32, round_up(raw_i, 32) // 32  # one scale per 32 values
    values = ((round_up(h // 2, 64) * round_up(2 * ir, 64) - 2 * raw_i * h // 2)
              + (round_up(ir // 2, 64) * round_up(h, 64) - h * raw_i // 2))
    scales_grown = (2 * ir - 2 * raw_i) * (h // 32) + h * (scale_blocks - raw_scale_blocks)
    swizzled_scales = round_up(2 * ir, 256) * (h // 32) + round_up(h, 256) * scale_blocks
    biases = (2 * ir + h) * 2  # float32 copies in place of bfloat16
    return n * e * (values + scales_grown + swizzled_scales + biases)


# The allocations and frees of triton_kernels' HopperMXValueLayout.swizzle_data
# (third_party/triton_kernels/tensor_details/layout_details/hopper_value.py) in the order eager torch makes them, for
# an input whose padded size is S bytes: the pad to multiples of 64, the pad to the mma tile (a copy even when
# nothing is padded: constant_pad_nd clones), permute().contiguous(), then _pack_bits: four int32 fields of S bytes
# each built from the uint8 values (every `&`, `<<`, `>>`, `|` a new tensor; the `x >> 4` slices S/4). "+n"
# allocates S bytes as tensor n, "*n" S/4 bytes, "-n" frees tensor n; tensor 75 is the result that stays.
_HOPPER_VALUE_SWIZZLE = (
    "+0 +1 -0 +2 -1 +3 +4 +5 -4 +6 +7 -6 +8 -5 -7 -3 *9 +10 -9 +11 +12 -11 +13 +14 -13 +15 -12 -14 -10 +16 -15 +17 -8 "
    "-16 +18 +19 +20 -19 +21 +22 -21 +23 -20 -22 -18 *24 +25 -24 +26 +27 -26 +28 +29 -28 +30 -27 -29 -25 +31 -30 +32 "
    "-23 -31 +33 +34 +35 -34 +36 +37 -36 +38 -35 -37 -33 *39 +40 -39 +41 +42 -41 +43 +44 -43 +45 -42 -44 -40 +46 -45 "
    "+47 -38 -46 +48 +49 +50 -49 +51 +52 -51 +53 -50 -52 +54 +55 -54 +56 -53 -55 -48 *57 +58 -57 +59 +60 -59 +61 +62 "
    "-61 +63 -60 -62 +64 +65 -64 +66 -63 -65 -58 +67 -66 +68 -56 -67 +69 +70 -69 +71 -70 +72 +73 -72 +74 -71 -73 +75 "
    "-74 -17 -32 -47 -68 -2")


def _swizzle_value(alloc, S: int) -> int:
    live = {}
    for tok in _HOPPER_VALUE_SWIZZLE.split():
        n = int(tok[1:])
        if tok[0] == "-":
            alloc.free(live.pop(n))
        else:
            live[n] = alloc.malloc(S if tok[0] == "+" else S // 4)
    (kept,) = live.values()
    return kept


def _swizzle_scale(alloc, E: int, rows: int, cols: int) -> int:
    """HopperMXScaleLayout.swizzle_data (hopper_scale.py) on [E, rows, cols] uint8 scales read along rows: the
    transposed view made contiguous twice, padded (rows to 256, cols to 2), and flattened out of its permutation
    (a copy)."""
    raw, padded = E * rows * cols, E * round_up(rows, 256) * round_up(cols, 2)
    a = alloc.malloc(raw)
    b = alloc.malloc(raw)
    alloc.free(a)
    c = alloc.malloc(padded)
    alloc.free(b)
    d = alloc.malloc(padded)
    alloc.free(c)
    return d


@per_spec
def mxfp4_hopper_load(m: ModelSpec, tp: int, rotary: int = 0) -> tuple[int, int, int]:
    """What torch holds allocated once vLLM has loaded an MXFP4 MoE model on Hopper (the TRITON backend), the memory
    that stays reserved but unallocated, and the largest free block in that (`rotary`: the rotary cache's bytes).
    Every layer's experts are swizzled into triton_kernels' Hopper layouts (Mxfp4MoEMethod.process_weights_after_
    loading, oracle/mxfp4.py convert_to_mxfp4_moe_kernel_format, quantization/utils/mxfp4_utils.py _swizzle_mxfp4)
    through temporaries as large as the experts, and the checkpoint-layout experts are freed only after; later
    layers' results and temporaries land in those freed segments, and the segments they leave partly used survive
    the empty_cache() of DeviceMemoryProfiler. Replayed through kvplan.sizing.caching_allocator.CachingAllocator in
    construction order (gpt_oss.py: the embedding; per layer the sinks, qkv and o projections, the router, w13, its
    scales, w2, its scales and the biases (Mxfp4MoEMethod.create_weights), the norms; the final norm and the LM
    head), then the conversion layer by layer. Returns zeros for other models."""
    if m.weight_dtype != "mxfp4" or m.moe is None or "moe" not in m.mlp_kinds:
        return 0, 0, 0

    b, H, E = DTYPE_BYTES[m.dtype], m.hidden_size, m.moe.num_experts
    Ir = round_up(m.moe.expert_intermediate_size // tp, 64)  # mxfp4_round_up_hidden_size_and_intermediate_size
    hd = m.head_dim or H // m.num_heads
    q, kv = m.num_heads // tp, max(1, m.num_kv_heads // tp)
    alloc = CachingAllocator()
    alloc.malloc(-(-padded_vocab(m.vocab_size) // tp) * H * b)
    experts = []
    for i, kind in enumerate(m.mlp_kinds):
        if i == 0 and rotary:
            alloc.malloc(rotary)  # the rotary cache (one, shared by the layers)
        if m.attention_sinks is True or (m.attention_sinks == "sliding" and m.layer_kinds[i] == "sliding"):
            alloc.malloc(q * b)
        alloc.malloc((q + 2 * kv) * hd * H * b)
        if m.qkv_bias:
            alloc.malloc((q + 2 * kv) * hd * b)
        alloc.malloc(H * q * hd * b)
        if m.o_bias:
            alloc.malloc(H * b)
        if kind == "moe":
            alloc.malloc(E * H * b)
            if m.moe.router_bias:
                alloc.malloc(E * b)
            w13, _ = alloc.malloc(E * 2 * Ir * H // 2), alloc.malloc(E * 2 * Ir * H // 32)
            w2, _ = alloc.malloc(E * H * Ir // 2), alloc.malloc(E * H * Ir // 32)
            biases = (alloc.malloc(E * 2 * Ir * b), alloc.malloc(E * H * b)) if m.moe.expert_bias else ()
            experts.append((w13, w2, biases))
        alloc.malloc(H * b)
        alloc.malloc(H * b)
    alloc.malloc(H * b)
    if not m.tie_word_embeddings:
        alloc.malloc(-(-padded_vocab(m.vocab_size) // tp) * H * b)
    for w13, w2, biases in experts:
        if biases:  # the biases in float32 first
            alloc.malloc(E * 2 * Ir * 4)
            alloc.malloc(E * H * 4)
        _swizzle_value(alloc, E * round_up(H // 2, 64) * round_up(2 * Ir, 64))
        _swizzle_scale(alloc, E, 2 * Ir, H // 32)
        _swizzle_value(alloc, E * round_up(Ir // 2, 64) * round_up(H, 64))
        _swizzle_scale(alloc, E, H, Ir // 32)
        for blk in biases + (w13, w2):  # replace_parameter drops the bf16 biases; the old experts go last
            alloc.free(blk)
    alloc.empty_cache()
    return alloc.allocated, alloc.reserved - alloc.allocated, alloc.largest_free_block

