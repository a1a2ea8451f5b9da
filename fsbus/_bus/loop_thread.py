"""An event loop in a daemon thread, with a blocking portal into it, that fork forgets.

anyio's ``start_blocking_portal`` is a context manager built on a suspended generator.
A forked child holds a copy of it but not the thread behind it; when the child drops
the copy, the generator is finalised and asks the absent thread to stop, waiting
forever. A :class:`LoopThread` stopped (or dropped) in a forked child does nothing:
the loop and everything running on it belong to the parent.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future

import anyio
from anyio.from_thread import BlockingPortal

__all__ = ["LoopThread"]


class LoopThread:
    """Start an asyncio loop in a daemon thread named ``name``; ``portal`` calls into it."""

    def __init__(self, name: str) -> None:
        ready: Future[BlockingPortal] = Future()

        async def serve() -> None:
            async with BlockingPortal() as portal:
                ready.set_result(portal)
                await portal.sleep_until_stopped()

        def run() -> None:
            try:
                anyio.run(serve)
            except BaseException as exc:  # handed to the thread waiting in __init__
                if not ready.done():
                    ready.set_exception(exc)

        self.pid = os.getpid()
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()
        self.portal = ready.result()

    @property
    def forked(self) -> bool:
        """True in a process forked after the loop started (it has no such thread)."""
        return self.pid != os.getpid()

    def stop(self, *, cancel: bool = False) -> None:
        """Stop the loop (cancelling what still runs if ``cancel``) and join its thread."""
        if self.forked:
            return
        try:
            self.portal.call(self.portal.stop, cancel)
        except RuntimeError:  # stopped already
            pass
        self._thread.join()
