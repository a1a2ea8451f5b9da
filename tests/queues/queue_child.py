"""A durable-queue peer in its own process, for the multi-process queue tests.

    python queue_child.py ROLE PARAMS_FILE

PARAMS_FILE is JSON with at least ``{"root": <bus root>}``; ``config`` holds BusConfig
options. Every step is one JSON line on stdout:

``{"event": "ready"}``
    a consumer is attached to its queue, or a publisher has its bus open;
``{"event": "start", "id": .., "queue": .., "delivery_count": ..}`` / ``{"event": "done", ..}``
    a consumer's handler began / is about to return (so the message will be acked);
``{"event": "published", "id": ..}``
    a publisher's ``publish`` returned for that message;
``{"event": "closed"}``
    the bus was closed after "STOP" on stdin.

Roles:

* ``consumer``: ``queue``, ``work`` (seconds each message takes), ``fail`` (ids whose
  handler raises), ``face`` ("async" or "blocking"), ``prefetch``, ``hang_after`` (the
  async handler never returns from the message after that many, so the process can be
  killed with one in hand);
* ``pub``: ``messages`` ([[topic, id], ...]), ``single``, ``durable``; then waits for
  "STOP";
* ``pub-lines``: publishes one message per stdin line "TOPIC ID" until "STOP".

Only the public fsbus API is used.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import anyio
import anyio.to_thread

from fsbus import BlockingBus, Bus, BusConfig, Message
from tests.multiprocess.bus_child import emit, wait_for_line  # one JSON-lines protocol


def describe(msg: Message) -> dict[str, Any]:
    return {
        "id": msg.payload.decode(),
        "topic": msg.topic,
        "queue": msg.queue,
        "single": msg.single,
        "delivery_count": msg.delivery_count,
        "headers": dict(msg.headers),
    }


def consumer(params: dict[str, Any], config: BusConfig) -> None:
    work = float(params.get("work", 0))
    fail = set(params.get("fail", ()))
    hang_after = params.get("hang_after")
    handled = 0
    if params.get("face", "async") == "blocking":
        stop = threading.Event()

        def watch() -> None:
            wait_for_line("STOP")
            stop.set()

        threading.Thread(target=watch, daemon=True).start()
        with (
            BlockingBus(params["root"], config=config) as bus,
            bus.messages(queue=params["queue"]) as it,
        ):
            emit("ready")
            while not stop.is_set():
                try:
                    msg = it.get(timeout=0.1)
                except TimeoutError:
                    continue
                emit("start", **describe(msg))
                if msg.payload.decode() in fail:
                    it.release(msg)
                    continue
                stop.wait(work)
                emit("done", **describe(msg))
                it.ack(msg)
        emit("closed")
        return

    async def handle(msg: Message) -> None:
        nonlocal handled
        emit("start", **describe(msg))
        if hang_after is not None and handled >= hang_after:
            await anyio.sleep_forever()
        handled += 1
        if msg.payload.decode() in fail:
            raise RuntimeError(f"job {msg.payload!r} always fails")
        if work:
            await anyio.sleep(work)
        emit("done", **describe(msg))

    async def main() -> None:
        async with Bus(params["root"], config=config) as bus:
            await bus.subscribe(
                None, handle, queue=params["queue"], prefetch=params.get("prefetch")
            )
            emit("ready")
            await anyio.to_thread.run_sync(wait_for_line, "STOP")

    anyio.run(main)
    emit("closed")


def getter(params: dict[str, Any], config: BusConfig) -> None:
    """Take the queue's messages one at a time with ``bus.get`` (no subscription), until
    STOP; after ``hang_after`` of them, hold the next one for good (to be killed)."""
    hang_after = params.get("hang_after")
    stop = threading.Event()

    def watch() -> None:
        wait_for_line("STOP")
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    handled = 0
    with BlockingBus(params["root"], config=config) as bus:
        emit("ready")
        while not stop.is_set():
            with bus.get(params["queue"]) as msg:
                if msg is None:
                    stop.wait(0.005)  # nothing ready: look again soon
                    continue
                emit("start", **describe(msg))
                if hang_after is not None and handled >= hang_after:
                    emit("hanging", **describe(msg))
                    stop.wait()
                    continue
                handled += 1
                emit("done", **describe(msg))
    emit("closed")


def pub(params: dict[str, Any], config: BusConfig) -> None:
    single = bool(params.get("single", False))
    durable = bool(params.get("durable", False))
    with BlockingBus(params["root"], config=config) as bus:
        emit("ready")
        for topic, ident in params["messages"]:
            bus.publish(topic, str(ident).encode(), single=single, durable=durable)
            emit("published", id=str(ident))
        wait_for_line("STOP")
    emit("closed")


def pub_lines(params: dict[str, Any], config: BusConfig) -> None:
    with BlockingBus(params["root"], config=config) as bus:
        emit("ready")
        for line in sys.stdin:
            if "STOP" in line:
                break
            topic, ident = line.split()
            bus.publish(topic, ident.encode())
            emit("published", id=ident)
    emit("closed")


def main() -> None:
    role, params_file = sys.argv[1], sys.argv[2]
    with open(params_file) as f:
        params = json.load(f)
    config = BusConfig(**params.get("config", {}))
    roles = {"consumer": consumer, "getter": getter, "pub": pub, "pub-lines": pub_lines}
    roles[role](params, config)


if __name__ == "__main__":
    main()
