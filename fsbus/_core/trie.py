"""The topic trie: which subscriptions does a topic reach? (pure: no I/O, no clock)

Semantics are AMQP's as implemented by qlobber (and so qlobber-fsq): words split
on ``"."``; ``"*"`` matches exactly one non-empty word; ``"#"`` matches zero or
more words, anywhere in the pattern and any number of times; every other word,
including the empty word, matches itself. ``"*"`` and ``"#"`` inside a topic are
ordinary words (only a wildcard matches them).

Matching walks the trie word by word keeping the *set* of live nodes, so each
(node, word index) state is visited once: a pattern such as ``"#.#.#.#.a"``
against a 128-word topic costs ``O(words x live nodes)``, never exponential. With
``#`` in the trie, that set is kept as a union of cached links (see "matching by links"
below), built by matches and dropped by every change: a word costs a lookup or two per link.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Final, Generic, Literal, TypeVar

from .topics import SEPARATOR, WILDCARD_ONE, WILDCARD_SOME, validate_pattern

__all__ = ["ALL", "TopicTrie"]

V = TypeVar("V", bound=Hashable)

# Most links (Link, below) cached for one trie between changes; a match that needs more
# walks the trie node by node. Links are built only from the trie's words (never from a
# topic's), so the cache cannot grow beyond what the bindings allow even without it.
LINK_LIMIT: Final = 1 << 15


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
    Not thread-safe: guard it with a lock if several threads change it. Several
    threads may match at once while none changes it (the cache that matches fill in
    only gains whole, immutable entries).
    """

    __slots__ = ("_by_pattern", "_count", "_hashes", "_links", "_root", "_seq")

    def __init__(self) -> None:
        self._root: _Node[V] = _Node(None, "")
        # pattern -> the node its values live in (shortcut for add/remove).
        self._by_pattern: dict[str, _Node[V]] = {}
        self._count = 0
        self._seq = 0
        # '#' nodes in the trie: without any, matching is a plain tree walk.
        self._hashes = 0
        # The root's link (Link, below), built by the first match after a change, and
        # with it every link; every change drops them (links never change in place).
        self._links: Link[V] | None = None

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
            self._links = None  # after the change: links built meanwhile go too

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
        self._links = None
        return removed

    def clear(self) -> None:
        """Remove every binding."""
        self._root = _Node(None, "")
        self._by_pattern.clear()
        self._count = 0
        self._hashes = 0
        self._links = None

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
        held = self._reach(topic)
        if not held:
            return []
        if len(held) == 1:
            return list(held[0])
        first: dict[V, int] = {}
        for values in held:
            for value, seq in values.items():
                seen = first.get(value)
                if seen is None or seq < seen:
                    first[value] = seq
        return sorted(first, key=first.__getitem__)

    def match_set(self, topic: str) -> set[V]:
        """The values whose patterns match ``topic``, as a set."""
        out: set[V] = set()
        for values in self._reach(topic):
            out.update(values)
        return out

    def test(self, topic: str, value: V) -> bool:
        """Whether ``value`` is bound to a pattern matching ``topic``."""
        return any(value in values for values in self._reach(topic))

    def _reach(self, topic: str) -> list[dict[V, int]]:
        """The values of the patterns matching ``topic``, in some non-empty dicts.

        Each maps a value to its binding number, in binding order; a value may be in
        several. ``live`` holds the nodes reached after the words consumed so far, closed
        under "a '#' may match zero words" (each node's ``closure``); a '#' node stays
        live on every following word (it absorbs it). Without any '#' the trie is a tree
        walked along distinct edges, so ``live`` holds no duplicates and needs no set.
        With some, ``live`` is a union of cached links (:class:`Link`: one or two dict
        lookups per link and word); a topic with an empty word (``"*"`` does not match
        it), or one that would need more than LINK_LIMIT links, is walked node by node
        as an ordered set (a dict), so each node is visited once per word.
        """
        root = self._root
        words = topic.split(SEPARATOR)
        if not self._hashes:
            nodes = [root]
            for word in words:
                reached: list[_Node[V]] = []
                for node in nodes:
                    child = node.children.get(word)
                    if child is not None:
                        reached.append(child)
                    if word:
                        child = node.star
                        if child is not None:
                            reached.append(child)
                if not reached:
                    return []
                nodes = reached
            return [node.values for node in nodes if node.values]
        if "" not in words:
            start = self._links
            if start is None:
                start = self._links = Link.start(root.closure or (root,))
            held = follow(start, words, LINK_LIMIT)
            if held is not None:
                return held
        live: dict[_Node[V], None] = {root: None} if root.hash is None else root.closure
        for word in words:
            live = step(live, word)
            if not live:
                return []
        return [node.values for node in live if node.values]


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


# --- matching by links --------------------------------------------------------------
#
# A trie match as a union of cached links: sets of nodes and what follows them.
#
# A match keeps the set of live trie nodes after each word (see ``TopicTrie._reach``). Most
# of what a word does to that set does not depend on the word: a ``#`` node stays live, and
# ``*`` children (closed under "a '#' matches zero words") become live, whatever the
# non-empty word. Only literal children depend on it. So the live set is kept as a union
# of :class:`Link` objects, each a set of nodes with, cached, the link that follows it on
# any non-empty word (``after``), the link each of its literal words adds (``go``), and
# the values its nodes hold (``held``). A word then costs a dict lookup or two per link
# instead of a visit per node, and a link is built once per trie change.
#
# Links are found by their node set (equal sets share one link) and only built from the
# trie's own words (``go``), so words in topics never grow the cache; a registry holds at
# most ``limit`` links, and a match that would need more is walked node by node.

# A link merges its nodes' values into one dict when they hold at most this many.
MERGED = 64
# A link whose nodes have more literal children than this fills ``go`` word by word, as
# topics use them (so a trie change never costs a pass over a wide node's children).
WIDE = 256


def step(live: Iterable[_Node[V]], word: str) -> dict[_Node[V], None]:
    """The nodes live after ``word`` given the ``live`` ones, as an ordered set."""
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
    return reached


class Link(Generic[V]):
    """A set of live nodes (closed under '#' matching zero words) and what follows it.

    ``go[word]``: what its literal children ``word`` reach, as the nodes until first
    needed and then as their link (if ``wide``: filled only as topics use the words);
    ``after``: the link that follows on any non-empty word, ``False`` if none does
    (``None`` until needed); ``held``: the values its nodes hold, as dicts of value ->
    binding number in binding order (one merged dict, or the nodes' own dicts when they
    hold more than MERGED values: no copies of large sets).
    Nothing else changes once built: a trie that changes starts a new registry.
    """

    __slots__ = ("after", "go", "held", "nodes", "registry", "wide")

    def __init__(self, nodes: tuple[_Node[V], ...], registry: dict[frozenset[Any], Link[V]]):
        self.nodes = nodes
        self.registry = registry
        self.after: Link[V] | Literal[False] | None = None
        lits: dict[str, dict[_Node[V], None]] = {}
        first: dict[V, int] = {}
        held = [node.values for node in nodes if node.values]
        merge = len(held) > 1 and sum(map(len, held)) <= MERGED
        self.wide = sum(len(node.children) for node in nodes) > WIDE
        for node in nodes:
            for word, child in () if self.wide else node.children.items():
                into = lits.get(word)
                if into is None:
                    into = lits[word] = {}
                if child.hash is None:
                    into[child] = None
                else:
                    into.update(child.closure)
            if merge:
                for value, seq in node.values.items():
                    seen = first.get(value)
                    if seen is None or seq < seen:
                        first[value] = seq
        self.go: dict[str, Link[V] | dict[_Node[V], None]] = dict(lits)
        if merge:
            held = [{value: first[value] for value in sorted(first, key=first.__getitem__)}]
        self.held = held

    @classmethod
    def start(cls, live: Iterable[_Node[V]]) -> Link[V]:
        """The link of a new registry for ``live``, the root's zero-word closure."""
        nodes = tuple(live)
        registry: dict[frozenset[Any], Link[V]] = {}
        link = registry[frozenset(nodes)] = cls(nodes, registry)
        return link

    def _find(self, reached: dict[_Node[V], None], limit: int) -> Link[V] | None:
        """The link for the node set ``reached`` (``None`` if ``limit`` links exist)."""
        key = frozenset(reached)
        registry = self.registry
        link = registry.get(key)
        if link is None:
            if len(registry) >= limit:
                return None
            link = registry.setdefault(key, Link(tuple(reached), registry))
        return link

    def next(self, limit: int) -> Link[V] | Literal[False] | None:
        """What follows on any non-empty word (``after``); ``None`` past ``limit`` links."""
        reached: dict[_Node[V], None] = {}
        for node in self.nodes:
            if node.is_hash:
                reached[node] = None
            child = node.star
            if child is not None:
                if child.hash is None:
                    reached[child] = None
                else:
                    reached.update(child.closure)
        if not reached:
            self.after = False
            return False
        after = self._find(reached, limit)
        if after is not None:
            self.after = after
        return after

    def look(self, word: str, limit: int) -> Link[V] | Literal[False] | None:
        """``go[word]`` of a wide link: ``False`` if no literal child is ``word``."""
        reached: dict[_Node[V], None] = {}
        for node in self.nodes:
            child = node.children.get(word)
            if child is not None:
                if child.hash is None:
                    reached[child] = None
                else:
                    reached.update(child.closure)
        if not reached:
            return False
        return self.take(word, reached, limit)

    def take(self, word: str, nodes: dict[_Node[V], None], limit: int) -> Link[V] | None:
        """The link of ``nodes``, which the literal children ``word`` reach (and keep it)."""
        link = self._find(nodes, limit)
        if link is not None:
            self.go[word] = link
        return link


def follow(start: Link[V], words: list[str], limit: int) -> list[dict[V, int]] | None:
    """The value maps of the links live after ``words`` (none empty) from ``start``.

    ``None`` if that needs more than ``limit`` links (the caller walks node by node).
    """
    links: Iterable[Link[V]] = (start,)
    for word in words:
        reached: dict[Link[V], None] = {}
        for link in links:
            after = link.after
            if after:
                reached[after] = None
            elif after is None:
                after = link.next(limit)
                if after is None:
                    return None
                if after:
                    reached[after] = None
            to = link.go.get(word)
            if to is None:
                if link.wide:
                    got = link.look(word, limit)
                    if got:
                        reached[got] = None
                    elif got is None:
                        return None
                continue
            if isinstance(to, dict):
                to = link.take(word, to, limit)
                if to is None:
                    return None
            reached[to] = None
        if not reached:
            return []
        links = reached
    return [values for link in links for values in link.held]
