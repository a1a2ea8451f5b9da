"""Fixtures of the kombu transport tests: a bus directory per test and its URL.

This folder has no ``__init__.py`` on purpose: with one, pytest would import it as the
package ``kombu`` and shadow the real kombu library.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("kombu")

import fsbus.kombu  # noqa: F401  (registers fsbus://)
from fsbus import BlockingBus


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "bus"


@pytest.fixture
def url(root: Path) -> str:
    return f"fsbus://{root}"


@pytest.fixture
def bus(root: Path) -> Iterator[BlockingBus]:
    """The same bus seen through fsbus itself, to check what the transport did."""
    with BlockingBus(root) as b:
        yield b
