"""Fixtures: a mounted power-cut filesystem per module, and the sweep size."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .checks import TOTALS
from .harness import PowerCut, unavailable


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--powercut-sweep",
        action="store_true",
        default=False,
        help="power-cut tests: every cut point and many random ones (also FSBUS_POWERCUT_SWEEP=1)",
    )


@pytest.fixture(scope="session")
def sweep(request: pytest.FixtureRequest) -> bool:
    """True for the long sweep: thousands of cut points instead of a few hundred."""
    return bool(request.config.getoption("--powercut-sweep")) or (
        os.environ.get("FSBUS_POWERCUT_SWEEP", "") not in ("", "0")
    )


@pytest.fixture(scope="module")
def pfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PowerCut]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"power-cut filesystem unavailable: {why}")
    fs = PowerCut(tmp_path_factory.mktemp("powercut") / "mnt")
    fs.save("empty")
    try:
        yield fs
    finally:
        fs.close()


@pytest.fixture
def fresh(pfs: PowerCut) -> PowerCut:
    """The filesystem, empty again."""
    pfs.load("empty")
    return pfs


def _summary() -> str | None:
    if not TOTALS["cuts"]:
        return None
    return (
        f"power cuts: {TOTALS['cuts']} crash states checked, "
        f"{TOTALS['lost']} acknowledged writes lost, {TOTALS['corrupt']} corrupt states"
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    # in a pytest-xdist worker: the line goes to the main process, which prints it
    out = getattr(session.config, "workeroutput", None)
    line = _summary()
    if out is not None and line is not None:
        out.setdefault("summary_lines", []).append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    line = _summary()
    if line is not None and not hasattr(terminalreporter.config, "workeroutput"):
        terminalreporter.write_line(line)
