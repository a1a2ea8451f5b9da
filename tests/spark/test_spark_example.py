"""The example pipeline of docs/examples/spark_pipeline.py, run on the session's Spark."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from spark_helpers import PANDAS_WARNING

# A SparkSession takes seconds to start, many more on a loaded machine.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings(PANDAS_WARNING),
    pytest.mark.timeout(300),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "spark_pipeline.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_pipeline_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_pipeline(spark: Any, root: Path, tmp_path: Path) -> None:
    example = load_example()
    result = example.run_pipeline(spark, root, tmp_path / "out", per_service=120)

    windows = result["windows"]
    assert len(windows) == 3 * 6  # three services, 60 s of events in 10 s windows
    assert all(w["events"] == 20 for w in windows)
    got = Counter(
        (body["service"], example._epoch(body["window_start"])) for _, body in result["alerts"]
    )
    assert set(got) == result["expected_alerts"]
    assert max(got.values()) == 1
    assert len(result["expected_alerts"]) == 2
    assert {topic for topic, _ in result["alerts"]} == {
        "alerts.latency.payments",
        "alerts.latency.checkout",
    }
