"""Power cuts while durable queues are declared, bound and fed: every declare and bind
that returned survives, and every durable publish that returned has its queue copy."""

from __future__ import annotations

import pytest

from fsbus import BlockingBus, QueueNotFound

from .checks import BUS_CONFIG, Tally, count_ops, cut_points, quiet_close, run_until_cut
from .harness import PowerCut

# Each test replays the workload at every cut point on a FUSE filesystem: minutes on a
# slow machine. The limit guards against a hang, it is not a speed assertion.
pytestmark = pytest.mark.timeout(900)

QUEUES = [("billing", "orders.*"), ("audit", "#"), ("ship", "orders.eu.*")]


def work(bus: BlockingBus, done: list[str]) -> None:
    """Declare and bind the queues, then publish durably; ``done`` records each step
    that returned."""
    for name, pattern in QUEUES:
        bus.declare_queue(name, [pattern])
        done.append(f"declare {name}")
    bus.bind_queue("billing", "refunds.#")
    done.append("bind billing refunds.#")
    for i, topic in enumerate(["orders.eu.new", "refunds.x", "orders.paid"]):
        bus.publish(topic, f"m{i}".encode(), durable=True)
        done.append(f"publish m{i} {topic}")


def expected_copies(done: list[str]) -> dict[str, set[str]]:
    """The queue copies each returned publish promises."""
    out: dict[str, set[str]] = {}
    for step in done:
        if not step.startswith("publish"):
            continue
        _, ident, topic = step.split()
        names = ["audit"]
        if topic.startswith("orders.") and topic.count(".") == 1:
            names.append("billing")
        if topic.startswith("orders.eu."):
            names.append("ship")
        if topic.startswith("refunds."):
            names.append("billing")
        for q in names:
            out.setdefault(q, set()).add(ident)
    return out


@pytest.fixture(scope="module")
def bus_root(pfs: PowerCut) -> str:
    pfs.load("empty")
    root = f"{pfs.mountpoint}/qbus"
    with BlockingBus(root, config=BUS_CONFIG):
        pass
    pfs.sync()
    pfs.save("qbus")
    return root


def test_queue_definitions_and_copies_survive_every_cut(
    pfs: PowerCut, bus_root: str, sweep: bool
) -> None:
    pfs.load("qbus")
    with BlockingBus(bus_root, config=BUS_CONFIG) as bus:
        total = count_ops(pfs, lambda: work(bus, []))
    tally = Tally()
    for k in cut_points(total, every=1 if sweep else 3, randoms=10, seed=7):
        pfs.load("qbus")
        done: list[str] = []
        bus = BlockingBus(bus_root, config=BUS_CONFIG).__enter__()

        def run() -> None:
            try:
                work(bus, done)  # noqa: B023 (run at once, in this iteration)
            finally:
                quiet_close(bus.close)  # noqa: B023

        run_until_cut(pfs, k, run)
        tally.cuts += 1
        where = f"cut {k}/{total} after {done[-1:] or 'nothing'}"
        with BlockingBus(bus_root, config=BUS_CONFIG) as after:
            declared = {s.split()[1] for s in done if s.startswith("declare")}
            for name in declared:
                try:
                    info = after.queue_info(name)
                except QueueNotFound:
                    tally.lost.append(f"{where}: queue {name} gone")
                    continue
                if name == "billing" and "bind billing refunds.#" in done:
                    if "refunds.#" not in info.bindings:
                        tally.lost.append(f"{where}: the binding refunds.# of billing is gone")
            for name, ids in expected_copies(done).items():
                if name not in declared:
                    continue
                try:
                    present = {m.topic for m in after.browse(queue=name)}
                    payloads = {m.name for m in after.browse(queue=name)}
                except QueueNotFound:
                    continue  # counted above
                if len(payloads) < len(ids):
                    tally.lost.append(
                        f"{where}: queue {name} has {len(payloads)} of {sorted(ids)} ({present})"
                    )
    assert tally.ok(), tally.lost[:10] + tally.corrupt[:10]
