"""An idle bus stays off its event loop.

A thread reads UPDATE every ``poll_interval`` and wakes the scanner only when a stamp
changed; the scanner itself looks about once a second. The thread is how other hosts
are seen where polling is all there is (``force_polling``, network filesystems), and the
safety net beside inotify: a stamp inotify did not report is still seen at the next tick.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from watchdog.observers.inotify_c import inotify_rm_watch

from fsbus import BlockingBus, Bus, BusConfig, Message
from fsbus._bus import engine

from .conftest import Inbox

TICK = BusConfig(poll_interval=0.05)


@pytest.mark.anyio
async def test_an_idle_subscriber_scans_about_once_a_second(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root, config=TICK) as bus:
        await bus.subscribe("x.#", inbox)
        with BlockingBus(root) as peer:
            peer.publish("x.first", b"1")
        await inbox.wait_for(1)  # scanning, and past the first listings
        before = bus.statistics().scans
        await anyio.sleep(3)  # an idle spell: nothing is published
        scans = bus.statistics().scans - before
    # at most one a second and the odd extra (it scanned every tick before: 60)
    assert scans <= 6


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["force_polling", "inotify missed it"])
async def test_a_stamp_is_seen_by_the_poll_when_inotify_does_not_report_it(
    root: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the scanner's own look and the full listings are far off: only the poll finds it
    monkeypatch.setattr(engine, "_POLLED_SCAN_EVERY", 3600.0)
    config = TICK.model_copy(
        update={"refresh_ttl": 3600.0, "force_polling": how == "force_polling"}
    )
    inbox = Inbox()
    async with Bus(root, config=config) as bus:
        await bus.subscribe("x.#", inbox)
        waker = bus._waker
        if how == "force_polling":
            assert not waker.inotify_active
        else:
            assert waker.inotify_active
            assert waker._fd is not None
            assert inotify_rm_watch(waker._fd, 1) == 0  # its only watch: events stop
        with BlockingBus(root) as peer:
            for i in range(3):
                peer.publish(f"x.{i}", str(i))
                with anyio.fail_after(10):
                    await inbox.wait_for(i + 1)
    assert [m.payload for m in inbox.messages] == [b"0", b"1", b"2"]


@pytest.mark.anyio
async def test_a_late_consumer_takes_the_work_behind_what_others_hold(root: Path) -> None:
    """Another consumer holds the oldest work-queue messages (handlers that do not
    finish). One that comes later loses its claims on those, and takes one of the
    messages behind them at once: it used to try the held ones again and again, each
    time they came due, and took another only at a poll tick that an idle bus no longer
    has."""
    with BlockingBus(root) as pub:
        for i in range(40):
            pub.publish(f"jobs.{i % 5}", f"job-{i}", single=True)
    release = anyio.Event()
    held = Inbox()

    async def hold(msg: Message) -> None:
        await held(msg)
        await release.wait()

    async with Bus(root, config=BusConfig(handler_concurrency=6)) as holder:
        await holder.subscribe("jobs.#", hold, kind="single")
        await held.wait_for(6)
        async with (
            Bus(root, config=BusConfig(handler_concurrency=1)) as late,
            late.messages("jobs.#", kind="single") as it,
        ):
            with anyio.fail_after(10):
                msg = await it.__anext__()
            await it.ack(msg)
        release.set()
    assert msg.payload not in held.payloads
    assert msg.delivery_count == 1
