"""vLLM's non-KV memory in closed form, against the worked arithmetic derived from vLLM's source (Llama-3.1-8B,
bf16, TP 1, H100 SXM, `vllm serve` defaults: 8,192 batched tokens, 1,024 sequences, vocab 128,256)."""

import pytest

from kvplan import capacity, load_gpu, load_model
from kvplan.nonkv import (LIBRARY_NON_TORCH, NCCL_COMMUNICATOR, _capture_sizes, _forward_peak, non_kv_memory,
                          serve_defaults, transport)

MiB, GiB = 2**20, 2**30
H100 = load_gpu("h100")
L31 = load_model("llama-3.1-8b")
W = 2 * 8_030_261_248


def run(version, **kw):
    return non_kv_memory(L31, H100, total_bytes=H100.memory_total_bytes, tp=1, weights=W, version=version,
                         max_model_len=131072, **kw)


def test_serve_defaults():
    def d(gpu, version):
        g = load_gpu(gpu)
        r = serve_defaults(g.memory_total_bytes, g, version, 131072)
        return r.max_num_batched_tokens, r.max_num_seqs

    assert d("h100", "0.33") == (8192, 1024)
    assert d("a100", "0.33") == (2048, 256)  # 80 GB, but A100s keep the small defaults
    assert d("b200", "0.33") == (16384, 1024)
    assert d("b200", "0.20") == (8192, 1024)
    # the offline LLM class batches more: 16,384 tokens on 70 GiB+ GPUs (A100s excepted, 8,192 with 256 seqs)
    def llm(gpu, version):
        g = load_gpu(gpu)
        r = serve_defaults(g.memory_total_bytes, g, version, 131072, "llm")
        return r.max_num_batched_tokens, r.max_num_seqs

    assert llm("h100", "0.33") == (16384, 1024) and llm("a100", "0.33") == (8192, 256)
    assert llm("b200", "0.20") == (16384, 1024)


def test_forward_terms():
    peak, parts = _forward_peak(L31, 8192, 1, 2)
    assert parts["mlp"] == 8192 * 2 * (4096 + 3 * 14336) == 736 * MiB   # residual + gate_up + act
    assert parts["attention"] == 8192 * 2 * (2 * 4096 + 3 * 4096 + 3 * 1024) == 368 * MiB
    assert peak == 736 * MiB


def test_eager_mlp_and_pipeline_stages():
    # eager (-O0 / --enforce-eager): the caller still holds the RMSNorm output while the MLP runs: 800 MiB
    peak, parts = _forward_peak(L31, 8192, 1, 2, eager=True)
    assert parts["mlp"] == 8192 * 2 * (2 * 4096 + 3 * 14336) == 800 * MiB
    # PP 2 on 0.30 (whose sampler pass stays below the MLP): the first stage holds the forward only (736 MiB +
    # the 32 MiB cuBLAS workspace lands in consumed memory, not here); the last stage also keeps the persistent
    # IntermediateTensors it receives, hidden + residual = 2 x 8192 x 4096 x 2 B = 128 MiB
    first = run("0.30", last_stage=False)
    last = run("0.30", first_stage=False)
    assert first.activation == 736 * MiB and last.activation == 736 * MiB + 128 * MiB


def test_sampler_sets_the_peak_in_020_and_033():
    # 0.20: bf16 logits 250.5 MiB + fp32 logits, probs, q (12 x R x V = 1,503 MiB) + Triton buffer 132 x V x 4
    # (64.6 MiB) + hold (hidden states 64 MiB + 2 x 1024 rows x 4096 x 2 = 16 MiB): 1,898 MiB
    v020 = run("0.20")
    expect = 2 * 1024 * 128256 + 12 * 1024 * 128256 + 4 * 132 * 128256 + 8192 * 4096 * 2 + 2 * 1024 * 4096 * 2
    assert round(expect / MiB) == 1898
    # the profile run's first GEMM also makes the main stream's cuBLAS workspace (32 MiB on SM90) inside the peak
    assert v020.activation == expect + 32 * MiB
    # 0.30: the default sampler pass keeps bf16 logits only: 250 + 80 MiB < 736 MiB, so the MLP sets the peak
    assert run("0.30").activation == 736 * MiB
    # 0.33: the warm-up pass adds the fp32 pipeline again: 1,753 + 80 = 1,834 MiB
    assert round(run("0.33").activation / MiB) == 1834


def test_persistent_penalty_state_and_rotary():
    # MRV2 (0.30+) allocates output_bin_counts [1024, V] int32 and prompt_bin_mask [1024, ceil(V/32)] int32: 517 MiB
    pen = 4 * 1024 * 128256 + 4 * 1024 * -(-128256 // 32)
    assert round(pen / MiB) == 517
    assert run("0.33").persistent == pen
    assert run("0.30").persistent == pen + 32 * MiB  # plus the main stream's cuBLAS workspace (SM90)
    assert run("0.20").persistent == 0  # the V1 runner's input buffers are charged nowhere
    # rotary cos/sin cache: 131,072 positions x 128 x 2 B = 32 MiB, on top of the parameters
    assert run("0.33").weights == W + 32 * MiB


def test_cudagraph_estimate():
    # H100 defaults: capture sizes 1, 2, 4, 8..248 by 8, 256..512 by 16: 51 sizes, all FULL-capturable (<= 1024)
    sizes = _capture_sizes(512)
    assert len(sizes) == 51 and sizes[-1] == 512
    f_cg = 512 * 2 * (4096 + 3 * 14336)  # the MLP at 512 tokens: 46 MiB
    assert round(f_cg / MiB) == 46
    assert run("0.33").cudagraph == 2 * f_cg + 32 * MiB + 50 * 4 * MiB + 50 * 1 * MiB
    assert run("0.33", enforce_eager=True).cudagraph == 0
    # 0.20: two samples per mode extrapolated, 51 piecewise + 51 full graphs - 2 at 4 MiB each
    assert run("0.20").cudagraph == f_cg + 32 * MiB + 100 * 4 * MiB
    # 0.19 measures the estimate and logs it, but does not subtract it (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)
    v019 = run("0.19")
    assert v019.cudagraph == 0 and v019.parts["cudagraph_estimate"] == run("0.20").cudagraph


def test_flashinfer_attention_workspace_on_sm100():
    # B200 (SM100) runs FlashInfer for GQA: its 394 MiB workspace is made at the first FULL warm-up, inside the
    # estimate; 0.33 on SM100 captures up to min(2 x 1024, 1024, 16384) = 1024 tokens: 51 + 32 sizes (272..1024)
    b200 = load_gpu("b200")
    nk = non_kv_memory(L31, b200, total_bytes=b200.memory_total_bytes, tp=1, weights=W, version="0.33",
                       max_model_len=131072)
    assert (nk.max_num_batched_tokens, nk.parts["capture_sizes"]) == (16384, 83)
    f_cg = 1024 * 2 * (4096 + 3 * 14336)
    assert nk.cudagraph == 2 * f_cg + 32 * MiB + 82 * 4 * MiB + 82 * MiB + 394 * MiB
    # MLA models run FlashMLA / CUTLASS MLA instead: no FlashInfer workspace
    ds = load_model("deepseek-v3")
    nk_ds = non_kv_memory(ds, b200, total_bytes=b200.memory_total_bytes, tp=8, weights=0, version="0.33",
                          max_model_len=4096)
    f_ds = _forward_peak(ds, 1024, 8, 2, with_moe_workspace=False)[0]
    assert nk_ds.cudagraph == 2 * f_ds + 32 * MiB + 82 * 4 * MiB + 82 * MiB


def test_tp_adds_the_allreduce_workspace():
    # FlashInfer all-reduce fusion on SM90: 4 x tp x S_fi + 2 MiB; S_fi 64 MB at TP 2 -> 514 MiB, 0.5 MB at TP 8
    m = load_model("llama-3.1-70b")
    nk2 = non_kv_memory(m, H100, total_bytes=H100.memory_total_bytes, tp=2, weights=0, version="0.33",
                        max_model_len=131072)
    nk8 = non_kv_memory(m, H100, total_bytes=H100.memory_total_bytes, tp=8, weights=0, version="0.33",
                        max_model_len=131072)
    fi = "flashinfer_allreduce_workspace"
    assert nk2.parts[fi] == 514 * MiB and nk8.parts[fi] == 18 * MiB
    # 0.33 makes torch's NCCL communicator before the snapshot: beyond the workspace only the libraries' own memory
    assert nk2.non_torch == 514 * MiB + LIBRARY_NON_TORCH and nk2.parts["torch_nccl_communicator"] == 0
    # tp 4: round2M(4 x 2 MiB) + round2M(4 KiB) + round2M(3 x 4 x 2 MiB) = 8 + 2 + 24 = 34 MiB
    nk4 = non_kv_memory(m, H100, total_bytes=H100.memory_total_bytes, tp=4, weights=0, version="0.33",
                        max_model_len=131072)
    assert nk4.parts[fi] == 34 * MiB


def test_allreduce_workspace_conditions():
    # the fusion pass caps S at one batch's hidden states: Llama-3.2-3B (H 3,072) at 2,048 batched tokens holds
    # 2048 x 3072 x 2 = 12 MiB < 64 MiB, so TP 2 takes round2M(24) + 2 + round2M(72) = 98 MiB
    m = load_model("llama-3.2-3b")

    def nt(version, gpu=H100, **kw):
        return non_kv_memory(m, gpu, total_bytes=gpu.memory_total_bytes, tp=2, weights=0, version=version,
                             max_model_len=8192, max_num_batched_tokens=2048,
                             **kw).parts["flashinfer_allreduce_workspace"]

    assert nt("0.33") == 98 * MiB
    # 0.33 without compilation: the standalone FlashInfer all-reduce makes the uncapped 514 MiB workspace
    assert nt("0.33", enforce_eager=True) == 514 * MiB
    # 0.20: no standalone FlashInfer all-reduce, and the fusion pass needs one pipeline stage and compilation
    assert nt("0.20") == 98 * MiB
    assert nt("0.20", enforce_eager=True) == 0 and nt("0.20", pp=2) == 0
    # no FlashInfer all-reduce on an A100 (SM80)
    assert nt("0.33", gpu=load_gpu("a100")) == 0


def test_non_torch_libraries_and_lazy_nccl():
    # vLLM 0.19/0.20 make torch's NCCL communicator inside the profile run: with TP 2 on an H100 SXM (NVLink SHARP)
    # the non-torch increase is the libraries' 256 MiB + the communicator's 1,392 MiB + the FlashInfer workspace.
    # Qwen2.5-7B at 8,192 batched tokens: S = 8192 x 3584 x 2 B = 56 MiB < 64 MiB, so round2M(112) + 2 + round2M(336)
    # = 450 MiB; 256 + 1392 + 450 = 2,098 MiB = 2.05 GiB (the 0.19 log: 2.06 GiB)
    m = load_model("qwen2.5-7b")

    def nk(tp, version="0.19", gpu=H100):
        return non_kv_memory(m, gpu, total_bytes=gpu.memory_total_bytes, tp=tp, weights=0, version=version,
                             max_model_len=8192, max_num_batched_tokens=8192)

    assert nk(2).non_torch == (256 + 1392 + 450) * MiB
    assert nk(1).non_torch == LIBRARY_NON_TORCH == 256 * MiB  # the TP-1 logs: 0.24-0.26 GiB
    # from 0.30 the communicator exists before the snapshot: charged to nothing
    assert nk(2, "0.30").parts["torch_nccl_communicator"] == 0
    # an A100 SXM has NVLink without NVLS, and no FlashInfer all-reduce (SM80)
    assert nk(2, gpu=load_gpu("a100")).non_torch == 256 * MiB + NCCL_COMMUNICATOR["nvlink"]
    assert transport(load_gpu("l40s")) == "pcie" and transport(H100) == "nvls"


def test_capacity_uses_the_model_by_default():
    r = capacity(L31, H100, "auto", max_model_len=131072)
    nk = r.non_kv
    expected = -(-H100.memory_total_bytes * 92 // 100) - nk["total"]
    assert abs(r.available_kv_bytes - expected) <= 1
    assert nk["total"] == nk["weights"] + nk["activation"] + nk["persistent"] + nk["non_torch"] + nk["cudagraph"]
    # the modelled overhead beyond the weights is far below the back-of-envelope 6 GiB on one H100
    assert 1.5 * GiB < nk["total"] - nk["weights"] < 4 * GiB
    flat = capacity(L31, H100, "auto", max_model_len=131072, activation_gib=6)
    assert flat.non_kv["source"] == "flat allowance" and flat.activation_bytes == 6 * GiB
    parts = capacity(L31, H100, "auto", max_model_len=131072, activation_gib=1, cudagraph_gib=0.5)
    assert parts.non_kv["activation"] == GiB and parts.non_kv["cudagraph"] == GiB // 2
    assert parts.non_kv["persistent"] == nk["persistent"]


@pytest.mark.parametrize("args", [["--non-torch-gib", "-1"], ["--max-num-seqs", "0"]])
def test_bad_overrides(cli, args):
    r = cli("capacity", "llama3-8b", "--gpu", "h100", *args)
    assert r.code == 2 and r.err.count("\n") == 1


def test_moe_workspace_stays_through_the_sampler():
    # Qwen3-30B-A3B at 8,192 tokens: the Triton experts' workspace, 8192 x 8 x (max(768, 2048) + max(1536, 2048))
    # x 2 B = 512 MiB, is the workspace manager's persistent buffer, so the dummy sampler runs on top of it
    m = load_model("qwen3-30b-a3b")
    nk = non_kv_memory(m, H100, total_bytes=H100.memory_total_bytes, tp=1, weights=0, version="0.33",
                       max_model_len=32768)
    w_moe = 8192 * 8 * (2048 + 2048) * 2
    assert w_moe == 512 * MiB and nk.parts["moe_workspace"] == w_moe
    V = 151_936  # already a multiple of 64
    hold = 8192 * 2048 * 2 + 2 * 1024 * 2048 * 2
    sampler = 2 * 1024 * V + 12 * 1024 * V  # bf16 logits; fp32 copy, top-k mask, probs (0.33's warm-up pass)
    assert nk.activation == w_moe + hold + sampler
