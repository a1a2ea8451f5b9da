"""Writes into a Stream or onto the Bus, exactly once per batch.

Protocol (one *batch key* per Spark micro-batch, or per batch job):

1. ``write()`` runs in each Spark task and stages the task's rows in
   ``spark/staging/<sink>/<batch>/<partition>-<task attempt>.arrow`` (written to a temporary
   name, then renamed). A retried task attempt writes its own file; the commit message
   names the file, so only the attempt Spark kept is published.
2. ``commit(messages, batchId)`` runs on the driver. If ``<batch>.done`` exists the batch
   was published before (a replay after a crash): nothing is done. Otherwise:

   * Stream: a ``<batch>.pending`` marker records the staged files and where the append
     starts, then all rows are appended with one ``append_batch`` (one lock hold, so they
     are contiguous); the first carries the header ``fsbus-spark-batch``. After a crash,
     the replay finds that first record, counts how many staged rows follow it, and
     appends only the rest (recording the new attempt in the pending marker first).
   * Bus: a ``<batch>.ledger`` lists the staged files, then the index of each message once
     it is published. Each message carries the header ``fsbus-spark-id`` =
     ``<sink>/<batch>:<index>``, and is published durably. The ledger's lines are not
     synced, so after a crash the messages missing from it are looked up by that header
     (one ``browse``).

   Then ``<batch>.done`` is written atomically and the staging is removed. Markers,
   staged files and the directories holding them are synced: a replay after a power cut
   finds what the first attempt left.
3. ``abort()`` removes the staged files of the failed attempt.

The replay always republishes the *first* attempt's staged rows, so the result does not
depend on Spark recomputing identical rows.
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from fsbus import (
    InvalidConfig,
    RecordIn,
    SegmentStager,
    Stream,
    StreamNotFound,
    UsageError,
    read_staged_columns,
)

from ._files import (
    Ledger,
    atomic_write_json,
    commits_dir,
    marker_names,
    read_json,
    read_staged,
    remove_empty_dir,
    remove_file,
    remove_tree,
    staging_dir,
    subdirs,
    write_staged,
)
from ._names import BATCH_HEADER, ID_HEADER
from ._options import SinkOptions

if TYPE_CHECKING:
    from fsbus import BlockingBus

__all__ = [
    "BATCH_HEADER",
    "ID_HEADER",
    "SinkColumns",
    "StagedFile",
    "discard",
    "publish",
    "sink_columns",
    "stage",
]

STAGED_FRAME_BYTES = 8 << 20
"""Frames of a task's staged segments: a renamed file's records appear to readers all at
once whatever its frames, and the commit rewrites and syncs one header page a frame (with
1 MiB frames that sync took half of a million-row commit's 40 ms)."""

KEEP_MARKERS = 100
"""Done markers kept per sink (Spark replays only the last batch or so)."""

_HEADERS = pa.map_(pa.string(), pa.string())


@dataclass(frozen=True)
class SinkColumns:
    """Which input columns a write uses (checked on the driver against the schema)."""

    value: str
    """Column of the record value / message payload (binary or string)."""
    key: str | None
    """Column of the record key (Streams only), if any."""
    headers: str | None
    """Column of the headers (map<string,string>), if any."""
    topic: str | None
    """Column of each message's topic (Bus, when no ``topic`` option), if any."""


@dataclass(frozen=True)
class StagedFile(WriterCommitMessage):
    """The commit message of one task: the file it staged. Spark pickles it to the driver."""

    path: str
    """The staged file: an Arrow file (the Bus), or the first staged segment (a Stream)."""
    rows: int
    """How many rows it holds."""
    partition: int
    """The Spark partition it came from (commit order)."""
    more: tuple[str, ...] = ()
    """The task's further staged segments, in order (a Stream's, cut at its segment size)."""


def sink_columns(schema: Any, opts: SinkOptions) -> SinkColumns:
    """Check the DataFrame's columns for this write; raise a clear error on a mismatch."""
    from pyspark.sql.types import BinaryType, MapType, StringType

    fields = {f.name: f.dataType for f in schema.fields}
    target = f"stream {opts.stream!r}" if opts.stream else "the Bus"
    names = ", ".join(f"{n} {t.simpleString()}" for n, t in fields.items())

    def want(name: str, ok: tuple[type, ...], what: str) -> None:
        if not isinstance(fields[name], ok):
            raise InvalidConfig(
                f"column {name!r} must be {what} to write to {target}, "
                f"got {fields[name].simpleString()}"
            )

    if "value" in fields:
        value = "value"
    elif "payload" in fields and opts.stream is None:
        value = "payload"
    else:
        raise InvalidConfig(
            f"writing to {target} needs a column 'value' (binary or string); the DataFrame "
            f"has: {names}. Rename one, e.g. df.selectExpr('to_json(struct(*)) AS value')"
        )
    want(value, (BinaryType, StringType), "binary or string")
    key = None
    if "key" in fields and opts.stream is not None:
        want("key", (BinaryType, StringType), "binary or string")
        key = "key"
    headers = None
    if "headers" in fields:
        h = fields["headers"]
        if not (
            isinstance(h, MapType)
            and isinstance(h.keyType, StringType)
            and isinstance(h.valueType, StringType)
        ):
            raise InvalidConfig(
                f"column 'headers' must be map<string,string> to write to {target}, "
                f"got {h.simpleString()}"
            )
        headers = "headers"
    topic = None
    if opts.stream is None and opts.topic is None:
        if opts.topic_column not in fields:
            raise InvalidConfig(
                f"publishing on the Bus needs option 'topic', or a column "
                f"{opts.topic_column!r} (option 'topicColumn') with each row's topic; "
                f"the DataFrame has: {names}"
            )
        want(opts.topic_column, (StringType,), "string")
        topic = opts.topic_column
    return SinkColumns(value=value, key=key, headers=headers, topic=topic)


def _staged_schema(cols: SinkColumns) -> pa.Schema:
    fields = [pa.field("value", pa.binary())]
    if cols.key:
        fields.append(pa.field("key", pa.binary()))
    if cols.headers:
        fields.append(pa.field("headers", _HEADERS))
    if cols.topic:
        fields.append(pa.field("topic", pa.string()))
    return pa.schema(fields)


def _normalise(batch: pa.RecordBatch, cols: SinkColumns, schema: pa.Schema) -> pa.RecordBatch:
    value = batch.column(cols.value)
    if value.null_count:
        raise UsageError(
            f"a row has a null {cols.value!r}; every record needs a value "
            "(use coalesce(value, '') to write empty values)"
        )
    arrays = [_as_binary(value)]
    if cols.key:
        arrays.append(_as_binary(batch.column(cols.key)))
    if cols.headers:
        arrays.append(batch.column(cols.headers).cast(_HEADERS))
    if cols.topic:
        topic = batch.column(cols.topic)
        if topic.null_count:
            raise UsageError(f"a row has a null topic in column {cols.topic!r}")
        arrays.append(topic)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _as_binary(column: pa.Array) -> pa.Array:
    """A string or binary column as binary: a string column's buffers as they are (the same
    layout, no copy), anything else cast."""
    if pa.types.is_string(column.type):
        return column.view(pa.binary())
    return column.cast(pa.binary())


def stage(
    opts: SinkOptions,
    cols: SinkColumns,
    sink_id: str,
    batch: str,
    rows: Iterator[pa.RecordBatch],
    *,
    durable: bool = True,
) -> StagedFile:
    """Stage one task's rows (runs on an executor); the commit message names the file.

    A Stream's rows are framed here, into staged segments that the commit appends
    without copying them (always synced). For the Bus, an Arrow file: ``durable=False``
    skips syncing it, for a commit that nothing replays."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.taskAttemptId() if ctx is not None else time.time_ns()
    schema = _staged_schema(cols)
    batches = (_normalise(b, cols, schema) for b in rows)
    if opts.stream is not None:
        prefix = f"{staged_prefix(sink_id, batch)}{partition:05d}-{attempt}"
        return _stage_segments(opts, prefix, partition, batches)
    path = staging_dir(opts.root, sink_id, batch) / f"{partition:05d}-{attempt}.arrow"
    count = write_staged(path, schema, batches, durable=durable)
    return StagedFile(path=str(path), rows=count, partition=partition)


def staged_prefix(sink_id: str, batch: str) -> str:
    """The start of the stager prefixes of one batch of one sink (``~`` is in no sink id)."""
    return f"{sink_id}~{batch}~"


def _stage_segments(
    opts: SinkOptions, prefix: str, partition: int, batches: Iterable[pa.RecordBatch]
) -> StagedFile:
    """Frame a task's rows for a Stream here, on the executor, into staged segments of
    the stream: the commit then renames them in (see :meth:`fsbus.Stream.append_staged`).
    Always synced: the commit does not copy them, so their data must be on disk."""
    assert opts.stream is not None
    with Stream.open(opts.root, opts.stream, create=opts.create_stream) as stream:
        stager = stream.stager(prefix, durable=True, frame_bytes=STAGED_FRAME_BYTES)
        return _stage_into(stager, partition, batches)


def _stage_into(
    stager: SegmentStager, partition: int, batches: Iterable[pa.RecordBatch]
) -> StagedFile:
    count = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            count += batch.num_rows
            rows = _stream_rows(pa.Table.from_batches([batch]))
            if rows.keys is None and rows.headers is None:
                assert rows.value_column is not None
                for data, lengths in value_chunks(rows.value_column):
                    stager.add_values(data, lengths)
            else:
                stager.add_records(_records(rows, 0, None))
        files = [s.path for s in stager.finish()]
    except BaseException:  # the task failed or was killed while producing rows
        stager.abort()
        raise
    if not files:
        return StagedFile(path="", rows=0, partition=partition)
    return StagedFile(path=files[0], rows=count, partition=partition, more=tuple(files[1:]))


def _ordered_files(messages: Sequence[Any]) -> list[str]:
    staged = [m for m in messages if isinstance(m, StagedFile)]
    return [
        path
        for m in sorted(staged, key=lambda m: m.partition)
        if m.rows
        for path in (m.path, *m.more)
    ]


def _adoptable(files: Sequence[str]) -> bool:
    """Whether every staged file is a segment large enough to be renamed into the stream
    (then whether it is still there says whether it was appended: see
    :meth:`fsbus.Stream.append_staged`)."""
    return bool(files) and all(
        _is_segment(f) and os.path.getsize(f) >= SegmentStager.ADOPT_BYTES for f in files
    )


def _is_segment(path: str) -> bool:
    return path.endswith(SegmentStager.SUFFIX)


def _segment_table(path: str) -> pa.Table:
    """A staged segment's records as the staged Arrow schema (value, key, headers)."""
    import numpy as np  # here, not at import: a driver that plans or commits never needs it

    values: list[pa.Array] = []
    keys: list[bytes | None] = []
    headers: list[Mapping[str, str]] = []
    for batch in read_staged_columns(path):
        ends = np.zeros(len(batch) + 1, dtype=np.int32)
        np.cumsum(np.frombuffer(batch.value_lengths, dtype=np.uint32), out=ends[1:])
        data = pa.py_buffer(bytes(batch.value_data))
        values.append(
            pa.Array.from_buffers(pa.binary(), len(batch), [None, pa.py_buffer(ends), data])
        )
        keys += batch.keys
        headers += batch.headers
    columns: dict[str, Any] = {"value": pa.chunked_array(values, pa.binary())}
    if any(k is not None for k in keys):
        columns["key"] = pa.array(keys, pa.binary())
    if any(headers):
        columns["headers"] = pa.array([list(h.items()) for h in headers], _HEADERS)
    return pa.table(columns)


def _load(files: Sequence[str]) -> pa.Table | None:
    tables = [_segment_table(f) if _is_segment(f) else read_staged(Path(f)) for f in files]
    if not tables:
        return None
    return pa.concat_tables(tables)


def publish(
    opts: SinkOptions, sink_id: str, batch: str, messages: Sequence[Any], *, replayable: bool
) -> int:
    """Publish a batch's staged rows exactly once (runs on the driver); rows published.

    ``replayable`` batches (streaming micro-batches) keep their done marker so a replay
    is recognised. A batch job is never replayed (its key is new for every job, and Spark
    does not rerun a job's commit), so its append to a Stream writes no markers at all.
    """
    files = _ordered_files(messages)
    if not replayable and opts.stream is not None:
        try:
            with Stream.open(opts.root, opts.stream, create=opts.create_stream) as stream:
                return len(stream.append_staged(files))
        finally:
            _remove_staged(opts, sink_id, batch)
    markers = commits_dir(opts.root, sink_id)
    done = markers / f"{batch}.done"
    if done.exists():
        _remove_staged(opts, sink_id, batch)
        return 0
    tag = f"{sink_id}/{batch}"
    if opts.stream is not None:
        rows = sum(m.rows for m in messages if isinstance(m, StagedFile))
        count = _append_to_stream(opts, markers / f"{batch}.pending", files, tag, rows)
    else:
        count = _publish_on_bus(opts, markers / f"{batch}.ledger", files, tag)
    atomic_write_json(done, {"batch": batch, "rows": count, "at": time.time()})
    remove_file(markers / f"{batch}.pending")
    remove_file(markers / f"{batch}.ledger")
    _remove_staged(opts, sink_id, batch)
    if replayable:
        _prune(opts, sink_id, batch)
    else:
        remove_file(done)
    return count


def discard(opts: SinkOptions, sink_id: str, batch: str, messages: Sequence[Any]) -> None:
    """Remove the staged files of a failed attempt (kept if a pending publish needs them)."""
    markers = commits_dir(opts.root, sink_id)
    pending = read_json(markers / f"{batch}.pending") or {}
    ledger, _ = Ledger(markers / f"{batch}.ledger").load()
    keep = set(pending.get("files", [])) | set((ledger or {}).get("files", []))
    for path in _ordered_files(messages):
        if path not in keep:
            remove_file(Path(path))
    remove_empty_dir(staging_dir(opts.root, sink_id, batch))


def _remove_staged(opts: SinkOptions, sink_id: str, batch: str) -> None:
    """Remove what the tasks of a batch staged, dead attempts' included."""
    remove_tree(staging_dir(opts.root, sink_id, batch))
    _remove_stream_staged(opts, sink_id, lambda b: b == batch)


def _remove_stream_staged(opts: SinkOptions, sink_id: str, which: Callable[[str], bool]) -> None:
    """Remove the target Stream's staged files of this sink's batches that ``which`` names."""
    if opts.stream is None:
        return
    try:
        stream = Stream.open(opts.root, opts.stream, create=False)
    except StreamNotFound:
        return
    with stream:
        start = f"{sink_id}~"  # what staged_prefix puts before the batch
        skip = len(SegmentStager.PREFIX) + len(start)
        mine = stream.staged(start)
        stream.remove_staged(p for p in mine if which(Path(p).name[skip:].split("~")[0]))


def _prune(opts: SinkOptions, sink_id: str, batch: str) -> None:
    root = opts.root
    if not batch.isdigit():
        return
    current = int(batch)
    for name in subdirs(staging_dir(root, sink_id, batch).parent):
        if name.isdigit() and int(name) < current:
            remove_tree(staging_dir(root, sink_id, name))
    _remove_stream_staged(opts, sink_id, lambda b: b.isdigit() and int(b) < current)
    markers = commits_dir(root, sink_id)
    for name in marker_names(markers):
        stem, _, ext = name.partition(".")
        if ext == "done" and stem.isdigit() and int(stem) < current - KEEP_MARKERS:
            remove_file(markers / name)


# --- Stream target ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Rows:
    """A batch's staged rows, column by column (None: the column is absent or all empty)."""

    value_column: pa.ChunkedArray | None
    keys: list[bytes | None] | None
    headers: list[dict[str, str]] | None

    def __len__(self) -> int:
        return 0 if self.value_column is None else len(self.value_column)

    @cached_property
    def values(self) -> list[bytes]:
        return [] if self.value_column is None else self.value_column.to_pylist()

    def row(self, i: int) -> tuple[bytes, bytes | None, dict[str, str]]:
        key = self.keys[i] if self.keys is not None else None
        headers = self.headers[i] if self.headers is not None else {}
        return self.values[i], key, headers


def _stream_rows(table: pa.Table | None) -> _Rows:
    if table is None:
        return _Rows(None, None, None)
    names = table.column_names
    keys = None
    if "key" in names and table.column("key").null_count < table.num_rows:
        keys = table.column("key").to_pylist()
    headers = None
    if "headers" in names:
        column = table.column("headers")
        if any(len(chunk.keys) for chunk in column.chunks):
            headers = [dict(h) if h else {} for h in column.to_pylist()]
    return _Rows(table.column("value"), keys, headers)


def _append_to_stream(
    opts: SinkOptions, pending_path: Path, files: list[str], tag: str, staged_rows: int
) -> int:
    assert opts.stream is not None
    pending = read_json(pending_path)
    if pending is not None:
        files = list(pending["files"])  # a replay publishes the first attempt's rows
    elif _adoptable(files):
        pending = {"files": files, "renamed": True, "rows": staged_rows}
        atomic_write_json(pending_path, pending)
    if pending is not None and pending.get("renamed"):
        # each file is renamed into the stream whole: those still here were not appended
        left = [f for f in files if os.path.exists(f)]
        with Stream.open(opts.root, opts.stream, create=opts.create_stream) as stream:
            stream.append_staged(left, copy_below=0)
        return int(pending["rows"])
    rows = _stream_rows(_load(files))
    with Stream.open(opts.root, opts.stream, create=opts.create_stream) as stream:
        if pending is None:
            pending = {"files": files, "parts": []}
            done = 0
        else:
            # read up to the end the append lock shows: a lagging view of what the
            # crashed attempt appended (another host, a shared mount) would append it twice
            done = _count_appended(stream, pending["parts"], rows, tag, stream.locked_end_offset())
        if done >= len(rows):
            return len(rows)
        pending["parts"].append({"from": stream.end_offset, "skip": done})
        atomic_write_json(pending_path, pending)
        _append_plain(stream, rows, skip=done, mark=f"{tag}:{done}")
    return len(rows)


def _append_plain(stream: Stream, rows: _Rows, *, skip: int, mark: str | None) -> int:
    """Append ``rows[skip:]`` with one hold of the append lock; the first record carries
    ``mark`` in the header :data:`BATCH_HEADER` if given. Returns ``len(rows)``."""
    if skip >= len(rows):
        return len(rows)
    if rows.keys is None and rows.headers is None:
        assert rows.value_column is not None
        marker = {BATCH_HEADER: mark} if mark is not None else None
        stream.append_value_chunks(value_chunks(rows.value_column, skip), first_headers=marker)
    else:
        stream.append_batch(_records(rows, skip, mark))
    return len(rows)


def value_chunks(column: pa.ChunkedArray, skip: int = 0) -> list[tuple[memoryview, array[int]]]:
    """The values of a binary column from row ``skip`` on: per Arrow chunk, its values back
    to back and their lengths.

    Read from the Arrow buffers as they are (no object per value, and no copy: the chunks
    of a memory-mapped staged file are written from its pages): what
    :meth:`fsbus.Stream.append_value_chunks` takes.
    """
    import numpy as np  # here, not at import: a driver that plans or commits never needs it

    out: list[tuple[memoryview, array[int]]] = []
    for chunk in column.slice(skip).chunks:
        n = len(chunk)
        if n == 0:
            continue
        _, offsets_buf, data_buf = chunk.buffers()
        ends = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1, offset=4 * chunk.offset)
        first, last = int(ends[0]), int(ends[-1])
        lens = array("I")
        lens.frombytes(np.diff(ends).view(np.uint32).data.cast("B"))  # lengths, unsigned
        # read-only: Arrow arrays do not change, so the Stream frames them where they lie
        # (a writable buffer it would copy first, lest it change before it is written)
        data = (
            memoryview(data_buf).toreadonly()[first:last]
            if data_buf is not None
            else memoryview(b"")
        )
        out.append((data, lens))
    return out


def _records(rows: _Rows, skip: int, mark: str | None) -> list[bytes | RecordIn]:
    """What to append: plain values where possible (the Stream frames runs of them on its
    fast path, so a marked first record does not slow down the rest)."""
    items: list[bytes | RecordIn]
    if rows.keys is None and rows.headers is None:
        items = list(rows.values[skip:])
    else:
        items = []
        for i in range(skip, len(rows)):
            value, key, headers = rows.row(i)
            if key is None and not headers:
                items.append(value)
            else:
                items.append(RecordIn(value=value, key=key, headers=headers))
    if mark is not None and items:
        value, key, headers = rows.row(skip)
        items[0] = RecordIn(value=value, key=key, headers={**headers, BATCH_HEADER: mark})
    return items


def _count_appended(
    stream: Stream, parts: Iterable[Mapping[str, int]], rows: _Rows, tag: str, end: int
) -> int:
    """How many staged rows earlier attempts appended.

    Each attempt appended ``rows[skip:]`` with one ``append_batch`` (one lock hold), so
    what it got onto disk is a contiguous run starting at the record marked
    ``<tag>:<skip>``; a crash may have cut the run short. Count the records of the run
    that equal the staged rows, in order, reading every record up to ``end``.
    """
    done = 0
    for part in parts:
        skip = int(part["skip"])
        mark = f"{tag}:{skip}"
        start = max(int(part["from"]), stream.start_offset)
        matched = 0
        found = False
        for rec in stream.read_through(start, end):
            if not found:
                if rec.headers.get(BATCH_HEADER) != mark:
                    continue
                found = True
            if skip + matched >= len(rows):
                break
            value, key, headers = rows.row(skip + matched)
            want = {**headers, BATCH_HEADER: mark} if matched == 0 else headers
            if rec.value != value or rec.key != key or dict(rec.headers) != want:
                break
            matched += 1
        if found:
            done = skip + matched
    return done


# --- Bus target ------------------------------------------------------------------------


def _publish_on_bus(opts: SinkOptions, ledger_path: Path, files: list[str], tag: str) -> int:
    ledger = Ledger(ledger_path)
    try:  # the ledger is closed whatever fails (a dead disk fails its flush, too)
        return _publish_ledgered(opts, ledger, files, tag)
    finally:
        ledger.close()


def _publish_ledgered(opts: SinkOptions, ledger: Ledger, files: list[str], tag: str) -> int:
    header, published = ledger.load()
    if header is None:
        ledger.start({"files": files})
    else:
        files = list(header["files"])
        ledger.resume()
    table = _load(files)
    if table is None:
        return 0
    payloads = table.column("value").to_pylist()
    n = len(payloads)
    topics = table.column("topic").to_pylist() if "topic" in table.column_names else None
    if "headers" in table.column_names:
        headers = [dict(h) if h else {} for h in table.column("headers").to_pylist()]
    else:
        headers = [{}] * n
    from fsbus import BlockingBus  # here: appends to a Stream never load the Bus's engine

    with BlockingBus(opts.root) as bus:
        if header is not None and len(published) < n:
            # The ledger's lines are not synced (a power cut loses the last ones), so any
            # message not in it may be on the bus: look them all up, with one listing.
            wanted = {topics[i] if topics else opts.topic for i in range(n)}
            for i in _on_bus(bus, wanted, tag) - published:
                if i < n:
                    ledger.record(i)
                    published.add(i)
        for i in range(n):
            if i in published:
                continue
            topic = topics[i] if topics else opts.topic
            assert topic is not None
            # durable: the done marker that follows is synced, and must not outlive the
            # messages it vouches for
            kwargs: dict[str, Any] = {"single": opts.single, "ttl": opts.ttl, "durable": True}
            if opts.priority is not None:
                kwargs["priority"] = opts.priority
            bus.publish(
                topic, payloads[i], headers={**headers[i], ID_HEADER: f"{tag}:{i}"}, **kwargs
            )
            ledger.record(i)
    return n


def _on_bus(bus: BlockingBus, topics: set[str | None], tag: str) -> set[int]:
    """Indexes of this batch's messages on the bus (by their header ``<tag>:<index>``)."""
    (only,) = topics if len(topics) == 1 else (None,)
    words = only.split(".") if only is not None else ["#"]
    pattern = "#" if ("*" in words or "#" in words) else only
    assert pattern is not None
    found: set[int] = set()
    prefix = f"{tag}:"
    for info in bus.browse(pattern=pattern):
        ident = (info.headers or {}).get(ID_HEADER, "")
        if ident.startswith(prefix) and ident[len(prefix) :].isdigit():
            found.add(int(ident[len(prefix) :]))
    return found
