"""The gateway's client sockets, read and written directly (non-blocking) through anyio.

anyio binds the listening sockets (:func:`anyio.create_tcp_listener`: addresses, dual
stack, port 0); :func:`serve` accepts on them, and each connection gets a
:class:`ClientSocket`. It tries the system call first and waits (:func:`anyio.wait_readable`,
:func:`anyio.wait_writable`) only when the kernel has nothing to give or no room. anyio's
own TCP stream puts a transport, a protocol, a queue and an event between the two, and a
turn of the event loop after every send, which every round trip (a ``basic.get``, any
synchronous method) pays: a ``basic.get`` with its ack took about 9 % longer through it
(docs/amqp.md).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

log = logging.getLogger("fsbus.amqp")

ACCEPT_RETRY = 0.1
"""Seconds before accepting again after the system refused (out of descriptors)."""


class ClientSocket:
    """One client's connected socket, with anyio's stream semantics: :meth:`receive`
    raises :class:`anyio.EndOfStream` at the client's end of stream and
    :class:`anyio.BrokenResourceError` on a reset; after :meth:`aclose` (from any task)
    both raise :class:`anyio.ClosedResourceError`, and a task waiting in them wakes."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._closed = False

    @property
    def remote_address(self) -> Any:
        """The peer's address (as :meth:`socket.socket.getpeername` gives it)."""
        return self._sock.getpeername()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """The bytes the kernel holds (up to ``max_bytes``), waiting for some if none.

        A checkpoint, as anyio's are: it waits, or else yields to the other tasks once
        (a client that sends without pause cannot keep the loop)."""
        waited = False
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                data = self._sock.recv(max_bytes)
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
                waited = True
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            if not data:
                raise anyio.EndOfStream
            if not waited:
                await anyio.lowlevel.checkpoint()
            return data

    async def send(self, data: bytes) -> None:
        """Write all of ``data``, waiting for room whenever the kernel's buffer is full
        (a client that does not read). No turn of the loop when it all fits at once."""
        view = memoryview(data)
        while view:
            if self._closed:
                raise anyio.ClosedResourceError
            try:
                sent = self._sock.send(view)
            except BlockingIOError:
                await anyio.wait_writable(self._sock)
                continue
            except OSError as exc:
                raise anyio.BrokenResourceError from exc
            view = view[sent:]

    async def aclose(self) -> None:
        """Close the socket (safe to repeat); a task waiting to read or write wakes
        with :class:`anyio.ClosedResourceError`."""
        if self._closed:
            return
        self._closed = True
        anyio.notify_closing(self._sock)
        self._sock.close()
        await anyio.lowlevel.checkpoint()


async def serve(
    listener: anyio.abc.Listener[Any], handle: Callable[[ClientSocket], Coroutine[Any, Any, None]]
) -> None:
    """Accept connections on ``listener``'s sockets for ever, each handled in a task of
    its own (``handle`` must not raise)."""
    inner = getattr(listener, "listeners", [listener])
    socks = [one.extra(anyio.abc.SocketAttribute.raw_socket) for one in inner]
    async with anyio.create_task_group() as tg:
        for sock in socks:
            tg.start_soon(_accept, sock, handle, tg)


async def _accept(
    listening: socket.socket,
    handle: Callable[[ClientSocket], Coroutine[Any, Any, None]],
    tg: anyio.abc.TaskGroup,
) -> None:
    while True:
        await anyio.wait_readable(listening)
        try:
            sock, _addr = listening.accept()
        except BlockingIOError:
            continue  # (another accept took it)
        except OSError as exc:  # out of descriptors...: the others keep being served
            log.warning("cannot accept a connection: %s; trying again shortly", exc)
            await anyio.sleep(ACCEPT_RETRY)
            continue
        try:
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # reset already
            sock.close()
            continue
        tg.start_soon(handle, ClientSocket(sock))
