"""The sink's commit protocol under real crashes: a child SIGKILLs itself mid-commit,
the replay (as Spark does after a driver crash) must publish every row exactly once."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from fsbus import BlockingBus, OffsetOutOfRange, RecordIn, SegmentStager, Stream
from fsbus.spark import BATCH_HEADER, ID_HEADER
from fsbus.spark._files import commits_dir, staging_dir
from fsbus.spark._options import SinkOptions, parse_sink_options
from fsbus.spark._sink import SinkColumns, StagedFile, publish, stage
from tests.lagging_view import lagging_view, segment_sizes

pytestmark = [pytest.mark.slow]

CHILD = Path(__file__).with_name("sink_crash_child.py")
SINK = "test-sink"
BATCH = "7"


def stage_rows(
    opts: SinkOptions, rows: list[dict[str, Any]], parts: int, batch: str = BATCH
) -> list[StagedFile]:
    """Stage rows as ``parts`` Spark tasks would (a fresh attempt each call)."""
    cols = SinkColumns(
        value="value",
        key="key" if opts.stream else None,
        headers="headers",
        topic="topic" if "topic" in rows[0] else None,
    )
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [("value", pa.string()), ("headers", pa.map_(pa.string(), pa.string()))]
            + ([("key", pa.string())] if cols.key else [])
            + ([("topic", pa.string())] if cols.topic else [])
        ),
    )
    size = -(-len(rows) // parts)
    return [
        stage(opts, cols, SINK, batch, iter(table.slice(i * size, size).to_batches()))
        for i in range(parts)
    ]


def crash(
    tmp_path: Path, opts: SinkOptions, messages: list[StagedFile], point: str, n: int
) -> None:
    (tmp_path / "m.pickle").write_bytes(pickle.dumps(messages))
    (tmp_path / "o.pickle").write_bytes(pickle.dumps(opts))
    child = subprocess.run(
        [
            sys.executable,
            str(CHILD),
            str(tmp_path / "m.pickle"),
            str(tmp_path / "o.pickle"),
            SINK,
            BATCH,
            point,
            str(n),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr


def stream_rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "value": f"row {i}",
            "key": f"k{i % 5}" if i % 2 else None,
            "headers": {"i": str(i)} if i % 3 == 0 else {},
        }
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("point", "n"),
    [("records", 0), ("records", 1), ("records", 1500), ("records", 2999), ("done", 0)],
)
def test_stream_commit_replay_after_crash(tmp_path: Path, point: str, n: int) -> None:
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out", "sinkId": SINK}, streaming=True)
    rows = stream_rows(3000)
    with Stream.open(root, "out") as stream:
        stream.append("before")
    crash(tmp_path, opts, stage_rows(opts, rows, parts=3), point, n)
    with Stream.open(root, "out") as stream:  # another writer appends after the crash
        stream.append("foreign")

    # Spark replays the batch: the tasks run again and stage fresh files.
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=2), replayable=True) == 3000
    # A second replay (driver died again before Spark logged the commit) does nothing.
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=2), replayable=True) == 0

    with Stream.open(root, "out", create=False) as stream:
        stored = list(stream.read())
    ours = [
        (
            r.value.decode(),
            r.key.decode() if r.key else None,
            {k: v for k, v in r.headers.items() if k != BATCH_HEADER},
        )
        for r in stored
        if r.value not in (b"before", b"foreign")
    ]
    assert ours == [(r["value"], r["key"], r["headers"]) for r in rows]
    assert sorted(r.value for r in stored if r.value in (b"before", b"foreign")) == [
        b"before",
        b"foreign",
    ]
    markers = sorted(p.name for p in commits_dir(str(root), SINK).iterdir())
    assert markers == [f"{BATCH}.done"]
    assert not staging_dir(str(root), SINK, BATCH).exists()


@pytest.mark.parametrize(("point", "n"), [("ledger", 0), ("ledger", 37), ("done", 0)])
def test_bus_commit_replay_after_crash(tmp_path: Path, point: str, n: int) -> None:
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "sinkId": SINK, "ttl": "3600"}, streaming=True)
    rows = [
        {"topic": f"alerts.{i % 4}", "value": f"alert {i}", "headers": {"n": str(i)}}
        for i in range(80)
    ]
    crash(tmp_path, opts, stage_rows(opts, rows, parts=2), point, n)
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=3), replayable=True) == 80
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=3), replayable=True) == 0

    with BlockingBus(root) as bus:
        infos = list(bus.browse("#"))
        seen = Counter((i.topic, bus.read_payload(i), i.headers["n"]) for i in infos)
    assert seen == Counter((r["topic"], r["value"].encode(), r["headers"]["n"]) for r in rows)
    ids = Counter(i.headers[ID_HEADER] for i in infos)
    assert sorted(ids) == sorted(f"{SINK}/{BATCH}:{i}" for i in range(80))


def large_rows(n: int) -> list[dict[str, Any]]:
    """Rows of 1,000-byte values: 10,000 of them stage a segment the commit renames."""
    return [{"value": f"{i:08d}".ljust(1000, "x"), "key": None, "headers": {}} for i in range(n)]


@pytest.mark.parametrize(("point", "n"), [("rename", 0), ("rename", 1), ("done", 0)])
def test_stream_commit_renames_large_segments_exactly_once(
    tmp_path: Path, point: str, n: int
) -> None:
    """Large staged segments are renamed into the stream; a crash between two renames,
    or after both, is replayed with every row once (a file still staged was not
    appended, one gone was), whatever another writer appended meanwhile."""
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out", "sinkId": SINK}, streaming=True)
    rows = large_rows(20_000)
    with Stream.open(root, "out") as stream:
        stream.append("before")
    staged = stage_rows(opts, rows, parts=2)
    assert [Path(m.path).stat().st_size >= SegmentStager.ADOPT_BYTES for m in staged] == [
        True,
        True,
    ]
    crash(tmp_path, opts, staged, point, n)
    with Stream.open(root, "out") as stream:
        stream.append("foreign")
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=2), replayable=True) == 20_000
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=2), replayable=True) == 0

    with Stream.open(root, "out", create=False) as stream:
        stored = [r.value.decode() for r in stream.read()]
        segments = len(stream.info().segments)
    renamed = {"rename": n, "done": 2}[point]
    expect = [r["value"] for r in rows]
    cut = 10_000 * renamed
    assert stored == ["before", *expect[:cut], "foreign", *expect[cut:]]
    assert segments >= 3  # the first segment, then one per staged file
    markers = sorted(p.name for p in commits_dir(str(root), SINK).iterdir())
    assert markers == [f"{BATCH}.done"]
    assert not staging_dir(str(root), SINK, BATCH).exists()


def test_only_the_attempt_spark_kept_is_published(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out", "sinkId": SINK}, streaming=True)
    rows = stream_rows(10)
    failed_attempt = stage_rows(opts, rows, parts=1)  # its task died; Spark retried it
    kept = stage_rows(opts, rows, parts=1)
    assert Path(failed_attempt[0].path).exists()
    assert publish(opts, SINK, BATCH, kept, replayable=True) == 10
    with Stream.open(root, "out", create=False) as stream:
        assert stream.end_offset == 10
        assert stream.staged() == []  # the dead attempt's staged segment went too
    assert not staging_dir(str(root), SINK, BATCH).exists()


def test_dead_attempts_and_older_batches_leftovers_are_removed(tmp_path: Path) -> None:
    """Staged segments no commit names (an attempt whose executor died after staging, or
    one that finished after its batch was committed) are removed by that batch's commit,
    or by a later batch's; files of other stagers are left alone."""
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out", "sinkId": SINK}, streaming=True)
    rows = stream_rows(10)
    orphan = stage_rows(opts, rows, parts=1)  # batch 7; Spark kept another attempt
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=1), replayable=True) == 10
    assert not Path(orphan[0].path).exists()
    with Stream.open(root, "out", create=False) as stream:
        late = stream.stager(f"{SINK}~{BATCH}~00099-1")  # batch 7, after its commit
        late.add_records([b"late"])
        late.finish()
        other = stream.stager("someone-else")
        other.add_records([b"not the sink's"])
        theirs = other.finish()
    assert (
        publish(opts, SINK, "8", stage_rows(opts, rows, parts=1, batch="8"), replayable=True) == 10
    )
    with Stream.open(root, "out", create=False) as stream:
        assert stream.staged() == [theirs[0].path]
        assert stream.end_offset == 20


def plain_rows(n: int) -> list[dict[str, Any]]:
    """Rows with a value only: the sink appends them as plain values (its fast path)."""
    return [{"value": f"plain {i:05d}", "key": None, "headers": {}} for i in range(n)]


@pytest.mark.parametrize("plain", [False, True])
@pytest.mark.parametrize("appended", [1, 1234, 2999])
def test_stream_commit_replay_after_a_torn_batch(
    tmp_path: Path, appended: int, plain: bool
) -> None:
    """A crash between two frames of one append leaves a prefix of the batch on disk."""
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out", "sinkId": SINK}, streaming=True)
    rows = plain_rows(3000) if plain else stream_rows(3000)
    crash(tmp_path, opts, stage_rows(opts, rows, parts=2), "records", 0)  # pending, no rows
    torn_append(root, rows, 0, appended)
    with Stream.open(root, "out") as stream:
        stream.append("foreign")
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=3), replayable=True) == 3000
    with Stream.open(root, "out", create=False) as stream:
        values = [r.value.decode() for r in stream.read()]
    assert values == [r["value"] for r in rows[:appended]] + ["foreign"] + [
        r["value"] for r in rows[appended:]
    ]
    if plain:  # one marked record per attempt, the rest plain
        with Stream.open(root, "out", create=False) as stream:
            marked = [r.offset for r in stream.read() if r.headers]
        assert marked == [0, appended + 1]


def test_plain_stream_commit_replay_after_crash_before_done(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out", "sinkId": SINK}, streaming=True)
    rows = plain_rows(5000)
    crash(tmp_path, opts, stage_rows(opts, rows, parts=2), "done", 0)
    with Stream.open(root, "out") as stream:
        stream.append("foreign")
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=3), replayable=True) == 5000
    with Stream.open(root, "out", create=False) as stream:
        stored = list(stream.read())
    assert [r.value.decode() for r in stored] == [r["value"] for r in rows] + ["foreign"]
    assert [dict(r.headers) for r in stored if r.headers] == [{BATCH_HEADER: f"{SINK}/{BATCH}:0"}]


def torn_append(root: Path, rows: list[dict[str, Any]], skip: int, stop: int) -> None:
    """What a dead attempt's first frames leave: rows[skip:stop], the first one marked."""
    mark = f"{SINK}/{BATCH}:{skip}"
    with Stream.open(root, "out") as stream:
        stream.append_batch(
            RecordIn(
                value=r["value"],
                key=r["key"],
                headers={**r["headers"], BATCH_HEADER: mark} if i == skip else r["headers"],
            )
            for i, r in enumerate(rows[skip:stop], start=skip)
        )


def test_stream_commit_survives_two_crashes_in_a_row(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out", "sinkId": SINK}, streaming=True)
    rows = stream_rows(3000)
    crash(tmp_path, opts, stage_rows(opts, rows, parts=2), "records", 0)
    torn_append(root, rows, 0, 1000)
    with Stream.open(root, "out") as stream:
        stream.append("foreign 1")
    # The replay dies too, after writing the first 500 of the remaining rows.
    crash(tmp_path, opts, stage_rows(opts, rows, parts=2), "records", 0)
    torn_append(root, rows, 1000, 1500)
    with Stream.open(root, "out") as stream:
        stream.append("foreign 2")

    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=2), replayable=True) == 3000
    with Stream.open(root, "out", create=False) as stream:
        values = [r.value.decode() for r in stream.read()]
    ours = [r["value"] for r in rows]
    assert values == [*ours[:1000], "foreign 1", *ours[1000:1500], "foreign 2", *ours[1500:]]


def test_batch_job_append_leaves_no_markers(tmp_path: Path) -> None:
    # A batch job is never replayed: its rows go straight in, with no marker files and
    # no marked record, and its staging is removed.
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out"}, streaming=False)
    rows = [{"value": f"v{i}", "key": None, "headers": {}} for i in range(500)]
    assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=3), replayable=False) == 500
    with Stream.open(root, "out", create=False) as stream:
        stored = list(stream.read())
    assert [r.value for r in stored] == [f"v{i}".encode() for i in range(500)]
    assert all(not r.headers for r in stored)
    assert not commits_dir(str(root), SINK).exists()
    assert not staging_dir(str(root), SINK, BATCH).exists()


@pytest.mark.parametrize("heal_after", [2, None])
def test_stream_commit_replay_through_a_lagging_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, heal_after: int | None
) -> None:
    """The attempt that crashed appended on another host, and the replay's host does not
    see those records yet (a shared mount's stale view): reading only what it sees, the
    replay would append them again. It reads on to the end the append lock shows; if
    that stays unreadable it fails, appending nothing, and a later replay completes."""
    root = tmp_path / "bus"
    opts = parse_sink_options({"path": str(root), "stream": "out", "sinkId": SINK}, streaming=True)
    rows = stream_rows(3000)
    with Stream.open(root, "out") as stream:
        stream.append("before")
        before = segment_sizes(stream.path)
    crash(tmp_path, opts, stage_rows(opts, rows, parts=2), "records", 0)  # pending, no rows
    torn_append(root, rows, 0, 1234)  # what the dead attempt got onto disk
    with lagging_view(monkeypatch, before, heal_after=heal_after) as view:
        if heal_after is None:
            with pytest.raises(OffsetOutOfRange, match=r"offsets 1\.\.1234 exist"):
                publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=2), replayable=True)
        else:
            n = publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=2), replayable=True)
            assert n == 3000
    if heal_after is None:  # the view has caught up: Spark's next replay
        assert publish(opts, SINK, BATCH, stage_rows(opts, rows, parts=2), replayable=True) == 3000
    with Stream.open(root, "out", create=False) as stream:
        values = [r.value.decode() for r in stream.read()]
    assert values == ["before", *(r["value"] for r in rows)]
    assert len(view.sleeps) == (heal_after or 8)
