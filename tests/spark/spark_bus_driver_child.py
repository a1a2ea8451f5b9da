"""Child processes for the Bus-topics kill tests: a Spark driver, and a publisher.

    python spark_bus_driver_child.py driver <root> <checkpoint> <scratch> run|finish <master>
    python spark_bus_driver_child.py publish <root> <first> <stop> [<pause>]

``driver`` runs a streaming query over the Bus topics ``orders.#`` (queue ``QUEUE``), 40
records per micro-batch, read in two partitions and shuffled, written to stream ``out``
(value: the payload, key: the topic) with the checkpoint given. ``run`` keeps going until
killed, or until its stdin says STOP or closes (then it stops the query and exits 0);
``finish`` uses Trigger.AvailableNow and exits 0 once caught up. ``master`` is
``local[2]`` or a standalone cluster's ``spark://`` URL.

``publish`` publishes messages ``first`` .. ``stop - 1`` (see spark_helpers.publish_one), one
JSON line ``{"event": "published", "stop": n}`` after each 20, then ``{"event": "done"}``.
``pause`` (seconds, default 0) is slept after each 20: it spreads the publishing over the
life of a driver, and nothing checked depends on it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from spark_helpers import PATTERN, QUEUE, build_spark, publish_one

from fsbus import BlockingBus


def publish(root: str, first: int, stop: int, pause: float) -> None:
    with BlockingBus(root) as bus:
        for i in range(first, stop):
            publish_one(bus, i)
            if (i - first) % 20 == 19:
                print(json.dumps({"event": "published", "stop": i + 1}), flush=True)
                if pause:
                    time.sleep(pause)
    print(json.dumps({"event": "done"}), flush=True)


def driver(root: str, checkpoint: str, scratch: str, mode: str, master: str) -> None:
    spark = build_spark(Path(scratch), app=f"fsbus-bus-driver-{mode}", master=master)
    writer = (
        spark.readStream.format("fsbus")
        .option("path", root)
        .option("pattern", PATTERN)
        .option("queue", QUEUE)
        .option("maxRecordsPerTrigger", "40")
        .option("minPartitions", "2")
        .load()
        .selectExpr("topic AS key", "payload AS value")
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
    print(json.dumps({"event": "started"}), flush=True)

    def stop_on_request() -> None:
        for line in sys.stdin:
            if "STOP" in line:
                break
        query.stop()

    if mode == "run":
        threading.Thread(target=stop_on_request, daemon=True).start()
    query.awaitTermination()
    exc = query.exception()
    spark.stop()
    if exc is not None:
        print(exc, file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"event": "stopped"}), flush=True)


def main() -> None:
    role, args = sys.argv[1], sys.argv[2:]
    if role == "driver":
        driver(*args[:5])
    elif role == "publish":
        pause = float(args[3]) if len(args) > 3 else 0.0
        publish(args[0], int(args[1]), int(args[2]), pause)
    else:
        sys.exit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
