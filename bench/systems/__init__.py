"""One module per benchmarked system; :data:`REGISTRY` names them for ``--systems``."""

from __future__ import annotations

import importlib

from bench.systems.base import Measurement, NotSupported, System

__all__ = ["DEFAULT", "REGISTRY", "Measurement", "NotSupported", "System", "load"]

REGISTRY: dict[str, tuple[str, str]] = {
    # name: (module, class)
    "raw": ("raw", "Raw"),
    "fsbus": ("fsbus_bus", "FsBus"),
    "fsbus-poll": ("fsbus_bus", "FsBusPolling"),
    "fsbus-streams": ("fsbus_streams", "FsBusStreams"),
    "qlobber-fsq": ("qlobber", "QlobberFsq"),
    "redis": ("redis_", "RedisSequential"),
    "redis-pipe": ("redis_", "RedisPipelined"),
    "rabbitmq": ("rabbitmq", "RabbitMQ"),
    "persist-queue": ("persist_queue", "PersistQueue"),
    "diskcache": ("diskcache_", "DiskCache"),
    "queuelib": ("queuelib_", "QueueLib"),
}
DEFAULT = tuple(REGISTRY)


def load(name: str) -> System:
    """An instance of the system registered as ``name``."""
    try:
        module, cls = REGISTRY[name]
    except KeyError:
        raise SystemExit(f"unknown system {name!r}; choose from {', '.join(REGISTRY)}") from None
    obj = getattr(importlib.import_module(f"bench.systems.{module}"), cls)()
    assert isinstance(obj, System)
    return obj
