"""Journal commits per durable publish: ``python -m bench.journal_commits [-n 200]``.

On a loop-mounted journaled ext4 (``bench.filesystems``, root only), one
``BlockingBus.publish(..., durable=True)`` of 100 B at a time into a bus with 0, 1 and 3
durable queues bound to its topic, counting the journal's transactions
(``/proc/fs/jbd2/<device>/info``) over ``-n`` publishes. A durable publish is bound by
these commits, not by CPU: the figure says how many a publish costs whatever the load,
where the publish rate printed beside it moves with the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

from bench.filesystems import scratch, unavailable

PAYLOAD = b"x" * 100
WARM_UP = 20


def transactions(mount: Path) -> int:
    """The journal transactions committed so far on the filesystem holding ``mount``."""
    dev = os.stat(mount).st_dev
    for entry in Path("/proc/fs/jbd2").iterdir():
        name = entry.name.rsplit("-", 1)[0]
        try:
            rdev = os.stat(f"/dev/{name}").st_rdev
        except OSError:
            continue
        if rdev == dev:
            m = re.match(r"(\d+) transactions", (entry / "info").read_text())
            if m:
                return int(m.group(1))
    raise SystemExit(f"no journal statistics for {mount} in /proc/fs/jbd2")


def measure(root: Path, mount: Path, queues: int, n: int) -> tuple[float, float]:
    """(commits per publish, publishes per second) for a bus with ``queues`` queues."""
    import fsbus

    with fsbus.BlockingBus(str(root)) as bus:
        for q in range(queues):
            bus.declare_queue(f"q{q}", ["bench.#"])
        for _ in range(WARM_UP):
            bus.publish("bench.x", PAYLOAD, durable=True)
        os.sync()
        before = transactions(mount)
        t0 = time.perf_counter()
        for _ in range(n):
            bus.publish("bench.x", PAYLOAD, durable=True)
        took = time.perf_counter() - t0
        after = transactions(mount)
    return (after - before) / n, n / took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.journal_commits", description=__doc__)
    ap.add_argument("-n", type=int, default=200, help="durable publishes per bus (200)")
    args = ap.parse_args(argv)
    why = unavailable("ext4loop")
    if why:
        print(f"ext4loop unavailable: {why}")
        return 1
    with scratch("ext4loop") as place:
        for queues in (0, 1, 3):
            root = place.path / f"bus-{queues}"
            root.mkdir()
            commits, rate = measure(root, place.path, queues, args.n)
            print(
                f"{queues} queue(s): {commits:.2f} journal commits per durable publish "
                f"({rate:,.0f} publishes/s)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
