"""Write the results: results.json, results.md (tables, ratios, targets) and PNG plots.

Ratios are *speed* ratios, so that above 1 always means "faster than the reference":
throughput / reference throughput, or reference latency / latency.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RAW = "raw"
QLOBBER = "qlobber-fsq"
FSBUS = "fsbus"


def speed_ratio(row: dict[str, Any], ref: dict[str, Any] | None) -> float | None:
    """How many times faster ``row`` is than ``ref`` (None when either is missing)."""
    if ref is None or row["median"] is None or ref["median"] is None:
        return None
    if row["unit"] == "ms":
        return float(ref["median"]) / float(row["median"]) if row["median"] else None
    return float(row["median"]) / float(ref["median"]) if ref["median"] else None


def add_ratios(results: list[dict[str, Any]]) -> None:
    index = {(r["fs"], r["scenario"], r["system"]): r for r in results}
    for r in results:
        for ref, key in ((RAW, "vs_raw"), (QLOBBER, "vs_qlobber")):
            r[key] = speed_ratio(r, index.get((r["fs"], r["scenario"], ref)))


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "ms":
        return f"{v:.2f}"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:,.1f}"


def _ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _ordered(values: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


TARGETS: list[tuple[str, str, str, str, float, str]] = [
    # (description, fs or "*", scenario, reference system, minimum speed ratio, system)
    ("Bus publish ≥ 70% of the raw loop", "*", "publish-100B", RAW, 0.70, FSBUS),
    ("Bus publish ≥ 3x qlobber-fsq", "*", "publish-100B", QLOBBER, 3.0, FSBUS),
    ("Bus fan-out end to end ≥ 2x qlobber-fsq", "*", "fanout-1-100B", QLOBBER, 2.0, FSBUS),
    ("Bus fan-out end to end ≥ 3x qlobber-fsq", "*", "fanout-1-100B", QLOBBER, 3.0, FSBUS),
    ("Bus work queue ≥ 3x qlobber-fsq", "*", "workqueue-4-100B", QLOBBER, 3.0, FSBUS),
    ("Topic matching ≥ qlobber-fsq's matcher", "*", "match-10k", QLOBBER, 1.0, FSBUS),
    ("tmpfs: Bus fan-out ≥ Redis pub/sub", "tmpfs", "fanout-1-100B", "redis", 1.0, FSBUS),
    ("In process end to end ≥ 3x qlobber-fsq", "*", "inprocess-100B", QLOBBER, 3.0, FSBUS),
    (
        "In process work queue ≥ 3x qlobber-fsq",
        "*",
        "inprocess_single-100B",
        QLOBBER,
        3.0,
        FSBUS,
    ),
    ("Fan-out to 4 ≥ Redis pub/sub", "*", "fanout-4-100B", "redis", 1.0, FSBUS),
    ("Round trip p50 ≤ RabbitMQ's", "*", "latency-100B", "rabbitmq", 1.0, FSBUS),
    (
        "Round trip in process p50 ≤ RabbitMQ's",
        "*",
        "latency_inprocess-100B",
        "rabbitmq",
        1.0,
        FSBUS,
    ),
    (
        "tmpfs: Streams append ≥ Redis pipelined",
        "tmpfs",
        "append-100B",
        "redis-pipe",
        1.0,
        "fsbus-streams",
    ),
]


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check the issue's targets against this run."""
    index = {(r["fs"], r["scenario"], r["system"]): r for r in results}
    fss = _ordered(r["fs"] for r in results)
    out: list[dict[str, Any]] = []
    for desc, fs_sel, scen, ref, need, system in TARGETS:
        for fs in fss if fs_sel == "*" else [fs_sel]:
            row = index.get((fs, scen, system))
            refrow = index.get((fs, scen, ref))
            if row is None or refrow is None:
                continue
            got = speed_ratio(row, refrow)
            out.append(
                {
                    "target": desc,
                    "fs": fs,
                    "ratio": got,
                    "need": need,
                    "met": got is not None and got >= need,
                }
            )
    for fs in fss:
        for scen, what, field, need in (
            ("latency-100B", "Bus round trip p50 ≤ 1 ms", "median", 1.0),
            ("latency-100B", "Bus round trip p99 ≤ 2 ms", "p99", 2.0),
            ("latency_inprocess-100B", "Bus round trip in process p99 ≤ 2 ms", "p99", 2.0),
        ):
            row = index.get((fs, scen, FSBUS))
            if row is not None:
                got = row[field] if row["median"] is not None else None
                out.append(
                    {
                        "target": what,
                        "fs": fs,
                        "ratio": got,
                        "need": need,
                        "met": got is not None and got <= need,
                        "unit": "ms",
                    }
                )
    return out


def suite_targets(suites: dict[str, dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """The targets measured by the suites run beside the harness (``bench.suites.TARGETS``)."""
    from bench.suites import TARGETS

    out: list[dict[str, Any]] = []
    for suite, what, figure, ref, need in TARGETS:
        for fs, figs in suites.get(suite, {}).items():
            got = figs.get(figure)
            if got is None:
                continue
            if ref is None:
                out.append(
                    {"target": what, "fs": fs, "ratio": got, "need": need,
                     "met": got <= need, "unit": "ms"}
                )  # fmt: skip
            elif figs.get(ref):
                ratio = got / figs[ref]
                out.append(
                    {"target": what, "fs": fs, "ratio": ratio, "need": need, "met": ratio >= need}
                )
    return out


def all_targets(results: list[dict[str, Any]], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The scenarios' targets and the suites' (their figures are in ``meta``)."""
    return targets(results) + suite_targets(meta.get("suites", {}))


def markdown(
    results: list[dict[str, Any]],
    meta: dict[str, Any],
    plots: list[str],
    *,
    title: bool = True,
    level: str = "##",
    prefix: str = "",
) -> str:
    """The results as Markdown; ``level`` and ``prefix`` let bench/README.md embed them."""
    lines = ["# fsbus benchmark results", ""] if title else []
    lines += [
        f"- {meta['date']}; {meta['machine']}; Python {meta['python']}",
        f"- plan **{meta['plan']}**, {meta['rounds']} interleaved rounds, median shown; "
        f"took {meta['seconds']} s",
        f"- command: `{meta['command']}`",
    ]
    if meta.get("suites_run"):
        lines.append(f"- the suites below (and their targets) run afterwards: {meta['suites_run']}")
    for fs, desc in meta["filesystems"].items():
        lines.append(f"- `{fs}`: {desc}")
    for name, why in meta.get("skipped", {}).items():
        lines.append(f"- skipped **{name}**: {why}")
    lines += [
        "",
        "Throughput in messages (records, topics) per second, higher is better; round trip "
        "in ms, lower is better. *vs raw* / *vs qlobber* are speed ratios (above 1 = faster "
        "than the reference) measured in the same run.",
    ]
    tgt = all_targets(results, meta)
    if tgt:
        lines += ["", f"{level} Targets", "", "| target | fs | measured | needed | met |"]
        lines.append("|---|---|---|---|---|")
        for t in tgt:
            unit = t.get("unit")
            got = (
                "—"
                if t["ratio"] is None
                else (f"{t['ratio']:.3g} ms" if unit == "ms" else f"{t['ratio']:.3g}x")
            )
            need = f"{t['need']:.2f} ms" if unit == "ms" else f"{t['need']:.2f}x"
            met = "yes" if t["met"] else "**no**"
            lines.append(f"| {t['target']} | {t['fs']} | {got} | {need} | {met} |")
    for fs in _ordered(r["fs"] for r in results):
        rows = [r for r in results if r["fs"] == fs]
        systems = _ordered(r["system"] for r in rows)
        lines += ["", f"{level} {fs}: {meta['filesystems'].get(fs, '')}", ""]
        head = " | ".join(systems)
        lines.append(f"| scenario | unit | {head} | fsbus vs raw | fsbus vs qlobber |")
        lines.append("|---|---|" + "---|" * len(systems) + "---|---|")
        for scen in _ordered(r["scenario"] for r in rows):
            cells = {r["system"]: r for r in rows if r["scenario"] == scen}
            first = next(iter(cells.values()))
            vals = []
            for s in systems:
                r = cells.get(s)
                if r is None:
                    vals.append("")
                elif not r["ok"]:
                    vals.append("fail")
                elif r["unit"] == "ms":
                    vals.append(f"{_fmt(r['median'], 'ms')} / {_fmt(r['p99'], 'ms')}")
                else:
                    vals.append(_fmt(r["median"], r["unit"]))
            fb = cells.get(FSBUS)
            unit = "ms p50 / p99" if first["unit"] == "ms" else first["unit"]
            lines.append(
                f"| {first['title']} | {unit} | "
                + " | ".join(vals)
                + f" | {_ratio(fb and fb.get('vs_raw'))} | {_ratio(fb and fb.get('vs_qlobber'))} |"
            )
        notes = [
            f"{r['system']} / {r['title']}: {'; '.join(r['notes'])}" for r in rows if r["notes"]
        ]
        if notes:
            lines += ["", "Notes:", *[f"- {n}" for n in notes]]
    lines += suites_markdown(meta.get("suites", {}), level=level)
    if plots:
        lines += ["", f"{level} Plots", ""]
        lines += [f"![{p}]({prefix}{p})" for p in plots]
    return "\n".join(lines) + "\n"


START, END = "<!-- results:start -->", "<!-- results:end -->"


def update_readme(readme: Path, out: Path) -> None:
    """Put the results in ``out`` into ``readme`` between the results markers."""
    data = json.loads((out / "results.json").read_text())
    rank = {"throughput": 0, "logs": 1, "latency": 2}

    def order(name: str) -> tuple[int, str]:
        return rank.get(name.split("-")[0].removesuffix(".png"), 9), name

    pngs = sorted((p.name for p in out.glob("*.png")), key=order)
    rel = f"{out.resolve().relative_to(readme.resolve().parent)}/"
    body = markdown(data["results"], data["meta"], pngs, title=False, level="###", prefix=rel)
    text = readme.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    readme.write_text(f"{head}{START}\n{body}{END}{tail}")


FIXED_COLOURS = {
    # fsbus in reds, its reference points in greys and orange, so the eye finds them
    "fsbus": "#d62728",
    "fsbus-poll": "#ff9896",
    "fsbus-streams": "#8c1c13",
    "raw": "#7f7f7f",
    "qlobber-fsq": "#ff7f0e",
    "redis": "#1f77b4",
    "redis-pipe": "#aec7e8",
    "rabbitmq": "#2ca02c",
}


SUITE_TITLES = {
    "streams": "Streams suite (bench/bench_streams.py: one process, 100 B records)",
    "async": (
        "Async suite (bench/bench_async.py: one process, 100 B messages, msg/s; "
        "the event loop's lag in ms)"
    ),
    "spark": "Spark suite (bench/bench_spark.py: local[2], 100 B records)",
}


def suites_markdown(
    suites: dict[str, dict[str, dict[str, float]]], *, level: str = "##"
) -> list[str]:
    """Tables for the suites run beside the harness (records per second, ratios)."""
    from bench.suites import RATIOS

    lines: list[str] = []
    for name, by_fs in suites.items():
        figs = {fs: f for fs, f in by_fs.items() if f}
        if not figs:
            continue
        cols = list(figs)
        lines += ["", f"{level} {SUITE_TITLES.get(name, name)}", ""]
        lines.append("| figure, records/s | " + " | ".join(cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for key in _ordered(k for f in figs.values() for k in f):
            unit = "ms" if ", ms" in key else "rec/s"  # (the async suite's loop lag)
            vals = [_fmt(figs[c].get(key), unit) for c in cols]
            lines.append(f"| {key} | " + " | ".join(vals) + " |")
        for a, b in RATIOS.get(name, []):
            vals = [
                _ratio(figs[c][a] / figs[c][b]) if figs[c].get(a) and figs[c].get(b) else "—"
                for c in cols
            ]
            lines.append(f"| *{a} / {b}* | " + " | ".join(vals) + " |")
    return lines


def plot(results: list[dict[str, Any]], out: Path) -> list[str]:
    """Throughput bars per filesystem and a latency chart; returns the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []
    systems = _ordered(r["system"] for r in results)
    others = iter(plt.get_cmap("tab20b")(i) for i in range(0, 20, 2))
    colours = {s: FIXED_COLOURS.get(s) or next(others, "grey") for s in systems}
    logs = ("append", "append_durable", "read")
    groups = [
        (fs, part, [r for r in results if r["fs"] == fs and r["unit"] == "msg/s"
                    and (r["kind"] in logs) == (part == "logs")])
        for fs in _ordered(r["fs"] for r in results)
        for part in ("messages", "logs")
    ]  # fmt: skip
    for fs, part, rows in groups:
        if not rows:
            continue
        scens = _ordered(r["scenario"] for r in rows)
        syss = _ordered(r["system"] for r in rows)
        width = 0.8 / max(1, len(syss))
        fig, ax = plt.subplots(figsize=(max(7, 1.5 * len(scens)), 5))
        for j, s in enumerate(syss):
            xs, ys = [], []
            for i, sc in enumerate(scens):
                r = next((x for x in rows if x["scenario"] == sc and x["system"] == s), None)
                if r is not None and r["median"]:
                    xs.append(i + j * width - 0.4 + width / 2)
                    ys.append(r["median"])
            ax.bar(xs, ys, width, label=s, color=colours[s])
        titles = [next(r["title"] for r in rows if r["scenario"] == sc) for sc in scens]
        ax.set_xticks(range(len(scens)), titles, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(f"{'records' if part == 'logs' else 'messages'} per second (log)")
        what = "Logs" if part == "logs" else "Messages"
        ax.set_title(f"{what} on {fs} (median of rounds, higher is better)")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        name = f"{'logs' if part == 'logs' else 'throughput'}-{fs}.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        names.append(name)
    lat = [r for r in results if r["unit"] == "ms" and r["median"]]
    if lat:
        fss = _ordered(r["fs"] for r in lat)
        keys = _ordered(f"{r['system']}|{r['kind']}" for r in lat)
        syss = [
            k.replace("|latency_inprocess", " (in process)")
            .replace("|latency_single", " (work queue)")
            .replace("|latency", "")
            for k in keys
        ]
        fig, axes = plt.subplots(1, len(fss), figsize=(5 * len(fss), 4.5), squeeze=False)
        for ax, fs in zip(axes[0], fss, strict=True):
            rows = [
                next((r for r in lat if r["fs"] == fs and f"{r['system']}|{r['kind']}" == k), None)
                for k in keys
            ]
            p50 = [r["median"] if r else 0 for r in rows]
            p99 = [r["p99"] or 0 if r else 0 for r in rows]
            xs = range(len(syss))
            ax.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
            ax.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
            ax.set_xticks(list(xs), syss, rotation=30, ha="right", fontsize=8)
            ax.set_yscale("log")
            ax.set_ylabel("round trip, ms (log)")
            ax.set_title(f"{fs} (lower is better)")
            ax.legend(fontsize=7)
            ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=90)
        plt.close(fig)
        names.append("latency.png")
    return names


def write(out: Path, results: list[dict[str, Any]], meta: dict[str, Any], *, plots: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    add_ratios(results)
    pngs = plot(results, out) if plots else []
    (out / "results.json").write_text(
        json.dumps(
            {"meta": meta, "targets": all_targets(results, meta), "results": results}, indent=1
        )
        + "\n"
    )
    (out / "results.md").write_text(markdown(results, meta, pngs))


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report [DIR] [--readme FILE]``: rebuild results.md and the plots
    from DIR/results.json (default bench/results), and optionally the README's summary."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.report", description=main.__doc__)
    ap.add_argument("out", nargs="?", default="bench/results")
    ap.add_argument("--readme", help="also put the results into this README")
    args = ap.parse_args(argv)
    out = Path(args.out)
    data = json.loads((out / "results.json").read_text())
    write(out, data["results"], data["meta"], plots=True)
    print(f"rewrote {out}/results.md and plots")
    if args.readme:
        update_readme(Path(args.readme), out)
        print(f"updated {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
