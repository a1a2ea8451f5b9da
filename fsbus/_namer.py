"""Naming messages for one publisher: the unique part of a name, the host id, and the
validated topic forms (no I/O besides reading the pid namespace once)."""

from __future__ import annotations

import itertools
import os
import socket
import time

from ._config import BusConfig
from ._errors import PayloadTooLarge
from ._layout import Layout
from ._message import PublishInfo
from ._names import host_id
from ._plan import PublishPlan, TopicForm, plan_publish, topic_form

__all__ = ["Namer", "next_unique", "pid_namespace"]

_SEQ = itertools.count(int.from_bytes(os.urandom(3), "big"))
_PID = [f"{os.getpid() & 0xFFFFFF:06x}"]


def _after_fork() -> None:
    _PID[0] = f"{os.getpid() & 0xFFFFFF:06x}"


os.register_at_fork(after_in_child=_after_fork)


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


class Namer:
    """Names messages for one publisher: validated topic forms are cached per topic."""

    _MAX_FORMS = 4096

    def __init__(self, layout: Layout, config: BusConfig) -> None:
        self._layout = layout
        self._config = config
        self.hostname = socket.gethostname()
        """This host's name, as subscribers see it."""
        self.host = host_id(self.hostname, pid_namespace())
        """The host id written into names (host name and pid namespace)."""
        self._host = self.host
        self._forms: dict[str, TopicForm] = {}

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
        form = self._forms.get(topic) if type(topic) is str else None
        if form is None:
            form = topic_form(topic, self._config.split_topic_at)
            if len(self._forms) >= self._MAX_FORMS:
                self._forms.clear()
            self._forms[form.topic] = form
        return plan_publish(
            self._layout,
            self._config,
            form,
            single=single,
            ttl=ttl,
            durable=durable,
            headers=headers,
            priority=priority,
            now_ms=int(time.time() * 1000),
            host=self._host,
            random_hex=next_unique(),
        )

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
        return PublishInfo(
            topic=plan.topic,
            name=plan.name,
            bucket=plan.bucket,
            path=self._layout.message_path(plan.bucket, plan.name),
            single=plan.single,
            expires=plan.expires_ms / 1000,
            size=size,
        )
