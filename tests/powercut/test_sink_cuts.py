"""Power cuts during the Spark sink's exactly-once commit (fsbus/spark/_sink.py).

A run stages each batch's rows (several partitions, as Spark tasks would) and publishes
it (the driver's commit), batch after batch, with the power cut after the k-th
filesystem operation. Then Spark is modelled as it restarts:

* a batch whose ``publish`` returned was reported committed: its rows must be in the
  target exactly once *before* anything is replayed;
* Spark writes its own commit log only after the sink's commit returned, so the last
  returned batch may still be replayed, and every batch after it is: the replay
  recomputes the batch (stages it again under new task attempts) and publishes it with
  the same batch id. Afterwards every batch's rows are in the target exactly once.

A second variant replays with the first run's commit messages where all their staged
files survived (a replay that only reran the commit), staging again otherwise.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from pyspark import TaskContext

from fsbus import BlockingBus, SegmentStager, Stream
from fsbus.spark._names import ID_HEADER
from fsbus.spark._options import SinkOptions
from fsbus.spark._sink import SinkColumns, StagedFile, publish, stage

from .checks import Tally, count_ops, cut_points, run_until_cut
from .harness import PowerCut

# Each test replays the workload at every cut point on a FUSE filesystem: minutes on a
# slow machine. The limit guards against a hang, it is not a speed assertion.
pytestmark = pytest.mark.timeout(900)

SINK = "q1"
BASE = 2  # records in the target stream before every run (synced)
PARTS = 3  # Spark partitions (staged files) per batch
BATCHES = ("0", "1")

_attempts = itertools.count(1000)


@dataclass(frozen=True)
class _Task:
    """What ``stage`` asks of Spark's TaskContext."""

    partition: int
    attempt: int

    def partitionId(self) -> int:  # Spark's names
        return self.partition

    def taskAttemptId(self) -> int:
        return self.attempt


def rows(batch: str, part: int) -> list[bytes]:
    """The values partition ``part`` of ``batch`` writes (unique across the run)."""
    return [f"b{batch}-p{part}-r{i}-".encode() * (1 + i % 5) for i in range(2 + part)]


def cols(batch: str) -> SinkColumns:
    # batch 0: plain values (the Stream's append_values path); batch 1: keys and headers
    if batch == "0":
        return SinkColumns(value="value", key=None, headers=None, topic=None)
    return SinkColumns(value="value", key="key", headers="headers", topic=None)


def arrow_rows(batch: str, part: int) -> Iterator[pa.RecordBatch]:
    values = rows(batch, part)
    data: dict[str, Any] = {"value": pa.array(values, pa.binary())}
    if batch != "0":
        data["key"] = pa.array([f"k{i}".encode() for i in range(len(values))], pa.binary())
        data["headers"] = pa.array(
            [[("n", str(i))] for i in range(len(values))], pa.map_(pa.string(), pa.string())
        )
    yield pa.RecordBatch.from_pydict(data)


def stage_batch(opts: SinkOptions, batch: str) -> list[StagedFile]:
    """Run the batch's write tasks: one staged file per partition, fresh attempt ids."""
    out = []
    for part in range(PARTS):
        task = _Task(part, next(_attempts))
        with mock.patch.object(TaskContext, "get", return_value=task):
            out.append(stage(opts, cols(batch), SINK, batch, arrow_rows(batch, part)))
    return out


def expected(batch: str) -> list[bytes]:
    return [v for part in range(PARTS) for v in rows(batch, part)]


def options(root: str, stream: str | None) -> SinkOptions:
    return SinkOptions(
        root=root,
        stream=stream,
        topic="sink.out" if stream is None else None,
        topic_column="topic",
        single=False,
        ttl=3600 if stream is None else None,
        priority=None,
        sink_id=SINK,
        create_stream=False,
    )


def run(
    opts: SinkOptions, batches: tuple[str, ...], messages: dict[str, list[Any]], acked: list[str]
) -> None:
    """Spark's micro-batches: stage, then commit; ``acked``: batches whose commit returned."""
    for batch in batches:
        messages[batch] = stage_batch(opts, batch)
        publish(opts, SINK, batch, messages[batch], replayable=True)
        acked.append(batch)


def target_values(opts: SinkOptions) -> list[bytes]:
    """Every value in the target after the base records, in order."""
    if opts.stream is not None:
        with Stream.open(opts.root, opts.stream, create=False) as s:
            return [r.value for r in s.read(BASE)]
    with BlockingBus(opts.root) as bus:  # the config the sink opens it with
        infos = list(bus.browse("#"))
        out = []
        for info in infos:
            payload = bus.read_payload(info)
            if payload is None or (info.headers or {}).get(ID_HEADER) is None:
                out.append(b"?" + (payload or b""))  # torn, or lost its headers
            else:
                out.append(payload)
        return out


def check(
    opts: SinkOptions, batches: tuple[str, ...], where: str, tally: Tally, *, whole: bool
) -> None:
    """``batches``' rows are there exactly once (in order for a Stream); with ``whole``,
    nothing else is there either (else rows of later batches may be there, once each)."""
    got = target_values(opts)
    counts = Counter(got)
    for batch in batches:
        want = expected(batch)
        missing = [v for v in want if counts[v] == 0]
        if missing:
            tally.lost.append(f"{where}: batch {batch} lost {len(missing)} of {len(want)} rows")
        twice = [v for v in want if counts[v] > 1]
        if twice:
            tally.corrupt.append(f"{where}: batch {batch}: {len(twice)} rows more than once")
        if opts.stream is not None and not missing and not twice:
            at = got.index(want[0])
            if got[at : at + len(want)] != want:
                tally.corrupt.append(f"{where}: batch {batch} not contiguous and in order")
    known = {v for b in BATCHES for v in expected(b)}
    stray = [v for v in got if v not in known]
    if stray:
        tally.corrupt.append(f"{where}: {len(stray)} stray or torn values, e.g. {stray[0]!r:.50}")
    if whole:
        extra = {v for v in got if v in known} - {v for b in batches for v in expected(b)}
        if extra:
            tally.corrupt.append(f"{where}: {len(extra)} rows of unpublished batches")
    checked = {v for b in batches for v in expected(b)}
    dups = [v for v, n in counts.items() if n > 1 and v in known and v not in checked]
    if dups:
        tally.corrupt.append(f"{where}: {len(dups)} rows of later batches more than once")


def replay(
    opts: SinkOptions,
    messages: dict[str, list[Any]],
    acked: list[str],
    *,
    reuse: bool,
) -> None:
    """Spark restarting: replay the last committed batch (its own commit log may not
    have made it) and every later one. ``reuse``: commit with the first run's messages
    where all their staged files are there, rather than recomputing."""
    first = BATCHES.index(acked[-1]) if acked else 0
    for batch in BATCHES[first:]:
        old = messages.get(batch)
        if reuse and old and all(_exists(m.path) for m in old):
            msgs = old
        else:
            msgs = stage_batch(opts, batch)
        publish(opts, SINK, batch, msgs, replayable=True)


def _exists(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def sweep_sink(
    pfs: PowerCut, state: str, opts: SinkOptions, *, every: int, randoms: int, seed: int
) -> Tally:
    tally = Tally()
    pfs.load(state)
    total = count_ops(pfs, lambda: run(opts, BATCHES, {}, []))
    target = "stream" if opts.stream is not None else "bus"
    for k in cut_points(total, every=every, randoms=randoms, seed=seed):
        for reuse in (False, True):
            pfs.load(state)
            messages: dict[str, list[Any]] = {}
            acked: list[str] = []
            run_until_cut(pfs, k, lambda m=messages, a=acked: run(opts, BATCHES, m, a))
            tally.cuts += 1
            where = f"{target} cut {k}/{total}{' reuse' if reuse else ''}"
            try:
                check(opts, tuple(acked), f"{where} before replay", tally, whole=False)
                replay(opts, messages, acked, reuse=reuse)
                check(opts, BATCHES, f"{where} after replay", tally, whole=True)
            except Exception as exc:  # a replay that cannot finish is a stuck query
                tally.corrupt.append(f"{where}: {type(exc).__name__}: {exc}")
    return tally


@pytest.fixture(scope="module")
def sink_state(pfs: PowerCut) -> str:
    """A synced root holding the target stream (BASE records) and an empty bus."""
    pfs.load("empty")
    root = f"{pfs.mountpoint}/sink"
    with Stream.open(root, "out") as s:
        for i in range(BASE):
            s.append(f"base-{i}".encode())
    with BlockingBus(root):  # its directories made and synced once
        pass
    pfs.sync()
    pfs.save("sink")
    return root


def test_stream_sink_commits_survive_cuts(pfs: PowerCut, sink_state: str, sweep: bool) -> None:
    """Each committed batch is in the stream once; a replay completes it, never twice."""
    opts = options(sink_state, "out")
    tally = sweep_sink(
        pfs, "sink", opts, every=1 if sweep else 6, randoms=20 if sweep else 3, seed=11
    )
    assert tally.cuts >= 5
    assert tally.ok(), (tally.lost, tally.corrupt)


def test_stream_sink_renamed_segments_survive_cuts(
    pfs: PowerCut, sink_state: str, sweep: bool
) -> None:
    """The same with every staged segment renamed into the stream (as a large batch's
    are): the rename is the append, and a replay appends only the files still staged."""
    opts = options(sink_state, "out")
    with mock.patch.object(SegmentStager, "ADOPT_BYTES", 1):
        tally = sweep_sink(
            pfs, "sink", opts, every=1 if sweep else 6, randoms=20 if sweep else 3, seed=13
        )
    assert tally.cuts >= 5
    assert tally.ok(), (tally.lost, tally.corrupt)


def test_bus_sink_commits_survive_cuts(pfs: PowerCut, sink_state: str, sweep: bool) -> None:
    """Each committed batch is on the bus once; a replay completes it, never twice."""
    opts = options(sink_state, None)
    tally = sweep_sink(
        pfs, "sink", opts, every=1 if sweep else 16, randoms=20 if sweep else 3, seed=12
    )
    assert tally.cuts >= 5
    assert tally.ok(), (tally.lost, tally.corrupt)
