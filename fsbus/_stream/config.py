"""StreamConfig: every option of a stream handle, validated once, immutable."""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .._env import env_force_polling
from .._errors import InvalidConfig
from .defaults import DEFAULTS as D
from .defaults import Defaults

__all__ = ["Durability", "Settings", "StreamConfig", "from_defaults"]

Durability = Literal["none", "batch", "record"]


class StreamConfig(BaseModel):
    """Options of a :class:`~fsbus.Stream` handle.

    Options are per handle: processes sharing a stream may use different durability or
    retention settings. Segment boundaries do not need agreement either (a writer finds
    the newest segment by name, whatever size the others roll at).
    """

    # The validators are built on the first validation, not at import: a process that
    # only opens streams with the defaults (a Spark planner, the CLI) never builds them.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    durability: Durability = Field(
        D.durability,
        description="When appends reach the disk: 'none' (page cache only: survives a "
        "crash of the process, not of the machine), 'batch' (fdatasync once per append or "
        "append_batch call before it returns), 'record' (fdatasync after every record).",
    )
    segment_bytes: int = Field(
        D.segment_bytes, ge=4096, le=1 << 40, description="Start a new segment past this size."
    )
    index_interval_bytes: int = Field(
        D.index_interval_bytes,
        ge=0,
        description="Bytes of frames between two sparse index entries.",
    )
    max_frame_bytes: int = Field(
        D.max_frame_bytes,
        ge=256,
        le=(1 << 32) - 1,
        description="A batch is cut into frames of about this size (a frame is what a "
        "reader sees at once).",
    )
    max_record_bytes: int = Field(
        D.max_record_bytes, gt=0, le=(1 << 32) - 1024, description="Largest record accepted."
    )
    read_chunk_bytes: int = Field(
        D.read_chunk_bytes, ge=4096, description="Bytes read from a segment per read call."
    )
    retention_bytes: int | None = Field(
        D.retention_bytes,
        gt=0,
        description="Delete the oldest segments while the stream is larger.",
    )
    retention_seconds: float | None = Field(
        D.retention_seconds,
        gt=0,
        description="Delete segments whose newest record is older than this.",
    )
    delete_consumed: bool = Field(
        D.delete_consumed,
        description="Let retention also delete segments every consumer group has committed.",
    )
    group_partitions: int = Field(
        D.group_partitions,
        ge=1,
        le=4096,
        description="Partitions of a new consumer group (records go to partitions by key "
        "hash, or by offset when they have no key); fixed when the group is created.",
    )
    session_timeout: float = Field(
        D.session_timeout,
        gt=0,
        description="A consumer silent this long is dead; its partitions move.",
    )
    heartbeat_interval: float = Field(
        D.heartbeat_interval, gt=0, description="How often a live consumer renews its lease."
    )
    cache_wait: float = Field(
        D.cache_wait,
        ge=0,
        description="How long a consumer-group file may show an old copy (a mount that "
        "caches names or sizes) before fsbus reports it.",
    )
    poll_interval: float = Field(
        D.poll_interval, gt=0, le=60, description="Seconds between checks for appends when polling."
    )
    force_polling: bool = Field(
        default_factory=env_force_polling,
        description="Poll only, no inotify (network filesystems); env FSBUS_FORCE_POLLING=1.",
    )

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            parts = []
            for err in exc.errors():
                loc = ".".join(str(x) for x in err["loc"]) or "config"
                parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
            raise InvalidConfig("invalid StreamConfig: " + "; ".join(parts)) from None

    @model_validator(mode="after")
    def _check(self) -> StreamConfig:
        if self.heartbeat_interval >= self.session_timeout:
            raise ValueError(
                f"heartbeat_interval ({self.heartbeat_interval}) must be shorter than "
                f"session_timeout ({self.session_timeout})"
            )
        return self


Settings: TypeAlias = "StreamConfig | Defaults"
"""What a handle reads its options from: the config it was given, or the defaults (a
handle opened without a config never imports this module, nor pydantic)."""


def from_defaults(defaults: Defaults) -> StreamConfig:
    """The defaults a handle read as a :class:`StreamConfig`, made without running the
    validators (they are valid)."""
    return StreamConfig.model_construct(**asdict(defaults))
