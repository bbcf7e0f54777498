"""No module of conveyor or of its benchmark harness (``benchmarks/``) over 400 lines, no
function over 60 (issues 35 and 41), checked with ``ast``.

A module counts its physical lines; a function (a method, a nested function) counts from
its ``def`` to its last line, ``end_lineno - lineno + 1``, decorators left out. Past
those sizes a module holds more than one concern, or a function more than one step:
split it along a real seam rather than raise the limits.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "conveyor"
BENCHMARKS = ROOT / "benchmarks"  # the harness (conveyor_bench) and the one-off studies
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized(package: Path = PACKAGE) -> list[str]:
    """Each module and function of ``package`` over its limit, with its size."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(package.parent)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where}: module of {lines} lines (at most {MAX_MODULE_LINES})")
        functions = sorted(
            (node.lineno, node.name, (node.end_lineno or node.lineno) - node.lineno + 1)
            for node in ast.walk(ast.parse(text, filename=str(path)))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        )
        found.extend(
            f"{where}:{line}: function {name} of {size} lines (at most {MAX_FUNCTION_LINES})"
            for line, name, size in functions
            if size > MAX_FUNCTION_LINES
        )
    return found


@pytest.mark.parametrize("package", [PACKAGE, BENCHMARKS], ids=["conveyor", "benchmarks"])
def test_no_module_or_function_is_too_long(package: Path) -> None:
    found = oversized(package)
    assert not found, "Too long, split along a seam:\n" + "\n".join(found)


def test_the_check_names_each_offender(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)

    def body(lines: int, indent: str = "    ") -> str:
        return "\n".join(f"{indent}x = {i}" for i in range(lines))

    # At the limits: 400 lines, and a def with 59 lines under it (60).
    (package / "ok.py").write_text("x = 1\n" * 400)
    (package / "sub" / "fine.py").write_text(f"async def fine():\n{body(59)}\n")
    # Over: 401 lines; a decorated function, a method and a nested function of 61.
    (package / "big.py").write_text("x = 1\n" * 401)
    (package / "sub" / "long.py").write_text(
        f"@decorator\ndef long():\n{body(60)}\n\n"
        f"class C:\n    def method(self):\n{body(60, ' ' * 8)}\n\n"
        f"def outer():\n    def inner():\n{body(60, ' ' * 8)}\n"
    )
    assert oversized(package) == [
        "pkg/big.py: module of 401 lines (at most 400)",
        "pkg/sub/long.py:2: function long of 61 lines (at most 60)",
        "pkg/sub/long.py:65: function method of 61 lines (at most 60)",
        "pkg/sub/long.py:127: function outer of 62 lines (at most 60)",
        "pkg/sub/long.py:128: function inner of 61 lines (at most 60)",
    ]
