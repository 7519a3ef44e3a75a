"""KV format byte layouts against the engines' own sizes (vLLM attention backends, TurboQuant config, SGLang pools)."""

import json

import pytest

from kvplan.errors import KvplanError
from kvplan.specs.kv_formats import CATALOG, kv_format


@pytest.mark.parametrize("name, expected", [
    ("bfloat16", 512), ("float16", 512), ("auto", 512),   # 2 x 128 x 2 B
    ("fp8", 256), ("fp8_e4m3", 256), ("fp8_e5m2", 256), ("fp8_inc", 256),
    ("int8_per_token_head", 264), ("fp8_per_token_head", 264),  # 2 x (128 + 4 B fp32 scale)
    ("int4_per_token_head", 136),                                 # 2 x (64 + 4)
    ("nvfp4", 144), ("nvfp4_4over6", 144),                        # 2 x (64 + 128/16)
    ("turboquant_k8v4", 196),     # K 128 fp8; V 64 + 4
    ("turboquant_4bit_nc", 134),  # K 64 + 2 norm; V 68
    ("turboquant_k3v4_nc", 118),  # K 48 + 2; V 68
    ("turboquant_3bit_nc", 102),  # K 50; V 48 + 4
    ("mxfp8", 264),               # SGLang: 1 scale byte per 32
    ("fp4_mx_block16", 144),
])
def test_bytes_per_token_per_kv_head_at_128(name, expected):
    assert kv_format(name).bytes_per_token_per_kv_head(128) == expected


@pytest.mark.parametrize("name, expected", [
    ("bfloat16", 1152), ("fp8", 576), ("fp8_ds_mla", 656), ("nvfp4_ds_mla", 352),
    ("int8_per_token_head", 584), ("int4_per_token_head", 296),  # vLLM adds a scale pair even to the single latent
])
def test_mla_latent_bytes(name, expected):
    assert kv_format(name).mla_bytes_per_token(512, 64) == expected


@pytest.mark.parametrize("name, d64, ratio128", [
    ("turboquant_k8v4", 100, 2.61), ("turboquant_4bit_nc", 70, 3.82),
    ("turboquant_k3v4_nc", 62, 4.34), ("turboquant_3bit_nc", 54, 5.02),
])
def test_turboquant_slots_and_ratios(name, d64, ratio128):
    f = kv_format(name)
    assert f.bytes_per_token_per_kv_head(64) == d64
    assert round(512 / f.bytes_per_token_per_kv_head(128), 2) == ratio128


# vllm/config/cache.py CacheDType, each release's Literal (the names --kv-cache-dtype takes); octave_k3v4 and
# octave_k3v3 (0.33) are refused by name (kvplan.specs.kv_formats.UNPLANNED)
CACHE_DTYPE_0_19 = {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"}
CACHE_DTYPE_ADDED = {
    "0.20": {"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
             "int8_per_token_head", "fp8_per_token_head", "nvfp4"},
    "0.25": {"int4_per_token_head"}, "0.28": {"nvfp4_4over6"}, "0.30": {"nvfp4_ds_mla"}, "0.32": {"ultraquant_4bit"},
    "0.33": {"octave_k3v3_compact"},
}


def test_every_vllm_cache_dtype_is_catalogued_with_its_first_release():
    added = {n for names in CACHE_DTYPE_ADDED.values() for n in names}
    assert (CACHE_DTYPE_0_19 | added) <= set(CATALOG)
    assert {"mxfp8", "fp4_mx_block16", "kivi2", "kivi4"} <= set(CATALOG)
    assert {n: CATALOG[n].vllm_since for n in added} == {n: v for v, names in CACHE_DTYPE_ADDED.items() for n in names}
    assert all(CATALOG[n].vllm_since is None for n in CACHE_DTYPE_0_19 if n in CATALOG)


def test_a_release_lacks_the_dtypes_its_cache_dtype_does_not_list():
    from kvplan.rules.vllm import VLLM

    for version, rules in VLLM.items():
        later = {n for v, names in CACHE_DTYPE_ADDED.items() if tuple(map(int, v.split("."))) >
                 tuple(map(int, version.split("."))) for n in names}
        assert rules.cache_dtypes_missing == later, version


def test_kivi_layout():
    # 2-bit codes: 128 x 2 / 8 = 32 B per side; keys carry fp16 scale+zero per channel over 32 tokens
    # (128 x 4 B / 32 = 16 B per token), values per 32 channels (4 groups x 4 B = 16 B): 96 B -> 3.0 bits
    assert kv_format("kivi2").bytes_per_token_per_kv_head(128) == 96
    assert kv_format("kivi2").bits_per_element(128) == 3.0
    assert kv_format("kivi4").bits_per_element(128) == 5.0
    assert kv_format("kivi2").residual_tokens == 128


def test_custom_format_honest_bits():
    # fp16 scale + fp16 zero per 32 int4 values: 32 bits of metadata on 128 bits of payload = 160 / 32 = 5.0 bits.
    # (The seed text calls this 5.25; the arithmetic it gives yields 5.0.)
    f = kv_format("custom:bits=4,group=32,scale=fp16,zero=fp16")
    assert f.bits_per_element(128) == 5.0
    assert kv_format("custom:bits=8").bytes_per_token_per_kv_head(128) == 256
    assert kv_format("custom:bits=2").bytes_per_token_per_kv_head(128) == 64


def test_custom_format_channel_axis_matches_kivi():
    kivi = kv_format("kivi2")
    custom = kv_format("custom:bits=2,group=32,axis=kivi,scale=fp16,zero=fp16")
    assert custom.bytes_per_token_per_kv_head(128) == kivi.bytes_per_token_per_kv_head(128)


@pytest.mark.parametrize("bad", ["custom:bits=4,group=x", "custom:bits=4,axis=diagonal", "custom:group=32",
                                 "custom:bits=4,scale=fp12", "custom:bits=4,color=red", "custom:bits4"])
def test_custom_format_errors(bad):
    with pytest.raises(KvplanError):
        kv_format(bad)


def test_unknown_format_suggests():
    with pytest.raises(KvplanError, match="did you mean"):
        kv_format("fp8_e4m4")


def test_default_skip_layers_only_for_turboquant():
    # vLLM 0.33 engine/arg_utils.py: kv_cache_dtype_skip_layers gains TurboQuantConfig.get_boundary_skip_layers where
    # the cache dtype starts with "turboquant_" or is "ultraquant_4bit" (uses_packed_kv_backend)
    assert {f.name for f in CATALOG.values() if f.default_skip == "boundary"} == {
        "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit"}


def test_formats_json(cli):
    r = cli("formats", "--head-dim", "128", "--json")
    assert r.code == 0
    rows = {row["name"]: row for row in json.loads(r.out)}
    expected = {"bfloat16": 512, "fp8": 256, "int8_per_token_head": 264, "fp8_per_token_head": 264,
                "int4_per_token_head": 136, "nvfp4": 144, "turboquant_k8v4": 196, "turboquant_4bit_nc": 134,
                "turboquant_k3v4_nc": 118, "turboquant_3bit_nc": 102}
    for name, b in expected.items():
        assert rows[name]["bytes_per_token_per_kv_head"] == b
        assert rows[name]["bits_per_element"] == b * 8 / 256
    assert rows["fp8_ds_mla"]["mla_bytes_per_token"] == 656
    assert rows["nvfp4_ds_mla"]["mla_bytes_per_token"] == 352
    assert rows["bfloat16"]["mla_bytes_per_token"] == 1152
