"""Durable queues on a real journaled ext4 (a loop-mounted image; root only).

There a durable publish is made durable by a record in its process's durable log
(``durable_log="auto"``, ``Platform.durable_log``: fsbus/_bus/wal.py), or, with
``durable_log="off"``, the message of one page and its queue copies are renamed before
they are synced (``Platform.durable_order``); docs/queues.md, Performance. Detected from
the real mount table and ``/proc/fs/jbd2``, and exercised by real processes, each
message counted per queue.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig, Message
from fsbus._core.mounts import detect, mount_facts
from tests.peer_process import JsonLinesPeer

from .test_queue_processes import FAST, Spawn, check_counts, handled, wait_all, wait_empty


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "mounting an ext4 image needs root"
    for tool in ("mkfs.ext4", "mount", "umount", "truncate"):
        if shutil.which(tool) is None:
            return f"{tool} is missing"
    return None


@pytest.fixture(scope="module")
def ext4() -> Iterator[Path]:
    """A fresh journaled ext4, loop-mounted for this module."""
    why = _unavailable()
    if why:
        pytest.skip(why)
    outer = Path(tempfile.mkdtemp(prefix="fsbus-test-ext4-"))
    img, mnt = outer / "ext4.img", outer / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "256M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "has_journal", str(img)], check=True)
    done = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True)
    if done.returncode != 0:
        shutil.rmtree(outer, ignore_errors=True)
        pytest.skip(f"cannot loop-mount an image here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        if subprocess.run(["mountpoint", "-q", str(mnt)], check=False).returncode == 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        shutil.rmtree(outer, ignore_errors=True)


@pytest.fixture
def root(ext4: Path, request: pytest.FixtureRequest) -> Path:
    return ext4 / request.node.name.replace("/", "_")


def test_the_real_mount_is_seen_as_journaled(ext4: Path) -> None:
    assert mount_facts(str(ext4)).journaled is True
    assert detect(str(ext4)).durable_order == "place_first"
    assert detect(str(ext4)).durable_log is True
    with BlockingBus(ext4 / "probe") as bus:
        assert bus._fs.platform.durable_order == "place_first"
        assert "renamed, then synced" in bus._fs.platform.describe()
        assert "through the durable log" in bus._fs.platform.describe()
        assert bus._fs.log_source is not None


def _journal_transactions(mount: Path) -> int:
    """Transactions the journal of the filesystem at ``mount`` has committed so far."""
    dev = os.stat(mount).st_dev
    for entry in Path("/proc/fs/jbd2").iterdir():
        try:
            if os.stat(f"/dev/{entry.name.rsplit('-', 1)[0]}").st_rdev == dev:
                return int((entry / "info").read_text().split()[0])
        except OSError:
            continue
    raise AssertionError(f"no journal statistics for {mount} in /proc/fs/jbd2")


@pytest.mark.parametrize(("mode", "most"), [("auto", 0.05), ("off", 1.5)])
def test_a_durable_publish_through_the_log_commits_no_journal_transaction(
    root: Path, ext4: Path, mode: str, most: float
) -> None:
    """The durable log's point: one data sync of a file written ahead, no journal
    commit (a checkpoint a second, the kernel's own commit every 5 s); the files synced
    one by one commit once a publish. Counted by the journal itself."""
    n = 300
    with BlockingBus(root, config=BusConfig.model_validate({"durable_log": mode})) as bus:
        bus.declare_queue("q", ["t.#"])
        for i in range(20):
            bus.publish("t.x", b"warm %d" % i, durable=True)
        before = _journal_transactions(ext4)
        for i in range(n):
            bus.publish("t.x", b"m %d" % i, durable=True)
        commits = _journal_transactions(ext4) - before
        assert bus.queue_info("q").depth == n + 20
    assert commits <= most * n, f"{commits} journal commits for {n} durable publishes"
    if mode == "off":
        assert commits >= n * 0.9  # (one a publish: what the log saves)


def _two_queues_consumed(root: Path, spawn: Spawn) -> dict[str, list[JsonLinesPeer]]:
    """Queues billing (``orders.*``) and audit (``orders.#``), two consumer processes
    each, ready."""
    with BlockingBus(root) as bus:
        bus.declare_queue("billing", ["orders.*"])
        bus.declare_queue("audit", ["orders.#"])
    groups = {
        q: [spawn("consumer", queue=q, config=FAST) for _ in range(2)] for q in ("billing", "audit")
    }
    for group in groups.values():
        for c in group:
            c.wait_count("ready", 1)
    return groups


@pytest.mark.parametrize("mode", ["auto", "off"], ids=["log", "placed-first"])
def test_durable_messages_into_two_queues(root: Path, spawn: Spawn, mode: str) -> None:
    """Two queues, two consumers each, 300 durable messages from another process: every
    one handled once per queue, and the queues empty after."""
    groups = _two_queues_consumed(root, spawn)
    ids = [str(i) for i in range(300)]
    config = {**FAST, "durable_log": mode}
    pub = spawn("pub", messages=[["orders.new", i] for i in ids], durable=True, config=config)
    pub.wait_count("published", len(ids))
    for q, group in groups.items():
        wait_all(group, q, set(ids))
        done = check_counts(group, q, set(ids))
        assert set(done.values()) == {1}, f"{q}: a message handled twice without a kill"
    with BlockingBus(root) as bus:
        wait_empty(bus, "billing", "audit")


def test_a_killed_publishers_log_is_retired_and_its_messages_all_arrive(
    root: Path, spawn: Spawn
) -> None:
    """A publisher killed with SIGKILL mid-flow leaves its durable log behind; the
    running consumers' gc finds it dead (same boot: syncfs, removed), and every message
    it said was published is handled in each queue; a duplicate only as a redelivery."""
    groups = _two_queues_consumed(root, spawn)
    sent = [str(i) for i in range(5000)]
    pub = spawn("pub", messages=[["orders.new", i] for i in sent], durable=True, config=FAST)
    pub.wait_count("published", 300)
    logs = root / "fsbus" / "wal"
    assert [p.name for p in logs.iterdir()], "the publisher has no durable log"
    pub.kill()
    published = {e["id"] for e in pub.of("published")}
    assert 300 <= len(published) < len(sent)
    for q, group in groups.items():
        wait_all(group, q, published)
        done = check_counts(group, q, set(handled(group, q)))  # (duplicates: redeliveries)
        assert published <= set(done) <= set(sent)
        # at most the one publish under way at the kill, besides the published ones
        assert len(set(done) - published) <= 1
    deadline = time.monotonic() + 30
    while list(logs.iterdir()):
        assert time.monotonic() < deadline, (
            f"the dead publisher's log stays: {list(logs.iterdir())}"
        )
        time.sleep(0.05)


_PUBLISH_MANY = """
import sys
from fsbus import BlockingBus
root, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with BlockingBus(root) as bus:
    for s in range(0, n, k):
        bus.publish_many([("t", str(i)) for i in range(s, min(n, s + k))], durable=True)
"""


@pytest.mark.anyio
async def test_a_running_consumer_gets_durable_publish_many_batches_in_order(root: Path) -> None:
    """Batches of durable messages through the durable log, from another process, while
    a queue consumer runs: each message once, in the order published (before each was
    stamped as it was placed, a batch's stamps waited for its record, and a consumer
    took later messages of a batch before earlier ones: in 5 runs of 5)."""
    n = 2000
    got: list[int] = []
    done = anyio.Event()

    async def handler(msg: Message) -> None:
        got.append(int(msg.payload))
        if len(got) == n:
            done.set()

    async with Bus(root) as bus:
        assert bus._fs.log_source is not None  # (through the durable log)
        await bus.declare_queue("q", ["t"])
        await bus.subscribe(None, handler, queue="q")
        await anyio.run_process([sys.executable, "-c", _PUBLISH_MANY, str(root), str(n), "100"])
        with anyio.fail_after(60):
            await done.wait()
    assert got == list(range(n))
