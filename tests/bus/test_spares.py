"""Spare staging files: on a local filesystem a bus creates the staging file of its next
plain publish right after stamping the last one, in ``fsbus/spares/``, so that the
creation happens while subscribers read the message rather than before they can.

Each test asserts what a user of the bus sees (every message delivered once, nothing left
behind once the bus is closed) and where the spare went (its inode)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from fsbus import BlockingBus, BusConfig, DiskFull, StorageError

from .conftest import FailingOps, RecordingOps, files_under, message_files, peer_buckets

FAST = BusConfig(bucket_num_chars=1, poll_interval=0.05, retry_interval=0.05, refresh_ttl=0.1)


def _spares(root: Path) -> list[Path]:
    folder = root / "fsbus" / "spares"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_a_plain_publish_is_written_into_the_spare_made_after_the_last_one(root: Path) -> None:
    with BlockingBus(root) as bus:
        first = bus.publish("t.a", b"one")
        (spare,) = _spares(root)
        assert spare.stat().st_size == 0
        ino = spare.stat().st_ino
        second = bus.publish("t.b", b"two")
        assert os.stat(second.path).st_ino == ino  # the spare became the message
        assert (root / "messages" / second.bucket / second.name).read_bytes() == b"\x00two"
        (after,) = _spares(root)
        assert after.stat().st_ino != ino
        assert os.stat(first.path).st_ino != ino
    assert _spares(root) == []  # removed when the bus closed
    assert files_under(root / "staging") == []


class Order(RecordingOps):
    """Records placements (renames), and in between each file created and each stamp."""

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        fd = super().open(path, flags, mode)
        if flags & os.O_CREAT:
            self.calls.append(("create", path))
        return fd

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if self.paths.get(fd, "").endswith("/UPDATE"):
            self.calls.append(("stamp", ""))
        return super().pwrite(fd, data, offset)


def test_the_next_spare_is_made_after_the_stamp(root: Path) -> None:
    peer_buckets(root)  # (a bucket's first message makes it: see test_storage)
    ops = Order()
    with BlockingBus(root, ops=ops) as bus:
        bus.publish("t.a", b"one")
        ops.calls.clear()
        bus.publish("t.b", b"two")
    kinds = [kind for kind, _ in ops.calls]
    assert kinds[:3] == ["place", "stamp", "create"]  # no creation before it is seen
    assert ops.calls[0][1].startswith(f"{root}/fsbus/spares/")
    assert ops.calls[2][1].startswith(f"{root}/fsbus/spares/")


@pytest.mark.parametrize("single", [False, True])
def test_a_spare_another_process_swept_is_replaced_and_nothing_is_lost(
    root: Path, single: bool
) -> None:
    with BlockingBus(root, config=FAST) as bus:
        bus.publish("t.a", b"one", single=single)
        (spare,) = _spares(root)
        assert bus.gc(debris_age=0) == 0  # its own spare is no debris to it
        assert spare.exists()
        with BlockingBus(root, config=FAST) as other:  # another process's gc, told 0 s
            assert other.gc(debris_age=0) == 1
        assert _spares(root) == []
        bus.publish("t.b", b"two", single=single)  # its spare was gone: staged anew
        assert len(_spares(root)) == 1
        with bus.messages("t.#", kind="single" if single else "multi", existing=True) as it:
            got = sorted(it.get(timeout=10).payload for _ in range(2))
    assert got == [b"one", b"two"]
    assert _spares(root) == []
    assert files_under(root / "staging") == []


@pytest.mark.parametrize(("op", "error"), [("write", DiskFull), ("place", StorageError)])
def test_a_storage_error_in_a_spare_is_the_publishs_and_leaves_nothing_behind(
    root: Path, op: str, error: type[StorageError]
) -> None:
    ops = FailingOps(op, errno.ENOSPC, where="/fsbus/spares/")
    with BlockingBus(root, ops=ops) as bus:
        bus.publish("t", b"first")
        assert len(_spares(root)) == 1
        ops.armed = True
        with pytest.raises(error) as caught:
            bus.publish("t", b"second")
        assert isinstance(caught.value.__cause__, OSError)
        assert "/fsbus/spares/" in str(caught.value.path)
        assert _spares(root) == []  # the spare went with the publish
        ops.armed = False
        bus.publish("t", b"third")
        assert bus.statistics().published == 2
    assert _spares(root) == []
    assert files_under(root / "staging") == []
    assert sorted((root / "messages" / f).read_bytes() for f in message_files(root)) == [
        b"\x00first",
        b"\x00third",
    ]


def test_a_spare_that_cannot_be_made_costs_nothing(root: Path) -> None:
    ops = FailingOps("open", errno.ENOSPC, where="/fsbus/spares/")
    with BlockingBus(root, ops=ops) as bus:
        bus.publish("t", b"first")  # its spare made
        ops.armed = True  # no more: each publish stages its own
        for payload in (b"second", b"third"):
            bus.publish("t", payload)
        assert _spares(root) == []
    assert files_under(root / "staging") == []
    assert sorted((root / "messages" / f).read_bytes() for f in message_files(root)) == [
        b"\x00first",
        b"\x00second",
        b"\x00third",
    ]


def test_a_queue_copy_is_staged_as_before(root: Path) -> None:
    # Only the bus's own plain publishes use spares: a queue's bus keeps none.
    with BlockingBus(root) as bus:
        bus.declare_queue("billing", ["orders.#"])
        for i in range(3):
            bus.publish("orders.paid", f"order {i}")
        queue_private = root / "fsbus" / "queues" / "billing" / "bus" / "fsbus"
        assert not (queue_private / "spares").exists()
        with bus.messages(queue="billing") as it:
            got = sorted(it.get(timeout=10).payload for _ in range(3))
    assert got == [b"order 0", b"order 1", b"order 2"]
    assert not (queue_private / "spares").exists()


def test_a_publish_into_a_missing_bucket_fails_clearly_and_leaves_no_spare(root: Path) -> None:
    with BlockingBus(root, config=FAST) as bus:
        bus.publish("t", b"first")
        assert len(_spares(root)) == 1
        # removed from under the bus: a bucket is made again on first use, but not
        # without the folder that holds the buckets
        shutil.rmtree(root / "messages")
        with pytest.raises(StorageError) as caught:
            bus.publish("t", b"second")
        assert isinstance(caught.value.__cause__, FileNotFoundError)
        assert _spares(root) == []  # its data did not stay behind in the spare
        assert files_under(root / "staging") == []
