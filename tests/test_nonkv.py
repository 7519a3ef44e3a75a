"""vLLM's non-KV memory in closed form, against the worked arithmetic derived from vLLM's source (Llama-3.1-8B,
bf16, TP 1, H100 SXM, `vllm serve` defaults: 8,192 batched tokens, 1,024 sequences, vocab 128,256)."""

from kvplan import load_gpu, load_model
from kvplan.rules.vllm import serve_defaults
from kvplan.sizing.vllm_activation import forward_peak
from kvplan.sizing.vllm_cudagraphs import (
    _capture_sizes,
    fa3_split_accumulators,
    per_graph_bytes,
    piece_kernels,
)
from kvplan.sizing import vllm_memory
from kvplan.sizing.vllm_non_torch import (
    LIBRARY_NON_TORCH,
    TORCH_NCCL_COMMUNICATOR,
    pre_snapshot_bytes,
    transport,
)

MiB, GiB = 2**20, 2**30
H100 = load_gpu("h100")
L31 = load_model("llama-3.1-8b")
W = 2 * 8_030_261_248


def non_kv_memory(m, gpu, *, total_bytes, version, max_model_len, max_num_batched_tokens=None, max_num_seqs=None,
                  **kw):
    """kvplan.sizing.vllm_memory.non_kv_memory with the batch limits `vllm serve` defaults to where a test leaves
    them out (resolve decides them the same way, from kvplan.rules.vllm.serve_defaults)."""
    d = serve_defaults(total_bytes, gpu, version, max_model_len)
    return vllm_memory.non_kv_memory(m, gpu, total_bytes=total_bytes, version=version, max_model_len=max_model_len,
                                     max_num_batched_tokens=max_num_batched_tokens or d.max_num_batched_tokens,
                                     max_num_seqs=max_num_seqs or d.max_num_seqs, **kw)


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
    # engine/arg_utils.py get_batch_defaults: 0.27 has two tiers (>= 70 GiB, not A100: 8,192 tokens for `vllm serve`;
    # else 2,048); 0.28 adds ">= 160 GiB" (B200/B300: 16,384 for serve too); kvplan had it from 0.30
    assert d("b200", "0.27") == (8192, 1024) and d("b200", "0.28") == (16384, 1024)
    # below 70 GiB every release 0.19 to 0.33 keeps "TODO(woosuk): Tune the default values for other hardware":
    # 2,048 batched tokens and 256 sequences for `vllm serve` (L40S: 44.5 GiB)
    assert {d("l40s", v) for v in ("0.19", "0.25", "0.29", "0.30", "0.33")} == {(2048, 256)}


def test_forward_terms():
    peak, parts = forward_peak(L31, 8192, 1, 2)
    assert parts["mlp"] == 8192 * 2 * (4096 + 3 * 14336) == 736 * MiB   # residual + gate_up + act
    assert parts["attention"] == 8192 * 2 * (2 * 4096 + 3 * 4096 + 3 * 1024) == 368 * MiB
    assert peak == 736 * MiB


def test_eager_mlp_and_pipeline_stages():
    # eager (-O0 / --enforce-eager): the caller still holds the RMSNorm output while the MLP runs: 800 MiB
    peak, parts = forward_peak(L31, 8192, 1, 2, eager=True)
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
    # per graph, for Llama's 32 layers (33 pieces): piecewise 0.2 x 33 = 6.6 -> 6 MiB, full 0.15 x 33 = 4.95 -> 4 MiB
    # (vLLM 0.19 printed 6 and 6 MiB for Llama-3.1-8B on H100)
    assert per_graph_bytes(32, "piecewise") == 6 * MiB and per_graph_bytes(32, "full") == 4 * MiB
    # and 18-20 / 10-14 MiB for the 80-layer Llama-3.3-70B and Kimi-Dev-72B: 0.2 x 81 = 16.2 -> 16, 0.15 x 81 -> 12
    assert per_graph_bytes(80, "piecewise") == 16 * MiB and per_graph_bytes(80, "full") == 12 * MiB
    assert run("0.33").cudagraph == 2 * f_cg + 32 * MiB + 50 * 6 * MiB + 50 * 4 * MiB
    assert run("0.33", enforce_eager=True).cudagraph == 0
    # 0.20: two samples per mode extrapolated, 50 more piecewise and 50 more full graphs. The first FULL sample
    # (512 requests) holds FlashAttention 3's split-KV accumulators, 32 splits x 32 heads x 512 x (128 + 1) x 4 B =
    # 258 MiB (vLLM 0.19 printed 260 MiB for it), more than the first piecewise one (46 + 32 MiB cuBLAS), and the
    # estimate keeps the larger: 258 + 300 + 200 = 758 MiB (vLLM 0.19 printed 0.84 GiB, its full samples 6 MiB)
    splits = 32 * 32 * 512 * 129 * 4
    assert round(splits / MiB) == 258 and fa3_split_accumulators(L31, H100, 1, 512) == splits
    assert run("0.20").cudagraph == splits + 50 * 6 * MiB + 50 * 4 * MiB
    # 0.19 measures the estimate and logs it, but does not subtract it (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)
    v019 = run("0.19")
    assert v019.cudagraph == 0 and v019.parts["cudagraph_estimate"] == run("0.20").cudagraph
    # what the capture then takes: the eager warm-up's activations and their captured copy (2 x 46 MiB), the capture
    # stream's cuBLAS workspace (32), the accumulators (258) and all 51 + 51 graphs (510): 892 MiB = 0.87 GiB
    # (vLLM 0.19's Llama-3.1-8B runs: "Graph capturing finished in 3 secs, took 0.91 GiB")
    assert v019.parts["cudagraph_capture"] == 2 * f_cg + 32 * MiB + splits + 51 * 6 * MiB + 51 * 4 * MiB
    assert round(v019.parts["cudagraph_capture"] / GiB, 2) == 0.87
    # MRV2 (0.30+): its capture is taken to be its estimate; no FA3 term there (not traced)
    assert run("0.33").parts["cudagraph_capture"] == run("0.33").cudagraph


def test_flashinfer_attention_workspace_on_sm100():
    # B200 (SM100) runs FlashInfer for GQA: its 394 MiB workspace is made at the first FULL warm-up, inside the
    # estimate; 0.33 on SM100 captures up to min(2 x 1024, 1024, 16384) = 1024 tokens: 51 + 32 sizes (272..1024)
    b200 = load_gpu("b200")
    nk = non_kv_memory(L31, b200, total_bytes=b200.memory_total_bytes, tp=1, weights=W, version="0.33",
                       max_model_len=131072)
    assert (nk.max_num_batched_tokens, nk.parts["capture_sizes"]) == (16384, 83)
    f_cg = 1024 * 2 * (4096 + 3 * 14336)
    assert nk.cudagraph == 2 * f_cg + 32 * MiB + 82 * 6 * MiB + 82 * 4 * MiB + 394 * MiB
    # MLA models run FlashMLA / CUTLASS MLA instead: no FlashInfer workspace
    ds = load_model("deepseek-v3")
    nk_ds = non_kv_memory(ds, b200, total_bytes=b200.memory_total_bytes, tp=8, weights=0, version="0.33",
                          max_model_len=4096)
    f_ds = forward_peak(ds, 1024, 8, 2, with_moe_workspace=False)[0]
    # DeepSeek-V3's 61 layers: 0.2 x 62 = 12.4 -> 12 MiB piecewise, 0.15 x 62 = 9.3 -> 10 MiB full
    assert nk_ds.cudagraph == 2 * f_ds + 32 * MiB + 82 * 12 * MiB + 82 * 10 * MiB


def test_tp_adds_the_allreduce_workspace():
    # FlashInfer's three buffers (tp x S, tp x 256 x 4 B of flags, 3 x tp x S; S = 64 MB at TP 2 on SM90, 2 MB at TP 4,
    # 0.5 MB at TP 8) are symmetric device memory: each takes whole 512 MiB multicast pages on an H100 NVSwitch
    # system, so 3 x 512 MiB = 1,536 MiB at every TP degree (vLLM 0.19's TP-2 logs: 1.81-1.82 GiB over TP 1 whether
    # FlashInfer asked for 362, 450 or 514 MiB)
    m = load_model("llama-3.1-70b")
    fi = "flashinfer_allreduce_workspace"
    for tp in (2, 4, 8):
        nk = non_kv_memory(m, H100, total_bytes=H100.memory_total_bytes, tp=tp, weights=0, version="0.33",
                           max_model_len=131072)
        assert nk.parts[fi] == 3 * 512 * MiB
        # 0.33 makes torch's NCCL communicator before the snapshot: beyond the workspace only the libraries
        assert nk.non_torch == 3 * 512 * MiB + LIBRARY_NON_TORCH and nk.parts["torch_nccl_communicator"] == 0


def test_allreduce_workspace_conditions():
    # the fusion pass caps S at one batch's hidden states: Llama-3.2-3B (H 3,072) at 2,048 batched tokens holds
    # 2048 x 3072 x 2 = 12 MiB < 64 MiB, so TP 2 asks for 24 + 2 + 72 MiB: still three 512 MiB multicast pages
    m = load_model("llama-3.2-3b")

    def nt(version, gpu=H100, **kw):
        return non_kv_memory(m, gpu, total_bytes=gpu.memory_total_bytes, tp=2, weights=0, version=version,
                             max_model_len=8192, max_num_batched_tokens=2048,
                             **kw).parts["flashinfer_allreduce_workspace"]

    assert nt("0.33") == 1536 * MiB
    # 0.33 without compilation: the standalone FlashInfer all-reduce makes the (uncapped) workspace
    assert nt("0.33", enforce_eager=True) == 1536 * MiB
    # 0.20: no standalone FlashInfer all-reduce, and the fusion pass needs one pipeline stage and compilation
    assert nt("0.20") == 1536 * MiB
    assert nt("0.20", enforce_eager=True) == 0 and nt("0.20", pp=2) == 0
    # no FlashInfer all-reduce on an A100 (SM80)
    assert nt("0.33", gpu=load_gpu("a100")) == 0


def test_non_torch_libraries_and_lazy_nccl():
    # vLLM 0.19/0.20 make torch's NCCL communicator inside the profile run: with TP 2 on an H100 SXM the non-torch
    # increase is the libraries' 256 MiB + the communicator's 328 MiB + FlashInfer's 1,536 MiB = 2,120 MiB = 2.07 GiB
    # (the 0.19 logs: 2.06-2.11 GiB for five models)
    m = load_model("qwen2.5-7b")

    def nk(tp, version="0.19", gpu=H100):
        return non_kv_memory(m, gpu, total_bytes=gpu.memory_total_bytes, tp=tp, weights=0, version=version,
                             max_model_len=8192, max_num_batched_tokens=8192)

    assert nk(2).non_torch == (256 + 328 + 1536) * MiB
    assert nk(1).non_torch == LIBRARY_NON_TORCH == 256 * MiB  # the TP-1 logs: 0.24-0.26 GiB
    # from 0.30 the communicator exists before the snapshot: charged to nothing
    assert nk(2, "0.30").parts["torch_nccl_communicator"] == 0
    # an A100 SXM has NVLink without multicast: no FlashInfer workspace (nor SM90), the communicator's estimate
    assert nk(2, gpu=load_gpu("a100")).non_torch == 256 * MiB + TORCH_NCCL_COMMUNICATOR["nvlink"]
    assert transport(load_gpu("l40s")) == "pcie" and transport(H100) == "nvls"


def test_memory_in_use_at_the_snapshot():
    # the 0.19 init snapshots on H100: 0.51 GiB at TP 1 (the CUDA context); 1.53 at TP 2 = context + PyNccl 500 MiB +
    # custom all-reduce 24 MiB + the 64 MiB symmetric-memory buffer in one 512 MiB multicast page (522 + 500 + 24 +
    # 512 = 1,558 MiB = 1.52 GiB); a MoE model's expert-parallel group adds a second communicator (gpt-oss-20b: 2.01)
    assert pre_snapshot_bytes(H100, 1, "0.19") == 522 * MiB
    assert pre_snapshot_bytes(H100, 2, "0.19") == (522 + 500 + 24 + 512) * MiB
    assert pre_snapshot_bytes(H100, 2, "0.19", moe=True) == (522 + 1000 + 24 + 512) * MiB
    # from 0.30 torch's communicator is made before the snapshot too
    assert pre_snapshot_bytes(H100, 2, "0.33") == (522 + 500 + 24 + 512 + 328) * MiB


def test_tp4_over_pcie_cards_bridged_in_pairs():
    """H100 PCIe cards carry NVLink bridges joining pairs (nvlink_domain 2): TP 2 on a bridged pair talks over
    NVLink, TP 4 spans two pairs and talks over PCIe. vLLM 0.19's custom all-reduce then stays off ("not supported
    on more than two PCIe-only GPUs" unless every pair is NVLink-connected), there is no multicast for the
    symmetric-memory buffer or FlashInfer's workspace, and NCCL's PCIe buffers are the estimate's 64 MiB."""
    pcie = load_gpu("h100-pcie")
    assert pcie.nvlink_domain_size == 2
    assert transport(pcie, 2) == "nvlink" and transport(pcie, 4) == "pcie" and transport(H100, 8) == "nvls"
    # TP 2 on the bridge: the context 522 MiB + PyNccl over NVLink 300 MiB + the custom all-reduce's 24 MiB
    assert pre_snapshot_bytes(pcie, 2, "0.19") == (522 + 300 + 24) * MiB
    # TP 4 over PCIe: the context + PyNccl's 64 MiB, nothing else
    assert pre_snapshot_bytes(pcie, 4, "0.19") == (522 + 64) * MiB
    # against TP 4 on H100 SXM: PyNccl with NVLS 500 MiB + 24 MiB + the 32 MiB symmetric buffer in a 512 MiB page
    assert pre_snapshot_bytes(H100, 4, "0.19") == (522 + 500 + 24 + 512) * MiB
    # the non-torch memory of the profile run (0.19: torch's communicator made in it): libraries 256 MiB + 64 MiB
    m = load_model("llama-3.1-70b")
    nk = non_kv_memory(m, pcie, total_bytes=pcie.memory_total_bytes, tp=4, weights=0, version="0.19",
                       max_model_len=8192, max_num_batched_tokens=8192)
    assert nk.non_torch == (256 + 64) * MiB and nk.parts["transport"] == "pcie"


def test_mxfp4_experts_on_hopper():
    # gpt-oss-20b's 24 MoE layers of 32 experts (H = I = 2,880) under vLLM's TRITON MXFP4 backend, per layer at TP 1:
    # values transposed and padded to 64: w13 32 x 1,472 x 5,760 - 32 x 1,440 x 5,760 = 5,898,240 and w2
    # 32 x 1,472 x 2,880 - 32 x 1,440 x 2,880 = 2,949,120; the swizzled scales beside the checkpoint's, rows padded
    # to 256: 32 x 5,888 x 90 + 32 x 3,072 x 90 = 25,804,800; biases in float32: 32 x (5,760 + 2,880) x 2 = 552,960.
    # 35,205,120 B a layer, 844,922,880 in all: 12.83 + 0.79 = 13.62 GiB against the 13.64 vLLM 0.19 loads
    from kvplan.sizing.vllm_mxfp4_hopper import mxfp4_hopper_repack

    m = load_model("gpt-oss-20b")
    assert mxfp4_hopper_repack(m, 1) == 24 * 35_205_120
    assert mxfp4_hopper_repack(load_model("llama-3.1-8b"), 1) == 0
    nk = non_kv_memory(m, H100, total_bytes=H100.memory_total_bytes, tp=1, weights=0, version="0.19",
                       max_model_len=8192)
    assert nk.parts["mxfp4_repack"] == 24 * 35_205_120
    # not on Blackwell, whose MXFP4 backends lay the experts out otherwise
    b200 = load_gpu("b200")
    assert non_kv_memory(m, b200, total_bytes=b200.memory_total_bytes, tp=1, weights=0, version="0.19",
                         max_model_len=8192).parts["mxfp4_repack"] == 0


def test_caching_allocator_blocks():
    from kvplan.sizing.caching_allocator import allocated_bytes

    # 9 MiB opens a 20 MiB segment and splits (11 MiB left over); a second 9 MiB takes 9 of those 11 and splits
    # again (2 MiB left); a 9.5 MiB pair leaves 1 MiB, too little to split, so the second holds 10.5 MiB
    assert allocated_bytes([9 * MiB, 9 * MiB]) == 18 * MiB
    assert allocated_bytes([int(9.5 * MiB), int(9.5 * MiB)]) == 20 * MiB
    # 10 MiB and up: a segment rounded up to 2 MiB; 31.5 MiB holds 32, 24.5 MiB splits 1.5 off its 26
    assert allocated_bytes([int(31.5 * MiB)]) == 32 * MiB
    assert allocated_bytes([int(24.5 * MiB)]) == int(24.5 * MiB)
    # the small pool (up to 1 MiB): 512-byte granules
    assert allocated_bytes([1, 513, MiB]) == 512 + 1024 + MiB



def test_hopper_swizzle_keeps_one_result():
    from kvplan.sizing.caching_allocator import CachingAllocator
    from kvplan.sizing.vllm_mxfp4_hopper import _swizzle_scale, _swizzle_value

    # gpt-oss-20b's w13 at TP 1: 32 experts x 1,440 bytes (2,880 fp4 inputs) padded to 1,472 x 5,760 outputs =
    # 271,319,040 B (258.75 MiB); every temporary of that size opens a 260 MiB segment (1.25 MiB split off), and
    # after empty_cache() only the result's segment is left
    a = CachingAllocator()
    _swizzle_value(a, 32 * 1472 * 5760)
    a.empty_cache()
    assert (a.allocated, a.reserved) == (271_319_040, 260 * MiB)
    # its scales, 32 x 5,760 x 90 B: rows padded to 5,888 (a multiple of 256): 16,957,440 B in a 18 MiB segment
    _swizzle_scale(a, 32, 5760, 90)
    a.empty_cache()
    assert (a.allocated, a.reserved) == (271_319_040 + 16_957_440, 278 * MiB)


def test_fa3_split_accumulators_limits():
    # FA3 splits dynamically only for batches of at most 992 requests; off Hopper, for MLA and for heads above 256
    # there are none
    assert fa3_split_accumulators(L31, H100, 1, 992) == 32 * 32 * 992 * 129 * 4
    assert fa3_split_accumulators(L31, H100, 1, 1008) == 0
    assert fa3_split_accumulators(L31, H100, 2, 512) == 32 * 16 * 512 * 129 * 4  # the heads on this rank
    assert fa3_split_accumulators(L31, load_gpu("b200"), 1, 512) == 0
    assert fa3_split_accumulators(load_model("deepseek-v3"), H100, 8, 512) == 0


def test_gpt_oss_capture_on_hopper():
    # gpt-oss-20b (24 layers, 64 query heads of 64, H = I = 2,880, 32 experts, top-4) captures 83 sizes up to 1,024
    # per mode. vLLM 0.19 on H100: "Graph capturing finished in 40 secs, took 1.84 GiB" at TP 1 and 1.55 GiB at TP 2,
    # against an estimate of 1.30 and 1.09 GiB
    m = load_model("gpt-oss-20b")

    def nk(tp):
        return non_kv_memory(m, H100, total_bytes=H100.memory_total_bytes, tp=tp, weights=0, version="0.19",
                             max_model_len=8192)

    one, two = nk(1), nk(2)
    assert (one.parts["capture_sizes"], one.parts["full_graphs"]) == (83, 83)
    # 1. FA3's accumulators: 1,024 and 1,008 requests are above FA3's 992-request dynamic-split limit (vLLM's two FULL
    # samples printed 6 and 8 MiB), but 992 is not: 32 x 64 x 992 x 65 x 4 = 528,220,160 B = 504 MiB at TP 1, half
    # at TP 2 (the OOM messages: 626 and 318 MiB in the CUDA-graph pools)
    assert one.parts["fa3_split_accumulators"] == 32 * 64 * 992 * 65 * 4
    assert two.parts["fa3_split_accumulators"] == 32 * 32 * 992 * 65 * 4
    # 2. the widest piece at 1,024 tokens: the MoE's hidden states and router logits, plus matmul_ogs's fused SwiGLU
    # output and the scatter's scratchpad, 1,024 x 4 x (2,880 + 2,880) x 2 B: 59,080,704 B = 56 MiB
    f_cg = 1024 * 2 * 2 * 2880 + 1024 * 32 * 2 + 8 * 1024 * 4 + 1024 * 4 * (2880 + 2880) * 2
    assert forward_peak(m, 1024, 1, 2, with_moe_workspace=False)[0] == f_cg == 59_080_704
    # 3. per graph: a layer's piece launches 8 - 3 + 10 = 15 kernels, so piecewise 0.2 x 15/8 x 25 pieces = 9.4
    # -> 10 MiB and full 0.15 x 18/11 x 25 = 6.1 -> 6 MiB (vLLM's samples: 6 and 8 MiB; 7.5 a graph on average
    # in what the capture took beyond the pools)
    assert piece_kernels(m, H100) == 15 and piece_kernels(m, load_gpu("b200")) == 8
    assert per_graph_bytes(24, "piecewise", 15) == 10 * MiB and per_graph_bytes(24, "full", 15) == 6 * MiB
    # TP 1: 2 x 56 + 32 + 504 + 83 x 16 = 1,976 MiB = 1.93 GiB (the log: 1.84)
    assert one.parts["cudagraph_capture"] == 2 * f_cg + 32 * MiB + 32 * 64 * 992 * 65 * 4 + 83 * 16 * MiB
    assert round(one.parts["cudagraph_capture"] / GiB, 2) == 1.93
    # TP 2: the MoE's intermediate halves (1,440), the all-reduce output sits beside its input: 2 x 51 + 32 + 252 +
    # 1,328 = 1,713 MiB = 1.67 GiB (the log: 1.55)
    f2 = 1024 * 2 * 2 * 2880 + 1024 * 32 * 2 + 8 * 1024 * 4 + 1024 * 4 * (1440 + 2880) * 2 + 1024 * 2880 * 2
    assert two.parts["cudagraph_capture"] == 2 * f2 + 32 * MiB + 32 * 32 * 992 * 65 * 4 + 83 * 16 * MiB
    assert round(two.parts["cudagraph_capture"] / GiB, 2) == 1.67


def test_the_runner_that_profiles_by_release_and_model():
    from pathlib import Path

    from kvplan.rules.vllm import vllm_rules
    fix = Path(__file__).resolve().parent / "fixtures"
    dense, moe, listed = L31, load_model("qwen3-30b-a3b"), load_model("deepseek-v2-lite")
    hybrid = load_model(str(fix / "configs" / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.config.json"))
    mamba = load_model(str(fix / "hf-corpus" / "mistralai--Mamba-Codestral-7B-v0.1_config.json"))

    def runners(v):
        r = vllm_rules(v)
        return [r.runner_for(m) for m in (dense, moe, listed, hybrid, mamba)]

    # vllm/envs.py VLLM_USE_V2_MODEL_RUNNER defaults to "0" through 0.21: V1 everywhere
    assert runners("0.19") == runners("0.21") == ["v1"] * 5
    # 0.25 to 0.28 (config/vllm.py _is_default_v2_model_runner_model): `is_default_v2_architecture or not is_moe`,
    # after refusing hybrids (unless listed) and attention-free models; DeepseekV2ForCausalLM is listed
    assert runners("0.25") == runners("0.27.1") == runners("0.28") == ["mrv2", "v1", "mrv2", "v1", "v1"]
    # 0.29+: use_v2_model_runner no longer asks the model
    assert runners("0.29") == runners("0.33") == ["mrv2"] * 5


def test_mrv2_on_dense_models_before_030():
    # Llama-3.1-8B, H100, serve defaults (8,192 tokens, 1,024 sequences), worked from the source of each release.
    f_mlp = 8192 * 2 * (4096 + 3 * 14336)  # 736 MiB: the MLP sets the forward peak
    logits = 1024 * 128256 * 2  # MRV2's default sampler pass: bf16 logits only, 250.5 MiB
    hold = 8192 * 4096 * 2 + 2 * 1024 * 4096 * 2  # hidden states 64 MiB + sampled rows and their copy 16 MiB
    assert hold + logits < f_mlp
    pen = 4 * 1024 * 128256 + 4 * 1024 * -(-128256 // 32)  # PenaltiesState: 501 + 15.7 = 516.7 MiB
    f_cg = 512 * 2 * (4096 + 3 * 14336)
    mrv2_estimate = 2 * f_cg + 32 * MiB + 50 * 6 * MiB + 50 * 4 * MiB  # what 0.29+ subtracts (MRV2, 51 + 51 graphs)

    # 0.25 and 0.26: MRV2 profiles; mem_utils adds weights + the torch peak's increase + non-torch, so the cuBLAS
    # workspace the first GEMM makes is in the peak (736 + 32 MiB), and the PenaltiesState that load_model makes after
    # the weights are measured is charged nowhere; MRV2's profile_cudagraph_memory returns 0: nothing subtracted
    for v in ("0.25", "0.26"):
        nk = run(v)
        assert (nk.activation, nk.persistent, nk.cudagraph) == (f_mlp + 32 * MiB, 0, 0)
        assert nk.parts["cudagraph_capture"] == mrv2_estimate  # the graphs are still captured, outside the budget
    # 0.27: non_kv = total_consumed + transient_peak_headroom: the PenaltiesState persists, so it is consumed memory
    nk = run("0.27")
    assert (nk.activation, nk.persistent, nk.cudagraph) == (f_mlp + 32 * MiB, pen, 0)
    # 0.29: cudagraph_utils.profile_cudagraph_memory estimates MRV2's graphs, and the budget subtracts it
    assert run("0.29").cudagraph == run("0.30").cudagraph == mrv2_estimate
    assert run("0.28").cudagraph == 0
    # the V1 runner's figures where it still profiles (0.20): 1,898 MiB sampler peak + cuBLAS, FA3's estimate
    assert run("0.20").activation > run("0.25").activation


def test_profile_run_below_70_gib_in_030_and_031():
    # L40S (44.5 GiB, SM89): `vllm serve` takes 2,048 batched tokens and 256 sequences. MRV2's profile_run
    # (v1/worker/gpu/model_runner.py, 0.29 to 0.31 alike) runs _dummy_run(2048, skip_attn=True): min(2048, 256) =
    # 256 dummy requests of 8 tokens, eager; then _dummy_sampler_run on those 256 rows: compute_logits in bf16 and
    # the sampler's default pass (no request added, so no fp32 copy, penalties or top-k/top-p; gumbel_sample keeps
    # [256, ceil(V / 1024)] int64 + fp32 partials, 378 KiB, left out)
    l40s = load_gpu("l40s")
    f_mlp = 2048 * 2 * (4096 + 3 * 14336)  # residual + gate_up + activation: 184 MiB
    f_attn = 2048 * 2 * (2 * 4096 + 3 * 4096 + 3 * 1024)  # 92 MiB
    sampler = 2048 * 4096 * 2 + 2 * 256 * 4096 * 2 + 256 * 128256 * 2  # hold 20 MiB + logits 62.6 MiB
    assert f_mlp == 184 * MiB and f_attn == 92 * MiB and sampler < f_mlp
    pen = 4 * 256 * 128256 + 4 * 256 * 4008  # the PenaltiesState for 256 requests: 129.2 MiB
    cublas = 8 * MiB + 128 * 1024  # torch's cuBLAS workspace off SM90/SM100
    for v in ("0.30", "0.31"):
        nk = non_kv_memory(L31, l40s, total_bytes=l40s.memory_total_bytes, tp=1, weights=W, version=v,
                           max_model_len=131072)
        assert (nk.max_num_batched_tokens, nk.max_num_seqs) == (2048, 256)
        assert nk.activation == f_mlp  # 0.30/0.31 charge the main stream's cuBLAS workspace as consumed memory
        assert nk.persistent == pen + cublas
