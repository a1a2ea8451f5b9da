"""Recording Bus topics into a Stream: every message once, across recorder kills."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from fsbus import BlockingBus, OffsetOutOfRange, Stream
from fsbus.recording import MESSAGE, TOPIC, drain, queue_for
from tests.lagging_view import lagging_view, segment_sizes

WAIT = 60.0
REPO = Path(__file__).resolve().parent.parent.parent


def ids_in(root: Path, name: str) -> Counter[str]:
    with Stream.open(root, name) as s:
        return Counter(r.value.decode() for r in s.read(0))


def test_a_drain_records_what_was_published_since_the_queue_exists(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    assert drain(root, "orders.#", "orders").appended == 0  # declares the queue
    with BlockingBus(root) as bus:
        bus.publish("orders.eu.new", b"1", headers={"k": "v"})
        bus.publish("orders.paid", b"2", single=True)
        bus.publish("invoices.new", b"not recorded")
        assert bus.routes("orders.x") == [queue_for("orders.#", "orders")]
    r = drain(root, "orders.#", "orders")
    assert (r.appended, r.skipped, r.end_offset) == (2, 0, 2)
    with Stream.open(root, "orders") as s:
        records = list(s.read(0))
    assert [(x.value, x.headers[TOPIC]) for x in records] == [
        (b"1", "orders.eu.new"),
        (b"2", "orders.paid"),
    ]
    assert records[0].headers["k"] == "v"
    assert all(x.headers[MESSAGE] for x in records)
    assert drain(root, "orders.#", "orders").appended == 0


def test_a_recorder_killed_again_and_again_records_each_message_once(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [
        sys.executable,
        "-m",
        "fsbus",
        "stream",
        "record",
        "jobs.#",
        "--into",
        "jobs",
        "--root",
        str(root),
    ]
    subprocess.run([*argv, "--once"], check=True, env=env, capture_output=True)
    n = 3000
    publisher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom fsbus import BlockingBus\n"
            "with BlockingBus(sys.argv[1]) as b:\n"
            "    for i in range(int(sys.argv[2])):\n"
            "        b.publish('jobs.x', str(i).encode())\n"
            "        if i % 100 == 0: time.sleep(0.05)\n",
            str(root),
            str(n),
        ],
        env=env,
    )
    kills = 0
    try:
        deadline = time.monotonic() + WAIT
        while kills < 4:
            rec = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
            assert rec.stdout is not None
            # once it recorded a batch (or after 5 s), kill it mid-run
            ready, _, _ = select.select([rec.stdout], [], [], 5.0)
            if ready:
                assert json.loads(rec.stdout.readline())["appended"] >= 0
            time.sleep(0.05 * kills)  # vary the moment of death a little
            rec.send_signal(signal.SIGKILL)
            rec.wait()
            rec.stdout.close()
            kills += 1
            assert time.monotonic() < deadline
        assert publisher.wait(timeout=WAIT) == 0
    finally:
        if publisher.poll() is None:
            publisher.kill()
    final = subprocess.run([*argv, "--once"], check=True, env=env, capture_output=True, text=True)
    last = json.loads(final.stdout.strip().splitlines()[-1])
    assert last["end_offset"] == n
    assert ids_in(root, "jobs") == Counter(str(i) for i in range(n))
    with BlockingBus(root) as bus:
        assert bus.queue_info(queue_for("jobs.#", "jobs")).depth == 0


def _drain_killed_after_append(root: Path) -> None:
    """A drain of ``t.#`` into ``s`` in a child process that SIGKILLs itself right after
    its append, before any ack."""
    script = (
        "import os, sys, signal\n"
        "import fsbus.recording as r\n"
        "real = r.Stream.append_batch\n"
        "def append_then_die(self, records):\n"
        "    out = real(self, records)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "r.Stream.append_batch = append_then_die\n"
        "r.drain(sys.argv[1], 't.#', 's')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root)], env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert proc.returncode == -signal.SIGKILL


def test_a_crash_between_append_and_ack_is_recovered(tmp_path: Path) -> None:
    """The recovery path itself: records appended, their messages not acknowledged
    (as a recorder SIGKILLed right after its append leaves them)."""
    root = tmp_path / "bus"
    drain(root, "t.#", "s")
    with BlockingBus(root) as bus:
        for i in range(5):
            bus.publish("t.x", str(i).encode())
    _drain_killed_after_append(root)
    assert ids_in(root, "s") == Counter(str(i) for i in range(5))  # appended, not acked
    r = drain(root, "t.#", "s")
    assert (r.appended, r.skipped) == (0, 5)
    assert ids_in(root, "s") == Counter(str(i) for i in range(5))


def _crash_after_append(root: Path) -> dict[Path, int]:
    """Two messages recorded into Stream ``s``, then five more appended by a drain
    SIGKILLed before its acks; returns the sizes of the segments before the five."""
    drain(root, "t.#", "s")
    with BlockingBus(root) as bus:
        for i in range(2):
            bus.publish("t.x", f"pre-{i}".encode())
    assert drain(root, "t.#", "s").appended == 2
    with Stream.open(root, "s") as s:
        before = segment_sizes(s.path)
    assert before
    with BlockingBus(root) as bus:
        for i in range(5):
            bus.publish("t.x", str(i).encode())
    _drain_killed_after_append(root)
    return before


RECORDED = Counter(["pre-0", "pre-1", *(str(i) for i in range(5))])


def test_a_recovering_drain_whose_view_lags_reads_on_to_the_locked_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain that crashed appended on another host: this host's view of the segment
    still ends before those records. Reading only what it sees, the recovering drain
    would append all five again."""
    root = tmp_path / "bus"
    before = _crash_after_append(root)
    with lagging_view(monkeypatch, before, heal_after=3) as view:
        r = drain(root, "t.#", "s")
    assert (r.appended, r.skipped) == (0, 5)
    assert ids_in(root, "s") == RECORDED
    assert len(view.sleeps) == 3  # it waited for the view to catch up


def test_a_recovering_drain_whose_view_never_catches_up_fails_and_appends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "bus"
    before = _crash_after_append(root)
    with lagging_view(monkeypatch, before, heal_after=None):
        with pytest.raises(OffsetOutOfRange, match=r"offsets 2\.\.6 exist"):
            drain(root, "t.#", "s")
    assert ids_in(root, "s") == RECORDED
    r = drain(root, "t.#", "s")  # the view has caught up: the recovery completes
    assert (r.appended, r.skipped) == (0, 5)
    assert ids_in(root, "s") == RECORDED
