"""Naming the process behind an flock, from /proc/locks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fsbus.ui._locks import lock_owners, parse_proc_locks

HOLDER = """
import fcntl, sys
f = open(sys.argv[1], "r+b")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
sys.stdin.readline()
"""


def test_parse_proc_locks() -> None:
    lines = [
        "1: FLOCK  ADVISORY  WRITE 23581 fe:00:2163244 0 EOF",
        "1: -> FLOCK  ADVISORY  WRITE 999 fe:00:2163244 0 EOF",
        "2: POSIX  ADVISORY  READ 42 08:11:7 0 EOF",
        "3: OFDLCK ADVISORY  WRITE -1 08:01:9 0 EOF",
        "garbage",
    ]
    assert parse_proc_locks(lines) == {(0xFE, 0, 2163244): 23581, (8, 0x11, 7): 42}


def test_lock_owner_is_the_process_holding_the_flock(tmp_path: Path) -> None:
    path = tmp_path / "message"
    path.write_bytes(b"\x00payload")
    assert lock_owners([str(path)]) == {}
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "locked"
            owner = lock_owners([str(path), str(tmp_path / "missing")])[str(path)]
            assert owner.pid == holder.pid
            assert owner.name is not None
            assert owner.name.startswith("python")
            assert str(owner) == f"pid {holder.pid} ({owner.name})"
        finally:
            holder.kill()
    assert lock_owners([str(path)]) == {}
