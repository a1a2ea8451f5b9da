"""The default options of a bus, readable without pydantic.

:class:`~fsbus.BusConfig` validates the options a caller gives. A bus opened without a
config reads :class:`Defaults` instead, so a process that only opens buses with the
defaults (the AMQP gateway, the CLI, a Spark task) never imports pydantic (0.1-0.2 s of
its start). ``BusConfig`` takes its field defaults from here: one place holds them.
``fsbus._settings`` holds what the engine does with either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ._env import env_force_polling

__all__ = ["DEFAULTS", "Defaults"]


@dataclass(frozen=True, slots=True)
class Defaults:
    """Every option of :class:`~fsbus.BusConfig` at its default (documented there)."""

    bucket_base: int = 16
    bucket_num_chars: int = 2
    bucket_stamp_size: int = 32
    split_topic_at: int = 200
    order_by_expiry: bool = False
    multi_ttl: float = 60.0
    single_ttl: float = 3600.0
    max_payload_size: int = 1 << 30
    default_priority: int = 50
    poll_interval: float = 0.1
    refresh_ttl: float = 10.0
    retry_interval: float = 0.5
    force_polling: bool = field(default_factory=env_force_polling)
    dedup: bool = True
    handler_concurrency: int = 16
    max_deliveries: int | None = 5
    count_deliveries: bool = False
    dead_letter_prefix: str = "dead-letter"
    gc_interval: float = 10.0
    locking: Literal["auto", "flock", "rename"] = "auto"
    claim_lease: float = 60.0
    durable_log: Literal["auto", "on", "off"] = "auto"
    file_mode: int | None = None
    dir_mode: int | None = None
    changed: frozenset[str] = frozenset()
    """The options changed from the defaults (by :func:`with_changes`)."""

    @property
    def num_buckets(self) -> int:
        """How many bucket directories there are (as :attr:`BusConfig.num_buckets`)."""
        if self.order_by_expiry:
            return 1
        return int(self.bucket_base**self.bucket_num_chars)


DEFAULTS = Defaults(force_polling=False)
"""The defaults as values, for ``BusConfig``'s fields (``force_polling`` comes from the
environment when a config is made, so its value here is not used)."""
