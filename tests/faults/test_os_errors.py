"""EMFILE, EROFS and EACCES from the real kernel: clear errors, and the bus keeps going.

EMFILE comes from a lowered RLIMIT_NOFILE in a child process, EROFS from remounting a
tmpfs read-only, EACCES from a process running as another user (root only).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fsbus import BlockingBus, Bus, BusConfig, StorageError, StoragePermissionError

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
async def test_read_only_filesystem_is_refused_clearly_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
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
            with pytest.raises(StoragePermissionError, match="read-only") as caught:
                async with Bus(mnt / "bus", config=FAST):
                    pass
            assert caught.value.path is not None
            assert caught.value.path.startswith(str(mnt))
            with pytest.raises(StoragePermissionError, match="remount it read-write"):
                BlockingBus(mnt / "bus", config=FAST).__enter__()
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
