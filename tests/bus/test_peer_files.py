"""Files exactly as qlobber-fsq 14 writes them reach fsbus subscribers (no Node needed).

The vectors are real qlobber-fsq files (``data/qlobber_fsq_names.json``); only the
expiry in each name is moved into the future so they are live when planted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from fsbus import BlockingBus, Bus, BusConfig

from .conftest import Inbox, files_under, message_files, peer_buckets, wait_until

VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "qlobber_fsq_names.json").read_text()
)["messages"]


def live_name(name: str, ttl: float = 600) -> str:
    """``name`` with its expiry field set ``ttl`` seconds from now."""
    at = name.rindex("@")
    size, _expires, kind, unique = name[at + 1 :].split("+")
    return f"{name[:at]}@{size}+{int((time.time() + ttl) * 1000):x}+{kind}+{unique}"


def plant(root: Path, vec: dict[str, Any]) -> str:
    """Write a vector's message (and topic spill) into its bucket; returns the name."""
    name = live_name(vec["name"])
    bucket = vec["bucket"]
    if vec["spill"] is not None:
        (root / "topics" / bucket / name).write_text(vec["spill"])
    (root / "messages" / bucket / name).write_bytes(bytes.fromhex(vec["content_hex"]))
    return name


def prepare(root: Path) -> None:
    """The bus layout, with every bucket as the qlobber-fsq peer whose files are
    planted makes them."""
    with BlockingBus(root):
        pass
    peer_buckets(root)


@pytest.mark.anyio
async def test_peer_files_reach_subscribers_with_their_topics(root: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    singles = [v for v in VECTORS if v["single"]]
    planted = [plant(root, v) for v in VECTORS]
    inbox = Inbox()
    async with Bus(root, config=BusConfig(poll_interval=0.05)) as bus:
        await bus.subscribe("#", inbox, existing=True)
        await inbox.wait_for(len(VECTORS))
        await wait_until(lambda: bus.statistics().acked == len(singles))
    got = {(m.topic, m.single): m for m in inbox.messages}
    assert len(got) == len(VECTORS)
    for v in VECTORS:
        msg = got[(v["topic"], v["single"])]
        assert msg.payload == bytes.fromhex(v["content_hex"])[1:]
        assert msg.bucket == v["bucket"]
        assert msg.headers == {}
        assert msg.published_at is None
        assert msg.host is None
        assert msg.priority == 50
    # Singles were consumed, spills with them; multis stay for other peers.
    stay = [(v, n) for v, n in zip(VECTORS, planted, strict=True) if not v["single"]]
    assert message_files(root) == sorted(f"{v['bucket']}/{n}" for v, n in stay)
    assert files_under(root / "topics") == sorted(
        f"{v['bucket']}/{n}" for v, n in stay if v["spill"] is not None
    )


@pytest.mark.anyio
async def test_peer_long_single_is_consumed_with_its_spill(root: Path) -> None:
    await anyio.to_thread.run_sync(prepare, root)
    (vec,) = [v for v in VECTORS if v["single"] and v["spill"]]
    name = plant(root, vec)
    inbox = Inbox()
    async with Bus(root) as bus:
        await bus.subscribe("jobs.#", inbox)
        (msg,) = await inbox.wait_for(1)
        await wait_until(lambda: bus.statistics().acked == 1)
    assert msg.topic == vec["topic"]
    assert not (root / "messages" / vec["bucket"] / name).exists()
    assert not (root / "topics" / vec["bucket"] / name).exists()


def test_browse_lists_peer_files(root: Path) -> None:
    prepare(root)
    for v in VECTORS:
        plant(root, v)
    with BlockingBus(root) as bus:
        infos = list(bus.browse())
        assert sorted(i.topic for i in infos) == sorted(v["topic"] for v in VECTORS)
        for info in infos:
            assert info.published_at is None
            assert info.host is None
            assert bus.read_payload(info) is not None


def test_update_file_size_matches_qlobber_fsq(root: Path) -> None:
    prepare(root)
    size = (root / "update" / "UPDATE").stat().st_size
    assert (
        size
        == json.loads((Path(__file__).parent / "data" / "qlobber_fsq_names.json").read_text())[
            "update_size"
        ]
    )
    assert sorted(p.name for p in (root / "messages").iterdir()) == [f"{i:02x}" for i in range(256)]
