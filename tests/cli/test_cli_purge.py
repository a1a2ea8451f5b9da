"""``fsbus purge``: remove the messages matching a pattern, never one a consumer holds."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cli_helpers import TIMEOUT, Result, cli_env, ok

Cli = Callable[..., Result]


def publish_sample(cli: Cli) -> None:
    ok(cli("publish", "jobs.resize", "a", "--single"))
    ok(cli("publish", "jobs.resize", "b", "--single"))
    ok(cli("publish", "jobs.resize", "event"))
    ok(cli("publish", "mail.send", "c", "--single"))


def listed(cli: Cli) -> list[tuple[str, str]]:
    return sorted((r["topic"], r["kind"]) for r in ok(cli("ls", "--json")).json_lines())


def test_purge_removes_work_queue_messages_by_default(cli: Cli) -> None:
    publish_sample(cli)
    res = ok(cli("purge", "jobs.#"))
    assert res.stdout == "purged 2 work-queue and 0 multi message(s) matching 'jobs.#'\n"
    assert listed(cli) == [("jobs.resize", "multi"), ("mail.send", "single")]


def test_purge_kind_all_as_json(cli: Cli) -> None:
    publish_sample(cli)
    [report] = ok(cli("purge", "#", "--kind", "all", "--json")).json_lines()
    assert report == {"pattern": "#", "kind": "all", "single": 3, "multi": 1, "locked": 0}
    assert listed(cli) == []
    [again] = ok(cli("purge", "#", "--json")).json_lines()
    assert again == {"pattern": "#", "kind": "single", "single": 0, "multi": 0, "locked": 0}


WORKER = """
import sys
from fsbus import BlockingBus, BusConfig

# One handler at a time: the worker claims (locks) a single message, not the whole queue.
config = BusConfig(handler_concurrency=1)
with BlockingBus(sys.argv[1], config=config) as bus, bus.messages("jobs.*", kind="single") as it:
    msg = it.get(timeout=60)
    print(msg.name, flush=True)
    sys.stdin.readline()  # hold the message (and its lock) until the test is done
"""


def test_a_message_a_consumer_holds_is_left_and_counted(cli: Cli, root: Path) -> None:
    publish_sample(cli)
    with subprocess.Popen(
        [sys.executable, "-c", WORKER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(None),
    ) as worker:
        try:
            assert worker.stdout is not None
            held = worker.stdout.readline().strip()
            assert held, "the worker got no message"
            res = ok(cli("purge", "jobs.#"))
            assert res.stdout.rstrip().endswith("; 1 held by a consumer, left alone")
            assert res.stdout.startswith("purged 1 work-queue and 0 multi message(s)")
        finally:
            worker.kill()
            worker.wait(TIMEOUT)
    # The killed worker's lock is gone; its message is still there for someone else.
    rows = ok(cli("ls", "jobs.#", "--json")).json_lines()
    assert [(r["name"], r["kind"], r["locked"]) for r in rows if r["kind"] == "single"] == [
        (held, "single", False)
    ]


def test_bad_pattern_is_one_line_exit_2_and_removes_nothing(cli: Cli) -> None:
    publish_sample(cli)
    res = cli("purge", "jobs.\x01")
    assert res.code == 2
    line = res.error_line()
    assert "invalid pattern" in line
    assert "control character" in line
    assert len(listed(cli)) == 4


def test_bad_kind_exits_2_and_names_the_choices(cli: Cli) -> None:
    res = cli("purge", "#", "--kind", "any")
    assert res.code == 2
    assert "invalid choice: 'any'" in res.stderr
    assert "single" in res.stderr
