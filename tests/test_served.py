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


SPARSE = Path(__file__).parent / "fixtures/hf-corpus/deepseek-ai--DeepSeek-V3.2_config.json"


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("name", sorted(CATALOG))
def test_a_format_named_that_vllm_cannot_run_here_is_marked(name, gpu):
    """A what-if is marked, and it is a what-if exactly where no attention backend is planned: the catalog's word
    (a platform vLLM has no backend for) and the backends' (none of this release stores it on this GPU) never
    disagree into a what-if that names a backend, or a served format without one."""
    f, g = CATALOG[name], load_gpu(gpu)
    # the DeepSeek sparse-attention latents are stored only by the sparse-MLA backends: planned on DeepSeek-V3.2
    m = str(SPARSE) if name.endswith("_ds_mla") else load_model("deepseek-v3" if f.applies_to == "mla" else "qwen3-32b")
    d = DeploymentArgs(model=m, gpu=gpu, kv_cache_dtype=name, tp=8 if f.applies_to == "mla" else 1).resolve()
    marked = any(n.startswith("what-if:") for n in d.notes)
    assert marked == (d.unserved is not None) == (d.attention_backend.name == "none"), (d.notes, d.attention_backend)
    if not f.served_on("vllm", g):
        assert marked, d.notes


@pytest.mark.parametrize("name, gpu, served", [
    ("kivi2", "h200", False), ("mxfp8", "h200", False), ("fp4_mx_block16", "h200", False),
    ("fp8_inc", "h200", False), ("fp8_e4m3", "a100-sxm-80gb", True), ("fp8_e5m2", "mi300x", True),
    # a vLLM catalog entry names the platform only: which CUDA GPUs store nvfp4 or fp8_ds_mla, in which release,
    # is the attention backends' (test_vllm_serves_by_release below)
    ("nvfp4", "h100", True), ("nvfp4", "b200", True), ("nvfp4", "mi300x", False), ("fp8_ds_mla", "a100-sxm-80gb", True),
    # TurboQuant is in platforms/rocm.py's priority list from 0.20 (_get_backend_priorities appends TURBOQUANT)
    ("turboquant_k8v4", "mi300x", True),
])
def test_vllm_support(name, gpu, served):
    assert CATALOG[name].served_on("vllm", load_gpu(gpu)) is served


@pytest.mark.parametrize("name, gpu, version, backend", [
    # nvfp4 (vllm/config/cache.py CacheDType from 0.20). 0.20: FlashInfer does not list it; FlashAttention's
    # supports_kv_cache_dtype takes it on FA3 (is_quantized_kv_cache -> flash_attn_supports_fp8) but its forward
    # views the cache through get_fp8_dtype_for_flashattn, which raises for it: no backend anywhere
    ("nvfp4", "h100", "0.20", None), ("nvfp4", "b200", "0.20", None),
    # 0.25 to 0.30: FlashInferBackend.supports_kv_cache_dtype takes it on is_device_capability_family(100) only
    ("nvfp4", "b200", "0.25", "FLASHINFER"), ("nvfp4", "h100", "0.25", None), ("nvfp4", "h100", "0.30", None),
    ("nvfp4", "rtx-5090", "0.30", None),
    # 0.33: _nvfp4_kv_on_fa2 adds families 80, 90 and 120 (nvfp4 only; nvfp4_4over6 stays TRTLLM's, 10.x)
    ("nvfp4", "a100-sxm-80gb", "0.33", "FLASHINFER"), ("nvfp4", "h100", "0.33", "FLASHINFER"),
    ("nvfp4", "rtx-5090", "0.33", "FLASHINFER"), ("nvfp4", "b200", "0.33", "FLASHINFER"),
    ("nvfp4_4over6", "h100", "0.33", None), ("nvfp4_4over6", "b200", "0.33", "FLASHINFER"),
    # no ROCm backend stores NVFP4 (ROCM_ATTN, TRITON_ATTN, TURBOQUANT list none of it)
    ("nvfp4", "mi300x", "0.33", None),
    # TurboQuant on ROCm: platforms/rocm.py _get_backend_priorities lists ROCM_ATTN, TRITON_ATTN, TURBOQUANT from
    # 0.20; TurboQuantAttentionBackend keeps AttentionBackend.supports_compute_capability (every GPU)
    ("turboquant_k8v4", "mi300x", "0.20", "TURBOQUANT"), ("turboquant_3bit_nc", "mi300x", "0.33", "TURBOQUANT"),
    ("turboquant_k8v4", "h100", "0.20", "TURBOQUANT"),
    # the per-token-head modes: 0.20's selector takes FlashAttention for them on FA3 (9.x), which fails at start;
    # on 8.x FA2 refuses them and Triton (supported_kv_cache_dtypes) stores them; 0.25 on, Triton everywhere
    ("int8_per_token_head", "h100", "0.20", None), ("int8_per_token_head", "a100-sxm-80gb", "0.20", "TRITON_ATTN"),
    ("int8_per_token_head", "h100", "0.25", "TRITON_ATTN"), ("fp8_per_token_head", "mi300x", "0.20", "TRITON_ATTN"),
    # fp8_e5m2 on 9.x: 0.19 and 0.20 pick FlashAttention (FA3), which cannot read it; 0.25 lists fp8/fp8_e4m3 only
    ("fp8_e5m2", "h100", "0.19", None), ("fp8_e5m2", "h100", "0.25", "FLASHINFER"),
])
def test_vllm_serves_by_release(name, gpu, version, backend):
    """Whether vLLM runs a dtype on a GPU in a release, and on which backend, as a deployment resolves it."""
    d = DeploymentArgs(model=load_model("llama3-8b"), gpu=gpu, kv_cache_dtype=name, engine_version=version).resolve()
    if backend is None:
        assert d.unserved is not None and d.attention_backend.name == "none", d.notes
    else:
        assert d.unserved is None and d.attention_backend.name == backend, d.unserved


# One GPU of each family the catalog has, by compute capability (ROCm: MI300X, whose capability is a gfx name)
FAMILIES = {"sm80": "a100-sxm-80gb", "sm89": "l40s", "sm90": "h100", "sm100": "b200", "sm120": "rtx-5090",
            "rocm": "mi300x"}
# Where vLLM's CacheDType has a name that no backend of that release stores on any GPU, read from its source:
NO_BACKEND = {
    # 0.20 lists nvfp4 but FlashInferBackend does not (FlashInferMetadataBuilder raises "nvfp4 KV cache is not yet
    # supported"), and FlashAttention, which its selector takes on FA3, raises in get_fp8_dtype_for_flashattn
    ("0.20", "nvfp4"),
}
# Octave's backend takes head 256 only (rocm_octave_attn.py get_supported_head_sizes): Qwen3-Next's heads are 256,
# its rotary dims 64 (partial_rotary_factor 0.25), a multiple of 64 as OctaveFormat needs
HEAD_256 = "tests/fixtures/hf-corpus/Qwen--Qwen3-Next-80B-A3B-Instruct_config.json"


def _stores(name: str, gpu, release: str) -> bool:
    """Whether some attention backend of `release` stores `name` on `gpu` for a model of the layout it applies to
    (--attention-backend NAME validated alone, for every backend of the release)."""
    from kvplan.errors import KvplanError
    from kvplan.rules.vllm_backends import backend_for, backend_names, facts_of

    f = CATALOG[name]
    models = [SPARSE] if name.endswith("_ds_mla") else [HEAD_256] if f.family == "octave" else \
        {"mha": ["llama3-8b"], "mla": ["deepseek-v3"], "both": ["llama3-8b", "deepseek-v3"]}[f.applies_to]
    platform = "rocm" if gpu.vendor == "amd" else "cuda"
    for m in models:
        facts = facts_of(load_model(str(m)), tp=8 if m != "llama3-8b" else 1)
        for b in backend_names(release):
            try:
                backend_for(facts, gpu.compute_capability, name, release, b, platform=platform)
                return True
            except KvplanError:
                continue
    return False


def test_catalog_and_backend_table_agree():
    """The attention backends (kvplan.rules.vllm_backends) decide which GPUs store a dtype in each release; the
    catalog's vLLM entries name the platforms and must not contradict them, for every vLLM release kvplan plans
    and every GPU family: (1) a vLLM entry on CUDA or ROCm carries no capability or release bound of its own;
    (2) where a backend stores the dtype, the catalog serves it there; (3) every platform the catalog names has a
    release and a GPU family whose backends store it; (4) a dtype the release has (not in cache_dtypes_missing) is
    stored somewhere by that release's backends, else it is in NO_BACKEND with the reason."""
    from kvplan.rules.vllm import VLLM
    from kvplan.rules.vllm_backends import read_release

    gpus = {fam: load_gpu(g) for fam, g in FAMILIES.items()}
    claimed = {(f.name, x.platform) for f in CATALOG.values() for x in f.serves if x.engine == "vllm"}
    backed, unbacked = set(), set()
    for f in CATALOG.values():
        for x in f.serves:
            if x.engine == "vllm" and x.platform in ("cuda", "rocm"):
                assert (x.min_cc, x.cc_majors, x.until) == ((0, 0), (), None), (f.name, x)  # (1)
    for version, rules in VLLM.items():
        release = read_release(version)
        for f in CATALOG.values():
            if f.name in rules.cache_dtypes_missing or f.name.startswith("custom"):
                continue
            somewhere = False
            for fam, g in gpus.items():
                if _stores(f.name, g, release):
                    somewhere = True
                    backed.add((f.name, "rocm" if fam == "rocm" else "cuda"))
                    assert f.served_on("vllm", g), (version, fam, f.name)  # (2)
            if not somewhere and any(x.engine == "vllm" and x.platform != "hpu" for x in f.serves):
                unbacked.add((version, f.name))
    assert {c for c in claimed if c[1] != "hpu"} == backed  # (3): and (2) over all releases
    assert unbacked == NO_BACKEND  # (4)


@pytest.mark.parametrize("name, version, first", [
    # vllm/config/cache.py CacheDType: 0.19.0 has auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2, fp8_inc and
    # fp8_ds_mla; 0.20.0 adds turboquant_*, int8/fp8_per_token_head and nvfp4; 0.25.0 int4_per_token_head; 0.28.0
    # nvfp4_4over6; 0.30.0 nvfp4_ds_mla
    ("turboquant_k8v4", "0.19", "0.20"), ("int8_per_token_head", "0.19", "0.20"),
    ("fp8_per_token_head", "0.19", "0.20"), ("nvfp4", "0.19", "0.20"), ("int4_per_token_head", "0.20", "0.25"), ("nvfp4_4over6", "0.26", "0.28"),
])
def test_a_dtype_the_release_lacks_is_refused_naming_the_release_that_adds_it(cli, name, version, first):
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "-d", name, "--engine-version", version)
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1 and "Traceback" not in r.err, r.err
    assert f"KV cache dtype '{name}' does not exist in vLLM {version}" in r.err
    assert f"vLLM adds it in {first} (choose --engine-version {first} or later)" in r.err


def test_sglang_only_formats():
    h200, b200 = load_gpu("h200"), load_gpu("b200")
    # mxfp8: SM100 and later (sglang 0.5.23 arg_groups/kv_cache_hook.py handle_mxfp8_kv_cache_compatibility)
    assert not CATALOG["mxfp8"].served_on("sglang", h200) and CATALOG["mxfp8"].served_on("sglang", b200)
    assert not CATALOG["fp4_mx_block16"].served_on("sglang", h200)  # FP4: Blackwell
    assert CATALOG["fp4_mx_block16"].served_on("sglang", b200)
    assert CATALOG["mxfp8"].unserved("vllm", b200) == "what-if: vLLM does not serve mxfp8; SGLang does on B200"
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


def test_a_what_if_is_marked_in_every_table_and_json_row(cli):
    """KIVI is a paper format no engine serves: planned when named, and marked in each command's table, JSON rows
    and sweep column; a throughput comparison of what-ifs alone names no winner."""
    import json

    why = "what-if: no engine serves kivi2 (a paper format)"
    r = cli("crossover", "llama3-8b", "-d", "kivi2", "--gpu", "h100")
    assert r.code == 0 and "kivi2 (what-if)" in r.out and f"note: kivi2: {why}" in r.out
    assert "auto (bf16) (what-if)" not in r.out and "auto: what-if" not in r.out  # the baseline is served
    body = json.loads(cli("crossover", "llama3-8b", "-d", "kivi2", "--gpu", "h100", "--json").out)
    assert body["deployment"]["what_if"] == why
    r = cli("capacity", "llama3-8b", "-d", "kivi2", "-d", "fp8", "--gpu", "h100")
    assert "kivi2 (what-if)" in r.out and "fp8 (what-if)" not in r.out
    body = json.loads(cli("throughput", "llama3-8b", "-d", "kivi2,auto", "--gpu", "h100", "--isl", "1k", "--osl", "1k",
                          "-n", "8", "--json").out)
    assert [row.get("what_if") for row in body["rows"]] == [why, None]
    assert body["winner"] == "auto"
    r = cli("throughput", "llama3-8b", "-d", "kivi2", "--gpu", "h100", "--isl", "1k", "--osl", "1k", "-n", "8")
    assert "kivi2 (what-if)" in r.out
    assert "verdict: no verdict: no engine serves kivi2 here (what-if)" in r.out
    body = json.loads(cli("sweep", "-m", "llama3-8b", "-g", "h100", "-d", "kivi2,fp8", "--format", "json").out)
    assert [row["what_if"] for row in body] == [why, None]
