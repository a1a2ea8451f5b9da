"""``python -m fsbus.demo``: real processes, counted; and the demo's own topic matcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsbus.demo import matches

VECTORS = Path(__file__).resolve().parent.parent / "data" / "rabbitmq_topic_vectors.json"


def test_demo_matcher_agrees_with_the_rabbitmq_vectors() -> None:
    data = json.loads(VECTORS.read_text())
    for topic, expected in data["tests"]:
        got = sorted({ident for pattern, ident in data["bindings"] if matches(pattern, topic)})
        assert got == sorted(set(expected)), topic


@pytest.mark.slow
def test_demo_runs_and_verifies_itself(tmp_path: Path) -> None:
    root = tmp_path / "demo-bus"
    proc = subprocess.run(
        [sys.executable, "-m", "fsbus.demo", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "OK: nothing lost" in out
    assert "subscriber-eu    orders.eu.*    got 40/40 matching events" in out
    assert "work queue: 60 jobs, 60 handled, 0 handled twice, 0 lost" in out
    for worker in ("worker-1", "worker-2", "worker-3"):
        assert worker in out
    assert (root / "messages").is_dir()  # --root is kept
