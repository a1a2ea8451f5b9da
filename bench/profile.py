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
    ("publish returns -> scanner awake (inotify on the loop)", "ret", "wake"),
    ("scanner awake -> in the worker thread", "wake", "thr0"),
    ("listing the changed buckets", "thr0", "list1"),
    ("decide (parse the new names)", "list1", "read0"),
    ("read the message", "read0", "read1"),
    ("read done -> back on the loop", "read1", "back"),
    ("back on the loop -> handler starts", "back", "handler"),
    ("one way: publish call -> handler", "call", "handler"),
)


def trace_path(fs: str, n: int, size: int, warmup: int = 50) -> str:
    """Timestamps along publish -> stamp -> inotify -> scan -> read -> handler."""
    import statistics
    from time import perf_counter_ns as now

    import anyio

    import fsbus

    legs: list[dict[str, int]] = []  # one dict of stamps per message (ping, then pong)
    cur: dict[str, int] = {}
    rtts: list[int] = []

    def stamp(key: str) -> None:
        if key not in cur:  # the first time in this leg (a leg is one message)
            cur[key] = now()

    def wrap(obj: object, attr: str, before: str | None, after: str | None) -> None:
        fn = getattr(obj, attr)

        def wrapped(*a: object, **k: object) -> object:
            if before:
                stamp(before)
            try:
                return fn(*a, **k)
            finally:
                if after:
                    stamp(after)

        setattr(obj, attr, wrapped)

    def wrap_async(obj: object, attr: str, before: str | None, after: str | None) -> None:
        fn = getattr(obj, attr)

        async def wrapped(*a: object, **k: object) -> object:
            if before:
                stamp(before)
            try:
                return await fn(*a, **k)
            finally:
                if after:
                    stamp(after)

        setattr(obj, attr, wrapped)

    async def main(bus_dir: str) -> None:
        nonlocal cur
        got = [anyio.Event()]
        async with fsbus.Bus(bus_dir) as bus:

            async def echo(msg: fsbus.Message) -> None:
                stamp("handler")
                legs.append(cur)
                start_leg()
                await bus.publish("bench.pong", msg.payload)

            async def pong(msg: fsbus.Message) -> None:
                stamp("handler")
                legs.append(cur)
                rtts.append(now() - int(msg.payload[:20]))
                got[0].set()

            def start_leg() -> None:
                nonlocal cur
                cur = {"call": now()}

            await bus.subscribe("bench.ping", echo)
            await bus.subscribe("bench.pong", pong)
            # the bus's own steps, wrapped on this instance (private names: a profiler
            # looks inside; nothing here changes what they do)
            b: object = bus
            offload = b._offload  # type: ignore[attr-defined]
            wrap(offload._fs, "publish_plain", "fs0", "fs1")
            wrap(offload._fs, "publish", "fs0", "fs1")
            wrap_async(b, "publish", None, "ret")
            wrap_async(b._waker, "wait", None, "wake")  # type: ignore[attr-defined]
            wrap(b, "_list", "thr0", "list1")
            wrap(b._fs, "read_multi", "read0", "read1")  # type: ignore[attr-defined]
            wrap(b, "_list_and_read", None, "read1")
            wrap_async(b, "_deliver_multi", "back", None)
            pad = b"x" * max(0, size - 20)
            for i in range(warmup + n):
                got[0] = anyio.Event()
                if i == warmup:
                    legs.clear()
                    rtts.clear()
                start_leg()
                await bus.publish("bench.ping", b"%020d" % cur["call"] + pad)
                with anyio.fail_after(30):
                    await got[0].wait()
                await anyio.sleep(0.001)  # the scanner settles; the next ping starts cold

    from bench.filesystems import scratch

    with scratch(fs) as place:
        bus_dir = place.path / "bus"
        bus_dir.mkdir()
        anyio.run(main, str(bus_dir))
    out = [f"{len(rtts)} round trips in one process on {fs}; {len(legs)} legs (one way)", ""]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    ap.add_argument("scenario", choices=("publish", "fanout", "workqueue", "path"))
    ap.add_argument("--fs", default="tmpfs", help="disk, ext4loop or tmpfs (default tmpfs)")
    ap.add_argument("-n", type=int, default=20_000, help="messages (default 20000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--rate", type=int, default=1000, help="samples per second")
    ap.add_argument("--top", type=int, default=40, help="rows to show")
    ap.add_argument(
        "--consumers", type=int, default=1, help="subscribers or workers (the first is sampled)"
    )
    args = ap.parse_args(argv)
    if args.scenario == "path":
        print(trace_path(args.fs, min(args.n, 2000), args.size))
        return 0
    print(profile(args.scenario, args.fs, args.n, args.size, args.rate, args.top, args.consumers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
