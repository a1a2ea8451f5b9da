"""``fsbus stream``: append, read (ranges, time, follow), info, groups."""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import pytest

from fsbus import Stream, StreamConfig, UsageError
from fsbus._cli.stream import add_stream_commands


def run(root: Path, *argv: str) -> int:
    parser = argparse.ArgumentParser(prog="fsbus")
    parser.add_argument("--json", action="store_true")
    add_stream_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    args.root = root
    code: int = args.func(args)
    return code


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_append_and_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, "stream", "append", "s", "hello", "--key", "k", "--header", "a=1") == 0
    assert lines(capsys) == ["0"]
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\nthree\n")
    assert run(tmp_path, "--json", "stream", "append", "s", "--lines", str(src)) == 0
    assert json.loads(lines(capsys)[0]) == {"stream": "s", "first": 1, "last": 3, "count": 3}
    assert run(tmp_path, "stream", "read", "s") == 0
    recs = [json.loads(x) for x in lines(capsys)]
    assert [r["value"] for r in recs] == ["hello", "one", "two", "three"]
    assert recs[0]["key"] == "k"
    assert recs[0]["headers"] == {"a": "1"}
    assert recs[1]["key"] is None
    assert run(tmp_path, "stream", "read", "s", "--from", "1", "--to", "3") == 0
    assert [json.loads(x)["offset"] for x in lines(capsys)] == [1, 2]
    assert run(tmp_path, "stream", "read", "s", "--from", "end") == 0
    assert lines(capsys) == []
    assert run(tmp_path, "stream", "read", "s", "--max", "1", "--from-time", "0") == 0
    assert len(lines(capsys)) == 1


def test_binary_values_are_base64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Stream.open(tmp_path, "b") as s:
        s.append(b"\xff\x00")
    run(tmp_path, "stream", "read", "b")
    assert json.loads(lines(capsys)[0])["value_base64"] == "/wA="


def test_follow(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = StreamConfig(durability="none", poll_interval=0.05)
    with Stream.open(tmp_path, "f", config=cfg) as s:
        s.append(b"first")

        def more() -> None:
            s.append_batch([b"second", b"third"])

        t = threading.Thread(target=more)
        t.start()
        assert run(tmp_path, "stream", "read", "f", "--follow", "--max", "3") == 0
        t.join()
    assert [json.loads(x)["value"] for x in lines(capsys)] == ["first", "second", "third"]


def test_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096)
    with Stream.open(tmp_path, "i", config=cfg) as s:
        for _ in range(10):
            s.append_batch([b"x" * 100] * 10)
        s.group("g").close()
    assert run(tmp_path, "--json", "stream", "info", "i") == 0
    info = json.loads(lines(capsys)[0])
    assert (info["start_offset"], info["end_offset"]) == (0, 100)
    assert len(info["segments"]) > 1
    assert info["groups"] == ["g"]
    assert run(tmp_path, "stream", "info") == 0
    out = lines(capsys)
    assert out[0].split() == ["STREAM", "START", "END", "SEGMENTS", "SIZE", "GROUPS"]
    assert out[1].split()[:3] == ["i", "0", "100"]
    assert run(tmp_path, "stream", "info", "i") == 0
    assert "offsets 0..100 (100 records)" in lines(capsys)[0]


def test_groups_list_lag_reset_delete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Stream.open(tmp_path, "g") as s:
        s.append_batch([b"x"] * 10)
        with s.group("workers") as g:
            g.poll(max_records=4)
            g.commit()
    assert run(tmp_path, "--json", "stream", "groups", "list", "g") == 0
    row = json.loads(lines(capsys)[0])
    assert row["group"] == "workers"
    assert row["lag"] == 6
    assert run(tmp_path, "--json", "stream", "groups", "lag", "g", "workers") == 0
    lag = json.loads(lines(capsys)[0])
    assert lag["lag"] == 6
    assert set(lag["committed"].values()) == {4}
    (tmp_path / "streams/g/groups/workers/offsets").write_bytes(b"garbage")
    with pytest.raises(Exception, match="fsbus stream groups reset g workers"):
        run(tmp_path, "stream", "groups", "lag", "g", "workers", "-o", "cache_wait=0.1")
    assert run(tmp_path, "stream", "groups", "reset", "g", "workers", "--to", "latest") == 0
    assert "resumes at offset 10" in lines(capsys)[0]
    assert run(tmp_path, "stream", "groups", "lag", "g", "workers") == 0
    assert lines(capsys)[0] == "group workers: lag 0 (end offset 10)"
    assert run(tmp_path, "stream", "groups", "delete", "g", "workers") == 0
    capsys.readouterr()
    with pytest.raises(UsageError, match="no consumer group"):
        run(tmp_path, "stream", "groups", "delete", "g", "workers")


def test_through_the_main_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fsbus._cli.main import main

    assert main(["stream", "append", "m", "--root", str(tmp_path), "--key", "k", "v1"]) == 0
    assert main(["--root", str(tmp_path), "--json", "stream", "append", "m", "v2"]) == 0
    assert main(["stream", "read", "m", "--root", str(tmp_path)]) == 0
    out = lines(capsys)
    assert out[:2] == ["0", '{"stream": "m", "offset": 1}']
    assert [json.loads(x)["value"] for x in out[2:]] == ["v1", "v2"]
    assert main(["stream", "append", "m", "--root", str(tmp_path)]) == 2
    assert "needs VALUE or --lines" in capsys.readouterr().err
    assert main(["stream", "read", "m", "--from", "9", "--root", str(tmp_path)]) == 1
    assert "valid offsets are 0 (oldest kept) to 2" in capsys.readouterr().err


def test_compact_and_retain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = StreamConfig(durability="none", segment_bytes=4096)
    with Stream.open(tmp_path, "c", config=cfg) as s:
        for i in range(300):
            s.append(b"v" * 60, key=f"k{i % 5}")
        segments = len(s.info().segments)
    assert run(tmp_path, "--json", "stream", "compact", "c") == 0
    report = json.loads(lines(capsys)[0])
    assert report["removed_records"] > 0
    assert run(tmp_path, "--json", "stream", "retain", "c", "--max-bytes", "1") == 0
    report = json.loads(lines(capsys)[0])
    assert len(report["deleted"]) == segments - 1
    assert report["start_offset"] > 0
    with pytest.raises(Exception, match="needs --max-bytes"):
        run(tmp_path, "stream", "retain", "c")


def test_options_set_stream_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fsbus._cli.main import main

    root = str(tmp_path)
    for _ in range(60):
        args = ["stream", "append", "o", "x" * 100, "--root", root]
        assert main([*args, "-o", "segment_bytes=4096", "-o", "durability=none"]) == 0
    capsys.readouterr()
    assert main(["--json", "stream", "info", "o", "--root", root]) == 0
    assert len(json.loads(lines(capsys)[0])["segments"]) > 1
    assert main(["stream", "info", "o", "--root", root, "-o", "nonsense=1"]) == 2
    assert "invalid StreamConfig: nonsense" in capsys.readouterr().err
