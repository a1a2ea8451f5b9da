"""fsbus across two clients of a distributed filesystem, beside qlobber-fsq, in one run.

Each ``--pair NAME=A,B`` names two mounts of one volume (two ceph-fuse or two GlusterFS
FUSE clients: two client sessions with their own caches, the closest one machine gets
to two hosts). Everything runs with default settings and no ``FSBUS_*`` variables;
publishers use mount A, receivers mount B. Per filesystem:

* ``latency multi`` / ``latency single``: a publisher on A sends one message every 25 ms
  with its send time (CLOCK_MONOTONIC, shared by every process of the machine) in the
  payload; a subscriber (or the single consumer) on B notes the time its handler runs.
  p50 and p99 of the difference, ms. qlobber-fsq: its ``ping`` role on A and ``echo`` on
  B (bench/node/driver.js), one way (ping -> echo).
* ``open + subscribe``: a fresh process on B opens the (existing) bus and enters
  ``bus.messages(...)``; median of 3, seconds (Python start-up not counted).
* ``idle``: a subscriber process on B that receives nothing, over 10 s: its CPU share of
  one core, the FUSE client process of B beside it (and that client alone before, with
  no subscriber), and the filesystem calls per second it makes (open, stat, listing,
  read, rename, unlink, flock... counted by wrapping ``os`` in that process).
* ``multi throughput``: a publisher on A publishes N messages in a plain loop; a
  subscriber on B receives them; N / (last receipt - first publish), msg/s. ``raw``:
  one process on A doing create + write + close + rename of N files into 256 buckets on
  the same mount (the ceiling; target fsbus >= 0.8x raw).
* ``single throughput``: N work-queue messages published on A, consumed by one consumer
  on B; msg/s, and filesystem calls per message (publisher + consumer).

    .venv/bin/python bench/bench_dfs.py --pair cephfs=/mnt/ca,/mnt/cb \\
        --pair glusterfs=/mnt/ga,/mnt/gb [--json FILE] [--quick]

or, as root on one machine, on the one-machine clusters the tests start (Debian's
ceph and glusterfs packages: ``make .venv/.system-packages`` installs them):

    .venv/bin/python -m bench.bench_dfs --start cephfs --start glusterfs [--quick]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NODE_DRIVER = HERE / "node" / "driver.js"
NODE_MODULES = REPO / "tests" / "interop" / "node_modules"
TARGETS = {"p50_ms": 25.0, "p99_ms": 100.0, "open_s": 0.5, "idle_cpu_pct": 2.0, "ratio": 0.8}
_COUNTED = (
    "open",
    "pread",
    "preadv",
    "pwrite",
    "writev",
    "listdir",
    "scandir",
    "stat",
    "lstat",
    "fstat",
    "rename",
    "replace",
    "unlink",
    "mkdir",
    "utime",
    "link",
    "ftruncate",
    "posix_fadvise",
)
CALLS: collections.Counter[str] = collections.Counter()


# --- children ------------------------------------------------------------------------


def _count_calls() -> None:
    """Count the filesystem calls this process makes (installed before fsbus runs)."""

    def wrap(mod: Any, name: str) -> None:
        fn = getattr(mod, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            CALLS[name] += 1
            return fn(*args, **kwargs)

        setattr(mod, name, counted)

    for name in _COUNTED:
        if hasattr(os, name):
            wrap(os, name)
    wrap(fcntl, "flock")


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _child(role: str, p: dict[str, Any]) -> None:
    _count_calls()
    import anyio

    from fsbus import BlockingBus, Bus, Message

    root = p["root"]
    if role == "pub":
        with BlockingBus(root) as bus:
            _emit("READY")
            sys.stdin.readline()  # GO
            before, kinds = sum(CALLS.values()), CALLS.copy()
            t0 = time.monotonic_ns()
            for i in range(p["n"]):
                bus.publish("bench.topic", f"{i:08d}{time.monotonic_ns():020d}", single=p["single"])
                if p["interval"]:
                    time.sleep(p["interval"])
            t1 = time.monotonic_ns()
            calls, by_kind = sum(CALLS.values()) - before, dict(CALLS - kinds)
            _emit("RESULT " + json.dumps({"t0": t0, "t1": t1, "calls": calls, "kinds": by_kind}))
        return
    if role == "raw":
        base = Path(root) / f"raw-{uuid.uuid4().hex[:8]}"
        (base / "staging").mkdir(parents=True)
        for b in range(256):
            (base / "m" / f"{b:02x}").mkdir(parents=True)
        t0 = time.monotonic()
        for i in range(p["n"]):
            name = f"{i:08d}{uuid.uuid4().hex}"
            fd = os.open(f"{base}/staging/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.write(fd, b"\x00" + b"x" * 28)
            os.close(fd)
            os.rename(f"{base}/staging/{name}", f"{base}/m/{i % 256:02x}/{name}")
        rate = p["n"] / (time.monotonic() - t0)
        shutil.rmtree(base, ignore_errors=True)
        _emit("RESULT " + json.dumps({"rate": rate}))
        return
    if role == "calls":
        _emit("RESULT " + json.dumps(_call_latencies(root, p["root_b"], p["n"])))
        return
    if role == "open":
        t0 = time.monotonic()

        async def enter() -> float:
            async with Bus(root) as bus, bus.messages("bench.#"):
                return time.monotonic() - t0

        _emit("RESULT " + json.dumps({"seconds": anyio.run(enter)}))
        return
    # sub / worker / idle: receive on B
    lat: list[int] = []
    first = last = 0

    async def main() -> None:
        nonlocal first, last
        done = anyio.Event()

        async def handler(msg: Message) -> None:
            nonlocal first, last
            t = time.monotonic_ns()
            first = first or t
            last = t
            lat.append(t - int(msg.payload[8:28]))
            if len(lat) >= p["expect"]:
                done.set()

        async with Bus(root) as bus:
            await bus.subscribe("bench.#", handler, kind="single" if role == "worker" else "multi")
            _emit("READY")
            if role == "idle":
                c0, t0, n0 = time.process_time(), time.monotonic(), sum(CALLS.values())
                await anyio.sleep(p["seconds"])
                cpu, wall = time.process_time() - c0, time.monotonic() - t0
                calls = sum(CALLS.values()) - n0
                _emit("RESULT " + json.dumps({"cpu": cpu, "wall": wall, "calls": calls}))
                return
            before, kinds = sum(CALLS.values()), CALLS.copy()
            with anyio.move_on_after(p["timeout"]):
                await done.wait()
            calls, by_kind = sum(CALLS.values()) - before, dict(CALLS - kinds)
            res = {"lat": lat, "first": first, "last": last, "calls": calls, "kinds": by_kind}
            _emit("RESULT " + json.dumps(res))

    anyio.run(main)


def _call_latencies(a: str, b: str, n: int) -> dict[str, list[float]]:
    """Median and 90th percentile (µs) of each filesystem call a message costs.

    Writes on mount A as a publisher does (create, write, close, rename into a bucket,
    stamp UPDATE) and reads on mount B as a subscriber does (O_DIRECT read of UPDATE,
    listing of the bucket, open + fstat + read + close of the message), plus the
    lookups, mkdir and unlink around them. ``seen`` rows: how long after A's call
    returned B first saw its effect (polling as fast as it can).
    """
    import mmap

    tag = uuid.uuid4().hex[:8]
    da, db = f"{a}/calls-{tag}", f"{b}/calls-{tag}"
    os.makedirs(f"{da}/staging")
    os.makedirs(f"{da}/update")
    for k in range(16):
        os.makedirs(f"{da}/m/{k:02x}")
    with open(f"{da}/update/UPDATE", "wb") as f:
        f.write(os.urandom(16 * 8))
    times: dict[str, list[int]] = collections.defaultdict(list)

    def timed(what: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args)
        except FileNotFoundError:
            return None
        finally:
            times[what].append(time.perf_counter_ns() - t0)

    def seen(what: str, t0: int, check: Any, *args: Any) -> None:
        deadline = t0 + 2_000_000_000
        while not check(*args) and time.perf_counter_ns() < deadline:
            pass
        times[what].append(time.perf_counter_ns() - t0)

    def listed(folder: str, name: str) -> bool:
        return name in os.listdir(folder)

    def stamped(off: int, stamp: bytes) -> bool:
        os.preadv(upd_b, [buf], 0)
        return buf[off : off + 8] == stamp

    upd_a = os.open(f"{da}/update/UPDATE", os.O_RDWR)
    while True:
        try:
            upd_b = os.open(f"{db}/update/UPDATE", os.O_RDONLY | os.O_DIRECT)
            break
        except FileNotFoundError:
            time.sleep(0.01)
    buf = mmap.mmap(-1, mmap.PAGESIZE)
    for i in range(n):
        k = f"{i % 16:02x}"
        name = f"{i:08d}{uuid.uuid4().hex}"
        staged, final = f"{da}/staging/{name}", f"{da}/m/{k}/{name}"
        timed("lookup of a missing name (A)", os.lstat, f"{da}/m/{k}/missing-{name}")
        fd = timed("create O_EXCL (A)", os.open, staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        timed("write 30 B (A)", os.writev, fd, [b"\x00", b"x" * 29])
        timed("close (A)", os.close, fd)
        timed("rename into a bucket (A)", os.rename, staged, final)
        t_renamed = time.perf_counter_ns()
        seen("B lists the renamed file after", t_renamed, listed, f"{db}/m/{k}", name)
        stamp = os.urandom(8)
        off = (i % 16) * 8
        timed("stamp: pwrite, kept fd (A)", os.pwrite, upd_a, stamp, off)
        t_stamped = time.perf_counter_ns()
        seen("B reads the stamp (O_DIRECT) after", t_stamped, stamped, off, stamp)
        timed("read UPDATE, O_DIRECT, kept fd (B)", os.preadv, upd_b, [buf], 0)
        fd = timed("stamp: open (A)", os.open, f"{da}/update/UPDATE", os.O_WRONLY)
        os.pwrite(fd, stamp, (i % 16) * 8)
        timed("stamp: close after write (A)", os.close, fd)
        timed("list a bucket (B)", os.listdir, f"{db}/m/{k}")
        timed("lookup of an existing name (B)", os.lstat, f"{db}/m/{k}/{name}")
        fd = timed("open a message (B)", os.open, f"{db}/m/{k}/{name}", os.O_RDONLY)
        timed("fstat (B)", os.fstat, fd)
        timed("read a message (B)", os.pread, fd, 64, 1)
        timed("close (B)", os.close, fd)
        timed("unlink (B)", os.unlink, f"{db}/m/{k}/{name}")
        if i % 4 == 0:
            timed("mkdir (A)", os.mkdir, f"{da}/m/{k}/d{i}")
    os.close(upd_a)
    os.close(upd_b)
    shutil.rmtree(da, ignore_errors=True)
    return {what: [statistics.median(v) / 1000, pct(v, 0.9) / 1000] for what, v in times.items()}


# --- harness ---------------------------------------------------------------------------


class Proc:
    """A child speaking READY / RESULT on stdout."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.p = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def wait_for(self, word: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        assert self.p.stdout is not None
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"child exited before {word}: {self.p.wait()}")
            if line.startswith(word):
                return line[len(word) :].strip()
        raise TimeoutError(word)

    def result(self, timeout: float = 300) -> dict[str, Any]:
        out = json.loads(self.wait_for("RESULT", timeout))
        self.p.wait(30)
        return dict(out)

    def send(self, text: str) -> None:
        assert self.p.stdin is not None
        with contextlib.suppress(OSError):  # it may have ended already
            self.p.stdin.write(text + "\n")
            self.p.stdin.flush()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def py(role: str, **params: Any) -> Proc:
    return Proc([sys.executable, __file__, "--child", role, json.dumps(params)])


def node(role: str, **params: Any) -> Proc:
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES)}
    return Proc(["node", str(NODE_DRIVER), role, json.dumps(params)], env)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fuse_client(mount: str) -> int | None:
    """The pid of the FUSE client process serving ``mount`` (its command line names it)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if os.fsencode(mount) in argv and (b"fuse" in argv[0] or b"gluster" in argv[0]):
                return int(entry)
    return None


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def latency_fsbus(a: str, b: str, single: bool, n: int) -> dict[str, float]:
    sub = py("worker" if single else "sub", root=b, expect=n, timeout=60)
    sub.wait_for("READY")
    pub = py("pub", root=a, n=n, interval=0.025, single=single)
    pub.wait_for("READY")
    pub.send("GO")
    pub.result()
    res = sub.result()
    lat = [x / 1e6 for x in res["lat"]]
    return {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "got": len(lat), "sent": n}


def latency_qlobber(a: str, b: str, single: bool, n: int) -> dict[str, float]:
    echo = node("echo", dir=b, single=single)
    echo.wait_for("READY")
    ping = node("ping", dir=a, n=n, size=100, single=single)
    res = ping.result(600)
    echo.send("STOP")
    echo.p.wait(30)
    oneway = [int(x) / 1e6 for x in res["oneway_ns"]]
    return {"p50": pct(oneway, 0.5), "p99": pct(oneway, 0.99), "got": len(oneway), "sent": n}


def throughput_fsbus(a: str, b: str, single: bool, n: int) -> dict[str, float]:
    sub = py("worker" if single else "sub", root=b, expect=n, timeout=300)
    sub.wait_for("READY")
    pub = py("pub", root=a, n=n, interval=0, single=single)
    pub.wait_for("READY")
    pub.send("GO")
    pres = pub.result()
    res = sub.result(600)
    got = len(res["lat"])
    rate = got / ((res["last"] - pres["t0"]) / 1e9) if got else 0.0
    return {
        "rate": rate,
        "got": got,
        "sent": n,
        "publish_rate": n / ((pres["t1"] - pres["t0"]) / 1e9),
        "calls_per_msg": (pres["calls"] + res["calls"]) / max(1, got),
        "pub_calls": {k: v / n for k, v in pres["kinds"].items()},
        "sub_calls": {k: v / max(1, got) for k, v in res["kinds"].items()},
    }


def throughput_qlobber(a: str, b: str, single: bool, n: int) -> dict[str, float]:
    sub = node("worker" if single else "sub", dir=b, expect=n)
    sub.wait_for("READY")
    pub = node("pub", dir=a, n=n, size=100, single=single, window=64)
    pres = pub.result(600)
    # qlobber-fsq may never see some messages (they can expire before its next full
    # listing): stop waiting 60 s after the last publish and count what arrived.
    stop = threading.Timer(60, sub.send, ("STOP",))
    stop.start()
    res = sub.result(600)
    stop.cancel()
    got = len(res["ids"])
    rate = got / ((int(res["last_ns"]) - int(pres["t0_ns"])) / 1e9) if got else 0.0
    return {"rate": rate, "got": got, "sent": n}


def idle(b: str, fuse_pid: int | None, seconds: float, qlobber: bool) -> dict[str, float]:
    """CPU share (% of one core) of an idle subscriber and of B's FUSE client beside it."""
    out: dict[str, float] = {}
    if fuse_pid is not None and not qlobber:
        f0 = cpu_seconds(fuse_pid)
        time.sleep(seconds / 2)
        out["fuse_alone_pct"] = (cpu_seconds(fuse_pid) - f0) / (seconds / 2) * 100
    proc = node("sub", dir=b) if qlobber else py("idle", root=b, seconds=seconds, expect=1)
    proc.wait_for("READY")
    time.sleep(1.0)  # past start-up
    c0 = cpu_seconds(proc.p.pid)
    f0 = cpu_seconds(fuse_pid) if fuse_pid is not None else 0.0
    t0 = time.monotonic()
    if qlobber:
        time.sleep(seconds)
    else:
        res = proc.result(seconds + 60)
        out["calls_per_s"] = res["calls"] / res["wall"]
    wall = time.monotonic() - t0
    if qlobber:
        out["cpu_pct"] = (cpu_seconds(proc.p.pid) - c0) / wall * 100
        if fuse_pid is not None:
            out["fuse_pct"] = (cpu_seconds(fuse_pid) - f0) / wall * 100
        proc.send("STOP")
        proc.p.wait(30)
    else:
        out["cpu_pct"] = res["cpu"] / res["wall"] * 100
        if fuse_pid is not None:
            out["fuse_pct"] = (cpu_seconds(fuse_pid) - f0) / wall * 100
    return out


PARTS = ("calls", "open", "latency", "idle", "throughput")
QLOBBER = [True]  # --no-qlobber: fsbus alone (quicker, while tuning)


def run_pair(
    name: str, a: str, b: str, quick: bool, parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    out: dict[str, Any] = {"a": a, "b": b}
    fuse_b = fuse_client(b)
    n_lat = 60 if quick else 200
    n_multi = 300 if quick else 2000
    n_single = 100 if quick else 500
    idle_s = 4.0 if quick else 10.0
    fs_root = f"bench-{tag}/fsbus"
    q_root = f"bench-{tag}/qlobber"
    for mount in (a,):
        os.makedirs(f"{mount}/{q_root}", exist_ok=True)
    ra, rb = f"{a}/{fs_root}", f"{b}/{fs_root}"
    qa, qb = f"{a}/{q_root}", f"{b}/{q_root}"
    if "calls" in parts:
        print(f"[{name}] latency of each filesystem call", flush=True)
        out["calls"] = py("calls", root=a, root_b=b, n=100 if quick else 300).result()
    print(f"[{name}] raw create+rename on A", flush=True)
    out["raw_rate"] = py("raw", root=a, n=n_multi // 2).result()["rate"]
    # create the buses once (the first open makes every bucket folder)
    py("open", root=ra).result()
    if "open" in parts:
        print(f"[{name}] open + subscribe on B", flush=True)
        out["open_s"] = statistics.median(py("open", root=rb).result()["seconds"] for _ in range(3))
    for kind, single in (("multi", False), ("single", True)):
        if "latency" not in parts:
            break
        print(f"[{name}] latency {kind}", flush=True)
        out[f"lat_{kind}"] = latency_fsbus(ra, rb, single, n_lat)
        # each qlobber-fsq ping waits for the previous pong (about a second here)
        if QLOBBER[0]:
            out[f"q_lat_{kind}"] = latency_qlobber(qa, qb, single, min(n_lat, 60))
    if "idle" in parts:
        print(f"[{name}] idle", flush=True)
        out["idle"] = idle(rb, fuse_b, idle_s, qlobber=False)
        if QLOBBER[0]:
            out["q_idle"] = idle(qb, fuse_b, idle_s, qlobber=True)
    for kind, single, n in (("multi", False, n_multi), ("single", True, n_single)):
        if "throughput" not in parts:
            break
        print(f"[{name}] throughput {kind}", flush=True)
        out[f"tp_{kind}"] = throughput_fsbus(ra, rb, single, n)
        if QLOBBER[0]:
            out[f"q_tp_{kind}"] = throughput_qlobber(qa, qb, single, min(n, 500))
    shutil.rmtree(f"{a}/bench-{tag}", ignore_errors=True)
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    rows: list[tuple[str, ...]] = []

    def row(label: str, fn: Any) -> None:
        cells = []
        for n in names:
            try:
                cells.append(fn(results[n]))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("—")
        rows.append((label, *cells))

    def lat(key: str) -> Any:
        def f(r: dict[str, Any]) -> str:
            v = r[key]
            lost = "" if v["got"] == v["sent"] else f" ({v['sent'] - v['got']} lost)"
            return f"{v['p50']:.1f} / {v['p99']:.1f}{lost}"

        return f

    row("multi A→B latency p50 / p99 ms, fsbus", lat("lat_multi"))
    row("multi A→B latency p50 / p99 ms, qlobber-fsq", lat("q_lat_multi"))
    row("single A→B latency p50 / p99 ms, fsbus", lat("lat_single"))
    row("single A→B latency p50 / p99 ms, qlobber-fsq", lat("q_lat_single"))
    row("open bus + enter subscription on B, s", lambda r: f"{r['open_s']:.3f}")
    row(
        "idle subscriber: CPU % of a core, fsbus",
        lambda r: f"{r['idle']['cpu_pct']:.2f}",
    )
    row("idle: FUSE client of B beside it, %", lambda r: f"{r['idle']['fuse_pct']:.2f}")
    row("idle: FUSE client of B alone, %", lambda r: f"{r['idle']['fuse_alone_pct']:.2f}")
    row("idle: filesystem calls/s, fsbus", lambda r: f"{r['idle']['calls_per_s']:.0f}")
    row("idle subscriber: CPU %, qlobber-fsq", lambda r: f"{r['q_idle']['cpu_pct']:.2f}")
    row("idle: FUSE client beside qlobber-fsq, %", lambda r: f"{r['q_idle']['fuse_pct']:.2f}")
    row("raw create+write+rename on A, files/s", lambda r: f"{r['raw_rate']:.0f}")

    def tp(key: str) -> Any:
        def f(r: dict[str, Any]) -> str:
            v = r[key]
            lost = "" if v["got"] == v["sent"] else f", {v['sent'] - v['got']} of {v['sent']} lost"
            return f"{v['rate']:.0f} ({v['rate'] / r['raw_rate']:.2f}x raw{lost})"

        return f

    row("multi A→B throughput msg/s, fsbus", tp("tp_multi"))
    row("multi A→B throughput msg/s, qlobber-fsq", tp("q_tp_multi"))
    row(
        "multi: publish rate on A during it, msg/s, fsbus",
        lambda r: f"{r['tp_multi']['publish_rate']:.0f}",
    )
    row("single A→B msg/s, fsbus", tp("tp_single"))
    row(
        "single: filesystem calls per message, fsbus",
        lambda r: f"{r['tp_single']['calls_per_msg']:.1f}",
    )
    row("single A→B msg/s, qlobber-fsq", tp("q_tp_single"))

    def per_msg(key: str, side: str) -> Any:
        def f(r: dict[str, Any]) -> str:
            kinds = r[key][side]
            return f"{sum(kinds.values()):.1f}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 0.05
            )

        return f

    row("multi: calls per message on A (publisher)", per_msg("tp_multi", "pub_calls"))
    row("multi: calls per message on B (subscriber)", per_msg("tp_multi", "sub_calls"))
    row("single: calls per message on A (publisher)", per_msg("tp_single", "pub_calls"))
    row("single: calls per message on B (consumer)", per_msg("tp_single", "sub_calls"))
    head = ("", *names)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def calls_table(results: dict[str, dict[str, Any]]) -> str:
    """Median / 90th percentile of each call, µs, per filesystem."""
    names = [n for n in results if "calls" in results[n]]
    whats = list(dict.fromkeys(w for n in names for w in results[n]["calls"]))
    head = ("call (median / p90, µs)", *names)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in whats:
        cells = []
        for n in names:
            v = results[n]["calls"].get(w)
            cells.append(f"{v[0]:.0f} / {v[1]:.0f}" if v else "—")
        lines.append("| " + " | ".join((w, *cells)) + " |")
    return "\n".join(lines)


_KINDS = {"cephfs": "ceph", "glusterfs": "gluster"}


def _run_started(name: str, quick: bool, parts: tuple[str, ...]) -> dict[str, Any]:
    """Start the test suite's one-machine cluster of ``name``, bench its two mounts, stop it."""
    import tempfile

    sys.path.insert(0, str(REPO))
    from tests.dfs import clusters

    base = Path(tempfile.mkdtemp(prefix=f"fsbus-bench-{name}-"))
    print(f"[{name}] starting a one-machine cluster under {base}", flush=True)
    cluster = clusters.start(_KINDS[name], base)
    try:
        return run_pair(name, str(cluster.a), str(cluster.b), quick, parts)
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--child", nargs=2, metavar=("ROLE", "PARAMS"), help=argparse.SUPPRESS)
    ap.add_argument("--pair", action="append", default=[], help="NAME=MOUNT_A,MOUNT_B")
    ap.add_argument(
        "--start",
        action="append",
        default=[],
        choices=sorted(_KINDS),
        help="start a one-machine cluster of this kind with two client mounts, bench it, stop it",
    )
    ap.add_argument("--quick", action="store_true", help="fewer messages, shorter idle window")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    ap.add_argument("--no-qlobber", action="store_true", help="leave qlobber-fsq out")
    ap.add_argument(
        "--only",
        action="append",
        choices=PARTS,
        help="run only these parts (default: all; the raw rate is always measured)",
    )
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], json.loads(args.child[1]))
        return 0
    if not args.pair and not args.start:
        ap.error("give --pair NAME=MOUNT_A,MOUNT_B (two clients of one volume) or --start KIND")
    if any(k.startswith("FSBUS_") for k in os.environ):
        ap.error("unset the FSBUS_* variables: this benchmark measures the defaults")
    parts = tuple(args.only or PARTS)
    QLOBBER[0] = not args.no_qlobber
    results: dict[str, dict[str, Any]] = {}
    for spec in args.pair:
        name, _, mounts = spec.partition("=")
        a, _, b = mounts.partition(",")
        results[name] = run_pair(name, a, b, args.quick, parts)
    for name in args.start:
        results[name] = _run_started(name, args.quick, parts)
    print()
    print(table(results))
    if any("calls" in r for r in results.values()):
        print()
        print(calls_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
