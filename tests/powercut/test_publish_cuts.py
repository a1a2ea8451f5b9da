"""Power cuts during publishes: what ``durable=True`` promises, and what plain ones do."""

from __future__ import annotations

import os

import pytest

from fsbus import BlockingBus

from .checks import (
    BUS_CONFIG,
    Item,
    Tally,
    bus_items,
    check_bus,
    count_ops,
    cut_points,
    publish_all,
    quiet_close,
    run_until_cut,
)
from .harness import PowerCut

# Each test replays the workload at every cut point on a FUSE filesystem: minutes on a
# slow machine. The limit guards against a hang, it is not a speed assertion.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def bus_root(pfs: PowerCut) -> str:
    """A bus made and synced once; every run starts from it (``load("bus")``)."""
    pfs.load("empty")
    root = f"{pfs.mountpoint}/bus"
    with BlockingBus(root, config=BUS_CONFIG):
        pass
    pfs.sync()
    pfs.save("bus")
    return root


def open_bus(root: str, spares: bool) -> BlockingBus:
    """The bus at ``root``, open; ``spares``: staging its plain publishes in spare files
    made ahead (a bus does that on a local filesystem only; this one is FUSE)."""
    bus = BlockingBus(root, config=BUS_CONFIG).__enter__()
    if spares:
        os.makedirs(bus.layout.spares, exist_ok=True)
        bus._fs.spares = True
    return bus


def one_run(
    pfs: PowerCut, root: str, items: list[Item], durable: bool, k: int, spares: bool = False
) -> set[str]:
    """Open the bus, publish until the cut after operation k; the acknowledged topics."""
    pfs.load("bus")
    acked: set[str] = set()
    bus = open_bus(root, spares)

    def work() -> None:
        try:
            publish_all(bus, items, durable, acked)
        finally:
            quiet_close(bus.close)

    run_until_cut(pfs, k, work)
    return acked


def sweep_publishes(
    pfs: PowerCut,
    root: str,
    *,
    durable: bool,
    seed: int,
    n: int,
    every: int,
    randoms: int,
    spares: bool = False,
) -> Tally:
    items = bus_items(seed, n)
    pfs.load("bus")
    bus = open_bus(root, spares)
    try:
        total = count_ops(pfs, lambda: publish_all(bus, items, durable, set()))
    finally:
        bus.close()
    tally = Tally()
    points = cut_points(total, every=every, randoms=randoms, seed=seed)
    for k in points:
        acked = one_run(pfs, root, items, durable, k, spares)
        tally.cuts += 1
        # Plain publishes promise nothing about survival: only that nothing is corrupt.
        where = f"seed {seed} cut {k}/{total}"
        deliver = k == points[-1]  # one run per sweep through a real subscriber
        check_bus(
            root, items, acked if durable else set(), where, tally, deliver=deliver, durable=durable
        )
    return tally


@pytest.mark.parametrize("seed", [1, 2])
def test_durable_publishes_survive_every_cut(
    pfs: PowerCut, bus_root: str, sweep: bool, seed: int
) -> None:
    """Every cut point of 6 durable publishes (multi and single, spilled topics,
    headers): each publish that returned is there and delivered; nothing torn."""
    tally = sweep_publishes(
        pfs,
        bus_root,
        durable=True,
        seed=seed,
        n=12 if sweep else 6,
        every=1,
        randoms=0,
    )
    assert tally.cuts >= 30
    assert tally.ok(), (tally.lost, tally.corrupt)


def test_durable_publishes_random_cuts(pfs: PowerCut, bus_root: str, sweep: bool) -> None:
    tally = Tally()
    for seed in range(100, 160 if sweep else 103):
        t = sweep_publishes(pfs, bus_root, durable=True, seed=seed, n=8, every=10**6, randoms=3)
        tally.cuts += t.cuts
        tally.lost += t.lost
        tally.corrupt += t.corrupt
    assert tally.ok(), (tally.lost, tally.corrupt)


@pytest.mark.parametrize("spares", [False, True])
def test_plain_publishes_leave_nothing_corrupt(
    pfs: PowerCut, bus_root: str, sweep: bool, spares: bool
) -> None:
    """durable=False: anything may be lost, but the bus opens and nothing is torn; with
    spares too (a message renamed from its spare may be left under both names)."""
    tally = sweep_publishes(
        pfs,
        bus_root,
        durable=False,
        seed=7,
        n=12 if sweep else 6,
        every=1 if sweep else 2,
        randoms=2,
        spares=spares,
    )
    assert tally.ok(), (tally.lost, tally.corrupt)
