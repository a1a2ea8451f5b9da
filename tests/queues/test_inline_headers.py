"""Headers inside a queue's message files: one file a message in a queue's bus, the
main bus's sidecars left as qlobber-fsq peers need them, and a file whose inline headers
are damaged set aside while the rest of the queue is delivered."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fsbus import BlockingBus
from fsbus._bus.names import FLAG_INLINE, FLAG_META, parse_name
from fsbus._bus.queueing import QueueWriter

from .conftest import WAIT


def _queue_files(root: Path, queue: str) -> list[Path]:
    return sorted(p for p in (root / "fsbus/queues" / queue / "bus/messages").glob("*/*"))


def _flags(path: Path) -> int:
    fields = parse_name(path.name).fields
    assert fields is not None
    return fields.flags


@pytest.mark.parametrize("durable", [False, True])
def test_a_queue_copy_holds_its_headers_in_its_one_file(root: Path, durable: bool) -> None:
    headers = {"k": "v", "unicode": "é✓", "empty": ""}
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["orders.#"])
        bus.publish("orders.paid", b"payload", durable=durable, headers=headers, priority=7)
        bus.enqueue("q", "orders.direct", b"straight in", durable=durable, headers={"a": "b"})
        files = _queue_files(root, "q")
        assert len(files) == 2
        for f in files:
            assert _flags(f) == FLAG_INLINE
        # no sidecar in the queue's bus; the main bus keeps its own (peers read that one)
        assert not list((root / "fsbus/queues/q/bus/fsbus/meta").glob("*/*"))
        (main,) = (root / "messages").glob("*/*")
        assert _flags(main) == FLAG_META
        assert (root / "fsbus/meta" / main.parent.name / main.name).is_file()

        seen = {i.topic: i for i in bus.browse(queue="q")}
        assert seen["orders.paid"].headers == headers
        assert seen["orders.paid"].size == len(b"payload")
        assert seen["orders.paid"].priority == 7
        assert seen["orders.direct"].headers == {"a": "b"}
        infos = list(bus.browse(queue="q"))
        assert sorted(bus.read_payload(i) or b"" for i in infos) == [b"payload", b"straight in"]

        got = {}
        with bus.messages(queue="q") as it:
            for _ in range(2):
                msg = it.get(timeout=WAIT)
                got[msg.topic] = (msg.payload, dict(msg.headers), msg.priority)
                it.ack(msg)
        assert got == {
            "orders.paid": (b"payload", headers, 7),
            "orders.direct": (b"straight in", {"a": "b"}, bus.config.default_priority),
        }
        assert _queue_files(root, "q") == []


def test_a_message_without_headers_has_no_inline_flag(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["a.#"])
        bus.publish("a.b", b"x")
        (f,) = _queue_files(root, "q")
        assert _flags(f) == 0
        assert f.read_bytes() == b"\x00x"


def test_a_redelivered_copy_keeps_its_headers(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["a.#"])
        bus.publish("a.b", b"again", headers={"h": "1"})
        with bus.messages(queue="q") as it:
            first = it.get(timeout=WAIT)
            it.release(first)
            second = it.get(timeout=WAIT)
            assert (second.payload, dict(second.headers)) == (b"again", {"h": "1"})
            assert second.delivery_count == 2
            it.ack(second)


def test_a_damaged_inline_file_is_set_aside_and_the_rest_delivered(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["a.#"])
        bus.publish("a.bad", b"to be damaged", headers={"h": "1"}, priority=0)
        (bad,) = _queue_files(root, "q")
        # the length says more headers than the file holds
        bad.write_bytes(b"\x00" + (1000).to_bytes(4, "big") + b"{}")
        bus.publish("a.good", b"fine", headers={"h": "2"}, priority=9)
        with caplog.at_level(logging.WARNING, logger="fsbus"):
            with bus.messages(queue="q") as it:
                msg = it.get(timeout=WAIT)
                assert (msg.topic, msg.payload, dict(msg.headers)) == (
                    "a.good",
                    b"fine",
                    {"h": "2"},
                )
                it.ack(msg)
        assert not bad.exists()
        quarantined = list((root / "fsbus/queues/q/bus/fsbus/quarantine").iterdir())
        assert [p.name.endswith(bad.name) for p in quarantined] == [True]
        assert any("headers are inline" in r.getMessage() for r in caplog.records)
        assert bus.queue_info("q").depth == 0


def test_a_copy_named_again_keeps_its_flags_priority_and_expiry(root: Path) -> None:
    """The astronomically rare name clash: the copy's new name changes only its unique
    digits (and so its bucket), never what the name says about the message."""
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["a.#"])
        writer = QueueWriter(str(root / "fsbus/queues/q/bus"), bus.config)
        try:
            plan = writer.plan("a.b", ttl=60, durable=False, headers={"h": "1"}, priority=4)
            again = writer._replan(plan)
        finally:
            writer.close()
    assert again.name != plan.name
    assert again.name[:-12] == plan.name[:-12]
    assert (again.head, again.meta, again.expires_ms) == (plan.head, None, plan.expires_ms)
    fields = parse_name(again.name).fields
    assert fields is not None
    assert (fields.flags, fields.priority) == (FLAG_INLINE, 4)
    assert again.bucket == writer.layout.buckets[again.bucket_index]
