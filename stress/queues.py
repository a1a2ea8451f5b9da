"""Durable queues: three queues with overlapping bindings, consumers SIGKILLed at random.

Queues ``orders`` (``orders.#``), ``paid`` (``orders.*.paid``) and ``ledger`` (``#.paid``)
are declared before anything runs; publisher processes send multi and single messages on
a mix of topics, some matching several queues and some none (the blocking face one by
one, the async face with ``publish`` and ``publish_many``); each queue has consumer
processes of both faces (``Bus.subscribe(None, handler, queue=...)`` and
``BlockingBus.messages(queue=...)``), some SIGKILLed while handling and replaced.
Halfway through, ``refunds.#`` is bound to ``ledger``: each publisher waits at its halfway
mark until the binding is in place (a file the harness makes), so that however fast they
publish, half of what they send comes after it.

Counted per queue, with an independent matcher for what each queue should hold: every
expected (queue, message) handled at least once, none handled in a queue whose bindings do
not match its topic, a second run only when it started as a redelivery
(``delivery_count > 1``) after a consumer of that queue was killed (``dup_after_kill``),
and every queue empty at the end. A message on ``refunds.#`` is expected in ``ledger`` when
its publish began after ``bind_queue`` returned, not when it ended before the bind began,
and may be there or not when the two overlapped (``during_bind``).

Event logs (one line per event, ``t`` is ``time.monotonic()``)::

    pub <id> <topic> <s|m> <t_before> <t_after>   a publish returned (publisher)
    start <queue> <id> <delivery_count> <topic> <t>  a handler began (consumer)
    done <queue> <id> <delivery_count>             a handler finished (consumer)
    bad <queue> <id>                               a payload failed its checksum
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from fsbus import BlockingBus, Bus, BusConfig, Message

from ._common import (
    EventLog,
    Summary,
    check_payload,
    main_for,
    make_payload,
    matches,
    read_events,
    spawn,
    wait_until,
    workdir,
)
from ._roles import wait_for_file

__all__ = ["QUEUES", "SIZES", "QueuesSize", "run"]

QUEUES: dict[str, tuple[str, ...]] = {
    "orders": ("orders.#",),
    "paid": ("orders.*.paid",),
    "ledger": ("#.paid",),
}
"""Queue name -> bindings declared before the run."""
LATE = ("ledger", "refunds.#")
"""(queue, pattern) bound halfway through the run."""
FIRST = ("orders",) * 5 + ("invoices", "invoices", "refunds", "refunds", "stock", "paid")
"""First word of a topic (almost half of them ``orders``)."""
REST = ("eu", "us", "paid", "paid", "new", "late")
"""Later words of a topic."""


@dataclass(frozen=True)
class QueuesSize:
    """One configuration of the scenario."""

    publishers: int
    """Publisher processes (even: blocking face, odd: async face with batches)."""
    consumers: int
    """Consumer processes per queue (even slots async face, odd slots blocking)."""
    per_publisher: int
    """Messages each publisher sends."""
    work_ms: tuple[float, float]
    """Simulated work per message, milliseconds."""
    kills: int
    """Consumers to SIGKILL while they handle a message."""
    max_size: int
    """Largest payload, bytes."""
    timeout: float
    """Seconds allowed from the first publish to the last queue drained."""
    concurrency: int = 2
    """Handlers running at once in each async consumer (BusConfig.handler_concurrency)."""


SIZES = {
    "small": QueuesSize(2, 2, 150, (10.0, 40.0), 4, 20_000, 60.0),
    "large": QueuesSize(3, 3, 2_000, (10.0, 40.0), 40, 200_000, 900.0, concurrency=4),
}


def random_queue_topic(rng: random.Random) -> str:
    """A topic that matches any number of the queues' bindings, or none: three words
    ending in ``paid`` (three in ten), else 1-4 words at random."""
    if rng.random() < 0.3:
        return f"{rng.choice(FIRST)}.{rng.choice(REST[:2])}.paid"
    n = rng.choices(range(4), weights=(1, 2, 4, 2))[0]
    return ".".join([rng.choice(FIRST), *(rng.choice(REST) for _ in range(n))])


def matches_any(patterns: Sequence[str], topic: str) -> bool:
    """Whether any of ``patterns`` matches ``topic`` (the reference matcher, not fsbus's)."""
    return any(matches(p, topic) for p in patterns)


def expected_queues(topic: str) -> set[str]:
    """The queues whose bindings declared before the run match ``topic``."""
    return {q for q, pats in QUEUES.items() if matches_any(pats, topic)}


# ---------------------------------------------------------------- child processes
@dataclass(frozen=True)
class QueuePublishJob:
    """What one publisher process sends."""

    root: str
    """Bus directory."""
    log: str
    """Event log path."""
    prefix: str
    """Prefix of the message ids (unique per publisher)."""
    topics: tuple[tuple[str, bool], ...]
    """(topic, single) of each message, in order."""
    seed: int
    """Seed of the payload generator and the batch sizes."""
    max_size: int
    """Largest payload, bytes."""
    face: str
    """``blocking``: ``BlockingBus.publish`` one by one; ``async``: ``Bus.publish`` and
    ``Bus.publish_many`` (runs of 2-8 messages with the same ``single``)."""
    config: dict[str, Any]
    """BusConfig options."""
    gate: str
    """A file the publisher waits for halfway through its messages: the harness makes it
    once the late binding is in place, so that some messages are published after it."""


GATE_WAIT = 120.0
"""Seconds a publisher waits at its gate before going on without it."""


def _wait_for_gate(path: str) -> None:
    wait_until(lambda: os.path.exists(path), GATE_WAIT, step=0.01)


def _payload(rng: random.Random, mid: str, max_size: int) -> bytes:
    """The message id and the CRC-32 of the random data, then the data (``publish_many``
    gives every message of a batch the same headers, so the id travels in the payload)."""
    data, crc = make_payload(rng, high=max_size)
    return f"{mid} {crc} ".encode() + data


def queue_publisher(job: QueuePublishJob) -> None:
    """Publish every message of ``job``; log each with the time before and after."""
    rng = random.Random(job.seed)
    log = EventLog(job.log)
    items = [(f"{job.prefix}{i}", t, s) for i, (t, s) in enumerate(job.topics)]
    half = len(items) // 2

    def logged(batch: list[tuple[str, str, bool]], before: float) -> None:
        after = time.monotonic()
        for mid, topic, single in batch:
            log.write("pub", mid, topic, "s" if single else "m", f"{before:.6f}", f"{after:.6f}")

    if job.face == "blocking":
        with BlockingBus(job.root, config=BusConfig(**job.config)) as bus:
            for n, (mid, topic, single) in enumerate(items):
                if n == half:
                    _wait_for_gate(job.gate)
                payload = _payload(rng, mid, job.max_size)
                before = time.monotonic()
                bus.publish(topic, payload, single=single)
                logged([(mid, topic, single)], before)
        log.close()
        return

    async def main() -> None:
        async with Bus(job.root, config=BusConfig(**job.config)) as bus:
            i = 0
            while i < len(items):
                if i == half:
                    await anyio.to_thread.run_sync(_wait_for_gate, job.gate)
                single = items[i][2]
                n = 1 if rng.random() < 0.4 else rng.randint(2, 8)
                end = half if i < half else len(items)  # no batch across the gate
                batch = [items[i]]
                while len(batch) < n and i + len(batch) < end:
                    if items[i + len(batch)][2] != single:
                        break
                    batch.append(items[i + len(batch)])
                i += len(batch)
                payloads = [(t, _payload(rng, mid, job.max_size)) for mid, t, _ in batch]
                before = time.monotonic()
                if len(batch) == 1:
                    await bus.publish(payloads[0][0], payloads[0][1], single=single)
                else:
                    await bus.publish_many(payloads, single=single)
                logged(batch, before)

    anyio.run(main)
    log.close()


@dataclass(frozen=True)
class QueueConsumerJob:
    """What one consumer process of a queue does."""

    root: str
    """Bus directory."""
    log: str
    """Event log path."""
    queue: str
    """The queue it consumes."""
    face: str
    """``async`` (``Bus.subscribe(None, h, queue=...)``) or ``blocking``
    (``BlockingBus.messages(queue=...)``, one message at a time, acked after its work)."""
    work_ms: tuple[float, float]
    """Range of simulated work per message, milliseconds."""
    seed: int
    """Seed of the work times."""
    config: dict[str, Any]
    """BusConfig options."""


def _started(log: EventLog, msg: Message) -> str:
    """Log the start of a handler run; returns the message id."""
    mid, crc, data = [*msg.payload.split(b" ", 2), b"", b""][:3]
    ident = mid.decode(errors="replace") or "?"
    log.write("start", msg.queue, ident, msg.delivery_count, msg.topic, f"{time.monotonic():.6f}")
    if not check_payload(data, crc.decode(errors="replace")):
        log.write("bad", msg.queue, ident)
    return ident


def queue_consumer(job: QueueConsumerJob, ready: Any, stop: str) -> None:
    """Consume queue ``job.queue`` until the ``stop`` file exists (or the process is killed)."""
    rng = random.Random(job.seed ^ os.getpid())
    log = EventLog(job.log)
    lo, hi = job.work_ms
    if job.face == "blocking":
        with (
            BlockingBus(job.root, config=BusConfig(**job.config)) as bus,
            bus.messages(queue=job.queue) as it,
        ):
            ready.set()
            while not os.path.exists(stop):
                try:
                    msg = it.get(timeout=0.1)
                except TimeoutError:
                    continue
                mid = _started(log, msg)
                time.sleep(rng.uniform(lo, hi) / 1000)
                log.write("done", job.queue, mid, msg.delivery_count)
                it.ack(msg)
        log.close()
        return

    async def handle(msg: Message) -> None:
        mid = _started(log, msg)
        await anyio.sleep(rng.uniform(lo, hi) / 1000)
        log.write("done", job.queue, mid, msg.delivery_count)

    async def main() -> None:
        async with Bus(job.root, config=BusConfig(**job.config)) as bus:
            await bus.subscribe(None, handle, queue=job.queue)
            ready.set()
            await wait_for_file(stop)

    anyio.run(main)
    log.close()


# ---------------------------------------------------------------- the driver
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
    cfg: dict[str, Any] = {
        "retry_interval": 0.2,
        "handler_concurrency": sz.concurrency,
        **(config or {}),
    }
    summary = Summary("queues", size, notes={"seed": seed})
    with workdir(roots) as (wd, buses):
        logs = wd / "logs"
        logs.mkdir()
        with BlockingBus(buses[0], config=BusConfig(**cfg)) as admin:
            for name, bindings in QUEUES.items():
                admin.declare_queue(name, list(bindings))
            _Run(summary, sz, random.Random(seed), cfg, buses, logs, admin).drive(wd / "stop")
    return summary


class _Run:
    """One run: its processes, kills and the late binding, then the count."""

    def __init__(
        self,
        summary: Summary,
        sz: QueuesSize,
        rng: random.Random,
        cfg: dict[str, Any],
        buses: list[str],
        logs: Path,
        admin: BlockingBus,
    ) -> None:
        self.summary, self.sz, self.rng, self.cfg = summary, sz, rng, cfg
        self.buses, self.logs, self.admin = buses, logs, admin
        self.ctx = spawn()
        self.slots = [(q, i) for q in QUEUES for i in range(sz.consumers)]
        self.consumers: dict[tuple[str, int], Any] = {}
        self.stems: dict[tuple[str, int], str] = {}
        self.starting: dict[tuple[str, int], Any] = {}  # slot -> ready event not yet seen set
        self.generation: Counter[tuple[str, int]] = Counter()
        self.kills: dict[str, list[float]] = defaultdict(list)  # queue -> times of kills
        self.bind: tuple[float, float] | None = None  # (before, after) the late bind_queue
        self.stop = ""

    def start_consumer(self, slot: tuple[str, int]) -> None:
        """Start the consumer of ``slot`` (queue, index); it is up once its event is set."""
        q, i = slot
        self.stems[slot] = f"c-{q}-{i}-{self.generation[slot]}"
        ready = self.ctx.Event()
        job = QueueConsumerJob(
            root=self.buses[(i + self.generation[slot]) % len(self.buses)],
            log=str(self.logs / f"{self.stems[slot]}.log"),
            queue=q,
            face="blocking" if i % 2 else "async",
            work_ms=self.sz.work_ms,
            seed=self.rng.randrange(1 << 30),
            config=self.cfg,
        )
        p = self.ctx.Process(target=queue_consumer, args=(job, ready, self.stop))
        p.start()
        self.consumers[slot] = p
        self.starting[slot] = ready

    def up(self, timeout: float = 0.0) -> bool:
        """Whether every consumer has started (waiting up to ``timeout`` for the rest).

        A consumer is only killed once its ready event was seen set: killed inside
        ``Event.set`` it would leave the event's lock held (see ``wait_for_file``).
        """
        for slot, ready in list(self.starting.items()):
            if ready.wait(timeout):
                del self.starting[slot]
        return not self.starting

    def drained(self) -> bool:
        """Whether every queue is empty (nothing waiting, nothing held)."""
        return all(self.admin.queue_info(q).depth == 0 for q in QUEUES)

    def drive(self, stop: Path) -> None:
        """Run everything, count, check the queues are empty and unused."""
        sz, rng, summary = self.sz, self.rng, self.summary
        self.stop = str(stop)
        pubs: list[Any] = []
        sent: dict[str, tuple[str, bool, float, float]] = {}
        try:
            for s in self.slots:
                self.start_consumer(s)
            if not self.up(60):
                summary.violations.append("a consumer did not start within 60 s")
                return
            jobs = [
                QueuePublishJob(
                    root=self.buses[(i + 1) % len(self.buses)],
                    log=str(self.logs / f"pub{i}.log"),
                    prefix=f"p{i}-",
                    topics=tuple(
                        (random_queue_topic(rng), rng.random() < 0.5)
                        for _ in range(sz.per_publisher)
                    ),
                    seed=rng.randrange(1 << 30),
                    max_size=sz.max_size,
                    face="async" if i % 2 else "blocking",
                    config=self.cfg,
                    gate=str(self.logs / "bound"),
                )
                for i in range(sz.publishers)
            ]
            t0 = time.monotonic()
            deadline = t0 + sz.timeout
            pubs = [self.ctx.Process(target=queue_publisher, args=(j,)) for j in jobs]
            for p in pubs:
                p.start()
            self.chaos(pubs, deadline)
            for p in pubs:
                p.join(max(1.0, deadline - time.monotonic()))
                if p.exitcode != 0:
                    summary.violations.append(f"publisher exited with {p.exitcode}")
            sent = _sent(self.logs)
            expected, maybe = _expected(sent, self.bind)

            def finished() -> bool:
                handled = {
                    (f[1], f[2])
                    for _, f in read_events(self.logs.glob("c-*.log"))
                    if f[0] == "done"
                }
                return expected <= handled and self.drained()

            wait_until(finished, timeout=max(1.0, deadline - time.monotonic()), step=0.2)
            summary.seconds = time.monotonic() - t0
            if not self.up(60):
                summary.violations.append("a replacement consumer did not start within 60 s")
            time.sleep(0.5)  # bounded grace period for a late duplicate to show
        finally:
            stop.touch()
            for p in [*pubs, *self.consumers.values()]:
                p.join(30)
                if p.is_alive():
                    p.kill()
                    summary.violations.append("a child did not stop within 30 s")
        summary.sent = len(sent)
        summary.notes["kills"] = sum(len(v) for v in self.kills.values())
        summary.notes["single"] = sum(1 for _, s, _, _ in sent.values() if s)
        summary.notes["unrouted"] = sum(
            1 for m in sent if not any((q, m) in expected or (q, m) in maybe for q in QUEUES)
        )
        _count(summary, self.logs, sent, expected, maybe, self.kills)
        for q in QUEUES:
            info = self.admin.queue_info(q)
            if info.depth:
                summary.violations.append(f"queue {q} holds {info.depth} message(s) at the end")
            if info.consumers:
                summary.violations.append(
                    f"queue {q} lists {info.consumers} consumer(s) at the end"
                )
        if LATE[1] not in self.admin.queue_info(LATE[0]).bindings:
            summary.violations.append(f"{LATE[1]} is not among the bindings of {LATE[0]}")

    def chaos(self, pubs: list[Any], deadline: float) -> None:
        """Bind the late pattern halfway through; SIGKILL busy consumers and replace them."""
        halfway = self.sz.publishers * (self.sz.per_publisher // 2)
        kills_left = self.sz.kills
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(0.02, 0.15))
            if self.bind is None and _published(self.logs) >= halfway:
                # every publisher waits at its halfway gate until this is done
                before = time.monotonic()
                self.admin.bind_queue(*LATE)
                self.bind = (before, time.monotonic())
                (self.logs / "bound").touch()
            if kills_left:
                self.up()
                busy = [
                    s
                    for s in self.slots
                    if s not in self.starting and _busy(self.logs / f"{self.stems[s]}.log")
                ]
                if busy:
                    slot = self.rng.choice(busy)  # a consumer in the middle of a handler
                    self.kills[slot[0]].append(time.monotonic())
                    self.consumers[slot].kill()
                    self.consumers[slot].join()
                    kills_left -= 1
                    self.generation[slot] += 1
                    self.start_consumer(slot)  # not waited for: the run goes on meanwhile
            if self.bind is not None and (
                not kills_left or (all(not p.is_alive() for p in pubs) and self.drained())
            ):
                return


def _published(logs: Path) -> int:
    """Messages published so far."""
    return sum(1 for _, f in read_events(logs.glob("pub*.log")) if f[0] == "pub")


def _busy(log: Path) -> bool:
    """Whether the consumer has a handler running (more starts than ends in its log)."""
    starts = ends = 0
    for _, f in read_events([log]):
        if f[0] == "start":
            starts += 1
        elif f[0] == "done":
            ends += 1
    return starts > ends


def _sent(logs: Path) -> dict[str, tuple[str, bool, float, float]]:
    """id -> (topic, single, time before publish, time after) of every message published."""
    return {
        f[1]: (f[2], f[3] == "s", float(f[4]), float(f[5]))
        for _, f in read_events(sorted(logs.glob("pub*.log")))
        if f[0] == "pub"
    }


def _expected(
    sent: dict[str, tuple[str, bool, float, float]], bind: tuple[float, float] | None
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The (queue, id) pairs that must be handled, and those that may be (their publish
    overlapped the late ``bind_queue``)."""
    must: set[tuple[str, str]] = set()
    maybe: set[tuple[str, str]] = set()
    for mid, (topic, _, before, after) in sent.items():
        for q in expected_queues(topic):
            must.add((q, mid))
        q, pattern = LATE
        if (q, mid) in must or bind is None or not matches(pattern, topic) or after <= bind[0]:
            continue
        if before >= bind[1]:
            must.add((q, mid))
        else:
            maybe.add((q, mid))
    return must, maybe


def _count(
    summary: Summary,
    logs: Path,
    sent: dict[str, tuple[str, bool, float, float]],
    expected: set[tuple[str, str]],
    maybe: set[tuple[str, str]],
    kills: dict[str, list[float]],
) -> None:
    """Count per queue from the consumers' logs (see the module docstring)."""
    starts: dict[tuple[str, str, str], tuple[int, float]] = {}  # (queue, id, stem) -> (dc, t)
    runs: dict[tuple[str, str], list[tuple[float, int, str]]] = defaultdict(list)
    wrong: Counter[str] = Counter()
    redelivered = unexplained = 0

    def after_kill(queue: str, t: float) -> bool:
        return any(k < t for k in kills[queue])

    for stem, f in read_events(logs.glob("c-*.log")):
        queue = stem.split("-")[1]
        if f[0] == "start":
            q, mid, dc, topic, t = f[1], f[2], int(f[3]), f[4], float(f[5])
            starts[(queue, mid, stem)] = (dc, t)
            if q != queue:
                wrong["message of another queue"] += 1
            elif mid in sent and topic != sent[mid][0]:
                wrong["topic other than the one published"] += 1
            if dc > 1:
                redelivered += 1
                unexplained += not after_kill(queue, t)
        elif f[0] == "done":
            dc, t = starts.get((queue, f[2], stem), (0, 0.0))
            runs[(queue, f[2])].append((t, dc, stem))
        elif f[0] == "bad":
            wrong["payload failing its checksum"] += 1
    for what, n in sorted(wrong.items()):
        summary.violations.append(f"{n} handler run(s) saw a {what}")
    if unexplained:
        summary.violations.append(
            f"{unexplained} redelivery(ies) (delivery_count > 1) before any consumer of "
            "their queue was killed"
        )
    stray = sorted({(q, m) for q, m, _ in starts} - expected - maybe)
    if stray:
        summary.violations.append(
            f"{len(stray)} message(s) handled in a queue whose bindings do not match their "
            f"topic (or never published), e.g. "
            + ", ".join(f"{m} in {q} ({sent[m][0] if m in sent else '?'})" for q, m in stray[:5])
        )
    for key in expected:
        if runs.get(key):
            summary.delivered += 1
        else:
            summary.lost += 1
    allowed = 0
    twice: list[str] = []
    for (q, mid), got in runs.items():
        for t, dc, stem in sorted(got)[1:]:
            # another run after the first: only a redelivery after a kill may do that
            if dc > 1 and after_kill(q, t):
                allowed += 1
            else:
                summary.duplicates += 1
                twice.append(f"{mid} in {q} by {stem} (delivery_count {dc})")
    if twice:
        summary.violations.append(f"handled again without a kill: {', '.join(twice[:5])}")
    summary.notes["expected"] = len(expected)
    summary.notes["after_bind"] = sum(
        1 for q, m in expected if q == LATE[0] and not matches_any(QUEUES[q], sent[m][0])
    )
    summary.notes["during_bind"] = len(maybe)
    summary.notes["during_bind_routed"] = sum(1 for k in maybe if runs.get(k))
    summary.notes["redelivered"] = redelivered
    summary.notes["dup_after_kill"] = allowed
    for q in QUEUES:
        summary.notes[f"q_{q}"] = sum(1 for k in expected if k[0] == q)


def main(argv: list[str] | None = None) -> int:
    """``python -m stress.queues [--size small|large]``."""
    return main_for("queues", run, argv)


if __name__ == "__main__":
    sys.exit(main())
