"""Message-name codec (pure), byte-compatible with qlobber-fsq 14.

A message file is named::

    <hex(utf8(topic))[:split_topic_at]>@<s|l>+<expires ms, hex>+<m|s|d>+<unique>

``s``/``l`` say whether the whole hex topic fits in the name (short) or the rest spilled
into ``topics/<bucket>/<name>`` (long). ``m`` is a multi message (every subscriber), ``s`` a
single (work-queue) message, ``d`` a qlobber-fsq direct stream (never produced by fsbus).

qlobber-fsq fills ``unique`` with 32 random hex digits and never parses it. fsbus writes its
own fields there, still ``[0-9a-f]`` only, prefixed ``f1``::

    f1 <flags:1> <priority:2> <published ms:11> <host id:6> <random:12>     (34 chars)

so a name stays under 255 bytes (200 + 3 + 11 + 3 + 34 = 251). ``flags`` bit 0 says that a
metadata sidecar (headers) exists; bit 1 that the headers are inline, at the head of the
file (see :data:`FLAG_INLINE`). Names whose unique part is not of this form (qlobber-fsq
peers) get the default priority and no publish time or host.
"""

from __future__ import annotations

import binascii
import re
from typing import Literal, NamedTuple

import xxhash

__all__ = [
    "FIELDS_HEAD_PATTERN",
    "FLAG_INLINE",
    "FLAG_META",
    "MAX_EXPIRES_MS",
    "FsbusFields",
    "ParsedName",
    "bucket_for",
    "decode_fields",
    "decode_topic",
    "encode_fields",
    "encode_topic",
    "format_bucket",
    "host_id",
    "make_name",
    "parse_name",
]

Kind = Literal["m", "s", "d"]

FLAG_META = 0x1
FLAG_INLINE = 0x2
"""The headers are in the message file itself, after its leading byte: their length (4
bytes, big-endian), then their JSON, then the payload. Only the buses of durable queues
write this (no qlobber-fsq peer reads them): one file a message instead of two."""
MAX_EXPIRES_MS = 0xFFF_FFFF_FFFF  # 11 hex digits: the year 2527
_FSBUS_PREFIX = "f1"
_FSBUS_UNIQUE_LEN = 34
FIELDS_HEAD_PATTERN = "f1([0-9a-f])([0-9a-f]{2})([0-9a-f]{11})([0-9a-f]{6})"
"""fsbus's unique part up to its random digits: flags, priority, publish time and host,
one group each (followed by 12 hex digits)."""
_FIELDS_PATTERN = FIELDS_HEAD_PATTERN + "[0-9a-f]{12}"
_FIELDS_RE = re.compile(_FIELDS_PATTERN)
# topic hex (no "@": the last "@" splits), size, expiry, kind, then the unique part (no
# "@" or "+": exactly four "+" fields), fsbus's fields in it when it has their form.
_NAME_RE = re.compile(
    r"((?:[0-9a-f]{2})*)@([sl])\+([0-9a-f]{1,13})\+([msd])\+"
    rf"((?=(?:{_FIELDS_PATTERN})\Z)?[^@+]*)",
    re.DOTALL,
)


class FsbusFields(NamedTuple):
    """What fsbus stores in the unique part of a name.

    A named tuple rather than a frozen dataclass: one is built per name listed, and a
    tuple costs a fifth as much to build."""

    flags: int
    """Bit field: ``FLAG_META``, a metadata sidecar holds headers; ``FLAG_INLINE``, the
    message file does."""
    priority: int
    """0-255, lower is taken first (work-queue messages)."""
    published_ms: int
    """Publish time, milliseconds since the epoch."""
    host: str
    """Six hex digits identifying the publishing host (see :func:`host_id`)."""


class ParsedName(NamedTuple):
    """A message file name taken apart (a named tuple: cheap to build, one per name)."""

    name: str
    """The whole file name."""
    topic_hex: str
    """The hex-encoded topic as far as the name holds it."""
    long: bool
    """True when the rest of the hex topic is in ``topics/<bucket>/<name>``."""
    expires_ms: int
    """Expiry, milliseconds since the epoch; expired when ``expires_ms <= now_ms``."""
    kind: Kind
    """``m`` multi, ``s`` single, ``d`` direct (qlobber-fsq only)."""
    unique: str
    """The unique part after the last ``+``."""
    fields: FsbusFields | None
    """fsbus's fields when an fsbus peer wrote the name, else None."""

    @property
    def single(self) -> bool:
        """Whether this is a work-queue message."""
        return self.kind == "s"


def encode_topic(topic: str) -> str:
    """Hex of the UTF-8 bytes of ``topic`` (qlobber-fsq's ``encode_topics``)."""
    return topic.encode("utf-8").hex()


def decode_topic(topic_hex: str) -> str | None:
    """Decode a full hex topic; None when it is not valid hex or not UTF-8."""
    try:
        return binascii.unhexlify(topic_hex).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def encode_fields(fields: FsbusFields, random_hex: str) -> str:
    """The unique part fsbus writes; ``random_hex`` is 12 hex digits."""
    return (
        f"{_FSBUS_PREFIX}{fields.flags & 0xF:x}{fields.priority:02x}"
        f"{fields.published_ms & MAX_EXPIRES_MS:011x}{fields.host}{random_hex}"
    )


def decode_fields(unique: str) -> FsbusFields | None:
    """fsbus's fields from a unique part, or None when a foreign peer wrote it."""
    m = _FIELDS_RE.fullmatch(unique)
    if m is None:
        return None
    flags, priority, published, host = m.groups()
    return FsbusFields(int(flags, 16), int(priority, 16), int(published, 16), host)


def make_name(
    topic_hex: str, *, split_at: int, expires_ms: int, kind: Kind, unique: str
) -> tuple[str, str | None]:
    """Build a message name; returns (name, spilled rest of the hex topic or None)."""
    head, rest = topic_hex[:split_at], topic_hex[split_at:]
    expires_ms = max(0, min(expires_ms, MAX_EXPIRES_MS))
    name = f"{head}@{'l' if rest else 's'}+{expires_ms:x}+{kind}+{unique}"
    return name, (rest or None)


def parse_name(name: str) -> ParsedName | None:
    """Parse a message file name the way qlobber-fsq does; None means "not a message".

    The last ``@`` splits topic from metadata; the metadata must split on ``+`` into
    exactly four fields. fsbus is stricter than qlobber-fsq where laxness would hurt:
    the topic part must be hex, the expiry hex, the kind one of ``m``/``s``/``d``.
    One regular-expression match takes the whole name apart (fsbus's unique fields too).
    """
    m = _NAME_RE.fullmatch(name)
    if m is None:
        return None
    topic_hex, size, expires, kind, unique, flags, priority, published, host = m.groups()
    fields = (
        None
        if flags is None
        else FsbusFields(int(flags, 16), int(priority, 16), int(published, 16), host)
    )
    return ParsedName(name, topic_hex, size == "l", int(expires, 16), kind, unique, fields)  # type: ignore[arg-type]


def bucket_for(name: str, num_buckets: int) -> int:
    """The bucket a publisher puts ``name`` in (any choice works for readers)."""
    if num_buckets == 1:
        return 0
    return int(xxhash.xxh32_intdigest(name.encode("ascii"))) % num_buckets


def format_bucket(index: int, base: int, chars: int) -> str:
    """qlobber-fsq's bucket directory name: ``index`` in ``base``, zero-padded."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    n = index
    while n:
        n, r = divmod(n, base)
        out = digits[r] + out
    return (out or "0").rjust(chars, "0")


def host_id(hostname: str, namespace: str = "") -> str:
    """Six hex digits naming a host in message names.

    ``namespace`` tells apart hosts that share a name, such as containers on one kernel
    (their pid namespaces differ), so that (host id, pid) stays unique.
    """
    key = f"{hostname}\0{namespace}" if namespace else hostname
    return f"{xxhash.xxh32_intdigest(key.encode('utf-8')) & 0xFFFFFF:06x}"
