"""Hostile input: nothing may make fsbus read or write outside its root or crash a reader.

Topics and header values that look like paths, NUL bytes, huge names, file names in
bucket directories that are not UTF-8 or whose hex is not UTF-8, spill files that are
symlinks, hard links or garbage, message files that are hard links to files outside the
bus. (Planted symlinked messages, FIFOs and directories are covered by the bus tests.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsbus import BlockingBus, Bus, BusConfig, InvalidHeader, InvalidTopic, StorageError
from fsbus._bus.names import encode_topic, make_name

from .conftest import Inbox, until

FAST = BusConfig(bucket_num_chars=1, poll_interval=0.05, retry_interval=0.05, refresh_ttl=0.1)

TRAVERSAL = [
    "../../../../etc/passwd",
    "/etc/passwd",
    "a/../../b",
    "..",
    ".",
    "messages/0",
    "~root",
    "x" * 1000,
    "ü.日本.🙂",
]


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.anyio
async def test_path_like_topics_and_headers_stay_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    outside_before = _tree(tmp_path)
    inbox = Inbox()
    async with Bus(root, config=FAST) as bus:
        await bus.subscribe("#", inbox)
        for i, topic in enumerate(TRAVERSAL):
            await bus.publish(
                topic,
                b"p",
                single=i % 2 == 0,
                headers={"../../x": "../../../etc/shadow", "/abs": "\\..\\.."},
            )
        await inbox.wait(len(TRAVERSAL))
    assert sorted(inbox.topics) == sorted(TRAVERSAL)
    assert all(
        m.headers == {"../../x": "../../../etc/shadow", "/abs": "\\..\\.."} for m in inbox.messages
    )
    created = _tree(tmp_path) - outside_before
    assert all(c == "bus" or c.startswith("bus/") for c in created)
    for p in root.rglob("*"):
        assert p.resolve().is_relative_to(root.resolve())


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("topic", "headers", "error", "words"),
    [
        ("a\x00b", None, InvalidTopic, "control character"),
        ("a" * 1025, None, InvalidTopic, "more than the limit"),
        (".".join(["w"] * 101), None, InvalidTopic, "words"),
        ("ok", {"k": "v\x00"}, InvalidHeader, "NUL"),
        ("ok", {"bad\x00name": "v"}, InvalidHeader, "printable"),
        ("ok", {"k": "v" * 70_000}, InvalidHeader, "bytes"),
        ("ok", {"k" * 300: "v"}, InvalidHeader, "1-256"),
        ("\udcff", None, InvalidTopic, "UTF-8"),
    ],
)
async def test_bad_topics_and_headers_are_refused_before_any_write(
    tmp_path: Path, topic: str, headers: dict[str, str] | None, error: type, words: str
) -> None:
    root = tmp_path / "bus"
    async with Bus(root, config=FAST) as bus:
        before = _tree(root)
        with pytest.raises(error, match=words):
            await bus.publish(topic, b"x", headers=headers)
        assert _tree(root) == before


def _peer_name(topic_hex: str, *, single: bool = False) -> str:
    name, _ = make_name(
        topic_hex, split_at=200, expires_ms=2**42, kind="s" if single else "m", unique="0" * 32
    )
    return name


@pytest.mark.anyio
async def test_names_that_are_not_utf8_are_quarantined_and_delivery_goes_on(
    tmp_path: Path,
) -> None:
    root = tmp_path / "bus"
    inbox = Inbox()
    async with Bus(root, config=FAST) as bus:
        await bus.subscribe("#", inbox, existing=True)
        bucket = os.fsencode(root / "messages" / "0")
        os.makedirs(bucket, exist_ok=True)  # (as a qlobber-fsq peer makes every bucket)
        planted = [
            bucket + b"/\xff\xfe@s+" + b"ffffffffff+m+" + b"0" * 32,  # not UTF-8 at all
            bucket + b"/" + _peer_name("ff80").encode() + b"",  # hex of invalid UTF-8
            bucket + b"/" + _peer_name("c0af", single=True).encode(),  # overlong '/'
            bucket + b"/\xc3\x28",
        ]
        for raw in planted:
            fd = os.open(raw, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"\x00junk")
            os.close(fd)
        await bus.publish("real", b"r")
        await inbox.wait(1)
        await until(lambda: bus.statistics().quarantined >= len(planted))
        assert inbox.topics == ["real"]
        left = os.listdir(bucket)
        assert all(os.fsencode(os.path.join(bucket, n)) not in planted for n in left)
        assert len(os.listdir(root / "fsbus" / "quarantine")) == len(planted)


@pytest.mark.anyio
async def test_hostile_spill_files_never_make_a_reader_leave_the_root(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    secret = tmp_path / "secret"
    secret.write_text("6f757473696465")  # hex of "outside": would decode to a topic
    inbox = Inbox()
    async with Bus(root, config=FAST) as bus:
        await bus.subscribe("#", inbox)
        long_hex = encode_topic("long." + "y" * 120)
        cases = {}
        for kind in ("symlink", "hardlink", "garbage", "huge"):
            name, rest = make_name(
                long_hex, split_at=200, expires_ms=2**42, kind="m", unique=os.urandom(16).hex()
            )
            assert rest is not None
            spill = root / "topics" / "0" / name
            spill.parent.mkdir(exist_ok=True)  # (as a qlobber-fsq peer makes every bucket)
            if kind == "symlink":
                spill.symlink_to(secret)
            elif kind == "hardlink":
                os.link(secret, spill)
            elif kind == "garbage":
                spill.write_bytes(b"\xff\x00../..")
            else:
                spill.write_text("ab" * 50_000)
            (root / "staging" / name).write_bytes(b"\x00" + kind.encode())
            (root / "messages" / "0").mkdir(exist_ok=True)
            (root / "staging" / name).rename(root / "messages" / "0" / name)
            cases[kind] = name
        await bus.publish("real", b"r")
        # A hard-linked spill is a file from elsewhere (a peer can link any file it
        # can see where fs.protected_hardlinks is off, or when it is privileged): it is
        # never read as a topic, and its message is quarantined like one whose spill
        # decodes to invalid UTF-8 (whose long name once broke the quarantine).
        # A symlinked or non-ASCII spill counts as missing: that message waits,
        # unmatched, until it expires.
        await inbox.wait(1)
        await until(lambda: bus.statistics().quarantined >= 2)
        assert (root / "topics" / "0" / cases["symlink"]).is_symlink()
    assert inbox.topics == ["real"]
    assert secret.read_text() == "6f757473696465"
    assert secret.stat().st_nlink == 2  # the link itself was left alone


def _plant_link(root: Path, target: Path, topic: str, kind: str) -> Path:
    """A hard link to ``target`` under a valid message name in bucket 0."""
    name, rest = make_name(
        encode_topic(topic), split_at=200, expires_ms=2**42, kind=kind, unique=os.urandom(16).hex()
    )
    assert rest is None
    link = root / "messages" / "0" / name
    link.parent.mkdir(exist_ok=True)  # (as a qlobber-fsq peer makes every bucket)
    os.link(target, link)
    return link


@pytest.mark.parametrize(
    ("kind", "locking"), [("s", "flock"), ("s", "rename"), ("m", "flock")], ids=str
)
def test_a_hard_link_to_an_outside_file_is_not_a_message(
    tmp_path: Path, kind: str, locking: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A peer links a file it can see (but should not leak or destroy) into the bus
    # under a valid name. Consuming and acking it once delivered the file's bytes and
    # truncated the outside file to 0 bytes.
    root = tmp_path / "bus"
    outside = tmp_path / "precious"
    outside.write_bytes(b"\x00do not leak or truncate me")
    config = FAST.model_copy(update={"locking": locking})
    with BlockingBus(root, config=config) as bus:
        link = _plant_link(root, outside, "jobs.evil", kind)
        bus.publish("jobs.real", b"real", single=kind == "s")
        with (
            caplog.at_level("WARNING", logger="fsbus"),
            bus.messages("jobs.#", existing=True) as it,
        ):
            msg = it.get(timeout=10)
            assert (msg.topic, msg.payload) == ("jobs.real", b"real")
            it.ack(msg)
            deadline_reached = False
            try:
                it.get(timeout=0.5)  # nothing else: the link is never delivered
            except TimeoutError:
                deadline_reached = True
            assert deadline_reached
        assert not link.exists()  # moved aside for a human
        quarantined = list((root / "fsbus" / "quarantine").iterdir())
        assert len(quarantined) == 1
        assert quarantined[0].stat().st_ino == outside.stat().st_ino
    assert outside.read_bytes() == b"\x00do not leak or truncate me"
    assert "hard links" in caplog.text
    assert "not a message" in caplog.text


@pytest.mark.parametrize("staged_in", ["staging", "fsbus/spares"])
@pytest.mark.parametrize("locking", ["flock", "rename"])
def test_a_rename_a_power_cut_left_half_done_is_still_a_message(
    tmp_path: Path, locking: str, staged_in: str
) -> None:
    # Each directory is written back on its own: a cut can keep a message's entry in
    # its bucket and lose the removal of the name it was staged under (one file, two
    # names): its staging name, or a spare's (a plain publish's, on a local disk).
    root = tmp_path / "bus"
    with BlockingBus(root, config=FAST.model_copy(update={"locking": locking})) as bus:
        info = bus.publish("jobs.cut", b"survived", single=True)
        staged = root / staged_in / (info.name if staged_in == "staging" else "dead-spare")
        os.link(info.path, staged)
        with bus.messages("jobs.#") as it:
            msg = it.get(timeout=10)
            assert (msg.topic, msg.payload) == ("jobs.cut", b"survived")
            it.ack(msg)
        assert not staged.exists()  # the leftover name was removed, not quarantined
        assert not (root / "fsbus" / "quarantine").exists() or not any(
            (root / "fsbus" / "quarantine").iterdir()
        )


def _plant_queue_link(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    """A bus with queue ``q`` whose ``fsbus/queues/<name>`` is a symbolic link to a file
    outside it; (the bus root, that file, the link)."""
    root = tmp_path / "bus"
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    with BlockingBus(root) as bus:
        bus.declare_queue("q", ["a.#"])
    link = root / "fsbus" / "queues" / name
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    return root, outside, link


def test_a_planted_link_for_the_queue_lock_is_refused_clearly(tmp_path: Path) -> None:
    """``fsbus/queues/LOCK``, held while a definition changes, is opened without following
    a symbolic link: one planted there would make fsbus lock a file elsewhere."""
    root, outside, lock = _plant_queue_link(tmp_path, "LOCK")
    with BlockingBus(root) as bus, pytest.raises(StorageError, match="symbolic link") as caught:
        bus.declare_queue("other", ["b.#"])
    assert caught.value.path == str(lock)
    assert "remove it" in str(caught.value)
    lock.unlink()
    with BlockingBus(root) as bus:
        bus.declare_queue("other", ["b.#"])  # and once it is gone, all is well
        assert sorted(q.name for q in bus.queues()) == ["other", "q"]
    assert outside.read_bytes() == b"precious"


@pytest.mark.anyio
async def test_a_planted_link_for_the_router_file_is_never_written_through(
    tmp_path: Path,
) -> None:
    """``fsbus/queues/.router`` is locked, and written (its progress), by the process that
    routes peers' messages: a symbolic link planted there is not followed, and the queue's
    consumer routes anyway, as where no flock can be had."""
    root, outside, router = _plant_queue_link(tmp_path, ".router")
    inbox = Inbox()
    async with Bus(root, config=FAST) as bus:
        await bus.subscribe(None, inbox, queue="q")
        await bus.publish("a.x", b"one")
        await inbox.wait_for(lambda got: [m.payload for m in got] == [b"one"])
        # it lists the main bus: it routes (its first listing may come after the copy
        # the publisher made reached the consumer)
        await until(lambda: bus.statistics().scans > 0)
    assert outside.read_bytes() == b"precious"
    assert router.is_symlink()
