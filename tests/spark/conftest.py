"""Spark for the connector tests: a local[2] session, and for the tests that prove the
connector beyond one JVM, a standalone cluster (Master and two Workers) and a Spark Connect
server on it, each started once per test session and only when a test asks for it.

A test runs on the cluster too when it is parametrized so:
``@pytest.mark.parametrize("spark", ["local", "cluster"], indirect=True)``. A process can
hold one SparkSession at a time, so the tests that ask for the cluster run after all the
others (see ``pytest_collection_modifyitems``): the session switches once. In the two
processes of ``make test`` (pytest-xdist), the local tests run in one and the cluster's
in one, each holding one session.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_cluster import Cluster, ConnectServer, connect_server, standalone_cluster
from spark_helpers import build_spark

KINDS = ("local", "cluster")
HERE = Path(__file__).parent


def needs_spark() -> None:
    pytest.importorskip("pyspark", reason="install the spark extra: pip install -e '.[spark]'")
    if shutil.which("java") is None:
        pytest.fail(
            "Java 17 is needed for the Spark tests: apt-get install openjdk-17-jre-headless"
        )


def on_cluster(item: pytest.Item) -> bool:
    """Whether ``item`` needs the standalone cluster (through a parameter or a fixture)."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    fixtures = getattr(item, "fixturenames", ())
    return "cluster" in params or "spark_cluster" in fixtures or "spark_connect" in fixtures


@pytest.hookimpl(tryfirst=True)  # the groups: before pytest-xdist reads them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=on_cluster)  # stable: the local tests keep their order, then the cluster's
    # make test's two processes: the local tests in one, the cluster's in one
    for item in items:
        if item.path.is_relative_to(HERE):
            kind = "cluster" if on_cluster(item) else "local"
            item.add_marker(pytest.mark.xdist_group(f"spark-{kind}"))


class Sessions:
    """The process's one SparkSession, of the kind the current test asks for."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.kind: str | None = None
        self.session: Any = None

    def get(self, kind: str, master: str) -> Any:
        if kind != self.kind:
            self.close()
            scratch, app = self.scratch / kind, f"fsbus-tests-{kind}"
            self.session = build_spark(scratch, app=app, master=master)
            self.kind = kind
        return self.session

    def close(self) -> None:
        if self.session is not None:
            self.session.stop()
        self.session = self.kind = None


@pytest.fixture(scope="session")
def spark_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    sessions = Sessions(tmp_path_factory.mktemp("spark"))
    yield sessions
    sessions.close()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Spark standalone cluster on 127.0.0.1 (up in ~10 s); stopped at the end of the
    session, and at once when it fails to start."""
    needs_spark()
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark_connect(
    spark_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectServer]:
    """A Spark Connect server (``sbin/start-connect-server.sh``) running its queries on the
    standalone cluster."""
    try:
        import grpc  # noqa: F401
    except ImportError:
        pytest.fail("the Spark Connect tests need the client's packages: pip install -e '.[dev]'")
    with connect_server(tmp_path_factory.mktemp("spark-connect"), spark_cluster.url) as server:
        yield server


@pytest.fixture
def spark(request: pytest.FixtureRequest, spark_sessions: Sessions) -> Any:
    """The SparkSession: local[2] unless the test is parametrized with ``"cluster"``
    (start-up takes several seconds, once per kind)."""
    kind = getattr(request, "param", "local")
    assert kind in KINDS, kind
    needs_spark()
    if kind == "cluster":
        cluster: Cluster = request.getfixturevalue("spark_cluster")
        return spark_sessions.get(kind, cluster.url)
    return spark_sessions.get(kind, "local[2]")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A fresh bus root for one test."""
    path = tmp_path / "bus"
    path.mkdir()
    return path
