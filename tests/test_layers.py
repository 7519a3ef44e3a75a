"""The per-layer classes (kvplan.specs.layers): each attention layer and MLP carries its cache per token, its tensors
and its step's figures, and the sizing code reads them from the layer, so that a new mixer or MLP is its class and
its mapping from the config (ModelSpec._attention_mixer, ModelSpec._mlp_block) with nothing else changed.

Figures worked by hand beside each assertion (bf16: 2 B per element)."""

from __future__ import annotations

from dataclasses import fields

from kvplan import crossover
from kvplan.sizing.kv_cache import format_bytes_per_token, kv_layers
from kvplan.sizing.model_tensors import model_tensors, param_count
from kvplan.specs.catalog import load_model
from kvplan.specs.kv_formats import kv_format
from kvplan.specs.layers import Attention, Dense, LatentAttention, MoE
from kvplan.specs.model import ModelSpec
from kvplan.specs.tensors import Tensor

AUTO, FP8 = kv_format("auto"), kv_format("fp8")
TINY = dict(name="Tiny-2L", num_layers=2, hidden_size=1024, intermediate_size=2048, num_heads=8, num_kv_heads=2,
            head_dim=128, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=32768)


def test_attention_cache_and_step_figures_by_hand():
    m = load_model("llama-3-8b")  # 32 query heads, 8 KV heads of 128
    a = m.layers[0].attention
    assert type(a) is Attention and a.heads == 32
    # K and V x 8 heads x 128 x 2 B = 4,096; TP 2: 4 heads; TP 16: one head replicated; fp8: 1 B per element
    assert [a.cache_bytes_per_token(AUTO, tp, "bf16") for tp in (1, 2, 16)] == [4_096, 2_048, 512]
    assert a.cache_bytes_per_token(FP8, 1, "bf16") == 2_048
    assert [lay.bytes_per_token for lay in kv_layers(m, AUTO, 2)] == [2_048] * 32
    assert (a.kernel_head_dim, a.flops_per_token_head, a.prefill_flops_per_token_head) == (128, 512, 512)

    d = load_model("deepseek-v3")  # latent 512 + rope 64, nope 128, v 128
    la = d.layers[0].attention
    assert type(la) is LatentAttention and la.kv_heads_per_rank(8) == 1
    # one latent of 576 x 2 B whatever the TP
    assert la.cache_bytes_per_token(AUTO, 8, "bf16") == 1_152 == format_bytes_per_token(d, AUTO, 8)
    # decode absorbed: 2 x 576 + 2 x 512; a prompt unabsorbed: 2 x (128 + 64) + 2 x 128
    assert (la.kernel_head_dim, la.flops_per_token_head, la.prefill_flops_per_token_head) == (576, 2_176, 640)
    assert la.read_window is None and la.indexer_bytes_per_token == 0


def test_the_model_tensors_are_the_layers_own():
    m = load_model("qwen3-30b-a3b")  # every layer attention and MoE
    a, moe = m.layers[0].attention, m.layers[0].mlp
    assert isinstance(moe, MoE) and {lay.mlp for lay in m.layers} == {moe}
    L, h = m.num_layers, m.hidden_size
    ts = model_tensors(m)
    for t in a.tensors(h, L) + a.norm_tensors(L) + moe.tensors(h, L):
        assert t in ts
    dense = load_model("llama-3-8b")
    mlp = dense.layers[0].mlp
    assert mlp == Dense(14_336) and all(t in model_tensors(dense) for t in mlp.tensors(4_096, 32))


# A new attention mixer and a new MLP, as a model would add them: the class, and its mapping from the config.

class KeyOnlyAttention(Attention):
    """A mixer whose value is its key: one cache entry per KV head (half of K and V), no v_proj."""

    def cache_bytes_per_token(self, fmt, tp, dtype, v_padded=False):
        return super().cache_bytes_per_token(fmt, tp, dtype, v_padded) / 2

    def tensors(self, hidden, count, layers=(), input_size=None) -> list[Tensor]:
        return [t for t in super().tensors(hidden, count, layers, input_size) if not t.name.startswith("attn.v_")]


class ScaledDense(Dense):
    """A dense MLP with a learned scale per intermediate channel."""

    def tensors(self, hidden, count, layers=()) -> list[Tensor]:
        return super().tensors(hidden, count, layers) + [
            Tensor("mlp.scale", self.width, 1, count, "col", "mlp", False, layers=layers)]


class KeyOnlyModel(ModelSpec):
    def _attention_mixer(self, kind, kv_heads, head_dim, v_from_k=False, indexed=False):
        a = super()._attention_mixer(kind, kv_heads, head_dim, v_from_k, indexed)
        return KeyOnlyAttention(**{f.name: getattr(a, f.name) for f in fields(a)})

    def _mlp_block(self, kind, width):
        return ScaledDense(width, self.gated_mlp, self.mlp_bias) if kind == "dense" else None


def test_a_new_mixer_and_mlp_are_their_class_and_mapping():
    plain, new = ModelSpec(**TINY), KeyOnlyModel(**TINY)
    assert [type(lay.mixer) for lay in new.layers] == [KeyOnlyAttention] * 2
    assert [type(lay.mlp) for lay in new.layers] == [ScaledDense] * 2
    # the cache: K and V x 2 heads x 128 x 2 B = 1,024 B per layer and token; the new mixer's, half of it
    assert [lay.bytes_per_token for lay in kv_layers(plain, AUTO, 1)] == [1_024, 1_024]
    assert [lay.bytes_per_token for lay in kv_layers(new, AUTO, 1)] == [512, 512]
    assert format_bytes_per_token(new, AUTO, 1) == 512
    # the parameters: untied embedding and head 2 x 32,000 x 1,024; per layer q and o 2 x 1,024 x 1,024, k and v
    # 2 x 256 x 1,024, gate, up and down 3 x 2,048 x 1,024, two norms of 1,024; the final norm 1,024
    per_layer = 2 * 1_024 * 1_024 + 2 * 256 * 1_024 + 3 * 2_048 * 1_024 + 2 * 1_024
    assert param_count(plain) == 2 * 32_000 * 1_024 + 2 * per_layer + 1_024 == 83_366_912
    # the new classes: no v_proj (256 x 1,024), a scale of 2,048 per layer
    assert param_count(new) == param_count(plain) - 2 * (256 * 1_024) + 2 * 2_048 == 82_846_720
    # a step reads the new cache: 1,024 tokens x 2 layers x 512 B beside the weights
    p_plain, = crossover(plain, "auto", batches=[1], contexts=[1024]).operating_points
    p_new, = crossover(new, "auto", batches=[1], contexts=[1024]).operating_points
    assert (p_plain.kv_bytes, p_new.kv_bytes) == (1024 * 2 * 1_024, 1024 * 2 * 512)
