"""What a bucket's UPDATE stamp tells about who stamped it last (pure).

A publisher stamps a bucket's slot in ``update/UPDATE`` after renaming a message into it;
qlobber-fsq writes random bytes, and so did fsbus. The consumers of durable queues elect
a router that lists the main bus for peers' messages alone (fsbus publishers route their
own when they publish), and that bus keeps every multi message until it expires: with
every bucket changing under a steady fsbus flow, the router listed all of them, about
once every half second, for nothing.

So fsbus stamps say they are fsbus's: a stamp of ``size`` bytes (at least
:data:`TAGGED_FROM`) is a body and an 8-byte tag, the xxh64 of the body with fsbus's
seed. A random stamp (a peer's, or an older fsbus's) passes for one with a chance of one
in 2**64. The body's first byte says whether the stamp *carries* a peer's: a publisher
that reads a peer's stamp in the slot just before it writes its own (see
``BusFS.stamp``) writes one that carries it, with the time it saw it, and the next fsbus
publishers there carry it on for :data:`CARRY_MS`. The router lists a changed bucket
unless its stamp is fsbus's and carries nothing (:func:`peer_may_have_stamped`).

Between that read and the write (two system calls), a peer's stamp can land and be
overwritten unseen: then its message is routed at the router's next full listing (every
``refresh_ttl``), late, never lost.
"""

from __future__ import annotations

from collections.abc import Callable

import xxhash

__all__ = ["CARRY_MS", "TAGGED_FROM", "fresh", "peer_may_have_stamped", "renew", "tagged"]

TAGGED_FROM = 24
"""The smallest stamp size that is tagged: 16 bytes of body (a flag, a time of 6 bytes
and 9 random ones, so that two stamps in a row differ) and the tag. Smaller stamps are
random as before, and a router lists every bucket whose stamp changed."""
CARRY_MS = 5000
"""Milliseconds that fsbus stamps carry a peer's after the first of them saw it: the
router lists every half second at most, so it lists the bucket at least once meanwhile."""

_TAG = 8
_SEED = 0x66736275735F7374  # "fsbus_st"
_CLEAN = 0
_CARRY = 1
_CLEAN_FLAG = bytes((_CLEAN,))
_CARRY_FLAG = bytes((_CARRY,))
_digest = xxhash.xxh64_digest


def tagged(size: int) -> bool:
    """Whether stamps of ``size`` bytes say who wrote them."""
    return size >= TAGGED_FROM


def _sign(body: bytes) -> bytes:
    return body + _digest(body, _SEED)


def _carried_since(stamp: bytes) -> int | None:
    """The time (ms) a peer's stamp was first seen, if ``stamp`` is fsbus's and carries
    one; -1 when it is fsbus's and carries none; None when it is not fsbus's."""
    body = stamp[:-_TAG]
    if len(stamp) < TAGGED_FROM or _digest(body, _SEED) != stamp[-_TAG:]:
        return None
    if body[0] == _CARRY:
        return int.from_bytes(body[1:7], "big")
    return -1


def fresh(before: bytes, noise: bytes, clock: Callable[[], float]) -> bytes:
    """The stamp to write over ``before`` (the slot just before).

    ``noise``: random bytes, as many as the stamp's size, that make it new. ``clock``:
    the wall clock (``time.time``), read only when a peer's stamp is carried. Of a slot
    never stamped (zeros) or stamped by fsbus with nothing carried, a stamp that
    carries nothing; of a peer's, one that carries it from now; of one carrying a
    peer's since less than :data:`CARRY_MS`, one that carries it since then.
    """
    body = before[:-_TAG]
    if body[:1] == _CLEAN_FLAG and _digest(body, _SEED) == before[-_TAG:]:
        new = _CLEAN_FLAG + noise[1:-_TAG]  # (the common case: fsbus's, nothing carried)
        return new + _digest(new, _SEED)
    since = _carried_since(before)
    if since is None:
        if before.count(0) == len(before):
            since = -1  # never stamped
        else:
            since = int(clock() * 1000)  # a peer's stamp (or an older fsbus's): carry it
    elif since >= 0 and int(clock() * 1000) - since >= CARRY_MS:
        since = -1  # carried long enough: the router has listed the bucket since
    if since < 0:
        new = _CLEAN_FLAG + noise[1:-_TAG]
    else:
        new = _CARRY_FLAG + (since & 0xFFFF_FFFF_FFFF).to_bytes(6, "big") + noise[7:-_TAG]
    return new + _digest(new, _SEED)


def renew(before: bytes, noise: bytes, size: int, now: float) -> bytes:
    """A whole UPDATE file's stamps made new at once (a bus that opens does so, as
    qlobber-fsq does): :func:`fresh` of each slot of ``before`` (zeros where the file is
    short), with ``noise`` as long as the file, at ``now`` (``time.time()``)."""
    before = before.ljust(len(noise), b"\0")
    return b"".join(
        fresh(before[at : at + size], noise[at : at + size], lambda: now)
        for at in range(0, len(noise), size)
    )


def peer_may_have_stamped(stamp: bytes) -> bool:
    """Whether a changed bucket whose slot holds ``stamp`` may hold a peer's new message:
    yes unless the stamp is fsbus's and carries no peer's."""
    since = _carried_since(stamp)
    return since is None or since >= 0
