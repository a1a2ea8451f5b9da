"""Durable queues on the dashboard: the overview's Queues table and ``/api/overview``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fsbus import BlockingBus, BusConfig
from fsbus.ui import UiServer

from .conftest import TOKEN, fetch

WAIT = 30.0

FLOCK = BusConfig(locking="flock")
"""Consumers that claim by flock: a copy they hold stays in its bucket, locked, so it
still counts in the depth and has not left the queue."""


def _wait_until(check: Callable[[], bool]) -> None:
    """Poll a counter until it holds, or fail the test (a counter has no event)."""
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_no_queues_is_said_plainly(ui: UiServer) -> None:
    page = fetch(ui.url)
    assert page.status == 200
    assert "<h2>Queues</h2>" in page.body
    assert "No durable queues." in page.body
    data = fetch(ui.url + "api/overview").json()
    assert isinstance(data, dict)
    assert data["queues"] == []


def test_queues_table_shows_bindings_depth_and_consumers(ui: UiServer) -> None:
    with BlockingBus(ui.bus.root, config=FLOCK) as bus:
        bus.declare_queue("billing", ["orders.*", "refunds.#"])
        bus.declare_queue("idle", ["nothing.here"])
        for i in range(3):
            bus.publish("orders.created", str(i))
        bus.publish("refunds.eu.paid", "r")
        with bus.messages(queue="billing") as it:
            held = it.get(timeout=WAIT)  # a live consumer holding one copy
            data = fetch(ui.url + "api/overview").json()
            page = fetch(ui.url)
            it.release(held)
    assert isinstance(data, dict)
    assert data["queues"] == [
        {
            "name": "billing",
            "bindings": ["orders.*", "refunds.#"],
            "depth": 4,
            "consumers": 1,
            "rate_in": None,  # one snapshot so far: no rates yet
            "rate_out": None,
        },
        {
            "name": "idle",
            "bindings": ["nothing.here"],
            "depth": 0,
            "consumers": 0,
            "rate_in": None,
            "rate_out": None,
        },
    ]
    # the bus's own messages are counted as before: the queue copies are not in them
    assert data["messages"] == 9 + 4
    assert "No durable queues." not in page.body
    row = page.body.split("<td><code>billing</code></td>", 1)[1].split("</tr>", 1)[0]
    assert "<code>orders.*</code> <code>refunds.#</code>" in row
    assert '<td class="num">4</td><td class="num">1</td>' in row
    assert '<div class="n">2</div><div class="l">queues</div>' in page.body


def test_queue_rates_count_copies_in_and_out_between_snapshots(bus_root: Path) -> None:
    clock = [1000.0]
    with BlockingBus(bus_root) as bus:
        bus.declare_queue("billing", ["orders.*"])
        bus.declare_queue("shipping", ["orders.#"])
        for i in range(3):
            bus.publish("orders.created", f"old-{i}")
    with UiServer(str(bus_root), port=0, token=TOKEN) as server:
        server.dashboard._clock = lambda: clock[0]
        first = server.dashboard.snapshot()
        assert first.rate_window is None
        assert {q.name: (q.depth, q.rate_in, q.rate_out) for q in first.queues} == {
            "billing": (3, None, None),
            "shipping": (3, None, None),
        }
        with BlockingBus(bus_root, config=FLOCK) as bus:
            for i in range(4):
                bus.publish("orders.created", f"new-{i}")  # into both queues
            bus.publish("orders.eu.created", "deep")  # shipping only
            with bus.messages(queue="billing") as it:
                for _ in range(2):  # the two oldest copies leave billing
                    msg = it.get(timeout=WAIT)
                    assert msg.text().startswith("old-")
                    it.ack(msg)
                # an ack unlinks its copy in the bus's next finishing batch, just after
                # ack() returns: the snapshot comes once both are done
                _wait_until(lambda: bus.statistics().acked == 2)
                clock[0] += 2.0
                second = server.dashboard.snapshot()
    assert second.rate_window == 2.0
    rows = {q.name: q for q in second.queues}
    assert (rows["billing"].depth, rows["billing"].consumers) == (5, 1)
    assert (rows["billing"].rate_in, rows["billing"].rate_out) == (2.0, 1.0)  # 4 in, 2 out
    assert (rows["shipping"].depth, rows["shipping"].consumers) == (8, 0)
    assert (rows["shipping"].rate_in, rows["shipping"].rate_out) == (2.5, 0.0)  # 5 in


def test_a_deleted_queue_leaves_the_table(bus_root: Path) -> None:
    clock = [1000.0]
    with BlockingBus(bus_root) as bus:
        bus.declare_queue("brief", ["orders.*"])
        bus.publish("orders.created", "x")
    with UiServer(str(bus_root), port=0, token=TOKEN) as server:
        server.dashboard._clock = lambda: clock[0]
        assert [q.name for q in server.dashboard.snapshot().queues] == ["brief"]
        with BlockingBus(bus_root) as bus:
            bus.delete_queue("brief")
        clock[0] += 2.0
        assert server.dashboard.snapshot().queues == ()


def test_bindings_are_escaped(ui: UiServer) -> None:
    with BlockingBus(ui.bus.root) as bus:
        bus.declare_queue("q", ["x.<script>alert(1)</script>"])
    page = fetch(ui.url)
    assert "<script>alert(1)</script>" not in page.body
    assert "<code>x.&lt;script&gt;alert(1)&lt;/script&gt;</code>" in page.body
