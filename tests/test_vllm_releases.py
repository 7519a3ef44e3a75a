"""vLLM 0.26 to 0.33 as kvplan reads them: for each release, a case where its attention backends differ from the
release before, worked by hand from that release's source (paths relative to the vllm package of the release's
wheel), and the bytes of the KV dtypes vLLM 0.32 and 0.33 added, computed by hand from their slot layouts.
"""

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.format_support import support_matrix
from kvplan.rules.vllm_backends import AttentionFacts, backend_for
from kvplan.sizing.kv_cache import format_bytes_per_token, kv_bytes_per_token, kv_layers
from kvplan.specs.catalog import load_model
from kvplan.specs.kv_formats import kv_format

# Llama-3-8B: head 128, 32 query heads. A head-256 model without sinks or a sliding window. gpt-oss-like: head 64
# with attention sinks.
LLAMA = AttentionFacts(head_size=128, num_heads=32)
HEAD256 = AttentionFacts(head_size=256, num_heads=16)
SINKS = AttentionFacts(head_size=64, num_heads=64, sinks=True)
QWEN3_NEXT = "tests/fixtures/hf-corpus/Qwen--Qwen3-Next-80B-A3B-Instruct_config.json"


def _row(gpu, version, dtype, model="llama3-8b"):
    sm = support_matrix(gpu, "vllm", version, [model], [kv_format(dtype)])
    return sm.models[0].rows[0]


def test_026_sliding_window_layers_refuse_turboquant():
    # 0.26 v1/attention/backend.py AttentionBackend.validate_configuration: "sliding window not supported" where
    # has_sliding_window and not supports_sliding_window(); TurboQuantAttentionBackend keeps the base's False, and
    # model_executor/layers/attention/attention.py passes has_sliding_window=sliding_window is not None. Mistral
    # 7B v0.1's layers all slide (window 4096): 0.25 stores turboquant_k8v4 on TURBOQUANT, 0.26 has no backend for it
    assert _row("h100", "0.25", "turboquant_k8v4", "mistral-7b-v0.1").backend.name == "TURBOQUANT"
    r = _row("h100", "0.26", "turboquant_k8v4", "mistral-7b-v0.1")
    assert r.status == "what-if" and "no attention backend for turboquant_k8v4" in r.reason
    with pytest.raises(KvplanError, match="sliding window not supported"):
        backend_for(AttentionFacts(head_size=128, num_heads=32, sliding=True), "9.0", "turboquant_k8v4", "0.26",
                    requested="TURBOQUANT")
    # FlashAttention's supports_sliding_window is True: a 16-bit cache still runs on FA3
    assert _row("h100", "0.26", "auto", "mistral-7b-v0.1").backend.label == "FLASH_ATTN (FA3)"


def test_027_flash_attention_stores_fp8_with_fa4_on_blackwell():
    # 0.26 flash_attn.py FlashAttentionBackend.supports_kv_cache_dtype: fp8 only where get_flash_attn_version() == 3
    # on family 90; 0.27 fa_utils.py flash_attn_supports_kv_cache_dtype: FA3 on family 90 or FA4 on family 100
    with pytest.raises(KvplanError, match="FLASH_ATTN: vLLM 0.26 refuses it for fp8"):
        backend_for(LLAMA, "10.0", "fp8", "0.26", requested="FLASH_ATTN")
    c = backend_for(LLAMA, "10.0", "fp8", "0.27", requested="FLASH_ATTN")
    assert c.label == "FLASH_ATTN (FA4)" and c.block_size == 16  # MultipleOf(16) -> the default 16


def test_027_to_029_head_256_on_b200():
    # fa_utils.py get_flash_attn_version on 10.0 at head 256: 0.26 FA2 (head > 128 and not 192); 0.27 FA4 (256
    # excepted unless requires_local_attention); 0.28 FA2 ("FA4 on Blackwell is temporarily disabled for
    # head_size=256"); 0.29 FA4's hd256 kernel (uses_fa4_hd256_kernel), whose pages are FA4_HD256_PAGE_SIZE = 128
    # tokens (flash_attn.py get_preferred_block_size -> _get_fa4_hd256_block_size)
    seen = {v: backend_for(HEAD256, "10.0", "auto", v, requested="FLASH_ATTN") for v in ("0.26", "0.27", "0.28",
                                                                                          "0.29")}
    assert [(c.family, c.block_size) for c in seen.values()] == [("FA2", 16), ("FA4", 16), ("FA2", 16), ("FA4", 128)]
    # 0.29 _fa4_hd256_fallback_reason: a quantized cache falls back to FA2, which stores no fp8 on 10.x
    with pytest.raises(KvplanError, match="refuses it for fp8"):
        backend_for(HEAD256, "10.0", "fp8", "0.29", requested="FLASH_ATTN")


def test_028_nvfp4_4over6_on_b200(cli):
    # 0.28 flashinfer.py FlashInferBackend.supported_kv_cache_dtypes gains nvfp4_4over6, and supports_kv_cache_dtype
    # takes every kv_cache_dtype.startswith("nvfp4") on family 100 with TRTLLM; 0.27's CacheDType has no such name
    r = cli("formats", "nvfp4_4over6", "--gpu", "b200", "--engine-version", "0.28", "--model", "llama3-8b")
    assert r.code == 0, r.err
    line = next(ln for ln in r.out.splitlines() if ln.startswith(" nvfp4_4over6"))
    assert "served" in line and "FLASHINFER" in line
    assert _row("b200", "0.29", "nvfp4_4over6").backend.name == "FLASHINFER"
    assert _row("b200", "0.27", "nvfp4_4over6").status == "refused"
    # on 9.0 (no TRTLLM prefill) it stays a what-if
    assert _row("h100", "0.28", "nvfp4_4over6").status == "what-if"


def test_028_and_030_flashinfer_sinks():
    # flashinfer.py FlashInferBackend.supports_sink: 0.27 family 100 only; 0.28 also family 120 (its XQA decode:
    # utils/flashinfer.py supports_trtllm_attention(is_prefill=False) is True on 12.x); 0.30 also 9.0
    with pytest.raises(KvplanError, match="attention sinks need"):
        backend_for(SINKS, "12.0", "auto", "0.27", requested="FLASHINFER")
    assert backend_for(SINKS, "12.0", "auto", "0.28", requested="FLASHINFER").name == "FLASHINFER"
    with pytest.raises(KvplanError, match="attention sinks need"):
        backend_for(SINKS, "9.0", "auto", "0.29", requested="FLASHINFER")
    assert backend_for(SINKS, "9.0", "auto", "0.30", requested="FLASHINFER").name == "FLASHINFER"


def test_031_fa4_fp8_at_head_512_on_h100():
    # 0.31 fa_utils.py flash_attn_supports_kv_cache_dtype: on family 90, FA3 or FA4 at head 512 (a 9.x head above
    # 256 runs FA4: get_flash_attn_version's upgrade); flash_attn.py _get_sm90_fa4_fp8_kv_block_size sets 64 for
    # fp8/fp8_e4m3 at head 512. 0.30 refuses fp8 there (FA4 only on family 100), so FLASHINFER, next in the list,
    # stores it in 16-token blocks
    wide = AttentionFacts(head_size=512, num_heads=16)
    c = backend_for(wide, "9.0", "fp8", "0.31")
    assert (c.label, c.block_size) == ("FLASH_ATTN (FA4)", 64)
    c = backend_for(wide, "9.0", "fp8", "0.30")
    assert (c.name, c.block_size) == ("FLASHINFER", 16)


def test_032_nvfp4_on_flashinfer_fa2_path():
    # 0.32 flashinfer.py _nvfp4_kv_on_fa2 (families 80, 90, 120): supports_kv_cache_dtype takes nvfp4 (not
    # nvfp4_4over6) there; supports_combination refuses it at head 64 or with sinks. 0.31 takes NVFP4 on 10.x only
    assert _row("h100", "0.31", "nvfp4").status == "what-if"
    assert _row("h100", "0.32", "nvfp4").backend.name == "FLASHINFER"
    assert _row("a100", "0.32", "nvfp4").backend.name == "FLASHINFER"
    assert _row("h100", "0.32", "nvfp4_4over6").status == "what-if"


def test_032_ultraquant_on_rocm():
    # 0.32 platforms/rocm.py _get_backend_priorities ends with ULTRAQUANT; ultraquant_attn.py
    # UltraQuantAttentionBackend.get_preferred_block_size returns 64; config/cache.py CacheDType adds ultraquant_4bit
    r = _row("mi300x", "0.32", "ultraquant_4bit", "llama-3.1-8b")
    assert (r.status, r.backend.name, r.block_size) == ("served", "ULTRAQUANT", 64)
    old = _row("mi300x", "0.31", "ultraquant_4bit", "llama-3.1-8b")
    assert old.status == "refused" and "vLLM adds it in 0.32" in old.reason
    # platforms/cuda.py lists no ULTRAQUANT: on an H100 no backend stores it
    assert _row("h100", "0.33", "ultraquant_4bit", "llama-3.1-8b").status == "what-if"
    # supported_dtypes = [torch.bfloat16]: a float16 model is refused
    with pytest.raises(KvplanError, match="dtype float16 not supported"):
        backend_for(AttentionFacts(head_size=128, num_heads=32, dtype="float16"), "gfx942", "ultraquant_4bit",
                    "0.33", requested="ULTRAQUANT", platform="rocm")


def test_033_octave_on_cdna3_only():
    # 0.33 rocm_octave_attn.py RocmOctaveAttentionBackend: head 256 only (get_supported_head_sizes), CDNA3 or RDNA3
    # (supports_compute_capability: get_cdna_version() == 3 is gfx942; MI355X is gfx950, CDNA4), kernel blocks
    # MultipleOf(16); platforms/rocm.py puts ROCM_OCTAVE after TURBOQUANT. Qwen3-Next's heads are 256 (hybrid: the
    # block is the model's, 16 before alignment)
    r = _row("mi300x", "0.33", "octave_k3v3_compact", QWEN3_NEXT)
    assert (r.status, r.backend.name) == ("served", "ROCM_OCTAVE")
    r = _row("mi355x", "0.33", "octave_k3v3_compact", QWEN3_NEXT)
    assert r.status == "what-if" and r.backend.name == "none"
    with pytest.raises(KvplanError, match="compute capability gfx950 not supported"):
        backend_for(HEAD256, "gfx950", "octave_k3v3_compact", "0.33", requested="ROCM_OCTAVE", platform="rocm")
    # head 128: no backend stores it
    assert _row("mi300x", "0.33", "octave_k3v3_compact", "llama-3.1-8b").status == "what-if"
    old = _row("mi300x", "0.32", "octave_k3v3_compact", QWEN3_NEXT)
    assert old.status == "refused" and "vLLM adds it in 0.33" in old.reason


def test_ultraquant_bytes_per_token():
    # ops/ultraquant/format.py slot_size(128) = K codes 128/2 = 64 + K scales 128/32 = 4 + V codes 64 + V scales 4
    # = 136 bytes per token per KV head
    assert kv_format("ultraquant_4bit").bytes_per_token_per_kv_head(128) == 136
    assert kv_format("ultraquant_4bit").bytes_per_token_per_kv_head(256) == 272  # 128 + 8 + 128 + 8
    # Llama-3.1-8B: 8 KV heads x 136 = 1,088 B per token per layer; vLLM keeps the first two and last two of its
    # 32 layers in bf16 (engine/arg_utils.py: TurboQuantConfig.get_boundary_skip_layers for ultraquant_4bit too):
    # 8 x (28 x 136 + 4 x 2 x 128 x 2) = 8 x (3,808 + 2,048) = 46,848 B per token
    m = load_model("llama-3.1-8b")
    assert format_bytes_per_token(m, kv_format("ultraquant_4bit"), 1) == 1_088
    assert kv_bytes_per_token(kv_layers(m, kv_format("ultraquant_4bit"))) == 46_848


def test_octave_compact_bytes_per_token():
    # ops/rocm_octave.py OctaveFormat(256, rope_dim, v_bits=3, compact=True): off_k_nope = 0, off_v = 256 x 3 // 8
    # = 96, off_scales = 96 + 96 = 192, num_scales = 1 + 1, raw = 192 + 2 x 2 = 196, rounded up to 4: 196
    assert kv_format("octave_k3v3_compact").bytes_per_token_per_kv_head(256) == 196
    # Qwen3-Next-80B-A3B: 48 layers, full attention every 4th (12 layers), 2 KV heads: 12 x 2 x 196 = 4,704 B
    m = load_model(QWEN3_NEXT)
    assert kv_bytes_per_token(kv_layers(m, kv_format("octave_k3v3_compact"))) == 4_704


@pytest.mark.parametrize("name", ["octave_k3v4", "octave_k3v3"])
def test_octave_block_k_presets_are_refused(cli, name):
    # OctaveFormat.slot_bytes keeps K's rotary dims (head x partial_rotary_factor) at 4 bits: kvplan does not read
    # the rotary dimension, so it refuses these rather than guess their bytes
    with pytest.raises(KvplanError, match="rotary dimension"):
        kv_format(name)
    r = cli("formats", name, "--gpu", "mi300x")
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1 and "partial_rotary_factor" in r.err
