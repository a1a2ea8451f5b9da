"""What fsbus reads from the environment (no pydantic: the stream code reads it too)."""

from __future__ import annotations

import os

__all__ = ["env_force_polling"]

_TRUE = {"1", "true", "yes", "on"}


def env_force_polling() -> bool:
    """Whether ``FSBUS_FORCE_POLLING`` asks for polling only (network filesystems)."""
    return os.environ.get("FSBUS_FORCE_POLLING", "").strip().lower() in _TRUE
