"""Structured Streaming through a real local Spark: offsets, limits, restarts, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import PANDAS_WARNING

from fsbus import BlockingBus, Stream
from fsbus.spark import ID_HEADER

# A SparkSession takes seconds to start, many more on a loaded machine.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings(PANDAS_WARNING),
    pytest.mark.timeout(300),
]


def fill(root: Path, name: str, values: range) -> None:
    with Stream.open(root, name) as stream:
        stream.append_batch(f"v{i}" for i in values)


def values_of(root: Path, name: str) -> list[str]:
    with Stream.open(root, name, create=False) as stream:
        return [r.value.decode() for r in stream.read()]


def copy_query(
    spark: Any, root: Path, checkpoint: Path, *, schema: str | None = None, **source: str
) -> Any:
    reader = spark.readStream.format("fsbus").option("path", str(root)).option("stream", "in")
    if schema is not None:
        reader = reader.schema(schema)
    for key, value in source.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .select("value")
        .writeStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "out")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


@pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)
def test_available_now_with_limit_and_restart(spark: Any, root: Path, tmp_path: Path) -> None:
    fill(root, "in", range(300))
    checkpoint = tmp_path / "ckpt"

    query = copy_query(spark, root, checkpoint, maxRecordsPerTrigger="100")
    query.awaitTermination(90)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [100, 100, 100]
    assert values_of(root, "out") == [f"v{i}" for i in range(300)]

    # New records arrive; the restarted query resumes from its checkpoint.
    fill(root, "in", range(300, 450))
    query = copy_query(spark, root, checkpoint, maxRecordsPerTrigger="100")
    query.awaitTermination(90)
    assert query.exception() is None
    assert values_of(root, "out") == [f"v{i}" for i in range(450)]

    # Nothing new: a restart publishes nothing.
    query = copy_query(spark, root, checkpoint)
    query.awaitTermination(90)
    assert values_of(root, "out") == [f"v{i}" for i in range(450)]


def test_starting_offsets_latest_and_explicit(spark: Any, root: Path, tmp_path: Path) -> None:
    fill(root, "in", range(50))
    query = copy_query(spark, root, tmp_path / "a", startingOffsets='{"in": 45}')
    query.awaitTermination(90)
    assert values_of(root, "out") == [f"v{i}" for i in range(45, 50)]

    query = copy_query(spark, root, tmp_path / "b", startingOffsets="latest")
    query.awaitTermination(90)
    assert values_of(root, "out") == [f"v{i}" for i in range(45, 50)]


@pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)
def test_stream_to_bus_topics(spark: Any, root: Path, tmp_path: Path) -> None:
    fill(root, "in", range(60))
    query = (
        spark.readStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "in")
        .option("maxRecordsPerTrigger", "25")
        .load()
        .selectExpr("concat('metrics.', CAST(offset % 3 AS STRING)) AS topic", "value")
        .writeStream.format("fsbus")
        .option("path", str(root))
        .option("ttl", "600")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(90)
    assert query.exception() is None
    with BlockingBus(root) as bus:
        seen = Counter((i.topic, bus.read_payload(i)) for i in bus.browse("metrics.*"))
        ids = Counter(i.headers[ID_HEADER] for i in bus.browse("metrics.*"))
    assert seen == Counter((f"metrics.{i % 3}", f"v{i}".encode()) for i in range(60))
    assert max(ids.values()) == 1


def start_reader(spark: Any, **options: str) -> Any:
    reader = spark.readStream.format("fsbus")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "in"}, "missing option 'path'"),
        ({"path": "{root}", "stream": "nope"}, "nope"),
        ({"path": "{root}", "stream": "in", "startingOffsets": "yesterday"}, "startingOffsets"),
        ({"path": "{root}", "stream": "in", "startingOffsets": '{"in": 99}'}, "offset 99"),
    ],
)
def test_bad_source_options_fail_before_the_query(
    spark: Any, root: Path, options: dict[str, str], message: str
) -> None:
    fill(root, "in", range(10))
    options = {k: v.replace("{root}", str(root)) for k, v in options.items()}
    with pytest.raises(Exception, match=message) as err:
        start_reader(spark, **options).writeStream.format("noop").start()
    assert "Streaming" not in type(err.value).__name__  # raised at definition, not mid-query
    assert spark.streams.active == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "out"}, "missing option 'path'"),
        ({"path": "{root}"}, "needs option 'topic'"),
        ({"path": "{root}", "stream": "out", "topic": "x"}, "exclude each other"),
    ],
)
def test_bad_sink_options_stop_the_query_before_any_batch(
    spark: Any, root: Path, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    fill(root, "in", range(10))
    df = start_reader(spark, path=str(root), stream="in").select("value")
    writer = df.writeStream.format("fsbus").option("checkpointLocation", str(tmp_path / "c"))
    for key, value in options.items():
        writer = writer.option(key, value.replace("{root}", str(root)))
    # Spark 4.3 builds a Python sink's writer in the query's thread, first thing: the
    # query stops with the error before it plans or reads any micro-batch.
    query = writer.start()
    with pytest.raises(Exception, match=message):
        query.awaitTermination(60)
    assert query.recentProgress == []
    assert spark.streams.active == []
    assert not (root / "streams" / "out").exists()


def test_several_streams_share_the_read_limit(spark: Any, root: Path, tmp_path: Path) -> None:
    fill(root, "a", range(100))
    fill(root, "b", range(1000, 1030))
    query = (
        spark.readStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "a,b")
        .option("maxRecordsPerTrigger", "50")
        .load()
        .selectExpr("concat(stream, ':', CAST(value AS STRING)) AS value")
        .writeStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "out")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(90)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [50, 50, 30]
    assert Counter(values_of(root, "out")) == Counter(
        [f"a:v{i}" for i in range(100)] + [f"b:v{i}" for i in range(1000, 1030)]
    )
    offsets = json.loads(
        sorted((tmp_path / "ckpt" / "offsets").glob("[0-9]*"))[-1].read_text().splitlines()[-1]
    )
    assert offsets == {"a": 100, "b": 30}


PRODUCER = """
import sys
from fsbus import Stream
root, count = sys.argv[1], int(sys.argv[2])
with Stream.open(root, "in") as stream:
    for lo in range(0, count, 25):
        stream.append_batch(f"p{i}" for i in range(lo, min(count, lo + 25)))
"""


@pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)
def test_query_keeps_up_with_a_live_producer(spark: Any, root: Path, tmp_path: Path) -> None:
    from spark_helpers import wait_until

    fill(root, "in", range(0))
    query = (
        spark.readStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "in")
        .option("maxRecordsPerTrigger", "300")
        .load()
        .select("value")
        .writeStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "out")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        # Another process appends while the query reads the stream's growing tail.
        producer = subprocess.run(
            [sys.executable, "-c", PRODUCER, str(root), "3000"], timeout=120, check=True
        )
        assert producer.returncode == 0

        def copied() -> bool:
            assert query.exception() is None
            with Stream.open(root, "out") as out:
                return out.end_offset >= 3000

        wait_until(copied, timeout=240, what="the query to copy 3000 records")
    finally:
        query.stop()
    assert Counter(values_of(root, "out")) == Counter(f"p{i}" for i in range(3000))


def test_a_narrower_schema_streams_only_its_columns(spark: Any, root: Path, tmp_path: Path) -> None:
    fill(root, "in", range(40))
    query = copy_query(spark, root, tmp_path / "ckpt", schema="offset long, value binary")
    query.awaitTermination(90)
    assert query.exception() is None
    assert values_of(root, "out") == [f"v{i}" for i in range(40)]
