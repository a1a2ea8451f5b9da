"""Durable queues in one process: declare, bind, route, consume, options, bad input."""

from __future__ import annotations

import errno
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from fsbus import (
    BlockingBus,
    Bus,
    BusConfig,
    InvalidPattern,
    Message,
    QueueFull,
    QueueMismatch,
    QueueNotFound,
    UsageError,
)
from fsbus._bus.ops import Ops
from fsbus._queues import store

from .conftest import WAIT, Inbox, wait_until


@pytest.mark.anyio
async def test_messages_wait_for_a_consumer_that_was_not_running(root: Path) -> None:
    async with Bus(root) as bus:
        info = await bus.declare_queue("billing", ["orders.*"])
        assert (info.name, info.bindings, info.depth, info.consumers) == (
            "billing",
            ("orders.*",),
            0,
            0,
        )
        await bus.publish("orders.before", b"not routed: published before the binding?")
    # Published while no consumer of the queue runs anywhere, multi and single alike.
    async with Bus(root) as bus:
        for i in range(20):
            await bus.publish("orders.new", f"m{i}".encode(), single=i % 2 == 1)
        await bus.publish("invoices.new", b"other topic")
        assert (await bus.queue_info("billing")).depth == 21
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe(None, inbox, queue="billing")
        await inbox.wait_for(21)
        await wait_until(lambda: bus.statistics().acked >= 21)
        info = await bus.queue_info("billing")
        assert info.depth == 0
    got = Counter(inbox.payloads)
    assert set(got.values()) == {1}
    assert {f"m{i}".encode() for i in range(20)} <= set(got)
    assert b"other topic" not in got
    assert all(m.queue == "billing" and m.delivery_count == 1 for m in inbox.messages)
    assert {m.topic for m in inbox.messages} == {"orders.new", "orders.before"}


@pytest.mark.anyio
async def test_each_queue_gets_its_copy_and_plain_delivery_is_unchanged(root: Path) -> None:
    a, b, plain, worker = Inbox(), Inbox(), Inbox(), Inbox()
    async with Bus(root) as bus:
        await bus.declare_queue("a", ["orders.#"])
        await bus.declare_queue("b", ["orders.paid", "orders.*"])  # two bindings, one copy
        await bus.subscribe("orders.#", plain, kind="multi")
        await bus.subscribe("orders.#", worker, kind="single")
        await bus.subscribe(None, a, queue="a")
        await bus.subscribe(None, b, queue="b")
        await bus.publish("orders.paid", b"multi")
        await bus.publish("orders.paid", b"single", single=True)
        await bus.publish("orders.eu.paid", b"deep")
        await a.wait_for(3)
        await b.wait_for(2)
        await plain.wait_for(2)
        await worker.wait_for(1)
        await wait_until(lambda: bus.statistics().acked >= 6)
    assert sorted(a.payloads) == [b"deep", b"multi", b"single"]
    assert sorted(b.payloads) == [b"multi", b"single"]
    assert sorted(plain.payloads) == [b"deep", b"multi"]
    assert worker.payloads == [b"single"]


@pytest.mark.anyio
async def test_consumers_of_one_queue_compete(root: Path) -> None:
    inboxes = [Inbox() for _ in range(3)]
    async with Bus(root) as one, Bus(root) as two:
        await one.declare_queue("work", ["jobs.#"])
        await one.subscribe(None, inboxes[0], queue="work")
        await two.subscribe(None, inboxes[1], queue="work")
        await two.subscribe(None, inboxes[2], queue="work")
        assert (await one.queue_info("work")).consumers == 3
        for i in range(300):
            await one.publish("jobs.run", str(i).encode())
        await wait_until(lambda: sum(len(x.messages) for x in inboxes) >= 300)
        await wait_until(lambda: one.statistics().acked + two.statistics().acked >= 300)
        assert (await one.queue_info("work")).depth == 0
    got = Counter(p for x in inboxes for p in x.payloads)
    assert got == Counter(str(i).encode() for i in range(300))


@pytest.mark.anyio
async def test_a_consumer_leaving_is_not_counted_while_it_settles(root: Path) -> None:
    """Once its unsubscribe has begun, a consumer is no consumer of the queue for its
    own Bus, though its handler still holds a message (and its consumer file: another
    Bus counts it until the message is settled)."""
    held, release = anyio.Event(), anyio.Event()

    async def hold(msg: Message) -> None:
        held.set()
        await release.wait()

    async with Bus(root) as bus, Bus(root) as other:
        await bus.declare_queue("work", ["jobs.#"])
        sub = await bus.subscribe(None, hold, queue="work")
        await bus.publish("jobs.run", b"held")
        with anyio.fail_after(10):
            await held.wait()
        assert (await bus.queue_info("work")).consumers == 1
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.unsubscribe, sub)
            try:
                await wait_until(lambda: sub.closed)
                assert (await bus.queue_info("work")).consumers == 0
                assert [q.consumers for q in await bus.queues()] == [0]
                assert (await other.queue_info("work")).consumers == 1  # its file, held
            finally:
                release.set()
        assert (await other.queue_info("work")).consumers == 0
        assert (await bus.queue_info("work")).depth == 0  # the message was acked


@pytest.mark.anyio
async def test_consumers_subscribing_at_once_share_one_queue_bus(root: Path) -> None:
    """Two consumers of one queue subscribing at the same moment in one Bus: both are
    served, each message once, and the Bus accounts for every delivery (a second,
    unrecorded bus for the queue would compete unseen and its counts would be lost)."""
    first, second = Inbox(), Inbox()
    holding = anyio.Event()

    async def hold_until_the_other_has_one(msg: Message) -> None:
        await first(msg)
        if len(first.messages) == 1:
            holding.set()
            await second.wait_for(1)  # while this one holds its message, the other works

    async with Bus(root) as bus:
        await bus.declare_queue("work", ["jobs.#"])
        subs = []

        async def consume(handler: Callable[[Message], Awaitable[None]]) -> None:
            subs.append(await bus.subscribe(None, handler, queue="work", prefetch=1))

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, hold_until_the_other_has_one)
            tg.start_soon(consume, second)
        assert (await bus.queue_info("work")).consumers == 2
        for i in range(40):
            await bus.publish("jobs.run", str(i).encode())
        await wait_until(lambda: len(first.messages) + len(second.messages) >= 40)
        await wait_until(lambda: bus.statistics().acked >= 40)
        stats = bus.statistics()
        assert (stats.delivered, stats.acked) == (40, 40)
        for sub in subs:
            await bus.unsubscribe(sub)
        assert (await bus.queue_info("work")).consumers == 0
    got = Counter(first.payloads + second.payloads)
    assert got == Counter(str(i).encode() for i in range(40))
    assert first.messages
    assert second.messages


@pytest.mark.anyio
async def test_bindings_change_while_messages_flow(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.declare_queue("q", ["a.*"])
        await bus.publish("a.1", b"a1")
        await bus.publish("b.1", b"b1-unbound")
        await bus.bind_queue("q", "b.*")
        await bus.bind_queue("q", "b.*")  # safe to repeat
        await bus.publish("b.1", b"b1")
        await bus.unbind_queue("q", "a.*")
        await bus.publish("a.1", b"a1-unbound")
        await bus.publish("b.2", b"b2")
        assert (await bus.queue_info("q")).bindings == ("b.*",)
        # A pattern given with queue= is a bind, safe to repeat.
        await bus.subscribe("c.#", inbox, queue="q")
        await bus.publish("c.x.y", b"c")
        await inbox.wait_for(4)
        assert (await bus.queue_info("q")).bindings == ("b.*", "c.#")
    assert sorted(inbox.payloads) == [b"a1", b"b1", b"b2", b"c"]


@pytest.mark.anyio
async def test_a_binding_made_in_another_process_routes_the_next_publish(root: Path) -> None:
    async with Bus(root) as publisher, Bus(root) as admin:
        await publisher.publish("x.1", b"warm the routing cache")
        for i in range(20):
            await admin.declare_queue(f"q{i}", [f"x.{i}"])
            await publisher.publish(f"x.{i}", b"routed")
            assert (await admin.queue_info(f"q{i}")).depth == 1


@pytest.mark.anyio
async def test_message_ttl_expires_waiting_messages(root: Path, fast: BusConfig) -> None:
    # no consumer takes anything before the expiries: each queue's depth shows what
    # expired, however slowly this machine runs
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("short", ["t.#"], message_ttl=1.0)
        await bus.declare_queue("long", ["t.#"])
        await bus.publish("t.1", b"x")
        await bus.publish("t.2", b"own ttl", ttl=0.3)

        async def depth_reaches(queue: str, depth: int) -> None:
            with anyio.fail_after(20):
                while (await bus.queue_info(queue)).depth != depth:  # noqa: ASYNC110
                    await anyio.sleep(0.05)  # (files: polled)

        await depth_reaches("long", 1)  # t.2's own TTL, in a queue with none
        await depth_reaches("short", 0)  # the queue's TTL, for t.1 too
        kept = Inbox()
        await bus.subscribe(None, kept, queue="long")
        await kept.wait_for(1)
        assert kept.payloads == [b"x"]
        late = Inbox()
        await bus.subscribe(None, late, queue="short")
        await bus.publish("t.3", b"fresh")
        await late.wait_for(1)
        await kept.wait_for(2)
    assert kept.payloads == [b"x", b"fresh"]
    assert late.payloads == [b"fresh"]


@pytest.mark.anyio
async def test_max_length_drop_head_keeps_the_newest(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.declare_queue("recent", ["m.#"], max_length=5)
        for i in range(200):  # many within one millisecond: the sequence orders them
            await bus.publish("m.x", str(i).encode())
        assert (await bus.queue_info("recent")).depth == 5
        inbox = Inbox()
        await bus.subscribe(None, inbox, queue="recent")
        await inbox.wait_for(5)
    assert sorted(int(p) for p in inbox.payloads) == [195, 196, 197, 198, 199]


def test_max_length_drop_head_of_a_deep_queue_goes_at_most_a_32nd_over(root: Path) -> None:
    # Counting a deep queue at every publish would make each publish cost the whole
    # queue: a queue of max_length 320 is counted once per 10 copies (or 0.1 s), and
    # trimmed back to 320 when a count finds it over.
    with BlockingBus(root) as bus:
        bus.declare_queue("recent", ["m.#"], max_length=320)
        for i in range(1000):
            bus.publish("m.x", str(i).encode())
        depth = len(list(bus.browse(queue="recent")))  # browsing does not trim
        assert 320 <= depth <= 330
        assert bus.queue_info("recent").depth == 320  # the depth read is trimmed first
        assert len(list(bus.browse(queue="recent"))) == 320
    with BlockingBus(root) as bus:  # a new process counts (and trims) at its first publish
        bus.publish("m.x", b"1000")
        assert len(list(bus.browse(queue="recent"))) == 320
        with bus.messages(queue="recent", prefetch=64) as it:
            got = [int(it.get(timeout=30).payload) for _ in range(320)]
    assert sorted(got) == list(range(681, 1001))


def test_queue_info_of_a_drop_head_queue_it_cannot_trim_counts_as_it_is(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An observer that may not remove files (here: every truncate and unlink refused at
    # the I/O seam) still gets the depth, untrimmed, instead of an error.
    monkeypatch.setattr(store, "RECOUNT", 3600.0)  # no count by age during the test

    class ReadOnly(Ops):
        def ftruncate(self, fd: int, length: int) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

        def unlink(self, path: str) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

    with BlockingBus(root) as bus:
        bus.declare_queue("recent", ["m.#"], max_length=64)  # trimmed beyond 66
        for i in range(66):
            bus.publish("m.x", str(i).encode())
        assert len(list(bus.browse(queue="recent"))) == 66
    with BlockingBus(root, ops=ReadOnly()) as observer:
        assert observer.queue_info("recent").depth == 66
    with BlockingBus(root) as bus:
        assert bus.queue_info("recent").depth == 64


@pytest.mark.anyio
async def test_max_length_reject_publish_refuses_and_publishes_nothing(root: Path) -> None:
    plain = Inbox()
    async with Bus(root) as bus:
        await bus.declare_queue("bounded", ["m.#"], max_length=3, overflow="reject-publish")
        await bus.subscribe("m.#", plain)
        for i in range(3):
            await bus.publish("m.x", str(i).encode())
        with pytest.raises(QueueFull, match=r"bounded.*reject-publish"):
            await bus.publish("m.x", b"refused")
        await bus.publish("other", b"unrelated topics still flow")
        await plain.wait_for(3)
        assert (await bus.queue_info("bounded")).depth == 3
        inbox = Inbox()
        await bus.subscribe(None, inbox, queue="bounded")
        await inbox.wait_for(3)
        await wait_until(lambda: bus.statistics().acked >= 3)
        await bus.publish("m.x", b"room again")
        await inbox.wait_for(4)
    assert b"refused" not in inbox.payloads + plain.payloads
    assert inbox.payloads[-1] == b"room again"


@pytest.mark.anyio
async def test_dead_letter_after_max_deliveries(root: Path, fast: BusConfig) -> None:
    dead = Inbox()
    failing = Inbox(fail=lambda m: m.payload == b"poison")
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("dlq", ["dead.#"])
        await bus.declare_queue("work", ["jobs.#"], max_deliveries=3, dead_letter="dead.work")
        await bus.subscribe(None, failing, queue="work")
        await bus.publish("jobs.a", b"ok")
        await bus.publish("jobs.a", b"poison", headers={"k": "v"})
        await bus.subscribe(None, dead, queue="dlq")
        (msg,) = await dead.wait_for(1)
        await wait_until(lambda: bus.statistics().dead_lettered == 1)
        # The handler returns once the dead letter is out; the ack follows it (and the
        # ack of "ok" may still be on its way): wait for both before looking at depth.
        await wait_until(lambda: bus.statistics().acked >= 2)
        assert (await bus.queue_info("work")).depth == 0
    attempts = [m.delivery_count for m in failing.messages if m.payload == b"poison"]
    assert attempts == [1, 2, 3]
    assert failing.payloads.count(b"ok") == 1
    assert msg.payload == b"poison"
    assert msg.topic == "dead.work"
    assert msg.headers["k"] == "v"
    assert msg.headers["x-fsbus-queue"] == "work"
    assert msg.headers["x-fsbus-topic"] == "jobs.a"


@pytest.mark.anyio
async def test_an_iterators_release_counts_toward_max_deliveries(
    root: Path, fast: BusConfig
) -> None:
    """``release`` on a queue's message iterator is a failed delivery, as a handler's
    raise is: after ``max_deliveries`` of them the message is dead-lettered, not
    delivered again."""
    dead = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("dlq", ["dead.#"])
        await bus.declare_queue("work", ["jobs.#"], max_deliveries=2, dead_letter="dead.work")
        await bus.subscribe(None, dead, queue="dlq")
        await bus.publish("jobs.a", b"poison")
        counts = []
        async with bus.messages(queue="work") as it:
            for _ in range(2):
                msg = await it.receive(timeout=10)
                counts.append(msg.delivery_count)
                await it.release(msg)
            (gone,) = await dead.wait_for(1)
            with pytest.raises(TimeoutError):
                await it.receive(timeout=0.5)  # dead-lettered: not delivered a third time
    assert counts == [1, 2]
    assert gone.payload == b"poison"
    assert gone.headers["x-fsbus-queue"] == "work"


@pytest.mark.anyio
async def test_auto_delete_when_the_last_consumer_leaves(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.declare_queue("temp", ["t.#"], auto_delete=True)
        s1 = await bus.subscribe(None, Inbox(), queue="temp")
        s2 = await bus.subscribe(None, Inbox(), queue="temp")
        await bus.unsubscribe(s1)
        assert (await bus.queue_info("temp")).consumers == 1
        await bus.unsubscribe(s2)
        with pytest.raises(QueueNotFound):
            await bus.queue_info("temp")
        assert [q.name for q in await bus.queues()] == []
        await bus.publish("t.x", b"no queue any more")


@pytest.mark.anyio
async def test_copies_expiring_unconsumed_warn_of_their_queue(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A copy that expires before a consumer of its queue took it is warned of, naming
    the queue and what sets a copy's life (its publish's ttl, capped by the queue's
    message_ttl), not the bus's single_ttl, which a queue's copies do not take."""
    config = BusConfig(poll_interval=0.05, refresh_ttl=0.2)  # (expiries found soon)
    async with Bus(root, config=config) as bus:
        await bus.declare_queue("slow", ["t.#"])
        await bus.publish("t.first", b"held")
        started, release = anyio.Event(), anyio.Event()

        async def busy(msg: Message) -> None:
            started.set()
            await release.wait()

        with caplog.at_level(logging.WARNING, logger="fsbus.bus"):
            await bus.subscribe(None, busy, queue="slow", prefetch=1)
            with anyio.fail_after(WAIT):
                await started.wait()
            await bus.publish("t.late", b"short", ttl=0.2)

            def warned() -> list[str]:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if r.levelno == logging.WARNING and "expired before" in r.getMessage()
                ]

            await wait_until(lambda: bool(warned()))
            release.set()
    assert warned() == [
        "1 message(s) of queue 'slow' expired before any consumer took them (e.g. "
        "'t.late'); add consumers, or publish with a longer ttl (the queue's message_ttl "
        "caps it)"
    ]


@pytest.mark.anyio
async def test_expires_deletes_an_unused_queue(root: Path, fast: BusConfig) -> None:
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("idle", ["i.#"], expires=0.5)
        await bus.declare_queue("kept", ["i.#"])
        await bus.publish("i.x", b"waiting")
        with anyio.fail_after(20):
            while "idle" in [q.name for q in await bus.queues()]:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert [q.name for q in await bus.queues()] == ["kept"]
        assert not (root / "fsbus" / "queues" / "idle").exists()


@pytest.mark.anyio
async def test_purge_and_delete_count_messages(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.declare_queue("q", ["p.#"])
        for _ in range(7):
            await bus.publish("p.x", b"m")
        assert await bus.purge_queue("q") == 7
        assert (await bus.queue_info("q")).depth == 0
        for _ in range(4):
            await bus.publish("p.x", b"m")
        with pytest.raises(QueueMismatch, match="if_empty"):
            await bus.delete_queue("q", if_empty=True)
        assert await bus.delete_queue("q") == 4
        with pytest.raises(QueueNotFound, match="declare it first"):
            await bus.queue_info("q")


@pytest.mark.anyio
async def test_priority_and_messages_iterator(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.declare_queue("prio", ["j.#"])
        for p in (5, 1, 9, 0):
            await bus.publish("j.x", str(p).encode(), single=True, priority=p)
        got = []
        async with bus.messages(queue="prio") as it:
            async for msg in it:
                got.append(int(msg.payload))
                await it.ack(msg)
                if len(got) == 4:
                    break
        assert got == [0, 1, 5, 9]
        assert (await bus.queue_info("prio")).depth == 0


def test_the_blocking_face(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("b", ["x.#"], max_length=10)
        for i in range(3):
            bus.publish("x.y", str(i).encode())
        assert bus.queue_info("b").depth == 3
        assert [q.name for q in bus.queues()] == ["b"]
        got = []
        with bus.messages(queue="b") as it:
            for _ in range(3):
                msg = it.get(timeout=10)
                assert msg.queue == "b"
                got.append(msg.payload)
                it.ack(msg)
        assert sorted(got) == [b"0", b"1", b"2"]
        bus.enqueue("b", "direct.topic", b"straight in")
        assert bus.purge_queue("b") == 1
        assert bus.delete_queue("b") == 0


# ------------------------------------------------------------------ bad input
@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "must not be empty"),
        ("a/b", "invalid queue name"),
        ("..", "invalid queue name"),
        ("-x", "invalid queue name"),
        ("x" * 201, "at most 200"),
        (7, "must be a str"),
    ],
)
async def test_an_invalid_queue_name_is_refused(root: Path, name: object, why: str) -> None:
    async with Bus(root) as bus:
        with pytest.raises(UsageError, match=why):
            await bus.declare_queue(name, ["a"])  # type: ignore[arg-type]
        with pytest.raises(UsageError, match=why):
            await bus.subscribe(None, Inbox(), queue=name)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_bad_options_and_patterns_are_refused(root: Path) -> None:
    async with Bus(root) as bus:
        with pytest.raises(UsageError, match="max_length must be an int of 0 or more"):
            await bus.declare_queue("q", ["a"], max_length=-1)
        with pytest.raises(UsageError, match="overflow must be one of"):
            await bus.declare_queue("q", ["a"], overflow="reject")
        with pytest.raises(UsageError, match="message_ttl"):
            await bus.declare_queue("q", ["a"], message_ttl=-1)
        with pytest.raises(InvalidPattern, match="control character"):
            await bus.declare_queue("q", ["a.\x00"])
        with pytest.raises(UsageError, match="give a pattern, or queue="):
            await bus.subscribe(None, Inbox())
        assert await bus.queues() == []


@pytest.mark.anyio
async def test_declaring_again_with_other_options_is_refused(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.declare_queue("q", ["a"], max_length=10)
        again = await bus.declare_queue("q", ["b"], max_length=10)  # same options: adds b
        assert again.bindings == ("a", "b")
        with pytest.raises(
            QueueMismatch, match=r"max_length: asked None, the queue has 10.*delete it first"
        ):
            await bus.declare_queue("q", ["a"])
        assert (await bus.queue_info("q")).options.max_length == 10


@pytest.mark.anyio
async def test_consuming_a_missing_queue_says_how_to_declare_it(root: Path) -> None:
    async with Bus(root) as bus:
        with pytest.raises(QueueNotFound, match=r"no queue named 'nope'.*declare_queue"):
            await bus.subscribe(None, Inbox(), queue="nope")
        with pytest.raises(QueueNotFound):
            async with bus.messages(queue="nope"):
                pass
        with pytest.raises(QueueNotFound):
            await bus.bind_queue("nope", "a.b")
        with pytest.raises(QueueNotFound):
            await bus.enqueue("nope", "a.b", b"x")


@pytest.mark.anyio
async def test_a_corrupt_definition_is_quarantined_and_the_bus_runs_on(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.declare_queue("good", ["x.#"])
        await bus.declare_queue("bad", ["x.#"])
        await bus.publish("x.1", b"before")
    definition = root / "fsbus" / "queues" / "bad" / "queue.json"
    definition.write_bytes(b'{"format": 1, "name": "bad", "opt')
    caplog.set_level(logging.WARNING, logger="fsbus")
    async with Bus(root) as bus:
        await bus.publish("x.2", b"after")
        assert [q.name for q in await bus.queues()] == ["good"]
        await bus.subscribe(None, inbox, queue="good")
        await inbox.wait_for(2)
        with pytest.raises(QueueNotFound):
            await bus.subscribe(None, Inbox(), queue="bad")
        # Declaring it again brings it back with its waiting message.
        await bus.declare_queue("bad", ["x.#"])
        assert (await bus.queue_info("bad")).depth == 1
    moved = list((root / "fsbus" / "quarantine").glob("*queue-bad.json"))
    assert len(moved) == 1
    assert moved[0].read_bytes().startswith(b'{"format": 1')
    warnings = [r.getMessage() for r in caplog.records if "corrupt definition" in r.getMessage()]
    assert len(warnings) == 1
    assert "declare the queue again" in warnings[0]


@pytest.mark.anyio
async def test_foreign_files_in_the_queues_folder_are_ignored(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.declare_queue("q", ["x"])
    queues = root / "fsbus" / "queues"
    (queues / "stray.txt").write_text("not a queue")
    (queues / "empty-dir").mkdir()
    (queues / "other").mkdir()
    (queues / "other" / "queue.json").write_text(json.dumps({"format": 99}))
    async with Bus(root) as bus:
        assert [q.name for q in await bus.queues()] == ["q"]
        await bus.publish("x", b"still routed")
        assert (await bus.queue_info("q")).depth == 1
    assert (queues / "stray.txt").read_text() == "not a queue"


@pytest.mark.anyio
async def test_unsubscribing_while_a_handler_runs_lets_it_finish(root: Path) -> None:
    """The queue's bus closes with its last consumer: not before the running handler's
    message is settled (else it would be given back and delivered again)."""
    started, finish = anyio.Event(), anyio.Event()
    seen: list[int] = []

    async def slow(msg: Message) -> None:
        seen.append(msg.delivery_count)
        started.set()
        await finish.wait()

    async with Bus(root) as bus:
        await bus.declare_queue("q", ["x"])
        await bus.publish("x", b"once")
        sub = await bus.subscribe(None, slow, queue="q")
        with anyio.fail_after(10):
            await started.wait()
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.unsubscribe, sub)
            await anyio.lowlevel.checkpoint()
            finish.set()
        assert (await bus.queue_info("q")).depth == 0
        again = Inbox()
        await bus.subscribe(None, again, queue="q")
        await bus.publish("x", b"next")
        await again.wait_for(1)
    assert seen == [1]
    assert again.payloads == [b"next"]


def test_leaving_an_iterator_with_messages_it_holds_gives_them_back(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["x"])
        for i in range(3):
            bus.publish("x", str(i).encode())
        with bus.messages(queue="q", prefetch=3) as it:
            first = it.get(timeout=10)
            it.ack(first)
            # the other two are claimed for it (prefetch) and not taken: leaving must
            # give them back, not wait for them
        assert bus.queue_info("q").depth == 2
        with bus.messages(queue="q") as it:
            rest = [it.get(timeout=10).payload for _ in range(2)]
    assert sorted([first.payload, *rest]) == [b"0", b"1", b"2"]


def test_a_copy_without_a_ttl_waits_for_good(root: Path) -> None:
    import time

    with BlockingBus(root) as bus:
        bus.declare_queue("keep", ["k"])
        bus.declare_queue("short", ["k"], message_ttl=60)
        bus.publish("k", b"no ttl")
        bus.publish("k", b"ttl", ttl=30)
        year = 365 * 24 * 3600
        kept = sorted(m.expires - time.time() for m in bus.browse(queue="keep"))
        assert kept[0] < 31
        assert kept[1] > 50 * year
        assert all(m.expires - time.time() <= 61 for m in bus.browse(queue="short"))


@pytest.mark.anyio
async def test_gets_keep_an_expires_queue_in_use(root: Path, fast: BusConfig) -> None:
    """A queue polled with ``get`` (and no consumer) is in use, as RabbitMQ counts a
    basic.get for ``x-expires``: it is kept for as long as the gets come, then expires
    (it was deleted ``expires`` after its declare, under the poller)."""
    async with Bus(root, config=fast) as bus:
        await bus.declare_queue("polled", ["p.#"], expires=1.0)
        started = time.monotonic()
        while time.monotonic() - started < 3.0:  # three times expires, a get each 0.2 s
            async with bus.get("polled") as msg:
                assert msg is None
            await anyio.sleep(0.2)
        with anyio.fail_after(20):
            while "polled" in [q.name for q in await bus.queues()]:  # noqa: ASYNC110
                await anyio.sleep(0.05)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "extra", [{"existing": True}, {"kind": "multi"}, {"kind": "bogus"}], ids=str
)
async def test_options_of_plain_subscriptions_are_refused_with_a_queue(
    root: Path, extra: dict[str, object]
) -> None:
    """``existing=`` and ``kind=`` say nothing to a queue's consumer: given with
    ``queue=``, they are a UsageError naming them (they were accepted and ignored)."""
    async with Bus(root) as bus:
        await bus.declare_queue("q", ["t.#"])
        with pytest.raises(UsageError, match="existing= and kind= do not apply"):
            await bus.subscribe(None, Inbox(), queue="q", **extra)  # type: ignore[arg-type]
        assert (await bus.queue_info("q")).consumers == 0
        sub = await bus.subscribe(None, Inbox(), queue="q", kind="single")  # what it is
        assert (await bus.queue_info("q")).consumers == 1
        await sub.aclose()


@pytest.mark.anyio
async def test_a_payload_that_is_not_bytes_or_text_is_refused(root: Path) -> None:
    """An int (or any other object) as a payload is a UsageError saying what to do, on
    every way in: ``enqueue`` wrote ``bytes(5)``, five NUL bytes (``10**9``: a 1 GB
    message), and ``publish`` into a queue said the payload file gave text."""
    async with Bus(root) as bus:
        await bus.declare_queue("a", ["t"])
        for call in (
            lambda: bus.enqueue("a", "t", 5),  # type: ignore[arg-type]
            lambda: bus.publish("t", 5),  # type: ignore[arg-type]
            lambda: bus.publish_many([("t", 5)]),  # type: ignore[list-item]
        ):
            with pytest.raises(UsageError, match="payload"):
                await call()

        def blocking() -> None:
            with BlockingBus(root) as b:
                for bad in (5, 10**9, 1.5):
                    with pytest.raises(UsageError, match=r"a payload is bytes or str, not"):
                        b.enqueue("a", "t", bad)  # type: ignore[arg-type]
                    with pytest.raises(UsageError, match=r"a payload is bytes or str, not"):
                        b.publish("t", bad)  # type: ignore[arg-type]

        await anyio.to_thread.run_sync(blocking)
        assert (await bus.queue_info("a")).depth == 0
