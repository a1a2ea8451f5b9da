"""Fixtures of the AMQP tests: an fsbus gateway per test, a real RabbitMQ per session.

``broker`` runs a test against both: the gateway (on a fresh bus) and rabbitmq-server
(Debian's package, started on free ports with its data under the session's tmp dir), so
the same client code shows the same observable results on each. Names used on RabbitMQ
carry a per-test suffix (``names``): one server serves the whole session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fsbus.amqp import Gateway, running

START_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    """Where a test's clients connect: ``kind`` is "fsbus" or "rabbitmq"."""

    kind: str
    url: str
    host: str
    port: int
    root: Path | None = None
    gateway: Gateway | None = None


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A real rabbitmq-server for the session (skips, saying why, when it cannot run)."""
    pika = pytest.importorskip("pika")
    server = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    if not server.exists() and shutil.which("rabbitmq-server") is None:
        pytest.skip("rabbitmq-server is not installed (make test installs it with apt as root)")
    base = tmp_path_factory.mktemp("rabbitmq")
    (base / "enabled_plugins").write_text("[].\n")
    port = _free_port()
    env = {
        **os.environ,
        "HOME": str(base),
        "RABBITMQ_NODENAME": f"fsbustest{os.getpid()}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(_free_port()),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(base / "none"),
    }
    epmd_before = subprocess.run(["pgrep", "-x", "epmd"], capture_output=True).returncode == 0
    proc = subprocess.Popen(
        [str(server) if server.exists() else "rabbitmq-server"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    started = time.monotonic()
    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1)
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"rabbitmq-server exited ({proc.returncode}) while starting")
            try:
                pika.BlockingConnection(params).close()
                break
            except pika.exceptions.AMQPError:
                if time.monotonic() - started > START_TIMEOUT:
                    pytest.fail(f"rabbitmq-server did not answer within {START_TIMEOUT} s")
                time.sleep(0.2)
        yield Broker("rabbitmq", f"amqp://guest:guest@127.0.0.1:{port}/", "127.0.0.1", port)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if not epmd_before:
            subprocess.run(["epmd", "-kill"], capture_output=True, check=False)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Broker]:
    """An fsbus gateway on a fresh bus directory, on a free port."""
    root = tmp_path / "bus"
    with running(root) as gw:
        yield Broker("fsbus", gw.url, gw.host, gw.port, root, gw)


@pytest.fixture(params=["fsbus", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> Broker:
    """The gateway, then a real RabbitMQ: the same test runs against each."""
    if request.param == "fsbus":
        return request.getfixturevalue("gateway")  # type: ignore[no-any-return]
    return request.getfixturevalue("rabbitmq")  # type: ignore[no-any-return]


@pytest.fixture
def conn(broker: Broker) -> Iterator[Any]:
    """A pika connection to ``broker``, closed afterwards."""
    pika = pytest.importorskip("pika")
    c = pika.BlockingConnection(pika.URLParameters(broker.url))
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def names() -> Names:
    return Names(uuid.uuid4().hex[:8])


@dataclass
class Names:
    """Queue and exchange names unique to one test (RabbitMQ is shared by the session)."""

    suffix: str

    def __call__(self, base: str) -> str:
        return f"{base}-{self.suffix}"
