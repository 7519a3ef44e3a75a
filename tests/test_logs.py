"""Startup logs: every supported format is read, compared with kvplan's prediction, saved as a profile, and the
profile reproduces the log's own figures. The logs are written from the line formats vLLM and SGLang print."""

import json

import pytest

from kvplan import capacity, load_gpu, load_model
from kvplan.app.log_import import import_log
from kvplan.app.startup_log import parse_startup_log
from kvplan.errors import KvplanError
from kvplan.plan.sglang_pool import sglang_pool
from kvplan.rules.sglang import default_mem_fraction_static
from kvplan.specs.catalog import model_for_repo
from kvplan.specs.profile import load_profile, save_profile

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


TP2_LOG = """\
(APIServer pid=1) INFO 03-02 10:00:00 [api_server.py:1885] vLLM API server version 0.20.1
(EngineCore_DP0 pid=90) INFO 03-02 10:00:09 [core.py:93] Initializing a V1 LLM engine (v0.20.1) with config: \
model='RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8', dtype=torch.bfloat16, max_seq_len=16384, tensor_parallel_size=2, \
pipeline_parallel_size=1, quantization=compressed-tensors, enforce_eager=False, kv_cache_dtype=auto
(Worker_TP0 pid=120) INFO 03-02 10:00:12 [parallel_state.py:1200] world_size=2 rank=0 local_rank=0 \
device NVIDIA H100 80GB HBM3
(Worker_TP0 pid=120) INFO 03-02 10:01:02 [gpu_model_runner.py:2900] Model loading took 33.89 GiB and 41.2 seconds
(Worker_TP1 pid=121) INFO 03-02 10:01:02 [gpu_model_runner.py:2900] Model loading took 33.89 GiB and 41.3 seconds
(Worker_TP1 pid=121) INFO 03-02 10:01:30 [gpu_worker.py:300] Available KV cache memory: 35.37 GiB
(Worker_TP0 pid=120) INFO 03-02 10:01:30 [gpu_worker.py:300] Available KV cache memory: 35.21 GiB
(EngineCore_DP0 pid=90) INFO 03-02 10:01:31 [kv_cache_utils.py:1087] GPU KV cache size: 230,736 tokens
(EngineCore_DP0 pid=90) INFO 03-02 10:01:31 [kv_cache_utils.py:1091] Maximum concurrency for 16,384 tokens per \
request: 14.08x
"""

V0_063_LOG = """\
INFO 11-05 08:00:00 api_server.py:528] vLLM API server version 0.6.3.post1
INFO 11-05 08:00:01 llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) with config: \
model='meta-llama/Meta-Llama-3-8B-Instruct', dtype=torch.bfloat16, max_seq_len=8192, tensor_parallel_size=1, \
pipeline_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto
INFO 11-05 08:00:10 model_runner.py:1067] Loading model weights took 14.9595 GB
INFO 11-05 08:00:13 worker.py:262] Memory profiling results: total_gpu_memory=79.11GiB \
initial_memory_usage=15.44GiB peak_torch_memory=16.19GiB memory_usage_post_profile=15.60GiB \
non_torch_memory=0.15GiB kv_cache_size=54.86GiB gpu_memory_utilization=0.90
INFO 11-05 08:00:13 gpu_executor.py:122] # GPU blocks: 28088, # CPU blocks: 2048
"""


def test_multi_rank_log_and_quantized_repo():
    log = parse_startup_log(TP2_LOG)
    # each rank prints its own figure; the engine sizes the pool by the smaller
    assert log.measured["available_kv_gib"] == 35.21 and log.config["tp"] == 2
    assert log.version == "0.20.1" and log.measured["weights_gib"] == 33.89
    result = import_log(TP2_LOG, "tp2.log")
    # the FP8 checkpoint is Llama-3.1-70B's architecture; compressed-tensors FP8 keeps per-channel scales; the GPU
    # is the one the log names
    assert result.model == "Llama-3.1-70B" and result.profile.weight_dtype == "fp8_channel"
    assert result.profile.gpu == "H100-SXM5-80GB" and result.profile.engine_version == "0.20"
    # 0.20 prints num_blocks // groups x block_size: 230,736 / 16 = 14,421 blocks
    assert {f.name: f.measured for f in result.figures}["KV blocks"] == 230_736 // 16


def test_v0_memory_profiling_results_line():
    log = parse_startup_log(V0_063_LOG)
    assert log.version == "0.6.3"
    assert log.measured["total_gpu_memory_gib"] == 79.11 and log.measured["kv_reserved_gib"] == 54.86
    assert log.measured["non_torch_gib"] == 0.15 and log.config["gpu_memory_utilization"] == 0.9
    assert log.measured["num_gpu_blocks"] == 28_088
    # without --gpu, the GPU is taken from the memory total the log states (79.11 GiB: the H100 SXM's CUDA total)
    result = import_log(V0_063_LOG, "v0.log")
    assert result.profile.gpu == "H100-SXM5-80GB"
    assert any("GPU taken to be H100-SXM5-80GB" in n for n in result.notes)
    assert any("the V0 engine is planned with the rules of vLLM 0.19 and earlier" in n for n in result.notes)


def test_gpu_from_memory_alone():
    from kvplan.specs.catalog import gpu_by_memory

    assert gpu_by_memory(int(79.19 * 2**30)).name == "H100-SXM5-80GB"
    assert gpu_by_memory(int(139.7 * 2**30)).name == "H200-SXM-141GB"
    assert gpu_by_memory(int(60 * 2**30)) is None
    r = capacity(load_model("llama-3.1-8b"), None, "auto", gpu_memory_gib=60, max_model_len=8192)
    assert any("no catalog GPU has 60 GiB" in n for n in r.notes)


def test_model_from_quantized_repo_names():
    assert model_for_repo("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8").name == "Llama-3.1-8B"
    assert model_for_repo("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4").name == "Llama-3.1-70B"
    assert model_for_repo("Qwen/Qwen2.5-7B-Instruct-AWQ").name == "Qwen2.5-7B"
    assert model_for_repo("/models/Llama-3.1-8B-Instruct/").name == "Llama-3.1-8B"


def test_log_with_kv_cache_memory_bytes():
    text = (
        "INFO 11-20 10:01:05 [api_server.py:1880] vLLM API server version 0.33.0\n"
        "INFO 11-20 10:01:05 [utils.py:326] non-default args: {'model': 'meta-llama/Llama-3.1-8B-Instruct', "
        "'max_model_len': 32768, 'kv_cache_memory_bytes': '20G'}\n"
        "INFO 11-20 10:01:31 [gpu_worker.py:660] reserved 20.0 GiB memory for KV Cache as specified by "
        "kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
        "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of KV "
        "cache memory size. If OOM'ed, check the difference of initial free memory between the current run and "
        "the previous run where kv_cache_memory_bytes is suggested and update it correspondingly.\n"
        "INFO 11-20 10:01:31 [kv_cache_utils.py:1150] GPU KV cache size: 163,840 tokens, Maximum concurrency for "
        "32,768 tokens per request: 5.00x\n")
    result = import_log(text, "kvmem.log", gpu="h100")
    fig = {f.name: f for f in result.figures}
    # 20G = 20 x 2^30 B: 10,240 blocks of 2 MiB; 10,240 / 2,048 blocks per request = 5.00x, 163,840 tokens
    assert fig["available KV cache memory"].measured == 20.0 and fig["available KV cache memory"].predicted == 20.0
    assert fig["KV blocks"].measured == fig["KV blocks"].predicted == 10_240
    assert fig["GPU KV cache size"].predicted == 163_840


def test_human_bytes():
    from kvplan.app.log_import import human_bytes

    assert human_bytes("4G") == 4 * 2**30 and human_bytes("4g") == 4 * 10**9 and human_bytes(1024) == 1024
    assert human_bytes("512M") == 512 * 2**20
    with pytest.raises(KvplanError, match="kv_cache_memory_bytes"):
        human_bytes("lots")


def test_entrypoint_from_the_log():
    # an API server's log runs `vllm serve`'s defaults; the offline LLM class logs from entrypoints/llm.py
    assert parse_startup_log(TP2_LOG).config["entrypoint"] == "serve"
    offline = TP2_LOG.replace("(APIServer pid=1) INFO 03-02 10:00:00 [api_server.py:1885] vLLM API server version "
                              "0.20.1", "INFO 03-02 10:00:00 [llm.py:347] Supported tasks: ['generate']")
    assert parse_startup_log(offline).config["entrypoint"] == "llm"
    assert import_log(offline, "offline.log").config["entrypoint"] == "llm"


@pytest.mark.parametrize("first,last", [(LOGS[1], LOGS[0]), (LOGS[0], LOGS[1]), (LOGS[3], LOGS[3])])
def test_restarted_server_reads_the_last_startup(cli, fixtures, tmp_path, first, last):
    """A server restarted with `tee -a` (or `docker logs` of a restarted container) leaves two startups in one file.
    The server running now is the last one, so a vLLM or SGLang user asks about it: kvplan reads only the last
    startup, whole, and says so, rather than the first run's configuration beside the second run's figures."""
    earlier, later = text(fixtures, first), text(fixtures, last)
    both = earlier + later
    alone = parse_startup_log(later)
    log = parse_startup_log(both)
    assert (log.version, log.config, log.measured) == (alone.version, alone.config, alone.measured)
    # the last startup begins at its API server's version line (SGLang: its server_args line), which in the later
    # file comes after the lines before it; line numbers count from 1
    marker = "server_args=" if "sglang" in last else "API server version"
    before = next(i for i, line in enumerate(later.splitlines()) if marker in line)
    assert log.startups == 2 and log.first_line == len(earlier.splitlines()) + before + 1
    path = tmp_path / "two.log"
    path.write_text(both)
    gpu = () if "sglang" in last else ("--gpu", "h100")
    r = cli("log", str(path), *gpu, "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["notes"][0] == (f"the log holds 2 startups (a restarted server appending to one file); read the "
                                f"last, from line {log.first_line}")
    one = tmp_path / "one.log"
    one.write_text(later)
    alone_data = json.loads(cli("log", str(one), *gpu, "--json").out)
    assert data["figures"] == alone_data["figures"] and data["config"] == alone_data["config"]


def test_restart_that_never_measured_names_the_last_startup(cli, fixtures, tmp_path):
    """The last startup cut short (the server is still starting) is not completed from the earlier run's figures."""
    earlier = text(fixtures, LOGS[0])
    cut = "\n".join(line for line in earlier.splitlines() if "KV cache" not in line and "concurrency" not in line)
    path = tmp_path / "restart.log"
    path.write_text(earlier + cut + "\n")
    r = cli("log", str(path), "--gpu", "h100")
    assert r.code == 2 and "Traceback" not in r.err
    first = len(earlier.splitlines()) + next(i for i, line in enumerate(cut.splitlines())
                                             if "API server version" in line) + 1
    assert f"log (its last startup, from line {first}) lacks" in r.err


@pytest.mark.parametrize("kind, expected", [
    ("missing", "no such folder"),
    ("file", "is a file, not a folder"),
    ("empty", "holds no config.json files"),
])
def test_log_configs_that_hold_no_configs_are_refused(tmp_path, kind, expected):
    # a mistyped --configs would otherwise surface later as "not in the catalog", or not at all
    from tests.test_options import LOG, _run

    folder = tmp_path / "configs"
    if kind == "file":
        folder.write_text("a: 1\n")
    elif kind == "empty":
        folder.mkdir()
    code, out, err = _run(["log", LOG, "--gpu", "h100", "--configs", str(folder)])
    assert code == 2 and out == ""
    assert err.startswith(f"kvplan: error: --configs {folder}") and expected in err and err.count("\n") == 1


def test_log_configs_in_a_hugging_face_cache_layout_are_read(tmp_path):
    from tests.test_options import LOG, _run

    snap = tmp_path / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    code, _, err = _run(["log", LOG, "--gpu", "h100", "--configs", str(tmp_path)])
    assert code == 2 and "holds no config.json" in err
    (snap / "config.json").write_text("{}")  # found in the cache layout: read (and refused for what it holds)
    code, _, err = _run(["log", LOG, "--gpu", "h100", "--configs", str(tmp_path)])
    assert "holds no config.json" not in err


def test_gzipped_log_is_read_as_the_log(tmp_path):
    import gzip

    from tests.test_options import LOG, _run

    packed = tmp_path / "startup.log.gz"
    packed.write_bytes(gzip.compress(open(LOG, "rb").read()))
    plain = _run(["log", LOG, "--gpu", "h100", "--json"])
    code, out, err = _run(["log", str(packed), "--gpu", "h100", "--json"])
    assert plain[0] == code == 0, err
    got, want = json.loads(out.replace(str(packed), LOG)), json.loads(plain[1])
    assert got["profile"].pop("source") == packed.name  # the same figures; the profile names its own file
    want["profile"].pop("source")
    assert got == want
    packed.write_bytes(packed.read_bytes()[:100])  # cut short
    code, out, err = _run(["log", str(packed), "--gpu", "h100"])
    assert code == 2 and out == "" and "gzip-compressed but cannot be decompressed" in err and err.count("\n") == 1


def test_log_header_says_when_the_version_is_not_stated():
    # the SGLang fixture names no version: one space and a plain "(version not stated)", not "sglang  startup log"
    from tests.test_options import _run

    code, out, _ = _run(["log", "tests/fixtures/logs/sglang-0.5-llama31-8b-h100.log"])
    assert code == 0 and out.startswith("sglang (version not stated) startup log: ")
    code, out, _ = _run(["log", "tests/fixtures/logs/vllm-v1-0.33-llama31-8b-h100.log", "--gpu", "h100"])
    assert code == 0 and out.startswith("vllm 0.33.0 startup log: ")
