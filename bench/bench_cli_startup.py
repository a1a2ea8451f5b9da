"""CLI start-up benchmark: how long a fresh ``fsbus`` process takes, beside Python's floor.

Each command runs as a new process (``subprocess.run``, output discarded), ``--runs``
times after ``--warmup`` runs that are not counted; the commands take turns in every run,
so a burst of load from elsewhere on the machine hits them all alike. Reported per
command: median and p90 wall time in ms, and the median as a ratio to the floors

* ``python -c pass``        the interpreter alone (with the venv's ``site``);
* ``python -c "import fsbus"``  the interpreter and the package's cheap top level.

The commands timed:

* ``fsbus --help``               what every invocation pays before a subcommand runs;
* ``fsbus subscribe --help``     a subcommand's parser, nothing run;
* ``fsbus publish TOPIC PAYLOAD --root DIR``  a real publish of one message (a fresh
  bus directory under a temp dir for the whole run, in ``FSBUS_BENCH_DISK_DIR`` if set;
  messages pile up, one per run, and are removed at the end).

Targets (checked at the end, on the median): ``fsbus --help`` <= 150 ms and
``fsbus publish`` <= 250 ms. The ``fsbus`` command is the venv's console script next to
the interpreter running this file (``--fsbus`` to pick another).

    .venv/bin/python bench/bench_cli_startup.py [--runs N] [--warmup W] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS_MS = {"fsbus --help": 150.0, "fsbus publish": 250.0}


def _commands(fsbus: str, root: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import fsbus'": [py, "-c", "import fsbus"],
        "fsbus --help": [fsbus, "--help"],
        "fsbus subscribe --help": [fsbus, "subscribe", "--help"],
        "fsbus publish": [fsbus, "publish", "bench.cli", "hello", "--root", str(root)],
    }


def _run_once(argv: list[str], env: dict[str, str]) -> float:
    """Wall time of one process, in ms; raises if it fails."""
    started = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    elapsed = (time.perf_counter() - started) * 1000.0
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {err}")
    return elapsed


def _p90(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def measure(fsbus: str, runs: int, warmup: int) -> dict[str, list[float]]:
    """Times in ms per command, commands interleaved run by run."""
    # No byte-code writes from the timed processes, so every run sees the same cache
    # (the warm-up has compiled whatever was stale), and no FSBUS_* from the caller.
    warm = {k: v for k, v in os.environ.items() if not k.startswith("FSBUS_")}
    warm.pop("PYTHONDONTWRITEBYTECODE", None)
    env = {**warm, "PYTHONDONTWRITEBYTECODE": "1"}
    base = os.environ.get("FSBUS_BENCH_DISK_DIR") or None
    scratch = Path(tempfile.mkdtemp(prefix="fsbus-bench-cli-", dir=base))
    try:
        commands = _commands(fsbus, scratch / "bus")
        times: dict[str, list[float]] = {name: [] for name in commands}
        for i in range(warmup + runs):
            for name, argv in commands.items():
                ms = _run_once(argv, env if i >= warmup else warm)
                if i >= warmup:
                    times[name].append(ms)
        return times
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _table(times: dict[str, list[float]]) -> tuple[str, dict[str, dict[str, float]]]:
    floor = statistics.median(times["python -c pass"])
    import_floor = statistics.median(times["python -c 'import fsbus'"])
    rows = [
        "| command | median ms | p90 ms | x python | x import fsbus |",
        "|---|---|---|---|---|",
    ]
    summary: dict[str, dict[str, float]] = {}
    for name, values in times.items():
        med = statistics.median(values)
        p90 = _p90(values)
        summary[name] = {"median_ms": med, "p90_ms": p90, "runs": float(len(values))}
        rows.append(
            f"| {name} | {med:.1f} | {p90:.1f} | {med / floor:.2f}x | {med / import_floor:.2f}x |"
        )
    return "\n".join(rows), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs per command")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per command first")
    parser.add_argument(
        "--fsbus",
        default=str(Path(sys.executable).with_name("fsbus")),
        help="the fsbus command to time (default: next to this Python)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be at least 1 and --warmup at least 0")
    if not Path(args.fsbus).exists():
        parser.error(f"{args.fsbus} not found; install the package (pip install -e .)")

    started = time.monotonic()
    times = measure(args.fsbus, args.runs, args.warmup)
    table, summary = _table(times)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.runs} runs after {args.warmup} warm-up; load {load:.2f}; "
        f"took {time.monotonic() - started:.1f} s"
    )
    print()
    print(table)
    print()
    met = True
    for name, limit in TARGETS_MS.items():
        med = summary[name]["median_ms"]
        ok = med <= limit
        met &= ok
        print(f"target {name} <= {limit:.0f} ms: {med:.1f} ms {'met' if ok else 'NOT met'}")
    if args.json:
        out: dict[str, object] = {
            "runs": args.runs,
            "warmup": args.warmup,
            "load": load,
            "commands": summary,
            "times_ms": times,
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
