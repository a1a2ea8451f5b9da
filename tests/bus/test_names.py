"""The message-name codec (pure): byte-exact qlobber-fsq 14 names, fsbus's own fields.

The vectors in ``data/qlobber_fsq_names.json`` are files the real qlobber-fsq 14.0.0
wrote (see the file's ``source``); these tests need neither Node nor a directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fsbus._bus.names import (
    FLAG_META,
    MAX_EXPIRES_MS,
    FsbusFields,
    bucket_for,
    decode_fields,
    decode_topic,
    encode_fields,
    encode_topic,
    format_bucket,
    host_id,
    make_name,
    parse_name,
)

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "qlobber_fsq_names.json").read_text()
)
PEER_MESSAGES: list[dict[str, Any]] = VECTORS["messages"]

FIELDS = FsbusFields(flags=FLAG_META, priority=7, published_ms=0x1A2008A389F, host="abc123")
RANDOM = "0123456789ab"


def test_foo_bar_prefix_is_qlobber_fsq_s() -> None:
    name, spill = make_name(
        encode_topic("foo.bar"), split_at=200, expires_ms=0x1A20038F819, kind="m", unique="u"
    )
    assert name == "666f6f2e626172@s+1a20038f819+m+u"
    assert name.startswith("666f6f2e626172@s+")
    assert spill is None


def test_design_example_name_parses() -> None:
    p = parse_name("666f6f2e626172@s+1a20038f819+m+0d8e9506066a0a24dd286e318839f2e1")
    assert p is not None
    assert decode_topic(p.topic_hex) == "foo.bar"
    assert p.expires_ms == 0x1A20038F819
    assert p.kind == "m"
    assert not p.single
    assert not p.long
    assert p.fields is None  # a qlobber-fsq peer's random part


@pytest.mark.parametrize("vec", PEER_MESSAGES, ids=lambda v: repr(v["topic"][:20]))
def test_qlobber_fsq_names_parse_to_their_topic(vec: dict[str, Any]) -> None:
    p = parse_name(vec["name"])
    assert p is not None
    topic_hex = p.topic_hex + (vec["spill"] or "")
    assert decode_topic(topic_hex) == vec["topic"]
    assert p.long == (vec["spill"] is not None)
    assert p.single == vec["single"]
    assert p.kind == ("s" if vec["single"] else "m")
    assert p.fields is None
    assert len(p.unique) == 32


@pytest.mark.parametrize("vec", PEER_MESSAGES, ids=lambda v: repr(v["topic"][:20]))
def test_make_name_rebuilds_qlobber_fsq_names_byte_for_byte(vec: dict[str, Any]) -> None:
    p = parse_name(vec["name"])
    assert p is not None
    name, spill = make_name(
        encode_topic(vec["topic"]),
        split_at=200,
        expires_ms=p.expires_ms,
        kind=p.kind,
        unique=p.unique,
    )
    assert name == vec["name"]
    assert spill == vec["spill"]


def test_long_topic_splits_at_200_hex_chars() -> None:
    topic = "t" * 150  # 300 hex chars
    name, spill = make_name(encode_topic(topic), split_at=200, expires_ms=1, kind="s", unique="u")
    head = name.split("@")[0]
    assert len(head) == 200
    assert name[200:203] == "@l+"
    assert spill is not None
    assert len(spill) == 100
    assert decode_topic(head + spill) == topic


def test_topic_of_exactly_200_hex_chars_is_short() -> None:
    name, spill = make_name(
        encode_topic("w" * 100), split_at=200, expires_ms=1, kind="m", unique="u"
    )
    assert "@s+" in name
    assert spill is None


def test_split_at_is_configurable() -> None:
    name, spill = make_name(
        encode_topic("abcdefghij"), split_at=16, expires_ms=1, kind="m", unique="u"
    )
    assert name.startswith("6162636465666768@l+")
    assert spill == "696a"


def test_unicode_topic_is_utf8_hex() -> None:
    assert encode_topic("café") == "636166c3a9"
    assert decode_topic("636166c3a9") == "café"


def test_empty_topic_encodes_to_empty_prefix() -> None:
    name, _ = make_name(encode_topic(""), split_at=200, expires_ms=255, kind="m", unique="u")
    assert name == "@s+ff+m+u"
    p = parse_name(name)
    assert p is not None
    assert decode_topic(p.topic_hex) == ""


def test_expiry_is_lowercase_hex_and_clamped() -> None:
    name, _ = make_name("61", split_at=200, expires_ms=0xABCDEF, kind="m", unique="u")
    assert "+abcdef+" in name
    far, _ = make_name("61", split_at=200, expires_ms=MAX_EXPIRES_MS * 16, kind="m", unique="u")
    assert f"+{MAX_EXPIRES_MS:x}+" in far
    neg, _ = make_name("61", split_at=200, expires_ms=-5, kind="m", unique="u")
    assert "+0+" in neg


@pytest.mark.parametrize(
    "name",
    [
        "no-at-sign",
        "61@s+1+m",  # three fields
        "61@s+1+m+u+extra",  # five fields
        "61@s+1+m+u@",  # last '@' leaves one field
        "61@x+1+m+u",  # size flag neither s nor l
        "61@s+1+q+u",  # unknown kind
        "61@s++m+u",  # empty expiry
        "61@s+zz+m+u",  # expiry not hex
        "61@s+12345678901234+m+u",  # expiry too long
        "6@s+1+m+u",  # odd topic hex
        "6g@s+1+m+u",  # topic not hex
        "",
    ],
)
def test_parse_rejects_what_is_not_a_message(name: str) -> None:
    assert parse_name(name) is None


def test_parse_uses_the_last_at_sign() -> None:
    # '@' cannot be in the hex part, so a name with two is not a message of ours...
    assert parse_name("61@62@s+1+m+u") is None
    # ...but the metadata split is taken after the last '@' like qlobber-fsq does.
    p = parse_name("6162@s+10+d+whatever")
    assert p is not None
    assert p.kind == "d"
    assert p.expires_ms == 16


def test_undecodable_topic_hex() -> None:
    assert decode_topic("ff") is None  # not UTF-8
    assert decode_topic("6") is None  # not hex


def test_fsbus_fields_round_trip() -> None:
    unique = encode_fields(FIELDS, RANDOM)
    assert len(unique) == 34
    assert unique.startswith("f11")
    assert set(unique) <= set("0123456789abcdef")
    assert decode_fields(unique) == FIELDS


def test_fsbus_name_stays_under_255_bytes() -> None:
    name, spill = make_name(
        encode_topic("x" * 500),
        split_at=200,
        expires_ms=MAX_EXPIRES_MS,
        kind="s",
        unique=encode_fields(FIELDS, RANDOM),
    )
    assert len(name.encode()) <= 255
    assert spill is not None
    p = parse_name(name)
    assert p is not None
    assert p.fields == FIELDS


@pytest.mark.parametrize(
    "unique",
    [
        "0d8e9506066a0a24dd286e318839f2e1",  # qlobber-fsq's 32 random hex digits
        "f2" + "0" * 32,  # another version's prefix
        "f1" + "0" * 31,  # too short
        "f1" + "g" * 32,  # not hex
        "F1" + "0" * 32,  # upper case
    ],
)
def test_foreign_unique_parts_have_no_fields(unique: str) -> None:
    assert decode_fields(unique) is None


def test_bucket_names_are_00_to_ff() -> None:
    names = [format_bucket(i, 16, 2) for i in range(256)]
    assert names[0] == "00"
    assert names[10] == "0a"
    assert names[255] == "ff"
    assert len(set(names)) == 256
    assert names == sorted(names)
    assert format_bucket(35, 36, 1) == "z"
    assert format_bucket(5, 10, 3) == "005"


def test_bucket_for_spreads_and_stays_in_range() -> None:
    got = {bucket_for(f"name-{i}", 256) for i in range(2000)}
    assert got <= set(range(256))
    assert len(got) > 200
    assert bucket_for("anything", 1) == 0
    assert bucket_for("same", 256) == bucket_for("same", 256)


def test_host_id_is_six_hex_digits() -> None:
    h = host_id("worker-1.example")
    assert len(h) == 6
    assert set(h) <= set("0123456789abcdef")
    assert h == host_id("worker-1.example")
    assert h != host_id("worker-2.example")
