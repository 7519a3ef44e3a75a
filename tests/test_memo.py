"""kvplan.memo.per_spec: a frozen spec's answers remembered by its identity, everything else by value."""

from dataclasses import dataclass

from kvplan import load_model
from kvplan.memo import per_spec
from kvplan.sizing.model_tensors import model_tensors
from kvplan.sizing.weights import weight_bytes


def test_same_spec_same_answer_other_spec_its_own():
    calls = []

    @per_spec
    def layers(m, tp):
        calls.append((m.name, tp))
        return m.num_layers // tp

    a, b = load_model("llama3-8b"), load_model("llama3-70b")
    assert layers(a, 1) == 32 and layers(a, 1) == 32 and layers(a, 2) == 16
    assert layers(b, 1) == 80  # a different spec is priced afresh
    assert calls == [("Llama-3-8B", 1), ("Llama-3-8B", 2), ("Llama-3-70B", 1)]
    # an equal copy is another object: priced again, with the same answer
    assert layers(a.model_copy(), 1) == 32 and len(calls) == 4


def test_unhashable_and_mutable_arguments_are_not_remembered():
    calls = []

    @dataclass  # not frozen: its content may change, so it is keyed by value, and it is unhashable
    class Box:
        n: int

    @per_spec
    def total(xs, box):
        calls.append(1)
        return sum(xs) + box.n

    box = Box(1)
    assert total([1, 2], box) == 4
    box.n = 10
    assert total([1, 2], box) == 13  # not a stale 4
    assert len(calls) == 2


def test_remembered_figures_equal_fresh_ones():
    m = load_model("deepseek-v3")
    first = weight_bytes(m, 8, None)
    assert weight_bytes(m, 8, None) is first  # remembered
    fresh = weight_bytes.__wrapped__(m, 8, None)
    assert fresh == first and fresh is not first
    assert model_tensors.__wrapped__(m) == model_tensors(m)
