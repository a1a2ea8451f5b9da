"""A lagging view of stream segments, made through the streams' I/O seam.

What a ceph-fuse client that holds no lock sees for a moment while another client appends:
its reads of a segment end at a byte where the file ended earlier. Appends (the writer opens
segments read-write) see the file whole, as the holder of the append lock does on CephFS.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fsbus._stream.ops import StreamOps


@dataclass
class LaggingView:
    limits: dict[str, int]
    """Segment path → the byte at which reads of it end while the view lags."""
    heal_after: int | None
    """Pauses (``ops.sleep``) after which the view catches up; None: never."""
    sleeps: list[float] = field(default_factory=list)
    fds: dict[int, str] = field(default_factory=dict)

    @property
    def lagging(self) -> bool:
        return self.heal_after is None or len(self.sleeps) < self.heal_after


@contextmanager
def lagging_view(
    monkeypatch: pytest.MonkeyPatch, limits: Mapping[Path, int], heal_after: int | None
) -> Iterator[LaggingView]:
    """Reads of each segment in ``limits`` (through read-only opens) end at its byte there,
    until ``heal_after`` pauses of the reading code; sleeping is recorded, not done."""
    view = LaggingView({str(p): n for p, n in limits.items()}, heal_after)
    open_ro, pread, close = StreamOps.open_ro, StreamOps.pread, StreamOps.close

    def lag_open_ro(self: StreamOps, path: Path) -> int:
        fd = open_ro(self, path)
        view.fds[fd] = str(path)
        return fd

    def lag_pread(self: StreamOps, fd: int, n: int, pos: int) -> bytes:
        data = pread(self, fd, n, pos)
        limit = view.limits.get(view.fds.get(fd, ""))
        if limit is not None and view.lagging and pos + len(data) > limit:
            return data[: max(limit - pos, 0)]
        return data

    def lag_close(self: StreamOps, fd: int) -> None:
        view.fds.pop(fd, None)
        close(self, fd)

    def lag_sleep(self: StreamOps, seconds: float) -> None:
        view.sleeps.append(seconds)

    with monkeypatch.context() as m:
        m.setattr(StreamOps, "open_ro", lag_open_ro)
        m.setattr(StreamOps, "pread", lag_pread)
        m.setattr(StreamOps, "close", lag_close)
        m.setattr(StreamOps, "sleep", lag_sleep)
        yield view


def segment_sizes(stream_dir: Path) -> dict[Path, int]:
    """Each segment of a stream and its size now: the view to lag at."""
    return {p: p.stat().st_size for p in sorted(stream_dir.glob("*.log"))}
