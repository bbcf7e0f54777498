"""The ``doctor`` subcommand: its options, and running it from parsed arguments."""

from __future__ import annotations

import argparse
import multiprocessing
import sys

from conveyor.doctor.advice import advise
from conveyor.doctor.argtypes import positive_int
from conveyor.doctor.measure import RUN_BUDGET_S, examine
from conveyor.doctor.report import render
from conveyor.doctor.target import DEFAULT_BATCH_SIZE, UsageError, load_target

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``doctor`` subcommand's options."""
    parser.add_argument(
        "target",
        metavar="MODULE:OBJECT",
        help="a dataset, a function returning one, or a DataLoader; MODULE is dotted "
        "(importable from the current directory) or a path to a .py file",
    )
    parser.add_argument(
        "--workers",
        type=_worker_counts,
        default=None,
        metavar="N[,N...]",
        help="worker counts to measure (default: 0, 2 and a DataLoader's own num_workers)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"default: a DataLoader's own, else {DEFAULT_BATCH_SIZE}",
    )
    parser.add_argument(
        "--start-method",
        choices=multiprocessing.get_all_start_methods(),
        default=None,
        help="default: a DataLoader's own, else the platform's",
    )
    parser.add_argument(
        "--batches",
        type=positive_int,
        default=20,
        metavar="K",
        help=f"batches timed per worker count after the first (default: 20, at most about "
        f"{RUN_BUDGET_S:.0f} s)",
    )


def _worker_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        counts = ()
    if not counts or counts[0] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts >= 0, e.g. 0,1,2,4")
    return counts


def run(args: argparse.Namespace) -> int:
    """Examine ``args.target``, print the report, and return the exit status."""
    try:
        target = load_target(args.target)
    except UsageError as exc:
        print(f"conveyor doctor: {exc}", file=sys.stderr)
        return 2
    report, profile = examine(
        target,
        workers=args.workers,
        batch_size=args.batch_size,
        start_method=args.start_method,
        batches=args.batches,
    )
    print(render(target, profile, report, advise(profile, report.findings)), flush=True)
    return 1 if report.errors or profile.errors else 0
