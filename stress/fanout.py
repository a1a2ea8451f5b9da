"""Fan-out: P publisher processes x S subscriber processes, random bindings and payloads.

Every multi message must reach every subscriber with a matching binding exactly once
(one handler per subscriber process, several bindings each), with an intact payload.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ._common import (
    START_TIMEOUT,
    Summary,
    main_for,
    matches,
    random_pattern,
    random_topic,
    read_events,
    spawn,
    wait_until,
    workdir,
)
from ._roles import PublishJob, publisher, subscriber

__all__ = ["FanoutSize", "run"]


@dataclass(frozen=True)
class FanoutSize:
    """One configuration of the scenario."""

    publishers: int
    """Publisher processes."""
    subscribers: int
    """Subscriber processes."""
    per_publisher: int
    """Messages each publisher sends."""
    bindings: int
    """Bindings per subscriber."""
    max_size: int
    """Largest payload, bytes."""
    timeout: float
    """Seconds allowed for delivery after the last publish."""


SIZES = {
    "small": FanoutSize(2, 3, 100, 3, 200_000, 60.0),
    "large": FanoutSize(4, 6, 2_500, 4, 200_000, 600.0),
}


def run(
    size: str,
    *,
    seed: int | None = None,
    config: dict[str, object] | None = None,
    roots: Sequence[str] | None = None,
) -> Summary:
    """Run the scenario; ``config`` adds BusConfig options, ``roots`` see ``--root``."""
    sz = SIZES[size]
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    cfg: dict[str, object] = {"multi_ttl": 3600.0, **(config or {})}
    summary = Summary("fanout", size, notes={"seed": seed})
    ctx = spawn()
    with workdir(roots) as (wd, buses):
        logs = wd / "logs"
        logs.mkdir()
        bindings = [
            tuple(random_pattern(rng) for _ in range(sz.bindings)) for _ in range(sz.subscribers)
        ]
        stop = str(wd / "stop")
        readies = [ctx.Event() for _ in bindings]
        subs = [
            ctx.Process(
                target=subscriber,
                args=(buses[i % len(buses)], str(logs / f"sub{i}.log"), b, cfg, readies[i], stop),
            )
            for i, b in enumerate(bindings)
        ]
        for p in subs:
            p.start()
        try:
            for r in readies:
                if not r.wait(START_TIMEOUT):
                    summary.violations.append(
                        f"a subscriber did not start within {START_TIMEOUT:.0f} s"
                    )
                    return summary
            jobs = [
                PublishJob(
                    root=buses[(i + 1) % len(buses)],
                    log=str(logs / f"pub{i}.log"),
                    prefix=f"p{i}-",
                    topics=tuple((random_topic(rng), False, None) for _ in range(sz.per_publisher)),
                    seed=rng.randrange(1 << 30),
                    max_size=sz.max_size,
                    config=cfg,
                )
                for i in range(sz.publishers)
            ]
            t0 = time.monotonic()
            pubs = [ctx.Process(target=publisher, args=(j,)) for j in jobs]
            for p in pubs:
                p.start()
            for p in pubs:
                p.join()
                if p.exitcode != 0:
                    summary.violations.append(f"publisher exited with {p.exitcode}")
            topics = {
                f[1]: f[2] for _, f in read_events(sorted(logs.glob("pub*.log"))) if f[0] == "pub"
            }
            summary.sent = len(topics)
            expected = {
                f"sub{i}": {mid for mid, t in topics.items() if any(matches(b, t) for b in bs)}
                for i, bs in enumerate(bindings)
            }
            want = sum(len(v) for v in expected.values())

            def got_count() -> int:
                return sum(1 for _, f in read_events(logs.glob("sub*.log")) if f and f[0] == "got")

            wait_until(lambda: got_count() >= want, timeout=sz.timeout, step=0.2)
            summary.seconds = time.monotonic() - t0
            # A short grace period for duplicates to show up, bounded.
            time.sleep(0.5)
        finally:
            Path(stop).touch()
            for p in subs:
                p.join(30)
                if p.is_alive():
                    p.kill()
                    summary.violations.append("a subscriber did not stop within 30 s")
        received: dict[str, Counter[str]] = {s: Counter() for s in expected}
        for stem, f in read_events(logs.glob("sub*.log")):
            if f[0] != "got":
                continue
            received[stem][f[1]] += 1
            if f[2] != "ok":
                summary.violations.append(f"{stem}: payload of {f[1]} failed its checksum")
        for stem, want_ids in expected.items():
            got = received[stem]
            summary.delivered += sum(min(1, got[m]) for m in want_ids)
            summary.lost += sum(1 for m in want_ids if got[m] == 0)
            summary.duplicates += sum(n - 1 for n in got.values() if n > 1)
            stray = set(got) - want_ids
            if stray:
                summary.violations.append(
                    f"{stem} got {len(stray)} message(s) its bindings do not match"
                )
        summary.notes["expected"] = want
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m stress.fanout [--size small|large]``."""
    return main_for("fanout", run, argv)


if __name__ == "__main__":
    sys.exit(main())
