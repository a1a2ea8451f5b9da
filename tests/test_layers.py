"""The layering of the package, read from the source with ``ast``.

* pure modules (topic rules and trie, name codec, layout, scan decisions, publish
  plan, message objects, errors, config, stream framing) do no I/O: they import no
  filesystem, clock or async module, call no ``open``, and import only other pure
  modules of fsbus;
* edges (CLI, Spark connector, pytest plugin and helpers, demo, bench/, stress/)
  reach fsbus only through its public names, never through a private module of
  another layer.

Modules that do not exist yet are skipped, so the test holds while the package grows.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fsbus"

PURE_NAMES = (
    "_topics.py",
    "_trie.py",
    "_names.py",
    "_layout.py",
    "_scan.py",
    "_retry.py",
    "_plan.py",
    "_message.py",
    "_errors.py",
    "_config.py",
)
PURE_PREFIXES = ("_stream_format",)

# Standard and third-party modules that mean I/O, a clock or an event loop.
FORBIDDEN_IN_PURE = frozenset(
    {
        "os",
        "fcntl",
        "shutil",
        "pathlib",
        "anyio",
        "watchdog",
        "time",
        "asyncio",
        "subprocess",
        "socket",
        "tempfile",
        "glob",
        "mmap",
        "select",
        "selectors",
        "signal",
        "trio",
        "sniffio",
    }
)

# The only uses of ``os`` a pure module may make: no I/O, just these attributes.
OS_ALLOWED: dict[str, frozenset[str]] = {
    # os.fspath to store a path as str; os.PathLike in annotations.
    "_errors.py": frozenset({"fspath", "PathLike"}),
    # os.environ read once for FSBUS_FORCE_POLLING.
    "_config.py": frozenset({"environ"}),
}

# Edge groups: a module may import private modules of its own group only.
EDGE_GROUPS: dict[str, tuple[str, ...]] = {
    "cli": ("fsbus/_cli*.py", "fsbus/__main__.py"),
    "spark": ("fsbus/spark/**/*.py",),
    "pytest": ("fsbus/pytest_plugin.py", "fsbus/testing.py"),
    "demo": ("fsbus/demo.py", "fsbus/demo/**/*.py"),
    "ui": ("fsbus/ui/**/*.py",),
    "bench": ("bench/**/*.py",),
    "stress": ("stress/**/*.py",),
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to an absolute module name."""

    module: str
    """Absolute dotted name of the imported module (or the package a name comes from)."""
    names: tuple[str, ...]
    """Names taken from it by ``from ... import``; empty for ``import x``."""
    line: int
    """Line of the statement."""


def module_name(path: Path) -> str:
    """Dotted module name of a file under the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(tree: ast.AST, module: str, is_package: bool = False) -> Iterator[Import]:
    """Every import in ``tree`` (at any depth), relative ones resolved against ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield Import(target, tuple(a.name for a in node.names), node.lineno)


def fsbus_targets(imp: Import) -> list[str]:
    """The fsbus modules an import reaches (``from fsbus import _x`` reaches ``fsbus._x``)."""
    if imp.module != "fsbus" and not imp.module.startswith("fsbus."):
        return []
    out = [imp.module]
    for name in imp.names:
        if name.startswith("_") and not name.startswith("__"):
            out.append(f"{imp.module}.{name}")
    return out


def is_public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


def pure_violations(tree: ast.AST, filename: str, module: str, pure: set[str]) -> list[str]:
    """What makes a would-be pure module impure."""
    allowed_os = OS_ALLOWED.get(filename, frozenset())
    problems = []
    for imp in imports(tree, module):
        top = imp.module.split(".")[0]
        if imp.module == "os" and not imp.names and allowed_os:
            continue  # attribute uses are checked below
        if imp.module == "os" and imp.names and set(imp.names) <= allowed_os:
            continue
        if top in FORBIDDEN_IN_PURE:
            problems.append(f"line {imp.line}: imports {imp.module} {list(imp.names) or ''}")
        for target in fsbus_targets(imp):
            if target != "fsbus" and target not in pure:
                problems.append(f"line {imp.line}: imports {target}, which is not a pure module")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr not in allowed_os
        ):
            problems.append(f"line {node.lineno}: uses os.{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"open", "__import__"}
        ):
            problems.append(f"line {node.lineno}: calls {node.func.id}()")
    return problems


def edge_violations(tree: ast.AST, module: str, own: set[str], is_package: bool) -> list[str]:
    """Imports by which an edge module reaches past the public fsbus API."""
    problems = []
    for imp in imports(tree, module, is_package):
        for target in fsbus_targets(imp):
            if not is_public(target) and target not in own:
                problems.append(
                    f"line {imp.line}: imports {target}; use the public package "
                    f"(`from fsbus import ...`) instead"
                )
    return problems


def pure_files() -> list[Path]:
    files = [PACKAGE / name for name in PURE_NAMES]
    for prefix in PURE_PREFIXES:
        files += sorted(PACKAGE.glob(f"{prefix}*.py"))
    return [f for f in files if f.exists()]


def edge_files() -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = {}
    for group, globs in EDGE_GROUPS.items():
        found = sorted({p for g in globs for p in ROOT.glob(g) if "node_modules" not in p.parts})
        if found:
            groups[group] = found
    return groups


def parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text("utf-8"), filename=str(path))


PURE = pure_files()
EDGES = [(group, path) for group, paths in edge_files().items() for path in paths]


def test_the_pure_layer_is_found() -> None:
    names = {p.name for p in PURE}
    assert {"_topics.py", "_trie.py", "_errors.py", "_config.py"} <= names


@pytest.mark.parametrize("path", PURE, ids=lambda p: p.name)
def test_pure_modules_do_no_io(path: Path) -> None:
    pure = {module_name(p) for p in PURE}
    problems = pure_violations(parse(path), path.name, module_name(path), pure)
    assert not problems, f"{path.relative_to(ROOT)} must stay pure:\n" + "\n".join(problems)


@pytest.mark.parametrize(("group", "path"), EDGES, ids=[str(p.relative_to(ROOT)) for _, p in EDGES])
def test_edges_use_only_the_public_api(group: str, path: Path) -> None:
    own = {module_name(p) for p in edge_files()[group]}
    problems = edge_violations(
        parse(path), module_name(path), own, is_package=path.name == "__init__.py"
    )
    assert not problems, f"{path.relative_to(ROOT)} is an edge ({group}):\n" + "\n".join(problems)


# --- the checker itself catches what it should -----------------------------------------


PURE_SET = {"fsbus._topics", "fsbus._errors", "fsbus._names"}


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import os\nos.listdir('.')", "uses os.listdir"),
        ("from os import listdir", "imports os"),
        ("import os.path", "imports os.path"),
        ("import time", "imports time"),
        ("from pathlib import Path", "imports pathlib"),
        ("import anyio.abc", "imports anyio.abc"),
        ("from watchdog.observers import Observer", "imports watchdog.observers"),
        ("import fcntl", "imports fcntl"),
        ("def f():\n    import asyncio", "imports asyncio"),
        ("with open('x') as f: pass", "calls open()"),
        ("from ._fs import BusFiles", "fsbus._fs, which is not a pure module"),
        ("from . import _fs", "fsbus._fs, which is not a pure module"),
        ("import fsbus._bus", "fsbus._bus, which is not a pure module"),
    ],
)
def test_pure_checker_catches(source: str, found: str) -> None:
    problems = pure_violations(ast.parse(source), "_topics.py", "fsbus._topics", PURE_SET)
    assert any(found in p for p in problems), problems


@pytest.mark.parametrize(
    "source",
    [
        "from ._errors import InvalidTopic\nfrom ._names import parse_name",
        "import re\nfrom typing import Final\nimport xxhash",
    ],
)
def test_pure_checker_accepts(source: str) -> None:
    assert pure_violations(ast.parse(source), "_topics.py", "fsbus._topics", PURE_SET) == []


def test_os_allowance_is_per_module_and_per_attribute() -> None:
    fspath = ast.parse("import os\nos.fspath(p)\nx: os.PathLike[str]")
    assert pure_violations(fspath, "_errors.py", "fsbus._errors", PURE_SET) == []
    assert pure_violations(fspath, "_names.py", "fsbus._names", PURE_SET)
    environ = ast.parse("import os\nos.environ.get('X')\nos.remove('f')")
    assert pure_violations(environ, "_config.py", "fsbus._config", PURE_SET) == [
        "line 3: uses os.remove"
    ]


@pytest.mark.parametrize(
    ("source", "module", "ok"),
    [
        ("import fsbus", "fsbus._cli", True),
        ("from fsbus import Bus, BusConfig, __version__", "fsbus._cli", True),
        ("from . import Bus", "fsbus._cli", True),
        ("from ._cli_format import table", "fsbus._cli", True),
        ("from fsbus.testing import collect", "fsbus.pytest_plugin", True),
        ("from ._bus import Bus", "fsbus._cli", False),
        ("from fsbus._trie import TopicTrie", "bench.trie", False),
        ("from fsbus import _bus", "fsbus._cli", False),
        ("import fsbus._fs", "fsbus._cli", False),
        ("from .._bus import Bus", "fsbus.spark.reader", False),
        ("from .. import Bus", "fsbus.spark.reader", True),
        ("from ._offsets import parse", "fsbus.spark.reader", True),
    ],
)
def test_edge_checker(source: str, module: str, ok: bool) -> None:
    own = {"fsbus._cli", "fsbus._cli_format", "fsbus.spark.reader", "fsbus.spark._offsets"}
    problems = edge_violations(ast.parse(source), module, own, is_package=False)
    assert (problems == []) is ok, problems
