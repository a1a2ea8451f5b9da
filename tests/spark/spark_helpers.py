"""Shared by the Spark tests and the child drivers they start (no pytest needed here).

The second half is the Bus-topics kill scenario (a driver child SIGKILLed mid-stream and
restarted on its checkpoint, publishers as other processes), used by
test_spark_bus_topics_kill.py and by the cross-client test on CephFS in tests/dfs.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

from fsbus import BlockingBus, Stream

if TYPE_CHECKING:
    from spark_cluster import Cluster

    from tests.peer_process import JsonLinesPeer

# PySpark warns about pandas >= 3 when it first converts through Arrow; the connector does
# not use pandas, so the warning is noise here (the suite turns warnings into errors).
PANDAS_WARNING = "ignore:PySpark does not yet fully support pandas:FutureWarning"


def spark_env() -> dict[str, str]:
    """Environment for a Spark driver on this machine (also used for child drivers)."""
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Not the realpath: a venv's python is a symlink, and its realpath loses the venv.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def build_spark(
    tmp: Path, app: str = "fsbus-tests", *, register: bool = True, master: str = "local[2]"
) -> Any:
    """A SparkSession with its scratch space under ``tmp``, fsbus registered (unless
    ``register`` is false: then Spark must find the data source on its own).

    ``master`` is ``local[2]`` (one JVM) or a standalone cluster's ``spark://`` URL (see
    spark_cluster.py): then each executor is a JVM of its own, started by a Worker.
    """
    from pyspark.sql import SparkSession
    from spark_cluster import app_conf

    import fsbus.spark

    os.environ.update(spark_env())
    (tmp / "local").mkdir(parents=True, exist_ok=True)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.local.dir", str(tmp / "local"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={tmp}")
        .config("spark.executor.extraJavaOptions", f"-Djava.io.tmpdir={tmp}")
        .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
    )
    if master.startswith("spark://"):
        for key, value in app_conf(tmp).items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if register:
        fsbus.spark.register(spark)
    return spark


WORKER_START = "connect back"
"""Spark's words when it gave up on a Python worker it started: Spark 4.3 waits a fixed
10 s for one to connect back (``PythonWorkerFactory``; no setting changes it), which a
loaded machine can miss."""


def run_query(start: Callable[[], Any], *, timeout: float, restarts: int = 3) -> int:
    """Start a streaming query (``start()`` starts it and returns it) and wait for its
    end, raising its failure. A query that failed because a Python worker did not connect
    back in time is started again from its checkpoint, as a supervisor would, at most
    ``restarts`` times (the checkpoint keeps its output exactly once, which the callers'
    counts check); returns how many restarts it took."""
    for attempt in range(restarts + 1):
        query = start()
        ended = True
        try:
            ended = query.awaitTermination(timeout) is not False
            failure = query.exception()
        except Exception as exc:  # Spark Connect raises it here
            failure = exc
        if failure is None:
            if not ended:
                query.stop()
                raise AssertionError(f"the query did not end within {timeout} s")
            return attempt
        if WORKER_START not in str(failure) or attempt == restarts:
            raise AssertionError(f"the query failed: {failure}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


# --------------------------------------------------------------- the Bus-topics kill scenario
PATTERN = "orders.#"
QUEUE = "spark-orders"
TOPICS = ("orders.eu.new", "orders.paid", "orders.us.x.returned")


def topic_of(i: int) -> str:
    """The topic message ``i`` is published on."""
    return TOPICS[i % len(TOPICS)]


def publish_one(bus: BlockingBus, i: int) -> None:
    """Message ``i``: payload ``m<i>`` on :func:`topic_of`; single when i % 4 == 0, a TTL
    of an hour when odd (none otherwise), durable when i % 5 == 0. Every tenth also has a
    twin on a topic the pattern does not match, which must never reach the output."""
    bus.publish(
        topic_of(i),
        f"m{i}",
        single=i % 4 == 0,
        ttl=3600.0 if i % 2 else None,
        durable=i % 5 == 0,
    )
    if i % 10 == 0:
        bus.publish("invoices.new", f"m{i}")


CHILD = Path(__file__).with_name("spark_bus_driver_child.py")


@dataclass(frozen=True)
class Sizes:
    """How many messages the kill scenario publishes in each phase, and how far the first
    driver gets before the kills."""

    before_kill: int = 1000
    """Published while the first driver runs (it copies ``first_copied`` of them first)."""
    across_kill: int = 300
    """Published by the publisher the driver's SIGKILL interrupts."""
    while_down: int = 300
    """Published while no driver runs."""
    after_restart: int = 300
    """Published once the second driver copies."""
    first_copied: int = 200
    """Copied by the first driver before an executor (on a cluster) or it is killed."""
    after_executor_kill: int = 120
    """Copied after an executor's SIGKILL, before the driver's."""

    @property
    def total(self) -> int:
        return self.before_kill + self.across_kill + self.while_down + self.after_restart

    def phases(self) -> tuple[range, range, range, range]:
        """The message numbers of each phase: before, across the kill, down, after."""
        a = self.before_kill
        b = a + self.across_kill
        c = b + self.while_down
        return range(a), range(a, b), range(b, c), range(c, self.total)


PAUSE = 0.05
"""Seconds a publisher rests after every 20 messages, to publish while drains run."""
SLOW_PAUSE = 0.1
"""The same for the publisher the kill interrupts: 1.4 s of rests after its first 20."""
WAIT = 300.0
"""Upper bound of any one wait on Spark (a healthy run needs well under a minute)."""
LOCAL = pytest.param("local", marks=pytest.mark.long)
"""A kill test's local[2] case, a long run (make test-long): its cluster case runs the
same scenario, with an executor's death too, on every make test."""

Publish = Callable[[range, float], "JsonLinesPeer"]
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


def python_publisher(root: Path) -> Publish:
    """Publishers running spark_bus_driver_child.py publish."""
    from tests.peer_process import JsonLinesPeer

    def start(numbers: range, pause: float) -> JsonLinesPeer:
        argv = [sys.executable, str(CHILD), "publish", str(root), str(numbers.start)]
        return JsonLinesPeer(
            [*argv, str(numbers.stop), str(pause)],
            name=f"publisher of {numbers}",
            env={**os.environ, **spark_env()},
        )

    return start


INTEROP = Path(__file__).resolve().parent.parent / "interop"


def node_with_qlobber() -> str:
    """The node executable; the calling test is skipped (saying why) when node or the
    peer is missing, as the interop tests are."""
    import pytest

    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not on PATH: the qlobber-fsq test needs Node.js 18+")
    for package in ("qlobber-fsq", "fs-ext"):
        if not (INTEROP / "node_modules" / package / "package.json").exists():
            pytest.skip(f"{package} is not installed: `cd tests/interop && npm install`")
    return exe


def qlobber_publisher(node: str, root: Path, tmp_path: Path) -> Publish:
    """Publishers that are qlobber-fsq peers (Node): the same messages as
    :func:`publish_one` but without the unmatched twins, all at once (no pause)."""
    from tests.peer_process import JsonLinesPeer

    n_started = 0

    def start(numbers: range, pause: float) -> JsonLinesPeer:
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
    root: Path,
    tmp_path: Path,
    master: str,
    cluster: Cluster | None,
    publish: Publish,
    sizes: Sizes = Sizes(),
) -> None:
    """The scenario, whoever publishes and wherever (``publish`` may publish on another
    client of ``root``'s filesystem); asserts every message arrived exactly once."""
    before_kill, across_kill, while_down, after_restart = sizes.phases()
    n = sizes.total
    with ExitStack() as stack:
        first = Driver(root, tmp_path, "run", master, "first")
        stack.callback(first.kill)
        wait_declared(root, first)
        before = publish(before_kill, PAUSE)
        stack.callback(before.kill)
        copied = sizes.first_copied
        wait_out(root, first, copied, f"the first driver to copy {copied} messages")
        if cluster is not None:
            killed = kill_an_executor(cluster, first)
            more = sizes.after_executor_kill
            wait_out(root, first, out_end(root) + more, f"{more} more after an executor's death")
            [app] = cluster.app_ids(first.app)
            assert killed not in cluster.executor_pids(app)
        done(before)
        across = publish(across_kill, SLOW_PAUSE)
        stack.callback(across.kill)
        across.wait_count("published", 1, timeout=WAIT)
        first.kill()  # SIGKILL mid-stream, while a publisher publishes
        copied_at_kill = out_end(root)
        assert copied_at_kill < len(before_kill), "the query caught up before the kill"

        done(across)
        done(publish(while_down, PAUSE))
        with BlockingBus(root) as bus:  # kept for the query while it is down

            def kept() -> bool:
                return bus.queue_info(QUEUE).depth >= len(while_down)

            wait_until(kept, timeout=WAIT, what="the queue to hold what was published")

        second = Driver(root, tmp_path, "run", master, "second")
        stack.callback(second.kill)
        wait_out(root, second, copied_at_kill + 1, "the restarted driver to copy")
        done(publish(after_restart, PAUSE))

        def all_there() -> bool:
            second.check_alive()
            if out_end(root) < n:
                return False
            return {v for v, _k in values(root, "out")} >= {f"m{i}" for i in range(n)}

        wait_until(all_there, timeout=WAIT, what=f"all {n} messages in the output")
        assert second.stop() == 0, second.output()

    expected = Counter((f"m{i}", topic_of(i)) for i in range(n))
    assert Counter(values(root, "out")) == expected
    assert out_end(root) == n
    # the recording behind the query holds each message once too, and nothing is left
    assert Counter(values(root, f"bus-{QUEUE}")) == Counter((f"m{i}", "") for i in range(n))
    with BlockingBus(root) as bus:
        assert bus.queue_info(QUEUE).depth == 0
