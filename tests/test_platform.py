"""What a bus does on each filesystem: the pure decision, over a table of mounts."""

from __future__ import annotations

import pytest

from fsbus._core.platform import BEEGFS_MAGIC, NETWORK_POLL_INTERVAL, MountFacts, decide

ON = {"tuneUseGlobalFileLocks": "true", "tuneUseGlobalAppendLocks": "true"}


def facts(fstype: str = "", *options: str, **kw: object) -> MountFacts:
    return MountFacts(fstype=fstype, options=frozenset(options), **kw)  # type: ignore[arg-type]


# fstype/options -> family, watch, stamp read, stamp write, singles, streams
CASES = [
    (facts("ext4"), "local", "inotify", "cached", "keep_open", "flock", "flock"),
    (facts("xfs"), "local", "inotify", "cached", "keep_open", "flock", "flock"),
    (facts("tmpfs"), "local", "inotify", "cached", "keep_open", "flock", "flock"),
    (facts("overlay"), "local", "inotify", "cached", "keep_open", "flock", "flock"),
    (facts(magic=0xEF53), "local", "inotify", "cached", "keep_open", "flock", "flock"),
    (facts(), "unknown", "inotify", "cached", "keep_open", "flock", "flock"),
    (facts("fuse.ceph-fuse"), "cephfs", "poll", "direct", "keep_open", "flock", "flock"),
    (facts("ceph", "name=admin"), "cephfs", "poll", "direct", "keep_open", "flock", "flock"),
    (facts("fuse.glusterfs"), "glusterfs", "poll", "direct", "keep_open", "flock", "flock"),
    (
        facts("nfs4", "vers=4.2", "local_lock=none"),
        "nfs",
        "poll",
        "direct",
        "reopen",
        "flock",
        "flock",
    ),
    (facts("nfs4", "local_lock=posix"), "nfs", "poll", "direct", "reopen", "flock", "flock"),
    (facts("nfs4", "local_lock=flock"), "nfs", "poll", "direct", "reopen", "rename", "refuse"),
    (facts("nfs4", "local_lock=all"), "nfs", "poll", "direct", "reopen", "rename", "refuse"),
    (facts("nfs", "vers=3", "nolock"), "nfs", "poll", "direct", "reopen", "rename", "refuse"),
    (facts("beegfs"), "beegfs", "poll", "direct", "reopen", "rename", "refuse"),
    (facts("beegfs", beegfs={}), "beegfs", "poll", "direct", "reopen", "rename", "refuse"),
    (facts("beegfs", beegfs=ON), "beegfs", "poll", "direct", "reopen", "flock", "flock"),
    (facts(magic=BEEGFS_MAGIC, beegfs=ON), "beegfs", "poll", "direct", "reopen", "flock", "flock"),
    (facts("fuse.sshfs"), "sshfs", "poll", "direct", "reopen", "rename", "refuse"),
    (facts("fuse.bindfs"), "fuse", "poll", "direct", "reopen", "flock", "flock"),
    (facts("cifs"), "network", "poll", "direct", "reopen", "flock", "flock"),
]


@pytest.mark.parametrize(
    ("mount", "family", "watch", "read", "write", "singles", "streams"),
    CASES,
    ids=[f"{c[0].fstype or hex(c[0].magic or 0)}-{'-'.join(sorted(c[0].options))}" for c in CASES],
)
def test_each_filesystem_gets_what_works_there(
    mount: MountFacts,
    family: str,
    watch: str,
    read: str,
    write: str,
    singles: str,
    streams: str,
) -> None:
    p = decide(mount)
    assert (p.family, p.watch, p.stamp_read, p.stamp_write) == (family, watch, read, write)
    assert (p.single_locking, p.stream_lock) == (singles, streams)
    assert p.shared == (watch == "poll")
    assert p.poll_interval == (NETWORK_POLL_INTERVAL if p.shared else None)
    assert bool(p.problem) == (streams == "refuse")
    assert p.list_workers == (8 if p.shared else 1)
    # each path component is a round trip there: files are named relative to kept
    # folders; by publishers too on GlusterFS (not on CephFS, where that slowed readers)
    assert p.read_at_dirs == (family in ("cephfs", "glusterfs"))
    assert p.write_at_dirs == (family == "glusterfs")


def test_beegfs_without_global_locks_names_both_settings() -> None:
    p = decide(facts("beegfs", beegfs={"tuneUseGlobalFileLocks": "false"}, mount_point="/mnt/b"))
    assert p.locks_global is False
    assert "tuneUseGlobalFileLocks=true" in p.problem
    assert "tuneUseGlobalAppendLocks=true" in p.problem
    assert "/mnt/b" in p.problem


def test_beegfs_with_file_locks_only_refuses_streams_for_appends() -> None:
    p = decide(facts("beegfs", beegfs={"tuneUseGlobalFileLocks": "1"}))
    assert p.locks_global is True
    assert p.single_locking == "flock"
    assert p.stream_lock == "refuse"
    assert "tuneUseGlobalAppendLocks=true" in p.problem
    assert "tuneUseGlobalFileLocks" not in p.problem
    assert "O_APPEND" in p.problem


def test_unreadable_beegfs_settings_are_taken_as_the_defaults() -> None:
    p = decide(facts("beegfs"))
    assert any("unreadable" in n for n in p.notes)
    assert p.single_locking == "rename"


def test_nfs_names_the_option_to_drop() -> None:
    assert "remount without nolock" in decide(facts("nfs", "nolock")).problem
    assert "local_lock=flock" in decide(facts("nfs4", "local_lock=flock")).problem


def test_a_fuse_mount_of_unknown_kind_says_it_cannot_tell() -> None:
    p = decide(facts("fuse.bindfs"))
    assert p.locks_global is None
    assert any("probe_locking" in n for n in p.notes)


def test_describe_names_every_decision() -> None:
    line = decide(facts("fuse.ceph-fuse")).describe()
    assert line.startswith("fuse.ceph-fuse (cephfs): polling only every 20 ms")
    assert "O_DIRECT" in line
    assert "claim by flock" in line
    local = decide(facts("ext4")).describe()
    assert "inotify + polling" in local
    assert "page cache" in local
    assert "refused" in decide(facts("fuse.sshfs")).describe()


@pytest.mark.parametrize(
    ("mount", "order"),
    [
        (facts("ext4", "rw", journaled=True), "place_first"),
        (facts("ext4", "rw", "data=journal", journaled=True), "place_first"),
        (facts("ext4", "rw", "data=writeback", journaled=True), "sync_first"),
        (facts("ext4", "rw", journaled=False), "sync_first"),  # no journal: nothing ordered
        (facts("ext4", "rw"), "sync_first"),  # cannot tell
        (facts("xfs"), "place_first"),
        (facts("btrfs"), "sync_first"),
        (facts("tmpfs"), "sync_first"),
        (facts("fuse.ceph-fuse"), "sync_first"),
        (facts("nfs4"), "sync_first"),
        (facts(""), "sync_first"),
    ],
    ids=lambda v: getattr(v, "fstype", v) or "unknown",
)
def test_durable_publishes_are_placed_first_only_where_data_precedes_metadata(
    mount: MountFacts, order: str
) -> None:
    """Renaming a durable message before syncing it needs a filesystem that writes a new
    file's data before the metadata showing it: a power cut then leaves it whole, absent
    or empty, never torn."""
    p = decide(mount)
    assert p.durable_order == order
    assert ("renamed, then synced" in p.describe()) == (order == "place_first")
