"""kvplan measure: the plan (anywhere), the no-GPU error, the fit, and the whole pipeline on the CPU under
Triton's interpreter (tiny sizes: a check of the plumbing, not a measurement)."""

import math
from pathlib import Path

import pytest

from kvplan.specs.calibration import (
    FAMILIES,
    MB,
    CalibrationProfile,
    fit_family,
    load_calibration,
    measure_plan,
    save_calibration,
)


def test_plan_sizes_and_duration():
    quick = measure_plan(True)
    assert {i.size_bytes for i in quick.items} == {8 * MB, 64 * MB, 256 * MB, 1024 * MB}
    assert {i.family for i in quick.items} == set(FAMILIES) and len(FAMILIES) == 18
    full = measure_plan(False)
    assert min(i.size_bytes for i in full.items) == 8 * MB and max(i.size_bytes for i in full.items) == 2048 * MB
    assert quick.flush_bytes >= 2 * 50 * MB  # the flush buffer is at least twice an H100's L2
    # on an H100 the quick run fits in 2 minutes and the full one in 10
    assert quick.expected_seconds() < 120 and full.expected_seconds() < 600
    capped = measure_plan(False, free_bytes=900 * MB)
    assert max(i.size_bytes for i in capped.items) <= 300 * MB and capped.notes


def test_fit_recovers_t0_and_eta():
    peak = 3.35e12
    pts = [(b, 5e-6 + b / (0.8 * peak), 0, 0) for b in (8 * MB, 64 * MB, 512 * MB)]
    f = fit_family("stream_read", pts, peak)
    assert f.t0_s == pytest.approx(5e-6, rel=1e-6) and f.eta == pytest.approx(0.8, rel=1e-9)
    assert f.seconds(1e9, peak, calls=2) == pytest.approx(2 * 5e-6 + 1e9 / (0.8 * peak))


def test_fractions_of_peak_and_of_the_stream_read():
    # the figures the measure table reports, from points written by hand:
    # stream read 256 MB in 100 us and 1024 MB in 400 us (2.684 TB/s both: 268,435,456 B / 1e-4 s)
    # decode 8 MB in 20 us (below 256 MB: not counted), 256 MB in 125 us, 1024 MB in 500 us -> 0.8 of the read at both
    peak = 3.35e12
    read = fit_family("stream_read", [(256 * MB, 1e-4, 0, 0), (1024 * MB, 4e-4, 0, 0)], peak)
    dec = fit_family("decode_bfloat16", [(8 * MB, 2e-5, 0, 0), (256 * MB, 1.25e-4, 0, 0), (1024 * MB, 5e-4, 0, 0)],
                     peak)
    p = CalibrationProfile({"name": "x"}, peak, {"stream_read": read, "decode_bfloat16": dec})
    assert p.stream_fraction("stream_read") == 1.0
    assert p.stream_fraction("decode_bfloat16") == pytest.approx(0.8, rel=1e-12)
    assert p.peak_fraction("stream_read") == pytest.approx(1024 * MB / 4e-4 / 3.35e12, rel=1e-12)  # 0.8013
    assert round(p.peak_fraction("stream_read"), 4) == 0.8013
    assert p.stream_fraction("decode_bfloat16", min_bytes=2048 * MB) is None  # no size that large measured
    assert p.stream_fraction("gemv_bf16") is None


def test_stream_fraction_interpolates_the_read():
    # stream read: 256 MB in 100 us (268,435,456 / 1e-4 = 2.68435456e12 B/s) and 1,024 MB in 320 us
    # (1,073,741,824 / 3.2e-4 = 3.3554432e12 B/s). 512 MB sits halfway between them in log(bytes), so the read's
    # rate there is their geometric mean, 2.68435456e12 x sqrt(1.25) = 3.0012e12 B/s
    peak = 4.8e12
    read = fit_family("stream_read", [(256 * MB, 1e-4, 0, 0), (1024 * MB, 3.2e-4, 0, 0)], peak)
    mid = 2.68435456e12 * math.sqrt(1.25)
    # a decode point of 512 MB at 0.75 of that, and one of 2,048 MB (past the read's largest size: the 1,024 MB rate
    # holds) at 0.5 of 3.3554432e12; a 255 MB point falls under the 256 MB floor and is not averaged
    dec = fit_family("decode_int4_per_token_head",
                     [(255 * MB, 1e-4, 0, 0), (512 * MB, 512 * MB / (0.75 * mid), 0, 0),
                      (2048 * MB, 2048 * MB / (0.5 * 3.3554432e12), 0, 0)], peak)
    p = CalibrationProfile({"name": "x"}, peak, {"stream_read": read, "decode_int4_per_token_head": dec})
    assert p.stream_bandwidth(512 * MB) == pytest.approx(3.0012e12, rel=1e-4)
    assert p.stream_bandwidth(8 * MB) == pytest.approx(2.68435456e12, rel=1e-12)  # below: the smallest size's rate
    assert p.stream_fraction("decode_int4_per_token_head") == pytest.approx((0.75 + 0.5) / 2, rel=1e-12)
    assert p.stream_fraction("stream_read") == pytest.approx(1.0, rel=1e-12)
    # a point that matches no read size exactly still gets its fraction: at 300 MB the read runs at
    # 2.68435456e12 x 1.25^w with w = log(300/256) / log(1024/256) = 0.1144 (the rate grows by 1.25 over the range)
    w = math.log(300 / 256) / math.log(1024 / 256)
    at300 = 2.68435456e12 * 1.25 ** w  # 2.7538e12 B/s
    one = fit_family("decode_nvfp4", [(300 * MB, 300 * MB / (0.9 * at300), 0, 0)], peak)
    p.families["decode_nvfp4"] = one
    assert round(w, 4) == 0.1144 and at300 == pytest.approx(2.7538e12, rel=1e-4)
    assert p.stream_fraction("decode_nvfp4") == pytest.approx(0.9, rel=1e-12)


def test_dry_run_and_no_gpu(cli):
    r = cli("measure", "--dry-run", "--quick")
    assert r.code == 0 and "decode_turboquant_3bit_nc" in r.out and "minutes" in r.out
    r = cli("measure", "--dry-run", "--gpu", "h200")
    assert r.code == 0 and "H200" in r.out
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = cli("measure", "--quick")
    assert r.code == 2 and "needs a CUDA GPU" in r.err and r.err.count("\n") == 1


def test_profile_round_trip(tmp_path):
    fit = fit_family("decode_bfloat16", [(1e8, 1e-4, 0, 0), (2e8, 1.9e-4, 0, 0)], 1e12)
    p = CalibrationProfile({"name": "NVIDIA H100 80GB HBM3"}, 3.35e12, {"decode_bfloat16": fit})
    save_calibration(p, tmp_path / "cal.yaml")
    back = load_calibration(tmp_path / "cal.yaml")
    assert back.families["decode_bfloat16"].eta == pytest.approx(fit.eta)
    (tmp_path / "bad.yaml").write_text("schema: nope\n")
    from kvplan.errors import KvplanError

    with pytest.raises(KvplanError, match="not a kvplan calibration profile"):
        load_calibration(tmp_path / "bad.yaml")


def test_pipeline_on_cpu(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")  # under the interpreter: conftest chose it before triton was imported
    from kvplan.errors import KvplanError
    from kvplan.measure.run import run_measure

    out = tmp_path / "cpu.yaml"
    # three sizes: a CPU shared with other work can time sizes out of order, which the fit rightly refuses ("the
    # times do not grow with the bytes"); on a CPU that busy the whole measurement is taken once more
    for attempt in (1, 2):
        try:
            run_measure(quick=True, output=str(out), device_name="cpu", sizes=[64 * 1024, 256 * 1024, 1024 * 1024],
                        samples=2, warmup=1, families=("stream_read", "stream_copy", "gemv_bf16", "decode_bfloat16",
                                                       "decode_int4_per_token_head"))
            break
        except KvplanError as e:
            if attempt == 2 or "do not grow with the bytes" not in str(e):
                raise
    prof = load_calibration(out)
    assert set(prof.families) == {"stream_read", "stream_copy", "gemv_bf16", "decode_bfloat16",
                                  "decode_int4_per_token_head"}
    for f in prof.families.values():
        assert f.eta > 0 and f.t0_s >= 0 and len(f.points) == 3 and math.isfinite(f.eta)
    # every family gets a fraction of the streaming read, int4 too (its points never match the read's sizes)
    assert all(prof.stream_fraction(f, min_bytes=0) is not None for f in prof.families)
    int4 = prof.families["decode_int4_per_token_head"].points
    assert {p[0] for p in int4}.isdisjoint(p[0] for p in prof.families["stream_read"].points)
    assert not list(tmp_path.glob(".*.tmp"))


def _profile(tmp_path, name="NVIDIA H100 80GB HBM3"):
    peak = 3.35e12
    fams = {
        "gemv_bf16": fit_family("gemv_bf16", [(b, 4e-6 + b / (0.85 * peak), 0, 0) for b in (1e7, 1e9)], peak),
        "decode_bfloat16": fit_family("decode_bfloat16", [(b, 6e-6 + b / (0.8 * peak), 0, 0) for b in (1e7, 1e9)],
                                      peak),
    }
    p = CalibrationProfile({"name": name, "memory_total_bytes": 85_000_000_000}, peak, fams)
    path = tmp_path / "h100.yaml"
    save_calibration(p, path)
    return path


def test_calibrated_step_times(cli, tmp_path):
    import json

    path = _profile(tmp_path)
    r = cli("crossover", "llama3-8b", "--gpu", "h100", "--context", "8192", "--calibration", str(path), "--json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    p = d["operating_points"][0]
    # Llama-3-8B at batch 1, 8,192 tokens, by hand: the measured GEMV fit (4 us, 85% of 3.35 TB/s) prices vLLM's
    # fused GEMMs per layer (qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096, down 4096 x 14336) and the LM
    # head (128256 x 4096), each reading its bf16 weights plus one activation row in and out; the measured decode
    # fit (6 us, 80%) one attention call per layer, with the bundled per-sequence, per-head and serial terms and their
    # blend with the streaming
    import yaml

    from kvplan.sizing.step_time import HOST_GAP_S, SAMPLER_KERNELS, SMALL_KERNELS_PER_LAYER

    B = 3.35e12
    a = yaml.safe_load((Path(__file__).parent.parent / "hardware" / "profiles" / "step-time.yaml").read_text())[
        "gpus"]["H100-SXM5-80GB"]["attention"]["bfloat16"]["groups"][4][128]

    def gemm(n, k):
        return 4e-6 + (n * k * 2 + k * 2 + n * 2) / (0.85 * B)
    gemms = 32 * (gemm(6144, 4096) + gemm(4096, 4096) + gemm(28672, 4096) + gemm(4096, 14336)) + gemm(128256, 4096)
    kv = 8192 * 8 * 128 * 2 * 2  # 8 KV heads of 128, K and V, bf16
    fixed, q = a["per_sequence_head_s"] * 8 + a["per_query_head_s"] * 32, a["blend_exponent"]
    attn = 32 * (6e-6 + (fixed ** q + max(kv / (0.8 * B), a["per_token_chain_s"] * 8192) ** q) ** (1 / q))
    small = SMALL_KERNELS_PER_LAYER * 32 * (4e-6 + 6 * 4096 * 2 / (0.85 * B))  # norms, rotary, activation
    sampler = HOST_GAP_S + SAMPLER_KERNELS * 4e-6 + 4 * 128256 * 4 / (0.85 * B)
    assert p["calibrated_step_ms"] == pytest.approx((gemms + attn + small + sampler) * 1e3, rel=1e-9)
    assert p["calibrated_step_ms"] > p["step_ms"]  # real kernels are slower than the roofline
    assert any(n.startswith("expected step ms: " + str(path)) for n in d["notes"])
    r = cli("crossover", "llama3-8b", "--gpu", "h100", "--context", "8192", "--calibration", str(path), "-d", "fp8")
    assert r.code == 0 and "no fp8 decode measurement" in r.out


def test_calibration_found_in_the_cache(cli, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("KVPLAN_CACHE_DIR", str(tmp_path))
    (tmp_path / "calibration").mkdir()
    src = _profile(tmp_path)
    (tmp_path / "calibration" / "nvidia-h100-80gb-hbm3.yaml").write_text(src.read_text())
    r = cli("crossover", "llama3-8b", "--gpu", "h100", "--context", "8192", "--json")
    assert json.loads(r.out)["operating_points"][0]["calibrated_step_ms"] is not None
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "--json")
    assert json.loads(r.out)["total_bytes"] == 85_000_000_000  # the measured total replaces the catalog's


def test_validate_on_cpu(fixtures, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvplan.measure.run import run_validate

    cal = _profile(tmp_path, name="cpu (Triton interpreter)")
    r = run_validate(str(fixtures / "tiny-model.yaml"), "auto", batch=2, context=64, layers=2, device_name="cpu",
                     calibration=str(cal), samples=2)
    # 2 layers of q, k, v, o (256x256, 128x256 twice, 256x256) and gate, up, down (512x256 twice, 256x512), bf16
    per_layer = 2 * (256 * 256 * 2 + 128 * 256 * 2 + 512 * 256 * 3)
    assert r["weight_bytes"] == 2 * per_layer
    assert r["kv_bytes"] == 2 * 2 * 64 * 2 * 256  # layers x batch x context x kv heads x 256-byte bf16 slots
    assert r["measured_ms"] > 0 and r["calibrated_ms"] is not None


def test_validate_prediction_is_the_step_models(fixtures, tmp_path):
    # --validate's prediction is the step model's (calibration over the bundled fits): the GEMMs less the LM head and
    # the decode attention, per layer, for the layers timed; an uncatalogued device takes the calibration alone
    from kvplan import load_gpu
    from kvplan.deployment import DeploymentArgs
    from kvplan.measure.run import predicted_step_s, validate_target
    from kvplan.sizing.step_time import step_model
    from kvplan.specs.calibration import load_calibration

    path = _profile(tmp_path)
    cal = load_calibration(str(path))
    m, fmt = validate_target("llama3-8b", "auto")
    one = predicted_step_s(m, fmt, load_gpu("h100"), cal, str(path), "NVIDIA H100 80GB HBM3", 8, 4096, 1)
    assert predicted_step_s(m, fmt, load_gpu("h100"), cal, str(path), "NVIDIA H100 80GB HBM3", 8, 4096, 4) == (
        pytest.approx(4 * one))
    whole = step_model(DeploymentArgs(model=m, gpu="h100", calibration=str(path)).resolve()).step(8, 4096)
    assert one * m.num_layers < whole.gemm_s + whole.moe_s + whole.attention_s  # the LM head left out
    tiny, auto = validate_target(str(fixtures / "tiny-model.yaml"), "auto")
    cpu = load_calibration(str(_profile(tmp_path, name="cpu (Triton interpreter)")))
    assert predicted_step_s(tiny, auto, None, cpu, "cpu.yaml", "cpu (Triton interpreter)", 2, 64, 2) > 0


def test_validate_needs_a_gpu(cli):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = cli("measure", "--validate", "llama3-8b")
    assert r.code == 2 and "needs a CUDA GPU" in r.err


def test_self_check_before_measuring(monkeypatch):
    # measure refuses to time kernels that compute the wrong thing: every decode kernel passes as shipped (here at
    # small shapes under the interpreter; on a GPU at head_dim 128, 8 KV heads and the timed contexts), an empty
    # sequence included, and a decode kernel that returns zeros fails it in every format
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvplan.kernels import bench, int4_attention, kivi_attention, paged_attention

    small = dict(head_dim=64, kv_heads=2, heads=4)
    assert bench.self_check(torch.device("cpu"), [40], **small) == []
    zeros = lambda q, *a, **k: torch.zeros_like(q)  # noqa: E731
    monkeypatch.setattr(paged_attention, "paged_decode", zeros)
    monkeypatch.setattr(int4_attention, "paged_decode_int4", zeros)
    monkeypatch.setattr(kivi_attention, "paged_decode_kivi", zeros)
    fmts = ("bfloat16", "fp8_e4m3", "int4_per_token_head", "kivi2")
    assert bench.self_check(torch.device("cpu"), [40], formats=fmts, **small) == list(fmts)


def test_self_check_reports_nan_for_an_empty_sequence(monkeypatch):
    # a kernel that leaves NaN where a sequence has no token fails the check, though every other row is right
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvplan.kernels import bench, paged_attention

    real = paged_attention.paged_decode

    def nan_first(*a, **k):
        out = real(*a, **k)
        out[0] = float("nan")
        return out

    monkeypatch.setattr(paged_attention, "paged_decode", nan_first)
    assert bench.self_check(torch.device("cpu"), [20], head_dim=64, kv_heads=2, heads=4,
                            formats=("float16",)) == ["float16"]


def test_self_check_shapes_are_the_timed_ones():
    # the contexts the quick plan times in bf16: 4,096 tokens from 64 MB up; at 8 MB, a slot of 512 bytes x 8 KV
    # heads = 4,096 bytes a token, 8,388,608 / 4,096 / 4 = 512 tokens (four sequences)
    from kvplan.kernels import bench

    assert bench.timed_contexts("bfloat16", [8 * MB, 64 * MB, 256 * MB, 1024 * MB]) == [512, 4096]
    # int4: 136 x 8 = 1,088 bytes a token; 8,388,608 // 1,088 // 4 = 1,927, down to whole blocks of 16: 1,920
    assert bench.timed_contexts("int4_per_token_head", [8 * MB, 64 * MB]) == [1920, 4096]
    assert (bench.HEAD_DIM, bench.KV_HEADS) == (128, 8)
    assert set(bench.CHECK_FORMATS) >= {f.removeprefix("decode_") for f in FAMILIES if f.startswith("decode_")}


def test_empty_sequence_gives_zeros():
    # a sequence of no token attends to nothing: zeros from every split layout, never NaN
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvplan.kernels.paged_attention import make_cache, paged_decode

    cache, layout = make_cache("float16", 2, 16, 2, 64)
    q = torch.randn(2, 4, 64).to(torch.float16)
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    for splits in (1, 2):
        out = paged_decode(q, cache, layout, table, torch.tensor([0, 0], dtype=torch.int32), splits=splits)
        assert bool((out == 0).all())


def test_write_path_check(monkeypatch):
    # the GPU-only comparison of the two write paths, run here on the formats the interpreter converts faithfully;
    # a write kernel that stores nothing fails it
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvplan.kernels import bench, paged_attention

    for fmt in ("bfloat16", "float16", "int8_per_token_head"):
        cache, layout = paged_attention.make_cache(fmt, 2, 16, 2, 64)
        assert bench._write_path_matches(cache, layout, torch.Generator().manual_seed(1), torch.device("cpu"))
    monkeypatch.setattr(paged_attention, "reshape_and_cache", lambda *a, **k: None)
    assert not bench._write_path_matches(cache, layout, torch.Generator().manual_seed(1), torch.device("cpu"))


def test_quantized_write_path_check(monkeypatch):
    # the int4, NVFP4, TurboQuant and KIVI write kernels against the torch writers (a GPU-only check, run here under
    # the interpreter, where these kernels convert only to fp16); a write kernel that stores nothing fails it
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvplan.kernels import (
        bench,
        int4_attention,
        kivi_attention,
        nvfp4_attention,
        turboquant_attention,
    )

    assert bench._quantized_write_paths(torch.Generator().manual_seed(2), torch.device("cpu")) == []
    monkeypatch.setattr(int4_attention, "reshape_and_cache_int4", lambda *a, **k: None)
    monkeypatch.setattr(nvfp4_attention, "reshape_and_cache_nvfp4", lambda *a, **k: None)
    monkeypatch.setattr(turboquant_attention, "reshape_and_cache_turboquant", lambda *a, **k: None)
    monkeypatch.setattr(kivi_attention, "reshape_and_cache_kivi", lambda *a, **k: None)
    assert bench._quantized_write_paths(torch.Generator().manual_seed(2), torch.device("cpu")) == [
        f"{fmt} (write path)" for fmt in ("int4_per_token_head", "nvfp4", "nvfp4_4over6", "turboquant_k8v4",
                                          "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
                                          "kivi2", "kivi4")]


def test_self_check_on_a_gpu_covers_the_write_kernels_at_the_timed_shape(monkeypatch):
    # on a GPU the check also runs every write kernel, at head_dim 128 and 8 KV heads (the device calls mocked: the
    # shapes and formats each check receives are what is checked)
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvplan.kernels import bench

    seen = {"decode": [], "paged": [], "quantized": None}
    monkeypatch.setattr(bench, "_decode_matches", lambda fmt, lens, d, kv, heads, gen, dev:
                        seen["decode"].append((fmt, lens, d, kv, heads)) or True)
    monkeypatch.setattr(bench, "_write_path_matches", lambda cache, layout, gen, dev:
                        seen["paged"].append((layout.fmt.name, cache.shape[2], layout.head_dim)) or True)
    monkeypatch.setattr(bench, "_quantized_write_paths", lambda gen, dev, kv, d, fmts:
                        seen.__setitem__("quantized", (kv, d, fmts)) or [])
    assert bench.self_check(torch.device("cuda"), {"bfloat16": [512, 4096]}) == []
    assert seen["decode"][0] == ("bfloat16", [0, 1, 37, 512, 4096], 128, 8, 32)
    assert [f for f, *_ in seen["decode"]] == list(bench.CHECK_FORMATS)  # all 15, 4,096 tokens where not told
    assert seen["decode"][-1][1] == [0, 1, 37, 4096]
    assert seen["paged"] == [(f, 8, 128) for f in bench.PAGED_FORMATS]
    assert seen["quantized"] == (8, 128, bench.QUANTIZED_FORMATS)


# ----------------------------------------------------------------------------------------------------------------
# kvplan measure --probe


def test_probe_refuses_without_a_gpu(cli):
    r = cli("measure", "--probe", "--budget", "5")
    try:
        import torch
    except ImportError:  # without torch the same refusal, naming what is missing
        assert r.code == 2 and "needs torch and triton" in r.err and r.err.count("\n") == 1
        return
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert r.code == 2 and r.err == "kvplan: error: kvplan measure --probe needs a CUDA GPU, and torch sees none\n"
    assert r.out == ""
    for args, says in ((("--budget", "5"), "add --probe"), (("--probe", "--budget", "0"), "positive"),
                       (("--probe", "--quick"), "drop --quick"), (("--probe", "--dry-run"), "drop --dry-run"),
                       (("--probe", "--device", "cpu"), "CUDA GPU")):
        r = cli("measure", *args)
        assert r.code == 2 and says in r.err and r.err.count("\n") == 1 and "Traceback" not in r.err


def test_probe_configurations_start_from_the_defaults():
    from kvplan.kernels.probe import Config, configurations

    configs = configurations()
    # 2 formats x 4 tiles x 2 warp counts x 3 stage counts x 6 split choices
    assert len(configs) == 2 * 4 * 2 * 3 * 6 == 288 and len(set(configs)) == 288
    assert configs[:2] == [Config("bfloat16", 64, 4, 3, None), Config("fp8_e4m3", 64, 4, 3, None)]
    # then one setting changed at a time (5 other splits, 1 other warp count, 2 other stage counts, 3 other tiles:
    # 11 per format), the split counts first
    assert configs[2] == Config("bfloat16", 64, 4, 3, 1)
    assert all(sum((c.tile != 64, c.num_warps != 4, c.num_stages != 3, c.splits is not None)) == 1
               for c in configs[2:24])
    assert configs[-1] == Config("fp8_e4m3", 16, 8, 4, 8)  # the last: every setting changed


def test_probe_sweep_with_a_fake_timer():
    from kvplan.kernels.probe import Config, compare_flushes, configurations, sweep

    configs = configurations(tiles=(64, 128), warps=(4, 8), stages=(3,), splits=(None, 2))
    # 2 tiles x 2 warp counts x 2 split choices x 2 formats; in order: the defaults, then one change (splits 2,
    # 8 warps, tile 128), each in bf16 then fp8
    assert len(configs) == 16
    assert [(c.fmt, c.tile, c.num_warps, c.splits) for c in configs[:8]] == [
        ("bfloat16", 64, 4, None), ("fp8_e4m3", 64, 4, None), ("bfloat16", 64, 4, 2), ("fp8_e4m3", 64, 4, 2),
        ("bfloat16", 64, 8, None), ("fp8_e4m3", 64, 8, None), ("bfloat16", 128, 4, None), ("fp8_e4m3", 128, 4, None)]
    now = [0.0]
    times = {("bfloat16", 64, 4, None): 400e-6, ("bfloat16", 64, 4, 2): 350e-6, ("bfloat16", 128, 4, None): 300e-6,
             ("fp8_e4m3", 64, 4, None): 250e-6, ("fp8_e4m3", 64, 4, 2): 200e-6, ("fp8_e4m3", 64, 8, None): 220e-6}

    def measure(c: Config) -> dict:
        now[0] += 1.0  # each configuration takes a second of the fake clock
        if (c.fmt, c.num_warps) == ("bfloat16", 8):
            raise RuntimeError("out of resources: shared memory\nmore detail")
        # the 128-token bf16 tile is the fastest, but its answer disagrees with the default's
        return {"seconds": times[(c.fmt, c.tile, c.num_warps, c.splits)], "matches": c.tile != 128}

    def moved(c: Config) -> int:
        return 2**30 if c.fmt == "bfloat16" else 2**29  # 1 GiB of bf16 cache, 512 MiB of fp8

    r = sweep(configs, measure, moved, budget_s=7, clock=lambda: now[0])
    # the budget is checked before each configuration: the 8th starts at 7 s of 7, and is not timed
    assert r["timed"] == 7 and r["planned"] == 16 and r["stopped_at_budget"] and r["elapsed_s"] == 7
    rows = r["configurations"]
    assert rows[4]["error"] == "RuntimeError: out of resources: shared memory" and "seconds" not in rows[4]
    assert rows[6]["matches"] is False
    # the fastest agreeing bf16: splits 2 at 350 us, 1,073,741,824 B / 350e-6 s = 3.0678e12 B/s; fp8: splits 2 at
    # 200 us, 536,870,912 B / 200e-6 s = 2.6844e12 B/s
    best = r["best"]
    assert (best["bfloat16"]["tile"], best["bfloat16"]["splits"], best["bfloat16"]["seconds"]) == (64, 2, 350e-6)
    assert best["bfloat16"]["bytes_per_s"] == pytest.approx(3.0678e12, rel=1e-4)
    assert (best["fp8_e4m3"]["num_warps"], best["fp8_e4m3"]["splits"]) == (4, 2)
    assert best["fp8_e4m3"]["bytes_per_s"] == pytest.approx(2.6844e12, rel=1e-4)
    # a budget long enough times all 16
    now[0] = 0.0
    assert sweep(configs, measure, moved, budget_s=100, clock=lambda: now[0])["timed"] == 16
    # the flush methods on one call of 1 GiB: read 400 us (2.684e12 B/s), write 500 us (2.147e12), none 250 us
    flush = compare_flushes({"read": 400e-6, "write": 500e-6, "none": 250e-6}.__getitem__, 2**30)
    assert flush["write"]["bytes_per_s"] == pytest.approx(2.1475e12, rel=1e-4)
    assert flush["read"]["seconds"] == 400e-6 and list(flush) == ["read", "write", "none"]


def test_probe_plumbing_on_cpu(monkeypatch):
    # the GPU sweep's own code, run under the interpreter at a tiny shape: every row timed, answers compared
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from kvplan.kernels import probe

    for name, value in (("SEQS", 2), ("KV_HEADS", 2), ("HEADS", 4), ("CONTEXT", 64)):
        monkeypatch.setattr(probe, name, value)
    monkeypatch.setattr(probe, "configurations",
                        lambda f=probe.configurations: f(tiles=(16, 32), warps=(4,), stages=(3,), splits=(None, 2)))
    found = probe.run_probe(torch.device("cpu"), flush_bytes=4096, budget_s=600, samples=2)
    assert found["timed"] == found["planned"] == 8 and not found["stopped_at_budget"]
    for row in found["configurations"]:
        assert row["matches"] is True and row["seconds"] > 0, row
        # 2 sequences x 64 tokens x 2 KV heads x 512 B (bf16) or 256 B (fp8) a slot
        assert row["bytes"] == 2 * 64 * 2 * (512 if row["fmt"] == "bfloat16" else 256)
        assert row["splits_used"] == (1 if row["splits"] is None else 2)  # one split off the GPU unless told
    assert set(found["best"]) == {"bfloat16", "fp8_e4m3"}
    assert set(found["flush"]) == {"configuration", "read", "write", "none"}


def test_probe_writes_its_findings(cli, tmp_path, monkeypatch):
    # the command around the sweep, with the GPU stubbed: the findings land atomically at --output, each timed row
    # with its fraction of the catalog's peak, and the fastest configurations are printed
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import json

    from kvplan.kernels import bench, probe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "device_info", lambda device: {"name": "NVIDIA H100 80GB HBM3", "device_type": "cuda"})
    seen = {}

    def fake_sweep(device, flush_bytes, budget_s, samples, progress):
        seen.update(flush_bytes=flush_bytes, budget_s=budget_s)
        row = {"fmt": "bfloat16", "tile": 64, "num_warps": 4, "num_stages": 3, "splits": None, "splits_used": 3,
               "seconds": 2**30 / 3.015e12, "bytes": 2**30, "bytes_per_s": 3.015e12, "matches": True}
        return {"configurations": [row, {"fmt": "fp8_e4m3", "tile": 128, "error": "OutOfResources: shared memory"}],
                "best": {"bfloat16": row}, "planned": 288, "timed": 2, "stopped_at_budget": True, "budget_s": budget_s,
                "elapsed_s": 30.2, "flush": {"configuration": {"fmt": "bfloat16"},
                                             "write": {"seconds": 1e-3, "bytes_per_s": 1.675e12}}}

    monkeypatch.setattr(probe, "run_probe", fake_sweep)
    out = tmp_path / "probe.json"
    r = cli("measure", "--probe", "--budget", "30", "--output", str(out))
    assert r.code == 0, r.err
    # the flush buffer: twice the H100's 50 MB L2 (100 MB = 104,857,600 B); the budget as given
    assert seen == {"flush_bytes": 100 * MB, "budget_s": 30.0}
    found = json.loads(out.read_text())
    # 3.015e12 / 3.35e12 = 0.9 of the H100's peak; the write flush's 1.675e12 / 3.35e12 = 0.5
    assert found["configurations"][0]["fraction_of_peak"] == pytest.approx(0.9)
    assert found["flush"]["write"]["fraction_of_peak"] == pytest.approx(0.5)
    assert "fraction_of_peak" not in found["configurations"][1] and found["peak_bytes_per_s"] == 3.35e12
    # 2^30 B at 3.015e12 B/s: 356.1 us
    assert "fastest bfloat16: tile 64, 4 warps, 3 stages, 3 splits: 356.1 us, 3.02 TB/s" in r.out
    assert "after a write flush: 1,000.0 us, 1.68 TB/s" in r.out and "(the budget ran out)" in r.out
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("argv, words", [
    (["measure", "--output", "{tmp}"], "it is a folder"),
    (["measure", "--probe", "--output", "{tmp}/missing/probe.json"], "does not exist"),
])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(cli, tmp_path, argv, words):
    r = cli(*[a.format(tmp=tmp_path) for a in argv])
    assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, says", [
    (["--validate", "llama3-8bb"], "unknown model 'llama3-8bb'"),
    (["--validate", "llama3-8b", "-d", "fp9"], "unknown KV cache dtype 'fp9'"),
    (["--validate", "deepseek-v3"], "uses MLA"),
])
def test_validate_checks_its_inputs_before_the_gpu(cli, argv, says):
    # found here, before a GPU is borrowed: the typo, not "needs a CUDA GPU" (this machine has none)
    r = cli("measure", *argv)
    assert r.code == 2 and says in r.err and "CUDA" not in r.err and r.err.count("\n") == 1


def test_quick_help_gives_no_duration_of_its_own(cli):
    # the expected duration is the one --dry-run computes from the plan; the help points there rather than
    # quoting a figure that can disagree with it
    import re

    help_text = " ".join(cli("measure", "--help").out.replace("│", " ").split())
    assert "--dry-run --quick prints its expected duration" in help_text
    assert not re.search(r"about [0-9.]+ minutes", help_text)
