"""A bus peer in its own process, for the multi-process tests.

    python bus_child.py ROLE PARAMS_FILE

PARAMS_FILE is JSON with at least ``{"root": <bus root>}``. Everything the child does is
reported on stdout as one JSON object per line:

``{"event": "ready"}``
    subscribed (the Bus has listed the directory) or, for a publisher, open;
``{"event": "message", "handler": h, "name": .., "topic": .., "id": ..}``
    a multi-message handler was called (``id`` is the payload, text);
``{"event": "start", ...}`` / ``{"event": "done", ...}``
    a work-queue handler began / is about to return (so it will be acked);
``{"event": "published", "count": n}``
    a publisher wrote all its messages;
``{"event": "writing"}``
    ``pub-stuck`` wrote the first chunk of a streamed payload and hangs (to be killed);
``{"event": "closed"}``
    the Bus was closed after "STOP" on stdin. The process then stays alive, holding
    nothing, until stdin says "EXIT" or closes, so the parent can probe for leftover locks.

Roles:

* ``pub``: ``messages`` ([[topic, id] or [topic, id, priority], ...]), ``single``,
  ``face`` ("async" or "blocking");
* ``sub``: ``subscriptions`` ([[handler name, pattern], ...]; a handler name used twice is
  one handler, so the bus calls it once per message);
* ``worker``: ``pattern``, ``hold`` (never finish a handler), ``fail`` (ids whose handler
  raises), ``work`` (seconds each job takes), ``face``;
* ``pub-stuck``: ``topic``, ``chunk`` (size of the one chunk written).

``config`` holds BusConfig options for any role.
Only the public fsbus API is used.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread

from fsbus import BlockingBus, Bus, BusConfig, Message

_out = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed at once."""
    line = json.dumps({"event": event, "pid": os.getpid(), **fields})
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def wait_for_line(*words: str) -> None:
    """Block until stdin has a line containing one of ``words`` (or closes)."""
    for line in sys.stdin:
        if any(w in line for w in words):
            return


def config(params: dict[str, Any]) -> BusConfig:
    return BusConfig(**params.get("config", {}))


def describe(msg: Message) -> dict[str, Any]:
    return {
        "name": msg.name,
        "bucket": msg.bucket,
        "topic": msg.topic,
        "id": msg.payload.decode(),
        "single": msg.single,
        "delivery_count": msg.delivery_count,
        "headers": dict(msg.headers),
    }


# ------------------------------------------------------------------ publisher
def pub(params: dict[str, Any]) -> None:
    # [topic, id] or [topic, id, priority]
    messages = [(str(m[0]), str(m[1]), m[2] if len(m) > 2 else None) for m in params["messages"]]
    single = bool(params.get("single", False))
    if params.get("face", "blocking") == "blocking":
        with BlockingBus(params["root"], config=config(params)) as bus:
            emit("ready")
            for topic, ident, priority in messages:
                bus.publish(topic, ident.encode(), single=single, priority=priority)
    else:

        async def main() -> None:
            async with Bus(params["root"], config=config(params)) as bus:
                emit("ready")
                for topic, ident, priority in messages:
                    await bus.publish(topic, ident.encode(), single=single, priority=priority)

        anyio.run(main)
    emit("published", count=len(messages))


def pub_stuck(params: dict[str, Any]) -> None:
    """Start publishing a streamed payload, write one chunk, then hang until killed."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * int(params.get("chunk", 1 << 20))
        emit("writing")
        await anyio.sleep_forever()
        yield b""  # never reached

    async def main() -> None:
        async with Bus(params["root"], config=config(params)) as bus:
            emit("ready")
            await bus.publish(params["topic"], chunks())

    anyio.run(main)


# ------------------------------------------------------------------ async subscribers
def serve(params: dict[str, Any], subscribe: Callable[[Bus], Awaitable[None]]) -> None:
    """Open a Bus, subscribe, say ready; on "STOP" close it, say closed, wait for "EXIT"."""

    async def main() -> None:
        async with Bus(params["root"], config=config(params)) as bus:
            await subscribe(bus)
            emit("ready")
            await anyio.to_thread.run_sync(wait_for_line, "STOP")

    anyio.run(main)
    emit("closed")
    wait_for_line("EXIT")


def sub(params: dict[str, Any]) -> None:
    handlers: dict[str, Callable[[Message], Awaitable[None]]] = {}

    def handler(name: str) -> Callable[[Message], Awaitable[None]]:
        async def handle(msg: Message) -> None:
            emit("message", handler=name, **describe(msg))

        return handlers.setdefault(name, handle)

    async def subscribe(bus: Bus) -> None:
        for name, pattern in params["subscriptions"]:
            await bus.subscribe(pattern, handler(name))

    serve(params, subscribe)


def worker(params: dict[str, Any]) -> None:
    if params.get("face", "async") == "blocking":
        blocking_worker(params)
        return
    hold = bool(params.get("hold", False))
    fail = set(params.get("fail", ()))
    work = float(params.get("work", 0))

    async def handle(msg: Message) -> None:
        emit("start", **describe(msg))
        if msg.payload.decode() in fail:
            emit("failed", **describe(msg))
            raise RuntimeError(f"job {msg.payload!r} always fails")
        if hold:
            await anyio.sleep_forever()  # until SIGKILL, or the Bus closes and cancels us
        if work:
            await anyio.sleep(work)  # stands for the job's own work
        emit("done", **describe(msg))

    async def subscribe(bus: Bus) -> None:
        await bus.subscribe(params["pattern"], handle)

    serve(params, subscribe)


# ------------------------------------------------------------------ blocking face
def blocking_worker(params: dict[str, Any]) -> None:
    hold = bool(params.get("hold", False))
    work = float(params.get("work", 0))
    stop = threading.Event()

    def watch_stdin() -> None:
        wait_for_line("STOP")
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    with (
        BlockingBus(params["root"], config=config(params)) as bus,
        bus.messages(params["pattern"]) as it,
    ):
        emit("ready")
        while not stop.is_set():
            try:
                msg = it.get(timeout=0.2)
            except TimeoutError:
                continue
            emit("start", **describe(msg))
            if hold:
                stop.wait()  # keep it claimed until told to stop; leaving `with` releases it
                break
            if work:
                stop.wait(work)  # stands for the job's own work
            emit("done", **describe(msg))
            it.ack(msg)
    emit("closed")
    wait_for_line("EXIT")


ROLES: dict[str, Callable[[dict[str, Any]], None]] = {
    "pub": pub,
    "pub-stuck": pub_stuck,
    "sub": sub,
    "worker": worker,
}


def main() -> None:
    role, params_file = sys.argv[1], sys.argv[2]
    with open(params_file, encoding="utf-8") as f:
        params = json.load(f)
    ROLES[role](params)


if __name__ == "__main__":
    main()
