"""One AMQP 0-9-1 client connection: the handshake, heartbeats, the frame loop, channels.

Frames are decoded and encoded by pamqp; the gateway's own job is the state machine and
the mapping onto the bus (see :mod:`fsbus.amqp._routing` and :mod:`fsbus.amqp._channel`).
"""

from __future__ import annotations

import ipaddress
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp.base import Frame

from .. import FsBusError
from ._frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT,
    PROTOCOL_HEADER,
    FrameReader,
    RawFrame,
    decode_method,
)
from ._routing import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    AmqpError,
    RouteJob,
)
from ._socket import ClientSocket

if TYPE_CHECKING:
    from ._contracts import GatewayPort

log = logging.getLogger("fsbus.amqp")

FRAME_MAX = 131072
CHANNEL_MAX = 2047
HEARTBEAT_SECONDS = 60
HANDSHAKE_TIMEOUT = 10.0
OUT_HIGH_WATER = 1 << 20
"""Bytes waiting to be written beyond which senders wait for the socket."""


class _Closed(Exception):
    """The connection is over (closed cleanly, or by the peer)."""


def _short(text: str) -> str:
    """``text`` cut to what a short string holds (255 bytes of UTF-8, whole characters)."""
    raw = text.encode("utf-8", "replace")
    return text if len(raw) <= 255 else raw[:255].decode("utf-8", "ignore")


def _named(method: object) -> str:
    return getattr(method, "name", None) or type(method).__name__


_ENDINGS = (
    _Closed,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


class Connection:
    """The server side of one client connection."""

    def __init__(self, gateway: GatewayPort, stream: ClientSocket) -> None:
        self.gateway = gateway
        self.stream = stream
        self.id = f"{gateway.state.gateway_id}/{uuid.uuid4().hex[:12]}"
        self.channels: dict[int, Any] = {}
        self.frame_max = FRAME_MAX
        self.heartbeat = 0
        self.user = ""
        self.client_properties: dict[str, Any] = {}
        self._out: list[bytes] = []  # frames waiting for the task that writes
        self._out_size = 0
        self._writing = False
        self._drained = anyio.Event()
        self._flush_due = False  # a task will write what send_soon queued
        self.has_published = False
        self.held = False  # publishes wait for the gateway's disk alarm to clear
        self._told_blocked = False
        self._last_recv = time.monotonic()
        self._closing = False
        self.exclusive: set[str] = set()
        self.capabilities: dict[str, Any] = {}
        # complete publishes not routed yet: (channel, confirm sequence, publish, job)
        self.publishes: list[tuple[Any, int, Any, RouteJob]] = []

    # ------------------------------------------------------------------ sending
    async def send_raw(self, data: bytes) -> None:
        """Send ``data`` after everything sent before it.

        Frames sent while another task writes are joined into its next write (one
        system call for a burst of deliveries or confirms); that caller returns at once,
        unless more than :data:`OUT_HIGH_WATER` bytes wait (a client that does not read):
        then it waits until they are written.
        """
        self._out.append(data)
        self._out_size += len(data)
        if self._writing:
            if self._out_size > OUT_HIGH_WATER:
                await self.flush()
            return
        self._writing = True
        try:
            while self._out:
                chunk = self._out[0] if len(self._out) == 1 else b"".join(self._out)
                self._out.clear()
                self._out_size = 0
                await self.stream.send(chunk)
        finally:
            self._writing = False
            self._drained.set()
            self._drained = anyio.Event()

    async def send_soon(self, data: bytes) -> None:
        """Send ``data`` with everything else sent in this turn of the event loop: the
        deliveries of a burst (up to the prefetch) leave in one write, not one each."""
        if self._writing or self._flush_due:
            self._out.append(data)
            self._out_size += len(data)
            if self._out_size > OUT_HIGH_WATER:
                await self.flush()
            return
        self._out.append(data)
        self._out_size += len(data)
        self._flush_due = True
        self.tasks.start_soon(self._flush_later)

    def send_soon_nowait(self, data: bytes) -> bool:
        """:meth:`send_soon` from code that cannot wait: False, and nothing queued, when
        more than :data:`OUT_HIGH_WATER` bytes wait already (a client that does not
        read): the caller then sends with :meth:`send_soon`, which waits for them."""
        if self._out_size > OUT_HIGH_WATER:
            return False
        self._out.append(data)
        self._out_size += len(data)
        if not self._writing and not self._flush_due:
            self._flush_due = True
            self.tasks.start_soon(self._flush_later)
        return True

    async def _flush_later(self) -> None:
        self._flush_due = False
        if self._out and not self._writing:
            await self.send_raw(b"")

    async def flush(self) -> None:
        """Wait until everything sent so far is written to the socket."""
        while self._writing:
            await self._drained.wait()
        if self._out:  # its writer was cancelled before it wrote these
            await self.send_raw(b"")

    async def send(self, channel: int, *frames: Frame) -> None:
        await self.send_raw(b"".join(pframe.marshal(f, channel) for f in frames))

    # ------------------------------------------------------------------ the run
    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self.tasks = tg
                try:
                    await self._serve(tg)
                finally:
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            rest = group.split(_ENDINGS)[1]
            if rest is not None:
                log.exception("connection %s failed", self.id, exc_info=rest)
        except _ENDINGS:
            pass
        except Exception:
            log.exception("connection %s failed", self.id)
        finally:
            self.gateway.connections.discard(self)
            with anyio.CancelScope(shield=True):
                await self._cleanup()

    async def _serve(self, tg: anyio.abc.TaskGroup) -> None:
        reader = FrameReader(self.frame_max)
        with anyio.move_on_after(HANDSHAKE_TIMEOUT) as scope:
            header = b""
            while len(header) < 8:
                header += await self.stream.receive(8 - len(header))
        if scope.cancelled_caught:
            return  # a client that never finishes its header is dropped
        if header != PROTOCOL_HEADER:
            await self.send_raw(PROTOCOL_HEADER)
            return
        await self.send(
            0,
            spec.Connection.Start(
                server_properties={
                    "product": "fsbus",
                    "version": self.gateway.version,
                    "platform": "Python",
                    "capabilities": {
                        "publisher_confirms": True,
                        "exchange_exchange_bindings": False,
                        "basic.nack": True,
                        "consumer_cancel_notify": True,
                        "connection.blocked": True,
                        "authentication_failure_close": True,
                        "per_consumer_qos": True,
                    },
                },
                mechanisms="PLAIN AMQPLAIN",
                locales="en_US",
            ),
        )
        opened = False
        while True:
            if opened:  # (no deadline: no cancel scope a frame, as a get round trip has)
                data = await self.stream.receive(65536)
            else:
                try:
                    with anyio.fail_after(HANDSHAKE_TIMEOUT):
                        data = await self.stream.receive(65536)
                except TimeoutError:
                    return
            self._last_recv = time.monotonic()
            try:
                frames = reader.feed(data)
            except AmqpError as exc:
                await self.close_connection(exc)
                return
            for raw in frames:
                if raw.kind == FRAME_HEARTBEAT:
                    continue
                method = None
                try:
                    if raw.kind == FRAME_METHOD or not opened:
                        method = self._decode(raw)
                    if self.publishes and not _publishing(raw, method):
                        # what came before this frame is done first (confirms, counts)
                        await self.route_publishes()
                        if self._closing:
                            return
                    if not opened:
                        opened = await self._handshake(method, reader, tg)
                    else:
                        await self._dispatch(raw, method)
                except AmqpError as exc:
                    await self.route_publishes()
                    if self._closing:
                        return
                    if exc.connection or raw.channel == 0:
                        await self.close_connection(exc, _method_id(raw, method))
                        return
                    await self._channel_error(raw.channel, exc, _method_id(raw, method))
                except (FsBusError, OSError) as exc:
                    # The bus directory failed under a method (a full disk, a lost
                    # permission...): RabbitMQ's answer to an error of its own, 541, with
                    # what failed, not a dropped socket. (The socket's own errors come
                    # as anyio's, never as a bare OSError.)
                    log.error("connection %s: %s failed: %s", self.id, _named(method), exc)
                    error = AmqpError(INTERNAL_ERROR, f"INTERNAL_ERROR - {exc}", connection=True)
                    await self.close_connection(error, _method_id(raw, method))
                    return
                if self._closing:
                    return
            await self.route_publishes()
            if self._closing:
                return

    async def route_publishes(self) -> None:
        """Route the publishes received so far, in one worker-thread hop, and answer each
        in order (returns, confirms); a publish that is a channel error closes its
        channel, and what followed it there is dropped."""
        if not self.publishes:
            return
        self.has_published = True
        if self.gateway.alarm is not None:
            await self._hold()
        batch, self.publishes = self.publishes, []
        outcomes = await self.gateway.route_many([job for _ch, _seq, _pub, job in batch])
        out: list[bytes] = []
        for (ch, seq, pub, job), outcome in zip(batch, outcomes, strict=True):
            if ch.closing or ch.number not in self.channels:
                continue  # its channel closed (by an earlier publish of the batch)
            try:
                out.append(ch.routed(seq, pub, job, outcome))
            except AmqpError as exc:
                if out:
                    await self.send_raw(b"".join(out))
                    out = []
                if exc.connection:
                    await self.close_connection(exc, _PUBLISH_ID)
                    return
                await self._channel_error(ch.number, exc, _PUBLISH_ID)
        if out:
            await self.send_raw(b"".join(out))

    # ------------------------------------------------------------------ disk alarm
    async def _hold(self) -> None:
        """Wait, reading nothing more from the client, while the gateway's disk alarm
        lasts (RabbitMQ blocks a publishing connection so); the client hears of it by
        connection.blocked and connection.unblocked if it said it understands them."""
        self.held = True
        try:
            while (alarm := self.gateway.alarm) is not None:
                if not self._told_blocked and self._blocked_capable():
                    self._told_blocked = True
                    await self.send(0, spec.Connection.Blocked(reason=alarm))
                await self.gateway.no_alarm.wait()
        finally:
            self.held = False
            self._last_recv = time.monotonic()

    def _blocked_capable(self) -> bool:
        return bool(self.capabilities.get("connection.blocked"))

    def alarm_changed(self) -> None:
        """The gateway's disk alarm started or ended: a connection that has published
        is told (a held one is released by the alarm's end)."""
        alarm = self.gateway.alarm
        frame: Frame | None = None
        if alarm is not None and self.has_published and not self._told_blocked:
            if self._blocked_capable():
                self._told_blocked = True
                frame = spec.Connection.Blocked(reason=alarm)
        elif alarm is None and self._told_blocked:
            self._told_blocked = False
            frame = spec.Connection.Unblocked()
        if frame is not None:
            try:
                self.tasks.start_soon(self.send, 0, frame)
            except RuntimeError:  # the connection is ending
                pass

    async def _handshake(self, method: Any, reader: FrameReader, tg: anyio.abc.TaskGroup) -> bool:
        if isinstance(method, spec.Connection.StartOk):
            self.client_properties = dict(method.client_properties or {})
            self.capabilities = dict(self.client_properties.get("capabilities") or {})
            user, password = _credentials(method.mechanism, method.response)
            if not self.gateway.authenticate(user, password, self._peer_is_loopback()):
                raise AmqpError(
                    ACCESS_REFUSED,
                    f"ACCESS_REFUSED - Login was refused using authentication mechanism "
                    f"{method.mechanism}. For details see the broker logfile.",
                    connection=True,
                )
            self.user = user
            await self.send(
                0,
                spec.Connection.Tune(
                    channel_max=CHANNEL_MAX, frame_max=FRAME_MAX, heartbeat=HEARTBEAT_SECONDS
                ),
            )
            return False
        if isinstance(method, spec.Connection.TuneOk):
            if method.frame_max:
                self.frame_max = max(4096, min(method.frame_max, FRAME_MAX))
                reader.frame_max = self.frame_max
            self.heartbeat = method.heartbeat or 0
            if self.heartbeat:
                tg.start_soon(self._heartbeats)
            return False
        if isinstance(method, spec.Connection.Open):
            vhost = method.virtual_host or "/"
            if vhost != "/":
                raise AmqpError(
                    NOT_ALLOWED,
                    f"NOT_ALLOWED - vhost {vhost} not found (an fsbus gateway serves '/')",
                    connection=True,
                )
            await self.send(0, spec.Connection.OpenOk())
            self.gateway.connections.add(self)
            return True
        raise AmqpError(
            COMMAND_INVALID,
            f"COMMAND_INVALID - expected the connection handshake, got {method.name}",
            connection=True,
        )

    def _decode(self, raw: RawFrame) -> Any:
        """pamqp's reading of a frame; a frame pamqp cannot read is a syntax error."""
        try:
            return decode_method(raw)
        except Exception as exc:  # pamqp raises its own errors, ValueError, struct.error
            raise AmqpError(
                SYNTAX_ERROR, f"SYNTAX_ERROR - cannot decode the frame: {exc}", connection=True
            ) from None

    async def _dispatch(self, raw: RawFrame, method: Any) -> None:
        if raw.kind not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY):
            raise AmqpError(
                FRAME_ERROR, f"FRAME_ERROR - unknown frame type {raw.kind}", connection=True
            )
        if raw.channel == 0:
            if raw.kind != FRAME_METHOD:
                raise AmqpError(
                    UNEXPECTED_FRAME,
                    "UNEXPECTED_FRAME - content frame on channel 0",
                    connection=True,
                )
            if isinstance(method, spec.Connection.Close):
                # close-ok says the connection is gone: its exclusive queues with it, so
                # that a client that declares one again next sees no trace of them
                await self._release()
                await self.send(0, spec.Connection.CloseOk())
                await self.flush()
                raise _Closed
            if isinstance(method, spec.Connection.CloseOk):
                raise _Closed
            raise AmqpError(
                COMMAND_INVALID,
                f"COMMAND_INVALID - {method.name} is not allowed on channel 0",
                connection=True,
            )
        ch = self.channels.get(raw.channel)
        if raw.kind != FRAME_METHOD:
            if ch is None:
                raise AmqpError(
                    CHANNEL_ERROR,
                    f"CHANNEL_ERROR - expected 'channel.open' on channel {raw.channel}",
                    connection=True,
                )
            await ch.content(raw)
            return
        if isinstance(method, spec.Channel.Open):
            if ch is not None:
                raise AmqpError(
                    CHANNEL_ERROR,
                    f"CHANNEL_ERROR - second 'channel.open' seen on channel {raw.channel}",
                    connection=True,
                )
            if raw.channel > CHANNEL_MAX:
                raise AmqpError(
                    NOT_ALLOWED,
                    f"NOT_ALLOWED - channel {raw.channel} above channel_max {CHANNEL_MAX}",
                    connection=True,
                )
            self.channels[raw.channel] = self.gateway.new_channel(self, raw.channel)
            await self.send(raw.channel, spec.Channel.OpenOk())
            return
        if ch is None:
            raise AmqpError(
                CHANNEL_ERROR,
                f"CHANNEL_ERROR - expected 'channel.open' on channel {raw.channel}",
                connection=True,
            )
        await ch.method(method)

    async def _channel_error(
        self, number: int, exc: AmqpError, method: tuple[int, int] = (0, 0)
    ) -> None:
        ch = self.channels.get(number)
        if ch is not None:
            ch.closing = True
            await ch.close()
        await self.send(
            number,
            spec.Channel.Close(
                reply_code=exc.code,
                reply_text=_short(exc.text),
                class_id=method[0],
                method_id=method[1],
            ),
        )

    async def close_connection(self, exc: AmqpError, method: tuple[int, int] = (0, 0)) -> None:
        self._closing = True
        try:
            await self.send(
                0,
                spec.Connection.Close(
                    reply_code=exc.code,
                    reply_text=_short(exc.text),
                    class_id=method[0],
                    method_id=method[1],
                ),
            )
            with anyio.move_on_after(1.0):
                # wait for close-ok (or anything) before dropping the socket
                await self.flush()
                await self.stream.receive(65536)
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def _heartbeats(self) -> None:
        interval = max(self.heartbeat / 2, 0.5)
        while True:
            await anyio.sleep(interval)
            if not self.held and time.monotonic() - self._last_recv > 2 * self.heartbeat:
                log.info("connection %s missed heartbeats; closing it", self.id)
                await self.stream.aclose()
                return
            try:
                await self.send_raw(HEARTBEAT)
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return

    def _peer_is_loopback(self) -> bool:
        try:
            addr = self.stream.remote_address
        except Exception:  # a UNIX socket or no address: local
            return True
        host = addr[0] if isinstance(addr, tuple) else str(addr)
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return True

    async def _release(self) -> None:
        """Close the channels and drop the exclusive queues (safe to repeat)."""
        for ch in list(self.channels.values()):
            await ch.close()
        self.channels.clear()
        for queue in list(self.exclusive):
            await self.gateway.drop_exclusive(queue)
        self.exclusive.clear()

    async def _cleanup(self) -> None:
        await self._release()
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (OSError, anyio.BrokenResourceError):
                pass


_PUBLISH_ID = (spec.Basic.Publish.index >> 16, spec.Basic.Publish.index & 0xFFFF)


def _publishing(raw: RawFrame, method: Any) -> bool:
    """Is this frame part of a publish (basic.publish, a content header or body)?"""
    return raw.kind != FRAME_METHOD or type(method) is spec.Basic.Publish


def _method_id(raw: RawFrame, method: Any) -> tuple[int, int]:
    """(class id, method id) of a method frame, for close replies: pamqp's, of the method
    it read; (0, 0) for other frames and for a method pamqp could not read."""
    if raw.kind == FRAME_METHOD and isinstance(method, Frame):
        return method.index >> 16, method.index & 0xFFFF
    return 0, 0


def _credentials(mechanism: str, response: Any) -> tuple[str, str]:
    if isinstance(response, bytes):
        data = response
    else:
        data = str(response).encode("utf-8", "surrogateescape")
    if mechanism == "PLAIN":
        parts = data.split(b"\x00")
        if len(parts) == 3:
            return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        return "", ""
    if mechanism == "AMQPLAIN":
        from pamqp import decode

        table: dict[str, Any] = {}
        try:
            offset = 0
            while offset < len(data):
                used, key = decode.short_str(data[offset:])
                offset += used
                used, value = decode.embedded_value(data[offset:])
                offset += used
                table[key] = value
        except Exception:
            return "", ""
        return str(table.get("LOGIN", "")), str(table.get("PASSWORD", ""))
    return "", ""
