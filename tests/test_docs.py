"""The examples in the docstrings run as written, and the package's public names are what they say."""

import difflib
import doctest
import importlib
import io
import os
import pkgutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import kvplan
from kvplan.app.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", ["kvplan", "kvplan.plan.sweep", "kvplan.app.gates"])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(importlib.import_module(module), verbose=False)
    assert tried >= 2 and failures == 0


def test_public_names_are_not_shadowed_by_submodules():
    # importing every submodule binds it on the package; an exported function of the same name would be lost
    for info in pkgutil.iter_modules(kvplan.__path__):
        if info.name not in ("__main__",):
            importlib.import_module(f"kvplan.{info.name}")
    for name in kvplan.__all__:
        assert not isinstance(getattr(kvplan, name), type(kvplan)), name


def test_readme_test_command_is_what_ci_runs():
    command = "pip install -e '.[test]' && python -m pytest -q"
    assert command in (ROOT / "README.md").read_text()
    assert command in (ROOT / ".ci" / "run").read_text()


def test_results_to_frame():
    pd = pytest.importorskip("pandas")
    m = kvplan.load_model("llama3-8b")
    x = kvplan.crossover(m, "fp8", contexts=[2048, 8192], batches=[1, 4])
    fx = x.to_frame()
    assert len(fx) == 4 and list(fx["context"]) == [2048, 8192, 2048, 8192]
    assert (fx["crossover_tokens"] == x.crossover_tokens).all()
    c = pd.concat([kvplan.capacity(m, kvplan.load_gpu("h100"), d, activation_gib=6).to_frame() for d in ("auto", "fp8")])
    assert list(c["dtype"]) == ["auto", "fp8"] and c["num_blocks"].iloc[1] == 53_067


def _readme_examples():
    """Each `$ kvplan ...` command in the README's console blocks, with the output shown under it."""
    import re

    examples = []
    for block in re.findall(r"```console\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        current = None
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("$ kvplan "):
                cmd = line[2:]
                while cmd.endswith("\\"):
                    i += 1
                    cmd = cmd[:-1] + lines[i].strip()
                current = (cmd, [])
                examples.append(current)
            elif current is not None:
                current[1].append(line)
            i += 1
    return examples


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory):
    """Where the README's examples write their files (one directory: a later example reads an earlier one's)."""
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize("cmd, shown", _readme_examples(), ids=lambda v: v[:60] if isinstance(v, str) else "")
def test_readme_examples_show_current_output(monkeypatch, readme_dir, cmd, shown):
    # the README's tour shows real output: rerun each command (at the terminal width it was captured at) and
    # compare, so a change in kvplan's figures cannot leave the README behind
    import shlex

    args = shlex.split(cmd)[1:]
    args = [str(ROOT / a) if (ROOT / a).exists() and "/" in a else a for a in args]
    args = [str(readme_dir / a) if a.endswith(".yaml") and not os.path.isabs(a) else a for a in args]
    want = [ln.rstrip() for ln in shown if ln.strip()]
    seen = []
    for width in (100, 80, 120):
        monkeypatch.setenv("COLUMNS", str(width))
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            main(args)
        got = [ln.rstrip() for ln in out.getvalue().splitlines() if ln.strip()]
        if got == want:
            return
        seen.append(got)
    diff = "\n".join(difflib.unified_diff(want, seen[0], "README", "now (100 columns)", lineterm="", n=1))
    pytest.fail(f"README output of `{cmd}` is out of date:\n{diff}")


def test_readme_api_capacity_figures():
    # the README's `c.num_blocks, c.max_concurrency` for Llama-3-8B fp8 on an H100 at 8,192 tokens: blocks of 16
    # tokens x 65,536 B (32 layers x 8 KV heads x 128 x 2 (K, V) x 1 B) = 1 MiB, so the pool's bytes // 2**20; a
    # sequence of 8,192 tokens takes 512 blocks
    import re

    text = (ROOT / "README.md").read_text()
    blocks, conc = re.search(r"c\.num_blocks, c\.max_concurrency, c\.log_lines +# \((\d+), ([\d.]+)\.\.\.", text).groups()
    c = kvplan.capacity(kvplan.load_model("llama3-8b"), kvplan.load_gpu("h100"), "fp8", max_model_len=8192)
    assert c.available_kv_bytes // (16 * 32 * 8 * 128 * 2) == c.num_blocks == int(blocks)
    assert f"{c.num_blocks / 512:.2f}" == conc


def test_no_install_advice_names_kvplan_on_the_package_index():
    # kvplan is installed from a checkout or a wheel; `pip install kvplan` or 'kvplan[plot]' would fetch another
    # project from the index, so advice names the dependency itself (matplotlib, huggingface_hub, torch triton)
    import re

    sources = [ROOT / "README.md", *sorted((ROOT / "kvplan").rglob("*.py"))]
    for path in sources:
        text = path.read_text()
        assert not re.search(r"pip install +['\"]?kvplan(\\?\[|\s|$)", text), path


def test_readme_gates_file_is_the_example_file():
    # the YAML shown is examples/gates.yaml as it is: the output under it is that file's (its TPOT row included)
    import re

    shown = re.search(r"\(`examples/gates.yaml`\):\n\n```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert shown and shown.group(1) == (ROOT / "examples" / "gates.yaml").read_text()


def test_readme_gpt_oss_failures_are_the_summarys():
    # the README's account of the two gpt-oss-20b warm-up failures quotes what `log --summary` says of them
    import re

    from tests.test_options import _run

    logs = sorted(str(p) for p in (ROOT / "tests/fixtures/logs/vllm-0.19-h100").glob("openai-gpt-oss-20b*.log"))
    code, out, _ = _run(["log", *logs, "--configs", "tests/fixtures/configs", "--summary"])
    said = " ".join(out.split())
    left = re.findall(r"it needs ([0-9.]+) GiB and ([0-9.]+) GiB are left", said)
    assert code == 0 and len(left) == 2
    readme = " ".join((ROOT / "README.md").read_text().split())
    (need, tp1), (_, tp2) = left
    assert f"kvplan predicts both (at TP 1 the warm-up needs {need} GiB and {tp1} GiB are left" in readme
    assert f"at TP 2, {tp2} GiB are left)" in readme


def test_a_benchmark_below_its_target_says_fail(capsys, monkeypatch):
    # 627,117 rows/s against a target of 1,000,000 is a failure, and the benchmark's output says so in words
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.delenv(mod.ENV, raising=False)
    assert mod.report(627_117, 1_000_000, "rows/s", higher_is_better=True, what="kvplan.sweep") is False
    assert capsys.readouterr().out == "FAIL: kvplan.sweep: 627,117 rows/s, target at least 1,000,000\n"
    assert mod.report(0.2, 0.5, "s", higher_is_better=False, what="start-up") is True
    assert capsys.readouterr().out.startswith("PASS: start-up: 0.2 s, target at most 0.5")
