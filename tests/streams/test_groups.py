"""Consumer groups: commits, independence, sharing, corrupt offsets, takeover."""

from __future__ import annotations

import os
import queue
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import Worker

from fsbus import CorruptDataError, RecordIn, Stream, StreamConfig, UsageError
from fsbus._stream.groups import group_info, list_groups, reset_group
from fsbus._stream.ops import StreamOps


def test_commit_and_resume(stream: Stream) -> None:
    stream.append_batch([str(i).encode() for i in range(100)])
    with stream.group("g") as g:
        got = g.poll(max_records=30)
        assert [r.offset for r in got] == list(range(30))
        g.commit()
        more = g.poll(max_records=10)  # polled, never committed
        assert [r.offset for r in more] == list(range(30, 40))
    with stream.group("g") as g:
        again = g.poll(max_records=1000)
        assert [r.offset for r in again] == list(range(30, 100))  # at-least-once
        g.commit()
        assert g.lag() == 0
        assert g.poll() == []


def test_groups_are_independent(stream: Stream) -> None:
    stream.append_batch([b"a", b"b", b"c"])
    with stream.group("one") as one, stream.group("two") as two:
        assert [r.value for r in one.poll()] == [b"a", b"b", b"c"]
        one.commit()
        assert [r.value for r in two.poll(max_records=1)] == [b"a"]
        two.commit()
    assert list_groups(stream) == ["one", "two"]
    assert group_info(stream, "one").lag == 0
    assert group_info(stream, "two").lag == 2


def test_start_latest(stream: Stream) -> None:
    stream.append_batch([b"old"] * 5)
    with stream.group("late", start="latest") as g:
        assert g.poll() == []
        stream.append(b"new")
        assert [r.value for r in g.poll()] == [b"new"]


def test_poll_waits_for_records(stream: Stream) -> None:
    with stream.group("g") as g:
        assert g.poll(timeout=0.05) == []


def test_corrupt_offsets_file_is_reported_then_reset(stream: Stream) -> None:
    stream.append_batch([b"x"] * 10)
    with stream.group("g") as g:
        g.poll(max_records=4)
        g.commit()
    path = stream.path / "groups" / "g" / "offsets"
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b" 4\n", b" 9\n", 1))
    with pytest.raises(CorruptDataError) as err:
        stream.group("g").commit()
    assert err.value.path == str(path)
    assert "fsbus stream groups reset s g" in str(err.value)
    assert path.read_bytes() == raw.replace(b" 4\n", b" 9\n", 1)  # not silently reset
    path.write_bytes(raw[: len(raw) // 2])  # torn
    with pytest.raises(CorruptDataError, match="no checksum line"):
        group_info(stream, "g")
    assert reset_group(stream, "g", 2) == dict.fromkeys(range(8), 2)
    with stream.group("g") as g:
        assert [r.offset for r in g.poll()] == list(range(2, 10))


def test_two_consumers_share_without_duplicates(stream: Stream) -> None:
    keys = [f"k{i % 13}" for i in range(400)]
    stream.append_batch([RecordIn(f"{i}", key=k) for i, k in enumerate(keys)])
    a = stream.group("g", consumer="a")
    b = stream.group("g", consumer="b")
    seen: dict[str, list[int]] = {"a": [], "b": []}
    try:
        for _ in range(50):
            for name, c in (("a", a), ("b", b)):
                seen[name] += [r.offset for r in c.poll(max_records=25)]
                c.commit()
            if len(seen["a"]) + len(seen["b"]) == 400:
                break
        assert a.assignment
        assert b.assignment
        assert not a.assignment & b.assignment
        assert sorted(seen["a"] + seen["b"]) == list(range(400))  # each exactly once
        # each consumer got a key's records in order
        for mine in seen.values():
            for k in set(keys):
                offs = [o for o in mine if keys[o] == k]
                assert offs == sorted(offs)
    finally:
        a.close()
        b.close()


def test_closed_consumer_share_is_taken_at_once(stream: Stream) -> None:
    stream.append_batch([b"x"] * 64)
    a = stream.group("g", consumer="a")
    b = stream.group("g", consumer="b")
    a.poll()
    a.commit()
    b.poll()  # b is live now, but a holds everything until it commits
    assert not b.assignment
    a.commit()  # gives b its share
    b.poll()
    assert len(a.assignment) == len(b.assignment) == 4
    a.close()
    b.poll()
    assert len(b.assignment) == 8
    b.close()


@pytest.mark.slow
def test_processes_share_a_group_and_take_over_a_killed_one(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none")
    n = 300
    with Stream.open(tmp_path, "s", config=cfg) as s:
        s.append(b"warm-up")
    events: queue.Queue[tuple[int, str | None]] = queue.Queue()
    ws = [
        Worker("consume", tmp_path, "s", "g", f"c{i}", 30.0, sink=events, tag=i) for i in range(3)
    ]
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    last_commit: dict[int, int] = {}

    def drain_until(total: int, dead: int | None = None) -> None:
        while len({o for offs in got.values() for o in offs}) < total:
            try:
                i, line = events.get(timeout=60)
            except queue.Empty:
                raise AssertionError(f"records missing: {got}") from None
            if line is None:
                assert i == dead, f"consumer {i} died"
                continue
            words = line.split()
            if words[0] == "got":
                got[i].append(int(words[1]))
            elif words[0] == "committed":
                last_commit[i] = int(words[1])

    def append(lo: int, hi: int) -> None:
        with Stream.open(tmp_path, "s", config=cfg) as s:
            for i in range(lo, hi, 20):
                s.append_batch([RecordIn(f"r{j}", key=f"k{j % 17}") for j in range(i, i + 20)])

    try:
        for w in ws:
            w.expect("ready")
        append(0, n)
        drain_until(n + 1)
        counts = Counter(o for offs in got.values() for o in offs)
        assert max(counts.values()) == 1, "a record went to two live consumers"
        os.kill(ws[0].proc.pid, signal.SIGKILL)
        ws[0].proc.wait(timeout=30)
        append(n, 2 * n)
        drain_until(2 * n + 1, dead=0)
    finally:
        for w in ws:
            w.stop()
    survivors = got[1] + got[2]
    assert set(range(n + 1, 2 * n + 1)) <= set(survivors)  # the dead one's share moved
    counts = Counter(o for offs in got.values() for o in offs)
    dups = {o for o, c in counts.items() if c > 1}
    # only what the killed consumer received but had not committed may come twice
    assert all(o > last_commit.get(0, -1) and o in got[0] for o in dups)


def test_commit_through_an_offset(stream: Stream) -> None:
    stream.append_batch([b"x"] * 10)
    with stream.group("g") as g:
        assert len(g.poll()) == 10
        assert set(g.commit(through=3).values()) == {4}
    with stream.group("g") as g:
        assert [r.offset for r in g.poll()] == list(range(4, 10))


def test_consumer_ids_are_exclusive(stream: Stream) -> None:
    with stream.group("g", consumer="same") as a:
        a.poll()
        b = stream.group("g", consumer="same")
        with pytest.raises(UsageError, match="already in use"):
            b.poll()
        b.close()
        assert (stream.path / "groups" / "g" / "members" / "same").exists()


def test_group_behind_retention_resumes_at_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096)
    with Stream.open(tmp_path, "s", config=cfg) as s, s.group("slow") as g:
        for _ in range(20):
            s.append_batch([b"x" * 100] * 10)
        s.reset_group("slow", 0)
        kept = cfg.model_copy(update={"retention_bytes": 4096})
        with Stream.open(tmp_path, "s", config=kept) as t:
            first = t.enforce_retention().start_offset
        assert first > 0
        with caplog.at_level("WARNING", logger="fsbus.stream"):
            assert g.poll() == []
        assert "deleted by retention" in caplog.text
        assert g.poll(max_records=1000)[0].offset == first


def test_group_reset_past_the_end_waits(stream: Stream) -> None:
    stream.append(b"a")
    stream.reset_group("ahead", 5)
    with stream.group("ahead") as g:
        assert g.poll() == []
        stream.append_batch([b"b"] * 5)
        assert [r.offset for r in g.poll()] == [5]


def test_a_silent_consumer_loses_its_partitions_after_the_session_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = StreamConfig(durability="none", session_timeout=0.3, heartbeat_interval=0.05)
    with Stream.open(tmp_path, "s", config=cfg) as s:
        s.append_batch([b"x"] * 16)
        a = s.group("g", consumer="a")
        b = s.group("g", consumer="b")
        try:
            assert len(a.poll(max_records=4)) == 4  # a holds every partition, then goes quiet
            assert len(a.assignment) == 8
            with deadline(30) as expired:
                while len(b.assignment) < 8 and not expired():
                    b.poll(max_records=100, timeout=0.05)  # alive, a's heartbeat expires
            assert len(b.assignment) == 8
            with caplog.at_level("WARNING", logger="fsbus.stream"):
                a.commit()  # too late: its partitions are b's now
            assert "lost partition" in caplog.text
            assert not a.assignment
        finally:
            a.close()
            b.close()


@contextmanager
def deadline(seconds: float) -> Iterator[Callable[[], bool]]:
    """A deadline to poll a condition against (a bound, not a sleep)."""
    end = time.monotonic() + seconds
    yield lambda: time.monotonic() >= end


@pytest.mark.slow
def test_a_consumer_is_not_used_across_fork(stream: Stream) -> None:
    import multiprocessing

    stream.append(b"x")
    with stream.group("g") as g:
        g.poll()
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(target=_poll_in_child, args=(g, results))
        child.start()
        child.join(60)
        if child.exitcode is None:
            child.kill()  # hung: fail below, and let the run end
        assert "join the group again in this process" in results.get(timeout=10)
        assert g.assignment  # the parent still holds its partitions
        assert (stream.path / "groups" / "g" / "members" / g.consumer).exists()
        g.commit()


def _poll_in_child(g: object, results: object) -> None:
    try:
        g.poll()  # type: ignore[attr-defined]
        results.put("polled")  # type: ignore[attr-defined]
    except UsageError as exc:
        results.put(str(exc))  # type: ignore[attr-defined]
    g.close()  # type: ignore[attr-defined]  # must not make the parent leave


class _CachingMount(StreamOps):
    """Serves the previous copy of a replaced group file for a few reads, as a FUSE or
    NFS mount caching names and sizes does right after another host replaced it."""

    def __init__(self) -> None:
        self.old: dict[str, bytes] = {}
        self.stale_reads: dict[str, int] = {}
        self.served_stale = 0

    def write_atomic(
        self, path: Path, data: bytes, *, durable: bool, sync_file: bool = False
    ) -> None:
        if path.name in ("owners", "offsets") or path.parent.name == "members":
            previous = super().read_file(path)
            if previous is not None:
                self.old[str(path)] = previous[: len(previous) // 2]  # cut short, too
                self.stale_reads[str(path)] = 3
        super().write_atomic(path, data, durable=durable, sync_file=sync_file)

    def read_file(self, path: Path) -> bytes | None:
        if self.stale_reads.get(str(path), 0) > 0:
            self.stale_reads[str(path)] -= 1
            self.served_stale += 1
            return self.old[str(path)]
        return super().read_file(path)


def test_group_files_read_through_a_caching_mount(tmp_path: Path) -> None:
    ops = _CachingMount()
    cfg = StreamConfig(durability="none")
    s = Stream._open(tmp_path, "s", config=cfg, create=True, ops=ops)
    try:
        s.append_batch([RecordIn(f"{i}", key=f"k{i % 5}") for i in range(100)])
        seen: list[int] = []
        with s.group("g", consumer="a") as a, s.group("g", consumer="b") as b:
            for _ in range(40):
                for c in (a, b):
                    seen += [r.offset for r in c.poll(max_records=10)]
                    c.commit()
                if len(seen) >= 100:
                    break
        assert ops.served_stale > 0
        assert sorted(seen) == list(range(100))  # no record twice, none lost
    finally:
        s.close()
