"""queuelib's ``FifoDiskQueue`` (Scrapy's on-disk request queue): one process only.

It is not safe across processes, so it has no fan-out or work-queue counterpart: publish is
``push`` and read is ``pop`` until empty, in the process that pushed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from bench.child import make_payload, result
from bench.scenarios import Kind
from bench.systems.base import System


class QueueLib(System):
    name: ClassVar[str] = "queuelib"
    label: ClassVar[str] = "queuelib FifoDiskQueue"
    module: ClassVar[str] = "queuelib_"
    kinds: ClassVar[frozenset[Kind]] = frozenset({"publish", "read"})


def _push_all(p: dict[str, Any]) -> tuple[Any, int, int]:
    from queuelib import FifoDiskQueue

    q = FifoDiskQueue(str(Path(p["dir"]) / "ql"))
    payloads = [make_payload(i, int(p["size"])) for i in range(int(p["n"]))]
    t0 = time.monotonic_ns()
    for body in payloads:
        q.push(body)
    return q, t0, time.monotonic_ns()


def _pub(p: dict[str, Any]) -> None:
    q, t0, t1 = _push_all(p)
    q.close()
    result(t0_ns=t0, t1_ns=t1)


def _read(p: dict[str, Any]) -> None:
    q, _, _ = _push_all(p)
    t0 = time.monotonic_ns()
    got = 0
    while q.pop() is not None:
        got += 1
    t1 = time.monotonic_ns()
    q.close()
    if got != int(p["n"]):
        raise SystemExit(f"popped {got}, pushed {p['n']}")
    result(t0_ns=t0, t1_ns=t1)


ROLES = {"pub": _pub, "read": _read}
