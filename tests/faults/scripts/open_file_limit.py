"""A child program for the open-file-limit tests: many workers under a real ``ulimit -n``.

Usage: ``python open_file_limit.py START_METHOD WORKERS ROOM``. After starting
multiprocessing's helpers (they live as long as the interpreter), it sets the soft
RLIMIT_NOFILE to the descriptors open now + FDS_PER_WORKER x WORKERS + ROOM, then
iterates a loader that keeps every batch (400 of them). Prints one JSON line: the
pre-flight findings (code and severity, from warnings and the error), where an error
came from (``iter`` or ``next``), how many batches came, and the descriptors the
loader held in this process once its workers ran.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import warnings
from typing import Any

import numpy as np

from conveyor import DataLoader, PreflightWarning
from conveyor.diagnostics.environment import FDS_PER_WORKER

BATCHES = 400


class Rows:
    def __len__(self) -> int:
        return BATCHES * 10

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(64, i, dtype=np.float32)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> None:
    method, workers, room = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    assert [b.item() for b in DataLoader([0], num_workers=1, multiprocessing_context=method)] == [0]
    before = open_fds()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = before + FDS_PER_WORKER * workers + room
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    report: dict[str, Any] = {"soft": soft, "findings": [], "error": None, "batches": 0}
    kept = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PreflightWarning)
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        loader = DataLoader(
            Rows(), batch_size=10, num_workers=workers, multiprocessing_context=method
        )
        where = "iter"
        try:
            it = iter(loader)
            report["held"] = open_fds() - before
            where = "next"
            for batch in it:
                kept.append(batch)
        except Exception as exc:
            finding = getattr(exc, "finding", None)
            if finding is not None:
                report["findings"].append([finding.code, finding.severity.name])
            report["error"] = [where, type(exc).__name__, str(exc).splitlines()[0][:200]]
    for warning in caught:
        finding = getattr(warning.message, "finding", None)
        if finding is not None:
            report["findings"].append([finding.code, finding.severity.name])
    report["batches"] = len(kept)
    report["distinct"] = len({int(b[0, 0]) for b in kept})
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
