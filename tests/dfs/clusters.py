"""One-machine CephFS and GlusterFS clusters, each with two FUSE clients.

Two FUSE mounts of one volume are two clients with their own caches and sessions: the
closest one machine gets to two hosts. Everything a cluster writes (configuration,
daemon data, logs, sockets, bricks) lives under one directory, and :meth:`stop` kills
its daemons and unmounts its clients, so nothing outlives the test session.

Run as root, with Debian's ceph-mon, ceph-osd, ceph-mds, ceph-fuse, ceph-common,
glusterfs-server and glusterfs-client (``make test`` installs them). By hand::

    python -m tests.dfs.clusters ceph /tmp/ceph    # starts, prints the mounts, waits
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CEPH_PACKAGES = "ceph-mon ceph-osd ceph-mds ceph-fuse ceph-common"
GLUSTER_PACKAGES = "glusterfs-server glusterfs-client"


class ClusterUnavailable(Exception):
    """This machine cannot run the cluster (not root, packages missing, no FUSE)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], *, timeout: float = 60, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}"
        )
    return proc.stdout


def _wait(check: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def _is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return any(line.split()[4] == target for line in f)


def _unmount(path: Path) -> None:
    for argv in (
        ["fusermount3", "-uz", str(path)],
        ["fusermount", "-uz", str(path)],
        ["umount", "-l", str(path)],
    ):
        if not _is_mounted(path):
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(argv, capture_output=True, timeout=20, check=False)


def _need(tools: list[str], packages: str) -> None:
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"needs root to run the cluster (apt-get install {packages})")
    if not os.path.exists("/dev/fuse"):
        raise ClusterUnavailable("needs /dev/fuse for the FUSE clients")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise ClusterUnavailable(
            f"{', '.join(missing)} not installed: apt-get install {packages} (make test "
            "installs them when run as root)"
        )


@dataclass
class Cluster:
    """A running volume and its two client mounts ``a`` and ``b``."""

    kind: str
    base: Path
    a: Path = field(init=False)
    b: Path = field(init=False)
    clients: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.a = self.base / "mnt-a"
        self.b = self.base / "mnt-b"

    def client_pid(self, which: str) -> int:
        """The FUSE client process serving mount ``"a"`` or ``"b"``."""
        return self.clients[which].pid

    def stop(self) -> None:
        for mnt in (self.a, self.b):
            _unmount(mnt)
        for proc in [*self.clients.values(), *self.daemons]:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self._stop_extra()

    def _stop_extra(self) -> None:
        pass


# ------------------------------------------------------------------ CephFS
class Ceph(Cluster):
    """One mon, one memstore OSD, one MDS, no manager; clients ``ceph-fuse --id a|b``."""

    def __init__(self, base: Path) -> None:
        super().__init__("ceph", base)
        self.conf = base / "ceph.conf"
        self.mds_id = "m"

    def ceph(self, *args: str, timeout: float = 30) -> str:
        return _run(["ceph", "-c", str(self.conf), *args], timeout=timeout)

    def start(self) -> Ceph:
        _need(
            ["ceph-mon", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph", "monmaptool"], CEPH_PACKAGES
        )
        b = self.base
        for d in ("run", "log", "mon/ceph-a", "osd/ceph-0", "mds/ceph-m"):
            (b / d).mkdir(parents=True, exist_ok=True)
        port, fsid = _free_port(), str(uuid.uuid4())
        self.conf.write_text(
            f"""[global]
fsid = {fsid}
mon host = v1:127.0.0.1:{port}
ms bind msgr2 = false
ms bind ipv6 = false
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 2147483648
run dir = {b}/run
admin socket = {b}/run/$name.asok
pid file = {b}/run/$name.pid
log file = {b}/log/$name.log
mon data = {b}/mon/$cluster-$id
osd data = {b}/osd/$cluster-$id
mds data = {b}/mds/$cluster-$id
paxos propose interval = 0.05
mds beacon interval = 1
mds tick interval = 0.2
mon osd full ratio = 0.99
mon osd nearfull ratio = 0.98
osd failsafe full ratio = 0.995
mds session autoclose = 300
client mount timeout = 30
"""
        )
        c = ["-c", str(self.conf)]
        _run(
            [
                "monmaptool",
                "--create",
                "--clobber",
                "--fsid",
                fsid,
                "--addv",
                "a",
                f"[v1:127.0.0.1:{port}]",
                str(b / "monmap"),
            ]
        )
        _run(["ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", str(b / "monmap")])
        self.daemons.append(
            subprocess.Popen(
                ["ceph-mon", *c, "-f", "-i", "a"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        osd_uuid = str(uuid.uuid4())
        osd_id = self.ceph("osd", "new", osd_uuid).strip()
        _run(["ceph-osd", *c, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid])
        self.daemons.append(
            subprocess.Popen(
                ["ceph-osd", *c, "-f", "-i", osd_id],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        _wait(
            lambda: '"num_up_osds":1' in self.ceph("osd", "stat", "--format=json").replace(" ", ""),
            "the OSD to be up",
            timeout=20,
        )
        self.ceph("osd", "pool", "create", "cephfs_data", "8")
        self.ceph("osd", "pool", "create", "cephfs_metadata", "8")
        self.ceph("fs", "new", "cephfs", "cephfs_metadata", "cephfs_data")
        self.daemons.append(
            subprocess.Popen(
                ["ceph-mds", *c, "-f", "-i", self.mds_id],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        _wait(lambda: "up:active" in self.ceph("mds", "stat"), "the MDS to be active", timeout=30)
        for which in ("a", "b"):
            self.mount(which)
        return self

    def mount(self, which: str) -> None:
        mnt = self.a if which == "a" else self.b
        mnt.mkdir(exist_ok=True)
        self.clients[which] = subprocess.Popen(
            ["ceph-fuse", "-c", str(self.conf), "--id", f"client{which}", "-f", str(mnt)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait(lambda: _is_mounted(mnt), f"ceph-fuse on {mnt}")

    def client_ids(self) -> list[str]:
        """The client sessions the MDS holds (one per mount)."""
        import json

        out = self.ceph("tell", f"mds.{self.mds_id}", "session", "ls", "--format=json")
        return sorted(str(s["id"]) for s in json.loads(out))

    def evict(self, which: str) -> None:
        """Make the MDS drop client ``which``'s session (and its locks) at once."""
        self.ceph(
            "tell",
            f"mds.{self.mds_id}",
            "client",
            "evict",
            f"client_metadata.entity_id=client{which}",
        )


# ------------------------------------------------------------------ GlusterFS
class Gluster(Cluster):
    """glusterd, one brick, caches off; clients are ``glusterfs`` FUSE processes."""

    def __init__(self, base: Path) -> None:
        super().__init__("gluster", base)
        self.volume = f"fsbus{os.getpid()}"
        self.glusterd: subprocess.Popen[bytes] | None = None

    def start(self) -> Gluster:
        _need(["glusterd", "gluster", "glusterfs"], GLUSTER_PACKAGES)
        host = socket.gethostname()
        try:
            socket.gethostbyname(host)
        except OSError as exc:
            raise ClusterUnavailable(f"the host name {host!r} does not resolve: {exc}") from exc
        brick = self.base / "brick"
        brick.mkdir(parents=True, exist_ok=True)
        if (
            shutil.which("pgrep")
            and subprocess.run(["pgrep", "-x", "glusterd"], capture_output=True).returncode == 0
        ):
            pass  # one glusterd per machine: reuse the running one
        else:
            self.glusterd = subprocess.Popen(
                ["glusterd", "-N", "--log-file", str(self.base / "glusterd.log")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        _wait(
            lambda: (
                subprocess.run(
                    ["gluster", "pool", "list"], capture_output=True, timeout=10
                ).returncode
                == 0
            ),
            "glusterd",
        )
        g = ["gluster", "--mode=script"]
        _run([*g, "volume", "create", self.volume, f"{host}:{brick}", "force"])
        _run([*g, "volume", "start", self.volume, "force"])
        for opt, val in (
            ("performance.quick-read", "off"),
            ("performance.io-cache", "off"),
            ("performance.read-ahead", "off"),
            ("performance.write-behind", "off"),
            ("performance.stat-prefetch", "off"),
            ("performance.open-behind", "off"),
            ("performance.readdir-ahead", "off"),
            ("performance.md-cache-timeout", "0"),
        ):
            _run([*g, "volume", "set", self.volume, opt, val])
        self._host = host
        for which in ("a", "b"):
            self.mount(which)
        return self

    def mount(self, which: str) -> None:
        mnt = self.a if which == "a" else self.b
        mnt.mkdir(exist_ok=True)
        self.clients[which] = subprocess.Popen(
            [
                "glusterfs",
                "-N",
                f"--volfile-server={self._host}",
                f"--volfile-id={self.volume}",
                "--attribute-timeout=0",
                "--entry-timeout=0",
                "--negative-timeout=0",
                "--fopen-keep-cache=false",
                f"--log-file={self.base}/client-{which}.log",
                str(mnt),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait(lambda: _is_mounted(mnt), f"glusterfs on {mnt}")

    def _stop_extra(self) -> None:
        g = ["gluster", "--mode=script"]
        with contextlib.suppress(Exception):
            _run([*g, "volume", "stop", self.volume, "force"], check=False)
            _run([*g, "volume", "delete", self.volume], check=False)
        # the brick server of this volume
        with contextlib.suppress(Exception):
            out = _run(["pgrep", "-f", f"glusterfsd.*{self.volume}"], check=False)
            for pid in out.split():
                os.kill(int(pid), signal.SIGKILL)
        if self.glusterd is not None and self.glusterd.poll() is None:
            self.glusterd.kill()
            self.glusterd.wait(10)


def start(kind: str, base: Path, *, attempts: int = 3) -> Cluster:
    """Start a cluster of ``kind`` ("ceph" or "gluster") under ``base``; stop() it after.

    A start that stalls (seen rarely on a loaded machine: an OSD refused by its monitor)
    is stopped and tried again from scratch in a fresh directory.
    """
    for attempt in range(1, attempts + 1):
        where = base / f"try{attempt}"
        where.mkdir(parents=True)
        cluster: Cluster = Ceph(where) if kind == "ceph" else Gluster(where)
        try:
            return cluster.start()  # type: ignore[attr-defined, no-any-return]
        except RuntimeError:
            cluster.stop()
            if attempt == attempts:
                raise
        except BaseException:
            cluster.stop()
            raise
    raise AssertionError("unreachable")


if __name__ == "__main__":
    import sys

    c = start(sys.argv[1], Path(sys.argv[2]))
    print(c.a, c.b, flush=True)
    try:
        signal.pause()
    finally:
        c.stop()
