"""The power-cut filesystem drops exactly what was not synced, and keeps what was."""

from __future__ import annotations

import errno
import os

import pytest

from .harness import PowerCut
from .powerfs import S_DIR, PowerState


def sync(path: str) -> None:
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def put(path: str, data: bytes, *, fsync: bool = False, datasync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
        if datasync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_nothing_synced_nothing_survives(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    os.mkdir(f"{m}/d")
    put(f"{m}/d/f", b"data")
    os.symlink("f", f"{m}/d/l")
    fresh.restore()
    assert os.listdir(m) == []


def test_file_synced_but_not_its_directory_is_gone(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"data", fsync=True)
    fresh.restore()
    assert not os.path.exists(f"{m}/f")


def test_name_synced_but_not_data_comes_back_empty(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"data")
    sync(m)
    assert read(f"{m}/f") == b"data"
    fresh.restore()
    assert read(f"{m}/f") == b""


@pytest.mark.parametrize("how", ["fsync", "fdatasync"])
def test_file_and_directory_synced_survive(fresh: PowerCut, how: str) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"data", fsync=how == "fsync", datasync=how == "fdatasync")
    sync(m)
    fresh.restore()
    assert read(f"{m}/f") == b"data"


def test_writes_after_the_sync_are_lost(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"one", fsync=True)
    sync(m)
    with open(f"{m}/f", "ab") as f:
        f.write(b"two")
    with open(f"{m}/f", "r+b") as f:
        f.write(b"ONE")
    fresh.restore()
    assert read(f"{m}/f") == b"one"


def test_truncate_needs_the_file_sync(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"0123456789", fsync=True)
    put(f"{m}/g", b"0123456789", fsync=True)
    sync(m)
    os.truncate(f"{m}/f", 3)
    os.truncate(f"{m}/g", 4)
    sync(f"{m}/g")
    fresh.restore()
    assert read(f"{m}/f") == b"0123456789"
    assert read(f"{m}/g") == b"0123"


def test_rename_needs_both_directories(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    for d in ("both", "dst", "src"):
        os.makedirs(f"{m}/{d}/a")
        os.mkdir(f"{m}/{d}/b")
        sync(f"{m}/{d}")
        put(f"{m}/{d}/a/x", d.encode(), fsync=True)
        sync(f"{m}/{d}/a")
    sync(m)
    for d in ("both", "dst", "src"):
        os.rename(f"{m}/{d}/a/x", f"{m}/{d}/b/y")
    sync(f"{m}/both/a")
    sync(f"{m}/both/b")
    sync(f"{m}/dst/b")
    sync(f"{m}/src/a")
    fresh.restore()
    # both synced: only the new name
    assert os.listdir(f"{m}/both/a") == []
    assert read(f"{m}/both/b/y") == b"both"
    # only the target synced: the old name comes back too, one inode with two links
    assert read(f"{m}/dst/a/x") == read(f"{m}/dst/b/y") == b"dst"
    assert os.stat(f"{m}/dst/a/x").st_ino == os.stat(f"{m}/dst/b/y").st_ino
    assert os.stat(f"{m}/dst/b/y").st_nlink == 2
    # only the source synced: neither name
    assert os.listdir(f"{m}/src/a") == os.listdir(f"{m}/src/b") == []


def test_rename_over_a_file(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"old", fsync=True)
    sync(m)
    put(f"{m}/tmp", b"new", fsync=True)
    os.replace(f"{m}/tmp", f"{m}/f")
    fresh.restore()
    assert os.listdir(m) == ["f"]
    assert read(f"{m}/f") == b"old"
    put(f"{m}/tmp", b"new", fsync=True)
    os.replace(f"{m}/tmp", f"{m}/f")
    sync(m)
    fresh.restore()
    assert os.listdir(m) == ["f"]
    assert read(f"{m}/f") == b"new"


def test_unlink_needs_the_directory_sync(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"f", fsync=True)
    put(f"{m}/g", b"g", fsync=True)
    sync(m)
    os.unlink(f"{m}/f")
    os.unlink(f"{m}/g")
    fresh.restore()
    assert sorted(os.listdir(m)) == ["f", "g"]
    os.unlink(f"{m}/f")
    sync(m)
    fresh.restore()
    assert os.listdir(m) == ["g"]
    assert read(f"{m}/g") == b"g"


def test_mkdir_and_rmdir(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    os.makedirs(f"{m}/a/b")
    sync(m)
    put(f"{m}/a/b/f", b"x", fsync=True)
    sync(f"{m}/a/b")  # b's entries, but b's own name in a was never synced
    fresh.restore()
    assert os.listdir(f"{m}/a") == []
    os.mkdir(f"{m}/a/c")
    sync(f"{m}/a")
    os.rmdir(f"{m}/a/c")
    fresh.restore()
    assert os.listdir(f"{m}/a") == ["c"]


def test_hard_link_and_symlink(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"f", fsync=True)
    os.link(f"{m}/f", f"{m}/g")
    os.symlink("f", f"{m}/l")
    assert os.stat(f"{m}/f").st_nlink == 2
    sync(m)
    os.link(f"{m}/f", f"{m}/h")  # not synced
    fresh.restore()
    assert sorted(os.listdir(m)) == ["f", "g", "l"]
    assert os.stat(f"{m}/g").st_nlink == 2
    assert os.readlink(f"{m}/l") == "f"
    assert read(f"{m}/l") == b"f"


def test_mode_needs_fsync_not_fdatasync(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"f", fsync=True)
    put(f"{m}/g", b"g", fsync=True)
    sync(m)
    os.chmod(f"{m}/f", 0o600)
    os.chmod(f"{m}/g", 0o600)
    fd = os.open(f"{m}/f", os.O_RDONLY)
    os.fdatasync(fd)
    os.close(fd)
    sync(f"{m}/g")
    fresh.restore()
    assert os.stat(f"{m}/f").st_mode & 0o777 == 0o644
    assert os.stat(f"{m}/g").st_mode & 0o777 == 0o600


def test_open_unlinked_file_is_forgotten(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    fd = os.open(f"{m}/f", os.O_RDWR | os.O_CREAT, 0o644)
    sync(m)
    os.unlink(f"{m}/f")
    os.write(fd, b"still writable")
    os.fsync(fd)
    assert os.pread(fd, 100, 0) == b"still writable"
    os.close(fd)
    fresh.restore()
    assert read(f"{m}/f") == b"still writable"  # the unlink was not synced


def test_cut_after_the_kth_operation(fresh: PowerCut) -> None:
    """Operation k completes; everything after it fails until restore."""
    m = fresh.mountpoint
    put(f"{m}/f", b"", fsync=True)
    sync(m)
    fresh.arm(3)  # write, fsync, write: cut after the second write
    fd = os.open(f"{m}/f", os.O_WRONLY)
    os.write(fd, b"one")
    os.fsync(fd)
    os.write(fd, b"two")
    with pytest.raises(OSError, match="Input/output error") as info:
        os.write(fd, b"three")
    assert info.value.errno == errno.EIO
    with pytest.raises(OSError, match="Input/output error"):
        os.listdir(m)
    assert fresh.status()["dead"]
    os.close(fd)
    fresh.restore()
    assert read(f"{m}/f") == b"one"
    put(f"{m}/g", b"alive again")
    assert read(f"{m}/g") == b"alive again"


def test_cut_on_a_sync_keeps_it(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    fresh.arm(3)  # create, write, fsync
    put(f"{m}/f", b"x", fsync=True)
    with pytest.raises(OSError, match="Input/output error"):
        sync(m)
    fresh.restore()
    assert os.listdir(m) == []  # the name never reached its directory's sync


def test_save_and_load(fresh: PowerCut) -> None:
    m = fresh.mountpoint
    put(f"{m}/f", b"saved")
    fresh.sync()
    fresh.save("one")
    os.unlink(f"{m}/f")
    fresh.load("one")
    assert read(f"{m}/f") == b"saved"


# ALICE crash states, on the model directly -----------------------------------------------


def _model_publish(state: PowerState, *, durable: bool) -> None:
    """What a durable publish does: stage, write, fdatasync, rename, fsync the target."""
    state.create("/staging", 0o755, S_DIR)
    state.create("/bucket", 0o755, S_DIR)
    state.sync_all()
    state.start_trace()
    ino = state.create("/staging/m", 0o644)
    state.write(ino, b"\x00payload", 0)
    if durable:
        state.fsync(ino, True)
    state.rename("/staging/m", "/bucket/m")
    if durable:
        state.fsync(state.lookup_ino("/bucket"), False)


def test_crash_states_of_a_durable_publish() -> None:
    state = PowerState()
    _model_publish(state, durable=True)
    states = list(state.crash_states())
    finals = [tree for _, _, tree in state.crash_states(from_point=len(state.trace))]
    # after the directory sync the message is always there, complete
    assert finals
    assert all(tree["/bucket/m"]["data"] == b"\x00payload" for tree in finals)
    # before it, every state either lacks the message or has it complete
    for _, _, tree in states:
        if "/bucket/m" in tree:
            assert tree["/bucket/m"]["data"] == b"\x00payload"


def test_crash_states_of_a_plain_publish_include_torn_and_empty() -> None:
    state = PowerState()
    _model_publish(state, durable=False)
    seen = {tree["/bucket/m"]["data"] for _, _, tree in state.crash_states() if "/bucket/m" in tree}
    assert b"" in seen  # the rename reached the disk, the data did not
    assert b"\x00payload" in seen
    assert any(d and d != b"\x00payload" for d in seen)  # torn


def test_crash_states_respect_per_directory_order() -> None:
    state = PowerState()
    state.sync_all()
    state.start_trace()
    for name in ("a", "b", "c"):
        state.create(f"/{name}", 0o644)
    names = {tuple(sorted(tree)) for _, _, tree in state.crash_states()}
    assert names == {(), ("/a",), ("/a", "/b"), ("/a", "/b", "/c")}
