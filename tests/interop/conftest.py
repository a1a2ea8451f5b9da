"""Fixtures for the qlobber-fsq interop tests: a bus root and real Node peers on it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peer_process import JsonLinesPeer

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "qlobber_peer.js"
MODULES = HERE / "node_modules"
FSBUS_CHILD = HERE.parent / "multiprocess" / "bus_child.py"


@pytest.fixture
def node() -> str:
    """The node executable; the test is skipped (saying why) when node or the peer is missing."""
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not on PATH: the qlobber-fsq interop tests need Node.js 18+")
    for package in ("qlobber-fsq", "fs-ext"):
        if not (MODULES / package / "package.json").exists():
            pytest.skip(
                f"{package} is not installed in tests/interop/node_modules: run `make pytest` "
                "or `cd tests/interop && npm install`"
            )
    return exe


@pytest.fixture
def bus_root(tmp_path: Path) -> Path:
    """The bus directory (not created: qlobber-fsq and fsbus both create it; its parent exists)."""
    return tmp_path / "bus"


@pytest.fixture
def qlobber(node: str, tmp_path: Path, bus_root: Path) -> Iterator[Callable[..., JsonLinesPeer]]:
    """``qlobber("sub", subscriptions=[...])`` starts a qlobber-fsq peer on ``bus_root``.

    Peers still running when the test ends are killed.
    """
    started: list[JsonLinesPeer] = []

    def start(role: str, **params: Any) -> JsonLinesPeer:
        params_file = tmp_path / f"qlobber-{role}-{len(started)}.json"
        params_file.write_text(json.dumps({"dir": str(bus_root), **params}))
        peer = JsonLinesPeer(
            [node, str(SCRIPT), role, str(params_file)],
            name=f"qlobber-fsq {role} #{len(started)}",
            cwd=HERE,
        )
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()


@pytest.fixture
def fsbus_child(tmp_path: Path, bus_root: Path) -> Iterator[Callable[..., JsonLinesPeer]]:
    """``fsbus_child("worker", pattern=...)`` runs an fsbus peer in its own Python process.

    It is tests/multiprocess/bus_child.py (see there for roles and events).
    """
    started: list[JsonLinesPeer] = []
    repo = str(HERE.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}

    def start(role: str, **params: Any) -> JsonLinesPeer:
        params_file = tmp_path / f"fsbus-{role}-{len(started)}.json"
        params_file.write_text(json.dumps({"root": str(bus_root), **params}))
        peer = JsonLinesPeer(
            [sys.executable, str(FSBUS_CHILD), role, str(params_file)],
            name=f"fsbus {role} #{len(started)}",
            cwd=HERE,
            env=env,
        )
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()
