"""StreamConfig: every option of a stream handle, validated once, immutable."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .._config import env_force_polling
from .._errors import InvalidConfig

__all__ = ["Durability", "StreamConfig", "default_config"]

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
        "batch",
        description="When appends reach the disk: 'none' (page cache only: survives a "
        "crash of the process, not of the machine), 'batch' (fdatasync once per append or "
        "append_batch call before it returns), 'record' (fdatasync after every record).",
    )
    segment_bytes: int = Field(
        64 << 20, ge=4096, le=1 << 40, description="Start a new segment past this size."
    )
    index_interval_bytes: int = Field(
        16 << 10, ge=0, description="Bytes of frames between two sparse index entries."
    )
    max_frame_bytes: int = Field(
        1 << 20,
        ge=256,
        le=(1 << 32) - 1,
        description="A batch is cut into frames of about this size (a frame is what a "
        "reader sees at once).",
    )
    max_record_bytes: int = Field(
        64 << 20, gt=0, le=(1 << 32) - 1024, description="Largest record accepted."
    )
    read_chunk_bytes: int = Field(
        4 << 20, ge=4096, description="Bytes read from a segment per read call."
    )
    retention_bytes: int | None = Field(
        None, gt=0, description="Delete the oldest segments while the stream is larger."
    )
    retention_seconds: float | None = Field(
        None, gt=0, description="Delete segments whose newest record is older than this."
    )
    delete_consumed: bool = Field(
        False,
        description="Let retention also delete segments every consumer group has committed.",
    )
    group_partitions: int = Field(
        8,
        ge=1,
        le=4096,
        description="Partitions of a new consumer group (records go to partitions by key "
        "hash, or by offset when they have no key); fixed when the group is created.",
    )
    session_timeout: float = Field(
        10.0, gt=0, description="A consumer silent this long is dead; its partitions move."
    )
    heartbeat_interval: float = Field(
        1.0, gt=0, description="How often a live consumer renews its lease."
    )
    cache_wait: float = Field(
        5.0,
        ge=0,
        description="How long a consumer-group file may show an old copy (a mount that "
        "caches names or sizes) before fsbus reports it.",
    )
    poll_interval: float = Field(
        0.1, gt=0, le=60, description="Seconds between checks for appends when polling."
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


def default_config() -> StreamConfig:
    """A config with every option at its default: what ``StreamConfig()`` gives, made
    without running the validators (the defaults are valid), so without building them."""
    return StreamConfig.model_construct()
