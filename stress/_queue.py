"""The work-queue driver shared by the workqueue and chaos scenarios.

Publishers put single messages on the bus while W worker processes compete for them;
some handlers fail on purpose (released, redelivered) and, in chaos, workers are
SIGKILLed at random and replaced. Afterwards every message must have exactly one
successful handler run, except that a message whose handler ran in a killed process may
have run again elsewhere (its ack died with the process); those are counted apart.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsbus import BlockingBus, BusConfig

from ._common import START_TIMEOUT, Summary, read_events, spawn, wait_until, workdir
from ._roles import PublishJob, WorkerJob, publisher, worker

__all__ = ["QueueSize", "run_queue"]


@dataclass(frozen=True)
class QueueSize:
    """One configuration of a work-queue scenario."""

    publishers: int
    """Publisher processes."""
    workers: int
    """Worker processes consuming at once."""
    per_publisher: int
    """Single messages each publisher sends."""
    fail_rate: float
    """Fraction of handler runs that raise."""
    work_ms: tuple[float, float]
    """Simulated work per message, milliseconds."""
    kills: int
    """Workers to SIGKILL while they work (0: none)."""
    max_size: int
    """Largest payload, bytes."""
    timeout: float
    """Seconds allowed after the last publish."""
    concurrency: int = 16
    """Handlers running at once in each worker (BusConfig.handler_concurrency)."""


def run_queue(
    name: str,
    size: str,
    sz: QueueSize,
    *,
    seed: int | None = None,
    config: dict[str, Any] | None = None,
    roots: Sequence[str] | None = None,
    retry_when_full: bool = False,
) -> Summary:
    """Run a work-queue scenario and count what happened.

    ``retry_when_full`` makes publishers retry on DiskFull (for runs on a tiny
    filesystem, where consumers free the space publishers wait for).
    """
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    cfg: dict[str, Any] = {
        "max_deliveries": None,
        "retry_interval": 0.2,
        "handler_concurrency": sz.concurrency,
        **(config or {}),
    }
    summary = Summary(name, size, notes={"seed": seed})
    ctx = spawn()
    killed: set[str] = set()
    with workdir(roots) as (wd, buses):
        logs = wd / "logs"
        logs.mkdir()
        stop = str(wd / "stop")
        workers: dict[int, Any] = {}
        generation: Counter[int] = Counter()

        def start_worker(slot: int) -> Any:
            ready = ctx.Event()
            job = WorkerJob(
                root=buses[slot % len(buses)],
                log=str(logs / f"w{slot}-{generation[slot]}.log"),
                pattern="jobs.#",
                fail_rate=sz.fail_rate,
                work_ms=sz.work_ms,
                seed=rng.randrange(1 << 30),
                config=cfg,
            )
            p = ctx.Process(target=worker, args=(job, ready, stop))
            p.start()
            return p, ready

        try:
            started = [start_worker(i) for i in range(sz.workers)]
            for i, (p, ready) in enumerate(started):
                workers[i] = p
                if not ready.wait(START_TIMEOUT):
                    summary.violations.append(
                        f"a worker did not start within {START_TIMEOUT:.0f} s"
                    )
                    return summary
            jobs = [
                PublishJob(
                    root=buses[i % len(buses)],
                    log=str(logs / f"pub{i}.log"),
                    prefix=f"p{i}-",
                    topics=tuple(
                        (f"jobs.{rng.choice('abc')}.{n % 7}", True, None)
                        for n in range(sz.per_publisher)
                    ),
                    seed=rng.randrange(1 << 30),
                    max_size=sz.max_size,
                    config=cfg,
                    retry_when_full=retry_when_full,
                )
                for i in range(sz.publishers)
            ]
            t0 = time.monotonic()
            pubs = [ctx.Process(target=publisher, args=(j,)) for j in jobs]
            for p in pubs:
                p.start()
            total = sz.publishers * sz.per_publisher

            def done_ids() -> set[str]:
                return {f[1] for _, f in read_events(logs.glob("w*.log")) if f[0] == "done"}

            kills_left = sz.kills
            deadline = time.monotonic() + sz.timeout
            while kills_left and time.monotonic() < deadline and len(done_ids()) < total:
                time.sleep(rng.uniform(0.05, 0.3))
                slot = rng.randrange(sz.workers)
                stem = f"w{slot}-{generation[slot]}"
                if not _busy(logs / f"{stem}.log"):
                    continue  # kill workers while they handle something
                workers[slot].kill()
                workers[slot].join()
                killed.add(stem)
                kills_left -= 1
                generation[slot] += 1
                p, ready = start_worker(slot)
                workers[slot] = p
                ready.wait(START_TIMEOUT)
            for p in pubs:
                p.join()
                if p.exitcode != 0:
                    summary.violations.append(f"publisher exited with {p.exitcode}")
            wait_until(
                lambda: len(done_ids()) >= total,
                timeout=max(1.0, deadline - time.monotonic()),
                step=0.2,
            )
            summary.seconds = time.monotonic() - t0
            time.sleep(0.5)  # bounded grace period for a late duplicate to show
        finally:
            Path(stop).touch()
            for p in workers.values():
                p.join(30)
                if p.is_alive():
                    p.kill()
                    summary.violations.append("a worker did not stop within 30 s")
        summary.notes["kills"] = len(killed)
        _count(summary, logs, killed)
        with BlockingBus(buses[0], config=BusConfig(**cfg)) as bus:
            left = sum(1 for info in bus.browse("#") if info.single)
        if left:
            summary.violations.append(f"{left} work-queue message(s) left on the bus")
    return summary


def _busy(log: Path) -> bool:
    """Whether the worker has a handler running (more starts than ends in its log)."""
    ends = starts = 0
    for _, f in read_events([log]):
        if f[0] == "start":
            starts += 1
        elif f[0] in ("done", "fail"):
            ends += 1
    return starts > ends


def _count(summary: Summary, logs: Path, killed: set[str]) -> None:
    pub_events = list(read_events(logs.glob("pub*.log")))
    sent = {f[1] for _, f in pub_events if f[0] == "pub"}
    summary.sent = len(sent)
    full = sum(1 for _, f in pub_events if f[0] == "full")
    if full:
        summary.notes["disk_full"] = full
    done_live: Counter[str] = Counter()
    done_killed: dict[str, Counter[str]] = defaultdict(Counter)
    failures = 0
    for stem, f in read_events(logs.glob("w*.log")):
        if f[0] == "done":
            if stem in killed:
                done_killed[f[1]][stem] += 1
            else:
                done_live[f[1]] += 1
        elif f[0] == "fail":
            failures += 1
        elif f[0] == "bad":
            summary.violations.append(f"payload of {f[1]} failed its checksum")
    allowed = 0
    for mid in sent:
        live = done_live[mid]
        dead = done_killed.get(mid, Counter())
        runs = live + sum(dead.values())
        if runs == 0:
            summary.lost += 1
            continue
        summary.delivered += 1
        forbidden = max(0, live - 1) + sum(n - 1 for n in dead.values() if n > 1)
        summary.duplicates += forbidden
        allowed += runs - 1 - forbidden
    stray = (set(done_live) | set(done_killed)) - sent
    if stray:
        summary.violations.append(f"{len(stray)} completed id(s) were never published")
    summary.notes["failures"] = failures
    summary.notes["dup_after_kill"] = allowed
