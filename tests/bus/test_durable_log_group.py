"""Group commits through the durable log: several durable publishes that go to disk
together (``publish_many``, awaited publishes queued for the worker thread at once) are
one record and one sync of the log, and a record that fails takes all of them back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, StorageError
from fsbus._bus import wal

from .durable_log_helpers import LogFaults, SyncRecording, is_log, records_of

ON = BusConfig(durable_log="on")
N = 40


@pytest.fixture(autouse=True)
def _no_timed_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY", 3600.0)


def _payloads(n: int = N) -> list[bytes]:
    return [f"message {i:03d}".encode() for i in range(n)]


def _bodies(rec: wal.Record) -> list[bytes]:
    return sorted(data[1:] for rel, data in rec.files)  # (the leading byte, then payload)


def _files_synced(ops: SyncRecording) -> list[tuple[str, str]]:
    """Syncs of anything but the log, and but the folder holding a bucket made for a
    message (its name is synced whatever the publish, as without the log)."""
    return [
        s
        for s in ops.file_syncs()
        if not is_log(s[1]) and not s[1].endswith(("/messages", "/topics"))
    ]


def _log_syncs(ops: SyncRecording) -> int:
    return sum(1 for op, path in ops.file_syncs() if op == "fdatasync" and is_log(path))


@pytest.mark.anyio
async def test_publish_many_durable_is_one_record_and_one_sync(root: Path) -> None:
    ops = SyncRecording()
    async with Bus(root, config=ON, ops=ops) as bus:
        await bus.publish("warm", b"x", durable=True)  # makes the log
        ops.clear()
        infos = await bus.publish_many([("t.x", p) for p in _payloads()], durable=True)
        assert len(infos) == N
        records = records_of(root)
        assert len(records) == 2  # the warm-up's, and the batch's
        assert _bodies(records[1]) == _payloads()
        assert _log_syncs(ops) == 1
        assert _files_synced(ops) == []
        assert len([m async for m in bus.browse("t.#")]) == N


def test_blocking_publish_many_durable_is_one_record(root: Path) -> None:
    with BlockingBus(root, config=ON) as bus:
        bus.publish_many([("t.x", p) for p in _payloads()], durable=True)
        records = records_of(root)
        assert len(records) == 1
        assert _bodies(records[0]) == _payloads()


@pytest.mark.anyio
async def test_publish_many_into_queues_is_one_record_for_the_messages_and_one_for_the_copies(
    root: Path,
) -> None:
    async with Bus(root, config=ON) as bus:
        await bus.declare_queue("a", ["t.#"])
        await bus.declare_queue("b", ["t.#"])
        await bus.publish_many([("t.x", p) for p in _payloads()], durable=True)
        records = records_of(root)
        assert len(records) == 2
        assert _bodies(records[0]) == _payloads()
        copies = records[1].files
        assert sorted(rel.split("/")[2] for rel, _ in copies) == ["a"] * N + ["b"] * N
        for q in "ab":
            assert (await bus.queue_info(q)).depth == N


@pytest.mark.anyio
async def test_publish_many_whose_record_fails_takes_every_message_back(root: Path) -> None:
    ops = LogFaults("fdatasync")
    async with Bus(root, config=ON, ops=ops) as bus:
        await bus.publish("warm", b"x", durable=True)
        ops.armed = True
        with pytest.raises(StorageError, match="durable log"):
            await bus.publish_many([("t.x", p) for p in _payloads()], durable=True)
        assert ops.failed == 1
        assert [m async for m in bus.browse("t.#")] == []
        ops.armed = False
        await bus.publish_many([("t.y", p) for p in _payloads(3)], durable=True)
        assert len([m async for m in bus.browse("t.#")]) == 3


@pytest.mark.anyio
async def test_concurrent_awaited_durable_publishes_are_each_recorded_once(root: Path) -> None:
    """Awaited publishes from many tasks go to the worker thread in batches; a batch
    of several is one record. Whatever the batching, every message is in exactly one
    record and on the bus, and no file but the log is synced."""
    ops = SyncRecording()
    async with Bus(root, config=ON, ops=ops) as bus:
        await bus.publish("warm", b"x", durable=True)
        ops.clear()
        async with anyio.create_task_group() as tg:
            for p in _payloads():
                tg.start_soon(lambda p=p: bus.publish("t.x", p, durable=True))
        records = records_of(root)[1:]
        recorded = sorted(b for rec in records for b in _bodies(rec))
        assert recorded == _payloads()
        assert len(records) == _log_syncs(ops) <= N
        assert _files_synced(ops) == []
        assert len([m async for m in bus.browse("t.#")]) == N


class _FirstLogSyncWaits(SyncRecording):
    """The first sync of the durable log (after ``armed``) waits until ``until()``."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.until: Callable[[], bool] = lambda: True

    def fdatasync(self, fd: int) -> None:
        if self.armed and is_log(self.paths.get(fd, "")):
            self.armed = False
            deadline = time.monotonic() + 30
            while not self.until():
                assert time.monotonic() < deadline, "the other publishes never wrote"
                time.sleep(0.001)
        super().fdatasync(fd)


def test_durable_publishes_from_threads_share_a_sync_of_the_log(root: Path) -> None:
    """A group commit across threads: while one thread's sync of the log runs, the
    others write their records; the next sync covers all of them. Each publish still
    returns only once its record is on disk, and each is one record."""
    threads = 8
    ops = _FirstLogSyncWaits()
    with BlockingBus(root, config=ON, ops=ops) as bus:
        bus.publish("warm", b"x", durable=True)  # makes the log
        (log,) = [w for w in wal._logs.values() if w.root == str(root)]
        ops.clear()
        ops.until = lambda: log._seq == 1 + threads
        ops.armed = True
        errors: list[BaseException] = []

        def publish(i: int) -> None:
            try:
                bus.publish("t.x", b"thread %d" % i, durable=True)
            except BaseException as exc:  # pragma: no cover (reported below)
                errors.append(exc)

        workers = [threading.Thread(target=publish, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        assert not errors
        records = records_of(root)[1:]
        assert sorted(b for rec in records for b in _bodies(rec)) == sorted(
            b"thread %d" % i for i in range(threads)
        )
        assert len(records) == threads
        assert _log_syncs(ops) <= 2  # the first thread's, then one for all the others
        assert log._synced == 1 + threads
