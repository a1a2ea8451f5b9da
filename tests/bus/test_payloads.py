"""Payload shapes: empty, 10 MB, a file path, an async iterator; long topics."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, PayloadTooLarge

from .conftest import Inbox, RecordingOps, files_under, message_files, wait_until

MB = 1 << 20


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_empty_payload(root: Path, single: bool) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("e", inbox)
        info = await bus.publish("e", b"", single=single)
        (msg,) = await inbox.wait_for(1)
    assert info.size == 0
    assert msg.payload == b""
    assert msg.size == 0


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_ten_megabytes_arrive_exactly(root: Path, single: bool) -> None:
    data = os.urandom(10 * MB)
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("big", inbox)
        info = await bus.publish("big", data, single=single)
        if not single:
            on_disk = await anyio.Path(info.path).read_bytes()
            assert on_disk[:1] == b"\x00"
            assert on_disk[1:] == data
        (msg,) = await inbox.wait_for(1)
    assert info.size == len(data)
    assert msg.size == len(data)
    assert msg.payload == data


@pytest.mark.anyio
async def test_str_payload_is_utf8(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("s", inbox)
        info = await bus.publish("s", "naïve ✓")
        (msg,) = await inbox.wait_for(1)
    assert msg.payload == "naïve ✓".encode()
    assert info.size == len("naïve ✓".encode())


@pytest.mark.anyio
async def test_payload_from_a_file_is_streamed_not_loaded(root: Path, tmp_path: Path) -> None:
    data = os.urandom(3 * MB + 123)
    src = tmp_path / "payload.bin"
    src.write_bytes(data)
    ops = RecordingOps()
    inbox = Inbox()
    async with Bus(root, ops=ops) as bus:
        await bus.subscribe("file", inbox)
        info = await bus.publish("file", src)
        (msg,) = await inbox.wait_for(1)
    assert info.size == len(data)
    assert msg.payload == data
    copies = [c for op, c in ops.calls if op == "copy_range"]
    # Copied in bounded chunks: never one read of the whole file.
    assert len(copies) >= 4
    assert all(int(c.split(":")[0]) <= MB for c in copies)
    assert src.read_bytes() == data  # the source is left alone


@pytest.mark.anyio
async def test_payload_file_larger_than_the_limit_leaves_nothing(
    root: Path, tmp_path: Path
) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(b"x" * (2 * MB + 1))
    async with Bus(root, config=BusConfig(max_payload_size=2 * MB)) as bus:
        with pytest.raises(PayloadTooLarge, match="max_payload_size"):
            await bus.publish("big", src)
    assert message_files(root) == []
    assert files_under(root / "staging") == []


@pytest.mark.anyio
async def test_payload_from_an_async_iterator_goes_to_disk_as_it_comes(root: Path) -> None:
    chunks = [os.urandom(256 * 1024) for _ in range(8)]
    staged_sizes: list[int] = []

    async def produce() -> AsyncIterator[bytes]:
        for chunk in chunks:
            # What is on disk so far: the leading byte and every chunk already given.
            staged = files_under(root / "staging")
            assert len(staged) == 1
            staged_sizes.append((root / "staging" / staged[0]).stat().st_size)
            yield chunk

    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("it", inbox)
        info = await bus.publish("it", produce())
        (msg,) = await inbox.wait_for(1)
    expected = [1 + sum(len(c) for c in chunks[:i]) for i in range(len(chunks))]
    assert staged_sizes == expected
    assert msg.payload == b"".join(chunks)
    assert info.size == sum(len(c) for c in chunks)
    assert files_under(root / "staging") == []


@pytest.mark.anyio
async def test_async_iterator_over_the_limit_is_aborted(root: Path) -> None:
    async def produce() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"y" * 1000

    async with Bus(root, config=BusConfig(max_payload_size=4500)) as bus:
        with pytest.raises(PayloadTooLarge):
            await bus.publish("it", produce())
    assert message_files(root) == []
    assert files_under(root / "staging") == []


@pytest.mark.anyio
async def test_failing_async_iterator_leaves_nothing(root: Path) -> None:
    async def produce() -> AsyncIterator[bytes]:
        yield b"part"
        raise RuntimeError("producer broke")

    async with Bus(root) as bus:
        with pytest.raises(RuntimeError, match="producer broke"):
            await bus.publish("it", produce())
    assert message_files(root) == []
    assert files_under(root / "staging") == []


@pytest.mark.anyio
async def test_bad_payload_type(root: Path) -> None:
    async with Bus(root) as bus:
        with pytest.raises(ValueError, match="payload must be"):
            await bus.publish("t", 12345)  # type: ignore[arg-type]
    assert message_files(root) == []


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_long_topics_spill_and_arrive_whole(root: Path, single: bool) -> None:
    topic = "region." + ".".join(f"word{i:03d}" for i in range(40))  # ~320 bytes
    inbox = Inbox()
    async with Bus(root) as bus:
        if not single:  # a multi must find its subscriber there; a single could be gone
            await bus.subscribe("region.#", inbox)  # before we look, so subscribe later
        info = await bus.publish(topic, b"long", single=single)
        spill = root / "topics" / info.bucket / info.name
        assert len(info.name.split("@")[0]) == 200
        assert "@l+" in info.name
        assert spill.read_text() == topic.encode().hex()[200:]
        if single:
            await bus.subscribe("region.#", inbox)
        (msg,) = await inbox.wait_for(1)
    assert msg.topic == topic
    assert msg.payload == b"long"


@pytest.mark.anyio
async def test_long_topic_matching_uses_the_whole_topic(root: Path) -> None:
    prefix = "p" * 120  # the name holds only the first 100 bytes of the topic
    wanted, other = Inbox(), Inbox()
    async with Bus(root) as bus:
        await bus.subscribe(f"{prefix}.wanted", wanted)
        await bus.subscribe(f"{prefix}.other", other)
        await bus.publish(f"{prefix}.wanted", b"1")
        await bus.publish(f"{prefix}.other", b"2")
        await wanted.wait_for(1)
        await other.wait_for(1)
    assert wanted.payloads == [b"1"]
    assert other.payloads == [b"2"]


@pytest.mark.anyio
async def test_a_payload_over_the_subscribers_limit_is_not_read(root: Path) -> None:
    small = BusConfig(max_payload_size=10)
    inbox = Inbox()
    with BlockingBus(root) as publisher:  # the publisher allows more than the subscriber
        job = publisher.publish("big.job", b"x" * 100, single=True)
    async with Bus(root, config=small) as bus:
        await bus.subscribe("big.#", inbox)
        publisher2 = BlockingBus(root)
        with publisher2:
            publisher2.publish("big.news", b"y" * 100)
            publisher2.publish("big.ok", b"fits")
        await inbox.wait_topic("big.ok")
        # the oversized work item was moved aside rather than retried forever
        await wait_until(lambda: not Path(job.path).exists())
        assert list((root / "fsbus" / "quarantine").iterdir())
    assert [m.topic for m in inbox.messages] == ["big.ok"]
