"""Suites written beside the harness, run by it as scenarios: Streams, async and Spark.

``bench/bench_streams.py`` exposes ``bench_fs(base, n, n_peer, rounds)`` (Streams beside raw
appends of the same frames, persist-queue and queuelib, in one process),
``bench/bench_async.py`` exposes ``throughput(place, n, rounds)`` and ``loop_lag(place,
seconds, with_gc)`` (``await bus.publish`` beside ``BlockingBus.publish``, and the event
loop's lag on a mount that takes 10 ms a call) and ``bench/bench_spark.py`` exposes
``run(args)`` (the Spark connector beside Spark's text and JSON file sources). The harness
runs each in a child process (``python -m bench.suites NAME PARAMS_JSON``, answering one
``RESULT`` line) on each filesystem (Streams, async) or once (Spark, which keeps its
scratch under bench/scratch/), and puts their figures in the same results.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.child import result
from bench.procs import REPO, run_single


@dataclass(frozen=True)
class Suite:
    """A suite and how big to run it."""

    name: str
    """streams, async or spark."""
    records: int
    """Records per figure."""
    rounds: int
    """The suite's own rounds (it takes the median itself)."""
    per_fs: bool
    """Run on every filesystem (True) or once (False)."""


RATIOS = {
    # suite: (figure, reference figure) pairs worth a ratio column
    "streams": [
        ("append", "raw append"),
        ("append+fsync", "raw append+fsync"),
        ("read", "raw read"),
        ("append 1-by-1", "persist-queue put"),
        ("append 1-by-1", "queuelib push"),
    ],
    "async": [
        ("sequential await publish", "blocking publish"),
        ("50 in flight await publish", "blocking publish"),
    ],
    "spark": [
        (f"{op} {who}{mode}", f"{op} {ref}{mode}")
        for op, who, mode in (
            ("read", "fsbus", " (batch)"),
            ("read", "no-op Python source", " (batch)"),
            ("read", "fsbus", " (streaming)"),
            ("read", "no-op Python source", " (streaming)"),
            ("write", "fsbus", ""),
            ("write", "no-op Python sink", ""),
            ("write", "fsbus", " (streaming)"),
            ("write", "no-op Python sink", " (streaming)"),
        )
        for ref in ("text files", "json files")
    ],
}


LAG_SEQUENTIAL = "loop lag p99, ms: sequential, 10 ms a call"
LAG_CONCURRENT = "loop lag p99, ms: 50 in flight, 10 ms a call"

TARGETS = [
    # suite, what, figure, reference figure (None: the figure itself, in ms), need
    ("async", "await publish, one at a time ≥ 0.5x BlockingBus.publish",
     "sequential await publish", "blocking publish", 0.5),
    ("async", "await publish, 50 in flight ≥ 0.8x BlockingBus.publish",
     "50 in flight await publish", "blocking publish", 0.8),
    ("async", "Loop lag p99 ≤ 5 ms, a mount taking 10 ms a call, one at a time",
     LAG_SEQUENTIAL, None, 5.0),
    ("async", "Loop lag p99 ≤ 5 ms, a mount taking 10 ms a call, 50 in flight",
     LAG_CONCURRENT, None, 5.0),
]  # fmt: skip
"""The suites' targets, checked in the results' table (``bench.report.suite_targets``)."""


def unavailable(suite: Suite) -> str | None:
    """Why the suite cannot run here, or None."""
    module = REPO / "bench" / f"bench_{suite.name}.py"
    if not module.exists():
        return f"{module.name} is not there"
    if suite.name == "spark" and shutil.which("java") is None:
        return "Java 17 is needed for Spark (apt-get install -y openjdk-17-jre-headless)"
    return None


def run(suite: Suite, place: Path, *, timeout: float) -> dict[str, float]:
    """Run ``suite`` in a child process with its scratch under ``place``; its figures."""
    params = {"dir": str(place), "records": suite.records, "rounds": suite.rounds}
    cmd = [sys.executable, "-m", "bench.suites", suite.name, json.dumps(params)]
    res = run_single(cmd, timeout=timeout)
    return {k: float(v) for k, v in res["rates"].items()}


def _streams(p: dict[str, Any]) -> None:
    from bench.bench_streams import bench_fs

    rates = bench_fs(Path(p["dir"]), int(p["records"]), min(20_000, int(p["records"])),
                     int(p["rounds"]))  # fmt: skip
    result(rates={k: v for k, v in rates.items() if not k.endswith(" [cpu]")})


def _async(p: dict[str, Any]) -> None:
    from bench import bench_async
    from bench.filesystems import Scratch

    records = int(p["records"])
    place = Scratch("async", Path(p["dir"]), "")
    got = bench_async.throughput(place, records, int(p["rounds"]))
    # the lag phases: the full plan's 4 s each, shorter for smaller plans
    seconds = 4.0 if records >= 20_000 else 1.5 if records >= 2_000 else 0.3
    lag = bench_async.loop_lag(place, seconds, False)
    m = got["median"]
    result(
        rates={
            "blocking publish": m["blocking"],
            "sequential await publish": m["sequential"],
            "50 in flight await publish": m["concurrent"],
            LAG_SEQUENTIAL: lag["slow sequential"]["p99_ms"],
            LAG_CONCURRENT: lag["slow 50 in flight"]["p99_ms"],
        }
    )


def _spark(p: dict[str, Any]) -> None:
    from bench import bench_spark

    scratch = Path(tempfile.mkdtemp(prefix="spark-", dir=p["dir"]))
    try:
        t0 = time.monotonic()
        out = bench_spark.run(
            argparse.Namespace(
                records=int(p["records"]),
                size=100,
                rounds=int(p["rounds"]),
                scratch=scratch,
                only=None,
                latency_messages=500,
                latency_rate=50.0,
            )
        )
        result(rates=out["rates"], seconds=time.monotonic() - t0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    {"streams": _streams, "async": _async, "spark": _spark}[sys.argv[1]](json.loads(sys.argv[2]))
