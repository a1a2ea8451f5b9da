"""Multi messages through the real async Bus: every subscription once, dedup, existing."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, Message
from fsbus._bus.ops import Ops

from .conftest import WAIT, Inbox, message_files, wait_until


@pytest.mark.anyio
async def test_publish_reaches_every_matching_subscription_once(root: Path) -> None:
    a, b, other = Inbox(), Inbox(), Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("orders.*", a)
        await bus.subscribe("#", b)
        await bus.subscribe("invoices.#", other)
        await bus.publish("orders.created", b"1")
        await bus.publish("invoices.paid", b"2")
        await a.wait_for(1)
        await b.wait_for(2)
        await other.wait_for(1)
        # A third message is the barrier: once it arrived nothing earlier can still come.
        await bus.publish("orders.last", b"3")
        await a.wait_for(2)
        await b.wait_for(3)
    assert a.topics == ["orders.created", "orders.last"]
    assert sorted(b.topics) == ["invoices.paid", "orders.created", "orders.last"]
    assert other.topics == ["invoices.paid"]


@pytest.mark.anyio
async def test_many_messages_none_lost_none_twice(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("load.#", inbox)
        sent = {f"m{i}".encode() for i in range(300)}
        async with anyio.create_task_group() as tg:
            for p in sent:
                tg.start_soon(bus.publish, "load.x", p)
        await inbox.wait_for(300)
        await bus.publish("load.end", b"end")
        await inbox.wait_topic("load.end")
    got = [m.payload for m in inbox.messages if m.topic == "load.x"]
    assert len(got) == 300
    assert set(got) == sent


@pytest.mark.anyio
async def test_one_handler_on_two_matching_patterns_is_called_once(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("a.*", inbox)
        await bus.subscribe("a.#", inbox)
        await bus.subscribe("#.b", inbox)
        await bus.publish("a.b", b"x")
        await inbox.wait_for(1)
        await bus.publish("a.c", b"barrier")
        await inbox.wait_for(2)
    assert inbox.topics == ["a.b", "a.c"]


@pytest.mark.anyio
async def test_without_dedup_each_subscription_gets_its_copy(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root, config=BusConfig(dedup=False)) as bus:
        await bus.subscribe("a.*", inbox)
        await bus.subscribe("a.#", inbox)
        await bus.publish("a.b", b"x")
        await inbox.wait_for(2)
    assert inbox.topics == ["a.b", "a.b"]


@pytest.mark.anyio
async def test_unsubscribe_stops_delivery(root: Path) -> None:
    gone, stays = Inbox(), Inbox()
    async with Bus(root) as bus:
        sub = await bus.subscribe("t.#", gone)
        await bus.subscribe("t.#", stays)
        await bus.publish("t.1", b"1")
        await gone.wait_for(1)
        await stays.wait_for(1)
        await bus.unsubscribe(sub)
        assert sub.closed
        await bus.publish("t.2", b"2")
        await stays.wait_for(2)
        # aclose is the same thing and is idempotent
        await sub.aclose()
        assert bus.statistics().subscriptions == 1
    assert gone.topics == ["t.1"]
    assert stays.topics == ["t.1", "t.2"]


@pytest.mark.anyio
async def test_existing_true_gets_present_messages_default_does_not(root: Path) -> None:
    async with Bus(root) as publisher:
        await publisher.publish("old.one", b"before")
        await publisher.publish("old.two", b"before")
    fresh, everything = Inbox(), Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("old.#", fresh)
        await bus.subscribe("old.#", everything, existing=True)
        await everything.wait_for(2)
        await bus.publish("old.three", b"after")
        await fresh.wait_for(1)
        await everything.wait_for(3)
    assert fresh.topics == ["old.three"]
    assert sorted(everything.topics) == ["old.one", "old.three", "old.two"]


@pytest.mark.anyio
async def test_existing_on_a_running_bus_gets_what_is_present(root: Path) -> None:
    first, late = Inbox(), Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("x.#", first)
        await bus.publish("x.1", b"1")
        await first.wait_for(1)
        await bus.subscribe("x.#", late, existing=True)
        await late.wait_for(1)
        await bus.publish("x.2", b"2")
        await late.wait_for(2)
        await first.wait_for(2)
    assert late.topics == ["x.1", "x.2"]
    assert first.topics == ["x.1", "x.2"]


@pytest.mark.anyio
async def test_two_buses_on_one_directory_both_see_a_multi(root: Path) -> None:
    a, b = Inbox(), Inbox()
    async with Bus(root) as one, Bus(root) as two:
        await one.subscribe("#", a)
        await two.subscribe("#", b)
        await one.publish("shared", b"hello")
        await a.wait_for(1)
        await b.wait_for(1)
    assert a.payloads == b.payloads == [b"hello"]
    # Multi messages stay until they expire (other peers may not have seen them).
    assert len(message_files(root)) == 1


@pytest.mark.anyio
async def test_headers_priority_time_and_host_reach_the_subscriber(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("meta.#", inbox)
        before = time.time()
        info = await bus.publish(
            "meta.x", b"p", headers={"content-type": "text/plain", "trace": "ü-1"}, priority=9
        )
        after = time.time()
        (msg,) = await inbox.wait_for(1)
    assert msg.headers == {"content-type": "text/plain", "trace": "ü-1"}
    assert msg.priority == 9
    assert msg.published_at is not None
    assert before - 0.002 <= msg.published_at <= after + 0.002
    assert msg.host == socket.gethostname()
    assert msg.name == info.name
    assert msg.bucket == info.bucket
    assert msg.expires == info.expires
    assert not msg.single
    assert msg.delivery_count == 1
    assert msg.size == 1
    assert (root / "fsbus" / "meta" / info.bucket / info.name).exists()


@pytest.mark.anyio
async def test_message_text_and_json(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("#", inbox)
        await bus.publish("j", '{"a": [1, "é"]}')
        (msg,) = await inbox.wait_for(1)
    assert msg.text() == '{"a": [1, "é"]}'
    assert msg.json() == {"a": [1, "é"]}


@pytest.mark.anyio
async def test_a_failing_multi_handler_does_not_stop_others(root: Path) -> None:
    inbox = Inbox()

    async def boom(msg: Message) -> None:
        raise RuntimeError("handler bug")

    async with Bus(root) as bus:
        await bus.subscribe("#", boom)
        await bus.subscribe("#", inbox)
        await bus.publish("a", b"1")
        await bus.publish("b", b"2")
        await inbox.wait_for(2)
        stats = bus.statistics()
    assert stats.failed >= 1
    assert stats.delivered >= 3


@pytest.mark.anyio
async def test_publish_many(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("pm.#", inbox)
        infos = await bus.publish_many([("pm.a", b"1"), ("pm.b", "2"), ("pm.c", b"3")])
        await inbox.wait_for(3)
    assert [i.topic for i in infos] == ["pm.a", "pm.b", "pm.c"]
    assert sorted(inbox.payloads) == [b"1", b"2", b"3"]


@pytest.mark.anyio
async def test_polling_only_still_delivers(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root, config=BusConfig(force_polling=True, poll_interval=0.05)) as bus:
        await bus.subscribe("#", inbox)
        await bus.publish("p", b"polled")
        await inbox.wait_for(1)
        assert not bus.statistics().inotify
    assert inbox.payloads == [b"polled"]


@pytest.mark.anyio
async def test_order_by_expiry_single_bucket(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root, config=BusConfig(order_by_expiry=True)) as bus:
        await bus.subscribe("#", inbox)
        info = await bus.publish("o", b"1")
        await inbox.wait_for(1)
    assert info.bucket == "0"
    assert (root / "messages" / "0" / info.name).exists()


@pytest.mark.anyio
async def test_no_update_file_scans_every_bucket(root: Path) -> None:
    inbox = Inbox()
    cfg = BusConfig(bucket_stamp_size=0, poll_interval=0.05)
    async with Bus(root, config=cfg) as bus:
        await bus.subscribe("#", inbox)
        await bus.publish("u", b"1")
        await inbox.wait_for(1)
    assert not (root / "update" / "UPDATE").exists()


class GatedListing(Ops):
    """Holds the first listing of a bucket other than ``spare`` until the gate opens."""

    def __init__(self) -> None:
        self.spare = ""
        self.holding = threading.Event()
        self.gate = threading.Event()

    def listdir(self, path: str) -> list[str]:
        if self.spare and "/messages/" in path and not path.endswith(f"/{self.spare}"):
            if not self.holding.is_set():
                self.holding.set()
                self.gate.wait(WAIT)
        return super().listdir(path)


@pytest.mark.anyio
async def test_existing_subscription_added_while_a_scan_is_listing(root: Path) -> None:
    # Regression: a scan whose (partial) listing began before subscribe(existing=True)
    # took the new subscription as served, so it never got what was present.
    ops = GatedListing()
    first, late = Inbox(), Inbox()
    async with Bus(root, ops=ops) as bus:
        await bus.subscribe("#", first)
        present = await bus.publish("x.present", b"1")
        await first.wait_for(1)
        ops.spare = present.bucket
        # A trigger in another bucket: the scan listing it (and not x.present) is held.
        while not ops.holding.is_set():
            await bus.publish("y.trigger", b"t")
            await wait_until(lambda: ops.holding.is_set() or len(first.messages) > 1)
        await bus.subscribe("x.#", late, existing=True)
        ops.gate.set()
        (msg,) = await late.wait_for(1)
    assert msg.name == present.name


@pytest.mark.anyio
async def test_one_subscriber_cannot_change_anothers_headers(root: Path) -> None:
    seen: list[dict[str, str]] = []

    async def mutator(msg: Message) -> None:
        msg.headers["k"] = "changed"  # type: ignore[index]
        seen.append(dict(msg.headers))

    async def reader(msg: Message) -> None:
        seen.append(dict(msg.headers))

    async with Bus(root) as bus:
        await bus.subscribe("#", mutator)
        await bus.subscribe("#", reader)
        await bus.publish("h", b"x", headers={"k": "original"})
        await wait_until(lambda: len(seen) == 2)
    assert {"k": "original"} in seen


class CountedListings(Ops):
    """Counts the listings of the main bus's buckets."""

    def __init__(self) -> None:
        self.listed = 0

    def listdir(self, path: str) -> list[str]:
        if "/messages/" in path:
            self.listed += 1
        return super().listdir(path)


@pytest.mark.anyio
async def test_a_multi_subscription_on_a_scanning_bus_lists_no_bucket_again(root: Path) -> None:
    """A subscription to multi messages only, added while the bus scans, gets what is
    published after it without a listing of every bucket (a worker's gets one, for the
    work already waiting; ``existing=True`` one, for what is present)."""
    seam = CountedListings()
    buckets = BusConfig().num_buckets
    async with Bus(root, ops=seam) as bus:
        await bus.subscribe("a.#", Inbox(), kind="multi")
        for i in range(3):
            inbox = Inbox()
            before = seam.listed
            await bus.subscribe(f"t{i}.#", inbox, kind="multi")
            await bus.publish(f"t{i}.x", b"%d" % i)
            await inbox.wait_for(1)
            assert inbox.payloads == [b"%d" % i]
            assert seam.listed - before < buckets
        old = Inbox()
        before = seam.listed
        await bus.subscribe("t0.#", old, kind="multi", existing=True)
        await old.wait_for(1)
        assert old.payloads == [b"0"]
        assert seam.listed - before >= buckets
        worker = Inbox()
        before = seam.listed
        await bus.subscribe("w.#", worker, kind="single")
        await bus.publish("w.x", b"w", single=True)
        await worker.wait_for(1)
        assert seam.listed - before >= buckets
