"""One entry for every benchmark: ``python -m bench.run [--quick] [--fs ...] [--systems ...]``.

For each filesystem, each scenario runs every system that supports it, round after round,
interleaved and rotated (A B C, B C A, C A B, ...), in a fresh directory each time; the
median of the rounds is kept. Results go to ``--out`` as results.md, results.json and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import report
from bench.filesystems import Scratch, scratch, unavailable
from bench.procs import ChildFailed
from bench.scenarios import PLANS, Plan, Scenario, match_data
from bench.suites import Suite
from bench.suites import run as run_suite
from bench.suites import unavailable as suite_unavailable
from bench.systems import DEFAULT, Measurement, System, load


@dataclass
class Row:
    """The rounds of one system in one scenario on one filesystem."""

    fs: str
    scenario: str
    title: str
    kind: str
    unit: str
    system: str
    label: str
    rounds: list[Measurement] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        vals = [m.value for m in self.rounds if m.value is not None]
        ok = bool(self.rounds) and all(m.ok for m in self.rounds) and bool(vals)
        p99s = [m.p99 for m in self.rounds if m.p99 is not None]
        extra: dict[str, float] = {}
        for key in {k for m in self.rounds for k in m.extra}:
            xs = [m.extra[key] for m in self.rounds if key in m.extra]
            extra[key] = statistics.median(xs)
        return {
            "fs": self.fs,
            "scenario": self.scenario,
            "title": self.title,
            "kind": self.kind,
            "unit": self.unit,
            "system": self.system,
            "label": self.label,
            "median": statistics.median(vals) if vals and ok else None,
            "p99": statistics.median(p99s) if p99s else None,
            "values": [m.value for m in self.rounds],
            "ok": ok,
            "notes": sorted({m.note for m in self.rounds if m.note}),
            "extra": extra,
        }


DEFAULT_OUT = {
    "full": "bench/results",
    "quick": "bench/results/quick",
    "tiny": "bench/scratch/tiny",
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(
    sysobj: System, sc: Scenario, workdir: Path, timeout: float, place: Scratch
) -> Measurement:
    """One round of one system in a fresh ``workdir``, deleted after."""
    workdir.mkdir(parents=True)
    # the previous system's data and deletions on disk (`sync -f` = syncfs): nobody pays
    # for another's writeback, and freed inodes are avoided for 1 minute, not 6
    t = time.monotonic()
    try:
        subprocess.run(["sync", "-f", str(workdir)], check=False, timeout=60)
    except subprocess.TimeoutExpired:
        pass  # someone else is writing a lot; measure anyway
    if time.monotonic() - t > 1:
        log(f"  (sync before {sysobj.name} took {time.monotonic() - t:.1f}s)")
    try:
        return sysobj.run(sc, workdir, timeout=timeout)
    except ChildFailed as exc:
        log(f"  {sysobj.name} {sc.key} failed: {exc}")
        lines = str(exc).splitlines()
        note = lines[0] + (f": {lines[-1].strip()}" if len(lines) > 1 else "")
        return Measurement(None, ok=False, note=note[:240])
    finally:
        place.remove(workdir)


def _check_matches(rows: dict[str, Row]) -> None:
    """Every matcher must find the same number of matches: mark all failed if not."""
    found = {
        name: {m.extra.get("matches") for m in row.rounds if m.value is not None}
        for name, row in rows.items()
    }
    if len({x for xs in found.values() for x in xs}) <= 1:
        return
    note = "matchers disagree: " + ", ".join(
        f"{name} {'/'.join(f'{x:,.0f}' for x in sorted(xs if None not in xs else ()))}"
        for name, xs in found.items()
    )
    log(f"  {note}")
    for row in rows.values():
        row.rounds = [replace(m, ok=False, note=note) for m in row.rounds]


def run_plan(
    plan: Plan,
    systems: list[System],
    filesystems: list[str],
    *,
    timeout: float,
    suites: dict[str, dict[str, dict[str, float]]],
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every scenario on every filesystem; suites' figures go into ``suites``."""
    rows: list[Row] = []
    fs_desc: dict[str, str] = {}
    done_fs_free: set[tuple[str, str]] = set()
    for fs in filesystems:
        with scratch(fs) as place:
            fs_desc[fs] = place.description
            log(f"== {fs}: {place.description} at {place.path}")
            for sc in plan.scenarios:
                runners = [s for s in systems if s.supports(sc)]
                if sc.kind == "match":
                    # matching does not touch the filesystem: run it once
                    if ("match", sc.key) in done_fs_free:
                        continue
                    done_fs_free.add(("match", sc.key))
                    (place.path / "match.json").write_text(
                        json.dumps(match_data(sc.bindings, sc.count))
                    )
                cur = {
                    s.name: Row(fs, sc.key, sc.title, sc.kind, sc.unit, s.name, s.label)
                    for s in runners
                }
                for r in range(plan.rounds):
                    # rotate the order each round (A B C, B C A, C A B): no system always
                    # runs right after another's deletions (slow creates on a journal-less
                    # ext4) or on a freshly warmed cache
                    k = r % max(1, len(runners))
                    for s in runners[k:] + runners[:k]:
                        t = time.monotonic()
                        # on the disk: a block group where creates are fast (bench.filesystems)
                        name = f"{s.name}-{sc.key}-{r}"
                        work = place.workdir(name) if sc.kind != "match" else place.path / name
                        m = measure(s, sc, work, timeout, place)
                        cur[s.name].rounds.append(m)
                        shown = "FAILED" if m.value is None else f"{m.value:,.1f} {sc.unit}"
                        log(
                            f"  {sc.key:<22} r{r} {s.name:<14} {shown:>16}"
                            f"  ({time.monotonic() - t:.1f}s){'  ' + m.note if m.note else ''}"
                        )
                if sc.kind == "match":
                    _check_matches(cur)
                rows += cur.values()
            for name, records, rounds in plan.suites:
                suite = Suite(name, records, rounds, per_fs=name != "spark")
                if not suite.per_fs and name in suites:
                    continue
                why = suite_unavailable(suite)
                if why:
                    log(f"  suite {name}: skipped, {why}")
                    suites.setdefault(name, {})["skipped"] = {}
                    continue
                t = time.monotonic()
                try:
                    figures = run_suite(suite, place.path, timeout=1800)
                except ChildFailed as exc:
                    log(f"  suite {name} failed: {exc}")
                    continue
                suites.setdefault(name, {})[fs if suite.per_fs else "once"] = figures
                log(f"  suite {name}: {len(figures)} figures ({time.monotonic() - t:.1f}s)")
            t_clean = time.monotonic()
        log(f"  removed the scratch directory ({time.monotonic() - t_clean:.1f}s)")
    return [r.summary() for r in rows], fs_desc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes, < 3 minutes")
    mode.add_argument("--tiny", action="store_true", help="a few messages: checks the harness")
    ap.add_argument("--fs", help="comma-separated: disk,ext4loop,tmpfs (default: the plan's)")
    ap.add_argument("--systems", help=f"comma-separated from: {','.join(DEFAULT)}")
    ap.add_argument("--scenarios", help="comma-separated kinds or keys to keep (e.g. publish)")
    ap.add_argument("--rounds", type=int, help="override the plan's rounds")
    ap.add_argument(
        "--out",
        help="results folder (default: bench/results, bench/results/quick for --quick, "
        "bench/scratch/tiny for --tiny)",
    )
    ap.add_argument("--no-plots", action="store_true", help="tables only")
    ap.add_argument(
        "--suites-only",
        action="store_true",
        help="run only the suites and add their figures to the results already in --out",
    )
    ap.add_argument(
        "--no-suites",
        action="store_true",
        help="skip bench_streams.py / bench_spark.py (also skipped with --systems/--scenarios)",
    )
    args = ap.parse_args(argv)

    plan = PLANS["quick" if args.quick else "tiny" if args.tiny else "full"]
    if args.scenarios:
        keep = set(args.scenarios.split(","))
        plan = replace(
            plan, scenarios=tuple(s for s in plan.scenarios if s.kind in keep or s.key in keep)
        )
    rounds = args.rounds or plan.rounds
    filesystems = args.fs.split(",") if args.fs else list(plan.filesystems)
    for fs in list(filesystems):
        why = unavailable(fs)
        if why:
            log(f"skipping filesystem {fs}: {why}")
            filesystems.remove(fs)
    names = args.systems.split(",") if args.systems else list(DEFAULT)
    systems: list[System] = []
    skipped: dict[str, str] = {}
    try:
        for name in names:
            try:
                s = load(name)
                why = s.prepare()
            except (ImportError, OSError, RuntimeError) as exc:
                log(f"skipping {name}: {exc}")
                skipped[name] = str(exc)
                continue
            if why:
                log(f"skipping {name}: {why}")
                skipped[name] = why
                s.close()
            else:
                systems.append(s)
        t0 = time.monotonic()
        suites: dict[str, dict[str, dict[str, float]]] = {}
        if args.suites_only:
            plan = replace(plan, scenarios=())
        elif args.scenarios or args.systems or args.no_suites:
            plan = replace(plan, suites=())
        results, fs_desc = run_plan(
            replace(plan, rounds=rounds), systems, filesystems, timeout=plan.timeout, suites=suites
        )
        elapsed = time.monotonic() - t0
    finally:
        for s in systems:
            s.close()
    meta = {
        "plan": plan.name,
        "rounds": rounds,
        "filesystems": fs_desc,
        "systems": {s.name: s.label for s in systems},
        "skipped": skipped,
        "seconds": round(elapsed, 1),
        "suites": suites,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {_cores()} cores, Linux {platform.release()}",
        "python": platform.python_version(),
        "command": " ".join(["python -m bench.run", *(argv if argv is not None else sys.argv[1:])]),
    }
    out = Path(args.out or DEFAULT_OUT[plan.name])
    if args.suites_only and (out / "results.json").exists():
        old = json.loads((out / "results.json").read_text())
        # the run's own lines stay; one more says when, and how, the suites were run
        note = f"{meta['date']}, `{meta['command']}`, {meta['seconds']} s"
        results, meta = old["results"], {**old["meta"], "suites": suites, "suites_run": note}
    report.write(out, results, meta, plots=not args.no_plots)
    if plan.name == "full" and args.out is None and not args.no_plots:
        report.update_readme(Path(__file__).with_name("README.md"), out)
        log("updated bench/README.md")
    log(f"wrote {out}/results.md, results.json{'' if args.no_plots else ' and plots'}")
    return 0


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    raise SystemExit(main())
