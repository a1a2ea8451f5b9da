"""The topic trie against the RabbitMQ/qlobber vectors, named examples and a reference matcher."""

from __future__ import annotations

import itertools
import json
import random
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsbus import InvalidPattern
from fsbus._core import trie as trie_module
from fsbus._core.topics import MAX_WORDS
from fsbus._core.trie import ALL, TopicTrie

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "rabbitmq_topic_vectors.json").read_text("utf-8")
)
BINDINGS: list[tuple[str, str]] = [(p, v) for p, v in VECTORS["bindings"]]


def loaded() -> TopicTrie[str]:
    trie: TopicTrie[str] = TopicTrie()
    for pattern, value in BINDINGS:
        trie.add(pattern, value)
    return trie


def cases(key: str) -> list[Any]:
    return [pytest.param(topic, expected, id=repr(topic)) for topic, expected in VECTORS[key]]


# --- RabbitMQ conformance vectors (ids compared sorted as strings, as the vectors are) ---------


@pytest.mark.parametrize(("topic", "expected"), cases("tests"))
def test_rabbitmq_vectors(topic: str, expected: list[str]) -> None:
    trie = loaded()
    assert len(trie) == len(BINDINGS) == 26
    assert sorted(trie.match(topic)) == expected
    assert trie.match_set(topic) == set(expected)
    for _, value in BINDINGS:
        assert trie.test(topic, value) is (value in expected)


@pytest.mark.parametrize(("topic", "expected"), cases("tests_after_remove"))
def test_rabbitmq_vectors_after_remove(topic: str, expected: list[str]) -> None:
    trie = loaded()
    for index in VECTORS["bindings_to_remove"]:
        pattern, value = BINDINGS[index - 1]
        assert trie.remove(pattern, value) == 1
    assert len(trie) == len(BINDINGS) - len(VECTORS["bindings_to_remove"])
    assert sorted(trie.match(topic)) == expected


@pytest.mark.parametrize(("topic", "expected"), cases("tests_after_remove_all"))
def test_rabbitmq_vectors_after_remove_all(topic: str, expected: list[str]) -> None:
    trie = loaded()
    for index in VECTORS["bindings_to_remove"]:
        pattern, _ = BINDINGS[index - 1]
        trie.remove(pattern)
    # "a.b.c" had two values (t1, t20): removing the pattern drops both.
    assert len(trie) == len(BINDINGS) - len(VECTORS["bindings_to_remove"]) - 1
    assert sorted(trie.match(topic)) == expected


@pytest.mark.parametrize(("topic", "expected"), cases("tests_after_clear"))
def test_rabbitmq_vectors_after_clear(topic: str, expected: list[str]) -> None:
    trie = loaded()
    trie.clear()
    assert len(trie) == 0
    assert trie.patterns() == []
    assert sorted(trie.match(topic)) == expected == []


# --- the examples of the design, by name -------------------------------------------------


def matches(pattern: str, topic: str) -> bool:
    trie: TopicTrie[int] = TopicTrie()
    trie.add(pattern, 1)
    return trie.match(topic) == [1]


@pytest.mark.parametrize("pattern", ["a.#", "#.a", "#.*", "*.#"])
def test_one_word_matches_hash_and_star_combinations(pattern: str) -> None:
    assert matches(pattern, "a")


def test_repeated_hash_matches_zero_words_in_the_middle() -> None:
    assert matches("a.#.#.b", "a.b")
    assert matches("a.#.#.b", "a.x.y.z.b")
    assert not matches("a.#.#.b", "a.x")


def test_empty_topic_matches_empty_and_hash_only() -> None:
    assert matches("", "")
    assert matches("#", "")
    assert matches("#.#", "")
    assert not matches("*", "")
    assert not matches("#.*", "")
    assert not matches("#.*.#", "")


def test_star_does_not_match_an_empty_word() -> None:
    assert not matches("a.*.b", "a..b")
    assert matches("a..b", "a..b")
    assert matches("a.#.b", "a..b")
    assert not matches("a.*", "a.")
    assert matches("a.#", "a.")


def test_star_matches_exactly_one_word() -> None:
    assert matches("a.*", "a.b")
    assert not matches("a.*", "a")
    assert not matches("a.*", "a.b.c")


def test_hash_matches_zero_or_more_words_anywhere() -> None:
    assert matches("#", "a.b.c")
    assert matches("#.c", "c")
    assert matches("#.c", "a.b.c")
    assert not matches("#.c", "a.b.c.d")
    assert matches("a.#.c.#", "a.c")
    assert matches("a.#.c.#", "a.x.c.y.z")


def test_wildcards_in_a_topic_are_ordinary_words() -> None:
    assert matches("a.*", "a.*")
    assert matches("a.*", "a.#")
    assert not matches("a.b", "a.*")
    assert not matches("a.b", "a.#")
    assert matches("a.#", "a.#.#")


def test_wildcard_characters_inside_a_word_are_literal() -> None:
    assert matches("a*", "a*")
    assert not matches("a*", "ab")
    assert matches("x.#y", "x.#y")
    assert not matches("x.#y", "x.y")
    assert not matches("x.#y", "x")


def test_rabbitmq_tutorial_example() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("*.orange.*", "Q1")
    trie.add("*.*.rabbit", "Q2")
    trie.add("lazy.#", "Q2")
    assert trie.match("quick.orange.rabbit") == ["Q1", "Q2"]
    assert trie.match("lazy.orange.elephant") == ["Q1", "Q2"]
    assert trie.match("quick.orange.fox") == ["Q1"]
    assert trie.match("lazy.brown.fox") == ["Q2"]
    assert trie.match("lazy.pink.rabbit") == ["Q2"]  # two patterns, one value
    assert trie.match("quick.brown.fox") == []
    assert trie.match("orange") == []
    assert trie.match("quick.orange.male.rabbit") == []
    assert trie.match("lazy.orange.male.rabbit") == ["Q2"]


def test_many_hashes_against_a_long_topic_stay_polynomial() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("#.#.#.#.#.#.#.#.#.#.#.#.a", "hashes")
    trie.add("#.*.#.*.#.*.#.*.#.*.#", "mixed")
    long_topic = ".".join(["b"] * 127 + ["a"])
    assert trie.match(long_topic) == ["hashes", "mixed"]
    assert trie.match(".".join(["b"] * 128)) == ["mixed"]


# --- values, order and bookkeeping -------------------------------------------------------


def test_match_returns_each_value_once_in_binding_order() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a.#", "late")
    trie.add("#", "first")
    trie.add("a.b", "second")
    trie.add("a.*", "first")
    trie.add("a.b", "late")
    assert trie.match("a.b") == ["late", "first", "second"]
    assert trie.match_set("a.b") == {"late", "first", "second"}
    trie.remove("a.#", "late")
    # "late" now comes only from its "a.b" binding, added after "first" and "second".
    assert trie.match("a.b") == ["first", "second", "late"]


def test_equal_values_are_one_value() -> None:
    trie: TopicTrie[tuple[str, int]] = TopicTrie()
    trie.add("x.*", ("sub", 1))
    trie.add("#", ("sub", 1))
    assert trie.match("x.y") == [("sub", 1)]
    assert len(trie) == 2


def test_adding_a_binding_twice_changes_nothing() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a.b", "v")
    trie.add("a.b", "v")
    assert len(trie) == 1
    assert trie.remove("a.b", "v") == 1
    assert trie.match("a.b") == []


def test_remove_one_value_or_all() -> None:
    trie: TopicTrie[str] = TopicTrie()
    for value in ("x", "y", "z"):
        trie.add("a.*", value)
    trie.add("a.b", "x")
    assert trie.remove("a.*", "y") == 1
    assert trie.match("a.b") == ["x", "z"]
    assert trie.remove("a.*", "y") == 0
    assert trie.remove("a.*", ALL) == 2
    assert trie.match("a.b") == ["x"]
    assert trie.remove("a.*") == 0
    assert trie.remove("never.added") == 0
    assert trie.patterns() == ["a.b"]
    assert len(trie) == 1


def test_test_checks_one_value() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a.*", "x")
    trie.add("b.#", "y")
    assert trie.test("a.b", "x")
    assert not trie.test("a.b", "y")
    assert not trie.test("a", "x")
    assert trie.test("b", "y")


def test_patterns_and_bindings_list_what_was_added() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("a.#", 1)
    trie.add("", 2)
    trie.add("a.#", 3)
    assert trie.patterns() == ["a.#", ""]
    assert list(trie.bindings()) == [("a.#", 1), ("a.#", 3), ("", 2)]


def test_remove_prunes_the_trie_back_to_empty() -> None:
    trie: TopicTrie[int] = TopicTrie()
    patterns = ["a.b.c", "a.*.c", "a.#", "#", "#.#.x", "*", "", "a..b", "a.#.*.#"]
    for i, pattern in enumerate(patterns):
        trie.add(pattern, i)
    for pattern in patterns:
        trie.remove(pattern)
    assert len(trie) == 0
    root = trie._root
    assert root.is_empty()


def test_invalid_patterns_are_refused_before_anything_changes() -> None:
    trie: TopicTrie[int] = TopicTrie()
    with pytest.raises(InvalidPattern, match="control character"):
        trie.add("a.\x00", 1)
    with pytest.raises(InvalidPattern, match="must be a str, not bytes"):
        trie.add(b"a.b", 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidPattern, match="must be a str, not list"):
        trie.add(["a"], 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidPattern, match="more than the limit of 100"):
        trie.remove("a." * 100)
    assert len(trie) == 0
    assert trie.patterns() == []


def test_match_accepts_any_str_topic() -> None:
    trie: TopicTrie[int] = TopicTrie()
    trie.add("#", 1)
    assert trie.match("x" * 5000) == [1]
    assert trie.match("." * 500) == [1]


# --- against a tiny reference matcher ----------------------------------------------------


def reference_matches(pattern: str, topic: str) -> bool:
    """The definition, written as directly as possible (exponential, fine for small input)."""

    def go(ps: list[str], ts: list[str]) -> bool:
        if not ps:
            return not ts
        head, rest = ps[0], ps[1:]
        if head == "#":
            return any(go(rest, ts[k:]) for k in range(len(ts) + 1))
        if not ts:
            return False
        if head == "*":
            return ts[0] != "" and go(rest, ts[1:])
        return head == ts[0] and go(rest, ts[1:])

    return go(pattern.split("."), topic.split("."))


WORDS = st.sampled_from(["", "a", "b", "*", "#", "a*", "#b"])
PATTERNS = st.lists(WORDS, min_size=1, max_size=6).map(".".join)
TOPICS = st.lists(WORDS, min_size=1, max_size=7).map(".".join)


@settings(max_examples=300, deadline=None)
@given(patterns=st.lists(PATTERNS, min_size=1, max_size=12), topics=st.lists(TOPICS, max_size=8))
def test_trie_agrees_with_reference_matcher(patterns: list[str], topics: list[str]) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for i, pattern in enumerate(patterns):
        trie.add(pattern, i)
    for topic in topics:
        expected = [i for i, p in enumerate(patterns) if reference_matches(p, topic)]
        assert trie.match(topic) == expected
        assert trie.match_set(topic) == set(expected)
        assert all(trie.test(topic, i) is (i in expected) for i in range(len(patterns)))


@settings(max_examples=200, deadline=None)
@given(
    bindings=st.lists(st.tuples(PATTERNS, st.integers(0, 3)), max_size=15),
    data=st.data(),
)
def test_add_remove_round_trips(bindings: list[tuple[str, int]], data: st.DataObject) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for pattern, value in bindings:
        trie.add(pattern, value)
    unique = list(dict.fromkeys(bindings))
    assert len(trie) == len(unique)
    assert sorted(trie.bindings()) == sorted(unique)

    removed = data.draw(st.lists(st.sampled_from(unique), unique=True) if unique else st.just([]))
    for pattern, value in removed:
        assert trie.remove(pattern, value) == 1
    kept = [b for b in unique if b not in removed]
    assert trie._hashes == _hash_nodes(trie._root)  # the '#'-free fast path stays honest
    assert sorted(trie.bindings()) == sorted(kept)
    assert len(trie) == len(kept)
    for topic in data.draw(st.lists(TOPICS, max_size=5)):
        expected = {v for p, v in kept if reference_matches(p, topic)}
        assert trie.match_set(topic) == expected

    for pattern, value in removed:
        trie.add(pattern, value)
    assert sorted(trie.bindings()) == sorted(unique)
    for pattern in {p for p, _ in unique}:
        trie.remove(pattern)
    assert len(trie) == 0
    assert trie._root.is_empty()
    assert trie._hashes == 0


def _hash_nodes(node: Any) -> int:
    kids = [*node.children.values(), node.star, node.hash]
    return int(node.is_hash) + sum(_hash_nodes(k) for k in kids if k is not None)


# --- the link cache (trie.Link) against the reference, with changes between -------

LONG_TOPICS = st.lists(WORDS, min_size=1, max_size=12).map(".".join)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), PATTERNS, st.integers(0, 4)),
        st.tuples(st.just("remove"), PATTERNS, st.one_of(st.none(), st.integers(0, 4))),
        st.tuples(st.just("match"), LONG_TOPICS, st.none()),
    ),
    max_size=40,
)


def expected_match(bindings: list[tuple[str, int]], topic: str) -> list[int]:
    """Each value once, ordered by its earliest matching binding (``bindings`` in add order)."""
    return list(dict.fromkeys(v for p, v in bindings if reference_matches(p, topic)))


@pytest.mark.parametrize(
    ("limit", "merged", "wide"),
    [
        (trie_module.LINK_LIMIT, trie_module.MERGED, trie_module.WIDE),
        (1, 64, 256),
        (2, 0, 0),
        (5, 1, 1),
        (trie_module.LINK_LIMIT, 0, 0),
    ],
)
@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_cached_matches_agree_with_reference_through_changes(
    limit: int, merged: int, wide: int, ops: list[tuple[str, str, int | None]]
) -> None:
    # Matches build links; every add or remove must drop them (a small LINK_LIMIT sends
    # some matches to the node-by-node walk part way through; a small MERGED leaves
    # links holding their nodes' own value dicts; a small WIDE fills links word by word).
    saved = trie_module.LINK_LIMIT, trie_module.MERGED, trie_module.WIDE
    trie_module.LINK_LIMIT = limit  # type: ignore[misc]
    trie_module.MERGED, trie_module.WIDE = merged, wide
    try:
        trie: TopicTrie[int] = TopicTrie()
        bindings: list[tuple[str, int]] = []  # in binding order, as the trie numbers them
        for op, text, value in ops:
            if op == "add":
                assert value is not None
                trie.add(text, value)
                if (text, value) not in bindings:
                    bindings.append((text, value))
            elif op == "remove":
                gone = [b for b in bindings if b[0] == text and value in (None, b[1])]
                assert trie.remove(text, ALL if value is None else value) == len(gone)
                bindings = [b for b in bindings if b not in gone]
            else:
                expected = expected_match(bindings, text)
                for _ in range(2):  # cold, then from the links the first match built
                    assert trie.match(text) == expected, (bindings, text)
                    assert trie.match_set(text) == set(expected)
                    assert all(trie.test(text, v) is (v in expected) for v in range(5))
    finally:
        trie_module.LINK_LIMIT, trie_module.MERGED, trie_module.WIDE = saved  # type: ignore[misc]


def test_links_follow_a_change_made_after_a_match() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("#.b", "x")
    assert trie.match("a.b") == ["x"]
    trie.add("a.#", "y")
    trie.add("*.b", "x")
    assert trie.match("a.b") == ["x", "y"]
    trie.remove("#.b")
    assert trie.match("a.b") == ["y", "x"]
    trie.remove("*.b", "x")
    assert trie.match("a.b") == ["y"]
    trie.clear()
    assert trie.match("a.b") == []
    trie.add("#", "z")
    assert trie.match("a.b") == ["z"]


def test_topic_words_never_grow_the_link_cache() -> None:
    # Links come from the trie's own words: ids in topics add none, however many.
    trie: TopicTrie[str] = TopicTrie()
    for pattern in ("orders.*.created", "orders.#", "#.created", "*.*.#.x"):
        trie.add(pattern, pattern)
    trie.match("orders.1.created")
    trie.match("id.created.x")
    assert trie._links is not None
    before = len(trie._links.registry)
    for i in range(2000):
        assert trie.match(f"orders.{i}.created") == ["orders.*.created", "orders.#", "#.created"]
        assert trie.match(f"id{i}.created.x") == ["*.*.#.x"]
    assert len(trie._links.registry) == before


def test_a_wide_link_fills_in_only_the_words_topics_use() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("#.end", "end")
    for i in range(trie_module.WIDE + 1):
        trie.add(f"w{i}.#", f"w{i}")
    assert trie.match("w7.x.end") == ["end", "w7"]
    assert trie.match("nothing.x") == []
    start = trie._links
    assert start is not None
    assert start.wide
    assert set(start.go) == {"w7"}


def test_links_stay_within_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trie_module, "LINK_LIMIT", 3)
    trie: TopicTrie[int] = TopicTrie()
    for i, pattern in enumerate(["#.a.*", "#.b.#.c", "*.#.a", "a.#", "#.b.b"]):
        trie.add(pattern, i)
    topics = [".".join(w) for w in itertools.product("abc", repeat=4)]
    got = {t: trie.match(t) for t in topics}
    assert trie._links is not None
    assert len(trie._links.registry) <= 3
    patterns = [p for p, _ in sorted(trie.bindings(), key=lambda b: b[1])]
    for topic in topics:
        assert got[topic] == [i for i, p in enumerate(patterns) if reference_matches(p, topic)]


def test_matching_from_threads_builds_consistent_links() -> None:
    # The bus and the queue store match from several threads at once (never while the
    # trie changes): the links they build concurrently must give the same answers.
    rnd = random.Random(7)
    words = ["a", "b", "c", "d"]
    patterns = []
    for _ in range(60):
        ws = [rnd.choice([*words, "*", "#"]) for _ in range(rnd.randint(1, 4))]
        patterns.append(".".join(ws))
    topics = [".".join(rnd.choice(words) for _ in range(rnd.randint(1, 6))) for _ in range(400)]
    plain: TopicTrie[int] = TopicTrie()
    for i, p in enumerate(patterns):
        plain.add(p, i)
    expected = [plain.match(t) for t in topics]
    for _ in range(5):
        shared: TopicTrie[int] = TopicTrie()
        for i, p in enumerate(patterns):
            shared.add(p, i)
        errors: list[str] = []

        def work(
            order: list[int], shared: TopicTrie[int] = shared, errors: list[str] = errors
        ) -> None:
            for k in order:
                if shared.match(topics[k]) != expected[k]:
                    errors.append(topics[k])

        threads = []
        for _t in range(4):
            order = list(range(len(topics)))
            rnd.shuffle(order)
            threads.append(threading.Thread(target=work, args=(order,)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


# --- against the real qlobber (the matcher inside qlobber-fsq 14) ------------------------

QLOBBER = Path(__file__).parent / "interop" / "node_modules" / "qlobber"

QLOBBER_SCRIPT = """
const { QlobberDedup } = require(process.argv[1]);
const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const out = {};
out.cases = input.cases.map(({ patterns, topics }) => {
    const q = new QlobberDedup({ max_wildcard_somes: 1000 });
    patterns.forEach((p, i) => q.add(p, i));
    return topics.map(t => [...q.match(t)].sort((a, b) => a - b));
});
out.word_limit = input.word_limit.map(t => {
    try { new QlobberDedup().match(t); return 'ok'; } catch (e) { return e.message; }
});
process.stdout.write(JSON.stringify(out));
"""


def run_qlobber(payload: dict[str, Any]) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None or not (QLOBBER / "package.json").exists():
        pytest.skip("needs node and tests/interop/node_modules (`make pytest` installs them)")
    done = subprocess.run(
        [node, "-e", QLOBBER_SCRIPT, str(QLOBBER)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.interop
def test_trie_agrees_with_qlobber() -> None:
    rng = random.Random(20261121)
    alphabet = ["", "a", "b", "*", "#", "a*", "#b"]

    def text(max_words: int) -> str:
        return ".".join(rng.choice(alphabet) for _ in range(rng.randint(1, max_words)))

    cases = [
        {
            "patterns": [text(6) for _ in range(rng.randint(1, 12))],
            "topics": [text(7) for _ in range(8)],
        }
        for _ in range(400)
    ]
    cases.append({"patterns": [p for p, _ in BINDINGS], "topics": [t for t, _ in VECTORS["tests"]]})
    word_limit = [".".join(["w"] * MAX_WORDS), ".".join(["w"] * (MAX_WORDS + 1))]
    result = run_qlobber({"cases": cases, "word_limit": word_limit})

    for case, expected_per_topic in zip(cases, result["cases"], strict=True):
        trie: TopicTrie[int] = TopicTrie()
        for i, pattern in enumerate(case["patterns"]):
            trie.add(pattern, i)
        for topic, expected in zip(case["topics"], expected_per_topic, strict=True):
            assert trie.match(topic) == expected, (case["patterns"], topic)
    # MAX_WORDS is qlobber's own limit: one word more and a qlobber-fsq peer would throw.
    assert result["word_limit"] == ["ok", "too many words"]
