"""Where ``await Bus.publish`` runs its file operations (``fsbus._bus.offload``).

Inline on the event loop while the mount is fast, in a worker thread while it is slow,
and back. Which path a publish took is read from the I/O seam: the thread each call ran
on. The slow mount is a seam that sleeps 10 ms in every call; where a test needs to
know that something happened *during* a call, the seam waits for it on an event (with a
deadline), never on a timer.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from fsbus import Bus, BusConfig, Message, QueueNotFound
from fsbus._bus import offload
from fsbus._bus.offload import FAST_RUN
from fsbus._bus.ops import Ops

from .conftest import WAIT, files_under, message_files

PAYLOAD = b"x" * 100


@pytest.fixture(autouse=True)
def thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thresholds for a busy test machine: a fast seam call takes microseconds but a
    loaded machine can stretch a publish to a few milliseconds; the slow seam takes
    30 ms per plain publish for certain (open, writev and rename: 10 ms or more each)."""
    monkeypatch.setattr(offload, "SLOW", 0.02)
    monkeypatch.setattr(offload, "FAST", 0.005)


TRIES = 5000
"""Publishes a test may make waiting for the path to change (each a few µs on a fast
mount); only a bus that never changes path gets near it."""


class Seam(Ops):
    """Records the thread of the calls of a publish (open, writev, fdatasync, rename; the
    staging file may be a spare made ahead) and sleeps ``delay`` seconds in each while it
    is set.

    ``gate``: a call named ``gate_op`` on the staging area or into a bucket waits there
    for ``release`` (at most :data:`WAIT` seconds) after setting ``entered``.
    """

    def __init__(self) -> None:
        self.delay = 0.0
        self.threads: list[tuple[str, int]] = []  # (call, thread id) of every publish call
        self.gate_op: str | None = None
        self.entered = threading.Event()
        self.release = threading.Event()
        self.during: list[object] = []  # what ``inside`` returned, per gated call
        self.inside: object = None  # called in a gated call, before it waits
        self.paths: dict[int, str] = {}
        self.placed: list[str] = []  # names renamed into a bucket, in order

    def _call(self, op: str, path: str) -> None:
        if "/staging/" not in path and "/messages/" not in path and "/spares/" not in path:
            return
        self.threads.append((op, threading.get_ident()))
        if self.delay:
            time.sleep(self.delay)
        if op == self.gate_op:
            self.gate_op = None  # once
            self.entered.set()
            if callable(self.inside):
                self.during.append(self.inside())
            assert self.release.wait(WAIT), "the test never released the gated call"

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        self._call("open", path)
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def writev(self, fd: int, buffers: object) -> int:  # type: ignore[override]
        self._call("writev", self.paths.get(fd, ""))
        return super().writev(fd, buffers)  # type: ignore[arg-type]

    def fdatasync(self, fd: int) -> None:
        self._call("fdatasync", self.paths.get(fd, ""))
        super().fdatasync(fd)

    def rename(self, src: str, dst: str) -> None:
        recorded = len(self.threads)
        self._call("rename", dst)
        try:
            super().rename(src, dst)
        except FileNotFoundError:
            # a bucket's first message: the bucket is made and the rename made again,
            # which counts (a rename this seam did not record is left alone)
            del self.threads[recorded:]
            raise
        if "/messages/" in dst:
            self.placed.append(os.path.basename(dst))

    def renames(self) -> list[int]:
        """Thread of each rename into a bucket, in order."""
        return [t for op, t in self.threads if op == "rename"]


def read(path: str) -> bytes:
    """A message file's bytes."""
    return Path(path).read_bytes()


async def publish_until_inline(bus: Bus, seam: Seam) -> None:
    """Publish until one rename runs on this (the loop's) thread."""
    me = threading.get_ident()
    for _ in range(TRIES):
        await bus.publish("t.fast", PAYLOAD)
        if seam.renames()[-1] == me:
            return
    pytest.fail(f"{TRIES} publishes on a fast seam and none ran inline")


@pytest.mark.anyio
async def test_a_new_bus_measures_in_the_thread_then_publishes_inline(root: Path) -> None:
    seam = Seam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        await bus.publish("t.first", PAYLOAD)
        assert seam.renames() == [seam.renames()[0]]
        assert seam.renames()[0] != me  # the first publish knows nothing of the mount yet
        await publish_until_inline(bus, seam)
        assert len(seam.renames()) > FAST_RUN  # after a run of fast ones in the thread
        stats = bus._offload
        assert stats.inline_runs >= 1
        assert stats.thread_runs >= FAST_RUN
        count = len(seam.renames())
    assert len(message_files(root)) == count
    assert files_under(root / "staging") == []


@pytest.mark.anyio
async def test_a_slow_mount_moves_publishes_to_a_thread_and_back(root: Path) -> None:
    seam = Seam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        await publish_until_inline(bus, seam)
        seam.delay = 0.01  # every call now takes 10 ms: a publish 30 ms or more
        before = len(seam.renames())
        for _ in range(5):
            await bus.publish("t.slow", PAYLOAD)
        slow = seam.renames()[before:]
        # Two met the slow mount inline (one could be a hiccup); the others ran in a
        # worker thread.
        assert slow[:2] == [me, me]
        assert all(t != me for t in slow[2:])
        assert not bus._offload.inline
        seam.delay = 0.0
        before = len(seam.renames())
        await publish_until_inline(bus, seam)
        back = seam.renames()[before:]
        assert back[0] != me  # the first fast one still went to the thread
        assert back[-1] == me
        total = len(seam.renames())
    assert len(message_files(root)) == total
    assert files_under(root / "staging") == []


@pytest.mark.anyio
async def test_slow_publishes_two_fast_ones_apart_are_hiccups_one_apart_a_slow_mount(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow inline publish is a strike; the second within ``STRIKE_WINDOW`` (two)
    inline publishes moves publishing to the thread. Slow ones with two fast ones
    between are taken for hiccups (a busy machine preempts the loop's process now and
    then): publishing stays inline. A mount slow every other publish is a slow mount."""
    # Every fast publish here must stay under SLOW: 20 ms was too little beside a full
    # test run on two cores (one took longer, a third strike). 60 ms, slow ones 90 ms.
    monkeypatch.setattr(offload, "SLOW", 0.06)
    seam = Seam()
    me = threading.get_ident()

    async def publish(delay: float) -> None:
        seam.delay = delay
        await bus.publish("t.x", PAYLOAD)
        seam.delay = 0.0

    async with Bus(root, ops=seam) as bus:
        await publish_until_inline(bus, seam)
        before = len(seam.renames())
        for _ in range(3):
            await publish(0.03)  # (three calls: 90 ms or more, past SLOW here)
            await publish(0.0)
            await publish(0.0)
        assert bus._offload.inline
        assert seam.renames()[before:] == [me] * 9
        await publish(0.03)
        await publish(0.0)
        await publish(0.03)
        assert not bus._offload.inline
        await publish(0.0)
        assert seam.renames()[-1] != me
        total = len(seam.renames())
    assert len(message_files(root)) == total


@pytest.mark.anyio
async def test_concurrent_publishes_on_a_slow_mount_share_thread_hops(root: Path) -> None:
    seam = Seam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        seam.delay = 0.005
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(bus.publish, f"t.c{i}", PAYLOAD)
        assert all(t != me for _, t in seam.threads)
        assert bus._offload.thread_runs == 20
    assert len(message_files(root)) == 20


@pytest.mark.anyio
async def test_publishes_on_a_slow_mount_read_a_fresh_routing_table_without_a_hop(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the thread, the durable-queue routing table is looked up in memory while it is
    fresh; only a due check of its VERSION file (a stat) takes a worker-thread hop of
    its own (one hop per publish for the lookup alone, before)."""
    from fsbus._queues import store

    monkeypatch.setattr(store, "REFRESH", 60.0)  # fresh for the whole test once read
    seam = Seam()
    async with Bus(root, ops=seam) as bus:
        seam.delay = 0.005
        await bus.publish("t.first", PAYLOAD)  # the table is read here, in the thread
        assert not bus._offload.inline
        real = bus._queues.targets
        lookups: list[int] = []

        def counting(topic: str) -> tuple[object, ...]:
            lookups.append(threading.get_ident())
            return real(topic)

        monkeypatch.setattr(bus._queues, "targets", counting)
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(bus.publish, f"t.c{i}", PAYLOAD)
        assert lookups == []
    assert len(message_files(root)) == 21


@pytest.mark.anyio
async def test_the_loop_keeps_running_while_a_publish_waits_on_a_slow_mount(root: Path) -> None:
    """A ticker task counts loop turns; the slow call itself checks that it counted on."""
    seam = Seam()
    ticks = [0]
    goal = threading.Event()

    async def ticker() -> None:
        while True:
            ticks[0] += 1
            if ticks[0] >= want[0]:
                goal.set()
            await anyio.lowlevel.checkpoint()

    want = [1 << 62]

    def inside() -> int:
        # In the slow call: wait (with a deadline) until the loop ticked 3 more times.
        # Were this call on the loop's thread, the ticker could not tick and this would
        # time out.
        start = ticks[0]
        want[0] = start + 3
        goal.clear()
        reached = goal.wait(WAIT)
        return ticks[0] - start if reached else -1

    async with Bus(root, ops=seam) as bus:
        await publish_until_inline(bus, seam)
        seam.delay = 0.01
        for _ in range(2):  # meet the slow mount (inline: two strikes)
            await bus.publish("t.slow", PAYLOAD)
        assert not bus._offload.inline
        seam.inside = inside
        seam.gate_op = "rename"
        seam.release.set()  # the gated call does not wait for the test, only for ticks
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            for _ in range(3):
                await bus.publish("t.slow", PAYLOAD)
            tg.cancel_scope.cancel()
    assert seam.during
    assert seam.during[0] >= 3


@pytest.mark.anyio
async def test_durable_publishes_never_run_inline(root: Path) -> None:
    seam = Seam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        await publish_until_inline(bus, seam)
        before = len(seam.threads)
        await bus.publish("t.durable", PAYLOAD, durable=True)
        calls = seam.threads[before:]
        assert ("fdatasync", calls[0][1]) in calls
        assert all(t != me for _, t in calls)
        assert bus._offload.inline  # a sync says nothing about the mount: still inline


async def cancel_during(bus: Bus, seam: Seam, op: str) -> tuple[bool, list[str]]:
    """Publish on the thread path, cancel it while its call ``op`` is held in the seam.

    Returns whether the publish raised a cancellation, and the bucket files seen at the
    moment it did.
    """
    seam.gate_op = op
    raised = anyio.Event()
    seen: list[str] = []
    scope = anyio.CancelScope()

    async def publish() -> None:
        with scope:
            try:
                await bus.publish("t.cancel", PAYLOAD)
            except anyio.get_cancelled_exc_class():
                seen.extend(message_files(Path(bus.root)))
                raised.set()
                raise

    async with anyio.create_task_group() as tg:
        tg.start_soon(publish)
        assert await anyio.to_thread.run_sync(seam.entered.wait, WAIT)
        scope.cancel()
        if op != "rename":
            # Withdrawn: the cancelled caller does not wait for the held call.
            with anyio.fail_after(WAIT):
                await raised.wait()
            assert not seam.release.is_set()
        seam.release.set()
    return raised.is_set(), seen


@pytest.mark.anyio
@pytest.mark.parametrize("op", ["open", "writev"])
async def test_a_publish_cancelled_before_its_rename_is_withdrawn_whole(
    root: Path, op: str
) -> None:
    seam = Seam()
    async with Bus(root, ops=seam) as bus:
        assert not bus._offload.inline  # a new bus: this one goes to the thread
        raised, seen = await cancel_during(bus, seam, op)
        assert raised
        assert seen == []
        # Queued behind the withdrawn one, on the same thread path: it runs after the
        # thread has given that one up (and removed what it staged).
        assert not bus._offload.inline
        await bus.publish("t.after", PAYLOAD)
    assert files_under(root / "staging") == []
    (only,) = message_files(root)
    assert "@" in only
    assert bytes.fromhex(os.path.basename(only).split("@")[0]).decode() == "t.after"


@pytest.mark.anyio
async def test_a_publish_cancelled_during_its_rename_lands_whole_before_it_raises(
    root: Path,
) -> None:
    seam = Seam()
    async with Bus(root, ops=seam) as bus:
        raised, seen = await cancel_during(bus, seam, "rename")
        assert raised
        assert len(seen) == 1  # placed before the cancellation was raised
        assert read(str(root / "messages" / seen[0])) == b"\x00" + PAYLOAD
    assert files_under(root / "staging") == []
    assert message_files(root) == seen


@pytest.mark.anyio
async def test_a_publish_cancelled_while_queued_writes_nothing(root: Path) -> None:
    """Queued behind a held publish, a cancelled one never reaches the filesystem."""
    seam = Seam()
    async with Bus(root, ops=seam) as bus:
        seam.gate_op = "open"
        cancelled = anyio.CancelScope()

        async def second() -> None:
            with cancelled:
                await bus.publish("t.second", PAYLOAD)

        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.publish, "t.first", PAYLOAD)
            assert await anyio.to_thread.run_sync(seam.entered.wait, WAIT)
            tg.start_soon(second)
            with anyio.fail_after(WAIT):
                while not bus._offload._queue:
                    await anyio.lowlevel.checkpoint()
            cancelled.cancel()
            seam.release.set()
        assert len(seam.placed) == 1  # the first publish's only
    (only,) = message_files(root)
    assert bytes.fromhex(os.path.basename(only).split("@")[0]).decode() == "t.first"
    assert files_under(root / "staging") == []


@pytest.mark.anyio
async def test_a_task_publishes_in_order_across_path_changes(root: Path) -> None:
    seam = Seam()
    got: list[str] = []
    async with Bus(root, ops=seam) as bus:
        me = threading.get_ident()
        i = 0
        while seam.renames()[-1:] != [me]:  # until one ran inline
            assert i < TRIES
            got.append((await bus.publish("t.order", f"{i}")).name)
            i += 1
        seam.delay = 0.01
        for j in range(i, i + 4):
            got.append((await bus.publish("t.order", f"{j}")).name)
    # Each returned only once its file was in place: renames happened in call order.
    assert seam.placed == got
    assert bus._offload.switches >= 2  # to inline, then back to the thread
    assert len(message_files(root)) == len(got)


@pytest.mark.anyio
async def test_an_inline_plain_publish_writes_what_the_general_path_writes(root: Path) -> None:
    seam = Seam()
    async with Bus(root, ops=seam) as bus:
        await publish_until_inline(bus, seam)
        before = len(seam.renames())
        text = await bus.publish("t.fast", "héllo")  # str: UTF-8
        work = await bus.publish("t.fast", PAYLOAD, single=True)
        assert seam.renames()[before:] == [threading.get_ident()] * 2  # both inline
        general = await bus.publish("t.fast", PAYLOAD, headers={"h": "v"})  # planned
        for info, payload in ((text, "héllo".encode()), (work, PAYLOAD), (general, PAYLOAD)):
            assert read(info.path) == b"\x00" + payload
            assert info.topic == "t.fast"
            assert info.size == len(payload)
            assert Path(info.path).parent.name == info.bucket
        assert work.single
        assert not text.single
        assert bus.statistics().published == len(seam.renames())


def queue_copies(root: Path, queue: str) -> list[str]:
    """``<bucket>/<name>`` of every copy in queue ``queue``."""
    return files_under(root / "fsbus" / "queues" / queue / "bus" / "messages")


@pytest.mark.anyio
async def test_a_publish_into_bound_queues_runs_inline_and_moves_to_the_thread_when_slow(
    root: Path,
) -> None:
    """The message and its queue copies are written on the loop while the mount is fast
    (a worker-thread hop per publish cost ten times the files' own time), and go to the
    thread, with plain publishes, when the mount turns slow."""
    seam = Seam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        await bus.declare_queue("a", ["t.q"])
        await bus.declare_queue("b", ["*.q"])
        await publish_until_inline(bus, seam)
        before = len(seam.threads)
        await bus.publish("t.q", PAYLOAD)
        calls = seam.threads[before:]
        assert [op for op, _ in calls].count("rename") == 3  # the message and two copies
        assert all(t == me for _, t in calls)
        seam.delay = 0.01
        before = len(seam.renames())
        for _ in range(4):
            await bus.publish("t.q", PAYLOAD)
        slow = seam.renames()[before:]
        assert len(slow) == 12
        # the first publish met the slow mount inline (three files), then a second
        # strike; what followed ran in a worker thread
        assert slow[:3] == [me] * 3
        assert all(t != me for t in slow[6:])
        assert not bus._offload.inline
    assert len(queue_copies(root, "a")) == len(queue_copies(root, "b")) == 5
    assert files_under(root / "staging") == []


@pytest.mark.anyio
async def test_a_publish_into_a_capped_queue_never_runs_inline(root: Path) -> None:
    """Keeping a queue to its max_length counts it now and then, which takes long for a
    deep queue: such publishes keep to the worker thread, whatever the mount."""
    seam = Seam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        await bus.declare_queue("capped", ["t.c"], max_length=10)
        await publish_until_inline(bus, seam)
        before = len(seam.threads)
        for _ in range(12):
            await bus.publish("t.c", PAYLOAD)
        copies = [t for op, t in seam.threads[before:] if op == "rename"]
        assert len(copies) == 24
        assert me not in copies[1::2]  # each copy, after its message
        assert bus._offload.inline
        info = await bus.queue_info("capped")
    assert info.depth == 10


@pytest.mark.anyio
async def test_enqueue_runs_inline_unless_durable_or_capped(root: Path) -> None:
    """``await bus.enqueue`` writes straight into a queue on the loop while the mount is
    fast; a durable one (synced) and one into a capped queue go to the worker thread."""
    seam = Seam()
    me = threading.get_ident()
    async with Bus(root, ops=seam) as bus:
        await bus.declare_queue("open", [])
        await bus.declare_queue("capped", [], max_length=3)
        await publish_until_inline(bus, seam)

        async def enqueue_threads(queue: str, *, durable: bool = False) -> list[int]:
            before = len(seam.threads)
            await bus.enqueue(queue, "t.e", PAYLOAD, durable=durable)
            return [t for op, t in seam.threads[before:] if op == "rename"]

        assert await enqueue_threads("open") == [me]
        [durable] = await enqueue_threads("open", durable=True)
        assert durable != me
        for _ in range(5):
            [capped] = await enqueue_threads("capped")
            assert capped != me
        assert (await bus.queue_info("open")).depth == 2
        assert (await bus.queue_info("capped")).depth == 3
        with pytest.raises(QueueNotFound):
            await bus.enqueue("missing", "t.e", PAYLOAD)


@pytest.mark.anyio
async def test_gets_take_and_settle_on_the_loop_once_the_queue_mount_measures_fast(
    root: Path,
) -> None:
    """``bus.get`` lists, claims and acks (or gives back) a queue's message inline while
    the mount is fast: three worker-thread hops a get cost four times the work. Every
    message is taken once, a failed one comes back, and the queue ends empty."""
    n = FAST_RUN * 4
    async with Bus(root) as bus:
        await bus.declare_queue("q", ["t.#"])
        for i in range(n):
            await bus.publish("t.x", b"%d" % i)
        got: list[bytes] = []
        failed_once = False
        while True:
            try:
                async with bus.get("q") as msg:
                    if msg is None:
                        break
                    if msg.payload == b"7" and not failed_once:
                        failed_once = True
                        raise ValueError("handled badly once")  # given back, counted
                    got.append(msg.payload)
            except ValueError:
                pass
        inner = bus._queue_buses["q"].bus
        assert inner._offload.inline_runs > 0  # the gets moved onto the loop
        assert inner._offload.thread_runs >= FAST_RUN  # after measuring in the thread
        assert failed_once
        assert sorted(got) == sorted(b"%d" % i for i in range(n))
        assert (await bus.queue_info("q")).depth == 0


class ClaimSeam(Seam):
    """:class:`Seam`, also recording the thread of each claim (a rename into
    ``fsbus/claims/``) and each ack (the claimed file's unlink)."""

    def __init__(self) -> None:
        super().__init__()
        self.consuming: list[tuple[str, int]] = []

    def rename(self, src: str, dst: str) -> None:
        if "/claims/" in dst:
            self.consuming.append(("claim", threading.get_ident()))
        super().rename(src, dst)

    def unlink(self, path: str) -> None:
        if "/claims/" in path:
            self.consuming.append(("ack", threading.get_ident()))
        super().unlink(path)


@pytest.mark.anyio
async def test_claims_and_acks_run_on_the_loop_while_the_mount_is_fast(root: Path) -> None:
    """A work-queue subscription's claim rounds and its batches of acks take the
    publishes' path: inline on a fast mount (a worker-thread hop each cost more than the
    renames and unlinks), and every message is handled once."""
    seam = ClaimSeam()
    me = threading.get_ident()
    n = FAST_RUN * 4
    got: list[bytes] = []
    done = anyio.Event()

    async def handler(msg: Message) -> None:
        got.append(msg.payload)
        if len(got) == n:
            done.set()

    async with Bus(root, ops=seam, config=BusConfig(locking="rename")) as bus:
        await publish_until_inline(bus, seam)
        await bus.subscribe("t.w", handler, kind="single")
        for i in range(n):
            await bus.publish("t.w", b"%d" % i, single=True)
        with anyio.fail_after(WAIT):
            await done.wait()
        with anyio.fail_after(WAIT):
            while sum(op == "ack" for op, _ in seam.consuming) < n:  # noqa: ASYNC110
                await anyio.sleep(0.01)  # the last batch of acks lands just after
    assert sorted(got) == sorted(b"%d" % i for i in range(n))
    claims = [t for op, t in seam.consuming if op == "claim"]
    acks = [t for op, t in seam.consuming if op == "ack"]
    assert len(claims) == len(acks) == n
    assert me in claims  # the bus had measured its mount fast: claims moved inline
    assert me in acks
    assert files_under(root / "fsbus" / "claims") == []  # every claim acked
    assert len(message_files(root)) == len(seam.renames()) - n  # the multi ones stay


class OneSlowClaim(ClaimSeam):
    """:class:`ClaimSeam` whose first claim on the loop's thread takes 50 ms: the machine
    busy for a moment (another process's disk work, a preemption)."""

    def __init__(self, loop: int) -> None:
        super().__init__()
        self.loop = loop
        self.slow_at: int | None = None  # its index in ``consuming``

    def rename(self, src: str, dst: str) -> None:
        if "/claims/" in dst and self.slow_at is None and threading.get_ident() == self.loop:
            self.slow_at = len(self.consuming)
            time.sleep(0.05)
        super().rename(src, dst)


@pytest.mark.anyio
async def test_claims_go_back_on_the_loop_after_one_slow_batch(root: Path) -> None:
    """One batch of claims that held the loop (50 ms for one claim) raises the cost per
    item the loop budgets for, and the next batches go to the thread; the claims they
    make there, each fast, bring it down again, and claims run inline once more. (Before,
    only an inline batch could lower it: none ran inline again, for good.)"""
    me = threading.get_ident()
    seam = OneSlowClaim(me)
    got: list[bytes] = []
    sent = 0

    async def handler(msg: Message) -> None:
        got.append(msg.payload)

    async with Bus(root, ops=seam, config=BusConfig(locking="rename")) as bus:
        await publish_until_inline(bus, seam)
        await bus.subscribe("t.w", handler, kind="single")
        for _ in range(200):
            for _ in range(8):
                await bus.publish("t.w", b"%d" % sent, single=True)
                sent += 1
            with anyio.fail_after(WAIT):
                while len(got) < sent:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            at = seam.slow_at
            if at is not None and any(
                op == "claim" and t == me for op, t in seam.consuming[at + 1 :]
            ):
                break
        else:
            pytest.fail(f"after one slow claim, none of {sent} ran on the loop again")
    assert sorted(got) == sorted(b"%d" % i for i in range(sent))
    assert seam.slow_at is not None
    assert any(op == "claim" and t != me for op, t in seam.consuming[seam.slow_at + 1 :])


class SlowAckSeam(ClaimSeam):
    """:class:`ClaimSeam` whose acks (unlinks of claimed files) take ``ack_delay`` seconds
    each: a batch of many acks is slow as a whole, each ack in it fast."""

    def __init__(self, ack_delay: float) -> None:
        super().__init__()
        self.ack_delay = ack_delay

    def unlink(self, path: str) -> None:
        if "/claims/" in path:
            time.sleep(self.ack_delay)
        super().unlink(path)

    def acks(self) -> int:
        """Acks made so far."""
        return sum(op == "ack" for op, _ in self.consuming)


async def consume_in_batches(
    root: Path,
    seam: SlowAckSeam,
    n: int,
    batch: int,
    after: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[list[bytes], float]:
    """Publish ``n`` messages into queue ``q``, then consume them with a prefetch of
    ``batch``, each handler held until ``batch`` are held so that their acks queue
    together; ``after(count)`` runs in each handler once it has counted its message.
    Returns the payloads handled and the queue bus's :attr:`Offload.item_cost`, once
    every ack has reached the seam."""
    got: list[bytes] = []
    held: list[anyio.Event] = []
    done = anyio.Event()

    async def handler(msg: Message) -> None:
        gate = anyio.Event()
        held.append(gate)
        got.append(msg.payload)
        if after is not None:
            await after(len(got))
        if len(held) == batch or len(got) == n:
            for g in held:
                g.set()
            held.clear()
        with anyio.fail_after(WAIT):
            await gate.wait()
        if len(got) == n:
            done.set()

    config = BusConfig(locking="rename", handler_concurrency=batch)
    async with Bus(root, ops=seam, config=config) as bus:
        await bus.declare_queue("q", ["t.#"])
        for i in range(n):
            await bus.publish("t.w", b"%d" % i)
        await bus.subscribe(None, handler, queue="q", prefetch=batch)
        with anyio.fail_after(WAIT):
            await done.wait()
        with anyio.fail_after(WAIT * 2):
            while seam.acks() < n:  # noqa: ASYNC110
                await anyio.sleep(0.01)  # the last batch of acks lands just after
        item_cost = bus._queue_buses["q"].bus._offload.item_cost
    return got, item_cost


@pytest.mark.anyio
async def test_batches_of_acks_are_timed_per_ack(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue consumer with a prefetch acks in batches. Each batch of ``batch`` acks
    takes longer than FAST as a whole, but each ack in it is fast, so the queue's bus
    (which never publishes) moves its claims and acks onto the loop once it has measured
    them: timed whole, every batch looked slow and each cost two thread hops. Every
    message is handled once."""
    monkeypatch.setattr(offload, "BATCH_BUDGET", 0.015)
    batch, rounds = 20, 3 * FAST_RUN
    seam = SlowAckSeam(0.0004)  # 20 acks: 8 ms or more, above FAST (5 ms); each well under
    n = batch * rounds
    got, item_cost = await consume_in_batches(root, seam, n, batch)
    assert item_cost < offload.FAST  # per ack, not per batch
    assert sorted(got) == sorted(b"%d" % i for i in range(n))
    acks = [t for op, t in seam.consuming if op == "ack"]
    assert len(acks) == n
    assert threading.get_ident() in acks  # measured fast per ack: batches moved onto the loop


@pytest.mark.anyio
async def test_a_batch_of_acks_on_the_loop_stops_when_the_mount_turns_slow(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks batched onto the loop, then the mount turns slow (each ack 30 ms, SLOW being
    20 ms here): a batch running inline stops after the ack that took it past SLOW and
    hands the rest to the thread, so no batch of ``batch`` acks runs whole on the loop
    (it would hold it ``batch`` times 30 ms), and two such strikes send the work to the
    thread. Every message is still handled and acked once."""
    monkeypatch.setattr(offload, "BATCH_BUDGET", 0.015)
    batch, fast_rounds, slow_rounds = 20, 3 * FAST_RUN, 6
    seam = SlowAckSeam(0.0)
    me = threading.get_ident()
    n = batch * (fast_rounds + slow_rounds)
    slow_from = 0  # index in seam.consuming where the acks turned slow

    async def turn_slow(count: int) -> None:
        nonlocal slow_from
        if count == batch * fast_rounds:  # every fast batch's acks queued before this
            with anyio.fail_after(WAIT):
                while seam.acks() < count - batch:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            slow_from = len(seam.consuming)
            seam.ack_delay = 0.03

    got, _ = await consume_in_batches(root, seam, n, batch, turn_slow)
    assert sorted(got) == sorted(b"%d" % i for i in range(n))
    acks = [t for op, t in seam.consuming if op == "ack"]
    assert len(acks) == n
    assert me in acks[: batch * fast_rounds - batch]  # the fast batches ran on the loop
    slow_inline = [t for op, t in seam.consuming[slow_from:] if op == "ack" and t == me]
    assert len(slow_inline) < batch  # no batch of slow acks ran whole on the loop
