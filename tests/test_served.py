"""Which engine serves which KV format on which GPU: a property of each catalog entry (formats.Serves, each
citing its engine source), used where `-d all` is expanded and by the verdicts."""

from pathlib import Path

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
    # the DeepSeek sparse-attention latents are stored only by the sparse-MLA backends: planned on DeepSeek-V3.2
    sparse = Path(__file__).parent / "fixtures/hf-corpus/deepseek-ai--DeepSeek-V3.2_config.json"
    m = str(sparse) if name.endswith("_ds_mla") else load_model("deepseek-v3" if f.applies_to == "mla" else "qwen3-32b")
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


def test_sglang_fp4_e2m1_served_up_to_0_5_15_and_refused_after():
    """SGLang 0.5.15 stores fp4_e2m1 in memory_pool.py MHATokenToKVPoolFP4; from 0.5.16 configure_kv_cache_dtype
    refuses it as deprecated (server_args still lists it in 0.5.20). Llama-3-8B (32 layers, 8 KV heads of 128):
    per layer and side 8 x 128 / 2 = 512 B of e2m1 pairs + 8 x 128 / 16 = 64 scale bytes = 576; K and V over 32
    layers: 2 x 576 x 32 = 36,864 B per token, fp4_mx_block16's bytes."""
    from kvplan.errors import KvplanError
    from kvplan.plan.sglang_pool import cell_bytes

    f, b200 = CATALOG["fp4_e2m1"], load_gpu("b200")
    assert f.bytes_per_token_per_kv_head(128) == 144 == CATALOG["fp4_mx_block16"].bytes_per_token_per_kv_head(128)
    assert f.served_on("sglang", b200, "0.5.15") and not f.served_on("sglang", b200, "0.5.16")
    assert not f.served_on("sglang", b200)  # the newest release, whose rules kvplan plans with by default
    assert not f.served_on("sglang", load_gpu("h200"), "0.5.15")  # FP4: Blackwell
    m = load_model("llama3-8b")
    assert cell_bytes(m, f, 1)[0] == 36_864
    d = DeploymentArgs(model=m, gpu="b200", engine="sglang", kv_cache_dtype="fp4_e2m1", engine_version="0.5.15")
    assert not any(n.startswith("what-if:") for n in d.resolve().notes)
    for version in (None, "0.5.16", "0.5.20"):
        with pytest.raises(KvplanError, match="refuses --kv-cache-dtype fp4_e2m1 at start.*-d fp4_mx_block16"):
            DeploymentArgs(model=m, gpu="b200", engine="sglang", kv_cache_dtype="fp4_e2m1",
                           engine_version=version).resolve()
    # DeepSeek-V3's latent (512 + 64) in MLATokenToKVPoolFP4: 576 / 2 + 576 / 16 = 324 B per layer
    assert cell_bytes(load_model("deepseek-v3"), f, 8)[0] == 324 * 61
    assert f.unserved("vllm", b200) == "what-if: vLLM does not serve fp4_e2m1; SGLang up to 0.5.15 does on B200"


@pytest.mark.parametrize("gpu", ["a100", "h100", "b200", "mi300x"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("model", ["llama-3-8b", "deepseek-v3"])
def test_every_format_is_served_marked_or_refused(model, engine, gpu):
    """Every catalog format, on each engine and GPU (a ROCm one among them): refused, or planned with the reason the
    engine cannot run it carried and said (a what-if), or run by the engine (under vLLM on an attention backend its
    selector picks); -d all keeps only the last, and a throughput verdict over them names none of the others."""
    from kvplan.app.options import _served_here
    from kvplan.errors import KvplanError

    m = load_model(model)
    planned = []
    for name in sorted(CATALOG):
        try:
            d = DeploymentArgs(model=m, gpu=gpu, engine=engine, kv_cache_dtype=name).resolve()
        except KvplanError:
            continue
        planned.append(d)
        if d.unserved:
            assert d.unserved.startswith("what-if") and any("what-if" in n for n in d.notes), (name, d.notes)
        elif engine == "vllm":
            assert d.attention_backend is not None and d.attention_backend.name != "none", name
    assert planned and all(d.unserved is None for d in _served_here(planned, ["all"]))
    assert len({d.kv.name for d in _served_here(planned, ["all"])}) == len(_served_here(planned, ["all"]))


def test_all_keeps_a_custom_format_named_beside_it(cli):
    """A format named beside 'all' is planned whatever serves it, a custom one too (its name has commas of its own)."""
    import json

    r = cli("crossover", "llama3-8b", "-d", "all,kivi2", "-d", "custom:k_bits=4,v_bits=4", "--json")
    names = [row["dtype"] for row in json.loads(r.out)]
    assert "kivi2" in names and "custom:k_bits=4,v_bits=4" in names
