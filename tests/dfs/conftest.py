"""Session fixtures: a one-machine CephFS and GlusterFS, each seen through two clients.

``two_clients`` gives each test a fresh directory on one volume as two paths, ``a`` and
``b``, one per FUSE client: what two hosts sharing the volume see. The clusters start
once per session (2-3 s each here) and stop at its end, also when a test fails. Without
root or the Debian packages the tests skip, saying what to install.

The Spark tests here use the helpers of tests/spark (put on ``sys.path`` below, as pytest
does for that directory) and its standalone cluster: ``spark_cluster`` is the same cluster
tests/spark/conftest.py gives, started once per session whichever directory asks first
(see ``spark_cluster.standalone_cluster``).
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .clusters import Cluster, ClusterUnavailable, start

SPARK_TESTS = str(Path(__file__).resolve().parent.parent / "spark")
if SPARK_TESTS not in sys.path:
    sys.path.insert(0, SPARK_TESTS)

import spark_cluster as spark_cluster_module  # noqa: E402  (needs the path above)

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _cluster(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp(kind)
    try:
        cluster = start(kind, base)
    except ClusterUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running CephFS: one mon, one memstore OSD, one MDS; two ceph-fuse clients."""
    yield from _cluster("ceph", tmp_path_factory)


@pytest.fixture(scope="session")
def gluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running GlusterFS volume (caches off); two glusterfs FUSE clients."""
    yield from _cluster("gluster", tmp_path_factory)


@dataclass(frozen=True)
class TwoClients:
    """One fresh directory of a volume, through client A and through client B."""

    cluster: Cluster
    a: Path
    b: Path

    @property
    def kind(self) -> str:
        return self.cluster.kind


def fresh_directory(cluster: Cluster) -> TwoClients:
    """A new directory of ``cluster``'s volume, made through client A."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    (cluster.a / name).mkdir()
    return TwoClients(cluster, cluster.a / name, cluster.b / name)


@pytest.fixture(params=["ceph", "gluster"])
def two_clients(request: pytest.FixtureRequest) -> TwoClients:
    return fresh_directory(request.getfixturevalue(request.param))


@pytest.fixture(scope="session")
def spark_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[spark_cluster_module.Cluster]:
    """The Spark standalone cluster of tests/spark (Master and two Workers on 127.0.0.1)."""
    pytest.importorskip("pyspark", reason="install the spark extra: pip install -e '.[spark]'")
    if shutil.which("java") is None:
        pytest.fail(
            "Java 17 is needed for the Spark tests: apt-get install openjdk-17-jre-headless"
        )
    scratch = tmp_path_factory.mktemp("spark-cluster")
    with spark_cluster_module.standalone_cluster(scratch) as cluster:
        yield cluster
