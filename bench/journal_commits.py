"""Journal commits per durable publish: ``python -m bench.journal_commits [-n 200]``.

On a loop-mounted journaled ext4 (``bench.filesystems``, root only), one
``BlockingBus.publish(..., durable=True)`` of 100 B at a time into a bus with 0, 1 and 3
durable queues bound to its topic, counting the journal's transactions
(``/proc/fs/jbd2/<device>/info``) over ``-n`` publishes. A durable publish is bound by
these commits, not by CPU: the figure says how many a publish costs whatever the load,
where the publish rate printed beside it moves with the machine.

Then the same with ``--consumers`` processes (default 4) taking each message as it comes:
plain subscribers of ``bench.#`` on a bus with no queue, and consumers of one queue. What
they do in the buckets (list them, claim, remove) lands in the journal too; each row
checks that every message reached them (every subscriber all, the queue's consumers each
once between them).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
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


def measure(
    root: Path, mount: Path, queues: int, n: int, consumers: int = 0
) -> tuple[float, float]:
    """(commits per publish, publishes per second) for a bus with ``queues`` queues, and
    ``consumers`` processes taking the messages meanwhile (of queue ``q0`` if there is
    one, else subscribers of ``bench.#``)."""
    import fsbus

    with fsbus.BlockingBus(str(root)) as bus:
        for q in range(queues):
            bus.declare_queue(f"q{q}", ["bench.#"])
        total = n + WARM_UP
        queue = "q0" if queues else ""
        children = [_consumer(root, queue, i, total) for i in range(consumers)]
        try:
            for i in range(consumers):
                _wait_for(root / f".ready-{i}", children[i])
            for _ in range(WARM_UP):
                bus.publish("bench.x", PAYLOAD, durable=True)
            os.sync()
            before = transactions(mount)
            t0 = time.perf_counter()
            for _ in range(n):
                bus.publish("bench.x", PAYLOAD, durable=True)
            took = time.perf_counter() - t0
            after = transactions(mount)
            deadline = time.monotonic() + 60
            while queue and children and bus.queue_info(queue).depth:
                if time.monotonic() > deadline:
                    raise SystemExit(f"queue {queue} still holds messages after 60 s")
                time.sleep(0.01)
        finally:
            (root / ".stop").touch()
            got = [int(c.communicate(timeout=150)[0] or -1) for c in children]
    if children and (sum(got) != total if queue else got != [total] * consumers):
        raise SystemExit(f"the consumers received {got} of {total} messages")
    return (after - before) / n, n / took


_CONSUME = """
import sys, anyio, fsbus
from pathlib import Path
root, queue, ready, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
got = 0
async def main():
    async with fsbus.Bus(root) as bus:
        all_in = anyio.Event()
        async def handle(msg):
            global got
            got += 1
            if got == total:
                all_in.set()
        if queue:
            await bus.subscribe(None, handle, queue=queue)
        else:
            await bus.subscribe("bench.#", handle)
        Path(ready).touch()
        stop = Path(root) / ".stop"  # a queue's consumers share: told when it is empty
        with anyio.move_on_after(120):
            while not all_in.is_set() and not stop.exists():
                with anyio.move_on_after(0.05):
                    await all_in.wait()
anyio.run(main)
print(got)
"""


def _consumer(root: Path, queue: str, i: int, total: int) -> subprocess.Popen[str]:
    ready = str(root / f".ready-{i}")
    argv = [sys.executable, "-c", _CONSUME, str(root), queue, ready, str(total)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def _wait_for(path: Path, child: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"a consumer did not start (exit status {child.poll()})")
        time.sleep(0.01)


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
            who = "consumers of the queue" if queues else "subscribers of bench.#"
            print(
                f"{queues} queue(s), {args.consumers} {who}: {commits:.2f} journal commits "
                f"per durable publish ({rate:,.0f} publishes/s)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
