"""Bus topics as a streaming source: what services publish, each message once in Spark."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import PANDAS_WARNING

from fsbus import BlockingBus, Stream

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings(PANDAS_WARNING),
    pytest.mark.timeout(300),
]


def run_once(spark: Any, root: Path, checkpoint: Path, **options: str) -> Any:
    from pyspark.sql import functions as F

    reader = spark.readStream.format("fsbus").option("path", str(root))
    for k, v in {"pattern": "orders.#", **options}.items():
        reader = reader.option(k, v)
    df = reader.load()
    query = (
        df.select(
            F.col("payload").alias("value"),
            F.col("topic").alias("key"),
            F.create_map(
                F.lit("kind"), F.col("kind"), F.lit("host"), F.coalesce(F.col("host"), F.lit(""))
            ).alias("headers"),
        )
        .writeStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "out")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


def out(root: Path) -> list[tuple[str, str, str]]:
    with Stream.open(root, "out") as s:
        return [
            (r.value.decode(), (r.key or b"").decode(), r.headers.get("kind", "")) for r in s.read()
        ]


def test_messages_published_while_running_or_stopped_arrive_once(
    spark: Any, root: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "ckpt"
    run_once(spark, root, checkpoint)  # the query exists from now on
    assert out(root) == []
    with BlockingBus(root) as bus:  # published while no query runs
        for i in range(200):
            bus.publish("orders.eu.new" if i % 2 else "orders.paid", f"m{i}", single=i % 3 == 0)
        bus.publish("invoices.new", "not matched")
    query = run_once(spark, root, checkpoint, maxRecordsPerTrigger="80")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [80, 80, 40]
    rows = out(root)
    assert Counter(v for v, _t, _k in rows) == Counter(f"m{i}" for i in range(200))
    assert {t for _v, t, _k in rows} == {"orders.eu.new", "orders.paid"}
    assert {k for _v, _t, k in rows} <= {"single", "multi"}
    # a restart with nothing new adds nothing; new messages come once
    run_once(spark, root, checkpoint)
    assert len(out(root)) == 200
    with BlockingBus(root) as bus:
        for i in range(200, 250):
            bus.publish("orders.x", f"m{i}")
    run_once(spark, root, checkpoint)
    assert Counter(v for v, _t, _k in out(root)) == Counter(f"m{i}" for i in range(250))


def test_the_rows_have_the_bus_schema(spark: Any, root: Path) -> None:
    stream = spark.readStream.format("fsbus").option("path", str(root)).option("pattern", "a.#")
    batch = spark.read.format("fsbus").option("path", str(root)).option("pattern", "a.#")
    assert stream.load().schema == batch.load().schema
    assert stream.load().columns[:3] == ["topic", "kind", "expires"]
