"""Where each KV-cache format runs: for one engine, release and GPU, every format of the catalog planned on a model
exactly as kvplan plans a deployment (kvplan.deployment.resolve), and what that plan says of it: served, a what-if
(the engine cannot run it here; kvplan plans it as if it could, and its verdicts leave it out) or refused (kvplan
will not plan it: the engine has no such dtype, in this release or at all), with the reason kvplan gives; for vLLM,
the attention backend its selector picks (kvplan.rules.vllm_backends), the block size that backend sets, and every
backend that --attention-backend could name instead. Nothing here is a fact of its own: each comes from the
catalog (kvplan.specs.kv_formats), the engines' rules (kvplan.rules) and the deployment's resolution, and each row
names the source its verdict is read from.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, Optional, Sequence, Union

from kvplan.deployment import DeploymentArgs
from kvplan.deployment.backend import backends_storing
from kvplan.errors import KvplanError
from kvplan.rules.sglang import SGLANG_DTYPES
from kvplan.rules.sglang_backends import DEFAULT_SOURCES, read_release as sglang_release
from kvplan.rules.vllm import newer_release_note, vllm_rules
from kvplan.rules.vllm_backends import PRIORITY_SOURCES, ROCM_SOURCE, Choice, facts_of, read_release
from kvplan.specs.catalog import GPUSpec, ModelSpec
from kvplan.specs.kv_formats import CATALOG, ENGINE_NAMES, KVFormat, Serves
from kvplan.values import frozen_dataclass

# The models a matrix is shown for when none is named: a plain dense GQA model, and an MLA one (vLLM's selector
# walks another list for MLA, and some formats apply to one layout only)
DEFAULT_MODELS = ("llama3-8b", "deepseek-v3")

Status = Literal["served", "what-if", "refused"]


@frozen_dataclass
class FormatSupport:
    """One format on one model: how kvplan plans it on the engine, release and GPU."""

    dtype: str
    status: Status
    reason: Optional[str]  # why it is a what-if or refused, in kvplan's words; None where served
    source: Optional[str]  # the source the status is read from (an engine file, or kvplan's rule where it has none)
    catalog: tuple[Serves, ...]  # the format's catalog entries for this engine (any platform, any release)
    stored_as: Optional[str] = None  # the format the engine stores under this name, where another (fp8_ds_mla)
    engine_dtype: Optional[str] = None  # SGLang: its --kv-cache-dtype for the format
    backend: Optional[Choice] = None  # vLLM: the selector's choice (name "none" for a what-if no backend stores);
    # SGLang: its default backend (kvplan.rules.sglang_backends) or the one --attention-backend names
    block_size: Optional[int] = None  # vLLM: the block the plan uses; SGLang: the page size
    backends: tuple[Choice, ...] = ()  # vLLM: every backend that could store it here (--attention-backend NAME)

    def to_dict(self) -> dict:
        def choice(c: Choice) -> dict:
            return {"name": c.name, "family": c.family, "block_size": c.block_size, "source": c.source or None}

        return {"dtype": self.dtype, "status": self.status, "reason": self.reason, "source": self.source,
                "stored_as": self.stored_as, "engine_dtype": self.engine_dtype,
                "backend": choice(self.backend) if self.backend is not None else None,
                "backends": [choice(c) for c in self.backends], "block_size": self.block_size,
                "catalog": [{"platform": x.platform, "where": x.where(), "source": x.source, "until": x.until}
                            for x in self.catalog]}


@frozen_dataclass
class ModelSupport:
    """The formats on one model: those that apply to its attention (MLA or heads), and the names of the rest."""

    model: str
    attention: str  # e.g. "GQA, head 128" or "MLA, latent 512 + 64"
    rows: tuple[FormatSupport, ...]
    not_applicable: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"model": self.model, "attention": self.attention, "rows": [r.to_dict() for r in self.rows],
                "not_applicable": list(self.not_applicable), "notes": list(self.notes)}


@frozen_dataclass
class SupportMatrix:
    """Every format of the catalog (or those asked for) on one engine, release and GPU, per model."""

    engine: str
    engine_version: str  # the release asked for, or the one kvplan plans with by default
    rules: str  # the rules kvplan plans that release with (vLLM: their range of releases)
    gpu: str
    compute_capability: Optional[str]
    platform: str  # cuda or rocm
    models: tuple[ModelSupport, ...]
    backends_release: Optional[str] = None  # the release whose attention backends and selector are read
    selector_source: Optional[str] = None  # vLLM: the priority lists' source; SGLang: its default choice's
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"engine": self.engine, "engine_version": self.engine_version, "rules": self.rules, "gpu": self.gpu,
                "compute_capability": self.compute_capability, "platform": self.platform,
                "backends_release": self.backends_release,
                "selector_source": self.selector_source, "models": [m.to_dict() for m in self.models],
                "notes": list(self.notes)}


def _attention(m: ModelSpec) -> str:
    if m.mla is not None:
        return f"MLA{', sparse' if m.sparse_mla else ''}, latent {m.mla.kv_lora_rank} + {m.mla.qk_rope_head_dim}"
    kind = "MHA" if m.num_kv_heads == m.num_heads else "GQA"
    return f"{kind}, head {facts_of(m).head_size}"


def _applies(f: KVFormat, m: ModelSpec) -> bool:
    """Whether the format is one for the model's attention (kvplan.app.options._formats_for's test)."""
    return f.applies_to == "both" or (f.applies_to == "mla") == m.is_mla


def _refusal_source(f: KVFormat, engine: str, version: Optional[str], rules_version: str) -> Optional[str]:
    """Where the rule that refused the format is kept: the catalog entry a later release ended, else kvplan's table
    of the engine's dtypes."""
    ended = f.refused_from(engine, version)
    if ended is not None:
        return ended.source
    if engine == "sglang" and f.name not in SGLANG_DTYPES:
        return "kvplan/rules/sglang.py SGLANG_DTYPES (the dtypes SGLang takes)"
    if engine == "vllm" and f.name in vllm_rules(rules_version).cache_dtypes_missing:
        return f"kvplan/rules/vllm.py VLLM['{rules_version}'].cache_dtypes_missing"
    return None


def _row(base: DeploymentArgs, f: KVFormat, m: ModelSpec, engine: str, rules_version: str,
         selector: Optional[str]) -> FormatSupport:
    """The format planned on the model (`base`: the engine, release and GPU), read as a row of the matrix."""
    mine = tuple(x for x in f.serves if x.engine == engine)
    try:
        d = replace(base, model=m, kv_cache_dtype=f).resolve()
    except KvplanError as e:
        return FormatSupport(f.name, "refused", str(e), _refusal_source(f, engine, base.engine_version, rules_version),
                             mine)
    kv = d.kv
    stored = tuple(x for x in kv.serves if x.engine == engine)
    catalog_word = kv.unserved(engine, d.gpu, base.engine_version)  # the catalog's; else no backend serves it
    if d.unserved is None:
        status: Status = "served"
        here = [x.source for x in stored if x.on(d.gpu) and x.in_release(base.engine_version)]
        source = d.attention_backend.source if engine == "vllm" else (here[0] if here else None)
    else:
        status = "what-if"
        if catalog_word or engine != "vllm":
            source = "; ".join(dict.fromkeys(x.source for x in stored)) or \
                f"kvplan/specs/kv_formats.py CATALOG['{kv.name}'] (no {ENGINE_NAMES[engine]} entry)"
        else:
            source = selector
    reason = d.unserved.removeprefix("what-if: ") if d.unserved else None
    common = dict(stored_as=kv.name if kv.name != f.name else None, catalog=mine)
    if engine == "sglang":
        return FormatSupport(f.name, status, reason, source, engine_dtype=SGLANG_DTYPES.get(kv.name),
                             backend=d.attention_backend, block_size=d.page_size, **common)
    return FormatSupport(f.name, status, reason, source, backend=d.attention_backend, block_size=d.block_size,
                         backends=tuple(backends_storing(d)), **common)


def support_matrix(gpu: Union[str, GPUSpec], engine: Optional[str] = None, engine_version: Optional[str] = None,
                   models: Optional[Sequence[Union[str, ModelSpec]]] = None,
                   formats: Optional[Sequence[KVFormat]] = None) -> SupportMatrix:
    """Each format of `formats` (default: the catalog) planned on each of `models` (default: DEFAULT_MODELS) for
    `engine` (default vLLM) release `engine_version` (default: the newest kvplan knows) on `gpu`. Bad input (an
    unknown engine, release, GPU or model, a model the engine does not serve) raises KvplanError, as planning the
    model's own dtype would."""
    if gpu is None:
        raise KvplanError("the support matrix is per GPU: name one (e.g. h100)")
    fmts = list(formats) if formats is not None else list(CATALOG.values())
    tables = []
    first = None
    for name in models or DEFAULT_MODELS:
        base = DeploymentArgs(model=name, gpu=gpu, engine=engine, engine_version=engine_version)
        d = base.resolve()  # the model's own dtype: refuses what is wrong with the engine, release, GPU or model
        first = first or d
        base = replace(base, gpu=d.gpu)
        m = d.model
        rules_version = d.engine_version
        selector = None
        if d.engine == "vllm":
            selector = ROCM_SOURCE if d.gpu.vendor == "amd" else PRIORITY_SOURCES[read_release(rules_version)]
        rows = tuple(_row(base, f, m, d.engine, rules_version, selector) for f in fmts if _applies(f, m))
        tables.append(ModelSupport(m.name, _attention(m), rows, tuple(f.name for f in fmts if not _applies(f, m)),
                                   (m.origin,) if m.origin else ()))
    if formats is not None and not any(t.rows for t in tables):
        f = fmts[0]
        layout = "MLA models" if f.applies_to == "mla" else "models with K and V heads (not MLA)"
        raise KvplanError(f"KV cache dtype '{f.name}' applies only to {layout}; "
                          f"{' and '.join(t.model for t in tables)} {'is' if len(tables) == 1 else 'are'} not one "
                          f"(name another --model)")
    g = first.gpu
    platform = "rocm" if g.vendor == "amd" else "cuda"
    version = engine_version.strip().lstrip("v") if engine_version else first.engine_version
    if first.engine == "vllm":
        newer = newer_release_note(engine_version)
        return SupportMatrix("vllm", version, first.rules.label, g.name, g.compute_capability, platform,
                             tuple(tables), read_release(first.engine_version), selector, (newer,) if newer else ())
    release = sglang_release(engine_version)
    return SupportMatrix("sglang", version, f"SGLang {first.engine_version}", g.name, g.compute_capability, platform,
                         tuple(tables), release, DEFAULT_SOURCES[release])
