"""An AMQP 0-9-1 endpoint over a bus directory: RabbitMQ clients, unchanged.

    async with Gateway("/srv/bus", port=5672) as gw:
        ...  # pika, aio-pika, kombu, Celery, amqplib connect to gw.url

or from the shell: ``fsbus amqp --root /srv/bus --listen 127.0.0.1:5672``. Exchanges,
queues and bindings live in the directory, so every gateway on the bus (on any host)
serves the same ones; see the AMQP page of the docs for what maps onto what.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from ._server import Gateway, serve

if TYPE_CHECKING:
    from .. import BusConfig

__all__ = ["Gateway", "running", "serve"]


@contextlib.contextmanager
def running(
    root: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    users: Mapping[str, str] | None = None,
    config: BusConfig | None = None,
    disk_free_limit: int | None = None,
    inode_free_limit: int | None = None,
) -> Iterator[Gateway]:
    """A gateway on ``root`` served by an event loop in a thread of its own, for blocking
    code and tests: ``with running(root) as gw: pika.URLParameters(gw.url)``."""
    import anyio.from_thread

    with anyio.from_thread.start_blocking_portal() as portal:
        gateway = Gateway(
            root,
            host=host,
            port=port,
            users=users,
            config=config,
            disk_free_limit=disk_free_limit,
            inode_free_limit=inode_free_limit,
        )
        with portal.wrap_async_context_manager(gateway):
            yield gateway
