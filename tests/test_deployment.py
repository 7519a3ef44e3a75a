"""One deployment value: every option is honoured or refused, the library and the CLI agree, and the figures that
depend on a rule of the engine follow that rule. Expected figures are worked by hand next to each assertion."""

import json

import pytest

from kvplan.specs.catalog import load_gpu, load_model

GiB = 2**30
LOG = "tests/fixtures/logs/vllm-v1-0.33-llama31-8b-h100.log"
SGLANG_LOG = "tests/fixtures/logs/sglang-0.5-llama31-8b-h100.log"


def one_line_error(r, says: str) -> None:
    assert r.code == 2, (r.out, r.err)
    assert r.err.startswith("kvplan: error: ") and r.err.count("\n") == 1, r.err
    assert says in r.err, r.err
    assert "Traceback" not in r.err


@pytest.fixture
def vllm_profile(cli, tmp_path):
    path = tmp_path / "deploy.yaml"
    r = cli("log", LOG, "--gpu", "h100", "--save-profile", str(path))
    assert r.code == 0, r.err
    return str(path)


@pytest.fixture
def sglang_profile(cli, tmp_path):
    path = tmp_path / "sglang.yaml"
    r = cli("log", SGLANG_LOG, "--gpu", "h100", "--save-profile", str(path))
    assert r.code == 0, r.err
    return str(path)


def write_calibration(path, memory_total_bytes: int, name: str = "H100-SXM5-80GB") -> str:
    path.write_text(
        "schema: kvplan-calibration/1\n"
        f"device: {{name: {name}, memory_total_bytes: {memory_total_bytes}}}\n"
        "peak_bandwidth_bytes_per_s: 3.35e+12\n"
        "families:\n"
        "  gemv_bf16: {t0_s: 5.0e-6, eta: 0.8}\n"
        "  decode_bfloat16: {t0_s: 8.0e-6, eta: 0.7}\n"
        "  decode_fp8_e4m3: {t0_s: 9.0e-6, eta: 0.6}\n")
    return str(path)


# ----------------------------------------------------------------------------------------------------------------
# Options an engine does not read are refused by name


@pytest.mark.parametrize("args, says", [
    (["--mem-fraction-static", "0.5"], "--mem-fraction-static applies to --engine sglang"),
    (["--page-size", "16"], "--page-size applies to --engine sglang"),
    (["--engine", "sglang", "--block-size", "32"], "--block-size applies to --engine vllm"),
    (["--engine", "sglang", "--pp", "2"], "--pp applies to --engine vllm"),
    (["--engine", "sglang", "--engine-version", "0.33"], "rules of SGLang 0.5"),
    (["--engine", "sglang", "--pp", "99", "--block-size", "-5", "--weight-dtype", "bogus"], "--pp applies"),
    (["--engine", "sglang", "--weight-dtype", "bogus"], "unknown weight dtype 'bogus'"),
    (["--engine", "sglang", "--max-model-len", "auto"], "auto is vLLM's"),
    (["--kv-cache-memory", "40", "--gpu-memory-utilization", "0.8"], "has no effect on it"),
    (["--enforce-eager", "--cudagraph-gib", "1"], "--cudagraph-gib has no effect"),
])
def test_options_the_engine_ignores_are_refused(cli, args, says):
    one_line_error(cli("capacity", "llama3-8b", "--gpu", "h100", *args), says)


def test_measure_refuses_what_it_would_ignore(cli):
    one_line_error(cli("measure", "--dry-run", "--validate", "llama3-8b"), "give one of the two")
    one_line_error(cli("measure", "--batch", "3"), "--batch applies with --validate")
    one_line_error(cli("measure", "--dry-run", "--output", "x.yaml"), "--output")


def test_max_regression_needs_a_baseline(cli):
    one_line_error(cli("gate", "examples/gates.yaml", "--max-regression", "5"), "add --baseline")


# ----------------------------------------------------------------------------------------------------------------
# vLLM's rules for the values it accepts


@pytest.mark.parametrize("block", ["17", "24", "8"])
def test_block_sizes_vllm_rejects(cli, block):
    # vLLM 0.33's attention backends take multiples of 16 (FlashAttention, Triton: MultipleOf(16))
    one_line_error(cli("capacity", "llama3-8b", "--gpu", "h100", "--block-size", block), "multiples of 16")


def test_block_size_48_is_a_multiple_of_16():
    # 48-token blocks of Llama-3-8B bf16: 48 x 32 layers x 8 heads x 2 x 128 x 2 B = 6,291,456 B per block
    c = load_model("llama3-8b")
    from kvplan import capacity

    r = capacity(c, load_gpu("h100"), "auto", block_size=48)
    assert r.block_size == 48 and r.bytes_per_block == 48 * 32 * 8 * 2 * 128 * 2


def test_dcp_follows_vllms_kv_head_rule(cli):
    # Llama-3-8B has 8 KV heads: at TP 2 each rank holds 4 distinct heads, none replicated, so vLLM refuses DCP
    one_line_error(cli("capacity", "llama3-8b", "--gpu", "h100", "--tp", "2", "--dcp", "2"), "largest DCP at TP 2 is 1")
    # at TP 16 each of the 8 heads sits on 2 ranks: DCP 2 shards each sequence's tokens over that pair, so a
    # sequence of 8,192 tokens needs cdiv(8192 / 2, 16) = 256 blocks instead of 512, and concurrency doubles
    from kvplan import capacity

    m, g = load_model("llama3-8b"), load_gpu("h100")
    one = capacity(m, g, "auto", tp=16, max_model_len=8192)
    two = capacity(m, g, "auto", tp=16, dcp=2, max_model_len=8192)
    assert (one.blocks_per_request, two.blocks_per_request) == (512, 256)
    assert two.num_blocks == one.num_blocks and two.max_concurrency == pytest.approx(2 * one.max_concurrency)


def test_batch_must_be_whole(cli):
    one_line_error(cli("crossover", "llama3-8b", "--batch", "1.5", "--context", "8k"), "--batch '1.5'")
    # 1.5k is a whole number of tokens: 1,536
    r = cli("crossover", "llama3-8b", "--context", "1.5k", "--json")
    assert r.code == 0 and json.loads(r.out)["operating_points"][0]["context"] == 1536


def test_crossover_notes_a_context_past_the_models_limit(cli):
    r = cli("crossover", "llama3-8b", "--context", "16k", "--json")
    assert r.code == 0
    assert any("exceeds Llama-3-8B's max_position_embeddings 8,192" in n for n in json.loads(r.out)["notes"])
    # by default, only operating points within the model's context: 2,048 and 8,192 for an 8k model
    r = cli("crossover", "llama3-8b", "--json")
    assert [p["context"] for p in json.loads(r.out)["operating_points"]] == [2048, 8192]


def test_nvidia_smi_total_names_the_h100(cli):
    # nvidia-smi prints 81,559 MiB on an H100 SXM = 79.647 GiB, the figure the README quotes
    r = cli("capacity", "llama3-8b", "--gpu-memory-gib", "79.65", "--json")
    assert r.code == 0 and json.loads(r.out)["gpu"] == "H100-SXM5-80GB"


# ----------------------------------------------------------------------------------------------------------------
# --kv-cache-memory: the pool given, the table adds up, and a pool that cannot fit is refused


def test_kv_cache_memory_that_cannot_fit(cli):
    # 500 GiB of pool beside 14.96 GiB of weights on a 79.11 GiB H100
    one_line_error(cli("capacity", "llama3-8b", "--gpu", "h100", "--kv-cache-memory", "500"),
                   "exceed the GPU's 79.11 GiB")


def test_kv_cache_memory_budget_adds_up(cli):
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "--kv-cache-memory", "40")
    assert r.code == 0
    # 79.11 total - 14.96 weights - 40.00 pool = 24.15 left
    assert "79.11 GiB" in r.out and "14.96 GiB" in r.out and "40.00 GiB" in r.out and "24.15 GiB" in r.out
    assert "gpu_memory_utilization" not in r.out
    d = json.loads(cli("capacity", "llama3-8b", "--gpu", "h100", "--kv-cache-memory", "40", "--json").out)
    # 40 GiB // (16 x 32 x 8 x 256 x 2 B = 2 MiB per block) = 20,480 blocks
    assert d["num_blocks"] == 40 * GiB // (16 * 32 * 8 * 256 * 2) == 20480


# ----------------------------------------------------------------------------------------------------------------
# Profiles and calibrations: applied the same everywhere, refused where they do not carry over


def test_profile_from_another_gpu_is_refused(cli, vllm_profile):
    one_line_error(cli("capacity", "--profile", vllm_profile, "--gpu", "a100"), "the profile was measured on H100")


def test_vllm_profile_with_sglang_is_refused(cli, vllm_profile):
    one_line_error(cli("capacity", "--profile", vllm_profile, "--engine", "sglang"), "measured with vllm")


def test_profile_refuses_replacing_what_it_measured(cli, vllm_profile):
    one_line_error(cli("capacity", "--profile", vllm_profile, "--activation-gib", "6"), "has no effect with --profile")


def test_profile_rebases_on_another_batch_size(cli, vllm_profile):
    base = json.loads(cli("capacity", "--profile", vllm_profile, "--json").out)
    more = json.loads(cli("capacity", "--profile", vllm_profile, "--max-num-batched-tokens", "16384", "--json").out)
    # twice the batched tokens: a larger profile-run activation peak, so less KV memory than measured
    assert more["available_kv_bytes"] < base["available_kv_bytes"]
    assert any("re-based for --max-num-batched-tokens" in n for n in more["notes"])


def test_library_applies_the_profile_like_the_cli(cli, vllm_profile):
    import kvplan
    from kvplan.specs.profile import load_profile

    prof = load_profile(vllm_profile)
    lib = kvplan.capacity(load_model(prof.model), profile=prof)
    via_cli = json.loads(cli("capacity", "--profile", vllm_profile, "--json").out)
    assert lib.gpu_memory_utilization == prof.gpu_memory_utilization == via_cli["gpu_memory_utilization"]
    assert lib.max_model_len == prof.max_model_len == via_cli["max_model_len"]
    assert lib.dtype == prof.kv_cache_dtype == via_cli["dtype"]
    assert lib.num_blocks == via_cli["num_blocks"]


def test_sglang_profile_at_another_tp_models_the_weights(cli, sglang_profile):
    one = json.loads(cli("capacity", "--profile", sglang_profile, "--json").out)
    two = json.loads(cli("capacity", "--profile", sglang_profile, "--tp", "2", "--json").out)
    # Llama-3.1-8B at TP 2: the modelled weights of one rank, about half of TP 1's, not the TP-1 figure measured
    assert two["weight_bytes"] < 0.6 * one["weight_bytes"]
    assert any("weights modelled at TP 2" in n for n in two["notes"])


def test_cached_calibration_memory_is_credited(cli, tmp_path, monkeypatch):
    from kvplan.specs.calibration import cache_dir, profile_name

    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    write_calibration(folder / profile_name("NVIDIA H100 80GB HBM3"), 80 * GiB)
    d = json.loads(cli("capacity", "llama3-8b", "--gpu", "h100", "--json").out)
    assert d["total_bytes"] == 80 * GiB
    assert "kvplan measure" in d["memory_source"] and "--gpu-memory-gib" not in d["memory_source"]


def test_calibration_from_another_gpu_is_refused(cli, tmp_path):
    path = write_calibration(tmp_path / "cal.yaml", 80 * GiB, name="NVIDIA A100-SXM4-80GB")
    one_line_error(cli("crossover", "llama3-8b", "--gpu", "h100", "--calibration", path), "not H100")


def test_log_for_another_model_is_refused(cli):
    one_line_error(cli("log", LOG, "--gpu", "h100", "--model", "qwen3-8b"), "the log ran")


# ----------------------------------------------------------------------------------------------------------------
# One deployment, the same figures whichever way it is asked


def test_sglang_prices_bfloat16_at_two_bytes(cli):
    # Llama-3-8B: 8 KV heads x (128 + 128) x 32 layers x 2 bytes = 131,072 B per token, as auto (bf16) is
    rows = json.loads(cli("capacity", "llama3-8b", "--gpu", "h100", "--engine", "sglang", "-d", "bfloat16,auto,fp8",
                          "--json").out)
    assert [r["cell_bytes"] for r in rows] == [131072, 131072, 65536]


def test_plot_and_sweep_infer_the_gpu_like_capacity(cli):
    cap = json.loads(cli("capacity", "llama3-8b", "--gpu-memory-gib", "79.11", "--tp", "2", "-d", "fp8",
                         "--json").out)
    fig = json.loads(cli("plot", "capacity", "llama3-8b", "--gpu-memory-gib", "79.11", "--tp", "2", "-d", "fp8",
                         "--json").out)
    series = fig["series"][0]
    assert series["x"][-1] == 8192 and series["y"][-1] == cap["max_concurrency"]
    rows = json.loads(cli("sweep", "-m", "llama3-8b", "-g", "h100", "--gpu-memory-gib", "79.11", "--tp", "2",
                          "-d", "fp8", "--json").out)
    assert rows[0]["num_blocks"] == cap["num_blocks"]


def test_library_cli_gate_and_sweep_agree(cli, tmp_path):
    """The same deployment gives byte-identical JSON from the library, the CLI and a gate, and the same figures
    in a sweep row."""
    import kvplan
    from kvplan.app.render import _whole_numbers

    argv = ["capacity", "qwen3-8b", "--gpu", "h200", "--tp", "2", "-d", "fp8", "--max-model-len", "16384",
            "--gpu-memory-utilization", "0.85", "--max-num-seqs", "128", "--json"]
    via_cli = cli(*argv).out
    lib = kvplan.capacity(load_model("qwen3-8b"), load_gpu("h200"), "fp8", tp=2, max_model_len=16384,
                          gpu_memory_utilization=0.85, max_num_seqs=128)
    assert json.dumps(_whole_numbers(lib.to_dict()), indent=2) + "\n" == via_cli
    gates = tmp_path / "g.yaml"
    gates.write_text("gates:\n  - {name: q, model: qwen3-8b, gpu: h200, tp: 2, kv_cache_dtype: fp8, "
                     "max_model_len: 16384, gpu_memory_utilization: 0.85, max_num_seqs: 128, "
                     "require: {min_concurrency: 1}}\n")
    report = json.loads(cli("gate", str(gates), "--json").out)
    assert json.dumps(report["gates"][0]["deployment"], sort_keys=True) == json.dumps(
        json.loads(via_cli)["deployment"], sort_keys=True)
    assert report["gates"][0]["checks"][0]["measured"] == json.loads(via_cli)["max_concurrency"]
    rows = json.loads(cli("sweep", "-m", "qwen3-8b", "-g", "h200", "--tp", "2", "-d", "fp8", "--max-model-len",
                          "16384", "--gpu-memory-utilization", "0.85", "--max-num-seqs", "128", "--json").out)
    for key in ("num_blocks", "kv_tokens", "available_kv_bytes", "max_concurrency", "blocks_per_request"):
        assert rows[0][key] == json.loads(via_cli)[key], key


def test_resolve_decides_each_default_once():
    from kvplan.deployment import DeploymentArgs

    d = DeploymentArgs(model="deepseek-v3", gpu="h200", kv_cache_dtype="fp8_ds_mla", tp=8).resolve()
    # MLA on SM90 runs FlashMLA: 64-token blocks; vLLM 0.33 defaults to 0.92 of the memory; a GPU of 160 GiB or
    # less gets `vllm serve`'s 8,192 batched tokens and 1,024 sequences
    assert (d.block_size, d.gpu_memory_utilization, d.max_num_batched_tokens, d.max_num_seqs) == (64, 0.92, 8192,
                                                                                                  1024)
    assert d.to_dict()["kv_cache_dtype"] == "fp8_ds_mla"


# ----------------------------------------------------------------------------------------------------------------
# Several dtypes: each one's problem, and the documented exit code


def test_multi_dtype_run_with_an_unfit_dtype_exits_2(cli):
    # at 6.0 + 14.96 GiB outside the pool, 131,072 B/token (bf16) holds fewer tokens than fp8's 65,536
    r = cli("capacity", "llama-3.1-8b", "--gpu", "h100", "-d", "auto,fp8", "--max-model-len", "131072",
            "--activation-gib", "48")
    assert r.code == 2
    assert r.err.startswith("kvplan: error: auto does not fit") and r.err.count("\n") == 1
    assert "fp8" in r.out  # the dtypes that fit are still shown


def test_profile_supplies_its_layout(cli, vllm_profile, tmp_path):
    # a profile measured at TP 2: without --tp the deployment is the measured one, weights as measured
    p = tmp_path / "tp2.yaml"
    p.write_text(open(vllm_profile).read().replace("tp: 1\n", "tp: 2\n"))
    d = json.loads(cli("capacity", "--profile", str(p), "--json").out)
    assert d["tp"] == 2 and d["non_kv"]["weights_measured"] is True
    d1 = json.loads(cli("capacity", "--profile", str(p), "--tp", "1", "--json").out)
    assert d1["tp"] == 1 and d1["non_kv"]["weights_measured"] is False


def test_calibration_without_gpu_plans_the_gpu_it_was_measured_on(cli, tmp_path):
    """A calibration profile names the GPU it was measured on (nvidia-smi's name for the H100 SXM here): without
    --gpu that GPU is planned, the same as naming it, rather than the option being dropped."""
    path = write_calibration(tmp_path / "cal.yaml", 80 * GiB, name="NVIDIA H100 80GB HBM3")
    alone = json.loads(cli("crossover", "llama3-8b", "-d", "fp8", "--calibration", path, "--json").out)
    named = json.loads(cli("crossover", "llama3-8b", "-d", "fp8", "--calibration", path, "--gpu", "h100",
                           "--json").out)
    assert alone["gpu"] == named["gpu"] == "H100-SXM5-80GB"
    assert alone["operating_points"] == named["operating_points"]
    assert alone["operating_points"][0]["calibrated_step_ms"] is not None
    cap = json.loads(cli("capacity", "llama3-8b", "--calibration", path, "--json").out)
    assert cap["gpu"] == "H100-SXM5-80GB" and cap["total_bytes"] == 80 * GiB  # the memory the profile measured
    assert "GPU taken from the calibration profile: H100-SXM5-80GB, the GPU it was measured on" in cap["notes"]
    unknown = write_calibration(tmp_path / "x.yaml", 80 * GiB, name="Mystery GPU")
    r = cli("crossover", "llama3-8b", "--calibration", unknown)
    assert (r.code, r.err) == (2, f"kvplan: error: the calibration profile {unknown} was measured on Mystery GPU, a "
                                  f"GPU kvplan's catalog does not hold; pass --gpu (a catalog name or a YAML spec)\n")
