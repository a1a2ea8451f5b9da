"""The physical ceiling: plain Python os calls, no bus at all.

``pub``: the same file dance a bus publish does (create O_EXCL in ``staging/``, write a 0x00
byte and the payload, close, rename into one of 256 bucket directories), nothing else:
no names to encode, no UPDATE stamp, no bookkeeping. ``durable`` adds fdatasync of the file
and fsync of the bucket directory. ``append``: length-prefixed records appended to one file
through a buffered writer (``durable``: fdatasync every 1000 records). ``read``: read them back.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any, ClassVar

from bench.child import make_payload, result
from bench.scenarios import Kind
from bench.systems.base import System

BUCKETS = 256
BATCH = 1000


class Raw(System):
    name: ClassVar[str] = "raw"
    label: ClassVar[str] = "raw os loop"
    module: ClassVar[str] = "raw"
    kinds: ClassVar[frozenset[Kind]] = frozenset(
        {"publish", "publish_durable", "append", "append_durable", "read"}
    )


def _pub(p: dict[str, Any]) -> None:
    root = Path(p["dir"])
    staging = root / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    buckets = [root / "messages" / f"{b:02x}" for b in range(BUCKETS)]
    for b in buckets:
        b.mkdir(parents=True, exist_ok=True)
    n, size, durable = int(p["n"]), int(p["size"]), bool(p.get("durable"))
    topic_hex = b"bench.topic".hex()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    payloads = [b"\x00" + make_payload(i, size) for i in range(n)]
    t0 = time.monotonic_ns()
    for i in range(n):
        name = f"{topic_hex}@s+{int(time.time() * 1000) + 60_000:x}+m+{secrets.token_hex(16)}"
        src = os.path.join(staging, name)
        fd = os.open(src, flags, 0o666)
        try:
            os.write(fd, payloads[i])
            if durable:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        bucket = buckets[i % BUCKETS]
        os.rename(src, os.path.join(bucket, name))
        if durable:
            dfd = os.open(bucket, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    t1 = time.monotonic_ns()
    result(t0_ns=t0, t1_ns=t1)


def _write_log(path: Path, n: int, size: int, durable: bool) -> None:
    with path.open("ab", buffering=1 << 16) as f:
        for i in range(n):
            rec = make_payload(i, size)
            f.write(len(rec).to_bytes(4, "little") + rec)
            if durable and i % BATCH == BATCH - 1:
                f.flush()
                os.fdatasync(f.fileno())
        f.flush()
        if durable:
            os.fdatasync(f.fileno())


def _append(p: dict[str, Any]) -> None:
    path = Path(p["dir"]) / "log.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic_ns()
    _write_log(path, int(p["n"]), int(p["size"]), bool(p.get("durable")))
    result(t0_ns=t0, t1_ns=time.monotonic_ns())


def _read(p: dict[str, Any]) -> None:
    path = Path(p["dir"]) / "log.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    n = int(p["n"])
    _write_log(path, n, int(p["size"]), False)
    t0 = time.monotonic_ns()
    got = 0
    with path.open("rb", buffering=1 << 16) as f:
        while head := f.read(4):
            rec = f.read(int.from_bytes(head, "little"))
            got += int(rec[:8]) >= 0
    t1 = time.monotonic_ns()
    if got != n:
        raise SystemExit(f"read {got} records, wrote {n}")
    result(t0_ns=t0, t1_ns=t1)


ROLES = {"pub": _pub, "append": _append, "read": _read}
