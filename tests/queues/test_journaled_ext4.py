"""Durable queues on a real journaled ext4 (a loop-mounted image; root only).

There the bus renames a durable message of one page, and its queue copies, before it
syncs them (``Platform.durable_order``, docs/queues.md, Performance): detected from the
real mount table and ``/proc/fs/jbd2``, and exercised by real processes, each message
counted per queue.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsbus import BlockingBus
from fsbus._core.mounts import detect, mount_facts

from .test_queue_processes import FAST, Spawn, check_counts, wait_all, wait_empty


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
    with BlockingBus(ext4 / "probe") as bus:
        assert bus._fs.platform.durable_order == "place_first"
        assert "renamed, then synced" in bus._fs.platform.describe()


def test_durable_messages_into_two_queues_placed_first(root: Path, spawn: Spawn) -> None:
    """Two queues, two consumers each, 300 durable messages from another process: every
    one handled once per queue, and the queues empty after."""
    with BlockingBus(root) as bus:
        bus.declare_queue("billing", ["orders.*"])
        bus.declare_queue("audit", ["orders.#"])
    groups = {
        q: [spawn("consumer", queue=q, config=FAST) for _ in range(2)] for q in ("billing", "audit")
    }
    for group in groups.values():
        for c in group:
            c.wait_count("ready", 1)
    ids = [str(i) for i in range(300)]
    pub = spawn("pub", messages=[["orders.new", i] for i in ids], durable=True, config=FAST)
    pub.wait_count("published", len(ids))
    for q, group in groups.items():
        wait_all(group, q, set(ids))
        done = check_counts(group, q, set(ids))
        assert set(done.values()) == {1}, f"{q}: a message handled twice without a kill"
    with BlockingBus(root) as bus:
        wait_empty(bus, "billing", "audit")
