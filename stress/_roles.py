"""Child process bodies (spawned): publishers, subscribers and workers.

Each takes plain picklable arguments and writes its events to its own :class:`EventLog`:

``pub <id> <topic>``                  a message was published
``got <id> <ok|bad>``                 a multi message arrived (payload checksum checked)
``start <id> <delivery_count>``       a work-queue handler began
``done <id>``                         a work-queue handler finished successfully
``fail <id>``                         a work-queue handler raised on purpose
``full <id>``                         a publish met a full disk and will be retried
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from fsbus import BlockingBus, Bus, BusConfig, DiskFull, Message

from ._common import EventLog, check_payload, make_payload, wait_until

__all__ = ["PublishJob", "WorkerJob", "publisher", "subscriber", "wait_for_file", "worker"]


async def wait_for_file(path: str) -> None:
    """Return once ``path`` exists.

    A file, not a multiprocessing Event: a process SIGKILLed inside ``Event.wait`` leaves
    the event's internal lock held and every later ``set`` hangs.
    """
    await anyio.to_thread.run_sync(wait_until, lambda: os.path.exists(path), None)


@dataclass(frozen=True)
class PublishJob:
    """What one publisher process sends."""

    root: str
    """Bus directory."""
    log: str
    """Event log path."""
    prefix: str
    """Prefix of the message ids (unique per publisher)."""
    topics: tuple[tuple[str, bool, float | None], ...]
    """(topic, single, ttl) of each message, in order."""
    seed: int
    """Seed of the payload generator."""
    max_size: int
    """Largest payload, bytes."""
    config: dict[str, Any]
    """BusConfig options."""
    retry_when_full: bool = False
    """On DiskFull, wait a little and publish again (logged as ``full``) instead of failing."""


def publisher(job: PublishJob) -> None:
    """Publish every message of ``job`` through the blocking face."""
    rng = random.Random(job.seed)
    log = EventLog(job.log)
    with BlockingBus(job.root, config=BusConfig(**job.config)) as bus:
        for i, (topic, single, ttl) in enumerate(job.topics):
            data, crc = make_payload(rng, high=job.max_size)
            mid = f"{job.prefix}{i}"
            while True:
                try:
                    bus.publish(
                        topic, data, single=single, ttl=ttl, headers={"id": mid, "crc": crc}
                    )
                    break
                except DiskFull:
                    if not job.retry_when_full:
                        raise
                    log.write("full", mid)
                    time.sleep(0.01)  # consumers free space meanwhile
            log.write("pub", mid, topic)
    log.close()


def subscriber(
    root: str,
    log_path: str,
    patterns: tuple[str, ...],
    config: dict[str, Any],
    ready: Any,
    stop: str,
) -> None:
    """Subscribe ``patterns`` with one handler (multi messages) until the ``stop`` file exists."""

    async def main() -> None:
        log = EventLog(log_path)

        async def handle(msg: Message) -> None:
            ok = check_payload(msg.payload, msg.headers.get("crc", ""))
            log.write("got", msg.headers.get("id", "?"), "ok" if ok else "bad")

        async with Bus(root, config=BusConfig(**config)) as bus:
            for p in patterns:
                await bus.subscribe(p, handle)
            ready.set()
            await wait_for_file(stop)
        log.close()

    anyio.run(main)


@dataclass(frozen=True)
class WorkerJob:
    """What one work-queue worker process does."""

    root: str
    """Bus directory."""
    log: str
    """Event log path."""
    pattern: str
    """Subscription pattern."""
    fail_rate: float
    """Fraction of deliveries whose handler raises (released, redelivered)."""
    work_ms: tuple[float, float]
    """Range of simulated work per message, milliseconds."""
    seed: int
    """Seed for failures and work times."""
    config: dict[str, Any]
    """BusConfig options."""
    patterns: tuple[str, ...] = ()
    """Extra multi subscriptions logged as ``got`` (mixed scenario)."""


class _Planned(Exception):
    """A failure the scenario asked for."""


def worker(job: WorkerJob, ready: Any, stop: str) -> None:
    """Consume work-queue messages until the ``stop`` file exists (or the process is killed)."""

    async def main() -> None:
        rng = random.Random(job.seed ^ os.getpid())
        log = EventLog(job.log)

        async def handle(msg: Message) -> None:
            mid = msg.headers.get("id", "?")
            if not msg.single:
                ok = check_payload(msg.payload, msg.headers.get("crc", ""))
                log.write("got", mid, "ok" if ok else "bad")
                return
            log.write("start", mid, msg.delivery_count)
            if not check_payload(msg.payload, msg.headers.get("crc", "")):
                log.write("bad", mid)
            lo, hi = job.work_ms
            if hi > 0:
                await anyio.sleep(rng.uniform(lo, hi) / 1000)
            if rng.random() < job.fail_rate:
                log.write("fail", mid)
                raise _Planned(mid)
            log.write("done", mid)

        async with Bus(job.root, config=BusConfig(**job.config)) as bus:
            await bus.subscribe(job.pattern, handle)
            for p in job.patterns:
                await bus.subscribe(p, handle)
            ready.set()
            await wait_for_file(stop)
        log.close()

    anyio.run(main)
