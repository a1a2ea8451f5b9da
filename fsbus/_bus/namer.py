"""Naming messages for one publisher: the unique part of a name, the host id, and the
validated topic forms (no I/O besides reading the pid namespace once)."""

from __future__ import annotations

import itertools
import os
import socket
from dataclasses import fields
from time import time

import xxhash

from .._errors import PayloadTooLarge
from .._settings import Settings
from .layout import Layout
from .message import PublishInfo
from .names import MAX_EXPIRES_MS, host_id
from .plan import PublishPlan, TopicForm, check_ttl_priority, plan_publish, topic_form

__all__ = ["Namer", "new_publish_info", "next_unique", "pid_namespace", "pid_tag"]

_SEQ = itertools.count(int.from_bytes(os.urandom(3), "big"))
_PID = [f"{os.getpid() & 0xFFFFFF:06x}"]
_xxh32 = xxhash.xxh32_intdigest


def _after_fork() -> None:
    _PID[0] = f"{os.getpid() & 0xFFFFFF:06x}"


os.register_at_fork(after_in_child=_after_fork)


def pid_tag() -> str:
    """This process's pid as message names carry it (six hex digits), kept current
    across forks without a system call."""
    return _PID[0]


def pid_namespace() -> str:
    """This process's pid namespace (its inode), or "" where there is none to read."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def next_unique() -> str:
    """12 hex digits unique on this host right now: pid, then a process-wide sequence.

    With the host id and publish time in the same name, two publishers never produce the
    same name (a rename would silently replace a message), and names from one process
    sort in publish order.
    """
    return f"{_PID[0]}{next(_SEQ) & 0xFFFFFF:06x}"


# PublishInfo is a frozen dataclass: its generated __init__ sets each field through
# object.__setattr__, which cost 5 % of a plain publish on tmpfs. Its slots can be
# filled directly instead; the result is the same object (same type, equality, repr).
_INFO_FIELDS = ("topic", "name", "bucket", "path", "single", "expires", "size")
if tuple(f.name for f in fields(PublishInfo)) != _INFO_FIELDS:  # pragma: no cover
    raise RuntimeError("PublishInfo changed its fields: update new_publish_info")
_new = object.__new__
(
    _set_topic,
    _set_name,
    _set_bucket,
    _set_path,
    _set_single,
    _set_expires,
    _set_size,
) = (getattr(PublishInfo, f).__set__ for f in _INFO_FIELDS)


def new_publish_info(
    topic: str, name: str, bucket: str, path: str, single: bool, expires: float, size: int
) -> PublishInfo:
    """``PublishInfo(topic, name, ...)``, built at under half the cost (the same object)."""
    info: PublishInfo = _new(PublishInfo)
    _set_topic(info, topic)
    _set_name(info, name)
    _set_bucket(info, bucket)
    _set_path(info, path)
    _set_single(info, single)
    _set_expires(info, expires)
    _set_size(info, size)
    return info


class Namer:
    """Names messages for one publisher: validated topic forms are cached per topic."""

    _MAX_FORMS = 4096

    def __init__(self, layout: Layout, config: Settings, *, inline_headers: bool = False) -> None:
        self._layout = layout
        self._config = config
        self._inline = inline_headers
        """Headers go into the message file, not a sidecar (``FLAG_INLINE``)."""
        self.hostname = socket.gethostname()
        """This host's name, as subscribers see it."""
        self.host = host_id(self.hostname, pid_namespace())
        """The host id written into names (host name and pid namespace)."""
        self._host = self.host
        self._forms: dict[str, TopicForm] = {}
        # What every plain publish (default ttl and priority, no headers) shares, for
        # name_plain: the kind and fsbus fields after the expiry, and the default ttl.
        prio = config.default_priority
        self._plain = (
            (f"+m+f10{prio:02x}", round(config.multi_ttl * 1000)),
            (f"+s+f10{prio:02x}", round(config.single_ttl * 1000)),
        )
        self._buckets = layout.buckets
        self._num_buckets = len(layout.buckets)

    def plan(
        self,
        topic: object,
        single: bool,
        ttl: float | None,
        durable: bool,
        headers: object,
        priority: int | None,
    ) -> PublishPlan:
        """Validate a publish call and name its file (no I/O)."""
        if type(topic) is str and headers is None and priority is None:
            # Default priority on a known topic, the default ttl or a plain number of
            # seconds (a queue's copies have theirs): the plan plan_publish would make.
            if ttl is None:
                named = self.name_plain(topic, single)
            elif (type(ttl) is float or type(ttl) is int) and ttl > 0:
                ttl_ms = MAX_EXPIRES_MS if ttl >= MAX_EXPIRES_MS / 1000 else round(ttl * 1000)
                named = self.name_plain(topic, single, ttl_ms)
            else:
                named = None  # (plan_publish says what is wrong with it)
            if named is not None:
                name, bi, expires_ms = named
                return PublishPlan(
                    topic,
                    name,
                    self._buckets[bi],
                    bi,
                    None,
                    None,
                    bool(durable),
                    bool(single),
                    expires_ms,
                )
        form = self._forms.get(topic) if type(topic) is str else None
        if form is None:
            form = self._form(topic)
        return plan_publish(
            self._layout,
            self._config,
            form,
            single=single,
            ttl=ttl,
            durable=durable,
            headers=headers,
            priority=priority,
            now_ms=int(time() * 1000),
            host=self._host,
            random_hex=next_unique(),
            inline=self._inline,
        )

    def check(self, topic: object, ttl: float | None, priority: int | None) -> None:
        """Validate a work-queue publish's topic, ttl and priority, as :meth:`plan` would
        (for a caller that plans elsewhere, e.g. in a queue's bus, which validates its
        headers then)."""
        if type(topic) is not str or topic not in self._forms:
            self._form(topic)
        check_ttl_priority(self._config, True, ttl, priority)

    def check_topic(self, topic: object) -> None:
        """Validate a topic, as :meth:`plan` would (for a caller that names the message
        later: ``publish_many``)."""
        if type(topic) is not str or topic not in self._forms:
            self._form(topic)

    def _form(self, topic: object) -> TopicForm:
        form = topic_form(topic, self._config.split_topic_at)
        if len(self._forms) >= self._MAX_FORMS:
            self._forms.clear()
        self._forms[form.topic] = form
        return form

    def name_plain(
        self, topic: object, single: bool, ttl_ms: int | None = None
    ) -> tuple[str, int, int] | None:
        """Name a plain message: (name, bucket index, expiry ms), or None to :meth:`plan` it.

        Plain means default priority, no headers, and a topic that :meth:`plan` has
        already validated and that fits in the name (no spill file); the default ttl, or
        ``ttl_ms`` (positive, checked by the caller). The name is the one :meth:`plan`
        would give at the same millisecond and unique part; only the general checks are
        skipped, since nothing here can be wrong.
        """
        form = self._forms.get(topic) if type(topic) is str else None
        if form is None or form.spill is not None:
            return None
        kind, default_ms = self._plain[1 if single else 0]
        ttl_ms = default_ms if ttl_ms is None else ttl_ms
        now_ms = int(time() * 1000)
        expires_ms = now_ms + ttl_ms
        if expires_ms > MAX_EXPIRES_MS:
            expires_ms = MAX_EXPIRES_MS
        name = (
            f"{form.head}{expires_ms:x}{kind}{now_ms & MAX_EXPIRES_MS:011x}"
            f"{self._host}{_PID[0]}{next(_SEQ) & 0xFFFFFF:06x}"
        )
        n = self._num_buckets
        return name, (_xxh32(name.encode("ascii")) % n if n > 1 else 0), expires_ms

    def check_size(self, size: int) -> None:
        """Refuse a payload over ``max_payload_size`` (before or while writing it)."""
        limit = self._config.max_payload_size
        if size > limit:
            raise PayloadTooLarge(
                f"payload of {size} bytes exceeds max_payload_size={limit}; raise "
                "BusConfig.max_payload_size, or put large data in a stream"
            )

    def info(self, plan: PublishPlan, size: int) -> PublishInfo:
        """What a publish wrote, for the caller."""
        return new_publish_info(
            plan.topic,
            plan.name,
            plan.bucket,
            self._layout.message_path(plan.bucket, plan.name),
            plan.single,
            plan.expires_ms / 1000,
            size,
        )
