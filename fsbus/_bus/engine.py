"""The async Bus: publish, subscribe, deliver, acknowledge, expire.

One :class:`Bus` owns a task group. Its scanner wakes on inotify or a poll tick, reads
UPDATE, lists the buckets whose stamp changed, decides (pure, in :mod:`fsbus._bus.scan`)
what is new, expired or claimable, then reads or claims messages in one worker-thread
hop per batch and starts handlers under a concurrency limit. Acks and releases are
batched into worker-thread hops the same way. A plain publish runs its file operations
inline on the loop while the filesystem is fast and in batched worker-thread hops while
it is slow (:mod:`fsbus._bus.offload`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import heapq
import inspect
import logging
import math
import operator
import os
import random
import threading
import time
import typing
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any, Literal, NamedTuple, Self, TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from .._core.topics import validate_pattern, validate_topic
from .._core.trie import TopicTrie
from .._core.watch import Waker
from .._errors import ClosedError, FsBusError, QueueFull, UsageError
from .._queues.definition import (
    Definition,
    QueueInfo,
    QueueOptions,
    cycle_of,
    dead_letter_headers,
)
from .._queues.routed import RouteMark
from .._queues.store import Expired, QueueId, QueueStore, queue_id
from .._settings import Settings, settings, was_set
from .browse import browse_messages
from .configured import Configured
from .fs import BusFS, Claim, NameClash, ReadResult, decode_meta
from .iterator import Decline, GiveBack, MessageIterator, Requeue
from .jobs import Batcher, JobQueue
from .layout import Layout, changed_buckets
from .message import BusStatistics, Message, MessageInfo, PublishInfo, PurgeKind, PurgeReport
from .namer import Namer, new_publish_info
from .names import FLAG_META, parse_name
from .offload import Offload, ScanTooBig
from .ops import Ops
from .plan import PublishPlan, payload_bytes
from .purge import check_purge, purge_some, purge_targets
from .queueing import enqueue_each, open_store, refused_in_batch, route_planned
from .retry import Contention, RetrySchedule
from .scan import (
    Entry,
    ScanDecision,
    ScanState,
    decide,
    long_names,
    sort_out,
    split_fresh,
)
from .share import SHARE_EVERY, Share, share_of
from .stamps import peer_may_have_stamped
from .sweep import collect_garbage
from .take import TakeView

if typing.TYPE_CHECKING:
    from .._config import BusConfig

__all__ = ["Bus", "Handler", "Subscription"]

log = logging.getLogger("fsbus.bus")

# typing.Callable (not collections.abc) so the alias can carry a docstring.
Handler = typing.Callable[[Message], Awaitable[None]]
Handler.__doc__ = "A subscription handler: ``async def handler(message: Message) -> None``."
Kind = typing.Literal["any", "multi", "single"]
_KINDS = ("any", "multi", "single")
T = TypeVar("T")
R = TypeVar("R")

_READ_BATCH = 256
_CLAIM_AGAIN = 0.1
"""Seconds at most between scans while work-queue messages are known and a handler is
free (at least ``poll_interval``): see :meth:`Bus._scan_loop`."""
_POLLED_SCAN_EVERY = 1.0
"""Seconds: the longest a bus goes without a scan (a thread reads UPDATE every
``poll_interval`` in between and wakes it when a stamp changed: see :meth:`Bus._watch`)."""
_READ_BATCH_BYTES = 64 << 20
_OWN_RELIST = 1.0
"""Seconds after which a bucket left unlisted for this bus's own stamps is listed anyway."""
_OWN_NAMES_MAX = 65536
"""Own names remembered at most (listings forget them; this bounds the rest)."""
_INLINE_SCAN_NAMES = 2048
"""A scan whose buckets to list held more names than this at their last listings runs in
a worker thread: its listings and decisions would take long enough to stall the event
loop. (Counted over the buckets the scan lists, not the whole bus: a busy bus keeps many
multi messages until they expire, and a scan lists the buckets that changed only.)"""
_DEFAULT_BUFFER = 64
_PURGE_BATCH = 256
"""Messages removed per worker-thread hop of a purge (cancellation waits for one)."""


_EXPIRY_TICK = 1.0
"""Seconds between looks at when the next queue with ``expires`` is due (a stat of each
such queue's ``used``), and at the expired messages of the queues with
``dead_letter_expired``, beside the gc every gc_interval."""
ExpiredHook = Callable[[str, str, list[Expired], str], Awaitable[bool]]
"""See ``Bus._expired_hook``."""

_DEAD_LETTER_LOOK = 0.05
"""Seconds at least between two looks for expired messages of the queues with
``dead_letter_expired``: when the soonest is due sooner than :data:`_EXPIRY_TICK`, the
look is then (a listing of each such queue per look), but no sooner than this, nor than
ten times the previous look's listing took."""
_EXPIRY_LOOK = 0.25
"""Seconds between looks at a queue whose ``expires`` time is up but that is still in
use (a consumer attached): when it is left, it goes within that."""
_REQUEUE = "requeue"
"""The outcome of a handler that raised :class:`~.iterator.Requeue`: a failed delivery,
tried again at once."""
_AT_ONCE = frozenset({_REQUEUE, "unseen"})
"""Outcomes given back to be taken again at once, in their place in the queue, not after
``retry_interval``: a requeue, and a message a subscription claimed ahead and never
handed over (an iterator closed with it buffered), which the next subscription of the
process must find first, not skip."""


Settle = Callable[[BaseException | None], None]
"""How a :attr:`Subscription.deliver_now` consumer settles a message: None when done with
it, or the error its handler would have raised."""
DeliverNow = Callable[[Message, Settle], bool]


class Subscription:
    """A live subscription; close it with :meth:`aclose` or :meth:`Bus.unsubscribe`."""

    def __init__(
        self,
        bus: Bus,
        pattern: str,
        handler: Handler,
        existing: bool,
        kind: Kind = "any",
        prefetch: int | None = None,
    ) -> None:
        self.bus = bus
        self.pattern = pattern
        self.handler = handler
        self.existing = existing
        self.kind = kind
        self.prefetch = prefetch
        self.queue: str | None = None  # the durable queue it consumes, if any
        self.on_close: Callable[[], Awaitable[None]] | None = None
        self.on_queue_gone: Callable[[], Awaitable[None]] | None = None
        """Called (once) when the bus ends this subscription because its queue was
        deleted, by another process or by a bus of this one."""
        self.queue_gone = False  # ended so: its queue was deleted under it
        self.in_flight = 0  # work-queue messages claimed for it and not yet settled
        self.acking = 0
        """Of :attr:`in_flight`, those its consumer is done with whose ack is not on
        disk yet (in the finisher's next batch): they no longer take up its prefetch, as
        RabbitMQ frees a consumer's room at the client's ack."""
        self.rank = 0
        """Its consumer priority (the AMQP gateway's ``x-priority``): of the work-queue
        subscriptions of this bus with room for a message, one of the highest rank gets
        it; one of a lower rank only when those are at their prefetch."""
        self.claiming = 0  # claim rounds under way that may claim for it
        self.lazy_topup = False
        """Claim rounds for it wait until half its prefetch is free (at most
        :data:`_TOPUP_GAP`; see :meth:`Bus._hungry`): set for an iterator's, whose reader
        acks one message at a time. A handler's settle in batches, as does an AMQP
        consumer's (taken up one slot at a time, they were no faster)."""
        self.settled: anyio.Event | None = None  # set when both drop to 0 (if asked)
        self.closed = False
        self.deliver_now: DeliverNow | None = None
        """A consumer that takes a work-queue message without a task (the AMQP gateway's,
        which waits for its client's ack): called on the event loop as each message is
        claimed for it, with the message and a ``settle`` callback. It returns False to
        have the message go to :attr:`handler` as usual (it cannot take it now), or True
        and calls ``settle(None)`` once it is done with it (acked), or ``settle(exc)`` as
        if the handler had raised ``exc`` (a :class:`Requeue` gives it back at once).
        A message still unsettled when the bus closes is given back."""
        self.delivery_limit: int | None = None
        """A queue's subscription: its queue's ``max_deliveries`` (a message delivered
        more often goes to :attr:`handler`, which gives it up)."""
        self.give_up: Callable[[Message, Exception], Awaitable[bool]] | None = None
        """A queue's subscription: for a message a :attr:`deliver_now` consumer settled
        with an error, whether that was its last delivery (dead-lettered: then acked)."""

    async def aclose(self) -> None:
        """Stop receiving messages (handlers already running finish)."""
        await self.bus.unsubscribe(self)

    def __repr__(self) -> str:
        return f"<Subscription {self.pattern!r}{' closed' if self.closed else ''}>"


def _room(sub: Subscription) -> int:
    """How many more work-queue messages ``sub`` (with a prefetch) may be handed."""
    assert sub.prefetch is not None
    return sub.prefetch - sub.in_flight + sub.acking


def _busy(sub: Subscription) -> bool:
    """Whether ``sub`` holds a work-queue message, or a claim round may claim it one."""
    return bool(sub.in_flight or sub.claiming)


_SPARE_CANDIDATES = 4
"""Claim candidates beyond the free handler slots, for claims that fail."""
_LOST_ENOUGH = 4
"""Claims lost in one round (and more than twice those won) after which it stops."""
_INLINE_CLAIMS = 64
"""Candidates in a claim round beyond which it runs in a worker thread whatever the mount
(about 1 ms of claims on a local disk: more would hold the event loop)."""
_CLAIM_ROUND_SECONDS = 0.05
"""How long one round of claims may take before what it won is handed out: hundreds of
claims on a local disk, a handful on a network filesystem, where a claim waits for the
server (the first message then reaches its handler after one claim, not after all)."""
_ROUTER_POLL = 0.25
"""Seconds between a waiting queue consumer's tries to take over routing peers' messages."""
_rank_of = operator.attrgetter("rank")
_ROUTE_GAP = 0.02
"""Seconds a bus that lists its directory only to route peers' messages into the queues
(no subscription of its own: the router of queue consumers) leaves between listings.
Every publish stamps a bucket; listing at each stamp, the router spent more on the
fsbus publishers' messages, which need no routing, than a consumer spends on its own
work. Peers' messages reach the queues up to this much later; nothing is missed, since
the events that come meanwhile are kept for the next listing. A long listing of many
names paces a router as a backlog paces a consumer (:data:`_PACE`): the main bus keeps
every multi message until it expires, so a router's listings grow with what fsbus
publishers send. Unpaced, the router of four queue consumers spent about 1 s of CPU a
50,000-message run listing them, and the flow ran 15-25 % slower. A router whose
listings keep finding no peer's message lists less often still: see
:data:`_ROUTE_GAP_MOST`."""
_ROUTE_GAP_MOST = 0.5
"""Seconds: the longest gap between a router's listings. Each listing that finds no
message of a peer's doubles the gap (from :data:`_ROUTE_GAP`); one that finds one sets it
back. While fsbus publishers keep every bucket changing and no peer publishes, the router
lists twice a second instead of every few tens of milliseconds: its listings of the main
bus (which keeps every multi message until it expires) took a third of the CPU of four
queue consumers. A peer's message that comes after a quiet spell reaches the queues up to
this much later, and only while the bus is busy: a listing due since the gap began waits
for nothing."""
_PACE_FROM = 0.002
"""Seconds: a listing that took longer than this, of buckets holding more than
:data:`_PACE_NAMES` work-queue messages (a backlog), paces the next one (see
:data:`_PACE`)."""
_PACE_NAMES = 256
"""Smaller backlogs never pace, however long their listing took: a network filesystem's
listing is slow for its round trips, not for what it holds. Multi messages do not count:
they stay in their buckets until they expire, delivered or not, and every listing that
finds new ones delivers them all (no other consumer races this bus for them). Counting
them paced fan-out subscribers on a slow disk into idling most of the time: 4.2-5.4k
messages a second to four subscribers where unpaced ones took 8-11k. (A router of
peers' messages, with no subscription of its own, counts every name: see
:data:`_ROUTE_GAP`. Fan-out subscribers short of cores rest less, and only then: see
:data:`_FANOUT_PACE`.)"""
_PACE = 7.0
"""After a long listing, the next one on a filesystem event waits this many times as
long (at most :data:`_PACE_MOST`): listing takes an eighth of a scanner's time, however
big the backlog. (Consumers of a deep queue listed it whole at every publish's stamp,
and the ones losing the race for its head spent their cores listing, taking them from the
publisher and from the consumer doing the work.) Meanwhile the scanner claims from what
it already knows."""
_PACE_MOST = 0.25
"""Seconds: the longest rest after a long listing (what pacing adds to a message's wait)."""
_FANOUT_PACE = 3.0
"""After a long listing that delivered several new multi messages and waited for a core
(its wall time more than twice its CPU time), the next one on a filesystem event waits
this many times as long. Fan-out subscribers that share
the cores with their publisher and with each other list the buckets that changed at
every stamp: every listing reads every name those buckets keep (multi messages stay
until they expire), so listing less often, each time for more new messages, leaves more
of the cores for delivering them. A subscriber with a core to itself never waits for
one and never rests: resting would leave it idle. The rest is short
(:data:`_FANOUT_MOST`)."""
_FANOUT_MOST = 0.01
"""Seconds: the longest rest of a fan-out subscriber short of cores. Its rest ends a
burst later than its listing could have (the events of the burst's end wait for it):
capped at 0.25 s, four subscribers of 10,000 messages took 12.8-13.2k messages a second
on the journaled ext4 (9.4-11.0k unpaced) but of 1,000 messages 8.2-8.6k on tmpfs
(11.3k unpaced); capped at 10 ms, 11.7k and 15.2k of 10,000 on the journaled ext4 and
tmpfs, 10.2k and 11.5k of 1,000 (`python -m bench.run [--quick] --scenarios fanout`)."""


@dataclasses.dataclass(eq=False)
class Held:
    """A message :meth:`Bus._take_held` took from a queue: held until :attr:`settle`."""

    msg: Message
    waiting: int
    """The other messages ready in the queue when it was taken."""
    consumers: int
    """The queue's consumers then."""
    settle: Callable[[BaseException | None], Awaitable[None]]
    """Ack it (None) or give it back (the exception its handler would have raised);
    later calls do nothing."""


class _Rest(NamedTuple):
    """A rest after a long listing: ``factor`` times as long as it took, at most ``most``
    seconds."""

    factor: float
    most: float


_NO_REST = _Rest(0.0, 0.0)
_BACKLOG_REST = _Rest(_PACE, _PACE_MOST)
_FANOUT_REST = _Rest(_FANOUT_PACE, _FANOUT_MOST)


def _pace_after(
    *,
    full: bool,
    took: float,
    cpu: float,
    held: int,
    new_multi: int,
    present_multi: int,
    local: bool,
) -> _Rest:
    """The rest after a listing (:data:`_NO_REST`: none); pure.

    ``took``: its wall time, ``cpu``: its thread's CPU time; ``held``: the work-queue
    messages it found (every name, for a router); ``new_multi`` and ``present_multi``: the
    multi messages new in it and present in the buckets it listed; ``local``: not a
    shared mount (where a listing waits for round trips, not for a core). A full listing
    (each ``refresh_ttl``) is long by nature: it paces nothing."""
    if full or took <= _PACE_FROM:
        return _NO_REST
    if held > _PACE_NAMES:
        return _BACKLOG_REST  # a backlog of work (see _PACE)
    if local and new_multi >= 2 and present_multi > _PACE_NAMES and cpu * 2 < took:
        return _FANOUT_REST  # fan-out short of cores (see _FANOUT_PACE)
    return _NO_REST


_ROUTER_SLACK = 2.0
"""Seconds before the old router's last progress from which a new router routes what it
finds unrouted (clocks of the hosts on a shared mount, and of the filesystem, may differ
a little)."""
_START_SLACK = 0.05
"""Seconds before a queue consumer came from which the first router routes what it
finds (a file's ``st_ctime`` comes from the kernel's coarse clock, a tick behind)."""
_OTHERS_RANK = 1 << 180
"""Or'ed into the heap rank of a work item in another consumer's share of the buckets:
after the own ones of its priority (priority is above bit 184, the publish time below
bit 170), before those of lower priority (see :meth:`Bus._heap_rank`)."""
_BATCH_GAP = 0.004
"""Seconds a work-queue consumer whose last listing found new work leaves before it
lists again on a filesystem event (meanwhile it claims what it knows). In a steady flow
every publish stamps a bucket, and a consumer that listed at each stamp listed a message
or two each time: the listing, not the message, was most of its cost. Four queue
consumers of one publisher took 113 µs of CPU a message with this gap where they took
135 without it, and the flow ran 11 % faster (median of five interleaved runs of 30,000
messages on tmpfs). A consumer that found nothing new (an idle one) lists at the next
event as before: the gap adds to a message's wait only in a busy flow."""
_TOPUP_GAP = 0.004
"""Seconds at most that a claim round waits while every iterator's subscription with room
has room for few messages (see :meth:`Bus._hungry`): a reader acks one message at a
time, and a round for each ack cost more than the claim (each claimed one or two
messages; an iterator at prefetch 16 drained a queue at a third of a handler's rate).
Meanwhile the reader still has half its prefetch or more in hand."""
_TOPUP_ROOM = 16
"""Room for this many messages makes a subscription hungry whatever its prefetch: the
claim rounds stay small enough to run inline (rounds of 50 at prefetch 100 went to the
worker thread, and cost more a message than rounds of 20)."""
_STEAL_AGE_MS = 250
"""Milliseconds after its publication that a work item in another consumer's share of
the buckets may be claimed by a consumer with nothing of its own left (before, it is
left to its owner: see :meth:`Bus._claim_round`)."""
_HEAPIFY_FROM = 256
"""From this many work items listed at once (and no fewer than the heap holds), they
are added to the ready heap whole and it is rebuilt: linear time, not a push each."""
_HELD_WAIT = 0.002
"""Seconds at most before a consumer lists again when its last listing held work back
(published after it began, see :meth:`Bus._take_listed`); a publisher on the same host
stamps UPDATE after such a message anyway, which wakes the consumer sooner."""


class Bus(Configured):
    """A message bus over a directory.

    Use it as an async context manager; everything it starts stops when the block ends,
    and no lock is left held::

        async with Bus("/srv/bus") as bus:
            await bus.subscribe("orders.*", handle)
            await bus.publish("orders.created", b"...")
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        config: BusConfig | None = None,
        ops: Ops | None = None,
    ) -> None:
        self._init(root, settings(config), ops)

    def _init(self, root: str | os.PathLike[str], options: Settings, ops: Ops | None) -> None:
        self._cfg = options
        self._config: BusConfig | None = None  # made from _cfg when asked (config)
        self.root = os.path.abspath(os.fspath(root))
        self.layout = Layout.of(self.root, self._cfg)
        self._fs = BusFS(self.layout, self._cfg, ops)
        self._fs.spares = True  # (on a local filesystem: see BusFS.publish_plain)
        self._namer = Namer(self.layout, self._cfg)
        self._buckets = self.layout.buckets
        self._max_payload = self._cfg.max_payload_size
        self._queues: QueueStore = open_store(self.layout, self._cfg, ops)
        # A main bus's stamps say they are fsbus's while a router is at work (stamps.py)
        self._fs.tag_stamps = True
        self._queues.on_router = self._fs.note_router
        self._queues.on_spooled = self._nudge_gc
        self._fs.router_active = self._queues.router_active
        self._queue_buses: dict[str, _Hosted] = {}
        # Queue -> this bus's consumer files of it -> their subscriptions (None while
        # attaching): counted from here, not from their flocks (see queue_info).
        self._own_consumers: dict[str, dict[str, Subscription | None]] = {}
        self._queue_name: str | None = None  # the queue whose messages this bus holds
        # A queue's bus whose expired messages are dead-lettered by the main buses
        # (QueueStore.dead_letter_expired): it leaves them where they are.
        self._keep_expired = False
        # When the soonest message of a queue with dead_letter_expired expires (time.time())
        self._dead_letter_due: float | None = None
        self._dead_letter_look = _DEAD_LETTER_LOOK  # seconds at least between two looks
        self._census_at = 0.0  # time.time() of the last listing for expired messages
        # this process dead-letters for a queue with dead_letter_dropped: look at its
        # spool every _DEAD_LETTER_LOOK
        self._spooling = False
        # A queue's bus, its queue capped with drop-head: after it gives a message back
        self._given_back: Callable[[], Awaitable[None]] | None = None
        # wakes the gc loop early (_nudge_gc): a queue here spooled what it dropped
        self._gc_wake = anyio.Event()
        self._gc_nudged = threading.Event()
        self._gc_token: anyio.lowlevel.EventLoopToken | None = None
        self._gc_thread: int | None = None
        # Takes the expired messages of a queue (queue, dead-letter topic, messages) that it
        # sends on itself (True), instead of their publish under the dead-letter topic: an
        # AMQP gateway routes them to the queue's dead-letter exchange at once.
        self._expired_hook: ExpiredHook | None = None
        self._queue_buses_starting: dict[str, anyio.Event] = {}
        self._hosts: dict[str, str] = {self._namer.host: self._namer.hostname}
        self._trie: TopicTrie[Subscription] = TopicTrie()
        # Topic and kind ("m" or "s") -> subscriptions wanting it; a new dict whenever the
        # subscriptions change (a worker thread may still read the previous one).
        self._target_cache: dict[tuple[str, str], list[Subscription]] = {}
        self._want_cache: dict[str, bool] = {}
        # Own multi messages no subscription here wanted (see BusFS.stamp_own): their
        # names, until a listing sees them (never delivered here, then), and the buckets
        # left unlisted for their stamps, with when that began.
        self._own_names: set[str] = set()
        self._own_dirty: dict[int, float] = {}
        # A queue's bus with several consumers: the buckets this process lists first, the
        # changes to the others' it put off (share.py), and the others' buckets listed by
        # the current scan (all their work items go on the heap).
        self._share = Share()
        self._share_look: Callable[[], Awaitable[frozenset[int] | None]] | None = None
        self._others_listed: set[int] = set()
        self._subs: list[Subscription] = []
        self._existing_pending: list[Subscription] = []
        self._state = ScanState()
        self._last_update: bytes | None = None
        self._last_refresh = 0.0
        self._retries = RetrySchedule()
        self._contention = Contention()
        self._listing_took = 0.0  # seconds the last listing took, if it was big (_PACE)
        self._pace = _BACKLOG_REST  # the rest after it (see _pace_after)
        self._list_cpu = 0.0  # CPU seconds the last listing took (its thread's)
        self._found_work = False  # the last listing found new work items (_BATCH_GAP)
        self._route_gap = _ROUTE_GAP  # a router's gap between listings (_ROUTE_GAP_MOST)
        self._passed_by_stamps = False  # (a router's, since its last full listing)
        self._passed: set[int] = set()  # buckets passed over by stamps since listed
        self._cut_ms: int | None = None  # when a subscription came to a router (_scan)
        self._full_wall = 0.0  # when the last full listing began (time.time)
        self._in_flight: set[tuple[int, str]] = set()
        # Work items this bus acked (removed), with when (time.monotonic), while a
        # listing that began before the ack may put them on the heap, or they are on it:
        # claiming one would look like losing it to another consumer (_claim_round).
        self._acked_keys: dict[tuple[int, str], float] = {}
        # (rank, push order, entry): a heap comparison is one integer comparison
        self._ready: list[tuple[int, int, Entry]] = []
        self._ready_keys: set[tuple[int, str]] = set()
        self._ready_seq = 0
        self._ranked_share: frozenset[int] | None = None  # what the heap is ordered by
        # When another consumer's work that a claim round left to it may be taken here
        # (time.monotonic; None: none was left).
        self._steal_at: float | None = None
        self._topup_due: float | None = None  # see _hungry
        # Buckets whose listing proved stale (a claim was lost there): listed next scan.
        self._stale_buckets: set[int] = set()
        # Work published after the last listing began (its wall clock, ms, taken before
        # it read UPDATE): held back from the heap until the next listing (split_fresh).
        self._horizon_ms = 0
        self._held_back: list[Entry] = []
        self._force_full = False
        self._iterators: set[MessageIterator] = set()
        self._workers_started = False
        self._tg: anyio.abc.TaskGroup | None = None  # the runner's: every task of the bus
        self._host: anyio.abc.TaskGroup | None = None  # the entering task's: the runner only
        self._runner_task: int | None = None
        self._stop = anyio.Event()  # set to make the runner stop
        self._stopped = anyio.Event()  # set when it has stopped and the bus is closed
        self._waker = Waker(self.layout.update_dir, use_inotify=not self._cfg.force_polling)
        self._poll_interval = self._cfg.poll_interval  # or the platform's (_follow_platform)
        self._scan_every = self._poll_interval  # longest wait between scans
        self._poll_thread = False  # UPDATE polled by a thread of the Waker
        self._free = self._cfg.handler_concurrency
        self._freed: anyio.Event | None = None  # set when a slot frees (made by a waiter)
        # Handlers run in a fixed pool of worker tasks fed by this queue: cheaper than a
        # task per message. Slots (_free) bound what is queued plus what runs.
        self._jobs = JobQueue()
        self._scanning = False
        self._watching = False  # UPDATE watched (from the first scan on: _watch)
        self._router_waiting = False  # a task waits to route peers' messages (_await_router)
        self._route_since: float | None = None  # a new router's first listing routes from
        self._open = False
        self._closed = False
        # Plain publishes: inline on the loop while the mount is fast, else in a thread.
        self._offload = Offload(self._fs)
        self._finisher: Batcher[tuple[Claim, str], None] = Batcher(
            self._finish_many, 256, self._run_finishing
        )
        # Rename claims held by running handlers: their leases are renewed (_renew_loop).
        self._held: dict[tuple[int, str], Claim] = {}
        self._deferred: dict[tuple[int, str], Claim] = {}
        """Claims handed to a :attr:`Subscription.deliver_now` consumer, not yet settled."""
        self._take_view: TakeView | None = None  # what gets on this (a queue's) bus listed
        self._counts = dict.fromkeys(
            (
                "published delivered acked released failed dead_lettered expired quarantined scans "
                "claims_lost leases_lost peer_routed"
            ).split(),
            0,
        )

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Self:
        if self._open or self._closed:
            raise UsageError("a Bus can be entered once; create a new one")
        await anyio.to_thread.run_sync(self._setup)
        self._follow_platform()
        # A mount other hosts share can stall for seconds unannounced: never inline there.
        self._offload.inline_allowed = not self._fs.platform.shared
        # The entering task hosts a single task, the runner, and every task the bus
        # starts runs in the runner's own task group. Stopping the bus is then a signal
        # to the runner, which any task can give (see aclose); only leaving this empty
        # host group is left to the entering task.
        host = anyio.create_task_group()
        await host.__aenter__()
        try:
            await host.start(self._run)
        except BaseException:
            with anyio.CancelScope(shield=True):
                host.cancel_scope.cancel()
                await host.__aexit__(None, None, None)
            self._closed = True
            self._fs.close()
            raise
        self._host = host
        self._open = True
        return self

    def _setup(self) -> None:
        self._fs.setup()
        self._fs.finish_setup(self._namer.host, self._namer.hostname)
        self._queues.log_source = self._fs.log_source

    def _follow_platform(self) -> None:
        """Watch and poll as the filesystem needs (read by setup), unless configured."""
        platform = self._fs.platform
        if platform.watch == "poll":
            self._waker.use_inotify = False
            self._poll_thread = self._fs.layout.update_size > 0
        if platform.poll_interval is not None and not was_set(self._cfg, "poll_interval"):
            self._poll_interval = platform.poll_interval

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._begin_close()
        host, self._host = self._host, None
        if host is None:
            await self.aclose()
        else:
            # Waits for the runner, even when this task is being cancelled.
            await host.__aexit__(None, None, None)
        return None

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """The runner: hosts every task of the bus until it is told to stop, then closes."""
        self._runner_task = anyio.get_current_task().id
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._offload.run)
                tg.start_soon(self._finisher.run)
                if self._fs.read_only is None:  # (open for looking only: no gc)
                    tg.start_soon(self._gc_loop)
                if self._fs.locking == "rename":
                    tg.start_soon(self._renew_loop)
                task_status.started()
                try:
                    await self._stop.wait()
                finally:
                    # Told to stop, or cancelled with the task that entered the bus:
                    # close the same way (iterators see their end, handlers are cancelled).
                    self._begin_close()
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self._shut_down()
            self._stopped.set()

    async def _shut_down(self) -> None:
        """After every task of the bus ended: give back unstarted work, stop watching."""
        # Work claimed but never started goes back, uncounted.
        queued = [args[2] for fn, args in self._jobs.take_all() if fn == self._run_single]
        # and what deliver_now consumers held unsettled (counted: they had it)
        held, self._deferred = list(self._deferred.values()), {}
        try:
            if queued:

                def give_back() -> None:
                    for c in queued:
                        self._fs.release(c, failed=False, uncount=True)

                await anyio.to_thread.run_sync(give_back)
                self._counts["released"] += len(queued)
            if held:

                def give_held_back() -> None:
                    for c in held:
                        with contextlib.suppress(Exception):
                            self._fs.release(c, failed=False)

                await anyio.to_thread.run_sync(give_held_back)
                self._counts["released"] += len(held)
            await anyio.to_thread.run_sync(self._waker.stop)
        finally:
            self._fs.close()
            self._queues.close()
            self._open = False

    def _begin_close(self) -> None:
        """Refuse new work, end the iterators and tell the runner to stop (idempotent)."""
        if self._closed and self._stop.is_set():
            return
        self._closed = True
        for it in list(self._iterators):
            it._close()  # a consumer waiting on it sees its end instead of waiting forever
        self._stop.set()

    async def aclose(self) -> None:
        """Stop scanning, cancel running handlers (their singles are released), close.

        Any task may call it, as often as it likes: it returns once the bus is closed,
        every handler has ended and every work-queue message this bus held is released
        or acknowledged on disk; a later call returns at once. Called from inside the
        bus (a handler, or a task a handler started in its own task group), it only
        starts the close and returns: waiting there would wait for itself. That handler
        is then cancelled at its next ``await`` like the others, and its work-queue
        message released, unless it returns first (then it is acknowledged). A caller
        cancelled while it waits stops waiting; the close goes on.

        The end of the ``async with`` block (``__aexit__``, in the task that entered
        the bus) still has to come: it leaves the task group that task opened. Enter a
        Bus with ``async with`` or an ``AsyncExitStack``, not by calling ``__aenter__``.
        """
        self._begin_close()
        if self._runner_task is None or self._in_bus_task():
            return  # never entered, or called from inside: do not wait for ourselves
        await self._stopped.wait()

    def _in_bus_task(self) -> bool:
        """Whether the calling task is the runner or below it (a handler, a scan...)."""
        runner = self._runner_task
        parents = {t.id: t.parent_id for t in anyio.get_running_tasks()}
        task: int | None = anyio.get_current_task().id
        for _ in range(len(parents) + 1):
            if task is None:
                return False
            if task == runner:
                return True
            task = parents.get(task)
        return False

    def _check_open(self) -> anyio.abc.TaskGroup:
        if self._closed:
            raise ClosedError("this Bus is closed; open a new one")
        if self._tg is None:
            raise UsageError("use the Bus as `async with Bus(root) as bus:` before calling it")
        return self._tg

    def _check_writable(self, what: str) -> anyio.abc.TaskGroup:
        """:meth:`_check_open`, and that this bus is not open for looking only."""
        tg = self._check_open()
        self._fs.check_writable(what)
        return tg

    # ------------------------------------------------------------------ publish
    async def publish(
        self,
        topic: str,
        payload: bytes | str | os.PathLike[str] | AsyncIterable[bytes],
        *,
        single: bool = False,
        ttl: float | None = None,
        durable: bool = False,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> PublishInfo:
        """Publish a message; returns once it is visible to subscribers.

        ``payload`` is bytes, str (UTF-8), a path to a file (streamed, not loaded) or an
        async iterable of byte chunks. ``single`` makes it a work-queue message that
        exactly one consumer handles; ``ttl`` is in seconds; ``durable`` makes the
        message survive power loss once this returns (its file and directory synced, or
        on a local journaled ext4 one record of it synced in the process's durable log:
        ``BusConfig.durable_log``); ``priority`` (0-255, lower first) orders work-queue
        messages.

        A message is all or nothing on disk. Its file operations run on the event loop
        while the filesystem is fast and in a worker thread while it is slow (durable
        publishes always in the thread). A call cancelled while its message waits for or
        is written in the thread is withdrawn, unless its final rename had started: then
        the message is placed before the cancellation is raised. Nothing appears after
        the call raised, but a message cancelled during its rename was published, so
        republishing after a cancellation can deliver it twice.
        """
        if (
            (type(payload) is bytes or type(payload) is str)
            and ttl is None
            and headers is None
            and priority is None
            and not durable
            and self._offload.inline
            and not self._closed
            and self._tg is not None
        ):
            # The common call while publishing inline, at a fraction of the general
            # path's cost (as BlockingBus.publish): the same name, file and stamp, without
            # a plan. Anything it does not take goes the general way.
            named = self._namer.name_plain(topic, single)
            if named is not None and not self._queues.targets(topic):
                data = payload.encode("utf-8") if isinstance(payload, str) else payload
                if len(data) <= self._max_payload:
                    name, bi, expires_ms = named
                    own = self._own(topic, single, name)
                    try:
                        placed = await self._offload.publish_plain(name, bi, data, own)
                    except NameClash:  # astronomically rare: the general path renames it
                        placed = None
                        self._own_names.discard(name)
                    except BaseException:
                        self._own_names.discard(name)
                        raise
                    if placed is not None:
                        self._counts["published"] += 1
                        return new_publish_info(
                            topic,
                            name,
                            self._buckets[bi],
                            placed,
                            True if single else False,  # as bool(single), without the call
                            expires_ms / 1000,
                            len(data),
                        )
        self._check_open()
        plan = self.plan(topic, single, ttl, durable, headers, priority)
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if self._offload.inline:
            targets = self._queues.targets(topic)
        else:
            # The routing table looks at its VERSION file every few milliseconds: on a
            # slow mount, not from the loop (a hop only when it is due).
            fresh = self._queues.targets_if_fresh(topic)
            targets = (
                fresh
                if fresh is not None
                else await anyio.to_thread.run_sync(self._queues.targets, topic)
            )
        if not targets and self._own(topic, single, plan.name):
            plan = plan._replace(own=True)  # as on the fast path above
        if targets:
            # Durable queues are bound to it: a copy goes into each before this returns.
            if not isinstance(payload, bytes | bytearray | memoryview):
                payload = await _gather_payload(payload)
            data = bytes(payload)
            self._namer.check_size(len(data))
            # The message and its copies together (see route). Durable: synced together,
            # in a worker thread; not withdrawn when cancelled, the call waits for it to
            # land. A queue with a max_length is counted now and then to keep to it:
            # in the thread too. Otherwise inline while publishing is (five calls a
            # file, as a plain publish), in the thread when the mount is slow.
            planned = [plan]
            routed = self._router(planned, data, targets, single, ttl, durable, headers, priority)
            if durable or any(d.options.max_length is not None for d in targets):
                size = await anyio.to_thread.run_sync(routed)
            else:
                size = await self._offload.call(routed)
            plan = planned[0]
        elif isinstance(payload, bytes | bytearray | memoryview):
            data = bytes(payload)
            try:
                self._namer.check_size(len(data))
                size = await self._offload.publish(plan, data)
            except NameClash:  # astronomically rare: name it again
                self._own_names.discard(plan.name)
                plan = self.plan(topic, single, ttl, durable, headers, priority)
                size = await self._offload.publish(plan, data)
            except BaseException:
                self._own_names.discard(plan.name)  # not published: never listed
                raise
        elif isinstance(payload, str | os.PathLike | AsyncIterable):
            try:
                if isinstance(payload, AsyncIterable):
                    size = await self._publish_stream(plan, payload)
                else:
                    size = await anyio.to_thread.run_sync(self._fs.publish, plan, payload)
            except BaseException:
                self._own_names.discard(plan.name)  # not published: never listed
                raise
        else:
            raise UsageError(
                "payload must be bytes, str, a path or an async iterable of bytes, not "
                f"{type(payload).__name__}"
            )
        self._counts["published"] += 1
        return self._namer.info(plan, size)

    def _router(
        self,
        planned: list[PublishPlan],
        data: bytes,
        targets: tuple[Definition, ...],
        single: bool,
        ttl: float | None,
        durable: bool,
        headers: dict[str, str] | None,
        priority: int | None,
    ) -> Callable[[], int]:
        """Blocking: publish ``planned[0]`` with a copy in each of the queues ``targets``
        (:func:`route_planned`); its size."""
        topic = planned[0].topic
        return functools.partial(
            route_planned,
            self._queues,
            self._fs,
            targets,
            planned,
            data,
            lambda: self.plan(topic, single, ttl, durable, headers, priority),
            ttl=ttl,
            durable=durable,
            headers=headers,
            priority=priority,
        )

    async def _publish_into(
        self, topic: str, data: bytes, targets: tuple[Definition, ...], headers: dict[str, str]
    ) -> None:
        """Publish as :meth:`publish` does, but with copies in the queues ``targets``
        only, not in every queue bound to ``topic`` (a dead letter leaves out the queue
        it expired in, or was dropped from: going back there would close a cycle, which
        RabbitMQ breaks too)."""
        self._check_open()
        plan = self.plan(topic, False, None, False, headers, None)
        self._namer.check_size(len(data))
        if targets:
            routed = self._router([plan], data, targets, False, None, False, headers, None)
            await anyio.to_thread.run_sync(routed)
        else:
            try:
                await self._offload.publish(plan, data)
            except NameClash:  # astronomically rare: name it again
                plan = self.plan(topic, False, None, False, headers, None)
                await self._offload.publish(plan, data)
        self._counts["published"] += 1

    async def publish_many(
        self,
        items: Sequence[tuple[str, bytes | str]],
        *,
        single: bool = False,
        ttl: float | None = None,
        durable: bool = False,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> list[PublishInfo]:
        """Publish many (topic, payload) pairs with the same options in one batch.

        As many ``publish`` calls one after the other: a message a full reject-publish
        queue refuses raises :class:`QueueFull`, the ones before it published, it and
        the ones after it not."""
        self._check_open()
        checked: list[tuple[str, bytes]] = []
        for topic, payload in items:
            data = payload_bytes(payload)
            self._namer.check_size(len(data))
            self._namer.check_topic(topic)
            checked.append((topic, data))
        if checked:  # the options, the same for every message: checked with the first
            self.plan(checked[0][0], single, ttl, durable, headers, priority)
        copies = [
            (i, targets, topic, data)
            for i, (topic, data) in enumerate(checked)
            if (targets := self._queues.targets(topic))
        ]
        # one worker-thread hop for each step of the batch, not one per message
        full: QueueFull | None = None
        if any(d.options.max_length is not None for _, t, _, _ in copies for d in t):

            def check_rooms() -> tuple[int, QueueFull] | None:
                # As one publish after the other: the first message a full reject-publish
                # queue refuses (the batch's copies before it counted in) and why.
                ahead: dict[str, int] = {}
                for i, targets, topic, data in copies:
                    if any(d.options.max_length is not None for d in targets):
                        try:
                            self._queues.check_room(targets, (topic, data, headers), ahead)
                        except QueueFull as exc:
                            return i, exc
                    for d in targets:
                        ahead[d.name] = ahead.get(d.name, 0) + 1
                return None

            refused = await anyio.to_thread.run_sync(check_rooms)
            if refused is not None:  # published up to it, as publish() one by one would
                cut, full = refused
                checked = checked[:cut]
                copies = [c for c in copies if c[0] < cut]

        def name(topic: str) -> PublishPlan:
            # named as it goes out: after the one before it was placed and stamped
            return self.plan(topic, single, ttl, durable, headers, priority)

        results = await anyio.to_thread.run_sync(self._fs.publish_many, checked, name, durable)
        out = []
        for plan, r in results:
            if isinstance(r, BaseException):
                raise r
            assert plan is not None  # (a result that is no error had its plan)
            out.append(self._namer.info(plan, r))
        if copies:

            def route_all() -> None:
                for _, targets, topic, data in copies:
                    enqueue_each(
                        self._queues,
                        targets,
                        topic,
                        data,
                        ttl=ttl,
                        durable=durable,
                        headers=headers,
                        priority=priority,
                        rooms_checked=True,  # all of them, before anything was published
                    )

            # (durable: one record of the durable log for every copy, where it is used)
            await anyio.to_thread.run_sync(
                functools.partial(self._fs.durably, route_all, many=True) if durable else route_all
            )
        self._counts["published"] += len(out)
        if full is not None:
            raise refused_in_batch(full, len(out), len(items))
        return out

    def plan(
        self,
        topic: object,
        single: bool,
        ttl: float | None,
        durable: bool,
        headers: object,
        priority: int | None,
    ) -> PublishPlan:
        """Validate a publish and name its file (no I/O)."""
        return self._namer.plan(topic, single, ttl, durable, headers, priority)

    async def _publish_stream(self, plan: PublishPlan, chunks: AsyncIterable[bytes]) -> int:
        fd = await anyio.to_thread.run_sync(self._fs.begin, plan)
        total = 0
        try:
            iterator = aiter(chunks)
            try:
                async for chunk in iterator:
                    if not isinstance(chunk, bytes | bytearray | memoryview):
                        raise UsageError(
                            f"payload chunks must be bytes, not {type(chunk).__name__}; "
                            "encode text chunks first (chunk.encode())"
                        )
                    total += len(chunk)
                    self._namer.check_size(total)
                    await anyio.to_thread.run_sync(self._fs.write_chunk, fd, bytes(chunk), plan)
            finally:
                await _close_iterator(iterator)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._fs.abort, plan, fd)
            raise
        await anyio.to_thread.run_sync(self._fs.commit, plan, fd)
        return total

    # ------------------------------------------------------------------ subscribe
    async def subscribe(
        self,
        pattern: str | None,
        handler: Handler,
        *,
        existing: bool = False,
        kind: Kind = "any",
        prefetch: int | None = None,
        queue: str | None = None,
    ) -> Subscription:
        """Call ``handler(message)`` for every message matching ``pattern``.

        Multi messages reach every subscription; a single (work-queue) message reaches one
        handler on the whole bus, is acknowledged when the handler returns and released for
        redelivery when it raises. ``existing`` also delivers multi messages already present.
        ``kind`` limits the subscription to ``"multi"`` messages (an observer that never takes
        work-queue messages) or to ``"single"`` ones (a worker); ``"any"`` takes both.
        ``prefetch`` caps the work-queue messages claimed for this subscription at once
        (None: up to ``handler_concurrency``), so one consumer does not hoard work.

        ``queue`` consumes the durable queue of that name instead (see
        :meth:`declare_queue`): each message once across its consumers, acknowledged
        when the handler returns; a ``pattern`` given too is bound to the queue first
        (safe to repeat). ``pattern`` may be None then.
        """
        if queue is not None:
            if existing or kind not in ("any", "single"):
                # a queue's messages are work-queue copies, each taken once, and the
                # queue holds what was published before its consumer: neither applies
                raise UsageError(
                    f"existing= and kind= do not apply to a queue's consumer (queue={queue!r}"
                    f" with existing={existing!r}, kind={kind!r}): a queue holds every "
                    "message routed to it since it was declared, each taken once; leave "
                    "them out"
                )
            return await self._subscribe_queue(queue, pattern, handler, prefetch)
        if pattern is None:
            raise UsageError("give a pattern, or queue= to consume a durable queue")
        tg = (
            self._check_open()
            if kind == "multi"
            else self._check_writable(
                f"a subscription that takes work-queue messages (kind={kind!r})"
            )
        )
        pattern = validate_pattern(pattern)
        if not _is_async_callable(handler):
            raise UsageError(
                f"handler must be an async function (async def), not {handler!r}; for "
                "blocking code use BlockingBus.messages() or call it with anyio.to_thread"
            )
        if prefetch is not None and (
            not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 1
        ):
            raise UsageError(f"prefetch must be a positive int or None, not {prefetch!r}")
        if kind not in _KINDS:
            raise UsageError(f"kind must be one of {', '.join(_KINDS)}, not {kind!r}")
        sub = Subscription(self, pattern, handler, existing, kind, prefetch)
        self._trie.add(pattern, sub)
        self._subs.append(sub)
        self._target_cache = {}
        self._want_cache = {}
        if existing:
            self._existing_pending.append(sub)
        if not self._scanning:
            try:
                await self._start_scanning(tg)
            except BaseException:
                await self.unsubscribe(sub)
                raise
        else:
            # Work items already present reach a worker promptly: every bucket is listed
            # again for it. A subscription to multi messages only needs no such listing
            # (the messages published after it returns are new to the next listings; one
            # with ``existing`` gets a full listing of its own): on a bus that keeps
            # thousands of messages, that listing takes milliseconds.
            if kind != "multi":
                self._force_full = True
            if self._cut_ms is None:
                self._cut_ms = int(time.time() * 1000)  # (buckets a router passed over)
            self._waker.wake()  # (the scan loop may rest, routing only, until woken)
        return sub

    def _watch(self, tg: anyio.abc.TaskGroup) -> None:
        """Start watching UPDATE, once: when the bus first scans. A bus that only
        publishes watches nothing (its own stamps would wake its loop for nothing)."""
        if self._watching:
            return
        self._watching = True
        if self._waker.start():
            tg.start_soon(self._waker.run)
        if self._fs.layout.update_size > 0:
            # A thread reads UPDATE every tick and wakes the scanner only when it
            # changed; the scan loop itself then looks at least once a second. Where
            # polling is how other hosts are seen (network filesystems, or no inotify)
            # it reads more often for a second after a change; beside inotify, which
            # wakes the scanner at once, it is the safety net. (The scan loop polled
            # itself every tick before: a thread hop and a scan ten times a second,
            # some 3% of a core for an idle subscriber.)
            hurry = self._poll_thread or not self._waker.inotify_active
            self._waker.start_poller(self._fs.read_update, self._poll_interval, hurry=hurry)
            self._scan_every = max(self._poll_interval, _POLLED_SCAN_EVERY)

    async def _start_scanning(self, tg: anyio.abc.TaskGroup) -> None:
        # Watch first, then list every bucket, so that anything published after this
        # call returns is new to this bus and wakes it (anything before is "existing").
        self._scanning = True
        # Own stamps are told apart only where every stamp is a local write seen at once
        # (on a shared mount, reads of UPDATE may lag other hosts' writes).
        self._fs.track_own = not self._fs.platform.shared
        self._watch(tg)
        if not self._workers_started:
            # Handlers of the first scan (existing messages) need the pool running;
            # its workers start as jobs come.
            self._workers_started = True
            self._jobs.start(tg, self._cfg.handler_concurrency)
        try:
            await self._scan(baseline=True, deliver=False)
        except BaseException:
            self._scanning = False
            raise
        tg.start_soon(self._scan_loop)

    async def unsubscribe(self, sub: Subscription) -> None:
        """Remove a subscription; messages already handed to it finish."""
        if sub.closed:
            return
        if sub.bus is not self:  # a queue's subscription: its own bus holds it
            await sub.bus.unsubscribe(sub)
            return
        sub.closed = True
        if sub.on_close is not None:
            with anyio.CancelScope(shield=True):
                await sub.on_close()
        self._trie.remove(sub.pattern, sub)
        self._subs.remove(sub)
        self._target_cache = {}
        self._want_cache = {}
        if sub in self._existing_pending:
            self._existing_pending.remove(sub)

    @asynccontextmanager
    async def messages(
        self,
        pattern: str | None = None,
        *,
        existing: bool = False,
        kind: Kind = "any",
        buffer: int = _DEFAULT_BUFFER,
        prefetch: int = 1,
        queue: str | None = None,
        ack_previous: bool = True,
    ) -> AsyncIterator[MessageIterator]:
        """Receive matching messages with ``async for``.

        Work-queue messages must be acknowledged with :meth:`MessageIterator.ack` (or are
        acknowledged when the next message is asked for, unless ``ack_previous=False``:
        then only when asked, so a batch can be taken first and acknowledged once it is
        stored) or given back with :meth:`MessageIterator.release`. Leaving the block
        releases what is not acked.
        """
        it = MessageIterator(buffer, ack_previous=ack_previous)
        try:
            sub = await self.subscribe(
                pattern, it._handle, existing=existing, kind=kind, prefetch=prefetch, queue=queue
            )
        except BaseException:
            it._close()  # a bad pattern or a closed bus: do not leak the streams
            raise
        it.subscription = sub
        sub.lazy_topup = True  # its reader acks one message at a time
        self._iterators.add(it)
        try:
            yield it
        finally:
            self._iterators.discard(it)
            with anyio.CancelScope(shield=True):
                # Give back what it holds first: a queue consumer leaves only once its
                # messages are settled (see _subscribe_queue), and these would wait on us.
                it._close()
                await self.unsubscribe(sub)
                # Leave only when every message it took is settled on disk: acked ones
                # consumed, the rest released (the engine does that in its handler tasks).
                with anyio.move_on_after(10):
                    while _busy(sub) and not sub.bus._closed:
                        sub.settled = anyio.Event()
                        await sub.settled.wait()

    # ------------------------------------------------------------------ scanning
    async def _scan_loop(self) -> None:
        baseline = False
        listing_due = True
        listed_at = 0.0
        while True:
            if self._share_look is not None and time.monotonic() >= self._share.next_look:
                self._share.next_look = time.monotonic() + SHARE_EVERY
                try:
                    self._share.mine = await self._share_look()
                except OSError:
                    self._share.mine = None
                self._rerank(self._share.mine)
            try:
                if listing_due:
                    listed_at = time.monotonic()
                    await self._scan(baseline=baseline)
                    baseline = False
                elif self._ready_keys and self._free > 0:
                    # Woken only because handlers finished: claim more of what the last
                    # listings showed, without listing again.
                    await self._claim_ready()
            except ClosedError:
                return
            except (FsBusError, OSError) as exc:
                # The directory failed under us (unmounted, permissions changed...): say so
                # and keep trying; publishing and closing still work.
                log.warning("scanning %s failed: %s; retrying", self.root, exc)
                await anyio.sleep(max(self._poll_interval, 1.0))
            now = time.monotonic()
            timeout = self._scan_every
            if self._ready_keys and self._free > 0:
                # Work-queue messages known and a handler free, yet none claimed (others
                # hold the first ones, backing off until retry_interval): look again each
                # poll tick, as an idle bus does not, so the next round tries those behind
                # them instead of waiting for the first ones to come due again.
                timeout = min(timeout, max(self._poll_interval, _CLAIM_AGAIN))
            due = self._retries.next_due()
            if due is not None:
                timeout = max(0.0, min(timeout, due - now))
            deadline = self._share.deadline()
            if deadline is not None:
                timeout = max(0.0, min(timeout, deadline - now))
            if self._share_look is not None:
                timeout = max(0.0, min(timeout, self._share.next_look - now))
            paced_until = self._paced_until(listed_at)
            quiet_until = max(self._contention.until, paced_until)
            if self._held_back:  # work held back by the last listing: list again soon
                timeout = min(timeout, max(_HELD_WAIT, quiet_until - now))
            if self._found_work:  # in a busy flow: events wait a little (_BATCH_GAP)
                paced_until = max(paced_until, listed_at + _BATCH_GAP)
                quiet_until = max(quiet_until, paced_until)
            # A router (it lists only to route peers' messages) rests between listings,
            # poll ticks included (_ROUTE_GAP, _ROUTE_GAP_MOST).
            rest_until = 0.0 if self._subs else listed_at + self._route_gap
            quiet_until = max(quiet_until, rest_until)
            if self._own_dirty:
                # Buckets left unlisted for this bus's own stamps are listed once they
                # wait _OWN_RELIST (see _list): a scan then (a little after, not before).
                first = next(iter(self._own_dirty.values()))
                at = max(first + _OWN_RELIST + 0.005, rest_until)
                timeout = max(0.0, min(timeout, at - now))
            if quiet_until > now and self._waker.fs_event_pending:
                # an event kept back during the quiet spell: list when the spell ends
                timeout = min(timeout, quiet_until - now)
            # Another's work left to it comes due: a claim round then, not a listing.
            steal_at, steal_only = self._steal_at, False
            if steal_at is not None and steal_at - now < timeout:
                steal_only, timeout = True, max(0.0, steal_at - now)
            self._waker.quiet_until = quiet_until
            woken = await self._waker.wait(timeout)
            if steal_only and not woken:
                self._steal_at = None  # (the claim round below sets it again if need be)
            # List again on a filesystem event, a poll tick, a retry that fell due, a new
            # subscription, or when handlers are free and nothing known is left to claim.
            now = time.monotonic()
            resting = not self._subs and now < rest_until  # (a subscription may have come)
            quiet = self._contention.quiet(now) or now < paced_until or resting
            fs_event = self._waker.take_fs_event()
            if fs_event and woken and (quiet or (self._free <= 0 and self._ready_keys)):
                # Every handler is busy and known work is waiting: listing now could not
                # start anything. Or other consumers won the last claims: listing at once
                # would race them again. Keep the event for when a slot frees or the
                # quiet spell ends (fewer scans under load, more claimed per scan).
                self._waker.keep_fs_event()
                fs_event = False
            due = self._retries.next_due()
            listing_due = (
                (not woken and not steal_only and not resting)
                or fs_event
                or self._force_full
                or bool(self._existing_pending)
                or (not self._ready_keys and not quiet)
                or (due is not None and due <= now)
                or (deadline is not None and deadline <= now)
            )

    def _paced_until(self, listed_at: float) -> float:
        """No listing on a filesystem event before this time (``time.monotonic``): an
        incremental listing of many names (:data:`_PACE_NAMES`) that took long
        (:data:`_PACE_FROM`) is followed by a rest :data:`_PACE` times as long as it took,
        at most :data:`_PACE_MOST` (a fan-out subscriber's: :data:`_FANOUT_PACE` times, at
        most :data:`_FANOUT_MOST`)."""
        took, rest = self._listing_took, self._pace
        return listed_at + took + min(took * rest.factor, rest.most) if took else 0.0

    async def _scan(self, *, baseline: bool, deliver: bool = True) -> None:
        """List what changed and act on it.

        ``deliver=False`` (the first listing, made inside :meth:`subscribe`) only learns
        what is present: delivering there could block ``subscribe`` itself (an iterator
        whose buffer fills before its owner starts reading); the scan loop delivers.
        """
        now = time.monotonic()
        wall = time.time()
        full = (
            baseline
            or self._force_full
            or bool(self._existing_pending)
            or (now - self._last_refresh >= self._cfg.refresh_ttl)
        )
        self._force_full = False
        # Taken before listing: a subscription added while the listing runs waits for
        # the next scan, which lists every bucket for it (this one may not).
        existing_subs = self._existing_pending if deliver else []
        if deliver:
            self._existing_pending = []
        due = self._retries.take_due(now)
        retry = {bi for bi, _ in due}
        relist, self._stale_buckets = retry | self._stale_buckets, set()
        cut: tuple[frozenset[int], int] | None = None
        if self._cut_ms is not None and self._subs:
            # The first listing since a subscription came to a router: the buckets it
            # passed over by their stamps are listed, and what was published in them
            # before the subscription is not new to it.
            if self._passed:
                cut = (frozenset(self._passed), self._cut_ms)
                relist |= self._passed
            self._cut_ms = None
        try:
            # Inline on the loop while the mount is fast and the bus holds no big backlog
            # (the thread hop costs more than a small scan); in a worker thread otherwise.
            cache = self._target_cache
            steal = not self._ready_keys and self._free > 0
            # No subscription here: the bus lists for peers' messages only (it routes
            # them into queues), and leaves fsbus's own names unparsed.
            peers_only = not self._subs
            t0 = time.perf_counter()
            update, listings, decision, reads = await self._offload.scan(
                lambda inline: self._list_and_read(
                    full, relist, baseline, deliver, cache, inline, steal, peers_only, cut
                ),
                big=full,
            )
            # (a full listing, every refresh_ttl, is long by nature: it paces nothing)
            took = time.perf_counter() - t0
            if decision.new_unparsed and self._subs:
                # A subscription came while the listing ran: what it left unparsed as
                # new is new to that subscription (parsed here, a few names at most).
                self._sort_out_new(decision)
            if self._subs:
                held = len(decision.singles)  # a backlog of work
            else:  # a router's: every name it lists, routed or not, is its work
                held = len(decision.singles) + len(decision.present_multi) + decision.unparsed
            pace = _pace_after(
                full=full,
                took=took,
                cpu=self._list_cpu,
                held=held,
                new_multi=len(decision.new_multi),
                present_multi=len(decision.present_multi),
                local=not self._fs.platform.shared,
            )
            self._listing_took = took if pace.factor else 0.0
            if peers_only:
                peers = any(e.fields is None for e in decision.new_multi) or any(
                    e.fields is None for e in decision.new_singles
                )
                self._route_gap = _ROUTE_GAP if peers else min(_ROUTE_GAP_MOST, self._route_gap * 2)
            self._pace = pace if pace.factor else _BACKLOG_REST
        except BaseException:
            self._existing_pending[:0] = existing_subs  # try them again next scan
            self._retries.put_back(due, now)
            self._stale_buckets |= relist
            if cut is not None and self._cut_ms is None:
                self._cut_ms = cut[1]
            raise
        if full:
            self._last_refresh = now
            self._full_wall, self._passed_by_stamps = wall, False
        if self._acked_keys:
            # (a listing that began after an ack does not see the message)
            ready = self._ready_keys
            self._acked_keys = {k: t for k, t in self._acked_keys.items() if t >= now or k in ready}
        self._last_update = update if update is not None else self._last_update
        self._counts["scans"] += 1
        self._retries.put_back((key for key in due if key[0] not in listings), now)
        if self._fs.read_only is None:  # (open for looking only: it removes and routes nothing)
            await self._tidy_and_route(decision, baseline)
        if self._queues.progress_due():
            # As the router: what was renamed before this listing began has been seen.
            # Once a listing passed over buckets by their stamps, every peer's message
            # but one whose stamp an fsbus publisher overwrote unread (stamps.py): the
            # last full listing has seen that one too.
            seen_from = self._full_wall if self._passed_by_stamps else wall
            await anyio.to_thread.run_sync(self._queues.note_progress, seen_from)
        # Work items already on the heap, in flight or backing off need no second look:
        # new ones go on the heap, and a full listing or a bucket listed again for a
        # retry puts back everything it holds (what was dropped while busy, released...).
        others = self._others_listed
        mine = self._share.mine
        if full:
            again = (
                decision.singles
                if mine is None or not self._share.deferred
                else [e for e in decision.singles if e.bucket_index in mine]
            )
        elif mine is not None and (due or others):
            # A consumer with a share: a retry puts back its own item only (a lost claim
            # in another's bucket does not pull this one into that bucket's work), and
            # the others' buckets listed put back what they hold: all of it when this
            # consumer had nothing left to claim, else only what comes before the head of
            # its own work (the others are further behind than this one: help them).
            again = [e for e in decision.new_singles if e.bucket_index not in others]
            views = self._state.buckets
            for bi, name in due:
                view = views.get(bi)
                e = view.singles.get(name) if view is not None and bi in listings else None
                if e is not None:
                    again.append(e)
            if others:
                head = self._ready[0][0] if self._ready and not steal else None
                theirs = [
                    e
                    for e in decision.singles
                    if e.bucket_index in others and (head is None or e.rank < head)
                ]
                most = 2 * self._cfg.handler_concurrency
                if len(theirs) > most:
                    # Take the oldest few, as many as the handlers could start soon: the
                    # owners take the rest (a consumer that took all it saw raced them
                    # for all of it). What is left is looked at again by the next steal.
                    theirs = heapq.nsmallest(most, theirs, key=_rank_of)
                    self._share.note((), others, time.monotonic())
                again.extend(theirs)
        elif retry:
            again = [
                *decision.new_singles,
                *(e for e in decision.singles if e.bucket_index in retry),
            ]
        else:
            again = decision.new_singles
        self._found_work = False
        if any(s.kind != "multi" and not s.closed for s in self._subs):
            taken, released = self._take_listed(again)
            self._push_all_ready(taken)
            # New work found: new items not held back now, or items the last listing held
            # back that go on the heap now. (What this one holds back is listed again at
            # once, within _HELD_WAIT: no gap for it.)
            self._found_work = len(decision.new_singles) > len(self._held_back) or released > 0
        elif self._ready or self._held_back:
            # No subscription here takes work-queue messages (a bus that only routes
            # peers' messages, or whose subscriptions are all multi): keep none of them
            # on the heap, where nothing would ever pop them. A work-queue subscription
            # that comes later makes the next listing a full one, which pushes them all.
            self._ready.clear()
            self._ready_keys.clear()
            self._held_back = []
        if not deliver:
            return
        multis = decision.new_multi
        extra: dict[tuple[int, str], list[Subscription]] = {}
        if existing_subs:
            new_keys = {e.key for e in multis}
            for e in decision.present_multi:
                hits = [s for s in existing_subs if not s.closed and self._trie_test(e, s)]
                if hits:
                    extra[e.key] = hits
                    if e.key not in new_keys:
                        multis = [*multis, e]
                    else:
                        # new as well: regular subscribers get it too
                        extra[e.key] = [*self._targets(e), *hits]
        if multis:
            await self._deliver_multi(multis, extra, reads)
        if self._ready_keys and self._free > 0:
            await self._claim_ready()

    def _take_listed(self, entries: list[Entry]) -> tuple[list[Entry], int]:
        """Of work items this listing found, those to put on the heap now: the ones
        published before it began, and those the last listing held back (still present);
        the others are held back until the next listing, which sees every message their
        publishers published before them (:func:`split_fresh`). The scan loop lists
        again within :data:`_HELD_WAIT`. Also returns how many of the items put on the
        heap are ones the last listing held back."""
        held = self._held_back
        ready, self._held_back = split_fresh(entries, self._horizon_ms)
        released = 0
        if held:
            views = self._state.buckets
            for e in held:
                view = views.get(e.bucket_index)
                if view is not None and e.name in view.singles:
                    ready.append(e)
                    released += 1
        return ready, released

    async def _tidy_and_route(self, decision: ScanDecision, baseline: bool) -> None:
        """After a listing: remove what it found expired, set aside what is foreign, and
        route the peers' messages it found into the durable queues."""
        if decision.expired or decision.foreign:
            await self._housekeep(decision.expired, decision.foreign)
        if not baseline:
            await self._route_peer_messages((*decision.new_multi, *decision.new_singles))
        elif self._route_since is not None:
            # a router taking over: what the old one left, since this one began to wait
            since, self._route_since = self._route_since, None
            await self._route_peer_messages((*decision.present_multi, *decision.singles), since)

    async def _route_peer_messages(
        self, entries: Iterable[Entry], since: float | None = None
    ) -> None:
        """Copy messages of qlobber-fsq peers (which do not route) into the durable queues
        bound to their topics; the first fsbus process to see one does it, once.
        ``since``: only those published (renamed into their bucket) since that time.
        """
        routed = []
        for e in entries:
            if e.fields is None and e.topic is not None:
                targets = self._queues.targets(e.topic)
                if targets:
                    routed.append((e, targets))
        if not routed:
            return
        buckets = self.layout.buckets
        resumable = self._fs.locking == "flock"  # see routed.claim

        def work() -> int:
            made = 0
            for e, targets in routed:
                bucket = buckets[e.bucket_index]
                if e.expires_ms <= time.time() * 1000:
                    continue
                if since is not None:
                    changed = self._fs.changed_at(bucket, e.name)
                    if changed is None or changed < since:
                        continue  # gone, or older than this router's watch
                assert e.topic is not None
                mark = self._queues.claim_route(bucket, e.name, e.topic, resumable)
                if mark is not None:  # else another process routes it
                    made += self._copy_peer_message(mark, e.expires_ms, targets)
            return made

        self._counts["peer_routed"] += await anyio.to_thread.run_sync(work)

    def _copy_peer_message(
        self, mark: RouteMark, expires_ms: int, targets: tuple[Definition, ...] | None = None
    ) -> int:
        """Blocking: copy a peer's message claimed by ``mark`` into its queues (those not
        already holding their copy), write each down, then mark it done; returns the
        copies made. An error leaves the marker half done, for a later router."""
        try:
            if targets is None:
                targets = self._queues.targets(mark.topic)
            ttl = (expires_ms - time.time() * 1000) / 1000
            todo = [d for d in targets if d.name not in mark.copied]
            made = 0
            if ttl > 0 and todo:
                got = self._fs.read_multi(mark.bucket, mark.name, has_meta=False)
                if got.payload is not None:  # else a peer consumed it first
                    for d in todo:
                        made += self._queues.enqueue(d, mark.topic, got.payload, ttl=ttl)
                        mark.copied_into(d.name)
            mark.done()
            return made
        finally:
            mark.close()

    async def _finish_peer_routes(self) -> None:
        """Route the peers' messages whose router died (or failed) half way through."""

        def work() -> int:
            made = 0
            for mark in self._queues.abandoned_routes(self._fs.locking == "flock"):
                parsed = parse_name(mark.name)
                if parsed is None:
                    mark.close()
                    continue
                made += self._copy_peer_message(mark, parsed.expires_ms)
            return made

        self._counts["peer_routed"] += await anyio.to_thread.run_sync(work)

    def _trie_test(self, entry: Entry, sub: Subscription) -> bool:
        assert entry.topic is not None
        return self._trie.test(entry.topic, sub)

    def _list_and_read(
        self,
        full: bool,
        retry: set[int],
        baseline: bool,
        deliver: bool,
        cache: dict[tuple[str, str], list[Subscription]],
        inline: bool,
        steal: bool = True,
        peers_only: bool = False,
        cut: tuple[frozenset[int], int] | None = None,
    ) -> tuple[bytes | None, dict[int, list[str]], ScanDecision, dict[tuple[int, str], ReadResult]]:
        """Blocking, one call per scan (inline or in a worker thread, see
        :meth:`Offload.scan`): list, decide, and read the new multi messages whose topic
        is known (``cache``) to have subscribers.

        Only the scan loop touches the scan state, and it waits for this call. Messages
        whose topic is not in ``cache`` are read afterwards, once the engine has matched
        them on its own thread (the trie is not read here). ``inline``: on the loop,
        where it raises :class:`ScanTooBig` instead of listing buckets that held more
        than :data:`_INLINE_SCAN_NAMES` names (before it has changed any state).
        """
        cpu0 = time.thread_time()
        update, listings, spills = self._list(
            full, retry, _INLINE_SCAN_NAMES if inline else None, steal, peers_only
        )
        decision = decide(
            self._state,
            listings,
            spills,
            int(time.time() * 1000),
            baseline=baseline,
            peers_only=peers_only,
            cut=cut,
        )
        own = self._own_names
        if own and decision.new_multi:
            # This bus's own, which none of its subscriptions wanted when it published
            # them: not new to a subscription made since.
            kept = []
            for e in decision.new_multi:
                if e.name in own:
                    own.discard(e.name)
                else:
                    kept.append(e)
            decision.new_multi = kept
        reads: dict[tuple[int, str], ReadResult] = {}
        if deliver and decision.new_multi:
            buckets = self.layout.buckets
            for e in decision.new_multi[:_READ_BATCH]:
                assert e.topic is not None
                if cache.get((e.topic, "m")):
                    reads[e.key] = self._fs.read_multi(
                        buckets[e.bucket_index], e.name, has_meta=_has_meta(e)
                    )
        self._list_cpu = time.thread_time() - cpu0
        return update, listings, decision, reads

    def _sort_out_new(self, decision: ScanDecision) -> None:
        """Sort out the names a listing for peers only left unparsed as new (see
        :meth:`_scan`), into the scan state and ``decision`` as new messages."""
        views = self._state.buckets
        now_ms = int(time.time() * 1000)
        by_bucket: dict[int, list[str]] = {}
        for bi, name in decision.new_unparsed:
            view = views.get(bi)
            if view is not None and name in view.unparsed:
                view.unparsed.discard(name)
                by_bucket.setdefault(bi, []).append(name)
        own = self._own_names
        for bi, names in by_bucket.items():
            for e in sort_out(views[bi], bi, names, now_ms):
                if e.expires_ms <= now_ms:
                    continue
                if e.name in own:  # published here before the subscription: not new
                    own.discard(e.name)
                    continue
                if e.kind == "m":
                    decision.new_multi.append(e)
                    decision.present_multi.append(e)
                elif e.kind == "s":
                    decision.new_singles.append(e)
                    decision.singles.append(e)
        decision.new_multi.sort(key=_rank_of)
        decision.new_unparsed = []

    def _list(
        self,
        full: bool,
        retry: set[int],
        limit: int | None = None,
        steal: bool = True,
        peers_only: bool = False,
    ) -> tuple[bytes | None, dict[int, list[str]], dict[tuple[int, str], str | None]]:
        """Read UPDATE, list the buckets that changed (all when ``full``) and read the
        spilled topics of long names. ``limit``: raise :class:`ScanTooBig` first, with
        nothing changed, when those buckets held more names than that at their last
        listing. ``steal``: nothing to claim and a handler free (a queue consumer with a
        share lists the others' buckets too, see share.py). ``peers_only``: a router's
        listing, which passes over the buckets last stamped by fsbus publishers with no
        peer's stamp carried (stamps.py)."""
        fs = self._fs
        self._horizon_ms = int(time.time() * 1000)
        update = fs.read_update(reopen=full)
        count = len(self.layout.buckets)
        dirty = self._own_dirty
        share = self._share
        if full or update is None:
            if limit is not None and self._names_in(range(count)) > limit:
                raise ScanTooBig
            wanted: set[int] | list[int] = list(range(count))
            dirty.clear()
            ours = share.mine
            if ours is None or steal:
                share.note(wanted, set(), time.monotonic())
            else:
                # listed, but the others' work stays theirs until this one is idle
                share.note(ours, {bi for bi in wanted if bi not in ours}, time.monotonic())
            self._others_listed = set()  # (a full listing puts back what it may)
        else:
            size = self.layout.stamp_size
            wanted = set(changed_buckets(self._last_update, update, size, count))
            if peers_only and fs.tag_stamps and wanted:
                # Only fsbus publishers stamped these since they were listed: their
                # messages were routed as they were published.
                passed = {
                    bi
                    for bi in wanted
                    if not peer_may_have_stamped(update[bi * size : bi * size + size])
                }
                if passed:
                    wanted -= passed
                    self._passed_by_stamps = True
                    self._passed |= passed
            # Buckets whose only change is this bus's own stamp hold nothing new for it;
            # they are listed again within _OWN_RELIST all the same (a stamp of another
            # publisher's that this bus overwrote in between is rare, not impossible: see
            # BusFS.stamp_own).
            mine = fs.own_only(wanted, update) if fs.track_own and wanted else ()
            wanted.difference_update(mine)
            wanted |= retry
            now = time.monotonic()
            due = []
            if dirty:
                # Unlisted for _OWN_RELIST: listed now. The dict is in the order of its
                # times (a bucket enters once, at its first own stamp), so the due ones
                # are at its front; a bus publishing fast keeps most buckets in it.
                for bi, t in dirty.items():
                    if now - t < _OWN_RELIST:
                        break
                    due.append(bi)
                wanted.update(due)
            listed, put_off, others = share.split(wanted, retry, steal, now)
            wanted = listed
            if limit is not None and self._names_in(wanted) > limit:
                raise ScanTooBig  # nothing changed yet
            share.note(listed, put_off, now)
            self._others_listed = others
            if dirty:
                for bi in due:
                    del dirty[bi]
                for bi in [bi for bi in wanted if bi in dirty]:  # listed now anyway
                    del dirty[bi]
            for bi in mine:
                if bi not in wanted:
                    dirty.setdefault(bi, now)
        if self._passed:
            self._passed.difference_update(wanted)
        listings = fs.list_buckets(sorted(wanted))
        if fs.track_own:
            fs.note_listed(listings, update)
        spills = fs.read_spills(long_names(self._state, listings))
        return update, listings, spills

    def _names_in(self, buckets: Iterable[int]) -> int:
        """Names the buckets held at their last listings (a scan state read: the scan
        loop's own, or a scan's while the loop waits for it)."""
        seen = self._state.seen
        return sum(len(seen.get(bi, ())) for bi in set(buckets))

    async def _housekeep(self, expired: list[Entry], foreign: list[tuple[int, str]]) -> None:
        lay = self.layout
        if self._keep_expired:
            expired = [e for e in expired if e.kind != "s"]
            if not expired and not foreign:
                return
        gone = [
            (lay.buckets[e.bucket_index], e.name) for e in expired if e.key not in self._in_flight
        ]
        now_ms = int(time.time() * 1000)

        def work() -> tuple[int, int]:
            n = self._fs.remove(gone)
            q = sum(self._fs.quarantine(lay.buckets[bi], name, now_ms) for bi, name in foreign)
            return n, q

        n, q = await anyio.to_thread.run_sync(work)
        self._counts["expired"] += n
        self._counts["quarantined"] += q
        if q:
            log.warning("moved %d foreign file(s) from %s to %s", q, lay.messages, lay.quarantine)
        lost_work = [e for e in expired if e.kind == "s" and e.key not in self._in_flight]
        if lost_work and self._queue_name is not None:
            # a queue's copies live as long as the queue's message_ttl or their publish's
            # ttl (single_ttl does not apply to them)
            log.warning(
                "%d message(s) of queue %r expired before any consumer took them (e.g. "
                "%r); add consumers, or publish with a longer ttl (the queue's "
                "message_ttl caps it)",
                len(lost_work),
                self._queue_name,
                lost_work[0].topic,
            )
        elif lost_work:
            # A multi message expiring is its TTL doing its job; a work item expiring
            # means nobody did it: that backlog is worth a warning.
            log.warning(
                "%d work-queue message(s) expired before any consumer took them (e.g. %r); "
                "add consumers or raise single_ttl",
                len(lost_work),
                lost_work[0].topic,
            )
        for bi, name in foreign:
            self._state.parsed.pop((bi, name), None)

    def _own(self, topic: str, single: bool, name: str) -> bool:
        """Whether a message this bus is about to publish as ``name`` is its own: a multi
        message that none of its subscriptions wants, whose stamp need not make this bus
        list its bucket again (see :meth:`BusFS.stamp_own`). Its name is remembered until
        a listing sees it (a publish that fails forgets it)."""
        if single or not self._fs.track_own or self._wanted_here(topic):
            return False
        if len(self._own_names) >= _OWN_NAMES_MAX:
            self._own_names.clear()  # unlisted for long: forget them
        self._own_names.add(name)
        return True

    def _wanted_here(self, topic: str) -> bool:
        """Whether a subscription of this bus matches ``topic`` (cached per topic)."""
        cache = self._want_cache
        wanted = cache.get(topic)
        if wanted is None:
            wanted = bool(self._trie.match(topic))
            if len(cache) >= 4096:
                cache.clear()
            cache[topic] = wanted
        return wanted

    def _targets(self, entry: Entry) -> list[Subscription]:
        """The subscriptions a message goes to (cached per topic and kind; do not mutate)."""
        assert entry.topic is not None
        kind = entry.kind
        cache = self._target_cache
        subs = cache.get((entry.topic, kind))
        if subs is not None:
            return subs
        unwanted = "multi" if kind == "s" else "single"
        subs = [s for s in self._trie.match(entry.topic) if s.kind != unwanted]
        if self._cfg.dedup and len(subs) > 1:
            seen: set[Any] = set()
            out = []
            for s in subs:
                h = s.handler
                if h not in seen:
                    seen.add(h)
                    out.append(s)
            subs = out
        if len(cache) >= 4096:
            cache.clear()
        cache[(entry.topic, kind)] = subs
        return subs

    async def _deliver_multi(
        self,
        entries: list[Entry],
        extra: dict[tuple[int, str], list[Subscription]],
        prefetched: dict[tuple[int, str], ReadResult],
    ) -> None:
        work: list[tuple[Entry, list[Subscription]]] = []
        for e in entries:
            targets = _unique(extra[e.key]) if e.key in extra else self._targets(e)
            if targets:
                work.append((e, targets))
        if not work:
            return
        for i in range(0, len(work), _READ_BATCH):
            chunk = work[i : i + _READ_BATCH]
            missing = [e for e, _ in chunk if e.key not in prefetched]
            if missing:
                got = await anyio.to_thread.run_sync(self._read_many, missing)
                prefetched = {**prefetched, **{e.key: r for e, r in zip(missing, got, strict=True)}}
            reads = [prefetched.pop(e.key) for e, _ in chunk]
            for (e, targets), r in zip(chunk, reads, strict=True):
                if r.payload is None:
                    continue
                msg = self._message(e, r.payload, r.meta, 0)
                for n, sub in enumerate(targets):
                    if sub.closed:
                        continue
                    if n and msg.headers:
                        # Each subscriber gets its own headers: none can change another's.
                        msg = replace(msg, headers=dict(msg.headers))
                    await self._take_slot()
                    self._counts["delivered"] += 1
                    self._check_open()
                    self._jobs.put((self._run_multi, (sub, msg)))
        # Let the handlers just woken run before the scanner finishes its round: what
        # they do next (often a publish of their own) waits for nothing else.
        await anyio.lowlevel.checkpoint()

    async def _take_slot(self) -> None:
        """Wait for a free handler slot (the backpressure point) and take it."""
        while self._free <= 0:
            # One Event for every wait until a slot frees, made by the first waiter: the
            # handlers that free slots meanwhile (often several before a waiter runs
            # again) make none.
            if self._freed is None:
                self._freed = anyio.Event()
            await self._freed.wait()
        self._free -= 1

    def _give_slot(self) -> None:
        self._free += 1
        freed = self._freed
        if freed is not None:
            self._freed = None
            freed.set()

    def _read_many(self, entries: list[Entry]) -> list[ReadResult]:
        buckets = self.layout.buckets
        return [
            self._fs.read_multi(buckets[e.bucket_index], e.name, has_meta=_has_meta(e))
            for e in entries
        ]

    async def _run_multi(self, sub: Subscription, msg: Message) -> None:
        try:
            await sub.handler(msg)
        except Decline:
            pass  # nothing to give back: a multi message is each subscriber's own
        except Exception:
            self._counts["failed"] += 1
            log.exception("handler for %r failed on multi message %s", sub.pattern, msg.name)
        finally:
            self._give_slot()

    def _heap_rank(self, e: Entry) -> int:
        """Where ``e`` goes on the ready heap: its rank, after every entry of the same
        priority in this consumer's own share of the buckets when its bucket is another
        consumer's (see share.py). So consumers of one queue claim from disjoint buckets
        while each has work of its own, instead of all racing for the same oldest few
        (a consumer that came late lost every claim to the one draining the head); what
        is another's is claimed once this one has nothing of its own left."""
        mine = self._ranked_share
        if mine is None or e.bucket_index in mine:
            return e.rank
        return e.rank | _OTHERS_RANK

    def _rerank(self, mine: frozenset[int] | None) -> None:
        """The share changed: order the ready heap by it (linear time)."""
        if mine == self._ranked_share:
            return
        self._ranked_share = mine
        if self._ready:
            self._ready = [(self._heap_rank(e), seq, e) for _, seq, e in self._ready]
            heapq.heapify(self._ready)

    def _push_ready(self, e: Entry) -> None:
        if e.key not in self._ready_keys:
            self._ready_keys.add(e.key)
            self._ready_seq += 1
            heapq.heappush(self._ready, (self._heap_rank(e), self._ready_seq, e))

    def _push_all_ready(self, entries: list[Entry]) -> None:
        """:meth:`_push_ready` each of ``entries``; many at once (a first listing of a
        deep queue) are added whole and the heap rebuilt, in linear time."""
        if len(entries) < _HEAPIFY_FROM or len(entries) < len(self._ready):
            for e in entries:
                self._push_ready(e)
            return
        keys = self._ready_keys
        ready = self._ready
        seq = self._ready_seq
        rank = self._heap_rank
        for e in entries:
            key = e.key
            if key not in keys:
                keys.add(key)
                seq += 1
                ready.append((rank(e), seq, e))
        self._ready_seq = seq
        heapq.heapify(ready)

    async def _claim_ready(self) -> None:
        """Claim work-queue messages from the ready heap, best priority first.

        The heap holds singles seen in listings; an entry is dropped when it is gone from
        its bucket's latest listing, in flight here, or backing off after a busy claim
        (the retry re-lists its bucket and pushes it again). Claims go in rounds of at
        most ``_CLAIM_ROUND_SECONDS``, each round's messages handed out when it ends.

        Nothing is claimed while a full listing that a new work-queue subscription asked
        for is to come: the heap may hold only what a listing of a few buckets found
        (it is emptied while no subscription takes work-queue messages), and a claim
        then took a new message before older ones, e.g. those the last subscription of
        a queue gave back.
        """
        if self._force_full:
            return
        while await self._claim_round():
            pass

    async def _claim_round(self) -> bool:
        """One round of :meth:`_claim_ready`; whether it ran out of time with candidates
        and free handlers left (another round should follow at once)."""
        capacity = self._free
        room = 0  # what the work-queue subscriptions can take, at most capacity
        for s in self._subs:
            if s.kind != "multi" and not s.closed:
                room += capacity if s.prefetch is None else max(0, _room(s))
                if room >= capacity:
                    break
        if capacity <= 0 or room <= 0:
            # No handler free, or every work-queue subscription at its prefetch: nothing
            # can be claimed, so leave the heap as it is (popping and pushing back every
            # candidate cost more than the claims when consumers are busy).
            return False
        # Subscriptions at their prefetch take no more than their room, however many
        # handlers are free: pick candidates for that many only (a consumer with a
        # prefetch of 100 on a bus of 1,000 handlers acks a few at a time, and each
        # round would otherwise pop, and push back, thousands of entries for those few).
        # Entries of full subscriptions are still passed over (deferred) as deep as the
        # free handlers allow, so that another subscription's work behind them is found.
        claimable = min(capacity, room)
        now = time.monotonic()
        if not self._hungry(now):
            return False
        now_ms = int(time.time() * 1000)
        # Candidates: the best ones in order, a few spare for claims that fail. When other
        # consumers keep winning the same candidates, twice as many, tried from a random
        # place among those of the best priority, so that they collide less.
        contended = self._contention.active
        per_slot = 2 if contended else 1
        wanted = claimable * per_slot + _SPARE_CANDIDATES
        picked: list[tuple[Entry, Subscription]] = []
        deferred: list[Entry] = []
        picks: dict[Subscription, int] = {}
        young_from = now_ms - _STEAL_AGE_MS  # another's work published after: its own
        self._steal_at = None
        while self._ready and len(picked) < wanted and len(deferred) < capacity * 4:
            heap_rank, _, e = heapq.heappop(self._ready)
            self._ready_keys.discard(e.key)
            if (
                e.key in self._in_flight
                or e.key in self._acked_keys
                or self._retries.backing_off(e.key, now)
                or e.name not in self._state.seen.get(e.bucket_index, ())
                or e.expires_ms <= now_ms
            ):
                continue
            if heap_rank & _OTHERS_RANK and e.fields is not None:
                # (a publisher's clock ahead of this host's makes it young until then)
                published = min(e.fields.published_ms, now_ms)
                if published > young_from:
                    # Another consumer's, just published: it claims it itself (racing it
                    # loses most claims); taken from it if still here _STEAL_AGE_MS on.
                    deferred.append(e)
                    at = now + (published - young_from) / 1000
                    if self._steal_at is None or at < self._steal_at:
                        self._steal_at = at
                    continue
            subs = [s for s in self._targets(e) if not s.closed]
            # A subscription with a prefetch limit gets at most per_slot times its free
            # room (and the spares) in candidates and at most its room in claims (below).
            free = [
                s
                for s in subs
                if s.prefetch is None or picks.get(s, 0) < per_slot * _room(s) + _SPARE_CANDIDATES
            ]
            if free:
                # One with room now if there is one: spare candidates for a full one are
                # for a slot that frees during the round, and a message always hashed to
                # a full subscription would wait while another had room (a consumer at
                # its prefetch beside an idle one starved it until the next change).
                roomy = [
                    s for s in free if s.prefetch is None or picks.get(s, 0) < per_slot * _room(s)
                ]
                pool = roomy or free
                if len(pool) > 1 and any(s.rank for s in pool):
                    best = max(s.rank for s in pool)
                    pool = [s for s in pool if s.rank == best]
                sub = pool[hash(e.name) % len(pool)]
                picks[sub] = picks.get(sub, 0) + 1
                picked.append((e, sub))
            elif subs:
                deferred.append(e)  # its consumers are full: keep it for later
        for e in deferred:
            self._push_ready(e)
        if not picked:
            return False
        buckets = self.layout.buckets

        ordered = picked
        if contended:
            best = picked[0][0].priority
            same = sum(1 for e, _ in picked if e.priority == best)
            if same > 1:
                start = random.randrange(same)
                ordered = picked[start:same] + picked[:start] + picked[same:]

        timed_out = False

        def claim_some() -> tuple[list[tuple[Entry, Subscription, Claim | None]], list[Entry]]:
            nonlocal timed_out
            got: list[tuple[Entry, Subscription, Claim | None]] = []
            untried: list[Entry] = []
            taken = lost = 0
            per_sub: dict[Subscription, int] = {}
            until = time.monotonic() + self._offload.batch_seconds(_CLAIM_ROUND_SECONDS)
            for e, sub in ordered:
                room = None if sub.prefetch is None else _room(sub)
                if (
                    taken >= capacity
                    or (room is not None and per_sub.get(sub, 0) >= room)
                    or (lost >= _LOST_ENOUGH and lost > 2 * taken)
                ):
                    # done, or the listing these came from is stale: others are taking
                    # them as they come (the contention wait sorts that out)
                    untried.append(e)
                    continue
                if got and time.monotonic() > until:
                    timed_out = True  # hand out what this round won first
                    untried.append(e)
                    continue
                c = self._fs.claim(
                    buckets[e.bucket_index], e.name, has_meta=_has_meta(e), attempts=False
                )
                got.append((e, sub, c))
                if c is None:
                    lost += 1
                else:
                    taken += 1
                    per_sub[sub] = per_sub.get(sub, 0) + 1
            # failure counts once the batch is held: one listing per bucket, not an
            # open per claim
            self._fs.fill_attempts(c for _, _, c in got if c is not None)
            if self._cfg.count_deliveries:
                self._fs.count_deliveries(c for _, _, c in got if c is not None)
            return got, untried

        # Inline while the mount is fast, as a publish (the claims never block: a rename,
        # or a flock that fails at once); a round of many claims goes to the thread.
        # Timed per claim it wants (spare candidates are tried only for lost claims: a
        # round that lost some is taken for slower than it was, never for faster).
        # A subscription that closes while the round runs waits for it (see _busy): what
        # the round claims for it is given back before it is gone, not after (the next
        # subscription of the queue found it locked, and took the one behind it first).
        for sub in picks:
            sub.claiming += 1
        try:
            results, untried = await self._off(
                claim_some,
                big=len(ordered) > _INLINE_CLAIMS,
                items=min(len(ordered), claimable),
            )
            self._dispatch_claims(results, untried, now)
        finally:
            for sub in picks:
                sub.claiming -= 1
                if not _busy(sub) and sub.settled is not None:
                    sub.settled.set()
        return timed_out and self._free > 0 and not self._closed

    def _hungry(self, now: float) -> bool:
        """Whether a claim round should run now: some work-queue subscription with room
        has no prefetch limit, none in flight, no :attr:`~Subscription.lazy_topup`, or
        room for half its prefetch or for :data:`_TOPUP_ROOM` (then each round claims
        many), or the rounds waited :data:`_TOPUP_GAP` since one was first put off. A
        round that runs serves every subscription with room, in rank order, as before."""
        some_room = False
        for s in self._subs:
            if s.kind == "multi" or s.closed:
                continue
            if s.prefetch is None:
                break
            room = _room(s)
            if room <= 0:
                continue
            if not s.lazy_topup or 2 * room >= s.prefetch:
                break
            if room >= _TOPUP_ROOM:
                break
            some_room = True
        else:
            if some_room:
                due = self._topup_due
                if due is None:
                    due = self._topup_due = now + _TOPUP_GAP
                if now < due:
                    # the scan loop wakes then (a claim round, no listing), if no ack first
                    if self._steal_at is None or due < self._steal_at:
                        self._steal_at = due
                    return False
        self._topup_due = None
        return True

    def _dispatch_claims(
        self,
        results: list[tuple[Entry, Subscription, Claim | None]],
        untried: list[Entry],
        now: float,
    ) -> None:
        """Hand out what a claim round won (a handler task each); put back the rest."""
        lost = sum(1 for _, _, c in results if c is None)
        self._counts["claims_lost"] += lost
        self._contention.round(len(results), lost, time.monotonic())
        for e in untried:  # not tried this round: back on the heap
            self._push_ready(e)
        for e, sub, claim in results:
            if claim is None:
                # Locked by another consumer, or gone: look again after retry_interval,
                # and list its bucket again at the next scan (what we saw there is stale).
                self._retries.add(e.key, now + self._cfg.retry_interval)
                self._stale_buckets.add(e.bucket_index)
                continue
            self._in_flight.add(e.key)
            if claim.renamed:
                self._held[e.key] = claim  # renewed until its handler is done
            msg = self._message(e, claim.payload, claim.meta, claim.attempts)
            self._free -= 1  # capacity was checked above: no wait here
            self._counts["delivered"] += 1
            sub.in_flight += 1
            if sub.deliver_now is not None and self._deliver_now(sub, msg, claim, e):
                continue
            self._jobs.put((self._run_single, (sub, msg, claim, e)))

    def _deliver_now(self, sub: Subscription, msg: Message, claim: Claim, e: Entry) -> bool:
        """Hand ``msg`` to ``sub``'s :attr:`~Subscription.deliver_now` consumer, with no
        task: whether it took it (one that had every delivery it may have goes to
        :meth:`_run_single`, which dead-letters it)."""
        assert sub.deliver_now is not None
        limit = sub.delivery_limit
        if self._over_limit(msg) or (limit is not None and msg.delivery_count > limit):
            return False
        self._deferred[e.key] = claim
        try:
            taken = sub.deliver_now(msg, functools.partial(self._settle_deferred, sub, msg, e))
        except Exception as exc:  # never let one consumer take the bus down
            log.error("delivering %s failed: %s; handing it over again", msg.name, exc)
            taken = False
        if not taken and self._deferred.pop(e.key, None) is None:
            return True  # settled already (by the consumer, before it failed)
        return taken

    def _settle_deferred(
        self, sub: Subscription, msg: Message, e: Entry, exc: BaseException | None = None
    ) -> None:
        """A :attr:`~Subscription.deliver_now` consumer is done with ``msg`` (``exc``:
        what its handler would have raised). Once only: later calls, and calls after the
        bus gave it back at close, do nothing."""
        key = e.key
        claim = self._deferred.pop(key, None)
        if claim is None:
            return
        if exc is None and self._post_ack(sub, claim, key):
            return
        tg = self._tg
        if tg is None:  # the bus has stopped: give it back now
            self._held.pop(key, None)
            with contextlib.suppress(Exception):
                self._fs.release(claim, failed=False)
            return
        if exc is not None and sub.give_up is not None and isinstance(exc, Exception):
            tg.start_soon(self._settle_failed, sub, msg, claim, e, exc)
            return
        outcome = "ack" if exc is None else self._failure_outcome(sub, msg, exc)
        tg.start_soon(self._conclude, sub, msg, claim, e, outcome)

    async def _settle_failed(
        self, sub: Subscription, msg: Message, claim: Claim, e: Entry, exc: Exception
    ) -> None:
        """A queue's message a :attr:`~Subscription.deliver_now` consumer failed: given up
        (dead-lettered, and acked) if that was its queue's last delivery, as the queue's
        handler does, else settled as a failed handler's."""
        assert sub.give_up is not None
        with anyio.CancelScope(shield=True):  # (its claim is no one else's to give back)
            try:
                gave_up = await sub.give_up(msg, exc)
            except Exception as err:  # not dead-lettered (a full disk...): a failure
                exc, gave_up = err, False
            outcome = "ack" if gave_up else self._failure_outcome(sub, msg, exc)
            if outcome == "ack" and self._post_ack(sub, claim, e.key):
                return
            await self._conclude(sub, msg, claim, e, outcome)

    async def _run_single(self, sub: Subscription, msg: Message, claim: Claim, e: Entry) -> None:
        try:
            if self._over_limit(msg):
                # Delivered as many times as max_deliveries allows, and never settled:
                # its consumers ended with it in hand (killed, crashed: a message that
                # kills its consumer). Not handed over again: dead-lettered.
                self._counts["failed"] += 1
                outcome = "dead:" + (
                    f"delivered {msg.delivery_count - 1} times and never settled "
                    "(its consumers ended with it in hand)"
                )
                log.warning(
                    "work-queue message %s was delivered %d times and never settled "
                    "(its consumers ended holding it); dead-lettered, not delivered again",
                    msg.name,
                    msg.delivery_count - 1,
                )
            else:
                await sub.handler(msg)
                outcome = "ack"
        except GiveBack as back:
            outcome = "giveback" if back.seen else "unseen"
        except Exception as exc:
            outcome = self._failure_outcome(sub, msg, exc)
        except BaseException:
            # Cancelled (shutdown): give it back without counting a failure.
            await self._conclude(sub, msg, claim, e, "release")
            raise
        # The common case: the finisher acks it in its next batch and settles it then
        # (slot, in-flight count); this task is free at once.
        if outcome == "ack" and self._post_ack(sub, claim, e.key):
            return
        await self._conclude(sub, msg, claim, e, outcome)

    def _failure_outcome(self, sub: Subscription, msg: Message, exc: BaseException) -> str:
        """How a work-queue message whose handler raised ``exc`` is settled: dead-lettered
        once it had every delivery ``max_deliveries`` allows, given back at once on a
        :class:`Requeue`, otherwise given back as failed (redelivered later)."""
        self._counts["failed"] += 1
        limit = self._cfg.max_deliveries
        if (
            limit is not None
            and msg.delivery_count >= limit
            and not self._is_dead_letter(msg.topic)  # no dead-letter cycles
        ):
            return "dead:" + f"{type(exc).__name__}: {exc}"[:500]
        if isinstance(exc, Requeue):
            return _REQUEUE
        log.info(
            "handler for %s failed on work-queue message %s (delivery %d): %s; "
            "it will be redelivered",
            f"queue {sub.queue!r}" if sub.queue else repr(sub.pattern),
            msg.name,
            msg.delivery_count,
            exc,
        )
        return "fail"

    def _post_ack(self, sub: Subscription, claim: Claim, key: tuple[int, str]) -> bool:
        """Queue the ack of a handled message with the finisher, which settles it after
        its batch; False when the finisher has stopped (the caller then settles it)."""
        try:
            self._finisher.post((claim, "ack"), functools.partial(self._acked, sub, key))
        except ClosedError:
            return False
        self._held.pop(key, None)
        sub.acking += 1
        if sub.prefetch is not None and _room(sub) == 1 and not self._closed:
            self._waker.wake()  # it was at its prefetch: a claim round may serve it now
        return True

    async def _conclude(
        self, sub: Subscription, msg: Message, claim: Claim, e: Entry, outcome: str
    ) -> None:
        """Settle a handled (or given up) work-queue message on disk as ``outcome`` says,
        then free its slot; ``"release"`` gives it back uncounted (a cancelled handler)."""
        key = e.key
        try:
            if outcome != "release":
                with anyio.CancelScope(shield=True):
                    try:
                        await self._finish(claim, msg, outcome)
                    except Exception as exc:  # never let one message take the bus down
                        log.error(
                            "could not settle %s (%s): %s; releasing it", msg.name, outcome, exc
                        )
                        outcome = "release"
        finally:
            self._held.pop(key, None)
            if outcome == "release":
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(lambda: self._fs.release(claim, failed=False))
                self._counts["released"] += 1
                # look at it again after retry_interval, not only at the next full
                # listing (settling failed, e.g. its dead letter met a full disk)
                self._retries.add(key, time.monotonic() + self._cfg.retry_interval)
            elif outcome in _AT_ONCE and not self._closed:
                # back in this process's queue at once, in its place (ahead of what
                # came after it), before its slot frees a claim
                self._push_ready(e)
            elif outcome == "ack" or outcome.startswith("dead:"):
                self._acked_keys[key] = time.monotonic()  # removed (see _acked)
            self._settled(sub, key)

    def _over_limit(self, msg: Message) -> bool:
        """Whether ``msg`` has had every delivery ``max_deliveries`` allows already (each
        is counted when it is claimed, so a consumer that died holding it counted one)."""
        limit = self._cfg.max_deliveries
        return (
            limit is not None
            and self._cfg.count_deliveries
            and msg.delivery_count > limit
            and not self._is_dead_letter(msg.topic)  # no dead-letter cycles
        )

    def _acked(self, sub: Subscription, key: tuple[int, str], result: object) -> None:
        sub.acking -= 1
        if isinstance(result, BaseException):
            self._not_finished(key)  # logged by _finish_many; the message is still there
        else:
            self._counts["acked"] += 1
            self._acked_keys[key] = time.monotonic()
        self._settled(sub, key)

    def _not_finished(self, key: tuple[int, str]) -> None:
        """An ack or release failed on disk. Its claim is unlocked and closed all the same
        (see :meth:`BusFS.ack`), so the message goes back: count it released, not acked,
        and look at it again after retry_interval."""
        self._counts["released"] += 1
        self._retries.add(key, time.monotonic() + self._cfg.retry_interval)

    def _settled(self, sub: Subscription, key: tuple[int, str]) -> None:
        """A work item is acked or released on disk: free its slot and say so."""
        self._in_flight.discard(key)
        sub.in_flight -= 1
        if not _busy(sub) and sub.settled is not None:
            sub.settled.set()
        self._give_slot()
        if not self._closed:
            self._waker.wake()

    async def _finish(
        self, claim: Claim, msg: Message, outcome: str, *, direct: bool = False
    ) -> None:
        """Settle one claim on disk and count it. ``direct``: not through the finishing
        batches but on its own, inline while the mount is fast (a ``get``, which waits
        for it: a batch would cost it a worker-thread hop)."""
        dead = outcome.startswith("dead:")
        if dead:
            await self._dead_letter(msg, outcome[5:])
            outcome = "ack"
        error: BaseException | None = None
        try:
            if direct:
                [error] = await self._off(lambda: self._finish_many([(claim, outcome)]))
            else:
                await self._finisher.submit((claim, outcome))
        except ClosedError:
            [error] = await anyio.to_thread.run_sync(self._finish_many, [(claim, outcome)])
        except Exception as exc:
            error = exc
        if error is not None:
            # Logged by _finish_many. The claim is closed: releasing it again would close
            # a descriptor that is no longer ours.
            self._not_finished((self.layout.buckets.index(claim.bucket), claim.name))
            return
        if outcome == "ack":
            self._counts["acked"] += 1
            if dead:  # counted once its ack is done: a failed ack redelivers it
                self._counts["dead_lettered"] += 1
        else:
            self._counts["released"] += 1
            # tried again after retry_interval; a requeue or an unseen one at once (and
            # its bucket listed again at the next scan, which the settling wakes)
            wait = 0.0 if outcome in _AT_ONCE else self._cfg.retry_interval
            self._retries.add(
                (self.layout.buckets.index(claim.bucket), claim.name), time.monotonic() + wait
            )
            if self._given_back is not None:
                await self._given_back()

    async def _run_finishing(
        self,
        fn: Callable[[list[tuple[Claim, str]]], list[BaseException | None]],
        items: list[tuple[Claim, str]],
    ) -> list[BaseException | None]:
        """A batch of acks and releases: inline while the mount is fast, as a publish (an
        unlink or a rename each), in the worker thread when it is slow or the batch big."""
        done = await self._off(
            functools.partial(fn, items), big=len(items) > _INLINE_CLAIMS, items=len(items)
        )
        if len(done) < len(items):  # stopped inline past its time: the rest in the thread
            rest = items[len(done) :]
            done += await self._off(functools.partial(fn, rest), big=True, items=len(rest))
        return done

    async def _off(self, fn: Callable[[], T], *, big: bool = False, items: int = 1) -> T:
        """:meth:`Offload.call` for the work of consuming (claims, acks, releases), which
        must run even while the bus closes: once the offload has stopped, in a thread."""
        try:
            return await self._offload.call(fn, big=big, items=items)
        except ClosedError:  # raised before ``fn`` ran (waiting for a turn)
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=False)

    def _finish_many(self, items: list[tuple[Claim, str]]) -> list[BaseException | None]:
        """Ack or release each claim; an item's result is the error that stopped it.

        Inline, it stops once the batch has run :data:`~.offload.SLOW` (a mount turning
        slow): the result is then shorter than ``items``, and the caller hands the rest
        to the thread."""
        out: list[BaseException | None] = []
        stop = time.monotonic() + self._offload.batch_seconds(math.inf)
        for claim, outcome in items:
            if out and time.monotonic() > stop:
                break
            try:
                if outcome == "ack":
                    self._fs.ack(claim)
                else:
                    failed = outcome in ("fail", _REQUEUE)
                    self._fs.release(claim, failed=failed, uncount=outcome == "unseen")
                    if outcome in _AT_ONCE:  # the other processes look at its bucket now
                        self._fs.stamp(self.layout.buckets.index(claim.bucket))
                out.append(None)
            except Exception as exc:  # one message's failure never stops the batch
                log.error(
                    "could not %s %s/%s: %s; it may be delivered again",
                    "ack" if outcome == "ack" else "release",
                    claim.bucket,
                    claim.name,
                    exc,
                )
                out.append(exc)
        return out

    async def _dead_letter(self, msg: Message, reason: str) -> None:
        topic = f"{self._cfg.dead_letter_prefix}.{msg.topic}"
        ours = {
            "x-original-topic": msg.topic,
            "x-deliveries": str(msg.delivery_count),
            "x-death-reason": reason,
        }
        headers = {**msg.headers, **ours}
        prefix = self._cfg.dead_letter_prefix
        plan = None
        # The original topic and headers may leave no room for ours: fall back to the
        # bare prefix, then to our headers alone, rather than fail the dead-lettering.
        for t, h in ((topic, headers), (prefix, headers), (prefix, ours)):
            try:
                plan = self.plan(t, True, None, False, h, msg.priority)
                break
            except UsageError:
                continue
        assert plan is not None
        await anyio.to_thread.run_sync(self._fs.publish, plan, msg.payload)
        log.warning(
            "work-queue message %s on %r failed %d times; moved to %r",
            msg.name,
            msg.topic,
            msg.delivery_count,
            plan.topic,
        )

    def _is_dead_letter(self, topic: str) -> bool:
        # A dead letter that fails again stays where it is (retried until it expires)
        # rather than moving to "<prefix>.<prefix>...." forever under a failing "#".
        prefix = self._cfg.dead_letter_prefix
        return topic == prefix or topic.startswith(prefix + ".")

    def _message(self, e: Entry, payload: bytes, meta: bytes | None, attempts: int) -> Message:
        f = e.fields
        assert e.topic is not None
        host = None
        if f is not None:
            host = self._hosts.get(f.host)
            if host is None:
                self._hosts.update(self._fs.read_hosts())
                host = self._hosts.setdefault(f.host, f.host)
        return Message(
            topic=e.topic,
            payload=payload,
            single=e.kind == "s",
            expires=e.expires_ms / 1000,
            name=e.name,
            bucket=self.layout.buckets[e.bucket_index],
            headers=decode_meta(meta),
            priority=f.priority if f else self._cfg.default_priority,
            published_at=f.published_ms / 1000 if f else None,
            host=host,
            delivery_count=attempts + 1,
            queue=self._queue_name,
        )

    # ------------------------------------------------------------------ housekeeping
    async def _renew_loop(self) -> None:
        """Renew the leases of rename claims while their handlers run.

        Every quarter of ``claim_lease`` the claimed files of running handlers get fresh
        times, so garbage collection on any host, which gives back claims older than the
        lease, leaves them alone however long a handler takes. Renewal is a ``utime`` in
        a worker thread; only a consumer whose event loop or host stops for a whole
        lease loses its claims (counted in ``leases_lost``; the message may then be
        handled again elsewhere, as after a crash).
        """
        period = self._cfg.claim_lease / 4
        while True:
            await anyio.sleep(period)
            held = list(self._held.values())
            if not held:
                continue
            lost = await anyio.to_thread.run_sync(self._fs.renew, held)
            for c in lost:
                if self._held.get((self.layout.buckets.index(c.bucket), c.name)) is not c:
                    continue  # its handler finished meanwhile and the claim was acked
                self._counts["leases_lost"] += 1
                log.warning(
                    "the claim on work-queue message %s lapsed (not renewed within "
                    "claim_lease=%s s) and was given back: another consumer may handle it "
                    "too; keep the event loop free, or raise claim_lease",
                    c.name,
                    self._cfg.claim_lease,
                )

    def _nudge_gc(self) -> None:
        """From any thread: wake the gc loop now (a queue spooled messages it dropped,
        to be dead-lettered: see :meth:`_dead_letter_expired`); bursts coalesce."""
        token = self._gc_token
        if token is None or self._gc_nudged.is_set():
            return
        self._gc_nudged.set()
        if threading.get_ident() == self._gc_thread:
            self._gc_wake.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: the bus is closing
            anyio.from_thread.run_sync(self._gc_wake.set, token=token)

    async def _gc_loop(self) -> None:
        next_gc = time.monotonic() + self._cfg.gc_interval
        self._gc_token = anyio.lowlevel.current_token()
        self._gc_thread = threading.get_ident()
        while True:
            # A queue with ``expires`` is deleted when its time is up, not at the next gc
            # (every gc_interval): its lifetime is looked at then, alone.
            # (and at least each _EXPIRY_TICK: a queue declared meanwhile, anywhere). A
            # queue's own bus holds no queues: it waits for its gc alone.
            wait = next_gc - time.monotonic()
            due = None
            if self._queue_name is None:
                wait = min(wait, _EXPIRY_TICK)
                try:
                    due = await anyio.to_thread.run_sync(self._queues.expiry_due)
                except Exception:  # a failing look: the gc below says what is wrong
                    due = None
                if due is not None:
                    wait = min(wait, max(_EXPIRY_LOOK, due - time.time()))
                if self._dead_letter_due is not None:
                    soon = self._dead_letter_due - time.time()
                    wait = min(wait, max(self._dead_letter_look, soon))
                if self._spooling:
                    wait = min(wait, _DEAD_LETTER_LOOK)
            with anyio.move_on_after(max(0.0, wait)):
                await self._gc_wake.wait()
            self._gc_wake = anyio.Event()
            self._gc_nudged.clear()
            try:
                if self._queue_name is None:
                    await self._dead_letter_expired()
                if time.monotonic() >= next_gc:
                    next_gc = time.monotonic() + self._cfg.gc_interval
                    await self._gc_if_turn()
                    await self._finish_peer_routes()
                elif due is not None and due <= time.time():
                    await anyio.to_thread.run_sync(self._queues.expire_queues, self._send_expired)
            except ClosedError:
                return  # the bus is closing under us: not a failure worth a warning
            except Exception as exc:  # keep the bus running; say what went wrong
                log.warning("garbage collection failed: %s", exc)

    async def _dead_letter_expired(self) -> None:
        """Republish the expired messages of the queues with ``dead_letter_expired``
        under their dead-letter topics, and what the queues with ``dead_letter_dropped``
        dropped (see :meth:`QueueStore.dead_letter_expired`).

        While this process sends for a queue with ``dead_letter_dropped``, it looks at
        the spools every :data:`_DEAD_LETTER_LOOK` (a listing of a folder, empty but for
        an overflow), and lists the queues for expired messages only when the soonest is
        due, or a second after the last listing, as without spools."""
        now = time.time()
        due, since = self._dead_letter_due, now - self._census_at
        census = (
            not self._spooling
            or since >= _EXPIRY_TICK
            or (due is not None and due <= now and since >= self._dead_letter_look)
        )
        done = await anyio.to_thread.run_sync(
            functools.partial(self._queues.dead_letter_expired, self._send_expired, census=census)
        )
        self._spooling = done.spooling
        if not census:
            return
        self._census_at = now
        # the next look no sooner than ten times this one's listing took: a long queue is
        # listed at most a tenth of the time (its sending is not counted: a backlog goes
        # out as fast as it can)
        self._dead_letter_look = max(_DEAD_LETTER_LOOK, 10 * done.listing)
        self._dead_letter_due = None if done.next_ms is None else done.next_ms / 1000

    def _send_expired(self, queue: str, target: str, messages: list[Expired], reason: str) -> None:
        """From a worker thread: publish expired (``reason`` ``expired``) or dropped
        (``maxlen``) messages of ``queue`` under ``target``, in order (with their queue,
        topic and the reason in ``x-fsbus-*`` headers), as :meth:`_give_up` does a failed
        one; or hand them to :attr:`_expired_hook`."""
        anyio.from_thread.run(self._publish_expired, queue, target, messages, reason)

    async def _publish_expired(
        self, queue: str, target: str, messages: list[Expired], reason: str
    ) -> None:
        hook = self._expired_hook
        if hook is not None and await hook(queue, target, messages, reason):
            self._counts["dead_lettered"] += len(messages)
            return
        # Into none of the queues of its cycle (the one it left, bound to its own
        # dead-letter topic; or one it expired in before, since it last failed)
        bound = self._queues.targets_if_fresh(target)
        if bound is None:  # (due to be checked against VERSION: not from the loop)
            bound = await anyio.to_thread.run_sync(self._queues.targets, target)
        for topic, payload, headers in messages:
            headers = dead_letter_headers(headers, queue, topic, reason)
            cycle = cycle_of(headers)
            others = tuple(d for d in bound if d.name not in cycle)
            if len(others) == len(bound):
                await self.publish(target, payload, headers=headers)
            else:
                await self._publish_into(target, payload, others, headers)
            self._counts["dead_lettered"] += 1
        log.debug(
            "%d message(s) of queue %r dead-lettered to %r (%s)",
            len(messages),
            queue,
            target,
            reason,
        )

    async def _gc_if_turn(self) -> None:
        """The periodic collection, run by one of the processes on the bus each
        ``gc_interval`` (:meth:`BusFS.gc_turn`), not by each of them."""
        fs = self._fs
        turn = await anyio.to_thread.run_sync(fs.gc_turn, self._cfg.gc_interval)
        if turn is None:
            return
        try:
            await self.gc()
        finally:
            with anyio.CancelScope(shield=True):  # (a closing bus lets the lock go too)
                await anyio.to_thread.run_sync(fs.gc_done, turn)

    async def gc(self, *, debris_age: float = 600.0) -> int:
        """Remove expired messages, quarantine foreign files, sweep crash debris, and
        delete the durable queues whose time is up (``expires`` with no use for that
        long, ``auto_delete`` with its last consumer dead).

        Debris (staging files of dead publishers, sidecars without a message) is removed
        once older than ``debris_age`` seconds. Returns the number of files removed or
        moved.
        """
        self._check_writable("gc (removing expired messages and debris)")
        in_flight = set(self._in_flight)
        keep = self._keep_expired
        n, q, debris = await anyio.to_thread.run_sync(
            lambda: collect_garbage(self._fs, in_flight, debris_age, keep_expired=keep)
        )
        await anyio.to_thread.run_sync(self._queues.expire_unused, self._send_expired)
        self._counts["expired"] += n
        self._counts["quarantined"] += q
        if q:
            log.warning("moved %d foreign file(s) to %s", q, self.layout.quarantine)
        return n + q + debris

    async def browse(
        self, pattern: str = "#", *, queue: str | None = None
    ) -> AsyncIterator[MessageInfo]:
        """Every unexpired message matching ``pattern``, without reading or consuming it.

        With ``queue=``, the messages waiting in that durable queue or held by one of
        its consumers (``locked``), those whose topic matches ``pattern``; nothing is
        taken from the queue. A queue that does not exist raises
        :class:`~fsbus.QueueNotFound`.
        """
        self._check_open()
        browse = functools.partial(
            browse_messages, self._fs, pattern, self._hosts, queue=queue, queues=self._queues
        )
        infos = await anyio.to_thread.run_sync(browse)
        for info in infos:
            yield info

    async def purge(self, pattern: str, *, kind: PurgeKind = "single") -> PurgeReport:
        """Remove the messages matching ``pattern`` that are on the bus now.

        ``kind`` says which: ``"single"`` (the default) the work-queue messages, as a
        queue purge does; ``"multi"`` the multi messages, for every subscriber at once
        (including those that would subscribe later with ``existing=True``); ``"all"``
        both. Multi messages are unlinked with their sidecars, as expiry removes them.
        A work-queue message is claimed and acknowledged like a consumer would, so one a
        consumer holds is never removed under it: it is counted in
        :attr:`PurgeReport.locked` and stays (with ``locking="rename"`` a held message
        has left its bucket and is not seen at all). Messages published during the
        purge may stay. Files that are not messages are never touched.

        A bad ``pattern`` or ``kind`` raises :class:`~fsbus.UsageError`
        (:class:`~fsbus.InvalidPattern`) before anything is read. Cancelling stops it
        between batches of messages; what it removed by then stays removed.
        """
        self._check_writable(f"purging {kind} messages matching {pattern!r}")
        pattern = check_purge(pattern, kind)
        multi, single = await anyio.to_thread.run_sync(purge_targets, self._fs, pattern, kind)
        counts = [0, 0, 0]
        for i in range(0, max(len(multi), len(single)), _PURGE_BATCH):
            got = await anyio.to_thread.run_sync(
                purge_some, self._fs, multi[i : i + _PURGE_BATCH], single[i : i + _PURGE_BATCH]
            )
            counts = [a + b for a, b in zip(counts, got, strict=True)]
        return PurgeReport(pattern, kind, single=counts[0], multi=counts[1], locked=counts[2])

    # ------------------------------------------------------------------ durable queues
    async def declare_queue(
        self,
        name: str,
        bindings: Sequence[str] = (),
        *,
        message_ttl: float | None = None,
        max_length: int | None = None,
        overflow: str = "drop-head",
        dead_letter: str | None = None,
        max_deliveries: int | None = None,
        auto_delete: bool = False,
        expires: float | None = None,
        dead_letter_expired: bool = False,
        dead_letter_dropped: bool = False,
    ) -> QueueInfo:
        """Declare a durable queue: every message published from now on whose topic
        matches one of ``bindings`` gets a copy in it, kept until a consumer of the queue
        takes it (or it expires), whether or not a consumer runs.

        Declaring an existing queue with the same options adds the bindings given;
        with other options it raises :class:`~fsbus.QueueMismatch`. See the Queues page
        for the options.
        """
        self._check_writable(f"declaring queue {name!r}")
        options = QueueOptions(
            message_ttl=message_ttl,
            max_length=max_length,
            overflow=overflow,  # type: ignore[arg-type]
            dead_letter=dead_letter,
            max_deliveries=max_deliveries,
            auto_delete=auto_delete,
            expires=expires,
            dead_letter_expired=dead_letter_expired,
            dead_letter_dropped=dead_letter_dropped,
        )
        if isinstance(bindings, str):
            bindings = [bindings]
        await anyio.to_thread.run_sync(self._queues.declare, name, list(bindings), options)
        return await self.queue_info(name)

    async def bind_queue(self, name: str, pattern: str) -> None:
        """Route messages matching ``pattern`` into queue ``name`` too (idempotent)."""
        self._check_writable(f"binding queue {name!r}")
        await anyio.to_thread.run_sync(self._queues.bind, name, pattern)

    async def unbind_queue(self, name: str, pattern: str) -> None:
        """Stop routing messages matching ``pattern`` into queue ``name``."""
        self._check_writable(f"unbinding queue {name!r}")
        await anyio.to_thread.run_sync(
            functools.partial(self._queues.bind, name, pattern, bind=False)
        )

    async def purge_queue(self, name: str) -> int:
        """Remove the messages waiting in queue ``name``; returns how many."""
        self._check_writable(f"purging queue {name!r}")
        return await anyio.to_thread.run_sync(self._queues.purge, name)

    async def delete_queue(
        self, name: str, *, if_unused: bool = False, if_empty: bool = False
    ) -> int:
        """Delete queue ``name`` and its messages; returns how many messages it held."""
        self._check_writable(f"deleting queue {name!r}")
        delete = functools.partial(
            self._queues.delete,
            name,
            if_unused=if_unused,
            if_empty=if_empty,
            send=self._send_expired,  # (what it dropped goes to its dead-letter topic first)
        )
        held = await anyio.to_thread.run_sync(delete)
        entry = self._queue_buses.get(name)
        if entry is not None and not entry.users:
            self._retire(name, entry)  # its bus, left open after its last consumer
        return held

    def routes(self, topic: str) -> list[str]:
        """The durable queues a message published on ``topic`` now gets a copy in."""
        self._check_open()
        return [d.name for d in self._queues.targets(validate_topic(topic))]

    async def queue_info(self, name: str) -> QueueInfo:
        """Queue ``name``: bindings, options, depth and consumers now."""
        # A consumer of this bus counts no longer from the moment its subscription is
        # closed, though it holds its consumer file until its messages are settled: the
        # files of this bus's consumers are left out of the listing and its open
        # subscriptions counted instead, on the event loop, once the listing is done
        # (a caller that reads the count with no await in between sees them as now).
        self._check_open()
        skip = frozenset(self._own_consumers.get(name, ()))  # (attaching later: on disk)
        info = await anyio.to_thread.run_sync(self._queues.info, name, skip)
        return self._with_own_consumers(info, skip)

    def _with_own_consumers(self, info: QueueInfo, skip: frozenset[str]) -> QueueInfo:
        live = self._own_live(info.name, skip)
        return dataclasses.replace(info, consumers=info.consumers + live) if live else info

    def _own_live(self, name: str, skip: frozenset[str]) -> int:
        """This bus's consumers of queue ``name`` among the files ``skip`` that are open."""
        own = self._own_consumers.get(name, {})
        return sum(1 for p in skip if (s := own.get(p)) is not None and not s.closed)

    async def queues(self) -> list[QueueInfo]:
        """Every queue declared on this bus."""
        self._check_open()

        def all_infos() -> list[QueueInfo]:
            out = []
            for n in self._queues.names():
                try:
                    out.append(self._queues.info(n, skip.get(n, ())))
                except FsBusError:
                    continue  # deleted meanwhile
            return out

        skip = {n: frozenset(own) for n, own in self._own_consumers.items()}
        infos = await anyio.to_thread.run_sync(all_infos)
        return [self._with_own_consumers(i, skip.get(i.name, frozenset())) for i in infos]

    async def enqueue(
        self,
        queue: str | Sequence[str],
        topic: str,
        payload: bytes | str,
        *,
        ttl: float | None = None,
        durable: bool = False,
        headers: dict[str, str] | None = None,
        priority: int | None = None,
    ) -> int:
        """Put a message straight into queue ``queue`` (no routing, no copy elsewhere),
        or into each of several queues, a copy each; how many queues got it.

        One queue that does not exist raises :class:`QueueNotFound`, and one that is
        full with ``overflow="reject-publish"`` raises :class:`QueueFull`, with nothing
        published. Of several queues, those that do not exist are left out, and a full
        one refuses its own copy only: the others get theirs, then :class:`QueueFull`
        names the ones that refused (as RabbitMQ nacks a publish one queue refused).
        """
        self._check_writable("enqueueing a message")
        self._namer.check(topic, ttl, priority)  # the queue's bus checks the headers
        data = payload_bytes(payload)
        self._namer.check_size(len(data))
        store = self._queues
        if isinstance(queue, str):
            if self._offload.inline:  # (cached: the routing table's lookup, as publish's)
                d = store.current(queue)
            else:
                d = await anyio.to_thread.run_sync(store.current, queue)
            targets: tuple[Definition, ...] = (d,)
            checked = functools.partial(store.check_room, targets, (topic, data, headers))
            put: Callable[[], int] = functools.partial(
                store.enqueue,
                d,
                topic,
                data,
                ttl=ttl,
                durable=durable,
                headers=headers,
                priority=priority,
            )
        else:
            names = list(queue)
            if self._offload.inline:
                targets = store.existing(names)
            else:
                targets = await anyio.to_thread.run_sync(store.existing, names)
            checked = None  # each queue's room is checked with its copy
            put = functools.partial(
                enqueue_each,
                store,
                targets,
                topic,
                data,
                ttl=ttl,
                durable=durable,
                headers=headers,
                priority=priority,
            )
        if durable or any(d.options.max_length is not None for d in targets):
            # synced, or counted now and then to keep to its length: in a worker thread

            def room_and_put() -> int:
                if checked is not None:
                    checked()
                return put()

            return await anyio.to_thread.run_sync(room_and_put)
        return await self._offload.call(put)  # inline while the mount is fast, as publish

    async def _subscribe_queue(
        self, name: str, pattern: str | None, handler: Handler, prefetch: int | None
    ) -> Subscription:
        self._check_writable(f"consuming queue {name!r}")
        if not _is_async_callable(handler):
            raise UsageError(f"handler must be an async function (async def), not {handler!r}")
        if pattern is not None:
            await self.bind_queue(name, pattern)
        root = self._queues.bus_root(name)

        def definition() -> tuple[Definition, int | None]:
            return self._queues.get(name), _inode(root)

        d, ino = await anyio.to_thread.run_sync(definition)
        inner = await self._queue_bus(name, None if ino is None else queue_id(d, ino))
        # Counted as a user of the queue's bus at once (no await since it was handed
        # out), so a consumer leaving meanwhile does not close it under this one.
        entry = self._queue_buses[name]
        token = object()
        entry.users.append(token)
        path = self._queues.consumer_path(name)
        own = self._own_consumers.setdefault(name, {})
        own[path] = None  # before its file exists: see queue_info
        try:
            fd = await anyio.to_thread.run_sync(self._queues.attach, name, path)
        except BaseException:
            self._forget_consumer(name, path)
            self._release_queue_bus(name, entry, token)
            raise
        self._start_routing()

        async def consume(msg: Message) -> None:
            limit = d.options.max_deliveries
            if limit is not None and msg.delivery_count > limit:
                # Every delivery max_deliveries allows was had and never settled: its
                # consumers ended with it in hand (a message that kills its consumer).
                # Dead-lettered (or dropped), not handed over again.
                never = RuntimeError("delivered that many times and never settled")
                await self._give_up(name, d.options, msg, never)
                return
            try:
                await handler(msg)
            except GiveBack:
                raise
            except Exception as exc:  # an iterator's release (Released) included
                if not await self._give_up(name, d.options, msg, exc):
                    raise

        try:
            sub = await inner.subscribe("#", consume, kind="single", prefetch=prefetch)
        except BaseException:
            await anyio.to_thread.run_sync(self._queues.detach, name, fd)
            self._forget_consumer(name, path)
            self._release_queue_bus(name, entry, token)
            raise
        sub.queue = name
        own[path] = sub
        sub.delivery_limit = d.options.max_deliveries  # (as consume checks it)

        async def give_up(msg: Message, exc: Exception) -> bool:
            return await self._give_up(name, d.options, msg, exc)

        sub.give_up = give_up

        async def leave() -> None:
            # Handlers still running finish and settle first: the queue's bus closes
            # with its last consumer, and would give their messages back.
            while _busy(sub) and not sub.bus._closed:
                sub.settled = anyio.Event()
                await sub.settled.wait()
            try:
                if sub.queue_gone:  # (its folder is gone, perhaps a new queue's in its place)
                    await anyio.to_thread.run_sync(os.close, fd)
                    deleted = True
                else:
                    deleted = await anyio.to_thread.run_sync(
                        self._queues.detach, name, fd, self._send_expired
                    )
            finally:
                self._forget_consumer(name, path)  # (its file gone first)
            self._release_queue_bus(name, entry, token, linger=not deleted)

        sub.on_close = leave
        return sub

    def _forget_consumer(self, name: str, path: str) -> None:
        own = self._own_consumers.get(name)
        if own is not None:
            own.pop(path, None)
            if not own:
                del self._own_consumers[name]

    async def _give_up(
        self, name: str, options: QueueOptions, msg: Message, exc: Exception
    ) -> bool:
        """A message of queue ``name`` failed: whether that was its last delivery (then it
        is dead-lettered, if the queue has a target, and is to be acked)."""
        limit = options.max_deliveries
        if limit is None or msg.delivery_count < limit:
            return False
        target = options.dead_letter
        if target is not None:
            await self.publish(
                target,
                msg.payload,
                headers=dead_letter_headers(msg.headers, name, msg.topic),
            )
        log.warning(
            "message %s of queue %r failed %d times (last: %s); %s",
            msg.name,
            name,
            msg.delivery_count,
            exc,
            f"dead-lettered to {target!r}" if target else "dropped",
        )
        self._counts["dead_lettered"] += 1
        return True

    @asynccontextmanager
    async def get(self, queue: str) -> AsyncIterator[Message | None]:
        """Take the next message of durable queue ``queue`` without subscribing to it:
        one claim, after a listing of what changed since the last ``get`` (AMQP's
        ``basic.get``).

        Yields the message, or None when none is ready (the queue is empty, or every
        message in it is held by a consumer). The message is held while the block runs:
        acknowledged when it ends, given back for redelivery when it raises, as a
        handler's message is (a failed delivery, dead-lettered or dropped after the
        queue's ``max_deliveries``). :class:`~fsbus.Decline` raised in the block gives it
        back untouched, not counted as a delivery, and ends the block quietly. A ``get`` is
        not a consumer of the queue. ::

            async with bus.get("billing") as msg:
                if msg is not None:
                    await charge(msg.payload)

        A queue that does not exist raises :class:`~fsbus.QueueNotFound`.
        """
        with contextlib.suppress(Decline):
            async with self._taking(queue) as taken:
                yield None if taken is None else taken[0]

    @asynccontextmanager
    async def _taking(
        self, queue: str, check: Callable[[], None] | None = None
    ) -> AsyncIterator[tuple[Message, int, int] | None]:
        """:meth:`get`, with how many other messages were ready in the queue when it
        took its own and how many consumers the queue has (see :meth:`_take_held`)."""
        held = await self._take_held(queue, check)
        if held is None:
            yield None
            return
        try:
            yield held.msg, held.waiting, held.consumers
        except BaseException as exc:
            await held.settle(exc)
            raise
        await held.settle(None)

    async def _take_held(self, queue: str, check: Callable[[], None] | None = None) -> Held | None:
        """Take the next message of queue ``queue`` and hold it, with no task and no
        block: it stays held until :attr:`Held.settle` is awaited, whenever the taker's
        client settles it (the AMQP gateway's ``basic.get``, whose ack is a method of
        its own). None when none is ready.

        The message comes with how many other messages were ready in the queue when it
        was taken (those another process's consumers hold counted in) and how many
        consumers the queue has, for the gateway's ``get-ok``. ``check``: blocking work
        of the caller's that must pass first (the gateway's exclusivity check), done
        with the queue's own look-up, under the same rule for the event loop."""
        self._check_writable(f"taking a message from queue {queue!r}")
        root = self._queues.bus_root(queue)

        skip = frozenset(self._own_consumers.get(queue, ()))

        def definition() -> tuple[Definition, int | None, int]:
            if check is not None:
                check()
            # as the routing table knows it (read again once VERSION changed): a get
            # after a change that returned sees it, with no read of the file each time
            d, ino = self._queues.current(queue), _inode(root)
            if ino is None:  # deleted since the table was read: says so (QueueNotFound)
                d = self._queues.get(queue)
            if d.options.expires is not None:
                self._queues.touch(queue)  # a get is a use, as on RabbitMQ (x-expires)
            return d, ino, self._queues.consumers(queue, skip)

        d, ino, consumers = await self._offload.call(definition)
        consumers += self._own_live(queue, skip)
        inner = await self._queue_bus(queue, None if ino is None else queue_id(d, ino))
        entry = self._queue_buses[queue]
        token = object()
        entry.users.append(token)  # no await since it was handed out: see _subscribe_queue
        try:
            self._start_routing()  # peers' messages reach it meanwhile
            while True:
                taken = await inner._take()
                if taken is None:
                    self._release_queue_bus(queue, entry, token)
                    return None
                msg, claim, key, waiting = taken
                limit = d.options.max_deliveries
                if limit is None or msg.delivery_count <= limit:
                    break
                # Every delivery max_deliveries allows was had, and never settled: the
                # getters ended with it in hand (killed). Dead-lettered, not handed over.
                never = RuntimeError("delivered that many times and never settled")
                with anyio.CancelScope(shield=True):
                    await self._give_up(queue, d.options, msg, never)
                    await inner._settle_taken(claim, msg, key, "ack")
        except BaseException:
            self._release_queue_bus(queue, entry, token)
            raise
        settled = False

        async def settle(exc: BaseException | None) -> None:
            # None: acked; Decline: given back untouched; another exception: a failed
            # delivery (dead-lettered after max_deliveries; a Requeue at once); anything
            # else (a cancellation, the bus closing): given back, no failure counted.
            nonlocal settled
            if settled:
                return
            settled = True
            with anyio.CancelScope(shield=True):  # (its claim is no one else's to settle)
                try:
                    outcome = "ack"
                    if isinstance(exc, Decline):
                        outcome = "unseen"
                    elif isinstance(exc, Exception):
                        try:
                            gave_up = await self._give_up(queue, d.options, msg, exc)
                        except Exception as err:  # not dead-lettered (a full disk...)
                            log.warning("could not dead-letter %s: %s", msg.name, err)
                            gave_up = False
                        if not gave_up:
                            outcome = _REQUEUE if isinstance(exc, Requeue) else "fail"
                    elif exc is not None:
                        outcome = "release"
                    await inner._settle_taken(claim, msg, key, outcome)
                finally:
                    self._release_queue_bus(queue, entry, token)

        return Held(msg, waiting, consumers, settle)

    async def _take(self) -> tuple[Message, Claim, tuple[int, str], int] | None:
        """:meth:`get` on this (a queue's) bus: claim its next message, or None."""
        self._check_open()
        if self._take_view is None:
            self._take_view = TakeView()
        # Inline while the mount is fast (a listing and a non-blocking claim), as a
        # publish: a worker-thread hop costs more than the work on a local disk.
        taken = await self._offload.call(
            functools.partial(
                self._take_view.take,
                self._fs,
                set(self._in_flight),
                count_deliveries=self._cfg.count_deliveries,
            )
        )
        if taken is None:
            return None
        e, claim = taken.entry, taken.claim
        self._in_flight.add(e.key)  # its own subscriptions pass it over
        if claim.renamed:
            self._held[e.key] = claim  # renewed until it is settled
        self._counts["delivered"] += 1
        msg = self._message(e, claim.payload, claim.meta, claim.attempts)
        return msg, claim, e.key, taken.waiting

    async def _settle_taken(
        self, claim: Claim, msg: Message, key: tuple[int, str], outcome: str
    ) -> None:
        """Ack (``"ack"``) or give back (``"fail"``: a failed delivery; a requeue: one,
        at once; ``"release"``: not one; ``"unseen"``: not even a delivery) a message
        :meth:`_take` took."""
        try:
            if outcome == "release":

                def release() -> None:
                    self._fs.release(claim, failed=False)

                await self._off(release)
                self._counts["released"] += 1
            else:
                await self._finish(claim, msg, outcome, direct=True)
                if outcome == "ack" and self._take_view is not None:
                    self._take_view.forget(*key)
        finally:
            self._held.pop(key, None)
            self._in_flight.discard(key)
            if not self._closed:
                self._waker.wake()  # a subscription may take it now

    def _start_routing(self) -> None:
        """Have this process route the messages of qlobber-fsq peers (who do not) into
        the queues, unless it does or waits to already: a consumer of a queue, or a
        ``get``, does, since it is what they are routed for (:meth:`_route_peers`, in the
        background: the consumer does not wait for a listing of the main bus)."""
        tg = self._tg
        if self._scanning or self._router_waiting or tg is None:
            return
        self._router_waiting = True
        tg.start_soon(self._route_peers, tg, time.time())

    async def _route_peers(self, tg: anyio.abc.TaskGroup, since: float) -> None:
        """Route peers' messages from the process elected for it
        (:meth:`QueueStore.take_router`), or wait for a turn (:meth:`_await_router`).

        Routing means listing the main bus: a process that scans it anyway (it
        subscribes there) routes as it goes; of the processes that only consume queues,
        one lists it for all, not each of them. ``since``: when the consumer that asked
        for it came. The first listing routes the peers' messages published since then
        (less :data:`_START_SLACK`), as if it had been made before that consumer's
        ``subscribe`` returned.
        """
        try:
            took = await anyio.to_thread.run_sync(self._queues.take_router)
        except (FsBusError, OSError) as exc:
            self._router_waiting = False
            log.warning("cannot route peers' messages on %s: %s", self.root, exc)
            return
        if not took:
            tg.start_soon(self._await_router, since)  # (still waiting)
            return
        self._router_waiting = False
        if self._scanning:
            return  # a subscription of its own scans meanwhile: it routes as it goes
        self._route_since = since - _START_SLACK
        with contextlib.suppress(FsBusError, OSError):
            await self._start_scanning(tg)
        if not self._scanning:
            self._route_since = None
            with contextlib.suppress(FsBusError, OSError):
                await anyio.to_thread.run_sync(self._queues.drop_router)

    async def _await_router(self, since: float) -> None:
        """Take over routing peers' messages when the router lets go (it closed, or its
        process died: its flock went with it), unless this bus scans for itself first.

        The new router's first listing routes the peers' messages it finds that no
        router has marked and that were published since the old router's last recorded
        progress (:meth:`QueueStore.note_progress`; without one, since this consumer
        began to wait), less :data:`_ROUTER_SLACK`: those the old router had not reached
        when it went. The markers keep each copy single if it had.
        """
        try:
            while not self._scanning:
                await anyio.sleep(_ROUTER_POLL)
                if self._scanning:
                    return  # a subscription of its own started a scan: it routes as it goes
                if not await anyio.to_thread.run_sync(self._queues.take_router):
                    continue
                tg = self._tg
                if tg is None:
                    return  # closing
                # from where the old router had got to (or, if it never said, from
                # when this one began to wait)
                progress = await anyio.to_thread.run_sync(self._queues.router_progress)
                # (never later than now: a router on a host whose clock runs ahead
                # would otherwise have the new one skip what came in between)
                start = since if progress is None else min(progress, time.time())
                self._route_since = start - _ROUTER_SLACK
                try:
                    await self._start_scanning(tg)
                except (FsBusError, OSError) as exc:
                    log.warning("cannot list %s to route peers' messages: %s", self.root, exc)
                    await anyio.to_thread.run_sync(self._queues.drop_router)
                    self._route_since = None
                    continue
                return
        finally:
            self._router_waiting = False

    async def _share_now(self, name: str, buckets: int) -> frozenset[int] | None:
        """This process's share of queue ``name``'s buckets (see share.py): its own
        consumers taken on the loop, before and after the others are looked at in a
        thread. A consumer of this process that came or left during the look is its own,
        never another's (counted as another, it made this process list half the buckets,
        and put off the other half, with no other consumer there)."""

        def own() -> frozenset[str]:
            return frozenset(os.path.basename(p) for p in self._own_consumers.get(name, ()))

        before = own()
        live = await anyio.to_thread.run_sync(self._queues.live_consumers, name, before)
        after = own()
        others = set(live) - before - after
        return share_of(others | after, after, buckets)

    def _release_queue_bus(
        self, name: str, entry: _Hosted, token: object, *, linger: bool = True
    ) -> None:
        """One user of a queue's bus is gone. After the last one the bus stays open for
        :data:`_QUEUE_BUS_LINGER` seconds, so that a consumer that comes back at once (an
        AMQP ``basic.get`` loop subscribes for each message) finds it running; or it
        closes now (``linger=False``: the queue was deleted)."""
        entry.users.remove(token)
        if not entry.users:
            if not linger:
                self._retire(name, entry)
            entry.idle.set()

    def _retire(self, name: str, entry: _Hosted) -> None:
        """Close queue ``name``'s bus ``entry`` (it has no users) without lingering."""
        entry.close_now = True
        if self._queue_buses.get(name) is entry:
            del self._queue_buses[name]
        entry.idle.set()

    async def _queue_bus(self, name: str, ident: QueueId | None) -> Bus:
        """The bus of queue ``name`` in this process, hosted by the runner; ``ident``:
        which queue it is now (see :meth:`QueueStore.identity`: a bus left open over one
        that was deleted, and perhaps declared again, is not used)."""
        # One bus per queue, however many consumers subscribe at once: the first starts
        # it and the others wait for it. (Two would compete through flock like two
        # processes, and the one not recorded here would run on, unseen, until close.)
        while True:
            entry = self._queue_buses.get(name)
            if entry is not None and entry.ident != ident and not entry.users:
                self._retire(name, entry)  # lingering over a queue deleted since
                entry = None
            if entry is not None:
                return entry.bus
            starting = self._queue_buses_starting.get(name)
            if starting is None:
                break
            await starting.wait()
        if self._tg is None:
            raise ClosedError("the bus is closed")
        starting = self._queue_buses_starting[name] = anyio.Event()
        try:
            hosted = _Hosted()
            await self._tg.start(self._host_queue_bus, name, hosted)
            self._queue_buses[name] = hosted
        finally:
            del self._queue_buses_starting[name]
            starting.set()
        return hosted.bus

    async def _trim_given_back(self, queue: str) -> None:
        """A message of ``queue`` (capped, ``drop-head``) was given back: ready again, it
        counts towards ``max_length`` again, and a full queue drops its head now, as
        RabbitMQ drops a message requeued into a full queue (see
        :meth:`QueueStore.trim_given_back`)."""
        try:
            await anyio.to_thread.run_sync(self._queues.trim_given_back, queue)
        except (FsBusError, OSError) as exc:  # the next publish trims it
            log.warning("trimming queue %r after a give-back failed: %s", queue, exc)

    async def _host_queue_bus(
        self, name: str, hosted: _Hosted, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        root = self._queues.bus_root(name)
        # the same I/O seam as this bus: a fault injected there reaches its consumers too
        bus = Bus._using(root, self._queues.sub_config, self._fs.ops)
        bus._fs.spares = False  # (what it publishes is rare: dead letters, given back)
        bus._fs.tag_stamps = False  # (no router reads a queue's bus)
        async with bus as inner:
            inner._queue_name = name  # (its messages say which queue they came from)
            with contextlib.suppress(FsBusError, OSError):  # (gone: no messages to keep)
                d = await anyio.to_thread.run_sync(self._queues.get, name)
                inner._keep_expired = d.options.dead_letter_expired
                if d.options.max_length is not None and d.options.overflow == "drop-head":
                    inner._given_back = functools.partial(self._trim_given_back, name)
            inner._fs.peerless = True  # (only fsbus processes read a queue's bus)
            if not self._fs.platform.shared:  # (flock and listings: see share.py)
                inner._share_look = functools.partial(
                    self._share_now, name, len(inner.layout.buckets)
                )
            hosted.bus = inner
            # the queue it opened (its folder created, if it was not there yet)
            hosted.ident = await anyio.to_thread.run_sync(self._queues.identity, name)
            task_status.started()
            async with anyio.create_task_group() as watching:
                watching.start_soon(self._watch_queue, name, hosted)
                while True:
                    await hosted.idle.wait()
                    if not hosted.users and not hosted.close_now:
                        with anyio.move_on_after(_QUEUE_BUS_LINGER):
                            # (and not over a queue another process deleted meanwhile)
                            while not hosted.users and not hosted.close_now:
                                await anyio.sleep(_QUEUE_BUS_LINGER / 8)
                                now = await anyio.to_thread.run_sync(self._queues.identity, name)
                                if now != hosted.ident:
                                    break
                    if hosted.users and not hosted.close_now:  # came back: they use it
                        hosted.idle = anyio.Event()
                        continue
                    if self._queue_buses.get(name) is hosted:
                        del self._queue_buses[name]
                    break
                watching.cancel_scope.cancel()
        for key in _CONSUMER_COUNTS:  # this bus's statistics keep what its queues did
            self._counts[key] += inner._counts[key]

    async def _watch_queue(self, name: str, hosted: _Hosted) -> None:
        """While queue ``name``'s bus has consumers here, look every
        :data:`_QUEUE_WATCH` seconds whether it is still the queue it opened.
        A queue deleted under them (by another process, or a bus of this one), and
        perhaps declared again, ends them, as RabbitMQ cancels the consumers of a queue
        that is deleted: their subscriptions close, iterators end, and
        :attr:`Subscription.on_queue_gone` is called."""
        while True:
            await anyio.sleep(_QUEUE_WATCH)
            if not hosted.users or hosted.close_now:
                continue
            now = await anyio.to_thread.run_sync(self._queues.identity, name)
            if now is None:  # it could not be told this time
                continue
            if hosted.ident is None and now != "gone":
                hosted.ident = now  # (it could not be told when the bus opened)
                continue
            if now == hosted.ident:
                continue
            subs = [
                s
                for s in self._own_consumers.get(name, {}).values()
                if s is not None and s.bus is hosted.bus and not s.closed
            ]
            if subs:
                log.warning(
                    "queue %r was deleted while %d consumer(s) of this process consumed "
                    "it: they end (declare it again and subscribe anew)",
                    name,
                    len(subs),
                )
            # (shielded: the last one's leaving closes the queue's bus, whose host then
            # stops this watch, and every hook must still run)
            with anyio.CancelScope(shield=True):
                for sub in subs:
                    sub.queue_gone = True
                    for it in [i for i in self._iterators if i.subscription is sub]:
                        it._close()  # what it still buffers goes back, and it ends
                    await self.unsubscribe(sub)
                    if sub.on_queue_gone is not None:
                        try:
                            await sub.on_queue_gone()
                        except Exception as exc:  # a caller's: it must not stop the bus
                            log.error("a hook of a consumer of %r failed: %s", name, exc)
            return

    def statistics(self) -> BusStatistics:
        """A snapshot of this Bus's counters (its queue consumers' included)."""
        c = collections.Counter(self._counts)
        for hosted in self._queue_buses.values():
            for key in _CONSUMER_COUNTS:
                c[key] += hosted.bus._counts[key]
        return BusStatistics(
            published=c["published"],
            delivered=c["delivered"],
            acked=c["acked"],
            released=c["released"],
            failed=c["failed"],
            dead_lettered=c["dead_lettered"],
            expired=c["expired"],
            quarantined=c["quarantined"],
            scans=c["scans"],
            subscriptions=len(self._subs),
            in_flight=len(self._in_flight),
            inotify=self._waker.inotify_active,
            claims_lost=c["claims_lost"],
            leases_lost=c["leases_lost"],
        )


class _Hosted:
    """A queue's bus that a Bus runs for its consumers of that queue in this process."""

    __slots__ = ("bus", "close_now", "ident", "idle", "users")

    def __init__(self) -> None:
        self.ident: QueueId | Literal["gone"] | None = None
        """Which queue it opened (see :meth:`QueueStore.identity`)."""
        self.bus: Bus = None  # type: ignore[assignment]  # set by its host task at once
        self.users: list[object] = []
        """A token per consumer using it."""
        self.idle = anyio.Event()
        """Set when the last user leaves."""
        self.close_now = False
        """Its queue was deleted: close it without lingering."""


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


_QUEUE_WATCH = 1.0
"""Seconds between two looks, while a queue has consumers in this process, at whether
it was deleted under them (:meth:`QueueStore.identity`: a stat and a read of its
definition)."""

_QUEUE_BUS_LINGER = 1.0
"""Seconds a queue's bus stays open after its last consumer in the process left."""

_CONSUMER_COUNTS = (
    "delivered acked released failed expired quarantined claims_lost leases_lost".split()
)
"""Counters of a queue's own bus that its host bus reports as its own."""


async def _gather_payload(payload: object) -> bytes:
    """A path's or an async iterable's bytes (copies into queues need them whole)."""
    if isinstance(payload, str | os.PathLike):
        return await anyio.Path(payload).read_bytes()
    if isinstance(payload, AsyncIterable):
        parts = []
        iterator = aiter(payload)
        try:
            async for chunk in iterator:
                if not isinstance(chunk, bytes | bytearray | memoryview):
                    raise UsageError(
                        f"payload chunks must be bytes, not {type(chunk).__name__}; "
                        "encode text chunks first (chunk.encode())"
                    )
                parts.append(bytes(chunk))
        finally:
            await _close_iterator(iterator)
        return b"".join(parts)
    raise UsageError(
        "payload must be bytes, str, a path or an async iterable of bytes, not "
        f"{type(payload).__name__}"
    )


async def _close_iterator(iterator: object) -> None:
    """Close a payload's async generator, even one left unfinished (a refused chunk, a
    payload over the limit): trio warns of one left to the garbage collector."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


def _is_async_callable(obj: object) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    return inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(
        getattr(obj, "__call__", None)  # noqa: B004
    )


def _has_meta(e: Entry) -> bool:
    f = e.fields
    return f is not None and bool(f.flags & FLAG_META)


def _unique(subs: list[Subscription]) -> list[Subscription]:
    out: list[Subscription] = []
    for s in subs:
        if s not in out:
            out.append(s)
    return out
