"""Durable queues through the CLI: ``fsbus queue ...`` and ``fsbus subscribe --queue``.

Every message is counted: what a queue held, what each consumer printed, what is left.
Waits are on conditions (a line printed, a notice on stderr), never on a fixed sleep.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import TIMEOUT, Result, Running, ok
from test_cli_imports import HEAVY, PRIVATE, _loaded

Cli = Callable[..., Result]
Spawn = Callable[..., Running]


def queues(cli: Cli) -> dict[str, dict[str, Any]]:
    """``queue ls --json`` by queue name."""
    return {q["name"]: q for q in ok(cli("queue", "ls", "--json")).json_lines()}


def publish_lines(cli: Cli, tmp_path: Path, topic: str, payloads: list[str]) -> None:
    src = tmp_path / f"{topic}-{len(payloads)}.txt"
    src.write_text("".join(f"{p}\n" for p in payloads))
    [summary] = ok(cli("publish", topic, "--lines", str(src), "--json")).json_lines()
    assert summary["published"] == len(payloads)


def test_declare_bind_unbind_ls_purge_delete_round_trip(cli: Cli) -> None:
    [info] = ok(cli("queue", "declare", "orders", "orders.#", "--json")).json_lines()
    assert info["name"] == "orders"
    assert info["bindings"] == ["orders.#"]
    assert (info["depth"], info["consumers"]) == (0, 0)
    assert info["options"]["overflow"] == "drop-head"
    assert info["options"]["max_length"] is None

    line = ok(cli("queue", "bind", "orders", "refunds.*")).stdout
    assert line.startswith("bound queue 'orders': bindings orders.# refunds.*")
    ok(cli("queue", "bind", "orders", "refunds.*"))  # again: nothing changes
    assert queues(cli)["orders"]["bindings"] == ["orders.#", "refunds.*"]
    line = ok(cli("queue", "unbind", "orders", "orders.#")).stdout
    assert line.startswith("unbound queue 'orders': bindings refunds.*")
    ok(cli("queue", "unbind", "orders", "orders.#"))  # again: nothing changes
    assert queues(cli)["orders"]["bindings"] == ["refunds.*"]

    ok(cli("publish", "refunds.eu", "r1"))
    ok(cli("publish", "refunds.us", "r2"))
    ok(cli("publish", "orders.eu", "not bound any more"))
    ok(cli("publish", "refunds.eu.late", "too deep for refunds.*"))
    table = ok(cli("queue", "ls")).stdout.splitlines()
    assert table[0].split() == ["NAME", "DEPTH", "CONSUMERS", "BINDINGS"]
    assert table[1].split() == ["orders", "2", "0", "refunds.*"]
    assert len(table) == 2

    assert ok(cli("queue", "purge", "orders")).stdout.strip() == (
        "purged 2 message(s) from queue 'orders'"
    )
    assert queues(cli)["orders"]["depth"] == 0
    [purged] = ok(cli("queue", "purge", "orders", "--json")).json_lines()
    assert purged == {"queue": "orders", "purged": 0}

    ok(cli("publish", "refunds.x", "r3"))
    assert ok(cli("queue", "delete", "orders")).stdout.strip() == (
        "deleted queue 'orders' (it held 1 message(s))"
    )
    assert ok(cli("queue", "ls")).stdout == ""
    assert ok(cli("queue", "ls", "--json")).stdout == ""
    # the bus's own messages were never touched: 5 published, 5 there
    assert len(ok(cli("ls", "--json")).json_lines()) == 5


def test_declare_is_idempotent_and_a_mismatch_says_what_differs(cli: Cli) -> None:
    ok(cli("queue", "declare", "jobs", "a.*", "--max-length", "10", "--overflow", "reject-publish"))
    # same options, more patterns, interleaved with the options: bindings are added
    [info] = ok(
        cli(
            "queue",
            "declare",
            "jobs",
            "--max-length",
            "10",
            "a.*",
            "--overflow",
            "reject-publish",
            "b.#",
            "--json",
        )
    ).json_lines()
    assert info["bindings"] == ["a.*", "b.#"]
    assert info["options"]["max_length"] == 10

    res = cli("queue", "declare", "jobs", "a.*", "--max-length", "20", "--auto-delete")
    assert res.code == 1
    line = res.error_line()
    assert "queue 'jobs' exists with other options" in line
    assert "--max-length asked 20, the queue has 10" in line
    assert "--overflow asked drop-head, the queue has reject-publish" in line
    assert "--auto-delete asked on, the queue has off" in line
    assert "`fsbus queue declare jobs --max-length 10 --overflow reject-publish`" in line
    assert "fsbus queue delete jobs" in line
    assert res.stdout == ""
    after = queues(cli)["jobs"]
    assert after["options"] == info["options"]
    assert after["bindings"] == ["a.*", "b.#"]


def test_declare_options_round_trip(cli: Cli) -> None:
    args = ["--message-ttl", "30", "--max-length", "5", "--dead-letter", "dead.jobs"]
    args += ["--max-deliveries", "3", "--expires", "3600", "--auto-delete"]
    args += ["--dead-letter-expired", "--dead-letter-dropped"]
    [info] = ok(cli("queue", "declare", "opts", "x.#", *args, "--json")).json_lines()
    assert info["options"] == {
        "message_ttl": 30.0,
        "max_length": 5,
        "overflow": "drop-head",
        "dead_letter": "dead.jobs",
        "max_deliveries": 3,
        "auto_delete": True,
        "expires": 3600.0,
        "dead_letter_expired": True,
        "dead_letter_dropped": True,
    }
    ok(cli("queue", "declare", "opts", *args))  # the same again: fine
    assert queues(cli)["opts"]["options"] == info["options"]


def test_messages_published_with_no_consumer_are_consumed_once(cli: Cli, tmp_path: Path) -> None:
    ok(cli("queue", "declare", "work", "jobs.#"))
    total = 50
    expected = [f"job-{i}" for i in range(total - 2)]
    publish_lines(cli, tmp_path, "jobs.resize", expected)  # routed by publish_many
    ok(cli("publish", "jobs.crop", "job-48"))
    ok(cli("publish", "jobs.crop.big", "job-49", "--single"))  # a single one is copied too
    ok(cli("publish", "other.topic", "not for the queue"))
    expected += ["job-48", "job-49"]
    assert queues(cli)["work"]["depth"] == total

    res = ok(cli("subscribe", "--queue", "work", "--count", str(total), "-q"))
    got = res.json_lines()
    assert len(got) == total
    assert sorted(m["payload"] for m in got) == sorted(expected)  # each exactly once
    assert len({m["name"] for m in got}) == total
    assert all(m["queue"] == "work" for m in got)
    assert all(m["kind"] == "single" for m in got)
    assert {m["topic"] for m in got} == {"jobs.resize", "jobs.crop", "jobs.crop.big"}
    info = queues(cli)["work"]
    assert (info["depth"], info["consumers"]) == (0, 0)

    # what was consumed does not come back: the next consumer gets only the new message
    ok(cli("publish", "jobs.resize", "job-50"))
    [msg] = ok(cli("subscribe", "--queue", "work", "--count", "1", "-q")).json_lines()
    assert msg["payload"] == "job-50"
    assert queues(cli)["work"]["depth"] == 0
    # the bus's copies are there for its own subscribers: 48 + 1 + 1 + 1 + 1 multi/single
    assert len(ok(cli("ls", "--json")).json_lines()) == total + 2


def test_plain_subscribe_has_no_queue_field(cli: Cli) -> None:
    ok(cli("queue", "declare", "q", "t.*"))
    ok(cli("publish", "t.a", "x"))
    [plain] = ok(cli("subscribe", "t.*", "--existing", "--count", "1", "-q")).json_lines()
    assert "queue" not in plain
    [queued] = ok(cli("subscribe", "--queue", "q", "--count", "1", "-q")).json_lines()
    assert queued["queue"] == "q"
    assert set(plain) | {"queue"} == set(queued)


def test_subscribe_with_a_pattern_binds_it_first(cli: Cli, spawn: Spawn) -> None:
    ok(cli("queue", "declare", "live"))
    assert queues(cli)["live"]["bindings"] == []
    sub = spawn("subscribe", "--queue", "live", "x.*", "--count", "2")
    sub.wait_stderr("subscribed to queue 'live' (bound to 'x.*')")  # bound and attached
    assert queues(cli)["live"]["consumers"] == 1
    ok(cli("publish", "x.1", "one"))
    ok(cli("publish", "y.1", "not bound"))
    ok(cli("publish", "x.2", "two"))
    got = [json.loads(line) for line in sub.lines(2)]
    assert sorted(m["payload"] for m in got) == ["one", "two"]
    code, rest = sub.finish()
    assert code == 0, sub.err_lines
    assert rest == []
    info = queues(cli)["live"]
    assert (info["bindings"], info["depth"], info["consumers"]) == (["x.*"], 0, 0)

    # the same again is safe: one binding still, and the waiting message is delivered
    ok(cli("publish", "x.3", "three"))
    [msg] = ok(cli("subscribe", "--queue", "live", "x.*", "--count", "1", "-q")).json_lines()
    assert msg["payload"] == "three"
    assert queues(cli)["live"]["bindings"] == ["x.*"]


def test_subscribe_count_exits_1_when_its_queue_is_deleted(cli: Cli, spawn: Spawn) -> None:
    """A queue deleted before --count messages arrived is not a success: exit status 1,
    what arrived printed, and stderr says the queue was deleted."""
    ok(cli("queue", "declare", "doomed", "d.#"))
    sub = spawn("subscribe", "--queue", "doomed", "--count", "5")
    sub.wait_stderr("subscribed to queue 'doomed'")
    ok(cli("publish", "d.1", "one"))
    [line] = sub.lines(1)
    assert json.loads(line)["payload"] == "one"
    ok(cli("queue", "delete", "doomed"))
    code, rest = sub.finish()
    assert code == 1, sub.err_lines
    assert rest == []
    [error] = [e for e in sub.err_lines if e.startswith("fsbus: error:")]
    assert "queue 'doomed'" in error
    assert "was deleted while this command consumed it, after 1 of 5 message(s)" in error
    assert "fsbus queue declare doomed" in error


class _Tagged(queue.Queue[str | None]):
    """A process's stdout lines, forwarded to a shared queue as (tag, line)."""

    def __init__(self, tag: int, sink: queue.Queue[tuple[int, str | None]]) -> None:
        super().__init__()
        self.tag = tag
        self.sink = sink

    def put(self, item: str | None, block: bool = True, timeout: float | None = None) -> None:
        self.sink.put((self.tag, item))


@pytest.mark.slow
def test_two_consumers_share_a_queue_disjointly(
    cli: Cli, spawn: Spawn, tmp_path: Path, root: Path
) -> None:
    ok(cli("queue", "declare", "shared", "work.#"))
    before = [f"early-{i}" for i in range(20)]
    publish_lines(cli, tmp_path, "work.items", before)  # waiting before any consumer runs
    sink: queue.Queue[tuple[int, str | None]] = queue.Queue()
    workers = [spawn("subscribe", "--queue", "shared", out=_Tagged(i, sink)) for i in range(2)]
    for w in workers:
        w.wait_stderr("subscribed to queue 'shared'")  # attached: Ctrl-C is a clean stop now
    assert queues(cli)["shared"]["consumers"] == 2
    after = [f"late-{i}" for i in range(60)]
    publish_lines(cli, tmp_path, "work.items", after)  # while both consume
    everything = before + after

    seen: list[list[dict[str, Any]]] = [[], []]
    deadline = time.monotonic() + TIMEOUT
    while sum(map(len, seen)) < len(everything):
        left = deadline - time.monotonic()
        assert left > 0, f"only {sum(map(len, seen))} of {len(everything)} printed"
        tag, line = sink.get(timeout=left)
        assert line is not None, f"worker {tag} exited after {len(seen[tag])} messages"
        seen[tag].append(json.loads(line))
    for w in workers:
        w.interrupt()
    for w in workers:
        code, _ = w.finish()
        assert code == 130, w.err_lines
        assert "Traceback" not in "\n".join(w.err_lines)
    while not sink.empty():  # anything printed after the count was reached
        tag, line = sink.get_nowait()
        if line is not None:
            seen[tag].append(json.loads(line))

    first = [m["payload"] for m in seen[0]]
    second = [m["payload"] for m in seen[1]]
    assert len(first) + len(second) == len(everything)  # none printed twice
    assert not set(first) & set(second)  # disjoint
    assert sorted(first + second) == sorted(everything)  # none lost
    info = queues(cli)["shared"]
    assert (info["depth"], info["consumers"]) == (0, 0)  # all acked, both detached


@pytest.mark.parametrize(
    "args",
    [
        ["subscribe", "--queue", "nope", "--count", "1"],
        ["subscribe", "--queue", "nope", "a.*", "--count", "1"],
        ["queue", "bind", "nope", "a.*"],
        ["queue", "unbind", "nope", "a.*"],
        ["queue", "purge", "nope"],
        ["queue", "delete", "nope"],
    ],
    ids=lambda a: "-".join(a[:2]) + ("-pattern" if "a.*" in a else ""),
)
def test_missing_queue_names_it_and_says_how_to_declare(
    cli: Cli, root: Path, args: list[str]
) -> None:
    res = cli(*args)
    assert res.code == 1, res.stderr
    assert res.error_line() == (
        f"fsbus: error: no queue named 'nope' on {root}; declare it first: "
        "fsbus queue declare nope PATTERN..."
    )
    assert res.stdout == ""
    assert ok(cli("queue", "ls")).stdout == ""  # nothing was created


BAD_NAMES = ["bad/name", "a..b", ".hidden", ":x", "-x", "sp ace", "x" * 201]


@pytest.mark.parametrize(
    "command",
    [
        ["queue", "declare", "{}", "a.*"],
        ["queue", "bind", "{}", "a.*"],
        ["queue", "unbind", "{}", "a.*"],
        ["queue", "purge", "{}"],
        ["queue", "delete", "{}"],
        ["subscribe", "--queue", "{}", "--count", "1"],
        ["subscribe", "--queue", "{}", "a.*", "--count", "1"],
    ],
    ids=lambda a: "-".join(a[:2]) + ("-pattern" if "a.*" in a[2:] else ""),
)
def test_invalid_queue_name_is_a_usage_error(cli: Cli, command: list[str]) -> None:
    res = cli(*["bad/name" if a == "{}" else a for a in command])
    assert res.code == 2, res.stderr
    assert res.error_line() == (
        "fsbus: error: invalid queue name 'bad/name': use letters, digits and _ . : - "
        "(not starting with . : or -, no '..'); it names a folder in the bus directory"
    )
    assert res.stdout == ""


def test_every_kind_of_invalid_name_is_refused(cli: Cli) -> None:
    for name in BAD_NAMES:
        # `--` lets a name starting with '-' reach the queue rules instead of argparse
        res = cli("queue", "declare", "--", name, "a.*")
        assert res.code == 2, (name, res.stderr)
        line = res.error_line()
        assert "invalid queue name" in line or "at most 200 are allowed" in line, line
    assert ok(cli("queue", "ls")).stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["queue", "declare", "q", "a.\x02"],
        ["queue", "declare", "fresh", "ok.#", "a.\x02"],
        ["queue", "bind", "q", "a.\x02"],
        ["queue", "unbind", "q", "a.\x02"],
        ["subscribe", "--queue", "q", "a.\x02", "--count", "1"],
    ],
    ids=lambda a: "-".join(a[:3]),
)
def test_invalid_pattern_is_a_usage_error(cli: Cli, args: list[str]) -> None:
    ok(cli("queue", "declare", "q", "good.#"))
    res = cli(*args)
    assert res.code == 2, res.stderr
    assert "invalid pattern 'a.\\x02'" in res.error_line()
    assert res.stdout == ""
    assert {n: q["bindings"] for n, q in queues(cli).items()} == {"q": ["good.#"]}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["queue", "declare", "q", "--max-length", "-1"], "--max-length: must be at least 0"),
        (["queue", "declare", "q", "--max-deliveries", "x"], "expected a whole number"),
        (["queue", "declare", "q", "--message-ttl", "0"], "must be more than 0"),
        (["queue", "declare", "q", "--expires", "-5"], "must be more than 0"),
        (["queue", "declare", "q", "--overflow", "block"], "invalid choice: 'block'"),
        (["queue", "declare", "q", "--dead-letter", "a\x01b"], "invalid topic"),
        (["queue"], "SUBCOMMAND"),
        (["subscribe"], "give a PATTERN, or --queue NAME"),
        (["subscribe", "--queue", "q", "--existing"], "--existing does not apply to --queue"),
        (["subscribe", "--queue", "q", "--single"], "--single does not apply to --queue"),
    ],
)
def test_bad_options_exit_2(cli: Cli, args: list[str], needle: str) -> None:
    res = cli(*args)
    assert res.code == 2, res.stderr
    assert needle in res.stderr
    assert "Traceback" not in res.stderr
    assert ok(cli("queue", "ls")).stdout == ""


def test_delete_if_empty_and_if_unused(cli: Cli, spawn: Spawn) -> None:
    ok(cli("queue", "declare", "d", "d.*"))
    ok(cli("publish", "d.one", "x"))
    res = cli("queue", "delete", "d", "--if-empty")
    assert res.code == 1
    line = res.error_line()
    assert "queue 'd' holds 1 message(s) and --if-empty was given: not deleted" in line
    assert "fsbus queue purge d" in line

    sub = spawn("subscribe", "--queue", "d")
    sub.wait_stderr("subscribed to queue 'd'")
    [msg] = [json.loads(line) for line in sub.lines(1)]
    assert msg["payload"] == "x"
    res = cli("queue", "delete", "d", "--if-unused")
    assert res.code == 1
    assert "queue 'd' has 1 consumer(s) and --if-unused was given" in res.error_line()
    sub.interrupt()
    code, rest = sub.finish()
    assert (code, rest) == (130, [])

    [gone] = ok(cli("queue", "delete", "d", "--if-unused", "--if-empty", "--json")).json_lines()
    assert gone == {"queue": "d", "deleted": True, "messages": 0}
    assert queues(cli) == {}


def test_stats_and_top_list_queues(cli: Cli, root: Path) -> None:
    text = ok(cli("stats")).stdout
    assert text.rstrip().splitlines()[-1] == "streams   none"  # no queues: as before
    [stats] = ok(cli("stats", "--json")).json_lines()
    assert stats["queues"] == []

    ok(cli("queue", "declare", "alpha", "s.*"))
    ok(cli("queue", "declare", "beta", "s.#", "t.#"))
    ok(cli("publish", "s.a", "1"))
    ok(cli("publish", "s.a.b", "2"))
    [stats] = ok(cli("stats", "--json")).json_lines()
    assert stats["messages"] == 2  # the bus's own messages, as before
    by_name = {q["name"]: q for q in stats["queues"]}
    assert (by_name["alpha"]["depth"], by_name["alpha"]["consumers"]) == (1, 0)
    assert (by_name["beta"]["depth"], by_name["beta"]["bindings"]) == (2, ["s.#", "t.#"])
    lines = ok(cli("stats")).stdout.splitlines()
    at = lines.index("queues")
    assert lines[at + 1].split() == ["NAME", "DEPTH", "CONSUMERS", "BINDINGS"]
    assert lines[at + 2].split() == ["alpha", "1", "0", "s.*"]
    assert lines[at + 3].split() == ["beta", "2", "0", "s.#", "t.#"]

    [frame] = ok(cli("top", "--once", "--interval", "0.05", "--json")).json_lines()
    assert frame["queues"] == [
        {"name": "alpha", "depth": 1, "consumers": 0, "in_rate": 0.0, "out_rate": 0.0},
        {"name": "beta", "depth": 2, "consumers": 0, "in_rate": 0.0, "out_rate": 0.0},
    ]
    top = ok(cli("top", "--once", "--interval", "0.05")).stdout.splitlines()
    at = next(i for i, line in enumerate(top) if line.split()[:1] == ["QUEUE"])
    assert top[at].split() == ["QUEUE", "DEPTH", "CONSUMERS", "IN/s", "OUT/s"]
    assert [line.split() for line in top[at + 1 : at + 3]] == [
        ["alpha", "1", "0", "0.0", "0.0"],
        ["beta", "2", "0", "0.0", "0.0"],
    ]


def test_top_measures_each_queues_rates_in_and_out(cli: Cli, spawn: Spawn, tmp_path: Path) -> None:
    """Copies routed into a queue count as in, copies acknowledged as out, once each."""
    ok(cli("queue", "declare", "work", "w.#"))
    ok(cli("queue", "declare", "idle", "x.#"))
    top = spawn("top", "--interval", "0.3", "--json")

    def frame() -> dict[str, dict[str, Any]]:
        [line] = top.lines(1)
        data = json.loads(line)
        for q in data["queues"]:  # rate x interval: how many copies, rounding aside
            q["came"] = round(q["in_rate"] * data["interval"])
            q["went"] = round(q["out_rate"] * data["interval"])
        return {q["name"]: q for q in data["queues"]}

    first = frame()
    assert (first["work"]["came"], first["work"]["went"]) == (0, 0)
    publish_lines(cli, tmp_path, "w.job", [f"job-{i}" for i in range(10)])
    came = went = 0
    deadline = time.monotonic() + TIMEOUT
    while came < 10:
        assert time.monotonic() < deadline, f"top saw {came} of 10 copies arrive"
        rows = frame()
        came += rows["work"]["came"]
        went += rows["work"]["went"]
        assert (rows["idle"]["came"], rows["idle"]["went"]) == (0, 0)
    assert (came, went) == (10, 0)
    assert rows["work"]["depth"] == 10

    got = ok(cli("subscribe", "--queue", "work", "--count", "10", "-q", "--json")).json_lines()
    assert sorted(m["payload"] for m in got) == sorted(f"job-{i}" for i in range(10))
    while went < 10:
        assert time.monotonic() < deadline, f"top saw {went} of 10 copies leave"
        rows = frame()
        came += rows["work"]["came"]
        went += rows["work"]["went"]
        assert (rows["idle"]["came"], rows["idle"]["went"]) == (0, 0)
    assert (came, went) == (10, 10)
    assert frame()["work"]["depth"] == 0
    top.interrupt()
    code, _rest = top.finish()
    assert code == 0


def test_queue_help_is_light_and_complete(cli: Cli) -> None:
    for sub in ("declare", "bind", "unbind", "ls", "purge", "delete"):
        assert "usage: fsbus queue " + sub in ok(cli("queue", sub, "--help")).stdout
    declare = " ".join(ok(cli("queue", "declare", "--help")).stdout.split())
    for flag in (
        "--message-ttl",
        "--max-length",
        "--overflow {drop-head,reject-publish}",
        "--dead-letter",
        "--max-deliveries",
        "--auto-delete",
        "--expires",
    ):
        assert flag in declare
    assert "--queue NAME" in ok(cli("subscribe", "--help")).stdout
    for argv in (("queue", "--help"), ("queue", "declare", "--help")):
        modules = _loaded(*argv)
        heavy = [
            m for m in modules if any(m == h or m.startswith(h + ".") for h in (*HEAVY, *PRIVATE))
        ]
        assert heavy == [], f"`fsbus {' '.join(argv)}` imported {heavy}"
