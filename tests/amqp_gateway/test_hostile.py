"""Hostile input to the gateway: each gets RabbitMQ's close code, others keep being
served, memory stays bounded, and nothing on disk is corrupted.

``FSBUS_FUZZ_ROUNDS`` (default 200) sets how many random inputs the fuzz test sends.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pamqp import commands as spec
from pamqp import frame as pframe

from fsbus import BlockingBus

from .conftest import Broker

HEADER = b"AMQP\x00\x00\x09\x01"
WAIT = 10.0


def raw_open(broker: Broker, *, heartbeat: int = 0) -> socket.socket:
    """A socket through the handshake (guest/guest), channel 1 not yet open."""
    s = socket.create_connection((broker.host, broker.port), timeout=WAIT)
    s.sendall(HEADER)
    read_frame(s)  # connection.start
    s.sendall(pframe.marshal(spec.Connection.StartOk(response="\0guest\0guest"), 0))
    read_frame(s)  # connection.tune
    tune = spec.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=heartbeat)
    s.sendall(pframe.marshal(tune, 0))
    s.sendall(pframe.marshal(spec.Connection.Open(virtual_host="/"), 0))
    read_frame(s)  # open-ok
    return s


def read_frame(s: socket.socket) -> object:
    data = b""
    while True:
        try:
            _used, _ch, value = pframe.unmarshal(data)
            return value
        except Exception:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed") from None
            data += chunk


def close_code(s: socket.socket) -> int:
    """The reply code of the connection.close (or channel.close) the server sends next."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = read_frame(s)
        if isinstance(value, spec.Connection.Close | spec.Channel.Close):
            return int(value.reply_code)
    raise AssertionError("no close")


def test_a_wrong_protocol_header_gets_the_right_one(broker: Broker) -> None:
    with socket.create_connection((broker.host, broker.port), timeout=WAIT) as s:
        s.sendall(b"HTTP/1.1\r\n")
        assert s.recv(8) == HEADER


def test_a_frame_on_an_unopened_channel(broker: Broker) -> None:
    with raw_open(broker) as s:
        s.sendall(pframe.marshal(spec.Queue.Declare(queue="x"), 5))
        assert close_code(s) == 504


def test_an_oversized_frame(broker: Broker) -> None:
    with raw_open(broker) as s:
        s.sendall(pframe.marshal(spec.Channel.Open(), 1))
        read_frame(s)
        s.sendall(struct.pack(">BHI", 3, 1, 200_000) + b"x" * 1000)
        assert close_code(s) == 501


def test_a_bad_frame_end(broker: Broker) -> None:
    with raw_open(broker) as s:
        frame = bytearray(pframe.marshal(spec.Channel.Open(), 1))
        frame[-1] = 0x00
        s.sendall(bytes(frame))
        assert close_code(s) == 501


def test_content_without_publish(broker: Broker) -> None:
    with raw_open(broker) as s:
        s.sendall(pframe.marshal(spec.Channel.Open(), 1))
        read_frame(s)
        s.sendall(struct.pack(">BHI", 3, 1, 3) + b"abc\xce")
        assert close_code(s) in (505, 504)


def test_reusing_a_consumer_tag(broker: Broker, names: object) -> None:
    q = f"tag-{os.getpid()}-{random.randrange(1 << 30)}"
    with raw_open(broker) as s:
        s.sendall(pframe.marshal(spec.Channel.Open(), 1))
        read_frame(s)
        s.sendall(pframe.marshal(spec.Queue.Declare(queue=q, auto_delete=True), 1))
        read_frame(s)
        s.sendall(pframe.marshal(spec.Basic.Consume(queue=q, consumer_tag="t"), 1))
        read_frame(s)
        s.sendall(pframe.marshal(spec.Basic.Consume(queue=q, consumer_tag="t"), 1))
        assert close_code(s) == 530


def test_a_client_that_never_finishes_its_header_is_dropped(gateway: Broker) -> None:
    with socket.create_connection((gateway.host, gateway.port), timeout=30) as s:
        s.sendall(b"AMQ")
        # the gateway gives up on it after its handshake timeout, and closes
        s.settimeout(30)
        assert s.recv(1) == b""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture
def gateway_process(tmp_path: Path) -> Iterator[tuple[Broker, subprocess.Popen[str]]]:
    """``fsbus amqp`` in a process of its own (its memory is measured)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path / "bus"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fsbus",
            "amqp",
            "--root",
            str(root),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert "AMQP gateway" in proc.stderr.readline()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    try:
        yield Broker("fsbus", url, "127.0.0.1", port, root), proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


FUZZ_ROUNDS = int(os.environ.get("FSBUS_FUZZ_ROUNDS", "200"))


# a round takes up to half a second (a frame the gateway waits on): a longer run on
# request gets the time it needs, not the suite's per-test limit
@pytest.mark.timeout(max(120.0, FUZZ_ROUNDS * 0.6))
def test_fuzz_keeps_serving_others(gateway_process: tuple[Broker, subprocess.Popen[str]]) -> None:
    """Random bytes, truncated and mangled frames on many connections, while a well
    behaved client publishes and consumes: it loses nothing, the gateway's RSS stays
    under 200 MB, and it keeps running."""
    gateway, proc = gateway_process
    assert gateway.root is not None
    rounds = FUZZ_ROUNDS
    rng = random.Random(1234)
    good_frames = [
        pframe.marshal(spec.Channel.Open(), 1),
        pframe.marshal(spec.Queue.Declare(queue="fuzz"), 1),
        pframe.marshal(spec.Basic.Publish(exchange="", routing_key="fuzz"), 1),
        pframe.marshal(spec.Basic.Consume(queue="fuzz"), 1),
    ]
    stop = threading.Event()
    sent: list[bytes] = []
    got: list[bytes] = []
    errors: list[BaseException] = []

    def well_behaved() -> None:
        try:
            with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
                ch = conn.channel()
                ch.queue_declare("steady")
                ch.confirm_delivery()
                i = 0
                while not stop.is_set():
                    body = str(i).encode()
                    ch.basic_publish("", "steady", body)
                    sent.append(body)
                    i += 1
                    method, _p, b = ch.basic_get("steady", auto_ack=True)
                    if method is not None:
                        got.append(b)
                while True:
                    method, _p, b = ch.basic_get("steady", auto_ack=True)
                    if method is None:
                        if len(got) >= len(sent):
                            break
                        continue
                    got.append(b)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    t = threading.Thread(target=well_behaved)
    t.start()
    peak = 0.0
    try:
        for n in range(rounds):
            kind = n % 4
            try:
                with socket.create_connection((gateway.host, gateway.port), timeout=2) as s:
                    if kind == 0:
                        s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300))))
                    else:
                        s.sendall(HEADER)
                        s.recv(4096)
                        s.sendall(
                            pframe.marshal(spec.Connection.StartOk(response="\0guest\0guest"), 0)
                        )
                        s.recv(4096)
                        s.sendall(pframe.marshal(spec.Connection.TuneOk(frame_max=131072), 0))
                        s.sendall(pframe.marshal(spec.Connection.Open(), 0))
                        s.recv(4096)
                        frame = bytearray(rng.choice(good_frames))
                        if kind == 1:  # truncated
                            frame = frame[: rng.randrange(1, len(frame))]
                        elif kind == 2:  # a byte flipped
                            i = rng.randrange(len(frame))
                            frame[i] ^= 1 << rng.randrange(8)
                        else:  # random payload in a valid frame envelope
                            junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64)))
                            frame = bytearray(struct.pack(">BHI", 1, 1, len(junk)) + junk + b"\xce")
                        s.sendall(bytes(frame))
                        s.settimeout(0.5)
                        try:
                            s.recv(4096)
                        except TimeoutError:
                            pass
            except OSError:
                pass  # the gateway may close on us at any point: that is the point
            if n % 20 == 0:
                assert proc.poll() is None, "the gateway died"
                peak = max(peak, rss_mb(proc.pid))
    finally:
        stop.set()
        t.join(timeout=60)
    assert not errors, errors
    assert sorted(got, key=int) == sorted(sent, key=int), "the steady client lost messages"
    assert len(sent) > 0
    assert proc.poll() is None, "the gateway died"
    assert 0 < peak < 200, f"gateway RSS {peak:.0f} MB"
    # the bus is sound: it opens, and fsbus reads every queue without complaint
    with BlockingBus(gateway.root) as bus:
        for q in bus.queues():
            assert q.depth >= 0
        assert (
            not list((gateway.root / "fsbus" / "quarantine").glob("*"))
            if (gateway.root / "fsbus" / "quarantine").exists()
            else True
        )


@pytest.mark.parametrize("size", [0, 1, 131072 - 8, 1_000_000])
def test_bodies_of_every_size(gateway: Broker, size: int) -> None:
    body = bytes(random.Random(size).getrandbits(8) for _ in range(size))
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        ch = conn.channel()
        ch.queue_declare("sizes")
        ch.basic_publish("", "sizes", body)
        deadline = time.monotonic() + WAIT
        while True:
            method, _p, got = ch.basic_get("sizes", auto_ack=True)
            if method is not None:
                break
            assert time.monotonic() < deadline
        assert got == body
