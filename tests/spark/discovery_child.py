"""A Spark driver that never calls ``fsbus.spark.register``: ``format("fsbus")`` must be
found by Spark's own lookup of ``pyspark_*`` modules.

    python discovery_child.py <root> <scratch>

Writes three rows into stream ``found``, reads them
back through Spark and prints the values as one JSON list.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from spark_helpers import build_spark


def main() -> None:
    root, scratch = sys.argv[1:3]
    spark = build_spark(Path(scratch), app="fsbus-discovery", register=False)
    df = spark.createDataFrame([("a",), ("b",), ("c",)], "value string")
    df.write.format("fsbus").mode("append").option("path", root).option("stream", "found").save()
    back = spark.read.format("fsbus").option("path", root).option("stream", "found").load()
    values = sorted(bytes(r.value).decode() for r in back.collect())
    spark.stop()
    print(json.dumps(values), flush=True)


if __name__ == "__main__":
    main()
