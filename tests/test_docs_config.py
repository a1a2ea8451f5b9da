"""The documentation stays in step with the code it describes."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _hook() -> ModuleType:
    path = DOCS / "hooks" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("fsbus_docs_config_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_matches_the_models() -> None:
    hook = _hook()
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert hook.is_current(page), (
        "docs/configuration.md is out of step with the configuration models; "
        "run `.venv/bin/python docs/hooks/config_reference.py` and commit the page"
    )


def test_every_config_field_is_documented() -> None:
    hook = _hook()
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for model in hook.models():
        for name, field in model.model_fields.items():
            assert f"| `{name}` |" in page, f"{model.__name__}.{name} missing from the page"
            assert field.description, f"{model.__name__}.{name} has no description"


def test_a_stale_page_is_detected() -> None:
    hook = _hook()
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    stale = page.replace("| `poll_interval` |", "| `poll_every` |")
    assert not hook.is_current(stale)
    assert hook.is_current(hook.splice(stale, hook.render()))


def _logger_names() -> set[str]:
    """Every literal name passed to logging.getLogger in the package."""
    names = set()
    for path in (ROOT / "fsbus").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names.add(node.args[0].value)
    return names


def test_every_logger_is_documented() -> None:
    page = (DOCS / "logging.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(fsbus(?:\.[a-z_]+)*)`", page))
    missing = {n for n in _logger_names() if n.startswith("fsbus")} - documented
    assert not missing, f"docs/logging.md does not mention the logger(s) {sorted(missing)}"


def test_api_page_covers_every_public_name() -> None:
    import fsbus

    page = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: fsbus\.(\w+)\s*$", page, flags=re.MULTILINE))
    missing = {n for n in fsbus.__all__ if not n.startswith("__")} - documented
    assert not missing, f"add `::: fsbus.<name>` to docs/api.md for {sorted(missing)}"
