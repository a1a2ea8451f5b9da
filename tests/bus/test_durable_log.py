"""The durable log (fsbus/_bus/wal.py): a durable publish made durable by one record in
its process's log and one data sync of it, and the recovery of dead processes' logs.

Real directories and real processes (killed with SIGKILL); faults and restarts of the
machine only through an :class:`~fsbus._bus.ops.Ops` subclass
(tests/bus/durable_log_helpers.py). Waits are on conditions with deadlines.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import struct
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsbus import BlockingBus, Bus, BusConfig, StorageError, UsageError
from fsbus._bus import wal
from fsbus._bus.ops import Ops
from fsbus._core.platform import MountFacts, decide
from tests.journaled import JournaledExt4, UnorderedMount

from .conftest import files_under, is_flocked, wait_until_blocking
from .durable_log_helpers import (
    WAIT,
    LogFaults,
    Publisher,
    Restarted,
    SharedMount,
    SyncRecording,
    is_log,
    log_files,
    payload,
    read_log,
    records_of,
    relative,
    run_and_kill,
    the_log,
    wal_dir,
)

ON = BusConfig(durable_log="on")
OFF = BusConfig(durable_log="off")
AUTO = BusConfig(durable_log="auto")


@pytest.fixture(autouse=True)
def _no_timed_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """No checkpoint thread writing the header between two calls a test counts (a
    checkpoint still runs when the log is full, and when it is closed)."""
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY", 3600.0)


def _drain(bus: BlockingBus, queue: str, count: int) -> list[bytes]:
    """Consume ``count`` messages of ``queue`` (acknowledged); their payloads."""
    got = []
    with bus.messages(queue=queue) as it:
        for _ in range(count):
            msg = it.get(timeout=WAIT)
            got.append(msg.payload)
            it.ack(msg)
    return got


def _snapshot(root: Path, rels: list[str]) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in rels}


def _queue_files(root: Path, queue: str) -> list[str]:
    """Every message file (relative to the root) in queue ``queue``'s buckets."""
    base = root / "fsbus" / "queues" / queue / "bus" / "messages"
    return [f"fsbus/queues/{queue}/bus/messages/{f}" for f in files_under(base)]


def _main_files(root: Path) -> list[str]:
    return [f"messages/{f}" for f in files_under(root / "messages")]


# ================================================================ 1. the format (pure)

PATHS = st.text(min_size=1, max_size=40)
FILES = st.lists(st.tuples(PATHS, st.binary(max_size=300)), max_size=5)
BATCHES = st.lists(FILES, min_size=1, max_size=6)
STEPS = st.lists(st.integers(min_value=1, max_value=1 << 20), min_size=6, max_size=6)


def _records(batches: list[list[tuple[str, bytes]]], steps: list[int]) -> list[wal.Record]:
    seq = 0
    out = []
    for files, step in zip(batches, steps, strict=False):
        seq += step
        out.append(wal.Record(seq, tuple(files)))
    return out


def _log_bytes(records: list[wal.Record], tail: bytes = b"") -> bytes:
    body = b"".join(wal.encode_record(r.seq, list(r.files)) for r in records)
    return bytes(wal.HEADER) + body + tail


@given(BATCHES, STEPS, st.integers(min_value=0, max_value=4096))
def test_records_round_trip_through_the_log_format(
    batches: list[list[tuple[str, bytes]]], steps: list[int], zeros: int
) -> None:
    """Records read back in order, whatever follows them (the log's zeros)."""
    records = _records(batches, steps)
    assert list(wal.decode_records(_log_bytes(records, bytes(zeros)))) == records


@given(BATCHES, STEPS, st.data())
def test_decoding_stops_at_a_torn_record(
    batches: list[list[tuple[str, bytes]]], steps: list[int], data: st.DataObject
) -> None:
    """A record cut short (the end of the bytes, or zeros where the rest was to go)
    ends the reading; the records before it are read."""
    records = _records(batches, steps)
    whole = _log_bytes(records)
    last = wal.encode_record(records[-1].seq, list(records[-1].files))
    cut = data.draw(st.integers(min_value=0, max_value=len(last) - 1), label="cut")
    truncated = whole[: len(whole) - len(last) + cut]
    assert list(wal.decode_records(truncated)) == records[:-1]
    zero_filled = truncated + bytes(len(last) - cut)
    if zero_filled != whole:  # (a record whose tail was zeros anyway is whole)
        assert list(wal.decode_records(zero_filled)) == records[:-1]


@given(BATCHES, STEPS, st.data())
def test_decoding_stops_at_a_crc_mismatch(
    batches: list[list[tuple[str, bytes]]], steps: list[int], data: st.DataObject
) -> None:
    """One byte changed anywhere in a record (length, crc, sequence, body) ends the
    reading at that record: the later ones are not read either."""
    records = _records(batches, steps)
    k = data.draw(st.integers(min_value=0, max_value=len(records) - 1), label="record")
    start = wal.HEADER + sum(len(wal.encode_record(r.seq, list(r.files))) for r in records[:k])
    size = len(wal.encode_record(records[k].seq, list(records[k].files)))
    at = start + data.draw(st.integers(min_value=0, max_value=size - 1), label="byte")
    flip = data.draw(st.integers(min_value=1, max_value=255), label="xor")
    buf = bytearray(_log_bytes(records))
    buf[at] ^= flip
    assert list(wal.decode_records(bytes(buf))) == records[:k]


@pytest.mark.parametrize("older", [1, 5, 6])
def test_decoding_stops_at_a_sequence_not_above_the_one_before(older: int) -> None:
    """A wrapped log: new records from the start, then what is left of the old ones
    (lower or equal sequence numbers, crcs intact) is not read."""
    new = [wal.Record(5, (("messages/aa/x", b"\0new5"),)), wal.Record(6, ())]
    leftover = wal.Record(older, (("messages/aa/y", b"\0old"),))
    after = wal.Record(7, (("messages/aa/z", b"\0never"),))
    buf = _log_bytes([*new, leftover, after])
    assert list(wal.decode_records(buf)) == new


def test_decoding_stops_at_a_body_that_does_not_parse() -> None:
    """A record whose crc holds but whose body claims more than it has (a hostile log)."""
    body = struct.pack("<I", 1) + struct.pack("<HI", 5, 1000) + b"a/b/c" + b"short"
    crc = zlib.crc32(body, zlib.crc32(struct.pack("<Q", 1)))
    rec = struct.pack("<IIQ", len(body), crc, 1) + body
    assert list(wal.decode_records(bytes(wal.HEADER) + rec)) == []


def _header_buf(*slots: tuple[int, wal.Header | None]) -> bytearray:
    buf = bytearray(wal.HEADER)
    for off, h in slots:
        if h is not None:
            raw = wal.encode_header(h)
            buf[off : off + len(raw)] = raw
    return buf


H2 = wal.Header(generation=2, checkpoint=10, boot_id="boot-a", pid=11)
H3 = wal.Header(generation=3, checkpoint=20, boot_id="boot-a", pid=11)


@pytest.mark.parametrize("order", ["higher-second", "higher-first"])
def test_the_valid_header_slot_with_the_higher_generation_wins(order: str) -> None:
    slots = ((0, H2), (wal.SLOT, H3)) if order == "higher-second" else ((0, H3), (wal.SLOT, H2))
    assert wal.decode_header(bytes(_header_buf(*slots))) == H3


@pytest.mark.parametrize("damage", ["torn", "flipped-crc", "bad-magic", "zeroed"])
def test_a_damaged_header_slot_falls_back_to_the_other(damage: str) -> None:
    buf = _header_buf((0, H2), (wal.SLOT, H3))
    raw_len = len(wal.encode_header(H3))
    if damage == "torn":  # the write of the newer slot cut short: its tail is old zeros
        buf[wal.SLOT + raw_len // 2 : wal.SLOT + raw_len] = bytes(raw_len - raw_len // 2)
    elif damage == "flipped-crc":
        buf[wal.SLOT + raw_len - 1] ^= 0xFF
    elif damage == "bad-magic":
        buf[wal.SLOT] ^= 0xFF
    else:
        buf[wal.SLOT : wal.SLOT + raw_len] = bytes(raw_len)
    assert wal.decode_header(bytes(buf)) == H2


def test_no_valid_header_slot_is_none() -> None:
    assert wal.decode_header(bytes(wal.HEADER)) is None
    assert wal.decode_header(b"") is None
    assert wal.decode_header(os.urandom(wal.HEADER)) is None
    buf = _header_buf((0, H2), (wal.SLOT, H3))
    buf[10] ^= 1
    buf[wal.SLOT + 10] ^= 1
    assert wal.decode_header(bytes(buf)) is None


@given(
    st.integers(min_value=0, max_value=(1 << 64) - 1),
    st.integers(min_value=0, max_value=(1 << 64) - 1),
    st.text(alphabet="0123456789abcdef-", max_size=40),
    st.integers(min_value=0, max_value=(1 << 32) - 1),
)
def test_a_header_round_trips(gen: int, ckpt: int, boot: str, pid: int) -> None:
    h = wal.Header(gen, ckpt, boot, pid)
    assert wal.decode_header(bytes(_header_buf((0, h)))) == h
    assert wal.decode_header(bytes(_header_buf((wal.SLOT, h)))) == h


@pytest.mark.parametrize(
    "rel",
    [
        *("", "/etc/passwd", "../escape", "messages/../../x", "a/..", "./a", "a/./b"),
        *("a//b", "a/", "a/b\0c", "\0", "..", "."),
    ],
)
def test_safe_relative_refuses_paths_that_leave_the_bus(rel: str) -> None:
    assert not wal.safe_relative(rel)


@pytest.mark.parametrize(
    "rel", ["messages/0e/742e78@s+1+m+f", "fsbus/queues/a/bus/messages/b/n", "a..b/..c/d.."]
)
def test_safe_relative_accepts_paths_inside_the_bus(rel: str) -> None:
    assert wal.safe_relative(rel)


# ================================================================ 2. a durable publish


def _assert_record_names(root: Path, rec: wal.Record, paths: list[str]) -> None:
    """``rec`` holds exactly the files at ``paths``, each with its bytes on disk now."""
    assert sorted(rel for rel, _ in rec.files) == sorted(relative(root, p) for p in paths)
    for rel, data in rec.files:
        assert (root / rel).read_bytes() == data, rel


def _assert_only_the_log_synced(ops: SyncRecording, log: Path, *, made: bool = False) -> None:
    """What ``ops`` saw since it was cleared: one data sync, of the log (more when the
    log was ``made`` then: its zeros and header, and its folder), and otherwise only
    the folder holding a directory made meanwhile (a new bucket's name, as a plain
    publish syncs it): no message file, copy, bucket or staging file synced."""
    syncs = ops.file_syncs()
    parents = {os.path.dirname(d) for d in ops.made}
    datasyncs = [p for op, p in syncs if op == "fdatasync"]
    if made:
        assert set(datasyncs) == {str(log)}, syncs
        parents.add(str(log.parent))
    else:
        assert datasyncs == [str(log)], syncs
    assert all(p in parents for op, p in syncs if op == "fsync"), syncs


def test_a_blocking_durable_publish_makes_one_record_and_syncs_only_the_log(root: Path) -> None:
    ops = SyncRecording()
    with BlockingBus(root, ops=ops, config=ON) as bus:
        ops.clear()
        first = bus.publish("t.x", b"first", durable=True)  # makes the log
        log = the_log(root)
        _assert_only_the_log_synced(ops, log, made=True)
        ops.clear()
        info = bus.publish("t.x", b"must survive", durable=True)
        _assert_only_the_log_synced(ops, log)
        records = records_of(root)
        assert [r.seq for r in records] == [1, 2]
        _assert_record_names(root, records[0], [first.path])
        _assert_record_names(root, records[1], [info.path])
        assert records[1].files[0][1].endswith(b"must survive")


@pytest.mark.anyio
async def test_an_awaited_durable_publish_makes_one_record_and_syncs_only_the_log(
    root: Path,
) -> None:
    ops = SyncRecording()
    async with Bus(root, ops=ops, config=ON) as bus:
        await bus.publish("t.x", b"first", durable=True)
        log = the_log(root)
        ops.clear()
        info = await bus.publish("t.x", b"must survive", durable=True)
        _assert_only_the_log_synced(ops, log)
        records = records_of(root)
        assert len(records) == 2
        _assert_record_names(root, records[1], [info.path])


def _three_queues(root: Path) -> None:
    with BlockingBus(root, config=OFF) as setup:
        for q in "abc":
            setup.declare_queue(q, ["t.#"])


def test_a_durable_publish_into_three_queues_is_one_record_of_four_files(root: Path) -> None:
    _three_queues(root)
    ops = SyncRecording()
    with BlockingBus(root, ops=ops, config=ON) as bus:
        bus.publish("t.x", b"opens the queues", durable=True)
        log = the_log(root)
        ops.clear()
        info = bus.publish("t.x", b"copied", durable=True)
        _assert_only_the_log_synced(ops, log)
        records = records_of(root)
        assert len(records) == 2
        copies = [str(root / rel) for q in "abc" for rel in _queue_files(root, q)]
        mine = [p for p in copies if Path(p).read_bytes().endswith(b"copied")]
        assert len(mine) == 3
        _assert_record_names(root, records[1], [info.path, *mine])
        for q in "abc":
            assert bus.queue_info(q).depth == 2


@pytest.mark.anyio
async def test_an_awaited_durable_publish_into_three_queues_is_one_record(root: Path) -> None:
    _three_queues(root)
    ops = SyncRecording()
    async with Bus(root, ops=ops, config=ON) as bus:
        await bus.publish("t.x", b"opens the queues", durable=True)
        log = the_log(root)
        ops.clear()
        await bus.publish("t.x", b"copied", durable=True)
        _assert_only_the_log_synced(ops, log)
        records = records_of(root)
        assert len(records) == 2
        assert len(records[1].files) == 4
        assert all(data.endswith(b"copied") for _, data in records[1].files)
        for q in "abc":
            assert (await bus.queue_info(q)).depth == 2


def test_a_plain_publish_writes_no_record(root: Path) -> None:
    _three_queues(root)
    ops = SyncRecording()
    with BlockingBus(root, ops=ops, config=ON) as bus:
        bus.publish("t.x", b"plain")
        assert log_files(root) == []  # the log is made by the first durable publish
        bus.publish("t.x", b"durable", durable=True)
        assert len(records_of(root)) == 1
        ops.clear()
        bus.publish("t.x", b"plain again")
        parents = {os.path.dirname(d) for d in ops.made}  # (a new bucket's name)
        assert all(op == "fsync" and p in parents for op, p in ops.file_syncs()), ops.syncs
        assert len(records_of(root)) == 1
        for q in "abc":
            assert bus.queue_info(q).depth == 3


# ================================================================ 3. when it is used


class _JournaledRecording(JournaledExt4, SyncRecording):
    pass


class _UnorderedRecording(UnorderedMount, SyncRecording):
    pass


def test_auto_uses_the_log_on_a_journaled_ext4(root: Path) -> None:
    ops = _JournaledRecording()
    with BlockingBus(root, ops=ops, config=AUTO) as bus:
        bus.publish("t.x", b"first", durable=True)
        log = the_log(root)
        ops.clear()
        info = bus.publish("t.x", b"logged", durable=True)
        _assert_only_the_log_synced(ops, log)
        _assert_record_names(root, records_of(root)[-1], [info.path])


def test_auto_syncs_the_files_on_btrfs(root: Path) -> None:
    ops = _UnorderedRecording()
    with BlockingBus(root, ops=ops, config=AUTO) as bus:
        bus.publish("t.x", b"first", durable=True)
        ops.clear()
        info = bus.publish("t.x", b"synced", durable=True)
        syncs = ops.file_syncs()
        assert ("fsync", os.path.dirname(info.path)) in syncs, syncs
        assert any(op == "fdatasync" and "/staging/" in p for op, p in syncs), syncs
        assert not any(is_log(p) for _, p in syncs)
        assert log_files(root) == []


@pytest.mark.parametrize("fstype", ["ceph", "fuse.ceph-fuse", "nfs4", "nfs"])
def test_durable_log_on_is_refused_on_a_shared_mount(root: Path, fstype: str) -> None:
    with pytest.raises(UsageError, match="durable_log"):
        with BlockingBus(root, ops=SharedMount(fstype), config=ON):
            pass
    assert log_files(root) == []


@pytest.mark.parametrize("fstype", ["ceph", "nfs4"])
def test_auto_on_a_shared_mount_syncs_the_files(root: Path, fstype: str) -> None:
    with BlockingBus(root, ops=SharedMount(fstype), config=AUTO) as bus:
        bus.publish("t.x", b"synced", durable=True)
        assert log_files(root) == []


@pytest.mark.parametrize("ops", [JournaledExt4(), UnorderedMount()], ids=["ext4", "btrfs"])
def test_durable_log_off_never_makes_a_log(root: Path, ops: JournaledExt4 | UnorderedMount) -> None:
    _three_queues(root)
    with BlockingBus(root, ops=ops, config=OFF) as bus:
        for i in range(5):
            bus.publish("t.x", f"d{i}".encode(), durable=True)
        assert log_files(root) == []
        assert bus.queue_info("a").depth == 5
    assert log_files(root) == []


# ================================================================ 4. a big publish


def test_a_publish_bigger_than_a_record_syncs_its_files(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wal, "MAX_RECORD", 1000)
    ops = SyncRecording()
    with BlockingBus(root, ops=ops, config=ON) as bus:
        bus.publish("t.x", b"small", durable=True)  # makes the log: one record
        ops.clear()
        info = bus.publish("t.x", b"B" * 2000, durable=True)
        syncs = ops.file_syncs()
        assert ("fdatasync", info.path) in syncs, syncs
        assert ("fsync", os.path.dirname(info.path)) in syncs, syncs
        assert not any(is_log(p) for _, p in syncs), syncs
        assert len(records_of(root)) == 1


# ================================================================ 5. the log failing


@pytest.mark.parametrize("op", ["pwrite", "fdatasync"])
def test_a_failed_log_write_takes_the_publish_back(root: Path, op: str) -> None:
    _three_queues(root)
    ops = LogFaults(op)
    with BlockingBus(root, ops=ops, config=ON) as bus:
        before = bus.publish("t.x", b"before", durable=True)  # the log is made
        log = the_log(root)
        main_before = _main_files(root)
        queues_before = {q: _queue_files(root, q) for q in "abc"}
        ops.armed = True
        with pytest.raises(StorageError, match="durable log") as caught:
            bus.publish("t.x", b"lost", durable=True)
        assert str(log) in str(caught.value)
        assert ops.failed == 1
        ops.armed = False
        # nothing of it is left: the message, its copies
        assert _main_files(root) == main_before
        for q in "abc":
            assert _queue_files(root, q) == queues_before[q]
            assert bus.queue_info(q).depth == 1
        assert [i.name for i in bus.browse("#")] == [before.name]
        for q in "abc":
            assert [bus.read_payload(i) for i in bus.browse(queue=q)] == [b"before"]
        # and the bus goes on once the fault is gone: through the log after a failed
        # write; after a failed sync (the kernel may have dropped what it did not
        # write) the log is broken, and the publish syncs its own files
        ops.clear()
        after = bus.publish("t.x", b"after", durable=True)
        for q in "abc":
            assert bus.queue_info(q).depth == 2
        assert sorted(bus.read_payload(i) or b"" for i in bus.browse("#")) == [b"after", b"before"]
        records = records_of(root)
        if op == "pwrite":
            assert [r.seq for r in records] == [1, 2]
            assert relative(root, after.path) in {rel for rel, _ in records[1].files}
            assert all(not data.endswith(b"lost") for r in records for _, data in r.files)
        else:
            assert all(relative(root, after.path) not in dict(r.files) for r in records)
            assert ("fdatasync", after.path) in ops.file_syncs() or any(
                op_ == "fdatasync" and not is_log(p) for op_, p in ops.file_syncs()
            )
        for q in "abc":
            assert sorted(_drain(bus, q, 2)) == [b"after", b"before"]
    assert log_files(root) == []


class _FailingSyncfs(SyncRecording):
    """``syncfs`` (a checkpoint's) fails with EIO while ``armed``."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = True

    def syncfs(self, fd: int) -> None:
        if self.armed:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().syncfs(fd)


def test_after_a_failed_checkpoint_durable_publishes_sync_their_files(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint whose syncfs fails breaks the log (what it covers is not known to
    be on disk): nothing more is recorded in it, and durable publishes sync their own
    files instead, until the bus is opened again."""
    monkeypatch.setattr(wal, "CHECKPOINT_EVERY", 0.01)
    _three_queues(root)
    ops = _FailingSyncfs()
    with BlockingBus(root, ops=ops, config=ON) as bus:
        bus.publish("t.x", b"before", durable=True)  # its record is written and synced
        held = next(w for w in wal._logs.values() if w.path == str(the_log(root)))
        wait_until_blocking(lambda: held.broken)
        ops.clear()
        for i in range(2):
            info = bus.publish("t.x", b"synced %d" % i, durable=True)
            assert ("fdatasync", info.path) in ops.file_syncs() or any(
                op == "fdatasync" and not is_log(p) for op, p in ops.file_syncs()
            )
        assert not any(is_log(p) for _, p in ops.file_syncs())
        assert len(records_of(root)) == 1
        for q in "abc":
            assert bus.queue_info(q).depth == 3
        ops.armed = False
    assert log_files(root) == []  # the last checkpoint, at close, worked: removed
    with BlockingBus(root, ops=ops, config=ON) as bus:  # a new log, used again
        ops.clear()
        bus.publish("t.x", b"after", durable=True)
        assert bus.queue_info("a").depth == 4
        assert len(records_of(root)) == 1


def test_durable_publishes_from_many_threads_get_one_record_each(root: Path) -> None:
    _three_queues(root)
    threads, each = 4, 25
    infos: list[list[str]] = [[] for _ in range(threads)]

    def publisher(k: int) -> None:
        for i in range(each):
            infos[k].append(bus.publish("t.x", f"{k}-{i}".encode(), durable=True).path)

    with BlockingBus(root, config=ON) as bus:
        workers = [threading.Thread(target=publisher, args=(k,)) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(WAIT)
        assert not any(w.is_alive() for w in workers)
        records = records_of(root)
        assert [r.seq for r in records] == list(range(1, threads * each + 1))
        by_message = {relative(root, p) for k in range(threads) for p in infos[k]}
        assert len(by_message) == threads * each
        for rec in records:
            assert len(rec.files) == 4  # its message and 3 copies, nobody else's
            assert len({data for _, data in rec.files}) == 1
            assert len([rel for rel, _ in rec.files if rel in by_message]) == 1
            for rel, data in rec.files:
                assert (root / rel).read_bytes() == data
        for q in "abc":
            assert bus.queue_info(q).depth == threads * each


class _Stamps(SyncRecording):
    """Records each stamp (a write into a bus's ``update/UPDATE``, which wakes its
    subscribers) among the syncs."""

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        n = super().pwrite(fd, data, offset)
        path = self.paths.get(fd, "")
        if path.endswith("/update/UPDATE"):
            with self._lock:
                self.syncs.append(("stamp", path))
        return n


@pytest.mark.parametrize("queues", [0, 3])
def test_a_durable_publish_stamps_only_after_its_record_is_synced(root: Path, queues: int) -> None:
    with BlockingBus(root, config=OFF) as setup:
        for q in "abc"[:queues]:
            setup.declare_queue(q, ["t.#"])
    ops = _Stamps()
    with BlockingBus(root, ops=ops, config=ON) as bus:
        bus.publish("t.x", b"first", durable=True)  # makes the log, opens the queues
        log = str(the_log(root))
        ops.clear()
        bus.publish("t.x", b"kept", durable=True)
        ev = ops.syncs
        stamps = [i for i, e in enumerate(ev) if e[0] == "stamp"]
        assert len({ev[i][1] for i in stamps}) == 1 + queues
        assert min(stamps) > ev.index(("fdatasync", log)), ev


def test_a_log_that_cannot_be_made_leaves_durable_publishes_syncing_their_files(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Writing the new log's zeros fails (a full disk, say): the durable publishes of
    this bus sync their files instead, with a warning, and no log file is left."""
    ops = LogFaults("pwrite")
    ops.armed = True
    with caplog.at_level(logging.WARNING, logger="fsbus"):
        with BlockingBus(root, ops=ops, config=ON) as bus:
            infos = [bus.publish("t.x", f"d{i}".encode(), durable=True) for i in range(2)]
            assert ops.failed == 1  # tried once, not at each publish
            assert log_files(root) == []
            syncs = ops.file_syncs()
            for info in infos:
                assert ("fsync", os.path.dirname(info.path)) in syncs, syncs
                assert Path(info.path).is_file()
            assert not any(is_log(p) for _, p in syncs)
    assert "sync their files instead" in caplog.text


# ================================================================ 6. its life


def test_closing_the_bus_removes_its_log(root: Path) -> None:
    with BlockingBus(root, config=ON) as bus:
        bus.publish("t.x", b"x", durable=True)
        assert len(log_files(root)) == 1
    assert log_files(root) == []


@pytest.mark.anyio
async def test_closing_an_async_bus_removes_its_log(root: Path) -> None:
    async with Bus(root, config=ON) as bus:
        await bus.publish("t.x", b"x", durable=True)
        assert len(log_files(root)) == 1
    assert log_files(root) == []


def test_two_buses_of_one_process_share_one_log(root: Path) -> None:
    with BlockingBus(root, config=ON) as one, BlockingBus(root, config=ON) as two:
        a = one.publish("t.x", b"from one", durable=True)
        b = two.publish("t.x", b"from two", durable=True)
        log = the_log(root)
        (held,) = [w for w in wal._logs.values() if w.path == str(log)]
        assert held.users == 2
        records = records_of(root)
        assert [r.seq for r in records] == [1, 2]
        _assert_record_names(root, records[0], [a.path])
        _assert_record_names(root, records[1], [b.path])
        one.close()
        assert the_log(root) == log  # still the other's
        assert held.users == 1
        c = two.publish("t.x", b"after", durable=True)
        _assert_record_names(root, records_of(root)[2], [c.path])
    assert log_files(root) == []
    assert all(w.path != str(log) for w in wal._logs.values())


def test_the_log_is_flocked_while_its_bus_is_open(root: Path) -> None:
    with BlockingBus(root, config=ON) as bus:
        bus.publish("t.x", b"x", durable=True)
        assert is_flocked(the_log(root))
        header, _ = read_log(the_log(root))
        assert header is not None
        assert header.pid == os.getpid()
        assert the_log(root).stat().st_size == wal.LOG_SIZE


# ================================================================ 7. recovery, same boot

N = 30


def _assert_each_queue_holds_each_message_once(
    bus: BlockingBus, queues: str, sent: list[bytes]
) -> None:
    """Consumed to the end, each queue gave each payload sent exactly once."""
    for q in queues:
        assert bus.queue_info(q).depth == len(sent), q
        got = _drain(bus, q, len(sent))
        assert sorted(got) == sorted(sent), q
        assert bus.queue_info(q).depth == 0, q


SENT = [payload(i) for i in range(N)]


def test_a_killed_publishers_log_is_synced_and_removed_when_a_bus_opens(root: Path) -> None:
    placed = run_and_kill(root, count=N, queues=("a", "b"))
    assert len(placed) == N
    (left,) = log_files(root)
    header, records = read_log(left)
    assert header is not None
    assert header.boot_id == Ops().boot_id()
    assert len(records) == N
    assert all(len(r.files) == 3 for r in records)  # the message and its 2 copies
    before = _snapshot(root, _main_files(root) + _queue_files(root, "a") + _queue_files(root, "b"))
    ops = SyncRecording()
    with BlockingBus(root, ops=ops, config=ON) as bus:
        assert not left.exists()
        assert ("syncfs", str(left)) in ops.syncs
        assert ops.restored == []  # nothing lost: the page cache had it all
        assert _snapshot(root, list(before)) == before
        assert len(_main_files(root)) == N
        _assert_each_queue_holds_each_message_once(bus, "ab", SENT)
    assert log_files(root) == []


def test_the_logs_of_two_killed_publishers_are_both_dealt_with(root: Path) -> None:
    """Two processes publishing at once, each into its own log, both killed: the next
    bus removes both logs, and each queue holds every message of both, once."""
    with BlockingBus(root, config=OFF) as setup:
        setup.declare_queue("a", ["t.#"])
        setup.declare_queue("b", ["t.#"])
    children = [Publisher(root, count=N, queues=(), prefix=p) for p in ("p", "q")]
    try:
        placed = [c.ready()["placed"] for c in children]
    finally:
        for c in children:
            c.kill()
    assert [c.proc.returncode for c in children] == [-signal.SIGKILL] * 2
    assert len(log_files(root)) == 2
    assert sum(len(read_log(f)[1]) for f in log_files(root)) == 2 * N
    assert len(set(placed[0]) | set(placed[1])) == 2 * N
    sent = [payload(i, prefix=p) for p in ("p", "q") for i in range(N)]
    with BlockingBus(root, config=ON) as bus:
        assert log_files(root) == []
        assert len(_main_files(root)) == 2 * N
        _assert_each_queue_holds_each_message_once(bus, "ab", sent)


# ================================================================ 8. recovery, restarted


def test_after_a_restart_the_records_write_back_what_the_cut_lost(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    placed = run_and_kill(root, count=N, queues=("a", "b", "c"), delete=("c",))
    (left,) = log_files(root)
    _header, records = read_log(left)
    assert len(records) == N
    assert not (root / "fsbus" / "queues" / "c").exists()
    assert all(any(rel.startswith("fsbus/queues/c/") for rel, _ in r.files) for r in records)
    main = _main_files(root)
    qa, qb = _queue_files(root, "a"), _queue_files(root, "b")
    assert sorted(main) == sorted(relative(root, p) for p in placed)
    assert len(qa) == len(qb) == N
    before = _snapshot(root, main + qa + qb)
    # What a power cut may leave: files gone, empty, torn (their size but zeros), and a
    # file whose leading byte a consumer changed since (a delivery count): it stays.
    gone, emptied, torn, counted = [], [], [], []
    for i, rel in enumerate(sorted(before)):
        path = root / rel
        kind = i % 5
        if kind == 0:
            path.unlink()
            gone.append(rel)
        elif kind == 1:
            os.truncate(path, 0)
            emptied.append(rel)
        elif kind == 2:
            path.write_bytes(before[rel][:1] + bytes(len(before[rel]) - 1))
            torn.append(rel)
        elif kind == 3:
            path.write_bytes(b"\x01" + before[rel][1:])
            counted.append(rel)
    assert gone
    assert emptied
    assert torn
    assert counted
    assert any(r.startswith("messages/") for r in gone)
    assert any(r.startswith("fsbus/queues/a/") for r in gone)
    assert any(r.startswith("fsbus/queues/b/") for r in emptied)

    ops = Restarted()
    with caplog.at_level(logging.WARNING, logger="fsbus"):
        with BlockingBus(root, ops=ops, config=ON) as bus:
            assert not left.exists()
            assert log_files(root) == []
            assert sorted(relative(root, p) for p in ops.restored) == sorted(gone + emptied + torn)
            for rel, data in before.items():
                want = b"\x01" + data[1:] if rel in counted else data
                assert (root / rel).read_bytes() == want, rel
            # nothing more, nothing twice; the deleted queue stays deleted
            assert sorted(_main_files(root)) == sorted(main)
            assert sorted(_queue_files(root, "a")) == sorted(qa)
            assert sorted(_queue_files(root, "b")) == sorted(qb)
            assert not (root / "fsbus" / "queues" / "c").exists()
            assert sorted(q.name for q in bus.queues()) == ["a", "b"]
            assert list((root / "staging").iterdir()) == []
            _assert_each_queue_holds_each_message_once(bus, "ab", SENT)
    assert f"{len(gone + emptied + torn)} message file(s) written again" in caplog.text


def test_after_a_restart_records_covered_by_a_checkpoint_are_not_replayed(
    root: Path,
) -> None:
    """A small log wraps (each wrap checkpoints: syncfs, then the header says up to
    which record): what is at or below the checkpoint is on disk, and is not written
    back even if it is gone (consumed, say); what came after is."""
    log_size = 64 << 10
    placed = run_and_kill(root, count=60, queues=("a",), size=1000, log_size=log_size)
    (left,) = log_files(root)
    assert left.stat().st_size == log_size
    header, records = read_log(left)
    assert header is not None
    assert header.checkpoint > 0  # it wrapped
    assert records
    assert records[0].seq == header.checkpoint + 1
    assert records[-1].seq == 60
    replayed = {rel for r in records for rel, _ in r.files}
    main = {relative(root, p) for p in placed}
    covered = sorted(main - replayed)
    logged = sorted(main & replayed)
    assert covered
    assert logged
    data = {rel: (root / rel).read_bytes() for rel in logged}
    for rel in covered + logged:
        (root / rel).unlink()
    with BlockingBus(root, ops=Restarted(), config=ON):
        assert log_files(root) == []
        for rel in covered:
            assert not (root / rel).exists(), rel
        for rel in logged:
            assert (root / rel).read_bytes() == data[rel], rel


def test_after_a_restart_an_explicit_checkpoint_bounds_the_replay(root: Path) -> None:
    """The same with a checkpoint taken by hand in this process: a copy of its log,
    flocked by nobody, is what a dead process would have left."""
    with BlockingBus(root, config=ON) as bus:
        early = bus.publish("t.x", b"early", durable=True)
        held = next(w for w in wal._logs.values() if w.path == str(the_log(root)))
        with held._lock:
            held._checkpoint_locked()
        late = bus.publish("t.x", b"late", durable=True)
        dead = wal_dir(root) / "deadhost-1-00000000.log"
        dead.write_bytes(the_log(root).read_bytes())
        header, records = read_log(dead)
        assert header is not None
        assert header.checkpoint == 1
        assert [r.seq for r in records] == [1, 2]
    assert log_files(root) == [dead]
    late_bytes = Path(late.path).read_bytes()
    os.unlink(early.path)
    os.unlink(late.path)
    with BlockingBus(root, ops=Restarted(), config=ON):
        assert log_files(root) == []
        assert not os.path.exists(early.path)
        assert Path(late.path).read_bytes() == late_bytes


LONG_TOPIC = "t." + "y" * 300
"""Too long for a file name: its message name is 251 bytes, with a topic sidecar."""


def test_after_a_restart_a_long_topic_message_is_written_back(root: Path) -> None:
    placed = run_and_kill(root, count=3, queues=("a",), topic=LONG_TOPIC)
    (left,) = log_files(root)
    qtopics = root / "fsbus" / "queues" / "a" / "bus" / "topics"
    sidecars = [f"topics/{f}" for f in files_under(root / "topics")]
    sidecars += [f"fsbus/queues/a/bus/topics/{f}" for f in files_under(qtopics)]
    files = _main_files(root) + _queue_files(root, "a") + sidecars
    assert len(files) == 4 * 3  # each message and its copy, with a topic sidecar each
    before = _snapshot(root, files)
    for rel in files:
        (root / rel).unlink()
    with BlockingBus(root, ops=Restarted(), config=ON) as bus:
        assert not left.exists()
        assert _snapshot(root, files) == before
        assert sorted(i.topic for i in bus.browse("#")) == [LONG_TOPIC] * 3
        assert sorted(_drain(bus, "a", 3)) == [payload(i) for i in range(3)]
    assert {relative(root, p) for p in placed} <= set(files)


# ================================================================ 9. hostile logs


def _opened_once(root: Path) -> None:
    with BlockingBus(root, config=OFF):
        pass
    wal_dir(root).mkdir(parents=True, exist_ok=True)


def test_a_log_of_random_bytes_is_quarantined(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    _opened_once(root)
    planted = wal_dir(root) / "somehost-4242-deadbeef.log"
    junk = os.urandom(8192)
    planted.write_bytes(junk)
    with caplog.at_level(logging.WARNING, logger="fsbus"):
        with BlockingBus(root, config=ON) as bus:
            assert not planted.exists()
            moved = root / "fsbus" / "quarantine" / planted.name
            assert moved.read_bytes() == junk
            info = bus.publish("t.x", b"still works", durable=True)
            assert Path(info.path).is_file()
            assert len(records_of(root)) == 1
    assert "not a durable log" in caplog.text
    assert str(planted) in caplog.text


def test_an_all_zero_log_is_removed(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    _opened_once(root)
    planted = wal_dir(root) / "somehost-4242-00000000.log"
    planted.write_bytes(bytes(1 << 16))
    with caplog.at_level(logging.WARNING, logger="fsbus"):
        with BlockingBus(root, config=ON) as bus:
            assert not planted.exists()
            assert not (root / "fsbus" / "quarantine" / planted.name).exists()
            bus.publish("t.x", b"x", durable=True)
    assert "durable log" not in caplog.text


def _plant_log(path: Path, files: list[tuple[str, bytes]], boot: str = "an-older-boot") -> None:
    buf = bytearray(1 << 16)
    head = wal.encode_header(wal.Header(generation=1, checkpoint=0, boot_id=boot, pid=4242))
    buf[: len(head)] = head
    rec = wal.encode_record(1, files)
    buf[wal.HEADER : wal.HEADER + len(rec)] = rec
    path.write_bytes(bytes(buf))


def test_a_log_naming_paths_outside_the_bus_writes_nothing_there(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _opened_once(root)
    outside = tmp_path / "escape"
    absolute = tmp_path / "absolute"
    planted = wal_dir(root) / "somehost-4242-hostile0.log"
    _plant_log(
        planted,
        [
            ("../escape", b"\0pwned"),
            ("messages/../../escape", b"\0pwned"),
            (str(absolute), b"\0pwned"),
            ("/etc/fsbus-test-should-not-exist", b"\0pwned"),
            ("fsbus/quarantine/replayed", b"\0inside"),  # shows that the record was read
        ],
    )
    before = set(os.listdir(tmp_path))
    with caplog.at_level(logging.WARNING, logger="fsbus"):
        with BlockingBus(root, config=ON) as bus:
            assert not planted.exists()
            assert (root / "fsbus" / "quarantine" / "replayed").read_bytes() == b"\0inside"
            bus.publish("t.x", b"x", durable=True)
    assert not outside.exists()
    assert not absolute.exists()
    assert not os.path.exists("/etc/fsbus-test-should-not-exist")
    assert set(os.listdir(tmp_path)) == before
    assert not (root / "etc").exists()
    text = caplog.text
    for rel in ("../escape", "messages/../../escape", str(absolute)):
        assert f"names {rel!r}, outside the bus" in text


@pytest.mark.parametrize("kind", ["garbage", "restart-log"])
def test_a_log_flocked_by_a_live_process_is_left_alone(root: Path, kind: str) -> None:
    """Held by another open file description (as its living process holds it): neither
    quarantined nor replayed nor removed."""
    _opened_once(root)
    planted = wal_dir(root) / "livehost-4242-cafef00d.log"
    target = root / "fsbus" / "quarantine" / "would-be-replayed"
    if kind == "garbage":
        planted.write_bytes(os.urandom(8192))
    else:
        _plant_log(planted, [(relative(root, target), b"\0replayed")])
    content = planted.read_bytes()
    fd = os.open(planted, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with BlockingBus(root, ops=Restarted(), config=ON) as bus:
            bus.publish("t.x", b"x", durable=True)
            assert planted.read_bytes() == content
            assert not (root / "fsbus" / "quarantine" / planted.name).exists()
            assert not target.exists()
            assert len(log_files(root)) == 2  # its and ours
        assert log_files(root) == [planted]
    finally:
        os.close(fd)
    # once its holder is gone, the next bus deals with it
    with BlockingBus(root, ops=Restarted(), config=ON):
        assert not planted.exists()
        assert (kind == "restart-log") == target.exists()


def _plant_entry(where: Path, kind: str, outside: Path) -> None:
    if kind == "symlink":
        outside.write_bytes(os.urandom(8192))
        where.symlink_to(outside)
    elif kind == "dangling-symlink":
        where.symlink_to(outside)
    elif kind == "directory":
        where.mkdir()
    else:
        os.mkfifo(where)


@pytest.mark.parametrize(
    "kind",
    [
        "symlink",
        "dangling-symlink",
        "directory",
        "fifo",
    ],
)
def test_something_not_a_log_file_in_the_log_folder_is_moved_aside(
    root: Path, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As a foreign file among the buckets: moved to the quarantine with a warning
    naming it, and the bus opens and publishes (nothing outside is touched, nothing
    read through it)."""
    _opened_once(root)
    planted = wal_dir(root) / "planted-1-00000000.log"
    outside = tmp_path / "outside"
    _plant_entry(planted, kind, outside)
    kept = outside.read_bytes() if outside.exists() else None
    with caplog.at_level(logging.WARNING, logger="fsbus"):
        with BlockingBus(root, config=ON) as bus:
            bus.publish("t.x", b"after", durable=True)
            assert [m.topic for m in bus.browse("t.#")] == ["t.x"]
    assert not os.path.lexists(planted)
    assert os.path.lexists(root / "fsbus" / "quarantine" / planted.name)
    assert str(planted) in caplog.text
    assert (outside.read_bytes() if outside.exists() else None) == kept


# ================================================================ 10. the platform


@pytest.mark.parametrize(
    ("facts", "logged"),
    [
        (MountFacts(fstype="ext4", journaled=True), True),
        (MountFacts(fstype="ext4", journaled=False), False),
        (MountFacts(fstype="ext4", journaled=None), False),
        (MountFacts(fstype="tmpfs"), False),
        (MountFacts(fstype="xfs"), False),
        (MountFacts(fstype="btrfs"), False),
        (MountFacts(fstype="nfs"), False),
        (MountFacts(fstype="nfs4"), False),
        (MountFacts(fstype="ceph"), False),
        (MountFacts(fstype="fuse.ceph-fuse"), False),
    ],
    ids=lambda v: v if isinstance(v, bool) else f"{v.fstype}-{v.journaled}",
)
def test_the_platform_says_where_the_durable_log_is_used(facts: MountFacts, logged: bool) -> None:
    p = decide(facts)
    assert p.durable_log is logged
    assert ("durable log" in p.describe()) is logged
    assert any("durable log" in n for n in p.notes) is logged


def test_doctor_reports_the_durable_log_on_a_journaled_ext4(tmp_path: Path) -> None:
    from fsbus import check_directory

    report = check_directory(tmp_path, reader=JournaledExt4())
    assert "durable log" in report.check("filesystem").detail
    report = check_directory(tmp_path, reader=UnorderedMount())
    assert "durable log" not in report.check("filesystem").detail


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=4))
def test_a_record_read_back_from_a_real_log_matches_the_files(payloads: list[bytes]) -> None:
    """(hypothesis, in-process with real files) what a publish wrote is what its
    record holds, byte for byte."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "bus"
        with BlockingBus(root, config=ON) as bus:
            infos = [bus.publish("t.x", p, durable=True) for p in payloads]
            records = records_of(root)
            assert len(records) == len(payloads)
            for rec, info in zip(records, infos, strict=True):
                _assert_record_names(root, rec, [info.path])
