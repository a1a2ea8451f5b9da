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


def test_demo_report_flags_lost_duplicate_and_stray_messages(tmp_path: Path) -> None:
    from fsbus.demo import JOB_PATTERN, SUBSCRIBERS, WORKERS, Child, Demo

    demo = Demo(tmp_path, events=3, jobs=2)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    eu, paid = (name for name, _ in SUBSCRIBERS)
    said = {
        eu: [{"event": "got", "id": "e1"}, {"event": "got", "id": "e1"}],  # twice, e2 lost
        paid: [{"event": "got", "id": "e9"}],  # not one it should get
        WORKERS[0]: [{"event": "job", "id": "j1"}],
        WORKERS[1]: [{"event": "job", "id": "j1"}],  # the same job twice
        WORKERS[2]: [],
    }
    for name, events in said.items():
        demo.children[name] = Child(name, done, events)
    published = [
        {"id": "e1", "topic": "orders.eu.created"},
        {"id": "e2", "topic": "orders.eu.paid"},
    ]
    expected = {eu: {"e1", "e2"}, paid: {"e2"}}
    demo.report(published, {"j1", "j2"}, expected, arrived=False)
    text = "\n".join(demo.problems)
    assert f"{eu} missed 1 events" in text
    assert f"{eu} got 1 events twice" in text
    assert f"{paid} missed 1 events" in text
    assert f"{paid} got events not matching" in text
    assert "1 jobs were handled twice" in text
    assert "1 jobs were never handled" in text
    assert JOB_PATTERN == "jobs.#"
