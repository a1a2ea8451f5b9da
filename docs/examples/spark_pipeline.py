"""Example pipeline: services publish events on the bus, Spark aggregates them, alerts return.

    python docs/examples/spark_pipeline.py [--root DIR] [--per-service N]
    make spark-demo

1. Three "services" (threads here; processes or hosts in real life) append JSON events
   to the stream ``events`` of a bus directory: service, region, latency, event time.
2. A Spark Structured Streaming job reads the stream with ``format("fsbus")``, counts
   events and averages latency per service and 10-second window (event time, with a
   watermark), and
   * writes every closed window to Parquet, and
   * publishes an alert on the bus topic ``alerts.latency.<service>`` for each window
     whose average latency is over the threshold (exactly once, via the fsbus sink).
3. A plain fsbus subscriber (no Spark) receives the alerts.

Both queries run with Trigger.AvailableNow, so the example ends by itself; with a
processing-time trigger the same job runs forever on live data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fsbus import BlockingBus, Message, RecordIn, Stream

SERVICES = ("checkout", "payments", "search")
T0 = 1_700_000_000  # event times start here (seconds since the epoch)
WINDOW = 10  # seconds
THRESHOLD_MS = 250.0
EVENT_SCHEMA = "service string, region string, latency_ms double, ts double"


def latency(service: str, i: int) -> float:
    """Deterministic latencies: payments is slow in its third window, checkout in its fifth."""
    window = i // 20
    slow = (service == "payments" and window == 2) or (service == "checkout" and window == 4)
    return 400.0 + i % 7 if slow else 80.0 + (i * 13) % 50


def run_service(root: Path, service: str, count: int) -> None:
    """One service: append ``count`` events, two per second of event time, in small batches."""
    with Stream.open(root, "events") as stream:
        batch: list[RecordIn] = []
        for i in range(count):
            event = {
                "service": service,
                "region": "eu" if i % 2 else "us",
                "latency_ms": latency(service, i),
                "ts": T0 + i / 2,
            }
            batch.append(RecordIn(value=json.dumps(event), key=service))
            if len(batch) == 25:
                stream.append_batch(batch)
                batch = []
        # A heartbeat far ahead in event time moves the watermark past every window.
        batch.append(RecordIn(value=json.dumps({**event, "ts": T0 + 10_000}), key=service))
        stream.append_batch(batch)


def expected_alerts(per_service: int) -> set[tuple[str, int]]:
    """(service, window start) of every window the job must alert on."""
    sums: dict[tuple[str, int], list[float]] = {}
    for service in SERVICES:
        for i in range(per_service):
            start = int(T0 + i / 2) // WINDOW * WINDOW
            sums.setdefault((service, start), []).append(latency(service, i))
    return {key for key, xs in sums.items() if sum(xs) / len(xs) > THRESHOLD_MS}


@contextmanager
def alert_subscriber(root: Path, received: list[Message]) -> Iterator[threading.Event]:
    """A plain fsbus subscriber on ``alerts.#``, in a thread, until the event is set."""
    stop = threading.Event()
    ready = threading.Event()

    def listen() -> None:
        with BlockingBus(root) as bus, bus.messages("alerts.#") as it:
            ready.set()
            while not stop.is_set():
                try:
                    received.append(it.get(timeout=0.2))
                except TimeoutError:
                    continue

    thread = threading.Thread(target=listen, name="alert-subscriber", daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield stop
    finally:
        stop.set()
        thread.join(30)


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
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(scratch))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_job(spark: Any, root: Path, out: Path) -> None:
    """The Spark job: windows per service to Parquet, alerts back onto the bus."""
    from pyspark.sql import functions as F

    from fsbus.spark import value_as_json

    events = (
        spark.readStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "events")
        .option("maxRecordsPerTrigger", "400")
        .load()
        .select(value_as_json(EVENT_SCHEMA, alias="e"))
        .select("e.*")
        .withColumn("event_time", F.timestamp_seconds("ts"))
    )
    windows = (
        events.withWatermark("event_time", f"{WINDOW} seconds")
        .groupBy(F.window("event_time", f"{WINDOW} seconds"), "service")
        .agg(
            F.count("*").alias("events"),
            F.avg("latency_ms").alias("avg_latency_ms"),
            F.max("latency_ms").alias("max_latency_ms"),
        )
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "service",
            "events",
            "avg_latency_ms",
            "max_latency_ms",
        )
    )
    to_parquet = (
        windows.writeStream.format("parquet")
        .option("path", str(out / "windows"))
        .option("checkpointLocation", str(out / "checkpoints" / "windows"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    alerts = windows.where(F.col("avg_latency_ms") > THRESHOLD_MS).select(
        F.concat(F.lit("alerts.latency."), "service").alias("topic"),
        F.to_json(F.struct("service", "window_start", "events", "avg_latency_ms")).alias("value"),
    )
    to_bus = (
        alerts.writeStream.format("fsbus")
        .option("path", str(root))
        .option("ttl", "3600")
        .option("checkpointLocation", str(out / "checkpoints" / "alerts"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    for query in (to_parquet, to_bus):
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"query {query.name or query.id} failed: {query.exception()}")


def run_pipeline(spark: Any, root: Path, out: Path, *, per_service: int = 120) -> dict[str, Any]:
    """Run every step; return the Parquet rows and the alerts the subscriber received."""
    received: list[Message] = []
    want = expected_alerts(per_service)
    with alert_subscriber(root, received):
        services = [
            threading.Thread(target=run_service, args=(root, s, per_service)) for s in SERVICES
        ]
        for t in services:
            t.start()
        for t in services:
            t.join()
        run_job(spark, root, out)
        deadline = threading.Event()
        for _ in range(300):  # the subscriber sees new files within its poll interval
            if len(received) >= len(want):
                break
            deadline.wait(0.1)
    windows = spark.read.parquet(str(out / "windows")).orderBy("window_start", "service")
    return {
        "windows": [r.asDict() for r in windows.collect()],
        "alerts": [(m.topic, m.json()) for m in received],
        "expected_alerts": want,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="bus directory (default: a temporary one)")
    parser.add_argument("--per-service", type=int, default=120, help="events per service")
    args = parser.parse_args(argv)
    # PySpark warns about pandas >= 3 on its first Arrow conversion; nothing here uses pandas.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    with tempfile.TemporaryDirectory(prefix="fsbus-pipeline-") as tmp:
        root = args.root or Path(tmp) / "bus"
        root.mkdir(parents=True, exist_ok=True)
        out = Path(tmp) / "out"
        (Path(tmp) / "spark").mkdir()
        spark = spark_session(Path(tmp) / "spark")
        try:
            result = run_pipeline(spark, root, out, per_service=args.per_service)
        finally:
            spark.stop()
        print(f"bus: {root}")
        print(f"{len(result['windows'])} windows written to Parquet:")
        for w in result["windows"]:
            print(
                f"  {w['window_start']:%H:%M:%S} {w['service']:<9} events={w['events']:>3} "
                f"avg={w['avg_latency_ms']:7.1f} ms max={w['max_latency_ms']:6.1f} ms"
            )
        print(f"{len(result['alerts'])} alerts received by a plain fsbus subscriber:")
        for topic, body in result["alerts"]:
            print(f"  {topic}: {body}")
        got = {(b["service"], _epoch(b["window_start"])) for _, b in result["alerts"]}
        if got != result["expected_alerts"] or len(result["alerts"]) != len(got):
            print(f"unexpected alerts; wanted {sorted(result['expected_alerts'])}")
            return 1
    return 0


def _epoch(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


if __name__ == "__main__":
    raise SystemExit(main())
