"""The options a bus runs with: the :class:`~fsbus.BusConfig` it was given, or the
defaults (:class:`~fsbus._defaults.Defaults`, no pydantic), and what the engine asks of
either. Pure: nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypeAlias

from ._defaults import Defaults

if TYPE_CHECKING:
    from ._config import BusConfig

__all__ = ["Settings", "as_config", "settings", "was_set", "with_changes"]

Settings: TypeAlias = "BusConfig | Defaults"
"""What a bus reads its options from: the config it was given, or the defaults."""


def settings(config: Settings | None) -> Settings:
    """The options of a bus opened with ``config``: the defaults when it is None."""
    return Defaults() if config is None else config


def with_changes(options: Settings, **changes: object) -> Settings:
    """``options`` with ``changes`` (known valid: set by fsbus, not by a caller)."""
    if isinstance(options, Defaults):
        changed = options.changed | changes.keys()
        return dataclasses.replace(options, changed=frozenset(changed), **changes)  # type: ignore[arg-type]
    return options.model_copy(update=changes)


def was_set(options: Settings, name: str) -> bool:
    """Whether option ``name`` was given rather than left at its default."""
    if isinstance(options, Defaults):
        return name in options.changed
    return name in options.model_fields_set


def as_config(options: Settings) -> BusConfig:
    """``options`` as a :class:`~fsbus.BusConfig` (made without running the validators
    for defaults: they are valid)."""
    from ._config import BusConfig

    if isinstance(options, BusConfig):
        return options
    values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    changed = values.pop("changed")
    return BusConfig.model_construct(_fields_set=set(changed), **values)
