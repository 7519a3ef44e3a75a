"""Deployment profiles: the overheads one real deployment measured at startup (what `kvplan log --save-profile`
keeps), so that later "what if" questions (another KV dtype, max_model_len or utilization) start from them. A
versioned YAML schema, its loader and its writer."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvplan.errors import KvplanError

PROFILE_SCHEMA = "kvplan-deployment-profile/1"


class DeploymentProfile(BaseModel):
    """What one deployment measured at startup. Versioned by `schema`."""

    # (its validators built on first use: a planning command that reads no profile does not pay for them)
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    schema_: Literal["kvplan-deployment-profile/1"] = Field(PROFILE_SCHEMA, alias="schema")
    engine: Literal["vllm", "sglang"]
    engine_version: Optional[str] = None
    model: str
    gpu: Optional[str] = None
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    weight_dtype: Optional[str] = None
    kv_cache_dtype: str = "auto"
    max_model_len: int = Field(ge=1)
    gpu_memory_utilization: Optional[float] = Field(None, gt=0, le=1)
    mem_fraction_static: Optional[float] = Field(None, gt=0, le=1)
    total_memory_bytes: Optional[int] = Field(None, gt=0)
    weights_bytes: int = Field(ge=0)
    overhead_bytes: Optional[int] = Field(None, description="vLLM: non-KV memory beyond the weights")
    free_before_load_bytes: Optional[int] = Field(None, description="SGLang: free memory before weight loading")
    available_kv_bytes: int
    max_num_batched_tokens: Optional[int] = Field(None, ge=1)  # engine limits: at least one token, one sequence
    max_num_seqs: Optional[int] = Field(None, ge=1)
    # data and expert parallelism as the engine was started (its own option names: data_parallel_size,
    # enable_expert_parallel, ... for vLLM; dp_size, enable_dp_attention, ep_size, ... for SGLang)
    layout: dict[str, Union[int, bool, str]] = Field(default_factory=dict)
    source: str = ""
    source_sha256: str = ""


def save_profile(profile: DeploymentProfile, path: str | Path) -> None:
    import yaml

    from kvplan.files import atomic_write_text

    data = profile.model_dump(by_alias=True, exclude_none=True)
    atomic_write_text(path, "# kvplan deployment profile: the overheads one startup measured; `kvplan capacity "
                            "--profile` starts from them\n" + yaml.safe_dump(data, sort_keys=False))


def load_profile(path: str | Path) -> DeploymentProfile:
    from kvplan.errors import did_you_mean
    from kvplan.files import check_finite, read_yaml, type_name

    data = read_yaml(path, "deployment profile", f"`kvplan log STARTUP.log --save-profile {path}` makes one")
    if not isinstance(data, dict):
        raise KvplanError(f"{path}: not a kvplan deployment profile (expected a mapping, found {type_name(data)})")
    if data.get("schema") != PROFILE_SCHEMA:
        schema = data.get("schema")
        shown = repr(schema) if isinstance(schema, str) or schema is None else type_name(schema)
        raise KvplanError(f"{path}: schema {' '.join(shown.split())} is not {PROFILE_SCHEMA!r}; re-import the log")
    check_finite(data, path)
    for key in ("max_num_batched_tokens", "max_num_seqs"):  # engine limits: at least one token, one sequence
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise KvplanError(f"{path}: field '{key}': expected a whole number of at least 1, found {value}")
    try:
        return DeploymentProfile.model_validate(data)
    except ValidationError as e:
        errors = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
        err = errors[0]
        where = ".".join(map(str, err["loc"])) or "(top level)"
        msg = " ".join(err["msg"].split())
        if err["type"] == "extra_forbidden":
            msg = "not a deployment profile field" + did_you_mean(str(err["loc"][-1]), list(
                {f.alias or k for k, f in DeploymentProfile.model_fields.items()}))
        raise KvplanError(f"{path}: field '{where}': {msg}") from None
