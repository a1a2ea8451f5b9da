"""Durable publishes and storage faults, injected through the Ops seam.

The tests run as root on this machine, where ``chmod 0o500`` stops nothing, so the
faults a read-only remount, a full disk or a permission change would cause are
raised by an :class:`~fsbus._bus.ops.Ops` subclass instead; everything else is real.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fsbus import (
    BlockingBus,
    Bus,
    BusConfig,
    DiskFull,
    StorageError,
    StoragePermissionError,
)
from tests.journaled import JournaledExt4, UnorderedMount

from .conftest import ERRNO_NAMES, FailingOps, Inbox, RecordingOps, files_under, message_files

# These tests are about the syncs of a durable publish made file by file.
SYNCS = BusConfig(durable_log="off")

LONG_TOPIC = "durable." + "t" * 150


def sync_calls(ops: RecordingOps, root: Path) -> list[tuple[str, str]]:
    """The syncs and placements, with paths relative to the bus root."""
    out = []
    for op, what in ops.calls:
        if op == "copy_range":
            continue
        out.append((op, what.replace(f"{root}/", "")))
    return out


@pytest.mark.parametrize("kind", ["bytes", "path"])
@pytest.mark.anyio
async def test_durable_publish_syncs_file_sidecars_then_directories_in_order(
    root: Path, tmp_path: Path, kind: str
) -> None:
    ops = RecordingOps()
    src = tmp_path / "payload"
    src.write_bytes(b"must survive power loss")
    payload: bytes | Path = src if kind == "path" else src.read_bytes()
    async with Bus(root, ops=ops, config=SYNCS) as bus:
        ops.calls.clear()
        info = await bus.publish(LONG_TOPIC, payload, single=True, durable=True, headers={"h": "1"})
        # Present as soon as publish returns.
        assert await anyio.Path(info.path).read_bytes() == b"\x00must survive power loss"
        b, n = info.bucket, info.name
        assert sync_calls(ops, root) == [
            ("fdatasync", f"staging/{n}"),
            # the first file in a bucket makes the bucket's directory (made on first use,
            # on a local mount): its name is synced before the file goes into it
            ("mkdir", f"topics/{b}"),
            ("fsync", "topics"),
            ("fdatasync", f"topics/{b}/{n}"),
            ("mkdir", f"fsbus/meta/{b}"),
            ("fsync", "fsbus/meta"),
            ("fdatasync", f"fsbus/meta/{b}/{n}"),
            # the sidecars' names before the message's (tests/powercut found a message
            # visible without its headers after a cut between these syncs)
            ("fsync", f"topics/{b}"),
            ("fsync", f"fsbus/meta/{b}"),
            ("mkdir", f"messages/{b}"),
            ("fsync", "messages"),
            ("place", f"staging/{n} -> messages/{b}/{n}"),
            ("fsync", f"messages/{b}"),
        ]


class JournaledRecording(JournaledExt4, RecordingOps):
    """Records syncs and placements on a bus that sees a journaled ext4 mount."""


@pytest.mark.anyio
async def test_durable_page_on_a_journaled_mount_is_placed_then_synced(root: Path) -> None:
    """One page, no sidecar, on a filesystem that writes data before the metadata that
    shows it: renamed first, then its data and its bucket synced (the first sync
    commits its creation and its rename together). Such a filesystem commits its
    metadata in order, so the bucket made for it needs no sync of its own: the
    bucket's sync commits its making too."""
    ops = JournaledRecording()
    async with Bus(root, ops=ops, config=SYNCS) as bus:
        ops.calls.clear()
        info = await bus.publish("d", b"x" * 4095, durable=True)  # a file of 4,096
    n, b = info.name, info.bucket
    assert sync_calls(ops, root) == [
        ("mkdir", f"messages/{b}"),
        ("place", f"staging/{n} -> messages/{b}/{n}"),
        ("fdatasync", f"staging/{n}"),  # (the descriptor opened in staging)
        ("fsync", f"messages/{b}"),
    ]


@pytest.mark.anyio
async def test_durable_over_a_page_on_a_journaled_mount_is_synced_first(root: Path) -> None:
    """Larger: its data is synced before the rename, so that no cut shows part of it."""
    ops = JournaledRecording()
    async with Bus(root, ops=ops, config=SYNCS) as bus:
        ops.calls.clear()
        info = await bus.publish("d", b"x" * 4096, durable=True)
    n, b = info.name, info.bucket
    assert sync_calls(ops, root) == [
        ("fdatasync", f"staging/{n}"),
        ("mkdir", f"messages/{b}"),
        ("place", f"staging/{n} -> messages/{b}/{n}"),
        ("fsync", f"messages/{b}"),
    ]


class UnorderedRecording(UnorderedMount, RecordingOps):
    """Records syncs and placements on a bus that sees a btrfs mount."""


@pytest.mark.anyio
async def test_durable_short_topic_syncs_file_then_bucket(root: Path) -> None:
    """Elsewhere (btrfs here, see test_platform) a durable message is synced before its
    rename, so that no power cut shows it torn."""
    ops = UnorderedRecording()
    async with Bus(root, ops=ops, config=SYNCS) as bus:
        ops.calls.clear()
        info = await bus.publish("d", b"x", durable=True)
    n, b = info.name, info.bucket
    assert sync_calls(ops, root) == [
        ("fdatasync", f"staging/{n}"),
        ("mkdir", f"messages/{b}"),  # its first message: the bucket made, its name synced
        ("fsync", "messages"),
        ("place", f"staging/{n} -> messages/{b}/{n}"),
        ("fsync", f"messages/{b}"),
    ]


@pytest.mark.anyio
async def test_durable_async_iterator_payload_is_synced(root: Path) -> None:
    ops = RecordingOps()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"

    async with Bus(root, ops=ops, config=SYNCS) as bus:
        ops.calls.clear()
        info = await bus.publish("d", chunks(), durable=True)
    ops_done = [op for op, _ in sync_calls(ops, root)]
    assert ops_done == ["fdatasync", "mkdir", "fsync", "place", "fsync"]  # (a new bucket)
    assert await anyio.Path(info.path).read_bytes() == b"\x00ab"


@pytest.mark.anyio
async def test_plain_publish_does_not_sync(root: Path) -> None:
    ops = RecordingOps()
    async with Bus(root, ops=ops) as bus:
        ops.calls.clear()
        await bus.publish(LONG_TOPIC, b"x", headers={"h": "1"})
    calls = sync_calls(ops, root)
    # No data or bucket is synced. Only the names of the bucket directories made for
    # this publish are (the bus is new: the first file in a bucket makes it, and syncs
    # its name whatever the publish, since a durable file in it later syncs only the
    # bucket).
    made = [("fsync", p) for p in ("topics", "fsbus/meta", "messages")]
    assert [c for c in calls if c[0] == "fsync"] == made
    assert [op for op, _ in calls if op != "fsync"] == ["mkdir"] * 3 + ["place"]


def assert_nothing_partial(root: Path) -> None:
    assert files_under(root / "staging") == []
    assert message_files(root) == []
    assert files_under(root / "topics") == []
    assert files_under(root / "fsbus" / "meta") == []


@pytest.mark.parametrize(
    ("op", "err", "cls", "hint"),
    [
        ("open", errno.EACCES, StoragePermissionError, "permission denied"),
        ("open", errno.EROFS, StoragePermissionError, "read-only"),
        ("open", errno.ENOSPC, DiskFull, "full"),
        ("write", errno.ENOSPC, DiskFull, "full"),
        ("write", errno.EROFS, StoragePermissionError, "read-only"),
        ("place", errno.EACCES, StoragePermissionError, "permission denied"),
        ("place", errno.ENOSPC, DiskFull, "full"),
        ("fdatasync", errno.EIO, StorageError, "cause"),
    ],
    ids=lambda v: ERRNO_NAMES.get(v, str(v)) if isinstance(v, int) else None,
)
@pytest.mark.anyio
async def test_storage_faults_raise_clear_errors_and_leave_nothing_partial(
    root: Path, op: str, err: int, cls: type[StorageError], hint: str
) -> None:
    ops = FailingOps(op, err)
    inbox = Inbox()
    async with Bus(root, ops=ops, config=SYNCS) as bus:
        await bus.subscribe("#", inbox)
        ops.armed = True
        with pytest.raises(cls, match=hint) as caught:
            await bus.publish(LONG_TOPIC, b"payload", headers={"h": "v"}, durable=True)
        assert isinstance(caught.value.__cause__, OSError)
        assert caught.value.__cause__.errno == err
        assert caught.value.path is not None
        assert "staging" in caught.value.path
        assert_nothing_partial(root)
        # The bus is not broken: once the fault is gone publishing works again.
        ops.armed = False
        await bus.publish("after", b"ok")
        (msg,) = await inbox.wait_for(1)
    assert msg.topic == "after"
    assert bus.statistics().published == 1


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES], ids=ERRNO_NAMES.get)
@pytest.mark.anyio
async def test_storage_fault_while_streaming_a_file_payload(
    root: Path, tmp_path: Path, err: int
) -> None:
    src = tmp_path / "p"
    src.write_bytes(b"z" * 100_000)
    ops = FailingOps("write", err)
    async with Bus(root, ops=ops) as bus:
        ops.armed = True
        with pytest.raises(StorageError) as caught:
            await bus.publish("f", src)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == err
    assert_nothing_partial(root)


@pytest.mark.anyio
async def test_storage_fault_while_streaming_an_async_iterator(root: Path) -> None:
    ops = FailingOps("write", errno.ENOSPC)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"first"
        ops.armed = True
        yield b"second"

    async with Bus(root, ops=ops) as bus:
        with pytest.raises(DiskFull):
            await bus.publish("f", chunks())
    assert_nothing_partial(root)


def test_blocking_publish_faults_are_the_same_errors(root: Path) -> None:
    ops = FailingOps("write", errno.ENOSPC)
    with BlockingBus(root, ops=ops, config=SYNCS) as bus:
        ops.armed = True
        with pytest.raises(DiskFull, match="full") as caught:
            bus.publish(LONG_TOPIC, b"x", headers={"a": "b"})
        assert caught.value.__cause__ is not None
        ops.armed = False
        bus.publish("fine", b"x")
    assert files_under(root / "staging") == []
    assert len(message_files(root)) == 1


@pytest.mark.parametrize(
    ("err", "cls"),
    [(errno.EACCES, StoragePermissionError), (errno.EROFS, StoragePermissionError)],
    ids=["EACCES", "EROFS"],
)
@pytest.mark.anyio
async def test_unwritable_root_fails_at_open_with_the_path(
    root: Path, err: int, cls: type[StorageError]
) -> None:
    ops = FailingOps("mkdir", err, where=str(root))
    ops.armed = True
    bus = Bus(root, ops=ops)
    with pytest.raises(cls) as caught:
        await bus.__aenter__()
    assert caught.value.path == str(root)
    assert "creating the bus directory" in str(caught.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory modes")
@pytest.mark.anyio
async def test_unwritable_root_by_mode(root: Path) -> None:
    async with Bus(root):
        pass
    (root / "staging").chmod(0o500)
    try:
        async with Bus(root) as bus:
            with pytest.raises(StoragePermissionError, match="permission denied"):
                await bus.publish("t", b"x")
    finally:
        (root / "staging").chmod(0o700)
    assert message_files(root) == []


@pytest.mark.anyio
async def test_a_file_as_the_root_is_refused_clearly(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    await anyio.Path(not_a_dir).write_text("x")
    with pytest.raises(StorageError, match="a file stands where a directory should be") as caught:
        async with Bus(not_a_dir):
            pass
    assert isinstance(caught.value.__cause__, NotADirectoryError)
    assert await anyio.Path(not_a_dir).read_text() == "x"
