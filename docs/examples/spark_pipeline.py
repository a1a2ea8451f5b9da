"""Example pipeline: services publish on the bus, a Spark streaming job counts every event once.

    python docs/examples/spark_pipeline.py [--root DIR] [--scale N] [--interval SECONDS]
    make spark-demo

1. A Spark Structured Streaming job reads every message published on ``events.#`` with
   ``readStream.format("fsbus").option("pattern", "events.#")``, and every second
   (processing-time trigger) counts events and sums their latency per service, kind
   (the topic is ``events.<service>.<kind>``) and 5-second window of the events' own
   time, with a watermark. Each closed window goes to the Stream ``event-counts``
   through the fsbus sink, exactly once.
2. Three services, each a process of its own, publish events with the async Bus API
   (``await bus.publish("events.<service>.<kind>", ...)``) until they are told to stop,
   then report how many events of each kind they published in each window.
3. Midway the query is stopped while the services keep publishing, then started again
   on the same checkpoint: what was published meanwhile waits in the query's durable
   queue and is counted after the restart.
4. Once the services have stopped and the query has taken in all they published, one
   more event, timed past every window, moves the watermark so the last windows close
   (in a live pipeline later events do that). The demo waits until Spark has counted
   what the services reported, stops the query, and compares window by window: every
   published event must be counted exactly once. It exits with status 1 otherwise.

The same script runs one service: ``spark_pipeline.py service --root DIR --name NAME``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICES = ("checkout", "payments", "search")
KINDS = ("ok", "slow", "error")
PATTERN = "events.#"
QUEUE = "spark-event-counts"  # the query's durable queue (option "queue")
COUNTS = "event-counts"  # the Stream the query writes closed windows to
TRIGGER = "1 second"
WINDOW = 5  # seconds of event time per window
LATENESS = 30  # seconds: the watermark's delay (an event this late would be dropped)
TIMEOUT = 180.0  # seconds any one step may take before the demo gives up


# --- a service: its own process, publishing with the async Bus API --------------------


def event(service: str, seq: int) -> tuple[str, int]:
    """The kind and latency (ms) of a service's ``seq``-th event (deterministic)."""
    latency = 20 + (seq * 37 + len(service) * 11) % 180
    kind = "error" if seq % 11 == 5 else "slow" if latency > 150 else "ok"
    return kind, latency


def say(**what: Any) -> None:
    sys.stdout.write(json.dumps(what) + "\n")
    sys.stdout.flush()


async def run_service(root: str, name: str, interval: float, report_every: int) -> None:
    """Publish ``events.<name>.<kind>`` every ``interval`` seconds until SIGTERM or
    SIGINT, then report the count and latency total of each kind and window.

    The signal only ends the loop: a publish is never cancelled half way (a cancelled
    publish may still have happened, and the report would be off by one)."""
    import anyio

    from fsbus import Bus

    counts: dict[tuple[str, int], list[int]] = {}  # (kind, window) -> [events, latency]
    stop = anyio.Event()

    async def on_signal(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for _ in signals:
                stop.set()
                return

    seq = 0
    async with Bus(root) as bus, anyio.create_task_group() as tg:
        await tg.start(on_signal)
        say(ready=True)
        while not stop.is_set():
            kind, latency = event(name, seq)
            ts_ms = time.time_ns() // 1_000_000
            body = {"seq": seq, "ts_ms": ts_ms, "latency_ms": latency}
            await bus.publish(f"events.{name}.{kind}", json.dumps(body))
            window = ts_ms // (WINDOW * 1000) * WINDOW * 1000
            total = counts.setdefault((kind, window), [0, 0])
            total[0] += 1
            total[1] += latency
            seq += 1
            if seq % report_every == 0:
                say(published=seq)
            with anyio.move_on_after(interval):
                await stop.wait()
        tg.cancel_scope.cancel()
    say(published=seq, done=[[kind, window, *c] for (kind, window), c in counts.items()])


# --- the Spark job ------------------------------------------------------------------


def spark_session(scratch: Path) -> Any:
    """A local Spark for the example (Java 17 on PATH). Spark finds ``format("fsbus")`` on
    its own (the ``pyspark_fsbus`` module fsbus installs); ``fsbus.spark.register(spark)``
    would do it explicitly."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("fsbus-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(scratch))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_query(spark: Any, root: Path, checkpoint: Path) -> Any:
    """Count events per service, kind and window; write each closed window to
    ``event-counts``."""
    from pyspark.sql import functions as F

    from fsbus.spark import value_as_json

    events = (
        spark.readStream.format("fsbus")
        .option("path", str(root))
        .option("pattern", PATTERN)
        .option("queue", QUEUE)
        .load()
    )
    topic = F.split("topic", r"\.")
    windows = (
        events.select(
            topic.getItem(1).alias("service"),
            topic.getItem(2).alias("kind"),
            value_as_json("ts_ms long, latency_ms long", column="payload", alias="e"),
        )
        .select("service", "kind", F.timestamp_millis("e.ts_ms").alias("time"), "e.latency_ms")
        .withWatermark("time", f"{LATENESS} seconds")
        .groupBy(F.window("time", f"{WINDOW} seconds"), "service", "kind")
        .agg(F.count("*").alias("events"), F.sum("latency_ms").alias("latency_ms"))
    )
    return (
        windows.select(
            F.concat_ws(".", "service", "kind").alias("key"),
            F.to_json(
                F.struct(
                    "service",
                    "kind",
                    F.unix_millis("window.start").alias("window"),
                    "events",
                    "latency_ms",
                )
            ).alias("value"),
        )
        .writeStream.format("fsbus")
        .option("path", str(root))
        .option("stream", COUNTS)
        .option("checkpointLocation", str(checkpoint))
        .outputMode("append")  # a window is written once, when the watermark closes it
        .trigger(processingTime=TRIGGER)
        .queryName("event-counts")
        .start()
    )


Key = tuple[str, str, int]
"""(service, kind, window start in ms since the epoch)"""


def counted(root: Path) -> dict[Key, list[int]]:
    """Key -> [events, latency total, rows]: what the query wrote to ``event-counts``
    (read with plain fsbus). ``rows`` is how many times it wrote that window: 1."""
    from fsbus import Stream, StreamNotFound

    out: dict[Key, list[int]] = {}
    try:
        stream = Stream.open(root, COUNTS, create=False)
    except StreamNotFound:
        return out
    with stream:
        for record in stream.read():
            row = json.loads(record.value)
            total = out.setdefault((row["service"], row["kind"], row["window"]), [0, 0, 0])
            total[0] += row["events"]
            total[1] += row["latency_ms"]
            total[2] += 1
    return out


def queue_depth(root: Path) -> int | None:
    """Messages waiting in the query's queue; None before the query declared it."""
    from fsbus import BlockingBus, QueueNotFound

    with BlockingBus(root) as bus:
        try:
            return bus.queue_info(QUEUE).depth
        except QueueNotFound:
            return None


# --- the demo: processes, a stop and restart, the comparison ------------------------


@dataclass
class Service:
    """One service process and what it said."""

    name: str
    proc: subprocess.Popen[bytes]
    published: int = 0
    """Events published so far (as last reported)."""
    report: list[list[Any]] | None = None
    """Its final report: [kind, window, events, latency total] for each window."""
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None
    """The thread reading its stdout."""


@dataclass
class Result:
    """What a run of the pipeline saw."""

    published: dict[Key, list[int]]
    """Key -> [events, latency total, 1], as the services reported."""
    counted: dict[Key, list[int]]
    """The same, as the Spark job counted."""
    while_stopped: int
    """Events published while the query was stopped."""
    phases: list[str]
    """One line per step, with the time it took."""

    @property
    def exact(self) -> bool:
        return self.published == self.counted

    def totals(self, which: dict[Key, list[int]]) -> dict[tuple[str, str], list[int]]:
        """(service, kind) -> [events, latency total, windows]."""
        out: dict[tuple[str, str], list[int]] = {}
        for (service, kind, _), (n, ms, _rows) in which.items():
            total = out.setdefault((service, kind), [0, 0, 0])
            total[0] += n
            total[1] += ms
            total[2] += 1
        return out


def start_service(root: Path, name: str, interval: float, report_every: int) -> Service:
    cmd = [sys.executable, os.path.abspath(__file__), "service", "--root", str(root)]
    cmd += ["--name", name, "--interval", str(interval), "--report-every", str(report_every)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    service = Service(name, proc)

    def listen() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                said = json.loads(line)
                service.published = said.get("published", service.published)
                service.report = said.get("done", service.report)
                if said.get("ready"):
                    service.ready.set()

    service.reader = threading.Thread(target=listen, name=f"{name}-stdout", daemon=True)
    service.reader.start()
    return service


def wait_for(what: str, condition: Callable[[], bool], services: list[Service], query: Any) -> None:
    """Poll ``condition`` until it holds; fail after TIMEOUT seconds, or at once if a
    service died or the query failed."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        for s in services:
            if s.proc.poll() not in (None, 0):
                raise RuntimeError(f"service {s.name} exited with {s.proc.returncode}")
        if query is not None and query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {TIMEOUT:.0f} s waiting until {what}")
        time.sleep(0.1)


def run_pipeline(
    spark: Any,
    root: Path,
    work: Path,
    *,
    scale: int = 2000,
    interval: float = 0.02,
    report: Callable[[str], None] = print,
) -> Result:
    """Run the pipeline. ``scale`` events are published before the stop, while the query
    is stopped, and after the restart (at least; the services do not pause)."""
    checkpoint = work / "checkpoint"
    phases: list[str] = []
    t0 = last = time.monotonic()

    def phase(text: str) -> None:
        nonlocal last
        now = time.monotonic()
        phases.append(f"{now - t0:5.1f} s  {text} ({now - last:.1f} s)")
        last = now
        report(phases[-1])

    def published() -> int:
        return sum(s.published for s in services)

    def counted_events() -> int:
        return sum(n for n, _, _ in counted(root).values())

    def wait(what: str, condition: Callable[[], bool]) -> None:
        wait_for(what, condition, services, query)

    services: list[Service] = []
    query = start_query(spark, root, checkpoint)
    try:
        # Its first micro-batch declares the queue: from then on nothing published is lost.
        wait("the query declared its queue", lambda: queue_depth(root) is not None)
        phase(f"query started; its queue {QUEUE!r} collects {PATTERN!r}")
        services += [start_service(root, s, interval, max(1, scale // 100)) for s in SERVICES]
        wait("the services are up", lambda: all(s.ready.is_set() for s in services))
        phase(f"{len(services)} service processes publishing")

        wait(f"the query read {scale} events", lambda: read(query) >= scale)
        query.stop()
        at_stop = published()
        phase(f"{read(query)} events read by the query; query stopped")
        wait(f"{scale} more events are published", lambda: published() >= at_stop + scale)
        at_restart = published()
        query = start_query(spark, root, checkpoint)
        phase(f"{at_restart - at_stop} events published while stopped; query restarted")
        wait(
            f"the query read {scale} events more than were published before the restart",
            lambda: read(query) >= at_restart - at_stop + scale,
        )
        phase(f"{read(query)} events read since the restart, {counted_events()} in closed windows")
        for s in services:
            s.proc.send_signal(signal.SIGTERM)
        wait("the services reported", lambda: all(s.report is not None for s in services))
        want = {
            (s.name, kind, window): [n, ms, 1]
            for s in services
            for kind, window, n, ms in s.report or ()
        }
        phase(f"services stopped after publishing {sum(n for n, _, _ in want.values())} events")

        # Once the queue is empty the query has taken in every event; the next one,
        # timed past every window, closes them all (its own window stays open).
        wait("the query took in every event", lambda: queue_depth(root) == 0)
        last_window = max((w for _, _, w in want), default=0)
        publish_tick(root, "events.clock.tick", last_window + (WINDOW + LATENESS) * 1000)
        total = sum(n for n, _, _ in want.values())
        wait("every window is counted", lambda: counted_events() >= total)
        query.stop()
        phase("every window counted; query stopped")
    finally:
        query.stop()
        for s in services:
            if s.proc.poll() is None:
                s.proc.kill()
            s.proc.wait()
            if s.reader is not None:
                s.reader.join(30)
    return Result(want, counted(root), at_restart - at_stop, phases)


def read(query: Any) -> int:
    """Rows the query read, over its recent micro-batches (enough for this demo)."""
    return sum(p["numInputRows"] for p in query.recentProgress)


def publish_tick(root: Path, topic: str, ts_ms: int) -> None:
    """Publish one event timed ``ts_ms`` (with the async Bus API, as the services do)."""
    import anyio

    from fsbus import Bus

    async def publish() -> None:
        async with Bus(root) as bus:
            await bus.publish(topic, json.dumps({"seq": 0, "ts_ms": ts_ms, "latency_ms": 0}))

    anyio.run(publish)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, help="an empty bus directory (default: a temporary one)"
    )
    parser.add_argument("--scale", type=int, default=2000, help="events per phase (2000)")
    parser.add_argument(
        "--interval", type=float, default=0.02, help="seconds between a service's events"
    )
    sub = parser.add_subparsers(dest="command")
    svc = sub.add_parser("service", help="run one service (the demo starts three)")
    svc.add_argument("--root", type=Path, required=True)
    svc.add_argument("--name", required=True)
    svc.add_argument("--interval", type=float, default=0.01)
    svc.add_argument("--report-every", type=int, default=10)
    args = parser.parse_args(argv)
    if args.command == "service":
        import anyio

        anyio.run(run_service, str(args.root), args.name, args.interval, args.report_every)
        return 0

    # PySpark warns about pandas >= 3 on its first Arrow conversion; nothing here uses pandas.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fsbus-pipeline-") as tmp:
        root = args.root or Path(tmp) / "bus"
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):  # an earlier run's counts and queue would be counted too
            parser.error(f"--root {root} is not empty")
        (Path(tmp) / "spark").mkdir()
        print(f"bus: {root}")
        spark = spark_session(Path(tmp) / "spark")
        try:
            result = run_pipeline(spark, root, Path(tmp), scale=args.scale, interval=args.interval)
        finally:
            spark.stop()
    published, counts = result.totals(result.published), result.totals(result.counted)
    print(
        f"{'service':<9} {'kind':<5} {'published':>9} {'counted':>8} {'windows':>7} {'avg ms':>7}"
    )
    for key in sorted(published.keys() | counts.keys()):
        n = published.get(key, [0])[0]
        c = counts.get(key, [0, 0, 0])
        print(f"{key[0]:<9} {key[1]:<5} {n:>9} {c[0]:>8} {c[2]:>7} {c[1] / max(c[0], 1):>7.1f}")
    total = sum(n for n, _, _ in result.published.values())
    if not result.exact:
        for window in sorted(result.published.keys() | result.counted.keys()):
            want, got = result.published.get(window), result.counted.get(window)
            if want != got:
                print(f"  {window}: published {want}, counted {got} ([events, latency, rows])")
        print(f"FAILED: the Spark job's counts differ from the {total} events published")
        return 1
    print(
        f"OK: all {total} events counted exactly once, window by window, "
        f"{result.while_stopped} of them published while the query was stopped "
        f"({time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
