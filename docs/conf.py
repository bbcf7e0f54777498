"""Sphinx configuration: the guide pages (Markdown, through MyST) and the API reference
(autodoc, from the docstrings) as one site.

Build: ``python -m sphinx -W --keep-going -n -b html docs docs/_build/html``
(``pip install -e '.[docs]'``; CI runs ``.ci/docs``). ``-W`` turns every warning into an
error and ``-n`` (nitpicky) makes every cross-reference that does not resolve a warning:
a broken link between pages, a heading anchor that is not there, a name in a signature
or a docstring that the reference does not document. ``_ext/conveyor_api.py`` adds one
more: a public name that the reference leaves out, or that has no docstring.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "_ext"))

project = "conveyor"
author = "the conveyor authors"
copyright = "the conveyor authors"


def _version() -> str:
    import conveyor

    return conveyor.__version__


release = version = _version()

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "myst_parser",
    "conveyor_api",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# --- Markdown (the guide pages) ------------------------------------------------------
# Links such as [troubleshooting](troubleshooting.md#4-keyerror-in-collate) are checked:
# the page must exist and the heading's anchor too (GitHub's anchors, so that the same
# Markdown works when read on GitHub).
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# --- the reference ---------------------------------------------------------------------
autodoc_member_order = "bysource"
# Every public member is shown, documented or not: conveyor_api fails the build on one
# without a docstring rather than leaving it out unsaid.
autodoc_default_options = {"undoc-members": True}
# accelerate (and torch, which it needs) is not installed to build the docs: the module's
# Accelerator subclasses a stand-in for accelerate's.
autodoc_mock_imports = ["accelerate"]
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_inherit_docstrings = False  # a method says what conveyor's does, not torch's
autodoc_preserve_defaults = True  # `reseed="worker"` as written, not a repr
# A long signature (DataLoader's) is set one parameter a line.
python_maximum_signature_line_length = 80
add_module_names = False  # `DataLoader(...)`: the module is in the page's heading
python_use_unqualified_type_names = True
# ``code`` in a docstring is a literal; a cross-reference is written :class:`Name`.
default_role = "literal"
nitpicky = True
# Names outside conveyor: with no network there is no inventory of Python's, torch's or
# NumPy's documentation to link them to, so they stay plain text. conveyor's own names
# are never in this list: one that does not resolve fails the build.
_OUTSIDE = sorted({*sys.stdlib_module_names, "torch", "numpy", "np", "ray", "accelerate", "PIL"})
nitpick_ignore_regex = [(r"py:.*", rf"({'|'.join(_OUTSIDE)})(\..*)?")]

# --- HTML -----------------------------------------------------------------------------
html_theme = "furo"
html_title = f"conveyor {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
# Code is written 100 columns wide (ruff's line length, the error tree in conveyor.errors):
# 12 px rather than furo's 13 fits it in the page's column.
html_theme_options = {"light_css_variables": {"code-font-size": "0.75rem"}}
