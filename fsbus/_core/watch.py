"""Wake-ups for the scanner: inotify on ``update/`` plus a poll tick.

On Linux the inotify descriptor (made with watchdog's inotify bindings) is read on the
event loop itself: a publisher's stamp wakes the scanner with no thread hop, which keeps
the unloaded round trip short. Where that is not possible, a watchdog observer thread
does the same job. On network filesystems inotify sees only local changes, so polling
always runs; there the bus turns the watcher off (``Platform.watch``), as
``force_polling`` (or FSBUS_FORCE_POLLING=1) does anywhere.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["BUSY_FACTOR", "BUSY_SECONDS", "Waker", "poll_delay"]

log = logging.getLogger("fsbus.watch")

_READ_SIZE = 64 * 1024
_UNSET: object = object()

BUSY_FACTOR = 4
"""After a change, polling runs this many times faster..."""
BUSY_SECONDS = 1.0
"""...until this long has passed without one."""


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop; None under another backend (trio)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def poll_delay(interval: float, since_change: float | None, *, hurry: bool = True) -> float:
    """Seconds until the next read of UPDATE (pure).

    ``interval`` is the idle period; ``since_change`` the seconds since the last read
    that found UPDATE changed (None: none yet). Traffic comes in runs: while messages
    keep coming (a change within :data:`BUSY_SECONDS`), poll :data:`BUSY_FACTOR`
    times as often, which cuts the wait for the next one by as much; an idle bus keeps
    polling at ``interval`` and costs what it did. ``hurry=False``: always ``interval``
    (where inotify reports every change at once and polling is only the safety net).
    """
    if hurry and since_change is not None and 0 <= since_change < BUSY_SECONDS:
        return interval / BUSY_FACTOR
    return interval


def close_inotify(fd: int) -> None:
    """Close an inotify descriptor in a thread of its own, without waiting for it.

    The kernel ends an inotify instance that holds a watch only after a grace period of
    its read-copy-update scheme: the ``close`` took 7-15 ms here (against 3 µs without a
    watch), and a bus waited for it on every close. A thread per descriptor, so that the
    grace periods of several closes overlap rather than queue.
    """
    try:
        threading.Thread(
            target=_close_quietly, args=(fd,), name="fsbus-inotify-close", daemon=True
        ).start()
    except RuntimeError:  # no new thread (the interpreter is shutting down): close here
        _close_quietly(fd)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError as exc:
        log.debug("closing an inotify descriptor failed: %s", exc)


class Waker:
    """An event the scanner waits on, set by inotify, by the engine, or by polling."""

    def __init__(self, watch_dir: str, *, use_inotify: bool) -> None:
        self._dir = watch_dir
        self.use_inotify = use_inotify
        """Whether :meth:`start` watches with inotify; may be changed until then."""
        self._event = anyio.Event()
        self._pending = threading.Event()
        self._fs_event = False
        self._observer: object | None = None
        self._fd: int | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self.inotify_active = False
        self._poller: threading.Thread | None = None
        self._poller_stop = threading.Event()
        self.quiet_until = 0.0
        """No filesystem wake-up before this time (``time.monotonic``); the scanner sets it."""

    def start(self) -> bool:
        """Start watching (call from the event loop).

        Returns True when the caller must run :meth:`run` as a task (the inotify
        descriptor is read on the loop); False when a thread or nothing does the work.
        """
        self._token = anyio.lowlevel.current_token()
        if not self.use_inotify:
            return False
        fd = self._open_inotify()
        if fd is not None:
            self._fd = fd
            self.inotify_active = True
            return True
        self._start_observer()
        return False

    def _open_inotify(self) -> int | None:
        try:
            from watchdog.observers.inotify_c import (
                InotifyConstants,
                inotify_add_watch,
                inotify_init,
            )
        except (ImportError, OSError):  # not Linux, or no inotify in libc
            return None
        fd = inotify_init()
        if fd < 0:
            log.info("inotify_init failed (errno %d); using a watcher thread", -fd)
            return None
        mask = (
            InotifyConstants.IN_MODIFY
            | InotifyConstants.IN_CREATE
            | InotifyConstants.IN_MOVED_TO
            | InotifyConstants.IN_CLOSE_WRITE
        )
        if inotify_add_watch(fd, os.fsencode(self._dir), mask) < 0:
            os.close(fd)
            log.warning("cannot watch %s with inotify; polling only", self._dir)
            return None
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        return fd

    async def run(self) -> None:
        """Read inotify events on the loop and wake the scanner (a task of the engine)."""
        fd = self._fd
        if fd is None:
            return
        loop = _asyncio_loop()
        if loop is not None:
            await self._run_on(loop, fd)
            return
        try:
            while True:
                # While the scanner is told to list less often (it keeps losing claims to
                # other consumers), leave the events queued in the kernel: waking the
                # loop for each would take CPU from the consumers doing the work.
                rest = self.quiet_until - time.monotonic()
                if rest > 0:
                    await anyio.sleep(rest)
                await anyio.wait_readable(fd)
                self._drain(fd)
        except NotImplementedError:  # an event loop without fd readiness
            self._fd = None
            os.close(fd)
            self.inotify_active = False
            await anyio.to_thread.run_sync(self._start_observer)

    def _drain(self, fd: int) -> None:
        """Read the queued events (their content does not matter: UPDATE tells what
        changed) and wake the scanner. One read takes what fits in its buffer; if more
        is left, the descriptor is still readable and the loop calls again."""
        try:
            os.read(fd, _READ_SIZE)
        except BlockingIOError:
            pass
        self._fs_event = True
        self._event.set()

    async def _run_on(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        """:meth:`run` on asyncio: the descriptor stays registered with the loop and
        its reader wakes the scanner directly. ``wait_readable`` would register and
        unregister it for every event (two ``epoll_ctl`` calls) and pass through a task
        of its own: about a tenth of an unloaded round trip's time.

        A quiet spell (:attr:`quiet_until`) unregisters it until the spell ends, so the
        events stay queued in the kernel, as :meth:`run` does by sleeping.
        """
        later: asyncio.TimerHandle | None = None

        def readable() -> None:
            nonlocal later
            self._drain(fd)
            rest = self.quiet_until - time.monotonic()
            if rest > 0:
                loop.remove_reader(fd)
                later = loop.call_later(rest, listen)

        def listen() -> None:
            nonlocal later
            later = None
            rest = self.quiet_until - time.monotonic()
            if rest > 0:  # the spell was made longer meanwhile
                later = loop.call_later(rest, listen)
            else:
                loop.add_reader(fd, readable)

        listen()
        try:
            await anyio.sleep_forever()
        finally:
            if later is not None:
                later.cancel()
            loop.remove_reader(fd)

    def _start_observer(self) -> None:
        try:
            from watchdog.events import (
                FileCreatedEvent,
                FileModifiedEvent,
                FileMovedEvent,
                FileSystemEvent,
                FileSystemEventHandler,
            )
            from watchdog.observers import Observer
        except ImportError:  # pragma: no cover - watchdog is a dependency
            log.info("no file watcher available; polling only")
            return

        waker = self

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                # Our own reads of UPDATE open and close it: only writes wake us.
                if event.event_type in ("modified", "created", "moved"):
                    waker.wake_threadsafe()

        try:
            observer = Observer(timeout=0.2)
            observer.schedule(
                _Handler(),
                self._dir,
                recursive=False,
                event_filter=[FileModifiedEvent, FileCreatedEvent, FileMovedEvent],
            )
            observer.daemon = True
            observer.start()
        except OSError as exc:
            log.warning("watching %s failed (%s); polling only", self._dir, exc)
            return
        self._observer = observer
        self.inotify_active = True

    def start_poller(
        self, read: Callable[[], bytes | None], interval: float, *, hurry: bool = True
    ) -> None:
        """Poll in a thread of its own: call ``read`` every ``interval`` seconds and wake
        the scanner only when what it returns changed (a filesystem event). Within a
        second of a change it polls four times as often (:func:`poll_delay`), unless
        not ``hurry``.

        This keeps an idle bus off the event loop: one short read per tick and no
        thread hop, instead of a scan (thread hop, loop wake-ups) every tick. Where
        polling is the only way to see other hosts (network filesystems) it is how
        changes are seen; beside inotify, it is the safety net.
        """
        waker = self
        # What UPDATE holds now, before the scanner's first listing (called before it):
        # a stamp written from here on is a change, even one before the thread's first
        # tick (read first in the thread, it was taken as the baseline, and its message
        # waited for the scanner's own look).
        first: object = _UNSET
        try:
            first = read()
        except Exception:  # the scanner reports storage errors
            pass

        def poll() -> None:
            last = first
            failed = False
            changed: float | None = None
            delay = interval
            while not waker._poller_stop.wait(delay):
                now = time.monotonic()
                delay = poll_delay(
                    interval, None if changed is None else now - changed, hurry=hurry
                )
                try:
                    data = read()
                    failed = False
                except Exception as exc:  # the scanner reports storage errors
                    if not failed:
                        log.debug("polling UPDATE failed: %s", exc)
                    failed = True
                    continue
                if data != last:
                    if last is not _UNSET:
                        changed = now
                        delay = poll_delay(interval, 0.0, hurry=hurry)
                        waker.wake_threadsafe()
                    last = data

        self._poller_stop.clear()
        thread = threading.Thread(target=poll, name="fsbus-poll", daemon=True)
        thread.start()
        self._poller = thread

    def stop(self) -> None:
        """Stop watching (blocking, short)."""
        self._poller_stop.set()
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.join(timeout=5)
        fd, self._fd = self._fd, None
        if fd is not None:
            close_inotify(fd)
        obs = self._observer
        self._observer = None
        if obs is not None:
            obs.stop()  # type: ignore[attr-defined]
            obs.join(timeout=2)  # type: ignore[attr-defined]

    def wake(self) -> None:
        """Wake the scanner (from the event loop); not a filesystem event."""
        self._event.set()

    def keep_fs_event(self) -> None:
        """Put back a filesystem event taken with :meth:`take_fs_event`."""
        self._fs_event = True

    @property
    def fs_event_pending(self) -> bool:
        """Whether a filesystem event is waiting to be taken (or was kept)."""
        return self._fs_event

    def take_fs_event(self) -> bool:
        """Whether the filesystem changed since the last call (inotify saw a write)."""
        seen, self._fs_event = self._fs_event, False
        return seen

    def wake_threadsafe(self) -> None:
        """Wake the scanner from another thread; coalesces bursts of events."""
        if self._pending.is_set() or self._token is None:
            return
        self._pending.set()
        self._fs_event = True
        try:
            anyio.from_thread.run_sync(self._event.set, token=self._token)
        except RuntimeError:
            pass  # the loop is gone: we are shutting down

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait for a wake-up or ``timeout`` seconds; True when woken."""
        if not self._event.is_set():
            with anyio.move_on_after(timeout):
                await self._event.wait()
        woken = self._event.is_set()
        self._event = anyio.Event()
        self._pending.clear()
        return woken
