"""A queue with ``dead_letter_expired``: its expired messages go to its dead-letter topic.

A queue with a ttl, a dead-letter topic and no consumers is a delay (RabbitMQ's "retry
after a delay": a waiting queue whose dead-letter exchange leads back to the work). Every
process running the bus's engine looks for expired messages (once a second, or when the
soonest is due) and sends each under a claim, so each is dead-lettered once, with
``x-fsbus-reason: expired``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, Message, QueueMismatch, UsageError
from fsbus._queues.definition import dead_letter_headers
from tests.peer_process import JsonLinesPeer

from .conftest import Inbox, publish_then_one_more, ready_child, wait_until

Spawn = Callable[..., JsonLinesPeer]
FAST = {"poll_interval": 0.05, "retry_interval": 0.05, "gc_interval": 0.2}


@pytest.mark.anyio
async def test_a_delay_queue_dead_letters_every_expired_message_once_in_order(
    root: Path, fast: BusConfig
) -> None:
    """No consumer of "delay": each message, once its ttl is over, is published under the
    dead-letter topic with its payload and headers, its queue, topic and the reason, in
    the order it was published; the queue is left empty and each is counted."""
    retried = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "delay",
            ["job.*"],
            message_ttl=0.3,
            dead_letter="retry.job",
            dead_letter_expired=True,
        )
        await bus.declare_queue("work", ["retry.#"])
        for i in range(30):
            await bus.publish("job.a", str(i).encode(), headers={"n": str(i)})
        await bus.subscribe(None, retried, queue="work", prefetch=1)
        got = await retried.wait_for(30)
        await wait_until(lambda: bus.statistics().dead_lettered == 30)
        assert (await bus.queue_info("delay")).depth == 0
    assert [m.payload for m in got] == [str(i).encode() for i in range(30)]
    for m in got:
        assert m.topic == "retry.job"
        assert m.delivery_count == 1
        assert m.headers["n"] == m.payload.decode()
        assert m.headers["x-fsbus-queue"] == "delay"
        assert m.headers["x-fsbus-topic"] == "job.a"
        assert m.headers["x-fsbus-reason"] == "expired"


@pytest.mark.anyio
async def test_an_expired_message_does_not_go_back_into_the_queue_it_expired_in(
    root: Path, fast: BusConfig
) -> None:
    """ "audit" is bound to every topic, its dead-letter topic included: each message that
    expires in it is dead-lettered once, into "kept", and not back into "audit" (where it
    would expire and be dead-lettered again, for ever; RabbitMQ drops a dead letter that
    would close such a cycle). A message published once the first three are in "kept"
    expires after any copy of them that came back would have, so "kept" gets exactly the
    four messages, in order, the last one last."""
    kept = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "audit", ["#"], message_ttl=0.2, dead_letter="dead.audit", dead_letter_expired=True
        )
        await bus.declare_queue("kept", ["dead.#"])
        await bus.subscribe(None, kept, queue="kept", prefetch=1)
        await publish_then_one_more(bus, "job.a", 3, kept, arrived=3, last=3)
        await wait_until(lambda: bus.statistics().dead_lettered >= 4)
        assert bus.statistics().dead_lettered == 4
        assert (await bus.queue_info("audit")).depth == 0
    got = [(m.payload, m.headers["x-fsbus-queue"], m.topic) for m in kept.messages]
    assert got == [(str(i).encode(), "audit", "dead.audit") for i in range(4)]


@pytest.mark.anyio
async def test_an_expired_message_does_not_go_round_a_cycle_of_two_queues(
    root: Path, fast: BusConfig
) -> None:
    """ "a" dead-letters what expires in it to "b", and "b" back to "a" (bound to "a.#"):
    a message goes from "a" to "b", then to "kept" (bound to what "b" sends) and not back
    into "a", where it expired already with no failed delivery since (its
    ``x-fsbus-cycle`` header names both). A message published once the first three are in
    "kept" follows them after any copy that went round again would have."""
    kept = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "a", ["a.#"], message_ttl=0.2, dead_letter="b.from-a", dead_letter_expired=True
        )
        await bus.declare_queue(
            "b", ["b.#"], message_ttl=0.2, dead_letter="a.from-b", dead_letter_expired=True
        )
        await bus.declare_queue("kept", ["a.from-b"])
        await bus.subscribe(None, kept, queue="kept", prefetch=1)
        await publish_then_one_more(bus, "a.start", 3, kept, arrived=3, last=3)
        await wait_until(lambda: bus.statistics().dead_lettered >= 8)
        assert bus.statistics().dead_lettered == 8
        for q in ("a", "b"):
            assert (await bus.queue_info(q)).depth == 0
    got = [
        (m.payload, m.headers["x-fsbus-queue"], m.headers["x-fsbus-cycle"]) for m in kept.messages
    ]
    assert got == [(str(i).encode(), "b", "a b") for i in range(4)]


@pytest.mark.anyio
async def test_a_message_a_consumer_holds_is_not_dead_lettered_when_it_expires(
    root: Path, fast: BusConfig
) -> None:
    """A consumer took "held" before its ttl ran out and still holds it: it stays the
    consumer's (acked when the handler returns), while "waiting", which nobody took,
    is dead-lettered when it expires."""
    dead = Inbox()
    handled: list[Message] = []
    release = anyio.Event()

    async def slow(msg: Message) -> None:
        handled.append(msg)
        await release.wait()

    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "q", ["t.#"], message_ttl=0.5, dead_letter="dead.q", dead_letter_expired=True
        )
        await bus.declare_queue("dlq", ["dead.#"])
        await bus.subscribe(None, dead, queue="dlq")
        await bus.subscribe(None, slow, queue="q", prefetch=1)
        await bus.publish("t.x", b"held")
        await wait_until(lambda: len(handled) == 1)
        await bus.publish("t.x", b"waiting")
        # "waiting" expired and went: "held" expired too meanwhile (published first)
        (msg,) = await dead.wait_for(1)
        assert msg.payload == b"waiting"
        release.set()
        # acked: "held" (its handler returned) and "waiting" (in "dlq")
        await wait_until(lambda: bus.statistics().acked == 2)
        assert (await bus.queue_info("q")).depth == 0
    assert [m.payload for m in handled] == [b"held"]
    assert [m.payload for m in dead.messages] == [b"waiting"]


@pytest.mark.anyio
async def test_without_the_option_an_expired_message_is_dropped_not_dead_lettered(
    root: Path, fast: BusConfig
) -> None:
    """``dead_letter`` alone is for failed deliveries: an expired message is dropped."""
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"], message_ttl=0.2, dead_letter="dead.q")
        await bus.declare_queue("dlq", ["dead.#", "marker"])
        await bus.subscribe(None, dead, queue="dlq")
        await bus.publish("t.x", b"dropped")
        messages = root / "fsbus" / "queues" / "q" / "bus" / "messages"
        await wait_until(lambda: any(p.is_file() for p in messages.rglob("*")))
        # removed by the periodic expiry (gc_interval), not sent anywhere
        await wait_until(lambda: not any(p.is_file() for p in messages.rglob("*")))
        await bus.publish("marker", b"after")
        await dead.wait_for(1)
        assert (await bus.queue_info("q")).depth == 0
    assert dead.payloads == [b"after"]


def test_the_option_needs_a_dead_letter_topic_and_is_part_of_the_queues_options(
    root: Path,
) -> None:
    """Without ``dead_letter`` the option is refused, saying what to give; declared
    again with it changed is a mismatch; left False, it is not written into the
    definition (an older fsbus reads it)."""
    with BlockingBus(root) as bus:
        with pytest.raises(UsageError, match="dead_letter_expired needs a dead_letter topic"):
            bus.declare_queue("q", ["t.#"], dead_letter_expired=True)
        bus.declare_queue("plain", ["t.#"], dead_letter="dead.t")
        bus.declare_queue("delay", ["d.#"], dead_letter="dead.d", dead_letter_expired=True)
        with pytest.raises(QueueMismatch, match="dead_letter_expired"):
            bus.declare_queue("delay", ["d.#"], dead_letter="dead.d")
        assert bus.queue_info("delay").options.dead_letter_expired is True
        assert bus.queue_info("plain").options.dead_letter_expired is False
    docs = {
        p.parent.name: json.loads(p.read_text())
        for p in (root / "fsbus" / "queues").glob("*/queue.json")
    }
    assert "dead_letter_expired" not in docs["plain"]["options"]
    assert docs["delay"]["options"]["dead_letter_expired"] is True


def test_the_cli_declares_a_delay_queue(root: Path) -> None:
    """``fsbus queue declare NAME PATTERN --dead-letter T --dead-letter-expired``."""
    declare = ["queue", "declare", "delay", "d.#", "--root", str(root), "--message-ttl", "5"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fsbus",
            *declare,
            "--dead-letter",
            "retry.d",
            "--dead-letter-expired",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with BlockingBus(root) as bus:
        options = bus.queue_info("delay").options
    assert options.dead_letter == "retry.d"
    assert options.dead_letter_expired is True


def delay_and_dead(root: Path, spawn: Spawn, *, consumers: int, ttl: float) -> list[JsonLinesPeer]:
    """Queue "delay" (``ttl``, dead-lettered under "dead.delay", expired ones too) and
    queue "dead" bound to it, and ``consumers`` processes consuming "dead", ready."""
    with BlockingBus(root) as bus:
        bus.declare_queue(
            "delay", ["d.#"], message_ttl=ttl, dead_letter="dead.delay", dead_letter_expired=True
        )
        bus.declare_queue("dead", ["dead.#"])
    peers = [spawn("consumer", queue="dead", config=FAST) for _ in range(consumers)]
    for p in peers:
        p.wait_count("ready", 1)
    return peers


def test_processes_with_the_bus_open_dead_letter_each_expired_message_once(
    root: Path, spawn: Spawn
) -> None:
    """Three consumer processes of "dead" (each with the bus open; one of them at a time
    looks for expired messages) and 300 messages expiring in "delay": every one reaches
    "dead" exactly once, none lost, none twice."""
    consumers = delay_and_dead(root, spawn, consumers=3, ttl=0.3)
    ids = {f"m{i}" for i in range(300)}
    pub = spawn("pub", messages=[["d.x", i] for i in sorted(ids)], config=FAST)
    pub.wait_count("published", 300)
    deadline = time.monotonic() + 60
    done: Counter[str] = Counter()
    while set(done) != ids:
        assert time.monotonic() < deadline, (
            f"never dead-lettered: {sorted(ids - set(done))[:10]}\n"
            + "\n".join(c.describe() for c in consumers)
        )
        time.sleep(0.05)
        done = Counter(e["id"] for c in consumers for e in c.of("done"))
    assert set(done) == ids
    assert max(done.values()) == 1, [i for i, n in done.items() if n > 1]
    heads = [e["headers"] for c in consumers for e in c.of("done")]
    assert {h["x-fsbus-reason"] for h in heads} == {"expired"}
    assert {h["x-fsbus-queue"] for h in heads} == {"delay"}
    with BlockingBus(root) as bus:
        assert bus.queue_info("delay").depth == 0


def _expirer_holder(root: Path, queue: str) -> int | None:
    """The pid holding the flock of ``queue``'s expirer file, from /proc/locks."""
    try:
        inode = (root / "fsbus" / "queues" / queue / "expirer").stat().st_ino
    except FileNotFoundError:
        return None
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields and fields[-3].split(":")[-1] == str(inode):
            return int(fields[-4])
    return None


def test_one_process_lists_a_delay_queue_and_another_takes_over_when_it_dies(
    root: Path, spawn: Spawn
) -> None:
    """Of two processes with the bus open, one holds the queue's ``expirer`` flock and
    dead-letters its expired messages (the other does not list the queue for them);
    SIGKILLed, the other takes over: every message of both halves arrives once."""
    consumers = delay_and_dead(root, spawn, consumers=2, ttl=0.2)
    pids = {c.proc.pid: c for c in consumers}

    def deliver(ids: list[str]) -> None:
        spawn("pub", messages=[["d.x", i] for i in ids], config=FAST).wait_count(
            "published", len(ids)
        )
        deadline = time.monotonic() + 60
        while not set(ids) <= {e["id"] for c in consumers for e in c.of("done")}:
            assert time.monotonic() < deadline, "\n".join(c.describe() for c in consumers)
            time.sleep(0.05)
        with BlockingBus(root) as bus:  # and acked ("done" comes just before the ack)
            while bus.queue_info("dead").depth:
                assert time.monotonic() < deadline, "dead-lettered, not acked"
                time.sleep(0.05)

    first = [f"a{i}" for i in range(50)]
    deliver(first)
    holder = _expirer_holder(root, "delay")
    assert holder in pids, holder
    pids[holder].proc.kill()
    pids[holder].wait_exit()
    second = [f"b{i}" for i in range(50)]
    deliver(second)
    assert _expirer_holder(root, "delay") in set(pids) - {holder}
    done = Counter(e["id"] for c in consumers for e in c.of("done"))
    assert set(done) == set(first + second)
    assert max(done.values()) == 1


_SENDER = textwrap.dedent(
    """
    import os, signal, sys, anyio
    from fsbus import Bus, BusConfig
    from tests.tracked_ops import TrackedOps

    PART = "/queues/delay/bus/messages/"

    class DiesRemovingIt(TrackedOps):
        # killed at the first step of removing the delay queue's message, which comes
        # after its dead letter is published: the window where it goes out twice
        def ftruncate(self, fd, length):
            with self.lock:
                if self.path_of(fd) is not None:
                    os.kill(os.getpid(), signal.SIGKILL)
            return super().ftruncate(fd, length)

        def unlink(self, path):
            if PART in path:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().unlink(path)

    async def main():
        config = BusConfig(poll_interval=0.05, retry_interval=0.05, gc_interval=0.2)
        async with Bus(sys.argv[1], config=config, ops=DiesRemovingIt(PART)):
            print("ready", flush=True)
            await anyio.sleep_forever()

    anyio.run(main)
    """
)


@pytest.mark.anyio
async def test_a_process_killed_between_sending_and_removing_leaves_it_to_be_sent_again(
    root: Path, fast: BusConfig
) -> None:
    """A process (real, SIGKILLed from inside its I/O seam) published an expired message's
    dead letter and died before removing it: the message is still in the delay queue,
    whole, and the next process sends it again. At least once: never lost; the second
    copy is the only one."""

    def declare_and_publish() -> None:
        with BlockingBus(root) as bus:
            bus.declare_queue(
                "delay", ["d.#"], message_ttl=0.3, dead_letter="dead.d", dead_letter_expired=True
            )
            bus.declare_queue("dead", ["dead.#"])
            bus.publish("d.x", b"m")

    def run_sender() -> int:
        with ready_child(_SENDER, root) as proc:
            return proc.wait(timeout=60)

    def depths() -> dict[str, int]:
        with BlockingBus(root) as bus:
            return {q: bus.queue_info(q).depth for q in ("delay", "dead")}

    await anyio.to_thread.run_sync(declare_and_publish)
    assert await anyio.to_thread.run_sync(run_sender) == -9
    # sent once; still in the delay queue (expired, so not counted in its depth)
    assert await anyio.to_thread.run_sync(depths) == {"delay": 0, "dead": 1}
    messages = root / "fsbus" / "queues" / "delay" / "bus" / "messages"
    [left] = [p for p in messages.rglob("*") if p.is_file()]
    assert left.read_bytes().endswith(b"m")
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.subscribe(None, dead, queue="dead")
        got = await dead.wait_for(2)
        await wait_until(lambda: not left.exists())
        await wait_until(lambda: bus.statistics().acked == 2)
    assert [m.payload for m in got] == [b"m", b"m"]
    assert {m.headers["x-fsbus-reason"] for m in got} == {"expired"}
    assert await anyio.to_thread.run_sync(depths) == {"delay": 0, "dead": 0}


def test_a_failed_delivery_ends_a_dead_letters_cycle() -> None:
    """``x-fsbus-cycle`` names, once each, the queues a message expired in or was dropped
    from one after the other; a failed last delivery (no reason) clears it, as a
    rejection ends a cycle for RabbitMQ, so a retry loop through a wait queue goes on."""
    h = dead_letter_headers({"n": "1"}, "a", "a.x", "expired")
    assert h["x-fsbus-cycle"] == "a"
    h = dead_letter_headers(h, "b", "b.x", "maxlen")
    assert h["x-fsbus-cycle"] == "a b"
    assert dead_letter_headers(h, "a", "a.x", "expired")["x-fsbus-cycle"] == "a b"
    failed = dead_letter_headers(h, "work", "job.x")
    assert "x-fsbus-cycle" not in failed
    assert failed["n"] == "1"
