"""Every face of fsbus across two clients of CephFS and of GlusterFS, default settings.

Client A and client B are two FUSE mounts of one volume, each with its own cache and
session: two hosts, as far as one machine goes. No ``FSBUS_*`` variable is set and every
bus runs with its default configuration, so what fsbus detects on these mounts is what
is tested. Every message is counted: nothing lost, no duplicate where forbidden.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsbus import BlockingBus, Bus, Message, Stream, check_directory
from tests.bus.conftest import wait_until
from tests.peer_process import JsonLinesPeer

from .conftest import TwoClients

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "tests" / "multiprocess" / "bus_child.py"
QUEUE_CHILD = REPO / "tests" / "queues" / "queue_child.py"
NODE_PEER = REPO / "tests" / "interop" / "qlobber_peer.js"
WAIT = 60.0


@pytest.fixture(autouse=True)
def _no_fsbus_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("FSBUS_")]:
        monkeypatch.delenv(k)


class Peers:
    """Child processes (fsbus peers or qlobber-fsq) killed when the test ends."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.started: list[JsonLinesPeer] = []
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FSBUS_")},
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }

    def fsbus(
        self, role: str, root: Path, *, name: str, child: Path = CHILD, **params: Any
    ) -> JsonLinesPeer:
        f = self.tmp / f"child-{len(self.started)}.json"
        f.write_text(json.dumps({"root": str(root), **params}))
        peer = JsonLinesPeer(
            [sys.executable, str(child), role, str(f)], name=name, cwd=REPO, env=self.env
        )
        self.started.append(peer)
        return peer

    def qlobber(self, role: str, root: Path, **params: Any) -> JsonLinesPeer:
        import shutil

        node = shutil.which("node")
        if node is None or not (REPO / "tests/interop/node_modules/qlobber-fsq").exists():
            pytest.skip("needs node and tests/interop/node_modules (make test installs them)")
        f = self.tmp / f"qlobber-{len(self.started)}.json"
        f.write_text(json.dumps({"dir": str(root), **params}))
        peer = JsonLinesPeer(
            [node, str(NODE_PEER), role, str(f)], name=f"qlobber-fsq {role}", cwd=NODE_PEER.parent
        )
        self.started.append(peer)
        return peer

    def kill_all(self) -> None:
        for p in self.started:
            p.kill()


@pytest.fixture
def peers(tmp_path: Path) -> Any:
    p = Peers(tmp_path)
    yield p
    p.kill_all()


def until(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def counts(peers: list[JsonLinesPeer], kind: str) -> Counter[str]:
    return Counter(str(e["id"]) for p in peers for e in p.of(kind))


# --------------------------------------------------------------------------- the clusters
def test_the_two_mounts_are_two_client_sessions(two_clients: TwoClients) -> None:
    c = two_clients.cluster
    assert c.client_pid("a") != c.client_pid("b")
    for which in ("a", "b"):
        assert c.clients[which].poll() is None  # each mount has its own FUSE client process
    if two_clients.kind == "ceph":
        ids = c.client_ids()  # type: ignore[attr-defined]
        assert len(set(ids)) >= 2, ids
    assert os.stat(two_clients.a).st_dev != os.stat(two_clients.b).st_dev
    (two_clients.a / "probe").write_text("seen")
    until(lambda: (two_clients.b / "probe").exists(), "A's file on B")


def test_doctor_passes_with_the_defaults(two_clients: TwoClients) -> None:
    with BlockingBus(two_clients.a / "bus"):
        pass
    report = check_directory(two_clients.b / "bus")
    fs = report.check("filesystem")
    assert "polling only" in fs.detail
    assert "claim by flock" in fs.detail or "claims by flock" in fs.detail or "flock" in fs.detail
    space = report.check("space")
    assert space.status != "fail", space  # unknown space or inodes are not "full"
    assert report.ok, report


# --------------------------------------------------------------------------- Bus
@pytest.mark.asyncio
async def test_multi_and_single_cross_from_a_to_b(two_clients: TwoClients) -> None:
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    got_b: list[Message] = []
    got_a_jobs: list[Message] = []
    got_b_jobs: list[Message] = []

    async def on_b(m: Message) -> None:
        got_b.append(m)

    n = 150
    async with Bus(a) as pub, Bus(b) as sub_b, Bus(a) as worker_a:
        await sub_b.subscribe("events.#", on_b)

        async def job_b(m: Message) -> None:
            got_b_jobs.append(m)

        async def job_a(m: Message) -> None:
            got_a_jobs.append(m)
            if len(got_a_jobs) == 1:
                # A, on the publisher's client, sees each job first: it holds its first
                # one (prefetch 1) until B has taken one, so B must claim across clients
                await wait_until(lambda: bool(got_b_jobs))

        await sub_b.subscribe("jobs.#", job_b)
        await worker_a.subscribe("jobs.#", job_a, prefetch=1)
        for i in range(n):
            await pub.publish(f"events.e{i % 7}", str(i))
            await pub.publish(f"jobs.j{i % 5}", str(i), single=True)
        await wait_until(lambda: len(got_b) >= n and len(got_a_jobs) + len(got_b_jobs) >= n)
        # three more scans of B: a message delivered twice would show up now
        scans = sub_b.statistics().scans
        await wait_until(lambda: sub_b.statistics().scans >= scans + 3)
    assert Counter(m.payload.decode() for m in got_b) == Counter(str(i) for i in range(n))
    jobs = Counter(m.payload.decode() for m in (*got_a_jobs, *got_b_jobs))
    assert jobs == Counter(str(i) for i in range(n))  # each job once, on either client
    assert got_b_jobs, "client B took none of the jobs"


def test_worker_processes_on_both_clients_share_a_queue(
    two_clients: TwoClients, peers: Peers
) -> None:
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    with BlockingBus(a):
        pass
    workers = [
        peers.fsbus("worker", root, name=f"worker on {side}", pattern="jobs.#")
        for side, root in (("A", a), ("A", a), ("B", b), ("B", b))
    ]
    for w in workers:
        w.wait_count("ready", 1)
    n = 300
    pub = peers.fsbus(
        "pub",
        a,
        name="publisher on A",
        messages=[[f"jobs.{i % 9}", f"j{i}"] for i in range(n)],
        single=True,
    )
    pub.wait_count("published", 1)
    until(lambda: counts(workers, "done").total() >= n, f"{n} jobs done")
    for w in workers:
        assert w.stop() == 0, w.describe()
    done = counts(workers, "done")
    assert done == Counter(f"j{i}" for i in range(n))
    assert counts(workers[2:], "done").total() > 0  # client B's workers took a share


def test_durable_queues_across_the_two_clients(two_clients: TwoClients, peers: Peers) -> None:
    """Two queues declared on A; a publisher on B before any consumer runs and after;
    consumers on both clients, one SIGKILLed mid-run. Per queue: every message handled,
    a second handling only as a redelivery."""
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    with BlockingBus(a) as bus:
        bus.declare_queue("all", ["orders.#"])
        bus.declare_queue("paid", ["orders.*.paid"])
    n = 200
    ids = [f"o{i}" for i in range(n)]
    topic = {i: "orders.eu.paid" if k % 2 else "orders.eu.new" for k, i in enumerate(ids)}
    early = peers.fsbus(
        "pub",
        b,
        name="publisher on B, no consumer yet",
        child=QUEUE_CHILD,
        messages=[[topic[i], i] for i in ids[: n // 2]],
    )
    early.wait_count("published", n // 2, timeout=WAIT)
    consumers = {
        "all": [
            peers.fsbus(
                "consumer", root, name=f"all on {side}", child=QUEUE_CHILD, queue="all", work=0.005
            )
            for side, root in (("A", a), ("B", b), ("B", b))
        ],
        "paid": [
            peers.fsbus("consumer", b, name="paid on B", child=QUEUE_CHILD, queue="paid"),
            peers.fsbus("consumer", a, name="paid on A", child=QUEUE_CHILD, queue="paid"),
        ],
    }
    for group in consumers.values():
        for c in group:
            c.wait_count("ready", 1, timeout=WAIT)
    late = peers.fsbus(
        "pub",
        b,
        name="publisher on B",
        child=QUEUE_CHILD,
        messages=[[topic[i], i] for i in ids[n // 2 :]],
        single=True,
    )
    victim = consumers["all"][2]
    until(lambda: victim.count("done") >= 5, "the consumer on B handled 5")
    victim.proc.kill()
    victim.wait_exit()
    late.wait_count("published", n - n // 2, timeout=WAIT)
    expected = {"all": set(ids), "paid": {i for i in ids if topic[i].endswith("paid")}}
    for q, group in consumers.items():
        until(
            lambda g=group, q=q: expected[q] <= set(counts(g, "done")),
            f"every message of queue {q} handled",
            timeout=2 * WAIT,
        )
        done = counts(group, "done")
        assert set(done) == expected[q]
        redelivered = {
            str(e["id"]) for c in group for e in c.of("start") if e["delivery_count"] > 1
        }
        assert {i for i, k in done.items() if k > 1} <= redelivered
    with BlockingBus(a) as bus:
        until(lambda: bus.queue_info("all").depth == 0, "queue all empty")
        assert bus.queue_info("paid").depth == 0


def test_gets_on_both_clients_take_each_message_once(two_clients: TwoClients, peers: Peers) -> None:
    """``bus.get`` across the two clients: getters on A and B take a queue's messages one
    at a time while a publisher on B publishes. A getter on A, alone on the queue when
    publishing starts, holds its first message and is SIGKILLed with it. Every message is
    handled, the held one by a survivor as a redelivery, none twice otherwise. A getter's
    listing follows the other client's publishes (and takes) only through UPDATE and the
    bucket listings, as a consumer's does."""
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    with BlockingBus(a) as bus:
        bus.declare_queue("jobs", ["jobs.#"])
    victim = peers.fsbus(
        "getter", a, name="getter on A", child=QUEUE_CHILD, queue="jobs", hang_after=0
    )
    victim.wait_count("ready", 1, timeout=WAIT)
    ids = [f"j{i}" for i in range(150)]
    publisher = peers.fsbus(
        "pub", b, name="publisher on B", child=QUEUE_CHILD, messages=[["jobs.x", i] for i in ids]
    )
    victim.wait_count("hanging", 1, timeout=WAIT)
    survivors = [
        peers.fsbus("getter", b, name="getter on B", child=QUEUE_CHILD, queue="jobs"),
        peers.fsbus("getter", a, name="getter 2 on A", child=QUEUE_CHILD, queue="jobs"),
    ]
    for g in survivors:
        g.wait_count("ready", 1, timeout=WAIT)
    victim.proc.kill()
    victim.wait_exit()
    publisher.wait_count("published", len(ids), timeout=WAIT)
    getters = [victim, *survivors]
    (held,) = {str(e["id"]) for e in victim.of("hanging")}
    until(
        lambda: set(ids) <= set(counts(getters, "done")),
        "every message taken and handled",
        timeout=2 * WAIT,
    )
    done = counts(getters, "done")
    assert set(done) == set(ids)
    assert {i for i, k in done.items() if k > 1} == set()
    again = [e for g in survivors for e in g.of("start") if str(e["id"]) == held]
    assert again
    assert again[-1]["delivery_count"] > 1
    with BlockingBus(a) as bus:
        until(lambda: bus.queue_info("jobs").depth == 0, "queue jobs empty")


def test_qlobber_fsq_on_one_client_and_fsbus_on_the_other(
    two_clients: TwoClients, peers: Peers
) -> None:
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    # qlobber-fsq publishes on A; an fsbus subscriber and worker on B
    fs_sub = peers.fsbus("sub", b, name="fsbus on B", subscriptions=[["all", "q.#"]])
    fs_sub.wait_count("ready", 1)
    fs_worker = peers.fsbus("worker", b, name="fsbus worker on B", pattern="qjobs.#")
    fs_worker.wait_count("ready", 1)
    n = 40
    msgs = [
        {
            "topic": f"q.m{i}",
            "payload": base64.b64encode(f"m{i}".encode()).decode(),
            "single": False,
        }
        for i in range(n)
    ] + [
        {
            "topic": f"qjobs.j{i}",
            "payload": base64.b64encode(f"j{i}".encode()).decode(),
            "single": True,
        }
        for i in range(n)
    ]
    q_pub = peers.qlobber("pub", a, messages=msgs)
    q_pub.wait_count("done", 1)
    until(lambda: fs_sub.count("message") >= n, "qlobber's multis on B")
    until(lambda: fs_worker.count("done") >= n, "qlobber's jobs on B")
    # and fsbus publishes on B to a qlobber-fsq subscriber on A
    q_sub = peers.qlobber("sub", a, subscriptions=[{"id": "back", "pattern": "back.#"}])
    q_sub.wait_count("ready", 1)
    with BlockingBus(b) as bus:
        for i in range(n):
            bus.publish(f"back.b{i}", f"b{i}")
    q_sub.wait_count("message", n, timeout=WAIT)
    for p in (fs_sub, fs_worker, q_sub, q_pub):
        p.stop()
    assert Counter(str(e["id"]) for e in fs_sub.of("message")) == Counter(f"m{i}" for i in range(n))
    assert counts([fs_worker], "done") == Counter(f"j{i}" for i in range(n))
    back = Counter(base64.b64decode(str(e["payload"])).decode() for e in q_sub.of("message"))
    assert back == Counter(f"b{i}" for i in range(n))


# --------------------------------------------------------------------------- Streams
def test_streams_appends_follow_and_groups_from_both_clients(two_clients: TwoClients) -> None:
    a, b = two_clients.a, two_clients.b
    per_side = 400
    with Stream.open(a, "log") as sa:
        sa.append(b"first")
    with Stream.open(a, "log") as sa, Stream.open(b, "log") as sb:
        errors: list[BaseException] = []

        def appender(s: Stream, tag: str) -> None:
            try:
                for i in range(per_side // 20):
                    s.append_batch([f"{tag}{i * 20 + k}".encode() for k in range(20)])
            except BaseException as exc:  # report it in the test thread
                errors.append(exc)

        threads = [
            threading.Thread(target=appender, args=(sa, "a")),
            threading.Thread(target=appender, args=(sb, "b")),
        ]
        for t in threads:
            t.start()
        # B follows the log while both clients append
        seen: list[bytes] = []
        deadline = time.monotonic() + WAIT
        offset = 0
        while len(seen) < 2 * per_side + 1 and time.monotonic() < deadline:
            for rec in sb.read(offset, max_records=500):
                seen.append(rec.value)
                offset = rec.offset + 1
            time.sleep(0.01)
        for t in threads:
            t.join()
        assert errors == []
    want = Counter([b"first"] + [f"{t}{i}".encode() for t in "ab" for i in range(per_side)])
    assert Counter(seen) == want
    with Stream.open(a, "log") as sa, Stream.open(b, "log") as sb:
        ra = [(r.offset, r.value) for r in sa.read(0)]
        rb = [(r.offset, r.value) for r in sb.read(0)]
        assert ra == rb  # one log, read the same from both clients
        assert [o for o, _ in ra] == list(range(len(ra)))  # dense offsets
        # a consumer group with one member on each client: each record once
        taken: list[bytes] = []
        ga, gb = sa.group("g", consumer="on-a"), sb.group("g", consumer="on-b")
        while True:
            progress = False
            for g in (ga, gb):
                batch = g.poll(max_records=37)
                if batch:
                    taken.extend(r.value for r in batch)
                    g.commit()
                    progress = True
            if not progress:
                break
    assert Counter(taken) == want


# --------------------------------------------------------------------------- stress
@pytest.mark.parametrize("scenario", ["workqueue", "chaos"])
def test_stress_scenarios_across_the_two_clients(
    two_clients: TwoClients, scenario: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib

    module = importlib.import_module(f"stress.{scenario}")
    monkeypatch.setenv("FSBUS_STRESS_DIR", str(tmp_path))
    s = module.run("small", roots=[str(two_clients.a), str(two_clients.b)])
    assert s.ok, s.line() + "\n" + "\n".join(s.violations)
    assert s.delivered == s.sent


def test_expired_messages_are_dead_lettered_once_across_the_two_clients(
    two_clients: TwoClients, peers: Peers
) -> None:
    """A delay queue (``message_ttl``, ``dead_letter_expired``) with no consumer, and
    consumers of its dead-letter queue on both clients, each of which may be the one
    that looks for expired messages (whichever holds the queue's expirer flock; one per
    client where flock does not cross clients): each of 200 reaches the dead-letter
    queue exactly once, with its reason, whichever client claimed it."""
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    with BlockingBus(a) as bus:
        bus.declare_queue(
            "delay", ["d.#"], message_ttl=0.5, dead_letter="dead.delay", dead_letter_expired=True
        )
        bus.declare_queue("dead", ["dead.#"])
    consumers = [
        peers.fsbus("consumer", root, name=f"dead on {side}", child=QUEUE_CHILD, queue="dead")
        for side, root in (("A", a), ("B", b), ("B", b))
    ]
    for c in consumers:
        c.wait_count("ready", 1, timeout=WAIT)
    ids = [f"d{i}" for i in range(200)]
    pub = peers.fsbus(
        "pub", a, name="publisher on A", child=QUEUE_CHILD, messages=[["d.x", i] for i in ids]
    )
    pub.wait_count("published", len(ids), timeout=WAIT)
    until(
        lambda: set(ids) <= set(counts(consumers, "done")),
        "every expired message dead-lettered",
        timeout=2 * WAIT,
    )
    done = counts(consumers, "done")
    assert set(done) == set(ids)
    assert [i for i, k in done.items() if k > 1] == []
    reasons = {e["headers"]["x-fsbus-reason"] for c in consumers for e in c.of("done")}
    assert reasons == {"expired"}
    with BlockingBus(b) as bus:
        until(lambda: bus.queue_info("delay").depth == 0, "the delay queue empty")


def test_dropped_messages_are_dead_lettered_once_across_the_two_clients(
    two_clients: TwoClients, peers: Peers
) -> None:
    """A full queue (``max_length`` 10, ``dead_letter_dropped``) overfilled by a publisher
    on each client at once, and consumers of its dead-letter queue on both: each of the
    300 messages is either still in the queue or was dead-lettered exactly once (reason
    ``maxlen``), whichever client dropped it and whichever sent it on; none lost, none
    twice, and the queue holds at most 10."""
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    with BlockingBus(a) as bus:
        bus.declare_queue(
            "capped", ["c.#"], max_length=10, dead_letter="over.c", dead_letter_dropped=True
        )
        bus.declare_queue("over", ["over.#"])
    consumers = [
        peers.fsbus("consumer", root, name=f"over on {side}", child=QUEUE_CHILD, queue="over")
        for side, root in (("A", a), ("B", b))
    ]
    for c in consumers:
        c.wait_count("ready", 1, timeout=WAIT)
    ids = {side: [f"{side}{i}" for i in range(150)] for side in "AB"}
    pubs = [
        peers.fsbus(
            "pub",
            root,
            name=f"publisher on {side}",
            child=QUEUE_CHILD,
            messages=[["c.x", i] for i in ids[side]],
        )
        for side, root in (("A", a), ("B", b))
    ]
    for p, side in zip(pubs, "AB", strict=True):
        p.wait_count("published", len(ids[side]), timeout=WAIT)
    every = set(ids["A"] + ids["B"])

    def settled() -> bool:
        with BlockingBus(a) as bus:
            depth = bus.queue_info("capped").depth  # (trims it first)
        return len(counts(consumers, "done")) + depth >= len(every)

    until(settled, "every message kept or dead-lettered", timeout=2 * WAIT)
    done = counts(consumers, "done")
    assert [i for i, k in done.items() if k > 1] == []
    left: list[str] = []
    with BlockingBus(b) as bus:
        while True:
            with bus.get("capped") as msg:
                if msg is None:
                    break
                left.append(msg.payload.decode())
    assert not set(done) & set(left)
    assert set(done) | set(left) == every
    assert len(left) <= 10
    reasons = {e["headers"]["x-fsbus-reason"] for c in consumers for e in c.of("done")}
    assert reasons == {"maxlen"}


# --------------------------------------------------------------------------- a client dies
def test_a_dead_clients_held_jobs_are_redelivered_once(
    two_clients: TwoClients, peers: Peers
) -> None:
    """SIGKILL B's FUSE client (a host crash) while a process on B holds jobs."""
    c = two_clients.cluster
    a, b = two_clients.a / "bus", two_clients.b / "bus"
    holding = 3
    victim = peers.fsbus(
        "worker",
        b,
        name="victim on B",
        pattern="jobs.#",
        hold=True,
        config={"handler_concurrency": holding},
    )
    victim.wait_count("ready", 1)
    n = 30
    pub = peers.fsbus(
        "pub",
        a,
        name="publisher on A",
        messages=[["jobs.x", f"j{i}"] for i in range(n)],
        single=True,
    )
    pub.wait_count("published", 1)
    held = {str(e["id"]) for e in victim.wait_count("start", holding)}
    survivor = peers.fsbus("worker", a, name="survivor on A", pattern="jobs.#")
    survivor.wait_count("ready", 1)
    until(lambda: survivor.count("done") >= n - holding, "the jobs not held")
    assert not held & set(counts([survivor], "start"))  # held jobs stay locked meanwhile

    # The host dies: its FUSE client and its process, at once.
    t0 = time.monotonic()
    os.kill(c.client_pid("b"), signal.SIGKILL)
    victim.proc.send_signal(signal.SIGKILL)
    victim.wait_exit()
    if two_clients.kind == "ceph":
        # What an operator does for a dead host (or sets session_autoclose for):
        c.evict("b")  # type: ignore[attr-defined]
    until(lambda: survivor.count("done") >= n, "the dead client's jobs redelivered")
    redelivered_after = time.monotonic() - t0
    assert survivor.stop() == 0, survivor.describe()
    c.clients["b"].wait(10)
    from .clusters import _unmount

    _unmount(c.b)
    c.mount("b")  # the next tests get a live client B again
    done = counts([survivor], "done")
    assert done == Counter(f"j{i}" for i in range(n))
    assert set(counts([victim], "start")) == held
    # T: seconds from the crash to the last held job handled on A (reported in the docs)
    print(f"\n{two_clients.kind}: held jobs redelivered {redelivered_after:.2f} s after the crash")
    assert redelivered_after < 30
