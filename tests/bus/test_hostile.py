"""Strangers' files in the bus directory: quarantined or ignored, never fatal, never followed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, StorageError
from fsbus._bus.names import encode_topic, make_name
from fsbus._bus.ops import Ops

from .conftest import Inbox, files_under, message_files, peer_buckets, wait_until


def peer_name(topic: str, *, single: bool, ttl: float = 3600) -> str:
    """A qlobber-fsq style name for ``topic`` that expires in ``ttl`` seconds."""
    name, spill = make_name(
        encode_topic(topic),
        split_at=200,
        expires_ms=int((time.time() + ttl) * 1000),
        kind="s" if single else "m",
        unique=os.urandom(16).hex(),
    )
    assert spill is None
    return name


def prepare(root: Path) -> None:
    """Create the bus layout (as a first Bus would), with every bucket directory (as a
    qlobber-fsq peer makes them) for the files planted there."""
    with BlockingBus(root):
        pass
    peer_buckets(root)


@pytest.mark.anyio
async def test_foreign_files_are_quarantined_and_counted(root: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    (root / "messages" / "00" / "README").write_text("not a message")
    (root / "messages" / "7f" / "zz@s+ff+m+junk").write_text("bad hex topic")
    (root / "messages" / "a0" / "x@s+1+m").write_text("three fields")
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("#", inbox)
        await wait_until(lambda: bus.statistics().quarantined == 3)
        await bus.publish("still.works", b"yes")
        await inbox.wait_for(1)
    assert inbox.topics == ["still.works"]
    assert len(message_files(root)) == 1
    moved = files_under(root / "fsbus" / "quarantine")
    assert len(moved) == 3
    assert any(m.endswith("-00-README") for m in moved)
    assert {(root / "fsbus" / "quarantine" / m).read_text() for m in moved} == {
        "not a message",
        "bad hex topic",
        "three fields",
    }


@pytest.mark.anyio
async def test_foreign_file_dropped_while_running_is_quarantined(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root, config=BusConfig(refresh_ttl=0.1, poll_interval=0.05)) as bus:
        await bus.subscribe("#", inbox)
        peer_buckets(root)
        await anyio.Path(root / "messages" / "3c" / "editor-backup~").write_text("x")
        await wait_until(lambda: bus.statistics().quarantined == 1)
        await bus.publish("after", b"1")
        await inbox.wait_for(1)
    assert message_files(root) != []


@pytest.mark.anyio
async def test_gc_quarantines_foreign_files_too(root: Path) -> None:
    async with Bus(root) as bus:
        peer_buckets(root)
        await anyio.Path(root / "messages" / "11" / "stray.txt").write_text("x")
        assert await bus.gc() == 1
        assert bus.statistics().quarantined == 1
    assert message_files(root) == []


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_a_planted_symlink_is_never_followed(
    root: Path, tmp_path: Path, single: bool
) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    secret = tmp_path / "secret"
    secret.write_bytes(b"\x00do not read or truncate me")
    link = root / "messages" / "42" / peer_name("steal.this", single=single)
    link.symlink_to(secret)
    inbox = Inbox()
    async with Bus(root, config=BusConfig(retry_interval=0.05)) as bus:
        await bus.subscribe("#", inbox, existing=True)
        await bus.publish("barrier", b"b", single=single)
        await inbox.wait_topic("barrier")
        # Give singles a few retry rounds at the link; it must stay untouched.
        scans = bus.statistics().scans
        await wait_until(lambda: bus.statistics().scans >= scans + 3)
    assert inbox.topics == ["barrier"]
    assert secret.read_bytes() == b"\x00do not read or truncate me"
    assert link.is_symlink()


@pytest.mark.anyio
async def test_an_expired_symlink_is_removed_not_its_target(root: Path, tmp_path: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    secret = tmp_path / "secret"
    secret.write_bytes(b"\x00keep")
    link = root / "messages" / "42" / peer_name("old", single=False, ttl=-10)
    link.symlink_to(secret)
    async with Bus(root) as bus:
        assert await bus.gc() == 1
    assert not link.is_symlink()
    assert secret.read_bytes() == b"\x00keep"


@pytest.mark.anyio
async def test_a_symlinked_bucket_directory_is_refused(root: Path, tmp_path: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bucket = root / "messages" / "05"
    bucket.rmdir()
    bucket.symlink_to(elsewhere)
    with pytest.raises(StorageError, match="symbolic link") as caught:
        async with Bus(root):
            pass
    assert caught.value.path == str(bucket)


@pytest.mark.parametrize("parent", ["meta", "attempts"])
@pytest.mark.anyio
async def test_a_symlinked_sidecar_bucket_is_refused(
    root: Path, tmp_path: Path, parent: str
) -> None:
    """The buckets of fsbus/meta and fsbus/attempts are made on first use: a link planted
    in their place before a bus opens is refused all the same (sidecars written through
    it would land elsewhere)."""
    await anyio.to_thread.run_sync(prepare, root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bucket = root / "fsbus" / parent / "05"
    bucket.symlink_to(elsewhere)
    with pytest.raises(StorageError, match="symbolic link") as caught:
        async with Bus(root):
            pass
    assert caught.value.path == str(bucket)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.anyio
async def test_sidecar_buckets_are_made_on_first_use(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        assert list((root / "fsbus" / "meta").iterdir()) == []
        assert list((root / "fsbus" / "attempts").iterdir()) == []
        await bus.subscribe("h", inbox)
        info = await bus.publish("h", b"x", headers={"k": "v"})
        (msg,) = await inbox.wait_for(1)
    assert msg.headers == {"k": "v"}
    assert [p.name for p in (root / "fsbus" / "meta").iterdir()] == [info.bucket]


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_a_directory_named_like_a_message_does_not_stop_delivery(
    root: Path, single: bool
) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    (root / "messages" / "00" / peer_name("a.dir", single=single)).mkdir()
    inbox = Inbox()
    async with Bus(root, config=BusConfig(retry_interval=0.05)) as bus:
        await bus.subscribe("#", inbox, existing=True)
        await bus.publish("real", b"r", single=single)
        await inbox.wait_topic("real")
    assert inbox.topics == ["real"]


@pytest.mark.anyio
async def test_an_empty_single_leftover_is_removed(root: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    leftover = root / "messages" / "10" / peer_name("job", single=True)
    leftover.write_bytes(b"")
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("job", inbox)
        await wait_until(lambda: not leftover.exists())
        await bus.publish("job", b"real", single=True)
        await inbox.wait_for(1)
    assert inbox.payloads == [b"real"]


@pytest.mark.anyio
async def test_an_empty_multi_file_is_not_delivered(root: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    (root / "messages" / "10" / peer_name("m", single=False)).write_bytes(b"")
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("m", inbox, existing=True)
        await bus.publish("m", b"real")
        await inbox.wait_for(1)
    assert inbox.payloads == [b"real"]


@pytest.mark.anyio
async def test_a_corrupt_headers_sidecar_gives_no_headers(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        info = await bus.publish("h", b"x", single=True, headers={"k": "v"})
        await anyio.Path(root / "fsbus" / "meta" / info.bucket / info.name).write_bytes(b"{nope")
        await bus.subscribe("h", inbox)
        (msg,) = await inbox.wait_for(1)
    assert msg.payload == b"x"
    assert msg.headers == {}


@pytest.mark.anyio
async def test_a_garbage_attempts_file_counts_as_none(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        info = await bus.publish("a", b"x", single=True)
        counter = anyio.Path(root / "fsbus" / "attempts" / info.bucket / info.name)
        await counter.parent.mkdir(exist_ok=True)  # (made on first use)
        await counter.write_text("??")
        await bus.subscribe("a", inbox)
        (msg,) = await inbox.wait_for(1)
    assert msg.delivery_count == 1


@pytest.mark.anyio
async def test_a_short_update_file_while_running(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("#", inbox)
        update = anyio.Path(root / "update" / "UPDATE")
        await update.write_bytes(b"short")
        for i in range(5):
            await bus.publish(f"u.{i}", b"x")
        await inbox.wait_for(5)
    assert sorted(inbox.topics) == [f"u.{i}" for i in range(5)]


@pytest.mark.anyio
async def test_a_short_update_file_is_rewritten_on_open(root: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    update = anyio.Path(root / "update" / "UPDATE")
    await update.write_bytes(b"\x01\x02")
    async with Bus(root) as bus:
        assert (await update.stat()).st_size == 256 * 32
        inbox = Inbox()
        await bus.subscribe("#", inbox)
        await bus.publish("x", b"1")
        await inbox.wait_for(1)


@pytest.mark.anyio
async def test_a_missing_update_file_while_running(root: Path) -> None:
    inbox = Inbox()
    async with Bus(root, config=BusConfig(poll_interval=0.05)) as bus:
        await bus.subscribe("#", inbox)
        await anyio.Path(root / "update" / "UPDATE").unlink()
        await bus.publish("gone.update", b"x")
        await inbox.wait_for(1)


@pytest.mark.anyio
async def test_an_update_file_replaced_while_running(root: Path) -> None:
    """UPDATE replaced by a new file (renamed over it): a running subscriber reads it
    through a descriptor kept open, so it sees the new file's stamps after its next full
    listing (every ``refresh_ttl``), and meanwhile messages stamped in either file
    reach it."""
    inbox = Inbox()
    config = BusConfig(refresh_ttl=0.2)
    update = root / "update" / "UPDATE"
    async with Bus(root, config=config) as bus:
        await bus.subscribe("#", inbox)
        await bus.publish("before", b"x")  # stamped in the old file
        await inbox.wait_topic("before")
        fresh = root / "update" / "UPDATE.new"
        await anyio.Path(fresh).write_bytes(os.urandom((await anyio.Path(update).stat()).st_size))
        os.rename(fresh, update)
        with BlockingBus(root, config=config) as other:  # opens and stamps the new file
            await anyio.to_thread.run_sync(other.publish, "after", b"y")
        await inbox.wait_topic("after")
        await bus.publish("again", b"z")  # this bus still stamps the file it opened
        await inbox.wait_topic("again")
    assert sorted(inbox.topics) == ["after", "again", "before"]


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_a_fifo_named_like_a_message_does_not_hang_the_bus(root: Path, single: bool) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    os.mkfifo(root / "messages" / "00" / peer_name("a.fifo", single=single))
    inbox = Inbox()
    async with Bus(root, config=BusConfig(retry_interval=0.05)) as bus:
        await bus.subscribe("#", inbox, existing=True)
        await bus.publish("real", b"r", single=single)
        await inbox.wait_topic("real")
    assert inbox.topics == ["real"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_a_device_node_named_like_a_message_is_never_read(root: Path, single: bool) -> None:
    import stat

    await anyio.to_thread.run_sync(prepare, root)
    node = root / "messages" / "00" / peer_name("a.device", single=single)
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is
    inbox = Inbox()
    async with Bus(root, config=BusConfig(retry_interval=0.05)) as bus:
        await bus.subscribe("#", inbox, existing=True)
        await bus.publish("real", b"r", single=single)
        await inbox.wait_topic("real")
    assert inbox.topics == ["real"]


def _make_sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # a hole: no blocks, but all of it to anyone who reads it


def _sizes_of(root: Path, name: str) -> list[int]:
    """Sizes of the file named ``name`` wherever it is now (its bucket or the quarantine)."""
    here = [p for p in root.rglob(name) if p.is_file()]
    moved = list((root / "fsbus" / "quarantine").glob(f"*{name[-20:]}"))
    return [p.stat().st_size for p in here + moved]


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.anyio
async def test_a_one_terabyte_sparse_file_named_like_a_message_is_not_read(
    root: Path, single: bool
) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    name = peer_name("a.huge", single=single)
    await anyio.to_thread.run_sync(_make_sparse, root / "messages" / "00" / name, 1 << 40)
    inbox = Inbox()
    async with Bus(root, config=BusConfig(retry_interval=0.05)) as bus:
        await bus.subscribe("#", inbox, existing=True)
        await bus.publish("real", b"r", single=single)
        await inbox.wait_topic("real")
    assert inbox.topics == ["real"]  # over max_payload_size: never read into memory
    sizes = await anyio.to_thread.run_sync(_sizes_of, root, name)
    assert sizes == [1 << 40]  # kept once, nothing truncated


class SpillOpens(Ops):
    """Counts the opens of files under ``topics/`` (topic spills)."""

    def __init__(self) -> None:
        self.spill_opens = 0

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        if "/topics/" in path:
            self.spill_opens += 1
        return super().open(path, flags, mode)


@pytest.mark.parametrize("bad", ["non-ascii", "symlink", "directory"])
@pytest.mark.anyio
async def test_a_bad_topic_spill_is_quarantined_once_not_read_at_every_listing(
    root: Path, tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    topic = "long." + "x" * 300
    name, spill = make_name(
        encode_topic(topic),
        split_at=200,
        expires_ms=int((time.time() + 3600) * 1000),
        kind="m",
        unique=os.urandom(16).hex(),
    )
    assert spill is not None
    (root / "messages" / "42" / name).write_bytes(b"\x00payload")
    spill_path = root / "topics" / "42" / name
    spill_path.parent.mkdir(parents=True, exist_ok=True)
    if bad == "non-ascii":
        spill_path.write_bytes(spill.encode() + "é".encode())
    elif bad == "symlink":
        target = tmp_path / "elsewhere"
        target.write_text(spill)  # a valid rest: only the link makes it bad
        spill_path.symlink_to(target)
    else:
        spill_path.mkdir()
    ops = SpillOpens()
    inbox = Inbox()
    config = BusConfig(refresh_ttl=0.05, poll_interval=0.02)
    async with Bus(root, config=config, ops=ops) as bus:
        await bus.subscribe("#", inbox)
        await wait_until(lambda: bus.statistics().quarantined == 1)
        # Many full listings later, the spill was read once and the message moved once.
        scans = bus.statistics().scans
        await wait_until(lambda: bus.statistics().scans >= scans + 10)
        await bus.publish("still.works", b"yes")
        await inbox.wait_for(1)
        assert bus.statistics().quarantined == 1
    assert ops.spill_opens == 1
    assert inbox.topics == ["still.works"]
    moved = files_under(root / "fsbus" / "quarantine")
    assert len(moved) == 1
    assert moved[0].endswith(name[-40:])
    warnings = [r for r in caplog.records if "foreign file" in r.getMessage()]
    assert len(warnings) == 1
