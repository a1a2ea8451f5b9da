"""The retry schedule and the contention wait (pure: the tests pass the clock in)."""

from __future__ import annotations

import pytest

from fsbus._bus.retry import Contention, RetrySchedule


def test_schedule_gives_back_only_what_fell_due_in_time_order() -> None:
    r = RetrySchedule()
    r.add((1, "b"), 2.0)
    r.add((0, "a"), 1.0)
    r.add((2, "c"), 3.0)
    assert r.next_due() == 1.0
    assert r.take_due(0.5) == []
    assert r.take_due(2.0) == [(0, "a"), (1, "b")]
    assert len(r) == 1
    assert r.next_due() == 3.0


def test_a_later_add_replaces_the_earlier_time() -> None:
    r = RetrySchedule()
    r.add((0, "a"), 1.0)
    r.add((0, "a"), 5.0)
    assert r.backing_off((0, "a"), 2.0)
    assert r.next_due() == 5.0  # the stale 1.0 entry is skipped
    assert r.take_due(2.0) == []
    assert r.take_due(5.0) == [(0, "a")]
    assert not r.backing_off((0, "a"), 2.0)
    assert r.next_due() is None


def test_backing_off_ends_at_its_time() -> None:
    r = RetrySchedule()
    r.add((3, "x"), 10.0)
    assert (3, "x") in r
    assert r.backing_off((3, "x"), 9.9)
    assert not r.backing_off((3, "x"), 10.0)
    assert not r.backing_off((3, "y"), 0.0)


def test_put_back_schedules_taken_items_again() -> None:
    r = RetrySchedule()
    r.add((0, "a"), 1.0)
    r.add((1, "b"), 1.0)
    due = r.take_due(1.0)
    assert sorted(due) == [(0, "a"), (1, "b")]
    r.put_back([k for k in due if k[0] == 1], 1.5)
    assert r.take_due(2.0) == [(1, "b")]


def test_many_items_fall_due_without_walking_the_rest() -> None:
    r = RetrySchedule()
    for i in range(10_000):
        r.add((i % 256, f"m{i}"), 100.0 + i)
    assert r.take_due(100.0) == [(0, "m0")]
    assert len(r) == 9_999
    assert r.next_due() == 101.0


def test_contention_waits_double_while_claims_are_lost_and_end_on_a_clean_round() -> None:
    c = Contention(first=0.001, most=0.004)
    assert not c.active
    assert not c.quiet(0.0)
    c.round(tried=8, lost=8, now=10.0)
    assert c.active
    assert c.quiet(10.0005)
    assert not c.quiet(10.001)
    c.round(tried=8, lost=6, now=11.0)
    assert c.until == pytest.approx(11.002)
    c.round(tried=8, lost=8, now=12.0)
    c.round(tried=8, lost=8, now=13.0)
    assert c.until == pytest.approx(13.004)  # capped at `most`
    # half lost or fewer: nothing changes (the wait runs out by itself)
    c.round(tried=8, lost=4, now=14.0)
    assert c.active
    assert c.until == pytest.approx(13.004)
    assert not c.quiet(14.0)
    # a clean round ends it, and the next wait starts again from `first`
    c.round(tried=8, lost=0, now=15.0)
    assert not c.active
    assert not c.quiet(15.0)
    c.round(tried=8, lost=8, now=16.0)
    assert c.until == pytest.approx(16.001)


def test_a_round_that_tried_nothing_changes_nothing() -> None:
    c = Contention()
    c.round(tried=0, lost=0, now=1.0)
    assert not c.active
    c.round(tried=4, lost=4, now=2.0)
    c.round(tried=0, lost=0, now=2.0005)
    assert c.active
    assert c.quiet(2.0005)
