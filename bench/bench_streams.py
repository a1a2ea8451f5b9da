"""Streams benchmark: fsbus Streams beside a raw append loop, persist-queue and queuelib.

Everything runs in one process, in one run, on each filesystem in turn (the working
disk under a temp dir, and tmpfs at /dev/shm), with 100-byte records:

* ``append``          ``Stream.append_batch`` of 1000 records, durability ``none``
* ``append+fsync``    the same with durability ``batch``: one fdatasync per 1000 records
* ``read``            ``Stream.read`` of every record, building :class:`fsbus.Record` s
* ``append 1-by-1``   ``Stream.append`` per record (durability ``none``), for reference
* ``raw ...``         the ceiling: the very bytes fsbus wrote (its frames), written with
                      plain ``file.write`` in the same number of calls (and fdatasync after
                      each for the durable variant); raw read = ``file.read`` of the file
* ``persist-queue``   ``persistqueue.Queue`` (file based) put / get + task_done
* ``queuelib``        ``FifoDiskQueue`` push / pop

The disk runs in a temp dir under ``bench/scratch/`` (``FSBUS_BENCH_DISK_DIR`` to change
it). Each figure is the median of ``--rounds`` runs; the ratios printed compare figures of
this run only. Targets (checked at the end): append >= 1 M rec/s, read >= 2 M rec/s,
append+fsync >= 300 k rec/s.

    .venv/bin/python bench/bench_streams.py [--records N] [--rounds R] [--fs disk,tmpfs]
    [--json FILE]

Peers: ``pip install -r bench/requirements.txt`` (persist-queue, queuelib).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from fsbus import Stream, StreamConfig

RECORD = 100
BATCH = 1000
TARGETS = {"append": 1_000_000, "read": 2_000_000, "append+fsync": 300_000}


def _records(n: int) -> list[bytes]:
    return [f"{i:010d}".encode().ljust(RECORD, b".") for i in range(n)]


Rates = tuple[float, float]


def _rate(n: int, fn: Callable[[], object]) -> Rates:
    """Records per second of wall time, and per second of this process's CPU time.

    On a shared machine the wall figure moves with the others' load; the CPU figure
    says what the code costs.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return n / wall, n / max(cpu, 1e-9)


def _append(s: Stream, batches: list[list[bytes]]) -> None:
    for b in batches:
        s.append_batch(b)


def _append_each(s: Stream, recs: list[bytes]) -> None:
    for v in recs:
        s.append(v)


def _read(s: Stream, n: int) -> None:
    count = 0
    for _ in s.read():
        count += 1
    if count != n:
        raise AssertionError(f"read {count} records, expected {n}")


def _raw_append(path: Path, chunks: list[bytes], *, sync: bool) -> None:
    with open(path, "wb", buffering=0 if sync else -1) as f:
        for c in chunks:
            f.write(c)
            if sync:
                os.fdatasync(f.fileno())


def _raw_read(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(4 << 20):
            pass


def bench_fs(base: Path, n: int, n_peer: int, rounds: int) -> dict[str, float]:
    """Median records/s of every scenario on the filesystem holding ``base``."""
    recs = _records(n)
    batches = [recs[i : i + BATCH] for i in range(0, n, BATCH)]
    single_n = min(n, 100_000)
    results: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}

    def add(key: str, rates: Rates) -> None:
        results.setdefault(key, []).append(rates[0])
        cpus.setdefault(key, []).append(rates[1])

    for r in range(rounds):
        work = Path(tempfile.mkdtemp(prefix=f"round{r}-", dir=base))
        try:
            with Stream.open(work, "nosync", config=StreamConfig(durability="none")) as s:
                add("append", _rate(n, partial(_append, s, batches)))
                add("read", _rate(n, partial(_read, s, n)))
                frames = b"".join(Path(seg.path).read_bytes() for seg in s.info().segments)
            with Stream.open(work, "sync", config=StreamConfig(durability="batch")) as s:
                add("append+fsync", _rate(n, partial(_append, s, batches)))
            with Stream.open(work, "single", config=StreamConfig(durability="none")) as s:
                add("append 1-by-1", _rate(single_n, partial(_append_each, s, recs[:single_n])))

            # raw: the very bytes fsbus wrote, in as many writes as fsbus made batches
            step = -(-len(frames) // len(batches))
            chunks = [frames[i : i + step] for i in range(0, len(frames), step)]
            del frames
            raw = work / "raw.log"
            add("raw append", _rate(n, partial(_raw_append, raw, chunks, sync=False)))
            add(
                "raw append+fsync",
                _rate(n, partial(_raw_append, work / "raw-sync.log", chunks, sync=True)),
            )
            add("raw read", _rate(n, partial(_raw_read, raw)))
            chunks.clear()

            pq = _persist_queue(work / "pq", recs[:n_peer])
            if pq is not None:
                add("persist-queue put", pq[0])
                add("persist-queue get", pq[1])
            ql = _queuelib(work / "ql", recs[:n_peer])
            if ql is not None:
                add("queuelib push", ql[0])
                add("queuelib pop", ql[1])
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out = {k: statistics.median(v) for k, v in results.items()}
    out |= {f"{k} [cpu]": statistics.median(v) for k, v in cpus.items()}
    return out


def _persist_queue(path: Path, recs: list[bytes]) -> tuple[Rates, Rates] | None:
    try:
        import persistqueue
    except ImportError:
        print("persist-queue is not installed: pip install -r bench/requirements.txt")
        return None
    q = persistqueue.Queue(str(path), tempdir=str(path.parent))

    def put() -> None:
        for v in recs:
            q.put(v)

    def get() -> None:
        for _ in recs:
            q.get()
            q.task_done()

    return _rate(len(recs), put), _rate(len(recs), get)


def _queuelib(path: Path, recs: list[bytes]) -> tuple[Rates, Rates] | None:
    try:
        from queuelib import FifoDiskQueue
    except ImportError:
        print("queuelib is not installed: pip install -r bench/requirements.txt")
        return None
    q = FifoDiskQueue(str(path))

    def push() -> None:
        for v in recs:
            q.push(v)

    def pop() -> None:
        for _ in recs:
            q.pop()

    rates = _rate(len(recs), push), _rate(len(recs), pop)
    q.close()
    return rates


def _fmt(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M/s"
    return f"{x / 1e3:.1f} k/s"


def report(all_results: dict[str, dict[str, float]]) -> bool:
    """Print tables and ratios; return True when every target is met everywhere."""
    ok = True
    for fs, res in all_results.items():
        print(f"\n== {fs} ==")
        print(f"  {'scenario':<22} {'wall':>12} {'per CPU-second':>15}")
        for key, val in res.items():
            if not key.endswith(" [cpu]"):
                print(f"  {key:<22} {_fmt(val):>12} {_fmt(res.get(key + ' [cpu]', 0.0)):>15}")
        print("  ratios (same run):")
        pairs = [
            ("append", "raw append"),
            ("append+fsync", "raw append+fsync"),
            ("read", "raw read"),
            ("append", "persist-queue put"),
            ("read", "persist-queue get"),
            ("append", "queuelib push"),
            ("read", "queuelib pop"),
            ("append 1-by-1", "persist-queue put"),
            ("append 1-by-1", "queuelib push"),
        ]
        for a, b in pairs:
            if a in res and b in res:
                print(f"    fsbus {a} / {b:<18} {res[a] / res[b]:8.2f}x")
        for key, target in TARGETS.items():
            got = res.get(key, 0.0)
            met = got >= target
            ok &= met
            verdict = "ok" if met else "MISSED"
            print(f"  target {key:<14} >= {_fmt(target):>10}: {_fmt(got):>10} {verdict}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records per scenario")
    ap.add_argument("--peer-records", type=int, default=5_000, help="records for the peers")
    ap.add_argument("--rounds", type=int, default=3, help="runs per scenario (median)")
    ap.add_argument("--fs", default="disk,tmpfs", help="disk and/or tmpfs")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    # the working disk: a temp dir under bench/scratch/ (git-ignored) unless
    # FSBUS_BENCH_DISK_DIR says where
    scratch = Path(__file__).resolve().parent / "scratch"
    disk = Path(os.environ.get("FSBUS_BENCH_DISK_DIR", scratch))
    disk.mkdir(parents=True, exist_ok=True)
    places = {"disk": disk, "tmpfs": Path("/dev/shm")}
    out: dict[str, dict[str, float]] = {}
    for fs in args.fs.split(","):
        base = places[fs]
        top = Path(tempfile.mkdtemp(prefix="fsbus-bench-streams-", dir=base))
        try:
            label = f"{fs} ({base})"
            out[label] = bench_fs(top, args.records, args.peer_records, args.rounds)
        finally:
            shutil.rmtree(top, ignore_errors=True)
    ok = report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
