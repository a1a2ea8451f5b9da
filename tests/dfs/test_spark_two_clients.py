"""Spark across two clients of a distributed filesystem: the query reads on client B what
processes write on client A, default settings, every record counted.

- On CephFS and on GlusterFS, a streaming query whose path is B's mount reads a Stream
  that a ``fsbus stream append`` process fills on A, chunk by chunk while the query runs.
- On CephFS, the Bus-topics source's kill scenario of tests/spark (see spark_helpers.py)
  on the standalone Spark cluster: its executors read on B, publishers (a qlobber-fsq
  peer, then fsbus processes) publish on A, an executor JVM and then the driver are
  SIGKILLed mid-run and the driver restarts on its checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_cluster import Cluster as SparkCluster
from spark_helpers import (
    PANDAS_WARNING,
    Publish,
    Sizes,
    build_spark,
    kill_restart_and_count,
    node_with_qlobber,
    out_end,
    python_publisher,
    qlobber_publisher,
    values,
    wait_until,
)

from fsbus import BlockingBus, Stream

from .clusters import Cluster
from .conftest import TwoClients, fresh_directory

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.filterwarnings(PANDAS_WARNING),
]

WAIT = 120.0
"""Upper bound of one wait on the query (a chunk crosses in a few seconds here)."""


@pytest.fixture(autouse=True)
def _no_fsbus_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("FSBUS_")]:
        monkeypatch.delenv(k)


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local[2] SparkSession for this module: the process's session if one is active
    (tests/spark's, when both directories run), else one of its own, stopped at the end."""
    pytest.importorskip("pyspark", reason="install the spark extra: pip install -e '.[spark]'")
    from pyspark.sql import SparkSession

    import fsbus.spark

    active = SparkSession.getActiveSession()
    if active is not None:
        fsbus.spark.register(active)
        yield active
        return
    session = build_spark(tmp_path_factory.mktemp("spark-dfs"), app="fsbus-tests-dfs")
    yield session
    session.stop()


N_RECORDS = 600
CHUNK = 100


@pytest.mark.timeout(300)
def test_a_query_on_b_reads_a_stream_appended_on_a(
    two_clients: TwoClients, spark: Any, tmp_path: Path
) -> None:
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    with Stream.open(a, "in"):
        pass  # the stream exists, empty, when the query starts
    query = (
        spark.readStream.format("fsbus")
        .option("path", str(b))
        .option("stream", "in")
        .option("maxRecordsPerTrigger", "70")
        .load()
        .selectExpr("key", "value")
        .writeStream.format("fsbus")
        .option("path", str(b))
        .option("stream", "out")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    log = tmp_path / "append.out"
    with open(log, "wb") as out:
        appender = subprocess.Popen(
            [
                *(sys.executable, "-m", "fsbus", "stream", "append", "--root", str(a)),
                *("--lines", "-", "--batch-size", "50", "in"),
            ],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    assert appender.stdin is not None
    try:
        for start in range(0, N_RECORDS, CHUNK):
            chunk = "".join(f"r{i}\n" for i in range(start, start + CHUNK))
            appender.stdin.write(chunk.encode())
            appender.stdin.flush()

            def copied(count: int = start + CHUNK) -> bool:
                assert query.isActive, query.exception()
                return out_end(b) >= count

            # each chunk is appended on A and copied by the query on B before the next
            wait_until(copied, timeout=WAIT, what=f"the query on B to copy {start + CHUNK}")
        appender.stdin.close()
        assert appender.wait(timeout=WAIT) == 0, log.read_text()
    finally:
        query.stop()
        if appender.poll() is None:
            appender.kill()
            appender.wait()
    assert query.exception() is None
    expected = Counter((f"r{i}", "") for i in range(N_RECORDS))
    assert Counter(values(b, "out")) == expected  # each record once, read on B
    with Stream.open(a, "in", create=False) as stream:
        assert stream.end_offset == N_RECORDS
    assert out_end(b) == N_RECORDS


CEPH_SIZES = Sizes(
    before_kill=300,
    across_kill=60,
    while_down=60,
    after_restart=60,
    first_copied=40,
    after_executor_kill=40,
)
"""Fewer messages than on one filesystem: the driver's recording on B claims each message
A's processes put into its queue, and on CephFS each such claim waits for the MDS to take
A's capabilities on the file (about 5 claims a second on this shared machine)."""


@pytest.mark.timeout(900)
def test_topic_source_on_the_cluster_reads_on_b_what_a_publishes_across_kills(
    ceph: Cluster, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    node = node_with_qlobber()
    where = fresh_directory(ceph)
    a, b = where.a / "bus", where.b / "bus"
    on_a = {"fsbus": python_publisher(a), "qlobber": qlobber_publisher(node, a, tmp_path)}

    def publish(numbers: range, pause: float) -> Any:
        # the first messages from a qlobber-fsq peer, the rest from fsbus processes
        return on_a["qlobber" if numbers.start == 0 else "fsbus"](numbers, pause)

    publisher: Publish = publish
    # qlobber-fsq does not route into queues: an fsbus process scanning on A does (the
    # driver's drains on B scan too; one copy, whoever routes it)
    with BlockingBus(a) as bus, bus.messages("router.idle"):
        kill_restart_and_count(b, tmp_path, spark_cluster.url, spark_cluster, publisher, CEPH_SIZES)
