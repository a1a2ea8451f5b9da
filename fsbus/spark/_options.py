"""Parse and check the options of the ``fsbus`` Spark data source (pure: no I/O).

Spark hands options over as a case-insensitive mapping of strings. Everything is
checked here, on the driver, when the query is defined, so a bad option fails at
``.load()`` / ``.save()`` / ``.start()`` with a message naming the option, the value and
the rule, before any task runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fsbus import InvalidConfig

__all__ = [
    "BusSnapshotOptions",
    "OffsetSpec",
    "SinkOptions",
    "StreamSourceOptions",
    "parse_bus_snapshot_options",
    "parse_sink_options",
    "parse_stream_source_options",
    "reader_kind",
]

DEFAULT_RECORDS_PER_PARTITION = 1_000_000
"""Records per Spark task by default: about the 128 MB split of Spark's file sources for
100-byte records. Each task of a Python data source costs Spark tens of milliseconds, and
one task keeps two cores busy (Python produces Arrow batches, the JVM consumes them)."""

_STREAM_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")

OffsetSpec = Literal["earliest", "latest"] | int
"""Where to start (or stop) in one stream: a symbolic position or an exact offset."""

_SOURCE_KEYS = frozenset(
    {
        "path",
        "stream",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "endingtimestamp",
        "maxrecordspertrigger",
        "maxrecordsperpartition",
        "minpartitions",
        "failondataloss",
    }
)
_BUS_KEYS = frozenset(
    {
        "path",
        "pattern",
        "includepayload",
        # streaming reads of Bus topics (a batch read ignores them)
        "queue",
        "maxrecordspertrigger",
        "maxrecordsperpartition",
        "minpartitions",
        "failondataloss",
    }
)
_SINK_KEYS = frozenset(
    {
        "path",
        "stream",
        "topic",
        "topiccolumn",
        "single",
        "ttl",
        "priority",
        "sinkid",
        "createstream",
        "checkpointlocation",
    }
)
# Spark itself adds these to the options it hands to a data source.
_SPARK_KEYS = frozenset({"checkpointlocation", "path", "queryname"})


@dataclass(frozen=True)
class StreamSourceOptions:
    """Options of a Stream read (streaming or batch)."""

    root: str
    """The bus root directory (option ``path``)."""
    streams: tuple[str, ...]
    """Names of the streams read (option ``stream``, comma-separated)."""
    starting: Mapping[str, OffsetSpec]
    """Per stream: where a new query or a batch read starts."""
    ending: Mapping[str, OffsetSpec]
    """Per stream: where a batch read stops (exclusive); streaming queries ignore it."""
    starting_timestamp: float | None
    """Start at the first record with a timestamp >= this (epoch seconds), if given."""
    ending_timestamp: float | None
    """Batch reads stop before the first record with a timestamp >= this, if given."""
    max_records_per_trigger: int | None
    """Admission control: at most this many records per micro-batch (None: no limit)."""
    max_records_per_partition: int
    """A Spark task reads at most this many records of one stream."""
    min_partitions: int
    """Split a batch or micro-batch into at least this many tasks when it has the records."""
    fail_on_data_loss: bool
    """Raise when records the query still needs were removed by retention (else skip them)."""


@dataclass(frozen=True)
class BusSnapshotOptions:
    """Options of a batch read of the Bus's current messages."""

    root: str
    """The bus root directory (option ``path``)."""
    pattern: str
    """Only messages whose topic matches this AMQP pattern (option ``pattern``)."""
    include_payload: bool
    """Read each message's payload (option ``includePayload``, default true)."""


@dataclass(frozen=True)
class SinkOptions:
    """Options of a write (batch or streaming) into a Stream or onto the Bus."""

    root: str
    """The bus root directory (option ``path``)."""
    stream: str | None
    """Append to this stream; None means publish on the Bus."""
    topic: str | None
    """Publish every row on this topic (option ``topic``)."""
    topic_column: str
    """Otherwise take each row's topic from this column (option ``topicColumn``)."""
    single: bool
    """Publish work-queue (single) messages instead of multi messages."""
    ttl: float | None
    """Time to live of published messages, seconds (None: the bus defaults)."""
    priority: int | None
    """Priority of published single messages (None: the bus default)."""
    sink_id: str | None
    """Names this sink's commit markers; stable across restarts of one query."""
    create_stream: bool
    """Create the target stream if it does not exist yet."""


def reader_kind(options: Mapping[str, str]) -> Literal["stream", "bus"]:
    """Which reader the options ask for: a Stream (``stream``) or a Bus snapshot (``pattern``)."""
    opts = _lower(options)
    if "stream" in opts and "pattern" in opts:
        raise InvalidConfig(
            "options 'stream' and 'pattern' exclude each other: give 'stream' to read a "
            "Stream, or 'pattern' to read a snapshot of the Bus's messages"
        )
    if "pattern" in opts:
        return "bus"
    if "stream" not in opts:
        raise InvalidConfig(
            "missing option 'stream': say which Stream to read, e.g. "
            ".option('stream', 'events') (or 'pattern' for a snapshot of the Bus's messages)"
        )
    return "stream"


def parse_stream_source_options(options: Mapping[str, str]) -> StreamSourceOptions:
    """Check the options of a Stream read and return them typed."""
    opts = _lower(options)
    _reject_unknown(opts, _SOURCE_KEYS, "reading a Stream")
    root = _root(opts)
    streams = _stream_names(opts.get("stream"))
    starting = _offsets(opts.get("startingoffsets"), streams, "startingOffsets", "earliest")
    ending = _offsets(opts.get("endingoffsets"), streams, "endingOffsets", "latest")
    starting_ts = _timestamp(opts.get("startingtimestamp"), "startingTimestamp")
    ending_ts = _timestamp(opts.get("endingtimestamp"), "endingTimestamp")
    if starting_ts is not None and "startingoffsets" in opts:
        raise InvalidConfig("give 'startingOffsets' or 'startingTimestamp', not both")
    if ending_ts is not None and "endingoffsets" in opts:
        raise InvalidConfig("give 'endingOffsets' or 'endingTimestamp', not both")
    for name in streams:
        a, b = starting[name], ending[name]
        if isinstance(a, int) and isinstance(b, int) and b < a:
            raise InvalidConfig(
                f"endingOffsets {b} of stream {name!r} is before startingOffsets {a}; "
                "the range is [starting, ending)"
            )
    return StreamSourceOptions(
        root=root,
        streams=streams,
        starting=starting,
        ending=ending,
        starting_timestamp=starting_ts,
        ending_timestamp=ending_ts,
        max_records_per_trigger=_positive_int(opts, "maxrecordspertrigger", "maxRecordsPerTrigger"),
        max_records_per_partition=_positive_int(
            opts, "maxrecordsperpartition", "maxRecordsPerPartition"
        )
        or DEFAULT_RECORDS_PER_PARTITION,
        min_partitions=_positive_int(opts, "minpartitions", "minPartitions") or 1,
        fail_on_data_loss=_bool(opts, "failondataloss", "failOnDataLoss", default=True),
    )


def parse_bus_snapshot_options(options: Mapping[str, str]) -> BusSnapshotOptions:
    """Check the options of a Bus snapshot read and return them typed."""
    opts = _lower(options)
    _reject_unknown(opts, _BUS_KEYS, "reading a snapshot of the Bus")
    pattern = opts.get("pattern", "#")
    return BusSnapshotOptions(
        root=_root(opts),
        pattern=pattern,
        include_payload=_bool(opts, "includepayload", "includePayload", default=True),
    )


def parse_sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    """Check the options of a write and return them typed.

    A streaming write needs a stable sink id: the option ``sinkId``, or else one derived
    from the query's ``checkpointLocation`` (so a restarted query finds its markers and a
    new query with a new checkpoint does not).
    """
    opts = _lower(options)
    _reject_unknown(opts, _SINK_KEYS, "writing")
    root = _root(opts)
    stream = opts.get("stream")
    topic = opts.get("topic")
    if stream is not None and topic is not None:
        raise InvalidConfig(
            "options 'stream' and 'topic' exclude each other: give 'stream' to append to a "
            "Stream, or 'topic' / 'topicColumn' to publish on the Bus"
        )
    if stream is not None:
        (stream,) = _stream_names(stream, allow_many=False)
        for key in ("topiccolumn", "single", "ttl", "priority"):
            if key in opts:
                raise InvalidConfig(
                    f"option {key!r} applies to publishing on the Bus, not to appending to "
                    f"stream {stream!r}; drop it"
                )
    if topic is not None and not topic:
        raise InvalidConfig("option 'topic' is empty; give a topic such as 'alerts.latency'")
    ttl = _positive_float(opts, "ttl", "ttl")
    priority = None
    if "priority" in opts:
        priority = _int(opts["priority"], "priority")
        if not 0 <= priority <= 255:
            raise InvalidConfig(f"option 'priority' must be 0..255, got {priority}")
    sink_id = opts.get("sinkid")
    if sink_id is not None and not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}", sink_id):
        raise InvalidConfig(
            f"option 'sinkId' {sink_id!r} must be 1-100 characters of letters, digits, "
            "'.', '_' or '-' (no leading dot)"
        )
    if sink_id is None and "checkpointlocation" in opts:
        # The query (its checkpoint) and the target: pointing a query at another target
        # starts that target's markers afresh.
        target = f"stream:{stream}" if stream else f"topic:{topic}:{opts.get('topiccolumn')}"
        material = f"{opts['checkpointlocation']}\0{target}".encode()
        sink_id = f"ckpt-{hashlib.sha256(material).hexdigest()[:20]}"
    if streaming and sink_id is None:
        raise InvalidConfig(
            "a streaming write to fsbus needs option 'checkpointLocation' (or an explicit "
            "'sinkId'): exactly-once publishing keys its commit markers on it"
        )
    return SinkOptions(
        root=root,
        stream=stream,
        topic=topic,
        topic_column=opts.get("topiccolumn", "topic"),
        single=_bool(opts, "single", "single", default=False),
        ttl=ttl,
        priority=priority,
        sink_id=sink_id,
        create_stream=_bool(opts, "createstream", "createStream", default=True),
    )


# --- helpers ---------------------------------------------------------------------------


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _reject_unknown(opts: Mapping[str, str], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(opts) - known - _SPARK_KEYS)
    if unknown:
        raise InvalidConfig(
            f"unknown option(s) {', '.join(map(repr, unknown))} for {what}; "
            f"known: {', '.join(sorted(known))} (case-insensitive)"
        )


def _root(opts: Mapping[str, str]) -> str:
    root = opts.get("path", "")
    if not root.strip():
        raise InvalidConfig(
            "missing option 'path': give the bus root directory, e.g. "
            ".option('path', '/shared/bus') or .load('/shared/bus')"
        )
    return root


def _stream_names(value: str | None, *, allow_many: bool = True) -> tuple[str, ...]:
    if value is None or not value.strip():
        raise InvalidConfig(
            "missing option 'stream': say which Stream to use, e.g. .option('stream', 'events')"
        )
    names = tuple(n.strip() for n in value.split(","))
    if len(names) > 1 and not allow_many:
        raise InvalidConfig(f"option 'stream' names one stream to write to, got {value!r}")
    for name in names:
        if not _STREAM_NAME.fullmatch(name):
            raise InvalidConfig(
                f"bad stream name {name!r} in option 'stream': names are 1-200 characters "
                "of letters, digits, '.', '_' or '-', not starting with '.'"
            )
    if len(set(names)) != len(names):
        raise InvalidConfig(f"option 'stream' names a stream twice: {value!r}")
    return names


def _offsets(
    value: str | None, streams: tuple[str, ...], option: str, default: OffsetSpec
) -> dict[str, OffsetSpec]:
    if value is None:
        return dict.fromkeys(streams, default)
    text = value.strip()
    if text in ("earliest", "latest"):
        return dict.fromkeys(streams, text)  # type: ignore[arg-type]
    rule = (
        f"option {option!r} must be 'earliest', 'latest', an offset (one stream), or a JSON "
        'object per stream such as {"events": 42}'
    )
    try:
        parsed = json.loads(text)
    except ValueError:
        raise InvalidConfig(f"{rule}; got {value!r}") from None
    if isinstance(parsed, int) and not isinstance(parsed, bool):
        if len(streams) != 1:
            raise InvalidConfig(f"{rule}; a bare offset needs exactly one stream, got {value!r}")
        parsed = {streams[0]: parsed}
    if not isinstance(parsed, dict):
        raise InvalidConfig(f"{rule}; got {value!r}")
    extra = sorted(set(parsed) - set(streams))
    if extra:
        raise InvalidConfig(
            f"option {option!r} names stream(s) {extra} that option 'stream' does not read "
            f"({', '.join(streams)})"
        )
    out: dict[str, OffsetSpec] = dict.fromkeys(streams, default)
    for name, spec in parsed.items():
        if spec in ("earliest", "latest"):
            out[name] = spec
        elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
            out[name] = spec
        else:
            raise InvalidConfig(f"{rule}; stream {name!r} has {spec!r}")
    return out


def _timestamp(value: str | None, option: str) -> float | None:
    if value is None:
        return None
    try:
        ts = float(value)
    except ValueError:
        raise InvalidConfig(
            f"option {option!r} must be seconds since the epoch (e.g. 1700000000.5), got {value!r}"
        ) from None
    if not math.isfinite(ts) or ts < 0:
        raise InvalidConfig(f"option {option!r} must be a finite time >= 0, got {value!r}")
    return ts


def _int(value: str, option: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidConfig(f"option {option!r} must be an integer, got {value!r}") from None


def _positive_int(opts: Mapping[str, str], key: str, option: str) -> int | None:
    if key not in opts:
        return None
    n = _int(opts[key], option)
    if n <= 0:
        raise InvalidConfig(f"option {option!r} must be a positive integer, got {n}")
    return n


def _positive_float(opts: Mapping[str, str], key: str, option: str) -> float | None:
    if key not in opts:
        return None
    try:
        x = float(opts[key])
    except ValueError:
        raise InvalidConfig(f"option {option!r} must be a number, got {opts[key]!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise InvalidConfig(f"option {option!r} must be a positive number, got {opts[key]!r}")
    return x


def _bool(opts: Mapping[str, str], key: str, option: str, *, default: bool) -> bool:
    if key not in opts:
        return default
    value = opts[key].strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidConfig(f"option {option!r} must be true or false, got {opts[key]!r}")
