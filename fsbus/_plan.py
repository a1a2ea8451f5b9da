"""Turning a publish call into a :class:`PublishPlan` (pure: validation and naming)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ._config import BusConfig
from ._errors import InvalidHeader, UsageError
from ._layout import Layout
from ._names import (
    FLAG_META,
    MAX_EXPIRES_MS,
    FsbusFields,
    bucket_for,
    encode_fields,
    encode_topic,
    make_name,
)
from ._topics import validate_topic

__all__ = ["MAX_HEADER_BYTES", "PublishPlan", "plan_publish", "validate_headers"]

MAX_HEADER_NAME = 256
MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class PublishPlan:
    """Everything needed to write one message, decided before any I/O."""

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


def validate_headers(headers: object) -> dict[str, str]:
    """Check header names and values; returns a plain dict copy."""
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
    if len(json.dumps(out, ensure_ascii=False).encode()) > MAX_HEADER_BYTES:
        raise InvalidHeader(
            f"headers take more than {MAX_HEADER_BYTES} bytes; put large data in the payload"
        )
    return out


def plan_publish(
    layout: Layout,
    config: BusConfig,
    topic: object,
    *,
    single: bool,
    ttl: float | None,
    durable: bool,
    headers: object,
    priority: int | None,
    now_ms: int,
    host: str,
    random_hex: str,
) -> PublishPlan:
    """Validate a publish call and name the message; raises UsageError subclasses."""
    t = validate_topic(topic)
    if ttl is None:
        ttl = config.single_ttl if single else config.multi_ttl
    elif not isinstance(ttl, int | float) or isinstance(ttl, bool) or not ttl > 0:
        raise UsageError(f"ttl must be a positive number of seconds, not {ttl!r}")
    if priority is None:
        priority = config.default_priority
    elif not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 255:
        raise UsageError(f"priority must be an int from 0 (first) to 255 (last), not {priority!r}")
    hdrs = validate_headers(headers)
    meta = (
        json.dumps({"headers": hdrs}, separators=(",", ":"), ensure_ascii=False).encode()
        if hdrs
        else None
    )
    fields = FsbusFields(
        flags=FLAG_META if meta else 0, priority=priority, published_ms=now_ms, host=host
    )
    # ttl=inf (or any huge ttl) means "as late as a name can say": clamp before rounding.
    expires_ms = now_ms + round(min(ttl * 1000, MAX_EXPIRES_MS))
    name, spill = make_name(
        encode_topic(t),
        split_at=config.split_topic_at,
        expires_ms=expires_ms,
        kind="s" if single else "m",
        unique=encode_fields(fields, random_hex),
    )
    bi = bucket_for(name, len(layout.buckets))
    return PublishPlan(
        topic=t,
        name=name,
        bucket=layout.buckets[bi],
        bucket_index=bi,
        spill=spill,
        meta=meta,
        durable=bool(durable),
        single=bool(single),
        expires_ms=min(expires_ms, 0xFFF_FFFF_FFFF),
    )
