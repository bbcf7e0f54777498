"""The ``conveyor`` command. Subcommands: ``bench`` (conveyor vs torch throughput),
``doctor`` (check and measure a dataset, and say what to change) and ``trace-plot``
(draw a trace written by ``loader.trace(PATH)``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


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
    from conveyor.benchmark.command import add_arguments, run

    add_arguments(bench)
    bench.set_defaults(handler=run)

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
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
