"""Chaos: work-queue workers SIGKILLed at random while handling, and replaced.

Nothing may be lost; a message may run twice only when a handler of it died with its
process (counted as ``dup_after_kill``); any other duplicate fails the run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ._common import Summary, main_for
from ._queue import QueueSize, run_queue

__all__ = ["SIZES", "run"]

SIZES = {
    "small": QueueSize(1, 3, 300, 0.05, (20.0, 80.0), 4, 20_000, 90.0, concurrency=2),
    "large": QueueSize(2, 6, 3_000, 0.05, (20.0, 80.0), 40, 200_000, 900.0, concurrency=4),
}


def run(
    size: str,
    *,
    seed: int | None = None,
    config: dict[str, object] | None = None,
    roots: Sequence[str] | None = None,
) -> Summary:
    """Run the scenario in configuration ``size`` (``roots``: see ``--root``)."""
    return run_queue("chaos", size, SIZES[size], seed=seed, config=config, roots=roots)


def main(argv: list[str] | None = None) -> int:
    """``python -m stress.chaos [--size small|large]``."""
    return main_for("chaos", run, argv)


if __name__ == "__main__":
    sys.exit(main())
