"""Property-based fuzzing of the command line: whatever the input, every command exits 0 (success), 1 (only `gate`:
a gate failed) or 2 (bad input), never with a traceback, and on exit 2 stderr is exactly one line starting
"kvplan: error: ".

Seeded and bounded: about 3,000 cases in all, some 30 s on two cores. The cases: option values drawn from each
command's real option list (good and bad numbers, token sizes, dtypes, engines, paths), and mutated model specs,
GPU specs, config.json files, gates files (with --baseline), startup logs, deployment and calibration profiles.

While hunting: KVPLAN_FUZZ_SEED=N another seed, KVPLAN_FUZZ_SCALE=N N times the cases, KVPLAN_FUZZ_NOSHRINK=1 the
first failure of each test as found (no shrinking), KVPLAN_FUZZ_ERRORS=1 (with -s) every refusal printed to review.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import signal
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st

from kvplan.app.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SEED = int(os.environ.get("KVPLAN_FUZZ_SEED", "20260101"))
MIN_CASES = 2000
SCALE = int(os.environ.get("KVPLAN_FUZZ_SCALE", "1"))  # more cases per test while hunting
# KVPLAN_FUZZ_NOSHRINK=1: report the first failing case of each test as found (faster while fixing)
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + ([] if os.environ.get("KVPLAN_FUZZ_NOSHRINK") else
                                                          [Phase.shrink])


def fuzz(n: int):
    """Hypothesis settings for one fuzz test: n examples, seeded, no database, no deadline."""

    def wrap(f):
        f = settings(max_examples=n * SCALE, deadline=None, derandomize=False, database=None, print_blob=False,
                     suppress_health_check=list(HealthCheck), phases=PHASES)(f)
        return seed(SEED)(f)

    return wrap


# ----------------------------------------------------------------------------------------------------------------
# Running the CLI and the property every case must hold

COUNT = {"cases": 0}
RAN: set[str] = set()


class CaseTimeout(BaseException):
    """A case ran past CASE_SECONDS: kvplan hangs (or loops over a huge count) on that input."""


CASE_SECONDS = 10


def _alarm(signum, frame):
    raise CaseTimeout(f"still running after {CASE_SECONDS} s")


def run(argv: list[str]) -> tuple[int, str, str]:
    """Call kvplan.app.cli.main in-process; fail the case on an escaped exception, a hang or a Python warning."""
    argv = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    timed = hasattr(signal, "setitimer")  # not on Windows
    if timed:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with redirect_stdout(out), redirect_stderr(err):
                code = main(argv)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - anything escaping main() is the bug we look for
            raise AssertionError(f"kvplan {' '.join(argv)}: {type(e).__name__} escaped main(): {e}") from e
        finally:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
    shown = [w for w in caught if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    assert not shown, f"kvplan {' '.join(argv)}: a Python warning reached stderr: {shown[0].message}"
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> int:
    note(f"argv: {[str(a) for a in argv]!r}")
    COUNT["cases"] += 1
    code, out, err = run(argv)
    note(f"exit {code}; stderr: {err!r}")
    key = f"{argv[0]} exit {code}"
    COUNT[key] = COUNT.get(key, 0) + 1
    if code == 2 and os.environ.get("KVPLAN_FUZZ_ERRORS"):  # print every refusal, to review them
        print(f"{' '.join(map(str, argv))}\n    {err.strip()}")
    assert "Traceback" not in err, f"kvplan {' '.join(map(str, argv))}: traceback on stderr:\n{err}"
    allowed = {0, 1, 2} if str(argv[0]) == "gate" else {0, 2}
    assert code in allowed, f"kvplan {' '.join(map(str, argv))}: exit {code}; stderr: {err!r}"
    if code == 2:
        lines = err.rstrip("\n").splitlines()  # \r, \x0b, \u2028 ... break a line in a terminal too
        assert len(lines) == 1 and lines[0].startswith("kvplan: error: "), (
            f"kvplan {' '.join(map(str, argv))}: exit 2 must say one 'kvplan: error: ' line; stderr: {err!r}")
    words = [str(a) for a in argv]
    if code in (0, 1) and "--json" in words and not {"--output", "-o"} & set(words):
        try:  # machine-readable: strict JSON, no NaN or Infinity
            json.loads(out, parse_constant=_no_constant)
        except ValueError as e:
            raise AssertionError(f"kvplan {' '.join(words)}: --json printed no valid JSON ({e}): {out[:300]!r}")
    return code


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def ran(name: str) -> None:
    RAN.add(name)


# ----------------------------------------------------------------------------------------------------------------
# The environment: a temporary working folder, cache and the valid files the mutations start from


ENV: dict = {}


@pytest.fixture(scope="module", autouse=True)
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
        gpu_specs = {}
        for name in ("h100", "b200", "a100-sxm-80gb"):
            code, out, err = run(["gpus", "show", name, "--json"])
            assert code == 0, err
            spec = json.loads(out)
            for k in ("memory_total_gib", "memory_source"):
                spec.pop(k, None)
            gpu_specs[name] = spec
            path = files / f"gpu-{name}.yaml"
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
            assert run(["capacity", "llama3-8b", "--gpu", path])[0] == 0, name
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
        ENV.update({
            "work": work,
            "files": files,
            "profile": profile,
            "profile_data": yaml.safe_load(profile.read_text()),
            "calibration": calibration,
            "baseline": json.loads(baseline),
            "specs": specs,
            "gpu_specs": gpu_specs,
            "gates": yaml.safe_load((ROOT / "examples" / "gates.yaml").read_text()),
            "configs": {p.name: json.loads(p.read_text()) for p in [
                *sorted(FIXTURES.glob("*.config.json")),
                # hybrids, state-space, sparse attention and a vision-language model: their own readers
                FIXTURES / "configs" / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.config.json",
                FIXTURES / "configs" / "Qwen--Qwen3.5-35B-A3B.config.json",
                FIXTURES / "configs" / "ibm-granite--granite-vision-3.3-2b.config.json",
                FIXTURES / "hf-corpus" / "ai21labs--AI21-Jamba-Mini-1.5_config.json",
                FIXTURES / "hf-corpus" / "mistralai--Mamba-Codestral-7B-v0.1_config.json",
                FIXTURES / "hf-corpus" / "deepseek-ai--DeepSeek-V3.2_config.json"]},
            "logs": {p.name: p.read_bytes() for p in sorted((FIXTURES / "logs").glob("*.log"))},
            "n": [0],
        })
        _regression_files(files, ENV)
        yield ENV
        ENV.clear()


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
GENERAL = INTS + FLOATS + TOKENS + DTYPES + ENGINES + ["a\nb", "h100\r", " "]
PLAUSIBLE = {"integer": ["1", "2", "4", "8", "16", "32", "64", "128", "256", "1024", "3", "0", "-1", "99999999999"],
             "float": ["0.5", "0.8", "0.9", "0.95", "1", "1.0", "2", "4", "16", "80", "0", "1e-9", "nan", "-1"]}
SPECIFIC = {
    "--gpu": GPUS, "-g": GPUS, "--model": MODELS + ["nope"], "-m": MODELS, "--validate": MODELS,
    "--kv-cache-dtype": DTYPES, "--baseline": DTYPES, "--engine": ENGINES,
    "--weight-dtype": ["bf16", "fp8", "int8", "int4_g128", "mxfp4", "nvfp4", "fp8_block128", "garbage"],
    "--kv-cache-dtype-skip-layers": ["0,1,30,31", "sliding_window", "none", "99", "-1", "a,b", "0,0", ","],
    "--entrypoint": ["serve", "llm", "x"], "--weight-read": ["streamed", "all", "x"],
    "--engine-version": ["0.19", "0.20", "0.25", "0.28", "0.30", "0.33", "0.5", "1", "abc", "0.1"],
    "--format": ["csv", "json", "markdown", "parquet", "x"], "--columns": ["model,gpu", "nope", ",", "model"],
    "--max-model-len": ["auto", "-1", "32k", "4096", "1m", "2,4"], "--context": ["2048", "128k", "1,2", "1m"],
    "--batch": ["1", "32", "1,8"], "--device": ["cpu", "cuda", "x"], "--tp": ["1", "2", "4", "8", "1,2", "3"],
    "--block-size": ["16", "32", "64", "128", "256", "17", "8"],
}
for short, long in (("-d", "--kv-cache-dtype"), ("--dtype", "--kv-cache-dtype"), ("-c", "--context"),
                    ("-b", "--batch")):
    SPECIFIC[short] = SPECIFIC[long]


def _kind(param) -> str:
    """'integer', 'float' or 'text': what the option's value parses as."""
    name = getattr(getattr(param, "type", None), "name", None)  # click's own types
    if name:
        return name
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)  # typer's vendored click
    return {int: "integer", float: "float"}.get(annotation, "text")


def _options(path: tuple[str, ...]) -> list[tuple[str, bool, str]]:
    """(option name, is a flag, value type) for every option of the command at `path`, from typer's own
    declaration."""
    import typer

    from kvplan.app.cli import app

    cmd = typer.main.get_command(app)
    for p in path:
        cmd = cmd.commands[p]  # type: ignore[attr-defined]
    out = []
    for param in cmd.params:
        if param.param_type_name != "option":
            continue
        for name in (*param.opts, *param.secondary_opts):
            out.append((name, bool(getattr(param, "is_flag", False)), _kind(param)))
    assert out, path
    return out


OPTIONS = {path: _options(path) for path in [("capacity",), ("crossover",), ("sweep",), ("plot", "capacity"),
                                               ("plot", "crossover"), ("formats",), ("measure",), ("models", "show"),
                                               ("gpus", "show"), ("throughput",), ("plot", "throughput")]}
FILE_OPTIONS = {"--profile", "--calibration", "--output", "-o"}


@st.composite
def option_values(draw, path: tuple[str, ...], head: list[str], env, most: int = 4) -> list[str]:
    argv = list(path) + head
    for _ in range(draw(st.integers(0, most))):
        name, flag, kind = draw(st.sampled_from(OPTIONS[path]))
        argv.append(name)
        if flag:
            continue
        # mostly a value of the option's own kind, so that a case gets past the parsing
        plausible = SPECIFIC.get(name) or PLAUSIBLE.get(kind) or GENERAL
        if name in FILE_OPTIONS:
            files, work = env["files"], env["work"]
            plausible = [str(env["profile"]), str(env["calibration"]), str(files / "missing.yaml"),
                         str(files / "adir.yaml"), str(work / "out.svg"), str(work / "out.csv"), str(work / "out.json"),
                         str(work / "out.md"), str(work / "no" / "out.csv"), str(files / "gpu-h100.yaml"),
                         str(FIXTURES / "logs" / "sglang-0.5-llama31-8b-h100.log"), "out.txt"]
        choices = GENERAL + plausible * max(1, 3 * len(GENERAL) // len(plausible))
        argv.append(draw(st.sampled_from(choices)))
    return argv


@fuzz(360)
@given(data=st.data())
def test_capacity_options(data):
    env = ENV
    ran("capacity")
    model = data.draw(st.sampled_from(MODELS * 6 + [None]))  # None: the catalog listing, one row per model
    head = ([model] if model else []) + ["--engine", data.draw(st.sampled_from(["vllm", "sglang"]))]
    gpu = data.draw(st.sampled_from(GPUS + ["h100", "h100", None]))
    head += ["--gpu", gpu] if gpu else []
    check(data.draw(option_values(("capacity",), head, env)))


@fuzz(260)
@given(data=st.data())
def test_crossover_options(data):
    env = ENV
    ran("crossover")
    head = [data.draw(st.sampled_from(MODELS))]
    gpu = data.draw(st.sampled_from(GPUS + [None, None]))
    head += ["--gpu", gpu] if gpu else []
    check(data.draw(option_values(("crossover",), head, env)))


@fuzz(140)
@given(data=st.data())
def test_sweep_options(data):
    env = ENV
    ran("sweep")
    head = ["-m", data.draw(st.sampled_from(MODELS + ["llama3-8b,gemma-3-27b"])),
            "-g", data.draw(st.sampled_from(GPUS + ["h100,a100"]))]
    check(data.draw(option_values(("sweep",), head, env, most=3)))


@fuzz(200)
@given(data=st.data())
def test_plot_capacity_options(data):
    env = ENV
    ran("plot capacity")
    head = [data.draw(st.sampled_from(MODELS))]
    gpu = data.draw(st.sampled_from(GPUS + ["h100", None]))
    head += ["--gpu", gpu] if gpu else []
    check(data.draw(option_values(("plot", "capacity"), head, env)))


@fuzz(180)
@given(data=st.data())
def test_plot_crossover_options(data):
    env = ENV
    ran("plot crossover")
    check(data.draw(option_values(("plot", "crossover"), [data.draw(st.sampled_from(MODELS))], env)))


@fuzz(80)
@given(data=st.data())
def test_formats_options(data):
    env = ENV
    ran("formats")
    check(data.draw(option_values(("formats",), [], env)))


@fuzz(100)
@given(data=st.data())
def test_measure_dry_run_options(data):
    env = ENV
    ran("measure")
    check(data.draw(option_values(("measure",), ["--dry-run"], env)))


@fuzz(80)
@given(data=st.data())
def test_models_show_options(data):
    env = ENV
    ran("models show")
    name = data.draw(st.sampled_from(MODELS + ["llama", "", "nope", "x.yaml", "./", str(env["profile"])]))
    check(data.draw(option_values(("models", "show"), [name], env)))


@fuzz(80)
@given(data=st.data())
def test_gpus_show_options(data):
    env = ENV
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
    return copy.deepcopy(draw(st.one_of(st.sampled_from(ODD), st.integers(-(2**70), 2**70), st.text(max_size=6),
                                        st.floats(allow_nan=True, allow_infinity=True))))


@st.composite
def mutated(draw, base, extra_keys=(), most: int = 3, ops=None):
    """`base` with 0..most random edits: a number scaled (the document stays well-formed, the figures change), a
    value replaced (at any depth), a key or item dropped, a key added, a value wrapped in a list or a mapping."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, most))):
        paths = list(_paths(doc))
        op = draw(st.sampled_from(ops or ["scale", "scale", "scale", "set", "set", "set", "drop", "add", "wrap"]))
        numbers = [p for p in paths if p and _is_number(_get(doc, p))]
        if op == "scale" and numbers:
            path = draw(st.sampled_from(numbers))
            parent = _get(doc, path[:-1])
            parent[path[-1]] = _scaled(parent[path[-1]], draw(st.sampled_from(FACTORS)))
            continue
        if op == "scale" and ops:
            continue
        path = draw(st.sampled_from(paths))
        op = "set" if op == "scale" else op
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


FACTORS = [0, 0.5, 2, 3, 10, 1000, 1e6, 1e12, -1, 1.5, 0.001]


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _scaled(v, factor):
    x = v * factor
    return int(x) if isinstance(v, int) and x == x and abs(x) != float("inf") else x


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
    if data.draw(st.sampled_from(range(40))) == 7:  # now and then (integers() favour 0)
        path.mkdir()
        return path
    path.write_bytes(data.draw(corrupted(encode(doc, kind))))
    return path


# ----------------------------------------------------------------------------------------------------------------
# 2. Model specs (YAML)


@fuzz(300)
@given(data=st.data())
def test_model_spec_files(data):
    env = ENV
    ran("model specs")
    base = env["specs"][data.draw(st.sampled_from(MODELS))]
    if data.draw(st.booleans()):  # an odd but well-formed architecture, planned with options drawn as in 1.
        path = fresh(env, ".yaml")
        path.write_bytes(encode(data.draw(mutated(base, most=4, ops=["scale"])), "yaml"))
        which = data.draw(st.sampled_from([("capacity",), ("crossover",), ("plot", "capacity"), ("plot", "crossover")]))
        head = [path] + (["--gpu", data.draw(st.sampled_from(["h100", "b200"]))] if "capacity" in which else [])
        check(data.draw(option_values(which, head, env, most=2)))
        return
    doc = data.draw(mutated(base, extra_keys=list(base)))
    path = write_case(env, data, doc, "yaml", data.draw(st.sampled_from([".yaml", ".yml"])))
    command = data.draw(st.sampled_from([["crossover", path], ["capacity", path, "--gpu", "h100"],
                                         ["capacity", path, "--gpu", "h100", "--engine", "sglang"],
                                         ["models", "show", path, "--json"], ["crossover", path, "--gpu", "b200"]]))
    check(command)


@fuzz(160)
@given(data=st.data())
def test_gpu_spec_files(data):
    ran("gpu specs")
    env = ENV
    base = env["gpu_specs"][data.draw(st.sampled_from(sorted(env["gpu_specs"])))]
    doc = data.draw(mutated(base, extra_keys=list(base)))
    path = write_case(env, data, doc, "yaml", ".yaml")
    model = data.draw(st.sampled_from(MODELS))
    command = data.draw(st.sampled_from([["gpus", "show", path], ["capacity", model, "--gpu", path],
                                         ["capacity", model, "--gpu", path, "--engine", "sglang"],
                                         ["crossover", model, "--gpu", path, "--json"],
                                         ["measure", "--dry-run", "--gpu", path],
                                         ["plot", "capacity", model, "--gpu", path]]))
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


@fuzz(300)
@given(data=st.data())
def test_hf_config_files(data):
    env = ENV
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
    if draw(st.booleans()):  # well-formed, other thresholds and settings: passes and failures
        doc = draw(mutated(base, most=4, ops=["scale"]))
        gate = doc["gates"][0]
        extra = draw(st.sampled_from([None, "profile", "calibration", "model", "gpu", "engine"]))
        if extra == "profile":  # the files a gate may name
            gate["profile"] = str(env["profile"])
            gate["model"] = "llama-3.1-8b"
        elif extra == "calibration":
            gate["calibration"] = str(env["calibration"])
        elif extra == "model":
            gate["model"] = str(env["files"] / f"{draw(st.sampled_from(MODELS))}.yaml")
        elif extra == "gpu":
            gate["gpu"] = str(env["files"] / "gpu-b200.yaml")
        elif extra == "engine":
            gate["engine"] = "sglang"
        return doc
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


@fuzz(260)
@given(data=st.data())
def test_gate_files(data):
    env = ENV
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
                new = draw(st.sampled_from(NUMBERS + [b"scale"] * 6))
                if new == b"scale":  # the same kind of number, another size
                    x = _scaled(float(m.group()) if b"." in m.group() else int(m.group()),
                                draw(st.sampled_from(FACTORS)))
                    new = str(round(x, 2) if isinstance(x, float) else x).encode()
                lines[i] = lines[i][: m.start()] + new + lines[i][m.end():]
        else:
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + b"\xff\xfe" + lines[i][at:]
    out = b"\n".join(lines)
    if draw(st.integers(0, 4)) == 0:
        out = out[: draw(st.integers(0, len(out)))]
    if draw(st.integers(0, 3)) == 0:  # a restarted server appending to the same file: two startups, or three
        for _ in range(draw(st.integers(1, 2))):
            out += b"\n" + logs[draw(st.sampled_from(sorted(logs)))]
    return out


@fuzz(280)
@given(data=st.data())
def test_startup_logs(data):
    env = ENV
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
        name: {"t0_s": 5e-6, "eta": eta,
               "points": [[8388608, 4e-6, 3.9e-6, 4.2e-6], [67108864, 2.6e-5, 2.5e-5, 2.7e-5]]}
        for name, eta in (("stream_read", 0.9), ("gemv_bf16", 0.8), ("gemv_fp8", 0.75), ("decode_bfloat16", 0.7),
                          ("decode_fp8_e4m3", 0.65), ("decode_nvfp4", 0.5))
    },
}
PROFILE_EXTRAS = ["schema", "engine", "engine_version", "model", "gpu", "tp", "pp", "kv_cache_dtype", "max_model_len",
                  "gpu_memory_utilization", "total_memory_bytes", "weights_bytes", "overhead_bytes",
                  "available_kv_bytes", "max_num_batched_tokens", "max_num_seqs", "block_size"]


@fuzz(180)
@given(data=st.data())
def test_deployment_profiles(data):
    env = ENV
    ran("deployment profile")
    doc = data.draw(mutated(env["profile_data"], extra_keys=PROFILE_EXTRAS))
    path = write_case(env, data, doc, "yaml", ".yaml")
    argv = data.draw(st.sampled_from([["capacity", "--profile", path], ["capacity", "llama-3.1-8b", "--profile", path],
                                      ["capacity", "llama-3.1-8b", "--gpu", "h100", "--profile", path],
                                      ["capacity", "--profile", path, "--json", "--max-model-len", "8k"],
                                      ["plot", "capacity", "llama-3.1-8b", "--profile", path]]))
    check(argv)


@fuzz(180)
@given(data=st.data())
def test_calibration_profiles(data):
    env = ENV
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

HUGE = "123456789012345678901234567890"


def _regression_files(files: Path, env: dict) -> None:
    """The minimised inputs of the regressions below, as files."""
    sglang = (FIXTURES / "logs" / "sglang-0.5-llama31-8b-h100.log").read_text().splitlines(keepends=True)
    (files / "sglang-no-server-args.log").write_text("".join(sglang[1:]))  # no mem_fraction_static, no GPU
    for name, key, value in (("profile-negative-seqs.yaml", "max_num_seqs", -3.414938507137853e16),
                             ("profile-zero-seqs.yaml", "max_num_seqs", 0.0),
                             ("profile-engine-version-newline.yaml", "engine_version", "a\nb"),
                             ("profile-gpu-newline.yaml", "gpu", "a\nb")):
        (files / name).write_text(yaml.safe_dump({**env["profile_data"], key: value}, sort_keys=False))
    spec = copy.deepcopy(env["specs"]["llama3-8b"])
    spec["attention"]["pattern"] = []
    (files / "spec-empty-pattern.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for name, where, value in (("baseline-at-mapping.json", ("checks", 0, "at"), {"x": 1}),
                               ("baseline-at-list.json", ("checks", 0, "at"), [1]),
                               ("baseline-name-list.json", ("name",), ["a"])):
        doc = copy.deepcopy(env["baseline"])
        _get(doc["gates"][0], where[:-1])[where[-1]] = value
        (files / name).write_text(json.dumps(doc))


# ----------------------------------------------------------------------------------------------------------------
# 7. Inputs met in use: numbers in exponent notation, folders in the working directory named like catalog models,
# two startups in one log, and a Hugging Face Hub that cannot be reached

EXPONENTS = ["1e5", "9e-1", "1E3", "2e0", "1.5e4", "1e+3", "0e0", "-1e3", "1e5k", "8e1", "1e400", "1e-400", ".5e1"]
NUMERIC = {path: [(n, k) for n, flag, k in opts if not flag and (k in ("integer", "float") or n in (
    "--max-model-len", "--context", "-c", "--batch", "-b", "--isl", "--osl", "--concurrency", "-n", "--tp"))]
    for path, opts in OPTIONS.items() if path in (("capacity",), ("crossover",), ("sweep",), ("throughput",),
                                                  ("plot", "capacity"))}
HEADS = {("capacity",): ["llama3-8b", "--gpu", "h100"], ("crossover",): ["llama3-8b", "--gpu", "h100"],
         ("sweep",): ["-m", "llama3-8b", "-g", "h100"], ("plot", "capacity"): ["llama3-8b", "--gpu", "h100"],
         ("throughput",): ["llama3-8b", "--gpu", "h100", "--isl", "1k", "--osl", "128", "-n", "1",
                           "--num-prompts", "8"]}


@fuzz(150)
@given(data=st.data())
def test_exponent_numbers(data):
    # every numeric option given a number in exponent notation: taken as the number it is, or refused in one line
    # naming the option
    ran("exponents")
    path = data.draw(st.sampled_from(sorted(NUMERIC)))
    argv = [*path, *HEADS[path]]
    for _ in range(data.draw(st.integers(1, 2))):
        name, _kind = data.draw(st.sampled_from(NUMERIC[path]))
        argv += [name, data.draw(st.sampled_from(EXPONENTS))]
    code = check(argv)
    if code == 2:
        _, _, err = run(argv)
        assert any(a in err for a in argv if a.startswith("-")) or "--" in err, err


def test_exponent_numbers_are_the_numbers_or_refused_with_the_digits():
    base = ["capacity", "llama3-8b", "--gpu", "h100", "--json"]
    code, plain, err = run([*base, "--gpu-memory-utilization", "0.9"])
    assert code == 0, err
    code, exp, err = run([*base, "--gpu-memory-utilization", "9e-1"])  # 9 x 10^-1 is 0.9
    assert code == 0 and json.loads(exp) == json.loads(plain), err
    code, _, err = run([*base, "--max-model-len", "1e5"])
    assert code == 2 and "write the digits (100000)" in err  # 1 x 10^5
    code, _, err = run([*base, "--max-num-seqs", "1e3"])
    assert code == 2 and err == "kvplan: error: --max-num-seqs '1e3': exponent notation is not taken; write the " \
                                "digits (1000)\n"


FOLDER_NAMES = ["llama3-8b", "Llama-3.1-8B", "deepseek-v3", "qwen3-30b-a3b", "snap", "adir", "h100", "config.json"]


@fuzz(120)
@given(data=st.data())
def test_local_folders(data):
    # a folder in the working directory, named like a catalog model or not, holding a config.json (valid, mutated,
    # empty, a folder) or nothing, named bare, as ./NAME or with a trailing slash
    env = ENV
    ran("local folders")
    here = fresh(env, "-cwd")
    here.mkdir()
    name = data.draw(st.sampled_from(FOLDER_NAMES))
    folder = here / name
    folder.mkdir()
    content = data.draw(st.sampled_from(["valid", "valid", "mutated", "empty", "folder", "none", "yaml"]))
    config = env["configs"][data.draw(st.sampled_from(sorted(env["configs"])))]
    if content == "valid":
        (folder / "config.json").write_text(json.dumps(config))
    elif content == "mutated":
        (folder / "config.json").write_text(json.dumps(data.draw(mutated(config))))
    elif content == "empty":
        (folder / "config.json").write_text("")
    elif content == "folder":
        (folder / "config.json").mkdir()
    elif content == "yaml":
        (folder / "model.yaml").write_text(yaml.safe_dump(env["specs"]["llama3-8b"]))
    spelled = data.draw(st.sampled_from([name, name, f"./{name}", f"{name}/"]))
    argv = data.draw(st.sampled_from([["crossover", spelled], ["crossover", spelled, "--json"],
                                      ["capacity", spelled, "--gpu", "h100"], ["models", "show", spelled],
                                      ["throughput", spelled, "--gpu", "h100", "--isl", "1k", "--osl", "128", "-n",
                                       "1", "--num-prompts", "8"]]))
    previous = os.getcwd()
    os.chdir(here)
    try:
        check(argv)
    finally:
        os.chdir(previous)


def test_a_local_folder_is_read_before_a_catalog_name(tmp_path, monkeypatch):
    # ./llama3-8b with 16 of Llama-3-8B's 32 layers: 2 (K, V) x 16 x 8 KV heads x 128 x 2 B = 65,536 B per token,
    # the folder's, not the catalog's 131,072; a bare relative folder name (snap) works as ./snap does
    config = json.loads((FIXTURES / "llama3-8b.config.json").read_text())
    for name in ("llama3-8b", "snap"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 16}))
    monkeypatch.chdir(tmp_path)
    for spelled in ("llama3-8b", "./llama3-8b", "snap", "snap/"):
        code, out, err = run(["crossover", spelled, "--json"])
        assert code == 0 and json.loads(out)["kv_bytes_per_token"] == 65536, (spelled, err)
    (tmp_path / "adir").mkdir()
    code, _, err = run(["crossover", "adir"])
    assert code == 2 and "the folder adir holds no config.json" in err


def test_two_startups_in_one_log_read_the_last(tmp_path):
    # a server restarted onto the same log file (tee -a): the figures are the second startup's, with a note
    first = (FIXTURES / "logs" / "vllm-v1-0.10-llama31-8b-h100.log").read_text()
    second = (FIXTURES / "logs" / "vllm-v1-0.33-llama31-8b-h100.log").read_text()
    both = tmp_path / "two.log"
    both.write_text(first + second)
    alone = tmp_path / "one.log"
    alone.write_text(second)
    code, out2, err = run(["log", both, "--gpu", "h100", "--json"])
    assert code == 0, err
    code, out1, err = run(["log", alone, "--gpu", "h100", "--json"])
    assert code == 0, err
    two, one = json.loads(out2), json.loads(out1)
    assert two["figures"] == one["figures"] and two["config"] == one["config"] and two["version"] == one["version"]
    assert any("2 startups" in n for n in two["notes"])


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the socket is: a connection there is refused at once


@pytest.mark.parametrize("hub", ["offline", "refused"])
def test_a_hub_that_cannot_be_reached(hub, tmp_path):
    # HF_HUB_OFFLINE=1, or a Hub endpoint that refuses connections: a catalog model's id is planned from the
    # catalog, any other id is refused in one line, and no case waits (each in a process of its own, since
    # huggingface_hub reads these variables once, at import)
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_HUB_CACHE": str(tmp_path / "hub"), "KVPLAN_CACHE_DIR": str(tmp_path / "cache"),
                "HF_HUB_DISABLE_TELEMETRY": "1"})
    if hub == "offline":
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    cases = [(["capacity", "Qwen/Qwen3-8B", "--gpu", "h100"], 0), (["crossover", "meta-llama/Llama-3.1-8B"], 0),
             (["crossover", "org/no-such-model"], 2), (["models", "show", "org/no-such-model"], 2),
             (["capacity", "org/no-such-model@v2", "--gpu", "h100"], 2)]
    code = "import sys; from kvplan.app.cli import main; sys.exit(main(sys.argv[1:]))"
    for argv, want in cases:
        start = time.monotonic()
        p = subprocess.run([sys.executable, "-c", code, *argv], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        took = time.monotonic() - start
        assert p.returncode == want, (argv, p.stderr)
        assert "Traceback" not in p.stderr and took < 15, (argv, took)
        if want == 2:
            lines = p.stderr.rstrip("\n").splitlines()
            assert len(lines) == 1 and lines[0].startswith("kvplan: error: "), p.stderr
            assert ("HF_HUB_OFFLINE" if hub == "offline" else "cannot reach the Hub") in lines[0], lines[0]


# Each once escaped main() as a traceback, or said its error on more than one line.
REGRESSIONS: list[list[str]] = [
    # sweep: numbers beyond 64-bit integers (OverflowError)
    ["sweep", "-m", "gemma-3-27b", "-g", "h100", "--max-num-batched-tokens", HUGE],
    ["sweep", "-m", "gemma-3-27b", "-g", "h100", "--max-num-batched-tokens", "9000000000000000000"],
    ["sweep", "-m", "llama3-8b", "-g", "h100", "--max-num-seqs", HUGE],
    ["sweep", "-m", "llama3-8b", "-g", "h100", "--max-model-len", HUGE],
    ["sweep", "-m", "llama3-8b", "-g", "h100", "--batch", HUGE],
    ["sweep", "-m", "llama3-8b", "-g", "h100", "--context", HUGE],
    ["sweep", "-m", "llama3-8b", "-g", "h100", "--batch", "9000000000000000000"],
    ["sweep", "-m", "llama3-8b", "-g", "h100", "--gpu-memory-gib", "1e30"],
    ["sweep", "-m", "llama3-8b", "-g", "h100", "--activation-gib", "1e30"],
    # an SGLang log without its server_args line (no mem_fraction_static) and no GPU (AttributeError)
    ["log", "{files}/sglang-no-server-args.log", "--model", "llama3-8b"],
    ["log", "{files}/sglang-no-server-args.log", "--model", "llama3-8b", "--json"],
    # a profile's engine limits below one (ValueError: max() arg is an empty sequence)
    ["capacity", "llama-3.1-8b", "--profile", "{files}/profile-negative-seqs.yaml"],
    ["plot", "capacity", "llama-3.1-8b", "--profile", "{files}/profile-negative-seqs.yaml"],
    ["capacity", "--profile", "{files}/profile-zero-seqs.yaml"],
    # a line break in a value quoted by the error (two lines on stderr)
    ["plot", "capacity", "llama-3.1-8b", "--profile", "{files}/profile-engine-version-newline.yaml"],
    ["plot", "capacity", "llama-3.1-8b", "--profile", "{files}/profile-gpu-newline.yaml"],
    ["capacity", "llama3-8b", "--gpu", "h100", "--engine-version", "0.3\n3"],
    ["capacity", "llama3-8b", "--gpu", "h100", "--engine-version", "0.3\u20283"],
    ["crossover", "lla\rma"],
    ["crossover", "llama3-8b", "--gpu", "a\x0bb"],
    # a model spec whose attention pattern is empty (ZeroDivisionError)
    ["crossover", "{files}/spec-empty-pattern.yaml", "--gpu", "b200"],
    ["capacity", "{files}/spec-empty-pattern.yaml", "--gpu", "h100"],
    # a --baseline whose name, requirement or operating point is not text (TypeError: unhashable type)
    ["gate", str(ROOT / "examples" / "gates.yaml"), "--baseline", "{files}/baseline-at-mapping.json"],
    ["gate", str(ROOT / "examples" / "gates.yaml"), "--baseline", "{files}/baseline-at-list.json", "--json"],
    ["gate", str(ROOT / "examples" / "gates.yaml"), "--baseline", "{files}/baseline-name-list.json"],
    # plot crossover: an operating point that is no number (IndexError), or several (the first was taken)
    ["plot", "crossover", "gemma-3-27b", "-c", " "],
    ["plot", "crossover", "gemma-3-27b", "-c", "2k", "-b", ","],
    ["plot", "crossover", "llama3-8b", "-c", "1,2"],
]


@pytest.mark.parametrize("argv", REGRESSIONS, ids=lambda a: " ".join(a)[:80])
def test_regressions_exit_2_with_one_line(argv):
    code, out, err = run([a.format(files=ENV["files"]) for a in argv])
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.rstrip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvplan: error: "), err


def test_regression_custom_dtype_operating_point():
    # a custom format's name holds commas; the operating point looked it up by the label's first comma part (KeyError)
    code, out, err = run(["plot", "crossover", "llama3-8b", "-d", "custom:bits=4,group=32", "-c", "2048", "--json"])
    assert code == 0, err
    assert json.loads(out)["points"][0][0].startswith("custom:bits=4,group=32: ")


def test_regression_sweep_figures_at_a_huge_batch_match_crossover():
    # the sweep multiplied batch x bytes in 64-bit integers: at batch 9e15 the weight read came out negative
    batch = "9000000000000000"
    code, out, err = run(["sweep", "-m", "llama3-8b", "-g", "h100", "--batch", batch, "--json"])
    assert code == 0, err
    row = json.loads(out)[0]
    code, out, err = run(["crossover", "llama3-8b", "--gpu", "h100", "-b", batch, "-c", "8192", "--json"])
    assert code == 0, err
    point = json.loads(out)["operating_points"][0]
    assert row["weight_bytes"] > 0
    assert row["weight_bytes"] == pytest.approx(point["weight_bytes"], rel=1e-12)
    assert row["kv_bytes"] == pytest.approx(point["kv_bytes"], rel=1e-12)


def test_regression_sizes_keep_every_digit():
    # 2**53 - 1 once went through a float; sizes are read exactly, up to 2**53, the largest whole number float64
    # arithmetic holds exactly (2**53 + 1 would come back as 2**53), and refused beyond it
    code, out, err = run(["crossover", "llama3-8b", "-c", str(2**53 - 1), "--json"])
    assert code == 0, err
    assert json.loads(out)["operating_points"][0]["context"] == 2**53 - 1
    code, out, err = run(["crossover", "llama3-8b", "-c", str(2**53 + 1)])
    assert code == 2 and err == (f"kvplan: error: --context '{2**53 + 1}': at most 2**53 (9,007,199,254,740,992), "
                                 f"the largest whole number kvplan's arithmetic holds exactly\n")


FUZZ_TESTS = {"capacity", "crossover", "sweep", "plot capacity", "plot crossover", "formats", "measure",
              "models show", "gpus show", "model specs", "gpu specs", "config.json", "gate", "log",
              "deployment profile",
              "calibration profile", "exponents", "local folders"}


def test_zz_case_count():
    """Runs last: the number of generated cases (at least MIN_CASES when the whole module ran)."""
    print(f"\nkvplan fuzz: {COUNT['cases']} CLI cases run (seed {SEED}) over {len(RAN)} fuzz tests: "
          + ", ".join(f"{k} {v}" for k, v in sorted(COUNT.items()) if k != "cases"))
    if RAN != FUZZ_TESTS:
        pytest.skip(f"only part of the module ran ({len(RAN)} of {len(FUZZ_TESTS)} fuzz tests)")
    assert COUNT["cases"] >= MIN_CASES * SCALE
