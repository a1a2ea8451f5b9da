"""Example pipeline: services publish on the bus, a Spark job counts every event once.

    python docs/examples/spark_pipeline.py [--root DIR] [--scale N] [--interval SECONDS]
    make spark-demo

Five kinds of process, each started from this script:

1. **Services** (three processes) publish events with the async Bus API,
   ``await bus.publish("events.<service>.<kind>", ...)``, until SIGTERM; then they report
   how many events of each kind they published in each 5-second window.
2. **The Spark job** (its own process, with its own JVM) runs two streaming queries with a
   1-second processing-time trigger:
   - ``windows`` reads ``events.#`` with ``readStream.format("fsbus")``, counts events and
     sums their latency per service, kind and 5-second window of the events' own time
     (with a watermark), and writes each closed window to a Parquet table;
   - ``alerts`` follows that table (a file stream: only committed files) and publishes
     ``alerts.<service>.errors`` on the bus, through the fsbus sink, for every window with
     at least ``ALERT_ERRORS`` errors.
3. **A subscriber** receives ``alerts.#`` and prints every alert it gets.
4. **The demo** starts them all, and once the job has read ``--scale`` events and written
   its first windows it kills the job's whole process group with SIGKILL (the Python
   driver, its JVM and Python workers: what a crashed machine does). The services go on
   publishing; a new job on the same checkpoints takes in what waited in its durable queue.
5. Once the services have stopped and the job has taken in all they published, one more
   event, timed past every window, moves the watermark so the last windows close (in a
   live pipeline later events do that). The demo then compares the Parquet table and the
   alerts received with what the services published, window by window: every event counted
   exactly once, every alert received exactly once. It exits with status 1 otherwise.

``spark_pipeline.py service|job|alerts --root DIR ...`` runs one of those processes alone.
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
from urllib.parse import urlparse

SERVICES = ("checkout", "payments", "search")
KINDS = ("ok", "slow", "error")
QUEUE = "spark-events"  # the windows query's durable queue (option "queue")
TRIGGER = "1 second"
WINDOW = 5  # seconds of event time per window
LATENESS = 10  # seconds: the watermark's delay (an event this late would be dropped)
ALERT_ERRORS = 10  # errors in one window of one service that raise an alert
TIMEOUT = 300.0  # seconds any one step may take before the demo gives up (a bound, not a pace)
RESTARTS = 3  # times the job restarts a failed query from its checkpoint before it gives up


def say(**what: Any) -> None:
    """One line of JSON on stdout: how the processes tell the demo what they do."""
    sys.stdout.write(json.dumps(what) + "\n")
    sys.stdout.flush()


# --- a service: its own process, publishing with the async Bus API --------------------


def event(service: str, seq: int) -> tuple[str, int]:
    """The kind and latency (ms) of a service's ``seq``-th event (deterministic)."""
    latency = 20 + (seq * 37 + len(service) * 11) % 180
    kind = "error" if seq % 11 == 5 else "slow" if latency > 150 else "ok"
    return kind, latency


async def run_service(root: str, name: str, interval: float, report_every: int) -> None:
    """Publish ``events.<name>.<kind>`` every ``interval`` seconds until SIGTERM or
    SIGINT, then report the count and latency total of each kind and window.

    The signal only ends the loop: a publish is never cancelled half way (a cancelled
    publish may still have happened, and the report would be off by one)."""
    import anyio

    from fsbus import Bus

    counts: dict[tuple[str, int], list[int]] = {}  # (kind, window) -> [events, latency]
    stop = anyio.Event()
    seq = 0
    async with Bus(root) as bus, anyio.create_task_group() as tg:
        await tg.start(set_on_signal, stop)
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


async def set_on_signal(stop: Any, *, task_status: Any) -> None:
    """Set the event ``stop`` on SIGTERM or SIGINT."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            stop.set()
            return


# --- the alert subscriber: its own process -------------------------------------------


async def run_subscriber(root: str) -> None:
    """Print every message published on ``alerts.#`` until SIGTERM or SIGINT."""
    import anyio

    from fsbus import Bus

    async def receive(*, task_status: Any) -> None:
        async with bus.messages("alerts.#", existing=True) as alerts:
            task_status.started()
            async for msg in alerts:
                say(topic=msg.topic, alert=msg.json())

    stop = anyio.Event()
    async with Bus(root) as bus, anyio.create_task_group() as tg:
        await tg.start(set_on_signal, stop)
        await tg.start(receive)
        say(ready=True)
        await stop.wait()
        tg.cancel_scope.cancel()


# --- the Spark job: its own process --------------------------------------------------


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


WINDOWS_SCHEMA = "service string, kind string, window timestamp, events long, latency_ms long"
"""The Parquet table's columns: one row per service, kind and window (its start)."""


def start_windows(spark: Any, root: Path, table: Path, checkpoint: Path) -> Any:
    """Count events per service, kind and window; append each closed window to the
    Parquet table."""
    from pyspark.sql import functions as F

    from fsbus.spark import value_as_json

    events = (
        spark.readStream.format("fsbus")
        .option("path", str(root))
        .option("pattern", "events.#")
        .option("queue", QUEUE)
        .load()
    )
    topic = F.split("topic", r"\.")  # events.<service>.<kind>
    windows = (
        events.select(
            topic[1].alias("service"),
            topic[2].alias("kind"),
            value_as_json("ts_ms long, latency_ms long", column="payload", alias="e"),
        )
        .select("service", "kind", F.timestamp_millis("e.ts_ms").alias("time"), "e.latency_ms")
        .withWatermark("time", f"{LATENESS} seconds")
        .groupBy(F.window("time", f"{WINDOW} seconds"), "service", "kind")
        .agg(F.count("*").alias("events"), F.sum("latency_ms").alias("latency_ms"))
    )
    return (
        windows.select(
            "service", "kind", F.col("window.start").alias("window"), "events", "latency_ms"
        )
        .writeStream.format("parquet")
        .option("path", str(table))
        .option("checkpointLocation", str(checkpoint / "windows"))
        .outputMode("append")  # a window is written once, when the watermark closes it
        .trigger(processingTime=TRIGGER)
        .queryName("windows")
        .start()
    )


def start_alerts(spark: Any, root: Path, table: Path, checkpoint: Path) -> Any:
    """Publish ``alerts.<service>.errors`` for each window of the Parquet table with at
    least ALERT_ERRORS errors."""
    from pyspark.sql import functions as F

    windows = spark.readStream.schema(WINDOWS_SCHEMA).parquet(str(table))
    return (
        windows.where((F.col("kind") == "error") & (F.col("events") >= ALERT_ERRORS))
        .select(
            F.concat(F.lit("alerts."), "service", F.lit(".errors")).alias("topic"),
            F.to_json(
                F.struct(
                    "service",
                    F.unix_millis("window").alias("window"),
                    F.col("events").alias("errors"),
                )
            ).alias("value"),
        )
        .writeStream.format("fsbus")
        .option("path", str(root))  # published on the topic in the column "topic"
        .option("checkpointLocation", str(checkpoint / "alerts"))
        .trigger(processingTime=TRIGGER)
        .queryName("alerts")
        .start()
    )


def run_job(root: Path, table: Path, checkpoint: Path, scratch: Path) -> int:
    """Run both queries until SIGTERM, saying what each micro-batch read."""
    # PySpark warns about pandas >= 3 on its first Arrow conversion; nothing here uses pandas.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    table.mkdir(parents=True, exist_ok=True)  # the alerts query's file stream needs it
    spark = spark_session(scratch)
    starters = {"windows": start_windows, "alerts": start_alerts}
    queries = [begin(spark, root, table, checkpoint) for begin in starters.values()]
    seen = {q.name: -1 for q in queries}  # the last batch reported, per query
    restarts = dict.fromkeys(starters, 0)
    try:
        while not stop.wait(0.2):
            for i, q in enumerate(queries):
                if q.exception() is not None:
                    # What a supervisor does: a failed query starts again from its
                    # checkpoint, which keeps its output exactly once. On a busy machine
                    # Spark can fail to start a Python worker (it waits 10 s for one).
                    reason = str(q.exception()).strip().splitlines()[0][:500]
                    if restarts[q.name] == RESTARTS:
                        raise RuntimeError(f"query {q.name} failed: {q.exception()}")
                    restarts[q.name] += 1
                    say(restart=q.name, attempt=restarts[q.name], reason=reason)
                    q = queries[i] = starters[q.name](spark, root, table, checkpoint)
                for p in q.recentProgress:
                    if p["batchId"] > seen[q.name]:
                        seen[q.name] = p["batchId"]
                        say(query=q.name, batch=p["batchId"], rows=p["numInputRows"])
        for q in queries:
            q.stop()
    finally:
        spark.stop()
    return 0


# --- the demo: processes, a SIGKILL and restart, the comparison ----------------------


@dataclass
class Process:
    """A process the demo started, and what it said on stdout (one JSON object a line)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    """Its stderr."""
    said: list[dict[str, Any]] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    def last(self, key: str, default: Any = None) -> Any:
        """The last value it said for ``key``."""
        return next((s[key] for s in reversed(self.said) if key in s), default)

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts it received (for the subscriber)."""
        return [s["alert"] for s in self.said if "alert" in s]

    def stop(self) -> None:
        """SIGTERM it, and wait until it and its children (for the job: its JVM) exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(TIMEOUT)
        wait_for(f"the processes of {self.name} are gone", lambda: not group_alive(self), [])
        if self.reader is not None:
            self.reader.join(TIMEOUT)


def start(name: str, log: Path, *args: str) -> Process:
    """Run this script with ``args`` in a process (and process group) of its own; its
    stderr (for the job: Spark's log) goes to the file ``log``."""
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    with log.open("ab") as stderr:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
        )
    started = Process(name, proc, log)

    def listen() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                if line.startswith(b"{"):  # anything else is Spark talking
                    said = json.loads(line)
                    started.said.append(said)
                    if said.get("ready"):
                        started.ready.set()

    started.reader = threading.Thread(target=listen, name=f"{name}-stdout", daemon=True)
    started.reader.start()
    return started


def kill_group(p: Process) -> None:
    """SIGKILL the process and everything in its group (for the job: its JVM and Python
    workers), and wait until none of them runs any more."""
    os.killpg(p.proc.pid, signal.SIGKILL)
    p.stop()


def group_alive(p: Process) -> bool:
    """Whether a process of ``p``'s process group still runs (Linux)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(group) == p.proc.pid and state != "Z":
            return True
    return False


def wait_for(what: str, condition: Callable[[], bool], running: list[Process]) -> None:
    """Poll ``condition`` until it holds; fail after TIMEOUT seconds, or at once if one of
    the ``running`` processes exited."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        for p in running:
            if p.proc.poll() is not None:
                tail = p.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{p.name} exited with {p.proc.returncode}; its stderr:\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {TIMEOUT:.0f} s waiting until {what}")
        time.sleep(0.1)


Key = tuple[str, str, int]
"""(service, kind, window start in ms since the epoch)"""


def committed_files(table: Path) -> list[Path]:
    """The Parquet files Spark's file sink committed: those its log ``_spark_metadata``
    lists. A batch killed half way may have left other files behind; Spark's own readers
    skip them too."""
    log = table / "_spark_metadata"
    if not log.is_dir():
        return []
    entries = {int(p.name.split(".")[0]): p for p in log.iterdir() if p.name[0].isdigit()}
    # every 10th batch is written as "<batch>.compact", which lists all the files so far
    start = max((b for b, p in entries.items() if p.suffix == ".compact"), default=0)
    files: dict[str, bool] = {}
    for batch in sorted(b for b in entries if b >= start):
        for line in entries[batch].read_text().splitlines()[1:]:  # after the version line
            entry = json.loads(line)
            if entry["action"] == "add":
                files[entry["path"]] = True
            else:
                files.pop(entry["path"], None)
    return [Path(urlparse(path).path) for path in files]


def counted(table: Path) -> dict[Key, list[int]]:
    """Key -> [events, latency total, rows]: the Parquet table, read with pyarrow.
    ``rows`` is how many times the job wrote that window: 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out: dict[Key, list[int]] = {}
    for path in committed_files(table):
        rows = pq.read_table(path)
        rows = rows.set_column(
            rows.schema.get_field_index("window"),
            "window",
            rows["window"].cast(pa.timestamp("ms")).cast(pa.int64()),
        )
        for row in rows.to_pylist():
            key = (row["service"], row["kind"], row["window"])
            total = out.setdefault(key, [0, 0, 0])
            total[0] += row["events"]
            total[1] += row["latency_ms"]
            total[2] += 1
    return out


def queue_depth(root: Path) -> int | None:
    """Messages waiting in the windows query's queue; None before the query declared it."""
    from fsbus import BlockingBus, QueueNotFound

    with BlockingBus(root) as bus:
        try:
            return bus.queue_info(QUEUE).depth
        except QueueNotFound:
            return None


def publish_tick(root: Path, ts_ms: int) -> None:
    """Publish one event timed ``ts_ms`` (with the async Bus API, as the services do)."""
    import anyio

    from fsbus import Bus

    async def publish() -> None:
        async with Bus(root) as bus:
            body = {"seq": 0, "ts_ms": ts_ms, "latency_ms": 0}
            await bus.publish("events.clock.tick", json.dumps(body))

    anyio.run(publish)


@dataclass
class Result:
    """What a run of the pipeline saw."""

    published: dict[Key, list[int]]
    """Key -> [events, latency total, 1], as the services reported."""
    counted: dict[Key, list[int]]
    """The same, from the job's Parquet table."""
    alerts_due: dict[tuple[str, int], int]
    """(service, window) -> errors, for each window with at least ALERT_ERRORS errors."""
    alerts: dict[tuple[str, int], list[int]]
    """(service, window) -> [errors, times received], as the subscriber received them."""
    killed_at: int
    """Events the job had read when it was killed."""
    while_down: int
    """Events published between the kill and the new job's first micro-batch (about)."""
    phases: list[str]
    """One line per step, with the time it took."""
    restarts: list[str] = field(default_factory=list)
    """Why a job restarted a failed query from its checkpoint, once per restart."""

    @property
    def exact(self) -> bool:
        received = {k: [errors, 1] for k, errors in self.alerts_due.items()}
        return self.published == self.counted and self.alerts == received

    def totals(self, which: dict[Key, list[int]]) -> dict[tuple[str, str], list[int]]:
        """(service, kind) -> [events, latency total, windows]."""
        out: dict[tuple[str, str], list[int]] = {}
        for (service, kind, _), (n, ms, _rows) in which.items():
            total = out.setdefault((service, kind), [0, 0, 0])
            total[0] += n
            total[1] += ms
            total[2] += 1
        return out


def run_pipeline(
    root: Path,
    work: Path,
    *,
    scale: int = 2000,
    interval: float = 0.02,
    report: Callable[[str], None] = print,
) -> Result:
    """Run the pipeline in ``work``: kill the job once it has read ``scale`` events and
    written a window, and stop the services once they have published ``scale`` more
    after the new job's first micro-batch."""
    table, checkpoint, scratch = work / "windows.parquet", work / "checkpoint", work / "spark"
    job_args = ["job", "--root", str(root), "--table", str(table)]
    job_args += ["--checkpoint", str(checkpoint), "--scratch", str(scratch)]
    phases: list[str] = []
    t0 = last = time.monotonic()

    def phase(text: str) -> None:
        nonlocal last
        now = time.monotonic()
        phases.append(f"{now - t0:5.1f} s  {text} ({now - last:.1f} s)")
        last = now
        report(phases[-1])

    def published() -> int:
        return sum(s.last("published", 0) for s in services)

    def read(job: Process) -> int:
        return sum(s["rows"] for s in job.said if s.get("query") == "windows")

    services: list[Process] = []

    def start_job() -> Process:
        return start("job", work / "job.log", *job_args)

    def start_service(name: str) -> Process:
        args = ["--root", str(root), "--name", name, "--interval", str(interval)]
        return start(name, work / f"{name}.log", "service", *args)

    subscriber = start("subscriber", work / "subscriber.log", "alerts", "--root", str(root))
    job = start_job()
    jobs: list[Process] = []  # the killed one
    try:
        # The first micro-batch declares the queue: from then on nothing published is lost.
        wait_for("the job declared its queue", lambda: queue_depth(root) is not None, [job])
        wait_for("the subscriber is up", subscriber.ready.is_set, [subscriber])
        phase(f"job started (pid {job.proc.pid}); its queue {QUEUE!r} collects 'events.#'")
        services = [start_service(name) for name in SERVICES]
        wait_for("the services are up", lambda: all(s.ready.is_set() for s in services), services)
        phase(f"{len(services)} service processes publishing")

        running = [job, subscriber, *services]
        wait_for(
            f"the job read {scale} events and wrote a window",
            lambda: read(job) >= scale and bool(committed_files(table)),
            running,
        )
        kill_group(job)
        jobs.append(job)
        killed_at, at_kill = read(job), published()
        phase(f"job killed with SIGKILL after reading {killed_at} events")

        job = start_job()
        running = [job, subscriber, *services]
        wait_for("the new job read its first events", lambda: read(job) > 0, running)
        at_restart = published()
        while_down = at_restart - at_kill
        phase(f"job restarted; about {while_down} events were published while it was down")
        wait_for(
            f"the services published {scale} more events",
            lambda: published() >= at_restart + scale,
            running,
        )
        for s in services:
            s.stop()
        want = {
            (s.name, kind, window): [n, ms, 1]
            for s in services
            for kind, window, n, ms in s.last("done", [])
        }
        total = sum(n for n, _, _ in want.values())
        phase(f"{read(job)} events read since the restart; services stopped at {total} events")

        # Once the queue is empty the job has taken in every event; the next one, timed
        # past every window, closes them all (its own window stays open).
        running = [job, subscriber]
        wait_for("the job took in every event", lambda: queue_depth(root) == 0, running)
        publish_tick(root, max(w for _, _, w in want) + (WINDOW + LATENESS) * 1000)
        alerts_due = {(s, w): n for (s, k, w), (n, _, _) in want.items() if k == "error"}
        alerts_due = {k: n for k, n in alerts_due.items() if n >= ALERT_ERRORS}
        wait_for(
            f"every window is in the table and {len(alerts_due)} alerts are received",
            lambda: (
                sum(n for n, _, _ in counted(table).values()) >= total
                and len(subscriber.alerts()) >= len(alerts_due)
            ),
            running,
        )
        phase("every window counted, every alert received")
    finally:
        for p in (job, subscriber, *services):
            p.stop()
    alerts: dict[tuple[str, int], list[int]] = {}
    for alert in subscriber.alerts():
        received = alerts.setdefault((alert["service"], alert["window"]), [alert["errors"], 0])
        received[1] += 1
    restarts = [s["reason"] for j in (*jobs, job) for s in j.said if "restart" in s]
    return Result(want, counted(table), alerts_due, alerts, killed_at, while_down, phases, restarts)


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
    job = sub.add_parser("job", help="run the Spark job")
    job.add_argument("--root", type=Path, required=True)
    job.add_argument("--table", type=Path, required=True, help="the Parquet table")
    job.add_argument("--checkpoint", type=Path, required=True)
    job.add_argument("--scratch", type=Path, required=True, help="Spark's local directory")
    subscriber = sub.add_parser("alerts", help="print the alerts published on the bus")
    subscriber.add_argument("--root", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "service":
        import anyio

        anyio.run(run_service, str(args.root), args.name, args.interval, args.report_every)
        return 0
    if args.command == "alerts":
        import anyio

        anyio.run(run_subscriber, str(args.root))
        return 0
    if args.command == "job":
        return run_job(args.root, args.table, args.checkpoint, args.scratch)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fsbus-pipeline-") as tmp:
        root = args.root or Path(tmp) / "bus"
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):  # an earlier run's queue and alerts would be counted too
            parser.error(f"--root {root} is not empty")
        print(f"bus: {root}")
        result = run_pipeline(root, Path(tmp), scale=args.scale, interval=args.interval)
    published, counts = result.totals(result.published), result.totals(result.counted)
    alerts = {s: sum(n for (a, _), (_, n) in result.alerts.items() if a == s) for s in SERVICES}
    print(
        f"{'service':<9} {'kind':<5} {'published':>9} {'counted':>8} {'windows':>7} {'alerts':>6}"
    )
    for key in sorted(published.keys() | counts.keys()):
        n = published.get(key, [0])[0]
        c = counts.get(key, [0, 0, 0])
        raised = str(alerts.get(key[0], 0)) if key[1] == "error" else ""
        print(f"{key[0]:<9} {key[1]:<5} {n:>9} {c[0]:>8} {c[2]:>7} {raised:>6}")
    total = sum(n for n, _, _ in result.published.values())
    if not result.exact:
        for window in sorted(result.published.keys() | result.counted.keys()):
            want, got = result.published.get(window), result.counted.get(window)
            if want != got:
                print(f"  {window}: published {want}, counted {got} ([events, latency, rows])")
        for due_key in sorted(result.alerts_due.keys() | result.alerts.keys()):
            due, got = result.alerts_due.get(due_key), result.alerts.get(due_key)
            if got != ([due, 1] if due is not None else None):
                print(f"  alert {due_key}: due for {due} errors, received {got} ([errors, times])")
        print(f"FAILED: the Spark job's counts or alerts differ from the {total} events published")
        return 1
    for reason in result.restarts:
        print(f"a query failed and started again from its checkpoint: {reason}")
    print(
        f"OK: all {total} events counted exactly once, window by window, and all "
        f"{len(result.alerts)} alerts received once; the job was killed with SIGKILL after "
        f"reading {result.killed_at} events, and about {result.while_down} were published "
        f"while it was down ({time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
