"""What a bus does on each filesystem: one pure decision from the facts about a mount.

:func:`decide` takes what the I/O seam found out about the mount that holds a bus
(:class:`MountFacts`: the filesystem type, its mount options, the statfs magic and a
BeeGFS client's settings) and returns a :class:`Platform`: how changes are noticed
(inotify and polling, or polling only), how ``update/UPDATE`` is read and written so
that other clients' stamps are seen, how work-queue messages are claimed, and whether
stream appends can be serialised. The bus, the streams and ``fsbus doctor`` all ask
this one function, so what doctor reports is what the bus does.

Why these choices (measured on two ceph-fuse and two GlusterFS FUSE clients of one
cluster): inotify never sees another client's changes there; a plain ``pread`` of
UPDATE on client B kept serving B's page cache for more than 20 s after A wrote it,
while a read with ``O_DIRECT`` on a descriptor kept open saw A's stamp in 0.5-1.7 ms
and cost 12-14 us of the reader's CPU and 50-70 us of the FUSE client's per read (a
re-opened descriptor costs 4-7 times more; ``posix_fadvise(DONTNEED)`` is about as
cheap but only drops clean pages). Polling that way every 20 ms is what remains.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "BEEGFS_MAGIC",
    "NETWORK_POLL_INTERVAL",
    "MountFacts",
    "Platform",
    "decide",
]

BEEGFS_MAGIC: Final = 0x19830326
"""statfs ``f_type`` of a BeeGFS mount."""

NETWORK_POLL_INTERVAL: Final = 0.02
"""Seconds between reads of UPDATE where polling is the only way to see other clients."""

_MAGICS: Final[dict[int, str]] = {
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
    0x794C7630: "overlay",
    0x6969: "nfs",
    0x00C36400: "ceph",
    0xFE534D42: "smb2",
    0xFF534D42: "cifs",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x01021997: "9p",
    BEEGFS_MAGIC: "beegfs",
    0x65735546: "fuse",
}

_LOCAL: Final = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "tmpfs",
        "ramfs",
        "zfs",
        "f2fs",
        "jfs",
        "reiserfs",
        "bcachefs",
        "overlay",
        "fuseblk",  # a FUSE driver of a local block device (ntfs-3g, exfat)
        "vfat",
        "exfat",
        "ntfs3",
        "hfsplus",
    }
)
_NFS: Final = frozenset({"nfs", "nfs4"})
_CEPH: Final = frozenset({"ceph", "fuse.ceph-fuse", "fuse.ceph", "ceph-fuse"})
_GLUSTER: Final = frozenset({"fuse.glusterfs", "glusterfs"})
_SSHFS: Final = frozenset({"fuse.sshfs", "sshfs"})
_OTHER_NETWORK: Final = frozenset(
    {"cifs", "smb3", "smb2", "smbfs", "lustre", "gpfs", "9p", "afs", "ocfs2", "gfs2", "orangefs"}
)
_TRUE: Final = frozenset({"1", "true", "yes", "on"})

Family = Literal[
    "local", "cephfs", "glusterfs", "beegfs", "nfs", "sshfs", "fuse", "network", "unknown"
]


@dataclass(frozen=True)
class MountFacts:
    """What the I/O seam found out about the mount holding a bus (the input of :func:`decide`)."""

    fstype: str = ""
    """Type in ``/proc/self/mountinfo`` (``ext4``, ``fuse.ceph-fuse``, ``nfs4``...); "" unknown."""
    options: frozenset[str] = frozenset()
    """Mount and superblock options (``nolock``, ``local_lock=flock``, ``vers=4.2``...)."""
    magic: int | None = None
    """statfs ``f_type`` of the directory, None when unknown."""
    beegfs: Mapping[str, str] | None = None
    """Settings of the BeeGFS client(s) (``/proc/fs/beegfs/*/config``), merged so that a
    setting reads true only if every client has it on; None when none could be read."""
    mount_point: str = ""
    """Where the filesystem is mounted ("" unknown), for messages."""
    source: str = ""
    """What is mounted (device, ``host:/export``...), for messages."""
    journaled: bool | None = None
    """Whether an ext4 mount has a journal (``/proc/fs/jbd2`` names its device); None
    when not an ext4 mount, or it cannot be told."""


@dataclass(frozen=True)
class Platform:
    """What a bus does on one filesystem; made by :func:`decide`."""

    family: Family
    """The kind of filesystem recognised."""
    fstype: str
    """The filesystem type as detected ("" unknown)."""
    shared: bool
    """Other hosts may write here: inotify does not see their changes."""
    watch: Literal["inotify", "poll"]
    """``inotify``: inotify on ``update/`` plus polling; ``poll``: polling only."""
    poll_interval: float | None
    """Default seconds between reads of UPDATE here; None keeps ``BusConfig.poll_interval``."""
    stamp_read: Literal["cached", "direct"]
    """How UPDATE is read: through the page cache, or with ``O_DIRECT`` on a kept
    descriptor (the client's cache would serve another client's stamp late)."""
    stamp_write: Literal["keep_open", "reopen"]
    """How a stamp is written: ``pwrite`` into a descriptor kept open, or open, write and
    close each time (close flushes to the server: NFS close-to-open, BeeGFS buffers)."""
    list_workers: int
    """Threads that list buckets at once in a full listing (network round trips overlap)."""
    read_at_dirs: bool
    """Readers keep the messages folder open and open, list and remove messages
    relative to it: a FUSE or network client asks its server again about every
    component of a path (GlusterFS's entry timeout is 0), so a message opened by its
    full path costs a lookup per folder above it (measured four folders below the
    mount, open: GlusterFS 1.0 -> 0.36 ms, CephFS 0.43 -> 0.14 ms)."""
    write_at_dirs: bool
    """Publishers do the same with the staging and messages folders. GlusterFS only:
    on CephFS a publisher keeping them open made other clients' opens of its new
    messages wait up to seconds (measured; capabilities the MDS must recall)."""
    locks_global: bool | None
    """Whether ``flock`` excludes processes on other hosts; None when it cannot be told."""
    single_locking: Literal["flock", "rename"]
    """How ``locking="auto"`` claims work-queue messages here."""
    stream_lock: Literal["flock", "refuse"]
    """``flock`` serialises stream appends; ``refuse``: streams cannot be made safe here
    (opening one raises, naming the setting to change)."""
    durable_order: Literal["sync_first", "place_first"] = "sync_first"
    """How a durable publish of one page orders its syncs: ``sync_first`` syncs the
    message before its rename, so no power cut leaves a torn message in view, whatever
    the filesystem; ``place_first`` renames it first and syncs after, so one journal
    commit carries its creation and its rename (two otherwise). Only where the
    filesystem writes a new file's data before the metadata that shows it (ext4 with a
    journal, ``data=ordered`` or ``data=journal``; XFS), so that a cut leaves the
    message whole, absent, or empty: as it leaves a plain publish there."""
    durable_log: bool = False
    """Whether ``durable_log="auto"`` makes durable publishes durable through the
    process's durable log (one data sync of a file written ahead) rather than by
    syncing their files (a journal commit each): on a local ext4 with a journal, where
    it was measured to pay. Never on a mount other hosts share: a log is replayed by
    its own machine after a restart."""
    problem: str = ""
    """Why streams are refused, and what to change (empty when they are not)."""
    notes: tuple[str, ...] = field(default=())
    """What was found and why it was chosen, for ``fsbus doctor`` and logs."""

    def describe(self) -> str:
        """One line: the filesystem and every decision."""
        fs = self.fstype or "unknown filesystem"
        durable = "renamed, then synced" if self.durable_order == "place_first" else "synced first"
        watch = "inotify + polling" if self.watch == "inotify" else "polling only"
        if self.poll_interval is not None:
            watch += f" every {self.poll_interval * 1000:.0f} ms"
        return (
            f"{fs} ({self.family}): {watch}; UPDATE read "
            f"{'with O_DIRECT' if self.stamp_read == 'direct' else 'through the page cache'}, "
            f"stamped {'by pwrite' if self.stamp_write == 'keep_open' else 'open/write/close'}; "
            f"work queues claim by {self.single_locking}; stream appends: "
            f"{'flock' if self.stream_lock == 'flock' else 'refused'}; "
            f"durable publishes {durable}"
            + (" (auto: through the durable log)" if self.durable_log else "")
        )


def _family(facts: MountFacts) -> tuple[Family, str]:
    fstype = facts.fstype
    if not fstype and facts.magic is not None:
        fstype = _MAGICS.get(facts.magic, "")
    if facts.magic == BEEGFS_MAGIC or fstype == "beegfs":
        return "beegfs", fstype or "beegfs"
    if fstype in _LOCAL:
        return "local", fstype
    if fstype in _CEPH:
        return "cephfs", fstype
    if fstype in _GLUSTER:
        return "glusterfs", fstype
    if fstype in _NFS:
        return "nfs", fstype
    if fstype in _SSHFS:
        return "sshfs", fstype
    if fstype in _OTHER_NETWORK:
        return "network", fstype
    if fstype.startswith("fuse"):
        return "fuse", fstype
    return "unknown", fstype


def _option(options: frozenset[str], key: str) -> str | None:
    for opt in options:
        name, _, value = opt.partition("=")
        if name == key:
            return value
    return None


def _durable_order(fstype: str, facts: MountFacts) -> Literal["sync_first", "place_first"]:
    """``place_first`` where a power cut never shows a new file's name before its data
    (see :attr:`Platform.durable_order`); ``sync_first`` anywhere else or unsure."""
    if fstype == "xfs":
        return "place_first"
    if fstype == "ext4" and facts.journaled and _option(facts.options, "data") != "writeback":
        return "place_first"
    return "sync_first"


def decide(facts: MountFacts) -> Platform:
    """What a bus does on the mount described by ``facts``."""
    family, fstype = _family(facts)
    notes: list[str] = []
    if family in ("local", "unknown"):
        if family == "unknown":
            notes.append("filesystem not recognised: treated as local (inotify and polling)")
        order = _durable_order(fstype, facts)
        if order == "place_first":
            notes.append(
                f"{fstype} writes a new file's data before the metadata showing it: "
                "a durable publish of one page is renamed first and synced after"
            )
        journaled_ext4 = fstype == "ext4" and bool(facts.journaled)
        if journaled_ext4:
            notes.append(
                "ext4 with a journal: a durable publish is made durable by a record in "
                "the process's durable log, one data sync, instead of a journal commit"
            )
        return Platform(
            durable_order=order,
            durable_log=journaled_ext4,
            family=family,
            fstype=fstype,
            shared=False,
            watch="inotify",
            poll_interval=None,
            stamp_read="cached",
            stamp_write="keep_open",
            list_workers=1,
            read_at_dirs=False,
            write_at_dirs=False,
            locks_global=True if family == "local" else None,
            single_locking="flock",
            stream_lock="flock",
            notes=tuple(notes),
        )

    notes.append("inotify does not see other clients' changes here: polling only")
    # Measured on CephFS and GlusterFS: another client's pwrite into a descriptor kept
    # open is seen by an O_DIRECT read within ms. Elsewhere write as qlobber-fsq does
    # (open, write, close): close pushes the data out (NFS close-to-open, BeeGFS buffers).
    stamp_write: Literal["keep_open", "reopen"] = (
        "keep_open" if family in ("cephfs", "glusterfs") else "reopen"
    )
    locks_global: bool | None = True
    append_fix = ""
    lock_fix = ""
    if family == "sshfs":
        locks_global = False
        lock_fix = (
            "sshfs never forwards flock; append to this stream from one host only, through "
            "a filesystem whose flock crosses hosts (the backing disk, NFSv4, CephFS)"
        )
    elif family == "nfs":
        local_lock = _option(facts.options, "local_lock")
        if "nolock" in facts.options or local_lock in ("flock", "all"):
            locks_global = False
            why = "nolock" if "nolock" in facts.options else f"local_lock={local_lock}"
            notes.append(f"NFS mounted with {why}: flock is local to this client")
            lock_fix = f"remount without {why} (NFSv4 with local_lock=none forwards flock)"
    elif family == "beegfs":
        cfg = facts.beegfs
        if cfg is None:
            notes.append(
                "BeeGFS client settings unreadable (/proc/fs/beegfs/*/config): "
                "assuming the defaults, tuneUseGlobalFileLocks=false and "
                "tuneUseGlobalAppendLocks=false"
            )
            cfg = {}
        file_locks = cfg.get("tuneUseGlobalFileLocks", "false").strip().lower() in _TRUE
        append_locks = cfg.get("tuneUseGlobalAppendLocks", "false").strip().lower() in _TRUE
        if not file_locks:
            locks_global = False
            notes.append("BeeGFS tuneUseGlobalFileLocks=false: flock is local to this client")
            lock_fix = "set tuneUseGlobalFileLocks=true in beegfs-client.conf and remount"
        if not append_locks:
            notes.append(
                "BeeGFS tuneUseGlobalAppendLocks=false: O_APPEND is not atomic across clients"
            )
            append_fix = "set tuneUseGlobalAppendLocks=true in beegfs-client.conf and remount"
    elif family in ("fuse", "network"):
        locks_global = None
        notes.append(
            "cannot tell whether flock crosses hosts here; check with "
            "fsbus.probe_locking(path_a, path_b) from two mounts"
        )
    single: Literal["flock", "rename"] = "rename" if locks_global is False else "flock"
    if single == "rename":
        notes.append("work-queue messages are claimed by rename (one winner on every filesystem)")
    problem = ""
    fixes = [f for f in (lock_fix, append_fix) if f]
    if fixes:
        mount = f" ({facts.mount_point})" if facts.mount_point else ""
        what = (
            "flock does not exclude other hosts"
            if lock_fix
            else "appends with O_APPEND are not atomic across clients"
        )
        problem = (
            f"streams cannot serialise appends on this {fstype or family} mount{mount}: "
            f"{what}, so two hosts appending at once would tear the log; " + "; and ".join(fixes)
        )
    return Platform(
        family=family,
        fstype=fstype,
        shared=True,
        watch="poll",
        poll_interval=NETWORK_POLL_INTERVAL,
        stamp_read="direct",
        stamp_write=stamp_write,
        list_workers=8,
        # measured on these two only; elsewhere files keep being named by their paths
        read_at_dirs=family in ("cephfs", "glusterfs"),
        write_at_dirs=family == "glusterfs",
        locks_global=locks_global,
        single_locking=single,
        stream_lock="refuse" if problem else "flock",
        problem=problem,
        notes=tuple(notes),
    )
