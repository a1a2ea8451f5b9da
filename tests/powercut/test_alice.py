"""ALICE-style crash states of one publish and one append (OSDI 2014).

The power-cut filesystem records the operations of one call as the units a real
filesystem may write back on its own — each directory entry change, each data write —
and lays out every state a crash may leave: for every point of the trace, any
per-directory prefix of entry changes and any per-file prefix of writes (the last one
possibly torn, half written or grown over zeros) that includes what a sync covered.
Each state is then opened as a restarted program would and checked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from fsbus import BlockingBus, Stream
from tests.journaled import JournaledExt4

from .checks import BUS_CONFIG, Item, Tally, check_bus, publish_all
from .harness import PowerCut
from .test_stream_cuts import config, value


@pytest.fixture
def scratch() -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = tempfile.mkdtemp(prefix="alice-", dir=base)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def states(
    pfs: PowerCut, into: str, *, final: bool, per_point: int, durable: bool = True
) -> list[dict[str, Any]]:
    """Lay out the crash states (``final``: only those after the whole call).

    Durable calls are held to the weakest model (each directory on its own, torn
    writes). Plain publishes sync nothing, so they are held to a journaled
    filesystem's (ext4, XFS): metadata in issue order, data of new files possibly
    missing (an empty file) but never torn or zero-filled.
    """
    n = pfs.command("trace_stop")["units"]
    out: list[dict[str, Any]] = pfs.command(
        "crash_states",
        into=os.path.join(into, "final" if final else "all"),
        per_point=per_point,
        from_point=n if final else 0,
        torn=durable,
        ordered_meta=not durable,
    )
    return out


ITEMS = {
    "short": Item("jobs.alice", b"payload under test", single=True, headers=None),
    "spilled": Item("jobs." + "long-" * 30 + "alice", b"p" * 300, single=False, headers=None),
    "headers": Item("jobs.h", b"with headers", single=True, headers={"k": "v"}),
}


@pytest.mark.parametrize("durable", [True, False])
@pytest.mark.parametrize("kind", sorted(ITEMS))
def test_publish_crash_states(
    pfs: PowerCut, scratch: str, sweep: bool, kind: str, durable: bool
) -> None:
    pfs.load("empty")
    root = f"{pfs.mountpoint}/bus"
    item = ITEMS[kind]
    with BlockingBus(root, config=BUS_CONFIG) as bus:
        pfs.sync()
        pfs.command("trace_start")
        publish_all(bus, [item], durable, set())
    per_point = 400 if sweep else 48
    tally = Tally()
    for st in states(pfs, scratch, final=False, per_point=per_point, durable=durable):
        check_bus(st["root"] + "/bus", [item], set(), f"{kind} {st}", tally, durable=durable)
        tally.cuts += 1
    pfs.load("empty")  # the same call again, for the states after it returned
    with BlockingBus(root, config=BUS_CONFIG) as bus:
        pfs.sync()
        pfs.command("trace_start")
        publish_all(bus, [item], durable, set())
    acked = {item.topic} if durable else set()
    for st in states(pfs, scratch, final=True, per_point=per_point, durable=durable):
        check_bus(st["root"] + "/bus", [item], acked, f"{kind} final {st}", tally, durable=durable)
        tally.cuts += 1
    assert tally.cuts >= 5
    assert tally.ok(), (tally.lost, tally.corrupt)


class _Journaled(JournaledExt4):
    pass


def test_durable_publish_placed_first_on_a_journaled_filesystem(
    pfs: PowerCut, scratch: str, sweep: bool
) -> None:
    """Where the bus sees ext4 with a journal, a durable message of one page is renamed
    before it is synced (Platform.durable_order). Held to that filesystem's model
    (metadata in issue order, a new file's data possibly missing, never torn): every
    state is whole, absent or empty, and the message is there once the call returned.
    (Held to the weakest model, with torn writes, this order fails: it is not taken
    where a filesystem may tear, see test_platform.) Messages with sidecars are synced
    first everywhere: test_publish_crash_states."""
    kind = "short"
    root = f"{pfs.mountpoint}/bus"
    item = ITEMS[kind]
    per_point = 400 if sweep else 48
    tally = Tally()
    for final in (False, True):
        pfs.load("empty")
        # (the file-by-file path: on such a mount the bus would use its durable log,
        # tested in test_log_cuts.py)
        config = BUS_CONFIG.model_copy(update={"durable_log": "off"})
        with BlockingBus(root, config=config, ops=_Journaled()) as bus:
            assert bus._fs.platform.durable_order == "place_first"
            assert bus._fs.log_source is None
            pfs.sync()
            pfs.command("trace_start")
            publish_all(bus, [item], True, set())
        n = pfs.command("trace_stop")["units"]
        for st in pfs.command(
            "crash_states",
            into=os.path.join(scratch, "final" if final else "all"),
            per_point=per_point,
            from_point=n if final else 0,
            torn=False,
            ordered_meta=True,
        ):
            acked = {item.topic} if final else set()
            check_bus(st["root"] + "/bus", [item], acked, f"{kind} {st}", tally, durable=True)
            tally.cuts += 1
    assert tally.cuts >= 5
    assert tally.ok(), (tally.lost, tally.corrupt)


@pytest.mark.parametrize("level", ["batch", "record"])
def test_append_crash_states(pfs: PowerCut, scratch: str, sweep: bool, level: str) -> None:
    pfs.load("empty")
    root = f"{pfs.mountpoint}/sbus"
    with Stream.open(root, "log", config=config(level)) as s:
        s.append(value(0))
    tally = Tally()
    for final in (False, True):
        pfs.sync()
        pfs.save("alice-stream")
        with Stream.open(root, "log", config=config(level), create=False) as s:
            pfs.command("trace_start")
            acked = list(s.append_batch([value(1), value(2), value(3)]))
            acked.append(s.append(value(4)))
        for st in states(pfs, scratch, final=final, per_point=300 if sweep else 40):
            where = f"{level} {'final' if final else ''} {st}"
            with Stream.open(st["root"] + "/sbus", "log", config=config(level)) as s:
                records = list(s.read(0))
                if [r.offset for r in records] != list(range(len(records))):
                    tally.corrupt.append(f"{where}: offsets {[r.offset for r in records]}")
                if any(r.value != value(r.offset) for r in records):
                    tally.corrupt.append(f"{where}: a record reads wrong")
                if len(records) < 1 or (final and len(records) < 5):
                    tally.lost.append(f"{where}: {len(records)} records")
                end = s.end_offset
                if s.append(value(end)) != end:
                    tally.corrupt.append(f"{where}: append after recovery misplaced")
            tally.cuts += 1
        pfs.load("alice-stream")
    assert tally.ok(), (tally.lost, tally.corrupt)
