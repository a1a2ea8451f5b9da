"""AMQP queue names as fsbus queue names (pure): valid, reversible, and the same as the
kombu transport's, so both faces of the bus name one queue alike."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsbus._queues.definition import validate_queue_name
from fsbus.amqp._routing import amqp_queue_name, bus_queue_name
from fsbus.kombu import queue_name as kombu_queue_name

NAMES = [
    "hello",
    "task_queue",
    "amq.gen-AbC_d-9",
    "celery@host-1.celery.pidbox",
    "a:b",
    ":leading",
    ".hidden",
    "-dash",
    "a..b",
    "a/b c",
    "snow\u2603man",
    "x" * 200,
    "x" * 201,
    "\u00e9" * 100,
]


@pytest.mark.parametrize("name", NAMES)
def test_examples_are_valid_and_match_kombu(name: str) -> None:
    bus = bus_queue_name(name)
    assert validate_queue_name(bus) == bus
    assert bus == kombu_queue_name(name)


def test_kept_and_escaped() -> None:
    assert bus_queue_name("hello") == "hello"
    assert bus_queue_name("w@host.celery.pidbox") == "w:40host.celery.pidbox"
    assert bus_queue_name(":x") == "_:3ax"
    assert amqp_queue_name("w:40host.celery.pidbox") == "w@host.celery.pidbox"
    assert amqp_queue_name("_:3ax") == ":x"


@given(st.text(max_size=80))
def test_any_name_is_valid_reversible_and_kombus(name: str) -> None:
    bus = bus_queue_name(name or "q")
    assert validate_queue_name(bus) == bus
    assert bus == kombu_queue_name(name or "q")
    back = amqp_queue_name(bus)
    if "::" in bus:  # cut short, with a hash: only the gateway's records name it
        assert back is None
        return
    assert back is not None
    assert bus_queue_name(back) == bus
    if not (name.startswith("_") and bus_queue_name(name[1:] or "q") == bus):
        assert back == (name or "q")


def test_the_one_collision() -> None:
    """kombu's scheme gives "_@x" and "@x" one name (a "_" starts both), so those two
    AMQP names share one queue."""
    assert bus_queue_name("_@x") == bus_queue_name("@x") == "_:40x"
    assert amqp_queue_name("_:40x") == "@x"


def test_long_names_are_cut_with_a_hash() -> None:
    a, b = bus_queue_name("@" * 100 + "a"), bus_queue_name("@" * 100 + "b")
    assert a != b
    assert len(a) <= 200
    assert amqp_queue_name(a) is None
    assert amqp_queue_name("bad:zz") is None
