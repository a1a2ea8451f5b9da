"""A garbage-collector process for the mixed scenario: ``gc()`` in a loop until told to stop."""

from __future__ import annotations

import os
import time
from typing import Any

from fsbus import BlockingBus, BusConfig

from ._common import EventLog

__all__ = ["collector"]


def collector(root: str, log_path: str, config: dict[str, Any], stop: str, every: float) -> None:
    """Run ``BlockingBus.gc`` every ``every`` seconds; log ``gc <removed>`` per round."""
    log = EventLog(log_path)
    with BlockingBus(root, config=BusConfig(**config)) as bus:
        while not os.path.exists(stop):
            log.write("gc", bus.gc())
            time.sleep(every)
    log.close()
