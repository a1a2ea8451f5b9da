"""Scan decisions (pure): new vs seen, expired, foreign, work items, baseline, spills."""

from __future__ import annotations

from fsbus._bus.names import FsbusFields, encode_fields, encode_topic, make_name
from fsbus._bus.scan import Entry, ScanState, decide, is_own_short, long_names, sweep_due

NOW = 1_800_000_000_000


def by_rank(e: Entry) -> int:
    return e.rank


def name(
    topic: str,
    *,
    single: bool = False,
    expires: int = NOW + 60_000,
    priority: int = 50,
    published: int = NOW,
    rand: str = "000000000000",
    split_at: int = 200,
) -> str:
    fields = FsbusFields(flags=0, priority=priority, published_ms=published, host="aaaaaa")
    n, _ = make_name(
        encode_topic(topic),
        split_at=split_at,
        expires_ms=expires,
        kind="s" if single else "m",
        unique=encode_fields(fields, rand),
    )
    return n


def topics(entries: list) -> list[str]:  # type: ignore[type-arg]
    return [e.topic for e in entries]


def test_first_listing_without_baseline_is_all_new() -> None:
    st = ScanState()
    d = decide(st, {0: [name("a"), name("b")]}, {}, NOW)
    assert sorted(topics(d.new_multi)) == ["a", "b"]
    assert sorted(topics(d.present_multi)) == ["a", "b"]


def test_baseline_marks_nothing_new_but_everything_present() -> None:
    st = ScanState()
    d = decide(st, {0: [name("a")], 1: [name("b")]}, {}, NOW, baseline=True)
    assert d.new_multi == []
    assert sorted(topics(d.present_multi)) == ["a", "b"]


def test_seen_names_are_not_new_again() -> None:
    st = ScanState()
    a, b = name("a"), name("b")
    decide(st, {0: [a]}, {}, NOW, baseline=True)
    d = decide(st, {0: [a, b]}, {}, NOW)
    assert topics(d.new_multi) == ["b"]
    d = decide(st, {0: [a, b]}, {}, NOW)
    assert d.new_multi == []


def test_bucket_not_listed_keeps_its_memory() -> None:
    st = ScanState()
    a = name("a")
    decide(st, {0: [a]}, {}, NOW, baseline=True)
    decide(st, {1: []}, {}, NOW)  # another bucket listed
    d = decide(st, {0: [a]}, {}, NOW)
    assert d.new_multi == []


def test_a_name_that_left_and_came_back_is_new() -> None:
    st = ScanState()
    a = name("a")
    decide(st, {0: [a]}, {}, NOW, baseline=True)
    decide(st, {0: []}, {}, NOW)
    assert (0, a) not in st.parsed  # cache forgets what is gone
    d = decide(st, {0: [a]}, {}, NOW)
    assert topics(d.new_multi) == ["a"]


def test_expired_when_expiry_is_now_or_before() -> None:
    st = ScanState()
    gone = name("old", expires=NOW)
    live = name("live", expires=NOW + 1)
    d = decide(st, {0: [gone, live]}, {}, NOW)
    assert topics(d.expired) == ["old"]
    assert topics(d.new_multi) == ["live"]
    assert topics(d.present_multi) == ["live"]


def test_expired_singles_are_not_work() -> None:
    d = decide(ScanState(), {0: [name("j", single=True, expires=NOW - 1)]}, {}, NOW)
    assert topics(d.expired) == ["j"]
    assert d.singles == []


def test_foreign_names_are_reported_every_time_until_moved() -> None:
    st = ScanState()
    listing = {3: ["README", "x@s+1+m", "zz@s+ff+m+u", name("ok")]}
    d = decide(st, listing, {}, NOW)
    assert sorted(d.foreign) == [(3, "README"), (3, "x@s+1+m"), (3, "zz@s+ff+m+u")]
    assert topics(d.new_multi) == ["ok"]
    d = decide(st, listing, {}, NOW)
    assert len(d.foreign) == 3  # still there: the engine quarantines them


def test_singles_are_work_items_whenever_present_even_at_baseline() -> None:
    st = ScanState()
    j = name("job", single=True)
    d = decide(st, {0: [j]}, {}, NOW, baseline=True)
    assert topics(sorted(d.singles, key=by_rank)) == ["job"]
    d = decide(st, {0: [j]}, {}, NOW)
    assert topics(sorted(d.singles, key=by_rank)) == ["job"]  # still there: try again
    assert d.new_multi == []


def test_singles_sort_by_priority_then_publish_time() -> None:
    names = [
        name("p50-late", single=True, priority=50, published=NOW + 5),
        name("p200", single=True, priority=200, published=NOW),
        name("p0", single=True, priority=0, published=NOW + 9),
        name("p50-early", single=True, priority=50, published=NOW + 1),
    ]
    d = decide(ScanState(), {0: names[:2], 1: names[2:]}, {}, NOW)
    assert topics(sorted(d.singles, key=by_rank)) == ["p0", "p50-early", "p50-late", "p200"]
    assert [e.priority for e in sorted(d.singles, key=by_rank)] == [0, 50, 50, 200]


def test_foreign_peer_singles_sort_at_the_default_priority_by_expiry() -> None:
    peer_late = "6a@s+" + f"{NOW + 900:x}" + "+s+" + "0" * 32
    peer_soon = "6b@s+" + f"{NOW + 100:x}" + "+s+" + "1" * 32
    urgent = name("c", single=True, priority=0)
    relaxed = name("d", single=True, priority=60)
    d = decide(ScanState(), {0: [relaxed, peer_late, urgent, peer_soon]}, {}, NOW)
    assert topics(sorted(d.singles, key=by_rank)) == ["c", "k", "j", "d"]
    assert [e.priority for e in sorted(d.singles, key=by_rank)] == [0, 50, 50, 60]


def test_singles_published_in_one_millisecond_sort_in_publish_order() -> None:
    # The publisher's sequence (the last 12 hex digits of the unique part) breaks ties.
    first, second, third = (
        name(t, single=True, priority=50, published=NOW, rand=f"00000a{k:06x}")
        for t, k in (("a", 0xFFF), ("b", 0x1000), ("c", 0x1001))
    )
    d = decide(ScanState(), {0: [third, first], 1: [second]}, {}, NOW)
    assert topics(sorted(d.singles, key=by_rank)) == ["a", "b", "c"]


def test_direct_kind_is_neither_multi_nor_single() -> None:
    direct = "61@s+" + f"{NOW + 100:x}" + "+d+" + "0" * 32
    d = decide(ScanState(), {0: [direct]}, {}, NOW)
    assert d.new_multi == d.present_multi == d.singles == d.foreign == []


def test_long_names_need_their_spill_first() -> None:
    st = ScanState()
    topic = "long." + "x" * 120
    n = name(topic)
    listing = {5: [n]}
    assert long_names(st, listing) == [(5, n)]
    d = decide(st, listing, {}, NOW)
    assert d.need_spill == [(5, n)]
    assert d.new_multi == []
    rest = encode_topic(topic)[200:]
    d = decide(st, listing, {(5, n): rest}, NOW)
    assert topics(d.new_multi) == [topic]
    assert long_names(st, listing) == []  # parsed and cached now


def test_long_name_with_missing_spill_is_looked_at_again() -> None:
    st = ScanState()
    n = name("long." + "y" * 120)
    d = decide(st, {0: [n]}, {(0, n): None}, NOW)
    assert d.need_spill == []  # asked already: the spill was missing
    assert d.new_multi == []
    assert n not in st.seen[0]  # not marked seen: it is new once the spill appears
    d = decide(st, {0: [n]}, {(0, n): encode_topic("long." + "y" * 120)[200:]}, NOW)
    assert len(d.new_multi) == 1


def test_long_name_with_garbage_spill_is_foreign() -> None:
    n = name("long." + "z" * 120)
    d = decide(ScanState(), {0: [n]}, {(0, n): "not hex at all"}, NOW)
    assert d.foreign == [(0, n)]


def test_undecodable_short_topic_is_foreign() -> None:
    bad = "ff@s+" + f"{NOW + 100:x}" + "+m+" + "0" * 32
    d = decide(ScanState(), {0: [bad]}, {}, NOW)
    assert d.foreign == [(0, bad)]


def test_a_message_seen_before_expires_in_a_later_unchanged_listing() -> None:
    st = ScanState()
    m = name("m", expires=NOW + 10)
    j = name("j", single=True, expires=NOW + 20)
    listing = {0: [m, j]}
    d = decide(st, listing, {}, NOW)
    assert topics(d.present_multi) == ["m"]
    d = decide(st, listing, {}, NOW + 10)
    assert topics(d.expired) == ["m"]
    assert d.present_multi == []
    assert topics(d.singles) == ["j"]
    d = decide(st, listing, {}, NOW + 20)
    assert sorted(topics(d.expired)) == ["j", "m"]
    assert d.singles == []
    d = decide(st, {0: []}, {}, NOW + 30)
    assert d.expired == []
    assert st.buckets[0].expired == {}


def test_new_singles_are_those_not_in_the_previous_listing_even_at_baseline() -> None:
    st = ScanState()
    a, b = name("a", single=True), name("b", single=True)
    d = decide(st, {0: [a]}, {}, NOW, baseline=True)
    assert topics(d.new_singles) == ["a"]
    d = decide(st, {0: [a, b]}, {}, NOW)
    assert topics(d.new_singles) == ["b"]
    assert sorted(topics(d.singles)) == ["a", "b"]
    d = decide(st, {0: [b]}, {}, NOW)
    assert d.new_singles == []
    assert topics(d.singles) == ["b"]


def test_debris_is_swept_at_every_collection_on_a_local_disk() -> None:
    assert sweep_due(100.0, 99.9, max_age=600, shared=False)
    assert sweep_due(100.0, None, max_age=600, shared=False)


def test_on_a_shared_mount_debris_is_swept_ten_times_per_age() -> None:
    assert sweep_due(100.0, None, max_age=600, shared=True)  # the first collection
    assert not sweep_due(100.0, 50.0, max_age=600, shared=True)
    assert sweep_due(110.0, 50.0, max_age=600, shared=True)  # 60 s = 600 s / 10
    # a short age (or claim lease) sweeps as often as it needs; 0 at every call
    assert sweep_due(100.0, 99.0, max_age=6, shared=True)
    assert not sweep_due(100.0, 99.9, max_age=6, shared=True)
    assert sweep_due(100.0, 100.0, max_age=0, shared=True)


def test_a_clock_that_went_back_sweeps_at_once() -> None:
    assert sweep_due(100.0, 5000.0, max_age=600, shared=True)


def peer_name(topic: str, *, single: bool = False) -> str:
    """A qlobber-fsq peer's name: 32 random hex digits, no fsbus fields."""
    n, _ = make_name(
        encode_topic(topic),
        split_at=200,
        expires_ms=NOW + 60_000,
        kind="s" if single else "m",
        unique="f1" + "0" * 30,  # even one that starts as fsbus's fields do
    )
    return n


def test_a_listing_for_peers_only_parses_peers_names_and_counts_the_others() -> None:
    st = ScanState()
    own, own_single, peer = name("own"), name("own.s", single=True), peer_name("peer")
    assert is_own_short(own)
    assert is_own_short(own_single)
    assert not is_own_short(peer)
    d = decide(st, {0: [own, own_single, peer]}, {}, NOW, peers_only=True)
    assert topics(d.new_multi) == ["peer"]
    assert d.singles == []
    assert d.new_singles == []
    assert d.unparsed == 2
    assert sorted(d.new_unparsed) == sorted([(0, own), (0, own_single)])
    # listed again unchanged: counted, nothing new
    d = decide(st, {0: [own, own_single, peer]}, {}, NOW, peers_only=True)
    assert (d.new_multi, d.new_unparsed, d.unparsed) == ([], [], 2)


def test_the_first_full_listing_after_peers_only_sorts_out_the_rest_as_present() -> None:
    st = ScanState()
    old, old_single, gone = name("old"), name("old.s", single=True), name("gone")
    decide(st, {0: [old, old_single, gone]}, {}, NOW, peers_only=True)
    later = name("later")
    d = decide(st, {0: [old, old_single, later]}, {}, NOW)
    assert topics(d.new_multi) == ["later"]  # not old: it was there before
    assert sorted(topics(d.present_multi)) == ["later", "old"]
    assert topics(d.singles) == ["old.s"]
    assert topics(d.new_singles) == []
    assert d.unparsed == 0


def test_long_names_are_parsed_even_for_peers_only() -> None:
    st = ScanState()
    n = name("t" * 150, split_at=100)
    assert not is_own_short(n)
    d = decide(st, {0: [n]}, {(0, n): encode_topic("t" * 150)[100:]}, NOW, peers_only=True)
    assert topics(d.new_multi) == ["t" * 150]


def test_an_entry_from_a_listing_is_the_entry_of_its_parsed_name() -> None:
    """:func:`parse_entry` takes fsbus's own short names apart with one match and parses
    the whole name only when asked (``Entry.parsed``): every field a scan, a claim or a
    delivery reads is what the full parse gives, for every kind, flag and priority."""
    from fsbus._bus.names import parse_name
    from fsbus._bus.scan import parse_entry

    names = []
    for kind in ("m", "s", "d"):
        for flags in (0, 1, 2, 3, 15):
            for priority in (0, 7, 255):
                fields = FsbusFields(flags, priority, NOW + priority, "0a1b2c")
                n, _ = make_name(
                    encode_topic("a.b.ünï"),
                    split_at=200,
                    expires_ms=NOW + 5,
                    kind=kind,  # type: ignore[arg-type]
                    unique=encode_fields(fields, "00ff00ff00ff"),
                )
                names.append(n)
    names.append(name("xy", single=True, split_at=2))  # long: the full parse
    for n in names:
        fast = parse_entry(3, n, {(3, n): encode_topic("xy")[2:]})
        parsed = parse_name(n)
        assert fast is not None
        assert parsed is not None
        full = Entry(3, parsed, fast.topic)
        got = (fast.name, fast.kind, fast.expires_ms, fast.fields, fast.rank, fast.key)
        assert got == (full.name, full.kind, full.expires_ms, full.fields, full.rank, full.key)
        assert fast.parsed == parsed  # parsed when asked
        assert fast == full


def test_a_name_of_fsbus_form_with_a_bad_topic_is_still_foreign() -> None:
    from fsbus._bus.scan import parse_entry

    good = name("a.b")
    at = good.index("@")
    for bad in ("ff" + good[2:], "C3" + good[2:], good[:at] + "0" + good[at:]):
        assert parse_entry(0, bad, {}) is None, bad
    assert parse_entry(0, good.replace("+m+", "+x+"), {}) is None
