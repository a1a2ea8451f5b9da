"""persist-queue's ``SQLiteQueue`` (auto-commit): a durable local queue on SQLite.

Work queue with one worker only: its get is a SELECT then a DELETE that other processes
can interleave with (two workers would take the same item). The worker polls with
``get(block=False)`` and a 1 ms pause when empty (its own blocking get waits up to 0.1 s
between looks, which only makes it slower).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from bench.child import Tally, make_payload, ready, result
from bench.scenarios import Kind
from bench.systems.base import System


class PersistQueue(System):
    name: ClassVar[str] = "persist-queue"
    label: ClassVar[str] = "persist-queue SQLiteQueue"
    module: ClassVar[str] = "persist_queue"
    kinds: ClassVar[frozenset[Kind]] = frozenset({"publish", "workqueue"})
    max_consumers: ClassVar[int] = 1


def _queue(p: dict[str, Any]) -> Any:
    import persistqueue

    return persistqueue.SQLiteQueue(str(Path(p["dir"]) / "pq"), auto_commit=True)


def _pub(p: dict[str, Any]) -> None:
    q = _queue(p)
    payloads = [make_payload(i, int(p["size"])) for i in range(int(p["n"]))]
    t0 = time.monotonic_ns()
    for body in payloads:
        q.put(body)
    result(t0_ns=t0, t1_ns=time.monotonic_ns())


def _worker(p: dict[str, Any]) -> None:
    import persistqueue

    q = _queue(p)
    tally = Tally(None)
    ready()
    while not tally.finished:
        try:
            tally.hit(q.get(block=False))
        except persistqueue.Empty:
            time.sleep(0.001)
    tally.send_result()


ROLES = {"pub": _pub, "worker": _worker}
