"""Messages a real qlobber-fsq peer publishes reach fsbus's durable queues.

qlobber-fsq knows nothing of queues: the fsbus processes on the bus route its messages,
the first to list one making the copies (a marker created with O_EXCL under
``fsbus/queues/.routed/`` says who). Each queue gets one copy, whichever process saw it.
Of the processes that only consume queues, one (holding a flock on
``fsbus/queues/.router``) lists the main bus for this; another takes over when it dies.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fsbus import BlockingBus
from tests.peer_process import JsonLinesPeer

QUEUE_CHILD = Path(__file__).resolve().parent.parent / "queues" / "queue_child.py"
FAST = {"poll_interval": 0.05, "retry_interval": 0.05, "gc_interval": 0.2}


@pytest.fixture
def consumer(tmp_path: Path, bus_root: Path) -> Iterator[Callable[..., JsonLinesPeer]]:
    """``consumer("q")``: an fsbus process consuming durable queue ``q`` (queue_child.py)."""
    started: list[JsonLinesPeer] = []
    repo = str(QUEUE_CHILD.parent.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}

    def start(queue: str, **params: Any) -> JsonLinesPeer:
        params_file = tmp_path / f"consumer-{len(started)}.json"
        params_file.write_text(
            json.dumps({"root": str(bus_root), "queue": queue, "config": FAST, **params})
        )
        peer = JsonLinesPeer(
            [sys.executable, str(QUEUE_CHILD), "consumer", str(params_file)],
            name=f"fsbus consumer of {queue} #{len(started)}",
            env=env,
        )
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()


def handled(peers: list[JsonLinesPeer]) -> Counter[str]:
    return Counter(e["id"] for p in peers for e in p.of("done"))


def wait_handled(peers: list[JsonLinesPeer], ids: set[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ids <= set(handled(peers)):
        assert time.monotonic() < deadline, (
            f"never handled: {sorted(ids - set(handled(peers)))[:10]}\n"
            + "\n".join(p.describe() for p in peers)
        )
        time.sleep(0.01)


def test_a_qlobber_peers_messages_reach_every_bound_queue_once(
    bus_root: Path,
    qlobber: Callable[..., JsonLinesPeer],
    consumer: Callable[..., JsonLinesPeer],
) -> None:
    with BlockingBus(bus_root) as bus:
        bus.declare_queue("all", ["peer.#"])
        bus.declare_queue("some", ["peer.*"])
    # a qlobber-fsq subscriber keeps getting the multi messages it always got (no
    # qlobber-fsq worker takes the single ones: see test_a_peer_worker_may_take_a_single_first)
    listener = qlobber(
        "sub",
        subscriptions=[{"id": "x", "pattern": "peer.x"}, {"id": "d", "pattern": "peer.deep.#"}],
    )
    listener.wait_count("ready", 1)
    all_ = [consumer("all"), consumer("all")]
    some = [consumer("some")]
    for c in (*all_, *some):
        c.wait_count("ready", 1)
    messages = [
        {
            "topic": "peer.job" if i % 4 == 0 else "peer.x" if i % 3 else "peer.deep.x",
            "payload": base64.b64encode(str(i).encode()).decode(),
            "single": i % 4 == 0,
        }
        for i in range(150)
    ]
    publisher = qlobber("pub", messages=messages)
    publisher.wait_count("done", 1)
    ids = {str(i) for i in range(150)}
    shallow = {str(i) for i in range(150) if i % 3 or i % 4 == 0}
    multi = {str(i) for i in range(150) if i % 4}
    wait_handled(all_, ids)
    wait_handled(some, shallow)
    listener.wait_count("message", len(multi))
    with BlockingBus(bus_root) as bus:
        assert bus.queue_info("all").depth == 0
        assert bus.queue_info("some").depth == 0
    # exactly one copy per queue, whichever of the three processes routed it
    assert handled(all_) == Counter(ids)
    assert handled(some) == Counter(shallow)
    got = Counter(base64.b64decode(e["payload"]).decode() for e in listener.of("message"))
    assert got == Counter(multi)


def test_a_peer_worker_may_take_a_single_first(
    bus_root: Path,
    qlobber: Callable[..., JsonLinesPeer],
    consumer: Callable[..., JsonLinesPeer],
) -> None:
    """A qlobber-fsq worker and the queues compete for a peer's single message: the queue
    gets a copy of each one an fsbus process lists before the worker has acknowledged it.
    Whatever happens, the worker gets each once and the queue never gets one twice."""
    with BlockingBus(bus_root) as bus:
        bus.declare_queue("q", ["job.#"])
    worker = qlobber("sub", subscriptions=[{"id": "w", "pattern": "job.#"}])
    worker.wait_count("ready", 1)
    queue = [consumer("q")]
    queue[0].wait_count("ready", 1)
    messages = [
        {"topic": "job.x", "payload": base64.b64encode(str(i).encode()).decode(), "single": True}
        for i in range(100)
    ]
    qlobber("pub", messages=messages).wait_count("done", 1)
    worker.wait_count("message", 100)
    got = Counter(base64.b64decode(e["payload"]).decode() for e in worker.of("message"))
    assert got == Counter(str(i) for i in range(100))
    with BlockingBus(bus_root) as bus:
        deadline = time.monotonic() + 30
        while bus.queue_info("q").depth and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bus.queue_info("q").depth == 0
    copies = handled(queue)
    assert set(copies.values()) <= {1}
    assert set(copies) <= {str(i) for i in range(100)}


def test_another_consumer_takes_over_routing_when_the_router_is_killed(
    bus_root: Path,
    qlobber: Callable[..., JsonLinesPeer],
    consumer: Callable[..., JsonLinesPeer],
) -> None:
    """Of the processes that only consume queues, one lists the main bus and routes the
    peer's messages. SIGKILL it: another takes over (its flock on fsbus/queues/.router went
    with the process), and what the peer publishes meanwhile still reaches the queue, one
    copy each."""
    with BlockingBus(bus_root) as bus:
        bus.declare_queue("q", ["peer.#"])
    router = consumer("q")  # the first to consume: elected
    router.wait_count("ready", 1)
    others = [consumer("q"), consumer("q")]
    for c in others:
        c.wait_count("ready", 1)
    everyone = [router, *others]

    def batch(first: int, count: int) -> list[dict[str, Any]]:
        return [
            {
                "topic": "peer.x",
                "payload": base64.b64encode(str(i).encode()).decode(),
                "single": False,
            }
            for i in range(first, first + count)
        ]

    publisher = qlobber("pub", messages=batch(0, 300), pause_at=100)
    publisher.wait_count("paused", 1)
    wait_handled(everyone, {str(i) for i in range(100)})
    router.proc.send_signal(signal.SIGKILL)
    assert router.wait_exit() == -signal.SIGKILL
    # the rest at once: the first while no one routes (a waiting consumer tries to take
    # over every quarter second), the others after the takeover
    publisher.send("GO")
    publisher.wait_count("done", 1)
    ids = {str(i) for i in range(300)}
    wait_handled(everyone, ids)
    with BlockingBus(bus_root) as bus:
        deadline = time.monotonic() + 30
        while bus.queue_info("q").depth and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bus.queue_info("q").depth == 0
    # one copy each: a copy is delivered first once (a later delivery of it, if the
    # killed router held it unacknowledged, counts its deliveries on)
    firsts = Counter(e["id"] for p in everyone for e in p.of("done") if e["delivery_count"] == 1)
    assert firsts == Counter(ids)
