"""The disk alarm: a bus whose filesystem runs short of space or inodes holds publishes
and tells publishing pika clients (connection.blocked), then lets them go
(connection.unblocked) once there is room again; nothing published is lost.

The bus lives on a small tmpfs mounted for the test (root only).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from fsbus import BlockingBus
from fsbus.amqp import Gateway, running
from fsbus.amqp._routing import bus_queue_name

WAIT = 20.0
BEFORE, HELD, AFTER = 20, 30, 1


@pytest.fixture(params=["bytes", "inodes"])
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(what runs short, a tmpfs mounted for the test)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    size = "size=4m" if request.param == "bytes" else "size=64m,nr_inodes=4000"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield request.param, mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _wait(conn: pika.BlockingConnection, ready: Callable[[], bool], what: str) -> None:
    """Run pika's I/O (and its callbacks) until ``ready()``, or fail after WAIT s."""
    deadline = time.monotonic() + WAIT
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {WAIT} s"
        conn.process_data_events(time_limit=0.05)


def _fill(kind: str, mnt: Path, gw: Gateway) -> list[Path]:
    """Use up the room left above the gateway's limit, leaving half of it free."""
    st = os.statvfs(mnt)
    ballast = mnt / "ballast"
    if kind == "bytes":
        free = st.f_bavail * st.f_frsize
        assert free > gw.disk_free_limit, "the bus took the room the test needs"
        with open(ballast, "wb") as f:
            f.write(b"\0" * (free - gw.disk_free_limit // 2))
        return [ballast]
    assert st.f_favail > gw.inode_free_limit, "the bus took the inodes the test needs"
    ballast.mkdir()
    files = [ballast / str(i) for i in range(st.f_favail - gw.inode_free_limit // 2)]
    for p in files:
        p.touch()
    return [*files, ballast]


def test_a_full_disk_blocks_publishers_until_there_is_room(small_disk: tuple[str, Path]) -> None:
    kind, mnt = small_disk
    root = mnt / "bus"
    limits = (
        {"disk_free_limit": 1_000_000, "inode_free_limit": 0}
        if kind == "bytes"
        else {"disk_free_limit": 0, "inode_free_limit": 1_000}
    )
    with running(root, **limits) as gw:
        conn = pika.BlockingConnection(pika.URLParameters(gw.url))
        heard: list[str] = []
        conn.add_on_connection_blocked_callback(lambda _c, frame: heard.append("blocked"))
        conn.add_on_connection_unblocked_callback(lambda _c, frame: heard.append("unblocked"))
        confirmed = conn.channel()
        confirmed.confirm_delivery()
        plain = conn.channel()
        confirmed.queue_declare("stored", durable=True)
        durable = pika.BasicProperties(delivery_mode=2)
        for i in range(BEFORE):
            confirmed.basic_publish("", "stored", str(i).encode(), durable)

        ballast = _fill(kind, mnt, gw)
        _wait(conn, lambda: heard == ["blocked"], "connection.blocked")

        for i in range(BEFORE, BEFORE + HELD):  # no confirms: basic_publish returns at once
            plain.basic_publish("", "stored", str(i).encode(), durable)
        _wait(conn, lambda: any(c.held for c in gw.connections), "publish held")
        with BlockingBus(root) as bus:
            assert bus.queue_info(bus_queue_name("stored")).depth == BEFORE

        for p in ballast:
            p.rmdir() if p.is_dir() else p.unlink()
        _wait(conn, lambda: heard == ["blocked", "unblocked"], "connection.unblocked")
        for i in range(BEFORE + HELD, BEFORE + HELD + AFTER):
            confirmed.basic_publish("", "stored", str(i).encode(), durable)

        got: list[int] = []

        def on_message(ch: object, method: object, _props: object, body: bytes) -> None:
            got.append(int(body))
            confirmed.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

        confirmed.basic_consume("stored", on_message)
        total = BEFORE + HELD + AFTER
        _wait(conn, lambda: len(got) >= total, f"all {total} messages")
        assert sorted(got) == list(range(total))
        conn.close()
