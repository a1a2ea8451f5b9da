"""publish and subscribe through the CLI: payload forms, headers, bulk, work queues, Ctrl-C."""

from __future__ import annotations

import base64
import json
import os
import queue
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import Result, Running, ok

from fsbus import BlockingBus

Cli = Callable[..., Result]
Spawn = Callable[..., Running]

MESSAGE_KEYS = {
    "topic",
    "kind",
    "headers",
    "expires",
    "published_at",
    "host",
    "delivery_count",
}


def test_text_payload_with_headers_round_trip(cli: Cli, root: Path) -> None:
    ok(cli("publish", "orders.eu.created", "héllo wörld", "--header", "k=v", "--header", "n=1"))
    assert (root / "messages").is_dir()
    assert (root / "staging").is_dir()
    res = ok(cli("subscribe", "orders.*.created", "--existing", "--count", "1", "-q"))
    [msg] = res.json_lines()
    assert MESSAGE_KEYS <= set(msg)
    assert msg["topic"] == "orders.eu.created"
    assert msg["payload"] == "héllo wörld"
    assert "payload_base64" not in msg
    assert msg["kind"] == "multi"
    assert msg["headers"] == {"k": "v", "n": "1"}
    assert msg["delivery_count"] == 1
    assert msg["expires"] > msg["published_at"]


def test_binary_payload_from_stdin(cli: Cli) -> None:
    blob = bytes(range(256)) * 3
    ok(cli("publish", "bin.data", "-", input=blob))
    [msg] = ok(cli("subscribe", "bin.#", "--existing", "--count", "1", "-q")).json_lines()
    assert "payload" not in msg
    assert base64.b64decode(msg["payload_base64"]) == blob


def test_payload_from_file_and_publish_json(cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "body.txt"
    src.write_bytes(b"from a file\n")
    [info] = ok(cli("publish", "files.one", "--file", str(src), "--json")).json_lines()
    assert info["topic"] == "files.one"
    assert info["kind"] == "multi"
    assert info["size"] == len(b"from a file\n")
    assert Path(info["path"]).is_file()
    [msg] = ok(cli("subscribe", "files.one", "--existing", "--count", "1", "-q")).json_lines()
    assert msg["payload"] == "from a file\n"


def test_options_after_the_topic_and_before_the_payload(cli: Cli) -> None:
    ok(cli("publish", "jobs.x", "--single", "--priority", "7", "--ttl", "120", "body"))
    [info] = ok(cli("ls", "--json")).json_lines()
    assert info["kind"] == "single"
    assert info["priority"] == 7
    assert 0 < info["expires_in"] <= 120


def test_single_is_consumed_after_printing(cli: Cli) -> None:
    ok(cli("publish", "jobs.resize", "img-1", "--single"))
    [msg] = ok(cli("subscribe", "jobs.#", "--single", "--count", "1", "-q")).json_lines()
    assert msg["kind"] == "single"
    assert msg["payload"] == "img-1"
    assert ok(cli("ls", "--json")).stdout == ""


def test_bulk_lines_then_receive_them_all(cli: Cli, tmp_path: Path) -> None:
    lines = [f"line {i}" for i in range(40)]
    src = tmp_path / "lines.txt"
    src.write_text("\n".join(lines) + "\n")
    [summary] = ok(cli("publish", "bulk.lines", "--lines", str(src), "--json")).json_lines()
    assert summary["published"] == 40
    assert summary["complete"] is True
    got = ok(cli("subscribe", "bulk.lines", "--existing", "--count", "40", "-q")).json_lines()
    assert sorted(m["payload"] for m in got) == sorted(lines)


def test_bulk_lines_from_stdin_text_summary(cli: Cli) -> None:
    res = ok(cli("publish", "bulk.stdin", "--lines", "-", input=b"a\r\nb\nc"))
    assert res.stdout.startswith("published 3 message(s)")
    assert res.stderr == ""  # no progress line when stderr is not a terminal
    got = ok(cli("subscribe", "bulk.stdin", "--existing", "--count", "3", "-q")).json_lines()
    assert sorted(m["payload"] for m in got) == ["a", "b", "c"]


def test_bulk_dir_one_message_per_file(cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}.bin").write_bytes(b"\xff" + bytes([i]))
    (src / "sub").mkdir()  # not a file: skipped
    [summary] = ok(cli("publish", "bulk.dir", "--dir", str(src), "--single", "--json")).json_lines()
    assert summary["published"] == 5
    got = ok(cli("subscribe", "bulk.dir", "--single", "--count", "5", "-q")).json_lines()
    assert sorted(base64.b64decode(m["payload_base64"]) for m in got) == [
        b"\xff" + bytes([i]) for i in range(5)
    ]


def test_timeout_exits_zero_with_what_arrived(cli: Cli) -> None:
    ok(cli("publish", "t.one", "x"))
    res = ok(cli("subscribe", "t.#", "--existing", "--timeout", "1", "-q"))
    assert [m["payload"] for m in res.json_lines()] == ["x"]


def test_live_delivery_and_ctrl_c_exits_130(cli: Cli, spawn: Spawn) -> None:
    sub = spawn("subscribe", "live.*")
    sub.wait_stderr("subscribed to 'live.*'")
    ok(cli("publish", "live.a", "one"))
    ok(cli("publish", "other.a", "not for it"))
    ok(cli("publish", "live.b", "two"))
    got = [json.loads(line) for line in sub.lines(2)]
    assert sorted(m["payload"] for m in got) == ["one", "two"]
    sub.interrupt()
    code, rest = sub.finish()
    assert code == 130
    assert rest == []
    assert "Traceback" not in "\n".join(sub.err_lines)


@pytest.mark.slow
def test_single_consumed_exactly_once_across_two_processes(
    cli: Cli, spawn: Spawn, root: Path, tmp_path: Path
) -> None:
    total = 60
    src = tmp_path / "jobs.txt"
    src.write_text("".join(f"job-{i}\n" for i in range(total)))
    ok(cli("publish", "work.items", "--lines", str(src), "--single"))
    printed: queue.Queue[str | None] = queue.Queue()  # both workers' stdout lines
    workers = [spawn("subscribe", "work.#", "--single", out=printed) for _ in range(2)]
    for w in workers:
        w.wait_stderr("subscribed to")  # started: Ctrl-C now means a clean shutdown
    seen = []
    while len(seen) < total:  # every job printed once: then stop both with Ctrl-C
        line = printed.get(timeout=60)
        assert line is not None, f"a worker exited after {len(seen)} jobs"
        seen.append(json.loads(line))
    for w in workers:
        w.interrupt()
    for w in workers:
        code, rest = w.finish()
        assert code == 130, w.err_lines
        seen += [json.loads(line) for line in rest]
    payloads = [m["payload"] for m in seen]
    assert sorted(payloads) == sorted(f"job-{i}" for i in range(total))  # none lost, none twice
    assert all(m["kind"] == "single" for m in seen)
    with BlockingBus(root) as bus:
        assert list(bus.browse()) == []  # all acked, no lock or file left behind
    assert os.listdir(root / "staging") == []


def test_plain_subscribe_leaves_work_queue_messages_alone(cli: Cli) -> None:
    ok(cli("publish", "mixed.job", "work", "--single"))
    ok(cli("publish", "mixed.event", "news"))
    res = ok(cli("subscribe", "mixed.*", "--existing", "--timeout", "1.5", "-q"))
    assert [m["payload"] for m in res.json_lines()] == ["news"]
    [job] = ok(cli("ls", "mixed.job", "--json")).json_lines()
    assert job["locked"] is False
    [msg] = ok(cli("subscribe", "mixed.job", "--single", "--count", "1", "-q")).json_lines()
    assert msg["payload"] == "work"
