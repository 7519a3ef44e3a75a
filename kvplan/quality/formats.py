"""Each KV format as a store: K and V written into the format's bytes, as the engine writes them, and read back
through the format's reference dequantizer. One implementation per format: the torch references beside kvplan's
Triton kernels (kernels/), which the kernel tests hold the kernels to. The MX formats, which no kvplan kernel reads,
and the parametric custom formats are written here, after the OCP MX rule and the custom format's own description.

A `LayerStore` is one layer's cache: it takes each chunk of new (post-RoPE) keys and values [tokens, kv_heads, d],
and holds what attention reads back. Formats whose scales span tokens (KIVI's per-channel keys, a custom format by
channel) quantize a group of tokens once it is whole; the newest tokens (the residual window, and a group not yet
whole) stay in the model dtype, as the format stores them.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from kvplan.errors import KvplanError
from kvplan.quality import STORED_FAMILIES
from kvplan.specs.kv_formats import KVFormat

Tensors = tuple[torch.Tensor, torch.Tensor]
Encode = Callable[[torch.Tensor, torch.Tensor], Tensors]  # K, V [tokens, kv_heads, d] -> stored and read back


class LayerStore:
    """One layer's KV cache in one format. `keys` / `values`: what attention reads, [tokens, kv_heads, d] fp32;
    `raw_keys` / `raw_values`: what was written, for the errors."""

    def __init__(self, encode: Optional[Encode], group_tokens: int = 1, residual: int = 0):
        self.encode = encode  # None: kept as written (the model dtype)
        self.group_tokens = group_tokens
        self.residual = residual
        self.raw_keys = self.raw_values = None
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self.quantized = 0  # tokens already in the format

    @property
    def exact(self) -> bool:
        return self.encode is None

    @property
    def windowed(self) -> bool:
        """Whether the newest tokens wait in the model dtype (a residual window, or token groups not yet whole)."""
        return self.encode is not None and (self.group_tokens > 1 or self.residual > 0)

    def read_mask(self, queries: int) -> torch.Tensor:
        """For the newest `queries` tokens as queries, which of [stored copies; written copies] of the tokens
        each reads [queries, 2 x tokens] (bool): token j from the format where j < quantized_len(p + 1), as
        written where that <= j <= p (the residual window as of decoding token p)."""
        from kvplan.kernels.kivi_attention import quantized_len

        n = self.raw_keys.shape[0]
        p = torch.arange(n - queries, n, device=self.raw_keys.device)
        held = torch.tensor([quantized_len(int(t) + 1, self.group_tokens, self.residual) for t in p],
                            device=p.device)
        j = torch.arange(n, device=p.device)
        stored = j[None, :] < held[:, None]
        written = (j[None, :] >= held[:, None]) & (j[None, :] <= p[:, None])
        return torch.cat([stored, written], dim=1)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        k, v = k.float(), v.float()
        self.raw_keys = k if self.raw_keys is None else torch.cat([self.raw_keys, k])
        self.raw_values = v if self.raw_values is None else torch.cat([self.raw_values, v])
        if self.encode is None:
            return
        from kvplan.kernels.kivi_attention import quantized_len  # KIVI's rule: whole groups, the residual after

        target = quantized_len(self.raw_keys.shape[0], self.group_tokens, self.residual)
        if target > self.quantized:
            kq, vq = self.encode(self.raw_keys[self.quantized:target], self.raw_values[self.quantized:target])
            self._k.append(kq)
            self._v.append(vq)
            self.quantized = target

    @property
    def keys(self) -> torch.Tensor:
        return self._read(self._k, self.raw_keys)

    @property
    def values(self) -> torch.Tensor:
        return self._read(self._v, self.raw_values)

    def _read(self, stored: list, raw: torch.Tensor) -> torch.Tensor:
        if self.encode is None:
            return raw
        return torch.cat(stored + [raw[self.quantized:]])


def _with_layout(fmt: KVFormat | str, d: int, write, read) -> Encode:
    """A format whose torch writer and reader take (cache, layout, ...): K and V written into a cache of one block
    holding the chunk's tokens at slots 0..n-1, and read back."""
    from kvplan.kernels.layouts import slot_layout

    layout = slot_layout(fmt, d)

    def encode(k: torch.Tensor, v: torch.Tensor) -> Tensors:
        cache = torch.zeros(1, k.shape[0], k.shape[1], layout.slot_bytes, dtype=torch.uint8, device=k.device)
        write(cache, layout, torch.arange(k.shape[0], device=k.device), k, v)
        kh, vh = read(cache, layout)
        return kh[0], vh[0]

    return encode


def _paged(fmt_name: str, d: int) -> Encode:
    """The formats kernels/paged_attention.py reads: bf16, fp16, fp8 e4m3 / e5m2 with per-tensor scales (1.0, what
    vLLM uses when the checkpoint carries none), int8 and fp8 per token and head."""
    from kvplan.kernels.paged_attention import dequantize_cache, write_kv

    return _with_layout(fmt_name, d, write_kv, dequantize_cache)


def _nvfp4(fmt: KVFormat, d: int) -> Encode:
    """NVFP4: the fp32 global scale is the layer's, fixed by the first chunk written (vLLM holds it per layer); a
    later value past it saturates at the block scale's largest e4m3, as the engine's would."""
    from kvplan.kernels.nvfp4_attention import dequantize_cache_nvfp4, global_scale, write_kv_nvfp4

    scales: list[float] = []

    def write(cache, layout, slots, k, v):
        if not scales:
            scales.extend([global_scale(k), global_scale(v)])
        write_kv_nvfp4(cache, layout, slots, k, v, *scales)

    return _with_layout(fmt, d, write, lambda cache, layout: dequantize_cache_nvfp4(cache, layout, *scales))


def _kivi(fmt: KVFormat, d: int) -> Encode:
    """KIVI: each whole group of tokens through kernels/kivi_attention.py's encode_group and decode_group."""
    from kvplan.kernels.kivi_attention import decode_group, encode_group
    from kvplan.kernels.layouts import slot_layout

    layout = slot_layout(fmt, d)
    g = fmt.params["group"]

    def encode(k: torch.Tensor, v: torch.Tensor) -> Tensors:
        parts = [decode_group(encode_group(k[s:s + g], v[s:s + g], layout), layout) for s in range(0, k.shape[0], g)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    return encode


# ----------------------------------------------------------------------------------------------------------------
# The MX formats (SGLang's mxfp8, fp4_mx_block16 and fp4_e2m1): no kvplan kernel reads them. OCP Microscaling
# Formats (MX) v1.0, section 6.3: a block's shared scale is the power of two 2^(floor(log2(amax)) - emax), emax the
# element format's largest exponent (8 for e4m3, 2 for e2m1), stored as an e8m0 byte; each element is x / scale
# rounded to the element format, saturating at its largest normal (448, 6).

_MX_ELEMENTS = {"mxfp8": ("e4m3", 32), "fp4_mx_block16": ("e2m1", 16), "fp4_e2m1": ("e2m1", 16)}


def mx_round_trip(x: torch.Tensor, element: str, block: int) -> torch.Tensor:
    """x [..., d] stored as MX blocks of `block` values along the last dimension and read back (fp32)."""
    from kvplan.kernels.nvfp4_attention import _decode_codes, _nearest_codes

    emax, top = (8, 448.0) if element == "e4m3" else (2, 6.0)
    blocks = x.float().unflatten(-1, (-1, block))
    amax = blocks.abs().amax(-1, keepdim=True)
    exponent = torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - emax
    scale = torch.exp2(exponent.clamp(-127, 127))  # the e8m0 byte holds exponents -127..127
    y = (blocks / scale).clamp(-top, top)
    if element == "e4m3":
        back = y.to(torch.float8_e4m3fn).float()
    else:
        back = _decode_codes(_nearest_codes(y))
    return (back * scale).flatten(-2)


def _mx(fmt: KVFormat) -> Encode:
    element, block = _MX_ELEMENTS[fmt.name]
    return lambda k, v: (mx_round_trip(k, element, block), mx_round_trip(v, element, block))


# ----------------------------------------------------------------------------------------------------------------
# custom:... formats: uniform codes, scales (and zero points) rounded to the dtypes the format names


def _rounder(name: str, what: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name in ("fp16", "bf16", "fp32"):
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]
        return lambda t: t.to(dt).float()
    if name == "fp8":
        return lambda t: t.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    if name == "e8m0" and what == "scale":
        return lambda t: torch.exp2(torch.ceil(torch.log2(t.clamp_min(2.0**-127))))
    raise KvplanError(f"kvplan quality stores a custom format's {what} as fp16, bf16, fp32, fp8"
                      f"{' or e8m0' if what == 'scale' else ''}, not {name}")


def uniform_round_trip(x: torch.Tensor, bits: int, dim: int, scale: Callable, zero: Optional[Callable]) -> torch.Tensor:
    """x quantized to b-bit uniform codes with one scale (and zero point) per slice along `dim`, read back.
    Asymmetric with a zero point: x ~ scale x code + zero, codes 0..2^b-1; symmetric without: x ~ scale x code,
    codes -(2^(b-1)-1)..2^(b-1)-1."""
    x = x.float()
    if zero is not None:
        lo, hi = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
        s = scale(((hi - lo) / (2**bits - 1)).clamp_min(1e-8)).clamp_min(1e-8)
        z = zero(lo)
        return torch.round((x - z) / s).clamp(0, 2**bits - 1) * s + z
    top = 2 ** (bits - 1) - 1
    if top < 1:
        raise KvplanError("a custom format of 1 bit needs a zero point (zero=fp16): symmetric codes need 2 bits")
    s = scale((x.abs().amax(dim, keepdim=True) / top).clamp_min(1e-8)).clamp_min(1e-8)
    return torch.round(x / s).clamp(-top, top) * s


def _custom(fmt: KVFormat, d: int) -> tuple[Encode, int]:
    """(the store, tokens per group): a side by token groups `group` channels of a token (the whole head without a
    group); by channel, one scale per channel over `group` tokens."""
    opts = dict(part.split("=", 1) for part in fmt.name.split(":", 1)[1].split(",") if "=" in part)
    group = int(opts.get("group", 0))
    axis = opts.get("axis", "token")
    axes = {"token": ("token", "token"), "channel": ("channel", "channel"), "kivi": ("channel", "token")}[axis]
    k_axis, v_axis = opts.get("k_axis", axes[0]), opts.get("v_axis", axes[1])
    scale_name = opts.get("scale", "fp16" if group else "none")
    if scale_name == "none":
        raise KvplanError(f"{fmt.name} has no scale, so its codes are not values: give scale=fp16 (or bf16, fp32, "
                          f"fp8, e8m0)")
    scale = _rounder(scale_name, "scale")
    zero = None if opts.get("zero", "none") == "none" else _rounder(opts["zero"], "zero")
    bits = {"k": int(opts.get("k_bits", opts.get("bits", 0))), "v": int(opts.get("v_bits", opts.get("bits", 0)))}
    if group and k_axis == "token" and v_axis == "token" and d % group:
        raise KvplanError(f"{fmt.name}: group {group} does not divide the head dimension {d}")
    if "channel" in (k_axis, v_axis) and not group:
        raise KvplanError(f"{fmt.name}: a side by channel needs group= (the tokens that share a channel's scale)")

    def side(x: torch.Tensor, b: int, ax: str) -> torch.Tensor:
        if ax == "channel":  # [G x groups, h, d]: one scale per channel over each group of tokens
            return uniform_round_trip(x.unflatten(0, (-1, group)), b, 1, scale, zero).flatten(0, 1)
        if group:
            return uniform_round_trip(x.unflatten(-1, (-1, group)), b, -1, scale, zero).flatten(-2)
        return uniform_round_trip(x, b, -1, scale, zero)

    tokens = group if "channel" in (k_axis, v_axis) else 1
    return (lambda k, v: (side(k, bits["k"], k_axis), side(v, bits["v"], v_axis))), tokens


# ----------------------------------------------------------------------------------------------------------------


def check_format(fmt: KVFormat, head_dim: int) -> None:
    """Refuse, in one line, a format kvplan cannot store at this head dimension (before any model is loaded)."""
    if fmt.applies_to == "mla":
        raise KvplanError(f"{fmt.name} stores DeepSeek's MLA latent; kvplan quality measures K and V caches "
                          f"(multi-head and grouped-query attention)")
    if fmt.family not in STORED_FAMILIES:
        raise KvplanError(f"kvplan quality has no store for {fmt.name}: vLLM writes it with kernels kvplan does not "
                          f"reproduce")
    power_of_two = fmt.family == "turboquant" and fmt.params.get("key_bits") != 8 or fmt.name == "int4_per_token_head"
    if power_of_two and head_dim & (head_dim - 1):
        raise KvplanError(f"{fmt.name} rotates keys by a Hadamard matrix: it needs a power-of-two head dimension, "
                          f"not {head_dim}")
    block = 16 if fmt.family in ("nvfp4", "mx") else fmt.params.get("group", 1) if fmt.family == "kivi" else 1
    if fmt.name == "mxfp8":
        block = 32
    if head_dim % block:
        raise KvplanError(f"{fmt.name} stores blocks of {block} values: head dimension {head_dim} is not a multiple")


def layer_store(fmt: KVFormat, head_dim: int, skipped: bool = False) -> LayerStore:
    """A fresh cache layer in `fmt` (in the model dtype where the layer is `skipped`, or the format is the model's
    own)."""
    check_format(fmt, head_dim)
    if skipped or fmt.name == "auto":
        return LayerStore(None)
    residual = fmt.residual_tokens
    if fmt.family == "custom":
        encode, tokens = _custom(fmt, head_dim)
        return LayerStore(encode, tokens, residual)
    if fmt.family == "kivi":
        return LayerStore(_kivi(fmt, head_dim), fmt.params["group"], residual)
    if fmt.family == "nvfp4":
        return LayerStore(_nvfp4(fmt, head_dim), 1, residual)
    if fmt.family == "mx":
        return LayerStore(_mx(fmt), 1, residual)
    if fmt.name == "int4_per_token_head":
        from kvplan.kernels.int4_attention import dequantize_cache_int4, write_kv_int4

        return LayerStore(_with_layout(fmt, head_dim, write_kv_int4, dequantize_cache_int4), 1, residual)
    if fmt.family == "turboquant":
        from kvplan.kernels.turboquant_attention import dequantize_cache_turboquant, write_kv_turboquant

        return LayerStore(_with_layout(fmt, head_dim, write_kv_turboquant, dequantize_cache_turboquant), 1, residual)
    # fp8_inc stores the bytes of fp8 e4m3 with a per-tensor scale (on Gaudi)
    return LayerStore(_paged("fp8" if fmt.name == "fp8_inc" else fmt.name, head_dim), 1, residual)

