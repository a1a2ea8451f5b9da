"""Fixtures for the stream tests: a fresh root and a fast (unsynced) config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fsbus import Stream, StreamConfig


@pytest.fixture
def fast_config() -> StreamConfig:
    """No fdatasync (tests check logic, not the disk), small segments and index steps."""
    return StreamConfig(
        durability="none", segment_bytes=8192, index_interval_bytes=512, cache_wait=0.2
    )


@pytest.fixture
def stream(tmp_path: Path, fast_config: StreamConfig) -> Iterator[Stream]:
    with Stream.open(tmp_path, "s", config=fast_config) as s:
        yield s
