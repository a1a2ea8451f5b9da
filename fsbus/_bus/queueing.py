"""The bus side of durable queues: each queue's own bus, opened for the queue store.

A queue keeps its messages in a bus directory of its own (``fsbus/queues/<name>/bus``),
as work-queue messages. :class:`QueueWriter` writes into it, lists and removes there,
through the same :class:`~fsbus._bus.fs.BusFS` and :class:`~fsbus._bus.namer.Namer` a
Bus uses, so a copy in a queue is an ordinary message of that bus.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from .._errors import QueueFull, StorageError, storage_error
from .._queues.definition import Definition
from .._queues.store import DeadLettered, DeadLetterSend, Expired, QueueStore, copy_ttl
from .._settings import Settings
from .dropped import count_spooled, take_spooled
from .dropped import spool as spool_messages
from .fs import BusFS, Claim, Go, NameClash, Then, Withdrawn, decode_meta, stamps_batched
from .layout import Layout
from .namer import Namer, next_unique
from .names import FLAG_META, bucket_for
from .ops import Ops
from .plan import PublishPlan, with_head
from .purge import purge_some, purge_targets
from .scan import Census, name_rank, parse_entry, soonest_expiry_ms
from .sweep import take_census

T = TypeVar("T")

DEAD_LETTER_BATCH = 64
"""Expired messages claimed, sent on in one call and removed, at a time (see
:meth:`QueueWriter.dead_letter_expired`): one hop to the event loop a batch."""


class QueueWriter:
    """A blocking handle on one queue's bus (the store's ``QueueBus``); thread-safe."""

    def __init__(self, root: str, config: Settings, ops: Ops | None = None) -> None:
        self.layout = Layout.of(root, config)
        self._fs = BusFS(self.layout, config, ops)
        self._fs.setup()
        # No qlobber-fsq peer reads a queue's bus: headers go into the message file,
        # one file a message (FLAG_INLINE), instead of a sidecar beside it.
        self._namer = Namer(self.layout, config, inline_headers=True)
        self._lock = threading.Lock()
        self._topics: dict[str, bool] = {}  # hex topic -> decodes (for the census)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        ttl: float | None,
        durable: bool,
        headers: dict[str, str] | None,
        priority: int | None,
    ) -> None:
        with self._lock:
            plan = self._namer.plan(topic, True, ttl, durable, headers, priority)
        self.publish_planned(plan, payload)

    def plan(
        self,
        topic: str,
        *,
        ttl: float | None,
        durable: bool,
        headers: dict[str, str] | None,
        priority: int | None,
    ) -> PublishPlan:
        """Name a copy (no I/O). Every queue's bus has the same buckets, and names are
        unique in the process, so one plan serves the copies of one publish in every
        queue (each queue is a directory of its own)."""
        with self._lock:
            return self._namer.plan(topic, True, ttl, durable, headers, priority)

    def publish_planned(self, plan: PublishPlan, payload: bytes) -> PublishPlan:
        """Write a copy named by :meth:`plan` (synced as the plan says); returns the plan
        it was written under (another if the name clashed)."""
        data = with_head(plan, payload)
        try:
            if plan.spill is None and plan.meta is None and not plan.durable:
                self._fs.publish_plain(plan.name, plan.bucket_index, data)  # the hot path
            else:
                self._fs.publish(plan, data)
        except NameClash:  # astronomically rare: name it again
            plan = self._replan(plan)
            self._fs.publish(plan, data)
        return plan

    def take_back(self, plan: PublishPlan) -> None:
        """Remove a copy written under ``plan``, with its sidecars, if it is still there
        (a publish that failed after it: see :func:`route`)."""
        lay = self._fs.layout
        for path in (
            lay.message_path(plan.bucket, plan.name),
            lay.topic_path(plan.bucket, plan.name),
            lay.meta_path(plan.bucket, plan.name),
        ):
            self._fs._unlink_quiet(path)

    def _replan(self, plan: PublishPlan) -> PublishPlan:
        """The same message under a new name: the name's unique digits and its bucket
        change; its expiry, flags and priority stay."""
        name = plan.name[:-12] + next_unique()
        buckets = self.layout.buckets
        bi = bucket_for(name, len(buckets))
        return plan._replace(name=name, bucket=buckets[bi], bucket_index=bi)

    def stage(self, plan: PublishPlan, payload: bytes) -> _Staged:
        """Write a copy into staging, not synced and not visible yet (see :func:`route`)."""
        try:
            fd = self._fs.begin(plan)
        except NameClash:
            plan = self._replan(plan)
            fd = self._fs.begin(plan)
        data = with_head(plan, payload)
        try:
            self._fs.write_chunk(fd, data, plan)
            # Start writing it back now: the first sync of the publish then finds every
            # copy's blocks allocated in the journal transaction it commits.
            self._fs.ops.drop_cache(fd)
        except BaseException:
            self._fs.abort(plan, fd)
            raise
        return _Staged(self, plan, fd, len(data))

    def _census(self) -> Census:
        return take_census(self._fs, int(time.time() * 1000), self._topics)

    def depth(self) -> int:
        """Messages not expired: waiting, or held by a consumer."""
        return len(self._census().singles)

    def ready(self) -> int:
        """Messages not expired that no consumer holds: the count, less the held ones
        at its head, told by their locks from the head on until one is not held
        (consumers take from the head; one held further back counts as ready)."""
        singles = self._census().singles
        buckets = self.layout.buckets
        held = 0
        for _, bi, name in sorted((name_rank(name), bi, name) for bi, name in singles):
            if not self._fs.is_locked(buckets[bi], name):
                break
            held += 1
        return len(singles) - held

    def expire(self) -> int:
        """Remove the expired messages no consumer holds; how many."""
        buckets = self.layout.buckets
        expired = self._census().expired
        return self.remove([(buckets[bi], name) for bi, name, kind in expired if kind == "s"])

    def dead_letter_expired(self, send: DeadLetterSend) -> DeadLettered:
        """Claim the expired messages no consumer holds, hand them to ``send`` in queue
        order, :data:`DEAD_LETTER_BATCH` at a time, then remove them. The messages of a
        batch ``send`` raises for are given back untouched, and the exception raised."""
        n = 0
        started = time.monotonic()
        census = self._census()
        next_ms = soonest_expiry_ms(name for _bi, name in census.singles)
        listing = time.monotonic() - started
        expired = [(bi, name) for bi, name, kind in census.expired if kind == "s"]
        expired.sort(key=lambda m: name_rank(m[1]))  # in queue order, as a consumer's
        claims: list[Claim] = []
        batch: list[Expired] = []
        for i, (bi, name) in enumerate(expired):
            # None: not a message, a consumer holds it, or another process is sending it
            taken = self._take_whole(bi, name)
            if taken:
                claims.append(taken[0])
                batch.append(taken[1])
            if claims and (len(claims) == DEAD_LETTER_BATCH or i == len(expired) - 1):
                self._hand_over(claims, functools.partial(send, batch))
                n += len(claims)
                claims, batch = [], []
        return DeadLettered(n, next_ms, listing)

    def trim(self, max_length: int, spool: str | None = None) -> tuple[int, int, int]:
        """Count the queue and remove from its head what goes beyond ``max_length`` of the
        messages no consumer holds (as RabbitMQ counts towards ``x-max-length`` only the
        ready ones): (depth counted, held ones passed over, removed). The held ones are
        told by their locks from the head on, where consumers take them, until enough
        are removed: one held further back counts as ready. ``spool``: write each one
        removed there first, whole, for its dead-lettering (see :mod:`.dropped`)."""
        singles = self._census().singles
        depth = len(singles)
        if depth <= max_length:
            return depth, 0, 0
        # the head of the queue: what a consumer would take next (priority, then
        # publish time and the publisher's sequence)
        ranked = sorted((name_rank(name), bi, name) for bi, name in singles)
        held, claims, items = self._claim_head(ranked, depth - max_length, whole=spool is not None)
        if spool is None:
            self._hand_over(claims, lambda: None)
        else:
            self._hand_over(claims, lambda: spool_messages(self._fs.ops, spool, items))
        return depth, held, len(claims)

    def _claim_head(
        self, ranked: list[tuple[int, int, str]], excess: int, *, whole: bool
    ) -> tuple[int, list[Claim], list[Expired]]:
        """Claim from the head of ``ranked`` those no consumer holds, until ``excess``
        less those held are claimed: (held ones passed over, the claims, and for
        ``whole`` each one's topic, payload and headers)."""
        buckets = self.layout.buckets
        claims: list[Claim] = []
        items: list[Expired] = []
        held = 0
        try:
            for _, bi, name in ranked:
                if len(claims) + held >= excess:
                    break
                taken: tuple[Claim, Expired | None] | Literal[False] | None
                if not whole:
                    claim = self._fs.claim(buckets[bi], name, has_meta=False, attempts=False)
                    taken = None if claim is None else (claim, None)
                else:
                    taken = self._take_whole(bi, name)
                    if taken is False:
                        continue  # not a message
                if taken is None:
                    held += 1  # a consumer holds it (or took it since the census)
                    continue
                claims.append(taken[0])
                if taken[1] is not None:
                    items.append(taken[1])
        except BaseException:
            self._give_back(claims)
            raise
        return held, claims, items

    def _take_whole(self, bi: int, name: str) -> tuple[Claim, Expired] | Literal[False] | None:
        """Claim message ``name`` of bucket ``bi`` as a consumer would, with its topic,
        payload and headers; None when it is held (by a consumer, or another process
        that takes it whole); False when it is not a message (or went with its spill)."""
        fs = self._fs
        spills = fs.read_spills([(bi, name)]) if "@l+" in name else {}
        entry = parse_entry(bi, name, spills)
        if entry is None or entry.topic is None:
            return False
        fields = entry.fields
        has_meta = fields is not None and bool(fields.flags & FLAG_META)
        claim = fs.claim(self.layout.buckets[bi], name, has_meta=has_meta, attempts=False)
        if claim is None:
            return None
        return claim, (entry.topic, claim.payload, decode_meta(claim.meta))

    def _hand_over(self, claims: list[Claim], then: Callable[[], None]) -> None:
        """Run ``then`` (the messages of ``claims`` sent on, or kept elsewhere), then
        remove them; if it raises, give them back untouched (and raise)."""
        try:
            then()
        except BaseException:
            self._give_back(claims)
            raise
        for i, c in enumerate(claims):
            try:
                self._fs.ack(c)
            except BaseException:  # (one that cannot be removed: the rest given back)
                self._give_back(claims[i + 1 :])
                raise

    def _give_back(self, claims: list[Claim]) -> None:
        for c in claims:
            self._fs.release(c, failed=False)

    def spool(self, folder: str, messages: list[Expired]) -> None:
        """Write ``messages`` into spool ``folder``, to be dead-lettered (a full
        ``reject-publish`` queue's refused copy: see :mod:`.dropped`)."""
        spool_messages(self._fs.ops, folder, messages)

    def dead_letter_dropped(self, folder: str, send: DeadLetterSend, quarantine: str) -> int:
        """Hand what spool ``folder`` holds (the messages this queue dropped) to
        ``send``, in the order dropped, then remove it; how many (see :mod:`.dropped`).
        A file there that is not a dropped message goes to ``quarantine``."""
        return take_spooled(
            self._fs.ops,
            folder,
            send,
            batch=DEAD_LETTER_BATCH,
            quarantine=quarantine,
            by_rename=self._fs.locking == "rename",
        )

    def spooled(self, folder: str) -> int:
        """Messages in spool ``folder`` not sent yet (see :mod:`.dropped`)."""
        return count_spooled(self._fs.ops, folder)

    def remove(self, messages: list[tuple[str, str]]) -> int:
        return purge_some(self._fs, [], messages)[0]

    def purge_all(self) -> int:
        multi, single = purge_targets(self._fs, "#", "all")
        removed, multi_removed, _locked = purge_some(self._fs, multi, single)
        return removed + multi_removed

    def close(self) -> None:
        self._fs.close()


class _Staged:
    """A copy in a queue's staging directory, on its way into the queue."""

    def __init__(self, writer: QueueWriter, plan: PublishPlan, fd: int, size: int) -> None:
        self.writer = writer
        self.plan = plan
        self.fd = fd
        self.synced = False
        self.placed = False
        self.late = writer._fs.places_first(plan, size)
        """Placed first, synced after (as the message: see BusFS.commit_then_sync)."""
        self.final: str | None = None  # its path once placed, while unsynced

    def sync(self) -> None:
        """Its data on disk (fdatasync)."""
        fs = self.writer._fs
        try:
            fs.ops.fdatasync(self.fd)
        except OSError as exc:
            path = f"{fs.layout.staging}/{self.plan.name}"
            raise storage_error("syncing a queue's copy", exc, path) from exc
        self.synced = True

    def place(self) -> None:
        """Rename it into its bucket (visible) and stamp the bucket; closed, but for a
        late one (synced by :meth:`sync_placed`); its directory is not synced here (see
        :meth:`settle`)."""
        if self.late:
            self.final = self.writer._fs.place_open(self.plan, self.fd)
        else:
            fd, self.fd = self.fd, -1
            self.writer._fs.commit(self.plan._replace(durable=False), fd)
        self.placed = True

    def sync_placed(self) -> None:
        """A late copy's data on disk, once placed (:meth:`sync`); then closed."""
        try:
            self.sync()
        finally:
            fd, self.fd = self.fd, -1
            self.writer._fs.ops.close(fd)

    def settle(self) -> None:
        """Its directory entry on disk (fsync of its bucket directory)."""
        fs = self.writer._fs
        path = f"{fs.layout.messages}/{self.plan.bucket}"
        try:
            fd = fs.ops.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fs.ops.fsync(fd)
            finally:
                fs.ops.close(fd)
        except FileNotFoundError:
            # Its queue was deleted since the copy was placed (nothing else removes a
            # bucket): nothing of it is left to sync, and the publish, visible by now,
            # must not fail (retried, it would be there twice).
            return
        except OSError as exc:
            raise storage_error("syncing a queue's bucket directory", exc, path) from exc

    def discard(self) -> None:
        """Remove it from staging if it is still there (nothing of it is visible), or
        take it back from its queue if it was placed and is not synced yet."""
        if self.final is not None and not self.synced:
            if self.fd >= 0:
                fd, self.fd = self.fd, -1
                self.writer._fs.ops.close(fd)
            self.writer._fs._unlink_quiet(self.final)
        elif self.fd >= 0:
            fd, self.fd = self.fd, -1
            self.writer._fs.abort(self.plan, fd)


def renaming(
    fs: BusFS, planned: list[PublishPlan], data: bytes, replan: Callable[[], PublishPlan]
) -> Callable[[Go | None, Then | None], int]:
    """:func:`route`'s ``publish`` for one message of bytes: written under ``planned[0]``,
    or, if that name clashes (astronomically rare), under ``replan()``'s, which then
    replaces it in ``planned``. Returns its size."""

    def publish(go: Go | None, then: Then | None) -> int:
        try:
            return fs.publish(planned[0], data, go, then)
        except NameClash:
            planned[0] = replan()
            return fs.publish(planned[0], data, go, then)

    return publish


def route_planned(
    store: QueueStore,
    fs: BusFS,
    targets: tuple[Definition, ...],
    planned: list[PublishPlan],
    data: bytes,
    replan: Callable[[], PublishPlan],
    *,
    ttl: float | None,
    durable: bool,
    headers: dict[str, str] | None,
    priority: int | None,
) -> int:
    """Publish a message of bytes under ``planned[0]`` (see :func:`renaming`) with a
    copy in each queue of ``targets`` (:func:`route`), once each full reject-publish
    one among them has refused it (:meth:`QueueStore.check_room`); its size."""
    topic = planned[0].topic
    store.check_room(targets, (topic, data, headers))
    return route(
        store,
        targets,
        topic,
        data,
        ttl=ttl,
        durable=durable,
        headers=headers,
        priority=priority,
        publish=renaming(fs, planned, data, replan),
        main=fs,
    )


def refused_in_batch(exc: QueueFull, index: int, total: int) -> QueueFull:
    """``exc``, raised for message ``index`` of a ``publish_many`` of ``total``, saying
    which messages of the batch went: the ones before it, not it nor the ones after."""
    return QueueFull(
        f"{exc} (message {index + 1} of {total} of publish_many: the {index} before it "
        "were published, it and the ones after it were not)"
    )


def route(
    store: QueueStore,
    targets: tuple[Definition, ...],
    topic: str,
    payload: bytes,
    *,
    ttl: float | None,
    durable: bool,
    headers: dict[str, str] | None,
    priority: int | None,
    publish: Callable[[Go | None, Then | None], T],
    main: BusFS,
) -> T:
    """Publish a message with ``publish`` and copy it into each queue of ``targets``;
    returns what ``publish`` returned.

    A durable publish is a group commit (docs/queues.md, Performance): every copy is
    staged first and its write-back started. Where the message and its copies are
    placed first (:meth:`~fsbus._bus.fs.BusFS.places_first`: one page, no sidecar, a
    filesystem that orders data before metadata), ``go``, just before the message's
    rename, renames each copy into its queue; once the message is renamed and its data
    synced, which commits every creation and rename of the publish in one journal
    commit, ``then`` syncs each copy (found on disk already). Otherwise ``publish``
    syncs the message itself, and ``go`` syncs each copy before renaming it; the
    message's directory sync then carries the copies' renames. Each copy's directory is
    synced after. Every file and every directory entry is synced before this returns,
    as one publish at a time would do; the kernel just finds most of them already on
    disk. Their buckets are stamped after the last sync (``main``, the bus ``publish``
    writes to, holds its stamp too: see :func:`~fsbus._bus.fs.stamps_batched`), so
    no consumer acts on any of them in between. A sync that fails takes the message and
    its copies back. A copy with a
    sidecar (a long topic) is written after the message, one at a time; headers go
    inline in a queue's copies, which are staged like any other.
    """
    durable_log = main.log_source() if durable and main.log_source is not None else None
    if durable_log is not None:
        # Made durable by one record in the durable log: written as a plain publish
        # (the message's own publish joins the record).
        return durable_log.durably(
            lambda: route(
                store,
                targets,
                topic,
                payload,
                ttl=ttl,
                durable=False,
                headers=headers,
                priority=priority,
                publish=publish,
                main=main,
            )
        )
    opened = store.open_targets(targets)
    if not opened:
        return publish(None, None)
    first = opened[0][1]
    plans: dict[float, PublishPlan] = {}

    def plan_for(d: Definition, w: QueueWriter) -> PublishPlan:
        life = copy_ttl(d, ttl)
        p = plans.get(life)
        if p is None:
            p = plans[life] = w.plan(
                topic, ttl=life, durable=durable, headers=headers, priority=priority
            )
        return p

    writers = [(d, w) for d, w in opened if isinstance(w, QueueWriter)]
    if not durable or not isinstance(first, QueueWriter) or len(writers) < len(opened):
        # The copies first, the message last: a copy that cannot be written (a full
        # disk...) takes back the copies written before it, so that a publish that
        # raises leaves nothing behind (retried, it would be there twice).
        written: list[tuple[QueueWriter, PublishPlan]] = []
        try:
            for d, w in opened:
                try:
                    if isinstance(w, QueueWriter):
                        written.append((w, w.publish_planned(plan_for(d, w), payload)))
                    else:
                        w.publish(
                            topic,
                            payload,
                            ttl=copy_ttl(d, ttl),
                            durable=durable,
                            headers=headers,
                            priority=priority,
                        )
                    if d.options.max_length is not None:
                        store.trim(d)
                except (StorageError, OSError):
                    if store.gone(d):
                        continue  # deleted while its copy was written: as if deleted before
                    raise
            return publish(None, None)
        except BaseException:
            for w, plan in written:
                w.take_back(plan)
            raise
    with stamps_batched():
        return _durable_route(store, writers, payload, plan_for, publish)


def _durable_route(
    store: QueueStore,
    writers: list[tuple[Definition, QueueWriter]],
    payload: bytes,
    plan_for: Callable[[Definition, QueueWriter], PublishPlan],
    publish: Callable[[Go | None, Then | None], T],
) -> T:
    """:func:`route`'s group commit of a durable message and its copies."""
    staged: list[_Staged] = []
    later: list[tuple[Definition, QueueWriter]] = []
    failed: list[BaseException] = []
    gone: set[str] = set()
    try:
        for d, w in writers:
            p = plan_for(d, w)
            if p.spill is None and p.meta is None:
                try:
                    staged.append(w.stage(p, payload))
                except (StorageError, OSError):
                    if not store.gone(d):
                        raise
                    gone.add(d.name)  # deleted as its copy was staged: as if deleted before
            else:
                later.append((d, w))

        def go() -> bool:
            # Called once the message is synced, before its rename (and again if its
            # name clashed and it is published under a new one: the copies are in).
            try:
                for s in staged:
                    if not s.synced and not s.late:
                        s.sync()
                for s in staged:
                    if not s.placed:
                        s.place()
            except BaseException as exc:
                failed.append(exc)
                return False  # the message is withdrawn: nothing of it is visible
            return True

        def then() -> None:
            # the message is visible and its data synced: the late copies' syncs
            for s in staged:
                if s.late and not s.synced:
                    s.sync_placed()

        out = publish(go, then)
    except BaseException as exc:
        for s in staged:
            s.discard()
        if failed and isinstance(exc, Withdrawn):
            raise failed[0] from None
        raise
    for s in staged:
        s.settle()
    for d, w in later:
        w.publish_planned(plan_for(d, w), payload)
    for d, _ in writers:
        if d.name not in gone:
            store.trim(d)
    return out


def enqueue_each(
    store: QueueStore,
    targets: Sequence[Definition],
    topic: str,
    payload: bytes,
    *,
    ttl: float | None,
    durable: bool,
    headers: dict[str, str] | None,
    priority: int | None,
    rooms_checked: bool = False,
) -> int:
    """Put a message into each queue of ``targets``, a copy each; how many got one.

    The copies are named once (per TTL: a queue's ``message_ttl`` can shorten it) and
    their headers encoded once, as :func:`route` does. A queue deleted meanwhile is
    skipped. A full queue with ``overflow="reject-publish"`` refuses its own copy only:
    the other queues get theirs, then :class:`QueueFull` names the ones that refused (as
    RabbitMQ delivers to the queues with room and nacks the publish). Any other error
    takes back the copies written before it: an enqueue that raised is nowhere.
    ``rooms_checked``: the caller checked every queue's room before it published
    anything (``publish_many``), so none is checked again here.
    """
    full: list[Definition] = []
    room: list[Definition] = []
    for d in targets:
        try:
            if not rooms_checked:
                store.check_room((d,), (topic, payload, headers))
        except QueueFull:
            full.append(d)
            continue
        room.append(d)
    plans: dict[float, PublishPlan] = {}
    made = 0
    written: list[tuple[QueueWriter, PublishPlan]] = []
    try:
        for d, w in store.open_targets(tuple(room)):
            life = copy_ttl(d, ttl)
            try:
                if isinstance(w, QueueWriter):
                    plan = plans.get(life)
                    if plan is None:
                        plan = plans[life] = w.plan(
                            topic, ttl=life, durable=durable, headers=headers, priority=priority
                        )
                    written.append((w, w.publish_planned(plan, payload)))
                else:
                    w.publish(
                        topic,
                        payload,
                        ttl=life,
                        durable=durable,
                        headers=headers,
                        priority=priority,
                    )
                store.trim(d)
            except (StorageError, OSError):
                if store.gone(d):
                    continue  # deleted while its copy was written: as if deleted before
                raise
            made += 1
    except BaseException:
        # As route does: a copy that cannot be written (a full disk...) takes back the
        # copies written before it, so that an enqueue that raises leaves nothing behind
        # (retried, as kombu and AMQP clients do, it would be there twice).
        for w, plan in written:
            w.take_back(plan)
        raise
    if full:
        names = ", ".join(repr(d.name) for d in full)
        raise QueueFull(
            f"queue {names} is full (overflow='reject-publish') and refused the message; "
            f"{made} other queue(s) got it: consume from or purge the full queue, or "
            "publish again later"
        )
    return made


def open_store(layout: Layout, config: Settings, ops: Ops | None = None) -> QueueStore:
    """The queue store of the bus laid out as ``layout``; the queues' buses do their file
    operations through ``ops``, as the bus does."""

    def opener(root: str, sub_config: Settings) -> QueueWriter:
        w = QueueWriter(root, sub_config, ops)
        w._fs.log_source = store.log_source  # (the bus's durable log, if it uses one)
        return w

    store = QueueStore(layout.private, config, layout.quarantine, opener, layout.messages)
    return store
