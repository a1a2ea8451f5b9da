"""The streams benchmark runs end to end (a tiny run: figures are not checked here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_streams.py"


@pytest.mark.slow
def test_bench_streams_runs(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--records",
            "3000",
            "--peer-records",
            "50",
            "--rounds",
            "1",
            "--fs",
            "tmpfs",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed on a tiny run
    assert "target read" in proc.stdout
    assert "fsbus append / raw append" in proc.stdout
    assert out.read_text().startswith("{")
