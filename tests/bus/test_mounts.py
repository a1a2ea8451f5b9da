"""The bus follows the filesystem it finds, shown a faked mount table through its I/O seam.

Each test hands the bus an :class:`Ops` whose mount table (``/proc/self/mountinfo``),
statfs magic and BeeGFS client settings (``/proc/fs/beegfs/*/config``) describe another
filesystem mounted on the test's directory; everything else is the real local disk.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, LockingUnsupported, Stream, check_directory
from fsbus._bus.doctor import space_check
from fsbus._bus.ops import Ops
from fsbus._core.mounts import MountReader, detect
from fsbus._stream.ops import StreamOps

from .conftest import Inbox

BEEGFS_DEFAULTS = {"tuneUseGlobalFileLocks": "false", "tuneUseGlobalAppendLocks": "false"}
BEEGFS_GLOBAL = {"tuneUseGlobalFileLocks": "true", "tuneUseGlobalAppendLocks": "true"}


class _Mounted(MountReader):
    """A mount table in which ``point`` holds a filesystem of type ``fstype``."""

    def __init__(
        self,
        point: Path,
        fstype: str,
        options: str = "rw",
        *,
        beegfs: dict[str, str] | None = None,
        magic: int | None = None,
    ) -> None:
        super().__init__()
        self.point = os.path.realpath(point)
        self.fstype = fstype
        self.options = options
        self.beegfs = beegfs
        self.magic = magic

    def read_text(self, path: str) -> str | None:
        if path == "/proc/self/mountinfo":
            return (
                "22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                f"50 22 0:50 / {self.point} rw,relatime shared:9 - {self.fstype} "
                f"server:/export {self.options}\n"
            )
        if path.startswith("/proc/fs/beegfs/"):
            if self.beegfs is None:
                return None
            return "".join(f"{k} = {v}\n" for k, v in self.beegfs.items()) + "sysMgmtdHost = m\n"
        return super().read_text(path)

    def list_names(self, path: str) -> list[str]:
        if path == "/proc/fs/beegfs":
            return ["c4a1e2f3-5B1C2D3E-beegfs"] if self.beegfs is not None else []
        return super().list_names(path)

    def statfs_magic(self, path: str) -> int | None:
        return self.magic


class FakeOps(_Mounted, Ops):
    """The bus's I/O seam, on a faked mount."""


class FakeStreamOps(_Mounted, StreamOps):
    """The streams' I/O seam, on a faked mount."""


def _claims_by_rename(root: Path) -> bool:
    return (root / "fsbus" / "claims").is_dir()


@pytest.mark.parametrize(
    ("fstype", "options", "beegfs", "rename"),
    [
        ("beegfs", "rw", BEEGFS_DEFAULTS, True),
        ("beegfs", "rw", None, True),  # settings unreadable: the defaults
        ("beegfs", "rw", {"tuneUseGlobalFileLocks": "true"}, False),
        ("beegfs", "rw", BEEGFS_GLOBAL, False),
        ("nfs", "rw,vers=3,nolock", None, True),
        ("nfs4", "rw,vers=4.2,local_lock=flock", None, True),
        ("nfs4", "rw,vers=4.2,local_lock=all", None, True),
        ("nfs4", "rw,vers=4.2,local_lock=posix", None, False),
        ("nfs4", "rw,vers=4.2,local_lock=none", None, False),
        ("fuse.sshfs", "rw", None, True),
        ("fuse.ceph-fuse", "rw", None, False),
        ("fuse.glusterfs", "rw", None, False),
    ],
)
def test_singles_are_claimed_by_rename_where_flock_stays_local(
    tmp_path: Path, fstype: str, options: str, beegfs: dict[str, str] | None, rename: bool
) -> None:
    root = tmp_path / "bus"
    ops = FakeOps(tmp_path, fstype, options, beegfs=beegfs)
    with BlockingBus(root, ops=ops) as bus:  # default config: locking="auto"
        bus.publish("jobs.a", b"1", single=True)
        with bus.messages("jobs.#") as jobs:
            job = jobs.get(timeout=10)
            assert job.text() == "1"
            jobs.ack(job)
    assert _claims_by_rename(root) is rename


def test_beegfs_magic_alone_is_recognised(tmp_path: Path) -> None:
    reader = FakeOps(tmp_path, "", beegfs=BEEGFS_DEFAULTS, magic=0x19830326)
    # no mount line matches: only the statfs magic says BeeGFS
    reader.point = "/nowhere"
    assert detect(str(tmp_path), reader).family == "beegfs"
    assert detect(str(tmp_path), reader).single_locking == "rename"


def test_explicit_flock_where_flock_stays_local_is_refused(tmp_path: Path) -> None:
    ops = FakeOps(tmp_path, "beegfs", beegfs=BEEGFS_DEFAULTS)
    with (
        pytest.raises(LockingUnsupported, match=r"tuneUseGlobalFileLocks.*locking='auto'"),
        BlockingBus(tmp_path / "bus", config=BusConfig(locking="flock"), ops=ops),
    ):
        pass


@pytest.mark.parametrize(
    ("fstype", "options", "beegfs", "setting"),
    [
        ("beegfs", "rw", BEEGFS_DEFAULTS, "tuneUseGlobalFileLocks=true"),
        ("beegfs", "rw", {"tuneUseGlobalFileLocks": "true"}, "tuneUseGlobalAppendLocks=true"),
        ("nfs", "rw,nolock", None, "remount without nolock"),
        ("fuse.sshfs", "rw", None, "sshfs never forwards flock"),
    ],
)
def test_streams_refuse_to_open_where_appends_cannot_be_serialised(
    tmp_path: Path, fstype: str, options: str, beegfs: dict[str, str] | None, setting: str
) -> None:
    ops = FakeStreamOps(tmp_path, fstype, options, beegfs=beegfs)
    with pytest.raises(LockingUnsupported, match="tear the log") as err:
        Stream._open(tmp_path, "log", config=None, create=True, ops=ops)
    assert setting in str(err.value)


def test_streams_open_where_flock_crosses_hosts(tmp_path: Path) -> None:
    ops = FakeStreamOps(tmp_path, "beegfs", beegfs=BEEGFS_GLOBAL)
    with Stream._open(tmp_path, "log", config=None, create=True, ops=ops) as s:
        s.append(b"x")
        assert [r.value for r in s.read(0)] == [b"x"]


@pytest.mark.parametrize("fstype", ["fuse.ceph-fuse", "fuse.glusterfs", "nfs4"])
@pytest.mark.anyio
async def test_a_network_mount_is_polled_with_coherent_reads(tmp_path: Path, fstype: str) -> None:
    """Polling only, every 20 ms, UPDATE read with O_DIRECT; stamps by pwrite or reopen."""
    root = tmp_path / "bus"
    inbox = Inbox()
    async with (
        Bus(root, ops=FakeOps(tmp_path, fstype)) as sub,
        Bus(root, ops=FakeOps(tmp_path, fstype)) as pub,
    ):
        assert sub._fs.platform.watch == "poll"
        assert sub._poll_interval == 0.02
        assert not sub._waker.use_inotify
        assert sub._poll_thread  # UPDATE is polled off the event loop
        await sub.subscribe("a.#", inbox)
        scans = sub.statistics().scans
        await anyio.sleep(0.5)
        assert sub.statistics().scans - scans <= 2  # no scan per 20 ms tick while idle
        fd = sub._fs._read_fd
        assert fd is not None
        if sub._fs._direct_ok:  # the test's disk may refuse O_DIRECT (then: fadvise)
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
        started = time.monotonic()
        for n in range(5):
            await pub.publish(f"a.{n}", b"x")
        await inbox.wait_for(5)
        assert time.monotonic() - started < 5  # by polling, not the 10 s full listing
    assert pub._fs.platform.stamp_write == ("reopen" if fstype == "nfs4" else "keep_open")


@pytest.mark.anyio
async def test_an_explicit_poll_interval_wins(tmp_path: Path) -> None:
    async with Bus(
        tmp_path / "bus",
        config=BusConfig(poll_interval=0.5),
        ops=FakeOps(tmp_path, "fuse.ceph-fuse"),
    ) as bus:
        assert bus._poll_interval == 0.5


@pytest.mark.anyio
async def test_a_local_disk_keeps_inotify(tmp_path: Path) -> None:
    async with Bus(tmp_path / "bus") as bus:
        assert bus._fs.platform.family == "local"
        assert bus._waker.use_inotify == (not bus.config.force_polling)
        assert bus._poll_interval == bus.config.poll_interval


def test_an_existing_bus_opens_without_making_its_directories(tmp_path: Path) -> None:
    class Counting(Ops):
        mkdirs = 0

        def mkdir(self, path: str, mode: int = 0o777) -> None:
            Counting.mkdirs += 1
            super().mkdir(path, mode)

    with BlockingBus(tmp_path / "bus"):
        pass
    with BlockingBus(tmp_path / "bus", ops=Counting()):
        pass
    assert Counting.mkdirs <= 12  # the top-level folders, not 4 x 256 bucket folders


def test_a_planted_link_among_the_buckets_is_still_refused(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    with BlockingBus(root):
        pass
    # (buckets are made on first use: none is there yet)
    os.symlink(tmp_path, root / "messages" / "7f")
    with pytest.raises(Exception, match="symbolic link"), BlockingBus(root):
        pass


@pytest.mark.anyio
async def test_listing_on_a_network_mount_uses_several_threads(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    async with Bus(root, ops=FakeOps(tmp_path, "fuse.glusterfs")) as bus:
        await bus.publish("a.b", b"1")
        got = bus._fs.list_buckets(range(256))
        assert sum(len(v) for v in got.values()) == 1
        assert sorted(got) == list(range(256))


# --- doctor -----------------------------------------------------------------------


def _statvfs(blocks: int, bavail: int, files: int, favail: int) -> os.statvfs_result:
    return os.statvfs_result(
        (4 << 20, 4 << 20, blocks, bavail, bavail, files, favail, favail, 0, 255)
    )


def test_doctor_treats_unknown_space_and_inodes_as_unknown() -> None:
    # CephFS without a manager: 0 blocks, f_files 3, f_ffree -1
    check = space_check(_statvfs(0, 0, 3, -1))
    assert check.status == "ok"
    assert "free space unknown" in check.detail
    assert "free inodes unknown" in check.detail
    # The same seen as unsigned
    assert space_check(_statvfs(0, 0, 3, (1 << 64) - 1)).status == "ok"
    # Known and full still fails
    full = space_check(_statvfs(1000, 1, 1000, 10))
    assert full.status == "fail"
    assert space_check(_statvfs(1000, 900, 0, 0)).detail.endswith("inodes not limited")


def test_doctor_reports_the_decisions_the_bus_takes(tmp_path: Path) -> None:
    reader = FakeOps(tmp_path, "beegfs", beegfs=BEEGFS_DEFAULTS)
    report = check_directory(tmp_path, reader=reader)
    fs = report.check("filesystem")
    platform = detect(str(tmp_path), reader)
    assert platform.describe().partition(": ")[2] in fs.detail
    assert fs.status == "warn"
    assert "tuneUseGlobalFileLocks=true" in fs.fix
    assert "claim by rename" in fs.detail
    with BlockingBus(tmp_path / "bus", ops=reader):
        pass
    assert _claims_by_rename(tmp_path / "bus")


def test_doctor_on_a_polled_mount_does_not_ask_for_the_environment(tmp_path: Path) -> None:
    report = check_directory(tmp_path, reader=FakeOps(tmp_path, "fuse.ceph-fuse"))
    assert report.check("filesystem").status == "ok"
    assert "polling only every 20 ms" in report.check("filesystem").detail
    inotify = report.check("inotify")
    assert inotify.status == "ok"
    assert "FSBUS_FORCE_POLLING" not in inotify.fix


@pytest.mark.anyio
async def test_a_single_is_taken_once_across_two_rename_hosts(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    got = Inbox()  # both hosts' handlers
    async with (
        Bus(root, ops=FakeOps(tmp_path, "fuse.sshfs")) as a,
        Bus(root, ops=FakeOps(tmp_path, "fuse.sshfs")) as b,
    ):
        await a.subscribe("w.#", got)
        await b.subscribe("w.#", got)
        for n in range(20):
            await a.publish("w.x", str(n), single=True)
        await got.wait_for(20)
        await anyio.sleep(0.3)  # time for a duplicate to show
    assert sorted(int(m.text()) for m in got.messages) == list(range(20))
    assert a._fs.locking == b._fs.locking == "rename"


class _Jbd2(MountReader):
    """``point`` on ext4 device ``/dev/<device>``; jbd2 runs the journals ``journals``."""

    def __init__(self, point: Path, device: str, journals: list[str]) -> None:
        super().__init__()
        self.point, self.device, self.journals = os.path.realpath(point), device, journals

    def read_text(self, path: str) -> str | None:
        if path == "/proc/self/mountinfo":
            return f"50 1 7:0 / {self.point} rw - ext4 /dev/{self.device} rw\n"
        return super().read_text(path)

    def list_names(self, path: str) -> list[str]:
        return list(self.journals) if path == "/proc/fs/jbd2" else super().list_names(path)


@pytest.mark.parametrize(
    ("journals", "journaled", "order"),
    [
        (["loop3-8"], True, "place_first"),
        (["loop31-8", "vda-8"], False, "sync_first"),  # others' journals, not this one's
        ([], None, "sync_first"),  # no journal anywhere, or no /proc: not told
    ],
)
def test_an_ext4_mount_is_journaled_when_jbd2_runs_its_journal(
    tmp_path: Path, journals: list[str], journaled: bool | None, order: str
) -> None:
    from fsbus._core.mounts import mount_facts

    reader = _Jbd2(tmp_path, "loop3", journals)
    assert mount_facts(str(tmp_path), reader).journaled is journaled
    assert detect(str(tmp_path), reader).durable_order == order
