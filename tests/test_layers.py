"""The layering of the package, read from the source with ``ast``.

* the tree is the architecture: the root holds the errors and the config, ``_core/`` what
  every face shares, then one subpackage per face (``_bus/``, ``_stream/``); a package
  imports only the packages below it (``PACKAGE_RULES``), never a face beside or above it;
* no import circle between fsbus modules, counting ``TYPE_CHECKING`` and function-level
  imports;
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
    "_core/topics.py",
    "_core/trie.py",
    "_core/platform.py",
    "_queues/definition.py",
    "_bus/names.py",
    "_bus/layout.py",
    "_bus/scan.py",
    "_bus/stamps.py",
    "_bus/retry.py",
    "_bus/plan.py",
    "_bus/message.py",
    "_stream/framing.py",
    "_stream/config.py",
    "_stream/defaults.py",
    "_errors.py",
    "_env.py",
    "_defaults.py",
    "_settings.py",
    "_config.py",
)

ROOT_MODULES = (
    "fsbus._errors",
    "fsbus._env",
    "fsbus._defaults",
    "fsbus._config",
    "fsbus._settings",
)
# What each private package may import from fsbus, besides its own modules. A package
# not named here is an edge (checked below to use only public names).
PACKAGE_RULES: dict[str, tuple[str, ...]] = {
    "fsbus._errors": (),
    "fsbus._env": (),
    "fsbus._defaults": ("fsbus._env",),
    "fsbus._config": ("fsbus._errors", "fsbus._env", "fsbus._defaults"),
    "fsbus._settings": ("fsbus._defaults", "fsbus._config"),
    "fsbus._core": ROOT_MODULES,
    "fsbus._queues": (*ROOT_MODULES, "fsbus._core"),
    "fsbus._bus": (*ROOT_MODULES, "fsbus._core", "fsbus._queues"),
    "fsbus._stream": (*ROOT_MODULES, "fsbus._core"),
}

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
    # os.environ read for FSBUS_FORCE_POLLING.
    "_env.py": frozenset({"environ"}),
}

# Edge groups: a module may import private modules of its own group only.
EDGE_GROUPS: dict[str, tuple[str, ...]] = {
    "cli": ("fsbus/_cli/**/*.py", "fsbus/__main__.py"),
    "spark": ("fsbus/spark/**/*.py",),
    "pytest": ("fsbus/pytest_plugin.py", "fsbus/testing.py"),
    "demo": ("fsbus/demo.py", "fsbus/demo/**/*.py"),
    "ui": ("fsbus/ui/**/*.py",),
    "amqp": ("fsbus/amqp/**/*.py",),
    "kombu": ("fsbus/kombu.py",),
    "recording": ("fsbus/recording.py",),
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
    return [PACKAGE / name for name in PURE_NAMES]


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
    assert {"topics.py", "trie.py", "_errors.py", "_config.py"} <= names


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
    assert pure_violations(environ, "_env.py", "fsbus._env", PURE_SET) == ["line 3: uses os.remove"]


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


# --- packages: each imports only what lies below it, and nothing imports in a circle -----


def package_of(module: str) -> str:
    """The rule that governs ``module``: its entry in ``PACKAGE_RULES``, or '' for none."""
    for name in sorted(PACKAGE_RULES, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    return ""


def package_violations(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Imports by which a module of a private package reaches a package it may not use."""
    own = package_of(module)
    if not own:
        return []
    allowed = (own, *PACKAGE_RULES[own])
    problems = []
    for imp in imports(tree, module, is_package):
        for target in fsbus_targets(imp):
            if target == "fsbus":
                problems.append(f"line {imp.line}: imports the public facade; import the module")
            elif not any(target == a or target.startswith(a + ".") for a in allowed):
                problems.append(
                    f"line {imp.line}: imports {target}; {own} may import only "
                    f"{', '.join(allowed[1:]) or 'nothing else of fsbus'}"
                )
    return problems


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if package_of(module_name(p)))


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> fsbus modules it imports, at any depth of the file (the facade left out)."""
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        mod = module_name(path)
        targets: set[str] = set()
        for imp in imports(parse(path), mod, path.name == "__init__.py"):
            # ``from pkg import sub`` reaches the submodule; the package only for other names.
            subs = {f"{imp.module}.{n}" for n in imp.names} & known
            if not imp.names or len(subs) < len(imp.names):
                subs.add(imp.module)
            targets |= {t for t in subs if t in known and t != mod}
        graph[mod] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


PACKAGED = package_modules()


def test_every_face_has_a_package() -> None:
    names = {p.relative_to(PACKAGE).parts[0] for p in PACKAGED}
    assert {"_core", "_bus", "_stream", "_errors.py", "_config.py"} <= names
    # the root modules: the errors, the environment, and the configuration (BusConfig,
    # its defaults readable without pydantic, and the options a bus runs with)
    root = {m.rpartition(".")[2] + ".py" for m in ROOT_MODULES}
    loose = sorted(
        p.name for p in PACKAGE.glob("_*.py") if p.name not in {"__init__.py", "__main__.py", *root}
    )
    assert loose == [], f"modules at the package root that belong in a subpackage: {loose}"


@pytest.mark.parametrize("path", PACKAGED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_packages_import_only_what_lies_below(path: Path) -> None:
    problems = package_violations(parse(path), module_name(path), path.name == "__init__.py")
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_no_import_circle() -> None:
    found = circles(import_graph(sorted(PACKAGE.rglob("*.py"))))
    assert found == [], f"modules that import each other in a circle: {found}"


@pytest.mark.parametrize(
    ("source", "module", "found"),
    [
        ("from .._stream.log import Stream", "fsbus._bus.engine", "fsbus._stream.log"),
        ("from .._bus.fs import BusFiles", "fsbus._core.watch", "fsbus._bus.fs"),
        ("from ..engine import Bus", "fsbus._core.trie", "fsbus.engine"),
        ("from .. import Bus", "fsbus._bus.engine", "public facade"),
        ("from .._cli import main", "fsbus._stream.log", "fsbus._cli"),
        ("from ._core.trie import TopicTrie", "fsbus._errors", "fsbus._core.trie"),
        ("def f():\n    from .._bus import names", "fsbus._stream.log", "imports fsbus._bus;"),
    ],
)
def test_package_checker_catches(source: str, module: str, found: str) -> None:
    problems = package_violations(ast.parse(source), module, is_package=False)
    assert any(found in p for p in problems), problems


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from .names import parse_name\nfrom .._core.trie import TopicTrie", "fsbus._bus.scan"),
        ("from .._errors import InvalidTopic\nfrom .._config import BusConfig", "fsbus._core.x"),
        ("from .framing import Record\nfrom .._core.watch import Waker", "fsbus._stream.log"),
    ],
)
def test_package_checker_accepts(source: str, module: str) -> None:
    assert package_violations(ast.parse(source), module, is_package=False) == []


def test_circle_finder() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
