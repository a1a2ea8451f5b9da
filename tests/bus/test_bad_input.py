"""Caller mistakes: raised at once, naming the value and the rule, with nothing written."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fsbus import (
    Bus,
    BusConfig,
    ClosedError,
    InvalidConfig,
    InvalidHeader,
    InvalidPattern,
    InvalidTopic,
    PayloadTooLarge,
    UsageError,
)
from fsbus._bus.names import MAX_EXPIRES_MS
from fsbus._bus.plan import MAX_HEADER_BYTES, encode_headers, validate_headers

from .conftest import Inbox, files_under, message_files


def assert_nothing_written(root: Path) -> None:
    assert message_files(root) == []
    assert files_under(root / "staging") == []
    assert files_under(root / "topics") == []
    assert files_under(root / "fsbus" / "meta") == []


@pytest.mark.parametrize(
    ("topic", "rule"),
    [
        (b"bytes.topic", "must be a str"),
        (None, "must be a str"),
        ("tab\there", "control character"),
        ("nul\x00", "control character"),
        ("x" * 1025, "more than the limit of 1024"),
        (".".join(["w"] * 101), "101 words"),
        ("lone\udcffsurrogate", "UTF-8"),
    ],
    ids=["bytes", "none", "tab", "nul", "too-long", "too-many-words", "surrogate"],
)
@pytest.mark.anyio
async def test_invalid_topic(root: Path, topic: object, rule: str) -> None:
    async with Bus(root) as bus:
        with pytest.raises(InvalidTopic, match=rule) as caught:
            await bus.publish(topic, b"x")  # type: ignore[arg-type]
        assert "invalid topic" in str(caught.value)
        with pytest.raises(InvalidTopic, match=rule):
            await bus.publish(topic, b"x", single=True)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert_nothing_written(root)


@pytest.mark.parametrize(
    ("pattern", "rule"),
    [
        (42, "must be a str"),
        ("a.\nb", "control character"),
        ("#." * 100 + "#", "101 words"),
    ],
    ids=["int", "newline", "too-many-words"],
)
@pytest.mark.anyio
async def test_invalid_pattern(root: Path, pattern: object, rule: str) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        with pytest.raises(InvalidPattern, match=rule) as caught:
            await bus.subscribe(pattern, inbox)  # type: ignore[arg-type]
        assert "invalid pattern" in str(caught.value)
        with pytest.raises(InvalidPattern, match=rule):
            async with bus.messages(pattern):  # type: ignore[arg-type]
                pass
        with pytest.raises(InvalidPattern, match=rule):
            async for _ in bus.browse(pattern):  # type: ignore[arg-type]
                pass
        assert bus.statistics().subscriptions == 0


@pytest.mark.parametrize(
    ("headers", "rule"),
    [
        ([("a", "b")], "must be a mapping"),
        ({"a": 1}, "must be str"),
        ({1: "a"}, "must be str"),
        ({"": "x"}, "names are 1-256 printable"),
        ({"line\nbreak": "x"}, "names are 1-256 printable"),
        ({"n" * 257: "x"}, "names are 1-256 printable"),
        ({"a": "nul\x00"}, "NUL"),
        ({"a": "x" * 70_000}, "more than 65536 bytes"),
    ],
    ids=["list", "int-value", "int-name", "empty", "newline", "long-name", "nul", "too-big"],
)
@pytest.mark.anyio
async def test_bad_headers(root: Path, headers: object, rule: str) -> None:
    async with Bus(root) as bus:
        with pytest.raises(InvalidHeader, match=rule):
            await bus.publish("t", b"x", headers=headers)  # type: ignore[arg-type]
    assert_nothing_written(root)


@pytest.mark.anyio
async def test_headers_a_publish_sent_before_are_still_checked_when_they_differ(root: Path) -> None:
    """A publish's headers encoded once are kept for the next publish with the same
    ones (a publisher repeats them); headers that differ from them in a value, even one
    that is not a str (or that cannot be hashed), are checked afresh and refused."""
    good = {"k": "v", "n": "1"}
    assert encode_headers(dict(good)) == encode_headers(good)
    assert json.loads(encode_headers({"n": "1", "k": "v"}) or b"") == {"headers": good}
    async with Bus(root) as bus:
        await bus.publish("t", b"x", headers=good)
        for bad, rule in (
            ({"k": "v", "n": 1}, "must be str"),
            ({"k": "v", "n": ["1"]}, "must be str"),
            ({"k": "nul\x00", "n": "1"}, "NUL"),
        ):
            with pytest.raises(InvalidHeader, match=rule):
                await bus.publish("t", b"x", headers=bad)  # type: ignore[arg-type]
        assert [m.headers async for m in bus.browse("t")] == [good]  # nothing else written


@pytest.mark.anyio
async def test_each_message_has_headers_of_its_own(root: Path) -> None:
    """Messages with the same headers read the same bytes; a handler that changes its
    message's headers changes no other message's."""
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("t", inbox)
        await bus.publish("t", b"1", headers={"k": "v"})
        (first,) = await inbox.wait_for(1)
        first.headers["k"] = "changed"  # type: ignore[index]
        first.headers["more"] = "x"  # type: ignore[index]
        await bus.publish("t", b"2", headers={"k": "v"})
        _, second = await inbox.wait_for(2)
    assert second.payload == b"2"
    assert second.headers == {"k": "v"}


@pytest.mark.parametrize("ttl", [0, -1, math.nan, "10", True, -math.inf])
@pytest.mark.anyio
async def test_bad_ttl(root: Path, ttl: object) -> None:
    async with Bus(root) as bus:
        with pytest.raises(UsageError, match="ttl must be a positive number of seconds"):
            await bus.publish("t", b"x", ttl=ttl)  # type: ignore[arg-type]
    assert_nothing_written(root)


@pytest.mark.parametrize("ttl", [math.inf, 1e300])
@pytest.mark.anyio
async def test_unbounded_ttl_means_the_latest_expiry_a_name_holds(root: Path, ttl: float) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("forever", inbox)
        info = await bus.publish("forever", b"x", ttl=ttl)
        (msg,) = await inbox.wait_for(1)
    assert info.expires == MAX_EXPIRES_MS / 1000
    assert msg.expires == info.expires


@pytest.mark.parametrize("priority", [-1, 256, 1.5, True, "1"])
@pytest.mark.anyio
async def test_bad_priority(root: Path, priority: object) -> None:
    async with Bus(root) as bus:
        with pytest.raises(UsageError, match="priority must be an int from 0"):
            await bus.publish("t", b"x", single=True, priority=priority)  # type: ignore[arg-type]
    assert_nothing_written(root)


@pytest.mark.anyio
async def test_payload_too_large(root: Path) -> None:
    async with Bus(root, config=BusConfig(max_payload_size=1000)) as bus:
        await bus.publish("t", b"x" * 1000)  # the limit itself is fine
        with pytest.raises(PayloadTooLarge, match="1001 bytes exceeds max_payload_size=1000"):
            await bus.publish("t", b"x" * 1001)
        with pytest.raises(PayloadTooLarge):
            await bus.publish_many([("t", b"ok"), ("t", b"y" * 1001)])
    assert len(message_files(root)) == 1  # publish_many checked everything first


@pytest.mark.anyio
async def test_handler_must_be_callable(root: Path) -> None:
    async with Bus(root) as bus:
        with pytest.raises(UsageError, match="handler must be an async function"):
            await bus.subscribe("t", "not a function")  # type: ignore[arg-type]
        assert bus.statistics().subscriptions == 0


@pytest.mark.anyio
async def test_a_plain_function_handler_is_refused_before_any_delivery(root: Path) -> None:
    def blocking(msg: object) -> None:  # would run, then fail when awaited
        raise AssertionError("never called")

    async with Bus(root) as bus:
        with pytest.raises(UsageError, match=r"async def.*BlockingBus\.messages"):
            await bus.subscribe("t", blocking)  # type: ignore[arg-type]
        assert bus.statistics().subscriptions == 0


@pytest.mark.anyio
async def test_use_before_entering(root: Path) -> None:
    bus = Bus(root)
    with pytest.raises(UsageError, match="async with Bus"):
        await bus.publish("t", b"x")
    assert not await anyio.Path(root).exists()


@pytest.mark.anyio
async def test_closed_bus_refuses_everything(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        sub = await bus.subscribe("t", inbox)
    with pytest.raises(ClosedError, match="closed"):
        await bus.publish("t", b"x")
    with pytest.raises(ClosedError):
        await bus.publish_many([("t", b"x")])
    with pytest.raises(ClosedError):
        await bus.subscribe("t", inbox)
    with pytest.raises(ClosedError):
        await bus.gc()
    with pytest.raises(ClosedError):
        async for _ in bus.browse():
            pass
    with pytest.raises(UsageError, match="entered once"):
        await bus.__aenter__()
    await bus.aclose()  # idempotent
    await sub.aclose()
    assert message_files(root) == []


@pytest.mark.parametrize(
    "options",
    [
        {"poll_interval": 0},
        {"bucket_base": 1},
        {"handler_concurrency": 0},
        {"max_deliveries": 0},
        {"no_such_option": 1},
        {"bucket_base": 36, "bucket_num_chars": 4},
    ],
    ids=["poll", "base", "concurrency", "deliveries", "unknown", "too-many-buckets"],
)
def test_bad_config(options: dict[str, object]) -> None:
    with pytest.raises(InvalidConfig, match="invalid BusConfig"):
        BusConfig(**options)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_async_iterator_of_text_chunks(root: Path) -> None:
    async def chunks() -> AsyncIterator[str]:
        yield "text, not bytes"

    async with Bus(root) as bus:
        with pytest.raises(UsageError, match=r"chunks must be bytes, not str.*encode"):
            await bus.publish("t", chunks())  # type: ignore[arg-type]
    assert_nothing_written(root)


@pytest.mark.parametrize("names", [1, 3])
def test_the_headers_limit_is_the_same_whether_encoded_or_only_checked(names: int) -> None:
    """A publish encodes its headers once (compact JSON) and measures that; the limit it
    applies is still the one validate_headers measures, to the byte."""
    base = {f"h{i}": "v" for i in range(names - 1)}
    size = len(json.dumps({**base, "last": ""}, ensure_ascii=False).encode())
    room = MAX_HEADER_BYTES - size
    fits = {**base, "last": "é" * (room // 2) + "x" * (room % 2)}
    over = {**base, "last": fits["last"] + "x"}
    assert validate_headers(fits) == fits
    meta = encode_headers(fits)
    assert meta is not None
    assert json.loads(meta) == {"headers": fits}
    for check in (validate_headers, encode_headers):
        with pytest.raises(InvalidHeader, match="more than 65536 bytes"):
            check(over)
    assert encode_headers({}) is None
    assert encode_headers(None) is None
