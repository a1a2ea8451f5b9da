"""The plugin as a user's test suite meets it: loaded by the pytest11 entry point alone.

Each test writes a small project (no conftest importing fsbus, pytest-asyncio in its
default strict mode beside the anyio plugin) into a temporary directory and runs pytest
on it in a new process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

USER_TESTS = """
import pytest

from fsbus import ClosedError
from fsbus.testing import wait_for_messages, wait_for_messages_blocking

kept = {}


@pytest.mark.asyncio
async def test_async_bus(fsbus_bus, fsbus_root):
    assert fsbus_bus.root == str(fsbus_root)
    await fsbus_bus.publish("orders.created", "1")
    [msg] = await wait_for_messages(fsbus_bus, "orders.*", 1)
    assert msg.text() == "1"
    kept["async"] = fsbus_bus


@pytest.mark.asyncio
async def test_async_bus_was_closed_and_this_one_is_fresh(fsbus_bus):
    with pytest.raises(ClosedError):
        await kept["async"].publish("orders.created", "2")
    assert [i async for i in fsbus_bus.browse()] == []


@pytest.mark.anyio  # the anyio plugin runs it once per installed backend: asyncio, trio
async def test_async_bus_under_anyio(fsbus_bus):
    await fsbus_bus.publish("orders.created", "1")
    [msg] = await wait_for_messages(fsbus_bus, "orders.*", 1)
    assert msg.text() == "1"


def test_blocking_bus(fsbus_blocking_bus):
    fsbus_blocking_bus.publish("jobs.run", "x", single=True)
    [job] = wait_for_messages_blocking(fsbus_blocking_bus, "jobs.*", 1)
    assert job.single
    kept["blocking"] = fsbus_blocking_bus


def test_blocking_bus_was_closed(fsbus_blocking_bus):
    with pytest.raises(ClosedError):
        kept["blocking"].publish("jobs.run", "y")
    assert list(fsbus_blocking_bus.browse()) == []


def test_config_is_overridden(fsbus_bus, fsbus_blocking_bus):
    assert fsbus_bus.config.multi_ttl == 7
    assert fsbus_blocking_bus.config.multi_ttl == 7


@pytest.mark.asyncio
async def test_a_timeout_fails_with_a_clear_message(fsbus_bus):
    await fsbus_bus.publish("a.b", "x")
    await wait_for_messages(fsbus_bus, "a.*", 3, timeout=0.2)


class TestRootIsAFile:
    @pytest.fixture
    def fsbus_root(self, tmp_path):
        path = tmp_path / "not-a-directory"
        path.write_text("x")
        return path

    @pytest.mark.asyncio
    async def test_opening_fails_at_setup(self, fsbus_bus):
        raise AssertionError("not reached")
"""

USER_CONFTEST = """
import pytest

from fsbus import BusConfig


@pytest.fixture
def fsbus_config():
    return BusConfig(multi_ttl=7)
"""


def run_user_suite(tmp_path: Path, files: dict[str, str]) -> tuple[dict[str, str], str]:
    """Run pytest on ``files`` in a fresh project; (outcome per test, output)."""
    project = tmp_path / "project"
    project.mkdir()
    for name, text in files.items():
        (project / name).write_text(text, encoding="utf-8")
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FSBUS_"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            f"--junitxml={report}",
            # its own temporary directory: the default one would make it clean up old
            # runs under the system's, which can take minutes and is none of its business
            f"--basetemp={tmp_path / 'basetemp'}",
            "-q",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[case.get("name", "")] = "failed" if failed else "passed"
    return outcomes, proc.stdout + proc.stderr


@pytest.mark.timeout(300)  # a pytest run in a new process, on a machine that may be busy
def test_fixtures_and_helpers_in_a_users_suite(tmp_path: Path) -> None:
    outcomes, output = run_user_suite(
        tmp_path, {"test_user.py": USER_TESTS, "conftest.py": USER_CONFTEST}
    )
    assert outcomes == {
        "test_async_bus": "passed",
        "test_async_bus_was_closed_and_this_one_is_fresh": "passed",
        "test_async_bus_under_anyio[asyncio]": "passed",
        "test_async_bus_under_anyio[trio]": "passed",
        "test_blocking_bus": "passed",
        "test_blocking_bus_was_closed": "passed",
        "test_config_is_overridden": "passed",
        "test_a_timeout_fails_with_a_clear_message": "failed",
        "test_opening_fails_at_setup": "failed",
    }, output
    assert "expected 3 messages on 'a.*' within 0.2 s, got 1: ['a.b' (multi, 1 B: b'x')]" in output
    assert "ERROR at setup of TestRootIsAFile.test_opening_fails_at_setup" in output
    assert "StorageError: creating the bus directory failed" in output
    assert "not reached" not in output


@pytest.mark.timeout(300)
def test_plugin_is_listed_with_its_fixtures(tmp_path: Path) -> None:
    project = tmp_path / "empty"
    project.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fixtures", "-q"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=240,
    )
    for name in ("fsbus_root", "fsbus_config", "fsbus_bus", "fsbus_blocking_bus"):
        assert name in proc.stdout, proc.stdout + proc.stderr
