"""``fsbus amqp``'s disk alarm limits, given on the command line."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
from cli_helpers import TIMEOUT, Result, Running


def _url(gateway: Running) -> str:
    gateway.wait_stderr("fsbus AMQP gateway for")
    line = next(line for line in gateway.err_lines if "fsbus AMQP gateway for" in line)
    found = re.search(r"127\.0\.0\.1:(\d+)", line)
    assert found, line
    return f"amqp://guest:guest@127.0.0.1:{found.group(1)}/"


def _blocked_while_publishing(gateway: Running) -> list[str]:
    """Publish once, wait for connection.blocked (or time out), then stop the gateway;
    the reasons got. (A blocked connection is not read from, as on RabbitMQ, so the
    client cannot close it cleanly: the gateway goes first.)"""
    reasons: list[str] = []
    conn = pika.BlockingConnection(pika.URLParameters(_url(gateway)))
    try:
        conn.add_on_connection_blocked_callback(
            lambda _c, frame: reasons.append(frame.method.reason)  # type: ignore[attr-defined]
        )
        conn.channel().basic_publish("amq.topic", "disk.test", b"held")
        deadline = time.monotonic() + TIMEOUT
        while not reasons and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
    finally:
        gateway.proc.send_signal(signal.SIGTERM)
        gateway.finish()
        with contextlib.suppress(pika.exceptions.AMQPError):
            conn.close()
    return reasons


def test_a_disk_free_limit_above_the_free_space_blocks_publishers(
    spawn: Callable[..., Running],
) -> None:
    # more free space than any disk here has: the alarm is on from the start
    gateway = spawn("amqp", "--listen", "127.0.0.1:0", "--disk-free-limit", "1000TB")
    assert _blocked_while_publishing(gateway) == ["low on disk"]


def test_an_inode_free_limit_above_the_free_inodes_blocks_publishers(
    spawn: Callable[..., Running], root: Path
) -> None:
    st = os.statvfs(root.parent)
    if not 0 < st.f_files < 2**63:
        pytest.skip("this filesystem reports no inode count (btrfs): no inode alarm on it")
    gateway = spawn(
        "amqp",
        "--listen",
        "127.0.0.1:0",
        "--inode-free-limit",
        str(2**62),
        "--disk-free-limit",
        "0",
    )
    assert _blocked_while_publishing(gateway) == ["low on disk"]


def test_a_bad_limit_is_refused_with_the_forms_it_takes(cli: Callable[..., Result]) -> None:
    for flag, value, wanted in (
        ("--disk-free-limit", "lots", "give bytes (50000000) or a number with a unit"),
        ("--disk-free-limit", "5XB", "give bytes (50000000) or a number with a unit"),
        ("--inode-free-limit", "-3", "give a whole number"),
    ):
        result = cli("amqp", "--listen", "127.0.0.1:0", flag, value)
        assert result.code == 2, result
        assert wanted in result.stderr, result.stderr
        assert flag in result.stderr, result.stderr
