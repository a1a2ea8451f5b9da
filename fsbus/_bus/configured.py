"""The options of a :class:`~fsbus.Bus` and a :class:`~fsbus.BlockingBus`, shared.

Each reads its options from what it was opened with (a :class:`~fsbus.BusConfig`, or the
defaults without pydantic: see :mod:`fsbus._settings`), and makes a ``BusConfig`` of
them only when asked for :attr:`Configured.config`. fsbus opens its own buses (a queue's
bus, the AMQP gateway's, a recorder's) with :meth:`Configured._using`: changes it sets
itself and knows valid, with no validation.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Self

from .._settings import Settings, as_config, settings, with_changes
from .ops import Ops

if TYPE_CHECKING:
    from .._config import BusConfig

__all__ = ["Configured"]


class Configured:
    """Options read from ``_cfg``; :attr:`config` made from them when first asked."""

    _cfg: Settings
    _config: BusConfig | None

    @classmethod
    def _using(
        cls,
        root: str | os.PathLike[str],
        options: Settings | None,
        ops: Ops | None = None,
        **changes: object,
    ) -> Self:
        """A bus with ``options`` (a config, the defaults when None, or defaults fsbus
        changed) and ``changes`` to them, set by fsbus and known valid."""
        opts = settings(options)
        bus = cls.__new__(cls)
        bus._init(root, with_changes(opts, **changes) if changes else opts, ops)
        return bus

    def _init(self, root: str | os.PathLike[str], options: Settings, ops: Ops | None) -> None:
        """Set the bus up with ``options`` (its ``__init__`` and :meth:`_using` call it)."""
        raise NotImplementedError

    @property
    def config(self) -> BusConfig:
        """This bus's options."""
        if self._config is None:
            self._config = as_config(self._cfg)
        return self._config
