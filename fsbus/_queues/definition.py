"""What a queue is: its name rules, options and bindings (pure; no I/O)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .._core.topics import validate_pattern
from .._errors import UsageError

Overflow = Literal["drop-head", "reject-publish"]
OVERFLOWS: tuple[str, ...] = ("drop-head", "reject-publish")
MAX_NAME = 200
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$")
FORMAT = 1


def validate_queue_name(name: object) -> str:
    """Return ``name`` if it can name a queue; else raise :class:`UsageError` saying why."""
    if not isinstance(name, str):
        raise UsageError(f"a queue name must be a str, not {type(name).__name__}")
    if not name:
        raise UsageError("a queue name must not be empty")
    if len(name) > MAX_NAME:
        raise UsageError(
            f"queue name is {len(name)} characters long; at most {MAX_NAME} are allowed"
        )
    if not _NAME.match(name) or ".." in name:
        raise UsageError(
            f"invalid queue name {name!r}: use letters, digits and _ . : - (not starting "
            "with . : or -, no '..'); it names a folder in the bus directory"
        )
    return name


def _positive(value: object, what: str, *, integer: bool = False, least: int = 1) -> None:
    """Raise :class:`UsageError` unless ``value`` is None or, for ``integer``, an int of
    ``least`` or more (not a bool), else a finite number of seconds more than 0 (not NaN, not
    infinity: a queue option is stored and applied to every message routed into it)."""
    if value is None:
        return
    if integer:
        if isinstance(value, int) and not isinstance(value, bool) and value >= least:
            return
        kind = "a positive int (1 or more)" if least == 1 else f"an int of {least} or more"
        raise UsageError(f"{what} must be {kind} or None, not {value!r}")
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    ):
        return
    raise UsageError(
        f"{what} must be a positive number of seconds (finite, more than 0) or None, not {value!r}"
    )


@dataclass(frozen=True)
class QueueOptions:
    """The options a queue is declared with (declaring again must repeat them)."""

    message_ttl: float | None = None
    """Seconds a message waits in the queue at most (the message's own TTL may be less)."""
    max_length: int | None = None
    """Messages ready in the queue at most (those a consumer holds do not count, as on
    RabbitMQ); see :attr:`overflow`. 0: it keeps none (each is dropped, or refused)."""
    overflow: Overflow = "drop-head"
    """When full: drop the oldest message ("drop-head") or refuse the publish
    ("reject-publish": ``publish`` raises :class:`~fsbus.QueueFull`)."""
    dead_letter: str | None = None
    """Topic a message is republished under on the bus after ``max_deliveries`` failed
    deliveries (None: it is dropped then, as RabbitMQ does without a dead-letter exchange)."""
    dead_letter_expired: bool = False
    """Also republish under ``dead_letter`` the messages that expire in the queue (the
    queue's ``message_ttl`` or their own ttl), as RabbitMQ's dead-letter exchange takes
    expired messages: a queue with a ttl and no consumers is a delay. False: an expired
    message is dropped."""
    dead_letter_dropped: bool = False
    """Also republish under ``dead_letter`` the messages a full ``drop-head`` queue drops
    from its head, as RabbitMQ's dead-letter exchange takes them (reason ``maxlen``): an
    overflow is kept, not lost. False: a dropped message is gone."""
    max_deliveries: int | None = None
    """Failed deliveries before a message is dead-lettered (None: retried until it expires)."""
    auto_delete: bool = False
    """Delete the queue when its last consumer leaves (after it had one)."""
    expires: float | None = None
    """Delete the queue after this many seconds with no consumer and no declare."""

    def __post_init__(self) -> None:
        _positive(self.message_ttl, "message_ttl")
        _positive(self.max_length, "max_length", integer=True, least=0)
        _positive(self.max_deliveries, "max_deliveries", integer=True)
        _positive(self.expires, "expires")
        if self.overflow not in OVERFLOWS:
            raise UsageError(
                f"overflow must be one of {', '.join(OVERFLOWS)}, not {self.overflow!r}"
            )
        if self.dead_letter is not None:
            from .._core.topics import validate_topic

            validate_topic(self.dead_letter)
        if not isinstance(self.auto_delete, bool):
            raise UsageError(f"auto_delete must be True or False, not {self.auto_delete!r}")
        if not isinstance(self.dead_letter_expired, bool):
            raise UsageError(
                f"dead_letter_expired must be True or False, not {self.dead_letter_expired!r}"
            )
        if self.dead_letter_expired and self.dead_letter is None:
            raise UsageError(
                "dead_letter_expired needs a dead_letter topic to republish expired messages "
                "under; give dead_letter=, or leave dead_letter_expired False"
            )
        if not isinstance(self.dead_letter_dropped, bool):
            raise UsageError(
                f"dead_letter_dropped must be True or False, not {self.dead_letter_dropped!r}"
            )
        if self.dead_letter_dropped and self.dead_letter is None:
            raise UsageError(
                "dead_letter_dropped needs a dead_letter topic to republish dropped messages "
                "under; give dead_letter=, or leave dead_letter_dropped False"
            )

    def differences(self, other: QueueOptions) -> list[str]:
        """The options that differ, ``self`` being those asked and ``other`` those of the
        queue, as ``name: asked X, the queue has Y``."""
        a, b = asdict(self), asdict(other)
        return [f"{k}: asked {a[k]!r}, the queue has {b[k]!r}" for k in a if a[k] != b[k]]


@dataclass(frozen=True)
class Definition:
    """A queue as stored in ``fsbus/queues/<name>/queue.json``."""

    name: str
    options: QueueOptions = field(default_factory=QueueOptions)
    bindings: tuple[str, ...] = ()
    uid: str = field(default="", compare=False)
    """Random, given when the queue is created and kept by every change of its definition:
    a queue deleted and declared again under its name is another queue, though the
    filesystem may give its folders the inodes of the old ones ("": a definition
    written before fsbus kept one)."""

    def with_bindings(self, bindings: tuple[str, ...]) -> Definition:
        return Definition(self.name, self.options, bindings, self.uid)

    def encode(self) -> bytes:
        doc = {
            "format": FORMAT,
            "name": self.name,
            "options": _options_doc(self.options),
            "bindings": list(self.bindings),
        }
        if self.uid:
            doc["uid"] = self.uid
        return json.dumps(doc, sort_keys=True, indent=1).encode()

    @staticmethod
    def decode(data: bytes, name: str) -> Definition:
        """Parse a definition file; raise ValueError saying what is wrong."""
        try:
            doc: Any = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a format-{FORMAT} queue definition")
        if doc.get("name") != name:
            raise ValueError(f"names queue {doc.get('name')!r}, but lies in folder {name!r}")
        options_doc, bindings_doc = doc.get("options"), doc.get("bindings")
        if not isinstance(options_doc, dict):
            raise ValueError(f"bad options {options_doc!r}: not an object")
        # a string is iterable too: "e.#" must not be read as the bindings e, . and #
        if not isinstance(bindings_doc, list) or not all(isinstance(p, str) for p in bindings_doc):
            raise ValueError(f"bad bindings {bindings_doc!r}: not a list of strings")
        try:
            options = QueueOptions(**options_doc)
            bindings = tuple(validate_pattern(p) for p in bindings_doc)
        except (TypeError, UsageError) as exc:
            raise ValueError(f"bad options or bindings: {exc}") from exc
        uid = doc.get("uid", "")
        if not isinstance(uid, str):
            raise ValueError(f"bad uid {uid!r}: not a string")
        return Definition(name, options, bindings, uid)


def _options_doc(options: QueueOptions) -> dict[str, Any]:
    """``options`` as stored; an option added since format 1 is left out while it has its
    default, so that an older fsbus on the bus still reads the definition."""
    doc = asdict(options)
    for added in ("dead_letter_expired", "dead_letter_dropped"):
        if not doc[added]:
            del doc[added]
    return doc


CYCLE_HEADER = "x-fsbus-cycle"
"""The queues a dead letter expired in or was dropped from, one after the other, since
it last failed a delivery (names, space-separated): it goes back into none of them."""


def dead_letter_headers(
    headers: Mapping[str, str], queue: str, topic: str, reason: str | None = None
) -> dict[str, str]:
    """The headers a message of ``queue``, published on ``topic``, carries once
    dead-lettered: its own, where it came from (``x-fsbus-queue``, ``x-fsbus-topic``) and
    why (``x-fsbus-reason``: ``expired``, ``maxlen``; none for one that failed its last
    delivery). One that expired or was dropped adds ``queue`` to :data:`CYCLE_HEADER`;
    a failed delivery clears it (as a rejection ends a cycle for RabbitMQ)."""
    out = {**headers, "x-fsbus-queue": queue, "x-fsbus-topic": topic}
    out.pop(CYCLE_HEADER, None)
    if reason is not None:
        out["x-fsbus-reason"] = reason
        left = cycle_of(headers)
        out[CYCLE_HEADER] = " ".join(left if queue in left else [*left, queue])
    return out


def cycle_of(headers: Mapping[str, str]) -> list[str]:
    """The queues of a dead letter's :data:`CYCLE_HEADER`, which it must not go back
    into (none when it has no such header)."""
    return headers.get(CYCLE_HEADER, "").split()


@dataclass(frozen=True)
class QueueInfo:
    """A queue: its definition and what it holds now."""

    name: str
    """The queue's name."""
    bindings: tuple[str, ...]
    """The patterns routing messages into it."""
    options: QueueOptions
    """The options it was declared with."""
    depth: int
    """Messages in it: waiting, or held by a consumer and not yet acknowledged."""
    consumers: int
    """Consumers attached to it now (in any process on any host)."""
    dead_lettering: int = 0
    """Messages it dropped from its head (or refused) and has not yet republished under
    its dead-letter topic (``dead_letter_dropped``): out of the queue, on their way."""
