"""Fuzzing the pure readers with hypothesis: the name parser, scan decisions, UPDATE diffs.

Whatever a stranger or a crashed peer leaves in a bucket or in UPDATE, these never
raise, and what they return is consistent.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsbus import Bus, BusConfig
from fsbus._bus.layout import changed_buckets
from fsbus._bus.names import encode_topic, make_name, parse_name
from fsbus._bus.scan import ScanState, decide

from .conftest import Inbox

HEX = "0123456789abcdef"
hexes = st.text(alphabet=HEX, max_size=60)
texts = st.text(max_size=300)


@st.composite
def valid_names(draw: st.DrawFn) -> str:
    topic = draw(st.text(max_size=40).filter(lambda t: "\x00" not in t))
    try:
        topic_hex = encode_topic(topic)
    except UnicodeEncodeError:
        topic_hex = "61"
    name, _ = make_name(
        topic_hex,
        split_at=draw(st.integers(16, 200)),
        expires_ms=draw(st.integers(0, 2**44)),
        kind=draw(st.sampled_from(["m", "s", "d"])),
        unique=draw(st.text(alphabet=HEX, min_size=1, max_size=34)),
    )
    return name


@st.composite
def mangled(draw: st.DrawFn) -> str:
    """A valid name with a few characters replaced, dropped or added."""
    name = list(draw(valid_names()))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(name)))
        op = draw(st.sampled_from(["set", "del", "ins"]))
        ch = draw(st.sampled_from([*"@+lsmd0fz\x00/.", "\udcff", "é"]))
        if op == "ins" or i == len(name):
            name.insert(i, ch)
        elif op == "set":
            name[i] = ch
        else:
            del name[i]
    return "".join(name)


names = st.one_of(texts, valid_names(), mangled())


@settings(max_examples=400, deadline=None)
@given(names)
def test_parse_name_never_raises_and_is_consistent(name: str) -> None:
    p = parse_name(name)
    if p is None:
        return
    assert p.name == name
    assert p.kind in ("m", "s", "d")
    assert p.expires_ms >= 0
    assert set(p.topic_hex) <= set(HEX)
    assert len(p.topic_hex) % 2 == 0
    assert name.startswith(p.topic_hex + "@" + ("l" if p.long else "s") + "+")
    assert name.endswith(f"+{p.kind}+{p.unique}")
    assert int(name.split("+")[1], 16) == p.expires_ms


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.integers(0, 3), st.lists(names, max_size=12, unique=True), max_size=4),
    st.dictionaries(st.integers(0, 3), st.lists(names, max_size=12, unique=True), max_size=4),
    st.integers(0, 2**44),
    st.dictionaries(st.tuples(st.integers(0, 3), names), st.none() | hexes, max_size=6),
)
def test_decide_sorts_every_name_exactly_once(
    first: dict[int, list[str]],
    second: dict[int, list[str]],
    now_ms: int,
    spills: dict[tuple[int, str], str | None],
) -> None:
    state = ScanState()
    decide(state, first, spills, now_ms, baseline=True)
    d = decide(state, second, spills, now_ms)
    buckets = [
        [e.key for e in d.singles],
        [e.key for e in d.present_multi],
        [e.key for e in d.expired],
        list(d.foreign),
    ]
    seen = [k for b in buckets for k in b]
    assert len(seen) == len(set(seen))
    listed = {(bi, n) for bi, ns in second.items() for n in ns}
    assert set(seen) <= listed
    assert {e.key for e in d.new_multi} <= {e.key for e in d.present_multi}
    assert set(d.need_spill) <= listed
    for e in d.singles:
        assert e.parsed.single
        assert e.parsed.expires_ms > now_ms
        assert e.topic is not None
    # Whatever is left out is a direct-stream name or a long name awaiting its spill.
    for key in listed - set(seen):
        p = parse_name(key[1])
        assert p is not None
        assert p.kind == "d" or p.long


@settings(max_examples=300, deadline=None)
@given(st.none() | st.binary(max_size=80), st.binary(max_size=80), st.integers(0, 8))
def test_changed_buckets_on_any_update_bytes(old: bytes | None, new: bytes, stamp: int) -> None:
    count = 8
    out = changed_buckets(old, new, stamp, count)
    assert all(0 <= i < count for i in out)
    assert out == sorted(set(out))
    if old is not None and stamp and len(old) >= stamp * count and len(new) >= stamp * count:
        expected = [
            i
            for i in range(count)
            if old[i * stamp : (i + 1) * stamp] != new[i * stamp : (i + 1) * stamp]
        ]
        assert out == expected


@pytest.mark.anyio
# random bytes, the same in every process of a parallel run (pytest-xdist compares ids)
@pytest.mark.parametrize(
    "content", [b"", b"\x00", random.Random(7).randbytes(7), random.Random(5000).randbytes(5000)]
)
async def test_a_running_bus_survives_any_update_file(tmp_path: Path, content: bytes) -> None:
    """UPDATE truncated, garbage or oversized by a stranger: delivery goes on."""
    root = tmp_path / "bus"
    inbox = Inbox()
    cfg = BusConfig(bucket_num_chars=1, poll_interval=0.05)
    async with Bus(root, config=cfg) as bus:
        await bus.subscribe("#", inbox)
        (root / "update" / "UPDATE").write_bytes(content)
        await bus.publish("after.garbage", b"x")
        await inbox.wait(1)
        assert inbox.topics == ["after.garbage"]
