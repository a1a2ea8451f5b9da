"""fsbus Streams (append-only segmented logs), through the public API only.

``append`` writes records with ``Stream.append_batch`` in batches of 1000 (one lock hold
each, the counterpart of Redis pipelines and the raw buffered loop) with durability
``none``; ``append_durable`` uses durability ``batch`` (fdatasync per batch, like the raw
loop's durable variant); ``read`` reads them all back with ``Stream.read``. Payloads are
made inside the timed loop, batch by batch, as the raw loop makes each record as it goes.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from bench.child import make_payload, result
from bench.scenarios import Kind
from bench.systems.base import System

BATCH = 1000
NAME = "bench"


class FsBusStreams(System):
    name: ClassVar[str] = "fsbus-streams"
    label: ClassVar[str] = "fsbus Streams"
    module: ClassVar[str] = "fsbus_streams"
    kinds: ClassVar[frozenset[Kind]] = frozenset({"append", "append_durable", "read"})

    def prepare(self) -> str | None:
        import fsbus

        if not hasattr(fsbus, "Stream"):
            return "this fsbus has no Streams yet"
        return None


def _open(p: dict[str, Any], durable: bool) -> Any:
    import fsbus

    config = fsbus.StreamConfig(durability="batch" if durable else "none")
    return fsbus.Stream.open(p["dir"], NAME, config=config)


def _write(stream: Any, n: int, size: int) -> None:
    # payloads are made batch by batch inside the timed loop, as the raw loop makes each
    # record as it goes (all of them up front was 200 MB of fresh memory at 10 KB)
    for start in range(0, n, BATCH):
        stream.append_batch([make_payload(i, size) for i in range(start, min(n, start + BATCH))])


def _append(p: dict[str, Any]) -> None:
    durable = bool(p.get("durable"))
    with _open(p, durable) as stream:
        t0 = time.monotonic_ns()
        _write(stream, int(p["n"]), int(p["size"]))
        t1 = time.monotonic_ns()
    result(t0_ns=t0, t1_ns=t1)


def _read(p: dict[str, Any]) -> None:
    n = int(p["n"])
    with _open(p, False) as stream:
        _write(stream, n, int(p["size"]))
        t0 = time.monotonic_ns()
        got = sum(1 for _ in stream.read(0))
        t1 = time.monotonic_ns()
    if got != n:
        raise SystemExit(f"read {got} records, wrote {n}")
    result(t0_ns=t0, t1_ns=t1)


ROLES = {"append": _append, "read": _read}
