"""The durable log's format (pure: bytes in, values out; see :mod:`fsbus._bus.wal`).

::

    0, 512     two header slots: magic, version, generation, checkpoint, boot id, pid,
               crc32 (the valid slot with the higher generation counts)
    4096 ...   records: body length, crc32 of sequence + body, sequence number, then
               the body: a count, and for each file its path's length, its data's
               length, its path (relative to the bus root, UTF-8) and its data

A reading of the records stops at the first that is torn, fails its crc, does not
parse, or does not follow the one before (the older records a wrapped log left).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "ALL_DONE",
    "HEADER",
    "SLOT",
    "Header",
    "Record",
    "decode_header",
    "decode_records",
    "encode_header",
    "encode_record",
    "safe_relative",
]

HEADER = 4096
"""Bytes before the first record (the two header slots, then padding)."""
SLOT = 512
ALL_DONE = (1 << 64) - 1
"""The checkpoint of a log that was recovered: nothing in it is replayed again."""
MAGIC = b"FSBUSWAL"
VERSION = 1
_HEAD = struct.Struct("<8sIQQ40sI")  # magic, version, generation, checkpoint, boot id, pid
_REC = struct.Struct("<IIQ")  # body length, crc32 of sequence + body, sequence
_SEQ = struct.Struct("<Q")
_ENTRY = struct.Struct("<HI")  # path length, data length


@dataclass(frozen=True, slots=True)
class Record:
    """One durable publish: the files it placed, relative to the bus root."""

    seq: int
    files: tuple[tuple[str, bytes], ...]


def encode_record(seq: int, files: list[tuple[str, bytes]]) -> bytes:
    """A record as written into the log."""
    parts = [struct.pack("<I", len(files))]
    for rel, data in files:
        path = rel.encode("utf-8")
        parts += (_ENTRY.pack(len(path), len(data)), path, data)
    body = b"".join(parts)
    crc = zlib.crc32(body, zlib.crc32(_SEQ.pack(seq)))
    return _REC.pack(len(body), crc, seq) + body


def decode_records(buf: bytes | memoryview, start: int = HEADER) -> Iterator[Record]:
    """The records of a log's bytes, in order, up to the first that is torn, fails its
    crc, or does not follow the one before (the older records a wrapped log left)."""
    view = memoryview(buf)
    pos = start
    prev = 0
    while pos + _REC.size <= len(view):
        length, crc, seq = _REC.unpack_from(view, pos)
        end = pos + _REC.size + length
        if length < 4 or end > len(view) or seq <= prev:
            return
        body = view[pos + _REC.size : end]
        if zlib.crc32(body, zlib.crc32(_SEQ.pack(seq))) != crc:
            return
        files = _decode_body(body)
        if files is None:
            return
        yield Record(seq, files)
        prev = seq
        pos = end


def _decode_body(body: memoryview) -> tuple[tuple[str, bytes], ...] | None:
    (count,) = struct.unpack_from("<I", body, 0)
    pos = 4
    files: list[tuple[str, bytes]] = []
    for _ in range(count):
        if pos + _ENTRY.size > len(body):
            return None
        plen, dlen = _ENTRY.unpack_from(body, pos)
        pos += _ENTRY.size
        if pos + plen + dlen > len(body):
            return None
        try:
            rel = bytes(body[pos : pos + plen]).decode("utf-8")
        except UnicodeDecodeError:
            return None
        files.append((rel, bytes(body[pos + plen : pos + plen + dlen])))
        pos += plen + dlen
    return tuple(files)


@dataclass(frozen=True, slots=True)
class Header:
    generation: int
    checkpoint: int
    boot_id: str
    pid: int


def encode_header(h: Header) -> bytes:
    raw = _HEAD.pack(
        MAGIC, VERSION, h.generation, h.checkpoint, h.boot_id.encode("ascii")[:40], h.pid
    )
    return raw + struct.pack("<I", zlib.crc32(raw))


def decode_header(buf: bytes) -> Header | None:
    """The valid header slot with the higher generation, or None (not a log, or never
    got as far as its first header)."""
    best: Header | None = None
    for off in (0, SLOT):
        raw = buf[off : off + _HEAD.size + 4]
        if len(raw) < _HEAD.size + 4:
            continue
        (crc,) = struct.unpack_from("<I", raw, _HEAD.size)
        if zlib.crc32(raw[: _HEAD.size]) != crc:
            continue
        magic, version, gen, ckpt, boot, pid = _HEAD.unpack_from(raw)
        if magic != MAGIC or version != VERSION:
            continue
        h = Header(gen, ckpt, boot.rstrip(b"\0").decode("ascii", "replace"), pid)
        if best is None or h.generation > best.generation:
            best = h
    return best


def safe_relative(rel: str) -> bool:
    """Whether a record's path stays inside the bus (a hostile log names nothing else)."""
    if not rel or rel.startswith("/") or "\0" in rel:
        return False
    parts = rel.split("/")
    return all(p not in ("", ".", "..") for p in parts)
