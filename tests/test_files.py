"""Every file kvplan reads: whatever is wrong with it (missing, a directory, unreadable, not UTF-8, malformed, a
field of the wrong type at any depth) is one error line naming the file, exit code 2, never a traceback. Files
kvplan writes respect the umask, and sweep's integer columns stay integers."""

from __future__ import annotations

import json
import os
import pathlib
import stat

import pytest
import yaml

from kvplan.errors import KvplanError

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def one_error_line(r, name: str) -> None:
    assert r.code == 2, (r.out, r.err)
    assert r.err.startswith("kvplan: error: "), r.err
    assert r.err.count("\n") == 1, r.err
    assert "Traceback" not in r.err
    assert name in r.err, r.err


# ----------------------------------------------------------------------------------------------------------------
# Every reader: missing, a directory, unreadable, not UTF-8

# (file name, the command that reads it)
READERS = {
    "model spec": ("model.yaml", lambda p: ["crossover", p]),
    "config.json": ("config.json", lambda p: ["crossover", p]),
    "GPU spec": ("gpu.yaml", lambda p: ["capacity", "llama3-8b", "--gpu", p]),
    "deployment profile": ("profile.yaml", lambda p: ["capacity", "--profile", p]),
    "calibration profile": ("cal.yaml", lambda p: ["crossover", "llama3-8b", "--gpu", "h100", "--calibration", p]),
    "gates file": ("gates.yaml", lambda p: ["gate", p]),
}


@pytest.mark.parametrize("kind", READERS)
def test_missing_file(cli, tmp_path, kind):
    name, args = READERS[kind]
    path = tmp_path / "nowhere" / name
    r = cli(*args(str(path)))
    one_error_line(r, str(path))
    assert "no such" in r.err


@pytest.mark.parametrize("kind", READERS)
def test_directory(cli, tmp_path, kind):
    name, args = READERS[kind]
    path = tmp_path / name
    path.mkdir()
    r = cli(*args(str(path)))
    one_error_line(r, str(path))
    assert "is a directory" in r.err


@pytest.mark.parametrize("kind", READERS)
def test_not_utf8(cli, tmp_path, kind):
    name, args = READERS[kind]
    path = tmp_path / name
    path.write_bytes(b"# caf\xe9\nname: x\n")  # Latin-1, as an old editor saves it
    r = cli(*args(str(path)))
    one_error_line(r, str(path))
    assert "line 1" in r.err and "0xe9 is not UTF-8" in r.err


@pytest.mark.parametrize("kind", READERS)
def test_unreadable(cli, tmp_path, monkeypatch, kind):
    name, args = READERS[kind]
    path = tmp_path / name
    path.write_text("name: x\n")
    real = pathlib.Path.read_bytes

    def refuse(self):  # what a file without read permission gives (the tests may run as root, who reads anything)
        if pathlib.Path(self) == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", refuse)
    r = cli(*args(str(path)))
    one_error_line(r, str(path))
    assert "permission denied" in r.err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_for_real(cli, tmp_path):
    path = tmp_path / "gates.yaml"
    path.write_text("gates: []\n")
    path.chmod(0)
    try:
        r = cli("gate", str(path))
    finally:
        path.chmod(0o644)
    one_error_line(r, str(path))
    assert "permission denied" in r.err


def test_readers(tmp_path):
    from kvplan.files import read_json, read_text, read_yaml

    p = tmp_path / "a.yaml"
    p.write_bytes(b"\xef\xbb\xbfname: x\n")  # a byte-order mark is dropped
    assert read_text(p) == "name: x\n" and read_yaml(p) == {"name": "x"}
    p.write_bytes(b"a: 1\nb: 2\nc: \xff\n")
    with pytest.raises(KvplanError, match=r"a.yaml: line 3: byte 0xff is not UTF-8; save the gates file as UTF-8"):
        read_yaml(p, "gates file")
    j = tmp_path / "base.json"
    j.write_bytes(b'{"gates": ["\x80"]}')
    with pytest.raises(KvplanError, match="base.json: line 1: byte 0x80 is not UTF-8"):
        read_json(j, "--baseline")
    j.write_text('{"gates": [')
    with pytest.raises(KvplanError, match="base.json: line 1: not valid JSON"):
        read_json(j)
    j.write_text("[" * 100_000)
    with pytest.raises(KvplanError, match="base.json"):
        read_json(j)
    with pytest.raises(KvplanError, match=r"no such calibration profile: .*missing.yaml \(`kvplan measure`"):
        read_yaml(tmp_path / "missing.yaml", "calibration profile", "`kvplan measure` writes one")
    p.write_text("when: 2024-13-45\n")  # YAML reads it as a date, and no such date exists
    with pytest.raises(KvplanError, match="a.yaml: is not valid YAML"):
        read_yaml(p)
    p.write_text("a: 1\nb: \x00\n")
    with pytest.raises(KvplanError, match="a.yaml: line 2 is not valid YAML"):
        read_yaml(p)


# ----------------------------------------------------------------------------------------------------------------
# Wrong types at any depth


def _config(**changes) -> str:
    cfg = json.loads((FIXTURES / "llama3-8b.config.json").read_text())
    for k, v in changes.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return json.dumps(cfg)


_DROP = object()
_LLAMA = json.loads((FIXTURES / "llama3-8b.config.json").read_text())
_TEXT = {k: v for k, v in _LLAMA.items() if k not in ("architectures", "_name_or_path")}

CONFIGS = [
    ("quantization_config", _config(quantization_config="fp8")),
    ("quantization_config", _config(quantization_config=["fp8"])),
    ("quantization_config.quant_method", _config(quantization_config={"quant_method": 8})),
    ("quantization_config.weight_block_size", _config(quantization_config={"quant_method": "fp8",
                                                                           "weight_block_size": "128"})),
    ("quantization_config.bits", _config(quantization_config={"quant_method": "awq", "bits": "4"})),
    ("text_config", _config(text_config=[1], num_hidden_layers=_DROP)),
    ("text_config", _config(text_config=5, num_hidden_layers=_DROP)),
    ("text_config.num_hidden_layers", json.dumps({"model_type": "gemma3",
                                                  "text_config": {**_TEXT, "num_hidden_layers": "32"}})),
    ("text_config.quantization_config", json.dumps({"text_config": {**_TEXT, "quantization_config": "x"}})),
    ("layer_types", _config(layer_types="full_attention")),
    ("layer_types.1", _config(layer_types=["full_attention", 2])),
    ("layer_types", _config(layer_types=["full_attention", "linear_attention"])),
    ("num_hidden_layers", _config(num_hidden_layers="32")),
    ("num_hidden_layers", _config(num_hidden_layers=32.5)),
    ("num_hidden_layers", _config(num_hidden_layers=32.0)),
    ("num_hidden_layers", _config(num_hidden_layers=True)),
    ("num_hidden_layers", _config(num_hidden_layers=-1)),
    ("num_hidden_layers", _config(num_hidden_layers=[32])),
    ("num_hidden_layers", _config(num_hidden_layers=_DROP)),
    ("num_hidden_layers", _config(num_hidden_layers=float("nan"))),
    ("num_attention_heads", _config(num_attention_heads=0)),
    ("hidden_size", _config(hidden_size="4096")),
    ("num_key_value_heads", _config(num_key_value_heads="8")),
    ("head_dim", _config(head_dim=[128])),
    ("intermediate_size", _config(intermediate_size={"a": 1})),
    ("max_position_embeddings", _config(max_position_embeddings="8k")),
    ("rope_scaling", _config(rope_scaling="linear")),
    ("rope_scaling", _config(rope_scaling=[8.0])),
    ("tie_word_embeddings", _config(tie_word_embeddings="false")),
    ("torch_dtype", _config(torch_dtype=16)),
    ("model_type", _config(model_type=["llama"])),
    ("_name_or_path", _config(_name_or_path=5)),
    ("sliding_window", _config(sliding_window="4096")),
    ("use_sliding_window", _config(sliding_window=4096, use_sliding_window="yes")),
    ("sliding_window_pattern", _config(model_type="gemma3", sliding_window=1024, sliding_window_pattern="6")),
    ("no_rope_layers", _config(model_type="llama4_text", attention_chunk_size=8192, no_rope_layers="1110")),
    ("attention_chunk_size", _config(model_type="llama4_text", attention_chunk_size=[8192])),
    ("kv_lora_rank", _config(kv_lora_rank="512")),
    ("qk_rope_head_dim", _config(kv_lora_rank=512, qk_rope_head_dim="64")),
    ("num_local_experts", _config(num_local_experts="8")),
    ("num_experts_per_tok", _config(num_local_experts=8, num_experts_per_tok="2")),
    ("num_experts_per_tok", _config(num_local_experts=8)),
    ("n_shared_experts", _config(num_local_experts=8, num_experts_per_tok=2, n_shared_experts=[1])),
    ("topk_method", _config(num_local_experts=8, num_experts_per_tok=2, topk_method=1)),
    ("attention_bias", _config(attention_bias="true")),
    ("multi_query", _config(model_type="falcon", multi_query="yes")),
    ("JSON object", "[1, 2]"),
    ("JSON object", '"config"'),
    ("JSON object", "null"),
    ("not valid JSON", '{"num_hidden_layers": 32,'),
]


@pytest.mark.parametrize("field, body", CONFIGS)
def test_malformed_config_json(cli, tmp_path, field, body):
    path = tmp_path / "config.json"
    path.write_text(body)
    r = cli("crossover", str(path))
    one_error_line(r, str(path))
    assert field in r.err


def _spec(name: str, **changes) -> str:
    from kvplan.specs.catalog import catalog_dir

    data = yaml.safe_load((catalog_dir("models" if name.startswith("llama") else "hardware") / name).read_text())
    data.update(changes)
    return yaml.safe_dump(data)


MODEL_SPECS = [
    ("attention", _spec("llama-3-8b.yaml", attention=5)),
    ("attention.pattern", _spec("llama-3-8b.yaml", attention={"pattern": 5})),
    ("attention.pattern.0", _spec("llama-3-8b.yaml", attention={"pattern": ["fulll"]})),
    ("attention.sliding_window", _spec("llama-3-8b.yaml", attention={"pattern": ["sliding"], "sliding_window": "x"})),
    ("moe", _spec("llama-3-8b.yaml", moe=[])),
    ("moe.num_experts", _spec("llama-3-8b.yaml", moe={"num_experts": [8], "experts_per_token": 2,
                                                      "expert_intermediate_size": 1024})),
    ("mla", _spec("llama-3-8b.yaml", mla="latent")),
    ("extra_params", _spec("llama-3-8b.yaml", extra_params=[1])),
    ("extra_params.vision", _spec("llama-3-8b.yaml", extra_params={"vision": "big"})),
    ("aliases", _spec("llama-3-8b.yaml", aliases=5)),
    ("num_layers", _spec("llama-3-8b.yaml", num_layers=32.5)),
    ("num_layers", _spec("llama-3-8b.yaml", num_layers=float("inf"))),
    ("declared_params", _spec("llama-3-8b.yaml", declared_params=float("nan"))),
    ("top level", "- name: x\n- name: y\n"),
    ("top level", "just a sentence\n"),
    ("top level", ""),
    ("not valid YAML", "name: [x\n"),
    ("not valid YAML", "name: x\n\tnum_layers: 3\n"),
]


@pytest.mark.parametrize("field, body", MODEL_SPECS)
def test_malformed_model_spec(cli, tmp_path, field, body):
    path = tmp_path / "model.yaml"
    path.write_text(body)
    r = cli("crossover", str(path))
    one_error_line(r, str(path))
    assert field in r.err


GPU_SPECS = [
    ("memory_gb", _spec("h100-sxm.yaml", memory_gb=float("inf"))),
    ("memory_gb", _spec("h100-sxm.yaml", memory_gb="lots")),
    ("dense_tflops", _spec("h100-sxm.yaml", dense_tflops=[989])),
    ("dense_tflops.bf16", _spec("h100-sxm.yaml", dense_tflops={"bf16": "fast"})),
    ("peak_bandwidth_tbps", _spec("h100-sxm.yaml", peak_bandwidth_tbps=float("nan"))),
    ("top level", "[h100]\n"),
]


@pytest.mark.parametrize("field, body", GPU_SPECS)
def test_malformed_gpu_spec(cli, tmp_path, field, body):
    path = tmp_path / "gpu.yaml"
    path.write_text(body)
    r = cli("capacity", "llama3-8b", "--gpu", str(path))
    one_error_line(r, str(path))
    assert field in r.err


def _profile(**changes) -> str:
    data = {"schema": "kvplan-deployment-profile/1", "engine": "vllm", "model": "Llama-3-8B", "gpu": "H100-SXM5-80GB",
            "max_model_len": 8192, "weights_bytes": 16_060_522_496, "available_kv_bytes": 59_229_113_930}
    data.update(changes)
    return yaml.safe_dump(data)


PROFILES = [
    ("expected a mapping", "- 1\n- 2\n"),
    ("expected a mapping", ""),
    ("schema", _profile(schema=["kvplan-deployment-profile/1"])),
    ("schema", _profile(schema={"a": "b\nc"})),
    ("field 'tp'", _profile(tp="two")),
    ("field 'tp'", _profile(tp=[1])),
    ("field 'engine'", _profile(engine=5)),
    ("field 'weights_bytes'", _profile(weights_bytes=float("inf"))),
    ("field 'available_kv_bytes'", _profile(available_kv_bytes={"gib": 55})),
    ("field 'max_model_len'", _profile(max_model_len=None)),
    ("field 'max_model_lenn'", _profile(max_model_lenn=8192)),
    ("field 'source'", _profile(source=["log"])),
    ("not valid YAML", "schema: [\n"),
]


@pytest.mark.parametrize("says, body", PROFILES)
def test_malformed_deployment_profile(cli, tmp_path, says, body):
    path = tmp_path / "profile.yaml"
    path.write_text(body)
    r = cli("capacity", "--profile", str(path))
    one_error_line(r, str(path))
    assert says in r.err


def _calibration(**changes) -> str:
    data = {"schema": "kvplan-calibration/1", "device": {"name": "NVIDIA H100 80GB HBM3"}, "quick": False,
            "peak_bandwidth_bytes_per_s": 3.35e12,
            "families": {"gemv_bf16": {"t0_s": 4e-6, "eta": 0.85, "points": [[1e7, 1.6e-5, 0, 0]]},
                         "decode_bfloat16": {"t0_s": 6e-6, "eta": 0.8, "points": [[1e7, 1.8e-5, 0, 0]]}}}
    for key, value in changes.items():
        if "." in key:
            family, field = key.split(".")
            data["families"][family][field] = value
        else:
            data[key] = value
    return yaml.safe_dump(data)


CALIBRATIONS = [
    ("not a kvplan calibration profile", "[1]\n"),
    ("not a kvplan calibration profile", _calibration(schema=5)),
    ("field 'families'", _calibration(families=[])),
    ("field 'families'", _calibration(families=None)),
    ("field 'families.gemv_bf16'", _calibration(families={"gemv_bf16": 5})),
    ("field 'families.gemv_bf16.t0_s'", _calibration(**{"gemv_bf16.t0_s": "fast"})),
    ("field 'families.gemv_bf16.t0_s'", _calibration(**{"gemv_bf16.t0_s": -1.0})),
    ("field 'families.gemv_bf16.eta'", _calibration(**{"gemv_bf16.eta": float("inf")})),
    ("field 'families.gemv_bf16.eta'", _calibration(**{"gemv_bf16.eta": 0})),
    ("field 'families.gemv_bf16.eta'", _calibration(**{"gemv_bf16.eta": True})),
    ("field 'families.gemv_bf16.points'", _calibration(**{"gemv_bf16.points": "many"})),
    ("field 'families.gemv_bf16.points.0'", _calibration(**{"gemv_bf16.points": [[1e7]]})),
    ("field 'families.gemv_bf16.points.0.0'", _calibration(**{"gemv_bf16.points": [["big", 1e-5]]})),
    ("field 'families.gemv_bf16.points.0.1'", _calibration(**{"gemv_bf16.points": [[1e7, 0]]})),
    ("field 'device'", _calibration(device=["H100"])),
    ("field 'device.memory_total_bytes'", _calibration(device={"memory_total_bytes": "80G"})),
    ("field 'peak_bandwidth_bytes_per_s'", _calibration(peak_bandwidth_bytes_per_s="3.35 TB/s")),
    ("field 'peak_bandwidth_bytes_per_s'", _calibration(peak_bandwidth_bytes_per_s=None)),
    ("field 'quick'", _calibration(quick="no")),
]


@pytest.mark.parametrize("says, body", CALIBRATIONS)
def test_malformed_calibration_profile(cli, tmp_path, says, body):
    path = tmp_path / "cal.yaml"
    path.write_text(body)
    r = cli("crossover", "llama3-8b", "--gpu", "h100", "--context", "8192", "--calibration", str(path))
    one_error_line(r, str(path))
    assert says in r.err


def test_valid_calibration_profile_still_loads(cli, tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text(_calibration())
    r = cli("crossover", "llama3-8b", "--gpu", "h100", "--context", "8192", "--calibration", str(path), "--json")
    assert r.code == 0, r.err


GATE = "  - name: g\n    model: llama3-8b\n    require: {min_concurrency: 3}\n"

GATES = [
    ("field 'gates'", "gates: 5\n"),
    ("field 'gates.0'", "gates: [5]\n"),
    ("field 'gates'", "gates: []\n"),
    ("field 'gates'", "gates: {name: g}\n"),
    ("defaults: field 'defaults'", "defaults: []\ngates:\n" + GATE),
    ("defaults: field 'defaults.tp'", "defaults: {tp: [2]}\ngates:\n" + GATE),
    ("field 'require'", "gates:\n  - name: g\n    model: llama3-8b\n    require: 3\n"),
    ("field 'require'", "gates:\n  - name: g\n    model: llama3-8b\n    require: [min_concurrency]\n"),
    ("field 'require.max_step_ms'", "gates:\n  - name: g\n    model: llama3-8b\n    require: {max_step_ms: 5}\n"),
    ("field 'require.max_step_ms.bacth' is not allowed (did you mean batch",
     "gates:\n  - name: g\n    model: llama3-8b\n    require: {max_step_ms: {bacth: 1, context: 8, ms: 2}}\n"),
    ("field 'gates.0.require.max_step_ms.ms'",
     "gates:\n  - name: g\n    model: llama3-8b\n    require: {max_step_ms: {context: 8, ms: .nan}}\n"),
    ("field 'gates.0.require.min_concurrency'",
     "gates:\n  - name: g\n    model: llama3-8b\n    require: {min_concurrency: .inf}\n"),
    ("gate #1: field 'name'", "gates:\n  - name: [g]\n    model: llama3-8b\n    require: {min_concurrency: 3}\n"),
    ("gate #1: field 'name'", 'gates:\n  - name: "a\\nb"\n    model: llama3-8b\n    require: {min_concurrency: 3}\n'),
    ("field 'model'", "gates:\n  - name: g\n    model: [llama3-8b]\n    require: {min_concurrency: 3}\n"),
    ("field 'kv_cache_dtype_skip_layers'",
     "gates:\n  - name: g\n    model: llama3-8b\n    kv_cache_dtype_skip_layers: {a: 1}\n"
     "    require: {min_concurrency: 3}\n"),
    ("expected a mapping", "5\n"),
    ("expected a mapping", ""),
]


@pytest.mark.parametrize("says, body", GATES)
def test_malformed_gates_file(cli, tmp_path, says, body):
    path = tmp_path / "gates.yaml"
    path.write_text(body)
    r = cli("gate", str(path))
    one_error_line(r, str(path))
    assert says in r.err


def test_malformed_startup_log_setting(cli, tmp_path):
    text = (FIXTURES / "logs" / "vllm-v1-0.10-llama31-8b-h100.log").read_text()
    assert "tensor_parallel_size=1" in text
    path = tmp_path / "startup.log"
    path.write_text(text.replace("tensor_parallel_size=1", "tensor_parallel_size=auto"))
    r = cli("log", str(path), "--gpu", "h100")
    one_error_line(r, str(path))
    assert "tp to 'auto', expected a whole number" in r.err
    path.write_text(text.replace("GPU KV cache size: ", "GPU KV cache size: " + "9" * 400))
    r = cli("log", str(path), "--gpu", "h100")
    one_error_line(r, str(path))


# ----------------------------------------------------------------------------------------------------------------
# Writing: atomic, with the umask's permissions


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_written_files_respect_the_umask(umask, tmp_path):
    from kvplan.files import atomic_write_text

    umask(0o022)
    atomic_write_text(tmp_path / "a.txt", "x")
    assert mode(tmp_path / "a.txt") == 0o644
    umask(0o077)
    atomic_write_text(tmp_path / "b.txt", "x")
    assert mode(tmp_path / "b.txt") == 0o600
    umask(0o002)
    atomic_write_text(tmp_path / "c.txt", "x")
    assert mode(tmp_path / "c.txt") == 0o664
    # replacing a file keeps its permissions
    (tmp_path / "a.txt").chmod(0o640)
    atomic_write_text(tmp_path / "a.txt", "y")
    assert mode(tmp_path / "a.txt") == 0o640 and (tmp_path / "a.txt").read_text() == "y"
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_cli_outputs_respect_the_umask(cli, umask, tmp_path):
    umask(0o022)
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", "-o", str(tmp_path / "grid.csv"))
    assert r.code == 0, r.err
    assert mode(tmp_path / "grid.csv") == 0o644
    gates = tmp_path / "gates.yaml"
    gates.write_text("defaults: {gpu: h100}\ngates:\n" + GATE)
    r = cli("gate", str(gates), "--junit", str(tmp_path / "junit.xml"))
    assert r.code == 0, r.err
    assert mode(tmp_path / "junit.xml") == 0o644


def test_write_into_a_folder_that_refuses(tmp_path, monkeypatch):
    import tempfile

    from kvplan.files import atomic_write_text

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(KvplanError, match="cannot write .*out.csv: Permission denied"):
        atomic_write_text(tmp_path / "out.csv", "x")


# ----------------------------------------------------------------------------------------------------------------
# sweep's column types

INTEGER_COLUMNS = ["tp", "max_model_len", "batch", "context", "weight_bytes_held", "available_kv_bytes", "num_blocks",
                   "blocks_per_request", "kv_tokens"]
FLOAT_COLUMNS = ["kv_bytes_per_token", "max_concurrency", "crossover_tokens", "weight_bytes", "kv_bytes",
                 "step_bytes", "saving", "crossover_tokens_at_batch", "step_ms"]


def test_sweep_csv_writes_integers(cli):
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100")
    assert r.code == 0, r.err
    header, row = r.out.splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(","), strict=True))
    assert "8192," in row and "8192.0" not in row
    for c in INTEGER_COLUMNS:
        assert cells[c].isdigit(), (c, cells[c])
    assert cells["fits"] == "True"


@pytest.mark.parametrize("tps", [[1, 2], [3]])  # [3] splits no head count evenly: every row is skipped
def test_sweep_column_dtypes(tps):
    import kvplan

    df = kvplan.sweep(["llama3-8b"], ["h100"], tps=tps, dtypes=["auto", "fp8"], batches=[1, 8])
    assert len(df) == (8 if tps == [1, 2] else 0)
    for c in INTEGER_COLUMNS:
        assert df[c].dtype.kind == "i", (c, df[c].dtype)
    assert df["fits"].dtype == bool
    for c in FLOAT_COLUMNS:
        assert df[c].dtype.kind == "f", (c, df[c].dtype)
