"""Helpers for test suites that use a bus: await N messages, record what arrives.

```python
from fsbus.testing import collect, wait_for_messages

msgs = await wait_for_messages(bus, "orders.*", 3, timeout=5.0)

async with collect(bus, "audit.#") as audit:
    await code_under_test()
    await audit.wait(2)
assert [m.topic for m in audit.messages] == ["audit.created", "audit.paid"]
```

The helpers subscribe with ``existing=True`` by default: messages already on disk
when the helper starts count too, so a test does not race the code that
publishes. Work-queue (single) messages the helpers receive are acknowledged,
that is consumed. When too few messages arrive in time they raise
:class:`WaitTimeout`, an :class:`AssertionError` (pytest shows it as a test
failure) that is also a :class:`TimeoutError`.

Uses only the public ``fsbus`` API.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio

from fsbus import BlockingBus, Bus, ClosedError, Message

__all__ = [
    "MessageCollector",
    "WaitTimeout",
    "collect",
    "wait_for_messages",
    "wait_for_messages_blocking",
]


class WaitTimeout(AssertionError, TimeoutError):
    """Fewer messages than expected arrived within the timeout.

    ``received`` holds the messages that did arrive.
    """

    def __init__(self, message: str, received: Sequence[Message]) -> None:
        super().__init__(message)
        self.received: tuple[Message, ...] = tuple(received)


def _describe(msg: Message) -> str:
    payload = msg.payload
    preview = payload[:40] + (b"..." if len(payload) > 40 else b"")
    kind = "single" if msg.single else "multi"
    return f"{msg.topic!r} ({kind}, {len(payload)} B: {preview!r})"


def _timeout_error(pattern: str, count: int, timeout: float, got: Sequence[Message]) -> WaitTimeout:
    listing = ", ".join(_describe(m) for m in got[:10])
    if len(got) > 10:
        listing += f", ... ({len(got) - 10} more)"
    noun = "message" if count == 1 else "messages"
    return WaitTimeout(
        f"expected {count} {noun} on {pattern!r} within {timeout} s, got {len(got)}: [{listing}]",
        got,
    )


def _check_args(count: int, timeout: float) -> None:
    if count < 0:
        raise ValueError(f"count must be 0 or more, got {count}")
    if timeout < 0:
        raise ValueError(f"timeout must be 0 or more seconds, got {timeout}")


class MessageCollector:
    """Records every message delivered on one pattern while :func:`collect` is open."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._messages: list[Message] = []
        self._changed = anyio.Event()

    @property
    def messages(self) -> list[Message]:
        """A copy of the messages received so far, in arrival order."""
        return list(self._messages)

    def __len__(self) -> int:
        return len(self._messages)

    async def _on_message(self, msg: Message) -> None:
        self._messages.append(msg)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait(self, count: int, timeout: float = 5.0) -> list[Message]:  # noqa: ASYNC109
        """Wait until at least ``count`` messages arrived in total; return the first ``count``.

        Raises :class:`WaitTimeout` when they have not arrived after ``timeout`` seconds.
        """
        _check_args(count, timeout)
        with anyio.move_on_after(timeout):
            while len(self._messages) < count:
                await self._changed.wait()
        if len(self._messages) < count:
            raise _timeout_error(self.pattern, count, timeout, self._messages)
        return self._messages[:count]


@asynccontextmanager
async def collect(
    bus: Bus, pattern: str, *, existing: bool = True
) -> AsyncIterator[MessageCollector]:
    """Subscribe ``pattern`` on ``bus`` and record every message until the block ends."""
    collector = MessageCollector(pattern)
    sub = await bus.subscribe(pattern, collector._on_message, existing=existing)
    try:
        yield collector
    finally:
        try:
            await bus.unsubscribe(sub)
        except ClosedError:  # the bus was closed inside the block: nothing left to undo
            pass


# The timeouts below are part of what a test asserts ("3 messages within 5 s") and
# of the failure message, so they are parameters rather than a caller's fail_after.
async def wait_for_messages(
    bus: Bus,
    pattern: str,
    count: int,
    timeout: float = 5.0,  # noqa: ASYNC109
    *,
    existing: bool = True,
) -> list[Message]:
    """Wait for ``count`` messages matching ``pattern`` on ``bus``; return them.

    Raises :class:`WaitTimeout` (an ``AssertionError``) naming what did arrive when
    fewer than ``count`` came within ``timeout`` seconds.
    """
    _check_args(count, timeout)
    async with collect(bus, pattern, existing=existing) as got:
        return await got.wait(count, timeout)


def wait_for_messages_blocking(
    bus: BlockingBus, pattern: str, count: int, timeout: float = 5.0, *, existing: bool = True
) -> list[Message]:
    """The same as :func:`wait_for_messages` for a :class:`~fsbus.BlockingBus`."""
    _check_args(count, timeout)
    deadline = time.monotonic() + timeout
    got: list[Message] = []
    with bus.messages(pattern, existing=existing) as it:
        while len(got) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg = it.get(timeout=left)
            except TimeoutError:
                break
            if msg.single:
                it.ack(msg)
            got.append(msg)
    if len(got) < count:
        raise _timeout_error(pattern, count, timeout, got)
    return got
