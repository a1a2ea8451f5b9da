"""Single (work-queue) messages: one consumer, ack, release, retry, dead letter, priority."""

from __future__ import annotations

import errno
from collections import Counter
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, Message

from .conftest import WAIT, FailingOps, Inbox, files_under, is_flocked, message_files, wait_until


def sidecars(root: Path) -> list[str]:
    """Every topic spill, headers and attempts file left on the bus."""
    return [
        *files_under(root / "topics"),
        *files_under(root / "fsbus" / "meta"),
        *files_under(root / "fsbus" / "attempts"),
    ]


@pytest.mark.anyio
async def test_each_single_reaches_exactly_one_handler(root: Path, fast: BusConfig) -> None:
    a, b, c = Inbox(), Inbox(), Inbox()
    async with Bus(root, config=fast) as one, Bus(root, config=fast) as two:
        await one.subscribe("jobs.*", a)
        await one.subscribe("jobs.#", b)
        await two.subscribe("#", c)
        sent = [f"job-{i}".encode() for i in range(60)]
        for p in sent:
            await one.publish("jobs.run", p, single=True)
        await wait_until(lambda: len(a.messages) + len(b.messages) + len(c.messages) >= 60)
        await wait_until(lambda: message_files(root) == [])
        # The barrier: a last job is taken only after everything before it was seen.
        await two.publish("jobs.last", b"last", single=True)
        await wait_until(lambda: message_files(root) == [])
    got = Counter(m.payload for box in (a, b, c) for m in box.messages if m.topic == "jobs.run")
    assert sorted(got) == sorted(sent)
    assert set(got.values()) == {1}
    assert all(m.single and m.delivery_count == 1 for box in (a, b, c) for m in box.messages)
    assert sidecars(root) == []


@pytest.mark.anyio
async def test_ack_removes_the_file_and_its_sidecars(root: Path, fast: BusConfig) -> None:
    inbox = Inbox()
    topic = "work." + "long" * 40  # spills into topics/
    async with Bus(root, config=fast) as bus:
        info = await bus.publish(topic, b"payload", single=True, headers={"k": "v"})
        assert (root / "topics" / info.bucket / info.name).exists()
        assert (root / "fsbus" / "meta" / info.bucket / info.name).exists()
        await bus.subscribe("work.*", inbox)
        (msg,) = await inbox.wait_for(1)
        # The counter moves once the ack is done (files first, then the count).
        await wait_until(lambda: bus.statistics().acked == 1)
        stats = bus.statistics()
    assert msg.topic == topic
    assert msg.headers == {"k": "v"}
    assert stats.acked == 1
    assert stats.delivered == 1
    assert message_files(root) == []
    assert sidecars(root) == []


@pytest.mark.anyio
async def test_a_failing_handler_releases_and_the_message_comes_back(
    root: Path, fast: BusConfig
) -> None:
    seen: list[Message] = []
    done = anyio.Event()

    async def flaky(msg: Message) -> None:
        seen.append(msg)
        if len(seen) == 1:
            raise RuntimeError("transient failure")
        done.set()

    async with Bus(root, config=fast) as bus:
        await bus.subscribe("retry.me", flaky)
        info = await bus.publish("retry.me", b"again", single=True)
        with anyio.fail_after(WAIT):
            await done.wait()
        await wait_until(lambda: bus.statistics().acked == 1)
        stats = bus.statistics()
    assert [m.delivery_count for m in seen] == [1, 2]
    assert [m.name for m in seen] == [info.name, info.name]
    assert [m.payload for m in seen] == [b"again", b"again"]
    assert stats.failed == 1
    assert stats.released == 1
    assert stats.acked == 1
    assert sidecars(root) == []  # the attempts counter went with the message


@pytest.mark.anyio
async def test_failures_are_counted_on_disk(root: Path, fast: BusConfig) -> None:
    first_failed = anyio.Event()
    hold = anyio.Event()
    calls: list[int] = []

    async def handler(msg: Message) -> None:
        calls.append(msg.delivery_count)
        if len(calls) == 1:
            first_failed.set()
            raise RuntimeError("fail once")
        await hold.wait()

    async with Bus(root, config=fast) as bus:
        info = await bus.publish("count.me", b"x", single=True)
        await bus.subscribe("count.me", handler)
        with anyio.fail_after(WAIT):
            await first_failed.wait()
        await wait_until(lambda: len(calls) == 2)
        # The count is the message file's leading byte (qlobber-fsq reads from byte 1):
        # no counter file per delivery.
        assert (root / "messages" / info.bucket / info.name).read_bytes() == b"\x01x"
        assert not (root / "fsbus" / "attempts" / info.bucket / info.name).exists()
        assert is_flocked(info.path)  # the second delivery holds the lock
        hold.set()
        await wait_until(lambda: not (root / "messages" / info.bucket / info.name).exists())
    assert calls == [1, 2]


@pytest.mark.anyio
async def test_a_counter_file_is_still_read_and_taken_over(root: Path, fast: BusConfig) -> None:
    """A count kept in fsbus/attempts/ (older fsbus, or past 255 deliveries) counts."""
    seen = Inbox()
    async with Bus(root, config=fast) as bus:
        info = await bus.publish("count.old", b"y", single=True)
        attempts = root / "fsbus" / "attempts" / info.bucket / info.name
        attempts.parent.mkdir(exist_ok=True)  # (made on first use)
        attempts.write_text("300")
        await bus.subscribe("count.old", seen)
        await seen.wait_for(1)
        message = root / "messages" / info.bucket / info.name
        await wait_until(lambda: not message.exists() and not attempts.exists())
    assert seen.messages[0].delivery_count == 301


@pytest.mark.anyio
async def test_dead_letter_after_max_deliveries(root: Path) -> None:
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05, max_deliveries=3)
    counts: list[int] = []
    dead = Inbox()

    async def always_fails(msg: Message) -> None:
        counts.append(msg.delivery_count)
        raise ValueError("cannot process order 7")

    async with Bus(root, config=cfg) as bus:
        await bus.subscribe("orders.#", always_fails)
        await bus.subscribe("dead-letter.#", dead)
        original = await bus.publish(
            "orders.new", b"order 7", single=True, headers={"id": "7"}, priority=3
        )
        (msg,) = await dead.wait_for(1)
        await wait_until(lambda: message_files(root) == [])
        stats = bus.statistics()
    assert counts == [1, 2, 3]
    assert msg.topic == "dead-letter.orders.new"
    assert msg.single
    assert msg.payload == b"order 7"
    assert msg.priority == 3
    assert msg.headers["x-original-topic"] == "orders.new"
    assert msg.headers["x-deliveries"] == "3"
    assert "ValueError: cannot process order 7" in msg.headers["x-death-reason"]
    assert msg.headers["id"] == "7"
    assert msg.name != original.name
    assert stats.dead_lettered == 1
    assert sidecars(root) == []


@pytest.mark.anyio
async def test_dead_letter_prefix_is_configurable(root: Path) -> None:
    cfg = BusConfig(
        poll_interval=0.05, retry_interval=0.05, max_deliveries=1, dead_letter_prefix="dlq"
    )
    dead = Inbox()

    async def fails(msg: Message) -> None:
        raise RuntimeError("no")

    async with Bus(root, config=cfg) as bus:
        await bus.subscribe("a.b", fails)
        await bus.subscribe("dlq.#", dead)
        await bus.publish("a.b", b"1", single=True)
        (msg,) = await dead.wait_for(1)
    assert msg.topic == "dlq.a.b"
    assert msg.headers["x-original-topic"] == "a.b"


@pytest.mark.anyio
async def test_shutdown_releases_without_counting_and_leaves_no_lock(
    root: Path, fast: BusConfig
) -> None:
    started = anyio.Event()

    async def stuck(msg: Message) -> None:
        started.set()
        await anyio.sleep_forever()

    async with Bus(root, config=fast) as bus:
        await bus.subscribe("slow", stuck)
        info = await bus.publish("slow", b"unfinished", single=True)
        with anyio.fail_after(WAIT):
            await started.wait()
        assert is_flocked(info.path)
        assert bus.statistics().in_flight == 1
    stats = bus.statistics()
    assert stats.released == 1
    assert stats.failed == 0
    assert stats.acked == 0
    assert message_files(root) == [f"{info.bucket}/{info.name}"]
    assert not is_flocked(info.path)
    assert (root / "messages" / info.bucket / info.name).read_bytes() == b"\x00unfinished"
    assert not (root / "fsbus" / "attempts" / info.bucket / info.name).exists()

    # The next consumer gets it as a first delivery.
    inbox = Inbox()
    async with Bus(root, config=fast) as bus:
        await bus.subscribe("slow", inbox)
        (msg,) = await inbox.wait_for(1)
        await wait_until(lambda: message_files(root) == [])
    assert msg.delivery_count == 1
    assert msg.payload == b"unfinished"


@pytest.mark.parametrize("order_by_expiry", [False, True])
@pytest.mark.anyio
async def test_a_backlog_is_taken_lowest_priority_first(root: Path, order_by_expiry: bool) -> None:
    cfg = BusConfig(handler_concurrency=1, order_by_expiry=order_by_expiry, poll_interval=0.05)
    priorities = [200, 10, 100, 50, 0, 255, 10, 77]
    inbox = Inbox()
    async with Bus(root, config=cfg) as bus:
        for i, p in enumerate(priorities):
            await bus.publish("q", f"{p}:{i}".encode(), single=True, priority=p)
        await bus.subscribe("q", inbox)
        await inbox.wait_for(len(priorities))
    got = [m.priority for m in inbox.messages]
    assert got == sorted(priorities)
    # Equal priorities go in publish order.
    tens = [m.payload for m in inbox.messages if m.priority == 10]
    assert tens == [b"10:1", b"10:6"]


@pytest.mark.anyio
async def test_default_priority_comes_from_the_config(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root, config=BusConfig(default_priority=42)) as bus:
        await bus.subscribe("#", inbox)
        await bus.publish("d", b"1", single=True)
        (msg,) = await inbox.wait_for(1)
    assert msg.priority == 42


@pytest.mark.anyio
async def test_singles_without_a_subscriber_are_left_alone(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("mine.#", inbox)
        theirs = await bus.publish("theirs.job", b"t", single=True)
        await bus.publish("mine.job", b"m", single=True)
        await inbox.wait_for(1)
    assert inbox.topics == ["mine.job"]
    assert message_files(root) == [f"{theirs.bucket}/{theirs.name}"]
    assert not is_flocked(theirs.path)


@pytest.mark.anyio
async def test_singles_published_while_subscribed_are_taken(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("live", inbox)
        for i in range(20):
            await bus.publish("live", str(i), single=True)
        await inbox.wait_for(20)
        await wait_until(lambda: message_files(root) == [])
    assert sorted(int(p) for p in inbox.payloads) == list(range(20))


@pytest.mark.parametrize(
    "topic",
    ["t" * 1020, ".".join(["w"] * 100)],
    ids=["1020-bytes", "100-words"],
)
@pytest.mark.anyio
async def test_dead_letter_of_a_topic_at_the_limits(root: Path, topic: str) -> None:
    # "dead-letter." + topic breaks the topic limits: it goes to the bare prefix.
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05, max_deliveries=1)
    dead = Inbox()

    async def fails(msg: Message) -> None:
        raise RuntimeError("no")

    async with Bus(root, config=cfg) as bus:
        await bus.subscribe(topic, fails)
        await bus.subscribe("dead-letter", dead)
        await bus.publish(topic, b"limit", single=True)
        (msg,) = await dead.wait_for(1)
    assert msg.headers["x-original-topic"] == topic
    assert msg.payload == b"limit"


@pytest.mark.anyio
async def test_dead_letter_with_headers_at_the_size_limit(root: Path) -> None:
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05, max_deliveries=1)
    dead = Inbox()
    big = {"blob": "b" * (64 * 1024 - 40)}

    async def fails(msg: Message) -> None:
        raise RuntimeError("x" * 400)

    async with Bus(root, config=cfg) as bus:
        await bus.subscribe("jobs", fails)
        await bus.subscribe("dead-letter.#", dead)
        await bus.publish("jobs", b"heavy", single=True, headers=big)
        (msg,) = await dead.wait_for(1)
        await wait_until(lambda: bus.statistics().dead_lettered == 1)
        await bus.publish("jobs.after", b"bus still runs")
    assert msg.payload == b"heavy"
    assert msg.headers["x-original-topic"] == "jobs"


@pytest.mark.anyio
async def test_a_failing_catch_all_does_not_dead_letter_a_dead_letter(root: Path) -> None:
    # A "#" handler that always fails also gets the dead-letter copy: that copy is
    # retried (until it expires), never moved to "dead-letter.dead-letter....".
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05, max_deliveries=2)
    seen: list[tuple[str, int]] = []

    async def always_fails(msg: Message) -> None:
        seen.append((msg.topic, msg.delivery_count))
        raise RuntimeError("poison")

    async with Bus(root, config=cfg) as bus:
        await bus.subscribe("#", always_fails)
        await bus.publish("jobs.poison", b"p", single=True)
        await wait_until(lambda: ("dead-letter.jobs.poison", 4) in seen)
        stats = bus.statistics()
        topics = {info.topic async for info in bus.browse()}
    assert stats.dead_lettered == 1
    assert topics == {"dead-letter.jobs.poison"}
    assert {t for t, _ in seen} == {"jobs.poison", "dead-letter.jobs.poison"}


@pytest.mark.anyio
async def test_a_dead_letter_that_cannot_be_written_is_retried_not_lost(root: Path) -> None:
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05, max_deliveries=1)
    ops = FailingOps("open", errno.ENOSPC)
    dead = Inbox()
    failures: list[int] = []

    async def fails(msg: Message) -> None:
        failures.append(msg.delivery_count)
        # the disk is full when the dead letter is written (armed here, not after the
        # publish: on a busy machine the first failure came before the test armed it)
        if len(failures) == 1:
            ops.armed = True
        raise RuntimeError("no")

    async with Bus(root, config=cfg, ops=ops) as bus:
        await bus.subscribe("jobs", fails)
        await bus.subscribe("dead-letter.#", dead)
        info = await bus.publish("jobs", b"keep me", single=True)
        await wait_until(lambda: len(failures) >= 3)
        assert await anyio.Path(info.path).exists()  # never lost meanwhile
        ops.armed = False
        (msg,) = await dead.wait_for(1)
        await wait_until(lambda: bus.statistics().dead_lettered == 1)
    assert msg.payload == b"keep me"


@pytest.mark.anyio
async def test_subscription_kinds(root: Path) -> None:
    observer, worker, anything = Inbox(), Inbox(), Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("k.#", observer, kind="multi")
        await bus.subscribe("k.#", worker, kind="single")
        await bus.publish("k.m", b"multi")
        await bus.publish("k.s", b"single", single=True)
        await observer.wait_for(1)
        await worker.wait_for(1)
        await wait_until(lambda: bus.statistics().acked == 1)
        await bus.subscribe("k.#", anything, kind="any")
        await bus.publish("k.m2", b"multi2")
        await anything.wait_for(1)
        await observer.wait_for(2)
        with pytest.raises(ValueError, match="kind must be one of"):
            await bus.subscribe("k", anything, kind="both")  # type: ignore[arg-type]
    assert observer.topics == ["k.m", "k.m2"]
    assert worker.topics == ["k.s"]
    assert anything.topics == ["k.m2"]
