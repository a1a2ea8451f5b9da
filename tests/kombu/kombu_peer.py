# kombu carries no annotations.
# mypy: disable-error-code="no-untyped-call"

"""A kombu consumer process for the transport's multi-process tests.

    python kombu_peer.py URL QUEUE [--exchange NAME --type fanout|topic|direct --key KEY]
                         [--prefetch N] [--hold]

Declares QUEUE (bound to the exchange when one is given), prints ``{"event": "ready"}``,
then one ``{"event": "got", ...}`` line per message and acknowledges it, or with
``--hold`` never acknowledges (a test kills it). Stops on "STOP" from stdin.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Consumer

import fsbus.kombu  # noqa: F401  (registers fsbus://)


def say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("queue")
    ap.add_argument("--exchange")
    ap.add_argument("--type", default="direct")
    ap.add_argument("--key", default="")
    ap.add_argument("--prefetch", type=int, default=1)
    ap.add_argument("--hold", action="store_true")
    args = ap.parse_args()

    stop = threading.Event()

    def watch_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "STOP":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    if args.exchange:
        queue = Queue(args.queue, Exchange(args.exchange, type=args.type), routing_key=args.key)
    else:
        queue = Queue(args.queue, routing_key=args.queue)

    def on_message(body: Any, message: Any) -> None:
        say(
            event="got",
            body=body,
            redelivered=bool(message.delivery_info.get("redelivered")),
            routing_key=message.delivery_info.get("routing_key"),
            pid=os.getpid(),
        )
        if not args.hold:
            message.ack()

    with Connection(args.url) as conn:
        channel = conn.channel()
        consumer = Consumer(channel, [queue], callbacks=[on_message], accept=["json"])
        consumer.qos(prefetch_count=args.prefetch)
        with consumer:
            say(event="ready", pid=os.getpid())
            while not stop.is_set():
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
    say(event="stopped")


if __name__ == "__main__":
    main()
