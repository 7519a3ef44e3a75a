"""kvplan.values.frozen_dataclass behaves as @dataclass(frozen=True): the same fields, signature, docstring, equality,
hash, repr, immutability and dataclasses functions, on classes declared both ways; and every frozen value class of
kvplan is built by it (none fell back to the standard decorator)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from kvplan.values import frozen_dataclass


def _classes(decorate):
    @decorate
    class Point:
        """A point."""

        x: int
        y: Optional[str] = None
        tags: list = field(default_factory=list)
        extra: dict = field(default_factory=dict, compare=False)

    @decorate
    class One:
        a: float = 1.0

    @decorate
    class Empty:
        pass

    @decorate
    class Holder:
        v: object = None

    return Point, One, Empty, Holder


STANDARD = _classes(dataclass(frozen=True))
LIGHT = _classes(frozen_dataclass)


def _field_view(cls):
    return [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.hash, f.compare, f.kw_only,
             f._field_type) for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("std,light", list(zip(STANDARD, LIGHT)), ids=[c.__name__ for c in STANDARD])
def test_the_class_is_the_standard_ones(std, light):
    assert light.__doc__ == std.__doc__  # a class without a docstring gets the signature, as dataclass gives it
    assert str(inspect.signature(light)) == str(inspect.signature(std))
    assert light.__init__.__annotations__ == std.__init__.__annotations__
    assert light.__match_args__ == std.__match_args__
    assert _field_view(light) == _field_view(std)
    assert repr(light.__dataclass_params__) == repr(std.__dataclass_params__)
    assert set(vars(light)) == set(vars(std))
    for name, value in vars(std).items():
        if not callable(value) and name not in ("__dict__", "__weakref__", "__dataclass_fields__",
                                                "__dataclass_params__", "__doc__"):
            assert vars(light)[name] == value, name  # class attributes: the defaults, factories removed
    for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"):
        assert getattr(light, name).__qualname__ == getattr(std, name).__qualname__
    assert dataclasses.is_dataclass(light)


def test_instances_behave_as_the_standard_ones():
    (P, One, Empty, Holder), (Ps, Ones, Emptys, Holders) = LIGHT, STANDARD
    p = P(1)
    assert p == P(1, extra={"ignored": True})  # a field left out of the comparison
    assert p != P(2) and p != Ps(1) and (p == Ps(1)) is False  # another class is never equal
    assert P(1).tags is not P(1).tags  # a factory per instance
    assert repr(P(1, "s", [1], {2: 3})) == repr(Ps(1, "s", [1], {2: 3})).replace("Ps", "P")
    assert repr(Empty()) == repr(Emptys()) and Empty() == Empty()
    assert hash(One(2.0)) == hash(Ones(2.0)) == hash((2.0,)) and hash(Empty()) == hash(())
    assert {One(2.0): 1}[One(2.0)] == 1
    with pytest.raises(TypeError, match="unhashable"):
        hash(p)  # a list field: as unhashable as the standard class
    nan = float("nan")
    assert (One(nan) == One(nan)) == (Ones(nan) == Ones(nan))  # a field compared as a tuple item: by identity first
    h = Holder()
    object.__setattr__(h, "v", h)
    hs = Holders()
    object.__setattr__(hs, "v", hs)
    assert repr(h) == repr(hs).replace("Holders", "Holder")  # an object holding itself shows as ...
    for obj in (p, One(), Empty()):
        for action in (lambda: setattr(obj, "x", 2), lambda: setattr(obj, "new", 2), lambda: delattr(obj, "x")):
            with pytest.raises(dataclasses.FrozenInstanceError):
                action()
    assert dataclasses.replace(p, x=5) == P(5) and dataclasses.asdict(p) == dataclasses.asdict(Ps(1))
    assert dataclasses.astuple(p) == (1, None, [], {})
    assert copy.deepcopy(p) == p and copy.copy(One(3.0)) == One(3.0)
    with pytest.raises(TypeError) as light_error:
        P()
    with pytest.raises(TypeError) as std_error:
        Ps()
    assert str(light_error.value) == str(std_error.value)


def test_declaration_errors_are_the_standard_ones():
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        @frozen_dataclass
        class Late:
            a: int = 1
            b: int

    with pytest.raises(ValueError, match="mutable default"):
        @frozen_dataclass
        class Mutable:
            a: list = []  # noqa: RUF012


def test_what_it_does_not_cover_goes_to_the_standard_decorator():
    @frozen_dataclass
    class Base:
        a: int = 0

    @frozen_dataclass
    class Derived(Base):  # a dataclass base
        b: int = 1

    assert Derived(1, 2) == Derived(1, 2) and [f.name for f in dataclasses.fields(Derived)] == ["a", "b"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Derived().b = 3

    @frozen_dataclass
    class Hidden:
        a: int = field(default=0, init=False)

    assert "a" not in inspect.signature(Hidden).parameters and Hidden().a == 0


def test_kvplan_value_classes_are_built_light():
    """Every @frozen_dataclass of kvplan took the light path: its __eq__ is the shared closure, not generated
    source (a class that fell back would start as slowly as before)."""
    root = Path(__file__).resolve().parents[1] / "kvplan"
    found = 0
    for path in sorted(root.rglob("*.py")):
        if "@frozen_dataclass" not in path.read_text(encoding="utf-8"):
            continue
        rel = path.relative_to(root.parent).with_suffix("")
        module = importlib.import_module(".".join(p for p in rel.parts if p != "__init__"))
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and dataclasses.is_dataclass(cls):
                if cls.__dataclass_params__.frozen:
                    found += 1
                    assert cls.__eq__.__code__.co_filename.endswith("values.py"), cls
    assert found >= 40
