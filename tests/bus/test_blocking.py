"""BlockingBus: publish, messages/get/ack/release, browse, read_payload, gc, statistics."""

from __future__ import annotations

import io
import socket
import threading
import time
from pathlib import Path

import pytest

from fsbus import (
    BlockingBus,
    Bus,
    BusConfig,
    ClosedError,
    InvalidPattern,
    InvalidTopic,
    Message,
    UsageError,
)

from .conftest import WAIT, is_flocked, message_files, wait_until_blocking


def test_publish_and_get_a_multi(root: Path) -> None:
    with BlockingBus(root) as bus, bus.messages("greet.*") as it:
        info = bus.publish("greet.world", b"hello", headers={"lang": "en"})
        msg = it.get(timeout=WAIT)
    assert msg.payload == b"hello"
    assert msg.topic == "greet.world"
    assert msg.name == info.name
    assert msg.headers == {"lang": "en"}
    assert msg.host == socket.gethostname()


def test_get_times_out(root: Path) -> None:
    with BlockingBus(root) as bus, bus.messages("none") as it, pytest.raises(TimeoutError):
        it.get(timeout=0.2)


def test_work_queue_ack_and_release(root: Path) -> None:
    cfg = BusConfig(poll_interval=0.05, retry_interval=0.05)
    with BlockingBus(root, config=cfg) as bus, bus.messages("jobs.#") as it:
        info = bus.publish("jobs.a", b"1", single=True)
        first = it.get(timeout=WAIT)
        assert is_flocked(info.path)
        it.release(first)
        second = it.get(timeout=WAIT)
        assert second.name == first.name
        assert second.delivery_count == 2
        it.ack(second)
        wait_until_blocking(lambda: bus.statistics().acked == 1)
        stats = bus.statistics()
    assert stats.published == 1
    assert stats.acked == 1
    assert stats.released == 1


def test_for_loop_iterates(root: Path) -> None:
    with BlockingBus(root) as bus, bus.messages("n") as it:
        for i in range(3):
            bus.publish("n", str(i))
        got = []
        for msg in it:
            got.append(msg.payload)
            if len(got) == 3:
                break
    assert sorted(got) == [b"0", b"1", b"2"]


def test_closing_the_bus_releases_held_singles(root: Path) -> None:
    with BlockingBus(root) as bus:
        info = bus.publish("hold", b"h", single=True)
        it = bus.messages("hold")
        with it:
            it.get(timeout=WAIT)
            assert is_flocked(info.path)
    assert not is_flocked(info.path)
    assert message_files(root) == [f"{info.bucket}/{info.name}"]


def test_publish_from_a_binary_file_object_and_a_path(root: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"from disk" * 1000)
    with BlockingBus(root) as bus, bus.messages("f.*") as it:
        bus.publish("f.obj", io.BytesIO(b"from memory"))
        with src.open("rb") as fh:
            bus.publish("f.fh", fh)
        bus.publish("f.path", src)
        got = {m.topic: m.payload for m in (it.get(timeout=WAIT) for _ in range(3))}
    assert got == {
        "f.obj": b"from memory",
        "f.fh": b"from disk" * 1000,
        "f.path": b"from disk" * 1000,
    }


def test_browse_sees_everything_and_consumes_nothing(root: Path) -> None:
    with BlockingBus(root) as bus:
        multi = bus.publish("b.one", b"1234", headers={"x": "y"})
        single = bus.publish("b.two", b"56", single=True, priority=5)
        bus.publish("other", b"no")
        infos = {i.topic: i for i in bus.browse("b.#")}
        assert set(infos) == {"b.one", "b.two"}
        one, two = infos["b.one"], infos["b.two"]
        assert (one.size, two.size) == (4, 2)
        assert one.name == multi.name
        assert one.path == multi.path
        assert one.headers == {"x": "y"}
        assert not one.single
        assert two.single
        assert two.priority == 5
        assert not two.locked
        assert one.host == socket.gethostname()
        assert one.published_at is not None
        assert abs(one.published_at - time.time()) < 60
        assert bus.read_payload(two) == b"56"
        assert len(list(bus.browse())) == 3
        assert {i.name for i in bus.browse("#")} >= {multi.name, single.name}
    assert len(message_files(root)) == 3


def test_browse_shows_locked_singles(root: Path) -> None:
    with BlockingBus(root) as bus, bus.messages("lock.me") as it:
        bus.publish("lock.me", b"x", single=True)
        it.get(timeout=WAIT)
        (info,) = bus.browse("lock.me")
        assert info.locked


def test_read_payload_of_a_vanished_message(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.publish("gone", b"x")
        (info,) = bus.browse()
        Path(info.path).unlink()
        assert bus.read_payload(info) is None


def test_gc_removes_expired_messages_and_debris(root: Path) -> None:
    with BlockingBus(root) as bus:
        short = bus.publish("short", b"x", ttl=0.05, headers={"a": "b"})
        keep = bus.publish("keep", b"y")
        wait_until_blocking(lambda: time.time() > short.expires)
        debris = root / "staging" / "crashed-publisher"
        debris.write_bytes(b"\x00half")
        assert bus.gc(debris_age=3600) == 1  # the staging file is too young
        assert message_files(root) == [f"{keep.bucket}/{keep.name}"]
        assert not (root / "fsbus" / "meta" / short.bucket / short.name).exists()
        assert debris.exists()
        assert bus.gc(debris_age=0) == 1
        assert not debris.exists()
        assert [i.name for i in bus.browse()] == [keep.name]


def test_statistics_before_any_subscription(root: Path) -> None:
    with BlockingBus(root) as bus:
        bus.publish("s", b"1")
        bus.publish_many([("s", b"2"), ("s", "3")])
        stats = bus.statistics()
    assert stats.published == 3
    assert stats.delivered == 0
    assert stats.subscriptions == 0


def test_blocking_and_async_buses_share_a_directory(root: Path) -> None:
    import anyio

    received: list[bytes] = []

    async def consume() -> None:
        async with Bus(root) as bus, bus.messages("x", existing=True) as it:
            msg = await it.receive(timeout=WAIT)
            received.append(msg.payload)
            await it.ack(msg)

    with BlockingBus(root) as bus:
        bus.publish("x", b"across faces", single=True)
        anyio.run(consume)
    assert received == [b"across faces"]
    assert message_files(root) == []


def test_publishing_from_threads(root: Path) -> None:
    with BlockingBus(root) as bus, bus.messages("t.*") as it:

        def work(n: int) -> None:
            for i in range(25):
                bus.publish(f"t.{n}", f"{n}-{i}")

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = {it.get(timeout=WAIT).payload for _ in range(100)}
    assert len(got) == 100


def test_use_before_enter_and_after_close(root: Path) -> None:
    bus = BlockingBus(root)
    with pytest.raises(UsageError, match="with BlockingBus"):
        bus.publish("t", b"x")
    with bus:
        bus.publish("t", b"x")
    with pytest.raises(ClosedError):
        bus.publish("t", b"x")
    with pytest.raises(ClosedError):
        bus.messages("t")
    with pytest.raises(UsageError, match="entered once"):
        bus.__enter__()


def test_bad_topic_from_the_blocking_face(root: Path) -> None:
    with BlockingBus(root) as bus, pytest.raises(InvalidTopic, match="control character"):
        bus.publish("bad\nline", b"x")
    assert message_files(root) == []


def test_a_text_mode_file_object_is_refused(root: Path, tmp_path: Path) -> None:
    src = tmp_path / "text.txt"
    src.write_text("words")
    with BlockingBus(root) as bus:
        with src.open() as fh, pytest.raises(UsageError, match=r"binary mode \('rb'\)"):
            bus.publish("t", fh)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="binary mode"):
            bus.publish("t", io.StringIO("words"))  # type: ignore[arg-type]
    assert message_files(root) == []
    assert list((root / "staging").iterdir()) == []


def test_a_bad_pattern_from_the_blocking_face(root: Path) -> None:
    with BlockingBus(root) as bus:
        with pytest.raises(InvalidPattern, match="control character"), bus.messages("a\tb"):
            pass
        with pytest.raises(InvalidPattern):
            list(bus.browse("a\nb"))
        # The bus still works afterwards.
        with bus.messages("ok") as it:
            bus.publish("ok", b"fine")
            assert it.get(timeout=WAIT).payload == b"fine"


def test_close_wakes_a_thread_waiting_in_get(root: Path) -> None:
    # Regression: close() waited for the pending get (forever without a timeout).
    outcome: list[str] = []
    bus = BlockingBus(root).__enter__()
    it = bus.messages("never").__enter__()
    waiting = threading.Event()

    def consume() -> None:
        waiting.set()
        try:
            it.get()  # no timeout: only the close can end it
        except ClosedError as exc:
            outcome.append(f"closed: {exc}")

    consumer = threading.Thread(target=consume)
    consumer.start()
    waiting.wait(WAIT)
    closer = threading.Thread(target=bus.close)
    closer.start()
    closer.join(WAIT)
    consumer.join(WAIT)
    assert not closer.is_alive(), "close() did not return"
    assert not consumer.is_alive(), "get() did not end"
    assert outcome == ["closed: the subscription is closed"]
    it.__exit__(None, None, None)  # leaving the block afterwards is harmless
    with pytest.raises(ClosedError):
        it.ack(Message("t", b"", False, 0.0, "n", "00"))


def test_close_releases_singles_held_by_an_open_subscription(root: Path) -> None:
    bus = BlockingBus(root).__enter__()
    info = bus.publish("held", b"h", single=True)
    it = bus.messages("held").__enter__()
    it.get(timeout=WAIT)
    assert is_flocked(info.path)
    bus.close()  # the block was never left
    assert not is_flocked(info.path)
    assert message_files(root) == [f"{info.bucket}/{info.name}"]


def test_get_with_timeout_zero_polls(root: Path) -> None:
    with BlockingBus(root) as bus, bus.messages("p") as it:
        with pytest.raises(TimeoutError):
            it.get(timeout=0)
        bus.publish("p", b"waiting")
        got: list[Message] = []

        def poll() -> bool:
            try:
                got.append(it.get(timeout=0))
            except TimeoutError:
                return False
            return True

        wait_until_blocking(poll)
    assert got[0].payload == b"waiting"


def _close_in_child(bus: BlockingBus, results: object) -> None:
    bus.close()  # the subscription and its event-loop thread are the parent's
    with BlockingBus(bus.root) as own:
        own.publish("from.child", b"child")
    results.put("closed")  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_forked_child_closes_its_copy_and_the_parent_keeps_consuming(root: Path) -> None:
    import multiprocessing

    with BlockingBus(root) as bus, bus.messages("from.*") as it:
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(target=_close_in_child, args=(bus, results))
        child.start()
        child.join(WAIT)
        if child.exitcode is None:
            child.kill()  # hung on the parent's loop thread: fail below
        assert child.exitcode == 0
        assert results.get(timeout=WAIT) == "closed"
        msg = it.get(timeout=WAIT)  # the parent's subscription still runs
        assert msg.topic == "from.child"
        assert msg.payload == b"child"
