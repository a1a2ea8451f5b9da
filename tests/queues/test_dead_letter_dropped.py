"""A queue with ``dead_letter_dropped``: what a full queue drops goes to its dead-letter topic.

A ``drop-head`` queue at its ``max_length`` drops its oldest message for each new one.
With ``dead_letter_dropped`` (and a ``dead_letter`` topic), as with RabbitMQ's
``x-max-length`` and a dead-letter exchange, the dropped messages are not lost: the
publisher that overfilled the queue writes each into the queue's spool
(``fsbus/queues/<name>/dropped/``) before it removes it, and the process that
dead-letters the queue (the holder of its ``expirer`` lock) publishes them under the
dead-letter topic, in the order dropped, with ``x-fsbus-reason: maxlen``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fsbus import (
    BlockingBus,
    Bus,
    BusConfig,
    Message,
    QueueError,
    QueueFull,
    QueueMismatch,
    UsageError,
)
from fsbus._bus.dropped import LEASE
from fsbus._bus.ops import Ops
from tests.peer_process import JsonLinesPeer

from .conftest import Inbox, publish_then_one_more, ready_child, wait_until

Spawn = Callable[..., JsonLinesPeer]
FAST = {"poll_interval": 0.05, "retry_interval": 0.05, "gc_interval": 0.2}


def spool_of(root: Path, queue: str) -> Path:
    return root / "fsbus" / "queues" / queue / "dropped"


@pytest.mark.anyio
async def test_a_full_queue_dead_letters_each_message_it_drops_once_in_order(
    root: Path, fast: BusConfig
) -> None:
    """ "capped" holds 5: of 50 messages published into it, the first 45 are dropped and
    each is published once under the dead-letter topic, in the order published, with its
    payload, headers, queue, topic and reason ``maxlen``; the last 5 stay in the queue,
    and the spool is left empty."""
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "capped",
            ["job.*"],
            max_length=5,
            dead_letter="overflow.capped",
            dead_letter_dropped=True,
        )
        await bus.declare_queue("overflow", ["overflow.#"])
        await bus.subscribe(None, dead, queue="overflow", prefetch=1)
        for i in range(50):
            await bus.publish("job.a", str(i).encode(), headers={"n": str(i)})
        got = await dead.wait_for(45)
        await wait_until(lambda: bus.statistics().dead_lettered == 45)
        kept = []
        while True:
            async with bus.get("capped") as msg:
                if msg is None:
                    break
                kept.append(msg.payload)
    assert [m.payload for m in got] == [str(i).encode() for i in range(45)]
    assert kept == [str(i).encode() for i in range(45, 50)]
    for m in got:
        assert m.topic == "overflow.capped"
        assert m.delivery_count == 1
        assert m.headers["n"] == m.payload.decode()
        assert m.headers["x-fsbus-queue"] == "capped"
        assert m.headers["x-fsbus-topic"] == "job.a"
        assert m.headers["x-fsbus-reason"] == "maxlen"
    assert not [p for p in spool_of(root, "capped").iterdir() if p.is_file()]


@pytest.mark.anyio
async def test_a_message_a_consumer_holds_is_not_dropped(root: Path, fast: BusConfig) -> None:
    """A consumer holds "held", the oldest: it is not counted towards ``max_length`` (as
    RabbitMQ counts only the ready messages), and the queue drops the oldest of those
    nobody holds instead; the held one stays its consumer's."""
    dead = Inbox()
    handled: list[Message] = []
    release = anyio.Event()

    async def slow(msg: Message) -> None:
        handled.append(msg)
        await release.wait()

    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "q", ["t.#"], max_length=2, dead_letter="dead.q", dead_letter_dropped=True
        )
        await bus.declare_queue("dlq", ["dead.#"])
        await bus.subscribe(None, dead, queue="dlq")
        await bus.subscribe(None, slow, queue="q", prefetch=1)
        await bus.publish("t.x", b"held")
        await wait_until(lambda: len(handled) == 1)
        for name in (b"a", b"b", b"c"):
            await bus.publish("t.x", name)
        await dead.wait_for(1)
        assert (await bus.queue_info("q")).depth == 3  # "held", and 2 ready
        release.set()
        await wait_until(lambda: len(handled) == 3)
        # "held", "b" and "c" by the slow consumer, "a" in dlq
        await wait_until(lambda: bus.statistics().acked == 4)
        assert (await bus.queue_info("q")).depth == 0
    assert dead.payloads == [b"a"]
    assert [m.payload for m in handled] == [b"held", b"b", b"c"]


@pytest.mark.anyio
async def test_without_the_option_a_dropped_message_is_gone(root: Path, fast: BusConfig) -> None:
    """``dead_letter`` alone is for failed deliveries: a full queue's dropped messages
    go nowhere, and no spool is made."""
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("q", ["t.#"], max_length=3, dead_letter="dead.q")
        await bus.declare_queue("dlq", ["dead.#", "marker"])
        await bus.subscribe(None, dead, queue="dlq")
        for i in range(10):
            await bus.publish("t.x", str(i).encode())
        assert (await bus.queue_info("q")).depth == 3
        await bus.publish("marker", b"after")
        await dead.wait_for(1)
    assert dead.payloads == [b"after"]
    assert not spool_of(root, "q").exists()


def test_the_option_needs_a_dead_letter_topic_and_is_part_of_the_queues_options(
    root: Path,
) -> None:
    """Without ``dead_letter`` the option is refused, saying what to give; declared
    again with it changed is a mismatch; left False, it is not written into the
    definition (an older fsbus reads it)."""
    with BlockingBus(root) as bus:
        with pytest.raises(UsageError, match="dead_letter_dropped needs a dead_letter topic"):
            bus.declare_queue("q", ["t.#"], max_length=3, dead_letter_dropped=True)
        bus.declare_queue("plain", ["t.#"], max_length=3, dead_letter="dead.t")
        bus.declare_queue(
            "capped", ["c.#"], max_length=3, dead_letter="dead.c", dead_letter_dropped=True
        )
        with pytest.raises(QueueMismatch, match="dead_letter_dropped"):
            bus.declare_queue("capped", ["c.#"], max_length=3, dead_letter="dead.c")
        assert bus.queue_info("capped").options.dead_letter_dropped is True
        assert bus.queue_info("plain").options.dead_letter_dropped is False
    docs = {
        p.parent.name: json.loads(p.read_text())
        for p in (root / "fsbus" / "queues").glob("*/queue.json")
    }
    assert "dead_letter_dropped" not in docs["plain"]["options"]
    assert docs["capped"]["options"]["dead_letter_dropped"] is True


def test_the_cli_declares_a_queue_that_dead_letters_what_it_drops(root: Path) -> None:
    """``fsbus queue declare NAME PATTERN --max-length N --dead-letter T
    --dead-letter-dropped``."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "fsbus",
            "queue",
            "declare",
            "capped",
            "c.#",
            "--root",
            str(root),
            "--max-length",
            "10",
            "--dead-letter",
            "over.c",
            "--dead-letter-dropped",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with BlockingBus(root) as bus:
        options = bus.queue_info("capped").options
    assert (options.max_length, options.dead_letter) == (10, "over.c")
    assert options.dead_letter_dropped is True


def test_a_publishing_process_drops_and_consumer_processes_dead_letter_each_once(
    root: Path, spawn: Spawn
) -> None:
    """A publisher process (its bus never runs the engine) overfills "capped" (10) with
    400 messages; of two consumer processes of "overflow", one sends the spool on: each
    message is either still in "capped" or was dead-lettered exactly once, none lost,
    none twice, and 390 were dead-lettered."""
    with BlockingBus(root) as bus:
        bus.declare_queue(
            "capped", ["c.#"], max_length=10, dead_letter="over.c", dead_letter_dropped=True
        )
        bus.declare_queue("overflow", ["over.#"])
    consumers = [spawn("consumer", queue="overflow", config=FAST) for _ in range(2)]
    for c in consumers:
        c.wait_count("ready", 1)
    ids = [f"m{i:03d}" for i in range(400)]
    pub = spawn("pub", messages=[["c.x", i] for i in ids], config=FAST)
    pub.wait_count("published", 400)
    deadline = time.monotonic() + 60
    done: Counter[str] = Counter()
    while sum(done.values()) < 390:
        assert time.monotonic() < deadline, f"{sum(done.values())} of 390 dead-lettered\n" + (
            "\n".join(c.describe() for c in consumers)
        )
        time.sleep(0.05)
        done = Counter(e["id"] for c in consumers for e in c.of("done"))
    with BlockingBus(root) as bus:
        kept = []
        while True:
            with bus.get("capped") as msg:
                if msg is None:
                    break
                kept.append(msg.payload.decode())
    assert max(done.values()) == 1, [i for i, n in done.items() if n > 1]
    assert not set(done) & set(kept)
    assert sorted(set(done) | set(kept)) == ids
    assert kept == ids[-10:]
    heads = [e["headers"] for c in consumers for e in c.of("done")]
    assert {h["x-fsbus-reason"] for h in heads} == {"maxlen"}
    assert {h["x-fsbus-queue"] for h in heads} == {"capped"}


@pytest.mark.anyio
async def test_a_file_in_the_spool_that_is_not_a_dropped_message_is_quarantined(
    root: Path, fast: BusConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A foreign file in the spool is moved to the bus's quarantine with a warning that
    names it; the dropped messages beside it are dead-lettered all the same."""
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "q", ["t.#"], max_length=1, dead_letter="dead.q", dead_letter_dropped=True
        )
        await bus.declare_queue("dlq", ["dead.#"])
        spool = spool_of(root, "q")
        spool.mkdir()
        (spool / "00000000000000000000-planted").write_bytes(b"not a message")
        with caplog.at_level(logging.WARNING, logger="fsbus.queues"):
            await bus.subscribe(None, dead, queue="dlq")
            for i in range(3):
                await bus.publish("t.x", str(i).encode())
            got = await dead.wait_for(2)
            await wait_until(lambda: not (spool / "00000000000000000000-planted").exists())
    assert [m.payload for m in got] == [b"0", b"1"]
    assert "00000000000000000000-planted is not a dropped message" in caplog.text
    quarantined = list((root / "fsbus" / "quarantine").glob("*-dropped-*planted"))
    assert [p.read_bytes() for p in quarantined] == [b"not a message"]


_SENDER = textwrap.dedent(
    """
    import os, signal, sys, anyio
    from fsbus import Bus, BusConfig
    from tests.tracked_ops import TrackedOps

    class DiesRemovingIt(TrackedOps):
        # killed when it removes a spooled message, which comes after its dead letter
        # is published: the window where it goes out twice
        def unlink(self, path):
            if "/dropped/" in path and "/.tmp-" not in path:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().unlink(path)

    async def main():
        config = BusConfig(poll_interval=0.05, retry_interval=0.05, gc_interval=0.2)
        async with Bus(sys.argv[1], config=config, ops=DiesRemovingIt("/dropped/")):
            print("ready", flush=True)
            await anyio.sleep_forever()

    anyio.run(main)
    """
)


@pytest.mark.anyio
async def test_a_process_killed_between_sending_and_removing_leaves_it_to_be_sent_again(
    root: Path, fast: BusConfig
) -> None:
    """A process (real, SIGKILLed from inside its I/O seam) published a dropped message's
    dead letter and died before removing it from the spool: the file is still there,
    whole, and the next process sends it again. At least once: never lost."""

    def declare_and_overfill() -> None:
        with BlockingBus(root) as bus:
            bus.declare_queue(
                "q", ["t.#"], max_length=1, dead_letter="dead.q", dead_letter_dropped=True
            )
            bus.declare_queue("dlq", ["dead.#"])
            bus.publish("t.x", b"dropped")
            bus.publish("t.x", b"kept")

    def run_sender() -> int:
        with ready_child(_SENDER, root) as proc:
            return proc.wait(timeout=60)

    await anyio.to_thread.run_sync(declare_and_overfill)
    [spooled] = list(spool_of(root, "q").iterdir())
    assert spooled.read_bytes().endswith(b"\ndropped")
    assert await anyio.to_thread.run_sync(run_sender) == -9
    assert spooled.exists()  # sent once, not removed
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.subscribe(None, dead, queue="dlq")
        got = await dead.wait_for(2)
        await wait_until(lambda: not spooled.exists())
        await wait_until(lambda: bus.statistics().acked == 2)
        assert (await bus.queue_info("q")).depth == 1
    assert [m.payload for m in got] == [b"dropped", b"dropped"]
    assert {m.headers["x-fsbus-reason"] for m in got} == {"maxlen"}


def renaming(fast: BusConfig) -> BusConfig:
    """``fast``, claiming by rename (as where flock does not cross hosts)."""
    return fast.model_copy(update={"locking": "rename"})


@pytest.mark.anyio
async def test_where_claims_are_renames_each_dropped_message_is_dead_lettered_once(
    root: Path, fast: BusConfig
) -> None:
    """With ``locking="rename"`` a sender claims a spool file by renaming it to
    ``.sending-NAME`` (one winner across hosts): each of the 25 dropped is dead-lettered
    once, in order, and no claimed file is left."""
    dead = Inbox()
    async with Bus(root, config=renaming(fast)) as bus:
        await bus.declare_queue(
            "q", ["t.#"], max_length=5, dead_letter="dead.q", dead_letter_dropped=True
        )
        await bus.declare_queue("dlq", ["dead.#"])
        await bus.subscribe(None, dead, queue="dlq", prefetch=1)
        for i in range(30):
            await bus.publish("t.x", str(i).encode())
        got = await dead.wait_for(25)
        await wait_until(lambda: bus.statistics().acked == 25)
    assert [m.payload for m in got] == [str(i).encode() for i in range(25)]
    assert list(spool_of(root, "q").iterdir()) == []


@pytest.mark.anyio
async def test_a_file_claimed_by_a_sender_that_died_is_sent_after_its_lease(
    root: Path, fast: BusConfig
) -> None:
    """Where claims are renames, a sender killed holding a spool file leaves it as
    ``.sending-NAME``: once older than the lease, it is given back and sent (at least
    once: never lost); a younger one is left to its sender."""
    async with Bus(root, config=renaming(fast)) as bus:
        await bus.declare_queue(
            "q", ["t.#"], max_length=1, dead_letter="dead.q", dead_letter_dropped=True
        )
        await bus.declare_queue("dlq", ["dead.#"])
    spool = spool_of(root, "q")
    spool.mkdir()
    body = b'{"topic":"t.x","headers":{}}\n'
    stale = spool / ".sending-00000000000000000001-1-00000000"
    stale.write_bytes(body + b"orphaned")
    old = time.time() - LEASE - 5
    os.utime(stale, (old, old))
    young = spool / ".sending-00000000000000000002-1-00000000"
    young.write_bytes(body + b"in hand")
    dead = Inbox()
    async with Bus(root, config=renaming(fast)) as bus:
        await bus.subscribe(None, dead, queue="dlq")
        await bus.publish("t.x", b"a")
        await bus.publish("t.x", b"b")  # drops "a": the spool is looked at
        got = await dead.wait_for(2)
        await wait_until(lambda: not stale.exists())
    assert sorted(m.payload for m in got) == [b"a", b"orphaned"]
    assert young.exists()


@pytest.mark.anyio
async def test_a_full_reject_publish_queue_dead_letters_each_copy_it_refuses(
    root: Path, fast: BusConfig
) -> None:
    """``overflow="reject-publish"`` with ``dead_letter_dropped`` (RabbitMQ's
    ``reject-publish-dlx``): a publish into the full queue still raises ``QueueFull``
    (saying the message goes to the dead-letter topic), and the refused message goes to the
    dead-letter topic, once each, in order, with reason ``maxlen``; the queue keeps the
    first 2. Through ``publish``, ``publish_many`` and ``enqueue`` alike."""
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "q",
            ["t.#"],
            max_length=2,
            overflow="reject-publish",
            dead_letter="dead.q",
            dead_letter_dropped=True,
        )
        await bus.declare_queue("dlq", ["dead.#"])
        await bus.subscribe(None, dead, queue="dlq", prefetch=1)
        await bus.publish("t.x", b"0")
        await bus.publish("t.x", b"1")
        with pytest.raises(QueueFull, match="it goes to the queue's dead-letter topic"):
            await bus.publish("t.x", b"2", headers={"k": "v"})
        with pytest.raises(QueueFull):
            await bus.publish_many([("t.x", b"3")])
        with pytest.raises(QueueFull):
            await bus.enqueue("q", "t.y", b"4")
        got = await dead.wait_for(3)
        kept = []
        while True:
            async with bus.get("q") as msg:
                if msg is None:
                    break
                kept.append(msg.payload)
    assert [m.payload for m in got] == [b"2", b"3", b"4"]
    assert [m.headers["x-fsbus-topic"] for m in got] == ["t.x", "t.x", "t.y"]
    assert {m.headers["x-fsbus-reason"] for m in got} == {"maxlen"}
    assert got[0].headers["k"] == "v"
    assert kept == [b"0", b"1"]


@pytest.mark.anyio
async def test_a_blocking_publisher_refused_by_a_full_queue_has_it_dead_lettered(
    root: Path, fast: BusConfig
) -> None:
    """The blocking face's ``publish`` and ``enqueue`` (a process that never runs the
    engine) spool what a full ``reject-publish`` queue refuses; a process with the bus
    open sends it on."""

    def overfill() -> None:
        with BlockingBus(root) as bus:
            bus.declare_queue(
                "q",
                ["t.#"],
                max_length=1,
                overflow="reject-publish",
                dead_letter="dead.q",
                dead_letter_dropped=True,
            )
            bus.declare_queue("dlq", ["dead.#"])
            bus.publish("t.x", b"kept")
            with pytest.raises(QueueFull):
                bus.publish("t.x", b"a")
            with pytest.raises(QueueFull):
                bus.enqueue("q", "t.x", b"b")

    await anyio.to_thread.run_sync(overfill)
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.subscribe(None, dead, queue="dlq", prefetch=1)
        got = await dead.wait_for(2)
        assert (await bus.queue_info("q")).depth == 1
    assert [m.payload for m in got] == [b"a", b"b"]


@pytest.mark.anyio
async def test_a_queue_of_max_length_0_keeps_no_copy(root: Path, fast: BusConfig) -> None:
    """``max_length=0`` is a limit, as RabbitMQ's ``x-max-length`` 0: a ``drop-head``
    queue dead-letters each copy as it comes, in order, and a ``reject-publish`` one
    refuses every publish; neither holds anything."""
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "none", ["t.#"], max_length=0, dead_letter="dead.none", dead_letter_dropped=True
        )
        await bus.declare_queue("closed", ["c.#"], max_length=0, overflow="reject-publish")
        await bus.declare_queue("dlq", ["dead.#"])
        await bus.subscribe(None, dead, queue="dlq", prefetch=1)
        for i in range(5):
            await bus.publish("t.x", str(i).encode())
        with pytest.raises(QueueFull):
            await bus.publish("c.x", b"refused")
        got = await dead.wait_for(5)
        assert (await bus.queue_info("none")).depth == 0
        assert (await bus.queue_info("closed")).depth == 0
    assert [m.payload for m in got] == [str(i).encode() for i in range(5)]


def _overfill_capped(bus: BlockingBus, name: str = "capped", *, auto_delete: bool = False) -> None:
    """Queue ``name`` (2 at most) overfilled by 5 from a process that runs no engine: its
    spool keeps the 5 it dropped, for now."""
    bus.declare_queue(
        name,
        ["job.*"],
        max_length=2,
        dead_letter=f"dead.{name}",
        dead_letter_dropped=True,
        auto_delete=auto_delete,
    )
    bus.declare_queue("dlq", ["dead.#"])
    for i in range(7):
        bus.publish("job.a", str(i))


def _drain(bus: BlockingBus, queue: str) -> list[tuple[bytes, str]]:
    out = []
    while True:
        with bus.get(queue) as msg:
            if msg is None:
                return out
            out.append((msg.payload, msg.headers["x-fsbus-reason"]))


def test_queue_info_counts_what_is_on_its_way_to_the_dead_letter_topic(root: Path) -> None:
    with BlockingBus(root) as bus:
        _overfill_capped(bus)
        info = bus.queue_info("capped")
        assert (info.depth, info.dead_lettering) == (2, 5)
        assert bus.queue_info("dlq").dead_lettering == 0
    done = subprocess.run(
        [sys.executable, "-m", "fsbus", "queue", "ls", "--root", str(root), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {q["name"]: q for q in map(json.loads, done.stdout.splitlines())}
    assert rows["capped"]["dead_lettering"] == 5


def test_deleting_a_queue_sends_what_it_dropped_first(root: Path) -> None:
    """What a queue dropped left it already (on RabbitMQ it would be in the dead-letter
    exchange's queues by now): deleting the queue sends it on, once, in order, rather
    than dropping it with the queue."""
    with BlockingBus(root) as bus:
        _overfill_capped(bus)
        assert bus.delete_queue("capped") == 2
        got = _drain(bus, "dlq")
    assert got == [(str(i).encode(), "maxlen") for i in range(5)]


@pytest.mark.anyio
async def test_deleting_a_queue_through_the_engine_dead_letters_each_dropped_one_once(
    root: Path, fast: BusConfig
) -> None:
    """The same through ``Bus.delete_queue`` (the CLI's and the AMQP gateway's), whose
    own sender may be sending the spool meanwhile: each one dead-lettered once."""
    with BlockingBus(root) as setup:
        _overfill_capped(setup)
    async with Bus(root, config=fast) as bus:
        assert await bus.delete_queue("capped") == 2
    with BlockingBus(root) as bus:
        got = _drain(bus, "dlq")
    assert got == [(str(i).encode(), "maxlen") for i in range(5)]


@pytest.mark.anyio
async def test_an_auto_delete_queue_dead_letters_what_it_dropped_as_its_last_consumer_leaves(
    root: Path, fast: BusConfig
) -> None:
    """An ``auto_delete`` queue goes as its last consumer leaves; what it dropped and
    had not yet dead-lettered goes to its dead-letter topic first (or has gone already,
    by the bus's own sender): each once, in order."""
    with BlockingBus(root) as setup:
        _overfill_capped(setup, "brief", auto_delete=True)
    async with Bus(root, config=fast) as bus:
        async with bus.messages(queue="brief", prefetch=1) as it:
            first = await it.receive(30.0)
            await it.ack(first)
        assert "brief" not in [q.name for q in await bus.queues()]
    with BlockingBus(root) as bus:
        got = _drain(bus, "dlq")
    assert got == [(str(i).encode(), "maxlen") for i in range(5)]


@pytest.mark.anyio
async def test_a_dropped_message_does_not_go_back_into_the_queue_that_dropped_it(
    root: Path, fast: BusConfig
) -> None:
    """ "capped" (2 at most) is bound to every topic, its dead-letter topic included: what
    it drops is dead-lettered once, into "kept", and not back into "capped", where each
    would drop another, for ever (RabbitMQ drops a dead letter that would close such a
    cycle). Of 5 published, 0 1 2 go to "kept"; a sixth then drops 3, which follows
    them (after any that came back would have); "capped" keeps 4 and 5."""
    kept = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue(
            "capped", ["#"], max_length=2, dead_letter="over.capped", dead_letter_dropped=True
        )
        await bus.declare_queue("kept", ["over.#"])
        await bus.subscribe(None, kept, queue="kept", prefetch=1)
        await publish_then_one_more(bus, "job.a", 5, kept, arrived=3, last=3)
        await wait_until(lambda: bus.statistics().dead_lettered >= 4)
        assert bus.statistics().dead_lettered == 4
        left = []
        while True:
            async with bus.get("capped") as msg:
                if msg is None:
                    break
                left.append(msg.payload)
    assert [(m.payload, m.headers["x-fsbus-reason"]) for m in kept.messages] == [
        (str(i).encode(), "maxlen") for i in range(4)
    ]
    assert left == [b"4", b"5"]


def test_deleting_a_queue_bound_to_its_own_dead_letter_topic_sends_its_drops_on(
    root: Path,
) -> None:
    """The spool sent as a queue bound to its own dead-letter topic is deleted reaches the
    other queue bound to that topic once each, in order."""
    with BlockingBus(root) as bus:
        bus.declare_queue(
            "capped", ["#"], max_length=2, dead_letter="dead.capped", dead_letter_dropped=True
        )
        bus.declare_queue("dlq", ["dead.#"])
        for i in range(7):
            bus.publish("job.a", str(i))
        assert bus.delete_queue("capped") == 2
        got = _drain(bus, "dlq")
    assert got == [(str(i).encode(), "maxlen") for i in range(5)]


def test_a_gc_that_deletes_an_unused_queue_sends_what_it_dropped_first(root: Path) -> None:
    """``BlockingBus.gc`` deletes a queue left unused for its ``expires``:
    what the queue had dropped goes to the dead-letter topic first, once each, in
    order, as with ``delete_queue``, rather than going with the queue."""
    with BlockingBus(root) as bus:
        bus.declare_queue(
            "capped",
            ["job.*"],
            max_length=2,
            dead_letter="dead.capped",
            dead_letter_dropped=True,
            expires=0.2,
        )
        bus.declare_queue("dlq", ["dead.#"])
        for i in range(7):
            bus.publish("job.a", str(i))
        deadline = time.monotonic() + 30
        while "capped" in {q.name for q in bus.queues()}:  # unused for 0.2 s, then gone
            assert time.monotonic() < deadline, "gc never deleted the unused queue"
            bus.gc()
            time.sleep(0.05)
        got = _drain(bus, "dlq")
    assert got == [(str(i).encode(), "maxlen") for i in range(5)]


class DropWhileSending(Ops):
    """Runs ``drop`` once, just after the first listing of queue "capped"'s spool has
    read it: what ``drop`` spools comes after the listing, before the queue is gone."""

    def __init__(self, drop: Callable[[], object]) -> None:
        super().__init__()
        self.drop: Callable[[], object] | None = drop

    def listdir(self, path: str) -> list[str]:
        names = super().listdir(path)
        drop, self.drop = self.drop, None
        if drop is not None and path.endswith("/queues/capped/dropped"):
            drop()
        else:
            self.drop = drop
        return names


def test_what_another_process_drops_while_a_queue_is_deleted_is_dead_lettered(
    root: Path,
) -> None:
    """Another publisher overfills the queue (its head dropped into the spool) after
    the deleting process has sent the spool, before the queue is renamed away: that copy
    is dead-lettered too, after the five sent first, not removed with the queue."""
    with BlockingBus(root) as other:
        _overfill_capped(other)  # 0-4 dropped, 5 and 6 in the queue
        ops = DropWhileSending(lambda: other.publish("job.a", "7"))  # drops 5
        with BlockingBus(root, ops=ops) as bus:
            assert bus.delete_queue("capped") == 2
        assert ops.drop is None  # it ran
        got = _drain(other, "dlq")
    assert got == [(str(i).encode(), "maxlen") for i in range(6)]


def test_a_queue_whose_drops_cannot_be_dead_lettered_is_not_deleted(root: Path) -> None:
    """Deleting a queue sends what it dropped first; when that fails (here its
    dead-letter topic leads into a full reject-publish queue), the delete is refused
    with what failed, and the queue and its spool stay: nothing is lost. Once the
    dead letters can go, the delete goes through and sends them, in order."""
    with BlockingBus(root) as bus:
        bus.declare_queue("full", ["dead.capped"], max_length=0, overflow="reject-publish")
        _overfill_capped(bus)
        with pytest.raises(QueueError) as caught:
            bus.delete_queue("capped")
        text = str(caught.value)
        assert "'capped'" in text
        assert "not deleted" in text
        assert "dead.capped" in text
        assert "'full'" in text  # the cause: the full queue that refused them
        info = bus.queue_info("capped")
        assert (info.depth, info.dead_lettering) == (2, 5)
        assert bus.queue_info("dlq").depth == 0

        bus.delete_queue("full")
        assert bus.delete_queue("capped") == 2
        got = _drain(bus, "dlq")
    assert got == [(str(i).encode(), "maxlen") for i in range(5)]


def test_what_is_dropped_while_a_queue_is_deleted_and_cannot_go_is_kept(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another publisher overfills the queue after the deleting process has sent the
    spool, and its dead-letter topic is full by then: the queue is deleted (it is renamed
    away already), and the copy dropped meanwhile is kept in the quarantine, said in an
    error, not removed with the queue."""
    with BlockingBus(root) as other:
        # takes the five sent first, then refuses
        other.declare_queue("full", ["dead.capped"], max_length=5, overflow="reject-publish")
        _overfill_capped(other)  # 0-4 dropped, 5 and 6 in the queue
        ops = DropWhileSending(lambda: other.publish("job.a", "7"))  # drops 5
        with caplog.at_level(logging.ERROR, "fsbus.queues"), BlockingBus(root, ops=ops) as bus:
            assert bus.delete_queue("capped") == 2
        assert ops.drop is None  # it ran
        assert _drain(other, "full") == [(str(i).encode(), "maxlen") for i in range(5)]
    kept = list((root / "fsbus" / "quarantine").glob("*-queue-capped-dropped"))
    assert len(kept) == 1
    assert len(list(kept[0].iterdir())) == 1  # the copy of "5"
    assert not list((root / "fsbus" / "queues").glob(".deleted-*"))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(str(kept[0]) in e and "'capped' was deleted" in e for e in errors), errors
