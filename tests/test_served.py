"""Which engine serves which KV format on which GPU: a property of each catalog entry (formats.Serves, each
citing its engine source), used where `-d all` is expanded and by the verdicts."""

import pytest

from kvplan.app.cli import _formats_for
from kvplan.deployment import DeploymentArgs
from kvplan.specs.catalog import load_gpu, load_model
from kvplan.specs.kv_formats import CATALOG

GPUS = ["a100-sxm-80gb", "h100", "b200", "mi300x"]


def test_every_entry_cites_its_source():
    for f in CATALOG.values():
        assert f.serves or f.what_if, f.name
        assert all(x.source for x in f.serves), f.name


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_all_means_what_the_engine_serves_here(engine, gpu):
    m = load_model("qwen3-32b")
    fmts = _formats_for(m, ["all"], args=DeploymentArgs(model=m, gpu=gpu, engine=engine))
    g = load_gpu(gpu)
    assert fmts and all(f.served_on(engine, g) for f in fmts)
    left_out = {f.name for f in CATALOG.values()} - {f.name for f in fmts}
    assert {"kivi2", "kivi4", "fp8_inc"} <= left_out  # a paper format, and Gaudi's


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("name", sorted(CATALOG))
def test_a_format_named_that_vllm_cannot_run_here_is_marked(name, gpu):
    f, g = CATALOG[name], load_gpu(gpu)
    m = load_model("deepseek-v3" if f.applies_to == "mla" else "qwen3-32b")
    d = DeploymentArgs(model=m, gpu=gpu, kv_cache_dtype=name, tp=8 if f.applies_to == "mla" else 1).resolve()
    marked = any(n.startswith("what-if:") for n in d.notes)
    assert marked == (not f.served_on("vllm", g)), d.notes


@pytest.mark.parametrize("name, gpu, served", [
    ("kivi2", "h200", False), ("mxfp8", "h200", False), ("fp4_mx_block16", "h200", False),
    ("fp8_inc", "h200", False), ("fp8_e4m3", "a100-sxm-80gb", True), ("nvfp4", "h100", False),
    ("nvfp4", "b200", True), ("fp8_ds_mla", "a100-sxm-80gb", False), ("fp8_ds_mla", "h100", True),
    ("fp8_e5m2", "mi300x", True), ("turboquant_k8v4", "mi300x", False),
])
def test_vllm_support(name, gpu, served):
    assert CATALOG[name].served_on("vllm", load_gpu(gpu)) is served


def test_sglang_only_formats():
    h200, b200 = load_gpu("h200"), load_gpu("b200")
    assert CATALOG["mxfp8"].served_on("sglang", h200)
    assert not CATALOG["fp4_mx_block16"].served_on("sglang", h200)  # FP4: Blackwell
    assert CATALOG["fp4_mx_block16"].served_on("sglang", b200)
    assert CATALOG["mxfp8"].unserved("vllm", h200) == "what-if: vLLM does not serve mxfp8; SGLang does on H200-SXM-141GB"
    assert CATALOG["kivi2"].unserved("vllm") == "what-if: no engine serves kivi2 (a paper format)"


def test_throughput_verdict_never_names_a_what_if():
    from kvplan.deployment import deployments
    from kvplan.plan.throughput import throughput_of

    m = load_model("qwen3-32b")
    args = DeploymentArgs(model=m, gpu="h200")
    ds = deployments(args, _formats_for(m, ["kivi2,fp8"], args=args), needs_memory=True)
    r = throughput_of(ds, 2048, 512, [8, 32], 30.0, None)
    assert r.winner == "fp8"
    assert any("kivi2: what-if: no engine serves kivi2" in n and "left out of the verdict" in n for n in r.notes)
