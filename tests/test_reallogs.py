"""The development set: 29 real vLLM 0.19 startup logs on H100 (tests/fixtures/logs/vllm-0.19-h100, with their
models' config.json files in tests/fixtures/configs). Every figure kvplan predicts is checked against what the
engine printed; the expected figures below are the logs' own (figures.csv), not kvplan's."""

import csv
import io
import json
import statistics
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from kvplan.app.cli import main
from kvplan.app.log_import import import_log
from kvplan.app.startup_log import parse_startup_log
from kvplan.sizing.weight_allocations import allocator_rounding
from kvplan.specs.catalog import model_for_repo
from kvplan.specs.hub import find_config

FIX = Path(__file__).resolve().parent / "fixtures"
LOGS = FIX / "logs" / "vllm-0.19-h100"
CONFIGS = FIX / "configs"
FIGURES = {row["log_file"]: row for row in csv.DictReader((LOGS / "figures.csv").open())}
OK = sorted(name for name, row in FIGURES.items() if row["status"] == "ok")
FAILED = sorted(name for name, row in FIGURES.items() if row["status"] == "failed")


@pytest.fixture(scope="module")
def results():
    return {name: import_log((LOGS / name).read_text(), name, configs=[CONFIGS]) for name in FIGURES}


def _figure(result, name):
    return next(f for f in result.figures if f.name == name)


def test_the_set_is_complete():
    assert len(OK) == 22 and len(FAILED) == 7


@pytest.mark.parametrize("name", OK)
def test_available_kv_memory_within_one_percent(results, name):
    r = results[name]
    measured = float(FIGURES[name]["kv_cache_memory_gib"])
    f = _figure(r, "available KV cache memory")
    assert f.measured == pytest.approx(measured, abs=0.005)
    # Kimi-Dev-72B at TP 2 is the hardest: a 3.02 GiB pool beside 67.82 GiB of weights, so 1% is 31 MiB
    assert abs(f.error_pct) < 1.0, f"{name}: {f.predicted} GiB predicted, {measured} GiB in the log"
    # the blocks follow the memory: the log's own block count, to the same relative error
    blocks = _figure(r, "KV blocks")
    assert blocks.measured == int(FIGURES[name]["kv_cache_blocks"])


@pytest.mark.parametrize("name", OK)
def test_weights_within_half_a_percent(results, name):
    f = _figure(results[name], "model weights")
    assert f.measured == float(FIGURES[name]["weight_memory_gib"])
    # the parameters' bytes, the rotary cache and the caching allocator's whole segments: the log prints two
    # decimals, so 0.005 GiB of rounding is 0.1% of granite-3.1-2b's 4.74 GiB
    assert abs(f.error_pct) < 0.15, f"{name}: {f.predicted} GiB predicted, {f.measured} GiB in the log"


@pytest.mark.parametrize("repo, tp, blocks_mib", [
    # Qwen2.5-7B, bf16, TP 1, per layer: qkv_proj 4,608 x 3,584 x 2 B = 31.5 MiB in a 32 MiB segment (+0.5),
    # o_proj 3,584 x 3,584 x 2 B = 24.5 MiB split off a 26 MiB segment (1.5 MiB left, +0), gate_up
    # 37,888 x 3,584 x 2 B = 259 MiB in 260 (+1), down 129.5 MiB in 130 (+0.5): 2 MiB x 28 layers, and the embedding
    # and LM head, 152,064 x 3,584 x 2 B = 1,039.5 MiB each in 1,040 (+0.5 each): 57 MiB (the log: 14.25 GiB against
    # 14.185 GiB of parameters and 8 MiB of rotary cache, +58 +- 5 MiB)
    ("Qwen/Qwen2.5-7B-Instruct", 1, 57),
    # Kimi-Dev-72B (Qwen2-72B), TP 2: down 8,192 x 14,784 x 2 B = 231 MiB in a 232 MiB segment, +1 x 80 layers; qkv
    # (80 MiB), o_proj (64), gate_up (462) and the vocabulary halves (1,188) are whole 2 MiB multiples
    ("moonshotai/Kimi-Dev-72B", 2, 80),
    # gemma-2-2b: gate_up 18,432 x 2,304 x 2 B = 81 MiB in 82 (+1) x 26 layers, and the tied embedding
    # 256,000 x 2,304 x 2 B = 1,125 MiB in 1,126 (+1); o_proj (9 MiB) packs two to a 20 MiB segment (2 MiB left,
    # split), down (40.5 MiB) splits 1.5 MiB off 42: 27 MiB (the log: +27 +- 5 MiB)
    ("google/gemma-2-2b-it", 1, 27),
    # Llama-3.1-8B: every tensor a whole number of 2 MiB
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 0),
])
def test_weights_held_in_whole_segments(repo, tp, blocks_mib):
    assert allocator_rounding(model_for_repo(repo, [CONFIGS]), tp) == blocks_mib * 2**20


@pytest.mark.parametrize("name", OK)
def test_non_kv_parts(results, name):
    # the activation peak and the non-torch increase the profile printed, part by part
    r, row = results[name], FIGURES[name]
    act = _figure(r, "activation peak")
    assert act.measured == float(row["activation_memory_gib"])
    nt = _figure(r, "non-torch memory")
    assert nt.measured == float(row["non_torch_forward_gib"])
    # the Granite text models' 0.46 GiB non-torch increase and Granite-3.3-8B's compiled peak are not modelled
    granite_text = "granite-3" in name and "visi" not in name
    assert abs(nt.predicted - nt.measured) < (0.25 if granite_text else 0.04)
    assert abs(act.predicted - act.measured) < (0.07 if granite_text else 0.03)


def test_summary_median_and_worst():
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["log", *map(str, sorted(LOGS.glob("*.log"))), "--configs", str(CONFIGS), "--summary", "--json"])
    assert code == 0, err.getvalue()
    data = json.loads(out.getvalue())
    assert len(data["logs"]) == 29 and data["unread"] == 0
    kv = data["available_kv"]
    assert kv["compared"] == 22 and kv["median_abs_error_pct"] <= 0.5
    errs = [abs(row["available_kv"]["error_pct"]) for row in data["logs"] if "available_kv" in row]
    assert kv["median_abs_error_pct"] == pytest.approx(statistics.median(errs))
    assert data["weights"]["worst_abs_error_pct"] < 0.6
    assert data["failures"]["logs"] == 7 and data["failures"]["predicted"] == 7


@pytest.mark.parametrize("name", [n for n in FIGURES if "Graph capturing finished" in (LOGS / n).read_text()])
def test_cuda_graph_capture_within_a_fifth_of_a_gib(results, name):
    # "Graph capturing finished in N secs, took X GiB": the warm-up's activations and their captured copy, the capture
    # stream's cuBLAS workspace, FlashAttention 3's split-KV accumulators and every graph's driver memory. Llama-3.1-8B:
    # 2 x 46 + 32 + 258 + 51 x (6 + 4) = 892 MiB = 0.87 GiB against 0.91; gpt-oss-20b TP 1: 2 x 56 + 32 + 504 +
    # 83 x (10 + 6) = 1,976 MiB = 1.93 GiB against 1.84 (kvplan's estimate alone was 0.71). Worst: Kimi-Dev-72B at
    # TP 2, 1.79 against 1.61 (its 80 layers' graphs cost 24 MiB a size, kvplan's rule 28)
    f = _figure(results[name], "CUDA-graph capture")
    assert f.measured is not None and abs(f.predicted - f.measured) <= 0.2, (name, f.predicted, f.measured)


@pytest.mark.parametrize("name, says", [
    ("codellama-codellama-34b---h100-80gb--tp2pp1dp1--8192.FAILED.log", "60.87 GiB once its CUDA context"),
    ("moonshotai-kimi-dev-72b--h100-80gb--tp4pp1dp1--8192.FAILED.log", "60.85 GiB once its CUDA context"),
    ("meta-llama-llama-4-scout--h100-80gb--tp4pp1dp1--8192.FAILED.log", "60.33 GiB once its CUDA context"),
    ("qwen-qwen3-14b--h100-80gb--tp5pp1dp1--8192.FAILED.log", "151936 is not divisible by 5"),
    ("microsoft-phi-2--h100-80gb--tp1pp1dp1--8192.FAILED.log", "max_position_embeddings 2048"),
    # after the KV cache: the sampler's 2.68 GiB (1,024 x 201,088 bf16 logits, fp32 logits, probabilities, q) does
    # not fit what the MXFP4 experts' conversion left fragmented and the CUDA graphs took
    ("openai-gpt-oss-20b--h100-80gb--tp2pp1dp1--8192.FAILED.log", "run out of memory warming up the sampler"),
    # TP 1 too, once the CUDA-graph capture is what it takes (1.93 GiB by kvplan, 1.84 in the log): 2.31 GiB left
    # for the 2.68 GiB (the log: 2.46 left, 0.22 GiB short)
    ("openai-gpt-oss-20b--h100-80gb--tp1pp1dp1--8192.FAILED.log", "2.31 GiB are left"),
])
def test_failures_predicted_as_what_they_are(results, name, says):
    r = results[name]
    assert r.failure is not None and r.failure_predicted
    assert says in r.predicted_failure


def test_failure_lines_parsed():
    log = parse_startup_log((LOGS / "codellama-codellama-34b---h100-80gb--tp2pp1dp1--8192.FAILED.log").read_text())
    assert log.failure["kind"] == "free_memory"
    assert (log.failure["free_gib"], log.failure["total_gib"], log.failure["requested_gib"]) == (60.87, 79.19, 75.23)
    oom = parse_startup_log((LOGS / "openai-gpt-oss-20b--h100-80gb--tp1pp1dp1--8192.FAILED.log").read_text())
    assert oom.failure["kind"] == "sampler_warmup" and oom.failure["rows"] == 1024
    # it failed after sizing its pool: those figures are there
    assert oom.measured["available_kv_gib"] == 58.47 and oom.measured["weights_gib"] == 13.64


def test_the_snapshot_and_profile_lines():
    log = parse_startup_log((LOGS / "qwen-qwen2-5-7b-instruct--h100-80gb--tp2pp1dp1--8192.log").read_text())
    m = log.measured
    assert (m["init_free_gib"], m["total_gpu_memory_gib"], m["init_used_gib"]) == (77.66, 79.19, 1.53)
    assert (m["non_kv_gib"], m["activation_peak_gib"], m["non_torch_gib"]) == (11.39, 2.21, 2.06)
    assert m["requested_gib"] == 75.23 and m["cudagraph_estimated_gib"] == 0.61


def test_config_lookup_by_repo_id(tmp_path, monkeypatch):
    # the fixtures' <org>--<name>.config.json, case-insensitively (the log says redhatai/, the file RedHatAI--)
    assert find_config("redhatai/Qwen2.5-7B-Instruct-quantized.w8a8", [CONFIGS]).name.startswith("RedHatAI--")
    # a Hugging Face cache layout: models--org--name/snapshots/<revision>/config.json
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert find_config("acme/tiny") == snap / "config.json"
    assert find_config("acme/other") is None


@pytest.mark.parametrize("tp, log_gib", [(1, 1.78), (2, 1.62)])
def test_mxfp4_conversion_fragments(tp, log_gib):
    # gpt-oss-20b's OOM message: "X GiB is reserved by PyTorch but unallocated", with no free block as large as
    # the 393 MiB of bf16 logits it then asked for; the replayed conversion leaves 1.93 and 1.39 GiB, in blocks of at
    # most 129 and 67 MiB
    from kvplan.sizing.vllm_mxfp4_hopper import mxfp4_hopper_load

    _, frag, largest = mxfp4_hopper_load(model_for_repo("openai/gpt-oss-20b", [CONFIGS]), tp)
    assert abs(frag / 2**30 - log_gib) < 0.25
    assert largest < 1024 * 201_088 * 2


@pytest.mark.parametrize("name, weights, kv", [
    ("openai-gpt-oss-20b--h100-80gb--tp1pp1dp1--8192.FAILED.log", 13.64, 58.47),
    ("openai-gpt-oss-20b--h100-80gb--tp2pp1dp1--8192.FAILED.log", 7.01, 63.28),
])
def test_gpt_oss_figures_before_the_failure(results, name, weights, kv):
    # it sized its pool before failing: the converted experts as the allocator holds them, and the float32 rotary
    # cache (131,072 positions x 64 x 4 B = 32 MiB)
    r = results[name]
    assert abs(r.figure("model weights").predicted - weights) < 0.01
    assert abs(r.figure("available KV cache memory").predicted - kv) < 0.01
