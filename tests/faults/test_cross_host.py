"""Two "hosts" seeing one bus through two mounts of the same directory.

The sshfs tests run a private sshd in a network namespace of its own (a second "host"
reached over a veth pair) and mount the directory from it; where namespaces cannot be
made, the sshd listens on 127.0.0.1 instead (the filesystem semantics are sshfs's
either way).

bindfs (FUSE) gives a second and third view of one directory. Like two NFS clients,
inotify on one mount does not see writes made through the other, so delivery across
mounts relies on polling. ``--enable-lock-forwarding`` passes flock to the backing
directory, so locks exclude across mounts; without it each mount keeps its own locks
(as over sshfs), which :func:`fsbus.probe_locking` detects and ``locking="rename"``
survives. Needs root, /dev/fuse and bindfs (installed with apt when missing).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from fsbus import Bus, BusConfig, Message, probe_locking
from tests.bindfs_mounts import mount_pair

from .conftest import WAIT, Inbox, is_root, unmount, until

pytestmark = [pytest.mark.root, pytest.mark.slow]


@dataclass(frozen=True)
class Hosts:
    """One directory and two mounts of it."""

    backing: Path
    """The real directory."""
    a: Path
    """Mount seen by host A."""
    b: Path
    """Mount seen by host B."""


def _mounts(tmp_path: Path, *, forward_locks: bool) -> Iterator[Hosts]:
    for backing, a, b in mount_pair(tmp_path, forward_locks=forward_locks):
        yield Hosts(backing, a, b)


@pytest.fixture
def forwarding(tmp_path: Path) -> Iterator[Hosts]:
    """Two mounts that forward flock to the backing directory."""
    yield from _mounts(tmp_path, forward_locks=True)


@pytest.fixture
def local_locks(tmp_path: Path) -> Iterator[Hosts]:
    """Two mounts whose flocks stay local to each mount (like sshfs across hosts)."""
    yield from _mounts(tmp_path, forward_locks=False)


POLL = {"force_polling": True, "poll_interval": 0.05, "retry_interval": 0.05}


def test_probe_locking_tells_the_two_kinds_of_mount_apart(
    forwarding: Hosts, tmp_path: Path
) -> None:
    assert probe_locking(forwarding.a, forwarding.b) is True
    assert probe_locking(tmp_path, tmp_path) is True  # one local directory
    assert list(forwarding.backing.iterdir()) == []  # the probe cleans up


def test_probe_locking_finds_locks_that_stay_on_one_mount(local_locks: Hosts) -> None:
    assert probe_locking(local_locks.a, local_locks.b) is False


def test_probe_locking_refuses_two_different_directories(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    with pytest.raises(ValueError, match="not two paths to the same directory"):
        probe_locking(tmp_path / "x", tmp_path / "y")


@pytest.mark.anyio
async def test_publish_on_one_mount_is_delivered_on_the_other_by_polling(
    forwarding: Hosts,
) -> None:
    inbox = Inbox()
    cfg = BusConfig(bucket_num_chars=1, **POLL)
    async with Bus(forwarding.b, config=cfg) as reader, Bus(forwarding.a, config=cfg) as writer:
        await reader.subscribe("x.#", inbox)
        for i in range(20):
            await writer.publish(f"x.{i}", str(i).encode(), single=i % 2 == 0)
            await writer.publish("x.long." + "l" * 150, b"long")
        await inbox.wait(40)
        assert (
            sorted(m.payload for m in inbox.messages if m.topic.startswith("x.long"))
            == [b"long"] * 20
        )
        assert reader.statistics().inotify is False


async def _compete(a: Path, b: Path, cfg: BusConfig, count: int) -> Counter[str]:
    """Consumers on both mounts share a queue; returns how often each payload ran.

    The wait is for every handler to *finish*, not to start: a handler still running
    when its bus closes is cancelled and its message given back, and the other bus
    may then rightly run it again (at-least-once), which is not what this counts.
    """
    runs: Counter[str] = Counter()
    finished: set[str] = set()
    done = anyio.Event()

    async def handle(msg: Message) -> None:
        key = msg.payload.decode()
        runs[key] += 1
        await anyio.sleep(0.005)  # overlap the two consumers
        finished.add(key)
        if len(finished) >= count:
            done.set()

    async with Bus(a, config=cfg) as bus_a, Bus(b, config=cfg) as bus_b:
        await bus_a.subscribe("q.#", handle)
        await bus_b.subscribe("q.#", handle)
        for i in range(count):
            await (bus_a if i % 2 else bus_b).publish(f"q.{i % 3}", str(i).encode(), single=True)
        with anyio.fail_after(WAIT * 4):
            await done.wait()
        # Let late duplicates show: every message must be gone from both views.
        await until(lambda: not any((a / "messages").rglob("*@*")))
    return runs


@pytest.mark.anyio
async def test_flock_excludes_across_mounts_that_forward_locks(forwarding: Hosts) -> None:
    cfg = BusConfig(bucket_num_chars=1, handler_concurrency=4, **POLL)
    runs = await _compete(forwarding.a, forwarding.b, cfg, 150)
    assert set(runs) == {str(i) for i in range(150)}
    assert max(runs.values()) == 1


@pytest.mark.anyio
async def test_claim_by_rename_is_exact_where_locks_stay_local(local_locks: Hosts) -> None:
    cfg = BusConfig(bucket_num_chars=1, handler_concurrency=4, locking="rename", **POLL)
    runs = await _compete(local_locks.a, local_locks.b, cfg, 150)
    assert set(runs) == {str(i) for i in range(150)}
    assert max(runs.values()) == 1
    assert list((local_locks.backing / "fsbus" / "claims").rglob("*@*")) == []


def test_stress_fanout_and_chaos_across_mounts_that_forward_locks(
    forwarding: Hosts, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The stress scenarios with their processes spread over two mounts."""
    from stress import chaos, fanout

    monkeypatch.setenv("FSBUS_STRESS_DIR", str(tmp_path))
    roots = [str(forwarding.a), str(forwarding.b)]
    for run in (fanout.run, chaos.run):
        s = run("small", config={"force_polling": True}, roots=roots)
        assert s.ok, s.line() + "\n" + "\n".join(s.violations)


def test_stress_workqueue_by_rename_across_mounts_whose_locks_stay_local(
    local_locks: Hosts, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stress import workqueue

    monkeypatch.setenv("FSBUS_STRESS_DIR", str(tmp_path))
    roots = [str(local_locks.a), str(local_locks.b)]
    s = workqueue.run("small", config={"force_polling": True, "locking": "rename"}, roots=roots)
    assert s.ok, s.line() + "\n" + "\n".join(s.violations)
    assert s.delivered == s.sent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _second_host() -> Iterator[tuple[list[str], str]]:
    """(command prefix, address) of a network namespace reached over veth, or localhost."""
    tag = f"{os.getpid() % 100000}"
    ns, host_if, ns_if = f"fsbus-{tag}", f"fsb{tag}a", f"fsb{tag}b"
    net = f"10.213.{os.getpid() % 250}"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        ["ip", "link", "set", ns_if, "netns", ns],
        ["ip", "addr", "add", f"{net}.1/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/30", "dev", ns_if],
        ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ]
    ok = shutil.which("ip") is not None and all(
        subprocess.run(step, capture_output=True, check=False).returncode == 0 for step in steps
    )
    try:
        yield (["ip", "netns", "exec", ns], f"{net}.2") if ok else ([], "127.0.0.1")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)


@pytest.fixture
def sshfs_share(tmp_path: Path) -> Iterator[Hosts]:
    with _second_host() as (prefix, address):
        yield from _sshfs_share(tmp_path, prefix, address)


def _sshfs_share(tmp_path: Path, prefix: list[str], address: str) -> Iterator[Hosts]:
    """The backing directory (host B) and an sshfs mount of it (host A)."""
    if not is_root():
        pytest.skip("needs root to run sshd and mount sshfs")
    tools = {t: shutil.which(t) for t in ("sshfs", "ssh-keygen")}
    sshd = "/usr/sbin/sshd"
    if not all(tools.values()) or not os.path.exists(sshd) or not os.path.exists("/dev/fuse"):
        pytest.skip("needs sshfs, ssh-keygen, /usr/sbin/sshd and /dev/fuse")
    d = tmp_path / "ssh"
    backing, mnt = tmp_path / "backing", tmp_path / "sshfs"
    for p in (d, backing, mnt):
        p.mkdir()
    os.makedirs("/run/sshd", exist_ok=True)
    for key in ("hostkey", "id"):
        subprocess.run(
            [str(tools["ssh-keygen"]), "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)],
            check=True,
        )
    shutil.copy(d / "id.pub", d / "authorized_keys")
    port = _free_port()
    opts = {
        "Port": str(port),
        "ListenAddress": address,
        "HostKey": str(d / "hostkey"),
        "AuthorizedKeysFile": str(d / "authorized_keys"),
        "PidFile": str(d / "sshd.pid"),
        "StrictModes": "no",
        "PermitRootLogin": "prohibit-password",
        "UsePAM": "no",
        "Subsystem": "sftp internal-sftp",
    }
    cmd = [*prefix, sshd, "-D", "-e", "-f", "/dev/null"]
    for k, v in opts.items():
        cmd += ["-o", f"{k}={v}"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mounted = False
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection((address, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.skip("the private sshd did not start")
                time.sleep(0.05)
        ssh_opts = (
            f"IdentityFile={d / 'id'},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,"
            "BatchMode=yes,dir_cache=no"
        )
        proc = subprocess.run(
            [
                str(tools["sshfs"]),
                "-p",
                str(port),
                "-o",
                ssh_opts,
                f"root@{address}:{backing}",
                str(mnt),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0:
            pytest.skip(f"sshfs could not mount: {proc.stderr.strip()}")
        mounted = True
        yield Hosts(backing, mnt, backing)
    finally:
        if mounted:
            unmount(mnt)
        server.terminate()
        server.wait(15)


def test_sshfs_locks_do_not_cross_and_auto_claims_by_rename(sshfs_share: Hosts) -> None:
    from fsbus import BlockingBus
    from fsbus._bus.fs import filesystem_type

    a, b = sshfs_share.a, sshfs_share.b
    assert filesystem_type(str(a)) == "fuse.sshfs"
    assert probe_locking(a, b) is False
    cfg = BusConfig(bucket_num_chars=1, locking="auto", **POLL)
    with BlockingBus(a / "bus", config=cfg):
        pass
    assert (b / "bus" / "fsbus" / "claims").is_dir()  # the sshfs host chose rename
    with BlockingBus(b / "bus", config=cfg) as bus:
        # The host on the backing disk follows, so both kinds of claim never mix.
        assert bus.browse() is not None
    with BlockingBus(b / "other", config=cfg):
        pass
    assert not (b / "other" / "fsbus" / "claims").exists()  # local disk alone: flock


def test_stress_workqueue_over_sshfs_by_rename(
    sshfs_share: Hosts, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stress import workqueue

    monkeypatch.setenv("FSBUS_STRESS_DIR", str(tmp_path))
    roots = [str(sshfs_share.a), str(sshfs_share.b)]
    s = workqueue.run("small", config={"force_polling": True, "locking": "rename"}, roots=roots)
    assert s.ok, s.line() + "\n" + "\n".join(s.violations)
    assert s.delivered == s.sent


def test_sshfs_defaults_claim_by_rename_poll_and_refuse_streams(sshfs_share: Hosts) -> None:
    """The live stand-in for BeeGFS without global locks: flock stays on each client."""
    from fsbus import BlockingBus, LockingUnsupported, Stream, check_directory

    a, b = sshfs_share.a, sshfs_share.b
    with BlockingBus(a / "bus") as bus:  # default config: locking="auto"
        bus.publish("jobs.x", b"1", single=True)
        with bus.messages("jobs.#") as jobs:
            job = jobs.get(timeout=20)
            jobs.ack(job)
    assert (b / "bus" / "fsbus" / "claims").is_dir()
    with pytest.raises(LockingUnsupported, match="sshfs never forwards flock"):
        Stream.open(a, "log")
    fs = check_directory(a).check("filesystem")
    assert "polling only" in fs.detail
    assert "claim by rename" in fs.detail
    assert fs.status == "warn"
    assert "dir_cache=no" in fs.fix
