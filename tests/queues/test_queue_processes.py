"""Durable queues across real processes: competing consumers, kill -9, restarts.

Every test counts per queue: every message handled, none lost, a message handled twice
only as a redelivery (``delivery_count > 1``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from fsbus import BlockingBus, BusConfig
from tests.peer_process import JsonLinesPeer

Spawn = Callable[..., JsonLinesPeer]
FAST = {"poll_interval": 0.05, "retry_interval": 0.05, "gc_interval": 0.2}


def handled(peers: Iterable[JsonLinesPeer], queue: str) -> Counter[str]:
    """How many times each id's handler returned, in consumers of ``queue``."""
    return Counter(e["id"] for p in peers for e in p.of("done") if e["queue"] == queue)


def check_counts(peers: list[JsonLinesPeer], queue: str, ids: set[str]) -> Counter[str]:
    """Every id handled; any handled twice was redelivered. Returns the counts."""
    done = handled(peers, queue)
    assert set(done) == ids, (
        f"queue {queue}: lost {sorted(ids - set(done))[:10]}, "
        f"unexpected {sorted(set(done) - ids)[:10]}"
    )
    redelivered = {
        e["id"]
        for p in peers
        for e in p.of("start")
        if e["queue"] == queue and e["delivery_count"] > 1
    }
    twice = {i for i, n in done.items() if n > 1}
    assert twice <= redelivered, f"queue {queue}: duplicates not redelivered: {twice}"
    return done


def wait_empty(bus: BlockingBus, *queues: str, timeout: float = 30) -> None:
    """Wait until these queues hold nothing. Consumers say "done" in the handler, before
    its return acks, so the last messages can be counted in a queue for a moment."""
    deadline = time.monotonic() + timeout
    while any(depths := [bus.queue_info(q).depth for q in queues]):
        assert time.monotonic() < deadline, f"messages left in {queues}: {depths}"
        time.sleep(0.01)


def wait_all(peers: list[JsonLinesPeer], queue: str, ids: set[str], timeout: float = 90) -> None:
    """Wait until every id was handled by some consumer of ``queue`` (polled every 10 ms,
    the events of all the peers together); fail saying what is missing."""
    deadline = time.monotonic() + timeout
    while not ids <= set(handled(peers, queue)):
        if time.monotonic() > deadline or all(p.proc.poll() is not None for p in peers):
            missing = sorted(ids - set(handled(peers, queue)))
            raise AssertionError(
                f"queue {queue}: {len(missing)} message(s) never handled, e.g. {missing[:10]}\n"
                + "\n".join(p.describe() for p in peers)
            )
        time.sleep(0.01)


def test_two_queues_on_one_topic_three_consumers_each(root: Path, spawn: Spawn) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("billing", ["orders.*"])
        bus.declare_queue("shipping", ["orders.#"])
    consumers = {
        q: [spawn("consumer", queue=q, config=FAST, face=f) for f in ("async", "async", "blocking")]
        for q in ("billing", "shipping")
    }
    for group in consumers.values():
        for c in group:
            c.wait_count("ready", 1)
    ids = [str(i) for i in range(600)]
    multi = spawn("pub", messages=[["orders.new", i] for i in ids[:300]], config=FAST)
    single = spawn("pub", messages=[["orders.new", i] for i in ids[300:]], single=True, config=FAST)
    multi.wait_count("published", 300)
    single.wait_count("published", 300)
    for q, group in consumers.items():
        wait_all(group, q, set(ids))
    # Every consumer takes part while work keeps coming. One that loses its first claims
    # to the others waits before it lists again (up to 64 ms, docs/work-queues.md), and
    # on a loaded machine the other two can drain a batch of 600 meanwhile: more batches
    # come until each consumer has handled some (at most ten; one starved through them
    # all fails the test below).
    everyone = [c for group in consumers.values() for c in group]
    for batch in range(10):
        if all(c.of("done") for c in everyone):
            break
        more = [str(i) for i in range(len(ids), len(ids) + 300)]
        pub = spawn(
            "pub", messages=[["orders.new", i] for i in more], single=batch % 2 == 1, config=FAST
        )
        pub.wait_count("published", 300)
        ids += more
        for q, group in consumers.items():
            wait_all(group, q, set(ids))
    for q, group in consumers.items():
        done = check_counts(group, q, set(ids))
        assert set(done.values()) == {1}, f"{q}: a message handled twice without a kill"
        assert all(len(c.of("done")) > 0 for c in group), f"{q}: a consumer got nothing"
    with BlockingBus(root) as bus:
        wait_empty(bus, "billing", "shipping")


def test_consumers_killed_mid_handling(root: Path, spawn: Spawn) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("a", ["jobs.#"])
        bus.declare_queue("b", ["jobs.#"])
    # The first of each group hangs in its 21st message: it is killed with it in hand.
    # It runs alone for the first 30 messages, so that it surely gets that far (which
    # consumer takes what is not for a test to assume); the two others join after.
    groups = {q: [spawn("consumer", queue=q, work=0.01, hang_after=20, config=FAST)] for q in "ab"}
    for group in groups.values():
        group[0].wait_count("ready", 1)
    ids = {str(i) for i in range(400)}
    ordered = sorted(ids)
    first = spawn("pub", messages=[["jobs.x", i] for i in ordered[:30]], config=FAST)
    for group in groups.values():
        group[0].wait_count("start", 21)
    for q, group in groups.items():
        group += [spawn("consumer", queue=q, work=0.01, config=FAST) for _ in range(2)]
        for c in group[1:]:
            c.wait_count("ready", 1)
    publisher = spawn("pub", messages=[["jobs.x", i] for i in ordered[30:]], config=FAST)
    for group in groups.values():
        victim = group[0]
        victim.proc.kill()
        victim.wait_exit()
    first.wait_count("published", 30)
    publisher.wait_count("published", len(ids) - 30)
    for q, group in groups.items():
        wait_all(group[1:], q, ids - set(handled(group[:1], q)))
        done = check_counts(group, q, ids)
        victim = group[0]
        in_hand = {e["id"] for e in victim.of("start")} - {e["id"] for e in victim.of("done")}
        assert in_hand
        # what it held when killed was handled by a survivor, as a redelivery
        for i in in_hand:
            assert done[i] >= 1


def test_declared_while_no_consumer_runs_then_1000_messages(root: Path, spawn: Spawn) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("late", ["events.#"])
    ids = [str(i) for i in range(1000)]
    half = len(ids) // 2
    p1 = spawn("pub", messages=[["events.a", i] for i in ids[:half]], config=FAST)
    p2 = spawn("pub", messages=[["events.b.c", i] for i in ids[half:]], single=True, config=FAST)
    p1.wait_count("published", half)
    p2.wait_count("published", len(ids) - half)
    p1.stop()
    p2.stop()
    with BlockingBus(root) as bus:
        assert bus.queue_info("late").depth == 1000
    group = [spawn("consumer", queue="late", config=FAST) for _ in range(3)]
    wait_all(group, "late", set(ids))
    done = check_counts(group, "late", set(ids))
    assert set(done.values()) == {1}


def test_bindings_changed_mid_flow_from_another_process(root: Path, spawn: Spawn) -> None:
    with BlockingBus(root) as admin:
        admin.declare_queue("q", ["a.*"])
        group = [spawn("consumer", queue="q", config=FAST) for _ in range(3)]
        publisher = spawn("pub-lines", config=FAST)
        for p in (*group, publisher):
            p.wait_count("ready", 1)
        expected: set[str] = set()
        sent = 0

        def send(topic: str, ident: str, routed: bool) -> None:
            nonlocal sent
            publisher.send(f"{topic} {ident}")
            sent += 1
            publisher.wait_count("published", sent)
            if routed:
                expected.add(ident)

        for round_ in range(5):
            send("a.x", f"a{round_}", True)
            send("b.x", f"b{round_}-before", False)
            admin.bind_queue("q", "b.*")
            send("b.x", f"b{round_}", True)
            admin.unbind_queue("q", "a.*")
            send("a.x", f"a{round_}-after", False)
            admin.bind_queue("q", "a.*")
            admin.unbind_queue("q", "b.*")
        wait_all(group, "q", expected)
        # the barrier: one last routed message, handled after everything before it
        send("a.x", "last", True)
        wait_all(group, "q", expected)
        done = check_counts(group, "q", expected)
        assert set(done.values()) == {1}
        wait_empty(admin, "q")


def test_ttl_max_length_and_dead_letter_across_processes(root: Path, spawn: Spawn) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("ttl", ["t.#"], message_ttl=0.5)
        bus.declare_queue("recent", ["r.#"], max_length=10)
        bus.declare_queue("work", ["w.#"], max_deliveries=2, dead_letter="dead.work")
        bus.declare_queue("dead", ["dead.#"])
    pubs = [
        spawn("pub", messages=[["t.x", f"t{i}"] for i in range(50)], config=FAST),
        spawn("pub", messages=[["r.x", f"r{i}"] for i in range(100)], config=FAST),
    ]
    for p in pubs:
        p.wait_count("published", 1)
    pubs[0].wait_count("published", 50)
    pubs[1].wait_count("published", 100)
    # no consumer of "ttl" runs: another process's gc removes its expired copies
    other = spawn("consumer", queue="dead", config=FAST)
    other.wait_count("ready", 1)
    with BlockingBus(root) as bus:
        deadline = time.monotonic() + 30
        while bus.queue_info("ttl").depth and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bus.queue_info("ttl").depth == 0
        assert bus.queue_info("recent").depth == 10
    ttl = spawn("consumer", queue="ttl", config=FAST)
    recent = spawn("consumer", queue="recent", config=FAST)
    workers = [spawn("consumer", queue="work", fail=["w3", "w7"], config=FAST) for _ in range(2)]
    for p in (ttl, recent, *workers):
        p.wait_count("ready", 1)
    spawn("pub", messages=[["t.x", "fresh"]] + [["w.x", f"w{i}"] for i in range(10)], config=FAST)
    wait_all([ttl], "ttl", {"fresh"})
    wait_all([recent], "recent", {f"r{i}" for i in range(90, 100)})
    wait_all(workers, "work", {f"w{i}" for i in range(10)} - {"w3", "w7"})
    wait_all([other], "dead", {"w3", "w7"})
    assert handled([ttl], "ttl") == Counter({"fresh": 1})
    assert set(handled([recent], "recent")) == {f"r{i}" for i in range(90, 100)}
    dead = list(other.of("done"))
    assert sorted(e["id"] for e in dead) == ["w3", "w7"]
    assert {e["headers"]["x-fsbus-queue"] for e in dead} == {"work"}
    tries = Counter(e["id"] for w in workers for e in w.of("start") if e["id"] in ("w3", "w7"))
    assert tries == Counter({"w3": 2, "w7": 2})


def test_every_process_restarted(root: Path, spawn: Spawn) -> None:
    with BlockingBus(root) as bus:
        bus.declare_queue("a", ["jobs.#"])
        bus.declare_queue("b", ["jobs.*"])
    ids = {str(i) for i in range(300)}
    first = sorted(ids)[:150]
    second = sorted(ids)[150:]
    peers: dict[str, list[JsonLinesPeer]] = {"a": [], "b": []}

    def start_consumers() -> None:
        for q in "ab":
            for _ in range(2):
                peers[q].append(spawn("consumer", queue=q, work=0.005, config=FAST))

    start_consumers()
    pub1 = spawn("pub", messages=[["jobs.x", i] for i in first], config=FAST)
    pub1.wait_count("published", 1)
    deadline = time.monotonic() + 60
    while any(sum(handled(peers[q], q).values()) < 5 for q in "ab"):
        assert time.monotonic() < deadline, "the consumers handled nothing in 60 s"
        time.sleep(0.01)
    # every process dies at once, the publisher mid-run included
    everyone = [pub1, *peers["a"], *peers["b"]]
    for p in everyone:
        p.proc.kill()
    for p in everyone:
        p.wait_exit()
    published = {e["id"] for e in pub1.of("published")}
    start_consumers()
    pub2 = spawn("pub", messages=[["jobs.x", i] for i in second], config=FAST)
    pub2.wait_count("published", len(second))
    expected = published | set(second)
    for q in "ab":
        wait_all(peers[q][2:], q, expected - set(handled(peers[q][:2], q)))
        done = handled(peers[q], q)
        assert expected <= set(done)
        # a message the publisher wrote but was killed before reporting may be there too
        assert set(done) <= ids
        check_counts(peers[q], q, set(done))


def test_gets_beside_a_consumer_and_a_getter_killed_holding_one(root: Path, spawn: Spawn) -> None:
    """Two processes take a queue's messages with ``bus.get``, one process consumes it
    with a subscription, while a fourth publishes 600. The first getter, alone on the
    queue when publishing starts, holds its first message for good and is killed with
    it: that one goes to a survivor as a redelivery; every other message is handled
    exactly once."""
    with BlockingBus(root) as bus:
        bus.declare_queue("g", ["jobs.#"])
    victim = spawn("getter", queue="g", hang_after=0, config=FAST)
    victim.wait_count("ready", 1)
    ids = {str(i) for i in range(600)}
    publisher = spawn("pub", messages=[["jobs.x", i] for i in sorted(ids)], config=FAST)
    victim.wait_count("hanging", 1)
    others = [spawn("getter", queue="g", config=FAST), spawn("consumer", queue="g", config=FAST)]
    for p in others:
        p.wait_count("ready", 1)
    victim.proc.kill()
    victim.wait_exit()
    publisher.wait_count("published", len(ids))
    wait_all(others, "g", ids - set(handled([victim], "g")))
    group = [victim, *others]
    done = check_counts(group, "g", ids)
    (held,) = {e["id"] for e in victim.of("hanging")}
    assert held not in handled([victim], "g")
    twice = {i for i, n in done.items() if n > 1}
    assert not twice, f"handled twice without a kill: {sorted(twice)[:10]}"
    redelivered = [e for p in others for e in p.of("start") if e["id"] == held]
    assert redelivered
    assert redelivered[-1]["delivery_count"] > 1
    with BlockingBus(root) as bus:
        wait_empty(bus, "g")
    publisher.stop()
    for p in others:
        p.stop()


def test_an_auto_delete_queue_whose_last_consumer_is_killed_is_deleted(
    root: Path, spawn: Spawn
) -> None:
    """A consumer killed with SIGKILL never detaches: the gc of a process still on the
    bus finds its file no longer locked, and deletes the auto-delete queue it leaves
    with no consumer, as RabbitMQ does when a consumer's connection dies. A queue that
    never had a consumer, or still has one, is kept."""
    with BlockingBus(root, config=BusConfig(**FAST)) as bus:
        bus.declare_queue("temp", ["t.#"], auto_delete=True)
        bus.declare_queue("kept", ["t.#"], auto_delete=True)  # never consumed
        bus.declare_queue("shared", ["t.#"], auto_delete=True)
        victims = [spawn("consumer", queue=q, config=FAST) for q in ("temp", "shared")]
        survivor = spawn("consumer", queue="shared", config=FAST)
        for c in (*victims, survivor):
            c.wait_count("ready", 1)
        bus.publish("t.x", b"waits")
        for c in victims:
            c.proc.kill()
            c.wait_exit()
        deadline = time.monotonic() + 30
        while "temp" in {q.name for q in bus.queues()}:
            assert time.monotonic() < deadline, "the auto-delete queue was never deleted"
            time.sleep(0.05)
        for _ in range(10):  # ten gc passes more: the others stay
            time.sleep(FAST["gc_interval"])
            assert {q.name for q in bus.queues()} == {"kept", "shared"}
        assert bus.queue_info("shared").consumers == 1
        assert bus.queue_info("kept").depth == 1


def test_expires_counts_from_a_killed_consumers_end_not_from_its_start(
    root: Path, spawn: Spawn
) -> None:
    """A consumer attached for longer than its queue's ``expires`` and then killed: the
    queue is kept for ``expires`` after its death is found, messages included, as after
    a clean leave (it was deleted at once, the time counted from the attach)."""
    expires = 2.0
    with BlockingBus(root, config=BusConfig(**FAST)) as bus:
        bus.declare_queue("e", ["e.#"], expires=expires)
        victim = spawn("consumer", queue="e", config=FAST)
        victim.wait_count("ready", 1)
        time.sleep(expires + 0.5)  # attached longer than expires: the point of the test
        assert bus.queue_info("e").consumers == 1
        victim.proc.kill()
        victim.wait_exit()
        bus.publish("e.x", b"kept for a while")
        found = time.monotonic()
        deadline = found + 30
        while bus.queue_info("e").consumers:  # counting finds the death
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(int(expires / FAST["gc_interval"] / 2)):  # half of expires: still there
            time.sleep(FAST["gc_interval"])
            bus.gc()
            assert bus.queue_info("e").depth == 1
        while "e" in {q.name for q in bus.queues()}:  # (a BlockingBus has no gc of its own)
            assert time.monotonic() < deadline, "the queue never expired"
            bus.gc()
            time.sleep(0.05)
        assert time.monotonic() - found >= expires


def test_a_message_that_kills_its_consumers_is_dead_lettered_after_max_deliveries(
    root: Path, spawn: Spawn
) -> None:
    """A message whose every consumer dies holding it (killed here with SIGKILL in the
    handler) has each delivery counted when claimed; once it has had the
    ``max_deliveries`` the queue allows it is dead-lettered, not handed to a third
    consumer (it was redelivered for ever: only a handler that raised counted)."""
    with BlockingBus(root, config=BusConfig(**FAST)) as bus:
        bus.declare_queue("pq", ["p.#"], max_deliveries=2, dead_letter="dead.p")
        bus.declare_queue("dq", ["dead.#"])
        bus.publish("p.x", b"poison")
        for delivery in (1, 2):
            victim = spawn("consumer", queue="pq", hang_after=0, config=FAST)
            [start] = victim.wait_count("start", 1)
            assert start["delivery_count"] == delivery
            victim.proc.kill()
            victim.wait_exit()
        third = spawn("consumer", queue="pq", config=FAST)
        third.wait_count("ready", 1)
        deadline = time.monotonic() + 30
        while bus.queue_info("dq").depth != 1:
            assert time.monotonic() < deadline, "never dead-lettered"
            time.sleep(0.05)
        assert bus.queue_info("pq").depth == 0
        assert third.of("start") == []
        with bus.get("dq") as dead:
            assert dead is not None
            assert (dead.payload, dead.headers["x-fsbus-queue"]) == (b"poison", "pq")
