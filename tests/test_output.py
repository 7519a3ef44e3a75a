"""What reaches the terminal: tables at any width, closed pipes, --version and help."""

import io
import os
import shlex
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import kvplan
from kvplan.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
GATES = str(ROOT / "examples" / "gates.yaml")


@pytest.fixture
def cli_at(monkeypatch):
    """Run the kvplan CLI in-process at a given terminal width, its output not a terminal (as when piped)."""

    def run(width: int, *args: str):
        monkeypatch.setenv("COLUMNS", str(width))
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(list(args))
        return code, out.getvalue(), err.getvalue()

    return run


TABLES = [
    ("capacity llama3-8b --gpu h100 -d auto,fp8,turboquant_4bit_nc --gpu-memory-gib 79.65 --activation-gib 6",
     ["1,210,688", "1,048,576", "2,969,600", "147.79x", "79.65 GiB", "52.32 GiB", "0-1,30-31"]),
    ("capacity llama-3.1-8b --gpu h100 -d auto,fp8 --max-model-len 32768",
     ["79.11 GiB", "H100-SXM5-80GB:", "895,184", "1,048,576", "27.32x"]),
    ("crossover llama3-8b -d turboquant_4bit_nc --weight-read all --context 128k",
     ["122,532", "346,132", "468,182", "131,072", "1 x 131,072", "turboquant_4bit_nc", "weights"]),
    ("crossover qwen3-30b-a3b --batch 1,64 --context 8k --gpu h100",
     ["61,887", "605,368", "33.149", "0.8053", "64 x 8,192", "weights"]),
    ("capacity --gpu h100", ["626.92 GiB", "10,485,760", "3,695.77x", "llama-4-scout-17b-16e", "97,760"]),
    ("formats", ["fp8_per_token_head", "turboquant_4bit_nc", "vllm,sglang", "1,152", "6.12"]),
    ("models", ["1,026.4B", "10,485,760", "507,904", "llama-4-scout-17b-16e", "fp8_block128"]),
    ("gpus", ["287.50 GiB est.", "10066.3", "126.5", "A100-PCIE-40GB"]),
    (f"gate {GATES}", ["869,264", ">= 400,000", "26.53", "long-context-70b-tp8", "2 of 2 gates passed"]),
]


@pytest.mark.parametrize("width", [60, 80, 200])
@pytest.mark.parametrize("cmd, figures", TABLES, ids=[c.split(" /")[0][:50] for c, _ in TABLES])
def test_tables_never_cut_a_cell_short(cli_at, width, cmd, figures):
    code, out, err = cli_at(width, *shlex.split(cmd))
    assert code == 0, err
    assert "…" not in out
    for figure in figures:
        assert figure in out, f"{figure!r} missing at {width} columns:\n{out}"


def test_a_table_that_fits_keeps_the_console_width(cli_at):
    # wrapping text columns is the first resort; columns move to a second table only when that is not enough
    _, out, _ = cli_at(80, "gate", GATES)
    table = [ln for ln in out.splitlines() if ln.strip()][1:-1]
    assert max(len(ln) for ln in table) <= 80
    _, out, _ = cli_at(60, "capacity", "llama3-8b", "--gpu", "h100", "-d", "auto,fp8,turboquant_4bit_nc",
                       "--gpu-memory-gib", "79.65", "--activation-gib", "6")
    assert max(len(ln) for ln in out.splitlines()) <= 60 and "1,210,688" in out


def test_columns_that_do_not_fit_continue_below_with_the_row_labels(cli_at):
    # throughput at 60 columns: the row labels (KV dtype, conc.) head every part, each figure once, none cut
    _, out, _ = cli_at(60, "throughput", "llama-3.1-8b", "--gpu", "h100", "--isl", "1k", "--osl", "1k",
                       "-n", "16,64", "-d", "fp8")
    headers = [ln.split() for ln in out.splitlines() if ln.startswith(" KV dtype")]
    assert len(headers) >= 2 and all(h[:3] == ["KV", "dtype", "conc."] for h in headers)
    names = [w for h in headers for w in h[3:]]
    for col, n in [("TPOT", 1), ("TTFT", 2), ("p99", 1), ("tok/s", 1), ("GPU", 1), ("user", 1), ("running", 1),
                   ("floor", 1)]:  # TTFT twice: TTFT ms and TTFT p99
        assert names.count(col) == n, (col, names)
    # each part lists the same rows: concurrency 16, 64 and the best, under the label fp8 once
    assert out.count(" fp8 ") == len(headers)
    assert max(len(ln) for ln in out.splitlines()) <= 60


LOGS = ROOT / "tests" / "fixtures" / "logs"
# every command that prints a table, with the options that make its tables widest
WIDE = [
    "capacity llama3-8b --gpu h100 -d auto,fp8,turboquant_4bit_nc",
    "capacity --gpu h200 --tp 8",
    "crossover llama-3.1-8b -d fp8 --gpu h100 -c 2304,128k",
    "crossover llama-3.1-8b -d turboquant_4bit_nc --weight-read all --context 128k",
    "crossover qwen3-30b-a3b --batch 1,64 --context 8k --gpu h100",
    "throughput llama-3.1-8b --gpu h100 --isl 1k --osl 1k --tpot-ms 20 -n 16,256",
    "throughput qwen3-30b-a3b --gpu h100 --isl 1k --osl 128 -n 8 --num-prompts 50 --layout tp1 --layout tp2",
    "capacity deepseek-v3 --gpu h200 --data-parallel-size 8 --enable-expert-parallel",
    "plot capacity llama3-8b --gpu h100",
    f"gate {GATES}",
    f"log {LOGS / 'vllm-v1-0.33-llama31-8b-h100.log'} --gpu h100",
    f"log {' '.join(sorted(str(p) for p in (LOGS / 'vllm-0.19-h100').glob('*.log'))[:6])} "
    f"--configs {ROOT / 'tests' / 'fixtures' / 'configs'} --summary",
    "formats", "formats turboquant_k3v4_nc", "models", "models show llama3-8b", "gpus", "gpus show h100",
    "plot throughput llama-3.1-8b --gpu h100 --isl 1k --osl 1k -n 8,64",
    "measure --dry-run --gpu h100",
]


def _widest(out: str) -> int:
    import re

    return max(len(re.sub(r"\x1b\[[0-9;]*m", "", ln)) for ln in out.splitlines())


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
@pytest.mark.parametrize("width", [50, 80, 120])
@pytest.mark.parametrize("cmd", WIDE, ids=[c.split(" /")[0][:40] for c in WIDE])
def test_no_line_is_wider_than_the_terminal(cli_at, monkeypatch, terminal, width, cmd):
    # COLUMNS=50, 80, 120, printed to a pipe (kvplan's plain renderer) and to a terminal (rich): every line of
    # every command's output fits, tables included (their extra columns continue below), and no cell is cut
    if terminal:
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
    code, out, err = cli_at(width, *shlex.split(cmd))
    assert code == 0, err
    assert "…" not in out
    assert _widest(out) <= width, f"{cmd} at {width} columns:\n{out}"


def test_piped_without_columns_is_80_wide(tmp_path):
    # a pipe with no COLUMNS and no terminal on stdin, stdout or stderr: 80 columns, as rich takes it
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    for cmd in ("models", "throughput llama-3.1-8b --gpu h100 --isl 1k --osl 1k -n 8,64", "capacity --gpu h100"):
        p = subprocess.run([_kvplan(), *shlex.split(cmd)], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert 60 < _widest(p.stdout) <= 80, cmd


# ----------------------------------------------------------------------------------------------------------------
# A closed pipe


def _kvplan() -> str:
    exe = Path(sys.executable).with_name("kvplan")
    found = str(exe) if exe.exists() else shutil.which("kvplan")
    if not found:
        pytest.skip("the kvplan console script is not installed")
    return found


@pytest.fixture
def failing_gates(tmp_path):
    path = tmp_path / "gates.yaml"
    path.write_text(Path(GATES).read_text().replace("min_concurrency: 12 ", "min_concurrency: 1000 "))
    return str(path)


def _pipeline(cmd: str) -> subprocess.CompletedProcess:
    """`cmd | head -1`, with pipefail: the status is kvplan's own."""
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run(["bash", "-c", f"set -o pipefail; {cmd} | head -1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run kvplan with its stdout a pipe whose reader has already gone: every write fails."""
    env = {**os.environ, "COLUMNS": "80"}
    p = subprocess.Popen([_kvplan(), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    return subprocess.CompletedProcess(p.args, p.wait(timeout=120), "", err)


def test_head_on_a_passing_gate_exits_0_quietly():
    r = _pipeline(f"{shlex.quote(_kvplan())} gate examples/gates.yaml")
    assert r.stdout.startswith("Capacity gates")
    assert (r.returncode, r.stderr) == (0, "")


def test_head_on_a_failing_gate_exits_1_without_a_traceback(failing_gates):
    r = _pipeline(f"{shlex.quote(_kvplan())} gate {shlex.quote(failing_gates)}")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr and "Exception" not in r.stderr


def test_head_on_capacity_exits_0_quietly():
    r = _pipeline(f"{shlex.quote(_kvplan())} capacity llama3-8b --gpu h100 -d auto,fp8,turboquant_4bit_nc "
                  "--gpu-memory-gib 79.65 --activation-gib 6")
    assert r.stdout.startswith("Llama-3-8B")
    assert (r.returncode, r.stderr) == (0, "")


@pytest.mark.parametrize("args, status", [
    (["gate", GATES], 0),
    (["capacity", "--gpu", "h100"], 0),
    (["crossover", "llama3-8b", "-d", "fp8"], 0),
    (["formats", "--json"], 0),
])
def test_a_closed_pipe_keeps_the_commands_status(args, status):
    r = _closed_pipe(*args)
    assert (r.returncode, r.stderr) == (status, "")


def test_a_closed_pipe_keeps_a_failing_gates_status(failing_gates):
    r = _closed_pipe("gate", failing_gates)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr and "Exception" not in r.stderr


# ----------------------------------------------------------------------------------------------------------------
# --version and help


def test_version(cli_at):
    code, out, err = cli_at(80, "--version")
    assert (code, out, err) == (0, f"kvplan {kvplan.__version__}\n", "")
    assert out == "kvplan 0.1.0\n"


HELP = ["", "crossover", "capacity", "sweep", "gate", "log", "measure", "formats", "models", "models show", "gpus",
        "gpus show", "plot", "plot crossover", "plot capacity"]


@pytest.mark.parametrize("cmd", HELP, ids=lambda c: c or "kvplan")
def test_flags_show_no_type_in_help(cli_at, cmd):
    code, out, _ = cli_at(200, *cmd.split(), "--help")
    assert code == 0
    assert "--help" in out
    assert "<bool>" not in out


def test_python_api_errors_say_what_it_takes():
    # the shapes the CLI reads ("auto,fp8", "8k") are not the library's: a KvplanError (exported as
    # kvplan.KvplanError) says what it takes instead of an AttributeError or a TypeError from deep inside
    import kvplan
    from kvplan.deployment import DeploymentArgs

    assert issubclass(kvplan.KvplanError, Exception)
    m, g = kvplan.load_model("llama3-8b"), kvplan.load_gpu("h100")
    with pytest.raises(kvplan.KvplanError, match="one name such as 'fp8'"):
        kvplan.capacity(m, g, ["auto", "fp8"])
    with pytest.raises(kvplan.KvplanError, match=r"contexts takes whole numbers .*got '8k'"):
        kvplan.crossover(m, "fp8", contexts=["8k"])
    with pytest.raises(kvplan.KvplanError, match=r"batches takes whole numbers .*got 0"):
        kvplan.crossover(m, "fp8", batches=[0])
    with pytest.raises(kvplan.KvplanError, match="step times are a GPU's"):
        kvplan.step_model(DeploymentArgs(model=m).resolve())
    # whole numbers of any integer type are taken: 8,192 tokens of fp8 KV are 8192 x 65,536 bytes
    import numpy as np

    point = kvplan.crossover(m, "fp8", contexts=[np.int64(8192)]).operating_points[0]
    assert point.context == 8192 and point.kv_bytes == 8192 * 2 * 32 * 8 * 128


def test_large_batches_and_concurrencies_have_thousands_separators(cli_at):
    # batch 1,000 x context 2,048 is written like the context; Falcon-7B's 10,288.78 sequences on an MI300X (one
    # KV head: 32 layers x 64 x 2 x 2 B = 8,192 B per token) carries its separator as every other count does
    code, out, err = cli_at(200, "crossover", "llama3-8b", "-b", "1000", "-c", "2k")
    assert code == 0, err
    assert "1,000 x 2,048" in out and "1000 x" not in out
    code, out, err = cli_at(200, "capacity", "--gpu", "mi300x")
    assert code == 0, err
    assert "10,288.78x" in out and "10288.78x" not in out
