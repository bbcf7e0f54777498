"""The ``bench`` command's options, shared by ``conveyor bench`` and ``benchmarks/run.py``."""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from collections.abc import Sequence

from conveyor.doctor.argtypes import positive_int
from conveyor_bench.catalogue import DEFAULT_WORKLOADS, QUICK_WORKLOADS, WORKLOADS
from conveyor_bench.plot import MatplotlibMissingError, plot_report, require_matplotlib
from conveyor_bench.report import render, write_json
from conveyor_bench.runner import ALL_LOADERS, QUICK_LOADERS, BenchOptions, run_benchmark

DEFAULT_ROUNDS = 3


def _workload_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown workload(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(WORKLOADS)}"
        )
    return names


def _loader_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ALL_LOADERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown loader(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(ALL_LOADERS)}"
        )
    return names


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds > 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser`` (and list the workloads in its epilog)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "workloads:\n" + "\n".join(
        f"  {spec.name:<8} {spec.summary}" for spec in WORKLOADS.values()
    )
    parser.add_argument(
        "--workloads",
        type=_workload_list,
        default=None,
        metavar="NAME[,NAME...]",
        help=f"comma-separated, from {', '.join(WORKLOADS)} (default: all but "
        f"{', '.join(n for n in WORKLOADS if n not in DEFAULT_WORKLOADS)}; with --quick "
        f"also but {', '.join(n for n in DEFAULT_WORKLOADS if n not in QUICK_WORKLOADS)})",
    )
    parser.add_argument(
        "--loaders",
        type=_loader_list,
        default=None,
        metavar="NAME[,NAME...]",
        help=f"which loaders, from {', '.join(ALL_LOADERS)} (default: all; with --quick "
        f"{', '.join(QUICK_LOADERS)}); spdl and grain are optional packages: a row they "
        "would join says 'not installed' without them",
    )
    _add_run_arguments(parser)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """How each row runs, and where the results go besides the report."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="few batches per run, 1 round, fork only (startup, epochs): a smoke test, "
        "not a measurement",
    )
    parser.add_argument(
        "--seconds",
        type=_positive_float,
        default=3.0,
        metavar="S",
        help="length of each timed window (default: 3); ignored with --quick",
    )
    parser.add_argument(
        "--repeat",
        type=positive_int,
        default=None,
        metavar="K",
        help="alternating rounds, every loader once in each; median and spread shown "
        f"(default: {DEFAULT_ROUNDS}, with --quick 1)",
    )
    parser.add_argument(
        "--start-method",
        choices=multiprocessing.get_all_start_methods(),
        default=None,
        help="multiprocessing_context for the worker rows (default: each loader's own); "
        "startup always uses spawn, epochs has a row for fork and one for spawn "
        "(with --quick both use fork only)",
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="also save raw results here")
    parser.add_argument(
        "--plot",
        metavar="PATH",
        default=None,
        help="also draw a bar chart of the results (.png, .svg or .pdf; needs matplotlib)",
    )
    parser.add_argument(
        "--stand-in-torch",
        action="store_true",
        help="put torch's DataLoader in the conveyor column too (checks the harness itself)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark for parsed ``args``; print the Markdown report to stdout."""
    if args.plot:
        try:  # before the run, not after minutes of it
            require_matplotlib()
        except MatplotlibMissingError as exc:
            print(f"conveyor bench: {exc}", file=sys.stderr)
            return 2
    repeat = args.repeat or (1 if args.quick else DEFAULT_ROUNDS)
    options = BenchOptions(
        workloads=args.workloads or (QUICK_WORKLOADS if args.quick else DEFAULT_WORKLOADS),
        quick=args.quick,
        repeat=repeat,
        start_method=args.start_method,
        stand_in_torch=args.stand_in_torch,
        seconds=args.seconds,
        loaders=args.loaders,
    )
    try:
        report = run_benchmark(options)
    except RuntimeError as exc:
        print(f"conveyor bench: {exc}", file=sys.stderr)
        return 2
    print(render(report), flush=True)
    if args.json:
        write_json(report, args.json)
        print(f"\nraw results saved to {args.json}", file=sys.stderr)
    if args.plot:
        try:
            plot_report(report, args.plot)
        except (ValueError, OSError) as exc:
            print(f"conveyor bench: no plot: {exc}", file=sys.stderr)
            return 1
        print(f"plot saved to {args.plot}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``benchmarks/run.py``: the same options as ``conveyor bench``."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py", description="conveyor vs torch DataLoader throughput"
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
