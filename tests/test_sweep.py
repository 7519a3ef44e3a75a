"""The sweep's rows equal what `capacity` and `crossover` answer for the same configuration."""

import json
import math
import random

import pytest

pd = pytest.importorskip("pandas")

from kvplan import capacity, crossover, load_gpu, load_model, sweep  # noqa: E402

MODELS = ["llama3-8b", "mistral-7b-v0.1", "gemma-3-27b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b"]
GPUS = ["h100", "h200", "b200"]


@pytest.fixture(scope="module")
def df():
    return sweep(MODELS, GPUS, tps=[1, 8], dtypes=["auto", "fp8", "turboquant_4bit_nc", "fp8_ds_mla"],
                 max_model_lens=[4096, 32000, 131072], batches=[1, 7, 64], contexts=[100, 2048, 40000])


def test_shape_and_left_out(df):
    # 6 models x 3 GPUs x 2 TP x 4 dtypes, less: fp8_ds_mla on the 5 non-MLA models and turboquant on DeepSeek
    # (2 x 3 x 6 = 36 combinations)
    assert len(df) == (6 * 3 * 2 * 4 - 36) * 27
    assert len(df.attrs["skipped"]) == 36
    assert list(df.columns[:7]) == ["model", "gpu", "tp", "dtype", "max_model_len", "batch", "context"]


def test_sample_rows_equal_capacity_and_crossover(df):
    rng = random.Random(7)
    checked = 0
    for i in rng.sample(range(len(df)), 60):
        row = df.iloc[i]
        m, g = load_model(_key(row["model"])), load_gpu(_gpu_key(row["gpu"]))
        tp, dt, mlen = int(row["tp"]), str(row["dtype"]), int(row["max_model_len"])
        if mlen <= m.max_position_embeddings:
            c = capacity(m, g, dt, tp=tp, max_model_len=mlen)
            assert row["num_blocks"] == c.num_blocks
            assert row["available_kv_bytes"] == c.available_kv_bytes
            assert row["blocks_per_request"] == c.blocks_per_request
            assert row["max_concurrency"] == c.max_concurrency
            assert row["kv_tokens"] == c.kv_tokens
            assert bool(row["fits"]) == c.fits
        else:
            assert not row["fits"]
        x = crossover(m, dt, tp=tp, gpu=g, batches=[int(row["batch"])], contexts=[int(row["context"])])
        p = x.operating_points[0]
        assert row["kv_bytes_per_token"] == x.kv_bytes_per_token
        assert _same(row["crossover_tokens"], x.crossover_tokens)
        for key in ("weight_bytes", "kv_bytes", "step_bytes", "saving", "step_ms"):
            assert row[key] == getattr(p, key), key
        assert row["bound"] == p.bound
        assert _same(row["crossover_tokens_at_batch"], p.crossover_tokens)
        # the step model priced over the grid's arrays, against crossover's one-point price (numpy's elementwise
        # arithmetic may round a last bit differently from Python's)
        assert row["expected_step_ms"] == pytest.approx(p.calibrated_step_ms, rel=1e-12, abs=0), "expected_step_ms"
        checked += 1
    assert checked == 60


def _same(a, b):
    return (b is None and math.isnan(a)) or a == b


def _key(name):
    return {"Llama-3-8B": "llama3-8b", "Mistral-7B-v0.1": "mistral-7b-v0.1", "Gemma-3-27B": "gemma-3-27b",
            "DeepSeek-V3": "deepseek-v3", "Qwen3-30B-A3B": "qwen3-30b-a3b", "gpt-oss-120b": "gpt-oss-120b"}[name]


def _gpu_key(name):
    return {"H100-SXM5-80GB": "h100", "H200-SXM-141GB": "h200", "B200": "b200"}[name]


def test_bad_axes():
    from kvplan.errors import KvplanError

    with pytest.raises(KvplanError, match="contexts"):
        sweep(["llama3-8b"], ["h100"], contexts=[])


def test_sweep_cli_writes_each_format(cli, tmp_path):
    import json

    for suffix in (".csv", ".json", ".md", ".parquet"):
        out = tmp_path / f"grid{suffix}"
        r = cli("sweep", "-m", "llama3-8b,qwen3-8b", "-g", "h100", "-d", "auto,fp8", "--batch", "1,32", "-o",
                str(out))
        assert r.code == 0, r.err
        assert out.exists() and "wrote 8 rows" in r.err
    assert len(json.loads((tmp_path / "grid.json").read_text())) == 8
    assert pd.read_csv(tmp_path / "grid.csv")["num_blocks"].tolist() == pd.read_parquet(
        tmp_path / "grid.parquet")["num_blocks"].tolist()
    md = (tmp_path / "grid.md").read_text().splitlines()
    assert md[0].startswith("| model | gpu |") and len(md) == 2 + 8


def test_sweep_cli_stdout_and_errors(cli):
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100")
    assert r.code == 0 and r.out.splitlines()[0].startswith("model,gpu,tp,dtype")
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", "-o", "out.xlsx")
    assert r.code == 2 and "cannot tell the format" in r.err
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", "-d", "fp8_ds_mla")
    assert r.code == 2 and "no combination" in r.err
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", "--format", "parquet")
    assert r.code == 2 and "binary" in r.err


def test_sweep_cli_columns(cli):
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", "--columns", "model,dtype,max_concurrency")
    assert r.code == 0 and r.out.splitlines()[0] == "model,dtype,max_concurrency"
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", "--columns", "model,concurrency")
    assert r.code == 2 and "did you mean max_concurrency" in r.err


def test_rows_vllm_refuses_say_why_in_capacitys_words(cli):
    """A row capacity refuses carries capacity's reason in `problem` (empty where the row fits), and `fits` is
    False exactly there."""
    from kvplan.errors import KvplanError

    df = sweep(["llama3-8b", "llama-3.1-70b", "llama-3.1-8b"], ["h100"], max_model_lens=[4096, 131072, 1 << 20],
               gpu_memory_utilization=0.3)
    by = {(str(r.model), int(r.max_model_len)): r for r in df.itertuples()}
    for (name, mlen), row in by.items():
        key = {"Llama-3-8B": "llama3-8b", "Llama-3.1-70B": "llama-3.1-70b", "Llama-3.1-8B": "llama-3.1-8b"}[name]
        try:
            c = capacity(load_model(key), load_gpu("h100"), "auto", max_model_len=mlen, gpu_memory_utilization=0.3)
            said = c.problem
        except KvplanError as e:  # refused before any pool is planned
            said = str(e)
        assert (None if pd.isna(row.problem) else row.problem) == said, (name, mlen)
        assert bool(row.fits) == (said is None)
    # Llama-3-8B's positions stop at 8,192: vLLM refuses 131,072 and 1,048,576 outright
    assert by[("Llama-3-8B", 131072)].problem.startswith("--max-model-len 131072 exceeds Llama-3-8B's "
                                                          "max_position_embeddings 8192; vLLM refuses it")
    # 70B parameters in bf16 (over 130 GiB) cannot sit in 30% of 80 GiB: no pool at any length
    assert by[("Llama-3.1-70B", 4096)].available_kv_bytes < 0
    assert "weights" in by[("Llama-3.1-70B", 4096)].problem and "exceed" in by[("Llama-3.1-70B", 4096)].problem
    # one 131,072-token sequence needs 131,072 / 16 = 8,192 blocks of 16 tokens; 30% of the H100 holds fewer
    short = by[("Llama-3.1-8B", 131072)]
    assert short.blocks_per_request == 131072 // 16 and "(8,192 blocks needed" in short.problem
    assert pd.isna(by[("Llama-3.1-8B", 4096)].problem) and by[("Llama-3.1-8B", 4096)].fits
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", "--max-model-len", "1M,8k", "--columns",
            "max_model_len,fits,problem")
    assert r.out.splitlines()[1:] == [
        "1048576,False,\"--max-model-len 1048576 exceeds Llama-3-8B's max_position_embeddings 8192; vLLM refuses it "
        "(lower it, or use a spec with a longer context)\"", "8192,True,"]


@pytest.mark.parametrize("asked, name, fix", [
    (["--json"], "out.csv", "out.json"),
    (["--format", "markdown"], "out.csv", "out.md"),
    (["--format", "csv"], "out.parquet", "out.csv"),
])
def test_sweep_refuses_a_format_the_file_name_contradicts(cli, tmp_path, asked, name, fix):
    out = tmp_path / name
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", *asked, "-o", str(out))
    assert r.code == 2 and not out.exists()
    assert r.err.count("\n") == 1 and str(tmp_path / fix) in r.err and "--format" in r.err


def test_sweep_format_that_agrees_with_the_file_name(cli, tmp_path):
    # --format that names the suffix's own format, or a suffix kvplan does not read, is written as asked
    for asked, name in ((["--json"], "a.json"), (["--format", "markdown"], "a.markdown"),
                        (["--format", "csv"], "a.txt")):
        r = cli("sweep", "-m", "llama3-8b", "-g", "h100", *asked, "-o", str(tmp_path / name))
        assert r.code == 0, r.err


@pytest.mark.parametrize("fmt", [[], ["--format", "csv"]])
def test_sweep_output_folder_is_named_as_a_folder(cli, tmp_path, fmt):
    r = cli("sweep", "-m", "llama3-8b", "-g", "h100", *fmt, "-o", str(tmp_path))
    assert r.code == 2 and r.err.count("\n") == 1
    assert f"--output {tmp_path} is a folder" in r.err and str(tmp_path / "sweep.csv") in r.err


def test_files_write_whole_byte_counts_as_integers(cli, tmp_path):
    # Llama-3-8B at batch 1 x 8,192: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B per token, and the
    # step's KV read 8,192 x 131,072 = 1,073,741,824 B; written as those integers in CSV, JSON and markdown
    args = ["sweep", "-m", "llama3-8b", "-g", "h100", "-b", "1", "-c", "8k", "--columns",
            "kv_bytes_per_token,kv_bytes,step_bytes,weight_bytes,crossover_tokens"]
    r = cli(*args)
    head, row = r.out.splitlines()[:2]
    cells = dict(zip(head.split(","), row.split(","), strict=True))
    assert cells["kv_bytes_per_token"] == "131072" and cells["kv_bytes"] == "1073741824"
    assert int(cells["step_bytes"]) == int(cells["weight_bytes"]) + 1073741824
    assert cells["crossover_tokens"] == str(int(cells["weight_bytes"]) / 131072)  # N* = weights / B per token
    rows = json.loads(cli(*args, "--json").out)
    assert rows[0]["kv_bytes_per_token"] == 131072 and isinstance(rows[0]["kv_bytes"], int)
    md = cli(*args, "--format", "markdown").out.splitlines()[2]
    assert f"| 131072 | 1073741824 | {cells['step_bytes']} | {cells['weight_bytes']} |" in md
    assert "e+" not in md
