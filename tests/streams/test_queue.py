"""StreamQueue: the blocking work-queue face (put, get with timeout, task_done)."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import pytest

from fsbus import QueueEmpty, StreamConfig, StreamQueue, UsageError, WouldBlock

CFG = StreamConfig(durability="none", poll_interval=0.02)


def test_put_get_task_done(tmp_path: Path) -> None:
    with StreamQueue(tmp_path, "jobs", config=CFG) as q:
        assert q.empty()
        q.put(b"a")
        q.put("b")
        q.put_many([b"c", b"d"])
        assert q.qsize() == 4
        assert q.get() == b"a"
        assert q.get(timeout=1) == b"b"
        assert q.qsize() == 2
        q.task_done()
        q.task_done()
        assert q.unfinished() == 0
        with pytest.raises(UsageError, match="more times than get"):
            q.task_done()


def test_get_timeout_and_nowait(tmp_path: Path) -> None:
    with StreamQueue(tmp_path, "jobs", config=CFG) as q:
        with pytest.raises(QueueEmpty, match=r"no item after 0\.05 s"):
            q.get(timeout=0.05)
        for exc in (queue.Empty, TimeoutError, WouldBlock):
            with pytest.raises(exc):
                q.get_nowait()
        with pytest.raises(QueueEmpty):
            q.get(block=False)


def test_blocking_get_wakes_on_put(tmp_path: Path) -> None:
    with StreamQueue(tmp_path, "jobs", config=CFG) as q:
        got: list[bytes] = []
        started = threading.Event()

        def consumer() -> None:
            started.set()
            got.append(q.get(timeout=30))

        t = threading.Thread(target=consumer)
        t.start()
        started.wait(10)
        with StreamQueue(tmp_path, "jobs", config=CFG) as producer:
            producer.put(b"hello")
        t.join(30)
        assert got == [b"hello"]


def test_unacknowledged_items_come_back(tmp_path: Path) -> None:
    with StreamQueue(tmp_path, "jobs", config=CFG) as q:
        q.put_many([b"1", b"2", b"3"])
        assert q.get() == b"1"
        q.task_done()
        assert q.get() == b"2"  # taken, never acknowledged: the worker "crashed"
    with StreamQueue(tmp_path, "jobs", config=CFG) as q:
        assert q.get() == b"2"
        assert q.get() == b"3"
        q.task_done()
        q.task_done()
    with StreamQueue(tmp_path, "jobs", config=CFG) as q:
        with pytest.raises(QueueEmpty):
            q.get_nowait()


def test_commit_every_groups_acknowledgements(tmp_path: Path) -> None:
    with StreamQueue(tmp_path, "jobs", config=CFG, commit_every=10) as q:
        q.put_many([str(i) for i in range(5)])
        for _ in range(5):
            q.get()
            q.task_done()
    # close committed the acknowledged items
    with StreamQueue(tmp_path, "jobs", config=CFG) as q:
        assert q.qsize() == 0


def test_two_queue_consumers_share_items(tmp_path: Path) -> None:
    n = 200
    with StreamQueue(tmp_path, "jobs", config=CFG) as producer:
        producer.put_many([str(i) for i in range(n)])
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    qa = StreamQueue(tmp_path, "jobs", consumer="a", config=CFG)
    qb = StreamQueue(tmp_path, "jobs", consumer="b", config=CFG)
    try:
        while len(got["a"]) + len(got["b"]) < n:
            for name, q in (("a", qa), ("b", qb)):
                try:
                    got[name].append(q.get(timeout=0.05))
                except QueueEmpty:
                    continue
                q.task_done()
    finally:
        qa.close()
        qb.close()
    allg = got["a"] + got["b"]
    assert sorted(allg, key=int) == [str(i).encode() for i in range(n)]
    assert got["a"]
    assert got["b"]


def test_task_done_does_not_wait_for_a_blocked_get(tmp_path: Path) -> None:
    with StreamQueue(tmp_path, "jobs", config=CFG) as q:
        q.put(b"one")
        assert q.get() == b"one"
        blocked = threading.Event()
        result: list[object] = []

        def getter() -> None:
            blocked.set()
            try:
                result.append(q.get(timeout=30))
            except QueueEmpty as exc:
                result.append(exc)

        t = threading.Thread(target=getter)
        t.start()
        blocked.wait(10)
        q.task_done()  # returns while the other thread is blocked in get()
        assert q.unfinished() == 0
        q.put(b"two")
        t.join(30)
        assert result == [b"two"]
