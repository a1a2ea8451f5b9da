"""The pool of handler workers (fsbus/_bus/jobs.py: JobQueue): how many run, and when."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from fsbus._bus.jobs import JobQueue

from .conftest import wait_until


def _recording() -> tuple[list[int], Callable[[int], Awaitable[None]]]:
    """A job that never waits, and the list of the arguments it ran with, in order."""
    ran: list[int] = []

    async def quick(i: int) -> None:
        ran.append(i)

    return ran, quick


async def _idle(jobs: JobQueue) -> None:
    await wait_until(lambda: len(jobs._idle) == jobs.workers)


@pytest.mark.anyio
async def test_a_burst_of_handlers_that_never_wait_wakes_one_worker_not_one_each() -> None:
    jobs = JobQueue()
    ran, quick = _recording()

    gate = anyio.Event()
    waiting = 0

    async def held() -> None:
        nonlocal waiting
        waiting += 1
        await gate.wait()

    async with anyio.create_task_group() as tg:
        jobs.start(tg, 16)
        for _ in range(4):  # four workers, each waiting in a handler, then all idle
            jobs.put((held, ()))
        await wait_until(lambda: waiting == 4)
        gate.set()
        await _idle(jobs)
        assert jobs.workers == 4
        idle_events = list(jobs._idle)
        for i in range(16):
            jobs.put((quick, (i,)))
        await _idle(jobs)
        # the first worker woken ran them all in order; the next one woken found the
        # queue empty, and the other two were never woken (still waiting on their Event)
        assert ran == list(range(16))
        assert jobs.workers == 4
        assert sum(1 for e in idle_events if e.is_set()) == 2
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_handlers_that_wait_run_side_by_side_up_to_the_limit() -> None:
    jobs = JobQueue()
    gate = anyio.Event()
    running = 0
    most = 0
    done = 0

    async def slow() -> None:
        nonlocal running, most, done
        running += 1
        most = max(most, running)
        await gate.wait()
        running -= 1
        done += 1

    async with anyio.create_task_group() as tg:
        jobs.start(tg, 8)
        for _ in range(12):
            jobs.put((slow, ()))
        await wait_until(lambda: running == 8)
        assert jobs.workers == 8  # the limit: the other four wait in the queue
        gate.set()
        await wait_until(lambda: done == 12)
        assert most == 8
        await _idle(jobs)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_jobs_queued_before_start_run_once_it_starts() -> None:
    jobs = JobQueue()
    ran, quick = _recording()

    for i in range(3):
        jobs.put((quick, (i,)))
    assert jobs.workers == 0
    async with anyio.create_task_group() as tg:
        jobs.start(tg, 4)
        await wait_until(lambda: len(ran) == 3)
        assert ran == [0, 1, 2]
        tg.cancel_scope.cancel()
