"""diskcache's ``Deque``: a process-safe persistent deque on SQLite plus files.

Publish is ``append``; workers ``popleft`` (safe across processes), pausing 1 ms when the
deque is empty (diskcache has no blocking get or notification).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from bench.child import Tally, make_payload, ready, result
from bench.scenarios import Kind
from bench.systems.base import System


class DiskCache(System):
    name: ClassVar[str] = "diskcache"
    label: ClassVar[str] = "diskcache Deque"
    module: ClassVar[str] = "diskcache_"
    kinds: ClassVar[frozenset[Kind]] = frozenset({"publish", "workqueue"})


def _deque(p: dict[str, Any]) -> Any:
    import diskcache

    return diskcache.Deque(directory=str(Path(p["dir"]) / "dc"))


def _pub(p: dict[str, Any]) -> None:
    dq = _deque(p)
    payloads = [make_payload(i, int(p["size"])) for i in range(int(p["n"]))]
    t0 = time.monotonic_ns()
    for body in payloads:
        dq.append(body)
    result(t0_ns=t0, t1_ns=time.monotonic_ns())


def _worker(p: dict[str, Any]) -> None:
    dq = _deque(p)
    tally = Tally(None)
    ready()
    while not tally.finished:
        try:
            tally.hit(dq.popleft())
        except IndexError:
            time.sleep(0.001)
    tally.send_result()


ROLES = {"pub": _pub, "worker": _worker}
