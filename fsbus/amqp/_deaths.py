"""What dead-lettering does to a message's properties, as RabbitMQ does it (pure).

A dead-lettered message gains an ``x-death`` header: a list of tables, one per queue and
reason it was dead-lettered for, the latest first, each counting how many times. The
``x-first-death-*`` headers name the first queue, reason and exchange and are never
changed after; the ``x-last-death-*`` headers (RabbitMQ 3.13 and later) name the latest.
A per-message ``expiration`` is removed (kept in the entry as ``original-expiration``),
so that the message does not expire again wherever it is routed to.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from pamqp import commands as spec

__all__ = ["cycle_queues", "dead_lettered"]


def dead_lettered(
    props: spec.Basic.Properties,
    *,
    queue: str,
    reason: str,
    exchange: str,
    routing_keys: Sequence[str],
    now: float,
) -> spec.Basic.Properties:
    """New properties for a message with ``props`` dead-lettered from ``queue`` for
    ``reason`` (``rejected``, ``expired``, ``maxlen``, ``delivery_limit``); ``exchange``
    and ``routing_keys``: where it was published to. ``props`` is not changed."""
    fields: dict[str, Any] = {name: getattr(props, name) for name in props.attributes()}
    headers: dict[str, Any] = dict(fields["headers"] or {})
    deaths = headers.get("x-death")
    entries = [d for d in deaths if isinstance(d, dict)] if isinstance(deaths, list) else []
    for i, old in enumerate(entries):
        if old.get("queue") == queue and old.get("reason") == reason:
            count = old.get("count")
            entry = {**old, "count": (count if isinstance(count, int) else 0) + 1}
            del entries[i]
            break
    else:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": queue,
            "time": datetime.datetime.fromtimestamp(int(now), tz=datetime.UTC),
            "exchange": exchange,
            "routing-keys": list(routing_keys),
        }
        if fields["expiration"]:
            entry["original-expiration"] = fields["expiration"]
    fields["expiration"] = None
    headers["x-death"] = [entry, *entries]
    if "x-first-death-reason" not in headers:
        headers["x-first-death-queue"] = queue
        headers["x-first-death-reason"] = reason
        headers["x-first-death-exchange"] = exchange
    headers["x-last-death-queue"] = queue
    headers["x-last-death-reason"] = reason
    headers["x-last-death-exchange"] = exchange
    fields["headers"] = headers
    return spec.Basic.Properties(**fields)


def cycle_queues(props: spec.Basic.Properties) -> frozenset[str]:
    """The queues a message just dead-lettered (``props`` with its new ``x-death``) must
    not be routed back into: each queue it died in, newest first, until a death by
    rejection. RabbitMQ drops a dead letter that would close such a cycle (one with no
    rejection in it), so a ttl that leads back to its own queue does not go round
    forever."""
    deaths = (props.headers or {}).get("x-death")
    out: set[str] = set()
    for d in deaths if isinstance(deaths, list) else []:
        if not isinstance(d, dict) or d.get("reason") == "rejected":
            break
        queue = d.get("queue")
        if isinstance(queue, str):
            out.add(queue)
    return frozenset(out)
