"""What the CLI imports before a subcommand runs (no timing: only which modules load).

``fsbus --help`` and building the parser must not load the event loop, pydantic, the Bus
engine, Streams or the dashboard's server; each command imports those when it runs.
``bench/bench_cli_startup.py`` measures what that is worth.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_helpers import cli_env

HEAVY = ("anyio", "asyncio", "pydantic", "watchdog", "xxhash", "http.server")
PRIVATE = ("fsbus._config", "fsbus._bus", "fsbus._stream", "fsbus.ui._server")

PROBE = """
import contextlib, io, json, sys
from fsbus._cli.main import build_parser, main
build_parser()
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(sys.argv[1:])
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(*argv: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        env=cli_env(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    last = proc.stdout.strip().splitlines()[-1]
    modules: list[str] = json.loads(last)
    return modules


@pytest.mark.parametrize("argv", [("--help",), ("subscribe", "--help"), ("ui", "--help")])
def test_help_loads_no_heavy_module(argv: tuple[str, ...]) -> None:
    modules = _loaded(*argv)
    assert "fsbus._cli.publish" in modules  # the probe did build the whole parser
    heavy = [m for m in modules if any(m == h or m.startswith(h + ".") for h in (*HEAVY, *PRIVATE))]
    assert heavy == [], f"`fsbus {' '.join(argv)}` imported {heavy}"


def test_public_names_still_import() -> None:
    # the lazy names of fsbus.ui resolve (the dashboard and its tests use them)
    import fsbus.ui

    assert fsbus.ui.UiServer.__name__ == "UiServer"
    assert {"Dashboard", "PurgeResult", "Snapshot"} <= set(dir(fsbus.ui))
    with pytest.raises(AttributeError):
        _ = fsbus.ui.no_such_name
