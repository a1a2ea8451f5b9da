"""AsyncStream: appends, reads, follow mode waking on appends, async groups."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fsbus import AsyncStream, Stream, StreamConfig

pytestmark = pytest.mark.anyio


async def test_append_and_read(tmp_path: Path) -> None:
    async with AsyncStream(tmp_path, "a", config=StreamConfig(durability="none")) as s:
        assert await s.append(b"x") == 0
        assert await s.append_batch([b"y", "z"]) == range(1, 3)
        assert [r.value async for r in s.read()] == [b"x", b"y", b"z"]
        assert [r.offset async for r in s.read(1, max_records=1)] == [1]
        assert (await s.start_offset(), await s.end_offset()) == (0, 3)
        assert (await s.info()).end_offset == 3


@pytest.mark.parametrize(
    "cfg",
    [
        # inotify alone must wake the follower: the poll is far longer than the test
        StreamConfig(durability="none", poll_interval=60.0),
        StreamConfig(durability="none", force_polling=True, poll_interval=0.05),
    ],
    ids=["inotify", "polling"],
)
async def test_follow_wakes_on_append(tmp_path: Path, cfg: StreamConfig) -> None:
    async with AsyncStream(tmp_path, "f", config=cfg) as s:
        await s.append(b"before")
        got: list[bytes] = []
        waiting = anyio.Event()

        async def follow() -> None:
            async with s.follow(start=0) as records:
                async for r in records:
                    got.append(r.value)
                    if r.value == b"before":
                        waiting.set()
                    if len(got) == 4:
                        return

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                await waiting.wait()
                # appended from another handle in another thread, as another writer would
                other = Stream.open(tmp_path, "f", config=cfg)
                await anyio.to_thread.run_sync(other.append_batch, [b"1", b"2"])
                await anyio.to_thread.run_sync(other.append, b"3")
                other.close()
        assert got == [b"before", b"1", b"2", b"3"]


async def test_follow_from_end_and_stop(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", poll_interval=0.05)
    async with AsyncStream(tmp_path, "f", config=cfg) as s:
        await s.append_batch([b"old"] * 3)
        async with s.follow(stop=5) as records:
            assert records.position == 3

            def writer() -> None:
                with Stream.open(tmp_path, "f", config=cfg) as w:
                    w.append_batch([b"n1", b"n2", b"n3"])

            with anyio.fail_after(30):
                await anyio.to_thread.run_sync(writer)
                assert [r.value async for r in records] == [b"n1", b"n2"]


async def test_async_group(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", poll_interval=0.05)
    async with AsyncStream(tmp_path, "g", config=cfg) as s:
        async with await s.group("workers") as g:
            assert await g.poll(timeout=0) == []
            await s.append_batch([b"a", b"b"])
            with anyio.fail_after(30):
                recs = await g.poll(timeout=20)
            assert [r.value for r in recs] == [b"a", b"b"]
            assert await g.commit() == dict.fromkeys(range(8), 2)


async def test_follow_across_segment_rolls(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096, poll_interval=0.05)
    async with AsyncStream(tmp_path, "roll", config=cfg) as s:
        got: list[int] = []

        async def follow() -> None:
            async with s.follow(start=0, stop=600) as records:
                async for r in records:
                    got.append(r.offset)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                for _ in range(12):
                    await s.append_batch([b"v" * 60] * 50)
        assert got == list(range(600))
        assert len((await s.info()).segments) > 5
