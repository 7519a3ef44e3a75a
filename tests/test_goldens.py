"""Golden snapshots of the command line: what each command prints, byte for byte, kept in tests/goldens/.

Every invocation in CASES runs in-process (the `cli` fixture of conftest.py, COLUMNS=200, output not a terminal) from
the repository's root, and its exit code, stdout and stderr (and any file it writes) must equal the snapshot stored
under tests/goldens/<group>.json exactly. They fence the behaviour through refactors: moving code between modules,
renaming or splitting them must leave every figure, table and error message as it was. A change that means to alter
output regenerates the snapshots, and its commit message says what changed in them and why:

    KVPLAN_UPDATE_GOLDENS=1 python -m pytest tests/test_goldens.py

Without that variable a missing snapshot fails (it is never written silently), and so does a snapshot no case produces.
The cases cover the catalogs (every model, every GPU) and the test fixtures (config.json files, startup logs, gates);
the lists are written out here so that a catalog entry added later fails test_catalogs_are_covered until it has cases.
Stored, each output is a list of its lines (joined with "\\n" they give the bytes back), so that a diff reads line by
line.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = Path(__file__).parent / "goldens"
UPDATE = os.environ.get("KVPLAN_UPDATE_GOLDENS") == "1"
# what a file written under the test's temporary folder is called in the snapshot: that folder's path changes per run
TMP = "$TMP"

MODELS = (
    "deepseek-r1", "deepseek-v2-lite", "deepseek-v3", "falcon-7b", "gemma-2-27b", "gemma-2-9b", "gemma-3-27b",
    "glm-4.5", "gpt-oss-120b", "gpt-oss-20b", "kimi-k2", "llama-3-70b", "llama-3-8b", "llama-3.1-405b",
    "llama-3.1-70b", "llama-3.1-8b", "llama-3.2-1b", "llama-3.2-3b", "llama-4-scout-17b-16e", "mistral-7b-v0.1",
    "mistral-7b-v0.3", "mixtral-8x22b", "mixtral-8x7b", "phi-3-mini-4k", "qwen2.5-72b", "qwen2.5-7b",
    "qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-32b", "qwen3-4b", "qwen3-8b",
)
GPUS = (
    "a100-pcie-40gb", "a100-pcie-80gb", "a100-sxm-40gb", "a100-sxm-80gb", "a10g", "b200", "b300", "gb200", "gb300",
    "h100-nvl", "h100-pcie", "h100-sxm", "h20", "h200", "l4", "l40s", "mi300x", "mi325x", "mi355x", "rtx-4090",
    "rtx-5090",
)
CONFIGS = (
    "tests/fixtures/deepseek-v3.config.json", "tests/fixtures/falcon-7b.config.json",
    "tests/fixtures/gemma-3-27b.config.json", "tests/fixtures/gpt-oss-120b.config.json",
    "tests/fixtures/llama3-8b.config.json", "tests/fixtures/qwen3-30b-a3b.config.json",
    "tests/fixtures/tiny-model.yaml",
) + tuple(f"tests/fixtures/configs/{name}.config.json" for name in (
    "Qwen--Qwen2.5-7B-Instruct", "Qwen--Qwen3-14B", "Qwen--Qwen3.5-35B-A3B",
    "RedHatAI--Meta-Llama-3.1-8B-Instruct-quantized.w8a8",
    "RedHatAI--Mistral-Small-3.1-24B-Instruct-2503-quantized.w8a8", "RedHatAI--Qwen2.5-7B-Instruct-fp8-dynamic",
    "RedHatAI--Qwen2.5-7B-Instruct-quantized.w8a8", "codellama--CodeLlama-34b-hf", "google--gemma-2-2b-it",
    "ibm-granite--granite-3.1-2b-instruct", "ibm-granite--granite-3.3-8b-instruct",
    "ibm-granite--granite-vision-3.3-2b", "meta-llama--Llama-3.1-8B-Instruct",
    "meta-llama--Llama-4-Scout-17B-16E-Instruct", "microsoft--phi-2", "moonshotai--Kimi-Dev-72B",
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "openai--gpt-oss-20b",
    "redhatai--Llama-3.3-70B-Instruct-quantized.w8a8",
))
LOGS = "tests/fixtures/logs"
ENGINE_LOGS = tuple(f"{LOGS}/{name}.log" for name in (
    "sglang-0.5-llama31-8b-h100", "vllm-v0-0.6-llama3-8b-h100", "vllm-v1-0.10-llama31-8b-h100",
    "vllm-v1-0.33-llama31-8b-h100",
))
VLLM_019_LOGS = tuple(f"{LOGS}/vllm-0.19-h100/{name}.log" for name in (
    "codellama-codellama-34b---h100-80gb--tp2pp1dp1--8192.FAILED",
    "fp8dyn-redhatai-qwen2-5---h100-80gb--tp1pp1dp1--8192", "google-gemma-2-2b-it--h100-80gb--tp1pp1dp1--8192",
    "granite-3-1-2b--h100-80gb--tp1pp1dp1--8192", "ibm-granite-granite-3-3---h100-80gb--tp1pp1dp1--8192",
    "ibm-granite-granite-visi--h100-80gb--tp1pp1dp1--8192", "meta-llama-llama---h100-80gb--tp1pp1dp1--8192-dtbf16",
    "meta-llama-llama-3--h100-80gb--tp1pp1dp1--8192-dtf16", "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--2048",
    "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--4096", "meta-llama-llama-3-1-8b--h100-80gb--tp1pp1dp1--16384",
    "meta-llama-llama-4-scout--h100-80gb--tp4pp1dp1--8192.FAILED", "microsoft-phi-2--h100-80gb--tp1pp1dp1--8192.FAILED",
    "moonshotai-kimi-dev-72b--h100-80gb--tp2pp1dp1--8192", "moonshotai-kimi-dev-72b--h100-80gb--tp4pp1dp1--8192.FAILED",
    "openai-gpt-oss-20b--h100-80gb--tp1pp1dp1--8192.FAILED", "openai-gpt-oss-20b--h100-80gb--tp2pp1dp1--8192.FAILED",
    "qwen-qwen2-5-7b-i--h100-80gb--tp1pp1dp1--8192-dtbf16", "qwen-qwen2-5-7b-instruc--h100-80gb--tp1pp1dp1--16384",
    "qwen-qwen2-5-7b-instruc--h100-80gb--tp1pp1dp1--32768", "qwen-qwen2-5-7b-instruct--h100-80gb--tp1pp1dp1--2048",
    "qwen-qwen2-5-7b-instruct--h100-80gb--tp1pp1dp1--4096", "qwen-qwen2-5-7b-instruct--h100-80gb--tp2pp1dp1--8192",
    "qwen-qwen3-14b--h100-80gb--tp5pp1dp1--8192.FAILED", "redhatai-llama-3-3-70b-i--h100-80gb--tp2pp1dp1--8192",
    "w8a8-mistral-small-24b--h100-80gb--tp1pp1dp1--8192", "w8a8-mistral-small-24b--h100-80gb--tp2pp1dp1--8192",
    "w8a8-redhatai-llam--h100-80gb--tp1pp1dp1--8192-dtf16", "w8a8-redhatai-qwen2-5-7b--h100-80gb--tp1pp1dp1--8192",
))
GATES = "tests/fixtures/gates"


class Case(NamedTuple):
    group: str  # the snapshot file: tests/goldens/<group>.json
    id: str  # the key in that file, and the test's id
    argv: tuple
    written: Optional[str] = None  # a text file the command writes (under TMP), kept in the snapshot too


def case(group: str, *argv: str, id: Optional[str] = None, written: Optional[str] = None) -> Case:
    return Case(group, id or " ".join(argv), argv, written)


def _capacity() -> list:
    cases = [case("capacity", "capacity", "--gpu", "h100", "--json"), case("capacity", "capacity", "--gpu", "mi300x")]
    cases += [case("capacity", "capacity", m, "--gpu", gpu, "--tp", tp, "-d", "auto,fp8", "--json")
              for m in MODELS for gpu in ("h100", "mi300x") for tp in ("1", "8")]
    cases += [case("capacity", "capacity", m, "--gpu", "h100", "-d", "auto,fp8", "--json") for m in CONFIGS]
    cases += [case("capacity", "capacity", *args.split()) for args in (
        "llama-3.1-8b --gpu h100 -d auto,fp8",  # the tables
        "deepseek-v3 --gpu h200 --tp 8 -d auto,fp8",
        "llama-3.1-8b --gpu h100 -d all --json",  # every format of the catalog, on GQA and on MLA
        "deepseek-v2-lite --gpu h100 -d all --json",
        "llama-3.1-8b --gpu h100 -d custom:bits=4,group=32 --json",
        "llama-3.1-8b --gpu h100 --max-model-len auto -d fp8 --json",
        "llama-3.1-8b --gpu h100 --max-model-len 32k --engine-version 0.19 --json",
        "llama-3.1-8b --gpu h100 --engine sglang -d auto,fp8 --json",
        "llama-3.1-8b --gpu h100 --engine sglang --page-size 16 --mem-fraction-static 0.85 --json",
        "llama-3.1-70b --gpu h100 --tp 4 --pp 2 --json",
        "llama-3.1-70b --gpu h100 --tp 8 --dcp 2 --json",
        "llama-3.1-8b --gpu h100 --gpu-memory-utilization 0.8 --block-size 32 --enforce-eager --json",
        "llama-3.1-8b --gpu h100 --activation-gib 6 --gpu-memory-gib 79.65 --json",
        "llama-3.1-8b --gpu h100 --kv-cache-memory 20 --json",
        "llama-3.1-8b --gpu h100 --free-memory-gib 60 --json",
        "llama-3.1-8b --gpu h100 --weight-dtype fp8 --max-num-seqs 512 --max-num-batched-tokens 4096 --json",
        "llama-3.1-8b --gpu h100 -d turboquant_4bit_nc --kv-cache-dtype-skip-layers none --json",
        "gemma-3-27b --gpu h100 -d fp8 --kv-cache-dtype-skip-layers sliding_window --json",
        "llama-4-scout-17b-16e --gpu h100 --tp 4 --language-model-only --entrypoint llm --json",
        "tests/fixtures/configs/nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.config.json --gpu h100 "
        "--mamba-ssm-cache-dtype float32 --json",
        # bad input: exit 2 and one line on stderr
        "llama3-9b --gpu h100",
        "llama-3.1-8b --gpu h99",
        "llama-3.1-8b --gpu h100 -d fp7",
        "llama-3.1-8b --gpu h100 --max-model-len 32q",
        "llama-3.1-8b --gpu h100 --tp 3",
        "llama-3.1-8b --gpu h100 --engine tgi",
        "llama-3.1-8b --gpu h100 --block-size 17",
        "llama-3.1-405b --gpu h100",
    )]
    return cases


def _crossover() -> list:
    cases = []
    for m in MODELS:
        cases.append(case("crossover", "crossover", m, "--gpu", "h100", "--json"))
        cases.append(case("crossover", "crossover", m, "--gpu", "h100", "-b", "1,8,64", "-c", "2k,32k,128k", "--json"))
    cases += [case("crossover", "crossover", m, "--gpu", "h100", "--json") for m in CONFIGS]
    cases += [case("crossover", "crossover", *args.split()) for args in (
        "llama-3.1-8b",  # the tables
        "llama-3.1-8b --gpu h100 -b 1,32 -c 8k,128k",
        "llama-3.1-8b --json",  # bytes only, no GPU
        "llama-3.1-8b --gpu b200 -d all --json",
        "deepseek-v3 --gpu h200 --tp 8 -d all --json",
        "llama-3.1-8b --gpu h100 --weight-read all --baseline fp8 -d auto,fp8,int4_per_token_head,kivi2 --json",
        "llama-3.1-70b --gpu h100 --tp 4 --weight-dtype fp8 --json",
        "gemma-3-27b --gpu mi300x -d fp8 --kv-cache-dtype-skip-layers 0,1 --json",
        "llama3-9b",
        "llama-3.1-8b -c 12q",
        "llama-3.1-8b --gpu h100 --weight-read some",
    )]
    return cases


def _throughput() -> list:
    return [case("throughput", "throughput", *args.split()) for args in (
        "llama-3.1-8b --gpu h100 --isl 1024 --osl 256 -n 1,8,64 --json",  # dense
        "llama-3.1-8b --gpu h100 --isl 1024 --osl 256 -n 1,8,64",  # the tables
        "llama-3.1-70b --gpu h100 --tp 4 --isl 1k --osl 256 -n 8,64 --tpot-ms 30 --json",
        "qwen3-30b-a3b --gpu h200 --isl 2k --osl 512 -n 1,16,128 --json",  # MoE
        "gpt-oss-120b --gpu b200 --isl 1k --osl 1k -n 4,32 --ttft-ms 500 --json",  # MoE, sliding window
        "deepseek-v3 --gpu h200 --tp 8 --isl 2k --osl 512 -n 1,16 --json",  # MLA
        "deepseek-v2-lite --gpu b200 --isl 4k --osl 512 -n 1,32 --json",
        "gemma-3-27b --gpu b200 --isl 4k --osl 512 -n 1,16 --json",  # sliding window
        "mistral-7b-v0.1 --gpu h100 --isl 8k --osl 1k -n 4,32 --engine sglang --json",
        "llama-3.1-8b --gpu h200 --isl 512 --osl 128 --max-model-len 8k --json",  # the default concurrencies
        "llama-3.1-8b --gpu h100 --osl 256",
        "llama-3.1-8b --gpu h100 --isl 1k --osl 256 -n 0",
    )]


def _sweep() -> list:
    grid = "-m llama-3.1-8b,qwen3-30b-a3b,deepseek-v2-lite -g h100,mi300x --tp 1,2 -d auto,fp8"
    return [case("sweep", "sweep", *args.split(), written=written) for args, written in (
        (f"{grid} --json", None),
        (grid, None),  # CSV on stdout
        (f"{grid} --format markdown", None),
        (f"{grid} -o {TMP}/grid.csv", "grid.csv"),
        (f"{grid} -o {TMP}/grid.json", "grid.json"),
        ("-m llama-3.1-8b -g h100 --max-model-len 8k,32k -b 1,32 -c 8k,32k --columns model,max_model_len,batch,"
         "context,max_concurrency,step_bytes,step_ms --json", None),
        ("-m llama-3.1-8b -g h100 --columns model,nope", None),
        ("-m llama-3.1-8b -g h100 -o grid.xlsx", None),
    )]


def _gate() -> list:
    cases = [case("gate", "gate", "examples/gates.yaml", "--json"), case("gate", "gate", "examples/gates.yaml"),
             case("gate", "gate", "examples/gates.yaml", "--junit", f"{TMP}/gates.xml", written="gates.xml")]
    for name in ("pass", "fail"):
        cases += [case("gate", "gate", f"{GATES}/{name}.yaml", "--json"), case("gate", "gate", f"{GATES}/{name}.yaml")]
    baseline = f"{GATES}/pass.baseline.json"
    cases += [case("gate", "gate", f"{GATES}/lower.yaml", "--baseline", baseline),
              case("gate", "gate", f"{GATES}/lower.yaml", "--baseline", baseline, "--max-regression", "5", "--json")]
    cases += [case("gate", "gate", f"{GATES}/{name}.yaml") for name in
              ("misspelt", "unknown-model", "not-yaml", "no-gates")]
    cases.append(case("gate", "gate", f"{GATES}/pass.yaml", "--baseline", f"{GATES}/pass.yaml"))
    return cases


def _log() -> list:
    configs = ("--configs", "tests/fixtures/configs")
    cases = [case("log", "log", path, *configs, "--json") for path in ENGINE_LOGS + VLLM_019_LOGS]
    cases += [case("log", "log", path, "--gpu", "h100", *extra) for path in ENGINE_LOGS for extra in (("--json",), ())]
    cases += [case("log", "log", *VLLM_019_LOGS, *configs, "--summary", *extra,
                   id=" ".join(("log", f"{LOGS}/vllm-0.19-h100/*.log", *configs, "--summary", *extra)))
              for extra in ((), ("--json",))]
    cases += [case("log", "log", *ENGINE_LOGS, "--gpu", "h100", "--summary",
                   id=f"log {LOGS}/*.log --gpu h100 --summary"),
              case("log", "log", ENGINE_LOGS[2], "--gpu", "h100", "--save-profile", f"{TMP}/profile.yaml",
                   written="profile.yaml"),
              case("log", "log", f"{LOGS}/vllm-0.19-h100/README.md"),
              case("log", "log", f"{LOGS}/missing.log"),
              case("log", "log", ENGINE_LOGS[1], "--gpu", "h100", "--model", "qwen3-8b")]
    return cases


def _catalogs() -> list:
    # the format catalog at several head shapes; each format on a model: capacity and crossover with -d all
    cases = [case("formats", "formats", *args.split()) for args in (
        "--json", "", "--head-dim 64 --json", "--head-dim 256", "--kv-lora-rank 256 --qk-rope-head-dim 32 --json",
        "--head-dim 0", "turboquant_k3v4_nc", "turboquant_4bit_nc --json", "fp8", "kivi2 --head-dim 64",
        "fp8_ds_mla", "nonsense")]
    # the support matrix: each format as kvplan plans it on an engine, release and GPU (both default models)
    cases += [case("formats_matrix", "formats", *args.split()) for args in (
        "--gpu h100", "--gpu h100 --json", "--gpu a100 --engine-version 0.19", "--gpu b200 --engine-version 0.25 --json",
        "--gpu mi300x --model llama-3.1-8b", "--gpu b200 --engine sglang --engine-version 0.5.15",
        "--gpu h100 --engine sglang --json", "fp8_e5m2 --gpu h100 --engine-version 0.20",
        "--gpu h100 --engine tgi", "--gpu h99", "--gpu h100 --engine-version 1.2", "--engine sglang",
        "nvfp4 --gpu h100 --model deepseek-v3")]
    cases += [case("models", "models", "--json"), case("models", "models")]
    cases += [case("models", "models", "show", m, "--json") for m in MODELS]
    cases += [case("models", "models", "show", *args.split()) for args in (
        "llama-3.1-8b", "deepseek-v3", "tests/fixtures/llama3-8b.config.json --json",
        "tests/fixtures/tiny-model.yaml", "llama3-9b")]
    cases += [case("gpus", "gpus", "--json"), case("gpus", "gpus")]
    cases += [case("gpus", "gpus", "show", g, "--json") for g in GPUS]
    cases += [case("gpus", "gpus", "show", *args.split()) for args in ("h100", "mi300x", "h99")]
    # usage errors (help texts are left out: rich lays them out, so they change with its version)
    cases += [case("usage", *args.split()) for args in ("nope", "capacity --nope", "crossover", "quality")]
    return cases


CASES = _capacity() + _crossover() + _throughput() + _sweep() + _gate() + _log() + _catalogs()


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """Nothing of the environment reaches the output: run from the repository's root (relative paths in the output
    stay the same), no variable that forces a terminal or moves the catalogs and caches."""
    monkeypatch.chdir(ROOT)
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "TERM",
                 "KVPLAN_MODELS_DIR", "KVPLAN_HARDWARE_DIR", "XDG_CACHE_HOME", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _lines(text: str) -> list:
    return text.split("\n")


def record(cli, tmp: Path, c: Case) -> dict:
    run = cli(*(a.replace(TMP, str(tmp)) for a in c.argv))
    # Normalised: the temporary folder's path, which differs per run (only files written under it print it).
    out, err = (s.replace(str(tmp), TMP) for s in (run.out, run.err))
    rec = {"argv": list(c.argv), "exit_code": run.code, "stdout": _lines(out), "stderr": _lines(err)}
    if c.written:
        path = tmp / c.written
        rec["written"] = _lines(path.read_text(encoding="utf-8")) if path.exists() else None
    return rec


def _golden_path(group: str) -> Path:
    return GOLDENS / f"{group}.json"


def _load(group: str) -> dict:
    path = _golden_path(group)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _store(group: str, entries: dict) -> None:
    """Write a snapshot file atomically (a temporary file in the same folder, then os.replace), its entries in the
    order of CASES."""
    order = [c.id for c in CASES if c.group == group]
    text = json.dumps({k: entries[k] for k in order if k in entries}, indent=1, ensure_ascii=False) + "\n"
    GOLDENS.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=GOLDENS, prefix=f".{group}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp's 0o600 would otherwise stay on the snapshot
    os.replace(tmp, _golden_path(group))


# A number in printed output. Sums of floats may differ in their last bit between numpy releases (pairwise
# summation, SIMD reductions), so two lines agree when their text matches outside numbers and each pair of numbers is
# equal or, for long fractions that only such rounding can move, within REL_ULPS of each other.
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
REL_ULPS = 1e-13


def _same_line(want: str, got: str) -> bool:
    if want == got:
        return True
    if _NUMBER.split(want) != _NUMBER.split(got):
        return False
    for a, b in zip(_NUMBER.findall(want), _NUMBER.findall(got)):
        if a == b:
            continue
        if len(a.replace("-", "").replace(".", "")) < 15:  # a short figure printed for people: exact
            return False
        x, y = float(a), float(b)
        if abs(x - y) > REL_ULPS * max(abs(x), abs(y)):
            return False
    return True


def _agrees(expected, actual) -> bool:
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(_agrees(expected[k], actual[k]) for k in expected)
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(_agrees(a, b) for a, b in zip(expected, actual))
    if isinstance(expected, str) and isinstance(actual, str):
        return _same_line(expected, actual)
    return expected == actual


def _diff(expected: dict, actual: dict) -> str:
    parts = []
    for key in sorted(set(expected) | set(actual)):
        want, got = expected.get(key), actual.get(key)
        if want == got:
            continue
        if isinstance(want, list) and isinstance(got, list):
            parts += difflib.unified_diff(want, got, f"golden {key}", f"now {key}", lineterm="", n=2)
        else:
            parts.append(f"{key}: golden {want!r}, now {got!r}")
    return "\n".join(parts)


@pytest.mark.parametrize("c", CASES, ids=[f"{c.group}:{c.id}" for c in CASES])
def test_golden(cli, isolated, c: Case):
    actual = record(cli, isolated, c)
    entries = _load(c.group)
    if UPDATE:
        if c.id not in entries or not _agrees(entries[c.id], actual):
            entries[c.id] = actual
            _store(c.group, entries)
        return
    if c.id not in entries:
        pytest.fail(f"no golden for {c.id!r} in {_golden_path(c.group)}: write it with KVPLAN_UPDATE_GOLDENS=1 "
                    f"python -m pytest tests/test_goldens.py", pytrace=False)
    if not _agrees(entries[c.id], actual):
        pytest.fail(f"{c.id!r} differs from its golden (KVPLAN_UPDATE_GOLDENS=1 rewrites it when the change is "
                    f"meant):\n{_diff(entries[c.id], actual)}", pytrace=False)


def test_no_stale_goldens():
    """Every snapshot file and entry belongs to a case: a case removed from CASES takes its snapshot with it."""
    groups = {c.group for c in CASES}
    stale = []
    for path in sorted(GOLDENS.glob("*.json")):
        group = path.stem
        if group not in groups:
            stale.append(f"{path.name} (no case writes it)")
            if UPDATE:
                path.unlink()
            continue
        entries = _load(group)
        extra = set(entries) - {c.id for c in CASES if c.group == group}
        stale += [f"{path.name}: {key!r}" for key in sorted(extra)]
        if UPDATE and extra:
            _store(group, entries)
    assert UPDATE or not stale, "snapshots no case produces (KVPLAN_UPDATE_GOLDENS=1 removes them):\n" + \
        "\n".join(stale)


def test_catalogs_are_covered(cli, isolated):
    """The lists above hold every catalog model and GPU, so that each has its snapshots."""
    for kind, listed in (("models", MODELS), ("gpus", GPUS)):
        keys = tuple(row["key"] for row in json.loads(cli(kind, "--json").out))
        assert keys == listed, f"add {sorted(set(keys) - set(listed))} to {kind.upper()} in this file (and remove " \
                               f"{sorted(set(listed) - set(keys))}), then regenerate the snapshots"


def test_cases_are_unique():
    ids = [(c.group, c.id) for c in CASES]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]


def test_lines_agree_only_up_to_float_rounding():
    # 17.199567931470224 and ...227 differ by 3e-15, which only summation order can do: the same figure
    assert _same_line('"step_ms": 17.199567931470224,', '"step_ms": 17.199567931470227,')
    # a figure printed for people (fewer than 15 digits) must match exactly, and so must the text around numbers
    assert not _same_line("TPOT 17.20 ms", "TPOT 17.21 ms")
    assert not _same_line('"step_ms": 17.199567931470224,', '"step_ms": 17.199567931480224,')
    assert not _same_line('"step_ms": 17.199567931470224,', '"itl_ms": 17.199567931470224,')
    assert _agrees({"a": ["x 1.0000000000000002"]}, {"a": ["x 1.0000000000000004"]})
    assert not _agrees({"a": ["x"]}, {"a": ["x", ""]})
