"""File and directory modes: configurable, and by default what the umask allows.

``BusConfig.file_mode`` / ``dir_mode`` set the mode of everything the bus creates
(message files, spills, headers, the UPDATE file, host records, every directory);
left at None, files get 0o666 and directories 0o777 less the process umask.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from fsbus import BlockingBus, BusConfig

from .conftest import run_python


def _modes(root: Path) -> tuple[set[int], set[int]]:
    files, dirs = set(), set()
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        (dirs if p.is_dir() else files).add(mode)
    return files, dirs


def _publish_everything(bus: BlockingBus) -> None:
    bus.publish("short", b"1")
    bus.publish("long." + "x" * 200, b"2", headers={"k": "v"}, single=True)


@pytest.mark.parametrize(("file_mode", "dir_mode"), [(0o640, 0o750), (0o660, 0o2770)])
def test_configured_modes_apply_to_every_file_and_directory(
    tmp_path: Path, file_mode: int, dir_mode: int
) -> None:
    root = tmp_path / "bus"
    with BlockingBus(root, config=BusConfig(file_mode=file_mode, dir_mode=dir_mode)) as bus:
        _publish_everything(bus)
    files, dirs = _modes(root)
    assert files == {file_mode}
    assert dirs == {dir_mode}


@pytest.mark.parametrize(
    ("umask", "file_mode", "dir_mode"), [(0o027, 0o640, 0o750), (0o002, 0o664, 0o775)]
)
def test_default_modes_honour_the_umask(
    tmp_path: Path, umask: int, file_mode: int, dir_mode: int
) -> None:
    root = tmp_path / "bus"
    proc = run_python(
        f"""
        import os
        os.umask({umask})
        from fsbus import BlockingBus
        with BlockingBus({str(root)!r}) as bus:
            bus.publish("short", b"1")
            bus.publish("long." + "x" * 200, b"2", headers={{"k": "v"}}, single=True)
        """
    )
    assert proc.returncode == 0, proc.stderr
    files, dirs = _modes(root)
    assert json.dumps(sorted(files)) == json.dumps([file_mode])
    assert dirs == {dir_mode}
