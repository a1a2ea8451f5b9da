"""Fixtures for the dashboard tests: a bus with some traffic and a server on a free port."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fsbus import BlockingBus
from fsbus.ui import UiServer

TOKEN = "test-token-123"


@dataclass(frozen=True)
class Response:
    """An HTTP response read whole."""

    status: int
    """HTTP status code."""
    headers: dict[str, str]
    """Response headers (last value wins)."""
    body: str
    """Body decoded as UTF-8."""

    def json(self) -> object:
        return json.loads(self.body)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def fetch(
    url: str,
    *,
    method: str = "GET",
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """Request ``url`` without following redirects; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with _opener.open(req, timeout=30) as resp:
            return Response(resp.status, dict(resp.headers), resp.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        return Response(err.code, dict(err.headers), err.read().decode("utf-8"))


@pytest.fixture
def bus_root(tmp_path: Path) -> Path:
    """A bus holding 5 multi messages, 3 work-queue messages and one binary message."""
    root = tmp_path / "bus"
    with BlockingBus(root) as bus:
        for i in range(5):
            bus.publish("orders.created", json.dumps({"id": i}), headers={"source": "shop"})
        for i in range(3):
            bus.publish("jobs.resize", f"img-{i}.png", single=True)
        bus.publish("blobs.raw", bytes(range(256)))
    return root


@pytest.fixture
def ui(bus_root: Path) -> Iterator[UiServer]:
    """The dashboard of ``bus_root``, served on a free port of 127.0.0.1."""
    with UiServer(str(bus_root), port=0, token=TOKEN) as server:
        server.start()
        yield server
