"""kvplan quality: a small Llama transformers builds from a config (random weights, seeded, no download) with
outlier channels planted in its keys (k_proj rows scaled), run with its cache in each format; every figure is held
to independent arithmetic: the model's own forward pass, the kernels' paged write and dequantize paths, torch's
KL divergence. And the synthetic proxy, the published-evidence table, and the command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvplan.kernels.layouts import KERNEL_MODES, slot_layout  # noqa: E402
from kvplan.quality.formats import layer_store, mx_round_trip, uniform_round_trip  # noqa: E402
from kvplan.quality.metrics import percentile, relative_error, token_figures  # noqa: E402
from kvplan.specs.kv_formats import CATALOG, kv_format, parse_dtypes  # noqa: E402

HEAD_DIM, KV_HEADS, LAYERS = 64, 2, 4
OUTLIERS = (5, 17, 50)  # key channels planted 15x larger in every KV head
TEXT = ("KV-cache formats trade accuracy for capacity: keys feed a softmax, values a convex combination, so the "
        "keys are quantized more carefully. Rotation spreads an outlier channel over the whole head; KIVI groups "
        "keys by channel instead. ") * 3
PLAIN_INT4 = "custom:bits=4,scale=fp32,zero=fp32"  # per token and head, no rotation, no groups
PLAIN_INT2 = "custom:bits=2,scale=fp32,zero=fp32"
TOKEN_GROUPS_4 = "custom:bits=4,group=32,axis=token,scale=fp16,zero=fp16"  # KIVI's budget, keys grouped by token
FORMATS = ["auto", "fp8", "int4_per_token_head", PLAIN_INT4, PLAIN_INT2, "kivi4", TOKEN_GROUPS_4, "kivi2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 4-layer Llama (GQA: 4 query heads, 2 KV heads of 64) with outlier key channels, saved as a snapshot."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS, num_attention_heads=4,
                      num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=256, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.self_attn.k_proj.weight
            for h in range(KV_HEADS):
                for c in OUTLIERS:
                    w[h * HEAD_DIM + c] *= 15
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    (folder / "text.txt").write_text(TEXT)
    return folder


@pytest.fixture(scope="module")
def run(tiny):
    from kvplan.quality.run import run_quality

    return run_quality(str(tiny), parse_dtypes(FORMATS), TEXT, context=1024, device="cpu")


def _row(result, name):
    return next(r for r in result.rows if r.kv_cache_dtype == kv_format(name).name)


def _layer(result, name, i):
    return next(x for x in result.layers if x.kv_cache_dtype == kv_format(name).name and x.layer == i)


def _ids(text):
    return torch.tensor(list(text.encode("utf-8")))[None]  # the snapshot has no tokenizer: bytes are its tokens


def _layer0_keys(folder, text):
    """Layer 0's post-RoPE keys [tokens, kv_heads, d], computed from the model's modules directly."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = LlamaForCausalLM.from_pretrained(folder).eval()
    ids = _ids(text)
    with torch.no_grad():
        h = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
        k = model.model.layers[0].self_attn.k_proj(h).view(1, ids.shape[1], KV_HEADS, HEAD_DIM).transpose(1, 2)
        cos, sin = model.model.rotary_emb(h, torch.arange(ids.shape[1])[None])
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
    return k[0].transpose(0, 1).float()


# ----------------------------------------------------------------------------------------------------------------
# The model run


def test_the_model_dtype_run_is_the_model_itself(run, tiny):
    from transformers import LlamaForCausalLM

    auto = _row(run, "auto")
    assert auto.kl_mean == 0 and auto.kl_p99 == 0 and auto.top1_agreement == 1 and auto.perplexity_delta == 0
    assert all(x.key_rel_error == x.value_rel_error == x.attention_rel_error == 0 for x in run.layers
               if x.kv_cache_dtype == "auto")
    # the perplexity of one plain forward pass over the whole text, without kvplan's cache or chunks
    model = LlamaForCausalLM.from_pretrained(tiny).eval()
    ids = _ids(TEXT)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    nll = -logp[:-1].gather(-1, ids[0, 1:, None])[:, 0]
    assert run.tokens == ids.shape[1] - 1 and run.windows == 1
    assert run.perplexity == pytest.approx(math.exp(float(nll.double().mean())), rel=1e-4)


def test_kl_by_position_splits_the_positions(run):
    n = len(TEXT.encode()) - 1
    for r in run.rows:
        buckets = r.kl_by_position
        assert [(b["from"], b["to"]) for b in buckets] == [(0, 128), (128, 512), (512, 2048)]
        assert [b["positions"] for b in buckets] == [128, 384, n - 512]
        assert sum(b["kl_mean"] * b["positions"] for b in buckets) / n == pytest.approx(r.kl_mean, rel=1e-5, abs=1e-12)
        assert sum(b["top1_agreement"] * b["positions"] for b in buckets) / n == pytest.approx(r.top1_agreement)


def test_the_residual_window_is_read_as_decoding_reads_it(run, tiny):
    """KIVI keeps each sequence's newest 128 tokens (and a group not yet whole) in the model dtype: a query at a
    position below 128 + 32 reads nothing quantized, so its prediction is the model's own, to rounding."""
    from kvplan.quality.run import run_quality

    kivi = _row(run, "kivi4").kl_by_position
    assert kivi[0]["kl_mean"] < 1e-9 and kivi[2]["kl_mean"] > 1e-6
    windowed = "custom:bits=4,residual=64,scale=fp32,zero=fp32"
    r = run_quality(str(tiny), [kv_format(windowed), kv_format(PLAIN_INT4)], TEXT, context=1024, device="cpu")
    near, far = r.rows[0].kl_by_position[0], r.rows[0].kl_by_position[2]
    assert near["kl_mean"] > 0 and far["kl_mean"] > 1e-6  # positions 64-127 read quantized tokens
    assert r.rows[0].kl_mean < r.rows[1].kl_mean  # the window only helps
    assert r.rows[0].capacity_gain == r.rows[1].capacity_gain  # the pool counts a token at the format's bytes


def test_errors_fall_as_bits_rise(run):
    k = {name: _layer(run, name, 0).key_rel_error for name in ("fp8", PLAIN_INT4, PLAIN_INT2)}
    assert 0 < k["fp8"] < k[PLAIN_INT4] < k[PLAIN_INT2]
    kl = {name: _row(run, name).kl_mean for name in ("fp8", "int4_per_token_head", "kivi2")}
    assert 0 < kl["fp8"] < kl["int4_per_token_head"] < kl["kivi2"]
    assert _row(run, "fp8").top1_agreement > _row(run, "kivi2").top1_agreement


def test_rotation_and_per_channel_keys_beat_per_token_keys_on_outlier_channels(run, tiny):
    keys = _layer0_keys(tiny, TEXT)
    rms = keys.pow(2).mean(0).sqrt()  # [kv_heads, d]: the planted channels (and their RoPE partners) stand out
    assert (rms.amax(-1) > 8 * rms.median(-1).values).all()
    for i in range(LAYERS):
        assert _layer(run, "int4_per_token_head", i).key_rel_error < 0.7 * _layer(run, PLAIN_INT4, i).key_rel_error
        assert _layer(run, "kivi4", i).key_rel_error < 0.7 * _layer(run, TOKEN_GROUPS_4, i).key_rel_error
    assert _row(run, "int4_per_token_head").kl_mean < _row(run, PLAIN_INT4).kl_mean


@pytest.mark.parametrize("name", ["fp8", "int4_per_token_head", "kivi4"])
def test_the_run_stores_post_rope_keys_as_the_kernels_write_them(run, tiny, name):
    """Layer 0's key error of the run equals the error of the same keys written into a paged cache (blocks of 16
    in a shuffled order) by the kernels' torch writers and read back by their dequantizers."""
    from kvplan.kernels import int4_attention, kivi_attention, paged_attention

    keys = _layer0_keys(tiny, TEXT)
    n = keys.shape[0]
    layout = slot_layout(name, HEAD_DIM)
    blocks = (n + 15) // 16
    cache = torch.zeros(blocks, 16, KV_HEADS, layout.slot_bytes, dtype=torch.uint8)
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(1))
    slots = table[torch.arange(n) // 16] * 16 + torch.arange(n) % 16
    if name == "kivi4":
        residual = kivi_attention.make_residual(1, layout, KV_HEADS, torch.float32)
        kivi_attention.write_sequence(cache, residual, layout, table, 0, keys, keys)
        quantized = kivi_attention.quantized_len(n, 32, 128)
        back = torch.cat([kivi_attention.decode_group(cache.view(-1, KV_HEADS, layout.slot_bytes)[slots[s:s + 32]],
                                                      layout)[0] for s in range(0, quantized, 32)]
                         + [residual[0, : n - quantized, :, 0]])
    else:
        if name == "fp8":
            paged_attention.write_kv(cache, layout, slots, keys, keys)
            back = paged_attention.dequantize_cache(cache, layout)[0]
        else:
            int4_attention.write_kv_int4(cache, layout, slots, keys, keys)
            back = int4_attention.dequantize_cache_int4(cache, layout)[0]
        back = back.reshape(-1, KV_HEADS, HEAD_DIM)[slots]
    assert _layer(run, name, 0).key_rel_error == pytest.approx(relative_error(back, keys), rel=1e-6)


def test_skip_layers_remove_exactly_their_layers_error(run, tiny):
    from kvplan.quality.run import run_quality

    skipped = run_quality(str(tiny), [kv_format("int4_per_token_head")], TEXT, context=1024, device="cpu",
                          skip=(1,))
    row = skipped.rows[0]
    assert row.skip_layers == [1]
    one = _layer(skipped, "int4_per_token_head", 1)
    assert one.skipped and one.key_rel_error == one.value_rel_error == one.attention_rel_error == 0
    # layer 0 runs before the skipped layer: its errors are the unskipped run's, to the bit
    before, now = _layer(run, "int4_per_token_head", 0), _layer(skipped, "int4_per_token_head", 0)
    assert (now.key_rel_error, now.value_rel_error, now.attention_rel_error) == \
        (before.key_rel_error, before.value_rel_error, before.attention_rel_error)
    assert all(_layer(skipped, "int4_per_token_head", i).key_rel_error > 0 for i in (0, 2, 3))
    # every layer skipped: the model-dtype run exactly, and the pool holds what the model dtype holds
    everything = run_quality(str(tiny), [kv_format("int4_per_token_head")], TEXT, context=1024, device="cpu",
                             skip=(0, 1, 2, 3)).rows[0]
    assert everything.kl_mean == 0 and everything.top1_agreement == 1
    assert everything.perplexity == skipped.perplexity and everything.capacity_gain == 1
    assert row.capacity_gain == pytest.approx(4 * 256 / (3 * 72 + 256))  # bf16 slots are 256 B, int4's 72 B


def test_capacity_and_bits_come_from_the_catalog(run):
    for r in run.rows:
        f = kv_format(r.kv_cache_dtype)
        assert r.bits_per_element == pytest.approx(f.bits_per_element(HEAD_DIM), abs=1e-4)
        auto = kv_format("auto").bytes_per_token_per_kv_head(HEAD_DIM)
        assert r.capacity_gain == pytest.approx(auto / f.bytes_per_token_per_kv_head(HEAD_DIM))


def test_metrics_against_torch():
    g = torch.Generator().manual_seed(3)
    a = torch.log_softmax(torch.randn(50, 40, generator=g), -1)
    b = torch.log_softmax(a + 0.3 * torch.randn(50, 40, generator=g), -1)
    targets = torch.randint(0, 40, (50,), generator=g)
    kl, agree, nll = token_figures(a, b, targets)
    expected = torch.nn.functional.kl_div(b, a, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(kl, expected, atol=1e-6)
    assert agree.tolist() == (a.argmax(-1) == b.argmax(-1)).tolist()
    assert torch.allclose(nll, torch.nn.functional.nll_loss(b, targets, reduction="none"))
    import numpy as np

    assert percentile(kl, 99) == pytest.approx(float(np.percentile(kl.numpy().astype("float64"), 99)), rel=1e-9)


# ----------------------------------------------------------------------------------------------------------------
# The stores: each format's reference dequantizer against its quantizer and the kernels' paged references

KERNEL_FORMATS = [n for n in CATALOG if n in KERNEL_MODES and n != "auto" and CATALOG[n].family != "kivi"]


def _kv(n=96, seed=2):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, KV_HEADS, HEAD_DIM, generator=g)
    k[..., list(OUTLIERS)] *= 15
    v = torch.randn(n, KV_HEADS, HEAD_DIM, generator=g) * torch.exp(torch.randn(n, 1, 1, generator=g))
    return k, v


def _write_read(name, k, v, slots, cache):
    """The kernels' torch writer and reader for `name` on `cache` at `slots`: (bytes written, K, V read back)."""
    from kvplan.kernels import int4_attention, nvfp4_attention, paged_attention, turboquant_attention

    layout = slot_layout(name, HEAD_DIM)
    fmt = layout.fmt
    if fmt.family == "nvfp4":
        scales = (nvfp4_attention.global_scale(k), nvfp4_attention.global_scale(v))
        nvfp4_attention.write_kv_nvfp4(cache, layout, slots, k, v, *scales)
        kk, vv = nvfp4_attention.dequantize_cache_nvfp4(cache, layout, *scales)
    elif fmt.family == "turboquant":
        turboquant_attention.write_kv_turboquant(cache, layout, slots, k, v)
        kk, vv = turboquant_attention.dequantize_cache_turboquant(cache, layout)
    elif name == "int4_per_token_head":
        int4_attention.write_kv_int4(cache, layout, slots, k, v)
        kk, vv = int4_attention.dequantize_cache_int4(cache, layout)
    else:
        paged_attention.write_kv(cache, layout, slots, k, v)
        kk, vv = paged_attention.dequantize_cache(cache, layout)
    flat = slots.long()
    return (cache.view(-1, KV_HEADS, layout.slot_bytes)[flat], kk.reshape(-1, KV_HEADS, HEAD_DIM)[flat],
            vv.reshape(-1, KV_HEADS, HEAD_DIM)[flat])


def _fresh(name, n):
    layout = slot_layout(name, HEAD_DIM)
    return torch.zeros(1, n, KV_HEADS, layout.slot_bytes, dtype=torch.uint8), torch.arange(n)


@pytest.mark.parametrize("name", KERNEL_FORMATS + ["kivi2", "kivi4"])
def test_dequantizer_round_trips_its_quantizers_codes_bit_for_bit(name):
    """Write, read back, write what was read: the same bytes (int4 per token and head: the same codes and zero
    points; its fp32 scale, found again through the rotation, within a step of its 19 kept mantissa bits)."""
    from kvplan.kernels import kivi_attention

    k, v = _kv()
    if name.startswith("kivi"):
        layout = slot_layout(name, HEAD_DIM)
        first = kivi_attention.encode_group(k[:32], v[:32], layout)
        again = kivi_attention.encode_group(*kivi_attention.decode_group(first, layout), layout)
        assert torch.equal(first, again)
        return
    cache, slots = _fresh(name, k.shape[0])
    first, kk, vv = _write_read(name, k, v, slots, cache)
    if kv_format(name).family == "nvfp4":  # the layer's global scale stays what it was
        from kvplan.kernels import nvfp4_attention

        layout = slot_layout(name, HEAD_DIM)
        cache, slots = _fresh(name, k.shape[0])
        nvfp4_attention.write_kv_nvfp4(cache, layout, slots, kk, vv, nvfp4_attention.global_scale(k),
                                       nvfp4_attention.global_scale(v))
        again = cache[0]
    else:
        cache, slots = _fresh(name, k.shape[0])
        again = _write_read(name, kk, vv, slots, cache)[0]
    if name != "int4_per_token_head":
        assert torch.equal(first, again)
        return
    layout = slot_layout(name, HEAD_DIM)
    for data, scale in ((layout.k_data, layout.k_scale), (layout.v_data, layout.v_scale)):
        assert torch.equal(first[..., data:data + HEAD_DIM // 2], again[..., data:data + HEAD_DIM // 2])
        a = first[..., scale:scale + 4].contiguous().view(torch.int32)
        b = again[..., scale:scale + 4].contiguous().view(torch.int32)
        assert torch.equal(a & 0xF, b & 0xF)
        sa, sb = (a & ~0xF).view(torch.float32), (b & ~0xF).view(torch.float32)
        assert ((sa - sb).abs() <= sa.abs() * 2.0**-18).all()


@pytest.mark.parametrize("name", KERNEL_FORMATS)
def test_each_store_is_the_kernels_reference(name):
    """What a layer store reads back, chunk by chunk, equals the kernels' paged write and dequantize of the same
    tokens at shuffled slots of a paged cache, to the bit."""
    k, v = _kv()
    store = layer_store(kv_format(name), HEAD_DIM)
    for s in range(0, k.shape[0], 40):
        store.append(k[s:s + 40], v[s:s + 40])
    layout = slot_layout(name, HEAD_DIM)
    cache = torch.zeros(8, 16, KV_HEADS, layout.slot_bytes, dtype=torch.uint8)
    slots = torch.randperm(128, generator=torch.Generator().manual_seed(5))[: k.shape[0]]
    if kv_format(name).family == "nvfp4":  # the store fixes the layer's global scale from its first chunk
        from kvplan.kernels import nvfp4_attention

        scales = (nvfp4_attention.global_scale(k[:40]), nvfp4_attention.global_scale(v[:40]))
        nvfp4_attention.write_kv_nvfp4(cache, layout, slots, k, v, *scales)
        kk, vv = nvfp4_attention.dequantize_cache_nvfp4(cache, layout, *scales)
        kk, vv = kk.reshape(-1, KV_HEADS, HEAD_DIM)[slots], vv.reshape(-1, KV_HEADS, HEAD_DIM)[slots]
    else:
        _, kk, vv = _write_read(name, k, v, slots, cache)
    assert torch.equal(store.keys, kk) and torch.equal(store.values, vv)
    assert store.quantized == k.shape[0]


def test_kivi_store_keeps_the_residual_and_partial_group_in_the_model_dtype():
    k, v = _kv(n=200)
    store = layer_store(kv_format("kivi4"), HEAD_DIM)
    store.append(k[:150], v[:150])
    assert store.quantized == 0  # 150 - 128 = 22 tokens: no whole group of 32 yet
    store.append(k[150:], v[150:])
    assert store.quantized == 64  # (200 - 128) // 32 groups of 32
    assert torch.equal(store.keys[64:], k[64:]) and not torch.equal(store.keys[:64], k[:64])


def test_mx_and_custom_stores_are_idempotent():
    k, _ = _kv()
    for element, block in (("e4m3", 32), ("e2m1", 16)):
        once = mx_round_trip(k, element, block)
        assert torch.equal(mx_round_trip(once, element, block), once)
        # every block's scale is a power of two, every element on the element format's grid
        scale = torch.exp2(torch.floor(torch.log2(k.unflatten(-1, (-1, block)).abs().amax(-1))) - (8 if element ==
                                                                                                     "e4m3" else 2))
        y = once.unflatten(-1, (-1, block)) / scale[..., None]
        grid = y.to(torch.float8_e4m3fn).float() if element == "e4m3" else y
        assert torch.equal(grid, y) and y.abs().max() <= (448 if element == "e4m3" else 6)
    fp32 = lambda t: t  # noqa: E731
    for bits in (2, 4, 8):
        once = uniform_round_trip(k, bits, -1, fp32, fp32)
        levels = ((once - once.amin(-1, keepdim=True)) / ((once.amax(-1, keepdim=True) - once.amin(-1, keepdim=True))
                                                           / (2**bits - 1)))
        assert torch.allclose(levels, levels.round(), atol=1e-3)  # at most 2^bits levels per token and head


def test_formats_refused_in_one_line():
    from kvplan.errors import KvplanError

    for name, says in (("fp8_ds_mla", "MLA"), ("custom:bits=4", "no scale")):
        with pytest.raises(KvplanError, match=says):
            layer_store(kv_format(name), HEAD_DIM)
    with pytest.raises(KvplanError, match="power-of-two"):
        layer_store(kv_format("int4_per_token_head"), 96)


# ----------------------------------------------------------------------------------------------------------------
# --synthetic


def test_synthetic_proxy_shows_the_literatures_orderings():
    from kvplan.quality.synthetic import run_synthetic

    r = run_synthetic(parse_dtypes(["auto,fp8,int4_per_token_head", PLAIN_INT4, PLAIN_INT2, "kivi4", TOKEN_GROUPS_4]),
                      tokens=512, head_dim=64, kv_heads=2, heads=4)
    e = {x.kv_cache_dtype: x for x in r.rows}
    assert e["auto"].key_rel_error == e["auto"].attention_rel_error == 0
    assert 0 < e["fp8"].key_rel_error < e[kv_format(PLAIN_INT4).name].key_rel_error < \
        e[kv_format(PLAIN_INT2).name].key_rel_error
    assert e["int4_per_token_head"].key_rel_error < 0.7 * e[kv_format(PLAIN_INT4).name].key_rel_error
    assert e["kivi4"].key_rel_error < 0.7 * e[kv_format(TOKEN_GROUPS_4).name].key_rel_error
    assert r.proxy and "proxy" in r.notes[0] and all(p["source"] for p in r.parameters)


# ----------------------------------------------------------------------------------------------------------------
# The published evidence


def test_every_evidence_row_is_sourced_and_quotes_its_figure():
    import re

    from kvplan.specs.kv_evidence import EVIDENCE, NOTES, formats_without_evidence

    assert EVIDENCE
    for e in EVIDENCE:
        assert e.format in CATALOG and e.source and e.quote
        for figure in re.findall(r"\d+(?:\.\d+)?", e.result):  # every number stated is in the source's words
            assert figure in e.quote, (e.format, figure)
    covered = {e.format for e in EVIDENCE}
    assert set(formats_without_evidence(CATALOG)) == set(CATALOG) - covered
    assert {n for note in NOTES for n in note.formats} <= set(CATALOG)
    assert covered == {"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"}


def test_formats_name_prints_the_evidence(cli):
    out = cli("formats", "turboquant_k3v4_nc")
    assert out.code == 0 and "GSM8K" in out.out and "Qwen3-4B" in out.out and "+10.63% PPL" in out.out
    assert "get_boundary_skip_layers" in out.out
    none = cli("formats", "fp8", "--json")
    data = json.loads(none.out)
    assert data["evidence"] == [] and data["bytes_per_token_per_kv_head"] == 256 and data["notes"]
    assert "no published accuracy figure" in cli("formats", "nvfp4").out


# ----------------------------------------------------------------------------------------------------------------
# The command line


def test_quality_command_json(cli, tiny):
    out = cli("quality", str(tiny), "-d", "fp8,turboquant_k8v4", "--text", str(tiny / "text.txt"), "--context", "256",
              "--device", "cpu", "--json")
    assert out.code == 0, out.err
    data = json.loads(out.out)
    rows = {r["kv_cache_dtype"]: r for r in data["rows"]}
    for key in ("bits_per_element", "kl_mean", "kl_p99", "top1_agreement", "perplexity", "perplexity_delta"):
        assert key in rows["fp8"]
    assert rows["turboquant_k8v4"]["skip_layers"] == [0, 1, 2, 3]  # 4 layers: the first and last two are all
    assert data["windows"] == math.ceil(len(TEXT.encode()) / 256) and len(data["layers"]) == 2 * LAYERS
    assert data["evidence"]["turboquant_k8v4"][0]["result"] == "+1.17% PPL" and data["evidence"]["fp8"] == []
    assert "about" in out.err  # the estimate, before the runs


@pytest.mark.parametrize("args, says", [
    (["quality"], "needs MODEL"),
    (["quality", "--synthetic", "--text", "x.txt"], "--text applies to a model run"),
    (["quality", "--synthetic", "-d", "fp8_ds_mla"], "MLA"),
    (["quality", "--synthetic", "--device", "tpu"], "--device tpu"),
    (["quality", "llama3-8b", "--text", "/nonexistent/text.txt"], "cannot read"),
    (["quality", "llama3-8b", "--text", "a", "--dataset", "b"], "give one"),
    (["quality", "--synthetic", "-d", "custom:bits=4"], "no scale"),
    (["formats", "nonsense"], "unknown KV cache dtype"),
])
def test_quality_refusals_are_one_line(cli, args, says):
    out = cli(*args)
    assert out.code == 2 and out.err.startswith("kvplan: error: ") and out.err.count("\n") == 1 and says in out.err


def test_context_beyond_the_models_is_refused(cli, tiny):
    out = cli("quality", str(tiny), "--text", str(tiny / "text.txt"), "--context", "4096", "--device", "cpu")
    assert out.code == 2 and "at most 2,048 tokens" in out.err and out.err.count("\n") == 1


def test_all_formats_are_those_that_store_k_and_v(cli):
    out = cli("quality", "--synthetic", "-d", "all", "--context", "64", "--json")
    assert out.code == 0, out.err
    names = [r["kv_cache_dtype"] for r in json.loads(out.out)["rows"]]
    # vLLM's packed ROCm caches (UltraQuant, Octave) have no store in kvplan quality (kvplan.quality
    # STORED_FAMILIES leaves them out), and naming one is refused
    assert names == [n for n, f in CATALOG.items() if f.applies_to != "mla" and f.family not in ("ultraquant", "octave")]
    out = cli("quality", "--synthetic", "-d", "ultraquant_4bit", "--context", "64")
    assert out.code == 2 and "no store for ultraquant_4bit" in out.err and out.err.count("\n") == 1


def test_quality_without_the_extra_names_it(cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails
    out = cli("quality", "some/model", "--text", "t.txt")
    assert out.code == 2 and out.err.count("\n") == 1
    assert "needs transformers (the quality extra): pip install transformers" in out.err


def test_planning_imports_no_torch_or_transformers():
    code = ("import sys, kvplan.app.cli as c; c.main(['crossover','llama3-8b','--dtype','fp8']); "
            "c.main(['capacity','llama3-8b','--gpu','h100','-d','turboquant_4bit_nc']); "
            "c.main(['throughput','llama3-8b','--gpu','h100','--isl','1k','--osl','128','-n','8']); "
            "c.main(['formats','turboquant_k3v4_nc']); "
            "bad = [m for m in ('torch', 'transformers', 'triton', 'kvplan.quality') if m in sys.modules]; "
            "sys.stderr.write(repr(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "[]", r.stderr[-500:]


def test_a_bf16_checkpoint_runs_in_bf16(tiny, tmp_path):
    """The model dtype is the checkpoint's: a bf16 snapshot runs in bf16, its own cache exactly (KL 0)."""
    from transformers import LlamaForCausalLM

    from kvplan.quality.run import run_quality

    LlamaForCausalLM.from_pretrained(tiny).to(torch.bfloat16).save_pretrained(tmp_path)
    r = run_quality(str(tmp_path), parse_dtypes(["auto,bfloat16,fp8"]), TEXT[:300], context=1024, device="cpu")
    assert r.model_dtype == "bfloat16"
    auto, bf16, fp8 = r.rows
    assert auto.kl_mean == 0 and bf16.kl_mean == 0 and bf16.key_rel_error == 0  # bf16 in bf16: nothing is lost
    assert fp8.kl_mean > 0 and fp8.key_rel_error > 0


def test_the_library_takes_format_names():
    import kvplan

    by_name = kvplan.run_synthetic(["fp8", "kivi4"], tokens=128, head_dim=64, kv_heads=2, heads=4)
    by_value = kvplan.run_synthetic(parse_dtypes(["fp8,kivi4"]), tokens=128, head_dim=64, kv_heads=2, heads=4)
    assert by_name.to_dict() == by_value.to_dict()
    assert [e.result for e in kvplan.evidence_for("turboquant_k8v4")] == ["+1.17% PPL"]


def test_a_family_without_a_store_is_left_out_without_naming_it():
    # a catalog family kvplan quality has no store for (a new packed cache, say) is not measurable and is refused in
    # one line, with no list of such families to keep: only the stored ones are named (kvplan.quality)
    from dataclasses import replace

    from kvplan.errors import KvplanError
    from kvplan.quality import measurable
    from kvplan.quality.formats import check_format
    from kvplan.specs.kv_formats import kv_format

    new = replace(kv_format("fp8_e4m3"), name="brand_new_4bit", family="brand_new")
    assert measurable(kv_format("fp8_e4m3")) and not measurable(new)
    assert not measurable(kv_format("fp8_ds_mla"))  # an MLA latent
    with pytest.raises(KvplanError, match="no store for brand_new_4bit"):
        check_format(new, 128)
