"""Paths under a bus root and the UPDATE stamp maths (pure)."""

from __future__ import annotations

import random

import pytest

from fsbus import BusConfig
from fsbus._bus.layout import Layout, changed_buckets


def test_default_layout_has_256_buckets() -> None:
    lay = Layout.of("/srv/bus", BusConfig())
    assert lay.buckets[0] == "00"
    assert lay.buckets[-1] == "ff"
    assert len(lay.buckets) == 256
    assert lay.stamp_size == 32
    assert lay.update_size == 256 * 32  # what qlobber-fsq 14 writes: 8192 bytes


def test_order_by_expiry_uses_one_bucket_named_0() -> None:
    lay = Layout.of("/srv/bus", BusConfig(order_by_expiry=True))
    assert lay.buckets == ("0",)
    assert lay.update_size == 32


def test_other_bases() -> None:
    lay = Layout.of("/b", BusConfig(bucket_base=36, bucket_num_chars=1))
    assert lay.buckets[:3] == ("0", "1", "2")
    assert lay.buckets[-1] == "z"
    assert len(lay.buckets) == 36


def test_paths_are_qlobber_fsq_s() -> None:
    lay = Layout.of("/srv/bus/", BusConfig())
    assert lay.root == "/srv/bus"
    assert lay.staging == "/srv/bus/staging"
    assert lay.message_path("0a", "n") == "/srv/bus/messages/0a/n"
    assert lay.topic_path("0a", "n") == "/srv/bus/topics/0a/n"
    assert lay.update_file == "/srv/bus/update/UPDATE"
    assert lay.meta_path("0a", "n") == "/srv/bus/fsbus/meta/0a/n"
    assert lay.attempts_path("0a", "n") == "/srv/bus/fsbus/attempts/0a/n"
    assert lay.quarantine == "/srv/bus/fsbus/quarantine"


def test_root_slash_is_kept() -> None:
    assert Layout.of("/", BusConfig()).root == "/"


def test_all_dirs_lists_parents_first() -> None:
    lay = Layout.of("/r", BusConfig(bucket_base=2, bucket_num_chars=1))
    dirs = lay.all_dirs()
    assert dirs[0] == "/r"
    for i, d in enumerate(dirs):
        parent = d.rsplit("/", 1)[0]
        if parent and parent != "/":
            assert parent in dirs[:i], d
    assert len(dirs) == len(set(dirs))
    # bucket directories are made on first use (on a local mount), under these
    assert not any(d.startswith("/r/messages/") for d in dirs)
    assert set(lay.bucket_parents) == {
        "/r/messages",
        "/r/topics",
        "/r/fsbus/meta",
        "/r/fsbus/attempts",
    }
    assert set(lay.bucket_parents) <= set(dirs)


@pytest.mark.parametrize(("index", "offset"), [(0, 0), (1, 32), (255, 8160)])
def test_stamp_offsets(index: int, offset: int) -> None:
    assert Layout.of("/r", BusConfig()).stamp_offset(index) == offset


def test_stamp_offsets_follow_stamp_size() -> None:
    lay = Layout.of("/r", BusConfig(bucket_stamp_size=4))
    assert lay.stamp_offset(3) == 12
    assert lay.update_size == 1024


def _update(stamps: list[bytes]) -> bytes:
    return b"".join(stamps)


def test_changed_buckets_finds_the_stamped_ones() -> None:
    old = _update([bytes([i]) * 4 for i in range(8)])
    new = bytearray(old)
    new[4 * 2 : 4 * 3] = b"XXXX"
    new[4 * 7] = 0xEE  # one byte of the last stamp
    assert changed_buckets(old, bytes(new), 4, 8) == [2, 7]


def test_changed_buckets_same_snapshot_is_nothing() -> None:
    snap = bytes(range(32))
    assert changed_buckets(snap, snap, 4, 8) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (None, bytes(32)),  # first read
        (bytes(31), bytes(32)),  # short old snapshot
        (bytes(32), bytes(10)),  # truncated (corrupt) UPDATE
        (bytes(32), b""),  # emptied UPDATE
    ],
)
def test_changed_buckets_missing_or_short_means_everything(old: bytes | None, new: bytes) -> None:
    assert changed_buckets(old, new, 4, 8) == list(range(8))


def test_changed_buckets_stamp_size_zero_scans_all() -> None:
    assert changed_buckets(b"", b"", 0, 5) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", range(20))
def test_changed_buckets_agrees_with_comparing_every_stamp(seed: int) -> None:
    rng = random.Random(seed)
    stamp, count = rng.choice([(4, 256), (8, 128), (1, 1024), (3, 7)])
    old = rng.randbytes(stamp * count + rng.choice([0, 5]))
    new = bytearray(old)
    for i in rng.sample(range(count), rng.choice([1, 2, 3, count // 2, count])):
        new[i * stamp + rng.randrange(stamp)] ^= 1 + rng.randrange(255)

    def stamp_of(snapshot: bytes, i: int) -> bytes:
        return snapshot[i * stamp : (i + 1) * stamp]

    expected = [i for i in range(count) if stamp_of(old, i) != stamp_of(bytes(new), i)]
    assert changed_buckets(old, bytes(new), stamp, count) == expected
