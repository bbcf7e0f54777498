"""What a benchmark run is asked to do, and what it hands back."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass

from conveyor_bench.catalogue import DEFAULT_WORKLOADS, WORKLOADS
from conveyor_bench.rows import ALTERNATIVES, LOADERS, Row

__all__ = ["ALL_LOADERS", "QUICK_LOADERS", "BenchOptions", "BenchReport"]

ALL_LOADERS = (*LOADERS, *ALTERNATIVES)
QUICK_LOADERS = LOADERS  # --quick leaves the alternatives out unless --loaders names them


@dataclass(frozen=True)
class BenchOptions:
    """What to run; validated on creation."""

    workloads: tuple[str, ...] = DEFAULT_WORKLOADS
    quick: bool = False
    repeat: int = 3
    start_method: str | None = None
    stand_in_torch: bool = False
    seconds: float = 3.0
    loaders: tuple[str, ...] | None = None  # None: all, or with quick conveyor and torch

    def __post_init__(self) -> None:
        unknown_loaders = [name for name in self.loaders or () if name not in ALL_LOADERS]
        if unknown_loaders or self.loaders == ():
            raise ValueError(
                f"loaders={list(self.loaders or ())!r}: choose from {', '.join(ALL_LOADERS)}"
            )
        if not self.seconds > 0:
            raise ValueError(f"seconds={self.seconds!r}: must be positive")
        unknown = [name for name in self.workloads if name not in WORKLOADS]
        if unknown or not self.workloads:
            raise ValueError(
                f"workloads={list(self.workloads)!r}: choose from {', '.join(WORKLOADS)}"
            )
        if self.repeat < 1:
            raise ValueError(f"repeat={self.repeat!r}: must be at least 1")
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ValueError(
                f"start_method={self.start_method!r}: this platform has {', '.join(methods)}"
            )

    @property
    def chosen_loaders(self) -> tuple[str, ...]:
        """The loaders to run, in the columns' order."""
        wanted = self.loaders or (QUICK_LOADERS if self.quick else ALL_LOADERS)
        return tuple(name for name in ALL_LOADERS if name in wanted)


@dataclass
class BenchReport:
    environment: dict[str, str]
    options: BenchOptions
    rows: list[Row]
