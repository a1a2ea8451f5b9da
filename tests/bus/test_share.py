"""The split of a queue's buckets among its consumers (fsbus/_bus/share.py), pure."""

from __future__ import annotations

from fsbus._bus.share import DEFER_MOST, Share, share_of


def test_live_consumers_split_the_buckets_with_nothing_left_over() -> None:
    live = ["c", "a", "d", "b"]
    shares = [share_of(live, {name}, 16) for name in live]
    assert all(s is not None and len(s) == 4 for s in shares)
    every = [b for s in shares if s is not None for b in s]
    assert sorted(every) == list(range(16))
    # by position in the sorted names: "a" takes 0, 4, 8, 12
    assert share_of(live, {"a"}, 16) == frozenset({0, 4, 8, 12})


def test_two_consumers_in_one_process_take_both_their_parts() -> None:
    assert share_of(["a", "b", "c"], {"a", "c"}, 6) == frozenset({0, 2, 3, 5})


def test_no_share_alone_or_without_a_consumer_here() -> None:
    assert share_of(["a"], {"a"}, 16) is None
    assert share_of(["a", "b"], {"a", "b"}, 16) is None  # (every consumer is here)
    assert share_of([], {"a"}, 16) is None  # (its own file counts even before it is seen)
    assert share_of(["a", "b"], set(), 16) is None


def test_more_consumers_than_buckets_leaves_some_without_a_part() -> None:
    live = [f"c{i:02}" for i in range(20)]
    assert share_of(live, {"c19"}, 16) == frozenset()
    assert share_of(live, {"c00"}, 16) == frozenset({0})


def test_without_a_share_every_changed_bucket_is_listed() -> None:
    share = Share()
    assert share.split({1, 2, 3}, set(), steal=False, now=0.0) == ({1, 2, 3}, set(), set())


def test_a_busy_consumer_puts_off_the_others_buckets_but_lists_its_retries() -> None:
    share = Share()
    share.mine = frozenset({0, 2})
    listed, put_off, others = share.split({0, 1, 2, 3}, keep={3}, steal=False, now=10.0)
    assert (listed, put_off, others) == ({0, 2, 3}, {1}, set())
    share.note(listed, put_off, 10.0)
    assert share.deferred == {1}
    assert share.deadline() == 10.0 + DEFER_MOST


def test_an_idle_consumer_lists_what_it_put_off_and_takes_all_it_holds() -> None:
    share = Share()
    share.mine = frozenset({0, 2})
    listed, put_off, _ = share.split({1, 3}, keep=set(), steal=False, now=10.0)
    share.note(listed, put_off, 10.0)
    listed, put_off, others = share.split({0}, keep=set(), steal=True, now=10.1)
    assert (listed, put_off, others) == ({0, 1, 3}, set(), {1, 3})
    share.note(listed, put_off, 10.1)
    assert share.deferred == set()
    assert share.deadline() is None


def test_changes_put_off_are_listed_by_their_deadline_however_busy() -> None:
    share = Share()
    share.mine = frozenset({0})
    listed, put_off, _ = share.split({1}, keep=set(), steal=False, now=10.0)
    share.note(listed, put_off, 10.0)
    # later changes keep the oldest deadline
    listed, put_off, _ = share.split({2}, keep=set(), steal=False, now=10.5)
    share.note(listed, put_off, 10.5)
    assert share.deferred == {1, 2}
    assert share.deadline() == 10.0 + DEFER_MOST
    listed, put_off, others = share.split(set(), keep=set(), steal=False, now=10.0 + DEFER_MOST)
    assert (listed, put_off, others) == ({1, 2}, set(), {1, 2})


def test_losing_the_share_lists_everything_put_off() -> None:
    share = Share()
    share.mine = frozenset({0})
    listed, put_off, _ = share.split({1, 2}, keep=set(), steal=False, now=10.0)
    share.note(listed, put_off, 10.0)
    share.mine = None  # the other consumers left
    assert share.split({0}, keep=set(), steal=False, now=10.1) == ({0, 1, 2}, set(), {1, 2})
