"""Fixtures for the CLI tests: a bus directory, and the CLI run as subprocesses on it."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_helpers import TIMEOUT, Result, Running, run_cli, start_cli


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A bus directory that does not exist yet (the CLI creates it)."""
    return tmp_path / "bus"


@pytest.fixture
def cli(root: Path) -> Callable[..., Result]:
    """``cli("publish", "a.b", "x")`` runs ``python -m fsbus`` with ``FSBUS_ROOT=root``."""

    def call(*args: str, input: bytes | None = None, env: dict[str, str] | None = None) -> Result:
        return run_cli(*args, root=root, input=input, env=env)

    return call


@pytest.fixture
def spawn(root: Path) -> Iterator[Callable[..., Running]]:
    """Start CLI processes in the background; any still running at the end are killed."""
    started: list[Running] = []

    def start(
        *args: str, env: dict[str, str] | None = None, out: queue.Queue[str | None] | None = None
    ) -> Running:
        running = start_cli(*args, root=root, env=env, out=out)
        started.append(running)
        return running

    yield start
    for running in started:
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait(TIMEOUT)
        running.close_pipes()
