"""Where things live under a bus root, and UPDATE stamp maths (pure).

::

    <root>/staging/                  messages being written (O_EXCL), renamed when complete
    <root>/messages/<bucket>/<name>  one file per message: a leading byte (0x00 when
                                     published; a delivery count once claimed), then the payload
    <root>/topics/<bucket>/<name>    the rest of a long topic (hex, ASCII)
    <root>/update/UPDATE             num_buckets x stamp_size random bytes
    <root>/fsbus/meta/<bucket>/<name>      headers of a message (JSON), fsbus only
    <root>/fsbus/attempts/<bucket>/<name>  deliveries of a single message past 255
    <root>/fsbus/hosts/<host id>           the host name behind a host id
    <root>/fsbus/quarantine/               foreign or corrupt files moved aside
    <root>/fsbus/spares/                   empty staging files publishers made ahead
    <root>/fsbus/wal/<host>-<pid>-<n>.log  a process's durable log (see wal.py)
    <root>/fsbus/gc                        flocked by the process collecting the bus;
                                           its mtime: when the last collection ended
    <root>/streams/<name>/                 streams (see the streams modules)

The first four are qlobber-fsq 14's layout; peers ignore the rest. The bucket
directories of ``fsbus/meta/`` and ``fsbus/attempts/`` are made when a file is first
written into them, not with the bus (a new bus makes 512 directories fewer).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._settings import Settings
from .names import format_bucket

__all__ = ["Layout", "changed_buckets"]

_BLOCK_STAMPS = 16
"""Stamps compared as one block before they are compared one by one."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Paths of one bus root (strings, for speed on the hot path)."""

    root: str
    """The bus directory."""
    buckets: tuple[str, ...]
    """Bucket directory names in index order."""
    stamp_size: int
    """Bytes per bucket in UPDATE (0: no UPDATE file)."""

    @classmethod
    def of(cls, root: str, config: Settings) -> Layout:
        """The layout of ``root`` under ``config``."""
        if config.order_by_expiry:
            buckets: tuple[str, ...] = ("0",)
        else:
            buckets = tuple(
                format_bucket(i, config.bucket_base, config.bucket_num_chars)
                for i in range(config.num_buckets)
            )
        return cls(
            root=root.rstrip("/") or "/", buckets=buckets, stamp_size=config.bucket_stamp_size
        )

    @property
    def staging(self) -> str:
        """Directory where messages are written before the rename."""
        return f"{self.root}/staging"

    @property
    def messages(self) -> str:
        """Parent of the message bucket directories."""
        return f"{self.root}/messages"

    @property
    def topics(self) -> str:
        """Parent of the long-topic bucket directories."""
        return f"{self.root}/topics"

    @property
    def update_dir(self) -> str:
        """Directory holding UPDATE (watched with inotify)."""
        return f"{self.root}/update"

    @property
    def update_file(self) -> str:
        """The UPDATE stamp file."""
        return f"{self.root}/update/UPDATE"

    @property
    def private(self) -> str:
        """fsbus's own directory, ignored by qlobber-fsq peers."""
        return f"{self.root}/fsbus"

    @property
    def quarantine(self) -> str:
        """Where foreign or corrupt files are moved."""
        return f"{self.root}/fsbus/quarantine"

    @property
    def spares(self) -> str:
        """Empty files publishers created ahead, each to stage its next plain message."""
        return f"{self.root}/fsbus/spares"

    @property
    def hosts(self) -> str:
        """Host id -> host name files."""
        return f"{self.root}/fsbus/hosts"

    @property
    def update_size(self) -> int:
        """Size of the UPDATE file in bytes."""
        return len(self.buckets) * self.stamp_size

    def message_path(self, bucket: str, name: str) -> str:
        """Path of a message file."""
        return f"{self.root}/messages/{bucket}/{name}"

    def topic_path(self, bucket: str, name: str) -> str:
        """Path of a long topic's spill file."""
        return f"{self.root}/topics/{bucket}/{name}"

    def meta_path(self, bucket: str, name: str) -> str:
        """Path of a message's headers sidecar."""
        return f"{self.root}/fsbus/meta/{bucket}/{name}"

    def attempts_path(self, bucket: str, name: str) -> str:
        """Path of a single message's delivery counter (counts its leading byte cannot hold)."""
        return f"{self.root}/fsbus/attempts/{bucket}/{name}"

    def stamp_offset(self, bucket_index: int) -> int:
        """Byte offset of a bucket's stamp in UPDATE."""
        return bucket_index * self.stamp_size

    def all_dirs(self) -> list[str]:
        """Every directory a bus makes when it opens, parents first. The bucket
        directories (under :attr:`bucket_parents`) come when a file first goes into
        them; on a mount that other hosts share, a bus makes those of ``messages`` and
        ``topics`` as it opens (see ``BusFS.setup``)."""
        return [
            self.root,
            self.staging,
            self.messages,
            self.topics,
            self.update_dir,
            self.private,
            f"{self.private}/meta",
            f"{self.private}/attempts",
            self.hosts,
            self.quarantine,
        ]

    @property
    def bucket_parents(self) -> tuple[str, str, str, str]:
        """``messages``, ``topics``, ``fsbus/meta`` and ``fsbus/attempts``: the folders
        of bucket directories (see :meth:`all_dirs`)."""
        return self.messages, self.topics, f"{self.private}/meta", f"{self.private}/attempts"


def changed_buckets(old: bytes | None, new: bytes, stamp_size: int, count: int) -> list[int]:
    """Indexes of buckets whose stamp differs between two UPDATE snapshots.

    A missing or short snapshot counts as "everything changed".
    """
    if stamp_size == 0:
        return list(range(count))
    size = stamp_size * count
    if old is None or len(old) < size or len(new) < size:
        return list(range(count))
    if old == new:
        return []
    # Compare blocks of stamps first (one memcmp each, in C), then the stamps of the
    # blocks that differ: a scan after a few stamps costs about 20 comparisons whatever
    # the bucket count. (A regular-expression search for non-zero bytes in the XOR of
    # the snapshots cost 45 µs for 256 buckets of 32 bytes, mostly walking zeros.)
    out: list[int] = []
    block = _BLOCK_STAMPS * stamp_size
    for start in range(0, size, block):
        end = min(start + block, size)
        if old[start:end] == new[start:end]:
            continue
        for at in range(start, end, stamp_size):
            if old[at : at + stamp_size] != new[at : at + stamp_size]:
                out.append(at // stamp_size)
    return out
