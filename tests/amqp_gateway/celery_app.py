"""The Celery app of tests/amqp_gateway/test_clients.py: ``add`` over an AMQP broker, results by rpc://.

The worker runs as ``celery -A tests.amqp_gateway.celery_app worker`` with the broker URL in
``FSBUS_CELERY_BROKER`` (and remote control off when ``FSBUS_CELERY_REMOTE_CONTROL=0``);
the test process builds its own client with :func:`make_app`.
Task names are explicit: the worker imports this module as ``tests.amqp_gateway.celery_app``,
pytest as ``amqp.celery_app``.
"""

from __future__ import annotations

import os

from celery import Celery

BROKER_ENV = "FSBUS_CELERY_BROKER"
REMOTE_CONTROL_ENV = "FSBUS_CELERY_REMOTE_CONTROL"
ADD = "fsbus_tests.add"


def make_app(broker_url: str, *, remote_control: bool = True) -> Celery:
    app = Celery("fsbus_tests", broker=broker_url, backend="rpc://", set_as_current=False)
    app.conf.update(
        broker_connection_retry_on_startup=False,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        # off: no pidbox queue ('<node name>.celery.pidbox') and no broadcast commands
        worker_enable_remote_control=remote_control,
    )

    @app.task(name=ADD)
    def add(x: int, y: int) -> int:
        return x + y

    return app


app = make_app(
    os.environ.get(BROKER_ENV, "amqp://guest:guest@127.0.0.1:5672//"),
    remote_control=os.environ.get(REMOTE_CONTROL_ENV, "1") != "0",
)
