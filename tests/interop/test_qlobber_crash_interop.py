"""A worker killed mid-handling hands its jobs over, across fsbus and qlobber-fsq 14.

Both implementations lock a work-queue message with flock(2) on the message file, so the
kernel's release of a dead process's locks is what redelivers it, whichever side died.
"""

from __future__ import annotations

import base64
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from fsbus import Bus, Message
from tests.peer_process import TIMEOUT, JsonLinesPeer, locked_files, singles_on_disk

pytestmark = [pytest.mark.interop, pytest.mark.slow]


def wait_until(check: Callable[[], bool], *, what: str, timeout: float = TIMEOUT) -> None:
    """Wait until ``check()`` holds, looking every 20 ms (for conditions that are files)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


@pytest.mark.asyncio
async def test_jobs_of_a_killed_qlobber_worker_go_to_an_fsbus_worker(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    jobs = 20
    # The Node worker's handler never calls done(): it keeps every job it takes locked.
    node = qlobber("sub", subscriptions=[{"id": "w", "pattern": "jobs.#", "hold": True}])
    await anyio.to_thread.run_sync(lambda: node.wait_count("ready", 1))

    handled: list[Message] = []

    async def worker(msg: Message) -> None:
        handled.append(msg)

    async with Bus(bus_root) as bus:
        infos = [
            await bus.publish("jobs.crash", f"job-{i}".encode(), single=True) for i in range(jobs)
        ]
        await anyio.to_thread.run_sync(lambda: node.wait_count("message", jobs))
        assert {str(e["fname"]) for e in node.of("message")} == {i.name for i in infos}
        assert await anyio.to_thread.run_sync(locked_files, bus_root) == {i.path for i in infos}
        # fsbus's browse sees qlobber-fsq's locks.
        assert {i.name: i.locked async for i in bus.browse("jobs.#")} == dict.fromkeys(
            (i.name for i in infos), True
        )

        # subscribe() lists the queue and tries every job at once: all are locked.
        await bus.subscribe("jobs.#", worker)
        assert handled == []

        node.proc.send_signal(signal.SIGKILL)
        assert await anyio.to_thread.run_sync(node.wait_exit) == -signal.SIGKILL
        with anyio.fail_after(TIMEOUT):
            while bus.statistics().acked < jobs:  # noqa: ASYNC110 - a counter, no event
                await anyio.sleep(0.02)

    payload_of = {info.name: f"job-{n}".encode() for n, info in enumerate(infos)}
    assert Counter(m.name for m in handled) == Counter(set(payload_of)), "each job exactly once"
    for m in handled:
        assert m.payload == payload_of[m.name]
    assert singles_on_disk(bus_root) == set()


def test_jobs_of_a_killed_fsbus_worker_go_to_a_qlobber_worker(
    qlobber: Callable[..., JsonLinesPeer],
    fsbus_child: Callable[..., JsonLinesPeer],
    bus_root: Path,
) -> None:
    jobs, holding = 30, 5
    # An fsbus worker process whose handlers never return: it holds `holding` jobs.
    victim = fsbus_child(
        "worker", pattern="jobs.#", hold=True, config={"handler_concurrency": holding}
    )
    victim.wait_count("ready", 1)
    payloads = [f"node-job-{i}".encode() for i in range(jobs)]
    pub = qlobber(
        "pub",
        messages=[
            {"topic": "jobs.crash", "payload": base64.b64encode(p).decode(), "single": True}
            for p in payloads
        ],
    )
    pub.wait_count("done", 1)
    assert pub.wait_exit() == 0
    by_name = {str(e["fname"]): payloads[int(e["i"])] for e in pub.of("published")}
    held = {str(e["name"]): e for e in victim.wait_count("start", holding)}

    node = qlobber("sub", subscriptions=[{"id": "w", "pattern": "jobs.#"}])
    node.wait_count("message", jobs - holding)
    wait_until(lambda: singles_on_disk(bus_root) == set(held), what="the rest consumed")
    # While the fsbus worker lives, its jobs stay locked and the Node worker skips them.
    assert not set(held) & {str(e["fname"]) for e in node.of("message")}
    assert locked_files(bus_root) == {
        str(bus_root / "messages" / str(e["bucket"]) / name) for name, e in held.items()
    }

    victim.proc.send_signal(signal.SIGKILL)
    assert victim.wait_exit() == -signal.SIGKILL
    node.wait_count("message", jobs)
    wait_until(lambda: not singles_on_disk(bus_root), what="every job consumed")
    assert node.stop() == 0

    got = Counter(str(e["fname"]) for e in node.of("message"))
    assert got == Counter(set(by_name)), "each job exactly once on the Node side"
    redelivered = set(got) & {str(e["name"]) for e in victim.of("start")}
    assert redelivered == set(held)
    assert victim.count("start") == holding
    for e in node.of("message"):
        assert base64.b64decode(str(e["payload"])) == by_name[str(e["fname"])]
