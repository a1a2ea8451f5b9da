"""What is measured: the scenarios, their sizes, and the plans (full, quick, tiny)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal[
    "publish",  # one process publishes `count` messages; messages/s
    "publish_durable",  # the same, each message on stable storage before publish returns
    "fanout",  # 1 publisher, `consumers` subscriber processes each get every message; end to end
    "workqueue",  # 1 publisher, `consumers` worker processes share the messages; end to end
    "latency",  # ping process publishes, echo process re-publishes; round trip, one at a time
    "latency_single",  # the same with work-queue (single) messages both ways
    "match",  # topic matching against `bindings` wildcard bindings; topics matched per second
    "append",  # append records to a log (raw file, fsbus Streams, Redis list)
    "append_durable",  # the same, flushed to stable storage every batch
    "read",  # read back what `append` wrote
    "inprocess",  # one process, one event loop: subscribed, publishes `count` multi, 50 in flight
    "inprocess_single",  # the same with work-queue (single) messages and one consumer
    "latency_inprocess",  # one process: ping and echo on one event loop; round trip
]

IN_FLIGHT = 50
"""Publishes in flight in the in-process scenarios."""


@dataclass(frozen=True)
class Scenario:
    """One measurement, run for every system that supports it."""

    kind: Kind
    """What is measured (see :data:`Kind`)."""
    count: int
    """Messages (or records, or probes, or topics) per round."""
    payload: int = 100
    """Payload bytes."""
    consumers: int = 0
    """Subscriber or worker processes (fan-out and work queue)."""
    bindings: int = 0
    """Wildcard bindings (match)."""

    @property
    def key(self) -> str:
        """A stable identifier: ``fanout-4-100B``."""
        parts = [self.kind]
        if self.consumers:
            parts.append(f"{self.consumers}")
        if self.bindings:
            parts.append(f"{self.bindings // 1000}k")
        if self.kind != "match":
            parts.append(_size(self.payload))
        return "-".join(parts)

    @property
    def title(self) -> str:
        """A human label for tables and plots."""
        base = {
            "publish": "publish",
            "publish_durable": "publish, durable",
            "fanout": f"fan-out to {self.consumers} sub",
            "workqueue": f"work queue, {self.consumers} worker{'s' if self.consumers > 1 else ''}",
            "latency": "round trip",
            "latency_single": "round trip, work queue",
            "match": f"match, {self.bindings:,} bindings",
            "append": "append",
            "append_durable": "append, durable",
            "read": "read",
            "inprocess": "in process, pub/sub",
            "inprocess_single": "in process, work queue",
            "latency_inprocess": "round trip, in process",
        }[self.kind]
        return base if self.kind == "match" else f"{base} {_size(self.payload)}"

    @property
    def unit(self) -> str:
        """What the figure counts."""
        if self.kind in LATENCY_KINDS:
            return "ms"
        if self.kind == "match":
            return "topics/s"
        return "msg/s"


LATENCY_KINDS = ("latency", "latency_single", "latency_inprocess")


def _size(n: int) -> str:
    return f"{n // 1000}KB" if n >= 1000 else f"{n}B"


@dataclass(frozen=True)
class Plan:
    """A whole run: which scenarios, how many rounds."""

    name: str
    """full, quick or tiny."""
    scenarios: tuple[Scenario, ...]
    """In the order they run."""
    rounds: int
    """A/B rounds: every system runs once per round, interleaved, and the median is kept."""
    filesystems: tuple[str, ...] = ("disk", "ext4loop", "tmpfs")
    """Default filesystems."""
    timeout: float = 120.0
    """Seconds one measurement may take before it is recorded as failed."""
    notes: tuple[str, ...] = field(default=())
    """Shown under the table."""
    suites: tuple[tuple[str, int, int], ...] = field(default=())
    """Suites beside the harness (bench/bench_<name>.py): (name, records, rounds)."""


FULL = Plan(
    "full",
    (
        Scenario("publish", 10_000, 100),
        Scenario("publish_durable", 1_000, 100),
        Scenario("fanout", 10_000, 100, consumers=1),
        Scenario("fanout", 10_000, 100, consumers=4),
        Scenario("workqueue", 10_000, 100, consumers=1),
        Scenario("workqueue", 10_000, 100, consumers=4),
        Scenario("latency", 300, 100),
        Scenario("latency_single", 300, 100),
        Scenario("inprocess", 10_000, 100),
        Scenario("inprocess_single", 10_000, 100),
        Scenario("latency_inprocess", 300, 100),
        Scenario("append", 100_000, 100),
        Scenario("append_durable", 100_000, 100),
        Scenario("read", 100_000, 100),
        Scenario("publish", 5_000, 10_000),
        Scenario("fanout", 5_000, 10_000, consumers=1),
        Scenario("workqueue", 5_000, 10_000, consumers=4),
        Scenario("append", 20_000, 10_000),
        Scenario("read", 20_000, 10_000),
        Scenario("match", 100_000, bindings=10_000),
    ),
    rounds=3,
    suites=(("streams", 200_000, 3), ("async", 20_000, 5), ("spark", 200_000, 2)),
)
QUICK = Plan(
    "quick",
    (
        # 5,000 publishes (50-150 ms for fsbus): 2,000 took 20-50 ms, within reach of one
        # scheduler hiccup; more makes the slow peers (persist-queue on a disk: 1-3 k/s) long
        Scenario("publish", 5000, 100),
        Scenario("fanout", 1000, 100, consumers=1),
        Scenario("fanout", 1000, 100, consumers=4),
        Scenario("workqueue", 1000, 100, consumers=1),
        Scenario("workqueue", 1000, 100, consumers=4),
        Scenario("append", 20_000, 100),
        Scenario("latency", 50, 100),
        Scenario("latency_single", 30, 100),
        Scenario("inprocess", 5000, 100),
        Scenario("inprocess_single", 5000, 100),
        Scenario("latency_inprocess", 50, 100),
        Scenario("match", 50_000, bindings=10_000),
    ),
    rounds=2,
    filesystems=("disk", "tmpfs"),
    timeout=30.0,
)
TINY = Plan(
    "tiny",
    (
        Scenario("publish", 50, 100),
        Scenario("fanout", 50, 100, consumers=1),
        Scenario("workqueue", 50, 100, consumers=1),
        Scenario("latency", 5, 100),
        Scenario("inprocess", 50, 100),
        Scenario("inprocess_single", 50, 100),
        Scenario("latency_inprocess", 5, 100),
    ),
    rounds=1,
    filesystems=("disk",),
    timeout=60.0,
)
PLANS = {p.name: p for p in (FULL, QUICK, TINY)}


def match_data(bindings: int, topics: int, *, seed: int = 6) -> dict[str, list[str]]:
    """Deterministic wildcard bindings and topics for the ``match`` scenario.

    Topics have 2-6 words from a 30-word vocabulary per position; bindings are such topics
    with about one word in eight replaced by ``*`` and one in thirty-two by ``#``; each
    topic matches some tens of bindings.
    """
    import random

    rnd = random.Random(seed)
    vocab = [f"w{i}" for i in range(30)]

    def topic() -> list[str]:
        return [rnd.choice(vocab) for _ in range(rnd.randint(2, 6))]

    out_b = []
    for _ in range(bindings):
        words = topic()
        for j in range(len(words)):
            x = rnd.random()
            if x < 1 / 32:
                words[j] = "#"
            elif x < 1 / 32 + 1 / 8:
                words[j] = "*"
        out_b.append(".".join(words))
    return {"bindings": out_b, "topics": [".".join(topic()) for _ in range(topics)]}
