"""Topic and pattern rules (pure: no I/O, no clock).

A *topic* names what a message is about; a *pattern* selects topics for a
subscription. Both are ``str`` split into words on ``"."``:

* the UTF-8 encoding must succeed (no lone surrogates) and be at most
  :data:`MAX_TOPIC_BYTES` bytes long;
* no C0 control characters (``"\\x00"`` … ``"\\x1f"``);
* at most :data:`MAX_WORDS` words.

The empty string is a valid topic (one empty word) and a valid pattern. In a
pattern, ``"*"`` (exactly one non-empty word) and ``"#"`` (zero or more words)
are wildcards only as whole words; ``"a*"`` is an ordinary word, as in qlobber.
In a topic, ``"*"`` and ``"#"`` are ordinary words.
"""

from __future__ import annotations

import re
from typing import Final

from .._errors import InvalidPattern, InvalidTopic, UsageError

__all__ = [
    "MAX_TOPIC_BYTES",
    "MAX_WORDS",
    "SEPARATOR",
    "WILDCARD_ONE",
    "WILDCARD_SOME",
    "split_words",
    "validate_pattern",
    "validate_topic",
]

MAX_TOPIC_BYTES: Final = 1024
"""Longest topic or pattern, in bytes of its UTF-8 encoding."""

MAX_WORDS: Final = 100
"""Most words in a topic or pattern.

qlobber 8 (the matcher inside qlobber-fsq 14) throws "too many words" on a topic of
more than 100 words, and a qlobber-fsq process meeting such a file dies of an
uncaught exception; 100 keeps every message fsbus publishes readable by Node peers.
"""

SEPARATOR: Final = "."
"""Separates the words of a topic or pattern."""

WILDCARD_ONE: Final = "*"
"""Pattern word matching exactly one non-empty word."""

WILDCARD_SOME: Final = "#"
"""Pattern word matching zero or more words."""

_SHOW_MAX: Final = 80
_CONTROL: Final = re.compile(r"[\x00-\x1f]")


def split_words(s: str) -> tuple[str, ...]:
    """Split a topic or pattern into its words (``""`` is one empty word)."""
    return tuple(s.split(SEPARATOR))


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic, else raise :class:`InvalidTopic`."""
    return _validate(topic, "topic", InvalidTopic)


def validate_pattern(pattern: object) -> str:
    """Return ``pattern`` if it is a valid pattern, else raise :class:`InvalidPattern`."""
    return _validate(pattern, "pattern", InvalidPattern)


def _validate(value: object, kind: str, error: type[UsageError]) -> str:
    if not isinstance(value, str):
        raise error(
            f"invalid {kind} {_show(value)}: a {kind} must be a str, "
            f"not {type(value).__name__}; pass text such as 'orders.created'"
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise error(
            f"invalid {kind} {_show(value)}: it cannot be encoded as UTF-8 "
            f"(lone surrogate {value[exc.start]!r} at index {exc.start}); "
            f"decode the source bytes with errors='strict' or replace the character"
        ) from None
    if size > MAX_TOPIC_BYTES:
        raise error(
            f"invalid {kind} {_show(value)}: it is {size} bytes in UTF-8, "
            f"more than the limit of {MAX_TOPIC_BYTES}; use a shorter {kind}"
        )
    bad = _CONTROL.search(value)
    if bad is not None:
        raise error(
            f"invalid {kind} {_show(value)}: control character {bad.group()!r} "
            f"at index {bad.start()} is not allowed; remove it"
        )
    words = value.count(SEPARATOR) + 1
    if words > MAX_WORDS:
        raise error(
            f"invalid {kind} {_show(value)}: it has {words} words, more than the limit of "
            f"{MAX_WORDS}; use fewer '{SEPARATOR}'-separated words"
        )
    return value


def _show(value: object) -> str:
    """``repr(value)``, cut to about :data:`_SHOW_MAX` characters for messages."""
    text = repr(value)
    if len(text) > _SHOW_MAX:
        return f"{text[: _SHOW_MAX - 3]}..."
    return text
