"""A real Spark driver (Python and its JVM) killed with SIGKILL mid-stream, then restarted
on the same checkpoint: every record of the source reaches the sink exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import IO

import pytest
from spark_helpers import spark_env, wait_until

from fsbus import RecordIn, Stream

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CHILD = Path(__file__).with_name("spark_driver_child.py")


def fill(root: Path, values: range) -> None:
    with Stream.open(root, "in") as stream:
        stream.append_batch(RecordIn(value=f"v{i}", key=f"k{i % 10}") for i in values)


def out_end(root: Path) -> int:
    try:
        with Stream.open(root, "out", create=False) as stream:
            return stream.end_offset
    except Exception:  # not created yet
        return 0


def driver(root: Path, tmp_path: Path, mode: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    scratch = tmp_path / f"scratch-{mode}"
    scratch.mkdir()
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(root), str(tmp_path / "ckpt"), str(scratch), mode],
        env={**os.environ, **spark_env()},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM and workers die with it
    )


def kill_when_copying(root: Path, tmp_path: Path, first: subprocess.Popen[bytes]) -> None:
    try:
        wait_until(
            lambda: out_end(root) >= 200 or first.poll() is not None,
            timeout=240,
            what="the first driver to copy 200 records",
        )
        assert first.poll() is None, (tmp_path / "run.out").read_text(errors="replace")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


@pytest.mark.timeout(600)
def test_driver_sigkill_mid_stream_then_restart(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    fill(root, range(1200))

    with open(tmp_path / "run.out", "wb") as log:
        first = driver(root, tmp_path, "run", log)
        kill_when_copying(root, tmp_path, first)
    copied_before_kill = out_end(root)
    assert copied_before_kill < 1200, "the driver finished before it could be killed"

    fill(root, range(1200, 1500))  # records keep arriving while the driver is down

    with open(tmp_path / "finish.out", "wb") as log:
        second = driver(root, tmp_path, "finish", log)
        try:
            code = second.wait(timeout=300)
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
                second.wait()
    assert code == 0, (tmp_path / "finish.out").read_text(errors="replace")

    with Stream.open(root, "out", create=False) as stream:
        stored = [(r.key, r.value) for r in stream.read()]
    expected = Counter((f"k{i % 10}".encode(), f"v{i}".encode()) for i in range(1500))
    assert Counter(stored) == expected
    assert len(stored) == 1500
