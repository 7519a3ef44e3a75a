"""Data and expert parallelism worked by hand: DeepSeek-V3 on 8 x H200 as TP 8 and as DP 8 with EP 8 (vLLM and
SGLang), Qwen3-235B-A22B with its experts spread (EP 4 x TP 1) against TP 4, and each engine's refusals.

The byte figures below are written out from the checkpoints' shapes (DeepSeek-V3: hidden 7168, 61 layers of which 58
MoE, 256 routed experts of width 2048 plus one shared, dense MLP width 18432, MLA with q_lora 1536, kv_lora 512,
rope 64, 128 heads of 128 + 64; fp8 with one fp32 scale per 128 x 128 block; bf16 embedding and LM head of 129,280
rows) and the engines' sharding rules (vllm/model_executor/models/deepseek_v2.py: q_a_proj and kv_a_proj are
ReplicatedLinear, q_b and kv_b column parallel, o_proj row parallel; fused_moe/layer.py determine_expert_map)."""

import math

import pytest

from kvplan.deployment import DeploymentArgs
from kvplan.plan.sglang_pool import sglang_capacity
from kvplan.plan.vllm_capacity import capacity_of
from kvplan.sizing.weights import weight_bytes

GiB = 2**30


def fp8_block(out_dim, in_dim):
    """An fp8 matrix with one fp32 scale per 128 x 128 block."""
    return out_dim * in_dim + math.ceil(out_dim / 128) * math.ceil(in_dim / 128) * 4


def dsv3_expert():  # gate, up [2048, 7168] and down [7168, 2048]
    return 2 * fp8_block(2048, 7168) + fp8_block(7168, 2048)


def dsv3_attention(tp):
    """One layer's MLA weights on one of `tp` attention ranks (norms included)."""
    return (fp8_block(1536, 7168)  # q_a_proj, replicated
            + fp8_block(128 * 192 // tp, 1536)  # q_b_proj, heads split
            + fp8_block(576, 7168)  # kv_a_proj_with_mqa, replicated
            + fp8_block(128 * 256 // tp, 512)  # kv_b_proj (k_nope 128 + v 128 per head), heads split
            + fp8_block(7168, 128 * 128 // tp)  # o_proj, input split
            + (1536 + 512) * 2)  # q_a and kv_a layernorms, bf16


def dsv3_dense_mlp(tp):  # gate and up split on outputs, down on inputs
    return 2 * fp8_block(18432 // tp, 7168) + fp8_block(7168, 18432 // tp)


def dsv3_shared_expert(tp):
    return 2 * fp8_block(2048 // tp, 7168) + fp8_block(7168, 2048 // tp)


def dsv3_rank_weights(attn_tp, dense_tp, vocab_tp, experts_per_rank, expert_split):
    vocab = math.ceil(129280 / vocab_tp) * 7168 * 2  # bf16, 129,280 rows (a multiple of 64) split
    router = 58 * (256 * 7168 * 2 + 256 * 2)  # bf16 gate and its e_score_correction_bias, replicated
    norms = (2 * 61 + 1) * 7168 * 2  # two per layer and the final norm
    if expert_split == 1:
        experts = 58 * experts_per_rank * dsv3_expert()
    else:  # every expert split: width 2048 / split, 2 blocks of 128 each at split 8
        experts = 58 * 256 * (2 * fp8_block(2048 // expert_split, 7168) + fp8_block(7168, 2048 // expert_split))
    return (61 * dsv3_attention(attn_tp) + 3 * dsv3_dense_mlp(dense_tp) + 58 * dsv3_shared_expert(dense_tp)
            + 2 * vocab + router + norms + experts)


def resolve(**kw):
    return DeploymentArgs(model="deepseek-v3", gpu="h200", **kw).resolve(needs_memory=True)


def test_deepseek_v3_weights_per_rank_by_hand():
    tp8 = resolve(tp=8)
    dp8 = resolve(tp=1, data_parallel_size=8, enable_expert_parallel=True)
    sg = resolve(engine="sglang", tp=8, dp_size=8, enable_dp_attention=True, ep_size=8)
    # the routed experts: 32 whole ones per EP rank, or all 256 split 8 ways: the same bytes (2048 / 8 = 2 blocks)
    assert weight_bytes(tp8.model, tp8.parallel).experts == 58 * 256 * (
        2 * fp8_block(256, 7168) + fp8_block(7168, 256)) == 58 * 32 * dsv3_expert() == 81_758_552_064
    assert weight_bytes(dp8.model, dp8.parallel).experts == 81_758_552_064
    # TP 8: everything split 8 ways
    assert weight_bytes(tp8.model, tp8.parallel).total == dsv3_rank_weights(8, 8, 8, None, 8)
    # vLLM DP 8: attention, dense MLPs, shared experts and the vocabulary whole on every rank
    assert weight_bytes(dp8.model, dp8.parallel).total == dsv3_rank_weights(1, 1, 1, 32, 1)
    # SGLang with DP attention: attention whole, dense MLPs, shared experts and the vocabulary over all 8 GPUs
    assert weight_bytes(sg.model, sg.parallel).total == dsv3_rank_weights(1, 8, 8, 32, 1)
    # what a DP rank holds beyond a TP 8 rank: 7/8 of the attention, dense MLP, shared experts and vocabulary
    extra = dsv3_rank_weights(1, 1, 1, 32, 1) - dsv3_rank_weights(8, 8, 8, None, 8)
    assert 14.5 * GiB < extra < 15.5 * GiB


def test_deepseek_v3_kv_per_rank_and_in_total():
    # the MLA latent: (512 + 64) values x 2 bytes x 61 layers per token, whole on every rank in either layout
    per_token = 576 * 2 * 61
    assert per_token == 70_272
    for engine, kw_tp, kw_dp in (
            ("vllm", dict(tp=8), dict(tp=1, data_parallel_size=8, enable_expert_parallel=True)),
            ("sglang", dict(engine="sglang", tp=8),
             dict(engine="sglang", tp=8, dp_size=8, enable_dp_attention=True, ep_size=8))):
        plan = capacity_of if engine == "vllm" else sglang_capacity
        tp8, dp8 = plan(resolve(**kw_tp)), plan(resolve(**kw_dp))
        bpt = "kv_bytes_per_token" if engine == "vllm" else "cell_bytes"
        assert getattr(tp8, bpt) == getattr(dp8, bpt) == per_token
        # TP 8: every rank holds the same latents: the deployment holds what one rank does
        assert tp8.total_kv_tokens == tp8.kv_tokens and tp8.dp == 1
        # DP 8: each rank its own requests' latents, so eight pools
        assert dp8.total_kv_tokens == 8 * dp8.kv_tokens and dp8.dp == 8 and dp8.world_size == 8
        assert dp8.total_max_concurrency == pytest.approx(8 * dp8.max_concurrency)
        lost = (tp8.kv_tokens - dp8.kv_tokens) * per_token
        if engine == "vllm":
            # each DP rank's pool is smaller by about the weights it now holds whole (14.5-15.5 GiB, above), less
            # the TP communicators' buffers it no longer needs
            assert 12 * GiB < lost < 15.5 * GiB, lost / GiB
        else:
            # SGLang: the attention whole (61 layers' MLA weights, 7/8 of them more than at TP 8) and, by its
            # mem_fraction_static rule, graph room for every attention group: 512 (largest decode graph on a
            # 141 GB GPU at TP 8) x 8 groups x 4.5 MB = 18 GiB on top of 512 + 1.5 x 8192 + 1024 + 1536 MB
            attention = 61 * (dsv3_attention(1) - dsv3_attention(8))
            assert (tp8.mem_fraction_static, dp8.mem_fraction_static) == (
                round((143771 - 15360) / 143771, 3), round((143771 - 15360 - 512 * 8 * 4.5) / 143771, 3))
            reserve = (dp8.mem_fraction_static - tp8.mem_fraction_static) * -(143771 - 512) * 2**20
            assert lost == pytest.approx(attention + reserve, rel=0.01)
        # and the deployment holds several times the tokens (the DP degree, less that)
        assert 3 < dp8.total_kv_tokens / tp8.total_kv_tokens < 8
        assert any("8 attention groups" in n for n in dp8.notes)


def test_deepep_buffers_come_out_of_the_vllm_pool():
    base = dict(tp=1, data_parallel_size=8, enable_expert_parallel=True)
    plain = capacity_of(resolve(**base))
    ll = capacity_of(resolve(**base, all2all_backend="deepep_low_latency"))
    ht = capacity_of(resolve(**base, all2all_backend="deepep_high_throughput"))
    # low latency: 1 GiB of NVLink buffer + 4 x 256 experts x 256 tokens x (2 x 7168 + 16) bytes of RDMA buffer
    ll_bytes = 2**30 + 4 * 256 * 256 * (2 * 7168 + 16)
    assert ll.non_kv["parts"]["all2all_buffers"] == ll_bytes == 4_836_032_512
    assert ht.non_kv["parts"]["all2all_buffers"] == 2**30  # one node: NVLink buffer only
    assert plain.available_kv_bytes - ll.available_kv_bytes == ll_bytes
    assert plain.available_kv_bytes - ht.available_kv_bytes == 2**30


def test_qwen3_235b_experts_spread_against_tp4():
    tp4 = DeploymentArgs(model="qwen3-235b-a22b", gpu="h200", tp=4).resolve(needs_memory=True)
    ep4 = DeploymentArgs(model="qwen3-235b-a22b", gpu="h200", tp=4,
                         enable_expert_parallel=True).resolve(needs_memory=True)
    m = tp4.model
    assert (m.num_layers, m.moe.num_experts, m.moe.expert_intermediate_size, m.hidden_size) == (94, 128, 1536, 4096)
    # EP 4 x TP 1 experts: 32 whole ones per rank, 3 x 4096 x 1536 bf16 each, in every one of 94 layers; TP 4 splits
    # each of the 128 four ways: the same bytes, and the same attention (TP 4 in both)
    experts = 94 * 32 * 3 * 4096 * 1536 * 2
    assert experts == 113_548_197_888
    assert weight_bytes(m, ep4.parallel).experts == weight_bytes(m, tp4.parallel).experts == experts
    assert weight_bytes(m, ep4.parallel).total == weight_bytes(m, tp4.parallel).total
    a, b = capacity_of(tp4), capacity_of(ep4)
    assert a.kv_tokens == b.kv_tokens and b.total_kv_tokens == b.kv_tokens  # one attention group
    assert (ep4.parallel.ep, ep4.parallel.moe_tp, ep4.parallel.attn_tp) == (4, 1, 4)
    assert (tp4.parallel.ep, tp4.parallel.moe_tp) == (1, 4)


@pytest.mark.parametrize("argv, says", [
    (["capacity", "deepseek-v3", "--gpu", "h200", "--enable-eplb"], "enable_expert_parallel must be True"),
    (["capacity", "deepseek-v3", "--gpu", "h200", "--data-parallel-size", "8", "--enable-expert-parallel",
      "--enable-eplb", "--num-redundant-experts", "3"], "--num-redundant-experts 8"),
    (["capacity", "llama3-8b", "--gpu", "h200", "--enable-expert-parallel"], "no MoE layers"),
    (["capacity", "deepseek-v3", "--gpu", "h200", "--data-parallel-size", "8", "--data-parallel-size-local", "3"],
     "must divide --data-parallel-size"),
    (["capacity", "deepseek-v3", "--gpu", "h200", "--engine", "sglang", "--tp", "8", "--ep-size", "3"],
     "must divide --tp 8"),
    (["capacity", "deepseek-v3", "--gpu", "h200", "--engine", "sglang", "--tp", "8", "--dp-size", "3",
      "--enable-dp-attention"], "tp_size must be divisible by dp_size"),
    (["capacity", "deepseek-v3", "--gpu", "h200", "--engine", "sglang", "--tp", "8", "--enable-dp-lm-head"],
     "applies with --enable-dp-attention"),
    (["capacity", "deepseek-v3", "--gpu", "h200", "--engine", "sglang", "--tp", "8", "--ep-size", "8",
      "--ep-num-redundant-experts", "4"], "--ep-num-redundant-experts 8"),
    (["capacity", "qwen3-30b-a3b", "--gpu", "h200", "--data-parallel-size", "1024"],
     "768 intermediate channels over tp x dp = 1024"),
    (["capacity", "qwen3-30b-a3b", "--gpu", "h200", "--data-parallel-size", "256", "--enable-expert-parallel"],
     "128 experts, fewer than the ranks"),
    (["capacity", "deepseek-v3", "--gpu", "h200", "--dp-size", "8"], "vllm's spelling is --data-parallel-size"),
    (["capacity", "deepseek-v3", "--gpu", "h200", "--engine", "sglang", "--enable-expert-parallel"],
     "sglang's spelling is --ep-size"),
])
def test_refused_layouts_name_the_rule(cli, argv, says):
    r = cli(*argv)
    assert r.code == 2 and r.err.count("\n") == 1 and r.err.startswith("kvplan: error: "), r.err
    assert says in r.err, r.err


def test_each_layout_option_is_honoured_on_a_moe_model(cli):
    """The options a dense model refuses (tests/test_options.py), each changing the plan of a MoE model."""
    import json

    vllm = ["capacity", "deepseek-v3", "--gpu", "h200", "--json"]
    sglang = vllm + ["--engine", "sglang", "--tp", "8"]

    def run(*argv):
        r = cli(*argv)
        assert r.code == 0, r.err
        return json.loads(r.out)

    base = run(*vllm, "--data-parallel-size", "8")
    ep = run(*vllm, "--data-parallel-size", "8", "--enable-expert-parallel")
    for added in (["--all2all-backend", "deepep_low_latency"], ["--enable-eplb", "--num-redundant-experts", "8"],
                  ["--data-parallel-size-local", "4"]):
        assert run(*vllm, "--data-parallel-size", "8", "--enable-expert-parallel", *added) != ep, added
    assert ep != base
    sg = run(*sglang)
    sg_ep = run(*sglang, "--ep-size", "8")
    sg_dpa = run(*sglang, "--dp-size", "8", "--enable-dp-attention", "--ep-size", "8")
    assert sg_ep != sg and sg_dpa != sg_ep
    for added in (["--moe-dense-tp-size", "1"], ["--enable-dp-lm-head"]):
        assert run(*sglang, "--dp-size", "8", "--enable-dp-attention", "--ep-size", "8", *added) != sg_dpa, added
    assert run(*sglang, "--ep-size", "8", "--ep-num-redundant-experts", "8") != sg_ep
    assert run(*sglang, "--moe-a2a-backend", "deepep") != sg
    assert run(*sglang, "--dp-size", "2") != sg  # replicas


def test_a_startup_log_of_a_data_parallel_run_recovers_its_layout(cli, tmp_path):
    """vLLM prints its non-default args, SGLang its ServerArgs: the layout options among them are read back, planned
    and kept in the saved profile (a run with DP 2 on a dense model: two replicas of TP 2)."""
    import json

    src = "tests/fixtures/logs/vllm-0.19-h100/qwen-qwen2-5-7b-instruct--h100-80gb--tp2pp1dp1--8192.log"
    text = open(src, encoding="utf-8").read()
    assert "'tensor_parallel_size': 2," in text
    log = tmp_path / "dp2.log"
    log.write_text(text.replace("'tensor_parallel_size': 2,", "'tensor_parallel_size': 2, 'data_parallel_size': 2,"))
    r = cli("log", str(log), "--gpu", "h100", "--json", "--save-profile", str(tmp_path / "p.yaml"))
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["config"]["data_parallel_size"] == 2
    assert any("--data-parallel-size 2" in n for n in out["notes"])
    assert "data_parallel_size: 2" in (tmp_path / "p.yaml").read_text()
    # the profile plans the same layout again: two replicas, each its own pool
    cap = json.loads(cli("capacity", "--profile", str(tmp_path / "p.yaml"), "--json").out)
    assert cap["dp"] == 2 and cap["total_kv_tokens"] == 2 * cap["kv_tokens"]

    sg = open("tests/fixtures/logs/sglang-0.5-llama31-8b-h100.log", encoding="utf-8").read()
    assert "tp_size=1, pp_size=1" in sg
    log2 = tmp_path / "sg.log"
    log2.write_text(sg.replace("tp_size=1, pp_size=1", "tp_size=1, pp_size=1, dp_size=2"))
    r = cli("log", str(log2), "--gpu", "h100", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["config"]["dp_size"] == 2


def test_layout_spelling():
    from kvplan.deployment.layout import layout_label, parse_layout
    from kvplan.errors import KvplanError

    assert parse_layout("tp8") == {"tp": 8}
    assert parse_layout("tp1,dp8,ep") == {"tp": 1, "data_parallel_size": 8, "enable_expert_parallel": True}
    assert parse_layout("tp2,dp2,ep4") == {"tp": 2, "data_parallel_size": 2, "enable_expert_parallel": True}
    assert parse_layout("tp8,dp8,ep8", "sglang") == {"tp": 8, "dp_size": 8, "enable_dp_attention": True,
                                                     "ep_size": 8}
    assert layout_label(parse_layout("tp1, dp8, ep")) == "tp1,dp8,ep"
    for bad, says in (("tp2,dp2,ep8", "spans tp x dp = 4"), ("tq8", "is not tp<N>"), ("tp8,tp4", "twice"),
                      ("tp8,ep", "takes a size")):
        with pytest.raises(KvplanError, match=says):
            parse_layout(bad, "sglang" if bad == "tp8,ep" else "vllm")


def test_throughput_compares_layouts_per_gpu(cli):
    """`--layout` runs each layout's benchmark and names the one with the most output tokens/s per GPU under the
    limits: each layout's rows are its own throughput table, its best row the one the layout verdict weighs."""
    import json

    r = cli("throughput", "qwen3-30b-a3b", "--gpu", "h100", "--isl", "1k", "--osl", "256", "-n", "8,32",
            "-d", "auto", "--tpot-ms", "60", "--layout", "tp2", "--layout", "tp1,dp2,ep", "--json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert [x["layout"] for x in out["layouts"]] == ["tp2", "tp1,dp2,ep"]
    best = {x["layout"]: x["best"] for x in out["layouts"]}
    winner = max(best, key=lambda k: best[k]["output_tokens_per_s_per_gpu"])
    assert out["winner_layout"] == winner and out["verdict"].startswith(winner + " with auto")
    dp = next(x for x in out["layouts"] if x["layout"] == "tp1,dp2,ep")
    assert all(row["output_tokens_per_s_per_gpu"] == pytest.approx(row["output_tokens_per_s"] / 2)
               for row in dp["rows"])
    bad = cli("throughput", "qwen3-30b-a3b", "--gpu", "h100", "--isl", "1k", "--osl", "256", "--tp", "2",
              "--layout", "tp2")
    assert bad.code == 2 and "give it in one place" in bad.err
