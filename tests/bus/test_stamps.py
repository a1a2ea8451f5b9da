"""Stamps that say they are fsbus's, and carry a peer's they overwrote (fsbus._bus.stamps).

A router of queue consumers lists the main bus only for qlobber-fsq peers' messages; it
passes over a changed bucket whose stamp is fsbus's and carries no peer's.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest

from fsbus._bus import stamps
from fsbus._bus.scan import ScanState, decide
from fsbus._bus.stamps import CARRY_MS, fresh, peer_may_have_stamped, renew, tagged

NOW = 1_800_000_000_000


def clock(ms: int) -> Callable[[], float]:
    return lambda: ms / 1000


def noise(size: int = 32) -> bytes:
    return os.urandom(size)


def fsbus_stamp() -> bytes:
    return fresh(bytes(32), noise(), clock(NOW))


def test_a_stamp_over_an_unstamped_or_fsbus_slot_carries_nothing() -> None:
    first = fresh(bytes(32), noise(), clock(NOW))
    again = fresh(first, noise(), clock(NOW))
    assert not peer_may_have_stamped(first)
    assert not peer_may_have_stamped(again)
    assert len(first) == len(again) == 32
    assert first != again  # every stamp is new: watchers compare them


def test_a_peers_stamp_is_carried_from_when_it_was_seen_and_for_carry_ms_only() -> None:
    peer = noise()
    assert peer_may_have_stamped(peer)
    carried = fresh(peer, noise(), clock(NOW))
    assert peer_may_have_stamped(carried)
    later = fresh(carried, noise(), clock(NOW + CARRY_MS - 1))
    assert peer_may_have_stamped(later)
    assert stamps._carried_since(later) == NOW  # (since the first sight, not the last)
    done = fresh(later, noise(), clock(NOW + CARRY_MS))
    assert not peer_may_have_stamped(done)


def test_a_stamp_of_random_bytes_is_never_taken_for_fsbuss() -> None:
    rng = random.Random(7)
    assert all(peer_may_have_stamped(rng.randbytes(32)) for _ in range(10_000))


def test_a_stamp_changed_anywhere_is_a_peers_again() -> None:
    stamp = bytearray(fsbus_stamp())
    for at in (0, 5, 20, 31):
        damaged = bytearray(stamp)
        damaged[at] ^= 1
        assert peer_may_have_stamped(bytes(damaged))


@pytest.mark.parametrize("size", [0, 8, 16, 23])
def test_stamps_too_small_for_a_tag_are_not_tagged(size: int) -> None:
    assert not tagged(size)
    assert peer_may_have_stamped(bytes(size))


def test_stamps_of_the_smallest_tagged_size_still_differ_each_time() -> None:
    size = stamps.TAGGED_FROM
    assert tagged(size)
    seen = {fresh(bytes(size), noise(size), clock(NOW)) for _ in range(2000)}
    assert len(seen) == 2000
    carried = fresh(noise(size), noise(size), clock(NOW))
    assert peer_may_have_stamped(carried)
    assert len({fresh(carried, noise(size), clock(NOW)) for _ in range(2000)}) == 2000


def test_renewing_a_whole_file_keeps_what_each_slot_said() -> None:
    size = 32
    slots = [fsbus_stamp(), noise(), bytes(32), fresh(noise(), noise(), clock(NOW))]
    before = b"".join(slots)
    after = renew(before, noise(len(before)), size, NOW / 1000)
    assert len(after) == len(before)
    parts = [after[i : i + size] for i in range(0, len(after), size)]
    assert [peer_may_have_stamped(p) for p in parts] == [False, True, False, True]
    assert all(a != b for a, b in zip(parts, slots, strict=True))


def test_renewing_a_short_file_fills_it_with_fsbus_stamps() -> None:
    after = renew(b"", noise(64), 32, NOW / 1000)
    assert len(after) == 64
    assert not peer_may_have_stamped(after[:32])
    assert not peer_may_have_stamped(after[32:])


def test_a_routers_first_listing_after_a_subscription_came_leaves_older_messages_present() -> None:
    """In the buckets a router passed over by their stamps (its last listing of them is
    older than the subscription), a multi message published before the subscription came
    (``cut``) is present, not new; one published after it, or a peer's (its name gives
    no time), is new. Other buckets are as ever."""
    from .test_scan import name, peer_name

    before = name("a.b", published=NOW - 5, rand="000000000001")
    after = name("a.b", published=NOW, rand="000000000002")
    elsewhere = name("a.b", published=NOW - 5, rand="000000000003")
    peer = peer_name("a.b")
    state = ScanState()
    decide(state, {0: [], 1: []}, {}, NOW, baseline=True)
    d = decide(
        state, {0: [before, after, peer], 1: [elsewhere]}, {}, NOW, cut=(frozenset({0}), NOW)
    )
    assert {e.name for e in d.new_multi} == {after, peer, elsewhere}
    assert {e.name for e in d.present_multi} == {before, after, peer, elsewhere}
