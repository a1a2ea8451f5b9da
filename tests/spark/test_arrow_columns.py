"""The connector's Arrow conversions, without a SparkSession: column batches in, values out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fsbus import InvalidConfig, RecordIn, Stream, StreamConfig, UsageError

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from fsbus.spark._arrow import _STREAM_ARROW, columns_batch  # noqa: E402
from fsbus.spark._options import parse_stream_source_options  # noqa: E402
from fsbus.spark._schema import ALL_STREAM_COLUMNS, stream_columns  # noqa: E402
from fsbus.spark._sink import value_chunks  # noqa: E402
from fsbus.spark._stream_source import StreamBatchReader  # noqa: E402


def _open(tmp_path: Path) -> Stream:
    return Stream.open(tmp_path, "s", config=StreamConfig(durability="none", max_frame_bytes=300))


def test_columns_batch_matches_the_records(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        s.append_batch([b"plain %d" % i for i in range(40)])
        s.append(b"", key="k", headers={"h": "v"}, timestamp=12.5)
        s.append_batch([RecordIn(b"x%d" % i, key=b"k%d" % i) for i in range(5)])
        parts = list(s.read_columns(3))
        assert len(parts) > 2
        batch = columns_batch("s", parts)
        records = list(s.read(3))
    assert batch.num_rows == len(records)
    rows = batch.to_pylist()
    for row, r in zip(rows, records, strict=True):
        assert row["stream"] == "s"
        assert row["offset"] == r.offset
        assert row["timestamp"].timestamp() == pytest.approx(r.timestamp, abs=1e-6)
        assert (row["key"], row["value"]) == (r.key, r.value)
        assert dict(row["headers"]) == dict(r.headers)


def test_columns_batch_of_plain_values_has_no_keys_or_headers(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        s.append_batch([b"%d" % i for i in range(100)])
        batch = columns_batch("s", list(s.read_columns(10, 90)))
    assert batch.column("offset").to_pylist() == list(range(10, 90))
    assert batch.column("value").to_pylist() == [b"%d" % i for i in range(10, 90)]
    assert batch.column("key").null_count == 80
    assert batch.column("headers").to_pylist() == [[]] * 80


def test_columns_batch_with_some_keys_missing(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        keys = [b"k%d" % i if i % 3 else None for i in range(30)]
        keys[4] = b""  # an empty key is a key, not a missing one
        s.append_batch([RecordIn(b"v%d" % i, key=k) for i, k in enumerate(keys)])
        batch = columns_batch("s", list(s.read_columns(0)))
    assert batch.schema == _STREAM_ARROW
    assert batch.column("key").to_pylist() == keys
    assert batch.column("value").to_pylist() == [b"v%d" % i for i in range(30)]


def _struct(*fields: tuple[str, object, bool]) -> StructType:
    return StructType([StructField(name, kind, nullable) for name, kind, nullable in fields])


def test_a_narrower_schema_returns_only_its_columns(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        s.append_batch([b"%d" % i for i in range(50)])
        parts = list(s.read_columns(5, 45))
    cols = stream_columns(_struct(("Value", BinaryType(), True), ("offset", LongType(), False)))
    assert cols.names == ("value", "offset")
    batch = columns_batch("s", parts, cols)
    assert batch.schema.names == ["Value", "offset"]  # spelled as the schema spells them
    assert not batch.schema.field("offset").nullable
    assert batch.column("Value").to_pylist() == [b"%d" % i for i in range(5, 45)]
    assert batch.column("offset").to_pylist() == list(range(5, 45))


def test_the_full_schema_reads_every_column() -> None:
    # STREAM_SCHEMA as Spark parses it and hands it to the reader
    full = _struct(
        ("stream", StringType(), True),
        ("offset", LongType(), True),
        ("timestamp", TimestampType(), True),
        ("key", BinaryType(), True),
        ("value", BinaryType(), True),
        ("headers", MapType(StringType(), StringType()), True),
    )
    assert stream_columns(full) is ALL_STREAM_COLUMNS
    assert stream_columns(None) is ALL_STREAM_COLUMNS


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (_struct(("payload", BinaryType(), True)), "'payload' is not in a Stream's rows"),
        (_struct(("value", StringType(), True)), "'value' is binary in a Stream's rows"),
        (_struct(("key", BinaryType(), False)), "declare it nullable"),
        (
            _struct(("value", BinaryType(), True), ("VALUE", BinaryType(), True)),
            "names column 'VALUE' twice",
        ),
        (StructType([]), "names no column"),
    ],
)
def test_a_schema_the_stream_cannot_fill_is_refused(schema: StructType, message: str) -> None:
    with pytest.raises(InvalidConfig, match=message):
        stream_columns(schema)


def test_the_batch_reader_builds_only_the_requested_columns(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        s.append_batch([b"%d" % i for i in range(20)])
    opts = parse_stream_source_options({"path": str(tmp_path), "stream": "s"})
    reader = StreamBatchReader(opts, _struct(("offset", LongType(), True)))
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert {b.schema.names[0] for b in batches} == {"offset"}
    assert [o for b in batches for o in b.column(0).to_pylist()] == list(range(20))


def test_reading_does_not_import_pandas(tmp_path: Path) -> None:
    # pa.array() imports pandas (~0.1 s) the first time; a fresh Spark worker would pay it
    with _open(tmp_path) as s:
        s.append_batch([RecordIn(b"v", key=b"k" if i % 2 else None) for i in range(20)])
    code = (
        "import sys\n"
        "from fsbus.spark._options import parse_stream_source_options\n"
        "from fsbus.spark._stream_source import StreamBatchReader\n"
        f"opts = parse_stream_source_options({{'path': {str(tmp_path)!r}, 'stream': 's'}})\n"
        "reader = StreamBatchReader(opts)\n"
        "rows = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))\n"
        "print(rows, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["20", "False"]


def test_planning_a_streaming_read_loads_no_arrow(tmp_path: Path) -> None:
    # Spark plans each streaming query in a Python process of its own: it asks for offsets
    # and ranges, never for a row, so it should not pay for importing pyarrow and NumPy
    with _open(tmp_path) as s:
        s.append_batch([b"v"] * 20)
    code = (
        "import sys\n"
        "from fsbus.spark import FsBusDataSource\n"
        f"source = FsBusDataSource({{'path': {str(tmp_path)!r}, 'stream': 's'}})\n"
        "reader = source.streamReader(None)\n"
        "start = reader.initialOffset()\n"
        "end = reader.latestOffset(start, reader.getDefaultReadLimit())\n"
        "parts = reader.partitions(start, end)\n"
        "print(end['s'], len(parts), 'pyarrow' in sys.modules, 'numpy' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["20", "1", "False", "False"]


def _joined(chunks: list[tuple[memoryview, Any]]) -> tuple[bytes, list[int]]:
    return b"".join(bytes(d) for d, _ in chunks), [n for _, lens in chunks for n in lens]


def test_value_chunks_read_arrow_buffers() -> None:
    chunks = [
        pa.array([b"a", b"", b"ccc"], pa.binary()),
        pa.array([b"dd", b"eeeee", b"f"], pa.binary()).slice(1),
    ]
    column = pa.chunked_array(chunks)
    got = value_chunks(column)
    assert [(bytes(d), list(n)) for d, n in got] == [(b"accc", [1, 0, 3]), (b"eeeeef", [5, 1])]
    assert _joined(value_chunks(column, 2)) == (b"ccceeeeef", [3, 5, 1])
    assert _joined(value_chunks(column, 4)) == (b"f", [1])
    assert _joined(value_chunks(pa.chunked_array([pa.array([b""] * 3, pa.binary())]))) == (
        b"",
        [0, 0, 0],
    )


@pytest.mark.parametrize("durability", ["none", "batch", "record"])
def test_staged_chunks_are_appended_as_one_batch(tmp_path: Path, durability: str) -> None:
    # what the sink's commit does: each Arrow chunk written from where it lies, in one
    # append, the marker on the first record only (an empty chunk and a chunk cut
    # short by the marker are fine)
    chunks = [
        pa.array([b"a", b"bb"], pa.binary()),
        pa.array([], pa.binary()),
        pa.array([b"ccc", b"", b"dddd"], pa.binary()),
    ]
    config = StreamConfig(durability=durability, max_frame_bytes=300)  # type: ignore[arg-type]
    with Stream.open(tmp_path, "s", config=config) as s:
        s.append(b"before")
        got = s.append_value_chunks(
            value_chunks(pa.chunked_array(chunks, pa.binary())), first_headers={"m": "1"}
        )
        assert got == range(1, 6)
        records = list(s.read(1))
    assert [r.value for r in records] == [b"a", b"bb", b"ccc", b"", b"dddd"]
    assert [dict(r.headers) for r in records] == [{"m": "1"}, {}, {}, {}, {}]


def test_a_bad_chunk_appends_nothing(tmp_path: Path) -> None:
    with Stream.open(tmp_path, "s") as s:
        with pytest.raises(UsageError, match="add up to 3 bytes but data holds 2"):
            s.append_value_chunks([(b"ab", [1, 1]), (b"cd", [1, 2])])
        assert s.append_value_chunks([]) == range(0)
        assert s.end_offset == 0
