"""The handful of array operations the engine's formulas use, so one formula serves a single plain-Python answer
(no numpy import on the planning path) and a numpy sweep over millions of rows alike."""

from __future__ import annotations

import math


class ScalarOps:
    """Plain Python numbers."""

    minimum = staticmethod(min)
    maximum = staticmethod(max)
    ceil = staticmethod(math.ceil)
    floor = staticmethod(math.floor)
    sqrt = staticmethod(math.sqrt)
    any = staticmethod(bool)

    @staticmethod
    def where(cond, a, b):
        return a if cond else b


SCALAR = ScalarOps()


def numpy_ops():
    """numpy itself provides minimum, maximum, ceil, floor, sqrt, where and any with the same meaning, elementwise."""
    import numpy

    return numpy
