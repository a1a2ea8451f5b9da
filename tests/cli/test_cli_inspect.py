"""ls, stats, gc, doctor, top, completion and --version through the CLI."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import Result, ok

from fsbus import Stream

Cli = Callable[..., Result]


def publish_sample(cli: Cli) -> None:
    ok(cli("publish", "orders.eu.created", "a"))
    ok(cli("publish", "orders.us.paid", "bb", "--header", "h=1"))
    ok(cli("publish", "jobs.resize", "ccc", "--single", "--priority", "9"))


def test_ls_shows_without_consuming(cli: Cli) -> None:
    publish_sample(cli)
    table = ok(cli("ls")).stdout.splitlines()
    assert table[0].split() == ["TOPIC", "KIND", "SIZE", "EXPIRES", "PRIO", "LOCKED"]
    assert sorted(line.split()[0] for line in table[1:]) == [
        "jobs.resize",
        "orders.eu.created",
        "orders.us.paid",
    ]
    first = ok(cli("ls", "--json")).json_lines()
    again = ok(cli("ls", "--json")).json_lines()
    assert [r["name"] for r in first] == [r["name"] for r in again]  # nothing consumed
    by_topic = {r["topic"]: r for r in first}
    assert by_topic["jobs.resize"]["kind"] == "single"
    assert by_topic["jobs.resize"]["priority"] == 9
    assert by_topic["jobs.resize"]["locked"] is False
    assert by_topic["orders.us.paid"]["headers"] == {"h": "1"}
    assert by_topic["orders.us.paid"]["size"] == 2
    assert 0 < by_topic["orders.eu.created"]["expires_in"] <= 60
    # the work-queue message is still there for a consumer
    [msg] = ok(cli("subscribe", "jobs.*", "--single", "--count", "1", "-q")).json_lines()
    assert msg["payload"] == "ccc"


def test_ls_pattern_and_limit(cli: Cli) -> None:
    publish_sample(cli)
    rows = ok(cli("ls", "orders.#", "--json")).json_lines()
    assert sorted(r["topic"] for r in rows) == ["orders.eu.created", "orders.us.paid"]
    assert len(ok(cli("ls", "--json", "--limit", "1")).json_lines()) == 1
    assert ok(cli("ls", "nothing.here")).stdout == ""


def test_stats_counts_messages_topics_and_streams(cli: Cli, root: Path) -> None:
    publish_sample(cli)
    with Stream.open(root, "audit") as stream:
        stream.append_batch([b"one", b"two", b"three"])
    [stats] = ok(cli("stats", "--json")).json_lines()
    assert stats["messages"] == 3
    assert stats["multi"] == 2
    assert stats["single"] == 1
    assert stats["bytes"] == 6
    assert stats["topics"] == 3
    assert stats["buckets"] == 256
    assert 1 <= stats["buckets_in_use"] <= 3
    [audit] = stats["streams"]
    assert audit["name"] == "audit"
    assert audit["records"] == 3
    text = ok(cli("stats")).stdout
    assert "messages  3 (multi 2, single 1; 0 locked)" in text
    assert "audit" in text


def test_gc_removes_expired_messages(cli: Cli) -> None:
    [info] = ok(cli("publish", "short.lived", "x", "--ttl", "0.2", "--json")).json_lines()
    ok(cli("publish", "long.lived", "y"))
    while time.time() <= info["expires"] + 0.05:  # wait for the clock to pass the expiry
        time.sleep(0.05)
    [res] = ok(cli("gc", "--json")).json_lines()
    assert res["removed"] >= 1
    assert [r["topic"] for r in ok(cli("ls", "--json")).json_lines()] == ["long.lived"]
    assert ok(cli("gc")).stdout.startswith("removed 0 file(s)")


def test_doctor_reports_every_check(cli: Cli, root: Path) -> None:
    root.mkdir()
    [report] = ok(cli("doctor", "--json")).json_lines()
    names = [c["name"] for c in report["checks"]]
    for name in ("root", "filesystem", "writable", "flock", "inotify", "clock", "space"):
        assert name in names
    assert report["status"] in {"ok", "warn"}
    flock = next(c for c in report["checks"] if c["name"] == "flock")
    assert flock["status"] == "ok"
    assert [p.name for p in root.iterdir()] == []  # probes cleaned up, nothing created
    text = ok(cli("doctor")).stdout
    assert "flock" in text
    assert text.rstrip().splitlines()[-1].startswith(str(root))


def test_doctor_fails_on_a_missing_directory(cli: Cli, root: Path) -> None:
    res = cli("doctor", "--json")
    assert res.code == 1
    [report] = res.json_lines()
    assert report["status"] == "fail"
    assert report["checks"][0]["name"] == "root"
    assert "mkdir" in report["checks"][0]["fix"]
    assert not root.exists()


def test_top_once_shows_backlog_per_topic(cli: Cli, root: Path) -> None:
    publish_sample(cli)
    with Stream.open(root, "audit") as stream:
        stream.append(b"x")
    res = ok(cli("top", "--once", "--interval", "0.1"))
    assert "\x1b[" not in res.stdout  # no ANSI when stdout is not a terminal
    lines = res.stdout.splitlines()
    assert lines[0].startswith("fsbus top")
    assert any(line.split()[:3] == ["jobs.resize", "0", "1"] for line in lines)
    assert any(line.startswith("audit") for line in lines)
    [frame] = ok(cli("top", "--once", "--interval", "0.1", "--json")).json_lines()
    assert frame["messages"] == 3
    topics = {t["topic"]: t for t in frame["topics"]}
    assert topics["orders.us.paid"]["multi"] == 1
    assert topics["jobs.resize"]["single"] == 1
    assert frame["streams"][0]["name"] == "audit"


def test_version(cli: Cli) -> None:
    import sys

    import fsbus

    assert ok(cli("--version")).stdout.strip() == f"fsbus {fsbus.__version__}"
    script = Path(sys.executable).parent / "fsbus"  # the installed console script
    if not script.exists():
        pytest.skip("fsbus is not installed as a console script in this environment")
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"fsbus {fsbus.__version__}"


def test_json_everywhere(cli: Cli, root: Path, tmp_path: Path) -> None:
    """Every command that prints gives parseable JSON lines with --json."""
    lines = tmp_path / "l.txt"
    lines.write_text("1\n2\n")
    commands = [
        ["publish", "j.a", "x", "--json"],
        ["publish", "j.b", "--lines", str(lines), "--json"],
        ["subscribe", "j.#", "--existing", "--count", "1", "-q", "--json"],
        ["ls", "--json"],
        ["stats", "--json"],
        ["gc", "--json"],
        ["purge", "#", "--json"],
        ["doctor", "--json"],
        ["top", "--once", "--interval", "0.05", "--json"],
        ["--json", "ls"],  # before the command works too
    ]
    for args in commands:
        res = ok(cli(*args))
        objects = res.json_lines()
        assert objects, args
        assert all(isinstance(o, dict) for o in objects), args


def test_bash_completion_completes_commands_and_options(cli: Cli) -> None:
    script = ok(cli("completion", "bash")).stdout
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")

    def complete(*words: str) -> list[str]:
        quoted = " ".join(f"'{w}'" for w in words)
        probe = (
            f"{script}\nCOMP_WORDS=(fsbus {quoted}); COMP_CWORD={len(words)}; "
            '_fsbus; printf "%s\\n" "${COMPREPLY[@]}"'
        )
        out = subprocess.run(
            [bash, "--norc", "--noprofile", "-c", probe],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return [w for w in out.stdout.splitlines() if w]

    assert complete("pub") == ["publish"]
    assert set(complete("")) >= {
        "publish",
        "subscribe",
        "ls",
        "doctor",
        "purge",
        "top",
        "completion",
    }
    assert complete("purge", "#", "--kind", "m") == ["multi"]
    assert "--single" in complete("publish", "t", "--s")
    assert complete("subscribe", "--ex") == ["--existing"]
    assert complete("completion", "z") == ["zsh"]
    assert "--once" in complete("--root", "/tmp", "top", "--")


def test_zsh_completion_script_loads(cli: Cli) -> None:
    script = ok(cli("completion", "zsh")).stdout
    assert script.startswith("#compdef fsbus")
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed")
    probe = f"autoload -Uz compinit && compinit -u -D\n{script}\nprint -r -- $_comps[fsbus]"
    out = subprocess.run(
        [zsh, "-f", "-c", probe], capture_output=True, text=True, check=False, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "_fsbus"


def test_help_of_every_command(cli: Cli) -> None:
    commands = ("publish", "subscribe", "ls", "stats", "gc", "purge", "doctor", "top", "completion")
    for command in commands:
        res = ok(cli(command, "--help"))
        assert "usage: fsbus" in res.stdout
    sub_help = " ".join(ok(cli("subscribe", "--help")).stdout.split())
    assert "0 when --count messages arrived or --timeout ran out" in sub_help
    assert "130 on Ctrl-C" in sub_help
