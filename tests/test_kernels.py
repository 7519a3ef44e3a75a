"""kvplan's Triton kernels under the interpreter (TRITON_INTERPRET=1) on small shapes, against plain torch
references. Skipped, with the reason, where torch or triton is missing."""

import math
import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch", reason="the kernels need torch: pip install '.[test]'")
pytest.importorskip("triton", reason="the kernels need triton: pip install '.[test]'")

from kvplan.kernels.layouts import KERNEL_MODES, slot_layout  # noqa: E402
from kvplan.kernels.paged_attention import (  # noqa: E402
    dequantize_cache,
    make_cache,
    paged_decode,
    paged_decode_reference,
    write_kv,
)
from kvplan.kernels.stream import copy_probe, read_probe, read_probe_reference  # noqa: E402

from kvplan.specs.kv_formats import kv_format  # noqa: E402

FORMATS = ["bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head"]


def _assert_matches_reference(out, q, k_all, v_all, table, lens, bs, tol):
    """Plain attention over each sequence's dequantized K and V [blocks, bs, kv_heads, d], gathered through the
    block table, against the kernel's output."""
    heads, kv_heads, d = q.shape[1], k_all.shape[2], q.shape[2]
    for s, n in enumerate(lens):
        blocks = table[s, : (n + bs - 1) // bs].long()
        k = k_all[blocks].reshape(-1, kv_heads, d)[:n].repeat_interleave(heads // kv_heads, 1)
        v = v_all[blocks].reshape(-1, kv_heads, d)[:n].repeat_interleave(heads // kv_heads, 1)
        p = (torch.einsum("hd,nhd->hn", q[s].float(), k) / math.sqrt(d)).softmax(-1)
        torch.testing.assert_close(out[s], torch.einsum("hn,nhd->hd", p, v), atol=tol, rtol=tol)


@pytest.mark.parametrize("fmt", sorted(KERNEL_MODES))
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_slot_layout_is_the_catalogs(fmt, head_dim):
    layout = slot_layout(fmt, head_dim)
    assert layout.slot_bytes == kv_format(fmt).bytes_per_token_per_kv_head(head_dim)
    d = head_dim
    if fmt.endswith("per_token_head"):  # [K values][K fp32 scale][V values][V fp32 scale]; int4: two per byte
        vb = d // 2 if fmt.startswith("int4") else d
        assert (layout.k_scale, layout.v_data, layout.v_scale) == (vb, vb + 4, 2 * vb + 4)
    elif fmt.startswith("nvfp4"):  # [K e2m1 pairs][K e4m3 scale per 16][V pairs][V scales]
        assert (layout.k_scale, layout.v_data, layout.v_scale) == (d // 2, d // 2 + d // 16, d + d // 16)
    elif fmt.startswith("turboquant"):  # [K codes or fp8][K fp16 norm][V codes][V fp16 scale, fp16 zero]
        kb, vb = layout.fmt.params["key_bits"], layout.fmt.params["value_bits"]
        k_bytes = d if kb == 8 else -(-d * kb // 8)
        norm = 0 if kb == 8 else 2
        assert layout.k_scale == (-1 if kb == 8 else k_bytes)
        assert (layout.v_data, layout.v_scale) == (k_bytes + norm, k_bytes + norm + -(-d * vb // 8))
    elif fmt.startswith("kivi"):  # [K codes][K scales, zeros: this token's d/32 channels][V codes][V scales, zeros]
        from kvplan.kernels.kivi_attention import _offsets

        o = _offsets(layout)
        assert (layout.k_scale, layout.v_data, layout.v_scale) == (o["k_scale"], o["v_codes"], o["v_scale"])
        bits = layout.fmt.params["bits"]
        assert (o["k_scale"], o["v_codes"]) == (d * bits // 8, d * bits // 8 + 2 * (d // 32) * 2)
    else:  # values only: per-tensor scales are layer parameters, not in the pool
        assert layout.k_scale == layout.v_scale == -1 and layout.v_data == layout.slot_bytes // 2


def _filled_cache(fmt, lens, kv_heads=2, d=64, bs=16, k_scale=0.05, v_scale=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks_needed = [(n + bs - 1) // bs for n in lens]
    nb = sum(blocks_needed) + 3
    cache, layout = make_cache(fmt, nb, bs, kv_heads, d)
    table = torch.zeros(len(lens), max(blocks_needed), dtype=torch.int32)
    perm = torch.randperm(nb, generator=g)  # blocks scattered over the pool, as a block allocator leaves them
    used = 0
    for s, n in enumerate(lens):
        table[s, : blocks_needed[s]] = perm[used:used + blocks_needed[s]]
        used += blocks_needed[s]
        pos = torch.arange(n)
        slots = table[s, pos // bs].long() * bs + pos % bs
        write_kv(cache, layout, slots, torch.randn(n, kv_heads, d, generator=g), torch.randn(n, kv_heads, d, generator=g),
                 k_scale, v_scale)
    return cache, layout, table, torch.tensor(lens, dtype=torch.int32)


# splits: the context of each sequence over 1 program walking tiles of 64 tokens (the default tile: every
# sequence here ends inside its first tile), or over 3 programs walking tiles of 16 (3 x 16 tokens here: a 5-token
# sequence leaves two splits empty, a 37-token one uses all three), folded by combine_splits
@pytest.mark.parametrize("splits, tile", [(1, 64), (3, 16)])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (4, 4), (6, 1)])  # GQA, MHA, MQA (group of 6: padded)
def test_paged_decode_matches_reference(fmt, heads, kv_heads, splits, tile):
    lens = [5, 37, 16, 1]  # ragged, one exactly a block, one a single token
    cache, layout, table, ctx = _filled_cache(fmt, lens, kv_heads=kv_heads)
    q = torch.randn(len(lens), heads, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out = paged_decode(q, cache, layout, table, ctx, k_scale=0.05, v_scale=0.05, splits=splits, tile=tile)
    ref = paged_decode_reference(q, cache, layout, table, ctx, k_scale=0.05, v_scale=0.05)
    # both read the same stored bytes; they differ by fp32 summation order and the bf16 output's rounding
    torch.testing.assert_close(out.float(), ref.float(), atol=1.6e-2, rtol=1e-2)


@pytest.mark.parametrize("fmt, bound", [
    ("bfloat16", lambda x, s: x.abs() * 2**-8),        # bf16 keeps 8 significant bits
    ("fp8_e4m3", lambda x, s: x.abs() * 2**-4 + 2**-9 * s),  # 3 mantissa bits: half an ulp is 2^-4 relative
    ("fp8_e5m2", lambda x, s: x.abs() * 2**-3 + 2**-16 * s),
    ("int8_per_token_head", lambda x, s: x.abs().amax(-1, keepdim=True) / 254 + 1e-7),  # half a step of amax/127
    ("fp8_per_token_head", lambda x, s: x.abs() * 2**-4 + x.abs().amax(-1, keepdim=True) / 448 * 2**-9),
])
def test_quantize_dequantize_error_bound(fmt, bound):
    cache, layout = make_cache(fmt, 2, 16, 2, 128)
    x = torch.randn(32, 2, 128, generator=torch.Generator().manual_seed(3))
    write_kv(cache, layout, torch.arange(32), x, -x, k_scale=0.05, v_scale=0.05)
    k, v = dequantize_cache(cache, layout, 0.05, 0.05)
    k = k.view(32, 2, 128)
    assert ((k - x).abs() <= bound(x, 0.05)).all()
    torch.testing.assert_close(v.view(32, 2, 128), -k)  # symmetric formats: -x stores as -q


def test_stream_probes():
    buf = torch.randint(0, 256, (3 * 4096 * 4 + 40,), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    assert torch.equal(read_probe(buf), read_probe_reference(buf))
    assert torch.equal(copy_probe(buf), buf)


def test_split_plan():
    from kvplan.kernels.common import split_plan

    cpu = torch.device("cpu")
    assert split_plan(4, 2, 48, 16, cpu) == (1, 48)  # one split off the GPU by default
    assert split_plan(4, 2, 48, 16, cpu, splits=3) == (3, 16)
    assert split_plan(4, 2, 48, 16, cpu, splits=5) == (3, 16)  # 48 / 5 rounds up to one 16-token tile: 3 splits
    assert split_plan(2, 2, 208, 32, cpu, splits=3) == (3, 96)  # 70 tokens rounded up to 3 groups of 32


def test_softmax_scale_and_single_token():
    # one cached token: attention returns its value exactly (softmax of one score is 1)
    cache, layout, table, ctx = _filled_cache("bfloat16", [1], kv_heads=1, d=64)
    q = torch.randn(1, 2, 64).to(torch.bfloat16)
    _, v = dequantize_cache(cache, layout)
    out = paged_decode(q, cache, layout, table, ctx)
    first = table[0, 0].long()
    torch.testing.assert_close(out[0].float(), v[first, 0, 0].expand(2, 64), atol=1e-2, rtol=0)
    assert math.isclose(1 / math.sqrt(64), 0.125)


def test_hadamard_rotation_identities():
    from kvplan.kernels.int4_attention import hadamard, rotate, unrotate

    h = hadamard(64)
    torch.testing.assert_close(h @ h, 64 * torch.eye(64))  # H H = d I: symmetric, orthogonal up to sqrt(d)
    x, y = torch.randn(5, 64), torch.randn(5, 64)
    torch.testing.assert_close(unrotate(rotate(x)), x, atol=1e-5, rtol=0)
    # rotating both sides scales every dot product by d: <Hq, Hk> = d <q, k>
    torch.testing.assert_close((rotate(x) * rotate(y)).sum(-1), 64 * (x * y).sum(-1), atol=1e-3, rtol=1e-5)
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(96)


def test_int4_zero_point_in_the_scale():
    from kvplan.kernels.int4_attention import decode_int4, encode_int4, rotate

    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(5))
    data, scale_bytes = encode_int4(x)
    assert data.shape == (40, 64) and scale_bytes.shape == (40, 4)  # 128 values in 64 bytes + one fp32
    bits = scale_bytes.view(torch.int32)
    zp = bits & 0xF
    assert ((zp >= 0) & (zp <= 15)).all()
    y = rotate(x)
    s = (bits & ~0xF).view(torch.float32)
    # a 4-bit asymmetric code is within half a step of the rotated value (steps of (max - min) / 15)
    assert ((decode_int4(data, scale_bytes) - y).abs() <= s / 2 + 1e-5).all()


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (4, 4)])
def test_int4_decode_matches_reference(heads, kv_heads, splits):
    from kvplan.kernels.int4_attention import (
        dequantize_cache_int4,
        paged_decode_int4,
        write_kv_int4,
    )

    lens, bs, d = [9, 33], 16, 64
    cache, layout = make_cache("int4_per_token_head", 6, bs, kv_heads, d)
    assert layout.slot_bytes == d + 8
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    g = torch.Generator().manual_seed(6)
    for s, n in enumerate(lens):
        pos = torch.arange(n)
        slots = table[s, pos // bs].long() * bs + pos % bs
        write_kv_int4(cache, layout, slots, torch.randn(n, kv_heads, d, generator=g),
                      torch.randn(n, kv_heads, d, generator=g))
    q = torch.randn(2, heads, d, generator=g)
    # with several splits, 16-token tiles, so that the 48-token table spans three of them (the default tile, 128
    # tokens, is one split here)
    tile = {} if splits == 1 else {"tile": 16}
    out = paged_decode_int4(q, cache, layout, table, torch.tensor(lens, dtype=torch.int32), splits=splits, **tile)
    # reference: dequantize, rotate back, plain attention
    _assert_matches_reference(out, q, *dequantize_cache_int4(cache, layout), table, lens, bs, 2e-4)


def test_nvfp4_codes_and_error():
    from kvplan.kernels.nvfp4_attention import decode_nvfp4, encode_nvfp4, global_scale

    x = torch.randn(24, 128, generator=torch.Generator().manual_seed(7))
    g = global_scale(x)
    packed, scales = encode_nvfp4(x, g)
    assert packed.shape == (24, 64) and scales.shape == (24, 8)  # 128 values: 64 bytes + 8 e4m3 scales
    y = decode_nvfp4(packed, scales, g)
    # e2m1 steps are at most 2 (between 4 and 6) on a block scaled to max 6: error within amax / 6 per block,
    # plus e4m3 rounding of the block scale (2^-4 relative)
    amax = x.unflatten(-1, (-1, 16)).abs().amax(-1, keepdim=True)
    assert ((y.unflatten(-1, (-1, 16)) - x.unflatten(-1, (-1, 16))).abs() <= amax / 6 * 1.07).all()
    p46, s46 = encode_nvfp4(x, g, four_over_six=True)
    err6 = ((y - x) ** 2).unflatten(-1, (-1, 16)).sum(-1)
    err46 = ((decode_nvfp4(p46, s46, g) - x) ** 2).unflatten(-1, (-1, 16)).sum(-1)
    assert (err46 <= err6 + 1e-6).all() and (err46 < err6).any()  # 4-over-6 never worse, sometimes better


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_4over6"])
def test_nvfp4_decode_matches_reference(fmt, splits):
    from kvplan.kernels.nvfp4_attention import (
        dequantize_cache_nvfp4,
        global_scale,
        paged_decode_nvfp4,
        write_kv_nvfp4,
    )

    lens, bs, d, heads, kv_heads = [7, 40], 16, 64, 4, 2
    cache, layout = make_cache(fmt, 6, bs, kv_heads, d)
    assert layout.slot_bytes == 2 * (d // 2 + d // 16)
    table = torch.tensor([[3, 0, 0], [1, 4, 2]], dtype=torch.int32)
    gen = torch.Generator().manual_seed(8)
    k = [torch.randn(n, kv_heads, d, generator=gen) for n in lens]
    v = [torch.randn(n, kv_heads, d, generator=gen) for n in lens]
    kg, vg = global_scale(torch.cat(k)), global_scale(torch.cat(v))
    for s, n in enumerate(lens):
        pos = torch.arange(n)
        write_kv_nvfp4(cache, layout, table[s, pos // bs].long() * bs + pos % bs, k[s], v[s], kg, vg)
    q = torch.randn(2, heads, d, generator=gen)
    tile = {} if splits == 1 else {"tile": 16}  # several splits of 16-token tiles, as for int4
    out = paged_decode_nvfp4(q, cache, layout, table, torch.tensor(lens, dtype=torch.int32), kg, vg, splits=splits,
                             **tile)
    _assert_matches_reference(out, q, *dequantize_cache_nvfp4(cache, layout, kg, vg), table, lens, bs, 2e-4)


def test_lloyd_max_centroids():
    from kvplan.kernels.turboquant_attention import lloyd_max_centroids

    # the optimal 1-bit quantizer of N(0, 1) sits at +-sqrt(2 / pi); 2 bits at +-0.4528, +-1.5104 (Max, 1960)
    assert lloyd_max_centroids(1, 1)[1] == pytest.approx(math.sqrt(2 / math.pi), abs=1e-6)
    assert lloyd_max_centroids(2, 1)[2:] == pytest.approx((0.4528, 1.5104), abs=1e-4)
    c = lloyd_max_centroids(4, 128)
    assert len(c) == 16 and c == pytest.approx(tuple(-x for x in reversed(c)))  # symmetric
    assert lloyd_max_centroids(3, 128)[7] == pytest.approx(lloyd_max_centroids(3, 1)[7] / math.sqrt(128))


def test_turboquant_bit_packing_and_norm_correction():
    from kvplan.kernels.turboquant_attention import (
        _pack,
        _unpack,
        decode_keys,
        encode_keys,
    )

    codes = torch.randint(0, 8, (5, 128), generator=torch.Generator().manual_seed(9))
    packed = _pack(codes, 3)
    assert packed.shape == (5, 48)  # 128 x 3 bits in 48 bytes, as the catalog counts
    assert torch.equal(_unpack(packed, 3, 128), codes)
    x = torch.randn(512, 128, generator=torch.Generator().manual_seed(10))
    k_bytes, norm = encode_keys(x, 3)
    corrected = decode_keys(k_bytes, norm, 3, 128, correct=True)
    plain = decode_keys(k_bytes, norm, 3, 128, correct=False)
    # centroids are conditional means, a contraction: E|y_hat|^2 = E|y|^2 - D, with D = 0.03455 the distortion of
    # Max's 3-bit Gaussian quantizer, so uncorrected keys come out sqrt(1 - D) = 0.9826 as long on average
    assert (plain.norm(dim=-1) / x.norm(dim=-1)).mean() == pytest.approx(math.sqrt(1 - 0.03455), abs=0.003)
    # the correction restores the stored norm (fp16)
    torch.testing.assert_close(corrected.norm(dim=-1), x.norm(dim=-1), atol=0, rtol=1e-3)
    cos = torch.nn.functional.cosine_similarity(corrected, x, dim=-1)
    assert cos.mean() > 0.98  # 3-bit rotated keys keep the direction


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("fmt", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                                 "turboquant_3bit_nc"])
def test_turboquant_decode_matches_reference(fmt, splits):
    from kvplan.kernels.turboquant_attention import (
        dequantize_cache_turboquant,
        paged_decode_turboquant,
        write_kv_turboquant,
    )

    lens, bs, d, heads, kv_heads = [11, 35], 16, 64, 4, 2
    cache, layout = make_cache(fmt, 6, bs, kv_heads, d)
    assert layout.slot_bytes == kv_format(fmt).bytes_per_token_per_kv_head(d)
    table = torch.tensor([[5, 0, 0], [2, 0, 4]], dtype=torch.int32)
    gen = torch.Generator().manual_seed(11)
    for s, n in enumerate(lens):
        pos = torch.arange(n)
        write_kv_turboquant(cache, layout, table[s, pos // bs].long() * bs + pos % bs,
                            torch.randn(n, kv_heads, d, generator=gen), torch.randn(n, kv_heads, d, generator=gen))
    q = torch.randn(2, heads, d, generator=gen)
    tile = {} if splits == 1 else {"tile": 16}  # several splits of 16-token tiles, as for int4
    out = paged_decode_turboquant(q, cache, layout, table, torch.tensor(lens, dtype=torch.int32), splits=splits,
                                  **tile)
    _assert_matches_reference(out, q, *dequantize_cache_turboquant(cache, layout), table, lens, bs, 3e-4)


@pytest.mark.parametrize("fmt", ["kivi2", "kivi4"])
def test_kivi_group_codec(fmt):
    from kvplan.kernels.kivi_attention import decode_group, encode_group

    layout = slot_layout(fmt, 128)
    bits = layout.fmt.params["bits"]
    assert layout.slot_bytes == (96 if bits == 2 else 160)  # the catalog's honest 3.0 and 5.0 bits
    gen = torch.Generator().manual_seed(12)
    k = torch.randn(32, 2, 128, generator=gen) * torch.linspace(0.2, 5, 128)  # outlier channels, as keys have
    v = torch.randn(32, 2, 128, generator=gen)
    kk, vv = decode_group(encode_group(k, v, layout), layout)
    levels = 2**bits - 1
    # within half a step (plus fp16 rounding of scale and zero): keys per channel over the group, values per
    # token over groups of 32 channels
    k_step = (k.amax(0) - k.amin(0)) / levels
    v_step = (v.unflatten(-1, (-1, 32)).amax(-1) - v.unflatten(-1, (-1, 32)).amin(-1)) / levels
    assert ((kk - k).abs() <= k_step / 2 * 1.01 + 2e-3 * k.abs().amax(0)).all()
    assert ((vv - v).unflatten(-1, (-1, 32)).abs() <= (v_step / 2 * 1.01 + 4e-3).unsqueeze(-1)).all()


# 7 splits of 32 tokens (one KIVI group): the 64 quantized tokens of the first sequence over two splits, the
# residual window in the last, and the all-residual second sequence's other splits empty
@pytest.mark.parametrize("splits", [1, 7])
@pytest.mark.parametrize("fmt", ["kivi2", "kivi4"])
def test_kivi_decode_matches_reference(fmt, splits):
    from kvplan.kernels.kivi_attention import (
        _offsets,
        decode_group,
        make_residual,
        paged_decode_kivi,
        quantized_len,
        write_sequence,
    )

    bs, d, heads, kv_heads = 16, 64, 4, 2
    layout = slot_layout(fmt, d)
    lens = [200, 40]  # 64 quantized + 136 in the residual; 40 all residual
    assert [quantized_len(n, 32, 128) for n in lens] == [64, 0]
    cache, _ = make_cache(fmt, 20, bs, kv_heads, d)
    residual = make_residual(2, layout, kv_heads, torch.float32)
    table = torch.tensor([list(range(13)), list(range(13, 16)) + [0] * 10], dtype=torch.int32)
    gen = torch.Generator().manual_seed(13)
    ks = [torch.randn(n, kv_heads, d, generator=gen) for n in lens]
    vs = [torch.randn(n, kv_heads, d, generator=gen) for n in lens]
    for s in range(2):
        write_sequence(cache, residual, layout, table[s], s, ks[s], vs[s])
    q = torch.randn(2, heads, d, generator=gen)
    out = paged_decode_kivi(q, cache, residual, layout, table, torch.tensor(lens, dtype=torch.int32), splits=splits)
    flat = cache.view(-1, kv_heads, layout.slot_bytes)
    for s, n in enumerate(lens):
        nq = quantized_len(n, 32, 128)
        kparts, vparts = [], []
        for start in range(0, nq, 32):
            pos = torch.arange(start, start + 32)
            kg, vg = decode_group(flat[table[s, pos // bs].long() * bs + pos % bs], layout)
            kparts.append(kg)
            vparts.append(vg)
        kk = torch.cat(kparts + [residual[s, : n - nq, :, 0]]).repeat_interleave(heads // kv_heads, 1)
        vv = torch.cat(vparts + [residual[s, : n - nq, :, 1]]).repeat_interleave(heads // kv_heads, 1)
        p = (torch.einsum("hd,nhd->hn", q[s], kk) / math.sqrt(d)).softmax(-1)
        torch.testing.assert_close(out[s], torch.einsum("hn,nhd->hd", p, vv), atol=3e-4, rtol=3e-4)
    assert _offsets(layout)["v_zero"] + 2 * (d // 32) == layout.slot_bytes


@pytest.mark.parametrize("batch", [1, 5, 64])
@pytest.mark.parametrize("fp8", [False, True])
def test_gemv(batch, fp8):
    from kvplan.kernels.gemv import gemv, gemv_reference, quantize_fp8_weights

    gen = torch.Generator().manual_seed(14)
    x = torch.randn(batch, 200, generator=gen).to(torch.bfloat16)  # K not a multiple of the tile: masked
    w = (torch.randn(72, 200, generator=gen) / 14).to(torch.bfloat16)
    args = quantize_fp8_weights(w) if fp8 else (w, None)
    if fp8:
        assert args[0].dtype == torch.uint8 and args[0].numel() == 72 * 200  # one byte per weight
    out = gemv(x, *args)
    torch.testing.assert_close(out.float(), gemv_reference(x, *args).float(), atol=2e-2, rtol=2e-2)
    if not fp8:
        torch.testing.assert_close(out.float(), (x.float() @ w.float().T), atol=2e-2, rtol=2e-2)


# one step of each storage format, relative to the value (and the smallest step, absolute, for the fp8 subnormals
# after the per-tensor scale of 0.05): the interpreter rounds some float conversions toward zero, a GPU to nearest
STEP = {"bfloat16": (2**-7, 0.0), "float16": (2**-10, 0.0), "fp8_e4m3": (2**-3, 2**-9 * 0.05),
        "fp8_e5m2": (2**-2, 2**-16 * 0.05), "int8_per_token_head": None, "fp8_per_token_head": (2**-3, None)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_reshape_and_cache_kernel_writes_what_write_kv_writes(fmt):
    from kvplan.kernels.paged_attention import reshape_and_cache

    gen = torch.Generator().manual_seed(21)
    tokens, kv_heads, d = 40, 2, 64
    k = torch.randn(tokens, kv_heads, d, generator=gen) * 3
    v = torch.randn(tokens, kv_heads, d, generator=gen) * 3
    slots = torch.randperm(64, generator=gen)[:tokens]
    ref, layout = make_cache(fmt, 4, 16, kv_heads, d)
    out, _ = make_cache(fmt, 4, 16, kv_heads, d)
    write_kv(ref, layout, slots, k, v, 0.05, 0.05)
    reshape_and_cache(out, layout, slots, k, v, 0.05, 0.05)
    unused = torch.ones(64, dtype=torch.bool)
    unused[slots] = False
    assert not out.view(64, kv_heads, -1)[unused].any()  # nothing written outside the given slots
    if layout.mode in (3, 4):  # the per-token-head scales: the same fp32 bits
        for off in (layout.k_scale, layout.v_scale):
            assert torch.equal(out.view(64, kv_heads, -1)[slots, :, off:off + 4],
                               ref.view(64, kv_heads, -1)[slots, :, off:off + 4])
    for a, b in zip(dequantize_cache(out, layout, 0.05, 0.05), dequantize_cache(ref, layout, 0.05, 0.05),
                    strict=True):
        a, b = a.view(64, kv_heads, d)[slots], b.view(64, kv_heads, d)[slots]
        if STEP[fmt] is None:  # int8: codes one apart at most (halves round away from zero here, to even in torch)
            step = b.abs().amax(-1, keepdim=True) / 127
        else:
            rel, floor = STEP[fmt]
            if floor is None:  # fp8 per token and head: the subnormal step scales with the head's amax
                floor = b.abs().amax(-1, keepdim=True) / 448 * 2**-9
            step = b.abs() * rel + floor
        within = (a - b).abs() <= step * 1.0001
        if layout.mode in (1, 2, 4):
            # Triton 3.9's interpreter converts a few values in a hundred from fp32 to fp8 at half their magnitude
            # (1.3% for e4m3 and 2.4% for e5m2 over uniform values in +-448; torch and a GPU's cvt.rn do not): under
            # the interpreter, fp8 shows only that placement, scales and most codes are right
            assert within.float().mean() > 0.95
        else:
            assert within.all()


def _write_setup(fmt, seed, tokens=24, kv_heads=2, d=128, num_blocks=3):
    """K, V [tokens, kv_heads, d], scattered slots of a num_blocks x 16 cache, and two empty caches of `fmt`."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens, kv_heads, d, generator=gen) * 3
    v = torch.randn(tokens, kv_heads, d, generator=gen)
    slots = torch.randperm(num_blocks * 16, generator=gen)[:tokens]
    ref, layout = make_cache(fmt, num_blocks, 16, kv_heads, d)
    out, _ = make_cache(fmt, num_blocks, 16, kv_heads, d)
    return k, v, slots, ref, out, layout


def _only_slots_written(cache, slots) -> bool:
    flat = cache.view(cache.shape[0] * cache.shape[1], cache.shape[2], -1)
    unused = torch.ones(flat.shape[0], dtype=torch.bool)
    unused[slots] = False
    return not flat[unused].any()


@pytest.mark.parametrize("d", [64, 128])
def test_int4_write_kernel_writes_what_write_kv_int4_writes(d):
    from kvplan.kernels.int4_attention import (
        decode_int4,
        reshape_and_cache_int4,
        write_kv_int4,
    )

    k, v, slots, ref, out, layout = _write_setup("int4_per_token_head", 31, d=d)
    write_kv_int4(ref, layout, slots, k, v)
    reshape_and_cache_int4(out, layout, slots, k, v)
    assert _only_slots_written(out, slots)
    flat_out, flat_ref = out.view(48, 2, -1), ref.view(48, 2, -1)
    half = d // 2
    for data_off, scale_off in ((layout.k_data, layout.k_scale), (layout.v_data, layout.v_scale)):
        so = flat_out[slots, :, scale_off:scale_off + 4].contiguous().view(torch.int32)
        sr = flat_ref[slots, :, scale_off:scale_off + 4].contiguous().view(torch.int32)
        # the zero points (low 4 bits) agree; the scales agree to the last few bits of their mantissas
        assert torch.equal(so & 0xF, sr & 0xF)
        assert ((so & ~0xF).view(torch.float32) / (sr & ~0xF).view(torch.float32) - 1).abs().max() < 1e-5
        a = decode_int4(flat_out[slots, :, data_off:data_off + half], flat_out[slots, :, scale_off:scale_off + 4])
        b = decode_int4(flat_ref[slots, :, data_off:data_off + half], flat_ref[slots, :, scale_off:scale_off + 4])
        step = (sr & ~0xF).view(torch.float32)  # one code step
        assert ((a - b).abs() <= step * 1.001).all()  # at most one step apart, where a value sits on a boundary
        assert (a == b).float().mean() > 0.99


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_4over6"])
def test_nvfp4_write_kernel_writes_what_write_kv_nvfp4_writes(fmt):
    from kvplan.kernels.nvfp4_attention import (
        global_scale,
        reshape_and_cache_nvfp4,
        write_kv_nvfp4,
    )

    k, v, slots, ref, out, layout = _write_setup(fmt, 32)
    v[0, 0, :16] = 0.0  # an all-zero block: scale 0, codes 0
    v[1, 1, 16:32] = 1e-4  # a block whose scale is an e4m3 subnormal
    kg, vg = global_scale(k), global_scale(v)
    write_kv_nvfp4(ref, layout, slots, k, v, kg, vg)
    reshape_and_cache_nvfp4(out, layout, slots, k, v, kg, vg)
    assert _only_slots_written(out, slots)
    # exact e4m3 rounding done with integer arithmetic, the same comparisons as the torch writer: same bytes
    assert torch.equal(out, ref)


@pytest.mark.parametrize("fmt", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"])
def test_turboquant_write_kernel_writes_what_write_kv_turboquant_writes(fmt):
    from kvplan.kernels.turboquant_attention import (
        dequantize_cache_turboquant,
        reshape_and_cache_turboquant,
        write_kv_turboquant,
    )

    k, v, slots, ref, out, layout = _write_setup(fmt, 33)
    k[0, 0, :4] = torch.tensor([-0.0, 0.0, 500.0, -1e-5])  # fp8 keys: negative zero, saturation, a subnormal
    write_kv_turboquant(ref, layout, slots, k, v)
    reshape_and_cache_turboquant(out, layout, slots, k, v)
    assert _only_slots_written(out, slots)
    flat_out, flat_ref = out.view(48, 2, -1), ref.view(48, 2, -1)
    # values, their fp16 scale and zero, fp8 keys and the keys' fp16 norms: the same bytes; 3- and 4-bit key codes
    # are rotated in another summation order, so a coordinate on a cell boundary may take the next centroid
    v_end = layout.v_scale + 4
    assert torch.equal(flat_out[slots, :, layout.v_data:v_end], flat_ref[slots, :, layout.v_data:v_end])
    if fmt == "turboquant_k8v4":
        assert torch.equal(flat_out[slots, :, :layout.v_data], flat_ref[slots, :, :layout.v_data])
    else:
        norm = slice(layout.k_scale, layout.k_scale + 2)
        assert torch.equal(flat_out[slots, :, norm], flat_ref[slots, :, norm])
        assert (flat_out[slots, :, :layout.v_data] == flat_ref[slots, :, :layout.v_data]).float().mean() > 0.99
        ko, _ = dequantize_cache_turboquant(out, layout)
        kr, _ = dequantize_cache_turboquant(ref, layout)
        assert torch.allclose(ko, kr, atol=0.05 * k.abs().max().item())


@pytest.mark.parametrize("fmt", ["kivi2", "kivi4"])
def test_kivi_write_kernel_writes_what_encode_group_writes(fmt):
    from kvplan.kernels.kivi_attention import encode_group, reshape_and_cache_kivi

    g = 32
    k, v, slots, ref, out, layout = _write_setup(fmt, 34, tokens=2 * g, num_blocks=6)
    k[:g, 0, 5] = 1.25  # a constant channel: scale 0 clamped to 1e-6
    flat = ref.view(96, 2, -1)
    for grp in range(2):
        flat[slots[grp * g:(grp + 1) * g]] = encode_group(k[grp * g:(grp + 1) * g], v[grp * g:(grp + 1) * g], layout)
    reshape_and_cache_kivi(out, layout, slots, k, v)
    assert _only_slots_written(out, slots)
    # the same statistics in the same order: the same bytes
    assert torch.equal(out, ref)


def test_one_split_skips_the_combine(monkeypatch):
    # one split per sequence: the decode kernel writes the answer itself and no combine kernel is launched; three
    # splits: one combine launch, one program per (sequence, head); the same answer both ways
    from kvplan.kernels import common

    grids = []
    real = common._combine_kernel

    class Counting:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    monkeypatch.setattr(common, "_combine_kernel", Counting())
    lens = [5, 37]
    cache, layout, table, ctx = _filled_cache("float16", lens, kv_heads=2)
    q = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    one = paged_decode(q, cache, layout, table, ctx, splits=1)
    assert grids == [] and one.dtype == torch.float16
    three = paged_decode(q, cache, layout, table, ctx, splits=3, tile=16)  # 48 tokens of table: 3 x 16
    assert grids == [(2, 8)]
    torch.testing.assert_close(one.float(), three.float(), atol=2e-3, rtol=2e-3)
