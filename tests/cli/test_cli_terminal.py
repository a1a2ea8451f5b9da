"""What the CLI draws on a real terminal (a pseudo-terminal): progress lines, top's screen."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli_helpers import TIMEOUT, cli_env


def read_until(fd: int, needle: bytes, proc: subprocess.Popen[bytes]) -> bytes:
    """Read the terminal until ``needle`` shows up (or the process ends / time runs out)."""
    seen = b""
    deadline = time.monotonic() + TIMEOUT
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    return seen


def test_bulk_publish_draws_progress_on_a_terminal(root: Path, tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"{i}\n" for i in range(300)))
    main, tty = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsbus", "publish", "tty.bulk", "--lines", str(lines)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=tty,
        env=cli_env(root),
    )
    os.close(tty)
    try:
        drawn = read_until(main, b"300/300 100%", proc)
        out, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        os.close(main)
    assert proc.returncode == 0
    assert b"publish tty.bulk [" in drawn
    assert b"300/300 100%" in drawn
    assert out.decode().startswith("published 300 message(s)")  # stdout stays clean


def test_top_redraws_the_screen_and_quits_on_ctrl_c(root: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "fsbus", "publish", "tty.topic", "x"],
        env=cli_env(root),
        check=True,
        timeout=TIMEOUT,
    )
    main, tty = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsbus", "top", "--interval", "0.1"],
        stdin=tty,
        stdout=tty,
        stderr=tty,
        env=cli_env(root),
    )
    os.close(tty)
    try:
        first = read_until(main, b"tty.topic", proc)
        second = read_until(main, b"tty.topic", proc)  # a later frame: it refreshes
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=TIMEOUT)
    finally:
        os.close(main)
    assert b"\x1b[H\x1b[2J" in first
    assert b"tty.topic" in second
    assert code == 0
