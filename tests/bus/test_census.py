"""The census (whole-listing passes: queue depth, expiry, gc) against decide's answer.

`census` sorts short names out with one match each and leaves the others in ``rest``;
what it says, together with `decide` on the rest, must be what `decide` says about every
name on a first listing.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fsbus._bus.names import FsbusFields, encode_fields, encode_topic, make_name, parse_name
from fsbus._bus.scan import Entry, ScanState, census, decide, long_names, name_rank, rank_of

NOW = 1_800_000_000_000
BAD_UTF8_HEX = "ff" + encode_topic("x")  # hex, but not UTF-8


def _name(rng: random.Random) -> str:
    """A name of one of the forms a bucket can hold, well formed or not."""
    form = rng.randrange(12)
    topic = rng.choice(["a", "orders.created", "é.ü", "x" * 40])
    kind = rng.choice("msd")
    expires = NOW + rng.choice([-10_000, -1, 0, 1, 60_000])
    fields = FsbusFields(rng.randrange(2), rng.randrange(256), NOW - rng.randrange(10**6), "abcdef")
    unique = encode_fields(fields, f"{rng.randrange(16**12):012x}")
    if form == 0:  # a qlobber-fsq peer's unique part
        unique = f"{rng.randrange(16**32):032x}"
    hexed = encode_topic(topic)
    if form == 1:
        hexed = BAD_UTF8_HEX
    split = 200 if form != 2 else 4  # form 2: a long name, its topic spilled
    name, _ = make_name(hexed, split_at=split, expires_ms=expires, kind=kind, unique=unique)  # type: ignore[arg-type]
    if form == 3:
        return name.replace("@", "@@", 1)
    if form == 4:
        return name + "+extra"
    if form == 5:
        return name.upper()
    if form == 6:
        return name.replace("@s+", "@s+0x", 1)
    if form == 7:
        return rng.choice(["README", ".hidden", "x@s+1+m+", "@s+1+s+u", "ab\n" + name])
    if form == 8:
        return name.replace("+", "+0", 1)  # a leading zero in the expiry
    return name


def _spills(listings: dict[int, list[str]]) -> dict[tuple[int, str], str | None]:
    """What read_spills would give: the rest of the topic, missing, or garbage."""
    out: dict[tuple[int, str], str | None] = {}
    for k, key in enumerate(long_names(ScanState(), listings)):
        out[key] = [encode_topic("rest"), None, "zz"][k % 3]
    return out


def _compare(listings: dict[int, list[str]]) -> None:
    spills = _spills(listings)
    want = decide(ScanState(), listings, spills, NOW, baseline=True)

    c = census(listings, NOW, {})
    rest = decide(ScanState(), c.rest, spills, NOW, baseline=True)
    assert set(c.singles) | {e.key for e in rest.singles} == {e.key for e in want.singles}
    assert len(c.singles) + len(rest.singles) == len(want.singles)
    assert c.multis + len(rest.present_multi) == len(want.present_multi)
    expired = {(bi, n) for bi, n, _ in c.expired} | {e.key for e in rest.expired}
    assert expired == {e.key for e in want.expired}
    kinds = {(bi, n): k for bi, n, k in c.expired}
    for e in want.expired:
        if e.key in kinds:
            assert kinds[e.key] == e.parsed.kind
    assert set(c.foreign) | set(rest.foreign) == set(want.foreign)
    assert len(want.need_spill) == len(rest.need_spill)
    # the census never takes a long name or a name it does not fully understand
    for bi, name, *_ in [*c.singles, *c.expired, *c.foreign]:
        assert "@s+" in name
        assert name not in c.rest.get(bi, [])


def test_census_agrees_with_decide_on_many_random_listings() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        listings = {bi: [_name(rng) for _ in range(rng.randrange(30))] for bi in range(4)}
        _compare(listings)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="0123456789abcdefABx@+smdl\n.", max_size=40), max_size=20))
def test_census_agrees_with_decide_on_arbitrary_names(names: list[str]) -> None:
    _compare({0: [n for n in names if n]})


def test_census_counts_and_sorts_a_plain_queue() -> None:
    topic = encode_topic("q.x")
    unique = encode_fields(FsbusFields(0, 50, NOW, "abcdef"), "0" * 12)

    def n(expires: int, kind: str) -> str:
        return make_name(topic, split_at=200, expires_ms=expires, kind=kind, unique=unique)[0]  # type: ignore[arg-type]

    live, old, multi = n(NOW + 1, "s"), n(NOW, "s"), n(NOW + 5, "m")
    c = census({3: [live, old, multi, "junk"]}, NOW)
    assert c.singles == [(3, live)]
    assert c.multis == 1
    assert c.expired == [(3, old, "s")]
    assert c.rest == {3: ["junk"]}


def test_rank_of_and_name_rank_are_the_entry_rank() -> None:
    rng = random.Random(7)
    for _ in range(200):
        name = _name(rng)
        parsed = parse_name(name)
        if parsed is None:
            continue
        assert rank_of(parsed) == Entry(0, parsed, "t").rank == name_rank(name)
