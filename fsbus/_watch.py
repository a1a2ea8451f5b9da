"""Wake-ups for the scanner: inotify on ``update/`` (through watchdog) plus a poll tick.

On network filesystems inotify sees only local changes, so polling always runs; the
watcher only makes local delivery faster. ``force_polling`` (or FSBUS_FORCE_POLLING=1)
turns the watcher off.
"""

from __future__ import annotations

import logging
import threading

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["Waker"]

log = logging.getLogger("fsbus.watch")


class Waker:
    """An event the scanner waits on, set from the watchdog thread or locally."""

    def __init__(self, watch_dir: str, *, use_inotify: bool) -> None:
        self._dir = watch_dir
        self._use_inotify = use_inotify
        self._event = anyio.Event()
        self._pending = threading.Event()
        self._observer: object | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self.inotify_active = False

    def start(self) -> None:
        """Start watching (call from the event loop)."""
        self._token = anyio.lowlevel.current_token()
        if not self._use_inotify:
            return
        try:
            from watchdog.events import (
                FileCreatedEvent,
                FileModifiedEvent,
                FileMovedEvent,
                FileSystemEvent,
                FileSystemEventHandler,
            )
            from watchdog.observers.inotify import InotifyObserver
        except ImportError:  # pragma: no cover - watchdog without inotify support
            log.info("inotify is not available here; polling only")
            return

        waker = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                # Our own reads of UPDATE open and close it: only writes wake us.
                if event.event_type in ("modified", "created", "moved"):
                    waker.wake_threadsafe()

        try:
            observer = InotifyObserver(timeout=0.2)
            observer.schedule(
                _Handler(),
                self._dir,
                recursive=False,
                event_filter=[FileModifiedEvent, FileCreatedEvent, FileMovedEvent],
            )
            observer.daemon = True
            observer.start()
        except OSError as exc:
            log.warning("inotify watch on %s failed (%s); polling only", self._dir, exc)
            return
        self._observer = observer
        self.inotify_active = True

    def stop(self) -> None:
        """Stop the observer thread (blocking, short)."""
        obs = self._observer
        self._observer = None
        if obs is not None:
            obs.stop()  # type: ignore[attr-defined]
            obs.join(timeout=2)  # type: ignore[attr-defined]

    def wake(self) -> None:
        """Wake the scanner (from the event loop)."""
        self._event.set()

    def wake_threadsafe(self) -> None:
        """Wake the scanner from another thread; coalesces bursts of events."""
        if self._pending.is_set() or self._token is None:
            return
        self._pending.set()
        try:
            anyio.from_thread.run_sync(self._event.set, token=self._token)
        except RuntimeError:
            pass  # the loop is gone: we are shutting down

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait for a wake-up or ``timeout`` seconds; True when woken."""
        woken = False
        if not self._event.is_set():
            with anyio.move_on_after(timeout):
                await self._event.wait()
        woken = self._event.is_set()
        self._event = anyio.Event()
        self._pending.clear()
        return woken
