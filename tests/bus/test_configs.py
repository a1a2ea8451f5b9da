"""The same round trip under each on-disk and delivery option that changes a code path."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsbus import Bus, BusConfig

from .conftest import Inbox, files_under, message_files, wait_until

CONFIGS = {
    "defaults": BusConfig(),
    "order-by-expiry": BusConfig(order_by_expiry=True),
    "no-update-file": BusConfig(bucket_stamp_size=0, poll_interval=0.05),
    "base36-one-char": BusConfig(bucket_base=36, bucket_num_chars=1),
    "tiny-stamps": BusConfig(bucket_stamp_size=1),
    "split-at-16": BusConfig(split_topic_at=16),
    "polling-only": BusConfig(force_polling=True, poll_interval=0.05),
    "one-handler": BusConfig(handler_concurrency=1),
    "no-dedup": BusConfig(dedup=False),
    "modes": BusConfig(file_mode=0o640, dir_mode=0o750),
    "rename-locking": BusConfig(locking="rename"),
}


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.anyio
async def test_round_trip(root: Path, cfg: BusConfig) -> None:
    multi, work = Inbox(), Inbox()
    long_topic = "long." + "segment." * 30 + "end"
    async with Bus(root, config=cfg) as bus:
        await bus.subscribe("#", multi, kind="multi")  # an observer: never takes work
        await bus.subscribe("jobs.#", work)
        await bus.publish("news.a", b"m1", headers={"h": "1"})
        await bus.publish(long_topic, b"m2")
        await bus.publish("jobs.x", b"s1", single=True)
        await bus.publish("jobs." + "y" * 60, b"s2", single=True)
        await multi.wait_for(2)
        # Each single goes to one of the two matching subscriptions.
        await wait_until(lambda: bus.statistics().acked == 2)
    singles = [m for m in (*multi.messages, *work.messages) if m.single]
    assert {m.topic for m in multi.messages if not m.single} == {"news.a", long_topic}
    assert sorted(m.payload for m in singles) == [b"s1", b"s2"]
    assert next(m for m in multi.messages if m.topic == "news.a").headers == {"h": "1"}
    assert len(message_files(root)) == 2  # the multis stay until they expire
    assert len(files_under(root / "topics")) == 1  # the long multi's spill
    if cfg.file_mode is not None:
        for rel in message_files(root):
            assert (root / "messages" / rel).stat().st_mode & 0o777 == cfg.file_mode
        assert (root / "messages").stat().st_mode & 0o777 == cfg.dir_mode


def test_the_defaults_without_pydantic_are_busconfigs_defaults() -> None:
    """A bus opened without a config reads fsbus._settings.Defaults; BusConfig takes its
    field defaults from the same place, so the two cannot drift apart."""
    import dataclasses

    from fsbus._defaults import Defaults
    from fsbus._settings import as_config, was_set, with_changes

    defaults = Defaults(force_polling=False)
    config = BusConfig(force_polling=False)
    names = [f.name for f in dataclasses.fields(Defaults) if f.name != "changed"]
    assert sorted(names) == sorted(BusConfig.model_fields)
    assert {n: getattr(defaults, n) for n in names} == config.model_dump()
    assert defaults.num_buckets == config.num_buckets == 256
    # made into a BusConfig (Bus.config), only what fsbus changed counts as set
    changed = with_changes(defaults, poll_interval=0.02)
    assert was_set(changed, "poll_interval")
    assert not was_set(changed, "gc_interval")
    made = as_config(changed)
    assert made.poll_interval == 0.02
    assert made.model_fields_set == {"poll_interval"}
    assert not was_set(made, "gc_interval")


NO_PYDANTIC = """
import sys
import anyio
from fsbus import BlockingBus, Bus
from fsbus.amqp import Gateway

root = sys.argv[1]
with BlockingBus(root) as bus:
    bus.publish("a.b", b"x")
    with bus.messages("a.*") as it:
        bus.publish("a.c", b"y")
        it.ack(it.get(timeout=10))

async def main():
    async with Bus(root) as bus, Gateway(root, port=0):
        await bus.publish("a.d", b"z")

anyio.run(main)
assert "pydantic" not in sys.modules, "pydantic was imported"
print(BlockingBus(root).config.multi_ttl)  # asked for: a BusConfig, made then
assert "pydantic" in sys.modules
"""


def test_a_bus_and_a_gateway_with_the_defaults_never_import_pydantic(tmp_path: Path) -> None:
    """pydantic takes 0.1-0.2 s to import: a process that opens buses (and an AMQP
    gateway) with the defaults does without it, until it asks for ``Bus.config``."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", NO_PYDANTIC, str(tmp_path / "bus")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "60.0"
