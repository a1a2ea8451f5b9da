"""Spark connector throughput against Spark's own file sources, side by side in one run.

    .venv/bin/python -m bench.bench_spark [--records 1000000] [--size 100] [--rounds 3]
                                          [--only read|write|latency]
                                          [--latency-messages 500] [--latency-rate 50]

Measures, on a local[2] Spark, records per second for

* reading: a Stream through ``format("fsbus")`` (batch read, and a streaming query with
  Trigger.AvailableNow) into the ``noop`` sink, against Spark's text and JSON sources
  reading the same records from files (batch, and a streaming file source), and against
  the floor of any Python data source: one that hands Spark ready-made Arrow batches of
  the same rows and does nothing else (bench/spark_floor.py, as many tasks as fsbus);
* writing: a DataFrame of the same records into a Stream through ``format("fsbus")``,
  against Spark writing them as text and JSON files; and a streaming query (the text
  files as a streaming source, Trigger.AvailableNow) into the fsbus sink, against
  Spark's streaming text and JSON file sinks; and against the floor of any Python sink,
  one that drops the rows (bench/spark_sink_floor.py);
* latency: from ``Stream.append`` (the Stream source) and from ``bus.publish`` (the
  Bus-topic source, ``option("pattern", ...)``) to the row in a Stream written by the
  fsbus sink, with a processing-time trigger of 0: ``--latency-messages`` messages
  sent at ``--latency-rate`` a second, each carrying the time it was sent; the sink's
  record carries the time it was appended. p50 and p99, after the throughput rounds.

What is timed is the operation a user runs: the benchmark's own preparation and checks
are not. A writer writes into page cache the kernel has just freed: the text and JSON
batch writers use ``mode("overwrite")``, which removes their previous round's output
inside the operation; for the others (fsbus appends to a new Stream each round, the
streaming sinks write to new paths) the benchmark removes the previous round's output
just before the timed part, and counts what the fsbus sink appended after it. Before each
timed operation the benchmark also syncs the filesystems (``os.sync``, untimed), so that
no operation waits behind the write-back of what the ones before it wrote: the file sinks
leave theirs to the kernel, and the fsbus sink, which syncs what it writes, otherwise
waited for their data too.

Rounds are interleaved (A B C A B C ...) and the median is reported, with the ratio of
fsbus to each file source measured in the same run. Absolute figures depend on the
machine; the ratios are the result. Scratch data goes under ``--scratch`` (default
bench/scratch/spark, git-ignored) and is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsbus import Stream

HERE = Path(__file__).resolve().parent


def spark_session(scratch: Path) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    import fsbus.spark

    (scratch / "local").mkdir(parents=True, exist_ok=True)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("fsbus-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch}")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    fsbus.spark.register(spark)
    from pyspark import cloudpickle

    from bench import spark_floor, spark_sink_floor

    # by value: Spark's Python workers need not find the bench package on their path
    cloudpickle.register_pickle_by_value(spark_floor)  # type: ignore[no-untyped-call]
    spark.dataSource.register(spark_floor.FloorDataSource)
    cloudpickle.register_pickle_by_value(spark_sink_floor)  # type: ignore[no-untyped-call]
    spark.dataSource.register(spark_sink_floor.SinkFloorDataSource)
    return spark


def value_of(i: int, size: int) -> str:
    head = f"{i:012d} "
    return head + "x" * (size - len(head))


def prepare(root: Path, files: Path, n: int, size: int) -> None:
    """The same records as a Stream, as text files and as JSON-lines files (two of each)."""
    with Stream.open(root, "bench") as stream:
        chunk = 50_000
        for lo in range(0, n, chunk):
            stream.append_batch([value_of(i, size).encode() for i in range(lo, min(n, lo + chunk))])
    for kind in ("text", "json"):
        (files / kind).mkdir(parents=True)
    for part in range(2):
        lo, hi = part * n // 2, (part + 1) * n // 2
        with open(files / "text" / f"part-{part}.txt", "w") as f:
            f.writelines(value_of(i, size) + "\n" for i in range(lo, hi))
        with open(files / "json" / f"part-{part}.json", "w") as f:
            f.writelines(json.dumps({"value": value_of(i, size)}) + "\n" for i in range(lo, hi))


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compile_bytecode() -> None:
    """Compile the modules of fsbus and of bench/ (the floors) to bytecode, as pip does when
    it installs a wheel. This checkout is installed in editable mode and the environment may
    set PYTHONDONTWRITEBYTECODE, so without this every Python process Spark starts (each
    streaming query's planner is a new one) would compile them from source: 0.13 s of
    fsbus's 0.2 s of imports there."""
    import compileall

    import fsbus

    compileall.compile_dir(Path(fsbus.__file__).parent, quiet=1)
    compileall.compile_dir(Path(__file__).parent, maxlevels=0, quiet=1)  # not its scratch


def run(args: argparse.Namespace) -> dict[str, Any]:
    compile_bytecode()
    scratch = args.scratch / f"run-{os.getpid()}"
    try:
        return _run(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    root, files, out = scratch / "bus", scratch / "files", scratch / "out"
    root.mkdir(parents=True)
    t = timed(lambda: prepare(root, files, args.records, args.size))
    print(f"prepared {args.records} records of {args.size} B in {t:.1f} s", file=sys.stderr)
    spark = spark_session(scratch)
    n, size = args.records, args.size
    counter = iter(range(1_000_000))

    def noop(df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()

    def stream_to_noop(df: Any, expect: int = n) -> None:
        ckpt = scratch / "ckpt" / str(next(counter))
        q = (
            df.writeStream.format("noop")
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        rows = sum(p["numInputRows"] for p in q.recentProgress)
        assert rows == expect, f"the streaming query read {rows} rows, not {expect}"

    fsbus_opts = {"path": str(root), "stream": "bench"}
    tasks = spark.read.format("fsbus").options(**fsbus_opts).load().rdd.getNumPartitions()
    floor_opts = {"n": str(n), "size": str(size), "partitions": str(tasks)}
    readers: dict[str, Callable[[], None]] = {
        "read fsbus (batch)": lambda: noop(spark.read.format("fsbus").options(**fsbus_opts).load()),
        "read text files (batch)": lambda: noop(spark.read.text(str(files / "text"))),
        "read json files (batch)": lambda: noop(
            spark.read.schema("value string").json(str(files / "json"))
        ),
        "read no-op Python source (batch)": lambda: noop(
            spark.read.format("fsbus-floor").options(**floor_opts).load()
        ),
        "read fsbus (streaming)": lambda: stream_to_noop(
            spark.readStream.format("fsbus").options(**fsbus_opts).load()
        ),
        "read text files (streaming)": lambda: stream_to_noop(
            spark.readStream.text(str(files / "text"))
        ),
        "read json files (streaming)": lambda: stream_to_noop(
            spark.readStream.schema("value string").json(str(files / "json"))
        ),
        "read no-op Python source (streaming)": lambda: stream_to_noop(
            spark.readStream.format("fsbus-floor").options(**floor_opts).load()
        ),
    }
    data = (
        spark.range(n, numPartitions=2)
        .selectExpr(
            f"concat(lpad(CAST(id AS STRING), 12, '0'), ' ', repeat('x', {size - 13})) AS value"
        )
        .cache()
    )
    assert data.count() == n

    # Every writer that writes files writes into page cache the kernel has just freed, not
    # into memory the guest has never touched (here that costs about 5x as much to write):
    # the text and JSON batch writers remove their previous round's output themselves
    # (mode("overwrite"), inside the operation timed); for the others the benchmark removes
    # it just before the timed part, since no user's append does that (see docs/spark.md).
    # What the benchmark checks afterwards (every record appended once) is not timed either.
    written: dict[str, Path] = {}
    current: dict[str, Any] = {}

    def fresh(kind: str, path: Path) -> Path:
        old = written.pop(kind, None)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        written[kind] = path
        return path

    def check_stream(name: str) -> None:
        with Stream.open(root, name, create=False) as s:
            assert s.end_offset == n, f"the fsbus sink appended {s.end_offset}, not {n}"

    def prepare_fsbus() -> None:
        current["fsbus"] = name = f"w{next(counter)}"
        fresh("fsbus", root / "streams" / name)

    def write_fsbus() -> None:
        data.write.format("fsbus").mode("append").options(
            path=str(root), stream=current["fsbus"]
        ).save()

    def prepare_stream(fmt: str) -> None:
        current[f"stream {fmt}"] = run = next(counter)
        if fmt == "fsbus":
            fresh("fsbus-stream", root / "streams" / f"sw{run}")
        elif fmt != "fsbus-sink-floor":
            fresh(fmt, out / f"{fmt}-stream-{run}")

    def stream_write(fmt: str) -> None:
        # the same streaming source (the text files) into each sink, one micro-batch
        run = current[f"stream {fmt}"]
        query = spark.readStream.text(str(files / "text")).writeStream.format(fmt)
        query = query.option("checkpointLocation", str(scratch / "ckpt" / str(run)))
        if fmt == "fsbus":
            query = query.options(path=str(root), stream=f"sw{run}")
        elif fmt != "fsbus-sink-floor":
            query = query.option("path", str(out / f"{fmt}-stream-{run}"))
        q = query.trigger(availableNow=True).start()
        q.awaitTermination()

    writers: dict[str, Callable[[], None]] = {
        "write fsbus": write_fsbus,
        "write text files": lambda: data.write.mode("overwrite").text(str(out / "text")),
        "write json files": lambda: data.write.mode("overwrite").json(str(out / "json")),
        "write no-op Python sink": lambda: (
            data.write.format("fsbus-sink-floor").mode("append").save()
        ),
        "write fsbus (streaming)": lambda: stream_write("fsbus"),
        "write no-op Python sink (streaming)": lambda: stream_write("fsbus-sink-floor"),
        "write text files (streaming)": lambda: stream_write("text"),
        "write json files (streaming)": lambda: stream_write("json"),
    }
    # untimed, before and after a writer's timed part
    before: dict[str, Callable[[], None]] = {
        "write fsbus": prepare_fsbus,
        "write fsbus (streaming)": lambda: prepare_stream("fsbus"),
        "write no-op Python sink (streaming)": lambda: prepare_stream("fsbus-sink-floor"),
        "write text files (streaming)": lambda: prepare_stream("text"),
        "write json files (streaming)": lambda: prepare_stream("json"),
    }
    after: dict[str, Callable[[], None]] = {
        "write fsbus": lambda: check_stream(current["fsbus"]),
        "write fsbus (streaming)": lambda: check_stream(f"sw{current['stream fsbus']}"),
    }
    if args.only in ("read", "latency"):
        writers = {}
    if args.only in ("write", "latency"):
        readers = {}
    # Warm-up (JIT, Python workers), not timed.
    noop(spark.read.format("fsbus").options(**fsbus_opts, endingOffsets="1000").load())
    noop(spark.read.text(str(files / "text")).limit(1000))
    noop(spark.read.format("fsbus-floor").options(**{**floor_opts, "n": "1000"}).load())
    # The first streaming query of a session also warms Spark's streaming path (about a
    # second here): not in whichever query the first round happens to run first.
    stream_to_noop(spark.readStream.format("fsbus").options(**fsbus_opts).load())
    stream_to_noop(spark.readStream.text(str(files / "text")))
    stream_to_noop(spark.readStream.format("fsbus-floor").options(**floor_opts).load())
    small = data.limit(1000)
    small.write.format("fsbus").mode("append").options(path=str(root), stream="warm").save()
    small.write.format("fsbus-sink-floor").mode("append").save()

    times: dict[str, list[float]] = {name: [] for name in (*readers, *writers)}
    for r in range(args.rounds):
        for name, fn in (*readers.items(), *writers.items()):
            if name in before:
                before[name]()
            # the write-back of what the operations before wrote (the file sinks do not
            # sync theirs) is done before this one starts: none waits behind another's
            os.sync()
            times[name].append(timed(fn))
            if name in after:
                after[name]()
            print(f"round {r + 1}: {name}: {times[name][-1]:.2f} s", file=sys.stderr)
    latencies: dict[str, list[float]] = {}
    if args.only in (None, "latency"):
        for source in ("stream", "topics"):
            latencies[source] = measure_latency(
                spark, root, scratch / "latency", source, args.latency_messages, args.latency_rate
            )
            print(f"latency of the {source} source measured", file=sys.stderr)
    spark.stop()
    rates = {name: n / statistics.median(ts) for name, ts in times.items()}
    return {
        "records": n,
        "size": size,
        "rounds": args.rounds,
        "rates": rates,
        "times": times,
        "latency_rate": args.latency_rate,
        "latencies": latencies,
    }


LATENCY_TIMEOUT = 300.0
"""Seconds the latency query may take to deliver every message before the bench fails."""


def measure_latency(
    spark: Any, root: Path, scratch: Path, source: str, n: int, rate: float
) -> list[float]:
    """Seconds from sending each of ``n`` messages to its row in the fsbus sink's Stream.

    ``source`` is "stream" (``Stream.append`` into a Stream the query reads) or "topics"
    (``BlockingBus.publish`` on a topic the query reads with ``option("pattern")``). The
    query runs with a processing-time trigger of 0, so it plans the next micro-batch as
    soon as one ends. Its first row (sent before the clock starts) warms it up.
    """
    from pyspark.sql import functions as F

    from fsbus import BlockingBus

    name = f"lat-{source}"
    out = f"{name}-out"
    reader = spark.readStream.format("fsbus").option("path", str(root))
    with contextlib.ExitStack() as stack:
        if source == "stream":
            stream = stack.enter_context(Stream.open(root, name))
            rows = reader.option("stream", name).load().select("value")

            def send(body: bytes) -> None:
                stream.append(body)

        else:
            bus = stack.enter_context(BlockingBus(root))
            rows = reader.option("pattern", f"{name}.#").option("queue", name).load()
            rows = rows.select(F.col("payload").alias("value"))

            def send(body: bytes) -> None:
                bus.publish(f"{name}.event", body)

        query = (
            rows.writeStream.format("fsbus")
            .option("path", str(root))
            .option("stream", out)
            .option("checkpointLocation", str(scratch / name))
            .trigger(processingTime="0 seconds")
            .start()
        )
        stack.callback(query.stop)
        if source == "topics":  # its first micro-batch declares the queue it reads
            wait_until(lambda: _has_queue(root, name), query, "the query declared its queue")
        send(b"warm-up")
        wait_until(lambda: _records(root, out) >= 1, query, "the warm-up row is in the sink")
        start = time.perf_counter()
        for i in range(n):
            # paced by the clock: message i is sent at start + i / rate
            time.sleep(max(0.0, start + i / rate - time.perf_counter()))
            send(f"{time.time():.6f}".encode())
        wait_until(lambda: _records(root, out) >= n + 1, query, f"{n} rows are in the sink")
    with Stream.open(root, out, create=False) as sink:
        records = list(sink.read())
    assert len(records) == n + 1, f"the sink holds {len(records)} rows, not {n + 1}"
    return [r.timestamp - float(r.value) for r in records[1:]]


def _has_queue(root: Path, name: str) -> bool:
    from fsbus import BlockingBus, QueueNotFound

    with BlockingBus(root) as bus:
        try:
            bus.queue_info(name)
        except QueueNotFound:
            return False
        return True


def _records(root: Path, name: str) -> int:
    from fsbus import StreamNotFound

    try:
        with Stream.open(root, name, create=False) as stream:
            return stream.end_offset
    except StreamNotFound:
        return 0


def wait_until(condition: Callable[[], bool], query: Any, what: str) -> None:
    deadline = time.monotonic() + LATENCY_TIMEOUT
    while not condition():
        if query.exception() is not None:
            raise RuntimeError(f"the latency query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting until {what}")
        time.sleep(0.05)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def report(result: dict[str, Any]) -> str:
    rates = result["rates"]
    lines = [
        f"Spark connector, {result['records']:,} records x {result['size']} B, local[2], "
        f"median of {result['rounds']} interleaved rounds",
    ]
    if rates:
        lines += [
            "",
            "| operation | records/s | / no-op Python | / text files | / json files |",
            "|---|---:|---:|---:|---:|",
        ]
    groups = [
        ("read", "(batch)"),
        ("read", "(streaming)"),
        ("write", ""),
        ("write", "(streaming)"),
    ]
    for verb, mode in groups:
        suffix = f" {mode}" if mode else ""
        if f"{verb} fsbus{suffix}" not in rates:
            continue  # not run (--only)
        floor = "no-op Python source" if verb == "read" else "no-op Python sink"
        for what in ("fsbus", floor, "text files", "json files"):
            rate = rates[f"{verb} {what}{suffix}"]
            ratio = "| | |"
            if what in ("fsbus", floor):
                text = rate / rates[f"{verb} text files{suffix}"]
                js = rate / rates[f"{verb} json files{suffix}"]
                ratio = f"| {text:.2f} | {js:.2f} |"
            of_floor = f"{rate / rates[f'{verb} {floor}{suffix}']:.2f}" if what == "fsbus" else ""
            lines.append(f"| {verb} {what}{suffix} | {rate:,.0f} | {of_floor} {ratio}")
    latencies = result.get("latencies") or {}
    if latencies:
        lines += [
            "",
            f"Latency to the row in the fsbus sink, processing-time trigger 0, "
            f"{result['latency_rate']:g} messages/s",
            "",
            "| source | sent with | messages | p50 ms | p99 ms |",
            "|---|---|---:|---:|---:|",
        ]
        sent_with = {"stream": "`Stream.append`", "topics": "`bus.publish`"}
        label = {"stream": "Stream", "topics": "Bus topics (`pattern`)"}
        for source, values in latencies.items():
            p50, p99 = percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000
            lines.append(
                f"| {label[source]} | {sent_with[source]} | {len(values)} | {p50:.0f} | {p99:.0f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per record value")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=HERE / "scratch" / "spark")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--only", choices=("read", "write", "latency"), help="run only these operations"
    )
    parser.add_argument(
        "--latency-messages", type=int, default=500, help="messages per latency measurement"
    )
    parser.add_argument(
        "--latency-rate", type=float, default=50.0, help="latency messages sent per second"
    )
    args = parser.parse_args(argv)
    if args.size < 20:
        parser.error("--size must be at least 20 bytes")
    result = run(args)
    text = report(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
