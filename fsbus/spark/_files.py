"""The connector's own files under ``<root>/spark/``: staged rows, commit markers, ledgers.

These are Spark bookkeeping, not bus or stream data (those go through the public fsbus
API). Layout::

    <root>/spark/staging/<sink id>/<batch>/<partition>-<task attempt>.arrow
    <root>/spark/commits/<sink id>/<batch>.done        the batch is published
    <root>/spark/commits/<sink id>/<batch>.pending     a stream append is under way
    <root>/spark/commits/<sink id>/<batch>.ledger      Bus publishes done so far
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsbus import StorageError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "Ledger",
    "absolute",
    "atomic_write_json",
    "commits_dir",
    "durable_dirs",
    "read_json",
    "read_staged",
    "remove_empty_dir",
    "remove_file",
    "remove_tree",
    "staging_dir",
    "subdirs",
    "write_staged",
]


def absolute(root: str) -> str:
    """``root`` as an absolute path (resolved on the driver, used on the executors)."""
    return os.path.abspath(root)


def staging_dir(root: str, sink_id: str, batch: str) -> Path:
    """Where the tasks of one batch of one sink stage their rows."""
    return Path(root) / "spark" / "staging" / sink_id / batch


def commits_dir(root: str, sink_id: str) -> Path:
    """Where one sink keeps its commit markers."""
    return Path(root) / "spark" / "commits" / sink_id


def _fail(what: str, exc: OSError, path: Path) -> StorageError:
    return StorageError(f"{what} failed at {path}: {exc.strerror or exc}", path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_dirs(path: Path) -> None:
    """Create directory ``path`` and its missing parents so that they survive a power cut.

    Each directory created is synced into its parent (``mkdir -p`` alone leaves the new
    names in memory: a file synced into them would still be gone after a cut).
    """
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it: sync anyway
            d.mkdir()
        _fsync_dir(d.parent)


def write_staged(
    path: Path, schema: pa.Schema, batches: Iterable[pa.RecordBatch], *, durable: bool = True
) -> int:
    """Write batches to an Arrow IPC file that appears complete or not at all; the row
    count. ``durable``: synced, with its directory (a pending commit names the file, and
    its replay after a power cut reads it back). Without it the file may be lost in a
    power cut, which only a commit that is never replayed (a batch job's) can afford."""
    import pyarrow as pa  # here: the processes that only plan reads never load it

    rows = 0
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        if durable:
            durable_dirs(path.parent)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
        if durable:
            _fsync_dir(path.parent)
    except OSError as exc:
        remove_file(tmp)
        raise _fail("staging rows for Spark", exc, path) from exc
    except BaseException:  # the task failed or was killed while producing rows
        remove_file(tmp)
        raise
    return rows


def read_staged(path: Path) -> pa.Table:
    """Read a staged Arrow file back (memory-mapped: the table's buffers are the file's pages)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path), "r") as source:
            return pa.ipc.open_stream(source).read_all()
    except OSError as exc:
        raise _fail("reading staged Spark rows", exc, path) from exc


def atomic_write_json(path: Path, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON, durably: readers see the old or the new file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        durable_dirs(path.parent)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        remove_file(tmp)
        raise _fail("writing a Spark commit marker", exc, path) from exc


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None if there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _fail("reading a Spark commit marker", exc, path) from exc


def remove_file(path: Path) -> None:
    """Remove a file if it exists."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def remove_empty_dir(path: Path) -> None:
    """Remove a directory if it exists and is empty."""
    with contextlib.suppress(OSError):
        path.rmdir()


def remove_tree(path: Path) -> None:
    """Remove a directory and everything in it, if it exists."""
    shutil.rmtree(path, ignore_errors=True)


def subdirs(path: Path) -> list[str]:
    """Names of the directories in ``path`` (none if it does not exist)."""
    try:
        with os.scandir(path) as it:  # closed even if an entry's stat fails midway
            return [e.name for e in it if e.is_dir()]
    except FileNotFoundError:
        return []


def marker_names(path: Path) -> list[str]:
    """Names of the files in ``path`` (none if it does not exist)."""
    try:
        with os.scandir(path) as it:
            return [e.name for e in it if e.is_file()]
    except FileNotFoundError:
        return []


class Ledger:
    """An append-only list of what a Bus publish has done: a JSON header, then indexes.

    Each line is written with one ``write`` call and flushed, so it survives the death
    of the process (it sits in the page cache); a torn last line is ignored on reading.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None

    def load(self) -> tuple[dict[str, Any] | None, set[int]]:
        """The header and the indexes recorded so far (None, empty: no ledger yet)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            return None, set()
        except OSError as exc:
            raise _fail("reading a Spark publish ledger", exc, self.path) from exc
        if not lines or not lines[0]:
            return None, set()
        try:
            header = json.loads(lines[0])
        except ValueError:
            return None, set()
        done = {int(x) for x in lines[1:-1] if x.isdigit()}
        return header, done

    def start(self, header: dict[str, Any]) -> None:
        """Create the ledger with its header, durably."""
        atomic_write_json(self.path, header)
        self._open()
        self._file.write("\n")
        self._file.flush()

    def resume(self) -> None:
        """Open an existing ledger for appending; end a torn last line."""
        self._open()
        self._file.write("\n")
        self._file.flush()

    def record(self, index: int) -> None:
        """Note that message ``index`` is published."""
        self._file.write(f"{index}\n")
        self._file.flush()

    def close(self) -> None:
        """Close the ledger file (closed even if its last flush fails)."""
        f, self._file = self._file, None
        if f is not None:
            f.close()

    def _open(self) -> None:
        try:
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise _fail("opening a Spark publish ledger", exc, self.path) from exc
