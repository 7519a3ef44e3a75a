"""Property-based fuzzing of the command line: whatever the input, every command exits 0 (success), 1 (only `gate`:
a gate failed) or 2 (bad input), never with a traceback, and on exit 2 stderr is exactly one line starting
"kvplan: error: ".

Seeded and bounded (about 2,000 cases in all): set KVPLAN_FUZZ_SEED to explore with another seed.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from kvplan.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SEED = int(os.environ.get("KVPLAN_FUZZ_SEED", "20260101"))
MIN_CASES = 2000


def fuzz(n: int):
    """Hypothesis settings for one fuzz test: n examples, seeded, no database, no deadline."""

    def wrap(f):
        f = settings(max_examples=n, deadline=None, derandomize=False, database=None, print_blob=False,
                     suppress_health_check=list(HealthCheck))(f)
        return seed(SEED)(f)

    return wrap


# ----------------------------------------------------------------------------------------------------------------
# Running the CLI and the property every case must hold

COUNT = {"cases": 0}
RAN: set[str] = set()


def run(argv: list[str]) -> tuple[int, str, str]:
    """Call kvplan.cli.main in-process; fail the case on an escaped exception or a Python warning."""
    argv = [str(a) for a in argv]
    COUNT["cases"] += 1
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with redirect_stdout(out), redirect_stderr(err):
                code = main(argv)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - anything escaping main() is the bug we look for
            raise AssertionError(f"kvplan {' '.join(argv)}: {type(e).__name__} escaped main(): {e}") from e
    shown = [w for w in caught if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    assert not shown, f"kvplan {' '.join(argv)}: a Python warning reached stderr: {shown[0].message}"
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> int:
    note(f"argv: {[str(a) for a in argv]!r}")
    code, out, err = run(argv)
    note(f"exit {code}; stderr: {err!r}")
    assert "Traceback" not in err, f"kvplan {' '.join(map(str, argv))}: traceback on stderr:\n{err}"
    allowed = {0, 1, 2} if str(argv[0]) == "gate" else {0, 2}
    assert code in allowed, f"kvplan {' '.join(map(str, argv))}: exit {code}; stderr: {err!r}"
    if code == 2:
        lines = err.rstrip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("kvplan: error: "), (
            f"kvplan {' '.join(map(str, argv))}: exit 2 must say one 'kvplan: error: ' line; stderr: {err!r}")
    return code


def ran(name: str) -> None:
    RAN.add(name)


# ----------------------------------------------------------------------------------------------------------------
# The environment: a temporary working folder, cache and the valid files the mutations start from


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVPLAN_CACHE_DIR", str(work / "cache"))
        mp.setenv("COLUMNS", "120")
        mp.delenv("GITHUB_ACTIONS", raising=False)
        mp.delenv("GITHUB_STEP_SUMMARY", raising=False)
        mp.chdir(work)  # a stray relative output lands here
        files = work / "files"
        files.mkdir()
        (files / "adir.yaml").mkdir()
        profile = files / "profile.yaml"
        code, _, err = run(["log", FIXTURES / "logs" / "vllm-v1-0.33-llama31-8b-h100.log", "--gpu", "h100",
                            "--save-profile", profile])
        assert code == 0, err
        calibration = files / "calibration.yaml"
        calibration.write_text(yaml.safe_dump(VALID_CALIBRATION, sort_keys=False))
        assert run(["crossover", "llama3-8b", "--gpu", "h100", "--calibration", calibration])[0] == 0
        code, baseline, err = run(["gate", ROOT / "examples" / "gates.yaml", "--json"])
        assert code == 0, err
        specs = {}
        for name in MODELS:
            code, out, err = run(["models", "show", name, "--json"])
            assert code == 0, err
            spec = json.loads(out)
            for k in ("computed_params", "active_params"):
                spec.pop(k, None)
            specs[name] = spec
            path = files / f"{name}.yaml"
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
            assert run(["crossover", path])[0] == 0, name
        yield {
            "work": work,
            "files": files,
            "profile": profile,
            "profile_data": yaml.safe_load(profile.read_text()),
            "calibration": calibration,
            "baseline": json.loads(baseline),
            "specs": specs,
            "gates": yaml.safe_load((ROOT / "examples" / "gates.yaml").read_text()),
            "configs": {p.name: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.config.json"))},
            "logs": {p.name: p.read_bytes() for p in sorted((FIXTURES / "logs").glob("*.log"))},
            "n": [0],
        }


def fresh(env, suffix: str) -> Path:
    """A new path in the working folder: each case writes its own file (loaders may cache by path)."""
    env["n"][0] += 1
    return env["files"] / f"case{env['n'][0]}{suffix}"


# ----------------------------------------------------------------------------------------------------------------
# 1. Option values, drawn from each command's real option list

MODELS = ["llama3-8b", "qwen3-30b-a3b", "deepseek-v3", "gemma-3-27b"]
GPUS = ["h100", "a100", "h200", "b200", "tpu-v9"]
INTS = ["0", "-1", "1", "2", "8", "17", "24", "99", "123456789012345678901234567890"]
FLOATS = ["0.5", "1.5", "nan", "inf", "-0.1", "1e30"]
TOKENS = ["8k", "1.5", "1.5k", "abc", ""]
DTYPES = ["auto", "fp8", "nvfp4", "turboquant_4bit_nc", "fp8_ds_mla", "bfloat16", "all", "custom:bits=4,group=32",
          "garbage"]
ENGINES = ["vllm", "sglang", "foo"]
GENERAL = INTS + FLOATS + TOKENS + DTYPES + ENGINES
SPECIFIC = {
    "--gpu": GPUS, "-g": GPUS, "--model": MODELS + ["nope"], "-m": MODELS, "--validate": MODELS,
    "--kv-cache-dtype": DTYPES, "--baseline": DTYPES, "--engine": ENGINES,
    "--weight-dtype": ["bf16", "fp8", "int8", "int4_g128", "mxfp4", "nvfp4", "fp8_block128", "garbage"],
    "--kv-cache-dtype-skip-layers": ["0,1,30,31", "sliding_window", "none", "99", "-1", "a,b", "0,0", ","],
    "--entrypoint": ["serve", "llm", "x"], "--weight-read": ["streamed", "all", "x"],
    "--engine-version": ["0.19", "0.20", "0.25", "0.28", "0.30", "0.33", "0.5", "1", "abc", "0.1"],
    "--format": ["csv", "json", "markdown", "parquet", "x"], "--columns": ["model,gpu", "nope", ",", "model"],
    "--max-model-len": ["auto", "-1", "32k", "4096", "1m", "2,4"], "--context": ["2048", "128k", "1,2", "1m"],
    "--batch": ["1", "32", "1,8"], "--device": ["cpu", "cuda", "x"],
}


def _options(path: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(option name, is a flag) for every option of the command at `path`, from typer's own declaration."""
    import typer

    from kvplan.cli import app

    cmd = typer.main.get_command(app)
    for p in path:
        cmd = cmd.commands[p]  # type: ignore[attr-defined]
    out = []
    for param in cmd.params:
        if param.param_type_name != "option":
            continue
        for name in (*param.opts, *param.secondary_opts):
            out.append((name, bool(getattr(param, "is_flag", False))))
    assert out, path
    return out


OPTIONS = {path: _options(path) for path in [("capacity",), ("crossover",), ("sweep",), ("plot", "capacity"),
                                               ("plot", "crossover"), ("formats",), ("measure",), ("models", "show"),
                                               ("gpus", "show")]}
FILE_OPTIONS = {"--profile", "--calibration", "--output", "-o"}


@st.composite
def option_values(draw, path: tuple[str, ...], head: list[str], env, most: int = 4) -> list[str]:
    argv = list(path) + head
    for _ in range(draw(st.integers(0, most))):
        name, flag = draw(st.sampled_from(OPTIONS[path]))
        argv.append(name)
        if flag:
            continue
        choices = GENERAL + SPECIFIC.get(name, []) * 3
        if name in FILE_OPTIONS:
            files, work = env["files"], env["work"]
            choices = choices + [str(env["profile"]), str(env["calibration"]), str(files / "missing.yaml"),
                                 str(files / "adir.yaml"), str(work / "out.svg"), str(work / "out.csv"),
                                 str(work / "out.json"), str(work / "out.md"), str(work / "no" / "out.csv"),
                                 str(FIXTURES / "logs" / "sglang-0.5-llama31-8b-h100.log"), "out.txt"]
        argv.append(draw(st.sampled_from(choices)))
    return argv


@fuzz(260)
@given(data=st.data())
def test_capacity_options(env, data):
    ran("capacity")
    head = [data.draw(st.sampled_from(MODELS)), "--engine", data.draw(st.sampled_from(["vllm", "sglang"]))]
    gpu = data.draw(st.sampled_from(GPUS + ["h100", "h100", None]))
    head += ["--gpu", gpu] if gpu else []
    check(data.draw(option_values(("capacity",), head, env)))


@fuzz(180)
@given(data=st.data())
def test_crossover_options(env, data):
    ran("crossover")
    head = [data.draw(st.sampled_from(MODELS))]
    gpu = data.draw(st.sampled_from(GPUS + [None, None]))
    head += ["--gpu", gpu] if gpu else []
    check(data.draw(option_values(("crossover",), head, env)))


@fuzz(100)
@given(data=st.data())
def test_sweep_options(env, data):
    ran("sweep")
    head = ["-m", data.draw(st.sampled_from(MODELS + ["llama3-8b,gemma-3-27b"])),
            "-g", data.draw(st.sampled_from(GPUS + ["h100,a100"]))]
    check(data.draw(option_values(("sweep",), head, env, most=3)))


@fuzz(140)
@given(data=st.data())
def test_plot_capacity_options(env, data):
    ran("plot capacity")
    head = [data.draw(st.sampled_from(MODELS))]
    gpu = data.draw(st.sampled_from(GPUS + ["h100", None]))
    head += ["--gpu", gpu] if gpu else []
    check(data.draw(option_values(("plot", "capacity"), head, env)))


@fuzz(130)
@given(data=st.data())
def test_plot_crossover_options(env, data):
    ran("plot crossover")
    check(data.draw(option_values(("plot", "crossover"), [data.draw(st.sampled_from(MODELS))], env)))


@fuzz(60)
@given(data=st.data())
def test_formats_options(env, data):
    ran("formats")
    check(data.draw(option_values(("formats",), [], env)))


@fuzz(80)
@given(data=st.data())
def test_measure_dry_run_options(env, data):
    ran("measure")
    check(data.draw(option_values(("measure",), ["--dry-run"], env)))


@fuzz(60)
@given(data=st.data())
def test_models_show_options(env, data):
    ran("models show")
    name = data.draw(st.sampled_from(MODELS + ["llama", "", "nope", "x.yaml", "./", str(env["profile"])]))
    check(data.draw(option_values(("models", "show"), [name], env)))


@fuzz(60)
@given(data=st.data())
def test_gpus_show_options(env, data):
    ran("gpus show")
    name = data.draw(st.sampled_from(GPUS + ["a100-sxm-80gb", "", "h", "x.yaml", str(env["calibration"])]))
    check(data.draw(option_values(("gpus", "show"), [name], env)))


# ----------------------------------------------------------------------------------------------------------------
# Mutating parsed YAML / JSON documents, and corrupting the bytes they are written as

ODD = [None, 0, -1, 1, 2, 1.5, -0.5, 10**30, 1e308, float("nan"), float("inf"), True, False, "", "abc", "8k", "1e3",
       "-1", [], [1, "a"], [None], {}, {"x": 1}, {"quant_method": 5}, "\u00e9\u2603", "a\nb", [[1]], {"": None}]
EXTRA_KEYS = ["extra", "name", "model", "gpu", "tp", "require", "quant_method", "text_config", "layer_types",
              "sliding_window", "rope_scaling", "quantization_config", "num_hidden_layers", "head_dim",
              "families", "t0_s", "eta", "points", "device", "measured", "checks", "gates", "at"]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


@st.composite
def odd_value(draw):
    return draw(st.one_of(st.sampled_from(ODD), st.integers(-(2**70), 2**70), st.text(max_size=6),
                          st.floats(allow_nan=True, allow_infinity=True)))


@st.composite
def mutated(draw, base, extra_keys=(), most: int = 3):
    """`base` with 0..most random edits: a value replaced (at any depth), a key or item dropped, a key added,
    a value wrapped in a list or a mapping."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, most))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["set", "set", "set", "drop", "add", "wrap"]))
        if not path:
            if op in ("set", "wrap"):
                doc = draw(odd_value()) if op == "set" else [doc]
                continue
            op = "add"
        parent = _get(doc, path[:-1]) if path else None
        if op == "add":
            target = _get(doc, path)
            if isinstance(target, dict):
                target[draw(st.sampled_from(list(extra_keys) + EXTRA_KEYS))] = draw(odd_value())
            elif isinstance(target, list):
                target.append(draw(odd_value()))
            continue
        if op == "drop":
            del parent[path[-1]]
        elif op == "wrap":
            parent[path[-1]] = draw(st.sampled_from([[parent[path[-1]]], {"x": parent[path[-1]]}]))
        else:
            parent[path[-1]] = draw(odd_value())
    return doc


def encode(doc, kind: str) -> bytes:
    if kind == "json":
        return json.dumps(doc, indent=1).encode()
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()


@st.composite
def corrupted(draw, data: bytes) -> bytes:
    how = draw(st.sampled_from(["none"] * 8 + ["truncate", "non-utf8", "garbage", "empty", "bom", "syntax"]))
    if how == "truncate":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if how == "non-utf8":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.sampled_from([b"\xff", b"\xc3(", b"\x80\x80", b"\xed\xa0\x80"])) + data[at:]
    if how == "garbage":
        return draw(st.binary(min_size=1, max_size=64))
    if how == "empty":
        return b""
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "syntax":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.sampled_from([b"{", b"]", b": :", b"\t", b"\x00", b"&a *b", b"!!python/int 1"])) \
            + data[at:]
    return data


def write_case(env, data, doc, kind: str, suffix: str) -> Path:
    """Write a mutated document (or, now and then, make a directory of that name) and return its path."""
    path = fresh(env, suffix)
    if data.draw(st.integers(0, 40)) == 0:
        path.mkdir()
        return path
    path.write_bytes(data.draw(corrupted(encode(doc, kind))))
    return path


# ----------------------------------------------------------------------------------------------------------------
# 2. Model specs (YAML)


@fuzz(220)
@given(data=st.data())
def test_model_spec_files(env, data):
    ran("model specs")
    base = env["specs"][data.draw(st.sampled_from(MODELS))]
    doc = data.draw(mutated(base, extra_keys=list(base)))
    path = write_case(env, data, doc, "yaml", data.draw(st.sampled_from([".yaml", ".yml"])))
    command = data.draw(st.sampled_from([["crossover", path], ["capacity", path, "--gpu", "h100"],
                                         ["capacity", path, "--gpu", "h100", "--engine", "sglang"],
                                         ["models", "show", path, "--json"], ["crossover", path, "--gpu", "b200"]]))
    check(command)


# ----------------------------------------------------------------------------------------------------------------
# 3. Hugging Face config.json files

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "head_dim": 128, "tie_word_embeddings": False,
}
CONFIG_EXTRAS = {
    "quantization_config": ["fp8", ["fp8"], {"quant_method": "fp8"}, {"quant_method": "awq", "bits": "4"},
                            {"quant_method": "mxfp4"}, {"quant_method": None}, {"quant_method": ["x"]},
                            {"quant_method": "gptq", "bits": 4, "group_size": -1}, {"quant_method": "weird"},
                            {"quant_method": "compressed-tensors", "config_groups": 5},
                            {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": "x"}}},
                            {"quant_method": "fp8", "weight_block_size": "128"}],
    "text_config": [[1], 5, "x", {}, {"num_hidden_layers": "3"}, dict(LLAMA_CONFIG), {"text_config": {}}],
    "layer_types": "sliding_attention", "sliding_window": ["4096", 0, -1, 4096, [1], 1e30],
    "rope_scaling": [{"rope_type": "yarn", "factor": "x"}, {"type": 5}, [], "linear", {"factor": 8.0}],
    "num_local_experts": ["8", 8, 0], "num_experts_per_tok": [2, "2", 100], "kv_lora_rank": [512, "x", 0],
    "use_sliding_window": ["yes", True], "max_window_layers": [5, "x"], "sliding_window_pattern": [6, 0, "x"],
}


@st.composite
def hf_config(draw, env):
    configs = env["configs"]
    base = draw(st.sampled_from([LLAMA_CONFIG, LLAMA_CONFIG] + [configs[k] for k in sorted(configs)]))
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted(CONFIG_EXTRAS)))
        choices = CONFIG_EXTRAS[key]
        value = draw(st.sampled_from(choices)) if isinstance(choices, list) else choices
        where = doc["text_config"] if isinstance(doc.get("text_config"), dict) and draw(st.booleans()) else doc
        where[key] = copy.deepcopy(value)
    if isinstance(doc.get("text_config"), dict) and draw(st.booleans()):
        n = doc["text_config"].get("num_hidden_layers", 4)
        doc["text_config"]["layer_types"] = draw(st.sampled_from(
            ["full_attention", ["sliding_attention", "full_attention"], [5] * 3,
             ["full_attention"] * (n if isinstance(n, int) and 0 < n < 200 else 4)]))
    return draw(mutated(doc, extra_keys=list(LLAMA_CONFIG) + list(CONFIG_EXTRAS), most=2))


@fuzz(220)
@given(data=st.data())
def test_hf_config_files(env, data):
    ran("config.json")
    doc = data.draw(hf_config(env))
    path = write_case(env, data, doc, "json", "-config.json")
    command = data.draw(st.sampled_from([["crossover", path], ["capacity", path, "--gpu", "h100"],
                                         ["capacity", path, "--gpu", "h100", "--engine", "sglang"],
                                         ["models", "show", path]]))
    check(command)


# ----------------------------------------------------------------------------------------------------------------
# 4. Gates files, with --json, --junit and --baseline

GATE_EXTRAS = ["name", "model", "gpu", "tp", "kv_cache_dtype", "max_model_len", "require", "defaults", "gates",
               "min_concurrency", "min_kv_tokens", "max_step_ms", "min_saving_pct", "batch", "context", "ms", "pct",
               "engine", "dtype", "profile", "calibration", "weight_read", "baseline", "kv_cache_dtype_skip_layers"]


@st.composite
def gates_doc(draw, env):
    base = copy.deepcopy(env["gates"])
    if draw(st.booleans()):  # one gate only: cheaper, and mutations reach it more often
        base["gates"] = base["gates"][:1]
    doc = draw(mutated(base, extra_keys=GATE_EXTRAS))
    special = draw(st.sampled_from([None] * 6 + ["gates5", "nondicts", "norequire", "huge", "nogates"]))
    if isinstance(doc, dict):
        if special == "gates5":
            doc["gates"] = 5
        elif special == "nondicts":
            doc["gates"] = [1, "x", None, [1]]
        elif special == "norequire" and isinstance(doc.get("gates"), list) and doc["gates"] \
                and isinstance(doc["gates"][0], dict):
            doc["gates"][0].pop("require", None)
        elif special == "huge" and isinstance(doc.get("gates"), list) and doc["gates"] \
                and isinstance(doc["gates"][0], dict):
            doc["gates"][0][draw(st.sampled_from(["tp", "max_model_len"]))] = 10**30
        elif special == "nogates":
            doc.pop("gates", None)
    return doc


@fuzz(180)
@given(data=st.data())
def test_gate_files(env, data):
    ran("gate")
    path = write_case(env, data, data.draw(gates_doc(env)), "yaml", ".yaml")
    argv = ["gate", path]
    if data.draw(st.booleans()):
        argv.append("--json")
    if data.draw(st.integers(0, 3)) == 0:
        argv += ["--junit", data.draw(st.sampled_from([fresh(env, ".xml"), env["files"] / "adir.yaml",
                                                       env["work"] / "no" / "j.xml"]))]
    if data.draw(st.integers(0, 2)) == 0:
        doc = data.draw(mutated(env["baseline"], extra_keys=GATE_EXTRAS))
        baseline = fresh(env, ".json")
        baseline.write_bytes(data.draw(corrupted(encode(doc, "json"))))
        argv += ["--baseline", baseline]
    if data.draw(st.integers(0, 4)) == 0:
        argv += ["--max-regression", data.draw(st.sampled_from(FLOATS + INTS))]
    check(argv)


# ----------------------------------------------------------------------------------------------------------------
# 5. Startup logs

NUMBER = re.compile(rb"\d+(?:\.\d+)?")
NUMBERS = [b"0", b"-1", b"99999999999999999999999999999", b"1" * 400, b"1e308", b"nan", b"abc", b"0.0", b"", b"1,000",
           b"4.5.6", b"-0.5"]


@st.composite
def mutated_log(draw, env):
    logs = env["logs"]
    text = logs[draw(st.sampled_from(sorted(logs)))]
    lines = text.split(b"\n")
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["drop", "dup", "swap", "numbers", "numbers", "non-utf8"]))
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "numbers":
            found = list(NUMBER.finditer(lines[i]))
            if found:
                m = draw(st.sampled_from(found))
                lines[i] = lines[i][: m.start()] + draw(st.sampled_from(NUMBERS)) + lines[i][m.end():]
        else:
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + b"\xff\xfe" + lines[i][at:]
    out = b"\n".join(lines)
    if draw(st.integers(0, 4)) == 0:
        out = out[: draw(st.integers(0, len(out)))]
    return out


@fuzz(200)
@given(data=st.data())
def test_startup_logs(env, data):
    ran("log")
    path = fresh(env, ".log")
    path.write_bytes(data.draw(mutated_log(env)))
    argv = ["log", path]
    model = data.draw(st.sampled_from([None] * 4 + ["llama3-8b", "llama-3.1-8b", "deepseek-v3", "nope"]))
    gpu = data.draw(st.sampled_from([None, None, "h100", "a100", "b200", "xyz"]))
    argv += ["--model", model] if model else []
    argv += ["--gpu", gpu] if gpu else []
    if data.draw(st.integers(0, 2)) == 0:
        argv += ["--save-profile", data.draw(st.sampled_from([fresh(env, ".yaml"), env["files"] / "adir.yaml",
                                                              env["work"] / "no" / "p.yaml"]))]
    if data.draw(st.booleans()):
        argv.append("--json")
    check(argv)


# ----------------------------------------------------------------------------------------------------------------
# 6. Deployment profiles (capacity --profile) and calibration profiles (crossover --calibration)

VALID_CALIBRATION = {
    "schema": "kvplan-calibration/1",
    "device": {"name": "H100-SXM5-80GB", "memory_total_bytes": 84942979072, "compute_capability": "9.0"},
    "quick": True,
    "peak_bandwidth_bytes_per_s": 3.35e12,
    "families": {
        name: {"t0_s": 5e-6, "eta": eta, "points": [[8388608, 4e-6, 3.9e-6, 4.2e-6], [67108864, 2.6e-5, 2.5e-5, 2.7e-5]]}
        for name, eta in (("stream_read", 0.9), ("gemv_bf16", 0.8), ("gemv_fp8", 0.75), ("decode_bfloat16", 0.7),
                          ("decode_fp8_e4m3", 0.65), ("decode_nvfp4", 0.5))
    },
}
PROFILE_EXTRAS = ["schema", "engine", "engine_version", "model", "gpu", "tp", "pp", "kv_cache_dtype", "max_model_len",
                  "gpu_memory_utilization", "total_memory_bytes", "weights_bytes", "overhead_bytes",
                  "available_kv_bytes", "max_num_batched_tokens", "max_num_seqs", "block_size"]


@fuzz(130)
@given(data=st.data())
def test_deployment_profiles(env, data):
    ran("deployment profile")
    doc = data.draw(mutated(env["profile_data"], extra_keys=PROFILE_EXTRAS))
    path = write_case(env, data, doc, "yaml", ".yaml")
    argv = data.draw(st.sampled_from([["capacity", "--profile", path], ["capacity", "llama-3.1-8b", "--profile", path],
                                      ["capacity", "llama-3.1-8b", "--gpu", "h100", "--profile", path],
                                      ["capacity", "--profile", path, "--json", "--max-model-len", "8k"],
                                      ["plot", "capacity", "llama-3.1-8b", "--profile", path]]))
    check(argv)


@fuzz(130)
@given(data=st.data())
def test_calibration_profiles(env, data):
    ran("calibration profile")
    doc = data.draw(mutated(VALID_CALIBRATION, extra_keys=PROFILE_EXTRAS + ["points", "t0_s", "eta", "name"]))
    path = write_case(env, data, doc, "yaml", ".yaml")
    argv = data.draw(st.sampled_from([["crossover", "llama3-8b", "--gpu", "h100", "--calibration", path],
                                      ["crossover", "llama3-8b", "--gpu", "h100", "--calibration", path, "--json",
                                       "-d", "fp8,nvfp4"],
                                      ["crossover", "llama3-8b", "--calibration", path],
                                      ["capacity", "llama3-8b", "--gpu", "h100", "--calibration", path]]))
    check(argv)


# ----------------------------------------------------------------------------------------------------------------
# Regressions: inputs the fuzzing above once turned into a traceback or a malformed error

REGRESSIONS: list[list[str]] = []


@pytest.mark.parametrize("argv", REGRESSIONS)
def test_regressions_exit_2_with_one_line(env, argv):
    code, out, err = run([a.format(files=env["files"]) for a in argv])
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("kvplan: error: "), err


FUZZ_TESTS = {"capacity", "crossover", "sweep", "plot capacity", "plot crossover", "formats", "measure",
              "models show", "gpus show", "model specs", "config.json", "gate", "log", "deployment profile",
              "calibration profile"}


def test_zz_case_count():
    """Runs last: the number of generated cases (at least MIN_CASES when the whole module ran)."""
    print(f"\nkvplan fuzz: {COUNT['cases']} CLI cases run (seed {SEED}) over {len(RAN)} fuzz tests")
    if RAN != FUZZ_TESTS:
        pytest.skip(f"only part of the module ran ({len(RAN)} of {len(FUZZ_TESTS)} fuzz tests)")
    assert COUNT["cases"] >= MIN_CASES
