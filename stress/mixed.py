"""Mixed: multi and single messages, long topics and expiring messages at once, with GC.

Worker processes subscribe ``mix.#`` and ``#.long.#`` with one handler each. Messages that
do not expire must arrive exactly once per worker (multi) or be completed exactly once
(single); messages with a short TTL may expire unseen but never arrive twice; a
collector process runs ``gc()`` meanwhile, and at the end nothing expired or consumed is
left on the bus.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsbus import BlockingBus, BusConfig

from ._common import START_TIMEOUT, Summary, main_for, read_events, spawn, wait_until, workdir
from ._gc import collector
from ._roles import PublishJob, WorkerJob, publisher, worker

__all__ = ["MixedSize", "run"]

LONG_WORD = "x" * 150  # a topic of more than 100 bytes spills out of the file name


@dataclass(frozen=True)
class MixedSize:
    """One configuration of the scenario."""

    publishers: int
    """Publisher processes."""
    workers: int
    """Worker processes (each gets every multi message)."""
    per_publisher: int
    """Messages each publisher sends."""
    expiring: float
    """Fraction of messages with a TTL of 50-300 ms."""
    max_size: int
    """Largest payload, bytes."""
    timeout: float
    """Seconds allowed after the last publish."""


SIZES = {
    "small": MixedSize(2, 2, 150, 0.2, 50_000, 60.0),
    "large": MixedSize(3, 4, 2_000, 0.2, 200_000, 600.0),
}


def _topic(rng: random.Random, expiring: float) -> tuple[str, bool, float | None]:
    single = rng.random() < 0.5
    long = rng.random() < 0.25
    ttl = rng.uniform(0.05, 0.3) if rng.random() < expiring else None
    parts = ["mix", "s" if single else "m"]
    if long:
        parts.append("long")
        parts.append(LONG_WORD)
    if ttl is not None:
        parts.append("exp")
    parts.append(str(rng.randrange(10)))
    return ".".join(parts), single, ttl


def run(
    size: str,
    *,
    seed: int | None = None,
    config: dict[str, object] | None = None,
    roots: Sequence[str] | None = None,
) -> Summary:
    """Run the scenario in configuration ``size`` (``roots``: see ``--root``)."""
    sz = SIZES[size]
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    cfg: dict[str, Any] = {
        "max_deliveries": None,
        "retry_interval": 0.2,
        "gc_interval": 0.5,
        "multi_ttl": 3600.0,
        **(config or {}),
    }
    summary = Summary("mixed", size, notes={"seed": seed})
    ctx = spawn()
    with workdir(roots) as (wd, buses):
        logs = wd / "logs"
        logs.mkdir()
        stop = str(wd / "stop")
        procs = []
        readies = []
        for i in range(sz.workers):
            ready = ctx.Event()
            job = WorkerJob(
                root=buses[i % len(buses)],
                log=str(logs / f"w{i}.log"),
                pattern="mix.#",
                fail_rate=0.05,
                work_ms=(0.0, 2.0),
                seed=rng.randrange(1 << 30),
                config=cfg,
                patterns=("#.long.#",),
            )
            procs.append(ctx.Process(target=worker, args=(job, ready, stop)))
            readies.append(ready)
        procs.append(
            ctx.Process(target=collector, args=(buses[-1], str(logs / "gc.log"), cfg, stop, 0.2))
        )
        for p in procs:
            p.start()
        try:
            for r in readies:
                if not r.wait(START_TIMEOUT):
                    summary.violations.append(
                        f"a worker did not start within {START_TIMEOUT:.0f} s"
                    )
                    return summary
            jobs = [
                PublishJob(
                    root=buses[(i + 1) % len(buses)],
                    log=str(logs / f"pub{i}.log"),
                    prefix=f"p{i}-",
                    topics=tuple(_topic(rng, sz.expiring) for _ in range(sz.per_publisher)),
                    seed=rng.randrange(1 << 30),
                    max_size=sz.max_size,
                    config=cfg,
                )
                for i in range(sz.publishers)
            ]
            t0 = time.monotonic()
            pubs = [ctx.Process(target=publisher, args=(j,)) for j in jobs]
            for p in pubs:
                p.start()
            for p in pubs:
                p.join()
                if p.exitcode != 0:
                    summary.violations.append(f"publisher exited with {p.exitcode}")
            sent = {
                f[1]: f[2] for _, f in read_events(sorted(logs.glob("pub*.log"))) if f[0] == "pub"
            }
            durable = {m for m, t in sent.items() if ".exp." not in t}
            multi_ids = {m for m in durable if sent[m].startswith("mix.m.")}
            single_ids = durable - multi_ids
            want = len(multi_ids) * sz.workers + len(single_ids)

            def progress() -> int:
                n = 0
                for _, f in read_events(logs.glob("w*.log")):
                    if (f[0] == "got" and f[1] in multi_ids) or (
                        f[0] == "done" and f[1] in single_ids
                    ):
                        n += 1
                return n

            wait_until(lambda: progress() >= want, timeout=sz.timeout, step=0.2)
            summary.seconds = time.monotonic() - t0
            time.sleep(0.5)  # bounded grace period for a late duplicate to show
        finally:
            Path(stop).touch()
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
                    summary.violations.append("a child did not stop within 30 s")
        summary.sent = len(sent)
        _count(summary, logs, sent, multi_ids, single_ids, sz.workers)
        with BlockingBus(buses[0], config=BusConfig(**cfg)) as bus:
            removed = bus.gc()
            left = list(bus.browse("#"))
        leftover = [i for i in left if i.single or ".exp." in i.topic]
        if leftover:
            summary.violations.append(
                f"{len(leftover)} consumed or expired message(s) still on the bus after gc"
            )
        gc_rounds = [int(f[1]) for _, f in read_events([logs / "gc.log"]) if f[0] == "gc"]
        summary.notes["gc_rounds"] = len(gc_rounds)
        summary.notes["gc_removed"] = sum(gc_rounds) + removed
        summary.notes["long"] = sum(1 for t in sent.values() if ".long." in t)
    return summary


def _count(
    summary: Summary,
    logs: Path,
    sent: dict[str, str],
    multi_ids: set[str],
    single_ids: set[str],
    workers: int,
) -> None:
    got: dict[str, Counter[str]] = {f"w{i}": Counter() for i in range(workers)}
    done: Counter[str] = Counter()
    for stem, f in read_events(logs.glob("w*.log")):
        if f[0] == "got":
            got[stem][f[1]] += 1
            if f[2] != "ok":
                summary.violations.append(f"{stem}: payload of {f[1]} failed its checksum")
        elif f[0] == "done":
            done[f[1]] += 1
        elif f[0] == "bad":
            summary.violations.append(f"payload of {f[1]} failed its checksum")
    expiring = set(sent) - multi_ids - single_ids
    for counts in got.values():
        for mid in multi_ids:
            if counts[mid]:
                summary.delivered += 1
            else:
                summary.lost += 1
        summary.duplicates += sum(n - 1 for n in counts.values() if n > 1)
        wrong = [m for m in counts if m in single_ids]
        if wrong:
            summary.violations.append(f"{len(wrong)} single message(s) arrived as multi")
    for mid in single_ids:
        if done[mid]:
            summary.delivered += 1
        else:
            summary.lost += 1
    summary.duplicates += sum(n - 1 for n in done.values() if n > 1)
    seen_expiring = {m for c in got.values() for m in c if m in expiring} | {
        m for m in done if m in expiring
    }
    summary.notes["expiring"] = len(expiring)
    summary.notes["expiring_delivered"] = len(seen_expiring)


def main(argv: list[str] | None = None) -> int:
    """``python -m stress.mixed [--size small|large]``."""
    return main_for("mixed", run, argv)


if __name__ == "__main__":
    sys.exit(main())
