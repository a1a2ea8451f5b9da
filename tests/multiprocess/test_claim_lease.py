"""Rename claims hold a lease: renewed while a handler runs, given back when it lapses.

Two consumer processes claim work-queue messages by rename (``locking="rename"``, what
network mounts without shared flock use) with a lease of 1 s, and garbage collection
running every 0.1 s in both, so a claim not renewed is taken back within moments.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.multiprocess.test_bus_processes import (
    Spawn,
    counts,
    publish,
    singles_on_disk,
    wait_until,
)

LEASE = 1.0
CONFIG = {
    "locking": "rename",
    "claim_lease": LEASE,
    "gc_interval": 0.1,
    "poll_interval": 0.05,
    "retry_interval": 0.05,
}

pytestmark = pytest.mark.slow


def claimed(root: Path) -> list[str]:
    claims = root / "fsbus" / "claims"
    return [p.name for p in claims.rglob("*") if p.is_file()] if claims.exists() else []


@pytest.mark.parametrize("face", ["async", "blocking"])
def test_a_handler_running_three_leases_is_not_run_twice(
    spawn: Spawn, bus_root: Path, face: str
) -> None:
    workers = [
        spawn(
            "worker", name=f"worker {i}", pattern="jobs.#", work=3 * LEASE, face=face, config=CONFIG
        )
        for i in range(2)
    ]
    for w in workers:
        w.wait_count("ready", 1)
    publish(spawn, [("jobs.slow", "job-1"), ("jobs.slow", "job-2")], single=True, config=CONFIG)
    wait_until(lambda: counts(workers, "done").total() >= 2, what="both jobs done", timeout=60)
    wait_until(
        lambda: not singles_on_disk(bus_root) and not claimed(bus_root),
        what="both jobs acknowledged",
    )
    for w in workers:
        assert w.stop() == 0, w.describe()
    # Each ran once although each handler outlived the lease three times over: had a
    # lease lapsed, the other worker (idle, its gc sweeping every 0.1 s) would have
    # started the job again long before the first run ended.
    assert counts(workers, "start") == {"job-1": 1, "job-2": 1}
    assert counts(workers, "done") == {"job-1": 1, "job-2": 1}


def test_a_claim_whose_holder_was_killed_is_given_back_after_the_lease(
    spawn: Spawn, bus_root: Path
) -> None:
    victim = spawn("worker", name="victim", pattern="jobs.#", hold=True, config=CONFIG)
    victim.wait_count("ready", 1)
    publish(spawn, [("jobs.held", "job-1")], single=True, config=CONFIG)
    victim.wait_count("start", 1)
    assert len(claimed(bus_root)) == 1  # claimed by rename, held by a live handler
    victim.proc.send_signal(signal.SIGKILL)
    assert victim.wait_exit() == -signal.SIGKILL

    survivor = spawn("worker", name="survivor", pattern="jobs.#", config=CONFIG)
    survivor.wait_count("ready", 1)
    survivor.wait_count("done", 1, timeout=30)
    wait_until(
        lambda: not singles_on_disk(bus_root) and not claimed(bus_root), what="the job acknowledged"
    )
    assert survivor.stop() == 0, survivor.describe()
    assert counts([victim], "start") == {"job-1": 1}
    assert counts([survivor], "done") == {"job-1": 1}
