"""Lets Spark find the ``fsbus`` data source without ``spark.dataSource.register``.

PySpark (4.x) imports every top-level module named ``pyspark_*`` on the Python path when
a session first needs a Python data source, and registers its ``DefaultSource`` under the
source's short name. This module is that hook; ``fsbus.spark`` is the connector.
"""

from __future__ import annotations

try:
    from fsbus.spark import FsBusDataSource as DefaultSource
except ImportError:  # pragma: no cover - pyspark or pyarrow missing: nothing to offer
    # Spark imports this module while looking up every Python data source: an error here
    # would break the lookup of all of them, so stay silent.
    __all__: list[str] = []
else:
    __all__ = ["DefaultSource"]
