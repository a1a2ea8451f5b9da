"""What the CLI prints: JSON lines, aligned tables, sizes, times and a progress line.

Everything goes out as UTF-8 bytes whatever the locale, one flush per line, so a
pipe reader sees each line as soon as it is complete.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = [
    "Progress",
    "emit",
    "emit_json",
    "format_age",
    "format_size",
    "format_table",
    "payload_fields",
]


def emit(text: str) -> None:
    """Write one line (a newline is added) to stdout as UTF-8 and flush."""
    out = sys.stdout.buffer
    out.write(text.encode("utf-8", "backslashreplace") + b"\n")
    out.flush()


def emit_json(obj: Any) -> None:
    """Write ``obj`` as one JSON line."""
    emit(json.dumps(obj, ensure_ascii=False, sort_keys=False, default=str))


def payload_fields(payload: bytes) -> dict[str, str]:
    """``{"payload": text}`` when the bytes are UTF-8, else ``{"payload_base64": ...}``."""
    try:
        return {"payload": payload.decode("utf-8")}
    except UnicodeDecodeError:
        return {"payload_base64": base64.b64encode(payload).decode("ascii")}


def format_size(n: float) -> str:
    """Bytes as a short human size: ``512 B``, ``1.5 KiB``, ``3.0 MiB``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def format_age(seconds: float) -> str:
    """A duration as ``45s``, ``12m``, ``3h``, ``2d`` (rounded down, at least ``0s``)."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172_800:
        return f"{s // 3600}h"
    return f"{s // 86_400}d"


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()
) -> list[str]:
    """Align ``rows`` under ``header``; columns whose index is in ``right`` align right."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


class Progress:
    """A one-line progress display on a terminal; silent when the stream is not a TTY.

    ``update(done)`` redraws at most ten times a second; ``close()`` ends the line.
    """

    def __init__(self, label: str, total: int | None, *, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = self._stream.isatty()
        self._label = label
        self._total = total
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False

    @property
    def enabled(self) -> bool:
        """Whether anything is drawn (the stream is a terminal)."""
        return self._enabled

    def update(self, done: int, *, force: bool = False) -> None:
        """Show that ``done`` items are finished."""
        if not self._enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        elapsed = now - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        if self._total:
            width = 24
            filled = min(width, done * width // self._total)
            bar = "#" * filled + "-" * (width - filled)
            pct = 100 * done // self._total
            text = f"{self._label} [{bar}] {done}/{self._total} {pct}% {rate:,.0f}/s"
        else:
            text = f"{self._label} {done} {rate:,.0f}/s {elapsed:.1f}s"
        self._stream.write("\r\x1b[2K" + text)
        self._stream.flush()
        self._drawn = True

    def close(self, done: int | None = None) -> None:
        """Draw the final state (if ``done`` is given) and end the line."""
        if not self._enabled:
            return
        if done is not None:
            self.update(done, force=True)
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
