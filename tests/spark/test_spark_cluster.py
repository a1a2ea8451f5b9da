"""Beyond local[2]: the standalone cluster's executors are JVMs of their own, and the
connector works through Spark Connect (a client with no JVM; the server runs the queries
on the cluster and finds ``format("fsbus")`` on its own, through ``pyspark_fsbus``)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_cluster import Cluster, ConnectServer
from spark_helpers import PANDAS_WARNING, run_query

from fsbus import BlockingBus, RecordIn, Stream
from fsbus.spark import ID_HEADER

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings(PANDAS_WARNING),
    pytest.mark.timeout(300),
]


@pytest.mark.parametrize("spark", ["cluster"], indirect=True)
def test_executors_are_jvms_of_their_own(spark: Any, spark_cluster: Cluster, root: Path) -> None:
    with Stream.open(root, "in") as stream:
        stream.append_batch(f"v{i}" for i in range(100))
    df = spark.read.format("fsbus").option("path", str(root)).option("stream", "in").load()
    assert df.count() == 100
    executors = spark_cluster.executor_pids(spark.sparkContext.applicationId)
    assert len(executors) == 2, executors  # one per Worker
    driver_jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    assert driver_jvm not in executors
    assert os.getpid() not in executors


@pytest.fixture(scope="module")
def connect_session(spark_connect: ConnectServer) -> Iterator[Any]:
    """A Spark Connect client session: no JVM in this process, no ``register`` call."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    session = RemoteSparkSession.builder.remote(spark_connect.url).getOrCreate()
    yield session
    session.stop()


@pytest.fixture
def remote(connect_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The Connect session, with PySpark's functions in Connect mode for this test only
    (the flag would turn later classic sessions of this process into Connect clients)."""
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return connect_session


def test_connect_batch_source_and_sink(
    remote: Any, spark_cluster: Cluster, spark_connect: ConnectServer, root: Path
) -> None:
    rows = [(f"k{i % 3}", f"value {i}") for i in range(300)]
    df = remote.createDataFrame(rows, "key string, value string").repartition(3)
    df.write.format("fsbus").mode("append").option("path", str(root)).option(
        "stream", "events"
    ).save()
    with Stream.open(root, "events", create=False) as stream:
        assert Counter((r.key, r.value) for r in stream.read()) == Counter(
            (k.encode(), v.encode()) for k, v in rows
        )

    back = (
        remote.read.format("fsbus")
        .option("path", str(root))
        .option("stream", "events")
        .option("maxRecordsPerPartition", "100")
        .load()
    )
    got = back.selectExpr("offset", "CAST(value AS STRING) AS v").collect()
    assert sorted(r.offset for r in got) == list(range(300))
    assert Counter(r.v for r in got) == Counter(v for _, v in rows)

    topics = remote.createDataFrame(
        [(f"alerts.{i % 2}", f"a{i}") for i in range(20)], "topic string, value string"
    )
    topics.write.format("fsbus").mode("append").option("path", str(root)).save()
    snapshot = remote.read.format("fsbus").option("path", str(root)).option("pattern", "alerts.*")
    assert sorted(bytes(r.payload) for r in snapshot.load().collect()) == sorted(
        f"a{i}".encode() for i in range(20)
    )
    # The server ran the tasks on the cluster's executors, not in its own JVM.
    [app] = spark_cluster.app_ids("Spark Connect server")
    assert len(spark_cluster.executor_pids(app)) == 2


def batch_ends(checkpoint: Path) -> list[int]:
    """The source's end offset of each micro-batch in ``checkpoint``."""
    files = sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    return [json.loads(f.read_text().splitlines()[-1])["in"] for f in files]


def test_connect_streaming_source_and_sink(remote: Any, root: Path, tmp_path: Path) -> None:
    with Stream.open(root, "in") as stream:
        stream.append_batch(RecordIn(value=f"v{i}", key=f"k{i % 4}") for i in range(250))

    def run(sink: dict[str, str], checkpoint: Path, select: list[str]) -> None:
        writer = (
            remote.readStream.format("fsbus")
            .option("path", str(root))
            .option("stream", "in")
            .option("maxRecordsPerTrigger", "100")
            .load()
            .selectExpr(*select)
            .writeStream.format("fsbus")
            .option("path", str(root))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
        )
        for key, value in sink.items():
            writer = writer.option(key, value)
        run_query(writer.start, timeout=120)

    run({"stream": "out"}, tmp_path / "a", ["key", "value"])
    # A Connect client sees no progress of a finished query; its checkpoint tells the batches.
    assert batch_ends(tmp_path / "a") == [100, 200, 250]
    with Stream.open(root, "in") as stream:  # more arrives; the restart resumes
        stream.append_batch(RecordIn(value=f"v{i}", key=f"k{i % 4}") for i in range(250, 300))
    run({"stream": "out"}, tmp_path / "a", ["key", "value"])
    with Stream.open(root, "out", create=False) as out:
        stored = [(r.key, r.value) for r in out.read()]
    assert Counter(stored) == Counter((f"k{i % 4}".encode(), f"v{i}".encode()) for i in range(300))
    assert len(stored) == 300

    run(
        {"ttl": "600"},
        tmp_path / "b",
        ["concat('metrics.', CAST(offset % 3 AS STRING)) AS topic", "value"],
    )
    with BlockingBus(root) as bus:
        infos = list(bus.browse("metrics.*"))
        seen = Counter((i.topic, bus.read_payload(i)) for i in infos)
    assert seen == Counter((f"metrics.{i % 3}", f"v{i}".encode()) for i in range(300))
    assert max(Counter(i.headers[ID_HEADER] for i in infos).values()) == 1


def test_connect_bus_topics_source_batch_read_and_topic_sink(
    remote: Any, root: Path, tmp_path: Path
) -> None:
    """Bus topics through Connect: two streaming queries read ``orders.#`` (one into a
    Stream, one back onto the Bus under ``copied.*``, each with its own queue), and batch
    reads take snapshots of topics; every message is counted."""

    def run(sink: dict[str, str], queue: str, select: list[str]) -> None:
        writer = (
            remote.readStream.format("fsbus")
            .option("path", str(root))
            .option("pattern", "orders.#")
            .option("queue", queue)
            .option("maxRecordsPerTrigger", "100")
            .load()
            .selectExpr(*select)
            .writeStream.format("fsbus")
            .option("path", str(root))
            .option("checkpointLocation", str(tmp_path / queue))
            .trigger(availableNow=True)
        )
        for key, value in sink.items():
            writer = writer.option(key, value)
        run_query(writer.start, timeout=120)

    into_stream = ({"stream": "out"}, "to-stream", ["topic AS key", "payload AS value"])
    onto_bus = ({"ttl": "600"}, "to-bus", ["concat('copied.', topic) AS topic", "payload AS value"])
    for sink, queue, select in (into_stream, onto_bus):
        run(sink, queue, select)  # the first start declares the query's queue
    n = 300
    with BlockingBus(root) as bus:
        for i in range(n):
            bus.publish("orders.eu.new" if i % 2 else "orders.paid", f"m{i}", single=i % 3 == 0)
            if i % 10 == 0:
                bus.publish("invoices.new", f"m{i}")  # not matched by orders.#
        for i in range(40):
            bus.publish(f"audit.{i % 2}", f"a{i}", single=i % 4 == 0, ttl=600)
    for sink, queue, select in (into_stream, onto_bus, into_stream):  # the last adds nothing
        run(sink, queue, select)

    def topic(i: int) -> str:
        return "orders.eu.new" if i % 2 else "orders.paid"

    with Stream.open(root, "out", create=False) as out:
        stored = [(r.value, r.key) for r in out.read()]
    assert Counter(stored) == Counter((f"m{i}".encode(), topic(i).encode()) for i in range(n))
    assert len(stored) == n
    with BlockingBus(root) as bus:
        infos = list(bus.browse("copied.#"))
        copied = Counter((i.topic, bus.read_payload(i)) for i in infos)
    assert copied == Counter((f"copied.{topic(i)}", f"m{i}".encode()) for i in range(n))
    assert max(Counter(i.headers[ID_HEADER] for i in infos).values()) == 1

    def snapshot(pattern: str) -> Counter[tuple[str, bytes]]:
        df = remote.read.format("fsbus").option("path", str(root)).option("pattern", pattern)
        return Counter((r.topic, bytes(r.payload)) for r in df.load().collect())

    assert snapshot("audit.*") == Counter((f"audit.{i % 2}", f"a{i}".encode()) for i in range(40))
    assert snapshot("copied.#") == copied
