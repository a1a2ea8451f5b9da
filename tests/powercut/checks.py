"""Runs and checks shared by the crash-consistency tests.

A run starts from a saved, fully synced state, opens what it needs, arms a cut after
the k-th mutating filesystem operation, does its work until the filesystem dies under
it, and comes back up with what was durable. The checks then open the bus or stream
again the way a restarted program would and hold it to docs/guarantees.md.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fsbus import BlockingBus, BusConfig

from .harness import PowerCut

# 16 buckets instead of 256: the same paths and syncs, fewer directories for the
# Python filesystem to build and list on every run.
BUS_CONFIG = BusConfig(bucket_num_chars=1)


TOTALS: dict[str, int] = {"cuts": 0, "lost": 0, "corrupt": 0}
"""Across the session, printed at its end (conftest): the figures for guarantees.md."""


@dataclass
class Tally:
    """What a sweep tried and found, for the report and the guarantees table."""

    cuts: int = 0
    lost: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        TOTALS["cuts"] += self.cuts
        TOTALS["lost"] += len(self.lost)
        TOTALS["corrupt"] += len(self.corrupt)
        self.cuts = 0  # counted once
        return not self.lost and not self.corrupt


def cut_points(total: int, *, every: int, randoms: int, seed: int) -> list[int]:
    """Every ``every``-th operation of ``total`` (and the last), plus random ones.

    ``total + 1`` stands for "after the last operation".
    """
    points = set(range(1, total + 2, every)) | {total, total + 1}
    rng = random.Random(seed)
    points |= {rng.randint(1, total + 1) for _ in range(randoms)}
    return sorted(p for p in points if p >= 1)


def count_ops(pfs: PowerCut, work: Callable[[], object]) -> int:
    """How many mutating operations ``work`` does (no cut)."""
    pfs.arm(0)
    work()
    return int(pfs.status()["ops"])


def run_until_cut(pfs: PowerCut, k: int, work: Callable[[], object]) -> bool:
    """Run ``work`` with a cut after its k-th operation; True if the cut came first.

    ``work`` records what was acknowledged itself; whatever it raises once the disk
    is dead is the crash. Then the power comes back.
    """
    pfs.arm(k)
    try:
        work()
    except Exception:
        if not pfs.status()["dead"]:
            raise
    died = bool(pfs.status()["dead"])
    pfs.restore()
    return died


def quiet_close(closer: Callable[[], object]) -> None:
    """Close what was open when the power went (its calls fail with EIO)."""
    try:
        closer()
    except Exception:
        pass


# ------------------------------------------------------------------ bus messages
@dataclass(frozen=True)
class Item:
    topic: str
    payload: bytes
    single: bool
    headers: dict[str, str] | None


def bus_items(seed: int, n: int) -> list[Item]:
    """Messages with unique topics: multi and single, short and spilled topics, headers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic = f"jobs.{i}" if i % 3 else "jobs." + "long-" * 30 + str(i)  # spills
        payload = rng.randbytes(rng.choice([0, 1, 17, 300, 5000]))
        headers = {"n": str(i)} if i % 4 == 1 else None
        out.append(Item(topic, payload, single=i % 2 == 1, headers=headers))
    return out


def check_bus(
    root: str,
    items: Iterable[Item],
    acked: set[str],
    where: str,
    tally: Tally,
    *,
    deliver: bool = False,
    durable: bool = True,
) -> None:
    """Open the bus after a cut and hold it to the guarantees.

    ``acked``: topics whose durable publish returned. Every one is present, complete
    and consumable; nothing visible is torn; gc removes debris and keeps messages.
    Work-queue messages are consumed by ``purge`` (claim, truncate, unlink), or with
    ``deliver`` by a subscriber (slower: the polled engine takes ~0.6 s a message here).
    Plain publishes (``durable=False``) may come back without their headers.
    """
    by_topic = {it.topic: it for it in items}
    with BlockingBus(root, config=BUS_CONFIG) as bus:
        seen: dict[str, bytes] = {}
        for info in bus.browse("#"):
            item = by_topic.get(info.topic)
            payload = bus.read_payload(info)
            if payload is None and item is not None and info.size <= 0:
                continue  # an empty file: a publish whose data never reached the disk
            if item is None or payload is None or payload != item.payload:
                tally.corrupt.append(f"{where}: {info.topic} read as {payload!r:.40}")
                continue
            headers = dict(info.headers)
            if not durable and not headers:
                headers = item.headers or {}  # plain: the sidecar's data may be lost
            if headers != (item.headers or {}) or info.single != item.single:
                tally.corrupt.append(f"{where}: {info.topic} headers/kind {info.headers}")
            seen[info.topic] = payload
        for topic in acked - set(seen):
            tally.lost.append(f"{where}: acknowledged {topic} missing")
        bus.gc(debris_age=0)
        staging = os.listdir(bus.layout.staging)
        if os.path.isdir(bus.layout.spares):
            staging += os.listdir(bus.layout.spares)
        if staging:
            tally.corrupt.append(f"{where}: staging debris left after gc: {staging}")
        after = {info.topic for info in bus.browse("#")}
        for topic in set(seen) - after:
            tally.lost.append(f"{where}: gc removed {topic}")
        singles = {t for t in seen if by_topic[t].single}
        if singles and not deliver:
            report = bus.purge("#", kind="single")
            if report.single != len(singles) or report.locked:
                tally.lost.append(f"{where}: purge consumed {report} of {sorted(singles)}")
        elif singles:
            got: set[str] = set()
            with bus.messages("#", existing=True, kind="single", prefetch=16) as it:
                while got != singles:
                    try:
                        msg = it.get(timeout=3)
                    except TimeoutError:
                        break
                    if msg.payload != by_topic[msg.topic].payload:
                        tally.corrupt.append(f"{where}: {msg.topic} delivered torn")
                    got.add(msg.topic)
                    it.ack(msg)
            for topic in singles - got:
                tally.lost.append(f"{where}: single {topic} not delivered")


def publish_all(bus: BlockingBus, items: Iterable[Item], durable: bool, acked: set[str]) -> Any:
    for it in items:
        bus.publish(it.topic, it.payload, single=it.single, durable=durable, headers=it.headers)
        acked.add(it.topic)
