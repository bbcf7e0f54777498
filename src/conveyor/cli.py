"""The ``conveyor`` command. Subcommands: ``bench`` (conveyor vs torch throughput, from a
clone of the repository), ``doctor`` (check and measure a dataset, and say what to change)
and ``trace-plot`` (draw a trace written by ``loader.trace(PATH)``)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# The benchmark harness is not part of the package: it lives in the repository's
# benchmarks/ folder, beside the clone an editable install (pip install -e .) points at.
_CLONE_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
_NO_HARNESS = (
    "conveyor bench: the benchmark harness is not installed with the package; it runs from "
    "a clone of conveyor's repository. Fix: clone it, then `pip install -e .` there and run "
    "`conveyor bench` (or `python benchmarks/run.py`)."
)


def _bench_harness() -> ModuleType | None:
    """``conveyor_bench.command`` from sys.path or from the clone this conveyor was
    installed from; None when there is neither."""
    if importlib.util.find_spec("conveyor_bench") is None:
        if not (_CLONE_BENCHMARKS / "conveyor_bench").is_dir():
            return None
        # Spawned workers inherit sys.path, so they import the workloads from there too.
        sys.path.insert(0, str(_CLONE_BENCHMARKS))
    return importlib.import_module("conveyor_bench.command")


def _no_harness(args: argparse.Namespace) -> int:
    print(_NO_HARNESS, file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conveyor", description="conveyor: a drop-in, faster torch DataLoader"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser(
        "bench",
        help="benchmark conveyor against torch.utils.data.DataLoader",
        description="Run conveyor and torch side by side; print a Markdown table.",
    )
    harness = _bench_harness()
    if harness is not None:
        harness.add_arguments(bench)
        bench.set_defaults(handler=harness.run)
    else:
        bench.set_defaults(handler=_no_harness)  # whatever its options: see main()

    doctor = commands.add_parser(
        "doctor",
        help="check a dataset, measure it, and say what to change",
        description="Import MODULE:OBJECT (a dataset, a function returning one, or a "
        "DataLoader), run conveyor.check, time samples and batches at a few worker counts, "
        "and print advice. Exit status: 0 no errors, 1 errors found, 2 bad target.",
    )
    from conveyor import doctor as doctor_command

    doctor_command.add_arguments(doctor)
    doctor.set_defaults(handler=doctor_command.run)

    trace_plot = commands.add_parser(
        "trace-plot",
        help="draw a trace written by loader.trace(PATH) as a PNG",
        description="One lane per worker and one for the training loop; needs matplotlib.",
    )
    from conveyor.observe import trace_plot as trace_plot_command

    trace_plot_command.add_arguments(trace_plot)
    trace_plot.set_defaults(handler=trace_plot_command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.handler is not _no_harness:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
