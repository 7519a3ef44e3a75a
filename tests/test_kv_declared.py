"""`--kv-cache-dtype auto` on a checkpoint that declares its KV-cache quantization: the engines store the declared
format (vLLM's resolve_kv_cache_dtype_string, SGLang's configure_kv_cache_dtype), and kvplan plans it."""

import json
from pathlib import Path

import pytest

from kvplan.deployment import DeploymentArgs
from kvplan.specs.catalog import load_model
from kvplan.specs.hf_config import declared_kv_cache

HERE = Path(__file__).parent / "fixtures" / "kv-declared"
LLAMA_FP8 = HERE / "nvidia--Llama-3.1-70B-Instruct-FP8.config.json"  # ModelOpt: hf_quant_config.json beside it
QWEN_FP8 = HERE / "Qwen--Qwen3-32B-FP8-Static-PerTensor.config.json"  # ModelOpt flat config.json, scheme a string


def test_modelopt_hf_quant_config_declares_fp8():
    decl = load_model(str(LLAMA_FP8)).kv_cache_dtype_declared
    assert decl.dtype == "fp8_e4m3"
    assert decl.source == "hf_quant_config.json kv_cache_quant_algo FP8"
    assert decl.engines == ("vllm", "sglang")


def test_snapshot_folder_reads_the_declaration(tmp_path):
    (tmp_path / "config.json").write_text(LLAMA_FP8.read_text())
    (tmp_path / "hf_quant_config.json").write_text(LLAMA_FP8.with_name(
        "nvidia--Llama-3.1-70B-Instruct-FP8.hf_quant_config.json").read_text())
    assert load_model(str(tmp_path)).kv_cache_dtype_declared.dtype == "fp8_e4m3"
    (tmp_path / "hf_quant_config.json").unlink()
    assert load_model(str(tmp_path)).kv_cache_dtype_declared is None


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_auto_resolves_to_the_declared_fp8_and_says_why(engine):
    d = DeploymentArgs(model=str(LLAMA_FP8), gpu="h200", engine=engine).resolve()
    assert d.kv.name == "fp8_e4m3"
    assert any(n.startswith("auto: the checkpoint declares an fp8 KV cache (hf_quant_config.json "
                            "kv_cache_quant_algo FP8)") for n in d.notes)
    # an explicit dtype wins, as in the engines
    assert DeploymentArgs(model=str(LLAMA_FP8), gpu="h200", engine=engine,
                          kv_cache_dtype="bfloat16").resolve().kv.name == "bfloat16"


def test_pool_holds_twice_the_tokens_of_bf16():
    from kvplan.api import capacity

    m = load_model(str(LLAMA_FP8))
    # by hand: 80 layers x 8 KV heads x 128 dims x (K + V); fp8 1 byte an element, bf16 2
    fp8_bytes, bf16_bytes = 80 * 8 * 128 * 2 * 1, 80 * 8 * 128 * 2 * 2
    auto = capacity(m, "h200", "auto")
    bf16 = capacity(m, "h200", "bfloat16")
    assert (auto.kv_bytes_per_token, bf16.kv_bytes_per_token) == (fp8_bytes, bf16_bytes)
    assert auto.token_slots / bf16.token_slots == pytest.approx(bf16_bytes / fp8_bytes, rel=1e-3)


def test_a_string_kv_cache_scheme_is_read_by_vllm_only():
    # torch_utils.get_kv_cache_quant_algo_string takes a string scheme; SGLang's ModelOptFp8Config.from_config
    # reads the flat kv_cache_scheme only as a dict (else kv_cache_quant_algo, absent here)
    decl = load_model(str(QWEN_FP8)).kv_cache_dtype_declared
    assert (decl.dtype, decl.engines) == ("fp8_e4m3", ("vllm",))
    assert DeploymentArgs(model=str(QWEN_FP8), gpu="h100").resolve().kv.name == "fp8_e4m3"
    d = DeploymentArgs(model=str(QWEN_FP8), gpu="h100", engine="sglang").resolve()
    assert d.kv.name == "auto" and any("not one SGLang reads" in n for n in d.notes)


@pytest.mark.parametrize("q, engines", [
    ({"kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}, ("vllm", "sglang")),
    ({"kv_cache_scheme": {"dynamic": True, "num_bits": 8, "type": "float"}}, ("sglang",)),  # vLLM: static only
    ({"kv_cache_quant_algo": "NVFP4"}, None),  # neither engine maps it (vLLM falls back to auto)
    ({}, None),
])
def test_modelopt_declarations(q, engines):
    decl = declared_kv_cache(q, "modelopt")
    assert (decl["engines"] if decl else None) == engines


def test_compressed_tensors_scheme_is_fp8_in_vllm_whatever_asked(tmp_path):
    cfg = json.loads((Path(__file__).parent / "fixtures" / "configs"
                      / "RedHatAI--Qwen2.5-7B-Instruct-fp8-dynamic.config.json").read_text())
    cfg["quantization_config"]["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                     "dynamic": False, "symmetric": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    d = DeploymentArgs(model=str(path), gpu="h100", kv_cache_dtype="bfloat16").resolve()
    assert d.kv.name == "fp8" and any("whatever --kv-cache-dtype says" in n for n in d.notes)
    assert DeploymentArgs(model=str(path), gpu="h100", engine="sglang").resolve().kv.name == "fp8"
    assert DeploymentArgs(model=str(path), gpu="h100", engine="sglang",
                          kv_cache_dtype="bfloat16").resolve().kv.name == "bfloat16"


def test_cli_capacity_on_a_modelopt_folder(tmp_path, capsys):
    from kvplan.app.cli import main

    (tmp_path / "config.json").write_text(LLAMA_FP8.read_text())
    (tmp_path / "hf_quant_config.json").write_text(
        HERE.joinpath("nvidia--Llama-3.1-70B-Instruct-FP8.hf_quant_config.json").read_text())
    assert main(["capacity", str(tmp_path), "--gpu", "h100", "--tp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out if isinstance(out, list) else [out]
    assert any("checkpoint declares an fp8 KV cache" in json.dumps(r) for r in rows)


def test_throughput_names_auto_from_the_checkpoint(capsys):
    # vLLM resolves auto to the fp8 the config's kv_cache_scheme "FP8" declares: the throughput table's row says so
    # and its JSON row carries the declaration; the bf16 row beside it carries neither
    from kvplan.app.cli import main

    args = ["throughput", str(QWEN_FP8), "--gpu", "h100", "--isl", "1024", "--osl", "256", "-n", "8"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "auto (fp8 from the checkpoint)" in table and "fp8_e4m3 " not in table
    assert main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    marked = {r["kv_cache_dtype"]: r.get("kv_cache_dtype_from_checkpoint") for r in rows}
    assert marked["fp8_e4m3"] and marked["bfloat16"] is None


def test_crossover_names_the_model_dtype_apart_from_auto_from_the_checkpoint(capsys):
    # where auto is the checkpoint's fp8, the bf16 baseline is named bf16, not "auto (bf16)": two rows called auto
    # would not say which is which
    from kvplan.app.cli import main

    assert main(["crossover", str(QWEN_FP8), "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "auto (fp8 from the checkpoint)" in out and "auto (bf16)" not in out and "vs bf16" in out
