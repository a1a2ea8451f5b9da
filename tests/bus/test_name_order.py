"""``name_order``: the string key that orders a queue for taking its head, in the same
order as ``name_rank`` (the integer rank a scan's entries carry), for fsbus's names and
for the names of qlobber-fsq peers, which carry no fields."""

from __future__ import annotations

import random

from fsbus._bus.names import FsbusFields, encode_fields, make_name
from fsbus._bus.scan import name_order, name_rank


def _names() -> list[str]:
    rng = random.Random(7)
    out = []
    for i in range(400):
        expires = rng.randrange(1, 0xFFF_FFFF_FFFF)
        if i % 5 == 0:
            unique = f"{rng.getrandbits(64):016x}"  # a peer's: no fsbus fields
        else:
            fields = FsbusFields(
                rng.randrange(2),
                rng.choice([0, 1, 50, 50, 50, 254, 255]),
                rng.choice([1_700_000_000_000, rng.randrange(0xFFF_FFFF_FFFF)]),
                f"{rng.getrandbits(24):06x}",
            )
            unique = encode_fields(fields, f"{rng.getrandbits(48):012x}")
        name, _ = make_name("612e62", split_at=200, expires_ms=expires, kind="s", unique=unique)
        out.append(name)
    return out


def test_name_order_sorts_as_name_rank() -> None:
    names = _names()
    assert sorted(names, key=name_order) == sorted(names, key=name_rank)
    for n in names:
        assert len(name_order(n)) == 25
