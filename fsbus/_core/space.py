"""What a filesystem's ``statvfs`` says about free space, where it says anything (pure)."""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["FreeSpace", "free_space"]


class FreeSpace(NamedTuple):
    """Free and total bytes and inodes; None where the filesystem does not know."""

    free_bytes: int | None
    total_bytes: int | None
    free_inodes: int | None
    total_inodes: int | None


def free_space(st: os.statvfs_result) -> FreeSpace:
    """Read ``statvfs`` values, taking those a filesystem does not know as unknown.

    CephFS has no inode limit and reports ``f_ffree = -1`` (and the number of files as
    ``f_files``); a cluster without a manager reports 0 blocks; btrfs reports no inode
    count (``f_files = 0``). None of these means full.
    """
    space_known = st.f_blocks > 0 and st.f_frsize > 0
    inodes_known = 0 < st.f_files < (1 << 63) and 0 <= st.f_favail <= st.f_files
    return FreeSpace(
        st.f_bavail * st.f_frsize if space_known else None,
        st.f_blocks * st.f_frsize if space_known else None,
        st.f_favail if inodes_known else None,
        st.f_files if inodes_known else None,
    )
