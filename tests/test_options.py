"""No option is silently ignored: every option of every command, under each engine where the command takes one,
either changes what the command does (its output, its exit code or the files it writes) or is refused with one
line and exit code 2. A new option without an entry here fails the test."""

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout

import pytest
import typer

from kvplan.app.cli import app, main

LOG = "tests/fixtures/logs/vllm-v1-0.33-llama31-8b-h100.log"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("options")
    code, _, err = _run(["log", LOG, "--gpu", "h100", "--save-profile", str(d / "profile.yaml")])
    assert code == 0, err
    (d / "cal.yaml").write_text(
        "schema: kvplan-calibration/1\n"
        "device: {name: H100-SXM5-80GB, memory_total_bytes: 85000000000}\n"
        "peak_bandwidth_bytes_per_s: 3.35e+12\n"
        "families:\n"
        "  gemv_bf16: {t0_s: 5.0e-6, eta: 0.8}\n"
        "  decode_bfloat16: {t0_s: 8.0e-6, eta: 0.7}\n"
        "  decode_fp8_e4m3: {t0_s: 9.0e-6, eta: 0.6}\n")
    code, out, _ = _run(["gate", "examples/gates.yaml", "--json"])
    report = json.loads(out)
    for g in report["gates"]:  # a baseline 3% better than now: a regression at the default 1%, none at 5%
        for c in g["checks"]:
            c["measured"] = c["measured"] * (1.03 if c["kind"] == "min" else 0.97)
    (d / "baseline.json").write_text(json.dumps(report))
    return d


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


# command -> (the base invocation, {option: value to add}); None as the value: a flag
BASE = {
    "crossover": ["crossover", "llama-3.1-8b", "-d", "fp8", "--gpu", "h100", "--json"],
    "capacity": ["capacity", "llama-3.1-8b", "--gpu", "h100", "-d", "fp8", "--max-model-len", "8192", "--json"],
    "sweep": ["sweep", "-m", "llama3-8b", "-g", "h100", "-d", "fp8"],
    "plot capacity": ["plot", "capacity", "llama3-8b", "--gpu", "h100", "--json"],
    "plot crossover": ["plot", "crossover", "llama3-8b", "--json"],
    "gate": ["gate", "examples/gates.yaml"],
    "log": ["log", LOG, "--gpu", "h100", "--json"],
    "measure": ["measure", "--dry-run"],
    "formats": ["formats", "--json"],
    "quality": ["quality", "--synthetic", "-d", "fp8", "--context", "256", "--json"],
    "models": ["models", "--json"],
    "models show": ["models", "show", "llama3-8b"],
    "gpus": ["gpus", "--json"],
    "gpus show": ["gpus", "show", "h100"],
}

DEPLOYMENT_VALUES = {
    "--gpu": "a100", "--tp": "2", "--gpu-memory-utilization": "0.8", "--max-model-len": "4096",
    "--kv-cache-dtype": "auto", "--block-size": "32", "--activation-gib": "6", "--non-torch-gib": "1",
    "--attention-backend": "FLASHINFER",
    "--cudagraph-gib": "1", "--max-num-seqs": "64", "--enforce-eager": None, "--entrypoint": "llm",
    "--language-model-only": None, "--mamba-ssm-cache-dtype": "float16",
    "--gpu-memory-gib": "70", "--free-memory-gib": "60", "--kv-cache-memory": "40", "--weight-dtype": "fp8",
    "--kv-cache-dtype-skip-layers": "0,1", "--max-num-batched-tokens": "4096", "--engine": "sglang",
    "--engine-version": "0.20", "--pp": "2", "--dcp": "2", "--num-gpu-blocks-override": "1000",
    "--profile": "{profile}", "--mem-fraction-static": "0.8", "--page-size": "16", "--calibration": "{cal}",
    "--json": None,
    # data and expert parallelism (the base model is dense: the MoE options are refused there; tests/test_parallel.py
    # holds each to its effect on a MoE model)
    "--data-parallel-size": "2", "--data-parallel-size-local": "1", "--enable-expert-parallel": None,
    "--all2all-backend": "deepep_low_latency", "--enable-eplb": None, "--num-redundant-experts": "8",
    "--dp-size": "2", "--enable-dp-attention": None, "--ep-size": "2", "--moe-a2a-backend": "deepep",
    "--ep-num-redundant-experts": "8", "--moe-dense-tp-size": "1", "--enable-dp-lm-head": None,
    "--max-running-requests": "4", "--disable-radix-cache": None,
}
VALUES = {
    "crossover": {**DEPLOYMENT_VALUES, "--context": "4096", "--batch": "8", "--weight-read": "all",
                  "--baseline": "fp8"},
    "capacity": DEPLOYMENT_VALUES,
    "sweep": {**DEPLOYMENT_VALUES, "--model": "qwen3-8b", "--gpu": "a100", "--max-model-len": "4096",
              "--batch": "8", "--context": "4096", "--output": "{dir}/sweep.csv", "--format": "markdown",
              "--columns": "model,num_blocks", "--weight-read": "all"},
    "plot capacity": {**DEPLOYMENT_VALUES, "--output": "{dir}/cap.svg"},
    "plot crossover": {**DEPLOYMENT_VALUES, "--batch": "8", "--context": "4096", "--weight-read": "all",
                       "--output": "{dir}/x.svg"},
    "gate": {"--junit": "{dir}/junit.xml", "--json": None, "--baseline": "{baseline}", "--max-regression": "5"},
    "log": {"--model": "llama3-8b", "--gpu": "a100", "--save-profile": "{dir}/saved.yaml", "--json": None,
            "--configs": "tests/fixtures/configs", "--summary": None},
    "measure": {"--quick": None, "--dry-run": None, "--output": "{dir}/c.yaml", "--gpu": "a100", "--device": "cpu",
                "--validate": "llama3-8b", "--kv-cache-dtype": "fp8", "--batch": "4", "--context": "1024",
                "--layers": "2", "--calibration": "{cal}", "--json": None, "--probe": None,
                "--budget": "30"},
    "formats": {"--head-dim": "64", "--kv-lora-rank": "256", "--qk-rope-head-dim": "32", "--json": None,
                "--gpu": "a100", "--model": "llama3-8b", "--engine": "sglang", "--engine-version": "0.20"},
    "quality": {"--kv-cache-dtype": "int4_per_token_head", "--text": "{dir}/text.txt", "--dataset": "wikitext2",
                "--context": "512", "--device": "cuda", "--synthetic": None, "--kv-cache-dtype-skip-layers": "0,1",
                "--json": None},
    "models": {"--json": None},
    "models show": {"--json": None},
    "gpus": {"--json": None},
    "gpus show": {"--json": None},
}
ENGINES = {"capacity": [["--engine", "vllm"], ["--engine", "sglang"]]}


def _command(path: str):
    cmd = typer.main.get_command(app)
    for part in path.split():
        cmd = cmd.commands[part]
    return cmd


def _options(path: str) -> list[str]:
    """The long name of every option the command declares (help and hidden options included)."""
    out = []
    for p in _command(path).params:
        if p.param_type_name != "option" or "--help" in p.opts:
            continue
        out.append(next(o for o in p.opts if o.startswith("--")))
    return out


def test_every_option_has_a_value_here():
    for path in BASE:
        missing = [o for o in _options(path) if o not in VALUES[path]]
        assert not missing, f"{path}: no test value for {missing}"


def _state(argv, folder):
    code, out, err = _run(argv)
    written = sorted(p.name for p in folder.iterdir())
    return code, out, err, written


CASES = [(path, opt, engine) for path in BASE for opt in _options(path) for engine in ENGINES.get(path, [[]])
         if not (engine and opt == "--engine")]


@pytest.mark.parametrize("path, option, engine", CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_option_changes_the_result_or_is_refused(path, option, engine, files, tmp_path):
    value = VALUES[path][option]
    sub = {"dir": str(tmp_path), "profile": str(files / "profile.yaml"), "cal": str(files / "cal.yaml"),
           "baseline": str(files / "baseline.json")}
    base = BASE[path] + engine
    if option == "--baseline" or option == "--max-regression":
        base = base + (["--baseline", sub["baseline"]] if option == "--max-regression" else [])
    added = [option] + ([] if value is None else [value.format(**sub)])
    if value is None and option in base:  # a flag of the base invocation: compare with it left out
        base = [a for a in base if a != option]
    before = _state(base, tmp_path)
    after = _state(base + added, tmp_path)
    if after[0] == 2:
        assert after[2].startswith("kvplan: error: ") and after[2].count("\n") == 1, after[2]
        return
    assert after != before, f"{' '.join(base + added)} changed nothing"


def test_the_cases_cover_both_engines():
    assert sum(1 for _, _, e in CASES if e == ["--engine", "sglang"]) >= 25
    assert len(CASES) > 150
    assert os.path.exists(LOG)


def test_every_deployment_field_is_one_flag_and_one_gate_key():
    """A deployment option is declared once: `capacity` has a flag for each field of DeploymentArgs, a gate file a
    key for each, and nothing else."""
    from dataclasses import fields

    from kvplan.app.gates import Options
    from kvplan.deployment import DeploymentArgs
    from kvplan.deployment.options import flag

    # SGLang's scheduler settings shape the benchmark, not the pool: `throughput` takes them, `capacity` does not
    scheduler = {"enable_mixed_chunk", "max_prefill_tokens"}
    names = [f.name for f in fields(DeploymentArgs) if f.name != "model" and f.name not in scheduler]
    flags = set(_options("capacity")) - {"--json"}
    assert {flag(n) for n in names} == flags
    assert {flag(n) for n in scheduler} <= set(_options("throughput"))
    gate_keys = set(Options.model_fields) - {"model", "dtype", "weight_read", "baseline", "kv_cache_memory"}
    sglang_only = {"mem_fraction_static", "page_size", "dp_size", "enable_dp_attention", "ep_size", "moe_a2a_backend",
                   "ep_num_redundant_experts", "moe_dense_tp_size", "enable_dp_lm_head", "max_running_requests",
                   "disable_radix_cache"}
    assert gate_keys | {"kv_cache_memory_gib"} == set(names) - sglang_only


def test_throughput_takes_every_deployment_option():
    """`throughput` plans the same deployment as `capacity`: every deployment flag reaches it (each then honoured
    by the resolved deployment, or refused by it, as for capacity), beside its own benchmark options."""
    from dataclasses import fields

    from kvplan.deployment import DeploymentArgs
    from kvplan.deployment.options import flag

    deployment = {flag(f.name) for f in fields(DeploymentArgs) if f.name != "model"}
    own = {"--isl", "--osl", "--concurrency", "--tpot-ms", "--ttft-ms", "--percentile", "--num-prompts",
           "--request-rate", "--random-range-ratio", "--layout", "--json"}
    assert set(_options("throughput")) == deployment | own


@pytest.mark.parametrize("added", [["--block-size", "128"], ["--kv-cache-dtype-skip-layers", "0,1"],
                                   ["--max-num-seqs", "8"], ["--max-num-batched-tokens", "4096"],
                                   ["--gpu-memory-utilization", "0.5"], ["--num-gpu-blocks-override", "3000"],
                                   ["--enforce-eager"]])
def test_throughput_honours_deployment_options(cli, added):
    base = ["throughput", "llama-3.1-8b", "--gpu", "h100", "--isl", "2000", "--osl", "256", "-n", "64", "-d", "fp8",
            "--json"]
    before, after = cli(*base), cli(*base, *added)
    assert before.code == 0 and after.code == 0, after.err
    assert json.loads(after.out)["rows"] != json.loads(before.out)["rows"], f"{added} changed nothing"
