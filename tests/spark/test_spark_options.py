"""Option parsing and offset maths of the Spark connector (pure: no Spark, no files)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from fsbus import InvalidConfig
from fsbus.spark._options import (
    parse_sink_options,
    parse_stream_source_options,
    reader_kind,
)
from fsbus.spark._plan import OffsetRange, cap_offsets, split_ranges


def test_stream_source_defaults() -> None:
    opts = parse_stream_source_options({"path": "/bus", "Stream": "a,b"})
    assert opts.streams == ("a", "b")
    assert opts.starting == {"a": "earliest", "b": "earliest"}
    assert opts.ending == {"a": "latest", "b": "latest"}
    assert opts.max_records_per_trigger is None
    assert opts.fail_on_data_loss is True


def test_starting_offsets_forms() -> None:
    one = parse_stream_source_options({"path": "/b", "stream": "s", "startingOffsets": "7"})
    assert one.starting == {"s": 7}
    many = parse_stream_source_options(
        {"path": "/b", "stream": "s,t", "startingOffsets": '{"t": 3, "s": "latest"}'}
    )
    assert many.starting == {"s": "latest", "t": 3}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"stream": "s"}, "missing option 'path'"),
        ({"path": "/b"}, "missing option 'stream'"),
        ({"path": "/b", "stream": ".hidden"}, "bad stream name '.hidden'"),
        ({"path": "/b", "stream": "s", "startingOffsets": "soon"}, "'startingOffsets' must be"),
        ({"path": "/b", "stream": "s", "startingOffsets": "-3"}, "'startingOffsets' must be"),
        ({"path": "/b", "stream": "s", "startingOffsets": '{"x": 1}'}, "names stream(s) ['x']"),
        ({"path": "/b", "stream": "s,t", "startingOffsets": "4"}, "exactly one stream"),
        ({"path": "/b", "stream": "s", "maxRecordsPerTrigger": "0"}, "positive integer"),
        ({"path": "/b", "stream": "s", "startingTimestamp": "noon"}, "seconds since the epoch"),
        ({"path": "/b", "stream": "s", "bogus": "1"}, "unknown option(s) 'bogus'"),
        (
            {"path": "/b", "stream": "s", "startingOffsets": "5", "endingOffsets": "2"},
            "is before startingOffsets 5",
        ),
    ],
)
def test_bad_source_options(options: dict[str, str], fragment: str) -> None:
    def check() -> None:
        reader_kind(options)
        parse_stream_source_options(options)

    with pytest.raises(InvalidConfig) as err:
        check()
    assert fragment in str(err.value)


def test_sink_options() -> None:
    s = parse_sink_options(
        {"path": "/b", "stream": "out", "checkpointLocation": "/ck"}, streaming=True
    )
    assert s.stream == "out"
    assert s.sink_id is not None
    assert s.sink_id.startswith("ckpt-")
    same = parse_sink_options(
        {"path": "/b", "stream": "out", "checkpointlocation": "/ck"}, streaming=True
    )
    assert same.sink_id == s.sink_id
    other = parse_sink_options(
        {"path": "/b", "stream": "elsewhere", "checkpointLocation": "/ck"}, streaming=True
    )
    assert other.sink_id != s.sink_id
    bus = parse_sink_options({"path": "/b", "topic": "a.b", "ttl": "30"}, streaming=False)
    assert (bus.topic, bus.ttl, bus.sink_id) == ("a.b", 30.0, None)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"path": "/b", "stream": "s", "topic": "t"}, "exclude each other"),
        ({"path": "/b", "stream": "s", "single": "true"}, "applies to publishing on the Bus"),
        ({"path": "/b", "topic": "t", "priority": "300"}, "0..255"),
        ({"path": "/b", "topic": "t", "ttl": "-1"}, "positive number"),
        ({"path": "/b", "topic": "t", "sinkId": "../x"}, "'sinkId'"),
    ],
)
def test_bad_sink_options(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidConfig) as err:
        parse_sink_options(options, streaming=False)
    assert fragment in str(err.value)


def test_streaming_sink_needs_a_stable_id() -> None:
    with pytest.raises(InvalidConfig, match="checkpointLocation"):
        parse_sink_options({"path": "/b", "stream": "s"}, streaming=True)


def test_cap_offsets_shares_the_budget() -> None:
    assert cap_offsets({"a": 0}, {"a": 10}, None) == {"a": 10}
    assert cap_offsets({"a": 0}, {"a": 10}, 4) == {"a": 4}
    # b has little backlog: it takes all of it, a gets the rest.
    assert cap_offsets({"a": 0, "b": 5}, {"a": 100, "b": 7}, 10) == {"a": 8, "b": 7}
    # Equal backlogs: an even split (the remainder of the division goes to one stream).
    assert cap_offsets({"a": 0, "b": 0, "c": 0}, {"a": 9, "b": 9, "c": 9}, 10) == {
        "a": 3,
        "b": 3,
        "c": 4,
    }
    # Never behind the start, never past the latest.
    assert cap_offsets({"a": 5}, {"a": 5}, 3) == {"a": 5}


def test_split_ranges() -> None:
    assert split_ranges({"a": 0}, {"a": 0}, max_per_range=10) == []
    assert split_ranges({"a": 0}, {"a": 25}, max_per_range=10) == [
        OffsetRange("a", 0, 10),
        OffsetRange("a", 10, 20),
        OffsetRange("a", 20, 25),
    ]
    parts = split_ranges({"a": 3, "b": 0}, {"a": 13, "b": 2}, max_per_range=100, min_ranges=4)
    assert sum(p.count for p in parts) == 12
    assert len(parts) >= 4
    assert {p.stream for p in parts} == {"a", "b"}


def test_public_names() -> None:
    import fsbus.spark

    assert set(fsbus.spark.__all__) == {
        "BATCH_HEADER",
        "BUS_SCHEMA",
        "ID_HEADER",
        "STREAM_SCHEMA",
        "FsBusDataSource",
        "register",
        "value_as_json",
        "value_as_string",
    }
    assert fsbus.spark.FsBusDataSource.name() == "fsbus"
