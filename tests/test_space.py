"""statvfs values a filesystem does not know are unknown, not "full" (the disk alarm of
the AMQP gateway and `fsbus doctor` both read them through free_space)."""

from __future__ import annotations

import os

import pytest

from fsbus._core.space import FreeSpace, free_space


def _statvfs(blocks: int, bavail: int, files: int, favail: int) -> os.statvfs_result:
    return os.statvfs_result((4096, 4096, blocks, bavail, bavail, files, favail, favail, 0, 255))


@pytest.mark.parametrize(
    ("st", "expected"),
    [
        # ext4: everything known
        (_statvfs(1000, 10, 500, 7), FreeSpace(40960, 4096000, 7, 500)),
        # CephFS without a manager: 0 blocks; no inode limit (f_ffree -1)
        (_statvfs(0, 0, 3, -1), FreeSpace(None, None, None, None)),
        # the same -1 seen as unsigned
        (_statvfs(0, 0, 3, (1 << 64) - 1), FreeSpace(None, None, None, None)),
        # btrfs: no inode count
        (_statvfs(1000, 10, 0, 0), FreeSpace(40960, 4096000, None, None)),
    ],
)
def test_free_space_says_unknown_where_the_filesystem_does_not_know(
    st: os.statvfs_result, expected: FreeSpace
) -> None:
    assert free_space(st) == expected


def test_a_real_directory_has_known_free_space(tmp_path: os.PathLike[str]) -> None:
    space = free_space(os.statvfs(tmp_path))
    assert space.free_bytes is not None
    assert space.total_bytes is not None
    assert 0 <= space.free_bytes <= space.total_bytes
