"""A real local Spark (local[2], Java 17) for the connector tests, started once per session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import build_spark


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's SparkSession (start-up takes several seconds)."""
    pytest.importorskip("pyspark", reason="install the spark extra: pip install -e '.[spark]'")
    if shutil.which("java") is None:
        pytest.fail(
            "Java 17 is needed for the Spark tests: apt-get install openjdk-17-jre-headless"
        )
    session = build_spark(tmp_path_factory.mktemp("spark"))
    yield session
    session.stop()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A fresh bus root for one test."""
    path = tmp_path / "bus"
    path.mkdir()
    return path
