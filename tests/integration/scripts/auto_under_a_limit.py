"""A child program for test_autotune: ``num_workers="auto"`` in a 1 GiB memory cgroup,
with workers of 200 MiB each (what each holds, touched) whose samples wait 4 ms, so the
loop always waits on busy workers and the tuner keeps wanting more of them. Prints one
JSON line: what was seen and the tuner's notes."""

from __future__ import annotations

import json
import threading

import numpy as np

from conveyor import DataLoader

HELD = []


def hold_memory(worker_id: int) -> None:
    HELD.append(np.ones(200 << 20, dtype=np.uint8))  # every page touched: the worker's own


class Waits:
    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int) -> int:
        threading.Event().wait(0.004)
        return i


if __name__ == "__main__":
    loader = DataLoader(
        Waits(), batch_size=8, num_workers="auto", worker_init_fn=hold_memory,
        multiprocessing_context="fork",
    )  # fmt: skip
    seen = [int(i) for batch in loader for i in batch]
    stats = loader.statistics()
    print(json.dumps({"seen": seen == list(range(4000)), "expected": True,
                      "notes": list(stats.notes) if stats else []}))  # fmt: skip
