"""Power cuts during Stream appends, consumer-group commits and StreamQueue use."""

from __future__ import annotations

import random

import pytest

from fsbus import Stream, StreamConfig, StreamQueue

from .checks import Tally, count_ops, cut_points, quiet_close, run_until_cut
from .harness import PowerCut

# Each test replays the workload at every cut point on a FUSE filesystem: minutes on a
# slow machine. The limit guards against a hang, it is not a speed assertion.
pytestmark = pytest.mark.timeout(900)

BASE = 3  # records appended (and synced) before every run


def value(offset: int) -> bytes:
    """Record ``offset``'s value: a reader can tell a wrong or torn one."""
    return f"record-{offset}-".encode() * (1 + offset % 7)


def config(level: str) -> StreamConfig:
    # Small segments and frames: runs cross segment rolls and frame boundaries.
    # The default cache_wait (1 s): the group's generation file, not synced, may be
    # older than the offsets file after a cut; a reader must not wait for it then.
    return StreamConfig(  # type: ignore[arg-type]
        durability=level, segment_bytes=4096, max_frame_bytes=256
    )


@pytest.fixture(scope="module")
def stream_root(pfs: PowerCut) -> str:
    pfs.load("empty")
    root = f"{pfs.mountpoint}/sbus"
    with Stream.open(root, "log", config=config("batch")) as s:
        for o in range(BASE):
            s.append(value(o))
    with Stream.open(root, "work", config=config("batch")) as s:
        s.append_batch([value(o) for o in range(20)])
        s.group("g", consumer="c0").close()
    StreamQueue(root, "q", config=config("batch")).close()
    pfs.sync()
    pfs.save("streams")
    return root


def appends(s: Stream, acked: list[int], seed: int) -> None:
    """Single appends and batches of random sizes; ``acked`` gets each returned offset."""
    rng = random.Random(seed)
    for _ in range(6):
        n = rng.choice([1, 1, 2, 5])
        if n == 1:
            o = s.end_offset
            acked.append(s.append(value(o)))
        else:
            start = s.end_offset
            acked.extend(s.append_batch([value(start + i) for i in range(n)]))


def check_stream(root: str, level: str, acked: list[int], where: str, tally: Tally) -> None:
    s = Stream.open(root, "log", config=config(level), create=False)
    try:
        records = list(s.read(s.start_offset))
        offsets = [r.offset for r in records]
        if offsets != list(range(s.start_offset, s.end_offset)) or s.start_offset != 0:
            tally.corrupt.append(f"{where}: offsets not dense: {offsets}")
        for r in records:
            if r.value != value(r.offset):
                tally.corrupt.append(f"{where}: record {r.offset} reads {r.value!r:.40}")
        if level != "none":
            missing = [o for o in acked if o >= s.end_offset]
            if missing:
                tally.lost.append(f"{where}: acknowledged offsets {missing} missing")
        if s.end_offset < BASE:
            tally.lost.append(f"{where}: synced base records lost (end {s.end_offset})")
        # the tail recovered: the next append follows on
        end = s.end_offset
        if s.append(value(end)) != end or next(iter(s.read(end))).value != value(end):
            tally.corrupt.append(f"{where}: append after recovery misplaced")
    finally:
        s.close()


@pytest.mark.parametrize("level", ["record", "batch", "none"])
def test_stream_appends_survive_cuts(
    pfs: PowerCut, stream_root: str, sweep: bool, level: str
) -> None:
    """Every acknowledged record at a synced level is there; offsets dense; tail recovers."""
    tally = Tally()
    for seed in range(8 if sweep else 1):
        pfs.load("streams")
        s = Stream.open(stream_root, "log", config=config(level), create=False)
        total = count_ops(pfs, lambda s=s, seed=seed: appends(s, [], seed))
        s.close()
        every = 1 if sweep or level == "record" else 2
        for k in cut_points(total, every=every, randoms=3, seed=seed):
            pfs.load("streams")
            acked: list[int] = []
            s = Stream.open(stream_root, "log", config=config(level), create=False)

            def work(s: Stream = s, acked: list[int] = acked, seed: int = seed) -> None:
                try:
                    appends(s, acked, seed)
                finally:
                    quiet_close(s.close)

            run_until_cut(pfs, k, work)
            tally.cuts += 1
            check_stream(stream_root, level, acked, f"{level} seed {seed} cut {k}/{total}", tally)
    assert tally.cuts >= 5
    assert tally.ok(), (tally.lost, tally.corrupt)


def test_group_commits_survive_cuts(pfs: PowerCut, stream_root: str, sweep: bool) -> None:
    """A commit that returned is on disk after the cut; the group always opens."""
    tally = Tally()

    def commits(done: list[int], consumer: str) -> None:
        # A consumer id per run: the cut leaves this process holding the last run's
        # liveness lock, as a dead process would not.
        s = Stream.open(stream_root, "work", config=config("batch"), create=False)
        try:
            g = s.group("g", consumer=consumer)
            for _ in range(5):
                recs = g.poll(max_records=4)
                if not recs:
                    break
                g.commit()
                done.append(min(g.committed().values()))
            g.close()
        finally:
            quiet_close(s.close)

    pfs.load("streams")
    total = count_ops(pfs, lambda: commits([], "count"))
    for k in cut_points(total, every=1 if sweep else 3, randoms=3, seed=5):
        pfs.load("streams")
        done: list[int] = []
        run_until_cut(pfs, k, lambda done=done, k=k: commits(done, f"c{k}"))
        tally.cuts += 1
        where = f"group cut {k}/{total}"
        with Stream.open(stream_root, "work", config=config("batch"), create=False) as s:
            # The "dead" consumer is this live process: read the group, do not join it.
            committed = s.group_info("g").committed
            pos = min(committed.values())
            if done and pos < done[-1]:
                tally.lost.append(f"{where}: committed {pos} < acknowledged {done[-1]}")
            if not all(0 <= v <= 20 for v in committed.values()):
                tally.corrupt.append(f"{where}: committed offsets {dict(committed)}")
    assert tally.ok(), (tally.lost, tally.corrupt)


def test_stream_queue_survives_cuts(pfs: PowerCut, stream_root: str, sweep: bool) -> None:
    """Acknowledged puts are there; items whose task_done returned do not come back."""
    tally = Tally()

    def work(put: list[bytes], got: list[bytes], done: list[bytes]) -> None:
        q = StreamQueue(stream_root, "q", config=config("batch"))
        try:
            for i in range(4):
                item = f"item-{i}".encode()
                q.put(item)
                put.append(item)
            for _ in range(3):
                item = q.get(timeout=0)
                got.append(item)
                q.task_done()
                done.append(item)
        finally:
            quiet_close(q.close)

    pfs.load("streams")
    total = count_ops(pfs, lambda: work([], [], []))
    for k in cut_points(total, every=1 if sweep else 3, randoms=3, seed=9):
        pfs.load("streams")
        put: list[bytes] = []
        got: list[bytes] = []
        done: list[bytes] = []
        run_until_cut(pfs, k, lambda put=put, got=got, done=done: work(put, got, done))
        tally.cuts += 1
        where = f"queue cut {k}/{total}"
        q = StreamQueue(stream_root, "q", config=config("batch"))
        try:
            rest = []
            while True:
                try:
                    rest.append(q.get(timeout=0))
                except TimeoutError:
                    break
                q.task_done()
        finally:
            q.close()
        if set(rest) & set(done):
            tally.corrupt.append(f"{where}: done items came back: {set(rest) & set(done)}")
        lost = set(put) - set(got) - set(rest)  # a got item's commit may have landed
        if lost:
            tally.lost.append(f"{where}: acknowledged puts lost: {lost}")
        if len(rest) != len(set(rest)) or any(not r.startswith(b"item-") for r in rest):
            tally.corrupt.append(f"{where}: queue holds {rest}")
    assert tally.ok(), (tally.lost, tally.corrupt)


def test_new_stream_survives_cuts(pfs: PowerCut, stream_root: str, sweep: bool) -> None:
    """A stream created and appended to in one go: its directories are durable too."""
    tally = Tally()

    def work(acked: list[int]) -> None:
        with Stream.open(stream_root, "fresh", config=config("batch")) as s:
            for o in range(3):
                acked.append(s.append(value(o)))

    pfs.load("streams")
    total = count_ops(pfs, lambda: work([]))
    for k in cut_points(total, every=1 if sweep else 2, randoms=2, seed=3):
        pfs.load("streams")
        acked: list[int] = []
        run_until_cut(pfs, k, lambda acked=acked: work(acked))
        tally.cuts += 1
        with Stream.open(stream_root, "fresh", config=config("batch")) as s:
            records = list(s.read(0))
            if [r.value for r in records] != [value(r.offset) for r in records]:
                tally.corrupt.append(f"fresh cut {k}: {records}")
            if len(records) < len(acked):
                tally.lost.append(f"fresh cut {k}/{total}: {len(records)} of {acked}")
    assert tally.ok(), (tally.lost, tally.corrupt)
