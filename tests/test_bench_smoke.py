"""The benchmark harness runs end to end (a tiny plan: no figures worth reading).

No benchmark runs in the test suite: this only checks that ``python -m bench.run`` starts
real publisher and subscriber processes for the raw loop, fsbus and one pure-Python peer,
counts every message, and writes its Markdown and JSON table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("raw", "fsbus", "diskcache")


@pytest.mark.slow
@pytest.mark.timeout(300)  # a dozen real processes; a loaded 2-core machine can be slow
def test_tiny_run_writes_the_table(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--tiny",
            "--fs",
            "disk",
            "--systems",
            ",".join(SYSTEMS),
            "--out",
            str(out),
            "--no-plots",
        ],
        cwd=ROOT,
        env={**os.environ, "FSBUS_BENCH_DISK_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["skipped"] == {}, data["meta"]["skipped"]
    rows = {(r["scenario"], r["system"]): r for r in data["results"]}
    for system in SYSTEMS:
        assert rows[("publish-100B", system)]["ok"], rows[("publish-100B", system)]
        assert rows[("publish-100B", system)]["median"] > 0
    # multi-process scenarios counted every message: nothing lost, nothing duplicated
    for key in (("fanout-1-100B", "fsbus"), ("workqueue-1-100B", "fsbus"),
                ("workqueue-1-100B", "diskcache"), ("latency-100B", "fsbus"),
                # one process, one event loop: publishing and subscribing
                ("inprocess-100B", "fsbus"), ("inprocess_single-100B", "fsbus"),
                ("latency_inprocess-100B", "fsbus")):  # fmt: skip
        assert rows[key]["ok"], rows[key]
        assert rows[key]["median"] > 0
    assert rows[("publish-100B", "fsbus")]["vs_raw"] is not None
    table = (out / "results.md").read_text()
    assert "| publish 100B | msg/s |" in table
    for system in SYSTEMS:
        assert system in table
    # scratch directories are gone
    assert [p.name for p in tmp_path.iterdir()] == ["results"]


@pytest.mark.timeout(120)
def test_cli_startup_bench_prints_the_table(tmp_path: Path) -> None:
    # two runs, no warm-up: checks the script works, not the figures (exit 1 only says a
    # target was missed, which a loaded machine may do; no timing is asserted here)
    out = tmp_path / "startup.json"
    proc = subprocess.run(
        [sys.executable, "bench/bench_cli_startup.py", "--runs", "2", "--warmup", "0",
         "--json", str(out)],
        cwd=ROOT,
        env={**os.environ, "FSBUS_BENCH_DISK_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    for name in ("python -c pass", "fsbus --help", "fsbus publish"):
        assert f"| {name} |" in proc.stdout, proc.stdout
    assert "target fsbus --help <= 150 ms" in proc.stdout
    data = json.loads(out.read_text())
    assert len(data["times_ms"]["fsbus publish"]) == 2
    assert all(v > 0 for v in data["times_ms"]["fsbus --help"])
    # the scratch bus is gone
    assert [p.name for p in tmp_path.iterdir()] == ["startup.json"]


def test_issue_targets_cover_the_in_process_scenarios() -> None:
    from bench.report import targets

    def row(scenario: str, system: str, median: float, p99: float | None = None) -> dict[str, Any]:
        unit = "ms" if scenario.startswith("latency") else "msg/s"
        return {"fs": "tmpfs", "scenario": scenario, "system": system, "unit": unit,
                "median": median, "p99": p99}  # fmt: skip

    rows = [
        row("inprocess-100B", "fsbus", 9.0),
        row("inprocess-100B", "qlobber-fsq", 3.0),
        row("inprocess_single-100B", "fsbus", 5.0),
        row("inprocess_single-100B", "qlobber-fsq", 2.0),
        row("fanout-4-100B", "fsbus", 1.0),
        row("fanout-4-100B", "redis", 2.0),
        row("latency_inprocess-100B", "fsbus", 0.5, 3.0),
        row("latency_inprocess-100B", "rabbitmq", 1.0, 2.0),
    ]
    got = {t["target"]: t for t in targets(rows)}
    assert got["In process end to end ≥ 3x qlobber-fsq"]["met"]
    assert not got["In process work queue ≥ 3x qlobber-fsq"]["met"]  # 2.5x
    assert not got["Fan-out to 4 ≥ Redis pub/sub"]["met"]
    assert got["Round trip in process p50 ≤ RabbitMQ's"]["ratio"] == 2.0
    assert not got["Bus round trip in process p99 ≤ 2 ms"]["met"]  # 3 ms


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_async_suite_answers_its_figures(tmp_path: Path) -> None:
    # the suite the full plan runs on every filesystem (await publish beside BlockingBus,
    # and the loop's lag on a mount that takes 10 ms a call), a few publishes only
    params = json.dumps({"dir": str(tmp_path), "records": 300, "rounds": 1})
    proc = subprocess.run(
        [sys.executable, "-m", "bench.suites", "async", params],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    rates = json.loads(line.removeprefix("RESULT "))["rates"]
    from bench.suites import LAG_CONCURRENT, LAG_SEQUENTIAL

    for key in ("blocking publish", "sequential await publish", "50 in flight await publish",
                LAG_SEQUENTIAL, LAG_CONCURRENT):  # fmt: skip
        assert rates[key] > 0, (key, rates)
    assert list(tmp_path.iterdir()) == []  # its directories are gone


def test_suite_targets_read_the_async_suite() -> None:
    from bench.report import suite_targets
    from bench.suites import LAG_CONCURRENT, LAG_SEQUENTIAL

    figs = {
        "blocking publish": 100.0,
        "sequential await publish": 60.0,
        "50 in flight await publish": 70.0,
        LAG_SEQUENTIAL: 0.2,
        LAG_CONCURRENT: 7.0,
    }
    got = {t["target"]: t for t in suite_targets({"async": {"tmpfs": figs}})}
    assert got["await publish, one at a time ≥ 0.5x BlockingBus.publish"]["met"]
    assert not got["await publish, 50 in flight ≥ 0.8x BlockingBus.publish"]["met"]  # 0.7x
    assert got["Loop lag p99 ≤ 5 ms, a mount taking 10 ms a call, one at a time"]["met"]
    assert not got["Loop lag p99 ≤ 5 ms, a mount taking 10 ms a call, 50 in flight"]["met"]
