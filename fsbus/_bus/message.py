"""The data objects a bus hands out (pure, frozen)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BusStatistics", "Message", "MessageInfo", "PublishInfo", "PurgeKind", "PurgeReport"]

PurgeKind = Literal["single", "multi", "all"]
"""Which messages a purge removes: work-queue ones, multi ones, or both."""


@dataclass(frozen=True, slots=True)
class Message:
    """A message delivered to a subscriber."""

    topic: str
    """The topic it was published on."""
    payload: bytes
    """The payload, exactly as published."""
    single: bool
    """True for a work-queue message (one consumer), False for multi (every subscriber)."""
    expires: float
    """When it expires, seconds since the epoch."""
    name: str
    """Its file name on the bus (unique)."""
    bucket: str
    """Its bucket directory."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """String headers set by the publisher (empty for qlobber-fsq peers)."""
    priority: int = 50
    """Priority of a work-queue message; lower is taken first."""
    published_at: float | None = None
    """Publish time, seconds since the epoch (None for qlobber-fsq peers)."""
    host: str | None = None
    """Host name of the publisher, when known."""
    delivery_count: int = 1
    """1 on the first delivery; a single message's failed deliveries + 1 after that."""
    queue: str | None = None
    """The durable queue it was taken from (None: delivered by the bus to a pattern)."""

    @property
    def size(self) -> int:
        """Payload size in bytes."""
        return len(self.payload)

    def text(self, encoding: str = "utf-8") -> str:
        """The payload decoded as text."""
        return self.payload.decode(encoding)

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """A message seen while browsing; nothing was read or consumed."""

    topic: str
    """Its topic."""
    single: bool
    """Work-queue (True) or multi (False)."""
    expires: float
    """Expiry, seconds since the epoch."""
    size: int
    """Payload size in bytes."""
    name: str
    """File name."""
    bucket: str
    """Bucket directory."""
    path: str
    """Full path of the message file."""
    locked: bool
    """A consumer holds it right now (single messages only)."""
    priority: int
    """Priority (lower first)."""
    published_at: float | None
    """Publish time, when an fsbus peer published it."""
    host: str | None
    """Publishing host, when known."""
    headers: Mapping[str, str]
    """Headers, if any."""


@dataclass(frozen=True, slots=True)
class PublishInfo:
    """What :meth:`Bus.publish` wrote."""

    topic: str
    """The topic."""
    name: str
    """The message's file name."""
    bucket: str
    """Its bucket directory."""
    path: str
    """Full path of the message file."""
    single: bool
    """Work-queue message or not."""
    expires: float
    """Expiry, seconds since the epoch."""
    size: int
    """Payload size in bytes."""


@dataclass(frozen=True, slots=True)
class BusStatistics:
    """Counters of one Bus since it was opened."""

    published: int
    """Messages published by this Bus."""
    delivered: int
    """Handler calls started (multi and single)."""
    acked: int
    """Single messages consumed after their handler succeeded."""
    released: int
    """Single messages given back for redelivery (failure or shutdown)."""
    failed: int
    """Handler calls that raised."""
    dead_lettered: int
    """Single messages moved to the dead-letter topic."""
    expired: int
    """Expired messages this Bus removed."""
    quarantined: int
    """Foreign files moved to the quarantine directory."""
    scans: int
    """Scan rounds run."""
    subscriptions: int
    """Live subscriptions."""
    in_flight: int
    """Handlers running now."""
    inotify: bool
    """Whether inotify wakes this bus's scanner (else it polls). False too while the bus
    scans nothing: a bus that only publishes watches nothing."""
    claims_lost: int = 0
    """Work-queue claims lost to other consumers (or to a message gone meanwhile).

    Many, next to few ``delivered``, means more consumers than the work needs: each one
    lists and races for the same messages (see "Many consumers on one queue")."""
    leases_lost: int = 0
    """Rename claims given back while their handler still ran: the lease
    (``claim_lease``) was not renewed in time, so the message may be handled twice."""


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What :meth:`Bus.purge` (or :meth:`BlockingBus.purge`) removed, and what it left."""

    pattern: str
    """The pattern purged."""
    kind: PurgeKind
    """Which messages it purged: ``"single"``, ``"multi"`` or ``"all"``."""
    single: int
    """Work-queue messages removed."""
    multi: int
    """Multi messages removed."""
    locked: int
    """Work-queue messages left alone because a consumer held them."""

    @property
    def purged(self) -> int:
        """Messages removed, of both kinds."""
        return self.single + self.multi
