"""Every public name has a docstring, and so does each public method, property and field
of a public class: the API reference (docs/reference/) is generated from them.

The public modules, and what counts as documented, are the docs extension's
(``docs/_ext/conveyor_api.py``), read here without Sphinx: the same rules fail the
site's build (``.ci/docs``), where Sphinx also checks that each name is on a page.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_docs_extension() -> Any:
    path = ROOT / "docs" / "_ext" / "conveyor_api.py"
    spec = importlib.util.spec_from_file_location("_conveyor_docs_api", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and the like look their module up
    spec.loader.exec_module(module)
    return module


api = _load_docs_extension()
# (A name whose optional dependency is missing, accelerate's Accelerator, is left out.)
PUBLIC = [
    (module, name, obj) for module, name, obj in api.public_names() if obj is not api.NOT_FOUND
]


# Classes and functions (a type alias such as conveyor.collate.Allocator is data: its
# description is on its page, docs/reference/).
# Each object once, under its first public name (conveyor.SharedList, not also
# conveyor.shared_list.SharedList).
def _is_class(obj: Any) -> bool:
    """A class, not a type alias: on Python 3.10 ``Callable[[int], X]`` (collate's
    ``Allocator``) passes ``isinstance(obj, type)``, and has no docstring to give."""
    return isinstance(obj, type) and not isinstance(obj, types.GenericAlias)


CALLABLES = sorted(
    {
        id(obj): (f"{module}.{name}", obj)
        for module, name, obj in reversed(PUBLIC)
        if _is_class(obj) or inspect.isroutine(obj)
    }.values()
)
CLASSES = {f"{obj.__module__}.{obj.__qualname__}": obj for _, obj in CALLABLES if _is_class(obj)}


def _members(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties ``cls`` defines itself (not inherited)."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, functools.cached_property):
            value = value.func
        if inspect.isfunction(value) or isinstance(value, property):
            found.append((name, value))
    return found


@pytest.mark.parametrize("name", [name for name, _ in CALLABLES])
def test_every_public_class_and_function_has_a_docstring(name: str):
    obj = dict(CALLABLES)[name]
    assert not api.missing_docstring(obj), f"{name} has no docstring: the reference shows it bare"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_public_member_and_field_of_a_public_class_is_documented(name: str):
    cls = CLASSES[name]
    missing = [member for member, value in _members(cls) if api.missing_docstring(value)]
    missing += [f"{field} (a field)" for field in api.undocumented_fields(cls)]
    assert not missing, (
        f"{name}: no docstring for {', '.join(missing)} (a method or property: a docstring; "
        "a field: a `#:` comment above it, or after it on its line)"
    )


def test_the_public_names_are_those_of_the_public_modules():
    import conveyor

    names = {name for module, name, _ in api.public_names() if module == "conveyor"}
    assert names == set(conveyor.__all__)
    assert {"conveyor.errors", "conveyor.collate", "conveyor.sampling"} <= set(api.PUBLIC_MODULES)


def test_what_counts_as_undocumented():
    """The rules fail for real: no docstring, a dataclass's generated one, a field with a
    plain comment; and pass for each form autodoc reads."""

    @dataclasses.dataclass
    class Generated:
        count: int

    @dataclasses.dataclass
    class Fields:
        """A record."""

        above: int  # a plain comment is not documentation
        #: documented above
        documented_above: int
        trailing: int  #: documented on its line
        after: int
        """documented after it"""

    class Kind(enum.Enum):
        """Kinds."""

        PLAIN = 1
        DOCUMENTED = 2  #: documented

    def bare() -> None:
        pass

    def described() -> None:
        """Does something."""

    assert api.missing_docstring(Generated)
    assert api.missing_docstring(bare)
    assert not api.missing_docstring(described)
    assert not api.missing_docstring(Fields)
    assert api.missing_docstring(property(lambda self: 1))
    assert api.undocumented_fields(Fields) == ["above"]
    assert api.undocumented_fields(Kind) == ["PLAIN"]
