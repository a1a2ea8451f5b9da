# Celery carries no annotations.
# mypy: disable-error-code="no-untyped-call,untyped-decorator"

"""The Celery app of the worker test: broker fsbus://$FSBUS_KOMBU_BUS, results in files.

The worker runs it as ``celery -A kombu_celery_app worker`` (cwd: this folder); the test
builds the same app with :func:`make_app` to send tasks.
"""

from __future__ import annotations

import os

from celery import Celery  # type: ignore[import-untyped]

import fsbus.kombu  # noqa: F401  (registers fsbus:// with kombu)


def make_app(bus: str, results: str) -> Celery:
    app = Celery("kombu_celery_app", broker=f"fsbus://{bus}", backend=f"file://{results}")
    app.conf.update(
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
    )

    @app.task(name="kombu_celery_app.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="kombu_celery_app.whoami")
    def whoami(n: int) -> list[int]:
        return [n, os.getpid()]

    return app


app = make_app(
    os.environ.get("FSBUS_KOMBU_BUS", "/nonexistent"),
    os.environ.get("FSBUS_KOMBU_RESULTS", "/nonexistent"),
)
