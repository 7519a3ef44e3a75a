"""Capacity gates: pass, fail, malformed; JUnit XML, GitHub summary and annotations; baseline regressions."""

import json
import xml.etree.ElementTree as ET

import pytest

SATISFIABLE = """
  - name: chat-8b-fp8
    model: llama3-8b
    kv_cache_dtype: fp8
    max_model_len: 8192
    require:
      min_concurrency: 100      # fp8 on an H100 at 0.92: 103.65 sequences of 8,192 tokens
      max_step_ms: {batch: 32, context: 8192, ms: 25}
"""
UNSATISFIABLE = """
  - name: chat-8b-bf16
    model: llama3-8b
    max_model_len: 8192
    require:
      min_concurrency: 100      # bf16 holds only 51.82
"""
# the seeds' flat 6 GiB allowance keeps the figures in the comments hand-checkable
HEADER = "defaults: {gpu: h100, engine: vllm, activation_gib: 6}\ngates:\n"


def write(tmp_path, text, name="gates.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_failing_gate_exits_1_and_writes_junit(cli, tmp_path):
    path = write(tmp_path, HEADER + SATISFIABLE + UNSATISFIABLE)
    junit = tmp_path / "gates.xml"
    r = cli("gate", path, "--junit", str(junit))
    assert r.code == 1
    assert "chat-8b-bf16" in r.err and "max concurrency" in r.err and "51.82" in r.err
    assert "chat-8b-fp8" not in r.err
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["chat-8b-fp8"].find("failure") is None
    failure = cases["chat-8b-bf16"].find("failure")
    assert failure is not None and "max concurrency" in failure.get("message")


def test_passing_gates_exit_0(cli, tmp_path):
    r = cli("gate", write(tmp_path, HEADER + SATISFIABLE))
    assert r.code == 0, r.err
    assert "1 of 1 gates passed" in r.out


@pytest.mark.parametrize("body, says", [
    ("gates: [\n", "not valid YAML"),
    ("defaults: {gpu: h100}\n", "field 'gates': Field required"),
    (HEADER + "  - name: x\n    model: llama3-8b\n    require: {min_concurency: 3}\n",
     "gate 'x': field 'require.min_concurency' is not allowed (did you mean min_concurrency"),
    (HEADER + "  - name: x\n    model: llama3-8b\n    tpp: 2\n    require: {min_concurrency: 3}\n",
     "gate 'x': field 'tpp' is not allowed"),
    (HEADER + "  - name: x\n    model: llama3-8b\n    tp: two\n    require: {min_concurrency: 3}\n",
     "gate 'x': field 'tp'"),
    (HEADER + "  - name: x\n    model: llama3-8b\n    require: {}\n", "require names no figure"),
    (HEADER + "  - name: x\n    require: {min_concurrency: 3}\n", "field 'model' is missing"),
    (HEADER + "  - model: llama3-8b\n    require: {min_concurrency: 3}\n", "gate #1: field 'name'"),
    (HEADER + "  - name: x\n    model: llama3-9b\n    require: {min_concurrency: 3}\n",
     "gate 'x': unknown model 'llama3-9b'"),
    (HEADER + "  - name: x\n    model: llama3-8b\n    engine: tgi\n    require: {min_concurrency: 3}\n",
     "field 'engine'"),
    ("- 1\n- 2\n", "expected a mapping"),
])
def test_malformed_gates_exit_2(cli, tmp_path, body, says):
    r = cli("gate", write(tmp_path, body))
    assert r.code == 2, r.out
    assert says in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


def test_github_summary_and_annotations(cli, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    r = cli("gate", write(tmp_path, HEADER + SATISFIABLE + UNSATISFIABLE))
    assert r.code == 1
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "| chat-8b-bf16 | max concurrency" in text and "**fail**" in text
    assert "::error title=kvplan gate::chat-8b-bf16: max concurrency" in r.out


def test_json_and_baseline_regression(cli, tmp_path):
    fp8 = HEADER + SATISFIABLE
    r = cli("gate", write(tmp_path, fp8), "--json")
    assert r.code == 0
    before = json.loads(r.out)
    assert before["passed"] and before["gates"][0]["checks"][0]["measured"] == pytest.approx(103.646484375)
    base = tmp_path / "base.json"
    base.write_text(r.out)
    # Same gate, with a utilization that loses ~2% of the pool: still above 100 sequences, but a regression
    lower = fp8.replace("max_model_len: 8192", "max_model_len: 8192\n    gpu_memory_utilization: 0.91")
    r = cli("gate", write(tmp_path, lower, "lower.yaml"), "--baseline", str(base))
    assert r.code == 1 and "regressed" in r.err
    r = cli("gate", write(tmp_path, lower, "lower.yaml"), "--baseline", str(base), "--max-regression", "5")
    assert r.code == 0, r.err
    (tmp_path / "bad.json").write_text("{")
    r = cli("gate", write(tmp_path, fp8), "--baseline", str(tmp_path / "bad.json"))
    assert r.code == 2 and "not valid JSON" in r.err


def test_example_file_passes(cli):
    from pathlib import Path

    r = cli("gate", str(Path(__file__).resolve().parents[1] / "examples" / "gates.yaml"))
    assert r.code == 0, r.err


def test_python_api_report_frame():
    import kvplan

    report = kvplan.gate({"defaults": {"gpu": "h100", "activation_gib": 6}, "gates": [
        {"name": "a", "model": "llama3-8b", "kv_cache_dtype": "fp8", "require": {"min_kv_tokens": 800000}}]})
    frame = report.to_frame()
    assert report.passed and list(frame["gate"]) == ["a"] and frame["measured"][0] == 849_072


def test_gate_on_a_gpu_without_step_times_names_the_gate_and_the_calibration_key(cli, tmp_path):
    # L4 has no bundled step-time fits: the throughput requirement cannot be priced; the gate and the requirement
    # are named, and the advice is the gate's own calibration key (gate has no --calibration option)
    path = write(tmp_path, """
gates:
  - name: tput2
    model: llama3-8b
    gpu: l4
    require:
      min_throughput_per_gpu: {isl: 1024, osl: 128, tokens_per_s: 10}
""")
    r = cli("gate", path)
    assert r.code == 2 and r.err.count("\n") == 1
    assert r.err.startswith(f"kvplan: error: {path}: gate 'tput2': require.min_throughput_per_gpu needs step times")
    assert "`calibration: PROFILE.yaml`" in r.err and "--calibration" not in r.err


def test_truncated_json_gates_file_reports_the_json_parsers_line(cli, tmp_path):
    # one line of JSON cut off after a comma: line 1, in the JSON parser's words (as for a model file)
    path = write(tmp_path, '{"gates": [{"name": "a", ', "trunc.json")
    r = cli("gate", path)
    assert r.code == 2 and r.err.count("\n") == 1
    assert r.err == f"kvplan: error: {path}: line 1: not valid JSON: Expecting property name enclosed in double quotes\n"
