"""A router killed half way through copying a peer's message into its queues: the copies
it had not made are made by another process, once; those it had made are not made again.

The router is a real child process killed with SIGKILL from inside the I/O seam, just as
it renames its second copy into place (the first is in place and written down in the
message's marker). The marker (``fsbus/queues/.routed/<bucket>/<name>``, see
``fsbus/_queues/routed.py``) keeps the topic and the queues done, and is flocked while
its router copies.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus
from fsbus._queues import routed

from .conftest import Inbox, ready_child, wait_until
from .test_peer_router import FAST, PEER, plant_peer_message

_ROUTER = textwrap.dedent(
    """
    import os, signal, sys, anyio
    from fsbus import Bus, BusConfig
    from fsbus._bus.ops import Ops

    class DiesOnSecondCopy(Ops):
        copies = 0

        def rename(self, src, dst):
            # (a copy into a bucket not made yet fails, and goes again once it is)
            copy = "/queues/" in dst and "/bus/messages/" in dst
            if copy and os.path.isdir(os.path.dirname(dst)):
                DiesOnSecondCopy.copies += 1
                if DiesOnSecondCopy.copies == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
            return super().rename(src, dst)

    async def ignore(message):
        pass

    async def main():
        config = BusConfig(poll_interval=0.05, retry_interval=0.05, gc_interval=0.2)
        async with Bus(sys.argv[1], config=config, ops=DiesOnSecondCopy()) as bus:
            # consuming a queue makes it the router of peers' messages
            await bus.subscribe(None, ignore, queue="elected")
            print("ready", flush=True)
            await anyio.sleep_forever()

    anyio.run(main)
    """
)


def _declare(root: Path) -> None:
    with BlockingBus(root) as admin:
        admin.declare_queue("elected", ["nothing.here"])
        admin.declare_queue("a", ["foo.#"])
        admin.declare_queue("b", ["foo.#"])


def _kill_router_mid_copy(root: Path) -> str:
    """Run the router, plant a peer's message and wait for the router's SIGKILL; returns
    the message's name."""
    with ready_child(_ROUTER, root) as proc:
        name = plant_peer_message(root, b"peer")
        assert proc.wait(timeout=30) == -9
    return name


def _depths(root: Path) -> dict[str, int]:
    with BlockingBus(root) as admin:
        return {q: admin.queue_info(q).depth for q in "ab"}


def _marker(root: Path, name: str) -> Path:
    return root / "fsbus" / "queues" / ".routed" / PEER["bucket"] / name


@pytest.mark.anyio
async def test_the_router_that_takes_over_makes_only_the_missing_copy(root: Path) -> None:
    await anyio.to_thread.run_sync(_declare, root)
    name = await anyio.to_thread.run_sync(_kill_router_mid_copy, root)
    # the dead router made one copy and wrote it down; the marker is not done
    assert sorted((await anyio.to_thread.run_sync(_depths, root)).values()) == [0, 1]
    marker = _marker(root, name)
    lines = marker.read_text().splitlines()
    assert lines[0] == b"foo.bar".hex()
    assert len(lines) == 2
    assert lines[1] in ("a", "b")
    assert marker.stat().st_mode & 0o200
    inbox = {q: Inbox() for q in "ab"}
    async with Bus(root, config=FAST) as bus:
        for q in "ab":
            await bus.subscribe(None, inbox[q], queue=q)  # the new router
        for q in "ab":
            await inbox[q].wait_for(1)
        await wait_until(lambda: not marker.stat().st_mode & 0o200)  # done
        # each queue empties once its message's ack lands (a second copy would stay, or
        # be received: the payloads below)
        await wait_until(lambda: _depths(root) == {"a": 0, "b": 0})
        await bus.gc()
    assert {q: inbox[q].payloads for q in "ab"} == {"a": [b"peer"], "b": [b"peer"]}


@pytest.mark.anyio
async def test_garbage_collection_finishes_a_half_done_routing(root: Path) -> None:
    """A process that does not list the bus (it neither subscribes nor consumes) still
    finishes the dead router's job in its periodic sweep."""
    await anyio.to_thread.run_sync(_declare, root)
    name = await anyio.to_thread.run_sync(_kill_router_mid_copy, root)
    async with Bus(root, config=FAST) as bus:
        await wait_until(lambda: not _marker(root, name).stat().st_mode & 0o200)
        assert bus.statistics().scans == 0
    assert await anyio.to_thread.run_sync(_depths, root) == {"a": 1, "b": 1}


def test_a_marker_is_claimed_by_one_router_at_a_time(tmp_path: Path) -> None:
    base, bucket, name = str(tmp_path), "00", "m"
    first = routed.claim(base, bucket, name, "foo.bar")
    assert first is not None
    assert first.copied == set()
    # while its router holds it, no one else routes it (it is not done)
    assert routed.claim(base, bucket, name, "foo.bar") is None
    assert routed.resume(base, bucket, name) is None
    first.copied_into("a")
    first.close()  # died before it was done
    second = routed.claim(base, bucket, name, "foo.bar")
    assert second is not None
    assert (second.topic, second.copied) == ("foo.bar", {"a"})
    second.copied_into("b")
    second.done()
    second.close()
    assert routed.claim(base, bucket, name, "foo.bar") is None
    assert routed.abandoned(base, str(tmp_path / "messages")) == []
    # no temporary file is left behind
    assert os.listdir(tmp_path / ".routed" / bucket) == [name]


def test_markers_that_are_not_half_done_routings_are_left_alone(tmp_path: Path) -> None:
    base, bucket = str(tmp_path), "00"
    folder = tmp_path / ".routed" / bucket
    folder.mkdir(parents=True)
    (tmp_path / "messages" / bucket).mkdir(parents=True)
    for name in ("empty", "garbled", "unfinished", "link"):
        (tmp_path / "messages" / bucket / name).write_bytes(b"\0x")
    (folder / "empty").touch()  # an older fsbus's marker: routed
    (folder / "garbled").write_bytes(b"not hex\n")
    (folder / "unfinished").write_bytes(b"666f6f")  # its first line never ended
    (folder / "link").symlink_to(folder / "garbled")
    for name in ("empty", "garbled", "unfinished", "link"):
        assert routed.claim(base, bucket, name, "foo") is None
    assert routed.abandoned(base, str(tmp_path / "messages")) == []


def test_no_marker_is_taken_over_where_flock_stays_on_one_host(tmp_path: Path) -> None:
    """Where the bus claims work by rename (flock does not cross the mount's hosts), a
    free lock says nothing of a router on another host: a half-done marker is left."""
    base, bucket, name = str(tmp_path), "00", "m"
    (tmp_path / "messages" / bucket).mkdir(parents=True)
    (tmp_path / "messages" / bucket / name).write_bytes(b"\0x")
    first = routed.claim(base, bucket, name, "foo.bar", resumable=False)
    assert first is not None
    first.copied_into("a")
    first.close()
    assert routed.claim(base, bucket, name, "foo.bar", resumable=False) is None
    assert routed.abandoned(base, str(tmp_path / "messages"), resumable=False) == []
    # where flock crosses hosts, the same marker is finished
    [mark] = routed.abandoned(base, str(tmp_path / "messages"))
    assert mark.copied == {"a"}
    mark.close()
