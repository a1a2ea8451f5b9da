"""An I/O seam that knows which file each open descriptor is, for faults aimed at one
message: a claim opens the message's file, then takes its ``flock`` on the descriptor."""

from __future__ import annotations

import threading

from fsbus._bus.ops import Ops


class TrackedOps(Ops):
    """Pass-through :class:`Ops` that remembers the path of each open descriptor whose
    path holds ``part`` (:meth:`path_of`); subclasses override the calls they fault
    (under :attr:`lock`, which guards their state too)."""

    def __init__(self, part: str) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self._part = part
        self._paths: dict[int, str] = {}

    def path_of(self, fd: int) -> str | None:
        """The path ``fd`` was opened at, if it holds ``part`` (call under :attr:`lock`)."""
        return self._paths.get(fd)

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        fd = super().open(path, flags, mode)
        if self._part in path:
            with self.lock:
                self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        with self.lock:
            self._paths.pop(fd, None)
        super().close(fd)
