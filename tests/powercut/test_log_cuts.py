"""Power cuts with the durable log (``durable_log="on"``, :mod:`fsbus._bus.wal`).

A durable publish writes its files unsynced and makes them durable by one record in the
process's log; after a restart of the machine, the next bus to open replays the records
after the log's checkpoint. Here powerfs is the disk, and :class:`PowerOps` is the
kernel: its ``syncfs`` makes everything durable (powerfs ``sync``), or fails with EIO
once the power is cut, and its ``boot_id`` is the test's (another one after a cut: the
machine restarted). Each run is held to the same promise as a durable publish without
the log: every publish that returned is there once, whole, with its headers (and in
each durable queue it routes to); nothing torn is in view; and the log is gone once
recovered.
"""

from __future__ import annotations

import collections
import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator

import pytest

from fsbus import BlockingBus, BusConfig, StorageError
from fsbus._bus import wal
from fsbus._bus.ops import Ops

from .checks import (
    BUS_CONFIG,
    Item,
    Tally,
    bus_items,
    check_bus,
    count_ops,
    cut_points,
    publish_all,
    quiet_close,
    run_until_cut,
)
from .harness import PowerCut

# Each test replays the workload at every cut point on a FUSE filesystem: minutes on a
# slow machine. The limit guards against a hang, it is not a speed assertion.
pytestmark = pytest.mark.timeout(900)

WAL_CONFIG: BusConfig = BUS_CONFIG.model_copy(update={"durable_log": "on"})
BOOT = "boot-before-the-cut"
REBOOTED = "boot-after-the-cut"
QUEUES = {"q1": "orders.#", "q2": "orders.*"}


class PowerOps(Ops):
    """The kernel of the machine whose disk powerfs is.

    ``syncfs`` puts everything on disk (powerfs ``sync``), as syncfs(2) does, and fails
    with EIO once the power is cut, as powerfs's operations do. ``boot_id`` is
    :attr:`boot`: the test changes it to show a restarted machine. powerfs is a FUSE
    mount, which a bus takes for one other hosts may share (where ``durable_log="on"``
    is refused): the mount table is shown with an unknown type, a local disk.
    ``events`` records the syncfs calls, the unlinks and the files recovery rewrites.
    """

    def __init__(self, pfs: PowerCut, boot: str = BOOT) -> None:
        self.pfs = pfs
        self.boot = boot
        self.events: list[tuple[str, str]] = []

    def boot_id(self) -> str:
        return self.boot

    def syncfs(self, fd: int) -> None:
        self.events.append(("syncfs", ""))
        try:
            self.pfs.sync()
        except RuntimeError as exc:
            if self.pfs.status()["dead"]:
                raise OSError(errno.EIO, "syncfs: power is cut") from exc
            raise

    def unlink(self, path: str) -> None:
        self.events.append(("unlink", path))
        super().unlink(path)

    def rename(self, src: str, dst: str) -> None:
        if "restored" in os.path.basename(src):  # recovery's staged file (wal._restore)
            self.events.append(("restore", dst))
        super().rename(src, dst)

    def read_text(self, path: str) -> str | None:
        text = super().read_text(path)
        if path == "/proc/self/mountinfo" and text:
            text = text.replace(" - fuse.powercut ", " - powercut ")
        return text


@pytest.fixture(autouse=True)
def small_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 128 KiB log (quick to make on powerfs; no test but the wrapping one fills it),
    and no timed checkpoints: the cut points stay the same from run to run."""
    monkeypatch.setattr(wal, "LOG_SIZE", 128 << 10)
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY", 3600.0)


@pytest.fixture(scope="module")
def bus_root(pfs: PowerCut) -> str:
    """Two synced states of one bus, each saved: ``wal-fresh``, as made (its log's folder
    is made by its first durable publish), and ``wal-ready``: its log's folder there, as
    an earlier durable publish leaves it, and durable queues q1 (``orders.#``) and q2
    (``orders.*``) declared."""
    pfs.load("empty")
    root = f"{pfs.mountpoint}/wbus"
    with BlockingBus(root, config=BUS_CONFIG):
        pass
    pfs.sync()
    pfs.save("wal-fresh")
    os.mkdir(f"{root}/fsbus/wal")
    with BlockingBus(root, config=BUS_CONFIG) as bus:
        for name, pattern in QUEUES.items():
            bus.declare_queue(name, [pattern])
    pfs.sync()
    pfs.save("wal-ready")
    return root


def order_items(seed: int, n: int) -> list[Item]:
    """:func:`bus_items` on ``orders.`` topics, routed to both queues."""
    return [
        Item("orders." + it.topic.removeprefix("jobs."), it.payload, it.single, it.headers)
        for it in bus_items(seed, n)
    ]


def open_bus(root: str, ops: PowerOps) -> BlockingBus:
    """The bus at ``root`` open, its durable log on. An open that fails (the power cut
    under it) is closed here: ``BlockingBus.__enter__`` leaves the UPDATE file that
    ``setup`` opened open when a later step (the log's recovery, say) raises."""
    bus = BlockingBus(root, config=WAL_CONFIG, ops=ops)
    try:
        return bus.__enter__()
    except BaseException:
        quiet_close(bus._fs.close)
        quiet_close(bus._queues.close)
        raise


def publishing(root: str, ops: PowerOps, items: list[Item], acked: set[str]) -> Callable[[], None]:
    """The work of a run: open the bus, publish durably, close (or die trying)."""

    def work() -> None:
        bus = open_bus(root, ops)
        try:
            publish_all(bus, items, True, acked)
        finally:
            quiet_close(bus.close)

    return work


def logs(root: str) -> list[str]:
    try:
        return sorted(os.listdir(f"{root}/fsbus/wal"))
    except FileNotFoundError:
        return []


def recover(pfs: PowerCut, root: str, boot: str = REBOOTED) -> PowerOps:
    """Open the bus as the restarted machine's first program does (recovery), close."""
    ops = PowerOps(pfs, boot)
    open_bus(root, ops).close()
    return ops


def check_recovered(
    root: str,
    items: list[Item],
    acked: set[str],
    where: str,
    tally: Tally,
    *,
    queues: bool = False,
    deliver: bool = False,
) -> None:
    """After recovery: the log gone, each acknowledged publish once on the bus (and in
    each queue, whole, with its headers), then :func:`check_bus`."""
    assert not wal._logs, f"{where}: a log left registered in this process: {wal._logs}"
    left = logs(root)
    if left:
        tally.corrupt.append(f"{where}: durable log(s) left after recovery: {left}")
    by_topic = {it.topic: it for it in items}
    with BlockingBus(root, config=BUS_CONFIG) as bus:
        counts = collections.Counter(info.topic for info in bus.browse("#"))
        for topic, n in counts.items():
            if n > 1:
                tally.corrupt.append(f"{where}: {topic} on the bus {n} times")
        for name in QUEUES if queues else ():
            got: collections.Counter[str] = collections.Counter()
            for info in bus.browse(queue=name):
                item = by_topic.get(info.topic)
                payload = bus.read_payload(info)
                if payload is None and info.size <= 0:
                    continue  # an empty file: a copy whose data never reached the disk
                if item is None or payload != item.payload:
                    tally.corrupt.append(f"{where}: {name}: {info.topic} read as {payload!r:.40}")
                    continue
                if dict(info.headers) != (item.headers or {}):
                    tally.corrupt.append(f"{where}: {name}: {info.topic} headers {info.headers}")
                got[info.topic] += 1
            for topic in acked:
                if got[topic] == 0:
                    tally.lost.append(f"{where}: acknowledged {topic} missing from {name}")
                elif got[topic] > 1:
                    tally.corrupt.append(f"{where}: {topic} {got[topic]} times in {name}")
    check_bus(root, items, acked, where, tally, deliver=deliver)


def sweep_log(
    pfs: PowerCut,
    root: str,
    items: list[Item],
    *,
    state: str = "wal-ready",
    every: int,
    randoms: int,
    seed: int,
    queues: bool = False,
    least_syncfs: int = 0,
    need_replay: bool = True,
) -> Tally:
    """Publish ``items`` durably through the log, cut after every ``every``-th
    operation (and at random ones), come back up as a restarted machine and check.
    ``least_syncfs``: checkpoints the run makes without a cut, at least; and some
    recoveries must have written files again (else the log was not put to the test)."""
    pfs.load(state)
    ops = PowerOps(pfs)
    total = count_ops(pfs, publishing(root, ops, items, set()))
    checkpoints = sum(1 for e in ops.events if e[0] == "syncfs")
    assert checkpoints >= least_syncfs, f"{checkpoints} checkpoints"
    tally = Tally()
    replays = 0
    points = cut_points(total, every=every, randoms=randoms, seed=seed)
    for k in points:
        pfs.load(state)
        acked: set[str] = set()
        run_until_cut(pfs, k, publishing(root, PowerOps(pfs), items, acked))
        tally.cuts += 1
        where = f"seed {seed} cut {k}/{total}"
        replayed = recover(pfs, root)
        replays += any(e[0] == "restore" for e in replayed.events)
        deliver = k == points[-1]  # one run per sweep through a real subscriber
        check_recovered(root, items, acked, where, tally, queues=queues, deliver=deliver)
    assert replays or not need_replay, f"no recovery of {len(points)} wrote a file again"
    return tally


def merge(into: Tally, t: Tally) -> None:
    into.cuts += t.cuts
    into.lost += t.lost
    into.corrupt += t.corrupt


# ------------------------------------------------------------------ the tests


def test_logged_publishes_survive_every_cut(pfs: PowerCut, bus_root: str, sweep: bool) -> None:
    """Every cut point of 6 durable publishes through the log (multi and single,
    spilled topics, headers), recovered after a restart: each acknowledged one there
    once, whole; nothing torn; the log gone."""
    tally = sweep_log(pfs, bus_root, bus_items(1, 12 if sweep else 6), every=1, randoms=0, seed=1)
    assert tally.cuts >= 30
    assert tally.ok(), (tally.lost[:10], tally.corrupt[:10])


def test_logged_publishes_random_cuts(pfs: PowerCut, bus_root: str, sweep: bool) -> None:
    tally = Tally()
    for seed in range(200, 240 if sweep else 202):
        t = sweep_log(
            pfs, bus_root, bus_items(seed, 8), every=10**6, randoms=3, seed=seed, need_replay=False
        )
        merge(tally, t)
    assert tally.ok(), (tally.lost[:10], tally.corrupt[:10])


def test_logged_queue_copies_survive_every_cut(pfs: PowerCut, bus_root: str, sweep: bool) -> None:
    """Durable publishes routed to two durable queues, one record each: after a cut and
    recovery each acknowledged message is once on the bus and once in each queue."""
    tally = sweep_log(
        pfs,
        bus_root,
        order_items(3, 8 if sweep else 5),
        every=1 if sweep else 2,
        randoms=4,
        seed=3,
        queues=True,
    )
    assert tally.cuts >= 20
    assert tally.ok(), (tally.lost[:10], tally.corrupt[:10])


def test_wrapped_log_survives_cuts(
    pfs: PowerCut, bus_root: str, sweep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 16 KiB log, 12 KiB of records: 14 publishes fill it several times over, each
    time a checkpoint (syncfs, then the header) and a wrap to its start. A cut anywhere,
    in a checkpoint too: the publishes acknowledged before the last checkpoint and
    those after it all survive."""
    monkeypatch.setattr(wal, "LOG_SIZE", 16 << 10)
    tally = sweep_log(
        pfs,
        bus_root,
        bus_items(5, 14),
        every=1 if sweep else 3,
        randoms=6,
        seed=5,
        least_syncfs=3,
    )
    assert tally.cuts >= 30
    assert tally.ok(), (tally.lost[:10], tally.corrupt[:10])


def test_timed_checkpoints_then_cut(
    pfs: PowerCut, bus_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint thread's own checkpoints (and one called directly, mid-run), then
    more publishes, then the cut: what was acknowledged before and after them survives
    (the records before a checkpoint are not replayed: their files are on disk)."""
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY", 0.02)
    items = bus_items(9, 10)
    tally = Tally()
    for rnd in range(3):
        pfs.load("wal-ready")
        ops = PowerOps(pfs)
        acked: set[str] = set()
        bus = open_bus(bus_root, ops)
        try:
            for i, it in enumerate(items):
                publish_all(bus, [it], True, acked)
                if i == 3:
                    (log,) = wal._logs.values()
                    with log._lock:
                        log._checkpoint_locked()
                elif i in (5, 7):
                    (log,) = wal._logs.values()
                    deadline = time.monotonic() + 30
                    while log._checkpointed < log._seq:  # the thread checkpoints
                        assert time.monotonic() < deadline, "the thread never checkpointed"
                        time.sleep(0.005)
            checkpoints = sum(1 for e in ops.events if e[0] == "syncfs")
            assert checkpoints >= 3, ops.events
            if rnd:
                # and a last publish whose record is cut short, at the rnd-th operation
                pfs.arm(rnd)
                last = bus_items(99, 1)[0]
                with pytest.raises(StorageError):  # (the disk is dead)
                    bus.publish(last.topic, last.payload, durable=True)
            pfs.cut()
        finally:
            quiet_close(bus.close)
        pfs.restore()
        assert logs(bus_root), "the log is gone after the cut"
        replayed = recover(pfs, bus_root)
        restored = {os.path.basename(p) for e, p in replayed.events if e == "restore"}
        tally.cuts += 1
        check_recovered(bus_root, items, acked, f"round {rnd}", tally)
        # replayed: only what came after the thread's last checkpoint (items 8 and 9,
        # their messages and sidecars, at most); the 8 before are on disk since
        assert len(restored) <= 6, restored
    assert tally.ok(), (tally.lost[:10], tally.corrupt[:10])


def test_cut_during_recovery(pfs: PowerCut, bus_root: str, sweep: bool) -> None:
    """A restarted machine replays the log, and the power goes again while it does (at
    every cut point of the replaying open): the next open replays again, and every
    acknowledged publish is there once."""
    items = bus_items(11, 8)
    pfs.load("wal-ready")
    acked: set[str] = set()
    bus = open_bus(bus_root, PowerOps(pfs))
    publish_all(bus, items, True, acked)
    pfs.cut()  # before the close would checkpoint: nothing but the log is on disk
    quiet_close(bus.close)
    pfs.restore()
    assert len(logs(bus_root)) == 1
    pfs.save("wal-crashed")
    total = count_ops(pfs, lambda: recover(pfs, bus_root))
    assert total >= len(items)  # a file written again for each publish at least
    tally = Tally()
    for k in cut_points(total, every=1 if sweep else 2, randoms=5, seed=11):
        pfs.load("wal-crashed")
        # the replaying open dies at k: its own syncfs fails too, once the power is cut
        run_until_cut(pfs, k, lambda: recover(pfs, bus_root))
        tally.cuts += 1
        recover(pfs, bus_root, boot="boot-after-the-second-cut")
        check_recovered(bus_root, items, acked, f"recovery cut {k}/{total}", tally)
    assert tally.cuts >= 10
    assert tally.ok(), (tally.lost[:10], tally.corrupt[:10])


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from fsbus import BlockingBus
    from fsbus._bus import wal
    from fsbus._bus.ops import Ops
    from tests.powercut.checks import bus_items
    from tests.powercut.test_log_cuts import WAL_CONFIG, BOOT

    wal.LOG_SIZE = 128 << 10
    wal.CHECKPOINT_EVERY = 3600.0

    class ChildOps(Ops):
        def boot_id(self):
            return BOOT
        def syncfs(self, fd):
            raise AssertionError("no checkpoint expected")
        def read_text(self, path):
            text = super().read_text(path)
            if path == "/proc/self/mountinfo" and text:
                text = text.replace(" - fuse.powercut ", " - powercut ")
            return text

    bus = BlockingBus({root!r}, config=WAL_CONFIG, ops=ChildOps()).__enter__()
    for it in bus_items(13, 6):
        bus.publish(it.topic, it.payload, single=it.single, durable=True, headers=it.headers)
        print(it.topic, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_same_boot_dead_process(pfs: PowerCut, bus_root: str) -> None:
    """No power cut: the publishing process is killed (SIGKILL, its log left behind
    with records past its checkpoint). The next bus of the same boot replays nothing:
    it syncfs'es, and only then removes the log; a cut after that loses nothing."""
    pfs.load("wal-ready")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.run(
        [sys.executable, "-c", CHILD.format(repo=repo, root=bus_root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    items = bus_items(13, 6)
    acked = set(child.stdout.split())
    assert acked == {it.topic for it in items}
    (name,) = logs(bus_root)
    log_path = f"{bus_root}/fsbus/wal/{name}"
    ops = recover(pfs, bus_root, boot=BOOT)
    assert not logs(bus_root)
    events = [e for e in ops.events if e[0] == "syncfs" or e[1] == log_path]
    assert events == [("syncfs", ""), ("unlink", log_path)], ops.events
    assert not [e for e in ops.events if e[0] == "restore"], ops.events
    tally = Tally(cuts=1)
    pfs.restore()  # the power goes now: what recovery synced is on disk
    # The log's removal was not synced: it may be back, marked done, and replays nothing.
    again = recover(pfs, bus_root)
    assert not [e for e in again.events if e[0] == "restore"], again.events
    check_recovered(bus_root, items, acked, "same boot, then a cut", tally)
    assert tally.ok(), (tally.lost[:10], tally.corrupt[:10])


def test_first_log_of_a_bus_survives_cuts(pfs: PowerCut, bus_root: str, sweep: bool) -> None:
    """The first durable publish through the log on a bus: the log's folder is made
    then. Every acknowledged publish survives a cut as it does with the folder there."""
    tally = sweep_log(
        pfs,
        bus_root,
        bus_items(15, 6 if sweep else 4),
        state="wal-fresh",
        every=1 if sweep else 4,
        randoms=2,
        seed=15,
    )
    assert tally.ok(), (tally.lost[:10], tally.corrupt[:10])


@pytest.fixture(autouse=True)
def no_logs_left() -> Iterator[None]:
    """No test leaves a log registered in this process (it would hide it from
    recovery: :func:`wal.recover` skips the process's own logs)."""
    yield
    assert not wal._logs
