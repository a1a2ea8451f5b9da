"""Failure counts read for a batch of claims at once (one listing per bucket)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, Message

from .conftest import WAIT, files_under, message_files, wait_until


@pytest.mark.anyio
async def test_every_claim_in_a_batch_gets_its_own_failure_count(
    root: Path, fast: BusConfig
) -> None:
    # Two buckets and a backlog present before the worker starts: its first claims come
    # in batches of several per bucket.
    config = fast.model_copy(update={"bucket_base": 2, "bucket_num_chars": 1})
    counts: dict[bytes, list[int]] = defaultdict(list)
    done = anyio.Event()
    sent = [f"job-{i}".encode() for i in range(12)]

    async def fail_twice(msg: Message) -> None:
        counts[msg.payload].append(msg.delivery_count)
        if msg.delivery_count < 3:
            raise RuntimeError("transient failure")
        if all(len(counts[p]) == 3 for p in sent):
            done.set()

    async with Bus(root, config=config) as bus:
        for p in sent:
            await bus.publish("jobs.run", p, single=True)
        await bus.subscribe("jobs.run", fail_twice)
        with anyio.fail_after(WAIT):
            await done.wait()
        await wait_until(lambda: bus.statistics().acked == len(sent))
    assert {p: counts[p] for p in sent} == {p: [1, 2, 3] for p in sent}
    assert message_files(root) == []
    assert files_under(root / "fsbus" / "attempts") == []


@pytest.mark.anyio
async def test_counts_past_the_leading_byte_go_on_in_a_counter_file(
    root: Path, fast: BusConfig
) -> None:
    """The message file's leading byte holds counts up to 255; the counter file the rest."""
    seen: list[int] = []
    done = anyio.Event()

    async def fail_until_256(msg: Message) -> None:
        seen.append(msg.delivery_count)
        if msg.delivery_count < 256:
            raise RuntimeError("transient failure")
        done.set()

    config = fast.model_copy(update={"max_deliveries": None})
    async with Bus(root, config=config) as bus:
        info = await bus.publish("jobs.many", b"m", single=True)
        path = root / "messages" / info.bucket / info.name
        path.write_bytes(b"\xfd" + b"m")  # 253 deliveries recorded
        await bus.subscribe("jobs.many", fail_until_256)
        with anyio.fail_after(WAIT):
            await done.wait()
        await wait_until(lambda: not path.exists())
    assert seen == [254, 255, 256]
    assert files_under(root / "fsbus" / "attempts") == []
