"""End to end in headless Chromium: the main page renders, with the expected content.

Uses Debian's ``chromium`` package: installed with apt-get when the tests run as root
and it is missing, otherwise the test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from fsbus.ui import UiServer

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1280,900",
]


def _apt_install_chromium() -> str | None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (
        ["apt-get", "install", "-y", "-q", "chromium"],
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "chromium"],
    ):
        done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode == 0 and step[1] == "install":
            break
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of the chromium binary."""
    found = shutil.which("chromium")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        found = _apt_install_chromium()
    if found is None:
        pytest.skip(
            "Debian's chromium is not installed and cannot be installed here "
            "(needs root and apt-get): apt-get install chromium"
        )
    return found


def _run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8, f"bit depth {depth}"
    assert color in (2, 6), f"color type {color}"
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        row = bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = row[i - bpp] if i >= bpp else 0
            up = prev[i]
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                ul = prev[i - bpp] if i >= bpp else 0
                p = left + up - ul
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else ul
                row[i] = (row[i] + pred) & 0xFF
        rows.append(bytes(row))
        prev = row
    return width, height, rows


@pytest.mark.timeout(1200)  # the first run may apt-get install chromium
def test_main_page_in_headless_chromium(ui: UiServer, chromium: str, tmp_path: Path) -> None:
    shot = tmp_path / "overview.png"
    _run_chromium(chromium, tmp_path / "profile-shot", f"--screenshot={shot}", ui.url)
    width, height, rows = decode_png(shot.read_bytes())
    assert (width, height) == (1280, 900)
    bpp = len(rows[0]) // width
    pixels = [row[i : i + 3] for row in rows[::4] for i in range(0, len(row), bpp * 4)]
    background = max(set(pixels), key=pixels.count)
    inked = sum(1 for p in pixels if p != background) / len(pixels)
    assert len(set(pixels)) > 20, "the screenshot is (nearly) one colour"
    assert 0.03 < inked < 0.9, f"{inked:.0%} of the page differs from its background"
    # The dark header band is drawn across the top.
    header = rows[10][: 3 * bpp]
    assert max(header) < 80, f"header pixel {header!r} is not dark"

    dom = _run_chromium(chromium, tmp_path / "profile-dom", "--dump-dom", ui.url).stdout
    for text in ("orders.created", "jobs.resize", "blobs.raw", "Work queue", "Streams"):
        assert text in dom, f"{text!r} missing from the rendered page"
    assert 'id="autorefresh"' in dom
