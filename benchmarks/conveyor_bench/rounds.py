"""A row's rounds: every loader once a round, alternating which goes first."""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from conveyor_bench.measure import LoaderFactory, Measurement
from conveyor_bench.rows import Row

Factories = dict[str, LoaderFactory]


class Progress:
    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def __call__(self, text: str) -> None:
        if self.stream is not None:
            print(text, file=self.stream, flush=True)


def run_row(
    row: Row,
    factories: Factories,
    measure: Callable[[LoaderFactory], Measurement],
    repeat: int,
    progress: Progress,
) -> None:
    names = list(factories)
    for attempt in range(repeat):
        shift = attempt % len(names)
        for name in names[shift:] + names[:shift]:
            if name in row.errors:
                continue
            try:
                result = measure(factories[name])
            except Exception as exc:  # a loader's failure goes on its row, not up the stack
                row.errors[name] = failure(exc)
                progress(f"  {row.workload} | {row.config} | {name}: FAILED {row.errors[name]}")
                continue
            row.runs.setdefault(name, []).append(result)
            if row.kind == "startup":
                value = f"{result.seconds:.2f} s to first batch"
            elif row.kind == "epochs":
                value = f"{1000 * (result.seconds_per_epoch or 0):,.0f} ms an epoch"
            elif row.kind == "train":
                value = f"{result.samples_per_s:,.0f} samples/s, {result.waited_share:.0%} waiting"
            else:
                value = f"{result.samples_per_s:,.0f} samples/s"
            progress(f"  {row.workload} | {row.config} | {name} #{attempt + 1}: {value}")


def failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
