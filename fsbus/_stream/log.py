"""Stream: the blocking face of a named, replayable, segmented log under a root.

Streams live in ``<root>/streams/<name>/``. A :class:`Stream` is thread-safe and
process-safe (appends are serialised by an flock on ``append.lock``), and it is cheap
to pickle the arguments needed to reopen one on a Spark executor.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from .._core.mounts import detect
from .._errors import (
    ClosedError,
    FsBusError,
    LockingUnsupported,
    OffsetOutOfRange,
    StreamNotFound,
    UsageError,
    storage_error,
)
from .defaults import Defaults
from .framing import (
    ColumnBatch,
    Encoded,
    Record,
    RecordIn,
    check_stream_name,
    encode_frames,
    encode_packed,
    prepare,
    prepare_parts,
    segment_name,
    too_large,
)
from .groups import (
    ConsumerGroup,
    GroupInfo,
    delete_group,
    group_info,
    list_groups,
    reset_group,
)
from .maint import CompactionReport, RetentionReport, compact, enforce_retention
from .ops import DEFAULT_OPS, StreamOps
from .segments import (
    iter_columns,
    iter_records,
    list_segments,
    offset_for_time,
    stream_end,
)
from .staged import ADOPT_BYTES, SegmentStager, StagedSegment, is_staged_name
from .staged import PREFIX as STAGED_PREFIX
from .writer import RecoveryInfo, Writer

if TYPE_CHECKING:
    from .config import Settings, StreamConfig

__all__ = ["SegmentInfo", "Stream", "StreamInfo", "list_streams", "stream_dir"]

STREAMS_DIR = "streams"


def stream_dir(root: str | os.PathLike[str], name: str) -> Path:
    """Where stream ``name`` lives under ``root``."""
    return Path(root) / STREAMS_DIR / check_stream_name(name)


def list_streams(root: str | os.PathLike[str]) -> list[str]:
    """Names of the streams under ``root``, sorted ([] if there are none)."""
    base = Path(root) / STREAMS_DIR
    out = []
    for name in DEFAULT_OPS.listdir(base):
        try:
            check_stream_name(name)
        except UsageError:
            continue
        if DEFAULT_OPS.is_dir(base / name):
            out.append(name)
    return sorted(out)


@dataclass(frozen=True)
class SegmentInfo:
    """One segment file of a stream."""

    base_offset: int
    """The segment's first offset (its file name)."""
    end_offset: int
    """The offset after its last record (for the newest segment: the stream's end)."""
    size_bytes: int
    """Size of the segment file."""
    path: str
    """Path of the segment file."""


@dataclass(frozen=True)
class StreamInfo:
    """A snapshot of a stream's extent."""

    name: str
    """The stream's name."""
    start_offset: int
    """The oldest offset kept (retention moves it forward)."""
    end_offset: int
    """The next offset to be written."""
    size_bytes: int
    """Bytes of all segment files."""
    segments: tuple[SegmentInfo, ...]
    """The segments, oldest first."""
    path: str = ""
    """The stream's directory."""
    groups: tuple[str, ...] = ()
    """Names of its consumer groups."""


class Stream:
    """A named, append-only, replayable log of records with offsets.

    Open with :meth:`Stream.open`; use as a context manager or call :meth:`close`.
    """

    def __init__(
        self, sdir: Path, name: str, config: Settings, ops: StreamOps, *, _private: object
    ) -> None:
        if _private is not _TOKEN:
            raise TypeError("use Stream.open(root, name) to open a stream")
        self._dir = sdir
        self._name = name
        self._root = sdir.parent.parent
        self._config: Settings = config  # the defaults become a StreamConfig when asked
        self._ops = ops
        self._writer: Writer | None = None
        self._closed = False
        # The highest end this handle has seen (records it read or appended): on a shared
        # filesystem a client can see a file shorter, for a moment, than it has already
        # read it (stale pages), and an offset already read is never out of range.
        self._seen_end = 0

    # --- opening and closing -----------------------------------------------------------

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        name: str,
        *,
        config: StreamConfig | None = None,
        create: bool = True,
    ) -> Stream:
        """Open stream ``name`` under ``root``, creating it unless ``create=False``.

        Raises :class:`~fsbus.InvalidTopic` for a bad name and
        :class:`~fsbus.StreamNotFound` if it is missing and ``create`` is false.
        """
        return cls._open(root, name, config=config, create=create, ops=DEFAULT_OPS)

    @classmethod
    def _open(
        cls,
        root: str | os.PathLike[str],
        name: str,
        *,
        config: StreamConfig | None,
        create: bool,
        ops: StreamOps,
    ) -> Stream:
        sdir = stream_dir(root, name)
        cfg: Settings = Defaults()  # no pydantic for a handle with the defaults
        if config is not None:
            from .config import StreamConfig

            if not isinstance(config, StreamConfig):
                raise UsageError(f"config must be a StreamConfig, got {type(config).__name__}")
            cfg = config
        if not ops.is_dir(sdir):
            if not create:
                raise StreamNotFound(
                    f"stream {name!r} does not exist under {root} (no directory {sdir}); "
                    "open it with create=True or append to it first"
                )
            try:
                ops.makedirs(sdir)
            except OSError as exc:
                raise storage_error(f"create stream {name!r}", exc, sdir) from exc
        platform = detect(str(sdir), ops)
        if platform.stream_lock == "refuse":
            # Appends, consumer groups and retention are serialised by flock: where it
            # does not cross hosts a log could be torn. Say so now, not after the damage.
            raise LockingUnsupported(platform.problem, sdir)
        return cls(sdir, name, cfg, ops, _private=_TOKEN)

    def close(self) -> None:
        """Release the handle's files (idempotent). The stream stays on disk."""
        self._closed = True
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Stream {self._name!r} at {self._dir}{' closed' if self._closed else ''}>"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickles as "open this stream again" (e.g. to ship it to a Spark executor).
        given = None if isinstance(self._config, Defaults) else self._config
        return (_reopen, (str(self._root), self._name, given))

    # --- properties ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The stream's name."""
        return self._name

    @property
    def path(self) -> Path:
        """The stream's directory."""
        return self._dir

    @property
    def ops(self) -> StreamOps:
        """The I/O seam this handle does its system calls through."""
        return self._ops

    @property
    def root(self) -> Path:
        """The root directory the stream lives under."""
        return self._root

    @property
    def config(self) -> StreamConfig:
        """This handle's options."""
        cfg = self._config
        if isinstance(cfg, Defaults):  # made once, when first asked
            from .config import from_defaults

            cfg = self._config = from_defaults(cfg)
        return cfg

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def start_offset(self) -> int:
        """The oldest offset kept (read from disk on each access)."""
        self._check_open()
        bases = list_segments(self._ops, self._dir)
        return bases[0] if bases else 0

    @property
    def end_offset(self) -> int:
        """The next offset to be written (read from disk on each access).

        Never less than the end of what this handle has read or appended.
        """
        self._check_open()
        end = stream_end(
            self._ops, self._dir, list_segments(self._ops, self._dir), self._config.read_chunk_bytes
        )
        return max(end, self._seen_end)

    @property
    def seen_end(self) -> int:
        """The end of what this handle has read or appended: the offset after the last
        complete frame it read or the last record it appended (0 before either).

        Offsets below it exist. On a shared filesystem a client can, for a moment, read a
        file another client appends to shorter than it read it before (stale pages); a
        reader that knows from elsewhere how far the stream reaches (a plan made on another
        host) compares it with this to tell such a view from the end of the stream.
        """
        return self._seen_end

    @property
    def recoveries(self) -> tuple[RecoveryInfo, ...]:
        """Torn tails this handle found and cut (empty in the normal case)."""
        return tuple(self._writer.recoveries) if self._writer is not None else ()

    # --- appending -----------------------------------------------------------------------

    def append(
        self,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        timestamp: float | None = None,
    ) -> int:
        """Append one record; return its offset.

        Durable on return as ``config.durability`` says ('batch' and 'record' both
        fdatasync before returning).
        """
        writer = self._get_writer()
        max_bytes = self._config.max_record_bytes
        if type(value) is bytes and key is None and not headers and timestamp is None:
            if len(value) > max_bytes:
                raise too_large(len(value), max_bytes)
            item: object = value
        else:
            item = prepare_parts(
                value, key=key, headers=headers, timestamp=timestamp, max_record_bytes=max_bytes
            )
        offsets = writer.append([item], now_us=self._now_us)
        self._after_append(writer, offsets)
        return offsets.start

    def append_batch(self, records: Iterable[bytes | str | RecordIn]) -> range:
        """Append many records under one hold of the append lock; return their offsets.

        With durability 'batch' one fdatasync covers the whole batch; with 'record', each
        record is synced before the next is written. Batches are cut into frames of
        ``config.max_frame_bytes``; each frame appears to readers at once.
        """
        items: list[Any] = records if isinstance(records, list) else list(records)
        if not items:
            end = self.end_offset
            return range(end, end)
        max_bytes = self._config.max_record_bytes
        batch: list[Any]
        types = set(map(type, items))
        if types == {bytes}:
            batch = items
            biggest = max(map(len, batch))
        else:
            if types <= {bytes, str}:
                batch = [x.encode() if type(x) is str else x for x in items]
            else:
                # plain values stay bytes: runs of them are framed on the fast path
                batch = [
                    x
                    if type(x) is bytes
                    else x.encode()
                    if type(x) is str
                    else prepare(x, max_record_bytes=max_bytes)
                    for x in items
                ]
            biggest = max((len(x) for x in batch if type(x) is bytes), default=0)
        if biggest > max_bytes:
            raise too_large(biggest, max_bytes)
        writer = self._get_writer()
        offsets = writer.append(batch, now_us=self._now_us)
        self._after_append(writer, offsets)
        return offsets

    def append_values(
        self,
        data: bytes | bytearray | memoryview,
        lengths: Sequence[int] | array[int],
        *,
        first_headers: Mapping[str, str] | None = None,
    ) -> range:
        """Append ``len(lengths)`` plain records whose values lie back to back in ``data``.

        The mirror of :meth:`read_columns` for bulk producers (Arrow, NumPy): ``lengths``
        is each value's length (an ``array('I')`` is taken as is), and frames are cut
        from the buffer with no object built per record. Otherwise as :meth:`append_batch`
        of the same values (one hold of the append lock, same durability); returns the
        offsets. ``first_headers``, if given, are the headers of the first record (a
        marker a writer can find its batch by; the others stay plain). A read-only buffer
        (``bytes``, an Arrow buffer) is written from where it lies; a writable one
        (``bytearray``, a NumPy array) is copied once first.
        """
        return self.append_value_chunks(((data, lengths),), first_headers=first_headers)

    def append_value_chunks(
        self,
        chunks: Iterable[tuple[bytes | bytearray | memoryview, Sequence[int] | array[int]]],
        *,
        first_headers: Mapping[str, str] | None = None,
    ) -> range:
        """:meth:`append_values` of values held in several buffers, in one append.

        ``chunks`` are ``(data, lengths)`` pairs as :meth:`append_values` takes them (the
        Arrow batches of a column, say): their records are appended in order, with one
        hold of the append lock and the durability of one append, and no buffer is joined
        to another (a frame never spans two chunks). ``first_headers`` go to the first
        record of all. Returns the offsets.
        """
        pairs: list[tuple[memoryview, array[int]]] = []
        for data, lengths in chunks:
            if isinstance(lengths, array) and lengths.typecode == "I":
                lens = lengths
            else:
                try:
                    lens = array("I", lengths)
                except (OverflowError, TypeError) as exc:
                    raise UsageError(
                        f"lengths must be ints from 0 to 2**32 - 1 (one per value): {exc}"
                    ) from exc
            view = memoryview(data).cast("B")
            total = sum(lens)
            if total != len(view):
                raise UsageError(
                    f"the lengths add up to {total} bytes but data holds {len(view)}; "
                    "give one length per value, values back to back"
                )
            if lens:
                pairs.append((view, lens))
        if not pairs:
            end = self.end_offset
            return range(end, end)
        max_bytes = self._config.max_record_bytes
        # no value is longer than its chunk: look at each value only in a chunk that
        # could hold one too large (a pass over a million lengths costs ~20 ms)
        biggest = max((max(lens) for view, lens in pairs if len(view) > max_bytes), default=0)
        if biggest > max_bytes:
            raise too_large(biggest, max_bytes)
        head = None
        if first_headers:
            view, lens = pairs[0]
            head = prepare_parts(
                bytes(view[: lens[0]]),
                key=None,
                headers=first_headers,
                timestamp=None,
                max_record_bytes=max_bytes,
            )
            pairs[0] = (view[lens[0] :], lens[1:])
        writer = self._get_writer()
        if self._config.durability == "record":
            # a frame and a sync per record: the general path does that already
            items: list[Any] = [] if head is None else [head]
            for view, lens in pairs:
                starts = accumulate(lens, initial=0)
                items += (bytes(view[a:e]) for a, e in pairwise(starts))
            offsets = writer.append(items, now_us=self._now_us)
        else:
            max_frame = self._config.max_frame_bytes

            def encode(_: object, base: int, now: int) -> Encoded:
                pieces: list[Encoded] = []
                if head is not None:
                    pieces.append(
                        encode_frames([head], base, now_us=now, max_frame_bytes=max_frame)
                    )
                    base += 1
                for view, lens in pairs:
                    if lens:
                        enc = encode_packed(view, lens, base, now_us=now, max_frame_bytes=max_frame)
                        pieces.append(enc)
                        base = enc.next_offset
                if len(pieces) == 1:
                    return pieces[0]
                parts: list[Any] = []
                frames: list[tuple[int, int, int]] = []
                shift = 0
                for enc in pieces:
                    parts += enc.parts
                    frames += ((o, p + shift, t) for o, p, t in enc.frames)
                    shift += enc.size
                return Encoded(tuple(parts), tuple(frames), base, shift)

            offsets = writer.append((None,), now_us=self._now_us, encode=encode)
        self._after_append(writer, offsets)
        return offsets

    def stager(
        self, prefix: str, *, durable: bool | None = None, frame_bytes: int | None = None
    ) -> SegmentStager:
        """A :class:`~fsbus.SegmentStager` that frames records into files of this stream,
        away from the append lock, for :meth:`append_staged` to append whole.

        Any number of producers (processes, hosts) may stage at once, each with a prefix
        of its own; the files are named ``.staged.<prefix>.<n>.seg`` in the stream's
        directory and are not part of the stream until appended. ``durable`` (default:
        unless the stream's durability is 'none') syncs each file when complete.
        ``frame_bytes`` (default ``config.max_frame_bytes``) sizes the frames: readers
        see a renamed file's records all at once anyway, and larger frames leave fewer
        headers for :meth:`append_staged` to rewrite and sync.
        """
        self._check_open()
        if durable is None:
            durable = self._config.durability != "none"
        return SegmentStager(
            self._dir,
            prefix,
            config=self._config,
            durable=durable,
            frame_bytes=frame_bytes,
            ops=self._ops,
        )

    def append_staged(
        self,
        segments: Iterable[StagedSegment | str | os.PathLike[str]],
        *,
        copy_below: int = ADOPT_BYTES,
    ) -> range:
        """Append the records of staged segments, in order, with one hold of the append lock.

        ``segments`` come from :meth:`stager` (of this stream). Each file's frames get
        their offsets here; a file of at least ``copy_below`` bytes then becomes a segment
        as it is (renamed: no data is copied), and a smaller one is written at the end of
        the newest segment and removed. Durable on return as ``config.durability`` says.
        Returns the offsets.

        A renamed file is in whole or not at all, and its staged name goes in the same
        step, so a caller that crashed part way can tell which of its files of at least
        ``copy_below`` bytes were appended by which are still staged (a copied file may
        still be there after its records were written).
        """
        self._check_open()
        paths: list[Path] = []
        for s in segments:
            path = Path(s.path if isinstance(s, StagedSegment) else s)
            if path.parent != self._dir or not is_staged_name(path.name):
                raise UsageError(
                    f"{str(path)!r} is not a staged segment of stream {self._name!r}: stage "
                    "the records with this stream's stager() and append the files it made"
                )
            paths.append(path)
        if not paths:
            end = self.end_offset
            return range(end, end)
        writer = self._get_writer()
        offsets = writer.append_staged(paths, copy_below=copy_below)
        self._after_append(writer, offsets)
        return offsets

    def staged(self, prefix: str = "") -> list[str]:
        """Paths of this stream's staged files (complete, or left part written by a
        producer that died) whose prefix starts with ``prefix``, sorted."""
        self._check_open()
        start = STAGED_PREFIX + prefix
        try:
            names = self._ops.listdir(self._dir)
        except OSError as exc:
            raise storage_error("list the staged segments", exc, self._dir) from exc
        return sorted(str(self._dir / n) for n in names if n.startswith(start))

    def remove_staged(self, paths: Iterable[str | os.PathLike[str]]) -> int:
        """Remove staged files of this stream that will not be appended; how many were
        there. Removing one that a producer still writes makes that producer fail."""
        self._check_open()
        removed = 0
        for p in paths:
            path = Path(p)
            if path.parent != self._dir or not path.name.startswith(STAGED_PREFIX):
                raise UsageError(f"{str(path)!r} is not a staged file of stream {self._name!r}")
            try:
                removed += self._ops.remove(path)
            except OSError as exc:
                raise storage_error("remove a staged segment", exc, path) from exc
        return removed

    def recover(self) -> tuple[RecoveryInfo, ...]:
        """Validate the tail now (as the first append would) and cut a torn record.

        Returns what was cut; empty if the tail was clean. Takes the append lock.
        """
        return tuple(self._get_writer().recover())

    # --- reading -------------------------------------------------------------------------

    def read(
        self, start: int = 0, stop: int | None = None, *, max_records: int | None = None
    ) -> Iterator[Record]:
        """Records with offsets in [start, stop), up to the current end of the stream.

        Raises :class:`~fsbus.OffsetOutOfRange` (saying the valid range) if ``start`` is
        before :attr:`start_offset` or after :attr:`end_offset`. Never yields a partial
        record and never skips a complete one.
        """
        self._check_read(start, stop, max_records)
        return iter_records(
            self._ops,
            self._dir,
            self._name,
            start,
            stop,
            max_records,
            self._config.read_chunk_bytes,
            self._see,
        )

    def read_columns(
        self, start: int = 0, stop: int | None = None, *, max_records: int | None = None
    ) -> Iterator[ColumnBatch]:
        """The records of :meth:`read`, column by column: one :class:`~fsbus.ColumnBatch`
        per frame (a batch append of plain values is a few frames of about
        ``config.max_frame_bytes``), with no object built per record.

        For bulk consumers (Arrow, NumPy, Spark): a batch's values sit back to back in one
        buffer with their lengths beside them. Same range, errors and guarantees as
        :meth:`read`; batches are never empty.
        """
        self._check_read(start, stop, max_records)
        return iter_columns(
            self._ops,
            self._dir,
            self._name,
            start,
            stop,
            max_records,
            self._config.read_chunk_bytes,
            self._see,
        )

    def locked_end_offset(self) -> int:
        """The next offset to be written, as the holder of the append lock sees it.

        Takes the append lock once (and cuts a torn tail, as an append would). On a shared
        filesystem this can be ahead of :attr:`end_offset` for a moment: a client that
        holds no lock can see the segment another host appended to shorter than it is.
        Read up to it with :meth:`read_through` to count what a crashed writer appended.
        """
        writer = self._get_writer()
        writer.recover()
        return writer.end

    def read_through(self, start: int, stop: int) -> Iterator[Record]:
        """The records in [start, stop), which the caller knows exist (from
        :meth:`locked_end_offset`, or a plan made on another host).

        Where this host's view of the stream ends before ``stop``, it reads on from there
        after a pause, for about 5 s in all, then raises :class:`~fsbus.OffsetOutOfRange`
        naming the offsets it could not read; it never ends early as :meth:`read` does at
        the end of what it sees. Records before :attr:`start_offset` (cut by retention)
        are not waited for.
        """
        reached = max(start, self.start_offset)
        for wait in (0.0, *LAGGING_VIEW_WAITS):
            if reached >= stop:
                return
            if wait:
                self._ops.sleep(wait)
            if reached > self.end_offset:
                continue  # this view ends before where reading resumes: not there yet
            before = self._seen_end
            for rec in self.read(reached, stop):
                reached = rec.offset + 1
                yield rec
            if self._seen_end > before:  # the complete frames read in this pass end there
                reached = max(reached, self._seen_end)
        if reached < stop:
            raise OffsetOutOfRange(
                f"stream {self._name!r}: offsets {reached}..{stop - 1} exist (the append lock "
                f"says so) but are not readable from this host after "
                f"{sum(LAGGING_VIEW_WAITS):.0f} s: its view of the segment lags, or the "
                "segment is damaged; retry later (fsbus doctor checks the segment)"
            )

    def _check_read(self, start: int, stop: int | None, max_records: int | None) -> None:
        self._check_open()
        if not isinstance(start, int) or start < 0:
            raise UsageError(f"start must be an offset (int >= 0), got {start!r}")
        if stop is not None and (not isinstance(stop, int) or stop < 0):
            raise UsageError(f"stop must be an offset (int >= 0) or None, got {stop!r}")
        if max_records is not None and max_records < 0:
            raise UsageError(f"max_records must be >= 0 or None, got {max_records!r}")
        bases = list_segments(self._ops, self._dir)
        first = bases[0] if bases else 0
        if start < first or start > max(bases[-1] if bases else 0, self._seen_end):
            end = stream_end(self._ops, self._dir, bases, self._config.read_chunk_bytes)
            if not first <= start <= end:
                _out_of_range(self._name, start, first, end)

    def follow(
        self,
        start: int | None = None,
        *,
        stop: int | None = None,
        idle_timeout: float | None = None,
    ) -> Iterator[Record]:
        """Records from ``start`` (default: the current end) on, waiting for new ones.

        The blocking tail: it checks for appends every ``config.poll_interval`` (use
        :meth:`AsyncStream.follow <fsbus.AsyncStream.follow>` to be woken by inotify).
        Ends at ``stop``, or after ``idle_timeout`` seconds without a new record.
        """
        self._check_open()
        off = self.end_offset if start is None else start
        # validate now, not at the first next()
        self.read(off, off)
        return self._follow(off, stop, idle_timeout)

    def _follow(self, off: int, stop: int | None, idle_timeout: float | None) -> Iterator[Record]:
        ops = self._ops
        quiet_since = ops.monotonic()
        while stop is None or off < stop:
            got = False
            for r in self.read(off, stop):
                got = True
                off = r.offset + 1
                yield r
            now = ops.monotonic()
            if got:
                quiet_since = now
                continue
            if idle_timeout is not None and now - quiet_since >= idle_timeout:
                return
            wait = self._config.poll_interval
            if idle_timeout is not None:
                wait = min(wait, max(idle_timeout - (now - quiet_since), 0.0))
            ops.sleep(wait)

    def offset_for_time(self, ts: float) -> int:
        """The first offset whose timestamp is >= ``ts`` (seconds), else :attr:`end_offset`.

        Uses the sparse index (the largest timestamp written before each entry), so it
        reads only the frames near the answer even if timestamps are not monotonic.
        """
        self._check_open()
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not abs(ts) < 9.0e12:
            raise UsageError(f"ts must be seconds since the epoch (a finite number), got {ts!r}")
        return offset_for_time(
            self._ops, self._dir, self._name, round(ts * 1_000_000), self._config.read_chunk_bytes
        )

    def info(self) -> StreamInfo:
        """Segments, sizes and offsets, as they are on disk now."""
        self._check_open()
        ops = self._ops
        bases = list_segments(ops, self._dir)
        end = stream_end(ops, self._dir, bases, self._config.read_chunk_bytes)
        segs = []
        for i, b in enumerate(bases):
            p = self._dir / segment_name(b)
            size = ops.file_size(p) or 0
            seg_end = bases[i + 1] if i + 1 < len(bases) else end
            segs.append(SegmentInfo(b, seg_end, size, str(p)))
        groups = tuple(
            sorted(n for n in ops.listdir(self._dir / "groups") if not n.startswith("."))
        )
        return StreamInfo(
            name=self._name,
            start_offset=bases[0] if bases else 0,
            end_offset=end,
            size_bytes=sum(s.size_bytes for s in segs),
            segments=tuple(segs),
            path=str(self._dir),
            groups=groups,
        )

    # --- maintenance -------------------------------------------------------------------

    def enforce_retention(self) -> RetentionReport:
        """Delete the oldest closed segments the retention settings allow (see
        :class:`~fsbus.StreamConfig`: ``retention_bytes``, ``retention_seconds``,
        ``delete_consumed``). Also runs by itself whenever this handle rolls a segment."""
        self._check_open()
        return enforce_retention(self)

    def compact(self) -> CompactionReport:
        """Rewrite the closed segments keeping only the newest record of each key.

        Records without a key stay. Offsets never change. Runs only when asked.
        """
        self._check_open()
        return compact(self)

    # --- consumer groups -------------------------------------------------------------

    def group(
        self,
        name: str,
        *,
        consumer: str | None = None,
        start: str | int = "earliest",
    ) -> ConsumerGroup:
        """Join consumer group ``name`` (created on first use) as one consumer.

        ``start`` ('earliest', 'latest' or an offset) applies only when the group is
        created. See :class:`~fsbus.ConsumerGroup`.
        """
        self._check_open()
        return ConsumerGroup(self, name, consumer=consumer, start=start)

    def groups(self) -> list[str]:
        """Names of this stream's consumer groups."""
        self._check_open()
        return list_groups(self)

    def group_info(self, name: str) -> GroupInfo:
        """Committed offsets, lag, live consumers and partition owners of a group."""
        self._check_open()
        return group_info(self, name)

    def reset_group(self, name: str, to: str | int) -> dict[int, int]:
        """Set a group's committed offsets to 'earliest', 'latest' or an offset.

        Also repairs a corrupt offsets file. Stop the group's consumers first: a running
        consumer commits its own positions over the reset.
        """
        self._check_open()
        return reset_group(self, name, to)

    def delete_group(self, name: str) -> None:
        """Remove a consumer group's files (stop its consumers first)."""
        self._check_open()
        delete_group(self, name)

    # --- helpers -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"stream {self._name!r} handle is closed; open it again")

    def _get_writer(self) -> Writer:
        self._check_open()
        if self._writer is None:
            self._writer = Writer(self._dir, self._config, self._ops)
        return self._writer

    def _see(self, end: int) -> None:
        if end > self._seen_end:
            self._seen_end = end

    def _after_append(self, writer: Writer, offsets: range) -> None:
        self._see(offsets.stop)
        if writer.rolled:
            writer.rolled = False
            cfg = self._config
            if cfg.retention_bytes or cfg.retention_seconds or cfg.delete_consumed:
                try:
                    self.enforce_retention()
                except FsBusError as exc:
                    # The append itself succeeded: report, do not make the caller retry it.
                    log.warning("stream %s: retention after a roll failed: %s", self._name, exc)

    def _now_us(self) -> int:
        return round(self._ops.now() * 1_000_000)


LAGGING_VIEW_WAITS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 1.0, 2.0)
"""Pauses of :meth:`Stream.read_through` between reads of a view that ends short."""
_TOKEN = object()
log = logging.getLogger("fsbus.stream")


def _reopen(root: str, name: str, config: StreamConfig | None) -> Stream:
    return Stream.open(root, name, config=config, create=False)


def _out_of_range(name: str, start: int, first: int, end: int) -> None:
    raise OffsetOutOfRange(
        f"offset {start} is outside stream {name!r}: valid offsets are {first} "
        f"(oldest kept) to {end} (the next to be written)"
    )
