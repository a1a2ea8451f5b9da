"""Row shapes of the Spark source, and helpers to decode ``value``.

Nothing here imports pyarrow or NumPy: the Python process that plans a streaming query
loads this module, and never builds a row (the Arrow conversions are in ``_arrow``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsbus import InvalidConfig

from ._names import BUS_SCHEMA, STREAM_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "ALL_STREAM_COLUMNS",
    "BUS_SCHEMA",
    "STREAM_COLUMNS",
    "STREAM_SCHEMA",
    "StreamColumns",
    "stream_columns",
    "value_as_json",
    "value_as_string",
]

STREAM_COLUMNS = ("stream", "offset", "timestamp", "key", "value", "headers")
"""The columns of a Stream read, in order."""

# What Spark reports for each column's type (``DataType.simpleString()``).
_SPARK_TYPES = {
    "stream": "string",
    "offset": "bigint",
    "timestamp": "timestamp",
    "key": "binary",
    "value": "binary",
    "headers": "map<string,string>",
}
_NULLABLE = frozenset({"key"})
"""Columns that hold nulls (a record without a key)."""


@dataclass(frozen=True)
class StreamColumns:
    """The columns a Stream read returns: all of them, or those a narrower schema asks for."""

    names: tuple[str, ...]
    """Each returned column's name in ``STREAM_COLUMNS``, in the order returned."""
    spark_schema: Any = None
    """The narrower schema the query gave (a ``StructType``; its spelling of the names is
    the batches'), or None for ``STREAM_SCHEMA``'s columns."""


ALL_STREAM_COLUMNS = StreamColumns(STREAM_COLUMNS)
"""Every column, as ``STREAM_SCHEMA`` has them."""


def stream_columns(schema: Any) -> StreamColumns:
    """The columns a Stream read returns for ``schema``, the one Spark gives the reader.

    That is ``STREAM_SCHEMA`` unless the query gave its own with ``.schema(...)``: any
    subset of the columns, in any order, with the same types, returns just those (only
    they are built and sent to Spark). Anything else is refused with what to do instead.
    """
    fields = list(schema.fields) if schema is not None else None
    if fields is None or [(f.name, f.dataType.simpleString(), f.nullable) for f in fields] == [
        (n, _SPARK_TYPES[n], True) for n in STREAM_COLUMNS
    ]:
        return ALL_STREAM_COLUMNS
    rule = (
        f"a Stream read returns the columns {STREAM_SCHEMA!r}; a schema given with "
        ".schema(...) may name any of them, in any order, with those types"
    )
    if not fields:
        raise InvalidConfig(f"the schema names no column; {rule}")
    names: list[str] = []
    for f in fields:
        name = f.name.lower()
        if name not in _SPARK_TYPES:
            raise InvalidConfig(f"column {f.name!r} is not in a Stream's rows; {rule}")
        if name in names:
            raise InvalidConfig(f"the schema names column {f.name!r} twice; {rule}")
        have, want = _SPARK_TYPES[name], f.dataType.simpleString()
        if have != want:
            raise InvalidConfig(
                f"column {f.name!r} is {have} in a Stream's rows, not {want}; ask for {have} "
                "and convert after loading (e.g. value_as_string(), .cast(...))"
            )
        if name in _NULLABLE and not f.nullable:
            raise InvalidConfig(
                f"column {f.name!r} is null for records without one; declare it nullable"
            )
        names.append(name)
    return StreamColumns(tuple(names), schema)


def value_as_string(column: str = "value", *, alias: str | None = None) -> Column:
    """The binary ``column`` decoded as UTF-8 text (a Spark Column)."""
    from pyspark.sql import functions as F

    return F.col(column).cast("string").alias(alias or column)


def value_as_json(schema: Any, column: str = "value", *, alias: str | None = None) -> Column:
    """The binary ``column`` parsed as JSON with ``schema`` (DDL string or StructType).

    Rows whose value is not valid JSON give null, as with Spark's ``from_json``.
    """
    from pyspark.sql import functions as F

    return F.from_json(F.col(column).cast("string"), schema).alias(alias or column)
