"""SGLang's attention backend per model, GPU, dtype and release (kvplan.rules.sglang_backends), the page size it
sets, and `--kv-cache-dtype auto` resolved from a checkpoint per SGLang release. Each expectation is read from
SGLang's source (python/sglang/srt), cited beside it."""

import json
from pathlib import Path

import pytest

from kvplan.deployment import DeploymentArgs
from kvplan.rules import sglang_backends as sb

HERE = Path(__file__).parent / "fixtures"
LLAMA_FP8 = HERE / "kv-declared" / "nvidia--Llama-3.1-70B-Instruct-FP8.config.json"
QWEN_FP8 = HERE / "kv-declared" / "Qwen--Qwen3-32B-FP8-Static-PerTensor.config.json"


def _d(model="llama3-8b", gpu="h100", **kw):
    return DeploymentArgs(model=model, gpu=gpu, engine="sglang", **kw).resolve()


@pytest.mark.parametrize("model, gpu, version, backend, page", [
    # MHA: fa3 on Hopper (is_hopper_with_cuda_12_3), trtllm_mha on SM100 with page 64 (it takes 16, 32, 64 [, 128]
    # and sets 64 otherwise), flashinfer elsewhere (0.5.9 server_args.py _handle_attention_backend_compatibility;
    # 0.5.23 arg_groups/model_override_base.py get_default_attn_backend)
    ("llama3-8b", "h100", "0.5.9", "fa3", 1),
    ("llama3-8b", "b200", "0.5.9", "trtllm_mha", 64),
    ("llama3-8b", "b200", "0.5.23", "trtllm_mha", 64),
    ("llama3-8b", "a100", "0.5.23", "flashinfer", 1),
    ("llama3-8b", "mi300x", "0.5.23", "aiter", 1),  # is_hip
    # MLA: fa3 on Hopper; DeepSeek-V3 on SM100 its own trtllm_mla (_handle_model_specific_adjustments), page 64;
    # another MLA model flashinfer there; triton elsewhere
    ("deepseek-v3", "h200", "0.5.23", "fa3", 1),
    ("deepseek-v3", "b200", "0.5.9", "trtllm_mla", 64),
    ("deepseek-v2-lite", "b200", "0.5.23", "flashinfer", 1),
    ("deepseek-v2-lite", "a100", "0.5.23", "triton", 1),
    # GPT-OSS: trtllm_mha on SM100, fa3 on SM90, else triton (_handle_model_specific_adjustments)
    ("gpt-oss-20b", "a100", "0.5.9", "triton", 1),
    ("gpt-oss-20b", "h100", "0.5.23", "fa3", 1),
])
def test_default_backend_and_page(model, gpu, version, backend, page):
    d = _d(model, gpu, engine_version=version, tp=8 if model == "deepseek-v3" else None)
    assert (d.attention_backend.name, d.page_size) == (backend, page)
    assert d.to_dict()["attention_backend"] == backend


def test_fp8_e5m2_runs_on_triton_on_hopper():
    # "FlashAttention3 only supports fp8_e4m3 if using FP8; Setting attention backend to triton."
    # (0.5.9 server_args.py; 0.5.23 arg_groups/overrides.py _attention_backend_fa3_fp8_fallback)
    d = _d(kv_cache_dtype="fp8_e5m2")
    assert d.attention_backend.name == "triton" and d.unserved is None


def test_mxfp8_needs_fa4_on_blackwell():
    # mxfp8 is the FA4 path's (0.5.16 server_args.py --kv-cache-dtype help); SGLang's default on a B200 MHA model
    # is trtllm_mha, which does not read it: a what-if naming fa4
    d = _d(gpu="b200", kv_cache_dtype="mxfp8")
    assert d.unserved and d.unserved.endswith("--attention-backend fa4 serves it")
    # fa4 on an MHA model sets page 128 (overrides.py _fa4_page_constraint)
    d = _d(gpu="b200", kv_cache_dtype="mxfp8", attention_backend="fa4")
    assert (d.attention_backend.name, d.page_size, d.unserved) == ("fa4", 128, None)


def test_fp4_caches_per_release():
    # 0.5.9 to 0.5.15: fp4_e2m1, on trtllm_mla for MLA (its dtype list: fp8_e4m3, fp4_e2m1, bf16, auto)
    d = _d("deepseek-v3", "b200", engine_version="0.5.9", kv_cache_dtype="fp4_e2m1", tp=8)
    assert (d.attention_backend.name, d.unserved) == ("trtllm_mla", None)
    # 0.5.16 on: nvfp4, on trtllm_mha for MHA (_handle_kv4_compatibility KV4_ATTENTION_MHA_BACKEND_CHOICES)
    d = _d(gpu="b200", engine_version="0.5.23", kv_cache_dtype="nvfp4")
    assert (d.attention_backend.name, d.unserved) == ("trtllm_mha", None)
    assert sb.serving("0.5.23", False, "nvfp4", (10, 0), "cuda") == ["triton", "trtllm_mha"]


def test_refusals_are_one_line(cli):
    r = cli("capacity", "llama3-8b", "--gpu", "a100", "--engine", "sglang", "--attention-backend", "fa3")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "fa3 does not run on A100-SXM4-80GB" in r.err and "--attention-backend flashinfer serves it" in r.err
    r = cli("capacity", "llama3-8b", "--gpu", "b200", "--engine", "sglang", "--engine-version", "0.5.12", "-d",
            "nvfp4")
    assert r.code == 2 and "gain it in 0.5.16" in r.err and r.err.count("\n") == 1
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "--engine", "sglang", "--attention-backend", "nope")
    assert r.code == 2 and "kvplan plans SGLang 0.5.23's" in r.err


def test_every_entry_cites_its_source():
    for b in sb.BACKENDS:
        assert b.source and (".py" in b.source), b.name
    for r in sb.READ:
        assert ".py" in sb.DEFAULT_SOURCES[r]


def test_formats_matrix_shows_the_backend(cli):
    r = cli("formats", "--engine", "sglang", "--gpu", "b200", "--model", "llama3-8b")
    assert r.code == 0
    row = next(line for line in r.out.splitlines() if line.split()[:1] == ["fp8_e4m3"])
    assert row.split()[:5] == ["fp8_e4m3", "served", "fp8_e4m3", "trtllm_mha", "64"]


# --kv-cache-dtype auto from the checkpoint, per SGLang release

def test_modelopt_nested_declaration_read_by_every_release():
    # hf_quant_config.json {"quantization": {"kv_cache_quant_algo": "FP8"}}: ModelOptFp8Config.from_config's nested
    # branch reads it in 0.5.9 and 0.5.23 alike; configure_kv_cache_dtype: "FP8" -> torch.float8_e4m3fn
    for v in ("0.5.9", "0.5.23"):
        d = _d(str(LLAMA_FP8), "h200", engine_version=v)
        assert d.kv.name == "fp8_e4m3" and d.kv_from_checkpoint


def test_flat_string_scheme_is_not_read_by_sglang():
    # Qwen3-32B-FP8-Static-PerTensor: config.json's quantization_config (quant_algo FP8, kv_cache_scheme "FP8", a
    # string) is read before hf_quant_config.json (configs/model_config.py _parse_quant_hf_config);
    # ModelOptFp8Config.from_config takes a dict kv_cache_scheme only (0.5.9), else the flat kv_cache_quant_algo
    # (0.5.15 on), absent here: SGLang stores bf16. vLLM's get_kv_cache_quant_algo_string takes the string: fp8.
    for v in ("0.5.9", "0.5.23"):
        assert _d(str(QWEN_FP8), engine_version=v).kv.name == "auto"
    d = DeploymentArgs(model=str(QWEN_FP8), gpu="h100").resolve()
    assert d.kv.name == "fp8_e4m3" and d.to_dict()["kv_cache_dtype_from_checkpoint"].startswith("config.json")


def test_flat_kv_cache_quant_algo_from_0_5_15(tmp_path):
    cfg = json.loads(QWEN_FP8.read_text())
    q = cfg["quantization_config"]
    del q["kv_cache_scheme"]
    q["kv_cache_quant_algo"] = "FP8"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    path = str(tmp_path / "config.json")
    # 0.5.14 ModelOptFp8Config.from_config: flat format, no dict scheme -> kv_cache_quant_method None (bf16);
    # 0.5.15: `else: kv_cache_quant_method = config.get("kv_cache_quant_algo")` -> "FP8" -> fp8_e4m3
    assert _d(path, engine_version="0.5.14").kv.name == "auto"
    assert _d(path, engine_version="0.5.15").kv.name == "fp8_e4m3"


def test_compressed_tensors_scheme_from_0_5_19(tmp_path):
    cfg = json.loads((HERE / "configs" / "RedHatAI--Qwen2.5-7B-Instruct-fp8-dynamic.config.json").read_text())
    cfg["quantization_config"]["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                     "dynamic": False, "symmetric": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    path = str(tmp_path / "config.json")
    # CompressedTensorsConfig.kv_cache_quant_algo (the property configure_kv_cache_dtype reads) exists from 0.5.19
    # (layers/quantization/compressed_tensors/compressed_tensors.py); 0.5.18 has none, so auto is the model dtype
    assert _d(path, engine_version="0.5.18").kv.name == "auto"
    assert _d(path, engine_version="0.5.19").kv.name == "fp8"


def test_tables_say_auto_is_fp8_from_the_checkpoint(cli):
    for engine in ("vllm", "sglang"):
        r = cli("capacity", str(LLAMA_FP8), "--gpu", "h200", "--engine", engine)
        assert r.code == 0 and "auto (fp8 from the checkpoint)" in r.out, engine
    r = cli("capacity", str(LLAMA_FP8), "--gpu", "h200", "--engine", "sglang", "--json")
    out = json.loads(r.out)
    rows = out if isinstance(out, list) else [out]
    assert rows[0]["deployment"]["kv_cache_dtype_from_checkpoint"] == "hf_quant_config.json kv_cache_quant_algo FP8"
    # by hand: 80 layers x 8 KV heads x 128 dims x (K + V) x 1 byte (fp8)
    assert rows[0]["cell_bytes"] == 80 * 8 * 128 * 2


def test_sglang_kv_cache_dtype_names_come_from_the_catalog():
    # sglang 0.5.9 server_args.py --kv-cache-dtype choices: auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1;
    # 0.5.16 adds nvfp4, fp4_mx_block16 and mxfp8 (srt/configs kv_cache_dtype.py). kvplan's fp8 is SGLang's fp8_e4m3
    from kvplan.rules.sglang import SGLANG_DTYPES

    assert set(SGLANG_DTYPES.values()) == {"auto", "fp8_e5m2", "fp8_e4m3", "bf16", "fp4_e2m1", "nvfp4",
                                           "fp4_mx_block16", "mxfp8"}
    assert SGLANG_DTYPES["bfloat16"] == "bf16" and SGLANG_DTYPES["fp8"] == "fp8_e4m3"
