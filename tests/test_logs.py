"""Startup logs: every supported format is read, compared with kvplan's prediction, saved as a profile, and the
profile reproduces the log's own figures. The logs are written from the line formats vLLM and SGLang print."""

import json

import pytest

from kvplan import capacity, load_gpu, load_model
from kvplan.deploy import import_log, load_profile, model_for_repo, save_profile
from kvplan.errors import KvplanError
from kvplan.sglang import default_mem_fraction_static, sglang_pool
from kvplan.startup_log import parse_startup_log

LOGS = ["vllm-v1-0.33-llama31-8b-h100.log", "vllm-v1-0.10-llama31-8b-h100.log", "vllm-v0-0.6-llama3-8b-h100.log",
        "sglang-0.5-llama31-8b-h100.log"]


def text(fixtures, name):
    return (fixtures / "logs" / name).read_text()


def test_vllm_v1_figures(fixtures):
    log = parse_startup_log(text(fixtures, LOGS[0]))
    assert log.engine == "vllm" and log.version == "0.33.0"
    assert log.config["max_model_len"] == 32768 and log.config["gpu_memory_utilization"] == 0.9
    assert log.measured["available_kv_gib"] == 53.1 and log.measured["kv_tokens"] == 434_992
    assert log.measured["max_concurrency"] == 13.27 and log.measured["weights_gib"] == 14.9889


def test_old_v1_and_v0_figures(fixtures):
    old = parse_startup_log(text(fixtures, LOGS[1]))
    assert old.measured["total_gpu_memory_gib"] == 79.19 and old.measured["kv_reserved_gib"] == 54.96
    assert old.measured["activation_peak_gib"] == 1.19 and old.measured["non_torch_gib"] == 0.13
    v0 = parse_startup_log(text(fixtures, LOGS[2]))
    assert v0.measured["num_gpu_blocks"] == 27_909 and v0.measured["weights_gib"] == 14.9595


@pytest.mark.parametrize("name", LOGS)
def test_round_trip(fixtures, tmp_path, name):
    result = import_log(text(fixtures, name), name, gpu="h100")
    path = tmp_path / "profile.yaml"
    save_profile(result.profile, path)
    prof = load_profile(path)
    assert prof == result.profile
    m = load_model(prof.model)
    if prof.engine == "vllm":
        # the profile reproduces the log's blocks (and so its tokens and concurrency) exactly
        logged = {f.name: f.measured for f in result.figures}
        again = capacity(m, None, prof.kv_cache_dtype, profile=prof, max_model_len=prof.max_model_len,
                         gpu_memory_utilization=prof.gpu_memory_utilization)
        assert again.num_blocks == logged["KV blocks"]
        if logged.get("GPU KV cache size") is not None:
            assert again.kv_tokens == logged["GPU KV cache size"]
        assert f"{again.max_concurrency:.2f}" == f"{logged['maximum concurrency']:.2f}"
        # a what-if on the same deployment: fp8 halves the page, so the same pool holds twice the blocks
        fp8 = capacity(m, None, "fp8", profile=prof, max_model_len=prof.max_model_len,
                       gpu_memory_utilization=prof.gpu_memory_utilization)
        assert fp8.num_blocks in (2 * again.num_blocks, 2 * again.num_blocks + 1)
    else:
        again = sglang_pool(m, None, prof.kv_cache_dtype, tp=prof.tp, mem_fraction_static=prof.mem_fraction_static,
                            context_len=prof.max_model_len, free_before_load_gib=prof.free_before_load_bytes / 2**30,
                            weight_gib=prof.weights_bytes / 2**30)
        assert again.max_total_num_tokens == 414_167


def test_sglang_arithmetic(fixtures):
    # free before 78.56 GiB, after weights 63.52, f = 0.835: 63.52 - 0.165 x 78.56 = 50.5576 GiB
    # / 131,072 B per token (32 layers x 8 heads x 256 x 2 B) = 414,167 tokens
    result = import_log(text(fixtures, LOGS[3]), LOGS[3])
    fig = {f.name: f for f in result.figures}
    assert fig["max_total_num_tokens (from the log's free memory)"].predicted == 414_167 == int(50.5576 * 8192)
    assert fig["K size"].predicted == 25.28  # (414,167 + 1 padding) x 65,536 B / 2^30
    assert fig["max_running_requests"].predicted == 2048


def test_sglang_default_fraction():
    # nvidia-smi 81,559 MiB; reserve 512 + 1.5 x 8192 + 1/8 x 1024 + 2 x 256 = 13,440 MB (above the 10 GB floor)
    assert default_mem_fraction_static(load_model("llama-3.1-8b"), load_gpu("h100"), 1) == round(
        (81559 - 13440) / 81559, 3) == 0.835


def test_model_from_repo_names():
    assert model_for_repo("meta-llama/Llama-3.1-8B-Instruct").name == "Llama-3.1-8B"
    assert model_for_repo("meta-llama/Meta-Llama-3-8B-Instruct").name == "Llama-3-8B"
    assert model_for_repo("Qwen/Qwen3-30B-A3B").name == "Qwen3-30B-A3B"
    with pytest.raises(KvplanError, match="pass --model"):
        model_for_repo("acme/secret-13b")


@pytest.mark.parametrize("body, says", [
    ("hello\nworld\n", "not a vLLM or SGLang startup log"),
    ("INFO vLLM API server version 0.33.0\nINFO Available KV cache memory: 12.0 GiB\n",
     "lacks 'GPU KV cache size: N tokens'"),
    ("INFO vLLM API server version 0.33.0\nINFO GPU KV cache size: 1,000 tokens\n",
     "lacks 'Available KV cache memory: X GiB'"),
    ("[x] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct')\n[x] KV Cache is allocated. dtype: "
     "torch.bfloat16, #tokens: 10, K size: 1.00 GB, V size: 1.00 GB\n", "lacks max_total_num_tokens"),
])
def test_logs_missing_lines(cli, tmp_path, body, says):
    p = tmp_path / "startup.log"
    p.write_text(body)
    r = cli("log", str(p), "--gpu", "h100")
    assert r.code == 2 and says in r.err and r.err.count("\n") == 1


def test_log_cli_stdin_json_and_profile(cli, fixtures, tmp_path, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(text(fixtures, LOGS[0])))
    prof = tmp_path / "dep.yaml"
    r = cli("log", "-", "--gpu", "h100", "--json", "--save-profile", str(prof))
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["engine"] == "vllm" and {f["name"] for f in d["figures"]} >= {"available KV cache memory", "KV blocks"}
    r = cli("capacity", "--profile", str(prof), "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["kv_tokens"] == 434_992
    r = cli("capacity", "qwen3-8b", "--profile", str(prof))
    assert r.code == 2 and "measured on Llama-3.1-8B" in r.err
    (tmp_path / "bad.yaml").write_text("schema: other/9\n")
    r = cli("capacity", "--profile", str(tmp_path / "bad.yaml"))
    assert r.code == 2 and "schema" in r.err
