"""Topic and pattern validation: each rule, and the message that explains it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fsbus import InvalidPattern, InvalidTopic, UsageError
from fsbus._core.topics import (
    MAX_TOPIC_BYTES,
    MAX_WORDS,
    split_words,
    validate_pattern,
    validate_topic,
)

VALIDATORS = [
    pytest.param(validate_topic, InvalidTopic, "topic", id="topic"),
    pytest.param(validate_pattern, InvalidPattern, "pattern", id="pattern"),
]


@pytest.mark.parametrize(
    "value",
    ["", "a", "a.b.c", "*", "#", "a.*.#", "a*", "#b", "a..b", ".", "ünïcödé.日本", "x" * 1024],
)
@pytest.mark.parametrize(("validate", "error", "kind"), VALIDATORS)
def test_valid_values_are_returned_unchanged(
    validate: Callable[[object], str], error: type[UsageError], kind: str, value: str
) -> None:
    assert validate(value) is value


@pytest.mark.parametrize(("validate", "error", "kind"), VALIDATORS)
@pytest.mark.parametrize(
    ("value", "type_name"), [(b"a.b", "bytes"), (None, "NoneType"), (42, "int"), (["a"], "list")]
)
def test_non_str_is_refused_naming_the_type(
    validate: Callable[[object], str],
    error: type[UsageError],
    kind: str,
    value: object,
    type_name: str,
) -> None:
    with pytest.raises(error, match=rf"invalid {kind} .*: a {kind} must be a str, not {type_name}"):
        validate(value)


@pytest.mark.parametrize(("validate", "error", "kind"), VALIDATORS)
def test_lone_surrogate_is_refused(
    validate: Callable[[object], str], error: type[UsageError], kind: str
) -> None:
    with pytest.raises(
        error,
        match=rf"invalid {kind} 'ab\.\\udc80': it cannot be encoded as UTF-8 "
        r"\(lone surrogate '\\udc80' at index 3\)",
    ):
        validate("ab.\udc80")


@pytest.mark.parametrize(("validate", "error", "kind"), VALIDATORS)
def test_byte_limit_counts_utf8_bytes(
    validate: Callable[[object], str], error: type[UsageError], kind: str
) -> None:
    assert MAX_TOPIC_BYTES == 1024
    validate("é" * 512)  # exactly 1024 bytes
    with pytest.raises(
        error,
        match=rf"it is 1026 bytes in UTF-8, more than the limit of 1024; use a shorter {kind}",
    ):
        validate("é" * 513)
    with pytest.raises(error, match="1025 bytes"):
        validate("x" * 1025)


@pytest.mark.parametrize(("validate", "error", "kind"), VALIDATORS)
@pytest.mark.parametrize(
    ("value", "shown", "index"),
    [
        ("a\x00b", r"'\\x00'", 1),
        ("a.b\n", r"'\\n'", 3),
        ("\tx", r"'\\t'", 0),
        ("x\x1f", r"'\\x1f'", 1),
    ],
)
def test_control_characters_are_refused(
    validate: Callable[[object], str],
    error: type[UsageError],
    kind: str,
    value: str,
    shown: str,
    index: int,
) -> None:
    with pytest.raises(
        error, match=rf"control character {shown} at index {index} is not allowed; remove it"
    ):
        validate(value)


@pytest.mark.parametrize(("validate", "error", "kind"), VALIDATORS)
def test_printable_non_c0_characters_are_allowed(
    validate: Callable[[object], str], error: type[UsageError], kind: str
) -> None:
    validate("del\x7f.nbsp\xa0.emoji\U0001f600")


@pytest.mark.parametrize(("validate", "error", "kind"), VALIDATORS)
def test_word_limit(validate: Callable[[object], str], error: type[UsageError], kind: str) -> None:
    assert MAX_WORDS == 100
    validate(".".join(["w"] * 100))
    validate("." * 99)  # 100 empty words
    with pytest.raises(
        error, match=r"it has 101 words, more than the limit of 100; use fewer '\.'-separated words"
    ):
        validate(".".join(["w"] * 101))


@pytest.mark.parametrize(("validate", "error", "kind"), VALIDATORS)
def test_long_bad_values_are_shown_truncated(
    validate: Callable[[object], str], error: type[UsageError], kind: str
) -> None:
    with pytest.raises(error) as info:
        validate("a" * 2000)
    message = str(info.value)
    shown = message.split(": ", 1)[0].removeprefix(f"invalid {kind} ")
    assert shown == "'" + "a" * 76 + "..."
    assert len(message) < 200


def test_errors_are_usage_errors_and_value_errors() -> None:
    with pytest.raises(ValueError, match="invalid topic"):
        validate_topic("\x00")
    assert issubclass(InvalidTopic, UsageError)
    assert issubclass(InvalidPattern, UsageError)
    with pytest.raises(InvalidPattern):
        validate_pattern(1)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", ("",)),
        ("a", ("a",)),
        ("a.b.c", ("a", "b", "c")),
        ("a..b", ("a", "", "b")),
        (".", ("", "")),
        ("a.*.#", ("a", "*", "#")),
    ],
)
def test_split_words(value: str, words: tuple[str, ...]) -> None:
    assert split_words(value) == words
