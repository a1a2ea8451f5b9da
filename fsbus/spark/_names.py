"""Names the connector shares with its users: the row shapes as Spark DDL and the headers
its sink writes. Nothing heavy is imported here: Spark starts a fresh Python process to
create the data source and another to plan each streaming query, and those import this
package but need neither pyarrow nor the sink."""

from __future__ import annotations

__all__ = ["BATCH_HEADER", "BUS_SCHEMA", "ID_HEADER", "STREAM_SCHEMA"]

STREAM_SCHEMA = (
    "stream string, offset long, timestamp timestamp, key binary, value binary, "
    "headers map<string,string>"
)
"""Columns of a Stream read: one row per record."""

BUS_SCHEMA = (
    "topic string, kind string, expires timestamp, size long, payload binary, "
    "headers map<string,string>, priority int, published_at timestamp, host string, "
    "locked boolean, name string, bucket string"
)
"""Columns of a Bus snapshot: one row per message on disk (nothing is consumed)."""

BATCH_HEADER = "fsbus-spark-batch"
"""Header on the first record a commit appends to a Stream: ``<sink>/<batch>:<skip>``."""
ID_HEADER = "fsbus-spark-id"
"""Header on every message a commit publishes on the Bus: ``<sink>/<batch>:<index>``."""
