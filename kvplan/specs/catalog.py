"""The model and GPU catalogs: specs loaded from the bundled YAML files, a YAML path, a Hugging Face config.json
or snapshot folder, or a Hugging Face id (the spec types themselves are kvplan.specs.model and
kvplan.specs.gpu, also importable from here)."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional, Sequence

from pydantic import BaseModel, ValidationError

from kvplan.errors import HubUnavailable, KvplanError, UnmodelledWeights, did_you_mean
from kvplan.files import check_finite, read_json, read_yaml, type_name  # noqa: F401  (read_yaml: also imported from here)
from kvplan.specs.gpu import GPUSpec  # noqa: F401 (importable from here)
from kvplan.specs.model import (  # noqa: F401 (importable from here)
    ATTENTION_KINDS,
    AttentionLayout,
    CompressedAttentionSpec,
    KVCacheDeclared,
    LayerKind,
    MixerKind,
    MLASpec,
    MlpKind,
    ModelSpec,
    MoESpec,
    SharedAttentionSpec,
    StateSpec,
    VisionSpec,
    _Frozen,
)

# ---------------------------------------------------------------------------------------------------------------
# Loading


def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent


def catalog_dir(kind: Literal["models", "hardware"]) -> Path:
    """The bundled catalog: inside the installed package, or beside it in a source checkout."""
    override = os.environ.get(f"KVPLAN_{kind.upper()}_DIR")
    if override:
        return Path(override)
    bundled = _package_root() / "_bundled" / kind
    if bundled.is_dir():
        return bundled
    return _package_root().parent / kind


def _validation_message(path: Path | str, e: ValidationError, cls) -> str:
    errors = sorted(e.errors(), key=lambda err: err["type"] != "extra_forbidden")  # a typo shows as extra + missing
    err = errors[0]
    field = ".".join(str(p) for p in err["loc"]) or "(top level)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if err["type"] == "extra_forbidden":
        fields = list(cls.model_fields)
        for part in err["loc"][:-1]:  # nested: suggest among the nested model's fields
            sub = cls.model_fields.get(str(part))
            ann = getattr(sub, "annotation", None)
            for cand in getattr(ann, "__args__", (ann,)):
                if isinstance(cand, type) and issubclass(cand, BaseModel):
                    fields, cls = list(cand.model_fields), cand
        return f"{path}: field '{field}' is not a spec field{did_you_mean(str(err['loc'][-1]), fields)}{more}"
    msg = " ".join(err["msg"].removeprefix("Value error, ").split())
    return f"{path}: field '{field}': {msg}{more}"


def _build(cls, data, path):
    if not isinstance(data, dict):
        raise KvplanError(f"{path}: expected a mapping of fields at the top level, found {type_name(data)}")
    check_finite(data, path)
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        missing = [".".join(str(p) for p in err["loc"]) for err in e.errors() if err["type"] == "missing"]
        if cls is ModelSpec and data.get("head_dim") is None and data.get("mla") is None and missing:
            missing.append("head_dim")  # checked once the fields are read, so its error would come only later
        if len(missing) > 1 and len(e.errors()) == len(missing) - (missing[-1] == "head_dim"):
            # only fields missing (a typo, extra and missing, is reported as one): every one at once
            raise KvplanError(f"{path}: fields {', '.join(repr(m) for m in missing[:-1])} and {missing[-1]!r} are "
                              f"required") from None
        raise KvplanError(_validation_message(path, e, cls)) from None


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _catalog_files(kind: str) -> list[Path]:
    d = catalog_dir(kind)  # type: ignore[arg-type]
    return sorted(d.glob("*.yaml")) if d.is_dir() else []




# Bump when read_yaml would parse the same text differently, so that no earlier parse is taken from the cache.
_CATALOG_CACHE_VERSION = 1


def _catalog_cache_file(path: Path) -> Optional[Path]:
    """Where a catalog file's parse is kept: KVPLAN_CACHE_DIR, else XDG_CACHE_HOME/kvplan, else ~/.cache/kvplan;
    None when that would be under a home directory that does not exist (kvplan makes no home directory)."""
    base = os.environ.get("KVPLAN_CACHE_DIR")
    if not base:
        root = os.environ.get("XDG_CACHE_HOME")
        if not root:
            home = os.path.expanduser("~")
            if not os.path.isdir(home):
                return None
            root = os.path.join(home, ".cache")
        base = os.path.join(root, "kvplan")
    return Path(base) / "catalog" / f"{path.parent.name}-{path.stem}.marshal"


def _catalog_data(path: Path):
    """A catalog file's YAML, parsed. The parse is a function of the text alone, so it is kept, with the text it
    came from, in kvplan's cache directory: a later run that finds the same text there takes the kept parse and
    never imports PyYAML (a tenth of a planning command's start-up beyond typer's). It is kept with `marshal`, as
    Python keeps its .pyc files: built in, so nothing to import, and it gives back every type YAML builds (dates
    aside, which are not kept) exactly. A cache that cannot be read or written is no cache; a file that does not
    parse is never kept, so its error is read_yaml's every time."""
    cached, tag, text, entry = _catalog_entry(path)
    if entry is not None:
        return entry[2]
    data = read_yaml(path)
    if cached is not None:
        _keep(cached, path, (tag, text, data))
    return data


def _catalog_entry(path: Path) -> tuple:
    """(the cache file or None, the cache's tag, the file's text, the entry kept for this very text or None). An
    entry is (tag, text, parse), and for a catalog spec (_load_catalog_file) the validated spec after them."""
    import marshal
    import sys

    from kvplan.files import read_text

    tag = (_CATALOG_CACHE_VERSION, tuple(sys.version_info[:2]))
    text = read_text(path, "YAML file")
    cached = _catalog_cache_file(path)
    if cached is None:
        return None, tag, text, None
    try:
        entry = marshal.loads(cached.read_bytes())
        if entry[0] == tag and entry[1] == text:
            return cached, tag, text, entry
    except (OSError, ValueError, EOFError, TypeError, IndexError, KeyError):
        pass
    return cached, tag, text, None


def _keep(cached: Path, path: Path, entry: tuple) -> None:
    """Write a cache entry, atomically, while the file's text is still the one it holds; what cannot be written
    (a value marshal cannot keep, a cache that cannot be written) is not kept."""
    import marshal

    from kvplan.files import read_text

    try:
        blob = marshal.dumps(entry)  # ValueError for what marshal cannot keep (a date)
        if read_text(path, "YAML file") == entry[1]:  # keep only the text that was parsed
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
            try:
                tmp.write_bytes(blob)
                os.replace(tmp, cached)
            finally:
                if tmp.exists():
                    tmp.unlink()
    except (OSError, ValueError, KvplanError):
        pass


@lru_cache(maxsize=None)
def _load_catalog_file(kind: str, path: Path):
    """A catalog file's spec. The validated spec is kept beside the file's parse in kvplan's cache (_catalog_data):
    validating a model spec first builds pydantic's validators for ModelSpec and every spec class inside it, the
    largest single cost of a planning command's start, so a later run that finds the same text, to be validated by
    the same spec classes (the same source files, as Python checks its .pyc files, and the same pydantic release),
    takes the kept spec instead: the same values of the same classes with the same fields set, as pickle would give
    them back. A spec that does not validate is never kept, so its error is _build's every time."""
    cls = ModelSpec if kind == "models" else GPUSpec
    cached, tag, text, entry = _catalog_entry(path)
    stamp = _spec_stamp()
    if entry is not None and len(entry) > 3 and entry[3][0] == stamp:
        try:
            spec = _from_tree(entry[3][1])
            if type(spec) is cls:
                return spec
        except (AttributeError, ImportError, IndexError, KeyError, TypeError, ValueError):
            pass
    data = entry[2] if entry is not None else read_yaml(path)
    spec = _build(cls, data, path)
    if cached is not None:
        try:
            tree = _to_tree(spec)
        except (TypeError, RecursionError):  # a value the tree does not hold: the parse alone is kept
            tree = None
        _keep(cached, path, (tag, text, data) if tree is None else (tag, text, data, (stamp, tree)))
    return spec


# The modules whose code decides what a catalog file validates to: a kept spec is taken only while their source files
# are the ones it was validated by.
_SPEC_MODULES = ("kvplan.specs.catalog", "kvplan.specs.model", "kvplan.specs.gpu", "kvplan.specs.mixers",
                 "kvplan.specs.layers", "kvplan.specs.tensors", "kvplan.specs.frozen", "kvplan.files", "kvplan.memo",
                 "kvplan.units", "kvplan.errors")


@lru_cache(maxsize=1)
def _spec_stamp() -> tuple:
    """pydantic's release, and the size and modification time of the source file of each of _SPEC_MODULES (read
    once a process)."""
    import sys

    from pydantic.version import VERSION

    stamps = []
    for name in _SPEC_MODULES:
        try:
            st = os.stat(sys.modules[name].__file__)
            stamps.append((name, st.st_size, st.st_mtime_ns))
        except (KeyError, AttributeError, TypeError, OSError):
            stamps.append((name, None, None))
    return (VERSION, tuple(stamps))


def _to_tree(value):
    """A validated spec as nested tuples that `marshal` keeps: a spec model as ("m", its module, its class, its
    pickling state), a dict, tuple, list or set tagged by kind, a number, string, bool or None as itself.
    TypeError for anything else."""
    if isinstance(value, BaseModel):
        cls = type(value)
        if not cls.__module__.startswith("kvplan.specs.") or "." in cls.__qualname__:
            raise TypeError(f"{cls.__qualname__} is not a spec class of kvplan.specs")
        return ("m", cls.__module__, cls.__qualname__, _to_tree(value.__getstate__()))
    kind = type(value)
    if kind is dict:
        return ("d", tuple(_to_tree(k) for k in value), tuple(_to_tree(v) for v in value.values()))
    if kind is tuple:
        return ("t", tuple(_to_tree(v) for v in value))
    if kind is list:
        return ("l", tuple(_to_tree(v) for v in value))
    if kind is set:
        return ("s", tuple(_to_tree(v) for v in value))
    if value is None or kind in (bool, int, float, str):
        return value
    raise TypeError(f"a {kind.__name__} is not kept")


def _from_tree(tree):
    """The value a _to_tree tree was made of: each spec model made anew as pickle makes it (its class's __new__,
    then __setstate__ with its state), no validation run."""
    if type(tree) is not tuple:
        return tree
    kind, items = tree[0], [_from_tree(v) for v in tree[-1]] if tree[0] != "m" else None
    if kind == "m":
        import importlib

        if not tree[1].startswith("kvplan.specs."):
            raise ValueError(f"{tree[1]} is not a module of kvplan.specs")
        cls = getattr(importlib.import_module(tree[1]), tree[2])
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            raise TypeError(f"{tree[1]}.{tree[2]} is not a spec class")
        spec = cls.__new__(cls)
        spec.__setstate__(_from_tree(tree[3]))
        return spec
    if kind == "d":
        return dict(zip([_from_tree(k) for k in tree[1]], items))
    if kind == "t":
        return tuple(items)
    if kind == "l":
        return items
    if kind == "s":
        return set(items)
    raise ValueError(f"unknown node {kind!r}")


def catalog_entries(kind: Literal["models", "hardware"]) -> list[tuple[str, ModelSpec | GPUSpec]]:
    """(short name, spec) for every bundled spec; the short name is the file stem, what a user types."""
    return [(p.stem, _load_catalog_file(kind, p)) for p in _catalog_files(kind)]


def load_catalog(kind: Literal["models", "hardware"]) -> list:
    return [spec for _, spec in catalog_entries(kind)]


def _resolve(kind: Literal["models", "hardware"], name: str):
    """A catalog entry by file stem, name or alias (case, dashes and dots ignored). Reads one file when the name
    matches a file stem; scans the aliases otherwise, building only the entries whose text holds the name."""
    import re

    key = _norm(name)
    files = _catalog_files(kind)
    for p in files:
        if _norm(p.stem) == key:
            return _load_catalog_file(kind, p)
    for p in files:
        try:  # the name's letters and digits, in order, lie in the text of any file naming it ([\W_]: not isalnum)
            if key not in re.sub(r"[\W_]+", "", p.read_text(encoding="utf-8", errors="replace").lower()):
                continue
        except OSError:
            pass  # let loading the file say what is wrong with it
        spec = _load_catalog_file(kind, p)
        if key in {_norm(spec.name), *(_norm(a) for a in spec.aliases)}:
            return spec
    entries = load_catalog(kind)
    for spec in entries:
        if key in {_norm(spec.name), *(_norm(a) for a in spec.aliases)}:
            return spec
    names = [p.stem for p in _catalog_files(kind)] + [a for s in entries for a in s.aliases]
    what = "model" if kind == "models" else "GPU"
    listing = "kvplan models" if kind == "models" else "kvplan gpus"
    raise KvplanError(
        f"unknown {what} '{name}'{did_you_mean(name, names)}; `{listing}` lists the catalog, "
        f"or pass a path to a YAML spec{' or a config.json' if kind == 'models' else ''}"
    )


def _looks_like_path(name: str) -> bool:
    """A file name, or a name that is a file or a snapshot folder here: what exists on disk wins over a catalog
    entry of the same name (a snapshot folder named Llama-3.1-8B is that folder's model)."""
    if name.endswith((".yaml", ".yml", ".json")) or os.sep in name or name.startswith("."):
        return True
    try:
        path = Path(name)
        return path.is_file() or (path / "config.json").is_file()
    except (OSError, ValueError):  # a name no file system can hold (NUL, too long)
        return False


def load_model(name_or_path: str, checkpoint: bool = False, unquantized: bool = False) -> ModelSpec:
    """A model by catalog name or alias, a path to a YAML spec, a Hugging Face config.json or snapshot folder, or a
    Hugging Face id (org/name: the local Hugging Face cache, else the Hub with the hub extra, else the catalog
    model of that architecture). With `checkpoint`, a Hugging Face id's checkpoint count comes from its safetensors
    headers on the Hub (or kvplan's cache of them) where its snapshot holds no weights. With `unquantized`, a
    config.json's quantization_config is set aside (the weights' format is given separately: --weight-dtype)."""
    if "/" in name_or_path:  # a Hugging Face id has one (the Hub's module is loaded only for names that might be one)
        from kvplan.specs.hub import looks_like_repo_id

        if looks_like_repo_id(name_or_path):
            return _model_for_repo_id(name_or_path, checkpoint, unquantized)
    if _looks_like_path(name_or_path):
        m = _model_from_path(name_or_path, unquantized)
        shadowed = _shadowed_catalog_name(name_or_path)
        if shadowed is None:
            return m
        note = (f"'{name_or_path}' is the {'folder' if _is_dir(name_or_path) else 'file'} of that name here, not the "
                f"catalog's {shadowed} (a path on disk wins; run elsewhere, or rename it, for the catalog model)")
        return m.model_copy(update={"origin": "; ".join(filter(None, (m.origin, note)))})
    try:
        return _resolve("models", name_or_path)
    except KvplanError:
        if _is_dir(name_or_path):
            raise KvplanError(f"unknown model '{name_or_path}': the folder {name_or_path} holds no config.json; pass a "
                              "snapshot folder (config.json inside), a config.json or a YAML spec, or name a catalog "
                              "model (`kvplan models` lists them)") from None
        raise


def _shadowed_catalog_name(name: str) -> Optional[str]:
    """The catalog model a bare name read from disk (a folder or file here, no path spelled) would otherwise name."""
    if name.endswith((".yaml", ".yml", ".json")) or os.sep in name or name.startswith("."):
        return None  # spelled as a path: no catalog name was meant
    try:
        return _resolve("models", name).name
    except KvplanError:
        return None


def _model_from_path(name_or_path: str, unquantized: bool) -> ModelSpec:
    """A model read from a YAML spec, a config.json or a snapshot folder."""
    path = Path(name_or_path)
    hint = "name a catalog model, a YAML spec or a config.json"
    if path.is_dir() and (path / "config.json").is_file():  # a local snapshot
        path = path / "config.json"
    if path.suffix == ".json":
        from kvplan.specs.hf_config import model_from_hf_config

        cfg = read_json(path, "file", hint)
        quant = _modelopt_file(path)
        if quant is not None and isinstance(cfg, dict) and not cfg.get("quantization_config"):
            q = read_json(quant, "file", "pass the hf_quant_config.json ModelOpt wrote beside the config")
            q = q.get("quantization", q) if isinstance(q, dict) else q
            cfg = {**cfg, "quantization_config": {"quant_method": "modelopt", **q} if isinstance(q, dict) else q}
            declared_in = "hf_quant_config.json"
        else:
            declared_in = "config.json quantization_config"
        if unquantized and isinstance(cfg, dict):
            cfg = _without_quantization(cfg)
        fields = model_from_hf_config(cfg, path)
        if fields.get("kv_cache_dtype_declared"):
            decl = fields["kv_cache_dtype_declared"]
            fields["kv_cache_dtype_declared"] = {**decl, "source": f"{declared_in} {decl['source']}"}
            if declared_in.startswith("config.json") and decl["source"].startswith("kv_cache_quant_algo") and \
                    "sglang" in decl["engines"]:
                # sglang 0.5.15 layers/quantization/modelopt_quant.py ModelOptFp8Config.from_config: a flat config's
                # kv_cache_quant_algo is read where kv_cache_scheme is not a dict (0.5.14 and before: not read)
                fields["kv_cache_dtype_declared"]["sglang_since"] = "0.5.15"
        held, unreadable = checkpoint_tensors(path.parent)
        if held:
            fields["checkpoint_params"], fields["checkpoint_dtypes"] = held["elements"], held["dtypes"]
        elif unreadable:
            fields["checkpoint_unavailable"] = unreadable
        return _build(ModelSpec, fields, path)
    return _build(ModelSpec, read_yaml(path, "file", hint), path)


def _is_dir(name: str) -> bool:
    try:
        return Path(name).is_dir()
    except (OSError, ValueError):
        return False


def load_model_as(name_or_path: str, weight_dtype: Optional[str] = None, checkpoint: bool = False) -> ModelSpec:
    """load_model, where a weight format given (--weight-dtype) stands in for a checkpoint quantization kvplan does
    not model; the model's origin says so."""
    try:
        return load_model(name_or_path, checkpoint)
    except UnmodelledWeights as e:
        if weight_dtype is None:
            raise
        what = e.what
    m = load_model(name_or_path, checkpoint, unquantized=True)
    note = f"the checkpoint's {what} is not modelled: its weights are planned as --weight-dtype {weight_dtype}"
    return m.model_copy(update={"origin": "; ".join(filter(None, (m.origin, note)))})


def _without_quantization(cfg: dict) -> dict:
    """A config.json without its quantization_config (nor its text_config's)."""
    cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"] = {k: v for k, v in cfg["text_config"].items() if k != "quantization_config"}
    return cfg


def checkpoint_elements(folder: Path) -> Optional[int]:
    """The elements of every tensor in a snapshot's *.safetensors files (see checkpoint_tensors)."""
    held, _ = checkpoint_tensors(folder)
    return held["elements"] if held else None


def checkpoint_tensors(folder: Path) -> tuple[Optional[dict], Optional[str]]:
    """The elements of every tensor in a snapshot's *.safetensors files and the elements per dtype, read from their
    headers alone (an 8-byte little-endian length, then a JSON object of dtypes and shapes), and why not where a file
    is unreadable or model.safetensors.index.json names a shard the folder lacks (a partial download). A folder
    without safetensors files gives (None, None): there is nothing to count."""
    import json
    import math
    import struct

    total, dtypes = 0, {}
    try:
        files = sorted(folder.glob("*.safetensors"))
        index = folder / "model.safetensors.index.json"
        if files and index.is_file():
            shards = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()
            missing = sorted(str(s) for s in set(shards) if not (folder / str(s)).is_file())
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                return None, (f"model.safetensors.index.json names {missing[0]}{more}, which the folder lacks (a "
                              f"partial download?)")
    except (OSError, ValueError, AttributeError) as e:
        return None, f"model.safetensors.index.json cannot be read ({type(e).__name__})"
    if not files:
        return None, None
    for f in files:
        unreadable = f"{f.name} cannot be read as safetensors (its header is cut short or not a safetensors header)"
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if not 0 < n < 100 * 2**20:
                    return None, unreadable
                header = json.loads(fh.read(n))
        except OSError as e:
            return None, f"{f.name} cannot be read ({e.strerror or e})"
        except (ValueError, struct.error):
            return None, unreadable
        if not isinstance(header, dict):
            return None, unreadable
        for name, t in header.items():
            if name != "__metadata__" and isinstance(t, dict) and isinstance(t.get("shape"), list):
                n = math.prod(int(x) for x in t["shape"])
                total += n
                dtype = str(t.get("dtype", "?"))
                dtypes[dtype] = dtypes.get(dtype, 0) + n
    if not total:
        return None, "its safetensors files list no tensors"
    return {"elements": total, "dtypes": dict(sorted(dtypes.items()))}, None


def _model_for_repo_id(name: str, checkpoint: bool = False, unquantized: bool = False) -> ModelSpec:
    from kvplan.specs.hub import checkpoint_summary, fetch_config, split_revision

    repo, revision = split_revision(name)
    try:
        config = fetch_config(repo, revision)
    except HubUnavailable as fetch_error:
        try:  # without the Hub: the catalog model of that architecture, when there is one
            spec = catalog_model_for_repo(repo)
        except KvplanError:
            raise fetch_error from None
        return spec.model_copy(update={"origin": f"'{repo}' planned as the catalog's {spec.name} (the same "
                                                 f"architecture); {fetch_error.why}"})
    spec = load_model(str(config), unquantized=unquantized)
    if not checkpoint or spec.checkpoint_params:  # a snapshot with its weights already counts them
        return spec
    summary, why = checkpoint_summary(repo, revision, config)
    if summary is None:
        return spec.model_copy(update={"checkpoint_unavailable": why})
    return spec.model_copy(update={"checkpoint_params": summary["elements"], "checkpoint_dtypes": summary["dtypes"],
                                   "checkpoint_unavailable": None})


def model_for_repo(repo: str, folders: Sequence[str | Path] = ()) -> ModelSpec:
    """The model a Hugging Face repo id names: its config.json in `folders` (or the local Hugging Face cache), else
    the catalog model of that architecture (instruct and chat variants share the base architecture)."""
    from kvplan.specs.hub import find_config

    found = find_config(repo, folders)
    if found is not None:
        return load_model(str(found))
    return catalog_model_for_repo(repo)


_QUANT_SUFFIX = (r"(?:[-_.](?:fp8(?:-dynamic)?|fp4|nvfp4|mxfp4|awq|gptq(?:-int[48])?|int[48]|w4a16|w8a8|w8a16|"
                 r"quantized(?:\.w\d+a\d+)?|bnb-4bit|4bit|8bit))+$")


def catalog_model_for_repo(repo: str) -> ModelSpec:
    """The catalog model a Hugging Face repo id names (instruct and chat variants share the base architecture)."""
    def norm(s: str) -> str:
        s = s.lower().rstrip("/").split("/")[-1]
        s = re.sub(_QUANT_SUFFIX, "", s)  # a quantized checkpoint has the base model's architecture
        for suffix in ("-instruct-2507", "-instruct", "-chat", "-it", "-base", "-hf"):
            s = s.removesuffix(suffix)
        return "".join(ch for ch in s.replace("meta-llama-", "llama-") if ch.isalnum())

    key = norm(repo)
    for stem, spec in catalog_entries("models"):
        names = {stem, spec.name, *(spec.aliases), *([spec.hf_repo] if spec.hf_repo else [])}
        if key in {norm(n) for n in names}:
            return spec
    raise KvplanError(f"the log's model '{repo}' is not in the catalog nor in the Hugging Face cache; pass --model "
                      f"(a catalog name, a YAML spec or its config.json) or --configs (a folder of config.json files)")


def _modelopt_file(config: Path) -> Optional[Path]:
    """ModelOpt's hf_quant_config.json beside a config.json (or <stem>_hf_quant_config.json beside
    <stem>_config.json, as saved from the Hub)."""
    name = config.name
    candidates = [config.with_name("hf_quant_config.json")]
    for suffix in ("_config.json", ".config.json"):
        if name.endswith(suffix):
            candidates.append(config.with_name(name[: -len(suffix)] + "_hf_quant_config.json"))
            candidates.append(config.with_name(name[: -len(suffix)] + ".hf_quant_config.json"))
    return next((c for c in candidates if c.is_file()), None)


def load_gpu(name_or_path: str) -> GPUSpec:
    """A GPU by catalog name or alias, or a path to a YAML spec."""
    if _looks_like_path(name_or_path):
        return _build(GPUSpec, read_yaml(name_or_path, "file", "name a catalog GPU or a YAML spec"), name_or_path)
    return _resolve("hardware", name_or_path)


def gpu_by_memory(total_bytes: int, tolerance: float = 0.01) -> Optional[GPUSpec]:
    """The catalog GPU whose total memory is nearest `total_bytes`, if one lies within `tolerance` (a fraction).
    A GPU matches by the total CUDA reports or by the one nvidia-smi prints (81,559 MiB = 79.65 GiB on an H100
    SXM): users quote either. Figures a tool really printed win ties over estimated ones."""
    best = None
    for g in load_catalog("hardware"):
        totals = [(g.memory_total_bytes, not g.memory_source.startswith("CUDA"))]
        if g.smi_total_mib:
            totals.append((g.smi_total_mib * 2**20, False))
        for figure, estimated in totals:
            if not figure:
                continue
            off = abs(figure - total_bytes) / total_bytes
            key = (off, estimated)
            if off <= tolerance and (best is None or key < best[0]):
                best = (key, g)
    return best[1] if best else None
