"""Models by Hugging Face id: the config.json (and ModelOpt's hf_quant_config.json) of a repo, from the local
Hugging Face cache or, with the `hub` extra (huggingface_hub), from the Hub itself. Honours HF_ENDPOINT, HF_TOKEN,
HF_HUB_CACHE / HF_HOME and HF_HUB_OFFLINE as huggingface_hub does. No weights are downloaded: the checkpoint's own
parameter count comes from its safetensors headers alone, read with HTTP range requests."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Optional, Sequence

from kvplan.errors import HubUnavailable, KvplanError

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?:@[\w./-]+)?")


def looks_like_repo_id(name: str) -> bool:
    """org/name (or org/name@revision: a branch, tag or commit), one slash before any @, no file suffix, and no
    such file or folder here."""
    return bool(REPO_ID.fullmatch(name)) and not name.endswith((".json", ".yaml", ".yml")) and not Path(name).exists()


def split_revision(name: str) -> tuple[str, Optional[str]]:
    repo, _, revision = name.partition("@")
    return repo, revision or None


def hf_cache_dir() -> Path:
    """Where huggingface_hub keeps downloaded snapshots (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def find_config(repo: str, folders: Sequence[str | Path] = ()) -> Optional[Path]:
    """The config.json of a Hugging Face repo id in the given folders or the local Hugging Face cache. A folder may
    hold <org>--<name>.config.json (or _config.json), <org>--<name>/config.json, or a Hugging Face cache layout
    (models--<org>--<name>/snapshots/<revision>/config.json). Repo ids match case-insensitively, as on the Hub."""
    stem = repo.strip().strip("/").replace("/", "--").lower()
    if not stem:
        return None
    wanted = {f"{stem}.config.json", f"{stem}_config.json", stem, f"models--{stem}"}
    for folder in [*map(Path, folders), hf_cache_dir()]:
        try:
            entries = {e.name.lower(): e for e in folder.iterdir()}
        except OSError:
            continue
        for name in sorted(wanted & set(entries)):
            e = entries[name]
            if e.is_file():
                return e
            if (e / "config.json").is_file():
                return e / "config.json"
            snapshots = sorted((e / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime)
            if snapshots:
                return snapshots[-1]
    return None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _quiet() -> None:
    """One line on failure: huggingface_hub's own retry warnings and progress bars stay quiet."""
    import logging

    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def fetch_config(repo: str, revision: Optional[str] = None) -> Path:
    """The local path of a repo's config.json: the Hugging Face cache first, else downloaded (config.json and, where
    the repo has one, hf_quant_config.json) into that cache."""
    cached = find_config(repo) if revision is None else _cached_revision(hf_cache_dir(), repo, revision)
    if cached is not None:
        return cached
    # where another revision is cached, the repo is known and this revision is what is missing
    other = _not_cached(repo, revision)
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        missing = other or f"'{repo}' is not in the catalog nor in the local Hugging Face cache"
        raise HubUnavailable(f"{missing}; install huggingface_hub (pip install huggingface_hub, the hub extra) to "
                             f"fetch its config.json, or pass a config.json or a snapshot folder",
                             "its own config.json needs the Hugging Face cache or the hub extra") from None
    if _offline():
        missing = other or f"'{repo}' is not in the local Hugging Face cache"
        raise HubUnavailable(f"{missing} and HF_HUB_OFFLINE is set; download it once online (or unset "
                             f"HF_HUB_OFFLINE)",
                             "HF_HUB_OFFLINE is set and its own config.json is not in the Hugging Face cache")
    unreachable = _unreachable()
    if unreachable:
        missing = (f"{other}, and the Hub cannot be reached ({unreachable})" if other
                   else f"cannot reach the Hub for '{repo}' ({unreachable})")
        raise HubUnavailable(f"{missing}; check the network or HF_ENDPOINT, or pass a local config.json",
                             f"the Hub cannot be reached ({unreachable}) for its own config.json")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    _quiet()
    at = f" at revision {revision}" if revision else ""
    try:
        path = Path(hf_hub_download(repo, "config.json", revision=revision))
    except LocalEntryNotFoundError as e:  # the Hub could not be reached (a subclass of EntryNotFoundError)
        reason = _reason(e)
        raise HubUnavailable(f"cannot reach the Hub for '{repo}' ({reason}); check the network or HF_ENDPOINT, or "
                             f"pass a local config.json", f"the Hub cannot be reached ({reason}) for its own "
                             f"config.json") from None
    except GatedRepoError:
        raise KvplanError(f"'{repo}' is gated: accept its terms on the Hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise KvplanError(f"no repo '{repo}' on the Hub (or it is private: set HF_TOKEN); check the id") from None
    except RevisionNotFoundError:
        raise KvplanError(f"'{repo}' has no revision '{revision}'") from None
    except EntryNotFoundError:
        raise KvplanError(f"'{repo}'{at} has no config.json: kvplan reads a transformers config") from None
    except (HfHubHTTPError, OSError) as e:
        reason = _reason(e)
        raise KvplanError(f"cannot fetch '{repo}' config.json from the Hub ({reason}); check the network or "
                          f"HF_ENDPOINT, or pass a local config.json") from None
    try:  # ModelOpt checkpoints describe their scheme beside the config
        hf_hub_download(repo, "hf_quant_config.json", revision=revision)
    except Exception:  # noqa: BLE001 - most repos have none
        pass
    return path


HUB_PROBE_SECONDS = 3.0  # how long the Hub's address may take to answer before it counts as out of reach


def _unreachable() -> Optional[str]:
    """Why the Hub (HF_ENDPOINT) cannot be reached, or None where a TCP connection to it opens within
    HUB_PROBE_SECONDS: huggingface_hub itself retries an unreachable Hub for many seconds before it gives up."""
    import socket
    import threading
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    outcome: list = []

    def probe() -> None:  # name resolution has no timeout of its own: the probe runs beside a bounded wait
        try:
            socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"{host}:{port}: {e.strerror or e}")

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(HUB_PROBE_SECONDS + 0.5)
    return outcome[0] if outcome else f"{host}:{port} did not answer within {HUB_PROBE_SECONDS:g} s"


def _reason(e: BaseException, limit: int = 160) -> str:
    """An exception's message on one line, shortened at a word (never cut mid-word)."""
    text = " ".join(str(e).split())
    if len(text) <= limit:
        return text
    cut = text[:limit + 1].rsplit(" ", 1)[0].rstrip(" ,;:")  # the character past the limit: a space ends a word
    return cut + "..."


def _not_cached(repo: str, revision: Optional[str]) -> Optional[str]:
    """"revision v2 of 'org/name' is not in the local Hugging Face cache (main is)", where other revisions of the
    repo are cached; None where none is (the whole repo is missing)."""
    if revision is None:
        return None
    refs = hf_cache_dir() / ("models--" + repo.replace("/", "--")) / "refs"
    try:
        cached = sorted(r.name for r in refs.iterdir() if r.is_file() and _cached_revision(hf_cache_dir(), repo, r.name))
    except OSError:
        return None
    if not cached:
        return None
    return (f"revision {revision} of '{repo}' is not in the local Hugging Face cache ({', '.join(cached)} "
            f"{'is' if len(cached) == 1 else 'are'})")


def _cached_revision(cache: Path, repo: str, revision: str) -> Optional[Path]:
    """A revision's config.json in the Hugging Face cache: refs/<branch or tag> names its commit folder."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    commit = revision
    ref = folder / "refs" / revision
    try:
        if ref.is_file():
            commit = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    found = folder / "snapshots" / commit / "config.json"
    return found if found.is_file() else None


def checkpoint_summary(repo: str, revision: Optional[str], config: Path) -> tuple[Optional[dict], Optional[str]]:
    """The elements of every tensor in a repo's safetensors files and the elements per dtype, from their headers
    alone (model.safetensors, or model.safetensors.index.json and each shard's header; no weights downloaded), at
    the commit `config` was read from. Kept in kvplan's cache, so that later runs, offline too, show it. Returns
    (summary, None), or (None, why the count is unavailable): a missing count never fails the command."""
    commit = config.parent.name if config.parent.parent.name == "snapshots" else (revision or "main")
    saved = _summary_file(repo, commit)
    try:
        summary = json.loads(saved.read_text(encoding="utf-8"))
        if isinstance(summary, dict) and isinstance(summary.get("elements"), int) and summary["elements"] > 0:
            return summary, None
    except (OSError, ValueError):
        pass
    try:
        from huggingface_hub import HfApi
    except ImportError:
        return None, "install huggingface_hub (pip install huggingface_hub, the hub extra) to read its safetensors headers from the Hub"
    if _offline():
        return None, ("HF_HUB_OFFLINE is set and its safetensors headers were not read before; run this once "
                      "online")
    unreachable = _unreachable()
    if unreachable:
        return None, f"the Hub cannot be reached ({unreachable}) to read its safetensors headers"
    _quiet()
    try:
        meta = HfApi().get_safetensors_metadata(repo, revision=commit)
    except Exception as e:  # noqa: BLE001 - the plan stands without the count; the reason is one line
        # by class name: huggingface_hub has moved these between modules across releases
        kinds = {k.__name__ for k in type(e).__mro__}
        if "NotASafetensorsRepoError" in kinds:
            return None, f"'{repo}' has no safetensors weights (model.safetensors or model.safetensors.index.json)"
        if "GatedRepoError" in kinds:
            return None, (f"'{repo}' is gated: accept its terms on the Hub and set HF_TOKEN to read its safetensors "
                          f"headers")
        if "RepositoryNotFoundError" in kinds:
            return None, f"'{repo}' was not found on the Hub to read its safetensors headers (private? set HF_TOKEN)"
        if "RevisionNotFoundError" in kinds:
            return None, f"'{repo}' has no revision '{commit}' on the Hub"
        reason = _reason(e)
        if "SafetensorsParsingError" in kinds:
            return None, f"its safetensors headers cannot be read ({reason})"
        return None, f"cannot read its safetensors headers from the Hub ({reason})"
    dtypes: dict[str, int] = {}
    for f in meta.files_metadata.values():
        for dtype, n in f.parameter_count.items():
            dtypes[dtype] = dtypes.get(dtype, 0) + int(n)
    total = sum(dtypes.values())
    if total <= 0:
        return None, f"the safetensors headers of '{repo}' list no tensors"
    summary = {"elements": total, "dtypes": dict(sorted(dtypes.items())), "files": len(meta.files_metadata)}
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        tmp = saved.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary), encoding="utf-8")
        tmp.replace(saved)
    except OSError:  # a read-only cache: shown now, read again next time
        pass
    return summary, None


def _summary_file(repo: str, commit: str) -> Path:
    """Where kvplan keeps a repo's safetensors header summary: its cache directory (KVPLAN_CACHE_DIR, else
    XDG_CACHE_HOME/kvplan or ~/.cache/kvplan), hub/<org>--<name>/<commit>.json."""
    from kvplan.specs.calibration import cache_dir

    safe = lambda s: re.sub(r"[^\w.-]", "-", s.replace("/", "--"))  # noqa: E731
    return cache_dir().parent / "hub" / safe(repo.lower()) / f"{safe(commit)}.json"
