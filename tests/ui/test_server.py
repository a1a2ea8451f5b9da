"""The dashboard over real HTTP, on a real bus, with real lock holders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest

from fsbus import BlockingBus, Stream, StreamConfig
from fsbus.ui import UiServer

from .conftest import TOKEN, fetch


def _count(root: Path, pattern: str = "#") -> tuple[int, int]:
    """(multi, single) messages on the bus now."""
    with BlockingBus(root) as bus:
        infos = list(bus.browse(pattern))
    return sum(1 for i in infos if not i.single), sum(1 for i in infos if i.single)


def test_overview_shows_topics_and_counts(ui: UiServer) -> None:
    page = fetch(ui.url)
    assert page.status == 200
    assert page.headers["Content-Type"].startswith("text/html")
    for text in ("orders.created", "jobs.resize", "blobs.raw", "Work queue", "Buckets"):
        assert text in page.body
    assert page.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]


def test_api_overview_counts_every_message(ui: UiServer) -> None:
    data = fetch(ui.url + "api/overview").json()
    assert isinstance(data, dict)
    assert data["messages"] == 9
    assert data["singles"] == 3
    topics = {t["topic"]: (t["multi"], t["single"], t["size"]) for t in data["topics"]}
    assert topics == {
        "orders.created": (5, 0, sum(len(json.dumps({"id": i})) for i in range(5))),
        "jobs.resize": (0, 3, 3 * len("img-0.png")),
        "blobs.raw": (1, 0, 256),
    }
    assert sum(b["messages"] for b in data["buckets"]) == 9
    assert data["locked"] == []


def test_rates_count_arrivals_between_snapshots(bus_root: Path) -> None:
    clock = [1000.0]
    with UiServer(str(bus_root), port=0, token=TOKEN) as server:
        server.dashboard._clock = lambda: clock[0]
        first = server.dashboard.snapshot()
        assert first.rate_window is None
        with BlockingBus(bus_root) as bus:
            for i in range(4):
                bus.publish("orders.created", str(i))
        clock[0] += 2.0
        second = server.dashboard.snapshot()
    assert second.rate_window == 2.0
    rows = {t.topic: t for t in second.topics}
    assert rows["orders.created"].rate_in == 2.0  # 4 new messages in 2 s
    assert rows["orders.created"].rate_out == 0.0
    assert rows["jobs.resize"].rate_in == 0.0


def test_topic_and_message_pages(ui: UiServer) -> None:
    topic = fetch(ui.url + "topic?" + urlencode({"t": "orders.created"}))
    assert topic.status == 200
    assert topic.body.count('href="/message?') == 5
    with BlockingBus(ui.bus.root) as bus:
        info = next(bus.browse("orders.created"))
        blob = next(bus.browse("blobs.raw"))
    msg = fetch(ui.url + "message?" + urlencode({"bucket": info.bucket, "name": info.name}))
    assert msg.status == 200
    assert "source" in msg.body
    assert "shop" in msg.body
    assert "{&quot;id&quot;: " in msg.body  # the JSON payload, escaped
    binary = fetch(ui.url + "message?" + urlencode({"bucket": blob.bucket, "name": blob.name}))
    assert "hex dump" in binary.body
    assert "00000000  00 01 02 03" in binary.body
    gone = fetch(ui.url + "message?" + urlencode({"bucket": info.bucket, "name": "nope"}))
    assert gone.status == 404
    assert "consumed or has expired" in gone.body


def test_markup_in_topics_and_payloads_is_escaped(ui: UiServer) -> None:
    with BlockingBus(ui.bus.root) as bus:
        info = bus.publish("x.<script>alert(1)</script>", "<b>bold</b>")
    page = fetch(ui.url)
    assert "<script>alert(1)</script>" not in page.body
    assert "x.&lt;script&gt;" in page.body
    msg = fetch(ui.url + "message?" + urlencode({"bucket": info.bucket, "name": info.name}))
    assert "&lt;b&gt;bold&lt;/b&gt;" in msg.body


def test_foreign_host_header_is_refused(ui: UiServer) -> None:
    evil = fetch(ui.url, headers={"Host": f"attacker.example:{ui.port}"})
    assert evil.status == 421
    assert fetch(ui.url, headers={"Host": f"localhost:{ui.port}"}).status == 200


def test_purge_needs_the_token_and_loses_nothing_without_it(ui: UiServer) -> None:
    form = urlencode({"pattern": "jobs.#", "confirm": "jobs.#", "token": "wrong"}).encode()
    refused = fetch(ui.url + "purge", method="POST", data=form)
    assert refused.status == 403
    assert "access token" in refused.body
    api = fetch(
        ui.url + "api/purge",
        method="POST",
        data=json.dumps({"pattern": "jobs.#"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert api.status == 403
    assert _count(Path(ui.bus.root)) == (6, 3)


def test_purge_needs_confirmation(ui: UiServer) -> None:
    form = urlencode({"pattern": "jobs.#", "confirm": "jobs", "token": TOKEN}).encode()
    unconfirmed = fetch(ui.url + "purge", method="POST", data=form)
    assert unconfirmed.status == 400
    assert "nothing was deleted" in unconfirmed.body
    assert _count(Path(ui.bus.root)) == (6, 3)


def test_cross_site_post_is_refused(ui: UiServer) -> None:
    form = urlencode({"pattern": "jobs.#", "confirm": "jobs.#", "token": TOKEN}).encode()
    crossed = fetch(
        ui.url + "purge", method="POST", data=form, headers={"Origin": "https://evil.example"}
    )
    assert crossed.status == 403
    assert _count(Path(ui.bus.root)) == (6, 3)


def test_confirmed_purge_consumes_the_work_queue_only(ui: UiServer) -> None:
    ask = fetch(ui.url + "purge?" + urlencode({"pattern": "#"}))
    assert ask.status == 200
    assert "<b>3</b> waiting work-queue messages" in ask.body
    assert "6 multi message(s) are not purged" in ask.body
    assert 'type="password" name="token"' in ask.body  # no cookie: the form asks for it
    form = urlencode({"pattern": "#", "confirm": "#", "token": TOKEN}).encode()
    done = fetch(ui.url + "purge", method="POST", data=form)
    assert done.status == 200
    assert "3 work-queue messages consumed and deleted" in done.body
    assert _count(Path(ui.bus.root)) == (6, 0)


def test_login_link_sets_a_cookie_that_fills_the_purge_form(ui: UiServer) -> None:
    assert fetch(ui.url + "?token=wrong").status == 403
    login = fetch(ui.login_url)
    assert login.status == 303
    cookie = login.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    ask = fetch(
        ui.url + "purge?" + urlencode({"pattern": "jobs.#"}),
        headers={"Cookie": cookie.split(";")[0]},
    )
    assert f'name="token" value="{TOKEN}"' in ask.body


def test_bad_pattern_is_a_clear_400(ui: UiServer) -> None:
    bad = fetch(ui.url + "purge?" + urlencode({"pattern": "a\x01b"}))
    assert bad.status == 400
    assert "pattern" in bad.body


WORKER = """
import sys
from fsbus import BlockingBus, BusConfig

# One handler at a time: the worker claims (locks) a single message, not the whole queue.
config = BusConfig(handler_concurrency=1)
with BlockingBus(sys.argv[1], config=config) as bus, bus.messages("jobs.*", existing=True) as it:
    msg = it.get(timeout=60)
    print(msg.name, flush=True)
    sys.stdin.readline()  # hold the message (and its lock) until the test is done
"""


def test_locked_message_shows_its_holder_and_survives_a_purge(ui: UiServer) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", WORKER, ui.bus.root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        try:
            assert worker.stdout is not None
            held = worker.stdout.readline().strip()
            assert held, "the worker got no message"
            data = fetch(ui.url + "api/overview").json()
            assert isinstance(data, dict)
            [row] = data["locked"]
            assert row["info"]["name"] == held
            assert row["owner"].startswith(f"pid {worker.pid} ")
            page = fetch(ui.url)
            assert f"pid {worker.pid}" in page.body

            result = fetch(
                ui.url + "api/purge",
                method="POST",
                data=json.dumps({"pattern": "jobs.#"}).encode(),
                headers={"X-Fsbus-Token": TOKEN},
            ).json()
            assert result == {"pattern": "jobs.#", "purged": 2, "locked": 1, "multi": 0}
        finally:
            worker.kill()
    # The killed worker's lock is gone; its message is still there for someone else.
    with BlockingBus(ui.bus.root) as bus:
        left = [(i.name, i.locked) for i in bus.browse("jobs.#")]
    assert left == [(held, False)]


def test_streams_show_segments_and_group_lag(ui: UiServer) -> None:
    config = StreamConfig(group_partitions=1)
    with Stream.open(ui.bus.root, "clicks", config=config) as stream:
        stream.append_batch([f"click-{i}" for i in range(10)])
        group = stream.group("reporting")
        try:
            assert len(group.poll(max_records=4)) == 4
            group.commit()
        finally:
            group.close()
    data = fetch(ui.url + "api/overview").json()
    assert isinstance(data, dict)
    [row] = data["streams"]
    assert (row["name"], row["start_offset"], row["end_offset"], row["records"]) == (
        "clicks",
        0,
        10,
        10,
    )
    assert len(row["segments"]) >= 1
    [g] = row["groups"]
    assert (g["name"], g["committed"], g["lag"], g["partitions"]) == ("reporting", 4, 6, 1)
    page = fetch(ui.url)
    assert "<code>reporting</code>: lag <b>6</b>" in page.body


def test_big_topics_and_payloads_are_cut_short(
    ui: UiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fsbus.ui._server.MAX_TOPIC_ROWS", 2)
    monkeypatch.setattr("fsbus.ui._snapshot.MAX_PAYLOAD_READ", 100)
    topic = fetch(ui.url + "topic?" + urlencode({"t": "orders.created"}))
    assert topic.body.count('href="/message?') == 2
    assert "The first 2 of 5 messages are listed." in topic.body
    with BlockingBus(ui.bus.root) as bus:
        blob = next(bus.browse("blobs.raw"))
    page = fetch(ui.url + "message?" + urlencode({"bucket": blob.bucket, "name": blob.name}))
    assert page.status == 200
    assert "Not shown: the payload is 256 bytes" in page.body
