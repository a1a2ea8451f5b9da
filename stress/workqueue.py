"""Work queue: W competing worker processes, a fraction of handlers failing at random.

Failed handlers release their message, which is redelivered; every single message must
be completed exactly once and nothing may be left on the bus.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ._common import Summary, main_for
from ._queue import QueueSize, run_queue

__all__ = ["SIZES", "run"]

SIZES = {
    "small": QueueSize(2, 3, 150, 0.15, (0.0, 2.0), 0, 20_000, 60.0),
    "large": QueueSize(3, 6, 3_000, 0.15, (0.0, 2.0), 0, 200_000, 600.0),
}


def run(
    size: str,
    *,
    seed: int | None = None,
    config: dict[str, object] | None = None,
    roots: Sequence[str] | None = None,
    retry_when_full: bool = False,
) -> Summary:
    """Run the scenario in configuration ``size`` (``roots``: see ``--root``)."""
    return run_queue(
        "workqueue",
        size,
        SIZES[size],
        seed=seed,
        config=config,
        roots=roots,
        retry_when_full=retry_when_full,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m stress.workqueue [--size small|large]``."""
    return main_for("workqueue", run, argv)


if __name__ == "__main__":
    sys.exit(main())
