"""What every benchmarked system provides, and the one way scenarios are run on it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bench.procs import python_cmd, run_flow, run_pair, run_single
from bench.scenarios import IN_FLIGHT, Kind, Scenario


@dataclass(frozen=True)
class Measurement:
    """One system, one scenario, one round."""

    value: float | None
    """Messages (records, topics) per second; for latency the p50 in ms. None: failed."""
    p99: float | None = None
    """Latency only: the 99th percentile in ms."""
    ok: bool = True
    """False when a message was lost, duplicated where forbidden, or the run failed."""
    note: str = ""
    """Why it failed, or what else is worth knowing (e.g. publish-side rate)."""
    extra: dict[str, float] = field(default_factory=dict)
    """Secondary figures (e.g. one-way latency, publisher-side rate)."""


class NotSupported(Exception):
    """The system has no counterpart for this scenario."""


class System:
    """A benchmarked system. Subclasses name their roles; :meth:`run` does the rest.

    Python systems implement roles as functions in ``ROLES`` of their module (run by
    :mod:`bench.child`); other systems override :meth:`command`.
    """

    name: ClassVar[str]
    """Short identifier used on the command line and in the JSON."""
    label: ClassVar[str]
    """Shown in tables and plots."""
    module: ClassVar[str]
    """Module under ``bench.systems`` whose ROLES run the children."""
    kinds: ClassVar[frozenset[Kind]]
    """Scenario kinds this system has a fair counterpart for."""
    uses_fs: ClassVar[bool] = True
    """False for servers keeping data in memory (Redis, RabbitMQ): the filesystem is moot."""
    max_consumers: ClassVar[int] = 64
    """Largest number of consumer processes it supports."""
    extra_params: ClassVar[dict[str, Any]] = {}
    """Passed to every child (e.g. a variant switch)."""
    latency_probes: ClassVar[int | None] = None
    """At most this many round trips (systems that poll take ~100 ms each)."""

    def prepare(self) -> str | None:
        """Get ready for the whole run (install, start servers). Returns why not, or None."""
        return None

    def close(self) -> None:
        """Undo :meth:`prepare` (stop servers)."""

    def supports(self, sc: Scenario) -> bool:
        return sc.kind in self.kinds and sc.consumers <= self.max_consumers

    def command(self, role: str, params: dict[str, Any]) -> list[str]:
        return python_cmd(self.module, role, {**self.extra_params, **params})

    def run(self, sc: Scenario, workdir: Path, *, timeout: float) -> Measurement:
        base: dict[str, Any] = {"dir": str(workdir), "n": sc.count, "size": sc.payload}
        kind = sc.kind
        if kind in ("publish", "publish_durable"):
            res = run_single(
                self.command("pub", {**base, "durable": kind == "publish_durable"}),
                timeout=timeout,
            )
            return _rate(sc.count, res)
        if kind in ("append", "append_durable", "read"):
            role = "read" if kind == "read" else "append"
            res = run_single(
                self.command(role, {**base, "durable": kind == "append_durable"}),
                timeout=timeout,
            )
            return _rate(sc.count, res)
        if kind in ("fanout", "workqueue"):
            shared = kind == "workqueue"
            role = "worker" if shared else "sub"
            cons = [
                self.command(role, {**base, "expect": None if shared else sc.count, "k": k})
                for k in range(sc.consumers)
            ]
            pub = self.command("pub", {**base, "single": shared, "flow": True})
            flow = run_flow(pub, cons, count=sc.count, shared=shared, timeout=timeout)
            ok = flow.missing == 0 and flow.duplicates == 0
            notes = []
            if flow.missing:
                notes.append(f"{flow.missing} lost")
            if flow.duplicates:
                notes.append(f"{flow.duplicates} duplicated")
            return Measurement(
                sc.count / flow.seconds if ok else None,
                ok=ok,
                note=", ".join(notes),
                extra={"publisher_rate": sc.count / max(flow.publish_seconds, 1e-9)},
            )
        if kind in ("latency", "latency_single"):
            base["single"] = kind == "latency_single"
            if self.latency_probes is not None:
                base["n"] = min(sc.count, self.latency_probes)
            res = run_pair(self.command("echo", base), self.command("ping", base), timeout=timeout)
            rtt = sorted(float(x) / 1e6 for x in res["rtt_ns"])
            one = sorted(float(x) / 1e6 for x in res["oneway_ns"])
            return Measurement(
                _pct(rtt, 50),
                p99=_pct(rtt, 99),
                extra={"oneway_p50": _pct(one, 50), "oneway_p99": _pct(one, 99)},
            )
        if kind in ("inprocess", "inprocess_single"):
            # one process subscribes and publishes with IN_FLIGHT publishes outstanding;
            # end to end: count / (last receipt - first publish), every message once
            res = run_single(
                self.command(
                    "inprocess",
                    {**base, "single": kind == "inprocess_single", "window": IN_FLIGHT},
                ),
                timeout=timeout,
            )
            return _inprocess(sc.count, res)
        if kind == "latency_inprocess":
            res = run_single(self.command("inprocess_ping", base), timeout=timeout)
            rtt = sorted(float(x) / 1e6 for x in res["rtt_ns"])
            return Measurement(_pct(rtt, 50), p99=_pct(rtt, 99))
        if kind == "match":
            res = run_single(
                self.command("match", {"file": str(workdir.parent / "match.json")}), timeout=timeout
            )
            return Measurement(
                sc.count / res["seconds"],
                extra={"matches": float(res["matches"]), "add_seconds": res["add_seconds"]},
            )
        raise NotSupported(kind)


def _rate(n: int, res: dict[str, Any]) -> Measurement:
    secs = (int(res["t1_ns"]) - int(res["t0_ns"])) / 1e9
    return Measurement(n / secs)


def _inprocess(n: int, res: dict[str, Any]) -> Measurement:
    ids = [int(x) for x in res["ids"]]
    missing = len(set(range(n)) - set(ids))
    duplicates = len(ids) - len(set(ids))
    notes = []
    if missing:
        notes.append(f"{missing} lost")
    if duplicates:
        notes.append(f"{duplicates} duplicated")
    ok = not notes
    t0, t1, t_pub = int(res["t0_ns"]), int(res["last_ns"]), int(res["published_ns"])
    return Measurement(
        n / ((t1 - t0) / 1e9) if ok else None,
        ok=ok,
        note=", ".join(notes),
        extra={"publisher_rate": n / max((t_pub - t0) / 1e9, 1e-9)},
    )


def _pct(values: list[float], p: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]
