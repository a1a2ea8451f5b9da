"""A real Spark driver (Python and its JVM) killed with SIGKILL mid-stream, then restarted
on the same checkpoint: every record of the source reaches the sink exactly once.

On the standalone cluster an executor JVM (with its Python workers) is SIGKILLed first,
while the driver keeps running: Spark reruns its tasks on the executor the Worker starts
in its place, and still nothing is lost or doubled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import IO

import pytest
from spark_cluster import Cluster
from spark_helpers import LOCAL, spark_env, wait_until

from fsbus import RecordIn, Stream

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CHILD = Path(__file__).with_name("spark_driver_child.py")
FIRST = 800
"""Records in stream ``in`` when the first driver starts; it is killed after copying about
200 (400 on the cluster, where an executor dies at 200), 40 a micro-batch."""
TOTAL = 1000
"""Records in all, the last 200 appended while no driver runs."""


def fill(root: Path, values: range) -> None:
    with Stream.open(root, "in") as stream:
        stream.append_batch(RecordIn(value=f"v{i}", key=f"k{i % 10}") for i in values)


def out_end(root: Path) -> int:
    try:
        with Stream.open(root, "out", create=False) as stream:
            return stream.end_offset
    except Exception:  # not created yet
        return 0


def driver(
    root: Path, tmp_path: Path, mode: str, master: str, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    scratch = tmp_path / f"scratch-{mode}"
    scratch.mkdir()
    ckpt = tmp_path / "ckpt"
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(root), str(ckpt), str(scratch), mode, master],
        env={**os.environ, **spark_env()},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM and workers die with it
    )


def wait_copied(root: Path, tmp_path: Path, first: subprocess.Popen[bytes], count: int) -> None:
    wait_until(
        lambda: out_end(root) >= count or first.poll() is not None,
        timeout=240,
        what=f"the first driver to copy {count} records",
    )
    assert first.poll() is None, (tmp_path / "run.out").read_text(errors="replace")


def kill_an_executor(cluster: Cluster) -> int:
    """SIGKILL one executor JVM of the first driver's application; its pid."""
    [app] = cluster.app_ids("fsbus-driver-run")
    pids = cluster.executor_pids(app)
    assert len(pids) == 2, pids  # one per Worker, each a JVM of its own
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


def kill_when_copying(
    root: Path, tmp_path: Path, first: subprocess.Popen[bytes], cluster: Cluster | None
) -> None:
    try:
        wait_copied(root, tmp_path, first, 200)
        if cluster is not None:
            killed = kill_an_executor(cluster)
            wait_copied(root, tmp_path, first, out_end(root) + 200)
            [app] = cluster.app_ids("fsbus-driver-run")
            assert killed not in cluster.executor_pids(app)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", [LOCAL, "cluster"])
def test_driver_sigkill_mid_stream_then_restart(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    cluster: Cluster | None = None
    master = "local[2]"
    if where == "cluster":
        cluster = request.getfixturevalue("spark_cluster")
        master = cluster.url
    root = tmp_path / "bus"
    fill(root, range(FIRST))

    with open(tmp_path / "run.out", "wb") as log:
        first = driver(root, tmp_path, "run", master, log)
        kill_when_copying(root, tmp_path, first, cluster)
    copied_before_kill = out_end(root)
    assert copied_before_kill < FIRST, "the driver finished before it could be killed"

    fill(root, range(FIRST, TOTAL))  # records keep arriving while the driver is down

    with open(tmp_path / "finish.out", "wb") as log:
        second = driver(root, tmp_path, "finish", master, log)
        try:
            code = second.wait(timeout=300)
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
                second.wait()
    assert code == 0, (tmp_path / "finish.out").read_text(errors="replace")

    with Stream.open(root, "out", create=False) as stream:
        stored = [(r.key, r.value) for r in stream.read()]
    expected = Counter((f"k{i % 10}".encode(), f"v{i}".encode()) for i in range(TOTAL))
    assert Counter(stored) == expected
    assert len(stored) == TOTAL
