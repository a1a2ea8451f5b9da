"""Turning a publish call into a :class:`PublishPlan` (pure: validation and naming)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from .._core.topics import validate_topic
from .._errors import InvalidHeader, UsageError
from .._settings import Settings
from .layout import Layout
from .names import (
    MAX_EXPIRES_MS,
    bucket_for,
    encode_topic,
)

__all__ = [
    "MAX_HEADER_BYTES",
    "PublishPlan",
    "TopicForm",
    "check_ttl_priority",
    "encode_headers",
    "frame_headers",
    "plan_publish",
    "topic_form",
    "unframe_headers",
    "validate_headers",
    "with_head",
]

MAX_HEADER_NAME = 256
MAX_HEADER_BYTES = 64 * 1024


class PublishPlan(NamedTuple):
    """Everything needed to write one message, decided before any I/O.

    A named tuple rather than a frozen dataclass: one is built per publish, on the
    hot path.
    """

    topic: str
    """The validated topic."""
    name: str
    """File name of the message."""
    bucket: str
    """Bucket directory name."""
    bucket_index: int
    """Bucket index (for the UPDATE stamp)."""
    spill: str | None
    """The rest of a long hex topic, or None."""
    meta: bytes | None
    """The headers sidecar (JSON), or None."""
    durable: bool
    """fdatasync the file and fsync the directory before returning."""
    single: bool
    """Work-queue message."""
    expires_ms: int
    """Expiry, milliseconds since the epoch."""
    own: bool = False
    """No subscription of the publishing bus wants it (see ``BusFS.stamp_own``)."""
    head: bytes | None = None
    """The headers framed to go inline, before the payload (``FLAG_INLINE``); ``meta``
    is None then. See :func:`with_head`."""


def frame_headers(meta: bytes) -> bytes:
    """Headers JSON framed to lead a message file's payload (``FLAG_INLINE``)."""
    return len(meta).to_bytes(4, "big") + meta


def unframe_headers(data: bytes) -> tuple[bytes, bytes] | None:
    """(headers JSON, payload) from what follows the leading byte of a ``FLAG_INLINE``
    file; None when it cannot hold the length it gives (a damaged or foreign file)."""
    n = int.from_bytes(data[:4], "big")
    if len(data) < 4 + n or n > MAX_HEADER_BYTES + 64:
        return None
    return data[4 : 4 + n], data[4 + n :]


def payload_bytes(payload: object) -> bytes:
    """A payload given as bytes (or a bytearray, a memoryview) or as text (UTF-8), as
    bytes; UsageError for anything else (``bytes(5)`` would be five NUL bytes)."""
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    shown = repr(payload)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise UsageError(
        f"a payload is bytes or str, not {type(payload).__name__} ({shown}); encode it "
        "first, e.g. str(n).encode() or json.dumps(obj).encode()"
    )


def with_head(plan: PublishPlan, payload: bytes) -> bytes:
    """What a message file under ``plan`` holds after its leading byte."""
    return payload if plan.head is None else plan.head + payload


def validate_headers(headers: object) -> dict[str, str]:
    """Check header names and values; returns a plain dict copy."""
    out = _checked_headers(headers)
    if out:
        _check_headers_size(len(json.dumps(out, ensure_ascii=False).encode()))
    return out


def encode_headers(headers: object) -> bytes | None:
    """Headers checked (as :func:`validate_headers`) and encoded as a message stores
    them (compact JSON, ``{"headers": {...}}``); None when there are none.

    A publisher tends to send the same headers message after message (an AMQP
    publisher's properties, exchange and routing key): the encoding of a dict of them
    is kept (:data:`_ENCODED`), keyed by its items, and the next dict with the same
    items, in the same order, is not checked and encoded again (a quarter of the AMQP
    gateway's work per publish)."""
    key: tuple[object, ...] | None = None
    if type(headers) is dict:
        try:
            key = tuple(headers.items())
            meta = _ENCODED.get(key)
        except TypeError:  # an unhashable value: refused below
            key = meta = None
        if meta is not None:
            return meta
    out = _checked_headers(headers)
    if not out:
        return None
    meta = json.dumps({"headers": out}, separators=(",", ":"), ensure_ascii=False).encode()
    # the size validate_headers measures: the mapping alone, with ", " and ": "
    _check_headers_size(len(meta) - len(b'{"headers":}') + 2 * len(out) - 1)
    if key is not None and len(meta) <= _ENCODED_BYTES:
        if len(_ENCODED) >= _ENCODED_MAX:
            _ENCODED.clear()
        _ENCODED[key] = meta
    return meta


_ENCODED: dict[tuple[object, ...], bytes] = {}
"""Headers encoded lately (see :func:`encode_headers`), keyed by the items of the dict
they were encoded from (str keys and values only: the items of a dict checked and
encoded; a str equal to another encodes the same)."""
_ENCODED_MAX = 256
"""Encodings :data:`_ENCODED` holds before it starts afresh."""
_ENCODED_BYTES = 2048
"""Encodings longer than this are not kept (headers unique to one message are too, but
cost no more than an entry soon dropped)."""


def _check_headers_size(size: int) -> None:
    if size > MAX_HEADER_BYTES:
        raise InvalidHeader(
            f"headers take more than {MAX_HEADER_BYTES} bytes; put large data in the payload"
        )


def _checked_headers(headers: object) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidHeader(
            f"headers must be a mapping of str to str, not {type(headers).__name__}"
        )
    out: dict[str, str] = {}
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidHeader(
                f"header {k!r}: names and values must be str (got "
                f"{type(k).__name__} -> {type(v).__name__}); convert them first"
            )
        if not k or len(k) > MAX_HEADER_NAME or not k.isprintable():
            raise InvalidHeader(
                f"header name {k[:80]!r} is not allowed: names are 1-{MAX_HEADER_NAME} "
                "printable characters"
            )
        if "\x00" in v:
            raise InvalidHeader(f"header {k!r}: values may not contain NUL characters")
        out[k] = v
    return out


def check_ttl_priority(
    config: Settings, single: bool, ttl: float | None, priority: int | None
) -> tuple[int, int]:
    """A publish's ttl (in ms, the default when None) and priority (likewise), checked;
    raises UsageError."""
    if ttl is None:
        ttl_ms = round((config.single_ttl if single else config.multi_ttl) * 1000)
    elif not isinstance(ttl, int | float) or isinstance(ttl, bool) or not ttl > 0:
        raise UsageError(f"ttl must be a positive number of seconds, not {ttl!r}")
    else:
        ttl_ms = MAX_EXPIRES_MS if ttl >= MAX_EXPIRES_MS / 1000 else round(ttl * 1000)
    if priority is None:
        priority = config.default_priority
    elif not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 255:
        raise UsageError(f"priority must be an int from 0 (first) to 255 (last), not {priority!r}")
    return ttl_ms, priority


@dataclass(frozen=True, slots=True)
class TopicForm:
    """A validated topic, pre-encoded for names (cache it per topic)."""

    topic: str
    """The topic."""
    head: str
    """The hex topic as far as the name holds it, with ``@s+`` or ``@l+``."""
    spill: str | None
    """The rest of a long hex topic, or None."""


def topic_form(topic: object, split_at: int) -> TopicForm:
    """Validate ``topic`` and encode it the way names need it."""
    t = validate_topic(topic)
    hexed = encode_topic(t)
    head, rest = hexed[:split_at], hexed[split_at:]
    return TopicForm(t, f"{head}@{'l' if rest else 's'}+", rest or None)


def plan_publish(
    layout: Layout,
    config: Settings,
    form: TopicForm,
    *,
    single: bool,
    ttl: float | None,
    durable: bool,
    headers: object,
    priority: int | None,
    now_ms: int,
    host: str,
    random_hex: str,
    inline: bool = False,
) -> PublishPlan:
    """Validate a publish call and name the message; raises UsageError subclasses.

    ``inline``: headers go into the message file (``FLAG_INLINE``, the plan's ``head``)
    instead of a sidecar (``FLAG_META``, its ``meta``)."""
    ttl_ms, priority = check_ttl_priority(config, single, ttl, priority)
    meta = encode_headers(headers)
    expires_ms = min(now_ms + ttl_ms, MAX_EXPIRES_MS)
    flags = 0 if meta is None else 2 if inline else 1
    name = (
        f"{form.head}{expires_ms:x}+{'s' if single else 'm'}+f1{flags}"
        f"{priority:02x}{now_ms & MAX_EXPIRES_MS:011x}{host}{random_hex}"
    )
    buckets = layout.buckets
    bi = bucket_for(name, len(buckets))
    return PublishPlan(
        topic=form.topic,
        name=name,
        bucket=buckets[bi],
        bucket_index=bi,
        spill=form.spill,
        meta=None if inline else meta,
        durable=bool(durable),
        single=bool(single),
        expires_ms=expires_ms,
        head=frame_headers(meta) if inline and meta is not None else None,
    )
