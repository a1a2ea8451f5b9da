# kombu carries no annotations.
# mypy: disable-error-code="no-untyped-call"

"""A real Celery worker (a subprocess, prefork pool) with broker ``fsbus:///<dir>``.

Results come back through Celery's filesystem result backend (``file://``); remote
control (``ping``) goes through the transport's fanout exchange and reply queues.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsbus import BlockingBus
from tests.kombu.kombu_helpers import HERE, WAIT, wait_for

pytest.importorskip("celery")

from tests.kombu.kombu_celery_app import make_app

pytestmark = pytest.mark.slow


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes], Path]]:
    bus, results, log = tmp_path / "bus", tmp_path / "results", tmp_path / "worker.log"
    results.mkdir()
    env = dict(os.environ, FSBUS_KOMBU_BUS=str(bus), FSBUS_KOMBU_RESULTS=str(results))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "kombu_celery_app",
                "worker",
                "--pool=prefork",
                "--concurrency=2",
                "--hostname=fsbus-test@%h",
                "--loglevel=INFO",
            ],
            cwd=HERE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield bus, results, proc, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=WAIT)


def test_celery_worker_runs_tasks_and_answers_ping(
    worker: tuple[Path, Path, subprocess.Popen[bytes], Path],
) -> None:
    bus, results, proc, log = worker
    app = make_app(str(bus), str(results))
    try:
        # tasks with an ETA are held unacked until due: Celery raises the prefetch count
        later = [
            app.send_task("kombu_celery_app.add", args=(100, i), countdown=1) for i in range(3)
        ]
        pending = [app.send_task("kombu_celery_app.add", args=(i, i)) for i in range(30)]
        answers = [r.get(timeout=WAIT) for r in pending]
        assert answers == [2 * i for i in range(30)]  # every task ran, each result back
        assert [r.get(timeout=WAIT) for r in later] == [100, 101, 102]

        pids = {app.send_task("kombu_celery_app.whoami", args=(0,)).get(timeout=WAIT)[1]}
        assert proc.pid not in pids  # ran in a pool process, not the worker's main one

        replies = app.control.ping(timeout=2.0)
        assert any("fsbus-test@" in name for reply in replies for name in reply), replies
    finally:
        app.close()

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=WAIT) == 0, log.read_text()
    with BlockingBus(bus) as b:
        wait_for(lambda: b.queue_info("celery").depth == 0, what="no task left behind")
    text = log.read_text()
    assert text.count("succeeded in") == 34, text
    assert "Connected to fsbus://" in text
