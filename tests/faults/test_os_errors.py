"""EMFILE, EROFS and EACCES from the real kernel: clear errors, and the bus keeps going.

EMFILE comes from a lowered RLIMIT_NOFILE in a child process, EROFS from remounting a
tmpfs read-only, EACCES from a process running as another user (root only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsbus import (
    BlockingBus,
    Bus,
    BusConfig,
    ClosedError,
    StorageError,
    StoragePermissionError,
)

from .conftest import NOBODY, Inbox, mount_tmpfs, run_python, unmount, until

FAST = BusConfig(bucket_num_chars=1, poll_interval=0.05, retry_interval=0.05)


def _remount(mnt: Path, how: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{how}", str(mnt)], check=True)


def test_too_many_open_files_is_a_clear_error_and_passes(tmp_path: Path) -> None:
    proc = run_python(
        f"""
        import json, os, resource
        from fsbus import BlockingBus, StorageError
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with BlockingBus({str(tmp_path / "bus")!r}) as bus:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
            hog = []
            try:
                while True:
                    hog.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                pass
            out = {{}}
            try:
                bus.publish("a.b", b"payload")
            except StorageError as exc:
                out["error"] = [type(exc).__name__, str(exc), exc.__cause__.errno]
            for fd in hog:
                os.close(fd)
            out["after"] = bus.publish("a.b", b"payload").size
            print(json.dumps(out))
        """
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    name, text, err = out["error"]
    assert name == "StorageError"
    assert "too many open files" in text
    assert "ulimit -n" in text
    assert err == 24  # EMFILE
    assert out["after"] == 7


@pytest.mark.root
@pytest.mark.anyio
async def test_a_read_only_filesystem_can_be_looked_at_and_refuses_writes_clearly(
    tmp_path: Path,
) -> None:
    """A bus on a read-only mount opens for looking (counts, listings, multi messages
    delivered), and each write is refused saying the mount is read-only; nothing on it
    is lost, and it works in full once remounted read-write."""
    # The kernel refuses a read-only remount while files are open for writing, so the
    # bus is closed around it, as after a filesystem error remounted it read-only.
    mnt = tmp_path / "ro"
    mount_tmpfs(mnt, "size=16m,mode=0755")
    try:
        with BlockingBus(mnt / "bus", config=FAST) as bus:
            for i in range(3):
                bus.publish(f"kept.{i}", str(i).encode(), single=i == 0)
        _remount(mnt, "ro")
        try:
            inbox = Inbox()
            async with Bus(mnt / "bus", config=FAST) as bus:
                assert len([m async for m in bus.browse("#")]) == 3
                await bus.subscribe("kept.#", inbox, existing=True, kind="multi")
                await inbox.wait(2)
                assert sorted(inbox.topics) == ["kept.1", "kept.2"]
                with pytest.raises(StoragePermissionError, match="read-only") as caught:
                    await bus.publish("new", b"x")
                assert caught.value.path is not None
                assert caught.value.path.startswith(str(mnt))
                with pytest.raises(StoragePermissionError, match="can only be read here"):
                    await bus.subscribe("kept.#", inbox)  # kind="any" takes work too
            with BlockingBus(mnt / "bus", config=FAST) as blocking:
                with pytest.raises(StoragePermissionError, match="remount it read-write"):
                    blocking.publish("new", b"x", single=True)
                with pytest.raises(StoragePermissionError, match="remount it read-write"):
                    blocking.declare_queue("q", ["kept.#"])
        finally:
            _remount(mnt, "rw")
        inbox = Inbox()
        async with Bus(mnt / "bus", config=FAST) as bus:
            await bus.subscribe("kept.#", inbox, existing=True)
            await inbox.wait(3)
            assert sorted(inbox.topics) == ["kept.0", "kept.1", "kept.2"]
            await bus.publish("after", b"3")
        await until(lambda: not any((mnt / "bus" / "messages").rglob("*@*+s+*")))
    finally:
        unmount(mnt)


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsbus", "--root", str(root), "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.root
def test_the_cli_inspects_a_read_only_bus_and_refuses_to_write_there(tmp_path: Path) -> None:
    """On a read-only mount (a monitoring host's), ``queue ls``, ``stats`` and ``ls``
    show the bus as it is; consuming a queue and purging one exit 1 with one line that
    says the mount is read-only and what works, and leave every message in place."""
    mnt = tmp_path / "ro"
    mount_tmpfs(mnt, "size=16m,mode=0755")
    root = mnt / "bus"
    try:
        with BlockingBus(root) as bus:  # (the CLI's format: no -o bucket_num_chars)
            bus.declare_queue("billing", ["orders.#"])
            for i in range(3):
                bus.publish(f"orders.{i}", str(i).encode())
        _remount(mnt, "ro")
        try:
            (queue,) = [json.loads(line) for line in _cli(root, "queue", "ls").stdout.splitlines()]
            assert (queue["name"], queue["depth"], queue["consumers"]) == ("billing", 3, 0)
            stats = json.loads(_cli(root, "stats").stdout)
            assert (stats["messages"], stats["queues"][0]["depth"]) == (3, 3)
            listed = [json.loads(line) for line in _cli(root, "ls").stdout.splitlines()]
            assert sorted(m["topic"] for m in listed) == ["orders.0", "orders.1", "orders.2"]
            doctor = _cli(root, "doctor")
            assert doctor.returncode == 1
            (layout,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "layout"]
            assert "mounted read-only" in layout["detail"]
            assert layout["fix"].startswith("remount it read-write")
            assert "can only be looked at" in layout["fix"]
            for args in (
                ("subscribe", "--queue", "billing", "--count", "1", "--timeout", "5"),
                ("queue", "purge", "billing"),
            ):
                proc = _cli(root, *args)
                assert proc.returncode == 1, proc
                (line,) = proc.stderr.splitlines()
                assert line.startswith("fsbus: error: ")
                for said in ("can only be read here", "Read-only file system"):
                    assert said in line
                for said in ("remount it read-write", "queue ls"):
                    assert said in line
                assert proc.stdout == ""
        finally:
            _remount(mnt, "rw")
        with BlockingBus(root) as bus:
            assert bus.queue_info("billing").depth == 3
    finally:
        unmount(mnt)


@pytest.mark.root
@pytest.mark.anyio
async def test_an_amqp_gateway_refuses_a_read_only_bus_and_stops_what_it_started(
    tmp_path: Path,
) -> None:
    """A gateway writes its exchanges and queues in the bus directory: on a read-only
    one it does not start, says so, and leaves nothing running (its bus is closed)."""
    from fsbus.amqp import Gateway

    mnt = tmp_path / "ro"
    mount_tmpfs(mnt, "size=16m,mode=0755")
    try:
        with BlockingBus(mnt / "bus"):
            pass
        _remount(mnt, "ro")
        try:
            gateway = Gateway(mnt / "bus", port=0)
            with pytest.raises(StoragePermissionError, match="cannot write there: Read-only"):
                async with gateway:
                    pass
            with pytest.raises(ClosedError):
                await gateway.bus.publish("t", b"x")
        finally:
            _remount(mnt, "rw")
    finally:
        unmount(mnt)


@pytest.mark.root
def test_another_user_without_write_access_gets_a_permission_error(shared_dir: Path) -> None:
    root = shared_dir / "bus"
    with BlockingBus(root, config=BusConfig(dir_mode=0o755, file_mode=0o644)) as bus:
        bus.publish("hello", b"from root")
    proc = run_python(
        f"""
        import json
        from fsbus import BlockingBus, StorageError
        try:
            with BlockingBus({str(root)!r}) as bus:
                bus.publish("x", b"y")
        except StorageError as exc:
            print(json.dumps([type(exc).__name__, str(exc), exc.path]))
        """,
        user=NOBODY,
    )
    assert proc.returncode == 0, proc.stderr
    name, text, path = json.loads(proc.stdout)
    assert name == "StoragePermissionError"
    assert "permission denied" in text
    assert "owner and mode" in text
    assert path.startswith(str(root))


@pytest.mark.root
def test_unreadable_files_of_another_user_do_not_stop_delivery(shared_dir: Path) -> None:
    """A root-only message among readable ones: the other user's subscriber skips it."""
    root = shared_dir / "bus"
    cfg = BusConfig(bucket_num_chars=1, dir_mode=0o777, file_mode=0o666)
    with BlockingBus(root, config=cfg) as bus:
        secret = bus.publish("t.secret", b"root only")
        secret_single = bus.publish("t.secret", b"root only", single=True)
    for info in (secret, secret_single):
        os.chmod(info.path, 0o600)
    proc = run_python(
        f"""
        import json, time
        from fsbus import BlockingBus, BusConfig
        cfg = BusConfig(bucket_num_chars=1, poll_interval=0.05, retry_interval=0.05,
                        file_mode=0o666)
        got = []
        with BlockingBus({str(root)!r}, config=cfg) as bus:
            with bus.messages("t.#", existing=True) as it:
                for i in range(6):
                    bus.publish("t.ok", str(i).encode(), single=i % 2 == 0)
                for _ in range(6):
                    msg = it.get(timeout=20)
                    got.append(msg.payload.decode())
                    it.ack(msg)
                try:
                    extra = it.get(timeout=1.0)
                    got.append("EXTRA " + extra.payload.decode())
                except TimeoutError:
                    pass
        print(json.dumps(sorted(got)))
        """,
        user=NOBODY,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [str(i) for i in range(6)]
    # Root's files are untouched by the other user.
    assert Path(secret.path).read_bytes() == b"\x00root only"
    assert Path(secret_single.path).read_bytes() == b"\x00root only"


def test_storage_error_names_are_in_the_tree() -> None:
    assert issubclass(StoragePermissionError, StorageError)
