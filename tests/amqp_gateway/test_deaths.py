"""The properties of a dead-lettered message (fsbus.amqp._deaths), the pure part."""

from __future__ import annotations

import datetime

from pamqp import commands as spec

from fsbus.amqp._deaths import dead_lettered
from fsbus.amqp._frames import decode_properties


def test_each_queue_and_reason_has_one_entry_latest_first() -> None:
    props = spec.Basic.Properties(headers={"app": 1}, expiration="500", priority=3)
    once = dead_lettered(
        props, queue="a", reason="rejected", exchange="ex", routing_keys=["k"], now=1e9
    )
    assert props.headers == {"app": 1}  # not changed
    assert props.expiration == "500"
    assert once.expiration is None
    assert once.priority == 3
    assert once.headers is not None
    assert once.headers["x-death"] == [
        {
            "count": 1,
            "reason": "rejected",
            "queue": "a",
            "time": datetime.datetime.fromtimestamp(1e9, tz=datetime.UTC),
            "exchange": "ex",
            "routing-keys": ["k"],
            "original-expiration": "500",
        }
    ]
    twice = dead_lettered(
        once, queue="b", reason="expired", exchange="dlx", routing_keys=["k2"], now=2e9
    )
    thrice = dead_lettered(
        twice, queue="a", reason="rejected", exchange="dlx", routing_keys=["k3"], now=3e9
    )
    assert thrice.headers is not None
    deaths = thrice.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        ("a", "rejected", 2),
        ("b", "expired", 1),
    ]
    # the first death's headers stay; the last death's follow
    assert {k: v for k, v in thrice.headers.items() if k.startswith("x-") and "death-" in k} == {
        "x-first-death-queue": "a",
        "x-first-death-reason": "rejected",
        "x-first-death-exchange": "ex",
        "x-last-death-queue": "a",
        "x-last-death-reason": "rejected",
        "x-last-death-exchange": "dlx",
    }
    assert thrice.headers["app"] == 1


def test_the_result_marshals_and_reads_back() -> None:
    empty = spec.Basic.Properties()
    out = dead_lettered(empty, queue="q", reason="rejected", exchange="", routing_keys=["q"], now=0)
    back = decode_properties(out.marshal())
    assert back.headers is not None
    assert back.headers["x-death"][0]["queue"] == "q"
    assert back.headers["x-death"][0]["count"] == 1
