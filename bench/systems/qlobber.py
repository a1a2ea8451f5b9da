"""qlobber-fsq 14 (Node, from npm): the peer fsbus is on-disk compatible with.

Driven by ``bench/node/driver.js`` with qlobber-fsq's defaults (UPDATE polled every second
plus ``fs.watch``, 256 buckets); publishes keep 64 in flight, Node's natural style. The
``match`` scenario uses qlobber's ``QlobberDedup``, the matcher qlobber-fsq routes with.
The in-process scenarios run one Node process that subscribes and publishes (50 in flight).
``npm install`` runs in bench/node the first time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, ClassVar

from bench.scenarios import Kind
from bench.systems.base import System

NODE_DIR = Path(__file__).resolve().parent.parent / "node"


def ensure_node_modules() -> str | None:
    """Install the Node peers into bench/node if needed; return why it failed, or None."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are needed (apt-get install nodejs npm)"
    marker = NODE_DIR / "node_modules" / "qlobber-fsq" / "package.json"
    if not marker.exists():
        proc = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0 or not marker.exists():
            return f"npm install failed: {proc.stderr.strip()[-300:]}"
    return None


class QlobberFsq(System):
    name: ClassVar[str] = "qlobber-fsq"
    label: ClassVar[str] = "qlobber-fsq 14 (Node)"
    module: ClassVar[str] = "qlobber"
    kinds: ClassVar[frozenset[Kind]] = frozenset(
        {
            "publish",
            "fanout",
            "workqueue",
            "latency",
            "latency_single",
            "match",
            "inprocess",
            "inprocess_single",
            "latency_inprocess",
        }
    )

    def prepare(self) -> str | None:
        return ensure_node_modules()

    def command(self, role: str, params: dict[str, Any]) -> list[str]:
        return ["node", str(NODE_DIR / "driver.js"), role, json.dumps(params)]


ROLES: dict[str, Any] = {}
