"""Shared by the Spark tests and the child drivers they start (no pytest needed here)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# PySpark warns about pandas >= 3 when it first converts through Arrow; the connector does
# not use pandas, so the warning is noise here (the suite turns warnings into errors).
PANDAS_WARNING = "ignore:PySpark does not yet fully support pandas:FutureWarning"


def spark_env() -> dict[str, str]:
    """Environment for a Spark driver on this machine (also used for child drivers)."""
    return {
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Not the realpath: a venv's python is a symlink, and its realpath loses the venv.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def build_spark(
    tmp: Path, app: str = "fsbus-tests", *, register: bool = True, master: str = "local[2]"
) -> Any:
    """A SparkSession with its scratch space under ``tmp``, fsbus registered (unless
    ``register`` is false: then Spark must find the data source on its own).

    ``master`` is ``local[2]`` (one JVM) or a standalone cluster's ``spark://`` URL (see
    spark_cluster.py): then each executor is a JVM of its own, started by a Worker.
    """
    from pyspark.sql import SparkSession
    from spark_cluster import app_conf

    import fsbus.spark

    os.environ.update(spark_env())
    (tmp / "local").mkdir(parents=True, exist_ok=True)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.local.dir", str(tmp / "local"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={tmp}")
        .config("spark.executor.extraJavaOptions", f"-Djava.io.tmpdir={tmp}")
        .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
    )
    if master.startswith("spark://"):
        for key, value in app_conf(tmp).items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if register:
        fsbus.spark.register(spark)
    return spark


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
