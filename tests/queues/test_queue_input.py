"""Durable queues given bad input: options out of range, corrupt or foreign entries in
fsbus/queues/, a planted symbolic link, a full disk under a declare."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsbus import BlockingBus, Bus, DiskFull, QueueMismatch, QueueNotFound, StorageError, UsageError

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("option", "value"),
    [("message_ttl", NAN), ("message_ttl", INF), ("expires", NAN), ("expires", INF)],
)
def test_out_of_range_options_are_refused_on_declare(root: Path, option: str, value: float) -> None:
    with BlockingBus(root) as bus:
        with pytest.raises(
            UsageError,
            match=rf"^{option} must be a positive number of seconds \(finite, more than 0\)",
        ) as err:
            bus.declare_queue("q", ["e.#"], **{option: value})
        assert repr(value) in str(err.value)
        assert bus.queues() == []
        bus.publish("e.1", b"no queue took this")  # (a NaN ttl broke every publish)
        bus.declare_queue("q", ["e.#"], message_ttl=60, expires=3600, max_length=5)
        bus.publish("e.2", b"routed")
        assert bus.queue_info("q").depth == 1


@pytest.mark.parametrize("value", ["e.#", {"e.#": 1}])
def test_bindings_that_are_not_a_list_of_strings_are_quarantined(
    root: Path, caplog: pytest.LogCaptureFixture, value: object
) -> None:
    """A string (or an object) of bindings was iterated: "e.#" bound e, . and #."""
    with BlockingBus(root) as bus:
        bus.declare_queue("bad", ["x.only"])
    definition = root / "fsbus" / "queues" / "bad" / "queue.json"
    doc = json.loads(definition.read_bytes())
    doc["bindings"] = value
    definition.write_text(json.dumps(doc))
    caplog.set_level(logging.WARNING, logger="fsbus")
    with BlockingBus(root) as bus:
        bus.publish("e.anything", b"would be collected by the bindings e, . and #")
        assert bus.queues() == []
        with pytest.raises(QueueNotFound):
            bus.queue_info("bad")
    assert not definition.exists()
    assert len(list((root / "fsbus" / "quarantine").glob("*queue-bad.json"))) == 1
    warnings = [r.getMessage() for r in caplog.records if "corrupt definition" in r.getMessage()]
    assert len(warnings) == 1
    assert "bad bindings" in warnings[0]


def test_a_nan_ttl_written_in_a_definition_is_quarantined(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("bad", ["e.#"], message_ttl=5)
    definition = root / "fsbus" / "queues" / "bad" / "queue.json"
    definition.write_text(definition.read_text().replace('"message_ttl": 5', '"message_ttl": NaN'))
    caplog.set_level(logging.WARNING, logger="fsbus")
    with BlockingBus(root) as bus:
        bus.publish("e.1", b"publishes go on")
        assert bus.queues() == []
    assert "message_ttl" in " ".join(r.getMessage() for r in caplog.records)


def test_a_stray_file_in_the_queues_folder_is_skipped_silently(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["x"])
    queues = root / "fsbus" / "queues"
    (queues / "notes.txt").write_text("not a queue")
    caplog.set_level(logging.DEBUG, logger="fsbus")
    with BlockingBus(root) as bus:
        assert [q.name for q in bus.queues()] == ["q"]
        bus.publish("x", b"routed")
        assert bus.queue_info("q").depth == 1
        with pytest.raises(QueueNotFound):
            bus.queue_info("notes.txt")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (queues / "notes.txt").read_text() == "not a queue"


@pytest.fixture
def planted(root: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """fsbus/queues/evil: a symbolic link to an empty folder outside the bus."""
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["e.#"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = root / "fsbus" / "queues" / "evil"
    link.symlink_to(elsewhere, target_is_directory=True)
    yield link, elsewhere
    assert list(elsewhere.iterdir()) == [], "something was written through the link"


def test_declaring_over_a_planted_link_fails_and_writes_nothing_through_it(
    root: Path, planted: tuple[Path, Path]
) -> None:
    link, _elsewhere = planted
    with BlockingBus(root) as bus:
        with pytest.raises(StorageError, match="symbolic link") as err:
            bus.declare_queue("evil", ["e.#"])
        assert err.value.path == str(link)
        assert str(link) in str(err.value)
        assert "remove it" in str(err.value)
        bus.publish("e.1", b"into q only")
        assert [q.name for q in bus.queues()] == ["q"]
        for call in (
            lambda: bus.queue_info("evil"),
            lambda: bus.delete_queue("evil"),
            lambda: bus.bind_queue("evil", "x"),
            lambda: bus.purge_queue("evil"),
        ):
            with pytest.raises(StorageError, match="remove it"):
                call()
    assert link.is_symlink()


def test_a_planted_link_with_a_definition_behind_it_is_not_followed(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A link to a real queue's folder (say one moved away) is still no queue: listing
    skips it with one warning, and no copy is routed through it."""
    with BlockingBus(root) as bus:
        bus.declare_queue("evil", ["e.#"])
    queues = root / "fsbus" / "queues"
    elsewhere = tmp_path / "elsewhere"
    (queues / "evil").rename(elsewhere)
    (queues / "evil").symlink_to(elsewhere, target_is_directory=True)
    before = sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*"))
    caplog.set_level(logging.WARNING, logger="fsbus")
    with BlockingBus(root) as bus:
        assert bus.queues() == []
        assert bus.queues() == []
        assert bus.queues() == []
        bus.publish("e.1", b"not through the link")
        with pytest.raises(StorageError, match="symbolic link"):
            bus.declare_queue("evil", ["e.#"])
    assert sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*")) == before
    warned = [r.getMessage() for r in caplog.records if "symbolic link" in r.getMessage()]
    assert len(warned) == 1
    assert str(queues / "evil") in warned[0]


def test_the_api_mismatch_says_which_side_was_asked(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["a"], max_length=10)
        with pytest.raises(QueueMismatch) as err:
            bus.declare_queue("q", ["a"], max_length=5)
    assert "max_length: asked 5, the queue has 10" in str(err.value)


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def full_fs(tmp_path: Path) -> Iterator[Path]:
    """A 600 KiB tmpfs (root only), unmounted afterwards."""
    from tests.faults.conftest import tmpfs_at

    with tmpfs_at(tmp_path / "small", "size=600k,nr_inodes=20000,mode=0755") as mnt:
        yield mnt


def _fill(fs: Path) -> Path:
    """Take every free byte of the filesystem with one file; returns it."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError, match="No space left"):  # noqa: PT012
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return filler


def test_declare_bind_and_unbind_on_a_full_disk_raise_disk_full(full_fs: Path) -> None:
    root = full_fs / "bus"
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["a"])
        filler = _fill(full_fs)
        with pytest.raises(DiskFull) as err:
            bus.declare_queue("q3", ["z"])
        message = str(err.value)
        assert "declaring queue 'q3' failed at" in message
        assert "free space" in message
        assert str(err.value.path).startswith(str(root))
        assert isinstance(err.value.__cause__, OSError)
        assert [q.name for q in bus.queues()] == ["q"]
        assert not (root / "fsbus" / "queues" / "q3").exists()  # nothing half made
        with pytest.raises(DiskFull, match=r"binding 'b' of queue 'q' failed at .*free space"):
            bus.bind_queue("q", "b")
        with pytest.raises(DiskFull, match=r"unbinding 'a' of queue 'q' failed at"):
            bus.unbind_queue("q", "a")
        assert bus.queue_info("q").bindings == ("a",)
        filler.unlink()
        bus.declare_queue("q3", ["z"])
        bus.bind_queue("q", "b")
        assert bus.queue_info("q").bindings == ("a", "b")
        bus.publish("z", b"in q3")
        assert bus.queue_info("q3").depth == 1


@pytest.mark.anyio
async def test_a_full_disk_declare_is_disk_full_in_the_async_face(full_fs: Path) -> None:
    async with Bus(full_fs / "bus") as bus:
        _fill(full_fs)
        with pytest.raises(DiskFull, match="declaring queue 'q3'"):
            await bus.declare_queue("q3", ["z"])


def test_cli_declare_on_a_full_disk_names_the_path(full_fs: Path) -> None:
    import sys

    root = full_fs / "bus"
    with BlockingBus(root):
        pass
    _fill(full_fs)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [sys.executable, "-m", "fsbus", "--root", str(root), "queue", "declare", "q3", "z"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("fsbus: error: declaring queue 'q3' failed at " + str(root)), line
    assert "free space" in line
