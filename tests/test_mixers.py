"""The state mixers as classes (kvplan.specs.mixers), and a model whose state layers use two different ones.

Every figure of the two-mixer model is worked by hand next to its assertion, from the mixers' definitions as vLLM's
mamba_utils (MambaStateShapeCalculator) and the modelling code lay them out:

* Mamba-2: conv state (conv_kernel - 1) x (inner + 2 x n_groups x state_size) elements, inner = heads x head_dim;
  SSM state heads x head_dim x state_size;
* gated delta net: conv state (conv_kernel - 1) x (2 x n_groups x state_size + inner), n_groups being the key heads
  and state_size the key head dim; recurrent state value heads x value head dim x key head dim;

both in the model dtype here (bf16, 2 B; no mamba_ssm_cache_dtype named).
"""

from __future__ import annotations

import json

import pytest

from kvplan import capacity, crossover, load_gpu
from kvplan.errors import KvplanError
from kvplan.sizing.kv_cache import check_tp, kv_layers, state_bytes
from kvplan.sizing.model_tensors import param_count
from kvplan.sizing.weights import weight_bytes
from kvplan.specs.catalog import load_model
from kvplan.specs.kv_formats import kv_format
from kvplan.specs.mixers import STATE_MIXERS, GatedDeltaNet, KimiDeltaAttention, LightningAttention, Mamba, Mamba2
from kvplan.specs.model import ModelSpec

M2 = dict(kind="mamba2", num_heads=16, head_dim=64, state_size=128, n_groups=2)  # conv_kernel 4, conv bias
GDN = dict(kind="gdn", num_heads=8, head_dim=128, state_size=128, n_groups=4, conv_bias=False)
MIXERS = ("state", "state", "full", "state", "state", "full", "state", "state")
BASE = dict(name="Two-Mixer-8L", num_layers=8, hidden_size=1024, intermediate_size=2048, num_heads=8, num_kv_heads=2,
            head_dim=128, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=32768, mixers=MIXERS)


def two_mixers() -> ModelSpec:
    """Mamba-2 in layers 0, 3 and 6, gated delta nets in 1, 4 and 7, full attention in 2 and 5; a dense MLP each."""
    return ModelSpec(**BASE, states=(M2, GDN), state_of=(0, 1, None, 0, 1, None, 0, 1))


# Per layer, one sequence, TP 1 (hand arithmetic):
#   Mamba-2: inner 16 x 64 = 1,024; conv 3 x (1,024 + 2 x 2 x 128 = 1,536) x 2 B = 9,216; SSM 16 x 64 x 128 x 2 B =
#   262,144; 271,360 B in all.
#   GDN: inner 8 x 128 = 1,024; conv 3 x (2 x 4 x 128 + 1,024 = 2,048) x 2 B = 12,288; recurrent 8 x 128 x 128 x 2 B
#   = 262,144; 274,432 B in all.
M2_LAYER, GDN_LAYER = 9_216 + 262_144, 12_288 + 262_144


def test_each_kind_is_its_class():
    assert list(STATE_MIXERS) == ["mamba2", "gdn", "mamba", "lightning", "kda"]
    for kind, cls in (("mamba2", Mamba2), ("gdn", GatedDeltaNet), ("mamba", Mamba), ("lightning", LightningAttention),
                      ("kda", KimiDeltaAttention)):
        m = ModelSpec(**{**BASE, "mixers": ("state",) * 8},
                      state=dict(kind=kind, num_heads=16, head_dim=64, state_size=64, intermediate_size=1024))
        assert type(m.state) is cls and m.state_mixers == (m.state,)
        assert m.model_dump()["state"]["kind"] == kind and "states" not in m.model_dump()
    with pytest.raises(ValueError, match="a Mamba2 mixer has kind 'mamba2', not 'gdn'"):
        Mamba2(**GDN)


def test_two_mixers_state_bytes_by_hand():
    m = two_mixers()
    assert [type(st) for st, _ in m.state_groups] == [Mamba2, GatedDeltaNet]
    assert [layers for _, layers in m.state_groups] == [(0, 3, 6), (1, 4, 7)]
    assert state_bytes(m, 1, layer=0) == (9_216, 262_144) and state_bytes(m, 1, layer=1) == (12_288, 262_144)
    layers = kv_layers(m, kv_format("auto"), 1)
    assert [lay.fixed_bytes for lay in layers] == [M2_LAYER, GDN_LAYER, 0, M2_LAYER, GDN_LAYER, 0, M2_LAYER, GDN_LAYER]
    assert sum(lay.fixed_bytes for lay in layers) == 3 * 271_360 + 3 * 274_432 == 1_637_376
    # TP 2: Mamba-2's 2 groups split (2 % 2 == 0): conv 3 x 1,536 / 2 x 2 B = 4,608, SSM 8 x 64 x 128 x 2 B =
    # 131,072; GDN conv 3 x 2,048 / 2 x 2 B = 6,144, recurrent 4 x 128 x 128 x 2 B = 131,072
    assert state_bytes(m, 2, layer=3) == (4_608, 131_072) and state_bytes(m, 2, layer=7) == (6_144, 131_072)
    assert [lay.fixed_bytes for lay in kv_layers(m, kv_format("auto"), 2) if lay.kind == "state"] == \
        [135_680, 137_216] * 3
    with pytest.raises(KvplanError, match="state layers differ \\(Mamba-2, GDN\\): name the layer"):
        state_bytes(m, 1)
    # a decode step reads every sequence's state beside its KV: 1,637,376 B and 1,024 tokens of 2 attention layers
    # x (2 (K, V) x 2 KV heads x 128 x 2 B = 1,024 B)
    p1, = crossover(m, "auto", batches=[1], contexts=[1024]).operating_points
    assert p1.kv_bytes == 1_637_376 + 1024 * 2 * 1024


def test_two_mixers_parameters_by_hand():
    m = two_mixers()
    embed = lm_head = 32_000 * 1_024  # 32,768,000 each, untied
    # Mamba-2: in_proj (z 1,024 + x/B/C 1,536 + dt 16 = 2,576) x 1,024 = 2,637,824; conv 1,536 x 4 + bias 1,536;
    # dt_bias, A_log, D 3 x 16; norm 1,024; out_proj 1,024 x 1,024 = 1,048,576
    mamba2 = 2_576 * 1_024 + 1_536 * 4 + 1_536 + 3 * 16 + 1_024 + 1_024 * 1_024
    assert mamba2 == 3_695_152
    # GDN: in_proj_qkvz (2 x 512 + 2 x 1,024 = 3,072) x 1,024; in_proj_ba 2 x 8 x 1,024; conv 2,048 x 4 (no bias);
    # dt_bias, A_log 2 x 8; norm 128 (the value head dim); out_proj 1,024 x 1,024
    gdn = 3_072 * 1_024 + 16 * 1_024 + 2_048 * 4 + 2 * 8 + 128 + 1_024 * 1_024
    assert gdn == 4_219_024
    attention = 1_024 * 1_024 + 2 * 256 * 1_024 + 1_024 * 1_024  # q, k and v (2 KV heads x 128), o: 2,621,440
    mlp = 3 * 2_048 * 1_024  # gate, up, down: 6,291,456
    norms = 2 * 8 * 1_024 + 1_024  # two per layer, and the final norm
    total = embed + lm_head + 3 * mamba2 + 3 * gdn + 2 * attention + 8 * mlp + norms
    assert param_count(m) == total == 144_870_464
    # the first pipeline stage (layers 0-3) holds the embedding, Mamba-2 layers 0 and 3, GDN layer 1, attention
    # layer 2, four MLPs and their eight norms, all in bf16
    first = weight_bytes(m, 1, stage=range(0, 4)).total
    assert first == 2 * (embed + 2 * mamba2 + gdn + attention + 4 * mlp + 8 * 1_024) == 144_345_568
    assert first + weight_bytes(m, 1, stage=range(4, 8)).total == weight_bytes(m, 1).total


def test_two_mixers_refused_by_the_engine_pools_and_priced_elsewhere():
    m = two_mixers()
    with pytest.raises(KvplanError) as e:  # vLLM builds one state shape per model; how it pages two is not known
        capacity(m, load_gpu("h100"), max_model_len=8192)
    assert str(e.value) == ("Two-Mixer-8L's state layers use 2 different mixers (Mamba-2, GDN): vLLM pages one state "
                            "shape per model, so kvplan plans no vLLM pool for it (its weights, state bytes and "
                            "crossover are still priced)")
    from kvplan.deployment import DeploymentArgs
    with pytest.raises(KvplanError, match="SGLang's Mamba pool holds one state shape per model"):
        DeploymentArgs(model=m, gpu="h100", engine="sglang").resolve(needs_memory=True)
    check_tp(m, 2)  # the attention heads set the TP rule


def test_one_mixer_vllm_grouping_by_hand():
    # The same layers with Mamba-2 in all six state layers, as `state` and as `states` of one: vLLM pads the state
    # page (271,360 B) into one attention page: attention 1,024 B per token per layer, so the block grows to
    # 16 x cdiv(271,360, 16 x 1,024) = 16 x 17 = 272 tokens, a page of 278,528 B. 2 attention and 6 state layers:
    # 6 >= 1.5 x 2, so groups of 2: one attention group and three state groups, no padding; a block is 2 pages =
    # 557,056 B, and 60 GiB = 64,424,509,440 B // 557,056 = 115,651 blocks
    one = ModelSpec(**BASE, state=M2)
    listed = ModelSpec(**BASE, states=(M2,), state_of=(0, 0, None, 0, 0, None, 0, 0))
    for spec in (one, listed):
        r = capacity(spec, load_gpu("b200"), kv_cache_memory_gib=60, max_model_len=32768, engine_version="0.19")
        assert (r.block_size, r.page_bytes, r.bytes_per_block) == (272, 278_528, 557_056)
        assert (r.num_kv_cache_groups, r.padding_layers, r.num_blocks) == (4, 0, 115_651)
        assert r.state_layers == 6 and r.state_bytes_per_sequence == 6 * 271_360
    assert param_count(one) == param_count(listed)


def test_two_mixers_spec_round_trip_and_table(tmp_path, cli):
    m = two_mixers()
    data = m.model_dump()
    assert data["state"] is None and [st["kind"] for st in data["states"]] == ["mamba2", "gdn"]
    assert ModelSpec.model_validate(data) == m
    path = tmp_path / "two.yaml"  # JSON is YAML
    path.write_text(json.dumps(data))
    assert load_model(str(path)) == m
    r = cli("models", "show", str(path), "--json")
    assert r.code == 0 and json.loads(r.out)["state_of"] == [0, 1, None, 0, 1, None, 0, 1]
    from kvplan.app.tool_commands import _model_row
    assert _model_row("two", m)["attention"] == "2 full + 3 Mamba-2 + 3 GDN"


@pytest.mark.parametrize("fields, message", [
    (dict(state=M2, states=(M2, GDN), state_of=(0, 1, None, 0, 1, None, 0, 1)), "not both"),
    (dict(states=(M2, GDN)), "state_of names each layer's mixer"),
    (dict(state=M2, state_of=(0,) * 8), "give states too"),
    (dict(states=(M2, GDN), state_of=(0, 2, None, 0, 1, None, 0, 1)), "layer 1 is a state layer; give it an index"),
    (dict(states=(M2, GDN), state_of=(0, 1, 0, 0, 1, None, 0, 1)), "layer 2 is a 'full' layer"),
    (dict(states=(M2, GDN), state_of=(0, 1)), "state_of lists 2 layers; the model has 8"),
])
def test_states_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**BASE, **fields)


def test_layer_view():
    from kvplan.specs.layers import Attention, Dense

    m = two_mixers()
    assert m.layers is m.layers  # built once per spec
    assert [type(lay.mixer).__name__ for lay in m.layers] == \
        ["Mamba2", "GatedDeltaNet", "Attention", "Mamba2", "GatedDeltaNet", "Attention", "Mamba2", "GatedDeltaNet"]
    assert m.layers[2].attention == Attention("full", 2, 128, None, heads=8) and m.layers[2].state is None
    assert m.layers[1].state is m.states[1] and m.layers[1].attention is None
    assert {lay.mlp for lay in m.layers} == {Dense(2048)} and {lay.norms for lay in m.layers} == {2}
