"""A streaming query over Bus topics, its driver SIGKILLed mid-stream and restarted on the
same checkpoint: every message published while it ran, while it was down and after it
came back appears exactly once in the output.

The driver is a child process (spark_bus_driver_child.py) in its own process group: the
kill takes its JVM and Python workers with it. Publishers are other processes, publishing
numbered messages before the kill, during it and after the restart. On the standalone
cluster an executor JVM is SIGKILLed first, while the driver runs. Another test has a
real qlobber-fsq (Node) peer publish, with an fsbus process on the bus to route its
messages into the query's queue (the peer does not route; see docs/queues.md). The last
one kills the query's recording step twice in a row, the second time while it recovers
from the first, at the point no Spark-level kill can be aimed at.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import IO

import pytest
from spark_bus_driver_child import PATTERN, QUEUE, publish_one, topic_of
from spark_cluster import Cluster
from spark_helpers import spark_env, wait_until

from fsbus import BlockingBus, Stream
from tests.peer_process import JsonLinesPeer

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

CHILD = Path(__file__).with_name("spark_bus_driver_child.py")
INTEROP = Path(__file__).resolve().parent.parent / "interop"

BEFORE_KILL = range(1000)
ACROSS_KILL = range(1000, 1300)
WHILE_DOWN = range(1300, 1600)
AFTER_RESTART = range(1600, 1900)
N = 1900
PAUSE = 0.05
"""Seconds a publisher rests after every 20 messages, to publish while drains run."""
SLOW_PAUSE = 0.1
"""The same for the publisher the kill interrupts: 1.4 s of rests after its first 20."""
WAIT = 300.0
"""Upper bound of any one wait on Spark (a healthy run needs well under a minute)."""

Publish = Callable[[range, float], JsonLinesPeer]
"""Starts a publisher process of the messages numbered in the range, resting the given
seconds after each 20 (if it can)."""


def out_end(root: Path) -> int:
    try:
        with Stream.open(root, "out", create=False) as stream:
            return stream.end_offset
    except Exception:  # not created yet
        return 0


def values(root: Path, stream_name: str) -> list[tuple[str, str]]:
    """(value, key) of every record of a stream."""
    with Stream.open(root, stream_name, create=False) as stream:
        return [(r.value.decode(), (r.key or b"").decode()) for r in stream.read()]


class Driver:
    """A Spark driver child in its own process group, its output in a log file."""

    def __init__(self, root: Path, tmp_path: Path, mode: str, master: str, tag: str) -> None:
        scratch = tmp_path / f"scratch-{tag}"
        scratch.mkdir()
        self.log_path = tmp_path / f"{tag}.out"
        self.log: IO[bytes] = open(self.log_path, "wb")  # closed in kill()
        argv = [str(CHILD), "driver", str(root), str(tmp_path / "ckpt"), str(scratch)]
        self.proc = subprocess.Popen(
            [sys.executable, *argv, mode, master],
            env={**os.environ, **spark_env()},
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the JVM and Python workers die with it
        )
        self.app = f"fsbus-bus-driver-{mode}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def check_alive(self) -> None:
        assert self.alive(), f"the driver exited with {self.proc.returncode}:\n{self.output()}"

    def stop(self) -> int:
        """Ask it to stop its query (STOP on stdin) and wait for it to exit."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"STOP\n")
        self.proc.stdin.close()
        return self.proc.wait(timeout=WAIT)

    def kill(self) -> None:
        """SIGKILL the whole group (also after it exited: workers may linger)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.log.close()


def python_publisher(root: Path, tmp_path: Path) -> Publish:
    """Publishers running spark_bus_driver_child.py publish."""

    def start(numbers: range, pause: float) -> JsonLinesPeer:
        argv = [sys.executable, str(CHILD), "publish", str(root), str(numbers.start)]
        return JsonLinesPeer(
            [*argv, str(numbers.stop), str(pause)],
            name=f"publisher of {numbers}",
            env={**os.environ, **spark_env()},
        )

    return start


def wait_declared(root: Path, driver: Driver) -> None:
    """Until the query's first start declared its queue: from then on, every message
    published on ``PATTERN`` is the query's."""
    with BlockingBus(root) as bus:

        def declared() -> bool:
            driver.check_alive()
            return QUEUE in {q.name for q in bus.queues()}

        wait_until(declared, timeout=WAIT, what=f"the query to declare queue {QUEUE}")


def wait_out(root: Path, driver: Driver, count: int, what: str) -> None:
    def reached() -> bool:
        driver.check_alive()
        return out_end(root) >= count

    wait_until(reached, timeout=WAIT, what=what)


def done(publisher: JsonLinesPeer) -> None:
    publisher.wait_count("done", 1, timeout=WAIT)
    assert publisher.wait_exit() == 0, publisher.describe()


def kill_an_executor(cluster: Cluster, driver: Driver) -> int:
    """SIGKILL one of the driver's two executor JVMs; its pid."""
    [app] = cluster.app_ids(driver.app)
    pids = cluster.executor_pids(app)
    assert len(pids) == 2, pids  # one per Worker, each a JVM of its own
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


def kill_restart_and_count(
    root: Path, tmp_path: Path, master: str, cluster: Cluster | None, publish: Publish
) -> None:
    """The scenario, whoever publishes; asserts every message arrived exactly once."""
    with ExitStack() as stack:
        first = Driver(root, tmp_path, "run", master, "first")
        stack.callback(first.kill)
        wait_declared(root, first)
        before = publish(BEFORE_KILL, PAUSE)
        stack.callback(before.kill)
        wait_out(root, first, 200, "the first driver to copy 200 messages")
        if cluster is not None:
            killed = kill_an_executor(cluster, first)
            wait_out(root, first, out_end(root) + 120, "120 more after an executor's death")
            [app] = cluster.app_ids(first.app)
            assert killed not in cluster.executor_pids(app)
        done(before)
        across = publish(ACROSS_KILL, SLOW_PAUSE)
        stack.callback(across.kill)
        across.wait_count("published", 1, timeout=WAIT)
        first.kill()  # SIGKILL mid-stream, while a publisher publishes
        copied_at_kill = out_end(root)
        assert copied_at_kill < len(BEFORE_KILL), "the query caught up before the kill"

        done(across)
        done(publish(WHILE_DOWN, PAUSE))
        with BlockingBus(root) as bus:  # kept for the query while it is down

            def kept() -> bool:
                return bus.queue_info(QUEUE).depth >= len(WHILE_DOWN)

            wait_until(kept, timeout=WAIT, what="the queue to hold what was published")

        second = Driver(root, tmp_path, "run", master, "second")
        stack.callback(second.kill)
        wait_out(root, second, copied_at_kill + 1, "the restarted driver to copy")
        done(publish(AFTER_RESTART, PAUSE))

        def all_there() -> bool:
            second.check_alive()
            if out_end(root) < N:
                return False
            return {v for v, _k in values(root, "out")} >= {f"m{i}" for i in range(N)}

        wait_until(all_there, timeout=WAIT, what=f"all {N} messages in the output")
        assert second.stop() == 0, second.output()

    expected = Counter((f"m{i}", topic_of(i)) for i in range(N))
    assert Counter(values(root, "out")) == expected
    assert out_end(root) == N
    # the recording behind the query holds each message once too, and nothing is left
    assert Counter(values(root, f"bus-{QUEUE}")) == Counter((f"m{i}", "") for i in range(N))
    with BlockingBus(root) as bus:
        assert bus.queue_info(QUEUE).depth == 0


@pytest.mark.parametrize("where", ["local", "cluster"])
def test_driver_sigkill_while_publishing_then_restart(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    cluster: Cluster | None = None
    master = "local[2]"
    if where == "cluster":
        cluster = request.getfixturevalue("spark_cluster")
        master = cluster.url
    root = tmp_path / "bus"
    root.mkdir()
    kill_restart_and_count(root, tmp_path, master, cluster, python_publisher(root, tmp_path))


def node_with_qlobber() -> str:
    """The node executable; the test is skipped (saying why) when node or the peer is
    missing, as the interop tests are."""
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not on PATH: the qlobber-fsq test needs Node.js 18+")
    for package in ("qlobber-fsq", "fs-ext"):
        if not (INTEROP / "node_modules" / package / "package.json").exists():
            pytest.skip(f"{package} is not installed: `cd tests/interop && npm install`")
    return exe


@pytest.mark.interop
def test_a_qlobber_peers_messages_reach_the_output_once(tmp_path: Path) -> None:
    node = node_with_qlobber()
    root = tmp_path / "bus"
    root.mkdir()
    n_started = 0

    def publish(numbers: range, pause: float) -> JsonLinesPeer:
        nonlocal n_started
        messages = [
            {
                "topic": topic_of(i),
                "payload": base64.b64encode(f"m{i}".encode()).decode(),
                "single": i % 4 == 0,
                "ttl": 3600_000,  # qlobber-fsq's default is a minute
            }
            for i in numbers
        ]
        params = tmp_path / f"qlobber-{n_started}.json"
        n_started += 1
        params.write_text(json.dumps({"dir": str(root), "messages": messages}))
        return JsonLinesPeer(
            [node, str(INTEROP / "qlobber_peer.js"), "pub", str(params)],
            name=f"qlobber-fsq publisher of {numbers}",
            cwd=INTEROP,
        )

    # An fsbus process scanning the bus routes the peer's messages into the query's
    # queue, the driver's included (its drains scan too): one copy, whoever routes it.
    with BlockingBus(root) as bus, bus.messages("router.idle"):
        kill_restart_and_count(root, tmp_path, "local[2]", None, publish)


DRAIN_THEN_DIE = """
import os, signal, sys
import fsbus.recording as r
real = r.Stream.append_batch
def append_then_die(self, records):
    real(self, records)
    os.kill(os.getpid(), signal.SIGKILL)
r.Stream.append_batch = append_then_die
r.drain(sys.argv[1], sys.argv[2], sys.argv[3], queue=sys.argv[4])
"""


def test_a_drain_killed_again_while_recovering_appends_nothing_twice(tmp_path: Path) -> None:
    """The query's recording, its driver killed twice in a row right after an append
    (before acknowledging): the first time with messages 0-4, the second time while
    recovering them together with messages 5-9. The next drain appends nothing twice."""
    from fsbus.recording import drain
    from fsbus.spark._bus_topics import recording_names

    root = tmp_path / "bus"
    queue, stream = recording_names(PATTERN, QUEUE)
    drain(root, PATTERN, stream, queue=queue)  # the query's first start: the queue exists
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = [sys.executable, "-c", DRAIN_THEN_DIE, str(root), PATTERN, stream, queue]
    with BlockingBus(root) as bus:
        for i in range(5):
            publish_one(bus, i)
    assert subprocess.run(argv, env=env).returncode == -signal.SIGKILL
    with BlockingBus(root) as bus:
        for i in range(5, 10):
            publish_one(bus, i)
    assert subprocess.run(argv, env=env).returncode == -signal.SIGKILL
    drain(root, PATTERN, stream, queue=queue)
    assert Counter(values(root, stream)) == Counter((f"m{i}", "") for i in range(10))
    with BlockingBus(root) as bus:
        assert bus.queue_info(queue).depth == 0
