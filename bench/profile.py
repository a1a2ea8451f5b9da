"""Where fsbus spends its time: ``python -m bench.profile [publish|fanout|workqueue] ...``.

Runs one fsbus scenario with py-spy sampling the interesting process (the publisher for
``publish``, the subscriber or worker for the delivery paths; every thread, native frames
off) and prints a function-level table: inclusive and self share of the samples, with the
idle waits (selectors, condition variables) and start-up imports left out, so the shares
add up to the work done (for ``publish``: to the time inside ``BlockingBus.publish``).

``path`` times one message's way through one process instead: an async ``Bus`` subscribed
to ``bench.ping`` (whose handler re-publishes to ``bench.pong``) and ``bench.pong``, pings
sent one at a time, and timestamps (``time.perf_counter_ns``) taken along the way by
wrapping the bus's own steps on the instance (a profiler has to look inside): the publish
call, its file operations (create, write, rename, stamp), the scanner waking (inotify on
the loop), the worker-thread hop, the listing, the decision, the read, the hop back and
the handler. It prints the median and p90 of each step, for both legs of the round trip.

``crosspath`` does the same with the echo in a second process: each leg's sending half
is stamped in one process and its receiving half in the other (one clock for both).
``--gap`` sets the pause between a pong and the next ping (``path`` and ``crosspath``;
0 sends them back to back, as the harness's ``latency`` scenario does).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from bench.filesystems import scratch
from bench.procs import REPO, Child, python_cmd

IDLE = (
    "Condition.wait",
    "EpollSelector.select",
    "_check_inotify_fd",
    "Event.wait",
    "Queue.get",
    "Tally._report",  # the harness's own threads in the child
    "Tally._read_stdin",
)
FRAME = re.compile(r"\s*\((?:.*/)?([^/]+\.py):\d+\)|\s*\(<[^>]*>:\d+\)")


def _name(frame: str) -> str:
    return FRAME.sub(lambda m: f" ({m.group(1)})" if m.group(1) else "", frame).strip()


def summarise(raw: Path, top: int, focus: str | None = None) -> str:
    """Aggregate py-spy's raw stacks; ``focus``: keep only stacks through that function."""
    incl: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        raw_frames = [f for f in stack.split(";") if f]
        frames = [_name(f) for f in raw_frames]
        if not frames or any(i in frames[-1] for i in IDLE):
            continue
        if focus is not None and not any(f.startswith(focus) for f in frames):
            continue
        if any(f.startswith("_find_and_load") for f in frames):
            continue  # importing modules at start-up
        n = int(count)
        total += n
        for f in set(frames):
            incl[f] += n
        own[frames[-1]] += n
        lines[_line(raw_frames[-1])] += n
    out = [f"{total} busy samples", "", "inclusive  function"]
    out += [f"{100 * v / total:8.1f}%  {k}" for k, v in incl.most_common(top) if total]
    out += ["", "self       function"]
    out += [f"{100 * v / total:8.1f}%  {k}" for k, v in own.most_common(top // 2) if total]
    out += ["", "self       line (the source line running when sampled)"]
    out += [f"{100 * v / total:8.1f}%  {k}" for k, v in lines.most_common(top // 2) if total]
    return "\n".join(out)


def _line(frame: str) -> str:
    m = re.search(r"^(.*?)\s*\((?:.*/)?([^/]+\.py):(\d+)\)", frame)
    if m is None:
        return frame
    func, path, lineno = m.group(1), m.group(2), int(m.group(3))
    text = ""
    for base in (Path(sys.prefix), REPO):
        hits = list(base.rglob(path)) if base == REPO else []
        for h in hits[:1]:
            src = h.read_text(errors="replace").splitlines()
            if 0 < lineno <= len(src):
                text = src[lineno - 1].strip()
    return f"{func} ({path}:{lineno})  {text}"[:110]


def _pyspy() -> str:
    exe = Path(sys.executable).parent / "py-spy"
    found = str(exe) if exe.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is needed: pip install -r bench/requirements.txt")
    return found


def profile(
    scenario: str, fs: str, n: int, size: int, rate: int, top: int, consumers: int = 1
) -> str:
    spy = _pyspy()
    out = Path(tempfile.mkdtemp(prefix="fsbus-profile-")) / "profile.raw"
    with scratch(fs) as place:
        base = {"dir": str(place.path / "bus"), "n": n, "size": size}
        (place.path / "bus").mkdir()
        if scenario == "publish":
            subprocess.run(
                [spy, "record", "-r", str(rate), "-f", "raw", "-o", str(out), "--",
                 *python_cmd("fsbus_bus", "pub", base)],
                check=True, capture_output=True,
            )  # fmt: skip
        else:
            shared = scenario == "workqueue"
            role = "worker" if shared else "sub"
            params = {**base, "expect": None if shared else n}
            # The first consumer is sampled; the others compete with it (work queue) or
            # read beside it (fan-out), as in the harness's 4-consumer scenarios.
            group = [Child(python_cmd("fsbus_bus", role, params)) for _ in range(consumers)]
            cons = group[0]
            try:
                for c in group:
                    c.wait_line("READY", time.monotonic() + 60)
                spy_proc = subprocess.Popen(
                    [spy, "record", "--nonblocking", "-r", str(rate), "-f", "raw", "-o", str(out),
                     "--pid", str(cons.proc.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                time.sleep(0.5)  # py-spy attaching; nothing is measured here
                pub = Child(python_cmd("fsbus_bus", "pub", {**base, "single": shared}))
                pub.wait_result(time.monotonic() + 300)
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    for c in group:
                        c.poll(0.02)
                    counts = [c.count for c in group]
                    if (sum(counts) if shared else min(counts)) >= n:
                        break
                for c in group:
                    c.stop()
                for c in group:
                    c.wait_result(time.monotonic() + 30)
                spy_proc.wait(timeout=60)
            finally:
                for c in group:
                    c.close()
    text = summarise(out, top, "BlockingBus.publish" if scenario == "publish" else None)
    shutil.rmtree(out.parent, ignore_errors=True)
    return text


PATH_STEPS = (
    ("publish call -> file operations start", "call", "fs0"),
    ("file operations (create, write, rename, stamp)", "fs0", "fs1"),
    ("file operations end -> publish returns", "fs1", "ret"),
    ("publish returns -> inotify events read", "ret", "ino"),
    ("inotify events read -> scanner awake", "ino", "wake"),
    ("publish returns -> scanner awake (inotify on the loop)", "ret", "wake"),
    ("scanner awake -> listing starts (or the worker thread)", "wake", "thr0"),
    ("  read UPDATE", "thr0", "upd"),
    ("  find the changed buckets (own stamps left out)", "upd", "ls0"),
    ("    compare the stamps", "cb0", "cb1"),
    ("    tell this bus's own", "own0", "own1"),
    ("  list them", "ls0", "ls1"),
    ("listing the changed buckets (the three above and more)", "thr0", "list1"),
    ("  decide (compare the listings, parse the new names)", "dec0", "dec1"),
    ("decide, up to the read", "list1", "read0"),
    ("read the message", "read0", "read1"),
    ("read done -> back on the loop", "read1", "back"),
    ("  back on the loop -> Message made", "back", "msg1"),
    ("back on the loop -> handler starts", "back", "handler"),
    ("one way: publish call -> handler", "call", "handler"),
)


class _Tracer:
    """Timestamps (``perf_counter_ns``: one clock for every process) on a bus's own steps.

    A leg is one message, publish call to handler. The sending half's stamps (the first
    of each in the leg) and the receiving half's (the last before the handler: a wake-up
    for the bus's own publish comes earlier and lists nothing) are kept apart, so that
    two processes' halves can be joined into one leg.
    """

    def __init__(self) -> None:
        self.sends: list[dict[str, int]] = []
        self.recvs: list[dict[str, int]] = []
        self.send: dict[str, int] = {}
        self.recv: dict[str, int] = {}

    def start_send(self, t: int) -> None:
        self.send = {"call": t}
        self.sends.append(self.send)

    def received(self) -> None:
        self.recv["handler"] = perf_counter_ns()
        self.recvs.append(self.recv)
        self.recv = {}

    def stamp(self, key: str) -> None:
        if key in _SEND_KEYS:
            self.send.setdefault(key, perf_counter_ns())
        else:
            self.recv[key] = perf_counter_ns()

    def _wrap(self, obj: object, attr: str, before: str | None, after: str | None) -> None:
        fn = getattr(obj, attr)
        stamp = self.stamp

        def wrapped(*a: object, **k: object) -> object:
            if before:
                stamp(before)
            try:
                return fn(*a, **k)
            finally:
                if after:
                    stamp(after)

        setattr(obj, attr, wrapped)

    def _wrap_async(self, obj: object, attr: str, before: str | None, after: str | None) -> None:
        fn = getattr(obj, attr)
        stamp = self.stamp

        async def wrapped(*a: object, **k: object) -> object:
            if before:
                stamp(before)
            try:
                return await fn(*a, **k)
            finally:
                if after:
                    stamp(after)

        setattr(obj, attr, wrapped)

    def install(self, bus: object) -> None:
        """Wrap the bus's own steps on this instance (private names: a profiler looks
        inside; nothing here changes what they do)."""
        b: Any = bus
        offload = b._offload
        self._wrap(offload._fs, "publish_plain", "fs0", "fs1")
        self._wrap(offload._fs, "publish", "fs0", "fs1")
        self._wrap_async(b, "publish", None, "ret")
        self._wrap_async(b._waker, "wait", None, "wake")
        self._wrap(b, "_list", "thr0", "list1")
        self._wrap(b._waker, "_drain", "ino", None)
        self._wrap(b._fs, "read_multi", "read0", "read1")
        self._wrap(b, "_list_and_read", None, "read1")
        self._wrap_async(b, "_deliver_multi", "back", None)
        self._wrap(b._fs, "read_update", None, "upd")
        self._wrap(b._fs, "list_buckets", "ls0", "ls1")
        self._wrap(b, "_message", None, "msg1")
        engine = sys.modules[type(b).__module__]
        self._wrap(engine, "decide", "dec0", "dec1")  # this process's engine module
        self._wrap(engine, "changed_buckets", "cb0", "cb1")
        self._wrap(b._fs, "own_only", "own0", "own1")


_SEND_KEYS = frozenset({"call", "fs0", "fs1", "ret"})


def _steps(legs: list[dict[str, int]], rtts: list[int], head: str) -> str:
    import statistics

    out = [head, ""]
    out.append(f"{'step':<56} {'p50 us':>8} {'p90 us':>8}")
    for label, a, b_ in PATH_STEPS:
        xs = [(leg[b_] - leg[a]) / 1000 for leg in legs if a in leg and b_ in leg]
        if not xs:
            continue
        xs.sort()
        p50 = statistics.median(xs)
        p90 = xs[int(0.9 * (len(xs) - 1))]
        out.append(f"{label:<56} {p50:8.1f} {p90:8.1f}")
    r = sorted(x / 1000 for x in rtts)
    if r:
        p99 = r[int(0.99 * (len(r) - 1))]
        out.append(f"{'round trip (two legs)':<56} {statistics.median(r):8.1f} {p99:8.1f} (p99)")
    return "\n".join(out)


async def _pinger(
    bus: Any, tracer: _Tracer, n: int, size: int, warmup: int, gap: float
) -> list[int]:
    """Send ``bench.ping`` one at a time, each after the last pong; the round trips."""
    import anyio

    rtts: list[int] = []
    got = [anyio.Event()]

    async def pong(msg: Any) -> None:
        tracer.received()
        rtts.append(perf_counter_ns() - int(msg.payload[:20]))
        got[0].set()

    await bus.subscribe("bench.pong", pong)
    pad = b"x" * max(0, size - 20)
    for i in range(warmup + n):
        got[0] = anyio.Event()
        if i == warmup:
            rtts.clear()
        t = perf_counter_ns()
        tracer.start_send(t)
        await bus.publish("bench.ping", b"%020d" % t + pad)
        with anyio.fail_after(30):
            await got[0].wait()
        if gap:
            await anyio.sleep(gap)  # the scanner settles; the next ping starts cold
    return rtts


async def _echoer(bus: Any, tracer: _Tracer) -> None:
    async def echo(msg: Any) -> None:
        tracer.received()
        tracer.start_send(perf_counter_ns())
        await bus.publish("bench.pong", msg.payload)

    await bus.subscribe("bench.ping", echo)


def trace_path(fs: str, n: int, size: int, gap: float, warmup: int = 50) -> str:
    """Timestamps along publish -> stamp -> inotify -> scan -> read -> handler, in one
    process: one bus pings itself."""
    import anyio

    import fsbus

    tracer = _Tracer()
    rtts: list[int] = []

    async def main(bus_dir: str) -> None:
        async with fsbus.Bus(bus_dir) as bus:
            await _echoer(bus, tracer)
            tracer.install(bus)
            rtts.extend(await _pinger(bus, tracer, n, size, warmup, gap))

    from bench.filesystems import scratch

    with scratch(fs) as place:
        bus_dir = place.path / "bus"
        bus_dir.mkdir()
        anyio.run(main, str(bus_dir))
    # in one process a leg's halves are the same message's: sends and receipts alternate
    legs = [{**s, **r} for s, r in zip(tracer.sends, tracer.recvs, strict=False)][2 * warmup :]
    return _steps(legs, rtts, f"{len(rtts)} round trips in one process on {fs}")


def _echo_process(bus_dir: str, ready: Any, stop: Any, out: Any) -> None:
    import anyio

    import fsbus

    tracer = _Tracer()

    async def main() -> None:
        async with fsbus.Bus(bus_dir) as bus:
            await _echoer(bus, tracer)
            tracer.install(bus)
            ready.set()
            await anyio.to_thread.run_sync(stop.wait)

    anyio.run(main)
    out.put((tracer.sends, tracer.recvs))


def trace_cross(fs: str, n: int, size: int, gap: float, warmup: int = 50) -> str:
    """The same steps with the echo in a second process: each leg's sending half is
    one process's, its receiving half the other's (their clocks are one clock)."""
    import multiprocessing

    import anyio

    import fsbus

    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    tracer = _Tracer()
    rtts: list[int] = []

    async def main(bus_dir: str) -> None:
        async with fsbus.Bus(bus_dir) as bus:
            tracer.install(bus)
            rtts.extend(await _pinger(bus, tracer, n, size, warmup, gap))

    from bench.filesystems import scratch

    with scratch(fs) as place:
        bus_dir = place.path / "bus"
        bus_dir.mkdir()
        fsbus.BlockingBus(str(bus_dir)).close()  # made once, before either process starts
        echo = ctx.Process(target=_echo_process, args=(str(bus_dir), ready, stop, out))
        echo.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("the echo process did not start")
            anyio.run(main, str(bus_dir))
            stop.set()
            e_sends, e_recvs = out.get(timeout=60)
        finally:
            stop.set()
            echo.join(60)
    pings = [{**s, **r} for s, r in zip(tracer.sends, e_recvs, strict=False)][warmup:]
    pongs = [{**s, **r} for s, r in zip(e_sends, tracer.recvs, strict=False)][warmup:]
    return _steps(pings + pongs, rtts, f"{len(rtts)} round trips between two processes on {fs}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    ap.add_argument("scenario", choices=("publish", "fanout", "workqueue", "path", "crosspath"))
    ap.add_argument("--fs", default="tmpfs", help="disk, ext4loop or tmpfs (default tmpfs)")
    ap.add_argument("-n", type=int, default=20_000, help="messages (default 20000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument(
        "--gap",
        type=float,
        default=0.001,
        help="path, crosspath: seconds between a pong and the next ping (default 0.001)",
    )
    ap.add_argument("--rate", type=int, default=1000, help="samples per second")
    ap.add_argument("--top", type=int, default=40, help="rows to show")
    ap.add_argument(
        "--consumers", type=int, default=1, help="subscribers or workers (the first is sampled)"
    )
    args = ap.parse_args(argv)
    if args.scenario == "path":
        print(trace_path(args.fs, min(args.n, 2000), args.size, args.gap))
        return 0
    if args.scenario == "crosspath":
        print(trace_cross(args.fs, min(args.n, 2000), args.size, args.gap))
        return 0
    print(profile(args.scenario, args.fs, args.n, args.size, args.rate, args.top, args.consumers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
