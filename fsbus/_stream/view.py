"""StreamView: what consumer groups and maintenance need to see of a stream.

``groups`` and ``maint`` take a ``StreamView`` rather than the :class:`~fsbus.Stream` class,
so that ``log`` (which offers their work as methods) imports them and nothing imports
``log`` back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .framing import Record
from .ops import StreamOps

if TYPE_CHECKING:
    from .config import StreamConfig

__all__ = ["StreamView"]


class StreamView(Protocol):
    """The read side of an open stream handle."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def config(self) -> StreamConfig: ...

    @property
    def ops(self) -> StreamOps: ...

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    def read(
        self, start: int = 0, stop: int | None = None, *, max_records: int | None = None
    ) -> Iterator[Record]: ...
