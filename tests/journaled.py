"""An I/O seam that shows the bus a journaled ext4 mount, wherever its directory is.

Where the filesystem writes a new file's data before the metadata that shows it (ext4
with a journal, XFS), a durable publish of one page is renamed first and synced after
(``Platform.durable_order``). The machines that run the tests may keep their temporary
directories anywhere: this mixin makes the order the test wants certain. Put it first
among the bases of an :class:`~fsbus._bus.ops.Ops` subclass.
"""

from __future__ import annotations

from fsbus._bus.ops import Ops

JOURNAL_DEVICE = "fsbus-test-journaled"


class JournaledExt4(Ops):
    """Every path is on ``/dev/<JOURNAL_DEVICE>``, an ext4 mount with a journal."""

    def read_text(self, path: str) -> str | None:
        if path == "/proc/self/mountinfo":
            return f"22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/{JOURNAL_DEVICE} rw\n"
        return super().read_text(path)

    def list_names(self, path: str) -> list[str]:
        if path == "/proc/fs/jbd2":
            return [f"{JOURNAL_DEVICE}-8"]
        return super().list_names(path)


class UnorderedMount(Ops):
    """Every path is on a btrfs mount: a durable publish is synced before its rename."""

    def read_text(self, path: str) -> str | None:
        if path == "/proc/self/mountinfo":
            return "22 1 0:40 / / rw,relatime shared:1 - btrfs /dev/fsbus-test-btrfs rw\n"
        return super().read_text(path)
