"""How a Hugging Face config.json is read: a config's fields with the defaults transformers gives them, and
the small readers of dtypes and names every part of the reader shares."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from kvplan.errors import KvplanError
from kvplan.files import type_name

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


def _dtype_of(text: Optional[str], default: Optional[str] = None) -> Optional[str]:
    """kvplan's name for a config's dtype string ("bfloat16", "torch.float16", ...)."""
    return _DTYPES.get(str(text or "").replace("torch.", ""), default)


def _served_dtype(text: Optional[str]) -> tuple[str, list[str]]:
    """The dtype vLLM's --dtype auto runs a checkpoint in, with a note where that is not the checkpoint's own: it
    downcasts float32 to the platform's first dtype, bfloat16 on every GPU from Ampere on (config/model.py
    _resolve_auto_dtype; platforms/cuda.py supported_dtypes)."""
    dtype = _dtype_of(text or "bfloat16", "bf16")
    if dtype == "fp32":
        return "bf16", ["a float32 checkpoint: vLLM runs it in bfloat16 (--dtype auto)"]
    return dtype, []


def _dt_rank(c: "_Fields", key: str, hidden: int) -> int:
    """A Mamba mixer's dt projection rank: the config's, or ceil(hidden / 16) where it says "auto" or nothing."""
    return -(-hidden // 16) if c.data.get(key, "auto") == "auto" else c.integer(key, minimum=1)


class _Fields:
    """One object of a config.json, read field by field with the type checked. A field that is absent or null
    reads as None."""

    def __init__(self, data: dict, path: Path | str, prefix: str = ""):
        self.data, self.path, self.prefix = data, path, prefix

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _error(self, key: str, expected: str, value: Any) -> KvplanError:
        return KvplanError(f"{self.path}: field '{self.prefix}{key}': expected {expected}, found {type_name(value)}")

    def integer(self, key: str, minimum: int = 0) -> Optional[int]:
        v = self.data.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._error(key, "a whole number", v)
        if v < minimum:
            raise self._error(key, f"a whole number of at least {minimum}", v)
        return v

    def need(self, key: str, *alts: str) -> int:
        """A positive whole number the config must have, under `key` or one of its older names."""
        for k in (key, *alts):
            if self.has(k):
                return self.integer(k, minimum=1)  # type: ignore[return-value]
        raise KvplanError(f"{self.path}: field '{self.prefix}{key}' is missing; a Hugging Face config.json for a "
                          "decoder has it")

    def flag(self, key: str) -> Optional[bool]:
        v = self.data.get(key)
        if v is None or isinstance(v, bool):
            return v
        raise self._error(key, "true or false", v)

    def text(self, key: str) -> Optional[str]:
        v = self.data.get(key)
        if v is None or isinstance(v, str):
            return v
        raise self._error(key, "a string", v)

    def section(self, key: str) -> Optional["_Fields"]:
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self._error(key, "an object ({...})", v)
        return _Fields(v, self.path, f"{self.prefix}{key}.")

    def items(self, key: str, ok: Callable[[Any], bool], expected: str) -> Optional[list]:
        """A list whose every item passes `ok`; `expected` describes such a list."""
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list):
            raise self._error(key, expected, v)
        for i, item in enumerate(v):
            if not ok(item):
                raise KvplanError(f"{self.path}: field '{self.prefix}{key}.{i}': expected {expected}, found "
                                  f"{type_name(item)} in it")
        return v


def _name_from_path(path: Path | str) -> str:
    """A config without _name_or_path is named after its file (<org>--<name>.config.json, as saved from the Hub,
    reads as org/name) or, for a plain config.json, its folder (a snapshot's revision folder names the repo above
    it: models--<org>--<name>/snapshots/<revision>/config.json)."""
    p = Path(os.path.abspath(path))  # not resolved: a cache's snapshot links to a blob named by its hash
    stem = p.name
    for suffix in (".config.json", "_config.json", "-config.json", ".json"):
        if stem.lower().endswith(suffix) and stem.lower() != "config.json":
            return stem[: -len(suffix)].replace("--", "/")
    folder = p.parent
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name[len("models--"):].replace("--", "/")
    return folder.name or "config.json"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
