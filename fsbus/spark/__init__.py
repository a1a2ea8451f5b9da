"""fsbus as a PySpark data source and sink (install with ``pip install 'fsbus[spark]'``).

Use the short name ``fsbus``: Spark finds it on its own (it imports the ``pyspark_fsbus``
module this package installs); ``fsbus.spark.register(spark)`` registers it explicitly::

    # a Stream, as micro-batches (offsets {"<stream>": next offset} in the checkpoint)
    df = (spark.readStream.format("fsbus")
          .option("path", "/shared/bus").option("stream", "events")
          .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", 100_000)
          .load())
    # ... appended to another Stream, or published on the Bus, exactly once
    (df.writeStream.format("fsbus").option("path", "/shared/bus").option("topic", "alerts")
       .option("checkpointLocation", "/shared/ckpt/alerts").start())

    # batch: a Stream's offset or time range, or a snapshot of the Bus's messages
    spark.read.format("fsbus").option("path", root).option("stream", "events").load()
    spark.read.format("fsbus").option("path", root).option("pattern", "orders.#").load()

See docs/spark.md for every option and the exactly-once protocol.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

try:
    import pyspark.sql.datasource  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fsbus.spark needs PySpark >= 4.2 and pyarrow: pip install 'fsbus[spark]'"
    ) from exc
if find_spec("pyarrow") is None:  # pragma: no cover - imported only where rows are built
    raise ImportError("fsbus.spark needs pyarrow: pip install 'fsbus[spark]'")

from ._names import BATCH_HEADER, BUS_SCHEMA, ID_HEADER, STREAM_SCHEMA
from ._source import FsBusDataSource

if TYPE_CHECKING:
    from ._schema import value_as_json, value_as_string

__all__ = (
    "BATCH_HEADER",
    "BUS_SCHEMA",
    "ID_HEADER",
    "STREAM_SCHEMA",
    "FsBusDataSource",
    "register",
    "value_as_json",
    "value_as_string",
)


def __getattr__(name: str) -> Any:
    # The decoding helpers need pyspark.sql.functions: loaded when first asked for, so
    # that Spark's planning processes, which import this package, do not.
    if name in ("value_as_json", "value_as_string"):
        from . import _schema

        return getattr(_schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(spark: Any) -> None:
    """Register the ``fsbus`` short name with ``spark`` (a SparkSession); idempotent.

    Not needed when fsbus is installed where Spark's Python runs: Spark then finds the
    data source through the ``pyspark_fsbus`` module. Useful in a session started before
    fsbus was installed.
    """
    spark.dataSource.register(FsBusDataSource)
