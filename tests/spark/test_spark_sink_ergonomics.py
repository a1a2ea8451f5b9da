"""What a user meets first when writing: finding the data source, save modes, bad options."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import PANDAS_WARNING, spark_env

from fsbus import Stream, StreamNotFound

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings(PANDAS_WARNING),
    pytest.mark.timeout(300),
]

CHILD = Path(__file__).with_name("discovery_child.py")


def test_spark_finds_the_source_module() -> None:
    import pyspark_fsbus
    from fsbus.spark import FsBusDataSource

    # What PySpark's lookup does: every top-level pyspark_* module's DefaultSource.
    assert "pyspark_fsbus" in {m.name for m in pkgutil.iter_modules()}
    assert pyspark_fsbus.DefaultSource is FsBusDataSource
    assert pyspark_fsbus.DefaultSource.name() == "fsbus"


def test_format_fsbus_works_without_register(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    root.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, str(CHILD), str(root), str(scratch)],
        env={**os.environ, **spark_env()},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["a", "b", "c"]
    with Stream.open(root, "found", create=False) as stream:
        assert stream.end_offset == 3


def test_default_save_mode_is_refused_by_spark_before_writing(spark: Any, root: Path) -> None:
    from pyspark.errors import AnalysisException

    df = spark.createDataFrame([("a",)], "value string")
    writer = df.write.format("fsbus").option("path", str(root)).option("stream", "s")
    # Spark refuses ErrorIfExists and Ignore for every Python data source, before any of
    # the source's code runs; the message names the modes that work.
    with pytest.raises(AnalysisException, match="Append"):
        writer.save()
    with pytest.raises(StreamNotFound):
        Stream.open(root, "s", create=False)
    writer.mode("append").save()
    with Stream.open(root, "s", create=False) as stream:
        assert [r.value for r in stream.read()] == [b"a"]


def test_overwrite_says_append_only(spark: Any, root: Path) -> None:
    df = spark.createDataFrame([("a",)], "value string")
    writer = df.write.format("fsbus").mode("overwrite").option("path", str(root))
    with pytest.raises(Exception, match=r"append-only: use mode\('append'\)"):
        writer.option("stream", "s").save()
    with pytest.raises(StreamNotFound):
        Stream.open(root, "s", create=False)


def test_bad_streaming_sink_option_stops_the_query_with_the_message(
    spark: Any, root: Path, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    with Stream.open(root, "in") as stream:
        stream.append_batch([b"x", b"y"])
    query = (
        spark.readStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "in")
        .load()
        .select("value")
        .writeStream.format("fsbus")
        .option("path", str(root))
        .option("stream", "out")
        .option("bogus", "1")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()  # Spark runs no code of a Python sink here
    )
    with pytest.raises(StreamingQueryException, match=r"unknown option\(s\) 'bogus'"):
        query.awaitTermination(120)
    assert not query.isActive
    with pytest.raises(StreamNotFound):
        Stream.open(root, "out", create=False)
