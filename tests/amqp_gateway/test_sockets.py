"""The gateway's client sockets (``fsbus.amqp._socket``): a consumer that stops reading
holds up only itself and gets everything once it reads again; a gateway that closes a
connection (missed heartbeats) wakes the read waiting on it; a client that goes away
mid-frame ends only its own connection."""

from __future__ import annotations

import socket
import struct
import time

import pika
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import heartbeat as pheartbeat

from .conftest import Broker
from .test_hostile import WAIT, raw_open, read_frame

QUEUE = "slow-reader"
COUNT = 400
BODY = 16384  # 400 x 16 KiB: more than the kernel buffers of both ends hold (4 MiB)


def handshake(broker: Broker, *, heartbeat: int = 0) -> socket.socket:
    """A raw socket through the handshake, channel 1 open."""
    s = raw_open(broker, heartbeat=heartbeat)
    s.sendall(pframe.marshal(spec.Channel.Open(), 1))
    read_frame(s)  # channel.open-ok
    return s


class Frames:
    """Frames read one at a time off a raw socket (a method, a header or a body)."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.data = b""

    def next(self) -> object:
        while True:
            if len(self.data) >= 7:
                (size,) = struct.unpack(">I", self.data[3:7])
                if len(self.data) >= size + 8:
                    used, _ch, value = pframe.unmarshal(self.data[: size + 8])
                    self.data = self.data[used:]
                    return value
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed by the gateway")
            self.data += chunk


def connections(broker: Broker) -> int:
    assert broker.gateway is not None
    return len(broker.gateway.connections)


def wait_for_connections(broker: Broker, count: int) -> None:
    """Wait until the gateway serves ``count`` connections (its own count)."""
    deadline = time.monotonic() + WAIT
    while connections(broker) != count:
        assert time.monotonic() < deadline, f"{connections(broker)} connections, not {count}"
        time.sleep(0.01)


def test_a_consumer_that_stops_reading_holds_up_only_itself(gateway: Broker) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True)
        ch.queue_declare("others", durable=True)
        for i in range(COUNT):
            ch.basic_publish("", QUEUE, i.to_bytes(4, "big") + bytes(BODY - 4))

    slow = handshake(gateway)
    # no prefetch limit: the gateway sends all 400 deliveries (6.5 MB) at once
    consume = spec.Basic.Consume(queue=QUEUE, consumer_tag="slow", no_ack=True)
    slow.sendall(pframe.marshal(consume, 1))
    try:
        # Meanwhile another client is served: 50 round trips through a publish and a get.
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(50):
                ch.basic_publish("", "others", str(i).encode())
                method, _props, body = ch.basic_get("others", auto_ack=True)
                assert method is not None
                assert body == str(i).encode()

        # The slow reader reads now: every delivery, in order, each body whole.
        frames = Frames(slow)
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < COUNT and time.monotonic() < deadline:
            value = frames.next()
            if isinstance(value, spec.Basic.Deliver):
                frames.next()  # its content header
                body = b""
                while len(body) < BODY:
                    part = frames.next()
                    body += part.value  # type: ignore[attr-defined]
                assert len(body) == BODY
                got.append(int.from_bytes(body[:4], "big"))
        assert got == list(range(COUNT))
    finally:
        slow.close()


def test_missed_heartbeats_close_a_connection_waiting_to_read(gateway: Broker) -> None:
    # heartbeat 1 s: the gateway sends one every 0.5 s and, hearing nothing for 2 s,
    # closes the socket under the read that waits on it
    with handshake(gateway, heartbeat=1) as s:
        assert connections(gateway) == 1
        started = time.monotonic()
        s.settimeout(10)
        frames = Frames(s)
        heartbeats = 0
        try:
            while True:
                value = frames.next()
                if isinstance(value, spec.Channel.OpenOk):
                    continue  # (handshake() reads it, unless a heartbeat came first)
                assert isinstance(value, pheartbeat.Heartbeat), value
                heartbeats += 1
        except ConnectionError:
            pass
        took = time.monotonic() - started
        assert heartbeats >= 2
        assert 1.5 < took < 8, took
        wait_for_connections(gateway, 0)  # its read woke, and the connection was cleaned up

    # the gateway still serves others
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        assert conn.channel().queue_declare("after", durable=True).method.message_count == 0


def test_a_client_gone_mid_frame_ends_only_its_connection(gateway: Broker) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        ch = conn.channel()
        ch.queue_declare("kept", durable=True)
        half = handshake(gateway)
        wait_for_connections(gateway, 2)
        publish = pframe.marshal(spec.Basic.Publish(routing_key="kept"), 1)
        half.sendall(publish[: len(publish) // 2])
        # a reset, not a clean close: the gateway's read fails
        half.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        half.close()
        wait_for_connections(gateway, 1)
        ch.basic_publish("", "kept", b"still here")
        deadline = time.monotonic() + WAIT
        while ch.queue_declare("kept", passive=True).method.message_count < 1:
            assert time.monotonic() < deadline
            conn.process_data_events(0.05)
        method, _props, body = ch.basic_get("kept", auto_ack=True)
        assert method is not None
        assert body == b"still here"
