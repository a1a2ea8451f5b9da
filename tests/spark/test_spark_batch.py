"""Batch reads and writes through a real local Spark: Streams and the Bus."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import PANDAS_WARNING

from fsbus import BlockingBus, RecordIn, Stream

# A SparkSession takes seconds to start, many more on a loaded machine.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings(PANDAS_WARNING),
    pytest.mark.timeout(300),
]


def read_stream(spark: Any, root: Path, **options: str) -> Any:
    reader = spark.read.format("fsbus").option("path", str(root))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)
def test_batch_round_trip(spark: Any, root: Path) -> None:
    rows = [(f"k{i % 7}", f"value {i}", {"n": str(i)} if i % 3 else {}) for i in range(500)]
    df = spark.createDataFrame(rows, "key string, value string, headers map<string,string>")
    (
        df.repartition(3)
        .write.format("fsbus")
        .mode("append")
        .option("path", str(root))
        .option("stream", "events")
        .save()
    )

    with Stream.open(root, "events", create=False) as stream:
        assert stream.end_offset == 500
        stored = list(stream.read())
    expected = Counter((k.encode(), v.encode(), tuple(sorted(h.items()))) for k, v, h in rows)
    got = Counter((r.key, r.value, tuple(sorted(r.headers.items()))) for r in stored)
    assert got == expected

    back = read_stream(spark, root, stream="events", maxRecordsPerPartition="120").collect()
    assert sorted(r.offset for r in back) == list(range(500))
    assert {r.stream for r in back} == {"events"}
    assert (
        Counter((bytes(r.key), bytes(r.value), tuple(sorted(r.headers.items()))) for r in back)
        == expected
    )
    by_offset = {r.offset: r for r in stored}
    for row in back:
        assert row.timestamp.timestamp() == pytest.approx(by_offset[row.offset].timestamp, abs=1e-5)


def test_offset_and_time_ranges(spark: Any, root: Path) -> None:
    with Stream.open(root, "ticks") as stream:
        stream.append_batch(
            RecordIn(value=json.dumps({"i": i}), timestamp=1_700_000_000 + i) for i in range(100)
        )

    df = read_stream(spark, root, stream="ticks", startingOffsets="10", endingOffsets="25")
    assert sorted(r.offset for r in df.collect()) == list(range(10, 25))

    df = read_stream(
        spark,
        root,
        stream="ticks",
        startingTimestamp=str(1_700_000_040),
        endingTimestamp=str(1_700_000_050.5),
    )
    assert sorted(r.offset for r in df.collect()) == list(range(40, 51))


def test_decoding_helpers(spark: Any, root: Path) -> None:
    from fsbus.spark import value_as_json, value_as_string

    with Stream.open(root, "json") as stream:
        stream.append_batch([json.dumps({"user": f"u{i}", "n": i}) for i in range(5)] + ["oops"])
    df = read_stream(spark, root, stream="json")
    text = [r.value for r in df.select(value_as_string()).orderBy("offset").collect()]
    assert text == [json.dumps({"user": f"u{i}", "n": i}) for i in range(5)] + ["oops"]
    parsed = df.select("offset", value_as_json("user string, n int", alias="v")).orderBy("offset")
    got = [(r.v.user, r.v.n) if r.v and r.v.user else None for r in parsed.collect()]
    assert got == [(f"u{i}", i) for i in range(5)] + [None]


@pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)
def test_bus_snapshot(spark: Any, root: Path) -> None:
    with BlockingBus(root) as bus:
        for i in range(5):
            bus.publish("orders.eu", f"order {i}", headers={"n": str(i)})
        for i in range(3):
            bus.publish("jobs.resize", f"job {i}", single=True, ttl=600)

    orders = read_stream(spark, root, pattern="orders.#").collect()
    assert sorted(bytes(r.payload) for r in orders) == [f"order {i}".encode() for i in range(5)]
    assert {(r.topic, r.kind) for r in orders} == {("orders.eu", "multi")}
    assert sorted(r.headers["n"] for r in orders) == [str(i) for i in range(5)]
    assert all(r.size == len(r.payload) for r in orders)

    everything = read_stream(spark, root, pattern="#", includePayload="false").collect()
    assert Counter(r.kind for r in everything) == {"multi": 5, "single": 3}
    assert all(r.payload is None for r in everything)
    with BlockingBus(root) as bus:  # a snapshot consumes nothing
        assert sum(1 for _ in bus.browse("#")) == 8


@pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)
def test_batch_write_to_bus_topics(spark: Any, root: Path) -> None:
    rows = [(f"alerts.{'high' if i % 4 == 0 else 'low'}", f"alert {i}") for i in range(40)]
    df = spark.createDataFrame(rows, "topic string, value string")
    df.repartition(2).write.format("fsbus").mode("append").option("path", str(root)).save()

    one = spark.createDataFrame([("hello",)], "value string")
    (
        one.write.format("fsbus")
        .mode("append")
        .option("path", str(root))
        .option("topic", "work.items")
        .option("single", "true")
        .save()
    )

    with BlockingBus(root) as bus:
        seen = Counter()
        for info in bus.browse("#"):
            seen[(info.topic, bus.read_payload(info), info.single)] += 1
    expected = Counter((t, v.encode(), False) for t, v in rows)
    expected[("work.items", b"hello", True)] += 1
    assert seen == expected


def test_a_narrower_schema_reads_only_its_columns(spark: Any, root: Path) -> None:
    with Stream.open(root, "events") as stream:
        stream.append_batch(RecordIn(f"v{i}".encode(), key=b"k") for i in range(50))

    df = (
        spark.read.format("fsbus")
        .schema("value binary, offset long")
        .option("path", str(root))
        .option("stream", "events")
        .load()
    )
    assert df.columns == ["value", "offset"]
    rows = df.collect()
    assert sorted((r.offset, bytes(r.value)) for r in rows) == [
        (i, f"v{i}".encode()) for i in range(50)
    ]


def test_a_schema_the_stream_cannot_fill_is_refused(spark: Any, root: Path) -> None:
    with Stream.open(root, "events") as stream:
        stream.append(b"x")
    reader = (
        spark.read.format("fsbus")
        .schema("value binary, colour string")
        .option("path", str(root))
        .option("stream", "events")
    )
    with pytest.raises(Exception, match="'colour' is not in a Stream's rows"):
        reader.load().collect()
