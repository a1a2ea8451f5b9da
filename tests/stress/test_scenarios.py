"""The small configuration of every stress scenario, in real processes.

Each scenario counts every message itself; here a run must report no loss, no forbidden
duplicate and no other violation. The runner is also checked end to end, as a user
would start it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stress import chaos, fanout, mixed, queues, workqueue
from stress._common import Summary, matches

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _check(summary: Summary) -> None:
    assert summary.ok, summary.line() + "\n" + "\n".join(summary.violations)
    assert summary.sent > 0
    assert summary.lost == 0
    assert summary.duplicates == 0


@pytest.fixture(autouse=True)
def _scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FSBUS_STRESS_DIR", str(tmp_path))


def test_fanout_small() -> None:
    s = fanout.run("small")
    _check(s)
    assert s.delivered == s.notes["expected"]


def test_fanout_small_polling_only() -> None:
    """The same with inotify off: the poll path alone delivers everything."""
    _check(fanout.run("small", config={"force_polling": True}))


def test_workqueue_small() -> None:
    s = workqueue.run("small")
    _check(s)
    assert s.delivered == s.sent
    assert s.notes["failures"] > 0  # failures happened and were redelivered


def test_chaos_small() -> None:
    s = chaos.run("small")
    _check(s)
    assert s.delivered == s.sent
    assert s.notes["kills"] > 0


def test_mixed_small() -> None:
    s = mixed.run("small")
    _check(s)
    assert s.notes["long"] > 0
    assert s.notes["gc_rounds"] > 0


def test_queues_small() -> None:
    """Three durable queues with overlapping bindings, consumers of both faces SIGKILLed."""
    s = queues.run("small")
    _check(s)
    assert s.delivered == s.notes["expected"]
    assert s.notes["kills"] > 0
    assert all(s.notes[f"q_{q}"] > 0 for q in queues.QUEUES)
    assert s.notes["after_bind"] > 0  # the binding added mid-run routed what came after
    assert s.notes["unrouted"] > 0


def test_runner_exit_code_and_summary_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stress", "workqueue", "--size", "small"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
        env={"FSBUS_STRESS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    for key in ("sent=", "delivered=", "duplicates=0", "lost=0", "rate=", "result=OK"):
        assert key in line


def test_summary_fails_on_any_violation() -> None:
    assert not Summary("x", "small", sent=1, lost=1).ok
    assert not Summary("x", "small", sent=1, duplicates=1).ok
    assert not Summary("x", "small", sent=1, violations=["bad"]).ok
    assert "result=FAIL" in Summary("x", "small", sent=1, lost=1).line()


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("a.#", "a", True),
        ("#.a", "a", True),
        ("a.#.#.b", "a.b", True),
        ("*", "", False),
        ("#", "", True),
        ("a.*.b", "a..b", False),
        ("*.b", "a.b.c", False),
    ],
)
def test_reference_matcher(pattern: str, topic: str, expected: bool) -> None:
    assert matches(pattern, topic) is expected
