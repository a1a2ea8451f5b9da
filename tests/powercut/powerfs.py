"""A FUSE filesystem that forgets, on command, everything that was not synced.

The strict model of LazyFS ("When Amnesia Strikes", VLDB 2024): every change is held
in memory and becomes durable only when the matching sync says so. On a power cut the
filesystem throws away what was not durable and carries on with what was, as a machine
that rebooted would find its disk.

What each sync makes durable (and nothing else does; there is no background writeback):

- ``fsync(fd)`` / ``fdatasync(fd)`` of a **file**: its data and size as they are now.
  ``fsync`` also makes its mode durable. It does not make the file's *name* durable:
  a new file whose directory was not synced is gone after a cut, whatever its data.
- ``fsync(fd)`` of a **directory**: its entries as they are now — names created,
  removed, linked or renamed into or out of it — each pointing to the inode it names
  now. Not the contents of those inodes, and not the directory's own name in its parent.
- a name that is durable for a file whose data never was synced comes back as an empty
  file (a crashed ext4 with delayed allocation shows the same).
- ``rename(a/x, b/y)`` changes two directories: ``b/y`` is durable once ``b`` is synced,
  the removal of ``a/x`` once ``a`` is synced. With only ``b`` synced both names come
  back (one inode, two links); with only ``a`` synced neither does. Both directories
  must be synced for the rename to be durable, and the file for its data.
- ``unlink``, ``rmdir``, ``link``, ``symlink``, ``mkdir``: changes of the parent's
  entries, durable with the parent's sync. A new directory's own entries need its own
  sync.
- ``truncate``, ``write``, ``chmod``, ``utimens``: changes of the inode, durable with
  the file's sync (a directory's mode and times are not tracked).

Cutting the power: the control channel arms a cut after the k-th *mutating* operation
(create, mknod, mkdir, unlink, rmdir, rename, link, symlink, write, truncate, chmod,
utimens, fsync, fsyncdir; reads never change what is durable). Operation k completes,
its effect on durability is kept, and from then on every operation fails with ``EIO``,
as a dead disk would, until ``restore`` brings back the durable state. Reads and
listings after ``restore`` see exactly what survived.

ALICE (OSDI 2014): with tracing on, the filesystem records each mutating operation as
units that a real filesystem may persist on its own before any sync — one directory
entry change, one data write — and :meth:`PowerState.crash_states` enumerates the
states a crash may leave: for every point of the trace, any per-directory prefix of
entry changes and any per-file prefix of data changes (the last one possibly torn:
half written, or the size grown over zeros) that includes everything a sync covered.

Run as a program (``python powerfs.py MOUNTPOINT``) it mounts in the foreground and
takes JSON commands, one a line, on standard input, answering each on standard output;
:class:`tests.powercut.harness.PowerCut` drives it. Only the standard library and
mfusepy (with libfuse 3) are needed.
"""

from __future__ import annotations

import base64
import copy
import errno
import hashlib
import itertools
import json
import os
import random
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

S_DIR = stat.S_IFDIR
S_REG = stat.S_IFREG
S_LNK = stat.S_IFLNK


@dataclass
class Node:
    """One inode: what programs see now, and what would survive a cut."""

    ino: int
    kind: int
    mode: int
    data: bytearray = field(default_factory=bytearray)
    entries: dict[str, int] = field(default_factory=dict)
    mtime_ns: int = 0
    durable_data: bytes = b""
    durable_entries: dict[str, int] = field(default_factory=dict)
    durable_mode: int = 0
    links: int = 0


class Dead(OSError):
    def __init__(self) -> None:
        super().__init__(errno.EIO, "power is cut")


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


# A unit a filesystem may persist on its own (ALICE): ("ent", dir, name, ino | None),
# ("w", ino, offset, bytes), ("t", ino, size); syncs are ("sync", "d" | "f", ino).
Unit = tuple[Any, ...]


class PowerState:
    """The in-memory filesystem and its durable shadow; no FUSE here, so tests can
    drive it directly and the FUSE layer stays a thin translation."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[int, Node] = {}
        self.next_ino = 2
        root = Node(1, S_DIR, 0o755, mtime_ns=time.time_ns(), durable_mode=0o755)
        self.nodes[1] = root
        self.ops = 0
        self.cut_at = 0
        self.dead = False
        self.cuts = 0
        self.saved: dict[str, tuple[dict[int, Node], int]] = {}
        self.tracing = False
        self.trace: list[Unit] = []
        self.trace_base: dict[int, Node] | None = None

    # ----------------------------------------------------------------- helpers
    def _alive(self) -> None:
        if self.dead:
            raise Dead()

    def _mutated(self, *units: Unit) -> None:
        """Count one mutating operation (already applied); cut when armed for it."""
        if self.tracing:
            self.trace.extend(units)
        self.ops += 1
        if self.cut_at and self.ops >= self.cut_at:
            self.cut()

    def resolve(self, path: str) -> Node:
        node = self.nodes[1]
        for part in path.split("/"):
            if not part:
                continue
            if node.kind != S_DIR:
                raise _err(errno.ENOTDIR)
            ino = node.entries.get(part)
            if ino is None:
                raise _err(errno.ENOENT)
            node = self.nodes[ino]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self.resolve(head or "/")
        if parent.kind != S_DIR:
            raise _err(errno.ENOTDIR)
        return parent, name

    def _new(self, kind: int, mode: int) -> Node:
        node = Node(self.next_ino, kind, mode, mtime_ns=time.time_ns(), durable_mode=mode)
        self.next_ino += 1
        self.nodes[node.ino] = node
        return node

    def nlink(self, node: Node) -> int:
        if node.kind == S_DIR:
            return 2 + sum(1 for i in node.entries.values() if self.nodes[i].kind == S_DIR)
        return node.links

    def _count_links(self) -> None:
        for node in self.nodes.values():
            node.links = 0
        for node in self.nodes.values():
            if node.kind == S_DIR:
                for i in node.entries.values():
                    self.nodes[i].links += 1

    # ----------------------------------------------------------------- operations
    def getattr(self, path: str | None, ino: int | None = None) -> dict[str, Any]:
        with self.lock:
            self._alive()
            node = self.nodes[ino] if ino is not None else self.resolve(path or "/")
            size = len(node.data) if node.kind != S_DIR else 4096
            return {
                "st_mode": node.kind | node.mode,
                "st_ino": node.ino,
                "st_nlink": self.nlink(node),
                "st_size": size,
                "st_blocks": (size + 511) // 512,
                "st_uid": os.getuid(),
                "st_gid": os.getgid(),
                "st_mtime": node.mtime_ns,
                "st_ctime": node.mtime_ns,
                "st_atime": node.mtime_ns,
            }

    def lookup_ino(self, path: str) -> int:
        with self.lock:
            self._alive()
            return self.resolve(path).ino

    def create(self, path: str, mode: int, kind: int = S_REG, target: bytes = b"") -> int:
        with self.lock:
            self._alive()
            parent, name = self._parent(path)
            if name in parent.entries:
                raise _err(errno.EEXIST)
            node = self._new(kind, mode & 0o7777)
            if kind == S_LNK:
                node.data = bytearray(target)
                node.durable_data = target  # a symlink's target is written with it
            parent.entries[name] = node.ino
            node.links = 1
            parent.mtime_ns = time.time_ns()
            self._mutated(
                ("node", node.ino, kind, node.mode, target), ("ent", parent.ino, name, node.ino)
            )
            return node.ino

    def unlink(self, path: str, *, is_dir: bool = False) -> None:
        with self.lock:
            self._alive()
            parent, name = self._parent(path)
            ino = parent.entries.get(name)
            if ino is None:
                raise _err(errno.ENOENT)
            node = self.nodes[ino]
            if is_dir:
                if node.kind != S_DIR:
                    raise _err(errno.ENOTDIR)
                if node.entries:
                    raise _err(errno.ENOTEMPTY)
            elif node.kind == S_DIR:
                raise _err(errno.EISDIR)
            del parent.entries[name]
            node.links -= 1
            parent.mtime_ns = time.time_ns()
            self._mutated(("ent", parent.ino, name, None))

    def rename(self, old: str, new: str) -> None:
        with self.lock:
            self._alive()
            src, sname = self._parent(old)
            dst, dname = self._parent(new)
            ino = src.entries.get(sname)
            if ino is None:
                raise _err(errno.ENOENT)
            moving = self.nodes[ino]
            if moving.kind == S_DIR and new.startswith(old.rstrip("/") + "/"):
                raise _err(errno.EINVAL)
            old_target = dst.entries.get(dname)
            if old_target == ino:
                return
            if old_target is not None:
                t = self.nodes[old_target]
                if t.kind == S_DIR and moving.kind != S_DIR:
                    raise _err(errno.EISDIR)
                if t.kind != S_DIR and moving.kind == S_DIR:
                    raise _err(errno.ENOTDIR)
                if t.kind == S_DIR and t.entries:
                    raise _err(errno.ENOTEMPTY)
            if old_target is not None:
                self.nodes[old_target].links -= 1
            del src.entries[sname]
            dst.entries[dname] = ino
            src.mtime_ns = dst.mtime_ns = time.time_ns()
            # The new name first: ext2-style writeback may persist either alone.
            self._mutated(("ent", dst.ino, dname, ino), ("ent", src.ino, sname, None))

    def link(self, existing: str, new: str) -> None:
        with self.lock:
            self._alive()
            node = self.resolve(existing)
            if node.kind == S_DIR:
                raise _err(errno.EPERM)
            parent, name = self._parent(new)
            if name in parent.entries:
                raise _err(errno.EEXIST)
            parent.entries[name] = node.ino
            node.links += 1
            self._mutated(("ent", parent.ino, name, node.ino))

    def write(self, ino: int, data: bytes, offset: int) -> int:
        with self.lock:
            self._alive()
            node = self.nodes[ino]
            buf = node.data
            if offset > len(buf):
                buf.extend(bytes(offset - len(buf)))
            buf[offset : offset + len(data)] = data
            node.mtime_ns = time.time_ns()
            self._mutated(("w", ino, offset, bytes(data)))
            return len(data)

    def read(self, ino: int, size: int, offset: int) -> bytes:
        with self.lock:
            self._alive()
            return bytes(self.nodes[ino].data[offset : offset + size])

    def truncate(self, ino: int, size: int) -> None:
        with self.lock:
            self._alive()
            node = self.nodes[ino]
            if node.kind == S_DIR:
                raise _err(errno.EISDIR)
            if size < len(node.data):
                del node.data[size:]
            else:
                node.data.extend(bytes(size - len(node.data)))
            node.mtime_ns = time.time_ns()
            self._mutated(("t", ino, size))

    def chmod(self, ino: int, mode: int) -> None:
        with self.lock:
            self._alive()
            self.nodes[ino].mode = mode & 0o7777
            self._mutated()

    def utimens(self, ino: int, mtime_ns: int | None) -> None:
        with self.lock:
            self._alive()
            self.nodes[ino].mtime_ns = mtime_ns if mtime_ns is not None else time.time_ns()
            self._mutated()

    def fsync(self, ino: int, datasync: bool) -> None:
        with self.lock:
            self._alive()
            node = self.nodes[ino]
            if node.kind == S_DIR:
                node.durable_entries = dict(node.entries)
                self._mutated(("sync", "d", ino))
                return
            node.durable_data = bytes(node.data)
            if not datasync:
                node.durable_mode = node.mode
            self._mutated(("sync", "f", ino))

    def listdir(self, ino: int) -> list[tuple[str, dict[str, int], int]]:
        """Entries with their inode numbers (an entry with inode 0 would be skipped)."""
        with self.lock:
            self._alive()
            node = self.nodes[ino]
            out = [
                (".", {"st_mode": S_DIR, "st_ino": ino}, 0),
                ("..", {"st_mode": S_DIR, "st_ino": 1}, 0),
            ]
            for name, i in node.entries.items():
                out.append((name, {"st_mode": self.nodes[i].kind, "st_ino": i}, 0))
            return out

    def readlink(self, path: str) -> str:
        with self.lock:
            self._alive()
            return self.resolve(path).data.decode("utf-8", "surrogateescape")

    # ----------------------------------------------------------------- power
    def cut(self) -> None:
        """The power fails now: nothing more changes until :meth:`restore`."""
        self.dead = True
        self.cut_at = 0
        self.cuts += 1

    def restore(self) -> dict[str, int]:
        """Come back up with what was durable (a cut first, if none happened)."""
        with self.lock:
            self.dead = True
            self.nodes = self._durable_nodes()
            self._count_links()
            self.dead = False
            self.cut_at = 0
            self.ops = 0
            return {"nodes": len(self.nodes)}

    def _durable_nodes(self) -> dict[int, Node]:
        """The nodes reachable from the root through durable entries, as they'd be read."""
        out: dict[int, Node] = {}
        todo = [1]
        while todo:
            ino = todo.pop()
            if ino in out:
                continue
            old = self.nodes[ino]
            new = Node(
                ino,
                old.kind,
                old.durable_mode,
                data=bytearray(old.durable_data),
                entries=dict(old.durable_entries),
                mtime_ns=old.mtime_ns,
                durable_data=old.durable_data,
                durable_entries=dict(old.durable_entries),
                durable_mode=old.durable_mode,
            )
            out[ino] = new
            if old.kind == S_DIR:
                todo.extend(old.durable_entries.values())
        return out

    def sync_all(self) -> None:
        """``sync(2)``: everything now is durable."""
        with self.lock:
            self._alive()
            for node in self.nodes.values():
                node.durable_data = bytes(node.data)
                node.durable_entries = dict(node.entries)
                node.durable_mode = node.mode

    def save(self, name: str) -> None:
        with self.lock:
            self.saved[name] = (copy.deepcopy(self.nodes), self.next_ino)

    def load(self, name: str) -> None:
        with self.lock:
            nodes, nxt = self.saved[name]
            self.nodes = copy.deepcopy(nodes)
            self.next_ino = max(self.next_ino, nxt)
            self.dead = False
            self.cut_at = 0
            self.ops = 0
            self.trace = []
            self.tracing = False

    def arm(self, k: int) -> None:
        """Cut after the k-th mutating operation from now (0 disarms)."""
        with self.lock:
            self.ops = 0
            self.cut_at = k

    def start_trace(self) -> None:
        """Record units from now on; the base is what is durable now."""
        with self.lock:
            self.trace = []
            self.trace_base = copy.deepcopy(self._durable_nodes())
            self.tracing = True

    # ----------------------------------------------------------------- ALICE
    def crash_states(
        self,
        *,
        per_point: int = 48,
        seed: int = 0,
        torn: bool = True,
        from_point: int = 0,
        ordered_meta: bool = False,
    ) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """Every distinct crash state the trace allows: ``(point, choice, tree)``.

        ``point`` is how many trace units had been issued; ``tree`` maps each path
        to ``{"type": "dir" | "file" | "link", "data": bytes, "ino": int}``. Where a
        point allows more than ``per_point`` combinations, the smallest, the largest and
        a seeded random sample of the rest are returned. ``ordered_meta``: entry
        changes of all directories persist in issue order and any directory's sync
        covers all before it (a metadata journal: ext4, XFS).
        """
        assert self.trace_base is not None, "start_trace first"
        rng = random.Random(seed)
        trace = list(self.trace)
        seen: set[str] = set()
        for point in range(from_point, len(trace) + 1):
            groups: dict[tuple[str, int], list[int]] = {}
            forced: dict[tuple[str, int], int] = {}
            for i, u in enumerate(trace[:point]):
                key = self._group(u)
                if ordered_meta and key is not None and key[0] == "d":
                    key = ("d", 0)
                if u[0] == "sync":
                    g = ("d", 0 if ordered_meta else u[2]) if u[1] == "d" else ("f", u[2])
                    forced[g] = len(groups.get(g, []))
                elif key is not None:
                    groups.setdefault(key, []).append(i)
            keys = sorted(groups)
            options: list[list[tuple[int, str]]] = []
            for k in keys:
                n, f = len(groups[k]), forced.get(k, 0)
                opts = [(m, "") for m in range(f, n + 1)]
                if torn and k[0] == "f":
                    for m in range(max(f, 0) + 1, n + 1):
                        u = trace[groups[k][m - 1]]
                        if u[0] == "w" and len(u[3]) > 1:
                            opts += [(m, "half"), (m, "zeros")]
                options.append(opts)
            total = 1
            for o in options:
                total *= len(o)
            if total <= per_point:
                combos: Iterator[tuple[tuple[int, str], ...]] = itertools.product(*options)
            else:
                picks = [tuple(o[0] for o in options), tuple(o[-1] for o in options)]
                picks += [tuple(rng.choice(o) for o in options) for _ in range(per_point - 2)]
                combos = iter(picks)
            for combo in combos:
                chosen: set[int] = set()
                tear: dict[int, str] = {}
                for k, (m, how) in zip(keys, combo, strict=True):
                    chosen.update(groups[k][:m])
                    if how:
                        tear[groups[k][m - 1]] = how
                tree = self._materialise(trace[:point], chosen, tear)
                digest = hashlib.sha1(
                    json.dumps(
                        sorted((p, v["type"], v["data"].hex()) for p, v in tree.items())
                    ).encode()
                ).hexdigest()
                if digest in seen:
                    continue
                seen.add(digest)
                desc = ",".join(
                    f"{k[0]}{k[1]}:{m}{how}" for k, (m, how) in zip(keys, combo, strict=True)
                )
                yield point, desc, tree

    @staticmethod
    def _group(u: Unit) -> tuple[str, int] | None:
        if u[0] == "ent":
            return ("d", u[1])
        if u[0] in ("w", "t"):
            return ("f", u[1])
        return None

    def _materialise(
        self, trace: list[Unit], chosen: set[int], tear: dict[int, str]
    ) -> dict[str, dict[str, Any]]:
        assert self.trace_base is not None
        kinds = {i: (n.kind, bytes(n.data)) for i, n in self.trace_base.items()}
        entries = {i: dict(n.entries) for i, n in self.trace_base.items() if n.kind == S_DIR}
        data = {i: bytearray(n.data) for i, n in self.trace_base.items() if n.kind != S_DIR}
        for i, u in enumerate(trace):
            if u[0] == "node":
                kinds[u[1]] = (u[2], u[4])
                if u[2] == S_DIR:
                    entries[u[1]] = {}
                else:
                    data[u[1]] = bytearray(u[4])
                continue
            if i not in chosen:
                continue
            if u[0] == "ent":
                if u[3] is None:
                    entries[u[1]].pop(u[2], None)
                else:
                    entries[u[1]][u[2]] = u[3]
            elif u[0] == "w":
                buf, off, chunk = data[u[1]], u[2], u[3]
                how = tear.get(i)
                if how == "half":
                    chunk = chunk[: len(chunk) // 2]
                elif how == "zeros":
                    chunk = bytes(len(chunk))
                if off > len(buf):
                    buf.extend(bytes(off - len(buf)))
                buf[off : off + len(chunk)] = chunk
            elif u[0] == "t":
                buf = data[u[1]]
                if u[2] < len(buf):
                    del buf[u[2] :]
                else:
                    buf.extend(bytes(u[2] - len(buf)))
        tree: dict[str, dict[str, Any]] = {}
        todo = [("", 1)]
        while todo:
            path, ino = todo.pop()
            for name, child in entries[ino].items():
                p = f"{path}/{name}"
                kind, target = kinds[child]
                if kind == S_DIR:
                    tree[p] = {"type": "dir", "data": b"", "ino": child}
                    todo.append((p, child))
                elif kind == S_LNK:
                    tree[p] = {"type": "link", "data": target, "ino": child}
                else:
                    tree[p] = {"type": "file", "data": bytes(data[child]), "ino": child}
        return tree


def write_tree(tree: dict[str, dict[str, Any]], root: str) -> None:
    """Lay a crash state out in a real directory (hard links stay links)."""
    os.makedirs(root, exist_ok=True)
    first: dict[int, str] = {}
    for path in sorted(tree, key=lambda p: p.count("/")):
        entry = tree[path]
        dest = root + path
        if entry["type"] == "dir":
            os.makedirs(dest, exist_ok=True)
        elif entry["type"] == "link":
            os.symlink(entry["data"], dest)
        elif entry["ino"] in first:
            os.link(first[entry["ino"]], dest)
        else:
            with open(dest, "wb") as f:
                f.write(entry["data"])
            first[entry["ino"]] = dest


# --------------------------------------------------------------------- FUSE layer
def _make_operations(state: PowerState) -> Any:
    import mfusepy

    class PowerFS(mfusepy.Operations):  # type: ignore[misc]
        """Translate FUSE calls into :class:`PowerState` operations (path -> inode)."""

        use_ns = True
        flag_nopath = True
        flag_nullpath_ok = True

        def __init__(self) -> None:
            self.fhs: dict[int, int] = {}
            self.next_fh = 1

        def _fh(self, ino: int) -> int:
            with state.lock:
                fh = self.next_fh
                self.next_fh += 1
                self.fhs[fh] = ino
                return fh

        def _ino(self, path: str | None, fh: int | None) -> int:
            if fh:
                return self.fhs[fh]
            assert path is not None
            return state.lookup_ino(path)

        def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
            return state.getattr(path, self.fhs[fh] if fh else None)

        def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
            return state.listdir(self._ino(path, fh))

        def opendir(self, path: str) -> int:
            return self._fh(state.lookup_ino(path))

        def releasedir(self, path: str | None, fh: int) -> int:
            self.fhs.pop(fh, None)
            return 0

        def open(self, path: str, flags: int) -> int:
            ino = state.lookup_ino(path)
            if flags & os.O_TRUNC:
                state.truncate(ino, 0)
            return self._fh(ino)

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return self._fh(state.create(path, stat.S_IMODE(mode)))

        def release(self, path: str | None, fh: int) -> int:
            self.fhs.pop(fh, None)
            return 0

        def flush(self, path: str | None, fh: int) -> int:
            return 0

        def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
            return state.read(self.fhs[fh], size, offset)

        def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
            return state.write(self.fhs[fh], data, offset)

        def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
            state.truncate(self._ino(path, fh), length)
            return 0

        def fsync(self, path: str | None, datasync: int, fh: int) -> int:
            state.fsync(self.fhs[fh], bool(datasync))
            return 0

        def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
            state.fsync(self._ino(path, fh), False)
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            state.create(path, stat.S_IMODE(mode), S_DIR)
            return 0

        def mknod(self, path: str, mode: int, dev: int) -> int:
            if not stat.S_ISREG(mode):
                raise _err(errno.EPERM)  # FIFOs and devices are not modelled
            state.create(path, stat.S_IMODE(mode))
            return 0

        def unlink(self, path: str) -> int:
            state.unlink(path)
            return 0

        def rmdir(self, path: str) -> int:
            state.unlink(path, is_dir=True)
            return 0

        def rename(self, old: str, new: str) -> int:
            state.rename(old, new)
            return 0

        def link(self, target: str, source: str) -> int:
            state.link(source, target)
            return 0

        def symlink(self, target: str, source: str) -> int:
            state.create(target, 0o777, S_LNK, source.encode("utf-8", "surrogateescape"))
            return 0

        def readlink(self, path: str) -> str:
            return state.readlink(path)

        def chmod(self, path: str | None, mode: int) -> int:
            state.chmod(self._ino(path, None), mode)
            return 0

        def chown(self, path: str | None, uid: int, gid: int) -> int:
            return 0

        def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
            state.utimens(self._ino(path, None), times[1] if times else None)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            return {
                "f_bsize": 4096,
                "f_frsize": 4096,
                "f_blocks": 1 << 20,
                "f_bfree": 1 << 19,
                "f_bavail": 1 << 19,
                "f_files": 1 << 20,
                "f_ffree": 1 << 19,
                "f_favail": 1 << 19,
                "f_namemax": 255,
            }

        def access(self, path: str, amode: int) -> int:
            state.lookup_ino(path)
            return 0

    return PowerFS()


def _control(state: PowerState, fin: Any, fout: Any) -> None:
    """Answer JSON commands from the driving test, one a line."""
    for line in fin:
        req = json.loads(line)
        cmd = req.pop("cmd")
        try:
            out: Any = None
            if cmd == "arm":
                state.arm(int(req["at"]))
            elif cmd == "cut":
                with state.lock:
                    state.cut()
            elif cmd == "restore":
                out = state.restore()
            elif cmd == "sync":
                state.sync_all()
            elif cmd == "save":
                state.save(req["name"])
            elif cmd == "load":
                state.load(req["name"])
            elif cmd == "status":
                out = {"ops": state.ops, "dead": state.dead, "cuts": state.cuts}
            elif cmd == "trace_start":
                state.start_trace()
            elif cmd == "trace_stop":
                with state.lock:
                    state.tracing = False
                out = {"units": len(state.trace)}
            elif cmd == "crash_states":
                out = []
                for n, (point, desc, tree) in enumerate(
                    state.crash_states(
                        per_point=int(req.get("per_point", 48)),
                        seed=int(req.get("seed", 0)),
                        torn=bool(req.get("torn", True)),
                        from_point=int(req.get("from_point", 0)),
                        ordered_meta=bool(req.get("ordered_meta", False)),
                    )
                ):
                    root = os.path.join(req["into"], f"{n:05d}")
                    write_tree(tree, root)
                    out.append({"point": point, "choice": desc, "root": root})
            elif cmd == "trace":
                out = [
                    [
                        u[0],
                        *(
                            base64.b64encode(x).decode() if isinstance(x, bytes) else x
                            for x in u[1:]
                        ),
                    ]
                    for u in state.trace
                ]
            else:
                raise ValueError(f"unknown command {cmd!r}")
            reply = {"ok": True, "result": out}
        except Exception as exc:  # the test sees the failure in its reply
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        fout.write(json.dumps(reply) + "\n")
        fout.flush()


def main(argv: list[str]) -> None:
    import mfusepy

    mountpoint = argv[1]
    state = PowerState()
    control_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # libfuse must not write into the control channel
    threading.Thread(target=_control, args=(state, sys.stdin, control_out), daemon=True).start()
    mfusepy.FUSE(
        _make_operations(state),
        mountpoint,
        foreground=True,
        nothreads=True,
        fsname="powercut",
        subtype="powercut",
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
        direct_io=True,
        hard_remove=True,
        use_ino=True,
        default_permissions=True,
    )


if __name__ == "__main__":
    main(sys.argv)
