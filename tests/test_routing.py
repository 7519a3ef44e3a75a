"""How many experts a MoE layer's tokens touch under the power-law router (kvplan.sizing.routing)."""

import numpy as np
import pytest

from kvplan.sizing.routing import ROUTING_ALPHA, experts_touched


def test_uniform_routing_is_the_power_law_of_exponent_zero():
    # every expert equally likely: E (1 - (1 - k/E)^T)
    for e, k, t in ((256, 8, 1), (256, 8, 32), (128, 4, 7.5), (32, 4, 1000)):
        assert experts_touched(e, k, t, alpha=0) == pytest.approx(e * (1 - (1 - k / e) ** t))


def test_two_experts_by_hand():
    # E = 2, k = 1, alpha = 1: p = (1, 1/2) / 1.5 = (2/3, 1/3). One token touches one expert; two tokens touch
    # expert 1 with probability 1 - (1/3)^2 = 8/9 and expert 2 with 1 - (2/3)^2 = 5/9: 13/9 in all
    assert experts_touched(2, 1, 1, alpha=1.0) == pytest.approx(1.0)
    assert experts_touched(2, 1, 2, alpha=1.0) == pytest.approx(13 / 9)


def test_a_pick_certain_expert_is_counted_once():
    # E = 4, k = 2, alpha = 1: p = (12, 6, 4, 3) / 25; k p_1 = 24/25 < 1, so nothing is capped: one token touches
    # k = 2 experts in expectation; with alpha = 2, p = (1, 1/4, 1/9, 1/16) / 1.4236 and k p_1 = 1.405 caps at 1:
    # one token touches 1 + 2 (1/4 + 1/9 + 1/16) / 1.4236 = 1.602 experts
    assert experts_touched(4, 2, 1, alpha=1.0) == pytest.approx(2.0)
    h = 1 + 1 / 4 + 1 / 9 + 1 / 16
    assert experts_touched(4, 2, 1, alpha=2.0) == pytest.approx(1 + 2 * (1 / 4 + 1 / 9 + 1 / 16) / h)


def test_arrays_give_the_numbers_scalars_give():
    t = np.array([[0.5, 1, 3], [32, 32, 4096]])
    got = experts_touched(256, 8, t)
    assert got.shape == t.shape
    for x, g in zip(t.ravel(), got.ravel()):
        assert g == pytest.approx(experts_touched(256, 8, float(x)), rel=1e-12)


def test_skew_touches_fewer_experts_until_every_one_is_touched():
    # the power law touches fewer experts than uniform routing at decode batches (the tables' power-law rows run
    # 75-90% of the balanced rows' time from 16 to 256 tokens), and all of them once thousands of tokens are routed
    for t in (4, 16, 64, 256):
        assert experts_touched(256, 8, t) < experts_touched(256, 8, t, alpha=0)
    assert experts_touched(256, 8, 32) < 0.7 * experts_touched(256, 8, 32, alpha=0)
    assert experts_touched(256, 8, 65536) == pytest.approx(256, rel=1e-6)
    assert ROUTING_ALPHA == 1.01  # the tables' power_law_1.01 rows, which the bundled MoE fits are fitted on
