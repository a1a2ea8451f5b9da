"""The poller's schedule (pure): idle period, and faster polling while messages come
(where polling is how changes are seen; beside inotify, the period only)."""

from __future__ import annotations

import pytest

from fsbus._core.watch import BUSY_FACTOR, BUSY_SECONDS, poll_delay


def test_an_idle_bus_polls_at_its_period() -> None:
    assert poll_delay(0.02, None) == 0.02  # nothing seen yet
    assert poll_delay(0.02, BUSY_SECONDS) == 0.02  # the last change is a second old
    assert poll_delay(0.02, 3600.0) == 0.02


@pytest.mark.parametrize("since", [0.0, 0.001, BUSY_SECONDS / 2, BUSY_SECONDS * 0.999])
def test_after_a_change_it_polls_faster_for_a_while(since: float) -> None:
    assert poll_delay(0.02, since) == pytest.approx(0.02 / BUSY_FACTOR)
    assert poll_delay(1.0, since) == pytest.approx(1.0 / BUSY_FACTOR)  # an explicit period too


def test_a_clock_that_went_back_does_not_keep_it_busy() -> None:
    assert poll_delay(0.02, -5.0) == 0.02


@pytest.mark.parametrize("since", [None, 0.0, BUSY_SECONDS / 2, 3600.0])
def test_beside_inotify_it_polls_at_its_period_only(since: float | None) -> None:
    assert poll_delay(0.1, since, hurry=False) == 0.1
