"""How a publish writes its queue copies: durable ones synced together (group commit),
every kind of copy (TTLs, headers, long topics) in every queue, nothing left in staging,
and a publish whose message fails to sync leaves no copy behind."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from fsbus import (
    BlockingBus,
    Bus,
    BusConfig,
    QueueFull,
    QueueNotFound,
    StorageError,
    UsageError,
)
from fsbus._bus.ops import Ops
from tests.journaled import JournaledExt4, UnorderedMount

from .conftest import WAIT

# The publish paths made durable file by file (the durable log: test_durable_log.py).
SYNCS = BusConfig(durable_log="off")

LONG_TOPIC = "orders." + "x" * 300
"""Too long for a file name: its copies carry a spill sidecar."""


def _staged(root: Path) -> list[Path]:
    """Files left in the staging folder of the bus or of any queue's bus."""
    dirs = [root / "staging", *(root / "fsbus" / "queues").glob("*/bus/staging")]
    return [f for d in dirs if d.is_dir() for f in d.iterdir()]


def _drain(bus: BlockingBus, queue: str, count: int) -> list[tuple[str, bytes, dict[str, str]]]:
    got = []
    with bus.messages(queue=queue) as it:
        for _ in range(count):
            msg = it.get(timeout=WAIT)
            got.append((msg.topic, msg.payload, dict(msg.headers)))
            it.ack(msg)
    return got


@pytest.mark.parametrize("durable", [True, False])
def test_every_copy_lands_in_every_queue(root: Path, durable: bool) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("a", ["orders.#"])
        bus.declare_queue("b", ["orders.#"], message_ttl=3600)  # another TTL: its own name
        bus.declare_queue("c", ["orders.#", "orders.paid"])
        sent = [
            ("orders.paid", b"plain", {}),
            ("orders.paid", b"with headers", {"k": "v"}),
            (LONG_TOPIC, b"long topic", {}),
        ]
        for i in range(20):
            sent.append(("orders.paid", f"m{i}".encode(), {}))
        for topic, payload, headers in sent:
            bus.publish(topic, payload, durable=durable, headers=headers or None)
        assert _staged(root) == []
        for q in ("a", "b", "c"):
            assert bus.queue_info(q).depth == len(sent)
            got = _drain(bus, q, len(sent))
            assert sorted(got) == sorted(sent), q
            assert bus.queue_info(q).depth == 0
        assert bus.statistics().published == len(sent)


@pytest.mark.anyio
async def test_the_async_bus_routes_durable_copies_the_same_way(root: Path) -> None:
    async with Bus(root) as bus:
        await bus.declare_queue("a", ["jobs.*"])
        await bus.declare_queue("b", ["jobs.#"])
        infos = [
            await bus.publish("jobs.run", f"j{i}".encode(), durable=True, single=i % 2 == 0)
            for i in range(10)
        ]
        assert all([await anyio.Path(i.path).is_file() for i in infos])
        assert (await bus.queue_info("a")).depth == 10
        assert (await bus.queue_info("b")).depth == 10
    assert _staged(root) == []


@pytest.mark.anyio
@pytest.mark.parametrize("durable", [True, False])
async def test_publish_many_copies_each_message_into_its_queues(root: Path, durable: bool) -> None:
    """A batch with topics bound to different queues (one capped, reject-publish, with
    room for the batch) and one bound to none: each queue gets the copies of its topics."""
    async with Bus(root) as bus:
        await bus.declare_queue("all", ["jobs.#"])
        await bus.declare_queue("runs", ["jobs.run"])
        await bus.declare_queue("capped", ["jobs.stop"], max_length=5, overflow="reject-publish")
        batch = [
            (f"jobs.{kind}", f"{kind}{i}".encode()) for i in range(5) for kind in ("run", "stop")
        ]
        batch.append(("other.x", b"unbound"))
        infos = await bus.publish_many(batch, durable=durable)
        assert len(infos) == len(batch)
        assert (await bus.queue_info("all")).depth == 10
        assert (await bus.queue_info("runs")).depth == 5
        assert (await bus.queue_info("capped")).depth == 5
        with pytest.raises(QueueFull):
            await bus.publish_many([("jobs.stop", b"one too many")], durable=durable)
        assert (await bus.queue_info("capped")).depth == 5
    with BlockingBus(root) as bus:
        got = _drain(bus, "runs", 5)
    assert sorted(p for _, p, _ in got) == [f"run{i}".encode() for i in range(5)]
    assert _staged(root) == []


@pytest.mark.anyio
@pytest.mark.parametrize("face", ["async", "blocking"])
async def test_publish_many_into_a_reject_publish_queue_stops_at_the_first_it_refuses(
    root: Path, face: str
) -> None:
    """A batch bigger than the room a reject-publish queue has: as many publishes one
    after the other, the messages that fit are published (on the bus and in the queue),
    the first that does not raises QueueFull, and neither it nor the ones after it are
    published anywhere; the queue never goes over its max_length. (The async face
    checked every message of the batch against the queue as it was before the batch,
    and published all ten into a queue of three.)"""
    batch = [("jobs.stop", f"m{i}".encode()) for i in range(10)]
    async with Bus(root) as bus:
        await bus.declare_queue("capped", ["jobs.stop"], max_length=3, overflow="reject-publish")
        await bus.declare_queue("all", ["jobs.#"])
        await bus.publish("jobs.stop", b"m-before")
        said = r"capped.*reject-publish.*message 3 of 10 of publish_many: the 2 before it"
        if face == "async":
            with pytest.raises(QueueFull, match=said):
                await bus.publish_many(batch)
        else:

            def publish_many() -> None:
                with BlockingBus(root) as blocking, pytest.raises(QueueFull, match=said):
                    blocking.publish_many(batch)

            await anyio.to_thread.run_sync(publish_many)
        assert (await bus.queue_info("capped")).depth == 3
        assert (await bus.queue_info("all")).depth == 3
    with BlockingBus(root) as bus:
        assert [p for _, p, _ in _drain(bus, "capped", 3)] == [b"m-before", b"m0", b"m1"]
        assert sorted(p for _, p, _ in _drain(bus, "all", 3)) == [b"m-before", b"m0", b"m1"]
        on_bus = [m.topic for m in bus.browse("#")]
    assert len(on_bus) == 3  # the bus's own copies: none of the refused or later ones


class FailingSync(Ops):
    """fdatasync fails (EIO) on the bus's own files: the queue buses use the real seam."""

    def __init__(self) -> None:
        self.failed = 0

    def fdatasync(self, fd: int) -> None:
        self.failed += 1
        raise OSError(errno.EIO, "Input/output error")


class _JournaledFailingSync(JournaledExt4, FailingSync):
    pass


class _UnorderedFailingSync(UnorderedMount, FailingSync):
    pass


# Synced before the renames (btrfs), or renamed first and synced after (journaled ext4).
MOUNTS = pytest.mark.parametrize("mount", ["sync-first", "place-first"])


@MOUNTS
def test_a_durable_publish_that_fails_to_sync_leaves_no_copy(root: Path, mount: str) -> None:
    """Whichever the order, a sync that fails leaves nothing of the publish: the copies
    and the message are taken back (renamed first, they were visible a moment)."""
    with BlockingBus(root) as setup:
        setup.declare_queue("a", ["t.#"])
        setup.declare_queue("b", ["t.#"])
    ops = _JournaledFailingSync() if mount == "place-first" else _UnorderedFailingSync()
    with BlockingBus(root, ops=ops, config=SYNCS) as bus:
        with pytest.raises(StorageError):
            bus.publish("t.x", b"lost", durable=True)
        assert ops.failed == 1
        assert bus.queue_info("a").depth == 0
        assert bus.queue_info("b").depth == 0
        assert list(bus.browse("#")) == []
        assert _staged(root) == []
        bus.publish("t.x", b"kept")  # not durable: no sync, the copies go in
        assert bus.queue_info("a").depth == 1
        assert bus.queue_info("b").depth == 1


class Recording(Ops):
    """Records, in order, each file's sync, each rename and each directory's sync."""

    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.events: list[tuple[str, str]] = []

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self.events.append(("fdatasync", self.paths[fd]))

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self.events.append(("fsync", self.paths[fd]))

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        self.events.append(("rename", f"{src} {dst}"))

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        n = super().pwrite(fd, data, offset)
        path = self.paths.get(fd, "")
        if path.endswith("/update/UPDATE"):  # a stamp: which bus, which bucket
            self.events.append(("stamp", f"{path} {offset}"))
        return n


@contextlib.contextmanager
def _three_queues(root: Path, ops: Recording) -> Iterator[BlockingBus]:
    """A bus on ``ops`` with queues a, b and c bound ``t.#``, its events cleared."""
    with BlockingBus(root) as setup:
        for q in "abc":
            setup.declare_queue(q, ["t.#"])
    with BlockingBus(root, ops=ops, config=SYNCS) as bus:
        ops.events.clear()
        yield bus


class _UnorderedRecording(UnorderedMount, Recording):
    pass


class _JournaledRecording(JournaledExt4, Recording):
    pass


def test_a_durable_publish_syncs_every_file_before_its_rename_and_every_bucket_after(
    root: Path,
) -> None:
    """Where a power cut could show a file torn (btrfs here), each file is synced before
    its rename; the copies' renames come before the message's bucket is synced (one
    commit carries them)."""
    ops = _UnorderedRecording()
    with _three_queues(root, ops) as bus:
        info = bus.publish("t.x", b"kept", durable=True)
        ev = ops.events
        renames = [(i, e[1].split(" ")) for i, e in enumerate(ev) if e[0] == "rename"]
        assert len(renames) == 4  # the message and three copies
        assert any(dst == info.path for _, (_, dst) in renames)
        for i, (src, dst) in renames:
            synced = [j for j, e in enumerate(ev) if e == ("fdatasync", src)]
            assert synced, f"{src} never synced"
            assert synced[0] < i, f"{src} renamed before its data was synced"
            bucket = dst.rsplit("/", 1)[0]
            after = [j for j, e in enumerate(ev) if e == ("fsync", bucket) and j > i]
            assert after, f"{bucket} not synced after {dst} arrived"
        # the copies' renames all come before the message's bucket is synced
        message_bucket = info.path.rsplit("/", 1)[0]
        first_dir_sync = ev.index(("fsync", message_bucket))
        assert all(i < first_dir_sync for i, _ in renames)
        for q in "abc":
            assert bus.queue_info(q).depth == 1
        assert _staged(root) == []


@pytest.mark.parametrize("size", [4, 5000])
def test_a_durable_page_on_a_journaled_mount_is_renamed_everywhere_then_synced(
    root: Path, size: int
) -> None:
    """On journaled ext4 a durable message of one page and its copies are all renamed
    into place before the first sync (one journal commit carries every creation and
    rename), each file and bucket synced after its rename, before the publish returns;
    a larger message is synced before its rename, as anywhere."""
    ops = _JournaledRecording()
    with _three_queues(root, ops) as bus:
        info = bus.publish("t.x", b"k" * size, durable=True)
        ev = ops.events
        renames = [(i, e[1].split(" ")) for i, e in enumerate(ev) if e[0] == "rename"]
        assert len(renames) == 4  # the message and three copies
        assert any(dst == info.path for _, (_, dst) in renames)
        first_sync = min(i for i, e in enumerate(ev) if e[0] in ("fdatasync", "fsync"))
        assert all(i < first_sync for i, _ in renames) == (size < 4096)
        for i, (src, dst) in renames:
            synced = [j for j, e in enumerate(ev) if e == ("fdatasync", src)]
            assert synced, f"{src} never synced"
            assert (synced[0] > i) == (size < 4096)
            bucket = dst.rsplit("/", 1)[0]
            after = [j for j, e in enumerate(ev) if e == ("fsync", bucket) and j > i]
            assert after, f"{bucket} not synced after {dst} arrived"
        for q in "abc":
            assert bus.queue_info(q).depth == 1
        assert _staged(root) == []


def _buses_stamped_after_every_sync(ev: list[tuple[str, str]]) -> int:
    """How many buses' UPDATE files the recorded events stamp; every stamp must come
    after every sync."""
    stamps = [i for i, e in enumerate(ev) if e[0] == "stamp"]
    syncs = [i for i, e in enumerate(ev) if e[0] in ("fdatasync", "fsync")]
    assert min(stamps) > max(syncs), ev
    return len({ev[i][1].split(" ")[0] for i in stamps})


@MOUNTS
@pytest.mark.parametrize("queues", [0, 3])
def test_a_durable_publish_stamps_after_its_last_sync(root: Path, mount: str, queues: int) -> None:
    """Whichever the order, a durable publish stamps the buckets of the message and of
    each copy only after every sync of it: no subscriber is woken for a message a power
    cut could take back, and no listing, claim or stamp lands between two syncs (each
    would cost a journal commit of its own). A plain publish stamps at once."""
    with BlockingBus(root) as setup:
        for q in "abc"[:queues]:
            setup.declare_queue(q, ["t.#"])
    ops = _JournaledRecording() if mount == "place-first" else _UnorderedRecording()
    with BlockingBus(root, ops=ops, config=SYNCS) as bus:
        bus.publish("t.x", b"first", durable=True)  # opens each queue's bus
        ops.events.clear()
        bus.publish("t.x", b"kept", durable=True)
        ev = ops.events
        renames = [e[1].split(" ")[1] for e in ev if e[0] == "rename"]
        assert len(renames) == 1 + queues
        # one stamp per bus written to (the message's, each queue's), all after the syncs
        assert _buses_stamped_after_every_sync(ev) == 1 + queues
        ops.events.clear()
        bus.publish("t.x", b"plain")
        ev = ops.events
        # (a bucket's first message makes it, and on a mount that does not commit in
        # order syncs the folder that holds it: not the message)
        made = [e for e in ev if e[0] == "fsync" and e[1].endswith("/messages")]
        assert mount == "sync-first" or made == []
        rest = [e[0] for e in ev if e[0] != "rename" and e not in made]
        assert rest == ["stamp"] * (1 + queues)
        for q in "abc"[:queues]:
            assert bus.queue_info(q).depth == 3
        assert len(list(bus.browse("#"))) == 3


@pytest.mark.anyio
async def test_an_awaited_durable_publish_stamps_after_its_last_sync(root: Path) -> None:
    """The async face routes in a worker thread: the same holding back of stamps."""
    with BlockingBus(root) as setup:
        for q in "abc":
            setup.declare_queue(q, ["t.#"])
    ops = _JournaledRecording()
    async with Bus(root, ops=ops, config=SYNCS) as bus:
        await bus.publish("t.x", b"first", durable=True)
        ops.events.clear()
        await bus.publish("t.x", b"kept", durable=True)
        ev = list(ops.events)
        assert _buses_stamped_after_every_sync(ev) == 4
        for q in "abc":
            assert (await bus.queue_info(q)).depth == 2


@MOUNTS
def test_a_copy_that_fails_to_sync_withdraws_the_message(root: Path, mount: str) -> None:
    with BlockingBus(root) as setup:
        setup.declare_queue("a", ["t.#"])

    base: type[Ops] = JournaledExt4 if mount == "place-first" else UnorderedMount

    class FailOnCopies(base):
        def __init__(self) -> None:
            self.paths: dict[int, str] = {}

        def open(self, path: str, flags: int, mode: int = 0o666) -> int:
            fd = super().open(path, flags, mode)
            self.paths[fd] = path
            return fd

        def fdatasync(self, fd: int) -> None:
            if "/queues/" in self.paths[fd]:
                raise OSError(errno.EIO, "Input/output error")
            super().fdatasync(fd)

    with BlockingBus(root, ops=FailOnCopies(), config=SYNCS) as bus:
        with pytest.raises(StorageError, match="queue's copy"):
            bus.publish("t.x", b"lost", durable=True)
        assert bus.queue_info("a").depth == 0
        assert list(bus.browse("#")) == []
        assert _staged(root) == []


def test_enqueue_sees_a_queue_another_bus_deleted_or_declared(root: Path) -> None:
    with BlockingBus(root) as one, BlockingBus(root) as other:
        one.declare_queue("a", ["t.#"])
        for i in range(5):
            other.enqueue("a", "t.x", f"e{i}".encode())
        assert one.queue_info("a").depth == 5
        one.delete_queue("a")
        with pytest.raises(QueueNotFound):
            other.enqueue("a", "t.x", b"too late")
        one.declare_queue("a", ["t.#"], max_length=1, overflow="reject-publish")
        other.enqueue("a", "t.x", b"again")
        assert one.queue_info("a").depth == 1
        with pytest.raises(QueueFull):  # the new definition's options, not the old ones
            other.enqueue("a", "t.x", b"one too many")


@pytest.mark.parametrize("declared_again_by", ["writer", "deleter"])
def test_a_bus_that_wrote_into_a_queue_another_deleted_writes_into_the_new_one(
    root: Path, declared_again_by: str
) -> None:
    """A bus keeps the queues' buses it wrote into open. One that another bus deleted,
    then this bus or the other declared again, is a new directory: the next publish,
    enqueue and count use it (they kept using the deleted one's: a StorageError where
    the new folder was not laid out yet, and so for every later publish routed there)."""
    with BlockingBus(root) as writer, BlockingBus(root) as deleter:
        writer.declare_queue("q", ["t.#"])
        writer.publish("t.x", b"old")
        assert writer.queue_info("q").depth == 1
        deleter.delete_queue("q")
        (writer if declared_again_by == "writer" else deleter).declare_queue("q", ["t.#"])
        writer.publish("t.x", b"routed")
        writer.enqueue("q", "t.x", b"enqueued")
        writer.enqueue(["q"], "t.x", b"enqueued into several")
        assert writer.queue_info("q").depth == 3
        assert sorted(payload for _t, payload, _h in _drain(deleter, "q", 3)) == [
            b"enqueued",
            b"enqueued into several",
            b"routed",
        ]
        assert _staged(root) == []


@pytest.mark.parametrize("deleted_by", ["another bus", "the writer"])
def test_the_buses_of_deleted_queues_are_closed_once_retired(
    root: Path, monkeypatch: pytest.MonkeyPatch, deleted_by: str
) -> None:
    """A queue bus found stale, or of a queue the process deleted itself, stays open for
    ``RETIRE`` seconds (a publish in another thread may hold it), then is closed: a
    process whose queue is deleted and declared again over and over keeps no more
    descriptors open for it."""
    import fsbus._queues.store as store

    monkeypatch.setattr(store, "RETIRE", 0.0)

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    with BlockingBus(root) as writer, BlockingBus(root) as other:
        deleter = writer if deleted_by == "the writer" else other
        writer.declare_queue("q", ["t.#"])
        counts = []
        for i in range(30):
            writer.publish("t.x", str(i).encode())
            counts.append(open_fds())
            deleter.delete_queue("q")
            deleter.declare_queue("q", ["t.#"])
        writer.publish("t.x", b"last")
        assert writer.queue_info("q").depth == 1
    # No growth: a bus left open per queue would add its descriptors at every turn. (A
    # retired bus is closed a moment after it is set aside, so a count may catch one
    # still open: the early turns' highest count is the bound, not one early turn's.)
    assert max(counts[20:]) <= max(counts[:10]), counts


@pytest.mark.parametrize("durable", [True, False])
def test_enqueue_into_several_queues_copies_into_each(root: Path, durable: bool) -> None:
    """One enqueue into several queues: a copy in each that exists (one named twice gets
    one copy, a missing one is left out), with its headers, and each queue's own TTL."""
    with BlockingBus(root) as bus:
        bus.declare_queue("a", [])
        bus.declare_queue("b", [], message_ttl=3600)
        made = bus.enqueue(
            ["a", "b", "gone", "a"], "t.x", b"one", durable=durable, headers={"k": "v"}
        )
        assert made == 2
        assert _staged(root) == []
        short = list(bus.browse("#", queue="b"))
        long = list(bus.browse("#", queue="a"))
        assert len(short) == len(long) == 1
        assert short[0].expires < long[0].expires  # b's message_ttl, a's none
        for q in ("a", "b"):
            assert _drain(bus, q, 1) == [("t.x", b"one", {"k": "v"})]
        assert bus.enqueue([], "t.x", b"nowhere") == 0
        assert bus.enqueue(["gone"], "t.x", b"nowhere") == 0
        with pytest.raises(UsageError, match="queue name"):
            bus.enqueue(["a", "no/slash"], "t.x", b"bad name")


def test_a_full_queue_among_several_refuses_only_its_own_copy(root: Path) -> None:
    """A full reject-publish queue among several: the others get the message, then
    QueueFull names the full one (RabbitMQ's nack); the full queue keeps what it had."""
    with BlockingBus(root) as bus:
        bus.declare_queue("full", [], max_length=1, overflow="reject-publish")
        bus.declare_queue("a", [])
        bus.declare_queue("z", [])
        assert bus.enqueue(["a", "full", "z"], "t.x", b"1") == 3
        with pytest.raises(QueueFull, match=r"'full' is full .* 2 other queue"):
            bus.enqueue(["a", "full", "z"], "t.x", b"2")
        assert [bus.queue_info(q).depth for q in ("a", "full", "z")] == [2, 1, 2]
        assert [p for _t, p, _h in _drain(bus, "full", 1)] == [b"1"]
        for q in ("a", "z"):
            assert [p for _t, p, _h in _drain(bus, q, 2)] == [b"1", b"2"]


def test_async_enqueue_into_several_queues(root: Path) -> None:
    async def main() -> None:
        async with Bus(root) as bus:
            await bus.declare_queue("a", [])
            await bus.declare_queue("capped", [], max_length=1, overflow="reject-publish")
            assert await bus.enqueue(["a", "capped", "gone"], "t.x", b"1") == 2
            with pytest.raises(QueueFull, match="'capped'"):
                await bus.enqueue(["a", "capped"], "t.x", b"2", durable=True)
            assert await bus.enqueue("a", "t.x", b"3") == 1
            assert [(await bus.queue_info(q)).depth for q in ("a", "capped")] == [3, 1]

    anyio.run(main)


@pytest.mark.parametrize("how", ["publish", "enqueue", "durable enqueue"])
def test_a_publish_that_fails_on_a_copy_leaves_nothing_behind(root: Path, how: str) -> None:
    """A publish (not durable), or an enqueue into several queues, whose copy into one
    queue cannot be written raises, and neither the message nor the copies written
    before that one are left: retried (as kombu and an AMQP client do after an error or
    a nack), it would otherwise be there twice (queue a's copy stayed)."""

    def send(bus: BlockingBus, payload: bytes) -> None:
        if how == "publish":
            bus.publish("t", payload, durable=False)
        else:
            bus.enqueue(["a", "b"], "t", payload, durable=how.startswith("durable"))

    with BlockingBus(root) as bus:
        bus.declare_queue("a", ["t"])
        bus.declare_queue("b", ["t"])
        send(bus, b"first")  # both queues' buses laid out
        staging = root / "fsbus" / "queues" / "b" / "bus" / "staging"
        staging.rmdir()
        staging.write_text("not a folder")  # b's copies cannot be staged any more
        with pytest.raises(StorageError):
            send(bus, b"failed")
        assert _payloads(bus, "a") == [b"first"]
        main = [] if how.endswith("enqueue") else ["t"]
        assert [i.topic for i in bus.browse("#")] == main  # the first publish's only
        staging.unlink()
        staging.mkdir()
        send(bus, b"again")
        for q in ("a", "b"):
            assert _payloads(bus, q) == [b"first", b"again"]


def _payloads(bus: BlockingBus, queue: str) -> list[bytes | None]:
    """The payloads of ``queue``'s messages, in the order they were published."""
    infos = sorted(bus.browse("#", queue=queue), key=lambda i: (i.published_at or 0, i.name))
    return [bus.read_payload(i) for i in infos]


class DeletedWhileCopied(Ops):
    """Another bus deletes queue ``queue`` just as this one creates its copy there (the
    copy's staging file), once."""

    def __init__(self) -> None:
        self.deleter: BlockingBus | None = None
        self.queue = ""

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        marker = f"/fsbus/queues/{self.queue}/bus/staging/"
        if self.deleter is not None and flags & os.O_CREAT and marker in path:
            deleter, self.deleter = self.deleter, None
            deleter.delete_queue(self.queue)
        return super().open(path, flags, mode)


@pytest.mark.parametrize("how", ["enqueue", "publish", "durable publish"])
def test_a_queue_deleted_while_its_copy_is_written_fails_no_publish(root: Path, how: str) -> None:
    """A queue deleted by another bus while a publish writes its copy there (an AMQP
    queue's ``x-expires`` running out under a publish) got no copy, as if it had been
    deleted before: the publish succeeds, and the other queues have theirs (it used to
    raise a StorageError, which the AMQP gateway turned into a nack)."""
    seam = DeletedWhileCopied()
    with BlockingBus(root, ops=seam, config=SYNCS) as bus, BlockingBus(root) as deleter:
        for q in ("a", "doomed", "z"):
            bus.declare_queue(q, ["t.#"])
        bus.publish("t.x", b"before")
        seam.deleter, seam.queue = deleter, "doomed"
        if how == "enqueue":
            assert bus.enqueue(["a", "doomed", "z"], "t.x", b"during") == 2
        else:
            bus.publish("t.x", b"during", durable=how == "durable publish")
        assert seam.deleter is None  # the deletion ran under the copy's write
        assert [q.name for q in deleter.queues()] == ["a", "z"]
        for q in ("a", "z"):
            assert [payload for _t, payload, _h in _drain(deleter, q, 2)] == [b"before", b"during"]
        assert _staged(root) == []


class DeletedBeforeItsBucketSync(Ops):
    """Another bus deletes queue ``queue`` just before this one syncs the bucket
    directory of its durable copy there (the message and its copies visible by then)."""

    def __init__(self) -> None:
        self.deleter: BlockingBus | None = None
        self.queue = ""

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        bucket = f"/fsbus/queues/{self.queue}/bus/messages/"
        if self.deleter is not None and not flags & os.O_CREAT and bucket in path:
            if os.path.isdir(path):
                deleter, self.deleter = self.deleter, None
                deleter.delete_queue(self.queue)
        return super().open(path, flags, mode)


def test_a_durable_publish_whose_queue_goes_before_its_last_sync_does_not_fail(
    root: Path,
) -> None:
    """The last step of a durable publish syncs its copies' bucket directories, after
    the message and its copies are visible: a queue deleted just before that step leaves
    nothing there to sync, and the publish returns (it raised, and a publisher retrying
    it would have published it twice)."""
    seam = DeletedBeforeItsBucketSync()
    with BlockingBus(root, ops=seam, config=SYNCS) as bus, BlockingBus(root) as deleter:
        for q in ("a", "doomed"):
            bus.declare_queue(q, ["t.#"])
        seam.deleter, seam.queue = deleter, "doomed"
        bus.publish("t.x", b"durable", durable=True)
        assert seam.deleter is None  # the deletion ran before the bucket's sync
        assert [q.name for q in deleter.queues()] == ["a"]
        assert [payload for _t, payload, _h in _drain(deleter, "a", 1)] == [b"durable"]
        assert deleter.queue_info("a").depth == 0
        assert _staged(root) == []
