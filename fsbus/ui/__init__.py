"""``fsbus ui``: a local web dashboard of a bus, in the spirit of RabbitMQ's management UI.

Served by the standard library's ``http.server`` (the ``ui`` extra needs nothing
else). Shows backlog and rates per topic and bucket, durable queues with their depth,
consumers and rates, work-queue messages being handled and by which process, streams
with their segments and consumer groups, and each message's headers and payload;
purges work queues after confirmation with the access token printed at start. Built
on the public ``fsbus`` API.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from ._cli import add_ui_command, run_ui

if _typing.TYPE_CHECKING:
    from ._server import UiServer
    from ._snapshot import Dashboard, PurgeResult, Snapshot

__all__ = ["Dashboard", "PurgeResult", "Snapshot", "UiServer", "add_ui_command", "run_ui"]

# The server and the snapshot code (http.server, the Bus) are imported on first use
# (PEP 562): the CLI imports this package for ``add_ui_command`` on every run.
_LAZY = {
    "Dashboard": "._snapshot",
    "PurgeResult": "._snapshot",
    "Snapshot": "._snapshot",
    "UiServer": "._server",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fsbus.ui' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
