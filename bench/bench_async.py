"""``await Bus.publish`` from one event loop, beside ``BlockingBus.publish``, in one run.

For each filesystem (a tmpfs and a journaled ext4 image, see ``bench/filesystems.py``),
round after round, each round in new directories (one per kind), 100-byte payloads, the
four kinds taking turns in slices of 1,000 publishes (rotated):

* ``blocking``    ``BlockingBus.publish`` in a plain loop (no event loop): the reference;
* ``sequential``  ``await bus.publish`` one at a time from one task;
* ``concurrent``  50 tasks, each awaiting its share of the publishes (50 in flight);
* ``subscribed``  ``await bus.publish`` one at a time from a bus that is also subscribed
  (to ``elsewhere.#``, which these publishes do not match), as a service publishes: its
  scan loop runs and wakes at each of its own stamps, on the same event loop.

Every figure is messages/s (publishes over the time spent in that kind's slices); the
ratios (median over the rounds of async / blocking of the same round) are what to read on
a shared machine. The CPU ratios are the same with the process's CPU time (every thread)
instead of the clock: what each publish costs, whatever else the machine runs. Each bus
is warmed up with the same number of publishes first (an async bus measures the mount in
a worker thread before it publishes inline). The blocking bus publishes from the same
thread as the event loop, between the async slices, as a script would.

Then the event loop's lag while the filesystem is slow: a bus on the tmpfs whose I/O seam
sleeps 10 ms in every system call of a publish (the seam is the ``ops=`` argument; this
bench brings its own object of the seam's shape, since the seam class is private). A
ticker task sleeps 1 ms again and again and records how late it wakes. Phases: idle (no
publishing: the machine's own noise), busy reference (no publishing, a task doing pure
Python work that yields every 0.5 ms: what a busy loop gets on this machine), fast mount
sequential and 50 in flight (publishing inline), slow mount sequential and 50 in flight.
The lag percentiles are over every tick of a phase; the calls that ran on the loop's
thread are counted from the seam (the first two publishes to meet the slow mount run
inline to their end: that is the ``max``). Each phase has its own bus. A fast phase
ends after 60,000 publishes if its time is not up first, and leaves a backlog of that
many messages; the bus's sweep for expired messages (every 10 s, in a worker thread) over
that many holds the GIL long enough to show in the lag, so it is off there unless
``--lag-with-gc``. The slow phases run on a fresh bus with the defaults.

    .venv/bin/python -m bench.bench_async [--quick] [--fs tmpfs,ext4loop] [--rounds R]
        [--messages N] [--lag-seconds S] [--lag-with-gc] [--json FILE]

Targets: sequential (subscribed or not) >= 0.5x and concurrent >= 0.8x blocking on both
filesystems; loop lag p99 <= 5 ms with the 10 ms seam.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from bench.filesystems import Scratch, scratch, unavailable
from fsbus import BlockingBus, Bus, BusConfig

PAYLOAD = b"x" * 100
TOPIC = "bench.async"
IN_FLIGHT = 50
WARMUP = 200
TICK = 0.001
"""Seconds the lag ticker sleeps each time."""
SLOW = 0.010
"""Seconds the slow seam sleeps in each call."""
CAP = 60_000
"""Publishes at most per lag phase (each file takes a 4 KiB page of the tmpfs)."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- throughput
KINDS = ("blocking", "sequential", "concurrent", "subscribed")
CHUNK = 1000
"""Publishes per slice: the kinds take turns slice by slice (a burst of load on a shared
machine then hits all of them alike, where whole runs of a second each drew different
bursts and swung a ratio by 2x)."""


async def _round(dirs: dict[str, Path], n: int) -> dict[str, float]:
    """One round: a bus per kind, each in its own new directory; the kinds publish
    ``n`` messages each, in slices of :data:`CHUNK`, taking turns (rotated); rates."""
    spent = dict.fromkeys(KINDS, 0.0)
    cpu = dict.fromkeys(KINDS, 0.0)
    done = dict.fromkeys(KINDS, 0)
    with BlockingBus(dirs["blocking"]) as blocking:
        async with (
            Bus(dirs["sequential"]) as seq_bus,
            Bus(dirs["concurrent"]) as conc_bus,
            Bus(dirs["subscribed"]) as sub_bus,
        ):

            async def elsewhere(_msg: object) -> None:
                raise AssertionError("the subscribed bus got one of its own publishes")

            await sub_bus.subscribe("elsewhere.#", elsewhere)
            for _ in range(WARMUP):  # the same for each (an async bus measures the mount)
                blocking.publish(TOPIC, PAYLOAD)
                await seq_bus.publish(TOPIC, PAYLOAD)
                await conc_bus.publish(TOPIC, PAYLOAD)
                await sub_bus.publish(TOPIC, PAYLOAD)

            async def worker(share: int) -> None:
                for _ in range(share):
                    await conc_bus.publish(TOPIC, PAYLOAD)

            for i in range(max(1, n // CHUNK)):
                j = i % len(KINDS)
                for kind in KINDS[j:] + KINDS[:j]:
                    t0, c0 = time.perf_counter(), time.process_time()
                    if kind == "blocking":
                        for _ in range(CHUNK):
                            blocking.publish(TOPIC, PAYLOAD)
                    elif kind == "sequential":
                        for _ in range(CHUNK):
                            await seq_bus.publish(TOPIC, PAYLOAD)
                    elif kind == "subscribed":
                        for _ in range(CHUNK):
                            await sub_bus.publish(TOPIC, PAYLOAD)
                    else:
                        async with anyio.create_task_group() as tg:
                            for _ in range(IN_FLIGHT):
                                tg.start_soon(worker, CHUNK // IN_FLIGHT)
                    spent[kind] += time.perf_counter() - t0
                    cpu[kind] += time.process_time() - c0
                    done[kind] += CHUNK
    rates = {k: done[k] / spent[k] for k in KINDS}
    rates.update({f"{k} cpu": done[k] / cpu[k] for k in KINDS})
    return rates


def throughput(place: Scratch, n: int, rounds: int) -> dict[str, Any]:
    """Rates per kind and round, and the ratios to blocking of the same round."""
    rates: dict[str, list[float]] = {k: [] for k in (*KINDS, *(f"{k} cpu" for k in KINDS))}
    for r in range(rounds):
        dirs = {k: place.workdir(k) for k in KINDS}
        try:
            got = anyio.run(_round, dirs, n)
        finally:
            for d in dirs.values():
                place.remove(d)
        for k, v in got.items():
            rates[k].append(v)
        log(f"  {place.name} round {r + 1}: " + ", ".join(f"{k} {got[k]:,.0f}/s" for k in KINDS))
    ratios = {
        k: [a / b for a, b in zip(rates[k], rates[ref], strict=True)]
        for k, ref in (
            ("sequential", "blocking"),
            ("concurrent", "blocking"),
            ("subscribed", "blocking"),
            ("sequential cpu", "blocking cpu"),
            ("concurrent cpu", "blocking cpu"),
            ("subscribed cpu", "blocking cpu"),
        )
    }
    return {
        "fs": place.description,
        "rates": rates,
        "median": {k: statistics.median(v) for k, v in rates.items()},
        "ratio": {k: statistics.median(v) for k, v in ratios.items()},
        "ratios": ratios,
    }


# ---------------------------------------------------------------------- a slow seam
class SlowSeam:
    """The bus's I/O seam (the ``ops=`` argument), with ``delay`` seconds in every call of
    a publish (creating, writing, closing, renaming, stamping) while it is set.

    It has the shape of fsbus's own seam: every call is the plain system call. It also
    counts the publish calls made on the event loop's thread (``loop_thread``).
    """

    def __init__(self) -> None:
        self.delay = 0.0
        self.loop_thread = threading.get_ident()
        self.on_loop = 0
        self.off_loop = 0
        self.last_rename_on_loop = False

    def _call(self) -> None:
        if threading.get_ident() == self.loop_thread:
            self.on_loop += 1
        else:
            self.off_loop += 1
        if self.delay:
            time.sleep(self.delay)

    # what a publish does
    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        self._call()
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        self._call()
        os.close(fd)

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview]) -> int:
        self._call()
        return os.writev(fd, buffers)

    def rename(self, src: str, dst: str) -> None:
        self._call()
        self.last_rename_on_loop = threading.get_ident() == self.loop_thread
        os.rename(src, dst)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        self._call()
        return os.pwrite(fd, data, offset)

    # everything else, at full speed
    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def pread_into(self, fd: int, buffer: Any, offset: int) -> int:
        return os.preadv(fd, [buffer], offset)

    def drop_cache(self, fd: int) -> None:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def subdirs(self, path: str) -> set[str]:
        with os.scandir(path) as it:
            return {e.name for e in it if e.is_dir(follow_symlinks=False)}

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def lstat(self, path: str) -> os.stat_result:
        return os.lstat(path)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)

    def link(self, src: str, dst: str) -> None:
        os.link(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        os.mkdir(path, mode)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode, follow_symlinks=False)

    def utime(self, path: str) -> None:
        os.utime(path, follow_symlinks=False)

    def flock(self, fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)

    def copy_range(self, src_fd: int, dst_fd: int, count: int) -> int:
        return os.copy_file_range(src_fd, dst_fd, count)

    # the mount table (which filesystem holds the bus)
    def read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def list_names(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except OSError:
            return []

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def statfs_magic(self, path: str) -> int | None:
        return None  # the mount table says it


# ---------------------------------------------------------------------- loop lag
def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def _lag(root: Path, seconds: float, with_gc: bool) -> dict[str, Any]:
    seam = SlowSeam()
    out: dict[str, Any] = {}
    lags: list[float] = []
    done = anyio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await anyio.sleep(TICK)
            lags.append(max(0.0, time.perf_counter() - t0 - TICK))

    async def phase(name: str, work: Callable[[], Awaitable[int]]) -> None:
        nonlocal done
        lags.clear()
        on_loop = seam.on_loop
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            published = await work()
            done.set()
        out[name] = {
            "p50_ms": percentile(lags, 0.5) * 1000,
            "p99_ms": percentile(lags, 0.99) * 1000,
            "max_ms": max(lags, default=float("nan")) * 1000,
            "ticks": len(lags),
            "publishes": published,
            "calls_on_loop": seam.on_loop - on_loop,
        }
        r = out[name]
        log(
            f"  lag {name}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
            f"max {r['max_ms']:.1f} ms ({r['ticks']} ticks, {published} publishes, "
            f"{r['calls_on_loop']} calls on the loop)"
        )

    current: list[Bus] = []  # the bus the phases publish on

    async def idle() -> int:
        await anyio.sleep(seconds)
        return 0

    async def busy() -> int:
        # The machine's floor for a busy loop: pure Python work, yielding every 0.5 ms.
        end = time.perf_counter() + seconds
        while (t := time.perf_counter()) < end:
            while time.perf_counter() - t < 0.0005:
                pass
            await anyio.lowlevel.checkpoint()
        return 0

    async def sequential() -> int:
        bus, n = current[0], 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and n < CAP:
            await bus.publish(TOPIC, PAYLOAD)
            n += 1
        return n

    async def concurrent() -> int:
        bus, count = current[0], [0]
        end = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < end and count[0] < CAP:
                await bus.publish(TOPIC, PAYLOAD)
                count[0] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(IN_FLIGHT):
                tg.start_soon(worker)
        return count[0]

    async def until_inline(bus: Bus) -> None:
        # A new bus measures the mount in a thread first: publish until one rename ran
        # on the loop's thread.
        seam.last_rename_on_loop = False
        for _ in range(10_000):
            await bus.publish(TOPIC, PAYLOAD)
            if seam.last_rename_on_loop:
                return
        raise RuntimeError("the bus never published inline on the fast seam")

    os.makedirs(root)
    # No sweep for expired messages here: a fast phase leaves up to 60,000 messages,
    # and the sweep (every 10 s, Python over every file, in a worker thread) holds the GIL
    # long enough to stall the loop for tens of milliseconds: a cost of the backlog, not
    # of publishing, measured apart (--lag-with-gc).
    fast_config = None if with_gc else BusConfig(gc_interval=1e6)
    await phase("idle", idle)
    await phase("busy reference", busy)
    for name, work in (("fast sequential", sequential), ("fast 50 in flight", concurrent)):
        # A bus per phase, removed after it: each file takes a page of the tmpfs.
        where = root / name.replace(" ", "-")
        async with Bus(where, ops=seam, config=fast_config) as bus:  # type: ignore[arg-type]
            current[:] = [bus]
            await until_inline(bus)
            await phase(name, work)
        shutil.rmtree(where)
    # The slow phases on a fresh bus (defaults): no backlog from the fast phases.
    async with Bus(root / "slow", ops=seam) as bus:  # type: ignore[arg-type]
        current[:] = [bus]
        await until_inline(bus)
        seam.delay = SLOW  # the mount turns slow under a bus that publishes inline
        await phase("slow sequential", sequential)
        await phase("slow 50 in flight", concurrent)
    return out


def loop_lag(place: Scratch, seconds: float, with_gc: bool) -> dict[str, Any]:
    workdir = place.workdir("lag")
    try:
        return anyio.run(_lag, workdir, seconds, with_gc)
    finally:
        place.remove(workdir)


# ---------------------------------------------------------------------- report
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer messages and rounds")
    ap.add_argument("--fs", default="tmpfs,ext4loop", help="filesystems (bench/filesystems.py)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--lag-seconds", type=float, default=None)
    ap.add_argument(
        "--lag-with-gc",
        action="store_true",
        help="keep the sweep for expired messages on during the fast lag phases",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    n = args.messages or (5_000 if args.quick else 20_000)
    rounds = args.rounds or (3 if args.quick else 5)
    seconds = args.lag_seconds or (1.5 if args.quick else 4.0)
    results: dict[str, Any] = {"messages": n, "rounds": rounds, "fs": {}}
    for fs in args.fs.split(","):
        why = unavailable(fs)
        if why:
            log(f"{fs}: skipped ({why})")
            results["fs"][fs] = {"skipped": why}
            continue
        log(f"{fs}: {n:,} publishes x {rounds} rounds")
        # every file of a round at once: four buses of n publishes (a loop ext4 image
        # gets one inode per 16 KiB, so 1 GiB held the quick plan's and not the full one's)
        size_mb = max(1024, 4 * (n + WARMUP) * 16 * 3 // (2 * 1024))
        with scratch(fs, size_mb=size_mb) as place:
            results["fs"][fs] = throughput(place, n, rounds)
            if fs == "tmpfs":
                log(f"{fs}: loop lag, {seconds:g} s per phase, seam {SLOW * 1000:g} ms per call")
                results["lag"] = loop_lag(place, seconds, args.lag_with_gc)

    print(f"\n100 B publishes, {n:,} per figure, median of {rounds} rounds (messages/s)\n")
    print(
        "| filesystem | blocking | sequential await | ratio | 50 in flight | ratio "
        "| sequential, subscribed | ratio | CPU ratios (sequential, 50 in flight, subscribed) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for fs, r in results["fs"].items():
        if "skipped" in r:
            print(f"| {fs} | skipped: {r['skipped']} | | | | | | | |")
            continue
        m, q = r["median"], r["ratio"]
        print(
            f"| {fs} ({r['fs']}) | {m['blocking']:,.0f} | {m['sequential']:,.0f} | "
            f"{q['sequential']:.2f}x | {m['concurrent']:,.0f} | {q['concurrent']:.2f}x | "
            f"{m['subscribed']:,.0f} | {q['subscribed']:.2f}x | "
            f"{q['sequential cpu']:.2f}x, {q['concurrent cpu']:.2f}x, {q['subscribed cpu']:.2f}x |"
        )
    lag = results.get("lag")
    if lag:
        print(f"\nEvent-loop lag (a {TICK * 1000:g} ms ticker), seam {SLOW * 1000:g} ms per call\n")
        print("| phase | publishes | p50 ms | p99 ms | max ms | calls on the loop |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, r in lag.items():
            if not isinstance(r, dict):
                continue
            print(
                f"| {name} | {r['publishes']:,} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{r['max_ms']:.1f} | {r['calls_on_loop']:,} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
