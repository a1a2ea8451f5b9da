"""A Spark driver in its own process, for the SIGKILL test.

    python spark_driver_child.py <root> <checkpoint> <scratch> run|finish [<master>]

It copies stream ``in`` to stream ``out`` through the fsbus source and sink, 40 records
per micro-batch. ``run`` keeps going until killed; ``finish`` uses Trigger.AvailableNow
and exits 0 once everything available has been copied. ``master`` is local[2] unless given
(a standalone cluster's ``spark://`` URL).
"""

from __future__ import annotations

import sys
from pathlib import Path

from spark_helpers import build_spark


def main() -> None:
    root, checkpoint, scratch, mode = sys.argv[1:5]
    master = sys.argv[5] if len(sys.argv) > 5 else "local[2]"
    spark = build_spark(Path(scratch), app=f"fsbus-driver-{mode}", master=master)
    writer = (
        spark.readStream.format("fsbus")
        .option("path", root)
        .option("stream", "in")
        .option("maxRecordsPerTrigger", "40")
        .load()
        .select("key", "value")
        .repartition(2)
        .writeStream.format("fsbus")
        .option("path", root)
        .option("stream", "out")
        .option("checkpointLocation", checkpoint)
    )
    if mode == "finish":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="0 seconds")
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()
    exc = query.exception()
    spark.stop()
    if exc is not None:
        print(exc, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
