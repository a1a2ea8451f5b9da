"""Errors: one clear line on stderr, the right exit status, no traceback, nothing lost."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_helpers import Result, ok, run_cli

Cli = Callable[..., Result]


@pytest.mark.parametrize(
    "args",
    [
        ["publish", "a.b", "x"],
        ["subscribe", "a.b", "--timeout", "1"],
        ["ls"],
        ["stats"],
        ["gc"],
        ["purge", "#"],
        ["doctor"],
        ["top", "--once"],
    ],
    ids=lambda a: a[0],
)
def test_missing_root_is_one_line_and_exit_2(args: list[str]) -> None:
    res = run_cli(*args, root=None)
    assert res.code == 2
    assert res.error_line() == "fsbus: error: no bus directory: pass --root DIR or set FSBUS_ROOT"
    assert res.stdout == ""


def test_root_option_wins_over_the_environment(cli: Cli, tmp_path: Path) -> None:
    other = tmp_path / "other"
    ok(cli("--root", str(other), "publish", "a.b", "x"))
    ok(cli("publish", "a.b", "x", "--root", str(other)))  # after the command too
    assert len(ok(cli("ls", "--json", "--root", str(other))).json_lines()) == 2
    assert ok(cli("ls", "--json")).stdout == ""


def test_bad_topic_names_the_rule_and_exits_2(cli: Cli, root: Path) -> None:
    res = cli("publish", "orders\x01eu", "x")
    assert res.code == 2
    line = res.error_line()
    assert "invalid topic" in line
    assert "control character" in line
    assert not list((root / "staging").iterdir())  # nothing half-written


def test_bad_pattern_exits_2(cli: Cli) -> None:
    res = cli("subscribe", "a.\x02", "--timeout", "1")
    assert res.code == 2
    assert "invalid pattern" in res.error_line()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["publish", "a", "--header", "novalue", "x"], "--header needs KEY=VALUE"),
        (["publish", "a", "--priority", "300", "x"], "priority"),
        (["publish", "a", "--file", "/no/such/file"], "is not a readable file"),
        (["publish", "a", "--lines", "/no/such/file"], "is not a readable file"),
        (["publish", "a", "--dir", "/no/such/dir"], "is not a directory"),
        (["publish", "a"], "nothing to publish"),
        (["-o", "bucket_num_chars=9", "ls"], "bucket_num_chars"),
        (["-o", "no_such_option=1", "ls"], "no_such_option"),
        (["-o", "novalue", "ls"], "KEY=VALUE"),
    ],
)
def test_usage_errors_exit_2(cli: Cli, args: list[str], needle: str) -> None:
    res = cli(*args)
    assert res.code == 2, res.stderr
    assert needle in res.error_line()


def test_argparse_errors_exit_2(cli: Cli) -> None:
    assert cli("publish", "a", "x", "--ttl", "-1").code == 2
    assert cli("no-such-command").code == 2
    assert cli().code == 2  # no command: help on stderr


def test_root_that_is_a_file(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "plain-file"
    f.write_text("not a bus")
    res = cli("publish", "a.b", "x", "--root", str(f))
    assert res.code == 1
    assert "Not a directory" in res.error_line()
    assert f.read_text() == "not a bus"


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot write: a read-only tmpfs as root, mode 0555 otherwise."""
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() != 0:
        target.chmod(0o555)
        yield target
        target.chmod(0o755)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_unwritable_root(cli: Cli, read_only_dir: Path) -> None:
    for root in (read_only_dir, read_only_dir / "bus"):
        res = cli("publish", "a.b", "x", "--root", str(root))
        assert res.code == 1
        line = res.error_line()
        assert str(read_only_dir) in line
        assert "read-only" in line or "ermission" in line
    doctor = cli("doctor", "--root", str(read_only_dir))
    assert doctor.code == 1
    assert "fail  writable" in doctor.stdout


def test_debug_shows_the_traceback(cli: Cli) -> None:
    res = cli("publish", "bad\x01topic", "x", env={"FSBUS_DEBUG": "1"})
    assert res.code != 0
    assert "Traceback" in res.stderr
    assert "InvalidTopic" in res.stderr


def test_broken_pipe_is_quiet(root: Path, cli: Cli, tmp_path: Path) -> None:
    lines = tmp_path / "lines"
    lines.write_text("".join(f"{i}\n" for i in range(400)))  # ~150 KiB of ls --json
    ok(cli("publish", "many.messages", "--lines", str(lines)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSBUS_")}
    env["FSBUS_ROOT"] = str(root)
    proc = subprocess.run(
        f"'{sys.executable}' -m fsbus ls --json | head -n 1",
        shell=True,
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert len(proc.stdout.splitlines()) == 1
    assert b"Traceback" not in proc.stderr


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with room for the bus's folders and a few hundred messages (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    target = tmp_path / "tiny"
    target.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,nr_inodes=1400", "tmpfs", str(target)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_disk_full_during_bulk_publish_says_how_far_it_got(
    cli: Cli, tiny_tmpfs: Path, tmp_path: Path
) -> None:
    lines = tmp_path / "lines"
    lines.write_text("".join(f"{i}\n" for i in range(2000)))
    root = tiny_tmpfs / "bus"
    res = cli("publish", "fill.up", "--lines", str(lines), "--root", str(root))
    assert res.code == 1
    line = res.error_line()
    assert "No space left on device" in line
    assert "free space" in line
    reported = int(line.split("(published ")[1].split(" ")[0])
    on_disk = len(ok(cli("ls", "--json", "--root", str(root))).json_lines())
    assert reported <= on_disk <= reported + 256  # the note names the uncertain batch
    assert 0 < on_disk < 2000


def test_bad_topic_in_bulk_publish_writes_nothing(cli: Cli, tmp_path: Path) -> None:
    lines = tmp_path / "lines"
    lines.write_text("a\nb\n")
    res = cli("publish", "bad\x01topic", "--lines", str(lines))
    assert res.code == 2
    assert res.error_line().startswith("fsbus: error: invalid topic")
    assert "published" not in res.stderr
    assert ok(cli("ls", "--json")).stdout == ""
