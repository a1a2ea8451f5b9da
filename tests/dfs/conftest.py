"""Session fixtures: a one-machine CephFS and GlusterFS, each seen through two clients.

``two_clients`` gives each test a fresh directory on one volume as two paths, ``a`` and
``b``, one per FUSE client: what two hosts sharing the volume see. The clusters start
once per session (2-3 s each here) and stop at its end, also when a test fails. Without
root or the Debian packages the tests skip, saying what to install.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .clusters import Cluster, ClusterUnavailable, start

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


@pytest.fixture(params=["ceph", "gluster"])
def two_clients(request: pytest.FixtureRequest) -> TwoClients:
    cluster: Cluster = request.getfixturevalue(request.param)
    name = f"t-{uuid.uuid4().hex[:12]}"
    (cluster.a / name).mkdir()
    return TwoClients(cluster, cluster.a / name, cluster.b / name)
