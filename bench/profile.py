"""Where fsbus spends its time: ``python -m bench.profile [publish|fanout|workqueue] ...``.

Runs one fsbus scenario with py-spy sampling the interesting process (the publisher for
``publish``, the subscriber or worker for the delivery paths; every thread, native frames
off) and prints a function-level table: inclusive and self share of the samples, with the
idle waits (selectors, condition variables) and start-up imports left out, so the shares
add up to the work done (for ``publish``: to the time inside ``BlockingBus.publish``).
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    ap.add_argument("scenario", choices=("publish", "fanout", "workqueue"))
    ap.add_argument("--fs", default="tmpfs", help="disk, ext4loop or tmpfs (default tmpfs)")
    ap.add_argument("-n", type=int, default=20_000, help="messages (default 20000)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (default 100)")
    ap.add_argument("--rate", type=int, default=1000, help="samples per second")
    ap.add_argument("--top", type=int, default=40, help="rows to show")
    ap.add_argument(
        "--consumers", type=int, default=1, help="subscribers or workers (the first is sampled)"
    )
    args = ap.parse_args(argv)
    print(profile(args.scenario, args.fs, args.n, args.size, args.rate, args.top, args.consumers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
