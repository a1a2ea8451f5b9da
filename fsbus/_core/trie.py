"""The topic trie: which subscriptions does a topic reach? (pure: no I/O, no clock)

Semantics are AMQP's as implemented by qlobber (and so qlobber-fsq): words split
on ``"."``; ``"*"`` matches exactly one non-empty word; ``"#"`` matches zero or
more words, anywhere in the pattern and any number of times; every other word,
including the empty word, matches itself. ``"*"`` and ``"#"`` inside a topic are
ordinary words (only a wildcard matches them).

Matching walks the trie word by word keeping the *set* of live nodes, so each
(node, word index) state is visited once: a pattern such as ``"#.#.#.#.a"``
against a 128-word topic costs ``O(words x live nodes)``, never exponential.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterator
from typing import Final, Generic, TypeVar

from .topics import SEPARATOR, WILDCARD_ONE, WILDCARD_SOME, validate_pattern

__all__ = ["ALL", "TopicTrie"]

V = TypeVar("V", bound=Hashable)


class _All(enum.Enum):
    ALL = enum.auto()


ALL: Final = _All.ALL
"""Pass as ``value`` to :meth:`TopicTrie.remove` to drop every value of a pattern."""


class _Node(Generic[V]):
    """One trie node: the patterns that reached it through the same words."""

    __slots__ = ("children", "closure", "hash", "is_hash", "key", "parent", "star", "values")

    def __init__(self, parent: _Node[V] | None, key: str) -> None:
        self.parent = parent
        # The pattern word leading here ("*" and "#" mean the wildcards).
        self.key = key
        self.is_hash = key == WILDCARD_SOME
        # Literal words (never "*" or "#": those are the two slots below).
        self.children: dict[str, _Node[V]] = {}
        self.star: _Node[V] | None = None
        self.hash: _Node[V] | None = None
        # value -> binding sequence number, for patterns ending here.
        self.values: dict[V, int] = {}
        # While ``hash`` is set: this node and the '#' nodes below it reached by matching
        # zero words (``hash``, ``hash.hash``, ...), as an ordered set (kept by _refresh).
        self.closure: dict[_Node[V], None] = {}

    def is_empty(self) -> bool:
        """Whether nothing ends here or passes through here (the node can go)."""
        return not (self.values or self.children or self.star or self.hash)


class TopicTrie(Generic[V]):
    """A set of ``(pattern, value)`` bindings, queried by topic: the matcher the bus uses.

    Patterns follow AMQP as qlobber (and so qlobber-fsq) does: words split on
    ``"."``; ``"*"`` matches exactly one non-empty word; ``"#"`` matches zero or
    more words, anywhere in the pattern. Values are any hashable objects.

    ```python
    trie: TopicTrie[str] = TopicTrie()
    trie.add("orders.*", "audit")
    trie.add("orders.#", "archive")
    trie.match("orders.created")  # ['audit', 'archive']
    ```

    Adding a binding that is already present changes nothing; each value comes
    out of :meth:`match` at most once, however many of its patterns match, in
    the order its earliest matching binding was added. A match costs
    ``O(words x live nodes)``, never exponential, whatever the wildcards.

    Patterns are checked when added or removed (a bad one raises
    :class:`~fsbus.InvalidPattern`). Topics given to :meth:`match` are not:
    any ``str`` is split and matched, so topics read from peers' files never raise.
    Not thread-safe: guard it with a lock if several threads change it.
    """

    __slots__ = ("_by_pattern", "_count", "_hashes", "_root", "_seq")

    def __init__(self) -> None:
        self._root: _Node[V] = _Node(None, "")
        # pattern -> the node its values live in (shortcut for add/remove).
        self._by_pattern: dict[str, _Node[V]] = {}
        self._count = 0
        self._seq = 0
        # '#' nodes in the trie: without any, matching is a plain tree walk.
        self._hashes = 0

    # --- bindings -------------------------------------------------------------

    def add(self, pattern: str, value: V) -> None:
        """Bind ``value`` to ``pattern`` (no-op if already bound).

        Raises :class:`~fsbus.InvalidPattern` if ``pattern`` is not a valid pattern.
        """
        validate_pattern(pattern)
        node = self._by_pattern.get(pattern)
        if node is None:
            node = self._root
            for word in pattern.split(SEPARATOR):
                if word == WILDCARD_SOME and node.hash is None:
                    self._hashes += 1
                node = _child(node, word)
            self._by_pattern[pattern] = node
        if value not in node.values:
            node.values[value] = self._seq
            self._seq += 1
            self._count += 1

    def remove(self, pattern: str, value: V | _All = ALL) -> int:
        """Unbind ``value`` from ``pattern``, or every value of it when ``value`` is left out.

        Returns how many bindings were removed (0 if there were none).
        """
        validate_pattern(pattern)
        node = self._by_pattern.get(pattern)
        if node is None:
            return 0
        if value is ALL:
            removed = len(node.values)
            node.values.clear()
        elif value in node.values:
            del node.values[value]
            removed = 1
        else:
            return 0
        self._count -= removed
        if not node.values:
            del self._by_pattern[pattern]
            self._hashes -= _prune(node)
        return removed

    def clear(self) -> None:
        """Remove every binding."""
        self._root = _Node(None, "")
        self._by_pattern.clear()
        self._count = 0
        self._hashes = 0

    def __len__(self) -> int:
        """Number of ``(pattern, value)`` bindings."""
        return self._count

    def patterns(self) -> list[str]:
        """The patterns with at least one value, oldest first."""
        return list(self._by_pattern)

    def bindings(self) -> Iterator[tuple[str, V]]:
        """Every ``(pattern, value)`` binding, grouped by pattern."""
        for pattern, node in self._by_pattern.items():
            for value in node.values:
                yield pattern, value

    # --- queries --------------------------------------------------------------

    def match(self, topic: str) -> list[V]:
        """The values whose patterns match ``topic``: each once, in binding order."""
        nodes = self._walk(topic)
        if not nodes:
            return []
        if len(nodes) == 1:
            return list(nodes[0].values)
        first: dict[V, int] = {}
        for node in nodes:
            for value, seq in node.values.items():
                seen = first.get(value)
                if seen is None or seq < seen:
                    first[value] = seq
        return sorted(first, key=first.__getitem__)

    def match_set(self, topic: str) -> set[V]:
        """The values whose patterns match ``topic``, as a set."""
        out: set[V] = set()
        for node in self._walk(topic):
            out.update(node.values)
        return out

    def test(self, topic: str, value: V) -> bool:
        """Whether ``value`` is bound to a pattern matching ``topic``."""
        return any(value in node.values for node in self._walk(topic))

    def _walk(self, topic: str) -> list[_Node[V]]:
        """Nodes holding values whose pattern matches ``topic``.

        ``live`` holds the nodes reached after the words consumed so far, closed under
        "a '#' may match zero words" (each node's ``closure``); a '#' node stays live on
        every following word (it absorbs it). Without any '#' the trie is a tree walked
        along distinct edges, so ``live`` holds no duplicates and needs no set; with
        some, ``live`` is an ordered set (a dict), so each node is visited once per word.
        """
        root = self._root
        if not self._hashes:
            nodes = [root]
            for word in topic.split(SEPARATOR):
                step: list[_Node[V]] = []
                for node in nodes:
                    child = node.children.get(word)
                    if child is not None:
                        step.append(child)
                    if word:
                        child = node.star
                        if child is not None:
                            step.append(child)
                if not step:
                    return []
                nodes = step
            return [node for node in nodes if node.values]
        live: dict[_Node[V], None] = {root: None} if root.hash is None else root.closure
        for word in topic.split(SEPARATOR):
            reached: dict[_Node[V], None] = {}
            for node in live:
                if node.is_hash:
                    reached[node] = None
                child = node.children.get(word)
                if child is not None:
                    if child.hash is None:
                        reached[child] = None
                    else:
                        reached.update(child.closure)
                if word:
                    child = node.star
                    if child is not None:
                        if child.hash is None:
                            reached[child] = None
                        else:
                            reached.update(child.closure)
            if not reached:
                return []
            live = reached
        return [node for node in live if node.values]


def _refresh(node: _Node[V]) -> None:
    """Recompute ``closure`` of ``node`` and of the '#' chain above it (its hash changed)."""
    cur: _Node[V] | None = node
    while cur is not None:
        below = cur.hash
        if below is None:
            cur.closure = {}
        elif below.hash is None:
            cur.closure = {cur: None, below: None}
        else:
            cur.closure = {cur: None, **below.closure}
        parent = cur.parent
        cur = parent if parent is not None and parent.hash is cur else None


def _child(node: _Node[V], word: str) -> _Node[V]:
    """The child of ``node`` for pattern word ``word``, created if missing."""
    if word == WILDCARD_ONE:
        if node.star is None:
            node.star = _Node(node, word)
        return node.star
    if word == WILDCARD_SOME:
        if node.hash is None:
            node.hash = _Node(node, word)
            _refresh(node)
        return node.hash
    child = node.children.get(word)
    if child is None:
        child = node.children[word] = _Node(node, word)
    return child


def _prune(node: _Node[V]) -> int:
    """Detach ``node`` and its ancestors while they hold nothing; return the '#' nodes gone."""
    gone = 0
    parent = node.parent
    while parent is not None and node.is_empty():
        if node.key == WILDCARD_ONE and parent.star is node:
            parent.star = None
        elif node.key == WILDCARD_SOME and parent.hash is node:
            parent.hash = None
            _refresh(parent)
            gone += 1
        else:
            del parent.children[node.key]
        node, parent = parent, parent.parent
    return gone
