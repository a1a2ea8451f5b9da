"""fsbus and a real qlobber-fsq 14 (Node) on one directory, in both directions.

The Node peer is tests/interop/qlobber_peer.js with qlobber-fsq's default options; it
reports what it does as JSON lines, which the tests wait on. Messages are identified by
their file name, which both sides report (``Message.name`` / ``info.fname``).
"""

from __future__ import annotations

import base64
import os
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from fsbus import BlockingBus, Bus, BusConfig, Message
from tests.peer_process import TIMEOUT, JsonLinesPeer

pytestmark = [pytest.mark.interop, pytest.mark.slow]

LONG_MULTI = "interop.long." + ".".join(f"w{i:03d}" for i in range(40))
LONG_SINGLE = "work.long." + ".".join(f"job{i:02d}" for i in range(40))


@dataclass(frozen=True)
class Out:
    """A message one side publishes."""

    topic: str
    """Its topic."""
    payload: bytes
    """Its exact payload."""
    single: bool = False
    """Work-queue message or not."""


def _messages() -> list[Out]:
    rng = random.Random(20261121)
    return [
        Out("interop.a.multi", b""),
        Out("interop.b.multi", bytes(range(256))),
        Out("interop.größe.multi", "héllo wörld ✓ 名前".encode()),
        Out(LONG_MULTI, rng.randbytes(70_000)),
        Out("interop.big.multi", rng.randbytes(1 << 20)),
        Out("interop.a.multi", b"\x00"),
        Out("interop.c", b"\r\n\x00\xff\n"),
        Out("other.topic", b"nobody subscribes to this"),
        Out("work.short", b"", single=True),
        Out("work.short", bytes(range(255, -1, -1)), single=True),
        Out(LONG_SINGLE, rng.randbytes(10_000), single=True),
        Out("work.größe", "ünïcødé".encode(), single=True),
    ]


MESSAGES = _messages()

# Subscriptions used on either side: id -> pattern. Singles only match "work".
SUBSCRIPTIONS = {
    "all": "interop.#",
    "star": "interop.*.multi",
    "long": LONG_MULTI,
    "long-wild": "interop.long.#",
    "work": "work.#",
}


def matches(pattern: str, topic: str) -> bool:
    """A tiny AMQP matcher (``*`` one word, ``#`` zero or more) to compute expectations."""
    p, t = pattern.split("."), topic.split(".")

    def m(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(t)
        if p[i] == "#":
            return m(i + 1, j) or (j < len(t) and m(i, j + 1))
        if j == len(t):
            return False
        return (p[i] == t[j] or (p[i] == "*" and t[j] != "")) and m(i + 1, j + 1)

    return m(0, 0)


def test_the_expectations_are_right() -> None:
    # > 200 hex characters: the topic spills into topics/<bucket>/<name>.
    assert len(LONG_MULTI.encode().hex()) > 200
    assert len(LONG_SINGLE.encode().hex()) > 200
    for pattern, topic in (("a.#", "a"), ("#.a", "a"), ("a.#.#.b", "a.b"), ("a.*.c", "a.b.c")):
        assert matches(pattern, topic), (pattern, topic)
    for pattern, topic in (("a.*.c", "a.c"), ("a.b", "a.c"), ("a", "a.b"), ("a.#", "b")):
        assert not matches(pattern, topic), (pattern, topic)
    counts = {
        k: v.total() for k, v in expected_names([str(i) for i in range(len(MESSAGES))]).items()
    }
    assert counts == {"all": 7, "star": 5, "long": 1, "long-wild": 1, "work": 4}


def expected_names(names: list[str]) -> dict[str, Counter[str]]:
    """For each subscription, the message names it must get exactly once."""
    out: dict[str, Counter[str]] = {}
    for sub_id, pattern in SUBSCRIPTIONS.items():
        out[sub_id] = Counter(
            name for name, m in zip(names, MESSAGES, strict=True) if matches(pattern, m.topic)
        )
    return out


def wire(messages: list[Out]) -> list[dict[str, object]]:
    """Messages as the Node peer's params want them."""
    return [
        {"topic": m.topic, "payload": base64.b64encode(m.payload).decode(), "single": m.single}
        for m in messages
    ]


@dataclass
class Inbox:
    """Messages handed to fsbus handlers, per subscription id."""

    by_sub: dict[str, list[Message]] = field(default_factory=lambda: defaultdict(list))

    def handler(self, sub_id: str) -> Callable[[Message], Awaitable[None]]:
        async def handle(msg: Message) -> None:
            self.by_sub[sub_id].append(msg)

        return handle

    def total(self) -> int:
        return sum(len(v) for v in self.by_sub.values())


async def eventually(
    check: Callable[[], bool],
    *,
    what: str,
    timeout: float = TIMEOUT,  # noqa: ASYNC109 - part of what is asserted
    detail: Callable[[], object] = lambda: "",
) -> None:
    """Wait until ``check()`` holds (looked at every 20 ms); fail saying what did not happen.

    The conditions mix handler calls, bus counters, files on disk and another process's
    output, which no single event covers, so this looks at them on a short tick.
    """
    with anyio.move_on_after(timeout):
        while not check():  # noqa: ASYNC110 - see above
            await anyio.sleep(0.02)
    assert check(), f"not within {timeout} s: {what}; {detail()}"


async def in_thread(fn: Callable[[], object]) -> None:
    """Run a blocking wait on a Node peer without blocking the event loop."""
    await anyio.to_thread.run_sync(fn)


def left_on_disk(root: Path, *, kind: str, under: str = "messages") -> list[str]:
    """Files of one kind ("s" single, "m" multi) in the message (or topic) buckets."""
    out = []
    for bucket in (root / under).iterdir():
        out += [n for n in os.listdir(bucket) if f"+{kind}+" in n]
    return out


# --------------------------------------------------------------------------- Node -> fsbus
@pytest.mark.asyncio
async def test_qlobber_publisher_reaches_fsbus_subscribers(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    inbox = Inbox()
    async with Bus(bus_root) as bus:
        for sub_id, pattern in SUBSCRIPTIONS.items():
            await bus.subscribe(pattern, inbox.handler(sub_id))

        pub = qlobber("pub", messages=wire(MESSAGES))
        await in_thread(lambda: pub.wait_count("done", 1))
        published = sorted(pub.of("published"), key=lambda e: int(e["i"]))
        names = [str(e["fname"]) for e in published]
        expires = {str(e["fname"]): int(e["expires"]) for e in published}
        expected = expected_names(names)
        total = sum(c.total() for c in expected.values())

        await eventually(
            lambda: inbox.total() >= total,
            what=f"{total} deliveries",
            detail=lambda: {k: len(v) for k, v in inbox.by_sub.items()},
        )
        singles = sum(m.single for m in MESSAGES)
        await eventually(lambda: bus.statistics().acked >= singles, what="singles acked")
        # A few more scan rounds: a message seen as new twice would show up now.
        scans = bus.statistics().scans
        await eventually(lambda: bus.statistics().scans >= scans + 3, what="3 more scans")
        assert pub.stop() == 0

    by_name = dict(zip(names, MESSAGES, strict=True))
    for sub_id, want in expected.items():
        got = inbox.by_sub[sub_id]
        assert Counter(m.name for m in got) == want, sub_id
        for msg in got:
            sent = by_name[msg.name]
            assert msg.payload == sent.payload, (sub_id, sent.topic, len(sent.payload))
            assert msg.topic == sent.topic
            assert msg.single is sent.single
            assert msg.expires == expires[msg.name] / 1000
            # Foreign names carry none of fsbus's fields.
            assert msg.headers == {}
            assert msg.published_at is None
            assert msg.delivery_count == 1
    assert set(inbox.by_sub) <= set(SUBSCRIPTIONS)
    assert left_on_disk(bus_root, kind="s") == []
    assert left_on_disk(bus_root, kind="s", under="topics") == []  # the long one's spill
    assert len(left_on_disk(bus_root, kind="m", under="topics")) == 1  # multis stay


# --------------------------------------------------------------------------- fsbus -> Node
@pytest.mark.asyncio
async def test_fsbus_publisher_reaches_qlobber_subscribers(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    # The Node peer starts first and creates the directory; fsbus joins it.
    sub = qlobber("sub", subscriptions=[{"id": k, "pattern": p} for k, p in SUBSCRIPTIONS.items()])
    await in_thread(lambda: sub.wait_count("ready", 1))

    async with Bus(bus_root) as bus:
        infos = [await bus.publish(m.topic, m.payload, single=m.single) for m in MESSAGES]
    names = [i.name for i in infos]
    expected = expected_names(names)
    total = sum(c.total() for c in expected.values())

    await in_thread(lambda: sub.wait_count("message", total))
    # Singles are acknowledged by the Node peer (done()): their files go away.
    await eventually(lambda: not left_on_disk(bus_root, kind="s"), what="singles consumed")
    await eventually(
        lambda: not left_on_disk(bus_root, kind="s", under="topics"), what="long spill removed"
    )
    assert sub.stop() == 0

    by_name = {i.name: (i, m) for i, m in zip(infos, MESSAGES, strict=True)}
    got: dict[str, Counter[str]] = defaultdict(Counter)
    for event in sub.of("message"):
        name = str(event["fname"])
        info, sent = by_name[name]
        got[str(event["sub"])][name] += 1
        assert base64.b64decode(str(event["payload"])) == sent.payload, sent.topic
        assert event["size"] == len(sent.payload)
        assert event["topic"] == sent.topic
        assert event["single"] is sent.single
        assert event["expires"] == round(info.expires * 1000)
    assert dict(got) == {k: v for k, v in expected.items() if v}


@pytest.mark.asyncio
async def test_headers_and_priority_leave_the_payload_a_qlobber_peer_gets_unchanged(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    sub = qlobber(
        "sub",
        subscriptions=[{"id": "all", "pattern": "meta.#"}, {"id": "work", "pattern": "job.#"}],
    )
    await in_thread(lambda: sub.wait_count("ready", 1))
    payload = b'{"looks": "like json"}\x00\x01'
    headers = {"content-type": "application/json", "x-trace": "ünï-42", "empty": ""}

    inbox = Inbox()
    async with Bus(bus_root) as bus:
        await bus.subscribe("meta.#", inbox.handler("py"))
        multi = await bus.publish("meta.with.headers", payload, headers=headers, priority=7)
        single = await bus.publish(
            "job.with.headers", payload, single=True, headers=headers, priority=200
        )
        # On disk, the message file is still exactly one 0x00 byte and the payload.
        assert await anyio.Path(multi.path).read_bytes() == b"\x00" + payload
        await eventually(lambda: inbox.total() >= 1, what="the fsbus subscriber's copy")
        await in_thread(lambda: sub.wait_count("message", 2))
    assert sub.stop() == 0

    events = {str(e["sub"]): e for e in sub.of("message")}
    assert set(events) == {"all", "work"}
    for event, info in ((events["all"], multi), (events["work"], single)):
        assert event["fname"] == info.name
        assert base64.b64decode(str(event["payload"])) == payload
        assert event["size"] == len(payload)
        assert event["topic"] == info.topic
    # fsbus peers do see the headers and priority.
    (mine,) = inbox.by_sub["py"]
    assert mine.headers == headers
    assert mine.priority == 7
    assert mine.payload == payload


@pytest.mark.asyncio
async def test_streamed_fsbus_payloads_reach_a_qlobber_peer_exactly(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path, tmp_path: Path
) -> None:
    sub = qlobber("sub", subscriptions=[{"id": "all", "pattern": "stream.#"}])
    await in_thread(lambda: sub.wait_count("ready", 1))
    rng = random.Random(5)
    from_file = rng.randbytes(3 * (1 << 20) + 17)  # larger than one copy chunk
    source = tmp_path / "payload.bin"  # a path (not a str, which would be the payload)
    await anyio.Path(source).write_bytes(from_file)
    chunks = [rng.randbytes(n) for n in (1, 0, 65_536, 4_095, 100_000)]

    async def chunked() -> AsyncIterator[bytes]:
        for c in chunks:
            yield c

    async with Bus(bus_root) as bus:
        a = await bus.publish("stream.file", source)
        b = await bus.publish("stream.chunks", chunked(), single=True)
        await in_thread(lambda: sub.wait_count("message", 2))
    assert sub.stop() == 0

    got = {str(e["fname"]): base64.b64decode(str(e["payload"])) for e in sub.of("message")}
    assert got == {a.name: from_file, b.name: b"".join(chunks)}
    assert (a.size, b.size) == (len(from_file), sum(map(len, chunks)))


# --------------------------------------------------------------------------- shared queue
@pytest.mark.asyncio
async def test_work_queue_shared_by_a_node_and_a_python_worker(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    per_side = 100
    node_jobs = [Out("jobs.shared", f"node-{i}".encode(), single=True) for i in range(per_side)]
    node_worker = qlobber("sub", subscriptions=[{"id": "worker", "pattern": "jobs.#"}])
    await in_thread(lambda: node_worker.wait_count("ready", 1))

    handled: list[Message] = []

    async def python_worker(msg: Message) -> None:
        if not handled:
            # Hold the first job until the Node worker has handled one, so both take part
            # (with handler_concurrency=1 this worker can hold at most one job).
            await in_thread(lambda: node_worker.wait_count("message", 1))
        handled.append(msg)

    # Python handles one job at a time; the Node worker too (qlobber-fsq's default).
    async with Bus(bus_root, config=BusConfig(handler_concurrency=1)) as bus:
        await bus.subscribe("jobs.#", python_worker)
        node_pub = qlobber("pub", messages=wire(node_jobs))
        py_infos = [
            await bus.publish("jobs.shared", f"py-{i}".encode(), single=True)
            for i in range(per_side)
        ]
        await in_thread(lambda: node_pub.wait_count("done", 1))
        assert node_pub.wait_exit() == 0
        published = {i.name: f"py-{n}".encode() for n, i in enumerate(py_infos)}
        for e in node_pub.of("published"):
            published[str(e["fname"])] = node_jobs[int(e["i"])].payload
        assert len(published) == 2 * per_side

        await eventually(
            lambda: len(handled) + node_worker.count("message") >= len(published),
            what=f"{len(published)} jobs handled",
        )
        await eventually(lambda: bus.statistics().acked >= len(handled), what="acks")
        await eventually(lambda: not left_on_disk(bus_root, kind="s"), what="queue drained")
        assert node_worker.stop() == 0

    node_done = node_worker.of("message")
    counts = Counter([m.name for m in handled] + [str(e["fname"]) for e in node_done])
    assert set(counts) == set(published)
    assert [n for n, c in counts.items() if c != 1] == []  # exactly once overall
    assert handled, "the Python worker took no job"
    assert node_done, "the Node worker took no job"
    for m in handled:
        assert m.payload == published[m.name]
    for e in node_done:
        assert base64.b64decode(str(e["payload"])) == published[str(e["fname"])]


# --------------------------------------------------------------------------- both at once
@pytest.mark.asyncio
async def test_node_and_fsbus_publish_and_subscribe_on_one_bus(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    per_side = 50
    node_sub = qlobber("sub", subscriptions=[{"id": "n", "pattern": "mix.#"}])
    await in_thread(lambda: node_sub.wait_count("ready", 1))
    inbox = Inbox()
    node_msgs = [Out(f"mix.node.k{i % 5}", f"node-{i}".encode()) for i in range(per_side)]

    async with Bus(bus_root) as bus:
        await bus.subscribe("mix.#", inbox.handler("py"))
        node_pub = qlobber("pub", messages=wire(node_msgs))  # publishes while we do
        payload_of = {}
        for i in range(per_side):
            info = await bus.publish(f"mix.py.k{i % 5}", f"py-{i}".encode())
            payload_of[info.name] = f"py-{i}".encode()
        await in_thread(lambda: node_pub.wait_count("done", 1))
        for e in node_pub.of("published"):
            payload_of[str(e["fname"])] = node_msgs[int(e["i"])].payload
        everything = 2 * per_side
        await eventually(lambda: inbox.total() >= everything, what="fsbus got everything")
        await in_thread(lambda: node_sub.wait_count("message", everything))
        scans = bus.statistics().scans
        await eventually(lambda: bus.statistics().scans >= scans + 3, what="3 more scans")
    assert node_sub.stop() == 0
    assert node_pub.wait_exit() == 0

    want = Counter(set(payload_of))
    assert Counter(m.name for m in inbox.by_sub["py"]) == want
    assert Counter(str(e["fname"]) for e in node_sub.of("message")) == want
    for m in inbox.by_sub["py"]:
        assert m.payload == payload_of[m.name]
    for e in node_sub.of("message"):
        assert base64.b64decode(str(e["payload"])) == payload_of[str(e["fname"])]


# --------------------------------------------------------------------------- expiry
@pytest.mark.asyncio
async def test_expired_qlobber_messages_are_not_delivered_and_are_removed(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    expired = [
        Out("old.multi", b"stale"),
        Out("old.single", b"stale job", single=True),
        Out(LONG_MULTI.replace("interop", "old"), b"stale and long"),
    ]
    inbox = Inbox()
    async with Bus(bus_root) as bus:
        await bus.subscribe("#", inbox.handler("all"))
        # A negative ttl makes qlobber-fsq write an expiry in the past.
        pub = qlobber(
            "pub",
            messages=[
                *[{**w, "ttl": -60_000} for w in wire(expired)],
                *wire([Out("fresh.marker", b"after the stale ones")]),
            ],
        )
        await in_thread(lambda: pub.wait_count("done", 1))
        assert pub.wait_exit() == 0
        await eventually(lambda: inbox.total() >= 1, what="the fresh marker")
        await bus.gc()
        delivered = bus.statistics().delivered

    assert [m.topic for m in inbox.by_sub["all"]] == ["fresh.marker"]
    assert delivered == 1
    # Gone from disk, with their topic spills. (Who removed which is not fixed: the
    # qlobber-fsq publisher deletes expired files it comes across too.)
    names = {str(e["fname"]) for e in pub.of("published")}
    on_disk = set()
    for sub in ("messages", "topics"):
        for bucket in (bus_root / sub).iterdir():
            on_disk.update(os.listdir(bucket))
    assert on_disk & names == {n for n in names if n.startswith(b"fresh".hex())}


# --------------------------------------------------------------------------- dead letters
@pytest.mark.asyncio
async def test_a_dead_lettered_qlobber_job_reaches_a_qlobber_subscriber_intact(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    poison = bytes(range(256)) + b"\x00"
    graveyard = qlobber("sub", subscriptions=[{"id": "dead", "pattern": "dead-letter.#"}])
    await in_thread(lambda: graveyard.wait_count("ready", 1))
    attempts: list[int] = []

    async def fragile(msg: Message) -> None:
        attempts.append(msg.delivery_count)
        raise RuntimeError("cannot handle this one")

    async with Bus(bus_root, config=BusConfig(max_deliveries=2)) as bus:
        await bus.subscribe("jobs.#", fragile)
        pub = qlobber("pub", messages=wire([Out("jobs.poison", poison, single=True)]))
        await in_thread(lambda: pub.wait_count("done", 1))
        (event,) = await anyio.to_thread.run_sync(lambda: graveyard.wait_count("message", 1))
        await eventually(lambda: bus.statistics().dead_lettered == 1, what="dead-lettered")
        # The Node peer acks after its handler returns: stop it only once that is done.
        await eventually(
            lambda: left_on_disk(bus_root, kind="s") == [], what="dead letter consumed"
        )
    assert graveyard.stop() == 0
    assert pub.wait_exit() == 0

    assert attempts == [1, 2]
    assert event["topic"] == "dead-letter.jobs.poison"
    assert event["single"] is True
    assert base64.b64decode(str(event["payload"])) == poison
    assert left_on_disk(bus_root, kind="s") == []


@pytest.mark.asyncio
async def test_a_job_fsbus_failed_reaches_a_qlobber_worker_intact(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    """fsbus counts a failed delivery in the file's leading byte; qlobber-fsq reads after it."""
    payload = b"\x00\x01" + bytes(range(256))
    with BlockingBus(bus_root) as bus:
        info = bus.publish("jobs.retry", payload, single=True)
        with bus.messages("jobs.#") as it:
            msg = it.get(timeout=TIMEOUT)
            assert msg.delivery_count == 1
            it.release(msg)  # a failure, counted
    assert (bus_root / "messages" / info.bucket / info.name).read_bytes()[0] == 1
    worker = qlobber("sub", subscriptions=[{"id": "w", "pattern": "jobs.#"}])
    await in_thread(lambda: worker.wait_count("message", 1))
    await eventually(lambda: left_on_disk(bus_root, kind="s") == [], what="job consumed")
    assert worker.stop() == 0
    (event,) = worker.of("message")
    assert event["fname"] == info.name
    assert base64.b64decode(str(event["payload"])) == payload
    assert event["size"] == len(payload)


# --------------------------------------------------------------------------- existing
@pytest.mark.asyncio
async def test_messages_already_there_reach_only_subscribers_asking_for_existing_ones(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    early = [Out(f"early.node.{i}", f"node-early-{i}".encode()) for i in range(3)]
    pub = qlobber("pub", messages=wire(early))
    await in_thread(lambda: pub.wait_count("done", 1))
    assert pub.wait_exit() == 0
    node_early = {str(e["fname"]) for e in pub.of("published")}

    inbox = Inbox()
    async with Bus(bus_root) as bus:
        py_early = {
            (await bus.publish(f"early.py.{i}", f"py-early-{i}".encode())).name for i in range(3)
        }
        await bus.subscribe("early.#", inbox.handler("new-only"))
        await bus.subscribe("early.#", inbox.handler("existing"), existing=True)
        node_sub = qlobber(
            "sub",
            subscriptions=[
                {"id": "new-only", "pattern": "early.#"},
                {"id": "existing", "pattern": "early.#", "existing": True},
            ],
        )
        await in_thread(lambda: node_sub.wait_count("ready", 1))
        late = (await bus.publish("early.late", b"late")).name

        old = node_early | py_early
        await eventually(lambda: inbox.total() >= len(old) + 2, what="fsbus deliveries")
        await in_thread(lambda: node_sub.wait_count("message", len(old) + 2))
        scans = bus.statistics().scans
        await eventually(lambda: bus.statistics().scans >= scans + 3, what="3 more scans")
    assert node_sub.stop() == 0

    node_got: dict[str, Counter[str]] = defaultdict(Counter)
    for e in node_sub.of("message"):
        node_got[str(e["sub"])][str(e["fname"])] += 1
    for side, got in (
        ("fsbus", {k: Counter(m.name for m in v) for k, v in inbox.by_sub.items()}),
        ("qlobber-fsq", node_got),
    ):
        assert got["new-only"] == Counter([late]), side
        assert got["existing"] == Counter([*old, late]), side


# --------------------------------------------------------------------------- browse
def test_browse_shows_qlobber_messages_without_consuming_them(
    qlobber: Callable[..., JsonLinesPeer], bus_root: Path
) -> None:
    pub = qlobber("pub", messages=wire(MESSAGES))
    pub.wait_count("done", 1)
    assert pub.wait_exit() == 0
    sent = {
        str(e["fname"]): (MESSAGES[int(e["i"])], int(e["expires"])) for e in pub.of("published")
    }

    with BlockingBus(bus_root) as bus:
        infos = list(bus.browse("#"))
        assert {i.name for i in infos} == set(sent)
        for info in infos:
            m, expires = sent[info.name]
            assert (info.topic, info.single, info.size) == (m.topic, m.single, len(m.payload))
            assert info.expires == expires / 1000
            assert info.locked is False
            assert info.headers == {}
            assert bus.read_payload(info) == m.payload
        assert len(list(bus.browse("work.#"))) == sum(m.single for m in MESSAGES)
        # Nothing was consumed.
        assert {i.name for i in bus.browse()} == set(sent)
