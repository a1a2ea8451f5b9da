"""``fsbus ui`` as a command: registered through add_ui_command, stopped by SIGTERM."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fsbus import InvalidConfig
from fsbus.ui import add_ui_command

from .conftest import fetch

# A stand-in for the fsbus CLI: a parser with subcommands, as the real one builds it.
CLI = """
import argparse, sys
from fsbus.ui import add_ui_command
parser = argparse.ArgumentParser(prog="fsbus")
add_ui_command(parser.add_subparsers(dest="command"))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fsbus")
    add_ui_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_defaults_listen_on_loopback() -> None:
    args = _parse("ui", "--root", "somewhere")
    assert (args.host, args.port) == ("127.0.0.1", 8765)


def test_missing_root_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FSBUS_ROOT", raising=False)
    args = _parse("ui")
    with pytest.raises(InvalidConfig, match="pass --root DIR or set FSBUS_ROOT"):
        args.func(args)
    args = _parse("ui", "--root", str(tmp_path / "nope"))
    with pytest.raises(InvalidConfig, match="is not a directory"):
        args.func(args)


def test_serves_prints_the_token_and_stops_on_sigterm(bus_root: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CLI, "ui", "--root", str(bus_root), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            serving = proc.stdout.readline()
            token_line = proc.stdout.readline()
            login_line = proc.stdout.readline()
            assert serving.startswith(f"fsbus ui: serving {bus_root} on http://127.0.0.1:")
            url = serving.rsplit(" on ", 1)[1].strip()
            token = token_line.rsplit(": ", 1)[1].strip()
            assert len(token) >= 20
            assert login_line.strip() == f"open {url}?token={token} to sign this browser in"
            page = fetch(url)
            assert page.status == 200
            assert "orders.created" in page.body
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()
