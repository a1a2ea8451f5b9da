"""Browsing: the messages waiting on a bus or in a queue, without consuming them."""

from __future__ import annotations

import time

from .._core.topics import validate_pattern
from .._core.trie import TopicTrie
from .._errors import UsageError
from .._queues.store import QueueStore
from .fs import BusFS, decode_meta
from .layout import Layout
from .message import MessageInfo
from .names import FLAG_INLINE, FLAG_META
from .scan import ScanState, decide, long_names

__all__ = ["browse_messages", "read_browsed"]


def browse_messages(
    fs: BusFS,
    pattern: str,
    hosts: dict[str, str],
    *,
    queue: str | None = None,
    queues: QueueStore | None = None,
) -> list[MessageInfo]:
    """Blocking: the unexpired messages matching ``pattern`` (used by both faces).

    With ``queue`` (and the bus's queue store ``queues``): the messages of that queue,
    read from the queue's own bus (``fsbus/queues/<name>/bus``) without creating or
    changing anything there; host names still come from the main bus ``fs``.
    """
    pattern = validate_pattern(pattern)
    trie: TopicTrie[int] = TopicTrie()
    trie.add(pattern, 1)
    src = fs
    if queue is not None:
        if queues is None:
            raise UsageError("browse(queue=...) needs the bus's queues")  # pragma: no cover
        queues.get(queue)  # QueueNotFound (or UsageError for a bad name)
        # Not set up: setup() would create directories (and a deleted queue's folder
        # again); listing a missing bucket of the queue's bus just lists nothing.
        src = BusFS(Layout.of(queues.bus_root(queue), queues.sub_config), queues.sub_config, fs.ops)
    try:
        lay = src.layout
        listings = src.list_buckets(range(len(lay.buckets)))
        spills = src.read_spills(long_names(ScanState(), listings))
        d = decide(ScanState(), listings, spills, int(time.time() * 1000), baseline=True)
        out = []
        for e in [*d.present_multi, *d.singles]:
            assert e.topic is not None
            if not trie.match(e.topic):
                continue
            bucket = lay.buckets[e.bucket_index]
            st = src.stat_message(bucket, e.name)
            if st is None:
                continue
            f = e.fields
            if f is not None and f.host not in hosts:
                hosts.update(fs.read_hosts())
            size = max(0, st.st_size - 1)
            meta = None
            if f and f.flags & FLAG_INLINE:  # headers in the file: its size is more
                read = src.read_multi(bucket, e.name, has_meta=False)
                if read.payload is None:
                    continue  # consumed meanwhile, or damaged
                meta, size = read.meta, len(read.payload)
            elif f and f.flags & FLAG_META:
                meta = src.read_meta(bucket, e.name)
            out.append(
                MessageInfo(
                    topic=e.topic,
                    single=e.kind == "s",
                    expires=e.expires_ms / 1000,
                    size=size,
                    name=e.name,
                    bucket=bucket,
                    path=lay.message_path(bucket, e.name),
                    locked=e.kind == "s" and src.is_locked(bucket, e.name),
                    priority=f.priority if f else src.config.default_priority,
                    published_at=f.published_ms / 1000 if f else None,
                    host=hosts.get(f.host, f.host) if f else None,
                    headers=decode_meta(meta),
                )
            )
        return out
    finally:
        if src is not fs:
            src.close()


def read_browsed(fs: BusFS, info: MessageInfo, queues: QueueStore) -> bytes | None:
    """Blocking: the payload of a message :func:`browse_messages` listed, on the bus
    ``fs`` or in one of its queues (``info.path`` says which); None when it is gone, or
    when ``info`` names no message of this bus."""
    if info.path == fs.layout.message_path(info.bucket, info.name):
        return fs.read_payload(info.bucket, info.name)
    # <queues>/<queue>/bus/messages/<bucket>/<name>
    parts = info.path.rsplit("/", 5)
    if len(parts) != 6 or parts[0] != queues.base:
        return None
    config = queues.sub_config
    src = BusFS(Layout.of(queues.bus_root(parts[1]), config), config, fs.ops)
    try:
        if info.path != src.layout.message_path(info.bucket, info.name):
            return None
        return src.read_payload(info.bucket, info.name)
    finally:
        src.close()
