"""Integer bisection, for the questions that search a count (steps, tokens, requests) against a monotone test."""

from __future__ import annotations

from typing import Callable


def last_true(holds: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest n in [lo, hi) for which `holds(n)`, given holds(lo) and not holds(hi), holds being monotone."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo
