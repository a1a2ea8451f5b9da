"""Consumer groups: committed offsets, key-hash partitions, leases and takeover.

A group is a directory ``<stream>/groups/<group>/``::

    group.json      {"partitions": P}; fixed when the group is created
    group.lock      flock taken for every change of the files below
    offsets         committed offset per partition, with an xxh64 checksum line;
                    replaced atomically (temp file, fsync, rename)
    owners          JSON {partition: consumer}: who holds each partition
    members/<id>    JSON {"expires": epoch seconds, ...}: a consumer's heartbeat

Work is shared by **partitions chosen by key hash** (records without a key by offset):
record r belongs to partition ``xxh64(r.key) % P`` (or ``r.offset % P``). Each live
consumer holds a share of the partitions and delivers only their records, so every
record goes to exactly one live consumer and the records of one key stay in order.

A consumer is live while its heartbeat file has not expired (``session_timeout``,
renewed every ``heartbeat_interval`` by :meth:`ConsumerGroup.poll` and
:meth:`ConsumerGroup.commit`). Partitions are dealt round-robin over the sorted live
consumers. A consumer takes a partition only when it is free or its holder is dead, and
gives one up only in :meth:`~ConsumerGroup.commit` (right after committing it) or
:meth:`~ConsumerGroup.close`; so a handover never delivers a record twice while both
consumers live. A killed consumer's partitions are taken over when its heartbeat
expires, from their committed offsets: delivery is at-least-once.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Self

import xxhash

from .._errors import (
    ClosedError,
    CorruptDataError,
    OffsetOutOfRange,
    StorageError,
    UsageError,
    storage_error,
)
from .framing import (
    Record,
    check_group_name,
    decode_generations,
    decode_offsets_file_generation,
    encode_generations,
    encode_offsets_file,
)
from .ops import StreamOps
from .segments import remove_debris
from .view import StreamView

__all__ = [
    "ConsumerGroup",
    "GroupInfo",
    "delete_group",
    "group_info",
    "list_groups",
    "min_committed",
    "reset_group",
]

log = logging.getLogger("fsbus.stream")

GROUPS_DIR = "groups"
SCAN_LIMIT = 100_000


@dataclass(frozen=True)
class GroupInfo:
    """A snapshot of one consumer group."""

    name: str
    """The group's name."""
    partitions: int
    """How many partitions the group's records are spread over."""
    committed: Mapping[int, int]
    """Committed offset per partition: records below it are done."""
    lag: int
    """Records between the lowest committed offset and the end of the stream (an upper
    bound on what is left to consume)."""
    members: tuple[str, ...]
    """Live consumers."""
    owners: Mapping[int, str]
    """Which consumer holds each held partition."""


def partition_of(record: Record, partitions: int) -> int:
    """The partition a record belongs to: key hash, or offset when it has no key."""
    if record.key is None:
        return record.offset % partitions
    return xxhash.xxh64_intdigest(record.key) % partitions


class _GroupFiles:
    """The files of one group, read and written under its lock."""

    def __init__(
        self, sdir: Path, stream_name: str, name: str, ops: StreamOps, *, cache_wait: float
    ) -> None:
        self.dir = sdir / GROUPS_DIR / check_group_name(name)
        self.cache_wait = cache_wait
        self.name = name
        self.stream_name = stream_name
        self.ops = ops
        self.offsets_path = self.dir / "offsets"
        self.owners_path = self.dir / "owners"
        self.meta_path = self.dir / "group.json"
        self.members_dir = self.dir / "members"
        self.locks_dir = self.dir / "locks"
        self.gen_path = self.dir / "generation"
        self.owners_gen = 0
        self.offsets_gen = 0
        self.held: dict[str, int] = {}
        self.kernel = ops.kernel_id()
        self._device: int | None = None
        self._lock_fd: int | None = None

    # locking
    def lock(self) -> None:
        ops = self.ops
        try:
            if self._lock_fd is None:
                ops.makedirs(self.members_dir)
                self._lock_fd = ops.open_rw(self.dir / "group.lock")
            ops.lock(self._lock_fd)
        except OSError as exc:
            raise storage_error(f"lock consumer group {self.name!r}", exc, self.dir) from exc

    def unlock(self) -> None:
        if self._lock_fd is not None:
            self.ops.unlock(self._lock_fd)

    def close(self) -> None:
        if self._lock_fd is not None:
            self.ops.close(self._lock_fd)
            self._lock_fd = None

    def forget(self) -> None:
        """Drop the descriptors without touching them (they belong to a parent process)."""
        self._lock_fd = None
        self.held.clear()

    # files
    def exists(self) -> bool:
        return self.ops.exists(self.meta_path)

    def partitions(self) -> int:
        raw = self.ops.read_file(self.meta_path)
        try:
            meta = json.loads(raw or b"")
            return int(meta["partitions"])
        except (ValueError, KeyError, TypeError):
            raise CorruptDataError(
                f"{self.meta_path} of consumer group {self.name!r} is unreadable; delete "
                f"the group (`fsbus stream groups delete {self.stream_name} {self.name}`) "
                "and create it again",
                self.meta_path,
            ) from None

    def create(self, partitions: int, start: int, durable: bool) -> None:
        self.write_offsets(dict.fromkeys(range(partitions), start), durable)
        self.write(self.meta_path, json.dumps({"partitions": partitions}).encode(), durable)

    # The owners and offsets files are replaced by rename, and a mount that caches names
    # or sizes (FUSE, NFS) may serve an old or cut-short copy for a moment after another
    # host replaced them. Each write records its count and length in the small
    # `generation` file, rewritten in place; readers read until the copy matches.

    def generations(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(count, length) of the latest owners and offsets writes ((0, 0): unknown)."""
        raw = self.ops.read_file(self.gen_path)
        got = decode_generations(raw) if raw else None
        return got if got is not None else ((0, 0), (0, 0))

    def _read_latest(
        self, path: Path, latest: tuple[int, int], generation: Callable[[bytes], int | None]
    ) -> tuple[bytes | None, bool]:
        """The file's bytes, and whether they are the latest write's.

        They are if they have its length, or are whole and of a later write
        (``generation`` reads a copy's own count, None if it is cut short): the
        `generation` file is not synced, so after a power cut it may describe an older
        write than the synced file it points to, and that file is no stale copy.
        Reads again for up to ``cache_wait`` seconds while they are not (a caching mount
        still serving the old copy); then returns what it has for the caller to judge.
        """
        started = self.ops.monotonic()
        while True:
            raw = self.ops.read_file(path)
            if latest[0] == 0 or (raw is not None and len(raw) == latest[1]):
                return raw, True
            if raw and (own := generation(raw)) is not None and own > latest[0]:
                return raw, True
            if self.ops.monotonic() - started >= self.cache_wait:
                return raw, False
            self.ops.sleep(0.02)

    def _stale(self, path: Path) -> StorageError:
        return StorageError(
            f"{path} still shows an old copy after {self.cache_wait:g} s: this mount caches "
            "file names or sizes too long for a consumer group shared between hosts (mount "
            "NFS with lookupcache=positive and a short actimeo, FUSE with entry_timeout=0 "
            "and attr_timeout=0, or raise StreamConfig.cache_wait)",
            path,
        )

    def read_offsets(self) -> dict[int, int]:
        """The committed offsets (the latest copy)."""
        latest = self.generations()[1]
        raw, fresh = self._read_latest(self.offsets_path, latest, _offsets_generation)
        if raw is None:
            why = "it is missing"
        else:
            try:
                offsets, gen = decode_offsets_file_generation(raw)
            except ValueError as exc:
                why = str(exc)
            else:
                if not fresh and gen < latest[0]:
                    raise self._stale(self.offsets_path)
                self.offsets_gen = max(self.offsets_gen, gen)
                return offsets
        raise CorruptDataError(
            f"offsets file {self.offsets_path} of consumer group {self.name!r} is corrupt: "
            f"{why}. Nothing was reset; choose where the group resumes with "
            f"`fsbus stream groups reset {self.stream_name} {self.name} --to "
            "earliest|latest|OFFSET`",
            self.offsets_path,
        )

    def write_offsets(self, offsets: Mapping[int, int], durable: bool) -> None:
        owners, latest = self.generations()
        gen = max(latest[0], self.offsets_gen) + 1
        data = encode_offsets_file(offsets, gen)
        # Always fsync the new file before the rename: after a machine crash the group
        # finds its old or its new offsets, never an empty file it would have to reset.
        self.write(self.offsets_path, data, durable, sync_file=True)
        self.offsets_gen = gen
        self._write_generations(owners, (gen, len(data)))

    def read_owners(self) -> dict[int, str]:
        """Who holds each partition (the latest copy)."""
        latest = self.generations()[0]
        raw, fresh = self._read_latest(self.owners_path, latest, _owners_generation)
        if not raw:
            if not fresh:
                raise self._stale(self.owners_path)
            return {}
        try:
            obj = json.loads(raw)
            gen = int(obj.get("generation", 0))
            owners = {int(k): str(v) for k, v in obj.get("owners", {}).items()}
        except (ValueError, AttributeError, TypeError):
            if not fresh:
                raise self._stale(self.owners_path) from None
            log.warning("consumer group %s: unreadable owners file, starting afresh", self.name)
            return {}
        if not fresh and gen < latest[0]:
            raise self._stale(self.owners_path)
        self.owners_gen = max(self.owners_gen, gen)
        return owners

    def owners_stamp(self) -> tuple[int, int] | None:
        """Changes whenever the owners file is replaced (inode, mtime)."""
        return self.ops.identity(self.owners_path)

    def write_owners(self, owners: Mapping[int, str]) -> None:
        latest, offsets = self.generations()
        gen = max(latest[0], self.owners_gen) + 1
        data = json.dumps(
            {"generation": gen, "owners": {str(k): v for k, v in owners.items()}}
        ).encode()
        self.write(self.owners_path, data, False)
        self.owners_gen = gen
        self._write_generations((gen, len(data)), offsets)

    def _write_generations(self, owners: tuple[int, int], offsets: tuple[int, int]) -> None:
        try:
            self.ops.write_in_place(self.gen_path, encode_generations(owners, offsets))
        except OSError as exc:
            raise storage_error(f"write consumer group {self.name!r}", exc, self.gen_path) from exc

    def live_members(self, now: float) -> dict[str, float]:
        """Consumers whose heartbeat has not expired, with their expiry.

        A consumer on this host whose liveness lock is free has died (the kernel dropped
        its flock), so it is dead at once, without waiting for its heartbeat to expire.
        """
        out: dict[str, float] = {}
        me = self.locality()
        for m in self.ops.listdir(self.members_dir):
            if m.startswith("."):
                continue
            beat = self._heartbeat(m)
            if beat is None:
                continue  # gone meanwhile
            expires, where = beat
            if expires > now and not (where == me and m not in self.held and self._dead(m)):
                out[m] = expires
            else:
                self.ops.remove(self.members_dir / m)  # a dead consumer's heartbeat
                self.ops.remove(self.locks_dir / m)
        return out

    def _heartbeat(self, member: str) -> tuple[float, tuple[str, int]] | None:
        """(expiry, locality) from a member's heartbeat file; None if it is gone.

        A caching mount may show a heartbeat cut short right after its owner replaced
        it: read again for up to ``cache_wait`` seconds before calling it unreadable
        (then it counts as expired, so a dead consumer's junk never blocks a group).
        """
        path = self.members_dir / member
        started = self.ops.monotonic()
        while True:
            raw = self.ops.read_file(path)
            if raw is None:
                return None
            try:
                info = json.loads(raw)
                return float(info["expires"]), (
                    str(info.get("kernel", "")),
                    int(info.get("device", -1)),
                )
            except (ValueError, KeyError, TypeError, AttributeError):
                if self.ops.monotonic() - started >= self.cache_wait:
                    return 0.0, ("", -1)
                self.ops.sleep(0.02)

    def locality(self) -> tuple[str, int]:
        """Where our flocks are seen: this kernel, through this mount.

        Two consumers with the same locality see each other's flocks for sure; others
        (another machine, or another mount such as a second sshfs or bindfs mount whose
        locks stay local) are judged by their heartbeat alone.
        """
        if self._device is None:
            try:
                self._device = self.ops.device(self.members_dir)
            except OSError:
                return self.kernel, -2  # unknown: matches no one, heartbeats decide
        return self.kernel, self._device

    def _dead(self, member: str) -> bool:
        """Whether a consumer of this host has died (its liveness lock is free)."""
        try:
            fd = self.ops.open_rw(self.locks_dir / member, create=False)
        except OSError:
            return False  # no lock file: judge by the heartbeat alone
        try:
            if self.ops.try_lock(fd):
                self.ops.unlock(fd)
                return True
            return False
        finally:
            self.ops.close(fd)

    def hold(self, member: str) -> None:
        """Take this consumer's liveness lock, held until :meth:`leave`."""
        if member in self.held:
            return
        try:
            self.ops.makedirs(self.locks_dir)
            fd = self.ops.open_rw(self.locks_dir / member)
            if not self.ops.try_lock(fd):
                self.ops.close(fd)
                raise UsageError(
                    f"consumer id {member!r} is already in use in group {self.name!r} on "
                    "this host; give each consumer its own id"
                )
        except OSError as exc:
            raise storage_error("take a consumer's liveness lock", exc, self.locks_dir) from exc
        self.held[member] = fd

    def heartbeat(self, member: str, expires: float) -> None:
        self.hold(member)
        data = json.dumps(
            {
                "expires": expires,
                "host": self.ops.hostname(),
                "kernel": self.kernel,
                "device": self.locality()[1],
                "pid": self.ops.pid(),
            }
        ).encode()
        self.write(self.members_dir / member, data, False)

    def leave(self, member: str) -> None:
        fd = self.held.pop(member, None)
        if fd is not None:  # only the holder of the id removes its files
            self.ops.remove(self.members_dir / member)
            self.ops.remove(self.locks_dir / member)
            self.ops.close(fd)

    def write(self, path: Path, data: bytes, durable: bool, *, sync_file: bool = False) -> None:
        try:
            self.ops.write_atomic(path, data, durable=durable, sync_file=sync_file)
        except OSError as exc:
            raise storage_error(f"write consumer group {self.name!r}", exc, path) from exc


def _offsets_generation(raw: bytes) -> int | None:
    """The write count an offsets file records, or None if it is not whole."""
    try:
        return decode_offsets_file_generation(raw)[1]
    except ValueError:
        return None


def _owners_generation(raw: bytes) -> int | None:
    """The write count an owners file records, or None if it is not whole."""
    try:
        return int(json.loads(raw)["generation"])
    except (ValueError, KeyError, TypeError):
        return None


class ConsumerGroup:
    """One consumer of a consumer group on a stream (blocking face).

    Get one from :meth:`Stream.group <fsbus.Stream.group>`. :meth:`poll` returns records
    of this consumer's partitions; :meth:`commit` marks everything polled so far as done.
    Records polled but not committed are delivered again (to this or another consumer)
    after a crash: at-least-once.
    """

    def __init__(
        self,
        stream: StreamView,
        name: str,
        *,
        consumer: str | None = None,
        start: str | int = "earliest",
    ) -> None:
        self._stream = stream
        self._ops: StreamOps = stream.ops
        self._config = stream.config
        self._files = _GroupFiles(
            stream.path, stream.name, name, self._ops, cache_wait=stream.config.cache_wait
        )
        self._name = name
        if consumer is None:
            consumer = f"{self._ops.hostname()}-{self._ops.pid()}-{secrets.token_hex(3)}"
        self._member = check_group_name(consumer)
        self._owned: dict[int, int] = {}  # partition -> next offset to deliver
        self._next_beat = 0.0
        self._owners_seen: tuple[int, int] | None = None
        self._closed = False
        self._pid = self._ops.pid()
        if start not in ("earliest", "latest") and not (isinstance(start, int) and start >= 0):
            raise UsageError(f"start must be 'earliest', 'latest' or an offset, got {start!r}")
        self._files.lock()
        try:
            remove_debris(self._ops, self._files.dir)
            remove_debris(self._ops, self._files.members_dir)
            if not self._files.exists():
                first = self._resolve(start)
                self._files.create(
                    self._config.group_partitions, first, self._config.durability != "none"
                )
            self._partitions = self._files.partitions()
        finally:
            self._files.unlock()

    # --- properties ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The group's name."""
        return self._name

    @property
    def consumer(self) -> str:
        """This consumer's id within the group."""
        return self._member

    @property
    def partitions(self) -> int:
        """How many partitions the group has."""
        return self._partitions

    @property
    def positions(self) -> dict[int, int]:
        """Next offset to deliver, per partition held."""
        return dict(self._owned)

    @property
    def assignment(self) -> frozenset[int]:
        """The partitions this consumer holds now."""
        return frozenset(self._owned)

    # --- consuming -----------------------------------------------------------------------

    def poll(self, *, max_records: int = 500, timeout: float = 0.0) -> list[Record]:
        """Up to ``max_records`` records of this consumer's partitions, in offset order.

        Waits up to ``timeout`` seconds for records (0: do not wait). Renews the
        heartbeat, takes free partitions and those of dead consumers.
        """
        self._check_open()
        if max_records < 1:
            raise UsageError(f"max_records must be >= 1, got {max_records}")
        deadline = self._ops.monotonic() + timeout
        while True:
            self._rebalance(release=False)
            recs = self._fetch(max_records)
            if recs or self._ops.monotonic() >= deadline:
                return recs
            self._ops.sleep(
                min(self._config.poll_interval, max(deadline - self._ops.monotonic(), 0))
            )

    def commit(self, *, through: int | None = None, release: bool = True) -> dict[int, int]:
        """Commit every record polled so far (or, with ``through``, every polled record
        up to that offset); return the committed offset per partition.

        Then (unless ``release`` is false) gives up partitions that now belong to other
        live consumers. Partitions this consumer lost (it was silent past
        ``session_timeout``) are not committed.
        """
        self._check_open()
        files = self._files
        files.lock()
        try:
            offsets = files.read_offsets()
            owners = files.read_owners()
            for p in list(self._owned):
                if owners.get(p) != self._member:
                    log.warning(
                        "consumer %s of group %s lost partition %d before committing it",
                        self._member,
                        self._name,
                        p,
                    )
                    del self._owned[p]
            for p, pos in self._owned.items():
                upto = pos if through is None else min(pos, through + 1)
                offsets[p] = max(offsets.get(p, 0), upto)
            files.write_offsets(offsets, self._config.durability != "none")
            self._rebalance_locked(release=release, owners=owners)
            return {p: offsets[p] for p in sorted(offsets)}
        finally:
            files.unlock()

    def committed(self) -> dict[int, int]:
        """The committed offset of every partition, as on disk."""
        return self._files.read_offsets()

    def lag(self) -> int:
        """Records between the lowest committed offset and the end of the stream."""
        return max(self._stream.end_offset - min(self.committed().values()), 0)

    def close(self) -> None:
        """Leave the group: release the partitions (uncommitted records will be delivered
        again) and remove the heartbeat. Idempotent."""
        if self._closed:
            return
        self._closed = True
        files = self._files
        if self._pid != self._ops.pid():
            files.forget()  # a forked copy: the consumer is the parent's; leave its files
            self._owned.clear()
            return
        try:
            files.lock()
            try:
                owners = files.read_owners()
                mine = [p for p, m in owners.items() if m == self._member]
                for p in mine:
                    del owners[p]
                if mine:
                    files.write_owners(owners)
                files.leave(self._member)
            finally:
                files.unlock()
        finally:
            files.close()
            self._owned.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<ConsumerGroup {self._name!r} consumer={self._member!r} holds={sorted(self._owned)}>"
        )

    # --- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"consumer {self._member!r} of group {self._name!r} is closed")
        if self._pid != self._ops.pid():
            raise UsageError(
                f"consumer {self._member!r} of group {self._name!r} was made in process "
                f"{self._pid}, before a fork; join the group again in this process "
                "(stream.group(...)), as its own consumer"
            )

    def _resolve(self, start: str | int) -> int:
        if start == "earliest":
            return self._stream.start_offset
        if start == "latest":
            return self._stream.end_offset
        assert isinstance(start, int)
        return start

    def _rebalance(self, *, release: bool) -> None:
        now = self._ops.monotonic()
        stamp = self._files.owners_stamp()
        if self._owned and now < self._next_beat and stamp == self._owners_seen:
            return  # nothing due: fresh heartbeat, partitions held, no owner changed
        self._files.lock()
        try:
            self._rebalance_locked(release=release, owners=None)
        finally:
            self._files.unlock()

    def _rebalance_locked(self, *, release: bool, owners: dict[int, str] | None) -> None:
        files = self._files
        cfg = self._config
        wall = self._ops.now()
        files.heartbeat(self._member, wall + cfg.session_timeout)
        self._next_beat = self._ops.monotonic() + cfg.heartbeat_interval
        live = files.live_members(wall)
        live.setdefault(self._member, wall + cfg.session_timeout)
        order = sorted(live)
        if owners is None:
            owners = files.read_owners()
        changed = False
        offsets: dict[int, int] | None = None
        for p in range(self._partitions):
            holder = owners.get(p)
            wanted = order[p % len(order)]
            if holder == self._member:
                if p not in self._owned:
                    # held by us on disk but not in memory (a restart with the same id)
                    offsets = offsets if offsets is not None else files.read_offsets()
                    self._owned[p] = offsets.get(p, 0)
                if release and wanted != self._member:
                    del owners[p]
                    self._owned.pop(p, None)
                    changed = True
            else:
                if p in self._owned:
                    log.warning(
                        "consumer %s of group %s lost partition %d to %s",
                        self._member,
                        self._name,
                        p,
                        holder,
                    )
                    del self._owned[p]
                if wanted == self._member and (holder is None or holder not in live):
                    offsets = offsets if offsets is not None else files.read_offsets()
                    owners[p] = self._member
                    self._owned[p] = offsets.get(p, 0)
                    changed = True
        if changed:
            files.write_owners(owners)
        self._owners_seen = files.owners_stamp()

    def _fetch(self, max_records: int) -> list[Record]:
        if not self._owned:
            return []
        start = min(self._owned.values())
        parts = self._partitions
        owned = self._owned
        out: list[Record] = []
        scanned_to = start
        try:
            it = self._stream.read(start, max_records=SCAN_LIMIT)
        except OffsetOutOfRange:
            first = self._stream.start_offset
            if start >= first:
                return []  # positions past the end (a reset ahead of the writers): wait
            log.warning(
                "group %s: offsets %d..%d were deleted by retention before being "
                "consumed; resuming at %d",
                self._name,
                start,
                first - 1,
                first,
            )
            for p in owned:
                owned[p] = max(owned[p], first)
            return []
        for r in it:
            scanned_to = r.offset + 1
            p = partition_of(r, parts)
            at = owned.get(p)
            if at is not None and r.offset >= at:
                out.append(r)
                if len(out) >= max_records:
                    break
        for p in owned:
            if owned[p] < scanned_to:
                owned[p] = scanned_to
        return out


# --- management (CLI, retention) -----------------------------------------------------------


def list_groups(stream: StreamView) -> list[str]:
    """Names of the stream's consumer groups."""
    gdir = stream.path / GROUPS_DIR
    return sorted(
        n
        for n in stream.ops.listdir(gdir)
        if not n.startswith(".") and stream.ops.exists(gdir / n / "group.json")
    )


def group_info(stream: StreamView, name: str) -> GroupInfo:
    """Committed offsets, lag, live members and owners of one group."""
    files = _GroupFiles(
        stream.path, stream.name, name, stream.ops, cache_wait=stream.config.cache_wait
    )
    if not files.exists():
        raise UsageError(f"stream {stream.name!r} has no consumer group {name!r}")
    committed = files.read_offsets()
    end = stream.end_offset
    live = files.live_members(stream.ops.now())
    owners = {p: m for p, m in files.read_owners().items() if m in live}
    return GroupInfo(
        name=name,
        partitions=files.partitions(),
        committed=MappingProxyType(committed),
        lag=max(end - min(committed.values(), default=end), 0),
        members=tuple(sorted(live)),
        owners=MappingProxyType(owners),
    )


def reset_group(stream: StreamView, name: str, to: str | int) -> dict[int, int]:
    """Set every partition's committed offset ('earliest', 'latest' or an offset).

    Also repairs a corrupt offsets file. Do it while the group's consumers are stopped:
    a running consumer commits its own positions over the reset.
    """
    files = _GroupFiles(
        stream.path, stream.name, name, stream.ops, cache_wait=stream.config.cache_wait
    )
    if to == "earliest":
        target = stream.start_offset
    elif to == "latest":
        target = stream.end_offset
    elif isinstance(to, int) and to >= 0:
        target = to
    else:
        raise UsageError(f"reset to 'earliest', 'latest' or an offset >= 0, not {to!r}")
    files.lock()
    try:
        if files.exists():
            parts = files.partitions()
        else:
            parts = stream.config.group_partitions
            files.write(files.meta_path, json.dumps({"partitions": parts}).encode(), True)
        offsets = dict.fromkeys(range(parts), target)
        files.write_offsets(offsets, True)
        return offsets
    finally:
        files.unlock()
        files.close()


def delete_group(stream: StreamView, name: str) -> None:
    """Remove a group's files (its consumers should be stopped)."""
    files = _GroupFiles(
        stream.path, stream.name, name, stream.ops, cache_wait=stream.config.cache_wait
    )
    ops = stream.ops
    for sub in (files.members_dir, files.locks_dir):
        for m in ops.listdir(sub):
            ops.remove(sub / m)
    for n in ops.listdir(files.dir):
        p = files.dir / n
        if not ops.is_dir(p):
            ops.remove(p)
    for d in (files.members_dir, files.locks_dir, files.dir):
        try:
            ops.rmdir(d)
        except OSError:
            pass


def min_committed(stream: StreamView) -> int | None:
    """The lowest committed offset over every group (None if there is no group)."""
    lows: list[int] = []
    for g in list_groups(stream):
        files = _GroupFiles(
            stream.path, stream.name, g, stream.ops, cache_wait=stream.config.cache_wait
        )
        lows.append(min(files.read_offsets().values()))
    return min(lows) if lows else None
