"""What one loader run measured, and how a run reads each batch it is handed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Measurement", "first_column", "touch"]


@dataclass(frozen=True)
class Measurement:
    """One run. ``seconds`` is the timed window (for epochs: all ``epochs`` of it), or the
    time to first batch for startup."""

    batches: int
    samples: int
    seconds: float
    main_cpu_s: float
    peak_rss_bytes: int | None
    leaked_processes: int
    main_page_faults: int | None = None  # minor faults of the main process in the window
    epochs: int = 0  # timed epochs, for the epochs kind of run
    waited_s: float = 0.0  # train: time the loop spent in next(), waiting for a batch
    copy_s: float = 0.0  # train, with an accelerator: time copying batches to it
    copied_bytes: int = 0
    # The descendants' (workers'): CPU time and minor faults in the window; None where
    # they cannot be read (not Linux), 0 with no worker process.
    workers_cpu_s: float | None = None
    workers_page_faults: int | None = None
    worker_processes: int = 0  # descendants seen at the window's end (helpers left out)
    # num_workers="auto": seconds until the count settled, before the window (None: it did
    # not within SETTLE_LIMIT_S, or the run was not asked to wait for it).
    settled_after_s: float | None = None
    settled_workers: int | None = None
    waited_to_settle: bool = False
    # The memory the loader added by the window's end (PSS): this process's growth since
    # before the loader was made, and its workers'.
    loader_pss_bytes: int | None = None
    workers_pss_bytes: int | None = None
    step_ms: float | None = None  # train: a training step's mean time in the window
    # The memory the loader added at its peak in the window (PSS of the process tree,
    # sampled all through it: WindowSpec.peak_memory), and how many readings were made.
    peak_pss_bytes: int | None = None
    pss_samples: int = 0
    # The same peak as the kernel charged it to a memory cgroup of the run's own (see
    # charged.py: PSS misses shared memory no process maps); None where none was made.
    charged_peak_bytes: int | None = None
    # The main process's function calls per batch, before the window (see calls.py):
    # Python functions, and all (C ones too).
    main_python_calls: float | None = None
    main_calls: float | None = None

    @property
    def waited_share(self) -> float:
        """The share of the window the training loop spent waiting for data."""
        return self.waited_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def copy_bytes_per_s(self) -> float | None:
        return self.copied_bytes / self.copy_s if self.copy_s > 0 else None

    @property
    def seconds_per_epoch(self) -> float | None:
        return self.seconds / self.epochs if self.epochs else None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def main_cpu_ms_per_batch(self) -> float:
        return 1000.0 * self.main_cpu_s / self.batches if self.batches else 0.0

    @property
    def main_faults_per_batch(self) -> float | None:
        if self.main_page_faults is None or not self.batches:
            return None
        return self.main_page_faults / self.batches

    @property
    def workers_cpu_ms_per_batch(self) -> float | None:
        if self.workers_cpu_s is None or not self.batches:
            return None
        return 1000.0 * self.workers_cpu_s / self.batches

    @property
    def workers_faults_per_batch(self) -> float | None:
        if self.workers_page_faults is None or not self.batches:
            return None
        return self.workers_page_faults / self.batches

    @property
    def total_cpu_ms_per_batch(self) -> float:
        """Main process and workers: all the CPU a batch cost."""
        return self.main_cpu_ms_per_batch + (self.workers_cpu_ms_per_batch or 0.0)


def first_column(batch: Any) -> Any:
    """The first field of a collated batch (every workload's sample is a tuple)."""
    if isinstance(batch, Mapping):
        return next(iter(batch.values()))
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch


def touch(batch: Any) -> int:
    """Read one element of the batch, as a training step would; return the batch's length.

    Reading forces a lazily mapped or zero-copy batch to be real without copying it all.
    """
    column = first_column(batch)
    item = column[0]
    shape = getattr(item, "shape", None)
    if shape is not None:
        float(item[(0,) * len(shape)])
    else:
        len(item)
    return len(column)
