"""The example pipeline of docs/examples/spark_pipeline.py (``make spark-demo``), small:
service processes publish, the Spark job (a process of its own) is killed with SIGKILL
midway and restarted, and every published event is counted once in its Parquet table and
every alert it publishes is received once."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from spark_helpers import PANDAS_WARNING, WORKER_START

# The example waits on conditions (each up to its own TIMEOUT), never on the clock.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.filterwarnings(PANDAS_WARNING),
    pytest.mark.timeout(900),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "spark_pipeline.py"
SCALE = 150


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_pipeline_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_published_event_is_counted_once_across_a_kill(root: Path, tmp_path: Path) -> None:
    example = load_example()
    # 0.02 s between a service's events: windows still reach ALERT_ERRORS (1 event in 11
    # is an error), and the backlog a restarted job drains first stays small when the
    # machine is busy with other tests (at 0.01, a loaded run took more than 180 s)
    result = example.run_pipeline(root, tmp_path, scale=SCALE, interval=0.02, report=lambda _: None)

    published = result.totals(result.published)
    assert set(published) == {(s, k) for s in example.SERVICES for k in example.KINDS}
    total = sum(n for n, _ms, _windows in published.values())
    assert total >= 2 * SCALE
    assert result.killed_at >= SCALE
    assert result.while_down > 0
    # window by window: the same events and latency total, each window written once
    assert result.counted == result.published
    assert all(rows == 1 for _n, _ms, rows in result.counted.values())
    # every window with enough errors raised one alert, received once
    assert result.alerts_due
    assert result.alerts == {key: [errors, 1] for key, errors in result.alerts_due.items()}
    assert result.exact
    # The job restarts a failed query from its checkpoint (as a supervisor would); the only
    # failure it may meet here is Spark giving up on a Python worker that a loaded machine
    # started too slowly (Spark waits 10 s for one). Anything else fails the test.
    assert all(WORKER_START in reason for reason in result.restarts), result.restarts


def test_a_service_reports_what_it_published(root: Path) -> None:
    """One service process alone: SIGTERM ends it after a whole publish, and its report
    matches the messages on the bus."""
    from fsbus import BlockingBus

    example = load_example()
    cmd = [sys.executable, str(EXAMPLE), "service", "--root", str(root), "--name", "search"]
    with subprocess.Popen([*cmd, "--interval", "0.001"], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        lines = iter(proc.stdout)
        assert json.loads(next(lines)) == {"ready": True}
        while json.loads(next(lines)).get("published", 0) < 50:
            pass
        proc.send_signal(signal.SIGTERM)
        report = [json.loads(line) for line in lines][-1]
    assert proc.returncode == 0
    with BlockingBus(root) as bus:
        on_bus = [(m.topic, json.loads(bus.read_payload(m) or b"")) for m in bus.browse("#")]
    assert len(on_bus) == report["published"] == sum(n for _k, _w, n, _ms in report["done"])
    assert {topic.split(".")[1] for topic, _ in on_bus} == {"search"}
    assert {topic.split(".")[2] for topic, _ in on_bus} <= set(example.KINDS)
    assert sum(body["latency_ms"] for _, body in on_bus) == sum(
        ms for _k, _w, _n, ms in report["done"]
    )
