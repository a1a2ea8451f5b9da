"""Configuration objects (pure: no I/O besides reading the environment once)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._defaults import DEFAULTS as D
from ._env import env_force_polling
from ._errors import InvalidConfig

__all__ = ["BusConfig"]


class BusConfig(BaseModel):
    """Every option of a :class:`~fsbus.Bus`, validated once, immutable.

    The first group must agree between all peers sharing a directory (fsbus and
    qlobber-fsq alike); the defaults are qlobber-fsq 14's.
    """

    # The validators are built on the first validation, not at import: a config made
    # from the defaults (fsbus._settings.as_config) never runs them.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    # --- on-disk format: every peer must agree ---------------------------------------
    bucket_base: int = Field(
        D.bucket_base, ge=2, le=36, description="Radix of bucket directory names."
    )
    bucket_num_chars: int = Field(
        D.bucket_num_chars,
        ge=1,
        le=4,
        description="Digits in a bucket name; buckets = base ** chars.",
    )
    bucket_stamp_size: int = Field(
        D.bucket_stamp_size,
        ge=0,
        le=1024,
        description="Bytes per bucket in update/UPDATE; 0 disables it.",
    )
    split_topic_at: int = Field(
        D.split_topic_at,
        ge=16,
        le=200,
        description="Hex characters of the topic kept in the file name.",
    )
    order_by_expiry: bool = Field(
        D.order_by_expiry, description="One bucket named '0' so messages are seen in expiry order."
    )

    # --- message defaults -----------------------------------------------------------
    multi_ttl: float = Field(
        D.multi_ttl, gt=0, description="Default TTL of multi messages, seconds."
    )
    single_ttl: float = Field(
        D.single_ttl, gt=0, description="Default TTL of single messages, seconds."
    )
    max_payload_size: int = Field(
        D.max_payload_size, gt=0, description="Largest payload accepted by publish, bytes."
    )
    default_priority: int = Field(
        D.default_priority,
        ge=0,
        le=255,
        description="Priority of work-queue messages; lower is taken first.",
    )

    # --- delivery ------------------------------------------------------------------
    poll_interval: float = Field(
        D.poll_interval,
        gt=0,
        le=60,
        description="Seconds between reads of update/UPDATE; when not set, 0.02 on network "
        "and FUSE filesystems, where polling is how other hosts' messages are seen; there, for "
        "a second after a stamp changed, UPDATE is read four times as often.",
    )
    refresh_ttl: float = Field(
        D.refresh_ttl,
        gt=0,
        description="Seconds after which every bucket is listed even unstamped.",
    )
    retry_interval: float = Field(
        D.retry_interval,
        gt=0,
        description=(
            "Seconds before a locked, failed or released single is tried again (one "
            "claimed ahead and given back unread, or an AMQP requeue, at once)."
        ),
    )
    force_polling: bool = Field(
        default_factory=env_force_polling,
        description="Poll only, no inotify, on any filesystem (network filesystems fsbus "
        "recognises are polled only anyway); env FSBUS_FORCE_POLLING=1.",
    )
    dedup: bool = Field(D.dedup, description="Call each handler at most once per message.")
    handler_concurrency: int = Field(
        D.handler_concurrency, ge=1, le=10_000, description="Handlers running at once in one Bus."
    )
    max_deliveries: int | None = Field(
        D.max_deliveries,
        ge=1,
        description="Failed deliveries of a single message before it is dead-lettered "
        "(None: retry until it expires).",
    )
    count_deliveries: bool = Field(
        D.count_deliveries,
        description="Record each delivery of a work-queue message before its handler runs, "
        "so one redelivered after its consumer crashed has delivery_count > 1 (costs one "
        "one-byte write into the held message file per delivery; durable queues always do "
        "it).",
    )
    dead_letter_prefix: str = Field(
        D.dead_letter_prefix,
        min_length=1,
        description="Dead-lettered messages go to '<prefix>.<topic>'.",
    )
    gc_interval: float = Field(
        D.gc_interval,
        gt=0,
        description=(
            "Seconds between sweeps for expired messages and debris (made by one of the "
            "processes on the bus, each interval)."
        ),
    )
    locking: Literal["auto", "flock", "rename"] = Field(
        D.locking,
        description="How single messages are claimed: flock (qlobber-fsq compatible), or "
        "rename (for mounts where flock does not cross hosts); auto picks rename where "
        "flock stays on each client (sshfs, NFS with nolock or local_lock, BeeGFS without "
        "tuneUseGlobalFileLocks) or another consumer already claims by rename, else flock.",
    )
    durable_log: Literal["auto", "on", "off"] = Field(
        D.durable_log,
        description="How durable publishes are made durable: 'on' appends a record of "
        "each (its files' bytes) to a log the process wrote ahead and syncs that, one "
        "data sync instead of a journal commit, and a bus that opens after the machine "
        "restarted writes back what the records of dead processes hold; 'off' syncs "
        "each file and its folder; 'auto' is 'on' where that pays (a local ext4 with a "
        "journal: fsbus doctor says) and 'off' elsewhere. Never on a mount other hosts "
        "share.",
    )
    claim_lease: float = Field(
        D.claim_lease,
        gt=0,
        description="Seconds a work-queue message claimed by rename stays claimed without "
        "word from its consumer: the consumer renews the lease every quarter of it while "
        "its handler runs, and garbage collection gives back a claim not renewed for this "
        "long (its consumer died or was cut off). Flock claims need no lease: the lock "
        "goes with the process.",
    )

    # --- files ---------------------------------------------------------------------
    file_mode: int | None = Field(
        D.file_mode, ge=0, le=0o7777, description="Mode of created files (None: 0o666 less umask)."
    )
    dir_mode: int | None = Field(
        D.dir_mode,
        ge=0,
        le=0o7777,
        description="Mode of created directories (None: 0o777 less umask).",
    )

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidConfig(_explain(exc)) from None

    @model_validator(mode="after")
    def _check(self) -> BusConfig:
        if self.num_buckets > 65536:
            raise ValueError(
                f"bucket_base ** bucket_num_chars = {self.num_buckets} buckets; at most 65536"
            )
        return self

    @property
    def num_buckets(self) -> int:
        """How many bucket directories there are."""
        if self.order_by_expiry:
            return 1
        return int(self.bucket_base**self.bucket_num_chars)


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return "invalid BusConfig: " + "; ".join(parts)
