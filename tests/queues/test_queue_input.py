"""Durable queues given bad input: options out of range, corrupt or foreign entries in
fsbus/queues/, a planted symbolic link, a full disk under a declare."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsbus import BlockingBus, UsageError

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
