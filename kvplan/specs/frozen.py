"""The base of every spec value: frozen, no unknown fields, validators built on first use."""

from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    # Validators are built on first use, so a command pays only for the spec kinds it loads.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
