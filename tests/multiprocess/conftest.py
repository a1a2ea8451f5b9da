"""Fixtures for the multi-process tests: a bus root and bus peers in child processes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peer_process import JsonLinesPeer

HERE = Path(__file__).resolve().parent
CHILD = HERE / "bus_child.py"
REPO = HERE.parent.parent


@pytest.fixture
def bus_root(tmp_path: Path) -> Path:
    """The bus directory (created by the first peer that opens it)."""
    return tmp_path / "bus"


@pytest.fixture
def spawn(tmp_path: Path, bus_root: Path) -> Iterator[Callable[..., JsonLinesPeer]]:
    """``spawn("worker", pattern="jobs.#")`` runs tests/multiprocess/bus_child.py on ``bus_root``.

    Children still running when the test ends are killed.
    """
    started: list[JsonLinesPeer] = []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }

    def start(role: str, *, name: str | None = None, **params: Any) -> JsonLinesPeer:
        label = name or f"{role} #{len(started)}"
        params_file = tmp_path / f"child-{len(started)}-{role}.json"
        params_file.write_text(json.dumps({"root": str(bus_root), **params}))
        peer = JsonLinesPeer(
            [sys.executable, str(CHILD), role, str(params_file)], name=label, cwd=HERE, env=env
        )
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()
