"""Stream on-disk format: record frames, segment and index names, offsets files (pure).

Nothing here touches the filesystem or a clock: bytes in, values out.

A segment file (``<base offset, 20 digits>.log``) is a sequence of *frames*. A frame holds
one or more records with consecutive (or, after compaction, increasing) offsets and is the
unit of checksum, of atomicity for readers, and of torn-tail recovery::

    frame header (48 bytes, little endian)
        checksum     u64  xxh64 of every byte of the frame after this field
        magic        u16  0x5346 ("FS")
        version      u8   1
        flags        u8   which optional columns follow (see FLAG_*)
        frame_len    u32  bytes of the whole frame, header included
        base_offset  u64  offset of the first record slot
        last_delta   u32  last offset of the frame - base_offset (kept through compaction)
        count        u32  records in the frame
        first_ts     i64  timestamp of every record (µs since the epoch) unless FLAG_TIMESTAMPS
        max_ts       i64  largest record timestamp in the frame (µs)
    columns, count entries each
        value_len    u32  always
        offset_delta u32  if FLAG_GAPS (compacted frames): offset - base_offset
        timestamp    i64  if FLAG_TIMESTAMPS: µs since the epoch
        key_len      i32  if FLAG_KEYS: -1 means no key
        headers_len  u32  if FLAG_HEADERS: bytes of the UTF-8 JSON object of headers
    data: for each record, key bytes, header bytes, value bytes

Putting the lengths in columns lets a reader get every length of a frame with one
``struct.unpack_from`` and a writer frame a batch with one ``bytes.join``; a single
:meth:`~fsbus.Stream.append` is simply a frame of one record.

The sparse index ``<base>.index`` holds 24-byte entries ``(offset u64, position u64,
max_ts_before i64)``: a frame starting at ``position`` whose first offset is ``offset``,
and the largest timestamp of every record written to the stream before it. It is a hint:
readers check the frame it points to and fall back to a scan of the segment.
"""

from __future__ import annotations

import bisect
import json
import re
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, islice, pairwise
from types import MappingProxyType
from typing import Any, Final, TypeAlias

import xxhash

from .._errors import InvalidHeader, InvalidTopic, PayloadTooLarge, UsageError

__all__ = [
    "EMPTY_HEADERS",
    "HEADER",
    "INDEX_ENTRY",
    "ColumnBatch",
    "FrameHeader",
    "FrameScan",
    "IndexEntry",
    "Record",
    "RecordIn",
    "check_stream_name",
    "decode_frame",
    "decode_generations",
    "decode_offsets_file",
    "decode_offsets_file_generation",
    "encode_frames",
    "encode_generations",
    "encode_offsets_file",
    "encode_packed",
    "encode_value_frame",
    "encode_values",
    "frame_columns",
    "index_name",
    "parse_index",
    "parse_segment_name",
    "scan_frames",
    "segment_name",
    "too_large",
]

MAGIC: Final = 0x5346
VERSION: Final = 1
FLAG_KEYS: Final = 0x01
FLAG_HEADERS: Final = 0x02
FLAG_TIMESTAMPS: Final = 0x04
FLAG_GAPS: Final = 0x08
_KNOWN_FLAGS: Final = FLAG_KEYS | FLAG_HEADERS | FLAG_TIMESTAMPS | FLAG_GAPS

HEADER: Final = struct.Struct("<QHBBIQIIqq")
HEADER_SIZE: Final = HEADER.size  # 48
_CHECKSUM = struct.Struct("<Q")
INDEX_ENTRY: Final = struct.Struct("<QQq")
MAX_FRAME_LEN: Final = 0xFFFF_FFFF
MAX_OFFSET: Final = 10**20 - 1
MAX_TIMESTAMP: Final = 9.0e12  # seconds: µs still fit in an i64

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_SEGMENT_RE = re.compile(r"(\d{20})\.log")
_xxh64 = xxhash.xxh64_intdigest

Buffer: TypeAlias = bytes | bytearray | memoryview
"""Bytes to write: frames are written from buffers like these without a copy."""

EMPTY_HEADERS: Final[Mapping[str, str]] = MappingProxyType({})


# --- records -----------------------------------------------------------------------------


class _RecordSlots:
    """The storage of a record: five slots, shared by :class:`Record` and its draft.

    A frozen dataclass sets each field through ``object.__setattr__``, which makes reading
    millions of records three times slower. Readers build a :class:`_RecordDraft` (plain
    attribute stores) and switch its class to :class:`Record`; both add no slot of their
    own to this base, so the switch is cheap and the result is an ordinary Record.
    """

    __slots__ = ("headers", "key", "offset", "timestamp", "value")
    offset: int
    timestamp: float
    key: bytes | None
    value: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Record(_RecordSlots):
    """One record read from a stream."""

    __slots__ = ()

    offset: int
    """Position of the record in the stream (0, 1, 2, ...; never reused)."""
    timestamp: float
    """When the record was appended (or the time the writer gave), seconds since the epoch."""
    key: bytes | None
    """Optional key: partitions consumer groups and drives compaction."""
    value: bytes
    """The payload."""
    headers: Mapping[str, str] = field(hash=False)
    """Optional string headers (read-only; empty when none were given; not hashed)."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # headers are a read-only mappingproxy, which pickle refuses: send a dict
        return (_record, (self.offset, self.timestamp, self.key, self.value, dict(self.headers)))


def _record(
    offset: int, timestamp: float, key: bytes | None, value: bytes, headers: dict[str, str]
) -> Record:
    return Record(
        offset, timestamp, key, value, MappingProxyType(headers) if headers else EMPTY_HEADERS
    )


class _RecordDraft(_RecordSlots):
    """A record under construction (mutable); see :class:`_RecordSlots`."""

    __slots__ = ()


def _check_layout() -> None:
    probe = _RecordDraft()
    probe.offset, probe.timestamp, probe.key, probe.value = 0, 0.0, None, b""
    probe.headers = EMPTY_HEADERS
    probe.__class__ = Record  # type: ignore[assignment]
    if not isinstance(probe, Record) or probe != Record(0, 0.0, None, b"", EMPTY_HEADERS):
        raise RuntimeError("Record and _RecordDraft layouts differ")


_check_layout()


@dataclass(frozen=True, slots=True)
class RecordIn:
    """A record to append, when more than a value is needed."""

    value: bytes | str
    """The payload (str is encoded as UTF-8)."""
    key: bytes | str | None = None
    """Optional key (str is encoded as UTF-8)."""
    headers: Mapping[str, str] | None = None
    """Optional string headers."""
    timestamp: float | None = None
    """Seconds since the epoch; None means the time of the append."""


# --- names -------------------------------------------------------------------------------


def check_stream_name(name: object) -> str:
    """Return ``name`` if it is a valid stream name, else raise :class:`InvalidTopic`."""
    if not isinstance(name, str):
        raise InvalidTopic(f"stream name must be a str, got {type(name).__name__}")
    if not _NAME_RE.fullmatch(name) or name.startswith("."):
        raise InvalidTopic(
            f"invalid stream name {name!r}: use 1 to 200 of the characters A-Z a-z 0-9 . _ -, "
            "not starting with a dot"
        )
    return name


def check_group_name(name: object) -> str:
    """Consumer group names follow the stream name rules."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name.startswith("."):
        raise UsageError(
            f"invalid consumer group name {name!r}: use 1 to 200 of the characters "
            "A-Z a-z 0-9 . _ -, not starting with a dot"
        )
    return name


def segment_name(base: int) -> str:
    """File name of the segment whose first offset is ``base``."""
    return f"{base:020d}.log"


def index_name(base: int) -> str:
    """File name of the sparse index of segment ``base``."""
    return f"{base:020d}.index"


def parse_segment_name(name: str) -> int | None:
    """Base offset of a segment file name, or None if ``name`` is not a segment."""
    m = _SEGMENT_RE.fullmatch(name)
    return int(m.group(1)) if m else None


# --- encoding ----------------------------------------------------------------------------


def _seal(frame: bytearray) -> bytearray:
    _CHECKSUM.pack_into(frame, 0, _xxh64(memoryview(frame)[8:]))
    return frame


def encode_values(values: Sequence[bytes], base_offset: int, ts_us: int) -> bytearray:
    """One frame of plain values that share a timestamp (the fast path of a batch)."""
    n = len(values)
    lens = struct.pack(f"<{n}I", *map(len, values))
    frame = bytearray().join(
        (HEADER.pack(0, MAGIC, VERSION, 0, 0, base_offset, n - 1, n, ts_us, ts_us), lens, *values)
    )
    struct.pack_into("<I", frame, 12, len(frame))
    return _seal(frame)


def encode_packed(
    data: bytes | bytearray | memoryview,
    lengths: array[int],
    base_offset: int,
    *,
    now_us: int,
    max_frame_bytes: int,
) -> Encoded:
    """Frames of plain values that lie back to back in ``data`` (``lengths``: ``array('I')``).

    Each frame is its header, a slice of the lengths and a slice of the data: no object
    per record. Frames hold as many records as fit in ``max_frame_bytes`` (one at least).
    """
    return _encode_values(data, lengths, base_offset, now_us, max_frame_bytes)


def _encode_values(
    data: bytes | bytearray | memoryview | list[bytes],
    lengths: array[int],
    base_offset: int,
    now_us: int,
    max_frame_bytes: int,
) -> Encoded:
    """:func:`encode_packed` of values given back to back, or as a list (``data``).

    Values given back to back are not copied (unless ``data`` is writable): each frame is
    a buffer of its header and lengths, then a slice of ``data``, checksummed in place and
    written with one vectored write. A list is joined, with the frame headers between its
    values, into one buffer (one copy of each value), and each frame's checksum is then
    taken over that buffer. A list's values are not written where they lie: on a batch of
    large values that saved a copy but cost more than it saved in a fresh process
    (glibc's heap, handed back to the system when the caller dropped the batch, was
    page-faulted anew on the next one; the batch-sized buffer keeps it).
    """
    n = len(lengths)
    if n == 0:
        return Encoded((), (), base_offset, 0)
    raw_lengths = lengths.tobytes()
    if _BIG_ENDIAN:
        swapped = array("I", lengths)
        swapped.byteswap()
        raw_lengths = swapped.tobytes()
    if not isinstance(data, list):
        view = memoryview(data).cast("B")  # bytes, whatever the buffer's item format
        if not view.readonly:
            # a frame is checksummed, then written: bytes changed in between (by another
            # thread) would leave a frame that fails its checksum, so write from a copy
            view = memoryview(view.tobytes())
        cuts, sizes = _cut_frames(lengths, len(view), max_frame_bytes - HEADER_SIZE)
        return _scatter_values(view, raw_lengths, cuts, sizes, base_offset, now_us)
    cuts, sizes = _cut_frames(lengths, sum(lengths), max_frame_bytes - HEADER_SIZE)
    pieces: list[bytes] = []
    frames: list[tuple[int, int, int]] = []
    pos = 0
    for (lo, hi), body in zip(pairwise(cuts), sizes, strict=True):
        count = hi - lo
        size = HEADER_SIZE + body
        off = base_offset + lo
        pieces.append(
            HEADER.pack(0, MAGIC, VERSION, 0, size, off, count - 1, count, now_us, now_us)
        )
        pieces.append(raw_lengths[4 * lo : 4 * hi])
        pieces += data[lo:hi]
        frames.append((off, pos, now_us))
        pos += size
    out = bytearray().join(pieces)
    view = memoryview(out)
    pack = _CHECKSUM.pack_into
    for (_, at, _), body in zip(frames, sizes, strict=True):
        pack(out, at, _xxh64(view[at + 8 : at + HEADER_SIZE + body]))
    view.release()
    return Encoded((out,), tuple(frames), base_offset + n, pos)


def _cut_frames(lengths: array[int], total: int, budget: int) -> tuple[list[int], list[int]]:
    """Cut values into frames of at most ``budget`` bytes after the header (one value at least).

    Returns the index of each frame's first value (and, last, the number of values) and
    each frame's bytes after its header. Each frame's count is guessed from the previous
    one, then adjusted by single values (values of similar sizes need few steps).
    """
    n = len(lengths)
    cuts = [0]
    sizes: list[int] = []
    lo = 0
    step = max(1, budget * n // (total + 4 * n or 1))
    while lo < n:
        hi = min(lo + step, n)
        size = sum(lengths[lo:hi]) + 4 * (hi - lo)
        while size > budget and hi > lo + 1:
            hi -= 1
            size -= lengths[hi] + 4
        while hi < n and size + lengths[hi] + 4 <= budget:
            size += lengths[hi] + 4
            hi += 1
        cuts.append(hi)
        sizes.append(size)
        step = hi - lo
        lo = hi
    return cuts, sizes


def _scatter_values(
    values: memoryview,
    raw_lengths: bytes,
    cuts: list[int],
    sizes: list[int],
    base_offset: int,
    now_us: int,
) -> Encoded:
    """Frames of values that stay where they lie: per frame, a head buffer, then a slice."""
    parts: list[Buffer] = []
    frames: list[tuple[int, int, int]] = []
    pos = vpos = 0
    for (lo, hi), body in zip(pairwise(cuts), sizes, strict=True):
        count = hi - lo
        size = HEADER_SIZE + body
        off = base_offset + lo
        head = bytearray(HEADER_SIZE)
        head += raw_lengths[4 * lo : 4 * hi]
        HEADER.pack_into(head, 0, 0, MAGIC, VERSION, 0, size, off, count - 1, count, now_us, now_us)
        vlen = body - 4 * count
        piece = values[vpos : vpos + vlen]
        hasher = xxhash.xxh64(memoryview(head)[8:])
        hasher.update(piece)
        _CHECKSUM.pack_into(head, 0, hasher.intdigest())
        parts += (head, piece)
        frames.append((off, pos, now_us))
        pos += size
        vpos += vlen
    return Encoded(tuple(parts), tuple(frames), base_offset + len(raw_lengths) // 4, pos)


def encode_value_frame(
    pieces: Sequence[tuple[memoryview, array[int]]], base_offset: int, now_us: int
) -> Encoded:
    """One frame of the plain values of several buffers (``(data, lengths)`` pairs, each
    ``data`` read-only and its values back to back), none of them copied: the frame is a
    head buffer (header and every length), then the buffers as they are. The caller keeps
    the frame within the 4 GiB frame limit."""
    lengths = array("I")
    for _, lens in pieces:
        lengths += lens
    if _BIG_ENDIAN:
        lengths.byteswap()
    count = len(lengths)
    head = bytearray(HEADER_SIZE)
    head += lengths.tobytes()
    size = len(head) + sum(len(view) for view, _ in pieces)
    HEADER.pack_into(
        head, 0, 0, MAGIC, VERSION, 0, size, base_offset, count - 1, count, now_us, now_us
    )
    hasher = xxhash.xxh64(memoryview(head)[8:])
    for view, _ in pieces:
        hasher.update(view)
    _CHECKSUM.pack_into(head, 0, hasher.intdigest())
    parts: list[Buffer] = [head]
    parts += (view for view, _ in pieces)
    return Encoded(tuple(parts), ((base_offset, 0, now_us),), base_offset + count, size)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A record reduced to bytes, ready to frame."""

    value: bytes
    """The payload."""
    key: bytes | None
    """The key, or None."""
    headers: bytes
    """The headers as UTF-8 JSON (empty when there are none)."""
    ts_us: int | None
    """Its own timestamp (µs), or None for the time of the append."""

    @property
    def size(self) -> int:
        """Bytes of its value, key and headers."""
        return len(self.value) + len(self.headers) + (len(self.key) if self.key else 0)


def too_large(size: int, limit: int) -> PayloadTooLarge:
    """The error for a record of ``size`` bytes where ``limit`` is the most accepted."""
    return PayloadTooLarge(
        f"record of {size} bytes exceeds max_record_bytes={limit}; "
        "split it or raise StreamConfig.max_record_bytes"
    )


def prepare(item: bytes | str | RecordIn, *, max_record_bytes: int) -> _Prepared:
    """Validate one record and reduce it to bytes (raises UsageError subclasses)."""
    if isinstance(item, RecordIn):
        value, key, headers, ts = item.value, item.key, item.headers, item.timestamp
    else:
        value, key, headers, ts = item, None, None, None
    return prepare_parts(
        value, key=key, headers=headers, timestamp=ts, max_record_bytes=max_record_bytes
    )


def prepare_parts(
    value: object,
    *,
    key: object,
    headers: Mapping[str, str] | None,
    timestamp: float | None,
    max_record_bytes: int,
) -> _Prepared:
    """Validate the parts of one record and reduce them to bytes."""
    v = _as_bytes(value, "value")
    k = None if key is None else _as_bytes(key, "key")
    h = encode_headers(headers) if headers else b""
    size = len(v) + len(h) + (len(k) if k is not None else 0)
    if size > max_record_bytes:
        raise too_large(size, max_record_bytes)
    ts_us: int | None = None
    if timestamp is not None:
        if (
            isinstance(timestamp, bool)
            or not isinstance(timestamp, int | float)
            or not -MAX_TIMESTAMP <= timestamp <= MAX_TIMESTAMP  # also refuses NaN
        ):
            raise UsageError(
                f"timestamp must be seconds since the epoch (a finite number within "
                f"±{MAX_TIMESTAMP:.0e}), got {timestamp!r}"
            )
        ts_us = round(timestamp * 1_000_000)
    return _Prepared(v, k, h, ts_us)


def _as_bytes(x: object, what: str) -> bytes:
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode("utf-8")
    if isinstance(x, bytearray | memoryview):
        return bytes(x)
    raise UsageError(f"record {what} must be bytes or str, got {type(x).__name__}")


def encode_headers(headers: Mapping[str, str]) -> bytes:
    """Headers as compact UTF-8 JSON (validated: str names, non-empty, str values)."""
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise InvalidHeader(f"header names must be non-empty str, got {name!r}")
        if not isinstance(value, str):
            raise InvalidHeader(
                f"header {name!r} has a {type(value).__name__} value; header values must be str"
            )
    return json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False).encode()


def encode_frame(
    records: Sequence[_Prepared],
    offsets: Sequence[int],
    *,
    base_offset: int,
    last_delta: int,
    default_ts_us: int,
) -> bytearray:
    """One frame of arbitrary records (keys, headers, own timestamps, gaps)."""
    n = len(records)
    ts = [default_ts_us if r.ts_us is None else r.ts_us for r in records]
    first_ts = ts[0] if ts else default_ts_us
    max_ts = max(ts) if ts else default_ts_us
    flags = 0
    cols = [struct.pack(f"<{n}I", *(len(r.value) for r in records))]
    deltas = [o - base_offset for o in offsets]
    if deltas != list(range(n)):
        flags |= FLAG_GAPS
        cols.append(struct.pack(f"<{n}I", *deltas))
    if any(t != first_ts for t in ts):
        flags |= FLAG_TIMESTAMPS
        cols.append(struct.pack(f"<{n}q", *ts))
    if any(r.key is not None for r in records):
        flags |= FLAG_KEYS
        cols.append(struct.pack(f"<{n}i", *(-1 if r.key is None else len(r.key) for r in records)))
    if any(r.headers for r in records):
        flags |= FLAG_HEADERS
        cols.append(struct.pack(f"<{n}I", *(len(r.headers) for r in records)))
    data: list[bytes] = []
    for r in records:
        if r.key:
            data.append(r.key)
        if r.headers:
            data.append(r.headers)
        data.append(r.value)
    hdr = HEADER.pack(0, MAGIC, VERSION, flags, 0, base_offset, last_delta, n, first_ts, max_ts)
    frame = bytearray().join((hdr, *cols, *data))
    if len(frame) > MAX_FRAME_LEN:
        raise PayloadTooLarge(f"a frame of {len(frame)} bytes exceeds the 4 GiB frame limit")
    struct.pack_into("<I", frame, 12, len(frame))
    return _seal(frame)


@dataclass(frozen=True, slots=True)
class Encoded:
    """Frames ready to write, and what the writer needs to know about them."""

    parts: tuple[Buffer, ...]
    """The frames, back to back, as buffers to write in this order (one when the frames
    were packed into a buffer; a head buffer and the values of each frame when they were
    not copied)."""
    frames: tuple[tuple[int, int, int], ...]
    """(first offset, position in the frames' bytes, largest timestamp in the frame) per
    frame."""
    next_offset: int
    """The offset after the last record."""
    size: int
    """Bytes of all the frames."""

    @property
    def data(self) -> Buffer:
        """The frames as one buffer (joined on each access when there are several parts)."""
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def cut(self, start: int, end: int) -> list[Buffer]:
        """The parts covering bytes ``start`` to ``end`` of the frames (sliced, not copied)."""
        out: list[Buffer] = []
        at = 0
        for part in self.parts:
            n = len(part)
            if at + n > start and at < end:
                if start <= at and at + n <= end:
                    out.append(part)
                else:
                    out.append(memoryview(part)[max(start - at, 0) : min(end - at, n)])
            at += n
            if at >= end:
                break
        return out


def encoded(data: Buffer, frames: tuple[tuple[int, int, int], ...], next_offset: int) -> Encoded:
    """An :class:`Encoded` of frames held in one buffer."""
    return Encoded((data,) if data else (), frames, next_offset, len(data))


def encode_frames(
    items: Sequence[_Prepared | bytes],
    base_offset: int,
    *,
    now_us: int,
    max_frame_bytes: int,
) -> Encoded:
    """Frame a batch, split into frames of about ``max_frame_bytes`` at most.

    ``items`` may mix plain values (``bytes``) and prepared records: each run of plain
    values is framed on the fast path (:func:`encode_packed`), so one record with a key
    or headers does not send a whole batch through the general framing.
    """
    n = len(items)
    if n == 0:
        return Encoded((), (), base_offset, 0)
    first = items[0]
    if n == 1 and type(first) is bytes:  # a single append: one frame, no splitting
        frame = encode_values((first,), base_offset, now_us)
        return encoded(frame, ((base_offset, 0, now_us),), base_offset + 1)
    if set(map(type, items)) == {bytes}:
        return _encode_plain(items, base_offset, now_us, max_frame_bytes)  # type: ignore[arg-type]
    parts: list[Buffer] = []
    frames: list[tuple[int, int, int]] = []
    pos = 0
    for lo, hi, plain in _runs(items, max_frame_bytes):
        off = base_offset + lo
        if plain:
            enc = _encode_plain(items[lo:hi], off, now_us, max_frame_bytes)  # type: ignore[arg-type]
            frames += [(o, pos + p, t) for o, p, t in enc.frames]
            parts += enc.parts
            pos += enc.size
            continue
        frame = encode_frame(
            [_as_prepared(x) for x in items[lo:hi]],
            range(off, off + hi - lo),
            base_offset=off,
            last_delta=hi - lo - 1,
            default_ts_us=now_us,
        )
        frames.append((off, pos, HEADER.unpack_from(frame)[9]))
        parts.append(frame)
        pos += len(frame)
    return Encoded(tuple(parts), tuple(frames), base_offset + n, pos)


MIN_PLAIN_RUN: Final = 64
"""Plain values in a row, within a mixed batch, that get frames of their own."""


def _runs(items: Sequence[_Prepared | bytes], max_frame_bytes: int) -> list[tuple[int, int, bool]]:
    """Cut a mixed batch into runs ``(lo, hi, plain)``, plain meaning values only.

    Runs of at least :data:`MIN_PLAIN_RUN` plain values take the fast path (the caller
    cuts them into frames); the other records share general frames, cut here, so a mixed
    batch is not cut into many small frames.
    """
    n = len(items)
    special = [i for i, x in enumerate(items) if type(x) is not bytes]
    runs: list[tuple[int, int, bool]] = []
    lo = 0
    for i in [*special, n]:
        if i - lo >= MIN_PLAIN_RUN:
            runs.append((lo, i, True))
        elif i > lo:
            _extend_general(runs, lo, i)
        if i < n:
            _extend_general(runs, i, i + 1)
        lo = i + 1
    out: list[tuple[int, int, bool]] = []
    for lo, hi, plain in runs:
        if plain:
            out.append((lo, hi, True))
        else:
            sizes = [_as_prepared(x).size for x in items[lo:hi]]
            out += [(lo + a, lo + b, False) for a, b in _split(sizes, max_frame_bytes)]
    return out


def _encode_plain(
    values: Sequence[bytes], base_offset: int, now_us: int, max_frame_bytes: int
) -> Encoded:
    listed = values if isinstance(values, list) else list(values)
    return _encode_values(
        listed, array("I", map(len, listed)), base_offset, now_us, max_frame_bytes
    )


def _as_prepared(x: _Prepared | bytes) -> _Prepared:
    return _Prepared(x, None, b"", None) if isinstance(x, bytes) else x


def _extend_general(runs: list[tuple[int, int, bool]], lo: int, hi: int) -> None:
    if runs and not runs[-1][2] and runs[-1][1] == lo:
        runs[-1] = (runs[-1][0], hi, False)
    else:
        runs.append((lo, hi, False))


def _split(sizes: Sequence[int], max_frame_bytes: int) -> list[tuple[int, int]]:
    """Cut a batch into runs whose frames stay under ``max_frame_bytes`` (one record at least)."""
    chunks: list[tuple[int, int]] = []
    lo = 0
    size = HEADER_SIZE
    for i, n in enumerate(sizes):
        add = n + 24  # the record's bytes and, at most, its column entries
        if i > lo and size + add > max_frame_bytes:
            chunks.append((lo, i))
            lo, size = i, HEADER_SIZE
        size += add
    chunks.append((lo, len(sizes)))
    return chunks


# --- decoding ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """The fixed header of one frame, and where it sits."""

    position: int
    """Byte position of the frame in its segment."""
    length: int
    """Bytes of the frame, header included."""
    flags: int
    """FLAG_* bits: which optional columns the frame has."""
    base_offset: int
    """Offset of the first record slot."""
    last_offset: int
    """Offset of the last record slot (kept through compaction)."""
    count: int
    """Records in the frame."""
    first_ts: int
    """Timestamp of the records (µs) unless the frame has a timestamp column."""
    max_ts: int
    """Largest timestamp in the frame (µs)."""

    @property
    def end(self) -> int:
        """Byte position just after the frame."""
        return self.position + self.length

    @property
    def next_offset(self) -> int:
        """The offset after the frame's last record slot."""
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class FrameScan:
    """What a scan of a buffer found: valid frames, then where and why it stopped."""

    frames: tuple[FrameHeader, ...]
    """The complete, checksum-valid frames, in order."""
    end: int
    """Position just after the last valid frame (where the next frame starts or belongs)."""
    problem: str | None
    """None if the scan reached the end of the buffer cleanly; else what stopped it."""
    incomplete: bool
    """True when the problem is a frame longer than the bytes available (maybe still
    being written, or cut short by a crash)."""
    needed: int
    """When incomplete: bytes from ``end`` the frame claims to need (0 if unknown)."""


def read_header(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, ...]:
    """The raw header fields at ``pos`` (the caller checks there are 48 bytes)."""
    return HEADER.unpack_from(buf, pos)


def scan_frames(
    buf: bytes | bytearray | memoryview,
    *,
    start: int = 0,
    base: int = 0,
    verify: bool = True,
) -> FrameScan:
    """Walk the frames of ``buf`` from ``start``; ``base`` is buf's position in the file.

    Stops at the end of the buffer, at a frame that runs past it (``incomplete``), or at
    bytes that are not a valid frame (``problem`` says what). With ``verify`` the checksum
    of each frame is checked.
    """
    mv = memoryview(buf)
    end = len(buf)
    pos = start
    frames: list[FrameHeader] = []
    unpack = HEADER.unpack_from
    while pos < end:
        if end - pos < HEADER_SIZE:
            return FrameScan(tuple(frames), pos + base, "a frame header is cut short", True, 0)
        cs, magic, version, flags, length, boff, ldelta, count, fts, mts = unpack(buf, pos)
        if magic != MAGIC or version != VERSION or flags & ~_KNOWN_FLAGS:
            return FrameScan(
                tuple(frames), pos + base, "bytes that are not a frame header", False, 0
            )
        if length < HEADER_SIZE + 4 * count or ldelta + 1 < count:
            return FrameScan(
                tuple(frames), pos + base, "a frame header with impossible sizes", False, 0
            )
        if pos + length > end:
            return FrameScan(tuple(frames), pos + base, "a frame is cut short", True, length)
        if verify and _xxh64(mv[pos + 8 : pos + length]) != cs:
            return FrameScan(tuple(frames), pos + base, "a frame fails its checksum", False, 0)
        frames.append(FrameHeader(pos + base, length, flags, boff, boff + ldelta, count, fts, mts))
        pos += length
    return FrameScan(tuple(frames), pos + base, None, False, 0)


@dataclass(frozen=True, slots=True)
class ColumnBatch:
    """Consecutive records of a stream, column by column (one frame's worth, or part of one).

    Nothing is built per record: the values stay in one buffer, back to back, with their
    lengths beside them, which is what columnar consumers (Arrow, NumPy) take as is;
    :attr:`values` slices them into a list of ``bytes`` when asked.
    """

    offsets: range | array[int]
    """Offset of each record: a ``range`` when they are consecutive (the usual case), else
    an ``array('q')`` (a compacted frame)."""
    timestamps: array[float]
    """Timestamp of each record, seconds since the epoch, as an ``array('d')``."""
    keys: Sequence[bytes | None]
    """Key of each record, None for none (a list)."""
    headers: Sequence[Mapping[str, str]]
    """Headers of each record, read-only and empty when none were given (a list)."""
    value_data: bytes | memoryview
    """The values, back to back in offset order."""
    value_lengths: array[int]
    """Length of each value in :attr:`value_data`, an ``array('I')``."""

    def __len__(self) -> int:
        return len(self.value_lengths)

    @property
    def values(self) -> list[bytes]:
        """Each record's value as ``bytes`` (built on each access, from :attr:`value_data`)."""
        data = self.value_data
        ends = accumulate(self.value_lengths, initial=0)
        starts = list(ends)
        return [bytes(data[a:e]) for a, e in zip(starts, islice(starts, 1, None), strict=False)]

    def head(self, n: int) -> ColumnBatch:
        """The first ``n`` records of the batch (all of them if it has fewer)."""
        if n >= len(self):
            return self
        size = sum(self.value_lengths[:n])
        return ColumnBatch(
            self.offsets[:n],
            self.timestamps[:n],
            self.keys[:n],
            self.headers[:n],
            self.value_data[:size],
            self.value_lengths[:n],
        )


_BIG_ENDIAN: Final = sys.byteorder == "big"


def _u32_array(buf: bytes | memoryview, pos: int, count: int) -> array[int]:
    """``count`` little-endian u32 at ``pos``, as an ``array('I')``."""
    out = array("I")
    out.frombytes(buf[pos : pos + 4 * count])
    if _BIG_ENDIAN:
        out.byteswap()
    return out


def frame_columns(
    buf: bytes,
    pos: int,
    header: FrameHeader,
    lo: int = 0,
    hi: int | None = None,
) -> ColumnBatch:
    """The records of the frame at ``pos`` in ``buf`` whose offsets lie in [lo, hi), as columns.

    This is the one parser of a frame's columns; :func:`decode_frame` builds records from
    its result. A frame of plain values (no keys, headers, own timestamps or gaps) costs a
    few slices whatever its size.
    """
    count = header.count
    base = header.base_offset
    flags = header.flags
    lens_at = pos + HEADER_SIZE
    p = lens_at + 4 * count
    offsets: range | array[int]
    if flags & FLAG_GAPS:
        all_offsets = [base + d for d in struct.unpack_from(f"<{count}I", buf, p)]
        p += 4 * count
        i0 = bisect.bisect_left(all_offsets, lo)
        i1 = count if hi is None else max(bisect.bisect_left(all_offsets, hi), i0)
        offsets = array("q", all_offsets[i0:i1])
    else:
        i0 = min(max(lo - base, 0), count)
        i1 = count if hi is None else min(max(hi - base, i0), count)
        offsets = range(base + i0, base + i1)
    n = i1 - i0
    if flags & FLAG_TIMESTAMPS:
        stamps = struct.unpack_from(f"<{count}q", buf, p)
        p += 8 * count
        timestamps = array("d", [t / 1_000_000 for t in stamps[i0:i1]])
    else:
        timestamps = array("d", (header.first_ts / 1_000_000,)) * n
    lengths = _u32_array(buf, lens_at, count)
    if not flags & (FLAG_KEYS | FLAG_HEADERS):
        # the values are back to back: one slice of the buffer
        a = p + (sum(lengths[:i0]) if i0 else 0)
        e = pos + header.length if i1 == count else a + sum(lengths[i0:i1])
        return ColumnBatch(
            offsets,
            timestamps,
            [None] * n,
            [EMPTY_HEADERS] * n,
            memoryview(buf)[a:e],
            lengths[i0:i1] if n != count else lengths,
        )
    klens: Sequence[int] = (-1,) * count
    if flags & FLAG_KEYS:
        klens = struct.unpack_from(f"<{count}i", buf, p)
        p += 4 * count
    hlens: Sequence[int] = (0,) * count
    if flags & FLAG_HEADERS:
        hlens = struct.unpack_from(f"<{count}I", buf, p)
        p += 4 * count
    keys: list[bytes | None] = []
    headers: list[Mapping[str, str]] = []
    values: list[bytes] = []
    for i in range(i1):
        kl = klens[i]
        key = None
        if kl >= 0:
            key = buf[p : p + kl]
            p += kl
        hl = hlens[i]
        hdrs = EMPTY_HEADERS
        if hl:
            if i >= i0:
                hdrs = _decode_headers(buf[p : p + hl])
            p += hl
        e = p + lengths[i]
        if i >= i0:
            keys.append(key)
            headers.append(hdrs)
            values.append(buf[p:e])
        p = e
    return ColumnBatch(offsets, timestamps, keys, headers, b"".join(values), lengths[i0:i1])


def decode_frame(
    buf: bytes,
    pos: int,
    header: FrameHeader,
    lo: int = 0,
    hi: int | None = None,
) -> list[Record]:
    """Records of the frame at ``pos`` in ``buf`` whose offsets lie in [lo, hi)."""
    if not header.flags:
        return list(iter_frame(buf, pos, header, lo, hi))
    cols = frame_columns(buf, pos, header, lo, hi)
    out: list[Record] = []
    append: Callable[[Any], None] = out.append
    new = object.__new__
    draft = _RecordDraft
    rec = Record
    for off, ts, key, value, hdrs in zip(
        cols.offsets, cols.timestamps, cols.keys, cols.values, cols.headers, strict=True
    ):
        r = new(draft)
        r.offset = off
        r.timestamp = ts
        r.key = key
        r.value = value
        r.headers = hdrs
        r.__class__ = rec  # type: ignore[assignment]
        append(r)
    return out


def iter_frame(
    buf: bytes,
    pos: int,
    header: FrameHeader,
    lo: int = 0,
    hi: int | None = None,
) -> Iterator[Record]:
    """Like :func:`decode_frame`, one record at a time.

    Handing records out as they are built lets each die before the next is made, so
    reading millions of them never sets off the cyclic garbage collector (building a
    list of a frame's records does, and costs a third more).
    """
    if header.flags:
        yield from decode_frame(buf, pos, header, lo, hi)
        return
    count = header.count
    base = header.base_offset
    p = pos + HEADER_SIZE
    lens = struct.unpack_from(f"<{count}I", buf, p)
    p += 4 * count
    ts = header.first_ts / 1_000_000
    first = max(lo - base, 0)
    last = count if hi is None else min(max(hi - base, 0), count)
    ends = list(accumulate(lens[first:last], initial=p + sum(lens[:first])))
    new = object.__new__
    draft = _RecordDraft
    rec = Record
    empty = EMPTY_HEADERS
    # ends has one more item than there are records: zip stops at the last record
    offsets = range(base + first, base + last)
    for off, a, e in zip(offsets, ends, islice(ends, 1, None), strict=False):
        r = new(draft)
        r.offset = off
        r.timestamp = ts
        r.key = None
        r.value = buf[a:e]
        r.headers = empty
        r.__class__ = rec  # type: ignore[assignment]
        yield r  # type: ignore[misc]


def frame_timestamps(buf: bytes, pos: int, header: FrameHeader) -> list[tuple[int, int]]:
    """(offset, timestamp µs) of every record of a frame, without building records."""
    count = header.count
    p = pos + HEADER_SIZE + 4 * count
    if header.flags & FLAG_GAPS:
        offsets = [header.base_offset + d for d in struct.unpack_from(f"<{count}I", buf, p)]
        p += 4 * count
    else:
        offsets = list(range(header.base_offset, header.base_offset + count))
    if header.flags & FLAG_TIMESTAMPS:
        stamps: Iterable[int] = struct.unpack_from(f"<{count}q", buf, p)
    else:
        stamps = [header.first_ts] * count
    return list(zip(offsets, stamps, strict=True))


def _decode_headers(raw: bytes) -> Mapping[str, str]:
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        return MappingProxyType({"_undecodable_headers": raw.decode("utf-8", "replace")})
    return MappingProxyType({str(k): str(v) for k, v in obj.items()})


# --- index -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One sparse index entry."""

    offset: int
    """First offset of the frame the entry points to."""
    position: int
    """Byte position of that frame in the segment."""
    max_ts_before: int
    """Largest timestamp (µs) of all records written to the stream before that frame."""


def encode_index_entry(offset: int, position: int, max_ts_before: int) -> bytes:
    """The 24 bytes of an index entry."""
    return INDEX_ENTRY.pack(offset, position, max_ts_before)


def parse_index(raw: bytes) -> list[IndexEntry]:
    """Entries of an index file; a torn trailing partial entry is ignored.

    Entries that do not increase in offset and position end the list (a stale tail).
    """
    out: list[IndexEntry] = []
    usable = len(raw) - len(raw) % INDEX_ENTRY.size
    last_off = last_pos = -1
    for off, pos, mts in INDEX_ENTRY.iter_unpack(raw[:usable]):
        if off < last_off or pos < last_pos or (out and pos == last_pos):
            break
        out.append(IndexEntry(off, pos, mts))
        last_off, last_pos = off, pos
    return out


# --- consumer group offsets file ----------------------------------------------------------

_OFFSETS_MAGIC = "fsbus-offsets 1"


def encode_offsets_file(offsets: Mapping[int, int], generation: int = 0) -> bytes:
    """Text of an offsets file: one ``partition offset`` line each, then a checksum line.

    ``generation`` counts the group's writes of the file (see :func:`encode_generations`).
    """
    lines = [_OFFSETS_MAGIC, f"partitions {len(offsets)}", f"generation {generation}"]
    lines += [f"{p} {o}" for p, o in sorted(offsets.items())]
    body = ("\n".join(lines) + "\n").encode()
    return body + f"checksum {xxhash.xxh64_hexdigest(body)}\n".encode()


def decode_offsets_file(raw: bytes) -> dict[int, int]:
    """Parse an offsets file; raise ValueError saying what is wrong with it."""
    return decode_offsets_file_generation(raw)[0]


def decode_offsets_file_generation(raw: bytes) -> tuple[dict[int, int], int]:
    """Parse an offsets file into (offsets, generation); raise ValueError if it is bad."""
    cut = raw.rfind(b"checksum ")
    if cut < 0 or not raw.endswith(b"\n"):
        raise ValueError("it has no checksum line (torn or not an offsets file)")
    body, tail = raw[:cut], raw[cut:].strip()
    if tail != f"checksum {xxhash.xxh64_hexdigest(body)}".encode():
        raise ValueError("its checksum does not match its contents")
    lines = body.decode().splitlines()
    if not lines or lines[0] != _OFFSETS_MAGIC or len(lines) < 2:
        raise ValueError(f"it does not start with {_OFFSETS_MAGIC!r}")
    count = int(lines[1].split()[1])
    generation = 0
    out: dict[int, int] = {}
    for line in lines[2:]:
        a, b = line.split()
        if a == "generation":
            generation = int(b)
        else:
            out[int(a)] = int(b)
    if len(out) != count:
        raise ValueError(f"it lists {len(out)} partitions but says {count}")
    return out, generation


# --- consumer group generations -------------------------------------------------------------

_GENERATIONS = struct.Struct("<QQQQQ")


def encode_generations(owners: tuple[int, int], offsets: tuple[int, int]) -> bytes:
    """The 40-byte ``generation`` file of a consumer group.

    For the owners and the offsets files: how many times each was written and the length
    of its latest version, then an xxh64 of those four numbers. The two files are
    replaced by rename; a mount that caches names or sizes (FUSE, NFS) may serve an old
    or cut-short copy for a moment after another host replaced them. This small file is
    rewritten in place at a fixed size, so every open sees its latest bytes, and a reader
    can tell a stale copy (older count, other length: read again) from a corrupt one
    (right length, bad checksum).
    """
    head = struct.pack("<QQQQ", owners[0], owners[1], offsets[0], offsets[1])
    return head + struct.pack("<Q", _xxh64(head))


def decode_generations(raw: bytes) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """((owners count, length), (offsets count, length)), or None if missing or torn."""
    if len(raw) != _GENERATIONS.size:
        return None
    og, ol, fg, fl, check = _GENERATIONS.unpack(raw)
    if _xxh64(raw[:32]) != check:
        return None
    return (og, ol), (fg, fl)
