"""Drive the power-cut filesystem (:mod:`tests.powercut.powerfs`) from a test.

:class:`PowerCut` mounts it in a child process and sends it commands: arm a cut after
the k-th mutating operation, cut now, restore what was durable, sync everything, save
and load whole states (so each run starts from the same synced bus without building it
again), trace and enumerate ALICE crash states.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def unavailable() -> str | None:
    """Why the filesystem cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "fusermount3 missing (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: libfuse not found
        return f"mfusepy unusable: {exc}"
    return None


class PowerCut:
    """One mounted power-cut filesystem."""

    def __init__(self, mountpoint: str | os.PathLike[str]) -> None:
        self.mountpoint = str(mountpoint)
        self._lock = threading.Lock()  # one command at a time (a test's thread and the bus's)
        os.makedirs(self.mountpoint, exist_ok=True)
        self._log = open(os.path.join(os.path.dirname(self.mountpoint), "powerfs.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "powerfs.py"), self.mountpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                log = Path(self._log.name).read_text(errors="replace")
                raise RuntimeError(f"powerfs did not mount: {log[-2000:]}")
            time.sleep(0.02)

    def command(self, cmd: str, **args: Any) -> Any:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("powerfs exited")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"powerfs {cmd}: {reply['error']}")
        return reply["result"]

    def arm(self, k: int) -> None:
        """Cut the power right after the k-th mutating operation from now."""
        self.command("arm", at=k)

    def cut(self) -> None:
        self.command("cut")

    def restore(self) -> None:
        """Come back up with exactly what was durable."""
        self.command("restore")

    def sync(self) -> None:
        self.command("sync")

    def save(self, name: str) -> None:
        self.command("save", name=name)

    def load(self, name: str) -> None:
        self.command("load", name=name)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.command("status")
        return result

    def close(self) -> None:
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], check=False)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
