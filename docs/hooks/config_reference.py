"""Render the configuration reference from the pydantic models.

``docs/configuration.md`` holds the generated tables between two markers so the
page reads well in the repository too. Three ways in:

* ``python docs/hooks/config_reference.py`` rewrites the tables in the page;
* as an mkdocs hook (``mkdocs.yml``: ``hooks:``) it renders fresh tables into the
  site and warns, which fails ``mkdocs build --strict``, when the page is stale;
* ``tests/test_docs_config.py`` fails when the page is out of step with the code.
"""

from __future__ import annotations

import enum
import logging
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

PAGE = Path(__file__).resolve().parent.parent / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: configuration reference (docs/hooks/config_reference.py) -->"
END = "<!-- END GENERATED: configuration reference -->"

# Fields whose default comes from a factory: say where it comes from.
_FACTORY_DEFAULTS = {
    "force_polling": "`False`, or `True` when the environment sets `FSBUS_FORCE_POLLING=1`",
}

log = logging.getLogger("mkdocs.plugins.fsbus.config_reference")


def models() -> list[type[BaseModel]]:
    """The configuration models documented, in page order (those the package exports)."""
    import fsbus

    found: list[type[BaseModel]] = []
    for name in ("BusConfig", "StreamConfig"):
        model = getattr(fsbus, name, None)
        if isinstance(model, type) and issubclass(model, BaseModel):
            found.append(model)
    return found


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "None"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


def _default(name: str, field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _FACTORY_DEFAULTS.get(name, "computed")
    if field.default is PydanticUndefined:
        return "required"
    value = field.default
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`{_in_units(value)}"


def _in_units(value: object) -> str:
    """ " (64 MiB)" for a whole number of MiB, GiB or TiB; else nothing."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20:
        for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
            if value % size == 0:
                return f" ({value // size} {unit})"
    return ""


_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"))


def _limits(field: FieldInfo) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sign in _BOUNDS:
            bound = getattr(meta, attr, None)
            if bound is not None:
                shown = oct(bound) if bound == 0o7777 else repr(bound) + _in_units(bound)
                parts.append(f"{sign} {shown}")
    return ", ".join(parts) if parts else "—"


def _cell(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|").replace("\n", " ")


def render_model(model: type[BaseModel]) -> str:
    """One markdown section: a heading and a table of every field."""
    doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    doc = re.sub(r":class:`~?([\w.]+)`", r"`\1`", doc)
    lines = [
        f"### `{model.__name__}`",
        "",
        doc,
        "",
        "| option | type | default | limits | description |",
        "|---|---|---|---|---|",
    ]
    for name, field in model.model_fields.items():
        lines.append(
            "| "
            + " | ".join(
                [
                    f"`{name}`",
                    _cell(f"`{_type_name(field.annotation)}`"),
                    _cell(_default(name, field)),
                    _cell(_limits(field)),
                    _cell(field.description or ""),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def render() -> str:
    """Every configuration model's section, between the markers."""
    body = "\n\n".join(render_model(m) for m in models())
    return f"{BEGIN}\n\n{body}\n\n{END}"


_BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)


def splice(page: str, block: str) -> str:
    """``page`` with its generated block replaced by ``block``."""
    if not _BLOCK.search(page):
        raise ValueError(f"{PAGE.name} lacks the markers {BEGIN!r} ... {END!r}")
    return _BLOCK.sub(lambda _: block, page, count=1)


def is_current(page: str) -> bool:
    """Whether the page's generated block matches the code."""
    return splice(page, render()) == page


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """mkdocs hook: render fresh tables, warn when the committed page is stale."""
    if page.file.src_uri != PAGE.name:
        return markdown
    fresh = splice(markdown, render())
    if fresh != markdown:
        log.warning(
            "%s is out of step with the configuration models; "
            "run `python docs/hooks/config_reference.py` and commit it",
            PAGE.name,
        )
    return fresh


def main() -> int:
    text = PAGE.read_text(encoding="utf-8")
    fresh = splice(text, render())
    if fresh == text:
        print(f"{PAGE} is up to date")
    else:
        PAGE.write_text(fresh, encoding="utf-8")
        print(f"rewrote the configuration reference in {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
