"""The public surface of ``fsbus``: exactly the intended names, each documented.

Adding or removing an export is a deliberate act: update ``EXPECTED`` in the same
commit as ``fsbus/__init__.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path

import pytest

import fsbus

EXPECTED = frozenset(
    {
        # bus
        "Bus",
        "BlockingBus",
        "BlockingMessages",
        "BusConfig",
        "BusStatistics",
        "Decline",
        "Handler",
        "Requeue",
        "Message",
        "MessageInfo",
        "MessageIterator",
        "PublishInfo",
        "PurgeReport",
        "Subscription",
        "TopicTrie",
        # streams
        "AsyncConsumerGroup",
        "AsyncStream",
        "ColumnBatch",
        "CompactionReport",
        "ConsumerGroup",
        "GroupInfo",
        "QueueEmpty",
        "QueueError",
        "QueueFull",
        "QueueInfo",
        "QueueMismatch",
        "QueueNotFound",
        "QueueOptions",
        "Record",
        "RecordIn",
        "RecoveryInfo",
        "RetentionReport",
        "SegmentInfo",
        "SegmentStager",
        "StagedSegment",
        "Stream",
        "StreamConfig",
        "StreamInfo",
        "StreamQueue",
        "list_streams",
        "read_staged_columns",
        # doctor
        "DoctorCheck",
        "DoctorReport",
        "check_directory",
        "probe_locking",
        # errors
        "ClosedError",
        "CorruptDataError",
        "DiskFull",
        "FsBusError",
        "InvalidConfig",
        "InvalidHeader",
        "InvalidPattern",
        "InvalidTopic",
        "LockingUnsupported",
        "OffsetOutOfRange",
        "PayloadTooLarge",
        "StorageError",
        "StoragePermissionError",
        "StreamError",
        "StreamNotFound",
        "UsageError",
        "WouldBlock",
        # metadata
        "__version__",
    }
)

DOCUMENTED = sorted(EXPECTED - {"__version__"})


def test_all_is_a_sorted_tuple_without_duplicates() -> None:
    assert isinstance(fsbus.__all__, tuple)
    assert len(set(fsbus.__all__)) == len(fsbus.__all__)
    assert list(fsbus.__all__) == sorted(fsbus.__all__)


def test_all_is_exactly_the_intended_set() -> None:
    exported = set(fsbus.__all__)
    assert exported - EXPECTED == set(), "exported but not intended"
    assert EXPECTED - exported == set(), "intended but not exported"


def test_every_exported_name_exists() -> None:
    for name in fsbus.__all__:
        assert hasattr(fsbus, name), name


def test_no_private_module_leaks_as_a_public_name() -> None:
    public = {n for n in vars(fsbus) if not n.startswith("_")}
    # Submodules are attributes once imported; they are not part of __all__.
    modules = {n for n in public if inspect.ismodule(getattr(fsbus, n))}
    stray = public - set(fsbus.__all__) - modules - {"annotations"}
    assert stray == set(), f"public names not in __all__: {sorted(stray)}"


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_exported_name_has_a_docstring(name: str) -> None:
    obj = getattr(fsbus, name)
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")  # its own, not inherited
    else:
        doc = getattr(obj, "__doc__", None)
    assert doc, f"fsbus.{name} has no docstring"
    assert doc.strip(), f"fsbus.{name} has an empty docstring"


@pytest.mark.parametrize(
    "name", [n for n in DOCUMENTED if dataclasses.is_dataclass(getattr(fsbus, n))]
)
def test_exported_dataclasses_are_frozen_with_a_docstring_per_field(name: str) -> None:
    cls = getattr(fsbus, name)
    assert cls.__dataclass_params__.frozen, f"{name} is not frozen"
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = set()
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            documented.add(node.target.id)
    fields = {f.name for f in dataclasses.fields(cls)}
    assert fields - documented == set(), f"{name}: fields without a docstring"


@pytest.mark.parametrize(
    "name", ["Bus", "BlockingBus", "MessageIterator", "BlockingMessages", "TopicTrie"]
)
def test_public_methods_of_the_bus_faces_are_documented(name: str) -> None:
    cls = getattr(fsbus, name)
    for attr, value in vars(cls).items():
        if attr.startswith("_") or not callable(value):
            continue
        assert inspect.getdoc(value), f"{name}.{attr} has no docstring"


def test_error_tree() -> None:
    usage = (
        fsbus.InvalidTopic,
        fsbus.InvalidPattern,
        fsbus.InvalidHeader,
        fsbus.InvalidConfig,
        fsbus.PayloadTooLarge,
    )
    for cls in usage:
        assert issubclass(cls, fsbus.UsageError)
    assert issubclass(fsbus.UsageError, ValueError)
    for cls in (fsbus.DiskFull, fsbus.StoragePermissionError, fsbus.LockingUnsupported):
        assert issubclass(cls, fsbus.StorageError)
    assert not issubclass(fsbus.StorageError, OSError)
    for cls in (fsbus.StreamNotFound, fsbus.OffsetOutOfRange):
        assert issubclass(cls, fsbus.StreamError)
    # Decline and Requeue are raised by a handler to tell the bus something, not errors
    # it reports.
    told = (fsbus.Decline, fsbus.Requeue)
    assert not any(issubclass(cls, fsbus.FsBusError) for cls in told)
    for name in DOCUMENTED:
        obj = getattr(fsbus, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj not in told:
            assert issubclass(obj, fsbus.FsBusError), f"{name} is outside the error tree"


def test_version_matches_the_package_metadata() -> None:
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    match = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)
    assert match is not None
    assert fsbus.__version__ == match.group(1)


def test_topic_trie_is_the_matcher_the_bus_uses() -> None:
    trie: fsbus.TopicTrie[str] = fsbus.TopicTrie()
    trie.add("orders.*", "audit")
    trie.add("orders.#", "archive")
    assert trie.match("orders.created") == ["audit", "archive"]
    assert trie.match_set("orders") == {"archive"}
    assert trie.remove("orders.#") == 1
    with pytest.raises(fsbus.InvalidPattern):
        trie.add("orders\nnew", "bad")  # control characters are refused
