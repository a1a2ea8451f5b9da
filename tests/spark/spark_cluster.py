"""A Spark standalone cluster and a Spark Connect server, started from the pip-installed
PySpark for the tests that must run beyond ``local[2]`` (no pytest needed here).

The cluster is a Master and two Workers on 127.0.0.1, each its own JVM, on ports picked
free, logs and work directories under one scratch directory. Executors run in JVMs the
Workers start, and their Python workers are forked from those, so a task never shares a
process with the driver. Each Worker offers three cores and 1.5 GiB: enough for three
applications at once (the tests' own driver, a child driver and the Connect server), each
given one single-core 512 MiB executor per Worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKERS = 2
WORKER_CORES = 3
WORKER_MEMORY = "1536m"
EXECUTOR_MEMORY = "512m"
DAEMON_MEMORY = "256m"
START_TIMEOUT = 180.0
"""Seconds to wait for a daemon to come up (far more than the ~15 s it takes here)."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def daemon_env(scratch: Path) -> dict[str, str]:
    """Environment for the cluster's daemons and the Connect server."""
    conf = scratch / "conf"  # empty: nothing from the machine's Spark set-up leaks in
    conf.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(scratch / "logs"),
        "SPARK_PID_DIR": str(scratch / "pids"),
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={scratch}",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def app_conf(scratch: Path) -> dict[str, str]:
    """Settings for an application on the cluster: one small executor per Worker."""
    return {
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.executor.cores": "1",
        "spark.cores.max": str(WORKERS),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
        "spark.pyspark.python": sys.executable,
    }


class Daemon:
    """One JVM started through a Spark script, in its own process group."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM the group (the JVMs shut down cleanly), SIGKILL what is left after 20 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        # The group outlives its leader when a child (the JVM under a shell script) lingers.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait()


def wait_for(condition: Callable[[], bool], daemons: list[Daemon], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        for daemon in daemons:
            daemon.check_alive()
        try:
            if condition():
                return
        except (OSError, ValueError):
            # not listening yet, or answering with a page that is not the JSON asked for
            # (a master's web UI served HTML at /json/ once in CI, while starting)
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {START_TIMEOUT} s waiting for {what}")
        time.sleep(0.25)


@dataclass(frozen=True)
class Cluster:
    url: str
    """The Master's URL, ``spark://127.0.0.1:<port>``."""
    ui: str
    """The Master's web UI (``/json/`` describes workers and applications)."""
    scratch: Path
    """Logs (``logs/``), the Workers' work directories (``work-<n>/``)."""

    def state(self) -> Any:
        """The Master's view of the cluster (its web UI's JSON)."""
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as resp:
            return json.load(resp)

    def app_ids(self, name: str) -> list[str]:
        """The running applications called ``name``."""
        return [app["id"] for app in self.state()["activeapps"] if app["name"] == name]

    def executor_pids(self, app_id: str) -> list[int]:
        """The executor JVMs the Workers run now for ``app_id`` (each runs in
        ``work-<n>/<app id>/<executor id>``)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            mine = cwd.startswith(str(self.scratch)) and Path(cwd).parent.name == app_id
            if b"CoarseGrainedExecutorBackend" in cmdline and mine:
                pids.append(int(entry.name))
        return pids


_running: list[Cluster] = []
"""The cluster this process started and still runs (at most one)."""


@contextmanager
def standalone_cluster(scratch: Path) -> Iterator[Cluster]:
    """A Master and ``WORKERS`` Workers, stopped on exit (also when start-up fails).

    One per process: while one runs, a second caller (the fixture of another test
    directory, tests/dfs next to tests/spark) gets the same cluster, and the first caller's
    exit stops it (``scratch`` is then not used).
    """
    if _running:
        yield _running[0]
        return
    home = spark_home()
    env = daemon_env(scratch)
    spark_class = str(home / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons: list[Daemon] = []
    with ExitStack() as stack:
        stack.callback(lambda: [d.stop() for d in reversed(daemons)])
        (scratch / "logs").mkdir(parents=True, exist_ok=True)
        daemons.append(
            Daemon(
                "the Spark master",
                [
                    *(spark_class, "org.apache.spark.deploy.master.Master"),
                    *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)),
                ],
                env,
                scratch / "logs" / "master.out",
            )
        )
        for n in range(WORKERS):
            work = scratch / f"work-{n}"
            work.mkdir()
            daemons.append(
                Daemon(
                    f"Spark worker {n}",
                    [
                        *(spark_class, "org.apache.spark.deploy.worker.Worker"),
                        *("--host", "127.0.0.1", "--webui-port", str(free_port())),
                        *("--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY),
                        *("--work-dir", str(work), url),
                    ],
                    env,
                    scratch / "logs" / f"worker-{n}.out",
                )
            )

        cluster = Cluster(url=url, ui=f"http://127.0.0.1:{ui}", scratch=scratch)

        def workers_alive() -> bool:
            return int(cluster.state()["aliveworkers"]) >= WORKERS

        wait_for(workers_alive, daemons, f"{WORKERS} workers to register with {url}")
        _running.append(cluster)
        stack.callback(_running.clear)
        yield cluster


@dataclass(frozen=True)
class ConnectServer:
    url: str
    """Where a client connects: ``sc://127.0.0.1:<port>``."""
    log: Path


CONNECT_STARTED = "Spark Connect server started at: "
CONNECT_FAILED = "Error starting Spark Connect server"
"""What the server logs once it serves, or when it could not (its port taken: by another
process between free_port() and its bind, as the other test worker's services pick
free ports too)."""


class _PortTaken(Exception):
    """The Connect server could not bind its port."""


@contextmanager
def connect_server(scratch: Path, master: str) -> Iterator[ConnectServer]:
    """``sbin/start-connect-server.sh`` in the foreground (``--wait``), bound to 127.0.0.1
    on a free port, running its queries on ``master``; stopped on exit. Up once its log
    says it serves: a port that answers may be another process's, which took the port
    first (then the server is started again on another one, up to three times)."""
    home = spark_home()
    env = {**daemon_env(scratch), "SPARK_IDENT_STRING": f"fsbus-tests-{os.getpid()}"}
    del env["SPARK_DAEMON_MEMORY"]  # the server is a driver: its heap is --driver-memory
    (scratch / "logs").mkdir(parents=True, exist_ok=True)
    log = scratch / "logs" / "connect.out"
    for attempt in range(3):
        port = free_port()
        server = Daemon(
            "the Spark Connect server", _connect_argv(home, scratch, master, port), env, log
        )

        def started(port: int = port) -> bool:
            text = log.read_text(errors="replace")
            if CONNECT_FAILED in text:
                raise _PortTaken(text[-3000:])
            if CONNECT_STARTED not in text:
                return False
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return True

        try:
            wait_for(started, [server], f"the Spark Connect server on port {port}")
        except (_PortTaken, RuntimeError):
            server.stop()
            if attempt == 2 or CONNECT_FAILED not in log.read_text(errors="replace"):
                raise
            continue
        try:
            yield ConnectServer(url=f"sc://127.0.0.1:{port}", log=log)
        finally:
            server.stop()
        return


def _connect_argv(home: Path, scratch: Path, master: str, port: int) -> list[str]:
    conf = {
        **app_conf(scratch),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.local.dir": str(scratch / "local"),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
        "spark.sql.warehouse.dir": str(scratch / "warehouse"),
        "spark.sql.streaming.stopTimeout": "30s",
    }
    argv = [str(home / "sbin" / "start-connect-server.sh"), "--wait", "--master", master]
    argv += ["--driver-memory", "1g"]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return argv
