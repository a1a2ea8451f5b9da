"""AsyncStream: appends, reads, follow mode waking on appends, async groups."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fsbus import AsyncStream, Stream, StreamConfig, UsageError

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


async def test_bulk_appends_and_column_reads(tmp_path: Path) -> None:
    cfg = StreamConfig(durability="none", max_frame_bytes=256)  # several frames
    async with AsyncStream(tmp_path, "cols", config=cfg) as s:
        values = [b"v%03d" % i for i in range(100)]
        assert await s.append_values(b"".join(values[:50]), [4] * 50) == range(50)
        chunks = [(b"".join(values[50:80]), [4] * 30), (b"".join(values[80:]), [4] * 20)]
        marker = {"batch": "b1"}
        assert await s.append_value_chunks(chunks, first_headers=marker) == range(50, 100)
        batches = [b async for b in s.read_columns(10, 95)]
        assert len(batches) > 1  # a batch per frame, moved in several hops or one
        got = [bytes(v) for b in batches for v in b.values]
        assert got == values[10:95]
        assert [o for b in batches for o in b.offsets] == list(range(10, 95))
        assert next(s.stream.read(50, 51)).headers == marker
        assert s.seen_end >= 95
        # bad input is refused as by Stream, and nothing is appended
        with pytest.raises(UsageError, match="lengths add up"):
            await s.append_values(b"abc", [1])
        assert await s.end_offset() == 100


async def test_staged_segments(tmp_path: Path) -> None:
    async with AsyncStream(tmp_path, "st", config=StreamConfig(durability="none")) as s:
        await s.append(b"first")
        stager = await s.stager("t")
        await anyio.to_thread.run_sync(stager.add_records, [b"a", b"b"])
        staged = await anyio.to_thread.run_sync(stager.finish)
        assert await s.staged() == [staged[0].path]
        assert await s.append_staged(staged, copy_below=0) == range(1, 3)
        assert [r.value async for r in s.read()] == [b"first", b"a", b"b"]
        left = await s.stager("dead")
        await anyio.to_thread.run_sync(left.add_records, [b"never"])
        await anyio.to_thread.run_sync(left.finish)
        assert await s.remove_staged(await s.staged("dead")) == 1
        assert await s.staged() == []


async def test_locked_end_read_through_and_recover(tmp_path: Path) -> None:
    async with AsyncStream(tmp_path, "t", config=StreamConfig(durability="none")) as s:
        await s.append_batch([b"%d" % i for i in range(30)])
        assert await s.locked_end_offset() == 30
        assert [r.offset async for r in s.read_through(25, 30)] == list(range(25, 30))
        assert await s.recover() == ()  # a clean tail: nothing cut


async def test_read_through_says_what_it_could_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsbus import OffsetOutOfRange
    from tests.lagging_view import lagging_view, segment_sizes

    cfg = StreamConfig(durability="none")
    with Stream.open(tmp_path, "lag", config=cfg) as w:
        w.append_batch([b"a"] * 20)
        sizes = segment_sizes(w.path)
        w.append_batch([b"b"] * 30)  # as from another host: this view ends at 20
    with lagging_view(monkeypatch, sizes, heal_after=None) as view:
        async with AsyncStream(tmp_path, "lag", config=cfg, create=False) as s:
            assert await s.end_offset() == 20
            assert await s.locked_end_offset() == 50
            got: list[int] = []

            async def read() -> None:
                async for r in s.read_through(0, 50):
                    got.append(r.offset)

            with pytest.raises(OffsetOutOfRange, match=r"offsets 20\.\.49 exist"):
                await read()
            assert got == list(range(20))  # what it could read, before the error
            assert sum(view.sleeps) == pytest.approx(5.0, abs=0.5)


async def test_group_administration(tmp_path: Path) -> None:
    async with AsyncStream(tmp_path, "g", config=StreamConfig(durability="none")) as s:
        await s.append_batch([b"x"] * 10)
        g = await s.group("billing", start="earliest")
        assert len(await g.poll(max_records=4)) == 4
        await g.commit()
        await g.aclose()
        assert await s.groups() == ["billing"]
        assert (await s.group_info("billing")).lag == 6
        await s.reset_group("billing", "latest")
        assert (await s.group_info("billing")).lag == 0
        await s.delete_group("billing")
        assert await s.groups() == []
