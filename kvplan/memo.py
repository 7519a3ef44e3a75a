"""Remembering what pure functions of the frozen specs return, for the grids and sweeps that ask the same question
of one model, GPU or KV format many times.

A spec (ModelSpec, GPUSpec, KVFormat) is frozen but not hashable (it holds dicts), so `per_spec` keys a call by the
identity of each frozen value it is given and by the value of every other argument. A frozen object never changes, so the
same object always gets the same answer; every entry keeps its specs alive, so an identity is never reused while
an entry names it. What a remembered function returns must be immutable (a number, a tuple, a frozen value).
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from pydantic import BaseModel

F = TypeVar("F", bound=Callable)

MAX_ENTRIES = 512  # per function; beyond it the memory starts again, so a long-running caller's memory stays flat


def _key(a):
    """A frozen value (a pydantic model or dataclass declared frozen) by identity; anything else by value."""
    cls = type(a)
    if isinstance(a, BaseModel) and cls.model_config.get("frozen"):
        return ("spec", id(a))
    params = getattr(cls, "__dataclass_params__", None)
    if params is not None and params.frozen:
        return ("spec", id(a))
    return a


def per_spec(fn: F) -> F:
    """`fn` remembered per spec identity and argument values (see the module's docstring)."""
    cache: dict[tuple, tuple] = {}

    @functools.wraps(fn)
    def remembered(*args, **kwargs):
        key = tuple(_key(a) for a in args)
        if kwargs:
            key += tuple(sorted((k, _key(v)) for k, v in kwargs.items()))
        try:
            hit = cache.get(key)
        except TypeError:  # an argument that is neither a spec nor hashable (a list): not remembered
            return fn(*args, **kwargs)
        if hit is not None:
            return hit[1]
        result = fn(*args, **kwargs)
        if len(cache) >= MAX_ENTRIES:
            cache.clear()
        cache[key] = ((args, kwargs), result)  # the arguments kept alive, so their identities stay theirs
        return result

    remembered.cache_clear = cache.clear  # type: ignore[attr-defined]
    return remembered  # type: ignore[return-value]
