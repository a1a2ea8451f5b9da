"""``async for`` over a subscription: :class:`MessageIterator` (see :meth:`Bus.messages`)."""

from __future__ import annotations

from typing import Self

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import QueueNotFound
from .message import Message

__all__ = ["Decline", "GiveBack", "MessageIterator", "Released", "Requeue"]


class MessageIterator:
    """Messages of one subscription, for ``async for`` (see :meth:`Bus.messages`)."""

    def __init__(self, buffer: int, *, ack_previous: bool = True) -> None:
        self._ack_previous = ack_previous
        send, recv = anyio.create_memory_object_stream[tuple[Message, anyio.Event | None]](buffer)
        self._send: MemoryObjectSendStream[tuple[Message, anyio.Event | None]] = send
        self._recv: MemoryObjectReceiveStream[tuple[Message, anyio.Event | None]] = recv
        self._pending: dict[str, anyio.Event] = {}
        self._verdict: dict[str, bool] = {}
        self._unseen: set[str] = set()  # still buffered when it closed: never read
        self._last: Message | None = None
        self.subscription: object | None = None  # the bus's, once subscribed

    async def _handle(self, msg: Message) -> None:
        done = anyio.Event() if msg.single else None
        try:
            await self._send.send((msg, done))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            if done is None:
                return
            raise GiveBack(msg.name, seen=False) from None
        if done is None:
            return
        await done.wait()
        verdict = self._verdict.pop(msg.name, None)
        if verdict is None:
            seen = msg.name not in self._unseen
            self._unseen.discard(msg.name)
            raise GiveBack(msg.name, seen=seen)
        if not verdict:
            raise Released(f"released by the consumer: {msg.name}")

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        return await self._next(wait=True)

    async def _next(self, *, wait: bool) -> Message:
        if self._ack_previous and self._last is not None and self._last.name in self._pending:
            await self.ack(self._last)
        try:
            if wait:
                msg, done = await self._recv.receive()
            else:
                msg, done = self._recv.receive_nowait()
        except anyio.WouldBlock:
            raise TimeoutError("no message is waiting") from None
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None
        if done is not None:
            self._pending[msg.name] = done
        self._last = msg
        return msg

    async def receive(self, timeout: float | None = None) -> Message:  # noqa: ASYNC109
        """The next message; raises TimeoutError after ``timeout`` seconds.

        ``timeout=0`` polls: a message already waiting, or TimeoutError at once. Once the
        subscription has ended it raises StopAsyncIteration, or
        :class:`~fsbus.QueueNotFound` if it ended because its durable queue was deleted.
        """
        try:
            if timeout is not None and timeout <= 0:
                return await self._next(wait=False)  # fail_after(0) would refuse even those
            with anyio.fail_after(timeout):
                return await self._next(wait=True)
        except StopAsyncIteration:
            self.raise_if_queue_gone()
            raise

    def raise_if_queue_gone(self) -> None:
        """Raise :class:`~fsbus.QueueNotFound` if the bus ended this iterator because its
        durable queue was deleted (by another process, or another bus of this one)."""
        sub = self.subscription
        if getattr(sub, "queue_gone", False):
            queue = getattr(sub, "queue", None)
            raise QueueNotFound(
                f"queue {queue!r} was deleted while this subscription consumed it; "
                "declare it again and subscribe anew"
            )

    async def ack(self, msg: Message) -> None:
        """Consume a work-queue message (no-op for multi messages).

        The message leaves its bucket in the bus's next finishing batch, just after
        this returns; ``statistics().acked`` counts it once it has.
        """
        self._settle(msg, True)

    async def release(self, msg: Message) -> None:
        """Give a work-queue message back for redelivery (counts as a failed delivery)."""
        self._settle(msg, False)

    def _settle(self, msg: Message, ok: bool) -> None:
        done = self._pending.pop(msg.name, None)
        if done is not None:
            self._verdict[msg.name] = ok
            done.set()

    def _close(self) -> None:
        for pending in self._pending.values():
            pending.set()
        self._pending.clear()
        self._send.close()
        # Whatever is still buffered goes back unconsumed.
        while True:
            try:
                _msg, done = self._recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            if done is not None:
                self._unseen.add(_msg.name)
                done.set()
        self._recv.close()


class Requeue(Exception):
    """Raised by a handler to give a work-queue message back *at once*: a failed delivery
    as any other exception is (its delivery counted, ``max_deliveries`` applies), but
    retried now, ahead of the messages behind it, not after ``retry_interval``, and the
    other processes of the bus told at once. What an AMQP ``nack``/``reject`` with
    requeue, a ``basic.recover`` or a closed channel does to a message on RabbitMQ."""


class Released(Exception):
    """Raised inside an iterator's handler when the consumer released the message."""


class GiveBack(Exception):
    """The iterator closed before the consumer settled the message: release, no failure.

    ``seen=False``: the consumer never read it (it was still buffered), so the delivery
    counted when it was claimed is taken back too.
    """

    def __init__(self, name: str, *, seen: bool = True) -> None:
        super().__init__(name)
        self.seen = seen


class Decline(GiveBack):
    """Raise it in a handler to give a work-queue or queue message back untouched.

    The message is released at once, for this or another consumer, as if it had not been
    delivered: its delivery is not counted (its next ``delivery_count`` is the same
    again), it is no failure, and it is never dead-lettered for it. For a handler that
    cannot take a message now, such as one whose consumer is stopping; a message the
    handler tried and failed on should fail (raise anything else), so that
    ``max_deliveries`` can stop it. In a handler of multi messages it does nothing (they
    are not given back), and it is not logged as a failure. In a :meth:`Bus.get` block,
    the message is given back the same way.
    """

    def __init__(self) -> None:
        super().__init__("", seen=False)
