"""Fixtures of the durable-queue tests: a bus root, fast settings, waiting helpers.

Everything runs on real directories with the real Bus; waits are on conditions with a
deadline, never a bare sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from fsbus import Bus, BusConfig, Message
from tests.peer_process import JsonLinesPeer

WAIT = 30.0
"""Seconds any single wait may take before it fails the test."""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A bus directory that does not exist yet (the bus creates it)."""
    return tmp_path / "bus"


@pytest.fixture
def fast() -> BusConfig:
    """Defaults, but polls and retries quick enough for redelivery and expiry tests."""
    return BusConfig(poll_interval=0.05, retry_interval=0.05, gc_interval=0.2)


class Inbox:
    """An async handler that records what it gets; tests wait on its count."""

    def __init__(self, fail: Callable[[Message], bool] | None = None) -> None:
        self.messages: list[Message] = []
        self._fail = fail
        self._changed = anyio.Event()

    async def __call__(self, msg: Message) -> None:
        self.messages.append(msg)
        self._changed.set()
        if self._fail is not None and self._fail(msg):
            raise RuntimeError(f"handler refuses {msg.payload!r}")

    @property
    def payloads(self) -> list[bytes]:
        return [m.payload for m in self.messages]

    async def wait_for(self, count: int, seconds: float = WAIT) -> list[Message]:
        """Wait until at least ``count`` messages arrived; returns all of them."""
        with anyio.fail_after(seconds):
            while len(self.messages) < count:
                self._changed = anyio.Event()
                await self._changed.wait()
        return self.messages


async def publish_then_one_more(
    bus: Bus, topic: str, count: int, kept: Inbox, arrived: int, last: int
) -> None:
    """A dead-letter cycle's test: publish ``count`` messages on ``topic`` (payloads
    0, 1, ...), wait until ``arrived`` dead letters are in ``kept``, publish one more
    (payload ``count``), and wait until the one with payload ``last`` is in ``kept``:
    any message that came back round a cycle would have come before it."""
    for i in range(count + 1):
        if i == count:
            await kept.wait_for(arrived)
        await bus.publish(topic, str(i).encode())
    want = str(last).encode()
    await wait_until(lambda: want in kept.payloads)


async def wait_until(check: Callable[[], object], seconds: float = WAIT) -> None:
    """Poll ``check`` every 10 ms until it is true; fail after ``seconds``."""
    # Files and counters have no event to wait on: poll them, with a deadline.
    with anyio.fail_after(seconds):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.01)


HERE = Path(__file__).resolve().parent
CHILD = HERE / "queue_child.py"
REPO = HERE.parent.parent


@pytest.fixture
def spawn(tmp_path: Path, root: Path) -> Iterator[Callable[..., JsonLinesPeer]]:
    """``spawn("consumer", queue="q")`` runs tests/queues/queue_child.py on ``root``.

    Children still running when the test ends are killed.
    """
    started: list[JsonLinesPeer] = []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }

    def start(role: str, *, name: str | None = None, **params: Any) -> JsonLinesPeer:
        label = name or f"{role} #{len(started)}"
        params_file = tmp_path / f"child-{len(started)}-{role}.json"
        params.setdefault("root", str(root))
        params_file.write_text(json.dumps(params))
        peer = JsonLinesPeer(
            [sys.executable, str(CHILD), role, str(params_file)], name=label, cwd=HERE, env=env
        )
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()


@contextlib.contextmanager
def ready_child(script: str, root: Path) -> Iterator[subprocess.Popen[str]]:
    """``python -c script root`` from the repository, once it printed "ready" (its bus
    is open); killed when the block ends if it still runs."""
    with subprocess.Popen(
        [sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True, cwd=REPO
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"
            yield proc
        finally:
            proc.kill()
