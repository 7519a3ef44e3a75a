"""Models by Hugging Face id: the config.json (and ModelOpt's hf_quant_config.json) of a repo, from the local
Hugging Face cache or, with the `hub` extra (huggingface_hub), from the Hub itself. Honours HF_ENDPOINT, HF_TOKEN,
HF_HUB_CACHE / HF_HOME and HF_HUB_OFFLINE as huggingface_hub does. No weights are downloaded."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from .errors import KvplanError

REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?:@[\w./-]+)?")


def looks_like_repo_id(name: str) -> bool:
    """org/name (or org/name@revision: a branch, tag or commit), one slash before any @, no file suffix, and no
    such file or folder here."""
    return bool(REPO_ID.fullmatch(name)) and not name.endswith((".json", ".yaml", ".yml")) and not Path(name).exists()


def split_revision(name: str) -> tuple[str, Optional[str]]:
    repo, _, revision = name.partition("@")
    return repo, revision or None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch_config(repo: str, revision: Optional[str] = None) -> Path:
    """The local path of a repo's config.json: the Hugging Face cache first, else downloaded (config.json and, where
    the repo has one, hf_quant_config.json) into that cache."""
    from .deploy import find_config, hf_cache_dir

    cached = find_config(repo) if revision is None else _cached_revision(hf_cache_dir(), repo, revision)
    if cached is not None:
        return cached
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise KvplanError(f"'{repo}' is not in the catalog nor in the local Hugging Face cache; install the hub extra "
                          f"(pip install 'kvplan[hub]') to fetch its config.json, or pass a config.json or a "
                          f"snapshot folder") from None
    if _offline():
        raise KvplanError(f"'{repo}' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; download it "
                          f"once online (or unset HF_HUB_OFFLINE)")
    import logging

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    # one line on failure: huggingface_hub's own retry warnings and progress bars stay quiet
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    at = f" at revision {revision}" if revision else ""
    try:
        path = Path(hf_hub_download(repo, "config.json", revision=revision))
    except LocalEntryNotFoundError as e:  # the Hub could not be reached (a subclass of EntryNotFoundError)
        reason = " ".join(str(e).split())[:160]
        raise KvplanError(f"cannot reach the Hub for '{repo}' ({reason}); check the network or HF_ENDPOINT, or pass "
                          f"a local config.json") from None
    except GatedRepoError:
        raise KvplanError(f"'{repo}' is gated: accept its terms on the Hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise KvplanError(f"no repo '{repo}' on the Hub (or it is private: set HF_TOKEN); check the id") from None
    except RevisionNotFoundError:
        raise KvplanError(f"'{repo}' has no revision '{revision}'") from None
    except EntryNotFoundError:
        raise KvplanError(f"'{repo}'{at} has no config.json: kvplan reads a transformers config") from None
    except (HfHubHTTPError, OSError) as e:
        reason = " ".join(str(e).split())[:160]
        raise KvplanError(f"cannot fetch '{repo}' config.json from the Hub ({reason}); check the network or "
                          f"HF_ENDPOINT, or pass a local config.json") from None
    try:  # ModelOpt checkpoints describe their scheme beside the config
        hf_hub_download(repo, "hf_quant_config.json", revision=revision)
    except Exception:  # noqa: BLE001 - most repos have none
        pass
    return path


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
