"""``fsbus ui``: a local web dashboard of a bus, in the spirit of RabbitMQ's management UI.

Served by the standard library's ``http.server`` (the ``ui`` extra needs nothing
else). Shows backlog and rates per topic and bucket, work-queue messages being
handled and by which process, streams with their segments and consumer groups, and
each message's headers and payload; purges work queues after confirmation with the
access token printed at start. Built on the public ``fsbus`` API.
"""

from __future__ import annotations

from ._cli import add_ui_command, run_ui
from ._server import UiServer
from ._snapshot import Dashboard, PurgeResult, Snapshot

__all__ = ["Dashboard", "PurgeResult", "Snapshot", "UiServer", "add_ui_command", "run_ui"]
