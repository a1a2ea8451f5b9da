"""The default options of a stream handle, readable without pydantic.

:class:`~fsbus.StreamConfig` validates options a caller gives; a handle opened with none
reads these instead, so that a process that only opens streams with the defaults (a Spark
planner, the CLI) never imports pydantic (about 0.15 s). ``StreamConfig`` takes its
defaults from here: one place holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .._env import env_force_polling

__all__ = ["DEFAULTS", "Defaults"]


@dataclass(frozen=True, slots=True)
class Defaults:
    """Every option of :class:`~fsbus.StreamConfig` at its default (documented there)."""

    durability: Literal["none", "batch", "record"] = "batch"
    segment_bytes: int = 64 << 20
    index_interval_bytes: int = 16 << 10
    max_frame_bytes: int = 1 << 20
    max_record_bytes: int = 64 << 20
    read_chunk_bytes: int = 4 << 20
    retention_bytes: int | None = None
    retention_seconds: float | None = None
    delete_consumed: bool = False
    group_partitions: int = 8
    session_timeout: float = 10.0
    heartbeat_interval: float = 1.0
    cache_wait: float = 5.0
    poll_interval: float = 0.1
    force_polling: bool = field(default_factory=env_force_polling)


DEFAULTS = Defaults(force_polling=False)
"""The defaults as values, for ``StreamConfig``'s fields (``force_polling`` comes from the
environment when a config is made, so its value here is not used)."""
