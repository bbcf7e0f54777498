"""Run accelerate's own data-loader tests twice, with torch's ``DataLoader`` and with
conveyor's in its place, and print every test whose outcome differs.

    python tools/accelerate_suite.py --from-git ~/src/accelerate   # the pinned copy, once
    python tools/accelerate_suite.py                                # both runs
    python tools/accelerate_suite.py --markdown docs/accelerate-suite.md

accelerate's tests are not ours, so they are never committed: the copy lives at
``.upstream/accelerate/test_data_loader.py`` (git-ignored; or under ``$CONVEYOR_UPSTREAM``).
It is huggingface/accelerate ``tests/test_data_loader.py`` as released with accelerate
1.15.0, checked by its sha256 (:data:`SHA256`); ``--from-git`` takes it from a clone at
:data:`COMMIT`. It needs ``accelerate==1.15.0``, ``parameterized`` and ``pytest-timeout``.

How conveyor takes torch's place, as ``tools/torch_suite.py`` does for torch's own tests:
the conveyor copy of the file starts with lines that make ``torch.utils.data.DataLoader``
conveyor's class before the file imports accelerate, so accelerate's ``DataLoaderShard``,
``DataLoaderDispatcher`` and ``SkipDataLoader`` build conveyor's loader where they build
torch's, and the file's own ``DataLoader(...)`` calls make conveyor's.

A difference conveyor makes on purpose is listed in ``DELIBERATE`` with its reason; any
other difference is printed as unexplained, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import torch_suite as suite  # tools/: the runner and the reading of results are shared

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = Path(os.environ.get("CONVEYOR_UPSTREAM") or ROOT / ".upstream")
SOURCE = UPSTREAM / "accelerate" / "test_data_loader.py"
# The accelerate 1.15.0 release's test file. The release commit itself was not in the
# snapshot of huggingface/accelerate at hand; its main branch at COMMIT (2026-07-24) holds
# this file, unchanged since 26d16dea (2026-06-26), beside an accelerate/data_loader.py
# byte-identical to the 1.15.0 wheel's. The sha256 is what pins it.
COMMIT = "16cb6eb80dd9aa8b4df1a63ef57863e455d53b83"
SHA256 = "25dd1254ec687a348806d3d47b5a1f6d6337dd5c36d0f2e4011af7e2154ec570"
VERSION = "1.15.0"
NEEDS = ("accelerate", "parameterized", "pytest_timeout", "torch")

# Tests whose outcome differs because conveyor behaves differently on purpose.
DELIBERATE: dict[str, str] = {}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.from_git:
        _take_from_git(Path(args.from_git), Path(args.source))
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        print(f"missing: {', '.join(missing)} (pip install them first)", file=sys.stderr)
        return 2
    source = Path(args.source)
    problem = _check_copy(source)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    run_dir = source.parent / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    results = {v: suite._run(v, source, run_dir, args) for v in ("torch", "conveyor")}
    differing = suite._differences(results["torch"], results["conveyor"])
    # The reasons are this tool's own (suite._differences reads torch_suite's table).
    rows = [
        suite.Difference(r.test, r.torch, r.conveyor, DELIBERATE.get(r.test)) for r in differing
    ]
    report = _report(results, rows, args)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")
    return 1 if any(row.reason is None for row in rows) else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=str(SOURCE), help="the local copy of the test file")
    parser.add_argument("--from-git", help="a clone of huggingface/accelerate to take it from")
    parser.add_argument("-k", dest="keyword", default="", help="pytest -k expression")
    parser.add_argument("--timeout", type=int, default=300, help="per test, seconds")
    parser.add_argument("--markdown", help="also write the report to this file")
    parser.add_argument(
        "--only", choices=("torch", "conveyor"), help="run one variant (the other is read back)"
    )
    parser.add_argument(
        "--report", action="store_true", help="run nothing: report the last runs' results"
    )
    return parser.parse_args(argv)


def _take_from_git(clone: Path, source: Path) -> None:
    text = subprocess.run(
        ["git", "-C", str(clone), "show", f"{COMMIT}:tests/test_data_loader.py"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(text)


def _check_copy(source: Path) -> str | None:
    """Why the copy cannot be used (None: it is the pinned file)."""
    where = (
        f"huggingface/accelerate tests/test_data_loader.py as released with {VERSION} "
        f"(sha256 {SHA256}; at commit {COMMIT}, `--from-git CLONE` takes it)"
    )
    if not source.is_file():
        return f"no copy of accelerate's test file at {source}: put {where} there"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    if digest != SHA256:
        return f"{source} is not the pinned file (sha256 {digest}): use {where}"
    return None


def _report(results: dict, rows: list, args: argparse.Namespace) -> str:
    installed = importlib.metadata.version("accelerate")
    import torch

    keyword = f" -k {args.keyword!r}" if args.keyword else ""
    lines = [
        "# accelerate's data-loader tests, run against conveyor",
        "",
        f"`python tools/accelerate_suite.py{keyword}`: huggingface/accelerate "
        f"`tests/test_data_loader.py` of {VERSION} (sha256 `{SHA256[:16]}…`), accelerate "
        f"{installed}, torch {torch.__version__}, Python {sys.version.split()[0]}.",
        "",
        "| run | tests |",
        "|---|---|",
        f"| torch's `DataLoader` | {suite._counts(results['torch'])} |",
        f"| conveyor's `DataLoader` | {suite._counts(results['conveyor'])} |",
        "",
    ]
    skipped = sorted(
        test for test, outcome in results["torch"].items() if outcome.status == "skipped"
    )
    if skipped:
        reasons = sorted({results["torch"][test].message for test in skipped})
        lines += [f"Skipped with both loaders ({len(skipped)}): " + "; ".join(reasons), ""]
    if not rows:
        lines.append("Every test has the same outcome with both loaders.")
        return "\n".join(lines)
    lines += [
        "Tests whose outcome differs (every other test has the same outcome):",
        "",
        "| test | torch | conveyor | why |",
        "|---|---|---|---|",
    ]
    for row in rows:
        why = row.reason or f"unexplained: {row.conveyor.message or row.torch.message}"
        lines.append(
            f"| `{row.test}` | {row.torch.status} | {row.conveyor.status} | "
            f"{why.replace('|', chr(92) + '|')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
