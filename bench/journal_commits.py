"""Journal commits per durable publish: ``python -m bench.journal_commits [-n 200]``.

On a loop-mounted journaled ext4 (``bench.filesystems``, root only), one
``BlockingBus.publish(..., durable=True)`` of 100 B at a time into a bus with 0, 1 and 3
durable queues bound to its topic, counting the journal's transactions
(``/proc/fs/jbd2/<device>/info``) over ``-n`` publishes. A durable publish is bound by
these commits, not by CPU: the figure says how many a publish costs whatever the load,
where the publish rate printed beside it moves with the machine.

Then the same with ``--consumers`` processes (default 4) taking each message as it comes:
the main benchmark's subscribers (``bench.systems.fsbus_bus``) on a bus with no queue,
and the durable-queue benchmark's consumers (``bench.bench_queues``) of one queue. What
they do in the buckets (list them, claim, remove) lands in the journal too; each row
checks that every message reached them (every subscriber all, the queue's consumers each
once between them).
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

from bench.bench_queues import BINDING, QUEUE, child_cmd
from bench.child import make_payload
from bench.filesystems import scratch, unavailable
from bench.procs import Child, python_cmd
from bench.systems.fsbus_bus import TOPIC

SIZE = 100
"""Bytes of each payload (its index first: bench.child.make_payload)."""
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


def measure(
    root: Path, mount: Path, queues: int, n: int, consumers: int = 0
) -> tuple[float, float]:
    """(commits per publish, publishes per second) for a bus with ``queues`` queues, and
    ``consumers`` processes taking the messages meanwhile: the durable-queue benchmark's
    consumers of the first queue if there is one, else the main benchmark's subscribers
    (bench.child's protocol: READY, COUNT, RESULT; STOP)."""
    import fsbus

    total = n + WARM_UP
    with fsbus.BlockingBus(str(root)) as bus:
        for q in range(queues):
            bus.declare_queue(QUEUE if q == 0 else f"q{q}", [BINDING])
        children = [_consumer(root, bool(queues), k, total) for k in range(consumers)]
        try:
            deadline = time.monotonic() + 60
            for c in children:
                c.wait_line("READY", deadline)
            payloads = (make_payload(i, SIZE) for i in range(total))
            for _ in range(WARM_UP):
                bus.publish(TOPIC, next(payloads), durable=True)
            os.sync()
            before = transactions(mount)
            t0 = time.perf_counter()
            for payload in payloads:
                bus.publish(TOPIC, payload, durable=True)
            took = time.perf_counter() - t0
            after = transactions(mount)
            if children:
                _check_all_taken(children, total, shared=bool(queues))
        finally:
            for c in children:
                c.close()
    return (after - before) / n, n / took


def _consumer(root: Path, queue: bool, k: int, total: int) -> Child:
    if queue:
        cpu = root / ".cpu"
        cpu.mkdir(exist_ok=True)
        return Child(child_cmd("fsbus-consumer", {"dir": str(root), "k": k, "cpu_dir": str(cpu)}))
    return Child(python_cmd("fsbus_bus", "sub", {"dir": str(root), "expect": total}))


def _check_all_taken(children: list[Child], total: int, *, shared: bool) -> None:
    """Every message received: by every subscriber, or once by the queue's consumers."""
    deadline = time.monotonic() + 60
    if shared:  # a queue's consumers are told to stop once they have all between them
        while sum(c.count for c in children) < total:
            if time.monotonic() > deadline:
                break
            for c in children:
                c.poll(0.01)
        for c in children:
            c.stop()
    ids = [c.wait_result(deadline)["ids"] for c in children]
    want = list(range(total))
    if shared and sorted(i for got in ids for i in got) != want:
        raise SystemExit(f"the queue's consumers received {sum(map(len, ids))} of {total}")
    if not shared and any(sorted(got) != want for got in ids):
        raise SystemExit(f"the subscribers received {[len(g) for g in ids]} of {total} each")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.journal_commits", description=__doc__)
    ap.add_argument("-n", type=int, default=200, help="durable publishes per bus (200)")
    ap.add_argument(
        "--consumers", type=int, default=4, help="processes taking the messages meanwhile (4)"
    )
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
        for queues in (0, 1) if args.consumers else ():
            root = place.path / f"bus-{queues}-consumed"
            root.mkdir()
            commits, rate = measure(root, place.path, queues, args.n, args.consumers)
            who = "consumers of the queue" if queues else "subscribers"
            print(
                f"{queues} queue(s), {args.consumers} {who}: {commits:.2f} journal commits "
                f"per durable publish ({rate:,.0f} publishes/s)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
