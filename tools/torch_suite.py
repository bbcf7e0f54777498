"""Run torch's own DataLoader test file twice, as torch and with conveyor in torch's place,
and print every test whose outcome differs.

    python tools/torch_suite.py                       # the whole file, both runs
    python tools/torch_suite.py -k "TestDataLoader and not Persistent"
    python tools/torch_suite.py --markdown docs/torch-suite.md

The test file is torch's, not ours, so it is never committed: keep a local copy at
``.upstream/torch/test_dataloader.py`` (git-ignored). The version to use is
pytorch/pytorch ``test/test_dataloader.py`` at commit
74436f9025609987bbc69c617564f98635b67807. It needs ``expecttest``, ``hypothesis`` and
``pytest-timeout`` installed.

How conveyor is put in torch's place: each run gets its own copy of the file in
``.upstream/torch/run/``; the conveyor copy starts with a few lines that make
``torch.utils.data.DataLoader`` conveyor's class before the file's own imports run.
Spawned test processes import the same copy, so they see the same substitution.

A difference that conveyor makes on purpose is listed in ``DELIBERATE`` with its reason;
any other difference is printed as unexplained, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / ".upstream" / "torch" / "test_dataloader.py"
COMMIT = "74436f9025609987bbc69c617564f98635b67807"
NEEDS = ("expecttest", "hypothesis", "pytest_timeout", "torch")

# Put in front of the conveyor copy: torch's name for the loader becomes conveyor's.
SUBSTITUTE = """\
import conveyor as _conveyor_substitute
import torch.utils.data as _tud_substitute
import torch.utils.data.dataloader as _tud_dataloader_substitute

_tud_substitute.DataLoader = _conveyor_substitute.DataLoader
_tud_dataloader_substitute.DataLoader = _conveyor_substitute.DataLoader
"""

# Tests whose outcome differs because conveyor behaves differently on purpose.
# Keyed by the test's name (class.method); the value says why.
_DUPLICATE_WARNING = (
    "deliberate: the test asserts that iterating `CountingIterableDataset(20)` with 3 "
    "workers raises no warning, but that dataset does not shard, so every worker yields "
    "all 20 items: conveyor says so once with a `DuplicateDataWarning` (torch is silent). "
    "The rest of the test (the length warning after `len(loader)`, the workers' exit) "
    "behaves as torch's when that warning is filtered out (checked by hand, persistent or not)"
)
DELIBERATE: dict[str, str] = {
    "TestDataLoader.test_iterable_style_dataset": _DUPLICATE_WARNING,
    "TestDataLoaderPersistentWorkers.test_iterable_style_dataset": _DUPLICATE_WARNING,
}


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str  # passed | failed | error | skipped
    message: str = ""


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        print(f"missing: {', '.join(missing)} (pip install them first)", file=sys.stderr)
        return 2
    source = Path(args.source)
    if not source.is_file():
        print(
            f"no copy of torch's test file at {source}: put pytorch/pytorch "
            f"test/test_dataloader.py at commit {COMMIT} there (it is not committed)",
            file=sys.stderr,
        )
        return 2
    run_dir = ROOT / ".upstream" / "torch" / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for variant in ("torch", "conveyor"):
        results[variant] = _run(variant, source, run_dir, args)
    rows = _differences(results["torch"], results["conveyor"])
    report = _report(results, rows, args)
    print(report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")
    return 1 if any(row.reason is None for row in rows) else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=str(SOURCE), help="the local copy of the test file")
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


def _run(variant: str, source: Path, run_dir: Path, args: argparse.Namespace) -> dict:
    """Run one variant (unless --only names the other: then read its last results)."""
    module = run_dir / f"test_dataloader_{variant}.py"
    junit = run_dir / f"{variant}.xml"
    if args.report or (args.only is not None and args.only != variant):
        if not junit.is_file():
            raise SystemExit(f"no earlier {variant} run in {run_dir} to report")
        return _read_junit(junit)
    text = source.read_text()
    module.write_text(_substituted(text) if variant == "conveyor" else text)
    command = [
        sys.executable, "-m", "pytest", str(module),
        "-c", "/dev/null", "--rootdir", str(run_dir), "-p", "no:cacheprovider",
        "-q", "--no-header", "-rN", f"--timeout={args.timeout}", f"--junitxml={junit}",
    ]  # fmt: skip
    if args.keyword:
        command += ["-k", args.keyword]
    started = time.monotonic()
    print(f"running torch's tests as {variant} ...", file=sys.stderr, flush=True)
    subprocess.run(command, cwd=run_dir, check=False, stdout=sys.stderr)
    print(f"{variant}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return _read_junit(junit)


def _substituted(text: str) -> str:
    """The file with the substitution placed after any ``from __future__`` import."""
    lines = text.splitlines(keepends=True)
    future = [i + 1 for i, line in enumerate(lines) if line.startswith("from __future__")]
    at = max(future, default=0)
    return "".join(lines[:at]) + SUBSTITUTE + "".join(lines[at:])


def _read_junit(path: Path) -> dict[str, Outcome]:
    outcomes = {}
    for case in ElementTree.parse(path).iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "").strip().splitlines()[:1]
                message = message[0] if message else ""
                break
        outcomes[name] = Outcome(status, message)
    return outcomes


@dataclasses.dataclass(frozen=True)
class Difference:
    test: str
    torch: Outcome
    conveyor: Outcome
    reason: str | None


def _differences(torch: dict[str, Outcome], conveyor: dict[str, Outcome]) -> list[Difference]:
    missing = Outcome("not run")
    rows = []
    for test in sorted(set(torch) | set(conveyor)):
        before, after = torch.get(test, missing), conveyor.get(test, missing)
        if before.status != after.status:
            rows.append(Difference(test, before, after, DELIBERATE.get(test)))
    return rows


def _counts(outcomes: dict[str, Outcome]) -> str:
    tally: dict[str, int] = {}
    for outcome in outcomes.values():
        tally[outcome.status] = tally.get(outcome.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(tally.items()))


def _report(results: dict[str, dict[str, Outcome]], rows: list[Difference], args) -> str:
    import torch

    lines = [
        "# torch's DataLoader tests, run against conveyor",
        "",
        f"`python tools/torch_suite.py{' -k ' + repr(args.keyword) if args.keyword else ''}`: "
        f"pytorch/pytorch `test/test_dataloader.py` at `{COMMIT[:12]}`, torch "
        f"{torch.__version__}, Python {sys.version.split()[0]}.",
        "",
        "| run | tests |",
        "|---|---|",
        f"| torch's `DataLoader` | {_counts(results['torch'])} |",
        f"| conveyor's `DataLoader` | {_counts(results['conveyor'])} |",
        "",
    ]
    both = sorted(
        test
        for test, outcome in results["torch"].items()
        if outcome.status in ("failed", "error")
        and results["conveyor"].get(test, Outcome("not run")).status == outcome.status
    )
    if both:
        lines += ["Tests that fail with both loaders on this machine (not conveyor's doing):", ""]
        lines += [f"- `{test}`: {results['torch'][test].message}" for test in both]
        lines.append("")
    if not rows:
        lines.append("Every other test has the same outcome with both loaders.")
        return "\n".join(lines)
    lines += [
        "Tests whose outcome differs (every other test has the same outcome):",
        "",
        "| test | torch | conveyor | why |",
        "|---|---|---|---|",
    ]
    for row in rows:
        why = row.reason or f"unexplained: {row.conveyor.message or row.torch.message}"
        why = why.replace("|", "\\|")
        lines.append(f"| `{row.test}` | {row.torch.status} | {row.conveyor.status} | {why} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
