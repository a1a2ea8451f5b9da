"""The AMQP records of a bus directory (fsbus.amqp._state), without a gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fsbus.amqp._state import AmqpState


def _exchange(name: str, **flags: Any) -> dict[str, Any]:
    return {"name": name, "type": "topic", "arguments": {}, **flags}


def test_bound_auto_delete_exchanges_are_read_again_only_once_their_record_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every gateway looks for auto-delete exchanges left unbound every few seconds: a
    record unchanged since the last look is not read again, a changed, new or removed
    one is seen at once."""
    state = AmqpState(str(tmp_path))
    try:
        state.write("exchanges", "a", _exchange("a", auto_delete=True, bound=True))
        state.write("exchanges", "b", _exchange("b", auto_delete=True))
        state.write("exchanges", "c", _exchange("c", bound=True))
        assert state.bound_auto_delete() == ["a"]

        reads: list[str] = []

        def read(path: str) -> dict[str, Any] | None:
            reads.append(Path(path).name)
            return AmqpState._read_file(path)

        monkeypatch.setattr(state, "_read_file", read)
        assert state.bound_auto_delete() == ["a"]
        assert state.bound_auto_delete(["a", "b"]) == ["a"]
        assert reads == []

        state.write("exchanges", "b", _exchange("b", auto_delete=True, bound=True))
        assert sorted(state.bound_auto_delete()) == ["a", "b"]
        assert reads == ["b.json"]
        state.write("exchanges", "d", _exchange("d", auto_delete=True, bound=True))
        state.remove("exchanges", "a")
        assert sorted(state.bound_auto_delete()) == ["b", "d"]
        assert reads == ["b.json", "d.json"]
    finally:
        state.close()


def test_headers_bindings_read_records_with_and_without_the_queues_uid(tmp_path: Path) -> None:
    """A binding records its queue's uid; one written before uids were reads as "", and
    malformed entries are left out rather than failing every publish to the exchange."""
    state = AmqpState(str(tmp_path))
    try:
        state.set_headers_bindings("h", [("q1", {"x-match": "all", "k": "v"}, "u1")])
        assert state.headers_bindings("h") == [("q1", {"x-match": "all", "k": "v"}, "u1")]
        (tmp_path / "fsbus" / "amqp" / "headers" / "h.json").write_text(
            '{"bindings": [["q0", {"k": 1}], "junk", ["q2"], ["q3", {}, "u3"]]}'
        )
        assert state.headers_bindings("h") == [("q0", {"k": 1}, ""), ("q3", {}, "u3")]
        state.drop_headers_bindings_of("q0")
        assert state.headers_bindings("h") == [("q3", {}, "u3")]
    finally:
        state.close()


def test_headers_bindings_are_read_again_only_once_their_record_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch published to a headers exchange asks for its bindings: an unchanged
    record is not read again, a changed or removed one is seen at once, and what a
    caller does with the list it got does not change what the next one gets."""
    state = AmqpState(str(tmp_path))
    try:
        state.set_headers_bindings("h", [("q1", {"k": "v"}, "u1")])
        assert state.headers_bindings("h") == [("q1", {"k": "v"}, "u1")]

        reads: list[str] = []

        def read(path: str) -> dict[str, Any] | None:
            reads.append(Path(path).name)
            return AmqpState._read_file(path)

        monkeypatch.setattr(state, "_read_file", read)
        got = state.headers_bindings("h")
        got.append(("q9", {}, "u9"))
        assert state.headers_bindings("h") == [("q1", {"k": "v"}, "u1")]
        assert reads == []

        state.set_headers_bindings("h", [("q1", {"k": "v"}, "u1"), ("q2", {}, "u2")])
        assert state.headers_bindings("h") == [("q1", {"k": "v"}, "u1"), ("q2", {}, "u2")]
        assert reads == ["h.json"]
        state.remove("headers", "h")
        assert state.headers_bindings("h") == []
        assert reads == ["h.json"]
    finally:
        state.close()
