"""Loading specs: catalog names and aliases, YAML paths, Hugging Face config.json, and bad input."""

import json
import shutil

import pytest

from kvplan.errors import KvplanError
from kvplan.sizing.model_tensors import param_count
from kvplan.specs.catalog import load_gpu, load_model


@pytest.mark.parametrize("name, full", [
    ("llama3-8b", "Llama-3-8B"), ("llama-3-8b", "Llama-3-8B"), ("Llama3-70B", "Llama-3-70B"),
    ("llama3.1-8b", "Llama-3.1-8B"), ("llama-4-scout", "Llama-4-Scout-17B-16E"), ("dsv3", "DeepSeek-V3"),
])
def test_model_names(name, full):
    assert load_model(name).name == full


@pytest.mark.parametrize("name, full", [("h100", "H100-SXM5-80GB"), ("h200", "H200-SXM-141GB"),
                                        ("A100", "A100-SXM4-80GB"), ("mi300x", "MI300X")])
def test_gpu_names(name, full):
    assert load_gpu(name).name == full


def test_gpu_memory_as_cuda_reports_it():
    h100 = load_gpu("h100")
    assert h100.cuda_total_gib == 79.11 and h100.smi_total_mib == 81559
    assert h100.memory_total_bytes == round(79.11 * 2**30)
    assert h100.peak_bandwidth_tbps == 3.35


def test_specs_are_immutable():
    m = load_model("llama3-8b")
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="frozen"):
        m.num_layers = 1


def test_unknown_model_suggests():
    with pytest.raises(KvplanError, match="did you mean.*llama-3-8b"):
        load_model("llama3-8bb")
    with pytest.raises(KvplanError, match="unknown GPU 'h1000'.*did you mean"):
        load_gpu("h1000")


@pytest.mark.parametrize("fixture, name, expected", [
    ("llama3-8b", "llama3-8b", 8_030_261_248),
    ("deepseek-v3", "deepseek-v3", 671_026_419_200),
    ("gpt-oss-120b", "gpt-oss-120b", 116_829_156_672),
    ("qwen3-30b-a3b", "qwen3-30b-a3b", 30_532_122_624),
    # the text model's 27,009,346,304 plus the SigLIP tower (27 layers of 1152 x 4304, 64 x 64 patches of 14 px:
    # 416,866,032 with its post-norm) and the projector (1152 x 5376 + 1152 = 6,194,304): the catalog's total
    ("gemma-3-27b", "gemma-3-27b", 27_009_346_304 + 416_866_032 + 6_194_304),
    ("falcon-7b", "falcon-7b", 6_921_720_704),
])
def test_hf_config_json(fixtures, fixture, name, expected):
    m = load_model(str(fixtures / f"{fixture}.config.json"))
    assert m.declared_params is None  # optional for config.json
    assert param_count(m) == expected
    catalog = load_model(name)
    assert m.layer_kinds == catalog.layer_kinds
    assert m.weight_dtype == catalog.weight_dtype
    assert (m.mla, m.moe) == (catalog.mla, catalog.moe)


def test_yaml_path_roundtrip(tmp_path):
    from kvplan.specs.catalog import catalog_dir

    p = tmp_path / "mine.yaml"
    shutil.copy(catalog_dir("models") / "llama-3-8b.yaml", p)
    assert load_model(str(p)).name == "Llama-3-8B"


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nnum_layers: [1, 2\n")
    with pytest.raises(KvplanError, match=r"bad.yaml: line \d+ is not valid YAML"):
        load_model(str(p))


def test_wrong_field_names_field(tmp_path):
    from kvplan.specs.catalog import catalog_dir

    text = (catalog_dir("models") / "llama-3-8b.yaml").read_text()
    p = tmp_path / "typo.yaml"
    p.write_text(text.replace("num_kv_heads: 8", "num_kv_head: 8"))
    with pytest.raises(KvplanError, match="field 'num_kv_head' is not a spec field \\(did you mean num_kv_heads"):
        load_model(str(p))
    p.write_text(text.replace("num_layers: 32", "num_layers: -3"))
    with pytest.raises(KvplanError, match="field 'num_layers'"):
        load_model(str(p))
    p.write_text(text.replace("head_dim: 128\n", ""))
    with pytest.raises(KvplanError, match="head_dim is required"):
        load_model(str(p))


def test_malformed_config_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"hidden_size": 4096,')
    with pytest.raises(KvplanError, match="config.json: line 1: not valid JSON"):
        load_model(str(p))
    p.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 100}))
    with pytest.raises(KvplanError, match="field 'num_hidden_layers' is missing"):
        load_model(str(p))


def test_missing_file():
    with pytest.raises(KvplanError, match="no such file"):
        load_model("./nope/model.yaml")


def test_catalog_parse_cache(tmp_path, monkeypatch):
    """A catalog file's parse is taken from the cache only for the very text it came from."""
    from kvplan.files import read_yaml
    from kvplan.specs import catalog as specs

    src = specs.catalog_dir("models") / "llama-3-8b.yaml"
    monkeypatch.setenv("KVPLAN_MODELS_DIR", str(tmp_path / "models"))
    (tmp_path / "models").mkdir()
    p = tmp_path / "models" / "llama-3-8b.yaml"
    shutil.copy(src, p)
    cold = specs._catalog_data(p)
    cached = specs._catalog_cache_file(p)
    assert cached.is_file() and cold == read_yaml(p)
    assert repr(specs._catalog_data(p)) == repr(cold)  # warm: same values, same types
    p.write_text(p.read_text().replace("num_layers: 32", "num_layers: 33"))
    assert specs._catalog_data(p)["num_layers"] == 33  # a changed file is parsed again
    cached.write_bytes(cached.read_bytes()[:40])
    assert specs._catalog_data(p)["num_layers"] == 33  # a broken cache is no cache
    p.write_text("name: [unclosed\n")
    with pytest.raises(KvplanError, match="is not valid YAML"):
        specs._catalog_data(p)


def _same_spec(a, b, at="spec"):
    """The same classes, values and fields set, all the way down."""
    from pydantic import BaseModel

    assert type(a) is type(b), at
    if isinstance(a, BaseModel):
        assert a.model_fields_set == b.model_fields_set and list(a.__dict__) == list(b.__dict__), at
        assert (a.__pydantic_extra__, a.__pydantic_private__) == (b.__pydantic_extra__, b.__pydantic_private__), at
        for k in a.__dict__:
            _same_spec(a.__dict__[k], b.__dict__[k], f"{at}.{k}")
    elif isinstance(a, (dict, list, tuple)):
        assert len(a) == len(b) and (not isinstance(a, dict) or list(a) == list(b)), at
        for k, (x, y) in enumerate(zip(a.values(), b.values()) if isinstance(a, dict) else zip(a, b)):
            _same_spec(x, y, f"{at}[{k}]")
    else:
        assert a == b, at


def test_catalog_specs_kept_validated(tmp_path, monkeypatch):
    """Every catalog spec, once validated, is taken from the cache as it was: the same classes (a state mixer's
    kind too), values and fields set, the same dumps, built without validating; a change to the spec classes'
    source or to the file's text validates it again."""
    from kvplan.specs import catalog as specs

    monkeypatch.setenv("KVPLAN_CACHE_DIR", str(tmp_path / "cache"))
    validated = {}
    for kind in ("models", "hardware"):
        for p in specs._catalog_files(kind):
            specs._load_catalog_file.cache_clear()
            validated[kind, p] = specs._load_catalog_file(kind, p)
    build = specs._build
    monkeypatch.setattr(specs, "_build", lambda *a: pytest.fail("validated again"))
    for (kind, p), fresh in validated.items():
        specs._load_catalog_file.cache_clear()
        kept = specs._load_catalog_file(kind, p)
        assert kept is not fresh and kept == fresh and repr(kept) == repr(fresh)
        _same_spec(fresh, kept)
        assert kept.model_dump() == fresh.model_dump() and kept.model_dump_json() == fresh.model_dump_json()
    calls = []
    monkeypatch.setattr(specs, "_build", lambda *a: calls.append(a[2]) or build(*a))
    p = specs.catalog_dir("models") / "llama-3-8b.yaml"
    monkeypatch.setattr(specs, "_spec_stamp", lambda: ("another release of the spec classes",))
    specs._load_catalog_file.cache_clear()
    assert specs._load_catalog_file("models", p) == validated["models", p] and calls == [p]
    monkeypatch.setenv("KVPLAN_MODELS_DIR", str(tmp_path / "models"))
    (tmp_path / "models").mkdir()
    edited = tmp_path / "models" / "llama-3-8b.yaml"
    edited.write_text(p.read_text().replace("num_layers: 32", "num_layers: 33"))
    specs._load_catalog_file.cache_clear()
    try:
        assert specs._load_catalog_file("models", edited).num_layers == 33 and calls == [p, edited]
    finally:
        specs._load_catalog_file.cache_clear()


def test_alias_lookup_builds_only_the_entry_named():
    from kvplan.specs import catalog as specs

    specs._load_catalog_file.cache_clear()
    try:
        assert load_model("meta-llama-3-8b").name == "Llama-3-8B"
        assert specs._load_catalog_file.cache_info().currsize == 1
    finally:
        specs._load_catalog_file.cache_clear()


def test_a_folder_or_file_on_disk_wins_over_the_catalog(cli, fixtures, tmp_path, monkeypatch):
    """A snapshot folder named like a catalog model is that folder's model, and a bare relative name works as ./name
    does: what exists on disk is what the user pointed at."""
    import json

    monkeypatch.chdir(tmp_path)
    cfg = json.loads((fixtures / "llama3-8b.config.json").read_text())
    cfg["num_hidden_layers"] = 16
    for folder in ("Llama-3.1-8B", "snap"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps(cfg))
    # K and V x 16 layers x 8 KV heads x head_dim 128 x 2 bytes (bf16) = 65,536 B/token; the catalog's
    # Llama-3.1-8B has 32 layers: 131,072
    per_token = 2 * 16 * cfg["num_key_value_heads"] * 128 * 2
    assert per_token == 65_536
    for name in ("Llama-3.1-8B", "snap", "./snap"):
        r = cli("crossover", name, "--json")
        assert r.code == 0, r.err
        assert json.loads(r.out)["kv_bytes_per_token"] == per_token, name
    # the clash is said where the folder stands in for a catalog name, and only there
    from kvplan.specs.catalog import load_model

    assert "not the catalog's Llama-3.1-8B" in load_model("Llama-3.1-8B").origin
    assert load_model("./Llama-3.1-8B").origin is None and load_model("snap").origin is None
    (tmp_path / "spec").write_text((fixtures / "tiny-model.yaml").read_text())  # a YAML spec without its suffix
    assert cli("crossover", "spec", "--json").code == 0
    # a folder without a config.json is no model: said so, and the catalog name still works beside such a folder
    (tmp_path / "adir").mkdir()
    r = cli("crossover", "adir")
    assert r.code == 2 and r.err.startswith("kvplan: error: unknown model 'adir': the folder adir holds no "
                                            "config.json; pass a snapshot folder") and "\n" == r.err[-1]
    (tmp_path / "llama3-8b").mkdir()
    assert json.loads(cli("crossover", "llama3-8b", "--json").out)["kv_bytes_per_token"] == 131_072


def test_weight_dtype_stands_in_for_an_unmodelled_checkpoint_quantization(cli, fixtures, tmp_path):
    """The error advises --weight-dtype; given, it plans the weights in that format: the same figures as the
    unquantized config with the same --weight-dtype, and a note saying the checkpoint's own scheme was set aside."""
    cfg = json.loads((fixtures / "llama3-8b.config.json").read_text())
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(cfg))
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MXFP8"}
    quant = tmp_path / "quant.json"
    quant.write_text(json.dumps(cfg))
    r = cli("capacity", str(quant), "--gpu", "h100", "--max-model-len", "8k")
    assert r.code == 2 and r.err == (f"kvplan: error: {quant}: ModelOpt quant_algo 'MXFP8' is not modelled; pass "
                                     f"--weight-dtype (fp8, nvfp4, ...) to plan the weights in that format\n")
    given = json.loads(cli("capacity", str(quant), "--gpu", "h100", "--max-model-len", "8k", "--weight-dtype",
                           "fp8", "--json").out)
    same = json.loads(cli("capacity", str(plain), "--gpu", "h100", "--max-model-len", "8k", "--weight-dtype", "fp8",
                          "--json").out)
    assert given["weight_bytes"] == same["weight_bytes"] and given["num_blocks"] == same["num_blocks"]
    assert given["weight_dtype"] == "fp8"
    assert ("the checkpoint's ModelOpt quant_algo 'MXFP8' is not modelled: its weights are planned as --weight-dtype "
            "fp8") in given["notes"]
    x = cli("crossover", str(quant), "--weight-dtype", "fp8", "--json")
    assert x.code == 0 and json.loads(x.out)["weight_bytes_held"] == json.loads(
        cli("crossover", str(plain), "--weight-dtype", "fp8", "--json").out)["weight_bytes_held"]
    # models show has no --weight-dtype: its message says where the option is taken
    r = cli("models", "show", str(quant))
    assert r.code == 2 and "`models show` shows the checkpoint as it is: capacity, crossover, throughput and sweep " \
                           "plan it with --weight-dtype" in r.err


def test_yaml_spec_reports_every_missing_field_at_once(tmp_path):
    # tie_word_embeddings is a required field and head_dim is never derived (without mla): both are named in one
    # message instead of the second only after the first is fixed
    import yaml

    from kvplan.errors import KvplanError
    from kvplan.specs.catalog import load_model

    spec = dict(name="Tiny", family="llama", num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4,
                num_kv_heads=2, vocab_size=256, max_position_embeddings=1024, dtype="bf16")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(KvplanError) as e:
        load_model(str(path))
    assert str(e.value) == f"{path}: fields 'tie_word_embeddings' and 'head_dim' are required"
    path.write_text(yaml.safe_dump({**spec, "tie_word_embeddings": False, "head_dim": 16}))
    assert load_model(str(path)).head_dim == 16


def test_no_home_directory_is_created_for_the_cache(tmp_path):
    # HOME pointing at a folder that does not exist: the command runs, and kvplan keeps no cache there rather
    # than creating the home directory; an existing home gets its ~/.cache/kvplan as before
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("KVPLAN_CACHE_DIR", "XDG_CACHE_HOME")}
    missing = tmp_path / "some" / "where"
    code = "import sys; from kvplan.app.cli import main; sys.exit(main(['crossover', 'llama3-8b', '--json']))"
    p = subprocess.run([sys.executable, "-c", code], env={**env, "HOME": str(missing)}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "some").exists()
    home = tmp_path / "home"
    home.mkdir()
    p = subprocess.run([sys.executable, "-c", code], env={**env, "HOME": str(home)}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert any((home / ".cache" / "kvplan" / "catalog").iterdir())
