"""The bus across real OS processes: fan-out, a worker pool, a killed consumer, shutdown.

Every child is tests/multiprocess/bus_child.py (a fresh Python process using the public
fsbus API) and reports each handler call as a JSON line; the tests count every message
per subscriber. Payloads are message ids, topics come from fixed seeds.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from fsbus import BlockingBus
from tests.peer_process import TIMEOUT, Event, JsonLinesPeer, locked_files

pytestmark = pytest.mark.slow

Spawn = Callable[..., JsonLinesPeer]

WORDS = ("orders", "users", "eu", "us", "created", "paid")


def make_topics(seed: int, n: int) -> list[str]:
    """``n`` topics of 1-4 words drawn from WORDS, the same for the same seed."""
    rng = random.Random(seed)
    return [".".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) for _ in range(n)]


def matches(pattern: str, topic: str) -> bool:
    """A tiny AMQP matcher (``*`` one word, ``#`` zero or more) to compute expectations."""
    p, t = pattern.split("."), topic.split(".")

    def m(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(t)
        if p[i] == "#":
            return m(i + 1, j) or (j < len(t) and m(i, j + 1))
        if j == len(t):
            return False
        return (p[i] == t[j] or (p[i] == "*" and t[j] != "")) and m(i + 1, j + 1)

    return m(0, 0)


def wait_until(check: Callable[[], bool], *, what: str, timeout: float = TIMEOUT) -> None:
    """Wait until ``check()`` holds, looking every 20 ms (for conditions that are files)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def singles_on_disk(root: Path) -> list[str]:
    """Work-queue message files still in the buckets."""
    out: list[str] = []
    for bucket in (root / "messages").iterdir():
        out += [n for n in os.listdir(bucket) if "+s+" in n]
    return out


def open_files_under(pid: int, root: Path) -> set[str]:
    """Files under ``root`` that process ``pid`` has open."""
    out = set()
    prefix = f"{root}/"
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix):
            out.add(target)
    return out


def message_path(root: Path, event: Event) -> str:
    return str(root / "messages" / str(event["bucket"]) / str(event["name"]))


def publish(spawn: Spawn, messages: list[tuple[str, str]], **params: object) -> None:
    """Publish from a child process and wait until it is done."""
    pub = spawn("pub", messages=messages, **params)
    pub.wait_count("published", 1)
    assert pub.wait_exit() == 0, pub.describe()


def counts(peers: list[JsonLinesPeer], kind: str) -> Counter[str]:
    """How often each message id appears in events of ``kind`` across ``peers``."""
    return Counter(str(e["id"]) for p in peers for e in p.of(kind))


# --------------------------------------------------------------------------- fan-out
def received_at_least(n: int, events: list[Event]) -> bool:
    """Whether ``n`` messages other than the fence arrived."""
    return sum(e.get("event") == "message" and str(e["id"]) != "fence" for e in events) >= n


SUBSCRIBERS = [
    [("all", "#"), ("orders", "orders.#"), ("eu-middle", "*.eu.*")],
    # One handler on two overlapping patterns: called once per message matching either.
    [("either", "orders.*.paid"), ("either", "orders.eu.#"), ("users", "users.#")],
    [("created", "#.created"), ("two-words", "*.*"), ("paid", "#.paid.#")],
]


@pytest.mark.parametrize("polling", [False, True], ids=["inotify", "polling-only"])
def test_every_multi_message_reaches_every_matching_subscriber_exactly_once(
    spawn: Spawn, polling: bool
) -> None:
    # polling-only is how fsbus runs on network filesystems (UPDATE stamps, no inotify);
    # there every bucket is also listed again every 0.2 s, so a message that a re-listing
    # mistook for new would be delivered twice.
    config = {"force_polling": True, "refresh_ttl": 0.2} if polling else {}
    subs = [
        spawn(
            "sub",
            name=f"subscriber {i}",
            subscriptions=[*s, ("fence", "fence")],
            config=config,
        )
        for i, s in enumerate(SUBSCRIBERS)
    ]
    for s in subs:
        s.wait_count("ready", 1)

    per_publisher = 300
    sent: dict[str, str] = {}
    pubs = []
    for k, face in enumerate(("blocking", "async")):
        msgs = [(t, f"p{k}-{i:04d}") for i, t in enumerate(make_topics(k, per_publisher))]
        sent.update((ident, topic) for topic, ident in msgs)
        pubs.append(spawn("pub", name=f"publisher {k}", messages=msgs, face=face))
    for p in pubs:  # both publish at the same time
        p.wait_count("published", 1)
        assert p.wait_exit() == 0, p.describe()

    expected: dict[tuple[int, str], Counter[str]] = {}
    for i, patterns in enumerate(SUBSCRIBERS):
        by_handler: dict[str, list[str]] = defaultdict(list)
        for handler, pattern in patterns:
            by_handler[handler].append(pattern)
        for handler, pats in by_handler.items():
            expected[(i, handler)] = Counter(
                ident for ident, topic in sent.items() if any(matches(p, topic) for p in pats)
            )
    assert all(expected.values()), "every handler has something to get"

    for i, s in enumerate(subs):
        want = sum(c.total() for (j, _), c in expected.items() if j == i)
        s.wait_for(partial(received_at_least, want), what=f"{want} messages")
    # A fence published after everything: once each subscriber has it, a duplicate of an
    # earlier message (seen as new twice) would have shown up. Its own handler "fence"
    # aside, the catch-all patterns get it too; it is left out of the counts.
    publish(spawn, [("fence", "fence")])
    for s in subs:
        s.wait_for(
            lambda evs: any(e.get("handler") == "fence" for e in evs), what="the fence message"
        )
        assert s.stop() == 0, s.describe()

    for i, s in enumerate(subs):
        got: dict[str, Counter[str]] = defaultdict(Counter)
        for e in s.of("message"):
            if e["id"] == "fence":
                continue
            assert e["topic"] == sent[str(e["id"])], e
            got[str(e["handler"])][str(e["id"])] += 1
        for (j, handler), want_ids in expected.items():
            if j != i:
                continue
            extra = got[handler] - want_ids
            missing = want_ids - got[handler]
            assert not extra, f"subscriber {i} {handler}: duplicates or strays {extra}"
            assert not missing, f"subscriber {i} {handler}: lost {missing}"
        assert set(got) <= {h for (j, h) in expected if j == i}


# --------------------------------------------------------------------------- worker pool
def test_every_single_message_is_handled_exactly_once_by_a_pool_of_workers(
    spawn: Spawn, bus_root: Path
) -> None:
    # Two async workers and one on the blocking face.
    workers = [
        spawn("worker", name=f"worker {i} ({face})", pattern="jobs.#", face=face)
        for i, face in enumerate(("async", "async", "blocking"))
    ]
    for w in workers:
        w.wait_count("ready", 1)

    per_publisher = 300
    ids: set[str] = set()
    pubs = []
    for k, face in enumerate(("blocking", "async")):
        rng = random.Random(100 + k)
        msgs = [(f"jobs.{rng.choice(WORDS)}", f"p{k}-{i:04d}") for i in range(per_publisher)]
        ids.update(i for _, i in msgs)
        pubs.append(spawn("pub", messages=msgs, single=True, face=face))
    for p in pubs:
        p.wait_count("published", 1)
        assert p.wait_exit() == 0, p.describe()

    wait_until(lambda: counts(workers, "done").total() >= len(ids), what=f"{len(ids)} jobs")
    wait_until(lambda: not singles_on_disk(bus_root), what="every job acknowledged")
    for w in workers:
        assert w.stop() == 0, w.describe()

    done, started = counts(workers, "done"), counts(workers, "start")
    assert set(done) == ids
    assert [i for i, n in done.items() if n != 1] == [], "a job was handled twice"
    assert started == done, "nobody failed or died, so nothing was delivered twice"


def test_a_worker_takes_jobs_from_several_publishers_by_priority_then_in_order(
    spawn: Spawn,
) -> None:
    priority_of: dict[str, int] = {}
    pubs = []
    for k, face in enumerate(("blocking", "async")):
        rng = random.Random(40 + k)
        msgs = [
            (f"jobs.{rng.choice(WORDS)}", f"p{k}-{i:03d}", rng.choice((0, 9, 200)))
            for i in range(60)
        ]
        priority_of.update((i, p) for _, i, p in msgs)
        pubs.append(spawn("pub", messages=msgs, single=True, face=face))
    for p in pubs:
        p.wait_count("published", 1)
        assert p.wait_exit() == 0, p.describe()

    # One job at a time, so the order it takes them in is the order it was offered them.
    worker = spawn("worker", pattern="jobs.#", config={"handler_concurrency": 1})
    worker.wait_count("done", len(priority_of))
    assert worker.stop() == 0, worker.describe()

    taken = [str(e["id"]) for e in worker.of("start")]
    assert sorted(taken) == sorted(priority_of)
    priorities = [priority_of[i] for i in taken]
    assert priorities == sorted(priorities), "a lower priority number is taken first"
    for k in range(2):
        for prio in (0, 9, 200):
            mine = [i for i in taken if i.startswith(f"p{k}-") and priority_of[i] == prio]
            assert mine == sorted(mine), f"publisher {k}, priority {prio}: not in publish order"


# --------------------------------------------------------------------------- SIGKILL
def test_messages_of_a_consumer_killed_mid_handling_are_redelivered(
    spawn: Spawn, bus_root: Path
) -> None:
    holding = 3
    # The victim's handlers never return: it claims `holding` jobs and sits on them.
    victim = spawn(
        "worker",
        name="victim",
        pattern="jobs.#",
        hold=True,
        config={"handler_concurrency": holding},
    )
    victim.wait_count("ready", 1)
    rng = random.Random(7)
    msgs = [(f"jobs.{rng.choice(WORDS)}", f"job-{i:04d}") for i in range(200)]
    publish(spawn, msgs, single=True)
    held = {str(e["id"]): message_path(bus_root, e) for e in victim.wait_count("start", holding)}

    survivors = [spawn("worker", name=f"survivor {i}", pattern="jobs.#") for i in range(2)]
    for s in survivors:
        s.wait_count("ready", 1)
    rest = len(msgs) - holding
    wait_until(lambda: counts(survivors, "done").total() >= rest, what=f"{rest} jobs")
    held_names = {os.path.basename(p) for p in held.values()}
    wait_until(lambda: set(singles_on_disk(bus_root)) == held_names, what="the rest acked")
    # While the victim lives, its jobs are locked and nobody else touches them.
    assert victim.count("start") == holding
    assert not set(held) & set(counts(survivors, "start"))
    assert locked_files(bus_root) == set(held.values())

    victim.proc.send_signal(signal.SIGKILL)
    assert victim.wait_exit() == -signal.SIGKILL

    wait_until(lambda: counts(survivors, "done").total() >= len(msgs), what="redelivery")
    wait_until(lambda: not singles_on_disk(bus_root), what="every job acknowledged")
    for s in survivors:
        assert s.stop() == 0, s.describe()

    done = counts(survivors, "done")
    assert set(done) == {i for _, i in msgs}
    assert [i for i, n in done.items() if n != 1] == []
    redelivered = set(counts([victim], "start")) & set(counts(survivors, "start"))
    assert redelivered == set(held)
    assert len(redelivered) == holding


def test_workers_killed_at_arbitrary_points_lose_nothing(spawn: Spawn, bus_root: Path) -> None:
    # Workers are SIGKILLed while jobs flow (wherever they are: claiming, handling, acking)
    # and replaced. At-least-once: every job is done; only a killed worker's jobs may be
    # handled twice.
    jobs, kill_after = 900, (150, 350, 550)

    def worker(n: int) -> JsonLinesPeer:
        return spawn("worker", name=f"worker {n}", pattern="jobs.#", work=0.005)

    alive = [worker(n) for n in range(3)]
    everyone = list(alive)
    killed: list[JsonLinesPeer] = []
    for w in alive:
        w.wait_count("ready", 1)
    rng = random.Random(31)
    msgs = [(f"jobs.{rng.choice(WORDS)}", f"job-{i:04d}") for i in range(jobs)]
    pub = spawn("pub", messages=msgs, single=True)

    for threshold in kill_after:
        wait_until(lambda t=threshold: counts(everyone, "done").total() >= t, what="progress")
        victim = alive.pop(0)
        victim.proc.send_signal(signal.SIGKILL)
        assert victim.wait_exit() == -signal.SIGKILL
        killed.append(victim)
        alive.append(worker(len(everyone)))
        everyone.append(alive[-1])
    pub.wait_count("published", 1)
    assert pub.wait_exit() == 0, pub.describe()

    ids = {i for _, i in msgs}
    wait_until(lambda: set(counts(everyone, "done")) >= ids, what="every job done")
    wait_until(lambda: not singles_on_disk(bus_root), what="every job acknowledged")
    for w in alive:
        assert w.stop() == 0, w.describe()
    assert locked_files(bus_root) == set()

    assert set(counts(everyone, "done")) == ids
    survivors_started = counts(alive, "start")
    assert [i for i, n in survivors_started.items() if n > 1] == [], "a survivor got a job twice"
    for w in everyone:
        assert max(counts([w], "start").values(), default=0) <= 1, w.name
    by_killed = set(counts(killed, "start"))
    twice = {i for i, n in counts(everyone, "start").items() if n > 1}
    assert twice <= by_killed, "only a killed worker's jobs may be handled again"


# --------------------------------------------------------------------------- dead letters
def test_failures_are_counted_across_processes_and_dead_lettered_once(
    spawn: Spawn, bus_root: Path
) -> None:
    limit = 3
    rng = random.Random(23)
    msgs = [(f"jobs.{rng.choice(WORDS)}", f"job-{i:03d}") for i in range(60)]
    poison = {"job-007", "job-031", "job-052"}
    workers = [
        spawn(
            "worker",
            name=f"worker {i}",
            pattern="jobs.#",
            fail=sorted(poison),
            config={"max_deliveries": limit},
        )
        for i in range(3)
    ]
    graveyard = spawn("worker", name="dead-letter worker", pattern="dead-letter.#")
    for w in [*workers, graveyard]:
        w.wait_count("ready", 1)
    publish(spawn, msgs, single=True)

    good = len(msgs) - len(poison)
    wait_until(lambda: counts(workers, "done").total() >= good, what=f"{good} good jobs")
    graveyard.wait_count("done", len(poison))
    wait_until(lambda: not singles_on_disk(bus_root), what="every job gone")
    for w in [*workers, graveyard]:
        assert w.stop() == 0, w.describe()

    done = counts(workers, "done")
    assert set(done) == {i for _, i in msgs} - poison
    assert max(done.values()) == 1
    # Each poison job failed `limit` times in all, whichever process took it, with the
    # delivery count going up across processes.
    failures: dict[str, list[int]] = defaultdict(list)
    for w in workers:
        for e in w.of("failed"):
            failures[str(e["id"])].append(int(e["delivery_count"]))
    assert {k: sorted(v) for k, v in failures.items()} == {
        p: list(range(1, limit + 1)) for p in poison
    }
    dead = graveyard.of("done")
    assert Counter(str(e["id"]) for e in dead) == Counter(poison)
    topic_of = {i: t for t, i in msgs}
    for e in dead:
        assert e["topic"] == f"dead-letter.{topic_of[str(e['id'])]}"
        assert e["headers"]["x-original-topic"] == topic_of[str(e["id"])]
        assert e["headers"]["x-deliveries"] == str(limit)


# --------------------------------------------------------------------------- shutdown
def test_no_lock_is_left_after_a_clean_shutdown_and_nothing_is_lost(
    spawn: Spawn, bus_root: Path
) -> None:
    rng = random.Random(11)
    msgs = [(f"jobs.{rng.choice(WORDS)}", f"job-{i:03d}") for i in range(40)]
    publish(spawn, msgs, single=True)

    # Workers that claim jobs and never finish them: two async Buses and a BlockingBus.
    holders = {
        "async, 4 at once": (
            spawn("worker", pattern="jobs.#", hold=True, config={"handler_concurrency": 4}),
            4,
        ),
        "async, 2 at once": (
            spawn("worker", pattern="jobs.#", hold=True, config={"handler_concurrency": 2}),
            2,
        ),
        "blocking": (
            spawn(
                "worker",
                pattern="jobs.#",
                hold=True,
                face="blocking",
                config={"handler_concurrency": 1},
            ),
            1,
        ),
    }
    held: set[str] = set()
    for w, n in holders.values():
        w.wait_count("ready", 1)
        held |= {message_path(bus_root, e) for e in w.wait_count("start", n)}
    assert len(held) == 7
    # The probe sees the locks that are there, and each holder has its files open.
    assert locked_files(bus_root) == held
    with BlockingBus(bus_root) as bus:  # so does browse, from another process
        assert {i.path for i in bus.browse("jobs.#") if i.locked} == held
    for w, _ in holders.values():
        assert open_files_under(w.proc.pid, bus_root) & held

    for w, _ in holders.values():
        w.send("STOP")
    for label, (w, n) in holders.items():
        w.wait_count("closed", 1)
        # Still alive, Bus closed: no lock and no open file is left behind.
        assert w.proc.poll() is None
        assert open_files_under(w.proc.pid, bus_root) == set(), label
        assert w.count("start") == n, label
    assert locked_files(bus_root) == set()
    for label, (w, _) in holders.items():
        assert w.stop() == 0, f"{label}: {w.describe()}"

    # Nothing was lost: every job is still there and a fresh worker gets each once.
    assert len(singles_on_disk(bus_root)) == len(msgs)
    fresh = spawn("worker", name="fresh worker", pattern="jobs.#")
    fresh.wait_count("done", len(msgs))
    wait_until(lambda: not singles_on_disk(bus_root), what="every job acknowledged")
    assert fresh.stop() == 0, fresh.describe()
    done = counts([fresh], "done")
    assert set(done) == {i for _, i in msgs}
    assert max(done.values()) == 1


# --------------------------------------------------------------------------- dead publisher
def test_a_publisher_killed_mid_publish_leaves_no_partial_message(
    spawn: Spawn, bus_root: Path
) -> None:
    sub = spawn("sub", subscriptions=[("all", "#")])
    worker = spawn("worker", pattern="big.#")
    for p in (sub, worker):
        p.wait_count("ready", 1)
    stuck = spawn("pub-stuck", topic="big.upload", chunk=1 << 20)
    stuck.wait_count("writing", 1)
    staged = os.listdir(bus_root / "staging")
    assert len(staged) == 1, staged
    assert (bus_root / "staging" / staged[0]).stat().st_size > 1 << 20  # 0x00 + the chunk

    stuck.proc.send_signal(signal.SIGKILL)
    assert stuck.wait_exit() == -signal.SIGKILL
    # Later messages flow; the half-written one never shows up anywhere.
    publish(spawn, [("after.crash", "marker")])
    sub.wait_count("message", 1)
    for p in (sub, worker):
        assert p.stop() == 0, p.describe()
    assert [e["id"] for e in sub.of("message")] == ["marker"]
    assert worker.of("start") == []
    on_disk = [n for b in (bus_root / "messages").iterdir() for n in os.listdir(b)]
    assert [n for n in on_disk if n.startswith(b"big".hex())] == []

    # The debris is swept by gc once old enough (here: at once).
    with BlockingBus(bus_root) as bus:
        assert bus.gc(debris_age=0) >= 1
    assert os.listdir(bus_root / "staging") == []


def test_a_job_that_kills_its_workers_is_dead_lettered_with_counted_deliveries(
    spawn: Spawn, bus_root: Path
) -> None:
    """With ``count_deliveries`` a work-queue message counts each delivery when it is
    claimed, so a worker killed holding it counts one. Once it has had every delivery
    ``max_deliveries`` allows it goes to ``dead-letter.<topic>`` instead of to the next
    worker (it was redelivered for ever: only a handler that raised counted)."""
    config = {"count_deliveries": True, "max_deliveries": 2, "retry_interval": 0.05}
    publish(spawn, [("jobs.poison", "poison")], single=True)
    for delivery in (1, 2):
        victim = spawn(
            "worker", name=f"victim {delivery}", pattern="jobs.#", hold=True, config=config
        )
        [start] = victim.wait_count("start", 1)
        assert start["delivery_count"] == delivery
        victim.proc.send_signal(signal.SIGKILL)
        assert victim.wait_exit() == -signal.SIGKILL
    third = spawn("worker", name="third", pattern="jobs.#", config=config)
    third.wait_count("ready", 1)
    with BlockingBus(bus_root) as bus:

        def topics() -> list[str]:
            return sorted(i.topic for i in bus.browse("#"))

        # (the dead letter is a work-queue message too: it waits for its own consumer)
        wait_until(lambda: topics() == ["dead-letter.jobs.poison"], what="the job dead-lettered")
    assert third.stop() == 0, third.describe()
    assert third.count("start") == 0
