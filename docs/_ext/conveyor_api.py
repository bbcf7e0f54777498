"""conveyor's Sphinx extension: the reference covers every public name, each documented.

conveyor's public names are the ``__all__`` of the modules in :data:`PUBLIC_MODULES`.
autodoc on its own documents what it is pointed at and skips a member with no docstring
without a word. Here each public name must be on some page of the reference (under any
of its import paths), and each object autodoc shows there — a class, a function, a
method, a property, a record's field, an enum member — must have a docstring (a
dataclass's generated ``Name(field: type, ...)`` is none). Each miss is a warning, which
``-W`` turns into an error.

And for the reader: inline code that names one documented object links to it on every
page (the guide's ``WorkerCrashedError``); "Bases:" shows public classes only; an
exception shows no constructor signature; the guide's link to ``../README.md`` leads to
the front page; a name that is real but on no page (a type variable, the ``Tracer`` that
``loader.trace()`` yields) stays text, while a typo still fails the build.

This module imports nothing from Sphinx at the top: ``tests/unit/test_docstrings.py`` reads
:data:`PUBLIC_MODULES`, :func:`missing_docstring` and :func:`undocumented_fields` from it
without Sphinx installed.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import re
import sys
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

# The modules a user imports from. Each name in their __all__ is in the reference.
PUBLIC_MODULES = (
    "conveyor",
    "conveyor.loader",
    "conveyor.dataset",
    "conveyor.worker_info",
    "conveyor.sampling",
    "conveyor.distributed",
    "conveyor.collate",
    "conveyor.errors",
    "conveyor.records",
    "conveyor.resources",
    "conveyor.shared_list",
    "conveyor.stateful",
    "conveyor.integrations.accelerate",
)


NOT_FOUND = object()  # public_names()'s object for a name it cannot import


def public_names() -> Iterator[tuple[str, str, Any]]:
    """(module, name, object) for each name in the public modules' ``__all__``; the object
    is :data:`NOT_FOUND` where an optional dependency is missing (``Accelerator``
    without accelerate)."""
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            yield module_name, name, getattr(module, name, NOT_FOUND)


def missing_docstring(obj: Any) -> bool:
    """True when ``obj`` (a class, function, method or property) has no docstring of its
    own: none, a blank one, or the signature a dataclass writes in its place."""
    doc = obj.__doc__ if isinstance(obj, (type, property)) or callable(obj) else None
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__")  # not inherited from a base class
        if dataclasses.is_dataclass(obj) and doc is not None:
            generated = obj.__name__ + str(inspect.signature(obj)).replace(" -> None", "")
            if doc == generated:
                return True
    return not (doc or "").strip()


def _class_source(cls: type) -> list[str] | None:
    """The lines of ``cls``'s own ``class`` statement. inspect looks for a class in the
    file of its ``__module__``: one whose ``__module__`` names the public module that
    re-exports it (``conveyor.errors.Culprit``, defined in ``_task/context.py``) is
    looked for in the wrong file, and Python 3.13 then reads from its ``__firstlineno__``
    there. Then the one ``class`` statement of that name in the package is it."""
    try:
        lines, _ = inspect.getsourcelines(cls)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        first = tree.body[0] if tree.body else None
        if isinstance(first, ast.ClassDef) and first.name == cls.__name__:
            return lines
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        pass
    package = Path(sys.modules[cls.__module__.partition(".")[0]].__file__ or "").parent
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found.append(text.splitlines(keepends=True)[start - 1 : node.end_lineno])
    return found[0] if len(found) == 1 else None


def undocumented_fields(cls: type) -> list[str]:
    """The fields of ``cls`` (a dataclass's, or annotated class attributes) with no
    documentation in the form autodoc reads: a ``#:`` comment on the lines above or
    after the field on its line, or a string right after it."""
    lines = _class_source(cls)
    if lines is None:
        return []
    tree = ast.parse(textwrap.dedent("".join(lines)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    missing = []
    members = isinstance(cls, enum.EnumMeta)  # an enum's members are fields too
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
        elif members and isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
        else:
            continue
        if name.startswith("_"):
            continue
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            continue  # a string after the field
        line = lines[stmt.lineno - 1]
        if "#:" in line:
            continue
        above = stmt.lineno - 2
        comments = []
        while above >= 0 and lines[above].strip().startswith("#"):
            comments.insert(0, lines[above].strip())
            above -= 1
        if comments and all(c.startswith("#:") for c in comments):
            continue
        missing.append(name)
    return missing


def _documented_as(name: str, obj: Any) -> set[str]:
    """The names under which autodoc documenting ``obj`` as ``name`` makes it findable."""
    names = {name}
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        names.add(f"{module}.{qualname}")
    return names


def setup(app: Any) -> dict[str, Any]:
    from sphinx.util import logging

    logger = logging.getLogger(__name__)

    def on_docstring(
        app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
    ) -> None:
        if what == "module":
            return
        if what in ("class", "exception"):
            for field in undocumented_fields(obj):
                logger.warning(
                    "field %s.%s has no docstring: a `#:` comment above it, or after it on "
                    "its line, says what it holds",
                    name,
                    field,
                    type="conveyor",
                    subtype="docstring",
                )
        if (what == "class" and missing_docstring(obj)) or not any(line.strip() for line in lines):
            logger.warning(
                "%s %s has no docstring: say what it is for (a field or constant: a `#:` "
                "comment above it or after it on its line)",
                what,
                name,
                type="conveyor",
                subtype="docstring",
            )

    def on_finished(app: Any, exception: Exception | None) -> None:
        if exception is not None:
            return
        # Every object a page describes, autodoc's or written by hand (``py:data``), under
        # its name and the canonical name autodoc adds (conveyor.DataLoader is also
        # conveyor.loader.DataLoader).
        documented = set(app.env.domains["py"].objects)
        # A function has no canonical name: conveyor.get_worker_info is the same object
        # as conveyor.worker_info.get_worker_info.
        same = {id(obj) for obj in map(_find, documented) if callable(obj)}
        left_out = [
            f"{module_name}.{name}"
            for module_name, name, obj in public_names()
            if obj is NOT_FOUND
            or (
                not _documented_as(f"{module_name}.{name}", obj) & documented
                and not (callable(obj) and id(obj) in same)
            )
        ]
        for here in sorted(left_out):
            logger.warning(
                "public name %s is in no page of the reference (docs/reference/)",
                here,
                type="conveyor",
                subtype="coverage",
            )

    app.connect("builder-inited", _import_public_modules)
    app.connect("autodoc-process-docstring", on_docstring)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-process-signature", _no_exception_signature)
    app.connect("missing-reference", _unlinked_but_real)
    app.connect("build-finished", on_finished)
    app.add_post_transform(_repository_links())
    app.add_post_transform(_code_links())
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


def _import_public_modules(app: Any) -> None:
    """Import the public modules once, with autodoc's stand-ins for what is not installed
    (accelerate): an incremental build that reads no page of theirs, and this extension's
    own lookups, then find them as autodoc does."""
    from sphinx.ext.autodoc.mock import mock

    with mock(app.config.autodoc_mock_imports):
        for module_name in PUBLIC_MODULES:
            importlib.import_module(module_name)


def _public_bases(app: Any, name: str, obj: Any, options: Any, bases: list[Any]) -> None:
    """Only public classes after "Bases:": a private base (``_NamesWorker``, a class of a
    private module) gives way to its own bases, and ``Generic[T]`` and ``object`` go."""
    shown: list[Any] = []
    todo = list(bases)
    while todo:
        base = todo.pop(0)
        if base is object or getattr(base, "__origin__", None) is Generic:
            continue
        if isinstance(base, type) and _private(base):
            todo[:0] = base.__dict__.get("__orig_bases__", base.__bases__)
            continue
        if base not in shown:
            shown.append(base)
    bases[:] = shown or [object]  # (autodoc writes "Bases:" even for an empty list)


def _no_exception_signature(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: Any, ret: Any
) -> tuple[str, Any] | None:
    """A user catches conveyor's exceptions and reads their attributes, never builds one:
    the constructor's ``message, *, worker_id=None, ...`` is not theirs to read."""
    return ("", ret) if what == "exception" and signature else None


def _private(cls: type) -> bool:
    module = cls.__module__
    return module.startswith("conveyor") and any(
        part.startswith("_") for part in (*module.split("."), cls.__qualname__)
    )


def _unlinked_but_real(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """A name that is no broken reference, though no page documents it, stays text: a
    type variable (``T``), or a conveyor object outside the public modules (the
    ``Tracer`` that ``loader.trace()`` yields). A typo still fails."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    context = [node.get("py:module"), node.get("py:class")]
    prefixes = [""]
    if context[0]:
        prefixes.append(context[0] + ".")
        if context[1]:
            prefixes.append(f"{context[0]}.{context[1]}.")
    for prefix in prefixes:
        obj = _find(prefix + target)
        if obj is NOT_FOUND:
            continue
        if isinstance(obj, TypeVar):
            return contnode
        module = getattr(obj, "__module__", None)
        if isinstance(module, str) and module.startswith("conveyor"):
            return contnode
    return None


def _find(dotted: str) -> Any:
    """The object a dotted name names, importing its module; NOT_FOUND if none."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, NOT_FOUND)
            if obj is NOT_FOUND:
                return obj
        return obj
    return NOT_FOUND


def _repository_links() -> type:
    from sphinx.transforms.post_transforms import SphinxPostTransform

    class RepositoryLinks(SphinxPostTransform):
        """A Markdown link from a page to a file of the repository outside docs/ (the
        guide's ``../README.md``): the site's front page stands for the README; any
        other file is named in plain text, as the site has no copy of it. A link to a
        file that does not exist is left for MyST to report."""

        default_priority = 8  # before MyST resolves its links (9)

        def run(self, **kwargs: Any) -> None:
            from sphinx import addnodes

            srcdir = Path(self.env.srcdir)
            for node in list(self.document.findall(addnodes.pending_xref)):
                if node.get("reftype") != "myst" or node.get("refdomain") != "doc":
                    continue
                target = node["reftarget"]
                if target in self.env.all_docs:
                    continue
                path = Path(target + ".md")
                if not path.is_absolute() or not path.is_file() or srcdir in path.parents:
                    continue
                if path == srcdir.parent / "README.md":
                    node["reftarget"] = self.config.root_doc
                else:
                    node.replace_self(node[0].deepcopy())

    return RepositoryLinks


# ``WorkerCrashedError``, ``conveyor.check(loader)``, ``loader.state_dict()``: code that
# names one documented object. A name alone must be a class's (``dataset`` stays text); a
# call, a function's or a method's whose name is more than one plain word
# (``get_worker_info()``); a dotted name anything's. ``loader.`` is how the pages write a
# DataLoader.
_NAMED = re.compile(r"(?P<name>[A-Za-z_][\w.]*)(?P<call>\(.*\))?")
_CLASSES = frozenset({"class", "exception"})
_CALLABLES = _CLASSES | {"function", "method"}


def _code_links() -> type:
    from docutils import nodes
    from sphinx.transforms.post_transforms import SphinxPostTransform
    from sphinx.util.nodes import make_refnode

    class CodeLinks(SphinxPostTransform):
        """Inline code that names exactly one documented object links to it, on every
        page: the guide's ``WorkerCrashedError`` leads to its reference."""

        default_priority = 5

        def run(self, **kwargs: Any) -> None:
            objects = self.env.domains["py"].objects
            docname = self.env.current_document.docname
            for node in list(self.document.findall(nodes.literal)):
                if _inside_reference(node, nodes):
                    continue
                entry = _one_object(objects, node.astext())
                if entry is None:
                    continue
                link = make_refnode(
                    self.app.builder, docname, entry.docname, entry.node_id, node.deepcopy()
                )
                node.replace_self(link)

    return CodeLinks


def _inside_reference(node: Any, nodes: Any) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, (nodes.reference, nodes.title, nodes.literal_block)):
            return True
        if parent.tagname in ("pending_xref", "desc_signature"):
            return True
        parent = parent.parent
    return False


def _one_object(objects: dict[str, Any], text: str) -> Any:
    """The one documented object ``text`` names, or None (none, or several)."""
    match = _NAMED.fullmatch(text.strip())
    if match is None:
        return None
    name, call = match["name"], match["call"]
    if name.startswith("loader."):
        name = "DataLoader" + name[len("loader") :]
    if "." in name:
        kinds = None
    elif call is not None and (name[:1].isupper() or "_" in name.strip("_")):
        kinds = _CALLABLES  # not close() or prepare(): a plain word is too common a name
    elif name[:1].isupper() and not name.isupper():
        kinds = _CLASSES
    else:
        return None
    found = {
        (entry.docname, entry.node_id): entry
        for full, entry in objects.items()
        if (full == name or full.endswith("." + name))
        and (kinds is None or entry.objtype in kinds)
        and not entry.aliased
    }
    return next(iter(found.values())) if len(found) == 1 else None
