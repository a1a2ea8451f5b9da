"""check_directory on real directories, and the mountinfo parsing behind its filesystem check."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fsbus import BlockingBus, DoctorReport, check_directory
from fsbus._bus.doctor import mount_of

MOUNTINFO = """\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
35 22 0:30 / /tmp rw,nosuid shared:2 - tmpfs tmpfs rw,size=100m
41 22 0:40 / /mnt/shared\\040bus rw,relatime shared:9 - fuse.sshfs host:/srv/bus rw
42 22 0:41 / /mnt/ceph rw - ceph 10.0.0.1:/ rw,name=admin
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/home/ada/bus", ("/", "ext4", "/dev/vda")),
        ("/tmp", ("/tmp", "tmpfs", "tmpfs")),
        ("/tmp/x/y", ("/tmp", "tmpfs", "tmpfs")),
        ("/tmpfoo", ("/", "ext4", "/dev/vda")),  # not inside /tmp
        ("/mnt/shared bus/q", ("/mnt/shared bus", "fuse.sshfs", "host:/srv/bus")),
        ("/mnt/ceph/bus", ("/mnt/ceph", "ceph", "10.0.0.1:/")),
    ],
)
def test_mount_of_picks_the_longest_mount_point(path: str, expected: tuple[str, ...]) -> None:
    assert mount_of(path, MOUNTINFO) == expected


def test_a_fresh_directory_passes(tmp_path: Path) -> None:
    report = check_directory(tmp_path)
    assert isinstance(report, DoctorReport)
    assert report.ok
    names = [c.name for c in report.checks]
    assert names == [
        "root",
        "filesystem",
        "layout",
        "space",
        "writable",
        "flock",
        "inotify",
        "clock",
    ]
    assert report.check("flock").status == "ok"
    assert report.check("writable").status == "ok"
    assert report.check("clock").status == "ok"
    assert list(tmp_path.iterdir()) == []  # probes removed


def test_an_existing_bus_has_its_layout_checked(tmp_path: Path) -> None:
    with BlockingBus(tmp_path) as bus:
        bus.publish("a.b", b"x")
    report = check_directory(tmp_path)
    assert report.check("layout").status == "ok"
    shutil.rmtree(tmp_path / "topics")
    layout = check_directory(tmp_path).check("layout")
    assert layout.status == "warn"
    assert "topics" in layout.detail
    assert layout.fix


def test_missing_and_non_directory_roots_fail(tmp_path: Path) -> None:
    missing = check_directory(tmp_path / "nope")
    assert missing.status == "fail"
    assert not missing.ok
    assert [c.name for c in missing.checks] == ["root"]
    f = tmp_path / "file"
    f.write_text("x")
    assert "is not a directory" in check_directory(f).check("root").detail


def test_forced_polling_is_mentioned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSBUS_FORCE_POLLING", "1")
    assert "FSBUS_FORCE_POLLING" in check_directory(tmp_path).check("inotify").detail


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_nearly_full_filesystem_fails_the_space_check(tmp_path: Path) -> None:
    import subprocess

    target = tmp_path / "small"
    target.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=64", "tmpfs", str(target)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {mounted.stderr.decode().strip()}")
    try:
        report = check_directory(target)
        space = report.check("space")
        assert space.status == "fail"
        assert "free" in space.fix
        assert report.check("filesystem").detail.startswith("local filesystem tmpfs")
    finally:
        subprocess.run(["umount", str(target)], check=True)
