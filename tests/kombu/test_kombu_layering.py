"""fsbus.kombu is an edge: it reaches fsbus only through its public names.

(The rule of tests/test_layers.py, applied to this module until its EDGE_GROUPS lists it.)
"""

from __future__ import annotations

from tests.test_layers import ROOT, edge_violations, module_name, parse


def test_the_transport_uses_only_the_public_api() -> None:
    path = ROOT / "fsbus" / "kombu.py"
    problems = edge_violations(parse(path), module_name(path), {module_name(path)}, False)
    assert problems == []


def test_the_check_would_catch_a_private_import() -> None:
    import ast

    tree = ast.parse("from fsbus._bus.blocking import BlockingBus\nfrom ._queues import x")
    assert len(edge_violations(tree, "fsbus.kombu", {"fsbus.kombu"}, False)) == 2
