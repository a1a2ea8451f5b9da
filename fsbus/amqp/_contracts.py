"""What the gateway's parts need of each other, as protocols (no import circles)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple, Protocol

import anyio.abc

from .. import Bus, Message, QueueInfo, Subscription
from ._routing import RouteJob
from ._state import AmqpState


class CountMark(NamedTuple):
    """Taken just before a queue's bus is listed for a count (``Gateway.mark``)."""

    held: int
    """The messages of the queue the gateway's consumers held."""
    seq: int
    """How many times the gateway's subscriptions had changed."""


class GatewayPort(Protocol):
    """The gateway, as its connections and channels use it."""

    bus: Bus
    state: AmqpState
    version: str
    consumers: dict[str, set[tuple[Any, str]]]
    single_waiters: dict[str, list[Any]]
    alarm: str | None
    no_alarm: anyio.Event
    connections: set[Any]

    def authenticate(self, user: str, password: str, loopback: bool) -> bool: ...

    def new_channel(self, conn: ConnectionPort, number: int) -> Any: ...

    async def drop_exclusive(self, queue: str) -> None: ...

    def track(self, queue: str, sub: Subscription) -> None: ...

    def untrack(self, queue: str, sub: Subscription) -> None: ...

    def counted_consumers(self, queue: str, on_disk: int) -> int: ...
    def wake_single(self, queue: str) -> None: ...

    async def waiting_elsewhere(self, queue: str, meta: dict[str, Any] | None) -> int: ...

    def held(self, queue: str) -> int: ...

    def taken(self, queue: str, delta: int) -> None: ...

    def mark(self, queue: str) -> CountMark: ...

    async def ready_count(
        self, queue: str, info: QueueInfo | None = None, mark: CountMark | None = None
    ) -> tuple[int, int]: ...

    async def ready_after_get(self, queue: str, waiting: int, consumers: int) -> int: ...

    async def consumer_left(self, queue: str) -> None: ...

    def forget(self, queue: str) -> None: ...

    async def cancel_consumers_of(self, queue: str) -> None: ...

    async def dead_letter(self, queue: str, msg: Message, reason: str = "rejected") -> None: ...

    async def route_many(self, jobs: list[RouteJob]) -> list[int | BaseException]: ...

    async def bindings_of(self, exchange: str, kind: str) -> list[tuple[str, str | None]]: ...

    def queue_uid(self, queue: str) -> str | None: ...

    def bound_now(self, queue: str, uid: str) -> bool: ...

    async def note_bound(self, exchange: str) -> bool: ...

    async def drop_unbound(self, exchanges: Collection[str] | None = None) -> None: ...

    async def unbind_deleted(self, queue: str) -> None: ...


class ConnectionPort(Protocol):
    """A client connection, as its channels use it."""

    gateway: GatewayPort
    id: str
    user: str
    """The login it authenticated as."""
    channels: dict[int, Any]
    frame_max: int
    capabilities: dict[str, Any]
    exclusive: set[str]
    tasks: anyio.abc.TaskGroup
    publishes: list[tuple[Any, int, Any, RouteJob]]

    async def send_raw(self, data: bytes) -> None: ...

    async def send_soon(self, data: bytes) -> None: ...

    def send_soon_nowait(self, data: bytes) -> bool: ...

    async def send(self, channel: int, *frames: Any) -> None: ...
