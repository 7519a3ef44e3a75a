"""The crossover arithmetic of the seed texts, figure by figure, with the hand arithmetic beside each assertion."""

import json
from pathlib import Path

import pytest

from kvplan.api import crossover
from kvplan.sizing.kv_cache import kv_bytes_per_token, kv_layers, kv_read_bytes
from kvplan.specs.catalog import load_gpu, load_model
from kvplan.specs.kv_formats import kv_format

W_8B = 8_030_261_248 * 2        # 1.606e10 bytes of bf16 weights
KV_8B = 2 * 32 * 8 * 128 * 2    # 131,072 B per token = 128 KiB


@pytest.fixture(scope="module")
def l8():
    return load_model("llama3-8b")


@pytest.fixture(scope="module")
def l70():
    return load_model("llama3-70b")


def test_llama3_8b_bytes_and_crossover(l8):
    bf16 = crossover(l8, "bfloat16", weight_read="all")
    fp8 = crossover(l8, "fp8", weight_read="all")
    assert bf16.kv_bytes_per_token == KV_8B == 131_072
    assert bf16.weight_bytes == W_8B
    assert f"{bf16.weight_bytes:.3e}" == "1.606e+10"
    assert bf16.crossover_tokens == pytest.approx(W_8B / KV_8B)           # 122,532
    assert f"{bf16.crossover_tokens:.2e}" == "1.23e+05"
    assert f"{fp8.crossover_tokens:.2e}" == "2.45e+05"                     # fp8 doubles N*


def test_fp8_saving_at_2304_and_128k(l8):
    r = crossover(l8, "fp8", weight_read="all", contexts=[2304, 131072], gpu=load_gpu("h100"))
    short, long = r.operating_points
    # 2304 x 131,072 = 3.02e8 B of KV; step 1.636e10 -> 1.621e10: a 0.9% cut
    assert short.baseline_kv_bytes == 2304 * KV_8B
    assert f"{short.baseline_step_bytes:.3e}" == "1.636e+10" and f"{short.step_bytes:.3e}" == "1.621e+10"
    assert round(short.saving * 100, 1) == 0.9
    # eliminating KV entirely would save KV / step = about 1.8%
    assert round(short.baseline_kv_bytes / short.baseline_step_bytes * 100, 1) == 1.8
    # on a 3.35 TB/s H100, about 45 us off a 4.9 ms step
    bf16_ms = short.baseline_step_bytes / 3.35e12 * 1e3
    assert round(bf16_ms, 1) == 4.9
    assert round((bf16_ms - short.step_ms) * 1e3) == 45
    # 128k: 1.72e10 B of KV against 1.606e10 of weights: past the crossover at batch 1; 3.33e10 -> 2.46e10, 26%
    assert f"{long.baseline_kv_bytes:.2e}" == "1.72e+10" and long.bound == "weights"  # fp8 KV is below weights
    assert f"{long.baseline_step_bytes:.2e}" == "3.32e+10"  # 3.3240e10; the seed rounds it to 3.33e10
    assert f"{long.step_bytes:.2e}" == "2.47e+10"           # 2.4650e10; the seed prints 2.46e10
    assert round(long.saving * 100) == 26


def test_llama3_70b(l8, l70):
    r = crossover(l70, "bfloat16", weight_read="all")
    assert r.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert f"{r.weight_bytes:.3e}" == "1.411e+11"  # the seed's 1.412e11 rounds P to 70.6e9
    ratio = r.crossover_tokens / crossover(l8, "bfloat16", weight_read="all").crossover_tokens
    assert round(ratio, 1) == 3.5
    # TP 8 divides both piles by 8 (8 KV heads): the same N* (norms replicated per rank move it by <0.1%)
    tp8 = crossover(l70, "bfloat16", weight_read="all", tp=8)
    assert tp8.kv_bytes_per_token == 327_680 // 8
    assert tp8.crossover_tokens == pytest.approx(r.crossover_tokens, rel=1e-3)
    # "17.7 GB of weights per rank" (the seed's 70.6e9 x 2 / 8 = 17.65e9)
    assert tp8.weight_bytes / 1e9 == pytest.approx(17.65, abs=0.01)


def test_streamed_default_skips_input_embedding(l8):
    # the 128256 x 4096 x 2 = 1.05 GB input embedding is gathered, not streamed: N* drops to about 1.15e5
    r = crossover(l8, "bfloat16")
    embed = 128256 * 4096 * 2
    assert r.weight_bytes == W_8B - embed + 4096 * 2  # one gathered row at batch 1
    assert f"{r.crossover_tokens:.3g}" == "1.15e+05"


def test_turboquant_4bit_nc_crossover(l8):
    # 32 layers x 8 heads x 134 B = 34,304 B/token; 1.606e10 / 34,304 = 4.68e5 (the seed's 4.7e5, "3.8x")
    none = crossover(l8, "turboquant_4bit_nc", weight_read="all", skip=("none",))
    assert none.kv_bytes_per_token == 32 * 8 * 134
    assert f"{none.crossover_tokens:.2g}" == "4.7e+05"
    # vLLM keeps layers 0, 1, 30, 31 in bf16: 28 x 8 x 134 + 4 x 8 x 512 = 46,400 B/token -> 3.46e5
    default = crossover(l8, "turboquant_4bit_nc", weight_read="all")
    assert default.skip_layers == [0, 1, 30, 31]
    assert default.kv_bytes_per_token == 28 * 8 * 134 + 4 * 8 * 512
    assert default.crossover_tokens == pytest.approx(W_8B / 46_400)


def test_turboquant_effective_ratio_with_boundary_layers():
    # dense 36-layer model, k3v4_nc with 4 bf16 boundary layers: 36 x 512 / (32 x 118 + 4 x 512) = 3.16x
    m = load_model("qwen3-4b")
    assert m.num_layers == 36
    assert round(crossover(m, "turboquant_k3v4_nc").kv_ratio, 2) == 3.16


@pytest.mark.parametrize("r, saving", [(0.01, 0.0050), (0.5, 0.1667), (1.0, 0.25)])
def test_halving_kv_saves_r_over_2_1_plus_r(l8, r, saving):
    # halving KV saves K / (2 (W + K)) = r / (2 (1 + r)) with r = K / W
    context = round(r * W_8B / KV_8B)
    p = crossover(l8, "fp8", weight_read="all", contexts=[context]).operating_points[0]
    assert p.saving == pytest.approx(saving, abs=2e-4)


def test_kv_cache_math_examples(l70):
    # 80 layers, 8 KV heads, 128 dims, fp16: 320 KiB per token
    layers = kv_layers(l70, kv_format("float16"))
    assert kv_bytes_per_token(layers) == 320 * 1024
    GiB = 2**30
    assert kv_read_bytes(layers, 1, 8192) == 2.5 * GiB
    assert kv_read_bytes(layers, 1, 131072) == 40 * GiB
    assert kv_read_bytes(layers, 32, 8192) == 80 * GiB
    assert kv_read_bytes(layers, 4, 131072) == 160 * GiB
    # 80 GiB is about 86 GB: about 29 ms of traffic at 3 TB/s
    assert round(kv_read_bytes(layers, 32, 8192) / 3e12 * 1e3) == 29


def test_kv_quantization_estimate(l8):
    # 2 x 32 layers x 32768 tokens x 8 heads x 128 x 2 B = 4 GiB; 8-bit 2 GiB; 2-bit codes alone 0.5 GiB
    GiB = 2**30
    for fmt, gib in [("bfloat16", 4), ("fp8", 2), ("custom:bits=2", 0.5)]:
        assert kv_read_bytes(kv_layers(l8, kv_format(fmt)), 1, 32768) == gib * GiB


def test_moe_weight_read_grows_with_batch():
    m = load_model("mixtral-8x7b")
    r = crossover(m, "bfloat16", batches=[1, 64], contexts=[1])
    b1, b64 = r.operating_points
    expert = 3 * 4096 * 14336 * 2  # one expert, bf16
    # batch 1 touches 2 of 8 experts per layer; batch 64 nearly all: 8 x (1 - (6/8)^64); plus 63 more gathered
    # embedding rows of 4096 x 2 B
    more_experts = 32 * expert * (8 * (1 - 0.75**64) - 2)
    assert b64.weight_bytes - b1.weight_bytes == pytest.approx(more_experts + 63 * 4096 * 2, rel=1e-12)
    # MoE N* at batch 1 counts only the active experts, so it sits far left of the all-parameters figure
    assert r.crossover_tokens < crossover(m, "bfloat16", weight_read="all").crossover_tokens / 3


def test_sliding_window_crossover():
    # Mistral-7B-v0.1: every layer slides over 4096 tokens, so one sequence never reads more than
    # 4096 x 131,072 B = 0.54 GB of KV; N* does not exist at batch 1, and ~27 full-window sequences cross it
    m = load_model("mistral-7b-v0.1")
    r = crossover(m, "bfloat16", weight_read="all")
    assert r.crossover_tokens is None
    assert r.crossover_batch == pytest.approx(2 * 7_241_732_096 / (4096 * 131_072))
    # Gemma-3-27B: 10 full layers read everything, 52 sliding layers at most 1024 tokens
    g = load_model("gemma-3-27b")
    gr = crossover(g, "bfloat16", weight_read="all")
    full, slide = 10 * 16 * 256 * 2, 52 * 16 * 256 * 2
    assert gr.crossover_tokens == pytest.approx((gr.weight_bytes - 1024 * slide) / full)


def test_mla_latent_not_split_by_tp():
    m = load_model("deepseek-v3")
    one = crossover(m, "fp8_ds_mla")
    eight = crossover(m, "fp8_ds_mla", tp=8)
    assert one.kv_bytes_per_token == eight.kv_bytes_per_token == 61 * 656


def test_kv_heads_replicated_beyond_tp():
    m = load_model("llama3-8b")
    assert crossover(m, tp=16).kv_bytes_per_token == 32 * 1 * 512  # 8 KV heads over 16 ranks: one each


def test_crossover_cli_json(cli):
    r = cli("crossover", "llama3-8b", "--dtype", "fp8", "--weight-read", "all", "--context", "2304",
            "--batch", "1", "--json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["kv_bytes_per_token"] == 65536 and d["weight_bytes"] == W_8B
    assert round(d["crossover_tokens"]) == 245064
    p = d["operating_points"][0]
    assert {"batch", "context", "weight_bytes", "kv_bytes", "step_bytes"} <= set(p)
    assert p["kv_bytes"] == 2304 * 65536


def test_crossover_cli_several_dtypes_is_an_array(cli):
    r = cli("crossover", "llama3-8b", "-d", "bf16,fp8", "-d", "turboquant_4bit_nc", "--json")
    assert [d["dtype"] for d in json.loads(r.out)] == ["bfloat16", "fp8", "turboquant_4bit_nc"]


def test_crossover_table(cli):
    r = cli("crossover", "llama3-8b", "--dtype", "fp8", "--gpu", "h100", "--context", "2304,128k")
    assert r.code == 0, r.err
    assert "245,064" in r.out or "229,032" in r.out
    assert "131,072" in r.out and "step ms" in r.out


def test_crossover_all_dtypes_on_mla(cli):
    """-d all is what vLLM's MLA backends store: on dense DeepSeek-V3 the 16-bit caches and plain fp8 (FlashMLA's
    supported_kv_cache_dtypes: auto, float16, bfloat16, fp8; fp8_e4m3 with FlashInfer's and CUTLASS's MLA); on
    DeepSeek-V3.2's sparse attention fp8 is stored as fp8_ds_mla (FlashMLASparseBackend: "fp8" an alias for it), once,
    and nvfp4_ds_mla."""
    r = cli("crossover", "deepseek-v3", "--dtype", "all", "--json")
    names = [d["dtype"] for d in json.loads(r.out)]
    assert names == ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"]
    sparse = Path(__file__).parent / "fixtures/hf-corpus/deepseek-ai--DeepSeek-V3.2_config.json"
    r = cli("crossover", str(sparse), "--dtype", "all", "--json")
    assert [d["dtype"] for d in json.loads(r.out)] == ["auto", "float16", "bfloat16", "fp8_ds_mla", "nvfp4_ds_mla"]


def test_operating_points_beyond_the_gpu_and_the_fitted_range_are_noted(l8):
    """An operating point whose KV cannot sit in the GPU's memory, or a batch beyond the step timings, is priced
    with a note rather than as if vLLM could run it."""
    import yaml

    from kvplan.specs.catalog import catalog_dir

    h100 = load_gpu("h100")
    # K and V x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 B a token; 64 x 131,072 tokens of it is
    # 1,099.5 GB, beyond the 80 GB H100; 8 x 8,192 tokens (8.6 GB) beside 16.1 GB of weights fit
    per_token = 2 * 32 * 8 * 128 * 2
    big = crossover(l8, "auto", gpu=h100, batches=[64], contexts=[131072])
    assert big.operating_points[0].kv_bytes == 64 * 131072 * per_token
    assert 64 * 131072 * per_token > h100.memory_total_bytes
    assert any(n.startswith(f"batch 64 x context 131,072: the KV cache a step reads "
                            f"({64 * 131072 * per_token / 1e9:,.1f} GB per rank)") and "no vLLM pool holds it" in n
               for n in big.notes)
    small = crossover(l8, "auto", gpu=h100, batches=[8], contexts=[8192])
    assert 8 * 8192 * per_token + small.weight_bytes_held < h100.memory_total_bytes
    assert not any("no vLLM pool" in n for n in small.notes)
    assert not any("no vLLM pool" in n for n in crossover(l8, "auto", batches=[64], contexts=[131072]).notes)

    # the bundled H100 GEMM timings reach steps of this many tokens (their largest range of m)
    bundled = yaml.safe_load((catalog_dir("hardware") / "profiles" / "step-time.yaml").read_text())
    reach = max(b["max_tokens"] for b in bundled["gpus"]["H100-SXM5-80GB"]["gemm"]["bfloat16"]["buckets"])
    inside = crossover(l8, "auto", gpu=h100, batches=[reach], contexts=[16])
    assert not any("beyond the" in n for n in inside.notes)
    past = crossover(l8, "auto", gpu=h100, batches=[reach + 1], contexts=[16])
    assert f"batch {reach + 1:,} is beyond the {reach:,} tokens a step that the step model's kernel timings reach: " \
           "its expected ms extrapolate the fits" in past.notes


def test_weights_beyond_the_gpu_are_noted_once(l70):
    """70B parameters in bf16 (over 140 GB) exceed an 80 GB H100 at TP 1 before any KV: one note says so."""
    h100 = load_gpu("h100")
    x = crossover(l70, "auto", gpu=h100, batches=[1, 8], contexts=[1024])
    assert x.weight_bytes_held > h100.memory_total_bytes
    said = [n for n in x.notes if "no vLLM pool" in n]
    assert said == [f"the weights held ({x.weight_bytes_held / 1e9:,.1f} GB per rank) alone exceed the "
                    f"{h100.memory_total_bytes / 1e9:,.1f} GB ({h100.memory_total_bytes / 2**30:,.1f} GiB) the "
                    f"H100-SXM5-80GB holds: no vLLM pool holds any operating point at TP 1; their step times are a "
                    f"what-if"]
    assert not any("no vLLM pool" in n for n in crossover(l70, "auto", gpu=h100, tp=2, batches=[1],
                                                          contexts=[1024]).notes)


def test_breakeven_sentence_says_never_plainly(cli):
    # the JSON's breakeven_context maps a batch to the context from which fp8 steps are faster, or null for never
    r = cli("crossover", "mistral-7b-v0.1", "-d", "fp8", "--gpu", "h100", "--json")
    assert json.loads(r.out)["breakeven_context"] == {"1": None}
    r = cli("crossover", "mistral-7b-v0.1", "-d", "fp8", "--gpu", "h100")
    assert "fp8 is never faster than auto (bf16) at batch 1" in r.out and "from context never" not in r.out
    both = cli("crossover", "mistral-7b-v0.1", "-d", "fp8", "--gpu", "h100", "-b", "1,256", "-c", "2k,32k,128k")
    found = json.loads(cli("crossover", "mistral-7b-v0.1", "-d", "fp8", "--gpu", "h100", "-b", "1,256", "-c",
                           "2k,32k,128k", "--json").out)["breakeven_context"]
    assert found["1"] is None and found["256"]
    assert f"fp8 steps faster than auto (bf16) from context {found['256']:,} at batch 256; never at batch 1" in \
        " ".join(both.out.split())


@pytest.mark.parametrize("name, moe", [("llama3-8b", False), ("mistral-7b-v0.1", False), ("qwen3-30b-a3b", True)])
def test_header_names_experts_only_for_moe_models(cli, name, moe):
    # a dense model has no experts to touch: its streamed read is everything but the input-embedding table
    header = " ".join(cli("crossover", name).out.split("weights held")[0].split())
    assert header.endswith("no input-embedding table, touched experts only" if moe else "no input-embedding table")


def test_crossover_follows_its_own_engine_version_advice(cli):
    # MiniMax-M1 is served by vLLM up to 0.23: the refusal names --engine-version, which crossover takes, and with
    # it the figure is the 10 softmax layers' K and V: 10 x 2 x 8 KV heads x 128 x 2 B = 40,960. The plot, which
    # holds no release-dependent figure, is drawn with the last release that serves the model
    from pathlib import Path
    cfg = str(Path(__file__).resolve().parent / "fixtures" / "hf-corpus" / "MiniMaxAI--MiniMax-M1-80k_config.json")
    r = cli("crossover", cfg, "--json")
    assert r.code == 2 and "--engine-version 0.23 or earlier" in r.err and "Traceback" not in r.err
    r = cli("crossover", cfg, "--engine-version", "0.23", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["kv_bytes_per_token"] == 10 * 2 * 8 * 128 * 2
    r = cli("plot", "crossover", cfg, "--json")
    assert r.code == 0, r.err
