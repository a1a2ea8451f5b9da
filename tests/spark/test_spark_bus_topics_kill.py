"""A streaming query over Bus topics, its driver SIGKILLed mid-stream and restarted on the
same checkpoint: every message published while it ran, while it was down and after it
came back appears exactly once in the output.

The scenario lives in spark_helpers.py (the cross-client test on CephFS runs it too). The
driver is a child process (spark_bus_driver_child.py) in its own process group: the
kill takes its JVM and Python workers with it. Publishers are other processes, publishing
numbered messages before the kill, during it and after the restart. On the standalone
cluster an executor JVM is SIGKILLed first, while the driver runs. Another test has a
real qlobber-fsq (Node) peer publish, with an fsbus process on the bus to route its
messages into the query's queue (the peer does not route; see docs/queues.md). The last
one kills the query's recording step twice in a row, the second time while it recovers
from the first, at the point no Spark-level kill can be aimed at.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from spark_cluster import Cluster
from spark_helpers import (
    LOCAL,
    PATTERN,
    QUEUE,
    Sizes,
    kill_restart_and_count,
    node_with_qlobber,
    publish_one,
    python_publisher,
    qlobber_publisher,
    values,
)

from fsbus import BlockingBus

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

CLUSTER_SIZES = Sizes(before_kill=600, across_kill=150, while_down=150, after_restart=150)
"""Half the messages of the local run: on the cluster each micro-batch of 40 crosses two
executor JVMs and a shuffle, and the kills (an executor's, then the driver's) and the
exactly-once counts are the same with 1,050 messages as with 1,900."""


CLUSTER = pytest.param("cluster", marks=pytest.mark.long)
"""The cluster case is a long run too (about 400 s of a make test's 2 workers): on every
make test, tests/dfs/test_spark_two_clients.py runs this same scenario on the standalone
cluster (an executor's SIGKILL, then the driver's), with the bus on CephFS."""


@pytest.mark.parametrize("where", [LOCAL, CLUSTER])
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
    sizes = Sizes() if cluster is None else CLUSTER_SIZES
    kill_restart_and_count(root, tmp_path, master, cluster, python_publisher(root), sizes)


@pytest.mark.interop
@pytest.mark.long  # tests/dfs/test_spark_two_clients.py runs a qlobber-fsq peer so, on CephFS
def test_a_qlobber_peers_messages_reach_the_output_once(tmp_path: Path) -> None:
    node = node_with_qlobber()
    root = tmp_path / "bus"
    root.mkdir()
    publish = qlobber_publisher(node, root, tmp_path)

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
