"""kvplan's frozen value classes (a deployment, a KV format, a layer's cache, a result) declared cheaply.

`@frozen_dataclass` is `@dataclass(frozen=True)` as kvplan uses it, built for a command's start: the standard
decorator writes six methods as source and compiles each apart (__init__, __repr__, __eq__, __hash__, __setattr__,
__delattr__), which for the classes one planning command loads is a large part of its start-up. Here __init__ alone is
generated (one compile: its signature and defaults are the standard one's); the other five are
shared closures over the field names, behaving as the generated ones do:

  * __init__(field, ..., field=default, field=<factory>) puts the fields in the instance's __dict__ (where the
    standard one calls object.__setattr__ per field), a default factory called per instance; __match_args__ names
    the fields;
  * __repr__ is `Name(a=..., b=...)` (the fields shown by repr, '...' where an object holds itself);
  * __eq__ compares the tuples of the compared fields of two objects of the very same class (NotImplemented
    otherwise), and __hash__ hashes that tuple, so the values serve as dict and cache keys (kvplan.memo keys a
    frozen dataclass by identity, reading __dataclass_params__.frozen);
  * assigning or deleting an attribute raises dataclasses.FrozenInstanceError;
  * __dataclass_fields__ and __dataclass_params__ are the standard ones, so dataclasses.fields, replace, asdict,
    astuple and is_dataclass work unchanged, as does a class docstring made from the signature where there is none.

A class this does not cover (a dataclass base, ClassVar, InitVar or KW_ONLY annotations, a field left out of
__init__ or keyword-only, __slots__, a method of its own among those six) is handed to the standard decorator whole."""

from __future__ import annotations

import abc
import dataclasses
import sys
from _thread import get_ident
from dataclasses import MISSING, Field, FrozenInstanceError
from operator import attrgetter

__all__ = ["frozen_dataclass"]


def _frozen_params():
    """The __dataclass_params__ the standard decorator gives a class for frozen=True (shared by every class built
    here): its _DataclassParams, whose fields differ between Python releases, made from its own argument names."""
    params = getattr(dataclasses, "_DataclassParams", None)
    try:
        code = params.__init__.__code__  # type: ignore[union-attr]
        names = code.co_varnames[1:code.co_argcount]
        given = {"init": True, "repr": True, "eq": True, "frozen": True, "match_args": True}
        return params(**{n: given.get(n, False) for n in names})  # type: ignore[misc]
    except (AttributeError, TypeError):
        return dataclasses.dataclass(frozen=True)(type("_Params", (), {})).__dataclass_params__


_PARAMS = _frozen_params()
_FIELD = getattr(dataclasses, "_FIELD", None)  # the marker dataclasses.fields() keeps a field by
_FACTORY = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", None)  # the default shown for a default_factory: <factory>
_OWN = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__")
_NOT_FIELDS = ("ClassVar", "InitVar", "KW_ONLY")


def frozen_dataclass(cls: type) -> type:
    """`@dataclass(frozen=True)`, with only __init__ generated (see the module's docstring)."""
    fields = _fields(cls)
    if fields is None:
        return dataclasses.dataclass(frozen=True)(cls)
    for name, f in fields.items():  # the class attribute is the default, as the standard decorator leaves it
        if isinstance(cls.__dict__.get(name), Field):
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
    cls.__dataclass_params__ = _PARAMS
    cls.__dataclass_fields__ = fields
    names = tuple(fields)
    _method(cls, "__init__", _init(cls, fields))
    _method(cls, "__repr__", _repr(tuple(n for n, f in fields.items() if f.repr)))
    compared = _key(tuple(n for n, f in fields.items() if f.compare))
    _method(cls, "__eq__", _eq(compared))
    _method(cls, "__hash__", _hash(_key(tuple(n for n, f in fields.items()
                                              if (f.compare if f.hash is None else f.hash)))))
    _method(cls, "__setattr__", _setattr(cls, names))
    _method(cls, "__delattr__", _delattr(cls, names))
    if "__match_args__" not in cls.__dict__:
        cls.__match_args__ = names
    if not getattr(cls, "__doc__"):
        import inspect

        try:
            text_sig = str(inspect.signature(cls)).replace(" -> None", "")
        except (TypeError, ValueError):
            text_sig = ""
        cls.__doc__ = cls.__name__ + text_sig
    abc.update_abstractmethods(cls)
    return cls


def _fields(cls: type) -> dict | None:
    """The class's fields as the standard decorator makes them, or None where it must make them itself."""
    if _FIELD is None or _FACTORY is None or any(k in cls.__dict__ for k in (*_OWN, "__slots__")):
        return None
    if any(hasattr(b, "__dataclass_fields__") for b in cls.__mro__[1:]):
        return None
    annotations = cls.__dict__.get("__annotations__", {})
    fields = {}
    for name, typ in annotations.items():
        if name == "self" or name.startswith("__") or any(w in str(typ) for w in _NOT_FIELDS):
            return None
        default = cls.__dict__.get(name, MISSING)
        if isinstance(default, Field):
            f = default
            if not f.init or f.kw_only not in (MISSING, False):
                return None
        else:
            if default is not MISSING and default.__class__.__hash__ is None:
                return None  # a mutable default: the standard decorator's ValueError
            f = dataclasses.field(default=default)
        f.name, f.type, f._field_type = name, typ, _FIELD  # type: ignore[attr-defined]
        if f.kw_only is MISSING:
            f.kw_only = False
        fields[name] = f
    if any(isinstance(v, Field) and k not in annotations for k, v in cls.__dict__.items()):
        return None  # a field() without an annotation: the standard decorator's TypeError
    return fields


def _method(cls: type, name: str, fn) -> None:
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, fn)


def _init(cls: type, fields: dict):
    """__init__ as the standard decorator writes it for a frozen class, compiled once."""
    params, body = [], []
    closure = {"__F": _FACTORY}
    seen_default = False
    for i, (name, f) in enumerate(fields.items()):
        value = name
        if f.default_factory is not MISSING:
            params.append(f"{name}=__F")
            closure[f"__f{i}"] = f.default_factory
            value = f"__f{i}() if {name} is __F else {name}"
            seen_default = True
        elif f.default is not MISSING:
            params.append(f"{name}=__d{i}")
            closure[f"__d{i}"] = f.default
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {name!r} follows default argument")
        else:
            params.append(name)
        body.append(f"{name!r}:{value}")
    # the fields go into the instance's __dict__ at once (what object.__setattr__ does one by one for a class
    # without slots or descriptors): half the source to compile, and a faster __init__
    src = (f"def __create_fn__({', '.join(closure)}):\n def __init__({', '.join(['self', *params])}):\n"
           + (f"  self.__dict__.update({{{', '.join(body)}}})" if body else "  pass") + "\n return __init__")
    module = sys.modules.get(cls.__module__)
    scope: dict = {}
    exec(src, module.__dict__ if module is not None else {}, scope)
    fn = scope["__create_fn__"](**closure)
    fn.__annotations__ = {**{name: f.type for name, f in fields.items()}, "return": None}
    return fn


def _key(names: tuple):
    """The tuple of these attributes of an object."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda self: (one(self),)
    return lambda self: ()


def _repr(names: tuple):
    running: set = set()

    def __repr__(self):
        key = id(self), get_ident()
        if key in running:
            return "..."
        running.add(key)
        try:
            return self.__class__.__qualname__ + f"({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"
        finally:
            running.discard(key)

    return __repr__


def _eq(key):
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return key(self) == key(other)
        return NotImplemented

    return __eq__


def _hash(key):
    def __hash__(self):
        return hash(key(self))

    return __hash__


def _setattr(cls: type, names: tuple):
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _delattr(cls: type, names: tuple):
    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__
