"""Several OS processes append to one stream at once: no lost or duplicated offset."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers import Worker

from fsbus import Stream, StreamConfig

WORKERS = 4
COUNT = 1500


@pytest.mark.slow
def test_concurrent_appenders(tmp_path: Path) -> None:
    ws = [Worker("append", tmp_path, "s", f"w{i}", COUNT) for i in range(WORKERS)]
    try:
        for w in ws:
            w.expect("ready")
        for w in ws:
            w.send("go")
        for w in ws:
            w.expect("done", timeout=110)
    finally:
        for w in ws:
            w.stop()
    with Stream.open(tmp_path, "s") as s:
        recs = list(s.read())
        assert s.end_offset == WORKERS * COUNT
        assert len(s.info().segments) > 1  # they rolled segments under each other
    assert [r.offset for r in recs] == list(range(WORKERS * COUNT))
    counts = Counter(r.value for r in recs)
    expected = {f"w{i}-{j}".encode() for i in range(WORKERS) for j in range(COUNT)}
    assert set(counts) == expected
    assert max(counts.values()) == 1
    # each writer's records keep their order
    for i in range(WORKERS):
        mine = [int(r.value.split(b"-")[1]) for r in recs if r.value.startswith(f"w{i}-".encode())]
        assert mine == list(range(COUNT))


def _forked_appender(s: Stream, tag: str, n: int) -> None:
    for i in range(n):
        s.append(f"{tag}-{i}".encode())


@pytest.mark.slow
def test_a_stream_opened_before_fork_still_serialises_appends(tmp_path: Path) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    n = 500
    with Stream.open(tmp_path, "f", config=StreamConfig(durability="none")) as s:
        s.append(b"before")  # the writer has its descriptors and its lock file open
        children = [ctx.Process(target=_forked_appender, args=(s, f"c{i}", n)) for i in range(2)]
        for c in children:
            c.start()
        _forked_appender(s, "parent", n)
        for c in children:
            c.join(60)
            if c.exitcode is None:
                c.kill()  # hung: fail, and let the run end
            assert c.exitcode == 0
        recs = list(s.read())
    assert [r.offset for r in recs] == list(range(1 + 3 * n))
    assert len({r.value for r in recs}) == 1 + 3 * n
