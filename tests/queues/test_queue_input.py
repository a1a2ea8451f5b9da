"""Durable queues given bad input: options out of range, corrupt or foreign entries in
fsbus/queues/, a planted symbolic link, a full disk under a declare."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fsbus import BlockingBus, QueueMismatch, QueueNotFound, UsageError

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("option", "value"),
    [("message_ttl", NAN), ("message_ttl", INF), ("expires", NAN), ("expires", INF)],
)
def test_out_of_range_options_are_refused_on_declare(root: Path, option: str, value: float) -> None:
    with BlockingBus(root) as bus:
        with pytest.raises(
            UsageError,
            match=rf"^{option} must be a positive number of seconds \(finite, more than 0\)",
        ) as err:
            bus.declare_queue("q", ["e.#"], **{option: value})
        assert repr(value) in str(err.value)
        assert bus.queues() == []
        bus.publish("e.1", b"no queue took this")  # (a NaN ttl broke every publish)
        bus.declare_queue("q", ["e.#"], message_ttl=60, expires=3600, max_length=5)
        bus.publish("e.2", b"routed")
        assert bus.queue_info("q").depth == 1


@pytest.mark.parametrize("value", ["e.#", {"e.#": 1}])
def test_bindings_that_are_not_a_list_of_strings_are_quarantined(
    root: Path, caplog: pytest.LogCaptureFixture, value: object
) -> None:
    """A string (or an object) of bindings was iterated: "e.#" bound e, . and #."""
    with BlockingBus(root) as bus:
        bus.declare_queue("bad", ["x.only"])
    definition = root / "fsbus" / "queues" / "bad" / "queue.json"
    doc = json.loads(definition.read_bytes())
    doc["bindings"] = value
    definition.write_text(json.dumps(doc))
    caplog.set_level(logging.WARNING, logger="fsbus")
    with BlockingBus(root) as bus:
        bus.publish("e.anything", b"would be collected by the bindings e, . and #")
        assert bus.queues() == []
        with pytest.raises(QueueNotFound):
            bus.queue_info("bad")
    assert not definition.exists()
    assert len(list((root / "fsbus" / "quarantine").glob("*queue-bad.json"))) == 1
    warnings = [r.getMessage() for r in caplog.records if "corrupt definition" in r.getMessage()]
    assert len(warnings) == 1
    assert "bad bindings" in warnings[0]


def test_a_nan_ttl_written_in_a_definition_is_quarantined(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("bad", ["e.#"], message_ttl=5)
    definition = root / "fsbus" / "queues" / "bad" / "queue.json"
    definition.write_text(definition.read_text().replace('"message_ttl": 5', '"message_ttl": NaN'))
    caplog.set_level(logging.WARNING, logger="fsbus")
    with BlockingBus(root) as bus:
        bus.publish("e.1", b"publishes go on")
        assert bus.queues() == []
    assert "message_ttl" in " ".join(r.getMessage() for r in caplog.records)


def test_the_api_mismatch_says_which_side_was_asked(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["a"], max_length=10)
        with pytest.raises(QueueMismatch) as err:
            bus.declare_queue("q", ["a"], max_length=5)
    assert "max_length: asked 5, the queue has 10" in str(err.value)
