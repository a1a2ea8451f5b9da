"""The connector's Arrow conversions, without a SparkSession: column batches in, values out."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsbus import RecordIn, Stream, StreamConfig

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from fsbus.spark._schema import columns_batch  # noqa: E402
from fsbus.spark._sink import packed_values  # noqa: E402


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


def test_packed_values_reads_arrow_buffers() -> None:
    chunks = [
        pa.array([b"a", b"", b"ccc"], pa.binary()),
        pa.array([b"dd", b"eeeee", b"f"], pa.binary()).slice(1),
    ]
    column = pa.chunked_array(chunks)
    data, lengths = packed_values(column)
    assert (bytes(data), list(lengths)) == (b"accceeeeef", [1, 0, 3, 5, 1])
    data, lengths = packed_values(column, 2)
    assert (bytes(data), list(lengths)) == (b"ccceeeeef", [3, 5, 1])
    data, lengths = packed_values(pa.chunked_array([pa.array([b""] * 3, pa.binary())]))
    assert (bytes(data), list(lengths)) == (b"", [0, 0, 0])
