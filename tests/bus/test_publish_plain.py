"""The blocking face's fast path for a plain publish (default ttl and priority, no headers).

It must write exactly what the general path writes: the name :func:`plan_publish` gives for
the same millisecond and unique part, the same bucket, the same bytes, the same UPDATE
stamp; it must refuse the same bad input with the same errors, and fall back to the
general path for everything else.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
from pathlib import Path

import pytest

from fsbus import (
    BlockingBus,
    BusConfig,
    ClosedError,
    DiskFull,
    PayloadTooLarge,
    StorageError,
    UsageError,
)
from fsbus._bus.layout import Layout
from fsbus._bus.message import PublishInfo
from fsbus._bus.namer import Namer, new_publish_info
from fsbus._bus.names import bucket_for, parse_name
from fsbus._bus.ops import Ops
from fsbus._bus.plan import PublishPlan, plan_publish, topic_form
from fsbus._defaults import Defaults
from tests.journaled import UnorderedMount

from .conftest import FailingOps, RecordingOps, files_under, message_files, peer_buckets

CONFIGS = {
    "defaults": BusConfig(),
    "one-bucket": BusConfig(order_by_expiry=True),
    "few-buckets": BusConfig(bucket_base=10, bucket_num_chars=1),
    "own-defaults": BusConfig(default_priority=3, multi_ttl=0.25, single_ttl=7200.5),
    "huge-ttl": BusConfig(multi_ttl=1e12, single_ttl=1e12),
}


def general_plan_for(
    namer: Namer,
    layout: Layout,
    config: BusConfig,
    name: str,
    single: bool,
    durable: bool = False,
    ttl: float | None = None,
) -> PublishPlan:
    """What the general path plans for the same topic, millisecond and unique part."""
    parsed = parse_name(name)
    assert parsed is not None
    assert parsed.fields is not None
    topic = bytes.fromhex(parsed.topic_hex).decode()
    return plan_publish(
        layout,
        config,
        topic_form(topic, config.split_topic_at),
        single=single,
        ttl=ttl,
        durable=durable,
        headers=None,
        priority=None,
        now_ms=parsed.fields.published_ms,
        host=namer.host,
        random_hex=parsed.unique[-12:],
    )


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("topic", ["jobs.resize", "ünï.cødé", "a", "x" * 100])
def test_name_plain_is_the_name_the_general_plan_gives(
    config: BusConfig, single: bool, topic: str
) -> None:
    layout = Layout.of("/nowhere/bus", config)
    namer = Namer(layout, config)
    assert namer.name_plain(topic, single) is None  # not validated yet: plan it first
    namer.plan(topic, single, None, False, None, None)
    for _ in range(20):
        named = namer.name_plain(topic, single)
        assert named is not None
        name, bucket_index, expires_ms = named
        plan = general_plan_for(namer, layout, config, name, single)
        assert plan.name == name
        assert plan.bucket_index == bucket_index == bucket_for(name, len(layout.buckets))
        assert plan.expires_ms == expires_ms
        assert (plan.spill, plan.meta, plan.durable, plan.single) == (None, None, False, single)
        # Namer.plan takes the same shortcut for a plain call on a known topic, durable or not.
        for durable in (False, True):
            fast_plan = namer.plan(topic, single, None, durable, None, None)
            general = general_plan_for(namer, layout, config, fast_plan.name, single, durable)
            assert fast_plan == general


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("ttl", [0.0004, 0.25, 1, 7200.5, 10**9, 1e12, float("inf")])
def test_a_plain_call_with_a_ttl_is_planned_as_the_general_plan_does(
    single: bool, ttl: float
) -> None:
    """Namer.plan's shortcut takes a ttl too (a queue's copies are named with the
    queue's): the same plan as the general path for the same millisecond and unique
    part, the expiry capped alike."""
    config = BusConfig()
    layout = Layout.of("/nowhere/bus", config)
    namer = Namer(layout, config)
    namer.plan("jobs.resize", single, None, False, None, None)  # (validates the topic)
    for durable in (False, True):
        fast_plan = namer.plan("jobs.resize", single, ttl, durable, None, None)
        general = general_plan_for(namer, layout, config, fast_plan.name, single, durable, ttl=ttl)
        assert fast_plan == general


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), True, "5", None.__class__])
def test_a_bad_ttl_gets_the_general_plans_error(ttl: object) -> None:
    namer = Namer(Layout.of("/nowhere/bus", BusConfig()), BusConfig())
    namer.plan("jobs.resize", True, None, False, None, None)
    with pytest.raises(UsageError, match="ttl must be a positive number of seconds"):
        namer.plan("jobs.resize", True, ttl, False, None, None)  # type: ignore[arg-type]


def test_name_plain_leaves_long_and_foreign_topics_to_the_general_plan() -> None:
    config = BusConfig(split_topic_at=16)
    namer = Namer(Layout.of("/nowhere/bus", config), config)
    namer.plan("a.long.topic", False, None, False, None, None)  # spills past 16 hex digits
    assert namer.name_plain("a.long.topic", False) is None
    namer.plan("short", False, None, False, None, None)
    assert namer.name_plain("short", False) is not None

    class Topic(str):
        __slots__ = ()

    for topic in (Topic("short"), b"short", ["short"], None):
        assert namer.name_plain(topic, False) is None


def test_names_from_the_fast_path_are_unique() -> None:
    config = Defaults()
    namer = Namer(Layout.of("/nowhere/bus", config), config)
    namer.plan("t", False, None, False, None, None)
    names = []
    for _ in range(5000):
        named = namer.name_plain("t", False)
        assert named is not None
        names.append(named[0])
    assert len(set(names)) == len(names)


def test_new_publish_info_is_a_plain_publish_info() -> None:
    args = ("t", "n", "b", "/r/messages/b/n", True, 12.5, 3)
    fast = new_publish_info(*args)
    slow = PublishInfo(*args)
    assert type(fast) is PublishInfo
    assert fast == slow
    assert repr(fast) == repr(slow)
    assert hash(fast) == hash(slow)
    with pytest.raises(AttributeError):
        fast.size = 4  # type: ignore[misc]


def update_stamps(root: Path, layout: Layout) -> list[bytes]:
    data = (root / "update" / "UPDATE").read_bytes()
    size = layout.stamp_size
    return [data[i * size : (i + 1) * size] for i in range(len(layout.buckets))]


def check_written(root: Path, bus: BlockingBus, info: PublishInfo, payload: bytes) -> None:
    """The message is where the info says, whole, alone, and its bucket's stamp changed."""
    assert Path(info.path) == root / "messages" / info.bucket / info.name
    assert Path(info.path).read_bytes() == b"\x00" + payload
    assert info.bucket == bus.layout.buckets[bucket_for(info.name, len(bus.layout.buckets))]
    assert info.size == len(payload)
    assert files_under(root / "staging") == []
    assert files_under(root / "topics") == []
    assert files_under(root / "fsbus" / "meta") == []


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("payload", [b"", b"\x00bytes\xff", "texte ünïcode"])
def test_fast_and_general_publishes_write_the_same_files(
    tmp_path: Path, single: bool, payload: bytes | str
) -> None:
    root = tmp_path / "bus"
    raw = payload.encode() if isinstance(payload, str) else payload
    with BlockingBus(root) as bus:
        cfg = bus.config
        ttl = cfg.single_ttl if single else cfg.multi_ttl
        infos = []
        # The first publish of a topic validates it (general path); the next take the fast
        # path; explicit defaults force the general path with the same meaning.
        for options in ({}, {}, {"priority": cfg.default_priority}, {"ttl": ttl}, {}):
            before = update_stamps(root, bus.layout)
            info = bus.publish("same.topic", payload, single=single, **options)  # type: ignore[arg-type]
            check_written(root, bus, info, raw)
            after = update_stamps(root, bus.layout)
            index = bus.layout.buckets.index(info.bucket)
            changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
            assert changed == [index]
            infos.append(info)
        assert bus.statistics().published == 5
    parsed = [parse_name(i.name) for i in infos]
    shapes = set()
    for info, p in zip(infos, parsed, strict=True):
        assert p is not None
        assert p.fields is not None
        assert p.expires_ms - p.fields.published_ms == round(ttl * 1000)
        assert info.expires == p.expires_ms / 1000
        assert info.single is single
        assert info.topic == "same.topic"
        shapes.add((p.topic_hex, p.long, p.kind, p.fields.flags, p.fields.priority, p.fields.host))
    assert len(shapes) == 1
    assert len(message_files(root)) == 5


def test_the_fast_path_refuses_what_the_general_path_refuses(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    config = BusConfig(max_payload_size=10)
    bus = BlockingBus(root, config=config)
    with pytest.raises(UsageError, match="with BlockingBus"):
        bus.publish("t", b"x")
    with bus:
        bus.publish("t", b"x" * 10)  # the general path validates "t"
        bus.publish("t", b"x" * 10)  # the fast path takes it
        for payload in (b"x" * 11, "é" * 6):
            with pytest.raises(PayloadTooLarge, match="exceeds max_payload_size=10"):
                bus.publish("t", payload)
        with pytest.raises(UnicodeEncodeError):
            bus.publish("t", "lone\udcff")
        assert len(message_files(root)) == 2
    with pytest.raises(ClosedError, match="closed"):
        bus.publish("t", b"x")
    assert files_under(root / "staging") == []


class ClashOnce(Ops):
    """The first staging file it creates already exists (another publisher took the name)."""

    def __init__(self) -> None:
        self.clashes = 0

    def open(self, path: str, flags: int, mode: int = 0o666) -> int:
        if "/staging/" in path and self.clashes == 0:
            self.clashes += 1
            raise FileExistsError(errno.EEXIST, "File exists", path)
        return super().open(path, flags, mode)


def test_a_name_clash_on_the_fast_path_is_named_again(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    ops = ClashOnce()
    with BlockingBus(root, ops=ops) as bus:
        bus._namer.plan("t", False, None, False, None, None)  # validated: the fast path is next
        info = bus.publish("t", b"payload")
        assert ops.clashes == 1
        check_written(root, bus, info, b"payload")
        assert bus.statistics().published == 1
    assert message_files(root) == [f"{info.bucket}/{info.name}"]


@pytest.mark.parametrize(
    ("op", "error"), [("open", DiskFull), ("write", DiskFull), ("place", StorageError)]
)
def test_storage_errors_on_the_fast_path_leave_nothing_behind(
    tmp_path: Path, op: str, error: type[StorageError]
) -> None:
    root = tmp_path / "bus"
    ops = FailingOps(op, errno.ENOSPC)
    with BlockingBus(root, ops=ops) as bus:
        bus._fs.spares = False  # staged in staging/ (tests/bus/test_spares.py: in a spare)
        bus.publish("t", b"first")  # general path: validates the topic
        ops.armed = True
        with pytest.raises(error) as caught:
            bus.publish("t", b"second")
        assert isinstance(caught.value.__cause__, OSError)
        assert "/staging/" in str(caught.value.path)
        ops.armed = False
        bus.publish("t", b"third")
        assert bus.statistics().published == 2
    assert files_under(root / "staging") == []
    assert sorted((root / "messages" / f).read_bytes() for f in message_files(root)) == [
        b"\x00first",
        b"\x00third",
    ]


def _publish_in_child(bus: BlockingBus, n: int) -> None:
    for i in range(n):
        bus.publish("forked", f"child-{i}")
    os._exit(0)


def test_a_forked_child_publishing_through_the_parents_bus_makes_new_names(
    tmp_path: Path,
) -> None:
    root = tmp_path / "bus"
    n = 300
    with BlockingBus(root) as bus:
        bus.publish("forked", "warm-up")  # the topic is validated before the fork
        child = multiprocessing.get_context("fork").Process(target=_publish_in_child, args=(bus, n))
        child.start()
        for i in range(n):
            bus.publish("forked", f"parent-{i}")
        child.join(60)
        assert child.exitcode == 0
    files = message_files(root)
    assert len(files) == 2 * n + 1
    payloads = sorted((root / "messages" / f).read_bytes()[1:].decode() for f in files)
    expected = sorted(["warm-up"] + [f"{who}-{i}" for who in ("parent", "child") for i in range(n)])
    assert payloads == expected


class _UnorderedRecording(UnorderedMount, RecordingOps):
    pass


def test_a_durable_publish_on_a_known_topic_is_still_synced(tmp_path: Path) -> None:
    root = tmp_path / "bus"
    peer_buckets(root)  # (a bucket's first message makes it: see test_storage)
    ops = _UnorderedRecording()  # (synced before its rename: see test_storage)
    with BlockingBus(root, ops=ops) as bus:
        bus.publish("d", b"x")  # known from now on: Namer.plan's shortcut names the next
        ops.calls.clear()
        info = bus.publish("d", b"y", durable=True)
        fast = bus.publish("d", b"z")
    n, b = info.name, info.bucket
    staging, messages = f"{root}/staging", f"{root}/messages"
    assert ops.calls[:3] == [
        ("fdatasync", f"{staging}/{n}"),
        ("place", f"{staging}/{n} -> {messages}/{b}/{n}"),
        ("fsync", f"{messages}/{b}"),
    ]
    (kind, move), *rest = ops.calls[3:]
    assert not rest
    # the plain one, from the spare made after the first publish (see test_spares.py)
    assert kind == "place"
    assert move.startswith(f"{root}/fsbus/spares/")
    assert move.endswith(f" -> {fast.path}")


class StampCounter(Ops):
    """Pass-through that counts the writes into UPDATE (stamps), by offset."""

    def __init__(self) -> None:
        self.stamps: list[int] = []

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("UPDATE"):
            self.stamps.append(offset)
        return super().pwrite(fd, data, offset)


def test_a_stamps_batched_block_stamps_each_bucket_once_as_it_ends(tmp_path: Path) -> None:
    """In a ``stamps_batched`` block (a durable publish's), every message is placed at
    once but no stamp is written; when the (outermost) block ends, each bucket that got
    a message is stamped once, and a subscriber gets every message."""
    from fsbus._bus.fs import stamps_batched

    config = BusConfig(bucket_base=2, bucket_num_chars=1)
    ops = StampCounter()
    root = tmp_path / "bus"
    with BlockingBus(root, config=config, ops=ops) as bus:
        before = (root / "update" / "UPDATE").read_bytes()
        ops.stamps.clear()
        with stamps_batched():
            for i in range(20):
                bus.publish("t.batch", str(i))
            with stamps_batched():  # nested: stamps when the outer block ends
                bus.publish("t.batch", "20")
            assert len(message_files(root)) == 21  # placed already
            assert ops.stamps == []
            assert (root / "update" / "UPDATE").read_bytes() == before
        assert sorted(ops.stamps) == [0, config.bucket_stamp_size]
        assert (root / "update" / "UPDATE").read_bytes() != before
        bus.publish("t.batch", "21")  # outside a block: its own stamp at once
        assert len(ops.stamps) == 3
        with bus.messages("t.#", existing=True) as it:
            got = [it.get(timeout=10).payload for _ in range(22)]
    assert sorted(got) == sorted(str(i).encode() for i in range(22))


class FailingStamps(StampCounter):
    """:class:`StampCounter` whose writes into UPDATE fail (EIO) while :attr:`failing`."""

    failing = False

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if self.failing and os.readlink(f"/proc/self/fd/{fd}").endswith("UPDATE"):
            self.stamps.append(offset)
            raise OSError(errno.EIO, "injected")
        return super().pwrite(fd, data, offset)


def test_a_stamp_that_fails_at_a_batchs_end_is_raised_after_every_stamp_was_tried(
    tmp_path: Path,
) -> None:
    """A durable publish's block whose stamps cannot be written raises it, once every
    bucket's stamp was tried. Nothing placed is lost."""
    from fsbus._bus.fs import stamps_batched

    config = BusConfig(bucket_base=2, bucket_num_chars=1)
    ops = FailingStamps()
    root = tmp_path / "bus"
    with BlockingBus(root, config=config, ops=ops) as bus:
        ops.stamps.clear()
        ops.failing = True
        placed: list[int] = []

        def publish_into_both_buckets() -> None:
            with stamps_batched():
                # until both buckets hold one (a name's bucket is its hash's: 8 in one
                # bucket happens once in 128 runs)
                for i in range(1, 65):
                    bus.publish("t.fail", str(i))
                    placed.append(i)
                    if len({f.split("/")[0] for f in message_files(root)}) == 2:
                        break

        with pytest.raises(StorageError, match="UPDATE"):
            publish_into_both_buckets()
        n = len(placed)
        ops.failing = False
        assert sorted(ops.stamps) == [0, config.bucket_stamp_size]  # both tried
        assert len(message_files(root)) == n
        with bus.messages("t.#", existing=True) as it:
            got = [it.get(timeout=10).payload for _ in range(n)]
    assert sorted(got) == sorted(str(i).encode() for i in range(1, n + 1))
